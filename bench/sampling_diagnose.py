"""Where the device sampling tail (operators/token_sampling.cu) and mgx_graph.llm.sampling's rule disagree.

Runs the top-p configurations of tests/operators/test_token_sampling.py (same logits, seeds and steps) through
:class:`~mgx_graph.operators.token_sampling_gpu.SampleAdvance` and the numpy rule, and prints, per config,
the agreement and for each mismatch: step, row, both ids and their scaled logits ``s``, the rule's kept
set (size, smallest kept ``s``, ``Z`` = e-mass over what top-k keeps, ``p * Z``, the mass above each id)
and the kernel's workspace (row max, candidate bin cut, candidate count, their e-mass, the row's ``Z``).

    python bench/sampling_diagnose.py            # on a GPU
    python bench/sampling_diagnose.py --host     # the kernels emulated on the host (tests/attn_host.py; slow)
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from mgx_graph.llm import sampling as S  # noqa: E402
from mgx_graph.operators.token_sampling_gpu import SampleAdvance  # noqa: E402

CONFIGS = [dict(temperature=0.7, top_p=0.9), dict(top_k=50, top_p=0.9, temperature=0.7),
           dict(top_k=None, top_p=0.9, temperature=0.7), dict(top_k=None, top_p=0.999, temperature=2.0)]
SHAPES = [("float32", 3, 1000), ("float32", 4, 49152), ("float16", 2, 128256)]


def _logits(rng, rows, v, dtype):  # as tests/operators/test_token_sampling.py's
    x = rng.standard_normal((rows, v)) * 3
    x[:, rng.integers(0, v, 4)] += 6
    return x.astype(dtype)


def _rule_detail(s_row, config, kid, rid):
    """The rule's view of one row of scaled logits: kept-set size, smallest kept s, Z, p*Z, masses above."""
    s = s_row[None].astype(np.float32)
    keep = S.kept(s, config)[0]
    e = S._weights(s)[0]
    k = config.top_k or 0
    topk = np.ones_like(keep)
    if 0 < k < s.shape[-1]:
        topk = s[0] >= np.partition(s[0], s.shape[-1] - k)[s.shape[-1] - k]
    ek = np.where(topk, e, 0.0)
    z = float(ek.sum())
    above = S._mass_above(s, ek[None])[0]
    return (f"rule kept {int(keep.sum())} (smallest kept s {float(s[0][keep].min()):.6f}), Z {z:.6f}, "
            f"p*Z {config.top_p * z:.6f}; mass above kernel id {above[kid]:.6f} (kept {bool(keep[kid])}), "
            f"above rule id {above[rid]:.6f} (kept {bool(keep[rid])})")


def _kernel_detail(ctx, dev, r, s_row):
    h = {n: np.asarray(ctx.to_host(getattr(dev, n), ctx.queue)) for n in ("rowm", "cut", "ncand", "z")}
    m, cut = float(h["rowm"][r]), int(h["cut"][r])
    d = m - s_row.astype(np.float32)
    bins = np.where(d < 16, np.floor(d * 4), 64)
    cand_mass = float(np.exp(s_row[bins <= cut].astype(np.float64) - m).sum())
    return (f"kernel max {m:.6f}, cut bin {cut}, candidates {int(h['ncand'][r])} (e-mass {cand_mass:.6f}), "
            f"row Z {float(h['z'][r]):.6f}")


def _run_config(ctx, run_tail, dtype, rows, v, cfg, steps, seed=2024):
    rng = np.random.default_rng(v + rows)
    config = S.SamplingConfig(do_sample=True, **cfg)
    dev = SampleAdvance(ctx, rows, v, dtype)
    host = S.TokenSampler(config, rows, v)
    host.seed = seed
    rng.integers(0, v, 10)  # the test's seen tokens (no penalty here)
    dev.set_seen(None, ctx.queue)
    same = total = 0
    for step in range(steps):
        x = _logits(rng, rows, v, dtype)
        want = host.choose(x)
        ids = ctx.xp.full((rows,), -1, np.int64)
        run_tail(dev, ctx.xp.asarray(x), ids, config, seed, step)
        got = np.asarray(ctx.to_host(ids, ctx.queue))
        same += int((got == want).sum())
        total += rows
        s = S.temperature(x.astype(np.float32), config.temperature)
        u = S.uniforms(seed, step, rows)
        for r in np.flatnonzero(got != want):
            k, w = int(got[r]), int(want[r])
            print(f"  step {step} row {r}: kernel id {k} (s {s[r, k]:.6f}) rule id {w} (s {s[r, w]:.6f}) u {u[r]:.8f}")
            if 0 <= k < v:
                print("    " + _rule_detail(s[r], config, k, w))
            print("    " + _kernel_detail(ctx, dev, r, s[r]))
    return same / total


def _host_runner():
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import test_token_sampling

    run = test_token_sampling._host_tail()

    def tail(dev, *a):
        dev.select_threads = 128
        run(dev, *a)
    return tail


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", action="store_true", help="emulate the kernels on the host (needs g++)")
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args(argv)
    from mgx_graph.targets import make_context

    if args.host:
        ctx, run_tail, shapes = make_context("ref"), _host_runner(), SHAPES[:1]
    else:
        ctx, shapes = make_context("gpu"), SHAPES
        run_tail = lambda dev, x, ids, cfg, seed, step: dev(x.reshape(-1), ids, cfg, seed, step)  # noqa: E731
    bad = 0
    for dtype, rows, v in shapes:
        for cfg in CONFIGS:
            steps = 8 if cfg.get("top_p") == 0.999 else args.steps
            name = ",".join(f"{k}={x}" for k, x in cfg.items())
            print(f"{dtype} [{rows}, {v}] {name} (top_k {S.SamplingConfig(**cfg).top_k}): {steps} steps", flush=True)
            if args.host:
                agree = _run_config(ctx, run_tail, dtype, rows, v, cfg, steps)
            else:
                with ctx.on_queue(ctx.queue):
                    agree = _run_config(ctx, run_tail, dtype, rows, v, cfg, steps)
            bad += agree < 0.999
            print(f"  agree {agree:.4f}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
