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
path's, relative to its largest magnitude.  Writes JSON (with the machine's details) and a PNG beside it.

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


def measure_ours(ctx, cupy, K, N, bits, block, zero_points, M, min_bytes) -> dict:
    """The fused GEMV and the dequantization + GEMM of one shape: µs, GB/s, labels, agreement."""
    from mgx_graph.ir.operation import make_op
    from mgx_graph.ir.shape import Shape
    from mgx_graph.operators.quantized_gpu import (DequantPlan, dequant_gemm_kernel, gemv_kernel, make_gemv_plan,
                                                   weights_of)

    op = make_op("matmul_nbits", K=K, N=N, bits=bits, block_size=block, zero_points=zero_points, _const_b=1)
    nbytes = weight_bytes(K, N, bits, block, zero_points)
    copies = copies_for(nbytes, min_bytes)
    weights = _operands(cupy, K, N, bits, block, zero_points, copies)
    x = cupy.random.standard_normal((M, K), dtype=cupy.float32).astype(cupy.float16)
    kb = -(-K // block)
    shapes = [Shape("float16", [M, K]), Shape("uint8", [N, kb, block * bits // 8]), Shape("float16", [N, kb])]
    if zero_points != "none":
        shapes.append(Shape(weights[0][2].dtype.name, list(weights[0][2].shape)))
    w = weights_of(op, shapes, Shape("float16", [M, N]))
    fused = gemv_kernel(op, make_gemv_plan(w, M, True))
    gemm = dequant_gemm_kernel(op, DequantPlan(w), M)
    ws = [cupy.empty((N, K), cupy.float16)]
    outs = [cupy.zeros((M, N), cupy.float16) for _ in range(2)]
    stream = cupy.cuda.Stream(non_blocking=True)
    ctx.current_queue = stream.ptr

    def args(r):
        b, s, zp = weights[r]
        return [x, b, s] + ([zp] if zp is not None else [])

    row = {"copies": copies, "weight_bytes": nbytes, "fused_label": fused.label, "gemm_label": gemm.label}
    for key, k, out in (("fused", fused, outs[0]), ("dequant_cublas", gemm, outs[1])):
        us = _graph_us(cupy, stream, lambda r: k.fn(ctx, out, args(r), ws), copies)
        row[f"{key}_us"], row[f"{key}_GBps"] = round(us, 3), round(nbytes / us / 1e3, 1)
    with stream:
        for k, out in ((fused, outs[0]), (gemm, outs[1])):
            k.fn(ctx, out, args(0), ws)
        stream.synchronize()
    ref = outs[1].astype(cupy.float32)
    diff = float(cupy.abs(outs[0].astype(cupy.float32) - ref).max())
    row["fused_vs_gemm_max_rel"] = diff / max(float(cupy.abs(ref).max()), 1e-30)
    row["speedup_vs_dequant_cublas"] = round(row["dequant_cublas_us"] / row["fused_us"], 2)
    del weights, ws, outs
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
    """A PNG beside ``path``: µs per launch and GB/s per shape and block size, one bar per kernel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["results"]
    names = [f"{r['shape']}\n{r['K']}x{r['N']} b{r['block']}" for r in rows]
    series = [("fused", "gemv_nbits.cu fused", "tab:blue"), ("dequant_cublas", "dequant + cuBLAS", "tab:orange"),
              ("torch_fp16", "torch fp16 (4x bytes)", "tab:red")]
    fig, axes = plt.subplots(2, 1, figsize=(max(10.0, 0.8 * len(rows) + 4), 8.0))
    width = 0.8 / len(series)
    for ax, unit, label in ((axes[0], "us", "µs per launch (log)"), (axes[1], "GBps", "GB/s of packed weight read")):
        for k, (key, legend, color) in enumerate(series):
            vals = [r.get(f"{key}_{unit}") or 0 for r in rows]
            if key == "torch_fp16" and unit == "GBps":  # torch's own bytes: the fp16 weight
                legend += ", its own bytes"
            if any(vals):
                ax.bar([i + (k - 1) * width for i in range(len(rows))], vals, width, label=legend, color=color)
        ax.set_ylabel(label)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(names, fontsize=7, rotation=30, ha="right")
        ax.legend(fontsize=8)
    axes[0].set_yscale("log")
    machine = result.get("machine", {})
    fig.suptitle(f"MatMulNBits int4 decode GEMV (M={result['rows']}, fp16, {result['zero_points']} zero points) - "
                 f"{machine.get('gpu', '?')} - {machine.get('date', '')[:10]}", fontsize=9)
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
                row.update(measure_ours(ctx, cupy, K, N, 4, block, a.zero_points, a.rows, a.min_bytes))
                if not a.no_torch and block == a.blocks[0]:
                    row.update(measure_torch(K, N, a.rows, a.min_bytes) or {})
                rows.append(row)
                print(json.dumps(row), flush=True)
    result = {"bench": "int4_gemv", "rows": a.rows, "zero_points": a.zero_points, "dtype": "float16",
              "pdl": False, "machine": machine_info(), "results": rows}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print("wrote", a.out, plot(result, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
