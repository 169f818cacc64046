"""Run ``operators/decode_attention.cu`` on the host, so its arithmetic is checked on a machine without a GPU.

The kernel source of a :class:`mgx_graph.operators.attention_gpu.Plan` is built with g++ (C++20) behind a
shim: each block runs as ``blockDim.x`` fibers (ucontext) on the calling thread, one after another until
each waits at a barrier or returns (on 2 cores, thousands of OS threads meeting at barriers took minutes
where the fibers take seconds), ``__syncthreads()`` is a barrier of those fibers, ``__shared__`` variables
are function-local statics (one block runs at a time, so they are that block's shared memory) and
``__half`` is ``_Float16``.  ``__shfl_sync`` / ``__shfl_xor_sync`` exchange values within a group of 32
consecutive threads through a buffer between two barriers of that group (a template, so a source may
declare its own overloads), so a warp whose lanes do not all reach a shuffle is reported as a hang
(:func:`launch` raises), as it would be wrong on the device.  So the index arithmetic, the chunk
loop, the shared-memory reductions, the online softmax and the split merge run as on the device, block by
block (not the device's memory model or its float16 / fused multiply-add rounding)."""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile

import numpy as np

from mgx_graph.ir.shape import Shape


_SHIM = r"""
#define MGX_HOST_EMULATION 1
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <ucontext.h>
#include <atomic>
#include <memory>
#include <vector>
struct mgx_dim3 { unsigned x, y, z; };
mgx_dim3 threadIdx;  // the running thread's: set by the scheduler before it resumes a thread
static mgx_dim3 blockIdx, blockDim, gridDim;
// Each CUDA thread of a block is a fiber (ucontext) on the calling OS thread: it runs until it waits at a
// barrier or returns, then the scheduler resumes the next one, in thread order, pass after pass.
struct mgx_barrier_t { unsigned n, arrived, gen; };
static mgx_barrier_t mgx_block_barrier, mgx_warp_barrier[32];
static ucontext_t mgx_sched;
static std::vector<ucontext_t> mgx_ctx;
static std::vector<char> mgx_done;
static unsigned mgx_cur;
static unsigned long long mgx_events;  // arrivals and returns: a pass without one is a hang
static int mgx_hung;
static void (*mgx_fn)(void*);
static void* mgx_arg;
static void mgx_wait(mgx_barrier_t& b) {
    const unsigned g = b.gen;
    ++mgx_events;
    if (++b.arrived == b.n) { b.arrived = 0; ++b.gen; return; }
    while (b.gen == g) swapcontext(&mgx_ctx[mgx_cur], &mgx_sched);
}
#define __syncthreads() mgx_wait(mgx_block_barrier)
#define __threadfence() std::atomic_thread_fence(std::memory_order_seq_cst)
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct __half { _Float16 v; operator float() const { return (float)v; } };
static inline float __half2float(__half h) { return (float)h.v; }
static inline __half __float2half(float f) { __half h; h.v = (_Float16)f; return h; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline long long __double_as_longlong(double d) { long long u; memcpy(&u, &d, 8); return u; }
template <class V> static inline V mgx_lane_value(V v, unsigned src) {
    static unsigned long long slot[1024];
    const unsigned t = threadIdx.x, w = t / 32;
    memcpy(&slot[t], &v, sizeof(V));
    mgx_wait(mgx_warp_barrier[w]);
    V r;
    memcpy(&r, &slot[w * 32 + (src & 31)], sizeof(V));
    mgx_wait(mgx_warp_barrier[w]);
    return r;
}
template <class V> static inline V __shfl_sync(unsigned, V v, int src) { return mgx_lane_value(v, (unsigned)src); }
template <class V> static inline V __shfl_xor_sync(unsigned, V v, int o) {
    return mgx_lane_value(v, (threadIdx.x & 31) ^ (unsigned)o);
}
static void mgx_entry() {
    mgx_fn(mgx_arg);
    mgx_done[mgx_cur] = 1;
    ++mgx_events;
}
extern "C" int mgx_host_hung() { return mgx_hung; }
static bool mgx_block(unsigned nt) {
    static std::vector<std::unique_ptr<char[]>> stacks;
    const size_t stack = 256 * 1024;
    while (stacks.size() < nt) stacks.emplace_back(new char[stack]);
    mgx_block_barrier = {nt, 0, 0};
    for (unsigned w = 0; w * 32 < nt && w < 32; ++w) mgx_warp_barrier[w] = {nt - w * 32 < 32 ? nt - w * 32 : 32, 0, 0};
    mgx_ctx.assign(nt, ucontext_t{});
    mgx_done.assign(nt, 0);
    for (unsigned t = 0; t < nt; ++t) {
        getcontext(&mgx_ctx[t]);
        mgx_ctx[t].uc_stack.ss_sp = stacks[t].get();
        mgx_ctx[t].uc_stack.ss_size = stack;
        mgx_ctx[t].uc_link = &mgx_sched;
        makecontext(&mgx_ctx[t], mgx_entry, 0);
    }
    for (unsigned left = nt; left;) {
        const unsigned long long before = mgx_events;
        for (unsigned t = 0; t < nt; ++t) {
            if (mgx_done[t]) continue;
            mgx_cur = t;
            threadIdx = {t, 0, 0};
            swapcontext(&mgx_sched, &mgx_ctx[t]);
            if (mgx_done[t]) --left;
        }
        if (left && mgx_events == before) return false;  // every live thread waits: they cannot all arrive
    }
    return true;
}
template <class F> static void mgx_grid(unsigned gx, unsigned gy, unsigned nt, F f) {
    blockDim = {nt, 1, 1};
    gridDim = {gx, gy, 1};
    mgx_fn = [](void* p) { (*static_cast<F*>(p))(); };
    mgx_arg = &f;
    mgx_hung = 0;
    for (unsigned y = 0; y < gy; ++y)
        for (unsigned x = 0; x < gx; ++x) {
            blockIdx = {x, y, 0};
            if (!mgx_block(nt)) { mgx_hung = 1; return; }
        }
}
"""
_KERNEL = re.compile(r'extern "C" __global__ void (?:(?:__launch_bounds__\([\w, ]+\)|MGX_WARP_BOUNDS) )?'
                     r'(\w+)\(([^)]*)\)', re.S)
_DIR = os.path.join(tempfile.gettempdir(), "mgx_attn_host")


def available() -> bool:
    return shutil.which("g++") is not None


def _signatures(src: str) -> dict:
    """``{kernel name: [(C type, parameter name), ...]}`` of the source's kernels."""
    sigs = {}
    for name, params in _KERNEL.findall(src):
        items = []
        for p in params.split(","):
            toks = p.replace("*", " * ").split()
            items.append((" ".join(toks[:-1]), toks[-1]))
        sigs[name] = items
    return sigs


def _compiled_kernels(source: str, sigs: dict) -> dict:
    """The kernels of ``sigs`` that the source defines once preprocessed for the host (a kernel inside
    an ``#if`` of its configuration that is off is left out); all of them when g++ cannot preprocess it."""
    r = subprocess.run(["g++", "-std=c++20", "-E", "-P", "-x", "c++", "-"], capture_output=True, text=True,
                       input="#define MGX_HOST_EMULATION 1\n" + source)
    if r.returncode:
        return sigs
    present = {n for n, _ in _KERNEL.findall(r.stdout)}
    return {n: p for n, p in sigs.items() if n in present}


def _wrappers(sigs: dict) -> str:
    out = []
    for name, params in sigs.items():
        decl = ", ".join(f"{t} {n}" for t, n in params)
        call = ", ".join(n for _, n in params)
        out.append(f'extern "C" void host_{name}(unsigned gx, unsigned gy, unsigned nt, {decl}) {{\n'
                   f"    mgx_grid(gx, gy, nt, [&] {{ {name}({call}); }});\n}}\n")
    return "".join(out)


_LIBS: dict = {}


def build(source: str):
    """``(library, signatures)`` of a kernel source (a plan's, or an ``operators/*.cu`` file with its
    typedefs) built for the host (cached by content)."""
    hit = _LIBS.get(source)
    if hit is not None:
        return hit
    sigs = _compiled_kernels(source, _signatures(source))
    full = _SHIM + source + _wrappers(sigs)
    os.makedirs(_DIR, exist_ok=True)
    base = os.path.join(_DIR, hashlib.sha1(full.encode()).hexdigest()[:16])
    if not os.path.exists(base + ".so"):  # built under names of this process, then renamed (xdist workers)
        part = f"{base}.{os.getpid()}"
        with open(part + ".cpp", "w") as f:
            f.write(full)
        r = subprocess.run(["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-ffp-contract=off",
                            "-o", part + ".so", part + ".cpp"], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"g++ failed on {part}.cpp:\n{r.stderr[-4000:]}")
        os.replace(part + ".so", base + ".so")
        os.unlink(part + ".cpp")
    _LIBS[source] = (ctypes.CDLL(base + ".so"), sigs)
    return _LIBS[source]


def _arg(ctype: str, v):
    if "*" in ctype:
        if v is None:
            return ctypes.c_void_p(None)
        assert isinstance(v, np.ndarray), ctype
        return ctypes.c_void_p(v.__array_interface__["data"][0])
    if ctype == "long long":
        return ctypes.c_longlong(int(v))
    if ctype == "int":
        return ctypes.c_int(int(v))
    assert ctype == "float", ctype
    return ctypes.c_float(float(v))


def launch(lib, sigs, name, grid, block, args):
    """Run kernel ``name`` of a :func:`build` over ``grid`` blocks of ``block`` threads; ``args`` as the
    gpu launch takes them, numpy arrays for pointers (None: a null pointer)."""
    params = sigs[name]
    assert len(params) == len(args), (name, len(params), len(args))
    gy = grid[1] if len(grid) > 1 else 1
    getattr(lib, f"host_{name}")(ctypes.c_uint(grid[0]), ctypes.c_uint(gy), ctypes.c_uint(block),
                                 *[_arg(t, a) for (t, _), a in zip(params, args)])
    if lib.mgx_host_hung():
        raise AssertionError(f"{name}: the threads of a block or warp did not all reach a barrier (a hang on the device)")


def run(plan, arrays: dict, out: np.ndarray, vector: bool = True) -> None:
    """Run ``plan`` (both kernels when it splits) over numpy ``arrays`` (by role, as the gpu launch takes
    them) into ``out``; ``vector``: the 16-byte-load variant (the arrays must then be aligned)."""
    lib, sigs = build(plan.source(vector))
    part = None
    if plan.splits > 1:
        part = np.full(plan.workspace()[0].lens, np.nan, np.float32)
    launch(lib, sigs, plan.kernel, plan.grid, plan.block[0], plan.split_args(arrays, out, part))
    if part is not None:
        launch(lib, sigs, "mgx_attn_combine", plan.combine_grid, plan.defines(vector)["CT"],
                plan.combine_args(arrays, out, part))


def shape_of(a: np.ndarray) -> Shape:
    """The :class:`~mgx_graph.ir.shape.Shape` of a numpy array: its dtype, dims and strides in elements."""
    return Shape(a.dtype.name, a.shape, tuple(s // a.itemsize for s in a.strides))


def kv_cache(rng, dtype, B, Nkv, P, D, layout):
    """A random K or V cache [B, Nkv, P, D]: ``standard``; ``cache``: a transpose of a [P, B, Nkv, D] buffer (the
    exports' scatternd layout); ``strided``: the head dim not contiguous (element-wise loads)."""
    if layout == "cache":
        return rng.normal(size=(P, B, Nkv, D)).astype(dtype).transpose(1, 2, 0, 3)
    if layout == "strided":
        return rng.normal(size=(B, Nkv, D, P)).astype(dtype).transpose(0, 1, 3, 2)
    return rng.normal(size=(B, Nkv, P, D)).astype(dtype)
