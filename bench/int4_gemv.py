"""The int4 decode GEMV of ``matmul_nbits`` on the gpu: ``gemv_nbits.cu``'s fused kernel against its
dequantization kernel + a cuBLAS GEMM (the prefill path) and, when torch is importable, torch's float16
``x @ W^T`` over an already dequantized weight (4x the bytes: what int4 saves), for the Llama-3.2-1B and
Llama-3-8B decode shapes (K x N: 2048x2048, 2048x8192, 8192x2048, 4096x4096, 4096x14336, 14336x4096,
4096x128256) at block sizes 32 and 128, one row, float16.

Each timing captures ``copies`` launches over distinct random weights (so the weights stream from memory,
not the L2: at least ``--min-bytes`` of them) into one CUDA graph, replays it and divides the replays' time
(CUDA events) by the launches: kernel time without launch overhead.  The kernels are built without
programmatic dependent launch (as with ``MIGRAPHX_PDL=0``), so the launches do not overlap.  Reported per
shape: µs per launch and achieved GB/s (bytes of packed weight + scales + zero points per launch / time;
for torch its float16 weight's bytes), and the largest difference of the fused output from the GEMM
path's, relative to its largest magnitude.  For a prefill of ``--prefill-rows`` rows it also times the
dequantization kernel + cuBLAS against the op's array-library evaluation (several elementwise kernels,
then the GEMM: what every row count ran before ``gemv_nbits.cu``).  Writes JSON (with the machine's
details) and a PNG beside it.

    python bench/int4_gemv.py --out bench/results/int4_gemv_h100.json [--blocks 32 128] [--zero-points packed]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import machine_info  # noqa: E402

SHAPES = [("Llama-3.2-1B q / o", 2048, 2048), ("Llama-3.2-1B gate / up", 2048, 8192),
          ("Llama-3.2-1B down", 8192, 2048), ("Llama-3-8B q / o", 4096, 4096),
          ("Llama-3-8B gate / up", 4096, 14336), ("Llama-3-8B down", 14336, 4096),
          ("Llama-3-8B lm_head", 4096, 128256)]


def weight_bytes(K: int, N: int, bits: int, block: int, zero_points: str, scale_bytes: int = 2) -> int:
    """Bytes one MatMulNBits launch reads of its weight: packed B, scales, zero points."""
    kb = -(-K // block)
    zp = {"none": 0, "packed": N * -(-kb * bits // 8), "float": N * kb * scale_bytes}[zero_points]
    return N * kb * block * bits // 8 + N * kb * scale_bytes + zp


def copies_for(nbytes: int, min_bytes: int, most: int = 256) -> int:
    """Launches per graph: distinct weights of at least ``min_bytes`` together, 2 .. ``most``."""
    return max(2, min(most, -(-min_bytes // max(nbytes, 1))))


def _graph_us(cupy, stream, launch, copies: int, seconds: float = 0.3) -> float:
    """µs per launch of ``launch(r)`` for r < copies, captured into one graph and replayed."""
    with stream:
        launch(0)  # compiles, makes the BLAS handle outside the capture
        stream.synchronize()
        stream.begin_capture()
        for r in range(copies):
            launch(r)
        graph = stream.end_capture()
    if hasattr(graph, "upload"):
        graph.upload(stream)
    for _ in range(3):
        graph.launch(stream)
    stream.synchronize()
    t0 = time.perf_counter()
    graph.launch(stream)
    stream.synchronize()
    iters = int(min(200, max(5, seconds / max(time.perf_counter() - t0, 1e-6))))
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    for _ in range(iters):
        graph.launch(stream)
    end.record(stream)
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) * 1000.0 / (iters * copies)


def _operands(cupy, K, N, bits, block, zero_points, copies):
    """``copies`` random weights (B, scales, zero points) on the device."""
    kb = -(-K // block)
    out = []
    for _ in range(copies):
        b = cupy.random.randint(0, 256, (N, kb, block * bits // 8), dtype=cupy.uint8)
        s = (cupy.random.random((N, kb), dtype=cupy.float32) * 0.02 + 0.001).astype(cupy.float16)
        zp = None
        if zero_points == "packed":
            zp = cupy.random.randint(0, 256, (N, -(-kb * bits // 8)), dtype=cupy.uint8)
        elif zero_points == "float":
            zp = (cupy.random.random((N, kb), dtype=cupy.float32) * ((1 << bits) - 1)).astype(cupy.float16)
        out.append((b, s, zp))
    return out


def _kernels(op, w, M: int, P: int, weights, cupy) -> list:
    """(key, fn(ctx, out, args, ws), rows, workspace arrays) of each timed path: the fused GEMV and the
    dequantization + cuBLAS at ``M`` rows; at ``P`` rows (a prefill) the dequantization + cuBLAS and the
    op's array-library evaluation (several elementwise kernels, then the GEMM: what ran before
    gemv_nbits.cu)."""
    from mgx_graph.ir.shape import Shape
    from mgx_graph.operators.quantized_gpu import DequantPlan, dequant_gemm_kernel, gemv_kernel, make_gemv_plan

    ins = [Shape("float16", [P, w.K])] + [Shape(a.dtype.name, list(a.shape)) for a in weights[0] if a is not None]
    ws_before = [cupy.empty(tuple(s.lens), s.np_dtype) for s in op.workspace(ins, Shape("float16", [P, w.N]))]
    ws = [cupy.empty((w.N, w.K), cupy.float16)]
    fused, gemm = gemv_kernel(op, make_gemv_plan(w, M, True)), dequant_gemm_kernel(op, DequantPlan(w), M)
    return [("fused", fused.fn, M, [], fused.label), ("dequant_cublas", gemm.fn, M, ws, gemm.label),
            ("prefill_dequant_cublas", dequant_gemm_kernel(op, DequantPlan(w), P).fn, P, ws, gemm.label),
            ("prefill_before", op.compute, P, ws_before, "elementwise dequantization + gemm")]


def _rel(cupy, got, ref) -> float:
    ref = ref.astype(cupy.float32)
    return float(cupy.abs(got.astype(cupy.float32) - ref).max()) / max(float(cupy.abs(ref).max()), 1e-30)


def measure_ours(ctx, cupy, K, N, bits, block, zero_points, M, min_bytes, prefill_rows=128) -> dict:
    """The paths of :func:`_kernels` for one shape: µs (and GB/s of packed weight read at ``M`` rows),
    labels, and each path's agreement with the dequantization + GEMM at the same rows."""
    from mgx_graph.ir.operation import make_op
    from mgx_graph.ir.shape import Shape
    from mgx_graph.operators.quantized_gpu import weights_of

    op = make_op("matmul_nbits", K=K, N=N, bits=bits, block_size=block, zero_points=zero_points, _const_b=1)
    nbytes = weight_bytes(K, N, bits, block, zero_points)
    copies = copies_for(nbytes, min_bytes)
    weights = _operands(cupy, K, N, bits, block, zero_points, copies)
    shapes = [Shape("float16", [M, K])] + [Shape(a.dtype.name, list(a.shape)) for a in weights[0] if a is not None]
    w = weights_of(op, shapes, Shape("float16", [M, N]))
    paths = _kernels(op, w, M, prefill_rows, weights, cupy)
    xs = {r: cupy.random.standard_normal((r, K), dtype=cupy.float32).astype(cupy.float16) for r in (M, prefill_rows)}
    outs = {key: cupy.zeros((rows, N), cupy.float16) for key, _, rows, _, _ in paths}
    stream = cupy.cuda.Stream(non_blocking=True)
    ctx.current_queue = stream.ptr

    def args(r, rows):
        return [xs[rows]] + [a for a in weights[r] if a is not None]

    row = {"copies": copies, "weight_bytes": nbytes, "prefill_rows": prefill_rows}
    for key, fn, rows, ws, label in paths:
        us = _graph_us(cupy, stream, lambda r: fn(ctx, outs[key], args(r, rows), ws), copies)
        row[f"{key}_us"], row[f"{key}_label"] = round(us, 3), label
        if rows == M:
            row[f"{key}_GBps"] = round(nbytes / us / 1e3, 1)
    with stream:
        for key, fn, rows, ws, _ in paths:
            fn(ctx, outs[key], args(0, rows), ws)
        stream.synchronize()
    row["fused_vs_gemm_max_rel"] = _rel(cupy, outs["fused"], outs["dequant_cublas"])
    row["prefill_before_vs_now_max_rel"] = _rel(cupy, outs["prefill_before"], outs["prefill_dequant_cublas"])
    row["speedup_vs_dequant_cublas"] = round(row["dequant_cublas_us"] / row["fused_us"], 2)
    row["prefill_speedup_vs_before"] = round(row["prefill_before_us"] / row["prefill_dequant_cublas_us"], 2)
    del weights, outs, paths
    cupy.get_default_memory_pool().free_all_blocks()
    return row


def measure_torch(K, N, M, min_bytes) -> dict | None:
    """torch's float16 ``x @ W^T`` (cuBLAS) over dequantized weights, captured and replayed; None
    without torch or its CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    nbytes = N * K * 2
    copies = copies_for(nbytes, min_bytes, most=64)
    ws = [torch.randn(N, K, dtype=torch.float16, device="cuda") for _ in range(copies)]
    x = torch.randn(M, K, dtype=torch.float16, device="cuda")
    out = torch.empty(M, N, dtype=torch.float16, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for w in ws[:2]:
            torch.matmul(x, w.t(), out=out)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for w in ws:
            torch.matmul(x, w.t(), out=out)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    iters = 20
    start.record()
    for _ in range(iters):
        g.replay()
    end.record()
    end.synchronize()
    us = start.elapsed_time(end) * 1000.0 / (iters * copies)
    del ws, g
    torch.cuda.empty_cache()
    return {"torch_fp16_us": round(us, 3), "torch_fp16_GBps": round(nbytes / us / 1e3, 1), "torch_copies": copies,
            "torch_version": torch.__version__}


def plot(result: dict, path: str) -> str:
    """A PNG beside ``path``: per shape and block size, the decode µs per launch and GB/s (one bar per
    kernel), and the prefill µs before and now."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["results"]
    names = [f"{r['shape']}\n{r['K']}x{r['N']} b{r['block']}" for r in rows]
    panels = [("us", f"decode µs per launch, M={result['rows']} (log)",
               [("fused", "gemv_nbits.cu fused", "tab:blue"), ("dequant_cublas", "dequant + cuBLAS", "tab:orange"),
                ("torch_fp16", "torch fp16 (4x bytes)", "tab:red")]),
              ("GBps", "GB/s of packed weight read (torch: its fp16 bytes)",
               [("fused", "gemv_nbits.cu fused", "tab:blue"), ("dequant_cublas", "dequant + cuBLAS", "tab:orange"),
                ("torch_fp16", "torch fp16", "tab:red")]),
              ("us", f"prefill µs, M={result.get('prefill_rows', '?')} (log)",
               [("prefill_dequant_cublas", "dequant_nbits.cu + cuBLAS", "tab:green"),
                ("prefill_before", "elementwise dequantization + cuBLAS (before)", "tab:gray")])]
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(10.0, 0.8 * len(rows) + 4), 11.0))
    for ax, (unit, label, series) in zip(axes, panels):
        width = 0.8 / len(series)
        for k, (key, legend, color) in enumerate(series):
            vals = [r.get(f"{key}_{unit}") or 0 for r in rows]
            if any(vals):
                ax.bar([i + (k - (len(series) - 1) / 2) * width for i in range(len(rows))], vals, width, label=legend,
                       color=color)
        ax.set_ylabel(label, fontsize=8)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(names, fontsize=7, rotation=30, ha="right")
        ax.legend(fontsize=8)
        if unit == "us":
            ax.set_yscale("log")
    machine = result.get("machine", {})
    fig.suptitle(f"MatMulNBits int4 (fp16, {result['zero_points']} zero points) - {machine.get('gpu', '?')} - "
                 f"{machine.get('date', '')[:10]}", fontsize=9)
    fig.tight_layout()
    out = os.path.splitext(path)[0] + ".png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON path (the PNG goes beside it)")
    ap.add_argument("--blocks", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--zero-points", choices=("none", "packed", "float"), default="packed")
    ap.add_argument("--rows", type=int, default=1, help="rows of A (1 .. 8: the fused GEMV)")
    ap.add_argument("--prefill-rows", type=int, default=128, help="rows of A of the prefill timings")
    ap.add_argument("--min-bytes", type=int, default=1 << 30, help="weight bytes per graph, spread over copies")
    ap.add_argument("--no-torch", action="store_true")
    a = ap.parse_args(argv)
    from mgx_graph.runtime import gpu_available

    if not gpu_available():
        print("int4_gemv: needs a GPU with CuPy (the gpu target)", file=sys.stderr)
        return 1
    import cupy

    from mgx_graph.settings import current, using
    from mgx_graph.targets.gpu import GpuContext

    ctx = GpuContext()
    rows = []
    with using(dataclasses.replace(current(), pdl=False)):  # kernels built without the grid dependency wait
        for block in a.blocks:
            for name, K, N in SHAPES:
                row = {"shape": name, "K": K, "N": N, "block": block, "bits": 4}
                row.update(measure_ours(ctx, cupy, K, N, 4, block, a.zero_points, a.rows, a.min_bytes,
                                        a.prefill_rows))
                if not a.no_torch and block == a.blocks[0]:
                    row.update(measure_torch(K, N, a.rows, a.min_bytes) or {})
                rows.append(row)
                print(json.dumps(row), flush=True)
    result = {"bench": "int4_gemv", "rows": a.rows, "prefill_rows": a.prefill_rows, "zero_points": a.zero_points,
              "dtype": "float16", "pdl": False, "machine": machine_info(), "results": rows}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print("wrote", a.out, plot(result, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
