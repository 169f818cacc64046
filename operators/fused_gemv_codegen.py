"""CUDA / HIP C source and launch of ``fused_gemv`` submodules: the gemv kernel of
:mod:`.gemv_gpu` (``gemv.cu``'s structure) with a generated prologue and epilogue.

The submodule (made by ``fuse_gemv``) holds one ``dot`` ``y [.., 1, N] = x [.., 1, K] @ W`` whose weight
is a parameter read as ``W^T [N, K]`` with K contiguous (row stride ``sw`` elements), the
instructions computing x (for an RMSNorm prologue: one reduction over the K elements of the row, with
its elementwise producers, as in a ``fused_reduce``) and, optionally, an elementwise epilogue reading
``y`` through ``S`` last-axis slices of one length ``L`` (offsets ``off_s``).  One kernel of ``NT``
threads per block:

0. weight prefetch: the column index and thread split are computed first and each thread loads its
   first ``PF`` weight chunks of each of the S rows into registers (:func:`prefetch_depth`: at most
   ``gemv_gpu.PREFETCH`` per row and ``PREFETCH_REGS`` in all).  The weight is a constant (fuse_gemv
   takes literal weights only), so nothing orders these loads after an earlier kernel; then
   ``MGX_GRID_DEPENDENCY();`` (the wait of :mod:`.programmatic_launch` unless ``MIGRAPHX_PDL=0``,
   empty otherwise), so the weight's DRAM latency overlaps the prologue and the kernel before;
1. prologue (``mgx_prologue``, the row function of :mod:`.fused_reduce_codegen` over one row, with an
   xor-shuffle block reduction of two barriers, :func:`_warp_helper`): every
   block computes the row statistics itself and writes x, rounded to the dot's element type as the
   unfused program stores it, into shared memory; block 0 alone also writes the submodule's further
   outputs (the residual sum).  Every block computes the same values, so results are deterministic;
2. GEMV: each block computes ``NT / tpc`` output columns n; the ``tpc`` threads of a column read the
   weight rows ``n + off_s`` in 16-byte loads (element loads where K or the pointers do not allow
   them), the first ``PF`` from the registers of step 0, accumulate in float in the order of
   ``gemv.cu`` (so the dot values equal the unfused kernel's), reduce by xor shuffles (within the
   column's ``tpc`` lanes when ``tpc`` < 32), then across 32-thread groups through shared memory;
3. epilogue (``mgx_epilogue``): the column's first thread rounds each dot value to the dot's element
   type (as the unfused program stores it) and evaluates the epilogue at column n (its other inputs
   read at their strides), or stores the dot value itself when there is no epilogue.

``tpc`` and the load width are those :func:`.gemv_gpu.make_plan` gives the unfused dot (N columns).
"""
from __future__ import annotations

import numpy as np

from .fused_codegen import (PRELUDE, KernelEmitter, broadcast_index, finish, linear_offset, output_names,
                            param_list, store_expr)
from .fused_module import module_params
from .fused_reduce_codegen import _COMBINE, _Row, reduction_of
from .gemv_gpu import CTYPES, NT, PREFETCH, SMEM_X, make_plan
from .gpu_kernel import GpuKernel, check_strides, compiled_function, layout, precompile

# the generated kernel also builds on the host behind tests/gemv_host.py's shim (MGX_HOST_EMULATION)
GEMV_PRELUDE = PRELUDE.replace("#else\n#include <cuda_fp16.h>", "#elif !defined(MGX_HOST_EMULATION)\n"
                               "#include <cuda_fp16.h>") + r"""
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__) || defined(__HIPCC_RTC__)
#define MGX_SHFL_XOR(v, o) __shfl_xor((v), (o), 32)
#else
#define MGX_SHFL_XOR(v, o) __shfl_xor_sync(0xffffffffu, (v), (o))
#endif
MGX_HD float mgx_gemv_f(float v) { return v; }
MGX_HD float mgx_gemv_f(__half v) { return __half2float(v); }
#ifndef MGX_GRID_DEPENDENCY  // defined by programmatic_launch.PRELUDE when the source is built for PDL
#define MGX_GRID_DEPENDENCY()
#endif
"""


class GemvParts:
    """The parts of a fused_gemv submodule: ``dot``, ``x`` (its input), ``weight`` (the parameter
    index of W), ``slices`` (with their offsets) and ``root`` (the returned result), ``extras`` (the
    further returned values), ``reduction`` (the prologue's, or None).  ValueError when the module is
    not of that form."""

    def __init__(self, sub, in_shapes):
        dots = [i for i in sub.instructions if i.op.name == "dot"]
        if len(dots) != 1:
            raise ValueError(f"fused_gemv module '{sub.name}' holds {len(dots)} dot instructions, expected 1")
        self.dot = d = dots[0]
        params = module_params(sub)
        if d.inputs[1] not in params:
            raise ValueError(f"fused_gemv module '{sub.name}': the weight is not a parameter")
        self.weight = params.index(d.inputs[1])
        self.x = d.inputs[0]
        rets = sub.get_return().inputs
        self.root, self.extras = rets[0], list(rets[1:])
        self.slices = [c for c in d.outputs if c.op.name == "slice"]
        if self.root is not d and (not self.slices or len(self.slices) != len(d.outputs)):
            raise ValueError(f"fused_gemv module '{sub.name}': the dot is read other than through slices")
        if self.root is d:
            self.slices = []
        self.offsets = [s.op._bounds(d.shape)[0][1].start for s in self.slices]
        reds = [i for i in sub.instructions if i.op.name in ("rms_norm", "layernorm", "softmax", "logsoftmax")
                or i.op.name.startswith("reduce_")]
        self.reduction = reduction_of(sub) if reds else None
        if self.reduction is not None and self.reduction.inputs[0].shape.dtype == "float64":
            raise ValueError("fused_gemv: a float64 reduction (the kernel's statistics are float)")
        w = in_shapes[self.weight]
        self.dtype, self.K, self.N = d.shape.dtype, d.inputs[0].shape.lens[-1], d.shape.lens[-1]
        self.L = self.slices[0].shape.lens[-1] if self.slices else self.N
        if self.dtype not in CTYPES or w.dtype != self.dtype or self.K * np.dtype(self.dtype).itemsize > SMEM_X:
            raise ValueError(f"fused_gemv: dot of {self.dtype} with K={self.K} (float16 / float32, x at most "
                             f"{SMEM_X} bytes)")
        if any(n != 1 for n in d.shape.lens[:-1]) or any(tuple(e.shape.lens) != tuple(self.x.shape.lens)
                                                         for e in self.extras):
            raise ValueError(f"fused_gemv: dot {d.shape.brief()} is not one row, or a further output is not "
                             f"of the row's lens {list(self.x.shape.lens)}")
        if self.K > 1 and w.strides[-2] != 1:
            raise ValueError(f"fused_gemv: weight strides {list(w.strides)}, K not contiguous")
        self.sw = int(w.strides[-1]) if self.N > 1 else self.K


def _prologue(em, parts, acc, outs, names) -> set[str]:
    """Emit the prologue's statements into ``em``; returns the helper kinds it uses."""
    ndim = parts.x.shape.ndim
    zero = ("0",) * (ndim - 1)
    helpers = set()
    if parts.reduction is not None:
        row = _Row(em, parts.reduction, zero[:parts.reduction.inputs[0].shape.ndim - 1], acc)
        em.special[id(parts.reduction)] = row.stats()
        helpers = row.helpers
    em.emit(f"for (long long j = tid; j < {parts.K}; j += nt) {{")
    em.push()
    idx = zero + ("j",)
    em.emit(f"xs[j] = {store_expr(em.value(parts.x, idx), parts.dtype)};")
    for e, o, y in zip(parts.extras, outs[1:], names[1:]):
        v = em.value(e, idx)
        em.emit(f"if (first) {y}[{linear_offset(idx, o)}] = {store_expr(v, o.dtype)};")
    em.pop()
    em.emit("}")
    return helpers


def _epilogue(em, parts, out, y) -> None:
    """Emit the epilogue's statements (column ``n`` of the result from dot values ``d0, d1, ..``)."""
    idx = ("0",) * (out.ndim - 1) + ("n",)
    if not parts.slices:
        em.emit(f"{y}[{linear_offset(idx, out)}] = {store_expr('d0', out.dtype)};")
        return
    for s, sl in enumerate(parts.slices):
        def value(e, at, s=s, sl=sl):
            if at[-1] != "n" or any(i != "0" for i in at[:-1]):
                raise ValueError("fused_gemv: the epilogue reads the dot at another column than its own")
            return f"d{s}"
        em.special[id(sl)] = value
    v = em.value(parts.root, broadcast_index(parts.root.shape.lens, out.lens, idx))
    em.emit(f"{y}[{linear_offset(idx, out)}] = {store_expr(v, out.dtype)};")


def _warp_helper(kind: str, acc: str) -> str:
    """The prologue's block reduction over ``NT`` threads: an xor-shuffle butterfly in each 32-lane
    group, the groups' values through shared memory, a butterfly over them in every group (so every
    thread holds the result, bit-equal: ``a op b`` is computed as ``b op a`` by the partner lane); two
    barriers where the tree of :mod:`.fused_reduce_codegen` takes ten at 256 threads."""
    assert NT % 32 == 0 and (NT // 32) & (NT // 32 - 1) == 0, "NT / 32 must be a power of two"
    op = _COMBINE[kind]
    return (f"MGX_HD {acc} mgx_block_{kind}({acc} v, {acc}* sm, int tid, int nt) {{\n"
            f"    for (int o = 16; o > 0; o >>= 1) {{ {acc} a = v, b = MGX_SHFL_XOR(v, o); v = {op}; }}\n"
            f"    if ((tid & 31) == 0) sm[tid >> 5] = v;\n    MGX_SYNC();\n"
            f"    v = sm[tid & ({NT // 32} - 1)];\n"
            f"    for (int o = {NT // 64}; o > 0; o >>= 1) {{ {acc} a = v, b = MGX_SHFL_XOR(v, o); v = {op}; }}\n"
            f"    MGX_SYNC();\n    return v;\n}}\n")


PREFETCH_REGS = 16  # most prefetched weight loads per thread over all S rows (16 uint4: 64 registers)


def prefetch_depth(plan, slices: int, vector: bool) -> int:
    """Weight loads per thread and weight row held in registers ahead of the prologue: at most the
    row's loads per thread and ``plan.prefetch``, lowered so that ``slices * depth`` stays within
    ``PREFETCH_REGS`` (0 when more weight rows are read: no prefetch)."""
    return min(plan.loads_per_thread(vector), plan.prefetch, PREFETCH_REGS // max(1, slices))


def _gemv_head(parts, plan, vector: bool) -> str:
    """The column split and the weight prefetch, first in the kernel (before the prologue): the
    first ``PF`` loads of each of the S weight rows into registers ``wp<s>``."""
    S = max(1, len(parts.slices))
    offs = parts.offsets or [0]
    item = np.dtype(parts.dtype).itemsize
    vec = plan.vec if vector else 1
    lt = "uint4" if vec * item == 16 else "T"
    ch, cols = parts.K // vec, NT // plan.tpc
    iters = plan.loads_per_thread(vector)
    pf = prefetch_depth(plan, S, vector)
    rows = "".join(f"    const LT* w{s} = reinterpret_cast<const LT*>(w + (nr + {offs[s]}LL) * {parts.sw}LL);\n"
                   for s in range(S))
    head = f"""    typedef {CTYPES[parts.dtype]} T;
    typedef {lt} LT;
    constexpr int CH = {ch}, COLS = {cols}, TPC = {plan.tpc}, ITERS = {iters}, S = {S}, PF = {pf};
    const int c = tid / TPC;
    const int t = tid - c * TPC;
    const long long n1 = (long long)blockIdx.x * COLS + c; // the block's first column group
    const long long nr = n1 < {parts.L} ? n1 : 0; // a column past the end reads no row
    const T* w = x{parts.weight};
{rows}"""
    if not pf:
        return head
    regs = "".join(f"    LT wp{s}[PF];\n" for s in range(S))
    loads = " ".join(f"wp{s}[i] = w{s}[j];" for s in range(S))
    return head + regs + f"""    if (n1 < {parts.L}) {{
#pragma unroll
        for (int i = 0; i < PF; ++i) {{
            const int j = t + i * TPC;
            if (j < CH) {{ {loads} }}
        }}
    }}
"""


def _chunk_loop(parts, vec: int, first: str, last: str, unroll: str, load: str) -> str:
    """``for (i = first; i < last; ++i)``: weight chunk j = t + i * TPC of each row (``load``: the
    expression of row s's chunk, ``{s}`` in it) times chunk j of x, added to acc[s] (e ascending)."""
    S = max(1, len(parts.slices))
    loads = "".join(f"                const LT wv{s} = {load.format(s=s)};\n"
                    f"                const T* we{s} = reinterpret_cast<const T*>(&wv{s});\n" for s in range(S))
    fma = "".join(f"                    acc[{s}] += mgx_gemv_f(we{s}[e]) * mgx_gemv_f(xe[e]);\n" for s in range(S))
    return f"""#pragma unroll{unroll}
        for (int i = {first}; i < {last}; ++i) {{
            const int j = t + i * TPC;
            if (j < CH) {{
{loads}                const LT xv = reinterpret_cast<const LT*>(xs)[j];
                const T* xe = reinterpret_cast<const T*>(&xv);
#pragma unroll
                for (int e = 0; e < {vec}; ++e) {{
{fma}                }}
            }}
        }}
"""


def _gemv_body(parts, plan, vector: bool) -> str:
    """The GEMV and the call of the epilogue, inside the kernel after the prologue (``gemv.cu``'s
    loops over S weight rows: the prefetched chunks, then the rest loaded as they are used), over the
    block's column groups ``blockIdx.x * COLS + k * gridDim.x * COLS``: the launch gives one block per
    group, and a smaller grid would compute the prologue's row once per block for several groups (the
    groups after the first load every chunk).  Each column's sums are in the same order whatever the
    grid.  On the H200 (2026-12-01) a grid capped at 528 blocks left SmolLM2's step as it was and made
    the Llama-1B-shaped step slower (1.40 against 1.22 ms per token): not taken."""
    S = max(1, len(parts.slices))
    vec = plan.vec if vector else 1
    pf = prefetch_depth(plan, S, vector)
    held = _chunk_loop(parts, vec, "0", "PF", "", "wp{s}[i]") if pf else ""
    rest = _chunk_loop(parts, vec, "PF", "ITERS", " 8", "w{s}[j]")
    full = _chunk_loop(parts, vec, "0", "ITERS", " 8", "w{s}[j]")
    offs = parts.offsets or [0]
    rows = "".join(f"            w{s} = reinterpret_cast<const LT*>(w + (n + {offs[s]}LL) * {parts.sw}LL);\n"
                   for s in range(S))
    rounded = ", ".join(f"mgx_gemv_f(TO_T(acc[{s}] + 0.0f))" for s in range(S))
    many = int(plan.tpc > 32)
    return f"""#if {many}
    __shared__ float red[{NT // 32}][S];
#endif
    for (long long g0 = (long long)blockIdx.x * COLS; g0 < {parts.L}; g0 += (long long)gridDim.x * COLS) {{
    const long long n = g0 + c;
    float acc[S];
#pragma unroll
    for (int s = 0; s < S; ++s) acc[s] = 0.0f;
    if (n < {parts.L} && n == n1) {{ // the first group: its leading chunks are held in registers
{held}{rest}    }} else if (n < {parts.L}) {{
{rows}{full}    }}
#pragma unroll
    for (int s = 0; s < S; ++s)
        for (int o = {min(plan.tpc, 32) // 2}; o > 0; o >>= 1) acc[s] += MGX_SHFL_XOR(acc[s], o);
#if {many}
    if ((tid & 31) == 0)
        for (int s = 0; s < S; ++s) red[tid >> 5][s] = acc[s];
    __syncthreads();
    if (t == 0)
        for (int s = 0; s < S; ++s) {{
            float v = 0.0f;
            for (int g = 0; g < TPC / 32; ++g) v += red[c * (TPC / 32) + g][s];
            acc[s] = v;
        }}
    __syncthreads(); // red is written again by the next group
#endif
    if (t == 0 && n < {parts.L}) mgx_epilogue(n, {rounded}, NAMES);
    }}
"""


def fused_gemv_source(sub, in_shapes, out_shape, vector: bool = True, prefetch: int = PREFETCH):
    """``(KernelSource, plan, parts)`` of a ``fused_gemv`` instruction over ``sub`` (see the module
    docstring); ``vector``: the 16-byte-load variant; ``prefetch``: the most weight loads per thread
    and row issued before the prologue (:func:`prefetch_depth`).  ValueError when the module is not
    of the fused form."""
    parts = GemvParts(sub, in_shapes)
    plan = make_plan(parts.dtype, 1, parts.K, parts.N, prefetch=prefetch)
    outs = out_shape if isinstance(out_shape, tuple) else (out_shape,)
    if len(outs) != 1 + len(parts.extras) or tuple(outs[0].lens[-1:]) != (parts.L,):
        raise ValueError(f"fused_gemv: results {[o.brief() for o in outs]} do not match the module")
    names = output_names(outs)
    params = param_list(in_shapes, outs)
    sig = ", ".join(f"{t} {n}" for t, n in params)
    call = ", ".join(n for _, n in params)
    acc = "float"
    pro = KernelEmitter(sub, in_shapes)
    helpers = _prologue(pro, parts, acc, outs, names)
    epi = KernelEmitter(sub, in_shapes)
    epi.functions = pro.functions  # one set of op functions, named once
    _epilogue(epi, parts, outs[0], names[0])
    S = max(1, len(parts.slices))
    ds = ", ".join(f"float d{s}" for s in range(S))
    item_t = CTYPES[parts.dtype]
    entry = (f"MGX_HD void mgx_prologue(int tid, int nt, {acc}* sm, {item_t}* xs, bool first, {sig}) {{\n" +
             "\n".join(pro.lines) + "\n}\n" +
             f"MGX_HD void mgx_epilogue(long long n, {ds}, {sig}) {{\n" + "\n".join(epi.lines) + "\n}")
    to_t = "__float2half" if parts.dtype == "float16" else ""  # as gemv.cu stores y
    kernel = (f"#define TO_T {to_t}\n#define NAMES {call}\n"
              f'extern "C" __global__ void __launch_bounds__({NT}) MGX_KERNEL({sig}) {{\n'
              f"    __shared__ {acc} mgx_sm[{NT}];\n"
              f"    __shared__ __align__(16) {item_t} xs[{parts.K}];\n"
              f"    const int tid = (int)threadIdx.x;\n" + _gemv_head(parts, plan, vector) +
              "    MGX_GRID_DEPENDENCY(); // every input but the weight is read, and every output written, after it\n"
              f"    mgx_prologue(tid, {NT}, mgx_sm, xs, blockIdx.x == 0, {call});\n"
              f"    __syncthreads();\n" + _gemv_body(parts, plan, vector) + "}")
    hs = "".join(_warp_helper(k, acc) for k in sorted(helpers))
    ks = finish("gemv", hs, pro, entry, kernel, params, entry="mgx_prologue", extent=parts.L, block=NT,
                grid=-(-parts.L // plan.cols), acc=acc)
    ks.source = ks.source.replace(PRELUDE, GEMV_PRELUDE, 1)
    return ks, plan, parts


def fused_gemv_kernel(sub, in_shapes, out_shape) -> GpuKernel:
    """The :class:`GpuKernel` of a ``fused_gemv`` instruction: one launch; both variants compiled now
    when CuPy is importable (ValueError when the module has no generated form or does not compile).
    Each launch checks the arrays' strides against the ones compiled in, and takes the 16-byte-load
    variant when the weight's rows and data pointer are 16-byte aligned."""
    (vks, plan, parts), (sks, _, _) = (fused_gemv_source(sub, in_shapes, out_shape, v) for v in (True, False))
    from .programmatic_launch import pdl_setting

    pdl = pdl_setting()  # the compile's MIGRAPHX_PDL, for the launches too
    ready = [precompile(k.source, k.name, pdl) for k in (vks, sks)]
    outs = out_shape if isinstance(out_shape, tuple) else (out_shape,)
    layouts = [layout(s) for s in in_shapes] + [layout(s) for s in outs]
    align = plan.vec * np.dtype(plan.dtype).itemsize
    rows_aligned = plan.vec > 1 and (parts.N == 1 or parts.sw % plan.vec == 0)
    grid, block, wk = (vks.grid,), (NT,), parts.weight

    def run(ctx, out, args, ws):
        results = out if isinstance(out, tuple) else (out,)
        check_strides(list(args) + list(results), layouts, vks.name)
        k = 0 if rows_aligned and ctx.data_ptr(args[wk]) % align == 0 else 1
        ks = (vks, sks)[k]
        (ready[k] or compiled_function(ks.source, ks.name, pdl))(grid, block, (*args, *results))

    run.source = vks  # type: ignore[attr-defined]  # a function attribute, for inspection
    run.sources = (vks, sks)  # type: ignore[attr-defined]  # a function attribute, for inspection
    run.plan = plan  # type: ignore[attr-defined]  # a function attribute, for inspection
    return GpuKernel(run, 1, [], True, f"fused_gemv (generated {vks.name}, {plan.cols} columns per block)")
