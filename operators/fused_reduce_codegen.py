"""CUDA / HIP C source for ``fused_reduce`` submodules: one reduction over the innermost axis with
its elementwise producers and consumers, one block per row (MIGraphX's ``fuse_reduce`` kernels).

The submodule holds exactly one reduction instruction (``reduce_sum`` / ``mean`` / ``max`` / ``min``
with keepdims, ``softmax``, ``logsoftmax``, ``rms_norm``, ``layernorm``) reading ``x`` of lens
``rows + [N]``; its output and every other member broadcast into the result's lens ``rows + [M]``.
Per row, the block's threads stride over the N columns evaluating ``x`` (its producers recomputed
from the inputs), combine in the accumulation type (float for float16 / float32 data, double for
float64) through a shared-memory tree (``nthreads`` a power of two), and then stride over the M output
columns evaluating the result, the reduction's value given by its statistics:

* reduce_sum / reduce_mean: sum (/ N); reduce_max / reduce_min: NaN-propagating max / min;
* softmax: ``exp(x - max) / sum(exp(x - max))``; logsoftmax: ``x - max - log(sum(exp(x - max)))``;
* rms_norm: ``x / sqrt(sum(x * x) / N + eps) * w``; layernorm: ``(x - mean) / sqrt(var + eps) * s + b``.

The per-row function is ``MGX_HD`` (see :mod:`.fused_codegen`): on the host with one thread it is
the plain sequential loop, which the tests run.
"""
from __future__ import annotations

from .fused_codegen import (MAX_GRID, KernelEmitter, KernelSource, broadcast_index, element_index, finish,
                            linear_offset, output_names, param_list, store_expr)
from .fused_exprs import c_constant

REDUCTIONS = ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "softmax", "logsoftmax", "rms_norm",
              "layernorm")

_COMBINE = {"sum": "a + b", "max": "(b > a || b != b) ? b : a", "min": "(b < a || b != b) ? b : a"}


def _helper(kind: str, acc: str) -> str:
    return (f"MGX_HD {acc} mgx_block_{kind}({acc} v, {acc}* sm, int tid, int nt) {{\n"
            f"    sm[tid] = v;\n    MGX_SYNC();\n"
            f"    for (int s = nt / 2; s > 0; s >>= 1) {{\n"
            f"        if (tid < s) {{ {acc} a = sm[tid], b = sm[tid + s]; sm[tid] = {_COMBINE[kind]}; }}\n"
            f"        MGX_SYNC();\n    }}\n"
            f"    {acc} r = sm[0];\n    MGX_SYNC();\n    return r;\n}}\n")


def reduction_of(sub):
    """The one reduction instruction of a fused_reduce submodule (ValueError when not exactly one)."""
    found = [i for i in sub.instructions if i.op.name in REDUCTIONS]
    if len(found) != 1:
        raise ValueError(f"fused_reduce module '{sub.name}' holds {len(found)} reductions, expected 1")
    return found[0]


class _Row:
    """The statistics stage of one row: loops over the reduced axis, block reductions."""

    def __init__(self, em: KernelEmitter, red, ridx, acc: str):
        self.em, self.red, self.ridx, self.acc = em, red, ridx, acc
        self.x = red.inputs[0]
        self.n = self.x.shape.lens[-1]
        self.helpers: set[str] = set()

    def inf(self, negative: bool) -> str:
        if self.acc == "double":
            return f"mgx_f64(0x{'fff' if negative else '7ff'}0000000000000ULL)"
        return f"mgx_f32(0x{'ff' if negative else '7f'}800000u)"

    def loop(self, init: str, step) -> str:
        """``acc s = init; for j: s = step(s, x_j)`` then the block combination; returns ``s``."""
        em, acc = self.em, self.acc
        s = em.fresh("s")
        em.emit(f"{acc} {s} = {init};")
        em.emit(f"for (long long j = tid; j < {self.n}; j += nt) {{")
        em.push()
        xv = em.value(self.x, self.ridx + ("j",))
        em.emit(f"{s} = {step(s, f'({acc}){xv}')};")
        em.pop()
        em.emit("}")
        return s

    def block(self, kind: str, s: str) -> str:
        self.helpers.add(kind)
        return self.em.var(self.acc, f"mgx_block_{kind}({s}, sm, tid, nt)", "r")

    def total(self, step) -> str:
        return self.block("sum", self.loop(f"({self.acc})0", step))

    def extreme(self, kind: str) -> str:
        cmp = ">" if kind == "max" else "<"
        s = self.loop(self.inf(kind == "max"), lambda s, x: f"({x} {cmp} {s} || {x} != {x}) ? {x} : {s}")
        return self.block(kind, s)

    def stats(self):
        """Emit the statistics; returns ``fn(emitter, idx) -> C expression`` of the reduction's value."""
        em, red, acc, n = self.em, self.red, self.acc, self.n
        name = red.op.name
        exp_, log_, sqrt_ = ("exp", "log", "sqrt") if acc == "double" else ("expf", "logf", "sqrtf")
        x = self.x

        def xs(e, idx):
            return f"({acc}){e.value(x, broadcast_index(x.shape.lens, red.shape.lens, idx))}"

        def arg(e, k, idx):  # a further input of the reduction (weight, scale, bias)
            v = red.inputs[k]
            return f"({acc}){e.value(v, broadcast_index(v.shape.lens, red.shape.lens, idx))}"

        if name in ("reduce_sum", "reduce_mean"):
            s = self.total(lambda s, v: f"{s} + {v}")
            stat = em.var(acc, f"{s} / ({acc}){n}") if name == "reduce_mean" else s
            return lambda e, idx: stat
        if name in ("reduce_max", "reduce_min"):
            stat = self.extreme(name[-3:])
            return lambda e, idx: stat
        if name in ("softmax", "logsoftmax"):
            mx = self.extreme("max")
            s = self.total(lambda s, v: f"{s} + {exp_}({v} - {mx})")
            if name == "softmax":
                return lambda e, idx: f"{exp_}({xs(e, idx)} - {mx}) / {s}"
            lg = em.var(acc, f"{log_}({s})")
            return lambda e, idx: f"{xs(e, idx)} - {mx} - {lg}"
        eps = c_constant(red.op.epsilon, "float64" if acc == "double" else "float32")
        if name == "rms_norm":
            s = self.total(lambda s, v: f"{s} + {v} * {v}")
            den = em.var(acc, f"{sqrt_}({s} / ({acc}){n} + {eps})")
            weighted = len(red.inputs) > 1
            return lambda e, idx: f"{xs(e, idx)} / {den}" + (f" * {arg(e, 1, idx)}" if weighted else "")
        # layernorm
        s = self.total(lambda s, v: f"{s} + {v}")
        mu = em.var(acc, f"{s} / ({acc}){n}")
        q = self.total(lambda s, v: f"{s} + ({v} - {mu}) * ({v} - {mu})")
        den = em.var(acc, f"{sqrt_}({q} / ({acc}){n} + {eps})")
        bias = len(red.inputs) > 2
        return lambda e, idx: (f"({xs(e, idx)} - {mu}) / {den} * {arg(e, 1, idx)}" +
                               (f" + {arg(e, 2, idx)}" if bias else ""))


def _block_size(n: int) -> int:
    b = 32
    while b < n and b < 256:
        b *= 2
    return b


def reduce_source(sub, in_shapes, out_shape) -> KernelSource:
    """The kernel of a ``fused_reduce`` instruction over ``sub`` (see the module docstring);
    ``out_shape``: its Shape, or a tuple of them when the module returns several values of the same
    lens (written in the same output pass).  Raises ValueError when the shapes are not one reduction
    over the innermost axis per row of the result."""
    red = reduction_of(sub)
    x = red.inputs[0]
    rows_lens = tuple(x.shape.lens[:-1])
    roots = sub.get_return().inputs
    outs = out_shape if isinstance(out_shape, tuple) else (out_shape,)
    lens = tuple(outs[0].lens)
    if len(roots) != len(outs) or any(tuple(r.shape.lens) != lens or tuple(o.lens) != lens
                                      for r, o in zip(roots, outs)) or lens[:-1] != rows_lens:
        raise ValueError(f"fused_reduce: results {[o.brief() for o in outs]} are not one row per row of "
                         f"{x.shape.brief()}")
    acc = "double" if x.shape.dtype == "float64" else "float"
    em = KernelEmitter(sub, in_shapes)
    ridx = element_index(em, rows_lens, "row")
    row = _Row(em, red, ridx, acc)
    em.special[id(red)] = row.stats()
    m = lens[-1]
    em.emit(f"for (long long j = tid; j < {m}; j += nt) {{")
    em.push()
    idx = ridx + ("j" if m != 1 else "0",)
    for r, o, y in zip(roots, outs, output_names(outs)):
        v = em.value(r, idx)
        em.emit(f"{y}[{linear_offset(idx, o)}] = {store_expr(v, o.dtype)};")
    em.pop()
    em.emit("}")
    params = param_list(in_shapes, outs)
    sig = ", ".join(f"{t} {n}" for t, n in params)
    names = ", ".join(n for _, n in params)
    block = _block_size(max(row.n, m))
    entry = f"MGX_HD void mgx_row(long long row, int tid, int nt, {acc}* sm, {sig}) {{\n" + "\n".join(em.lines) + "\n}"
    kernel = (f'extern "C" __global__ void MGX_KERNEL({sig}, long long rows) {{\n'
              f"    __shared__ {acc} mgx_sm[{block}];\n"
              f"    for (long long row = blockIdx.x; row < rows; row += gridDim.x)\n"
              f"        mgx_row(row, (int)threadIdx.x, (int)blockDim.x, mgx_sm, {names});\n}}")
    helpers = "".join(_helper(k, acc) for k in sorted(row.helpers))
    rows = 1
    for d in rows_lens:
        rows *= d
    return finish("reduce", helpers, em, entry, kernel, params, entry="mgx_row", extent=rows, block=block,
                  grid=max(1, min(rows, MAX_GRID)), acc=acc)
