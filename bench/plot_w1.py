"""Bar charts of the decode benchmarks, written as a PNG beside the JSON:

* a W1 result file of ``bench/w1_decode.py`` (:func:`plot`): ms/token and kernels per token of each
  configuration (fp16 / fp32, eager / graph);
* a peers result file of ``bench/w1_peers.py`` (:func:`plot_peers`, chosen when the JSON has ``results``):
  ms/token, prefill ms and kernels per token of every measured row, one group per workload.

    python bench/plot_w1.py bench/results/w1_smollm2_h200.json      # -> bench/results/w1_smollm2_h200.png

Needs matplotlib; without it, says so and exits 1.
"""
from __future__ import annotations

import json
import os
import sys


def plot(path: str) -> str:
    """Write ``<path without .json>.png`` from the W1 JSON at ``path``; returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path) as f:
        d = json.load(f)
    rows = d["configs"]
    names = [f"{'fp16' if r['fp16'] else 'fp32'} {'graph' if r['hip_graph'] else 'eager'}" for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(names, [r["ms_per_token"] for r in rows], color="tab:blue")
    a.set_ylabel("ms / token (median)")
    a.set_title("W1 SmolLM2-135M decode, batch 1")
    b.bar(names, [r["launches_per_run_eager"] for r in rows], color="tab:orange")
    b.set_ylabel("kernels per token (eager program)")
    machine = d.get("machine", {})
    fig.suptitle(f"{machine.get('gpu', '?')} - {machine.get('date', '')[:10]}", fontsize=9)
    for ax in (a, b):
        ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    out = os.path.splitext(path)[0] + ".png"
    fig.savefig(out, dpi=100)
    return out


PEER_COLORS = {"mgx_graph": "tab:blue", "mgx_eager": "tab:cyan", "mgx_graph_genai_folder": "tab:purple",
               "onnxruntime_genai": "tab:green", "ort_cuda_graph": "tab:olive", "torch_cuda_graph": "tab:red"}


def plot_peers(path: str) -> str:
    """Write ``<path without .json>.png`` from the ``bench/w1_peers.py`` JSON at ``path`` (rows without a
    measurement are left out; log scale for the times); returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path) as f:
        d = json.load(f)
    rows = sorted((r for r in d["results"] if r.get("ms_per_token")), key=lambda r: r["workload"])
    names = [f"{r['workload']} {r['system']} {r['precision']}" for r in rows]
    colors = [PEER_COLORS.get(r["system"], "tab:gray") for r in rows]
    panels = (("ms_per_token", "ms / token (median, log)", True), ("prefill_ms", "prefill ms (warm, log)", True),
              ("kernels_per_token", "kernels per token", False))
    fig, axes = plt.subplots(1, 3, figsize=(max(12.0, 0.9 * len(rows) + 6), 5.0))
    for ax, (key, label, log) in zip(axes, panels):
        vals = [r.get(key) or 0 for r in rows]
        ax.bar(range(len(rows)), vals, color=colors)
        for i, v in enumerate(vals):
            if v:
                ax.text(i, v, f"{v:.3g}", ha="center", va="bottom", fontsize=6, rotation=90)
        if log and any(vals):
            ax.set_yscale("log")
        ax.set_ylabel(label)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
    machine = d.get("machine", {})
    fig.suptitle(f"decode vs peers, batch 1, target {d.get('target')}: {machine.get('gpu') or machine.get('cpu', '')}"
                 f" - {machine.get('date', '')[:10]}"[:140], fontsize=9)
    fig.tight_layout()
    out = os.path.splitext(path)[0] + ".png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python bench/plot_w1.py RESULT.json")
    try:
        with open(sys.argv[1]) as f:
            peers = "results" in json.load(f)
        print(plot_peers(sys.argv[1]) if peers else plot(sys.argv[1]))
    except ImportError:
        sys.exit("plot_w1: matplotlib is not installed (pip install matplotlib)")
