"""Bar chart of a W1 result file (``bench/w1_decode.py``): ms/token and kernels per token of each
configuration (fp16 / fp32, eager / graph), written as a PNG beside the JSON.

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


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python bench/plot_w1.py RESULT.json")
    try:
        print(plot(sys.argv[1]))
    except ImportError:
        sys.exit("plot_w1: matplotlib is not installed (pip install matplotlib)")
