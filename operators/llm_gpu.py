"""The gpu target's kernels of the LLM ops: one kernel each for ``rotary_embedding``, ``kv_cache_update``,
``rotary_kv_write`` and ``skip_layer_norm`` (what onnxruntime's GroupQueryAttention, RotaryEmbedding and
(Skip)SimplifiedLayerNormalization lower to), and the one-kernel attention of :mod:`.attention_gpu` for
``decode_attention`` and the decode step of ``grouped_attention``; each is the op's entry in the kernel
table (:mod:`.gpu_lowering`).

The kernels are in ``llm_kernels.cu``, compiled at run time through CuPy (``cupy.RawModule``: NVRTC on
CUDA, hipRTC on ROCm), once per element type (float16 or float32; arithmetic in float32).  Sizes and
strides are kernel arguments, planned from the instruction's shapes; each launch checks the arrays'
strides against the planned ones (a mismatch raises ValueError instead of reading wrong elements), as
the fused and attention kernels do.  Each builder returns a
:class:`~mgx_graph.operators.gpu.GpuKernel` of one launch, or None for shapes or types it does not take
(the op's array-library evaluation then runs, as before):

* ``rotary_embedding``: one thread per output element (its pair of channels read from x, its angle from
  the cos / sin tables at the position id or per token); x of any strides;
* ``kv_cache_update`` (with its rotation of the new rows when it has one: GroupQueryAttention's keys,
  read straight from the packed QKV projection): when the present output is the past buffer (bound in
  place, the shared past / present cache of onnxruntime-genai) only the S new rows per entry are
  written; otherwise every present row is (past row, new row or 0);
* ``skip_layer_norm``: one block of 256 threads per row (``s = x + skip + bias`` in float32, block
  reductions for the statistics, then the normalized row and the optional sum / mean / inv_std_var
  outputs); x, skip, gamma, beta, bias in standard layout, skip broadcast over leading rows.
"""
from __future__ import annotations

import os
import warnings

import numpy as np

from ..ir.shape import Shape
from .attention_gpu import Spec, attention_kernel, broadcast_strides, head_strides, unsupported
from .gpu_kernel import GpuKernel
from .gpu_lowering import gpu_kernel_for

CTYPES = {"float16": "__half", "float32": "float"}
NT = 256  # threads per block (the normalization's block reduction assumes this power of two)
MAX_BLOCKS = 1 << 16  # the loops are grid-stride: at most this many blocks, each looping when needed
_HERE = os.path.dirname(os.path.abspath(__file__))


def kernel_source(dtype: str) -> str:
    """The source of ``llm_kernels.cu`` for element type ``dtype`` (float16 / float32)."""
    from .gpu_kernel import HEADER

    with open(os.path.join(_HERE, "llm_kernels.cu")) as f:
        return HEADER + f"typedef {CTYPES[dtype]} T;\n" + f.read()


def _function(dtype: str, name: str):
    """The compiled kernel now when CuPy is importable, else a loader that compiles on first launch."""
    from .gpu_kernel import compiled_function, precompile
    from .programmatic_launch import pdl_setting

    src, pdl = kernel_source(dtype), pdl_setting()
    ready = precompile(src, name, pdl)
    if ready is not None:
        return ready
    cache: list = []

    def lazy(*a):
        if not cache:
            cache.append(compiled_function(src, name, pdl))
        return cache[0](*a)
    return lazy


def own_kernel(builder, op, inputs, output):
    """``builder(op, inputs, output)``, or None with a warning when the kernel does not compile (the
    array-library evaluation then runs)."""
    try:
        return builder(op, inputs, output)
    except ValueError as e:
        warnings.warn(f"{op.name} {inputs[0].brief()}: no gpu kernel ({e}); the array-library evaluation runs "
                      f"instead", stacklevel=3)
        return None


def _blocks(total: int) -> int:
    return int(min(max(-(-total // NT), 1), MAX_BLOCKS))


def _layout(shape: Shape) -> tuple:
    return tuple((d, s) for d, (n, s) in enumerate(zip(shape.lens, shape.byte_strides())) if n > 1)


def _checker(label: str, shapes: list):
    layouts = [_layout(s) for s in shapes]

    def check(arrays):
        for k, (a, want) in enumerate(zip(arrays, layouts)):
            st = a.strides
            if any(st[d] != b for d, b in want):
                raise ValueError(f"{label}: argument {k} has strides {st}, the kernel was planned for "
                                 f"{dict(want)} (bytes, by dim)")
    return check


def _i64(*vals) -> tuple:
    return tuple(np.int64(v) for v in vals)


def _st(shape: Shape, d: int) -> int:
    """Element stride of dim ``d`` (0 for a dim of size 1: only index 0 is read)."""
    return 0 if shape.lens[d] == 1 else int(shape.strides[d])


def _table_args(cos: Shape, pos) -> tuple:
    """(pos b, pos s, table row, table b, table s, table column) element strides of the rotation's
    angles: cos / sin [M, R/2] at position ids [B or 1, S] (``pos``), else per token [B or 1, S, R/2]."""
    if pos is not None:
        return (_st(pos, 0), _st(pos, 1), int(cos.strides[0]), 0, 0, int(cos.strides[1]))
    return (0, 0, 0, _st(cos, 0), _st(cos, 1), int(cos.strides[2]))


def _rotary_types_ok(x: Shape, cos: Shape, sin: Shape) -> bool:
    return x.dtype in CTYPES and cos.dtype == x.dtype and sin.dtype == x.dtype and cos.strides == sin.strides


def _rotary_scalars(op, inputs: list, output: Shape):
    """The scalar arguments of ``mgx_rotary`` after its five arrays, or None (other types)."""
    x, cos, sin = inputs[:3]
    if not _rotary_types_ok(x, cos, sin):
        return None
    B, S, N, H, R = op._dims(x)
    order = (0, 1, 2, 3) if op.heads_axis == 2 else (0, 2, 1, 3)  # (b, s, n, h) dims of x / the output
    xs = [_st(x, d) for d in order]
    ys = [_st(output, d) for d in order]
    table = _table_args(cos, inputs[3] if len(inputs) == 4 else None)
    return _i64(B, S, N, H, R, *xs, *ys, *table) + (np.int32(len(inputs) == 4), np.int32(op.interleaved)), B * S * N * H


def rotary_kernel(op, inputs: list, output: Shape):
    """One launch of ``mgx_rotary`` for a ``rotary_embedding`` instruction, or None (other types: x, cos
    and sin must share one float16 / float32 type)."""
    plan = _rotary_scalars(op, inputs, output)
    if plan is None:
        return None
    scalars, total = plan
    has_pos = len(inputs) == 4
    fn = _function(inputs[0].dtype, "mgx_rotary")
    check = _checker("rotary_embedding (llm_kernels.cu)", list(inputs) + [output])
    grid = (_blocks(total),)

    def run(ctx, out, args, ws):
        check(list(args) + [out])
        p = args[3] if has_pos else args[0]
        fn(grid, (NT,), (args[0], args[1], args[2], p, out) + scalars)

    return GpuKernel(run, 1, [], True, "rotary_embedding (llm_kernels.cu)")


def _kv_plan(op, inputs: list, output: Shape):
    """``(base scalars, rotation scalars, {full: element count})`` of ``mgx_kv_write``, or None (types
    other than float16 / float32, cos / sin of another type)."""
    past = inputs[0] if op.has_past else None
    new = inputs[op.has_past]
    if new.dtype not in CTYPES:
        return None
    B, S, Nkv, H = new.lens
    P = op.present_len
    L = past.lens[2] if past is not None else 0
    ps = [int(s) for s in past.strides] if past is not None else [0, 0, 0, 0]
    base = _i64(B, S, Nkv, H, P, L, *new.strides, *ps, *output.strides)
    if op.rotary:
        cos, sin, pos = inputs[-3:]
        if not _rotary_types_ok(new, cos, sin):
            return None
        R = op.rotary_dim or H
        rot = _i64(R, *_table_args(cos, pos)) + (np.int32(1), np.int32(1), np.int32(op.interleaved))
    else:
        rot = _i64(0, 0, 0, 0, 0, 0, 0) + (np.int32(0), np.int32(0), np.int32(0))
    return base, rot, {0: B * Nkv * S * H, 1: B * Nkv * P * H}


def _kv_args(op, ctx, out, args, base, rot) -> tuple:
    """The arguments of one ``mgx_kv_write`` (or one K / V part of ``mgx_rotary_kv_write``) and its
    ``full`` flag: 0 when the present output is the past buffer (bound in place)."""
    pa = args[0]  # the past, or (no past: L = 0, never read) the new rows
    nw, start = args[op.has_past], args[op.has_past + 1]
    in_place = op.has_past and ctx.data_ptr(pa) == ctx.data_ptr(out) and pa.shape == out.shape \
        and pa.strides == out.strides
    full = 0 if in_place else 1
    tables = tuple(args[-3:]) if op.rotary else (nw, nw, start)
    return (pa, nw, start, out) + base + (np.int32(full),) + tables + rot, full


def kv_write_kernel(op, inputs: list, output: Shape):
    """One launch of ``mgx_kv_write`` for a ``kv_cache_update`` instruction (its rotation of the new rows
    included), or None (types other than float16 / float32, cos / sin of another type)."""
    plan = _kv_plan(op, inputs, output)
    if plan is None:
        return None
    base, rot, totals = plan
    fn = _function(inputs[op.has_past].dtype, "mgx_kv_write")
    check = _checker("kv_cache_update (llm_kernels.cu)", list(inputs) + [output])
    grids = {f: (_blocks(n),) for f, n in totals.items()}

    def run(ctx, out, args, ws):
        check(list(args) + [out])
        a, full = _kv_args(op, ctx, out, args, base, rot)
        fn(grids[full], (NT,), a)

    return GpuKernel(run, 1, [], True, "kv_cache_update (llm_kernels.cu)")


def rotary_kv_kernel(op, inputs: list, output):
    """One launch of ``mgx_rotary_kv_write`` for a ``rotary_kv_write`` instruction (the query's
    rotation, the rotated key rows and the value rows), or None when one of its parts has no kernel
    (other types; x, cos and sin of one float16 / float32 type)."""
    rot_op, k_op, v_op = op.parts()
    (qi, ki, vi), (qo, ko, vo) = op.split(inputs), output
    rp, kp, vp = _rotary_scalars(rot_op, qi, qo), _kv_plan(k_op, ki, ko), _kv_plan(v_op, vi, vo)
    if rp is None or kp is None or vp is None or len(qi) != 4 or qi[0].dtype != ki[1].dtype:
        return None
    fn = _function(qi[0].dtype, "mgx_rotary_kv_write")
    check = _checker("rotary_kv_write (llm_kernels.cu)", list(inputs) + list(output))

    def run(ctx, out, args, ws):
        check(list(args) + list(out))
        qa, ka, va = op.split(args)
        k_args, kf = _kv_args(k_op, ctx, out[1], ka, kp[0], kp[1])
        v_args, vf = _kv_args(v_op, ctx, out[2], va, vp[0], vp[1])
        grid = (_blocks(rp[1] + kp[2][kf] + vp[2][vf]),)
        fn(grid, (NT,), (qa[0], qa[1], qa[2], qa[3], out[0]) + rp[0] + k_args + v_args)

    return GpuKernel(run, 1, [], True, "rotary_kv_write (llm_kernels.cu)")


def _suffix_rows(s: Shape, x: Shape, D: int):
    """Rows of ``s`` when it is standard and its dims (leading ones dropped) are a suffix of x's
    covering the D normalized elements; None otherwise."""
    lens = list(s.lens)
    while lens and lens[0] == 1:
        lens.pop(0)
    n = int(np.prod(lens)) if lens else 1
    if not s.standard() or tuple(lens) != tuple(x.lens[len(x.lens) - len(lens):]) or n % D:
        return None
    return n // D


def skip_norm_kernel(op, inputs: list, output):
    """One launch of ``mgx_skip_norm`` for a ``skip_layer_norm`` instruction, or None (x not standard,
    inputs of another type than x's float16 / float32, a skip or gamma / beta / bias that is not a
    standard suffix of x)."""
    x, skip, gamma, beta, bias = op._split(inputs)
    if x.dtype not in CTYPES or not x.standard():
        return None
    a = op.axis % x.ndim
    D = int(np.prod(x.lens[a:]))
    rows = int(np.prod(x.lens[:a]))
    if D < 1 or rows < 1:
        return None
    skip_rows = 1
    for s in (skip, gamma, beta, bias):
        if s is None:
            continue
        r = _suffix_rows(s, x, D)
        if s.dtype != x.dtype or r is None or (s is not skip and r != 1):
            return None
        if s is skip:
            skip_rows = r
    outs = list(output) if isinstance(output, tuple) else [output]
    if not all(o.standard() for o in outs):
        return None
    flags = tuple(np.int32(v) for v in (op.simplified, skip is not None, beta is not None, bias is not None,
                                        bool(op.stats), bool(op.stats)))
    scalars = _i64(rows, D, skip_rows) + (np.float32(op.epsilon),) + flags
    fn = _function(x.dtype, "mgx_skip_norm")
    check = _checker("skip_layer_norm (llm_kernels.cu)", list(inputs) + outs)
    grid = (int(min(rows, MAX_BLOCKS)),)
    has = (op.skip, 1, op.beta, op.bias)

    def run(ctx, out, args, ws):
        o = list(out) if op.stats else [out]
        check(list(args) + o)
        it = iter(args)
        xa = next(it)
        sk, g, be, bi = (next(it) if f else xa for f in has)
        y = o[0]
        mean, inv, sm = (o[1], o[2], o[3]) if op.stats else (y, y, y)
        fn(grid, (NT,), (xa, sk, g, be, bi, y, mean, inv, sm) + scalars)

    return GpuKernel(run, 1, [], True, "skip_layer_norm (llm_kernels.cu)")


# ---------------------------------------------------------------------------------------------------
# the table's entries
# ---------------------------------------------------------------------------------------------------
@gpu_kernel_for("rotary_embedding")
def _lower_rotary(op, inputs, output, ins) -> GpuKernel | None:
    """One launch of :func:`rotary_kernel`; None for the types and layouts it does not take."""
    return own_kernel(rotary_kernel, op, inputs, output)


@gpu_kernel_for("kv_cache_update")
def _lower_kv_cache_update(op, inputs, output, ins) -> GpuKernel | None:
    """One launch of :func:`kv_write_kernel` (the rotation included); None for the types it does not take."""
    return own_kernel(kv_write_kernel, op, inputs, output)


@gpu_kernel_for("rotary_kv_write")
def _lower_rotary_kv_write(op, inputs, output, ins) -> GpuKernel | None:
    """One launch of :func:`rotary_kv_kernel`; None for the types it does not take (the parts'
    array-library evaluations run then)."""
    return own_kernel(rotary_kv_kernel, op, inputs, output)


@gpu_kernel_for("skip_layer_norm")
def _lower_skip_layer_norm(op, inputs, output, ins) -> GpuKernel | None:
    """One launch of :func:`skip_norm_kernel`; None for the types and layouts it does not take."""
    return own_kernel(skip_norm_kernel, op, inputs, output)


@gpu_kernel_for("decode_attention")
def _lower_decode_attention(op, inputs, output, ins) -> GpuKernel | None:
    """The one-kernel attention of :mod:`.attention_gpu` (two launches for a cache of more than 256
    rows); None, with a warning, for shapes it does not take (head size > 256, ...) or a source that
    does not compile: the array-library evaluation runs instead (correct, many launches, not
    capturable)."""
    q, k, v = inputs[:3]
    mk = inputs[3] if op.mask else None
    B, N, S, H = q.lens
    spec = Spec(dtype=q.dtype, B=B, N=N, NKV=k.lens[1], S=S, P=k.lens[2], H=H, HV=v.lens[3], q=head_strides(q),
                k=head_strides(k), v=head_strides(v), out=head_strides(output), scale=op.scale,
                softcap=op.softcap, mask_dtype=mk.dtype if mk is not None else None,
                mask=broadcast_strides(mk) if mk is not None else (0, 0, 0, 0), mask_len=k.lens[2], mask_round=True,
                empty=1 if op.nan_zero else 0, nan_zero=bool(op.nan_zero))
    shapes = {"q": q, "k": k, "v": v, "out": output}
    if mk is not None:
        shapes["mask"] = mk
    has_mask = mk is not None

    def pick(args):
        return {"q": args[0], "k": args[1], "v": args[2], "mask": args[3] if has_mask else None}

    try:
        return attention_kernel(spec, pick, shapes, op.name)
    except ValueError as e:
        warnings.warn(f"{op.name} {q.brief()} x {k.brief()}: no gpu kernel ({e}); the array-library "
                      f"evaluation runs instead", stacklevel=2)
        return None


def _grouped_attention_spec(op, inputs, output):
    """The :class:`~.attention_gpu.Spec` of a decode step, or None when an input's layout does not fit
    the kernel (kv_len / sink not contiguous)."""
    q, k, v, pos, kv_len = inputs[:5]
    bias, sink, km = op.optional_inputs(inputs)
    B, S, N, H = q.lens
    Hv = v.lens[3]
    if (B > 1 and kv_len.strides[0] != 1) or (sink is not None and N > 1 and sink.strides[0] != 1):
        return None
    kms = None
    if km is not None:
        kms = broadcast_strides(km, 3) if km.ndim == 3 else (broadcast_strides(km, 2)[0], 0,
                                                              broadcast_strides(km, 2)[1])
    out = (0 if B == 1 else S * N * Hv, Hv, 0 if S == 1 else N * Hv, 1)
    return Spec(dtype=q.dtype, B=B, N=N, NKV=k.lens[1], S=S, P=k.lens[2], H=H, HV=Hv,
                q=head_strides(q, (0, 2, 1, 3)), k=head_strides(k), v=head_strides(v), out=out,
                scale=op.scale or 1.0 / float(np.sqrt(H)), softcap=op.softcap,
                mask_dtype=bias.dtype if bias is not None else None,
                mask=broadcast_strides(bias) if bias is not None else (0, 0, 0, 0),
                mask_len=bias.lens[3] if bias is not None else 0, key_mask=kms,
                pos=broadcast_strides(pos, 2), lengths=True, causal=bool(op.causal),
                window=max(op.local_window, 0), sink_dtype=sink.dtype if sink is not None else None,
                smooth=bool(op.smooth) and sink is None, empty=2)


@gpu_kernel_for("grouped_attention")
def _lower_grouped_attention(op, inputs, output, ins) -> GpuKernel | None:
    """A decode step (one query row per batch entry, S == 1) runs as one kernel over the cache
    (:mod:`.attention_gpu`: the KV heads read in place, flash-decoding splits past 256 rows); a
    prompt (S > 1), or a shape the kernel does not take, runs the GEMM path of the op's ``compute`` (None)."""
    if inputs[0].lens[1] != 1:
        return None
    spec = _grouped_attention_spec(op, inputs, output)
    if spec is None or unsupported(spec):
        return None

    roles = ["q", "k", "v", "pos", "kv_len", "rows"] + [r for r, f in (("mask", op.bias), ("sink", op.sink),
                                                                      ("key_mask", op.key_mask)) if f]
    shapes = {r: s for r, s in zip(roles, inputs) if r != "rows"}
    shapes["out"] = output

    def pick(args):
        return dict(zip(roles, args))

    try:
        return attention_kernel(spec, pick, shapes, op.name)
    except ValueError as e:  # a source that does not compile, a launch too large
        warnings.warn(f"{op.name}: no one-kernel decode step ({e}); the GEMM path runs", stacklevel=2)
        return None
