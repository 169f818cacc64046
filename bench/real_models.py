"""Real models from PyPI packages against onnxruntime CPU: max abs / relative error per output and
pass/fail against each model's stated tolerance, per target, graphs off and on, with the graph stats
(regions, captures, replays, fallbacks) and the ops that ran on the host.

Covers ``mgx_graph.models.pypi.REAL_MODELS`` (seeded random inputs), all-MiniLM-L6-v2 (three real
sentences, padded; also against transformers) and the silero-vad models (30 streamed chunks with the
state fed back; the error is the worst chunk's).

    python bench/real_models.py --target ref --out bench/results/real_models_ref.json
    python bench/real_models.py --target gpu --out bench/results/real_models_h200.json

``--peers``: the same models timed on mgx_graph (eager, graph) next to onnxruntime CPU, CUDA EP and CUDA EP
with CUDA graphs, with the error against onnxruntime CPU (see ``bench/peers.py``); writes
``{"machine", "target", "runs", "warmup", "models": {name: {...}}}`` and a PNG bar chart beside it:

    python bench/real_models.py --target gpu --peers -n 50     # -> bench/results/real_models_gpu_h200.json
    python bench/real_models.py --target ref --peers -n 3 --out /tmp/peers.json --only magika
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from machine import machine_info  # noqa: E402

MINILM_SENTENCES = ["A man is eating food.", "The new movie is awesome, and everyone in the theatre loved it.",
                    "GPU graphs replay a captured kernel sequence as one launch."]
MINILM_ATOL = 2e-5


def _summary(prog) -> dict:
    st = prog.stats()
    return {"regions": len(st["regions"]), "captures": st["captures"], "replays": st["replays"],
            "fallbacks": st["fallbacks"], "eager_runs": st["eager_runs"],
            "region_names": [r["region"] for r in st["regions"]]}


def _row(name, target, hip_graph, errs, rtol, atol, ok, prog, seconds, **extra) -> dict:
    return {"model": name, "target": target, "graph": hip_graph,
            "max_abs_error": max(a for a, _ in errs),
            "max_rel_error": max((r for _, r in errs if r is not None), default=None),
            "rtol": rtol, "atol": atol, "pass": bool(ok),
            "host_fallback_ops": list(getattr(prog, "host_fallback_ops", []) or []),
            "seconds": round(seconds, 2), **_summary(prog), **extra}


def run_pypi(name, target, hip_graph, cache):
    import numpy as np
    import onnxruntime as ort

    import mgx_graph
    from mgx_graph.models.oracle import ort_cpu_options
    from mgx_graph.models.pypi import REAL_MODELS, errors, model_path, random_feeds

    m = REAL_MODELS[name]
    path = model_path(name, cache)
    sess = ort.InferenceSession(path, ort_cpu_options(), providers=["CPUExecutionProvider"])
    feeds = random_feeds(sess, m.input_dims, m.int_high)
    want = sess.run(None, feeds)
    t0 = time.perf_counter()
    prog = mgx_graph.compile(path, target=target, hip_graph=hip_graph,
                             input_dims={k: list(v.shape) for k, v in feeds.items()})
    errs, ok = [], True
    for _ in range(4 if hip_graph else 1):  # every run is checked: warmups, capture, replay
        got = prog.run(feeds)
        run_errs = errors(got, want)
        errs = [(max(a, b), max(r, s)) for (a, r), (b, s) in zip(errs, run_errs)] if errs else run_errs
        # the test's criterion: |got - want| <= atol + rtol * |want| element-wise (+ the same argmax)
        ok = ok and all(np.allclose(g, w, rtol=m.rtol, atol=m.atol) and
                        (m.argmax_axis is None or np.array_equal(g.argmax(m.argmax_axis), w.argmax(m.argmax_axis)))
                        for g, w in zip(got, want))
    return _row(name, target, hip_graph, errs, m.rtol, m.atol, ok, prog, time.perf_counter() - t0)


def run_minilm(target, hip_graph, cache):
    import numpy as np
    import onnxruntime as ort

    import mgx_graph
    from mgx_graph.models import build
    from mgx_graph.models.oracle import hf_sentence_embeddings, tokenize_batch
    from mgx_graph.models.pypi import errors

    info = build("minilm", cache_dir=cache, progress=False)
    feeds = tokenize_batch(info, MINILM_SENTENCES)
    want = ort.InferenceSession(str(info.onnx_path), providers=["CPUExecutionProvider"]).run(None, feeds)
    hf = hf_sentence_embeddings(info, feeds)
    t0 = time.perf_counter()
    shape = list(feeds["input_ids"].shape)
    prog = mgx_graph.compile(str(info.onnx_path), target=target, hip_graph=hip_graph,
                             input_dims={k: shape for k in feeds})
    for _ in range(4 if hip_graph else 1):
        got = prog.run(feeds)
    errs = errors(got, want)
    hf_err = float(np.max(np.abs(got[0] - hf)))
    ok = all(a <= MINILM_ATOL for a, _ in errs) and hf_err <= MINILM_ATOL
    return _row("minilm", target, hip_graph, errs, 0.0, MINILM_ATOL, ok, prog, time.perf_counter() - t0,
                max_abs_error_vs_transformers=hf_err)


def run_silero(name, target, hip_graph, cache):
    import mgx_graph
    from mgx_graph.models.pypi import SILERO_MODELS, SILERO_STREAM_ATOL, silero_path, silero_stream

    n, has_sr = SILERO_MODELS[name]
    path = silero_path(name, cache)
    t0 = time.perf_counter()
    prog = mgx_graph.compile(path, target=target, hip_graph=hip_graph,
                             input_dims={"input": [1, n], "state": [2, 1, 128]} if has_sr else None)
    worst = silero_stream(path, prog.run, 30)
    atol = SILERO_STREAM_ATOL
    return _row(name, target, hip_graph, [(max(worst), None)], 0.0, atol, max(worst) < atol, prog,
                time.perf_counter() - t0, chunks=len(worst))


def peer_cases(cache) -> list:
    """(name, function returning a :class:`peers.Case`) for every model the peer benchmark covers."""
    from peers import minilm_case, pypi_case, silero_case

    from mgx_graph.models.pypi import REAL_MODELS, SILERO_MODELS

    jobs = [(n, lambda n=n: pypi_case(n, cache)) for n in sorted(REAL_MODELS)]
    jobs += [("minilm", lambda: minilm_case(cache, MINILM_SENTENCES, MINILM_ATOL))]
    jobs += [(n, lambda n=n: silero_case(n, cache)) for n in sorted(SILERO_MODELS)]
    return jobs


def run_peers(args) -> int:
    """``--peers``: one row per model with every column of bench/peers.py; writes the JSON and the PNG."""
    import peers

    cache = os.environ.get("MGX_GRAPH_CACHE")
    out = args.out or os.path.join(HERE, "results", f"real_models_{args.target}"
                                   f"{'_h200' if args.target == 'gpu' else '_peers'}.json")
    res = {"machine": machine_info(), "target": args.target, "runs": args.n, "warmup": args.warmup,
           "cuda_unavailable": peers.cuda_unavailable(), "models": {}}
    for name, make in peer_cases(cache):
        if args.only and name not in args.only:
            continue
        t0 = time.perf_counter()
        try:
            row = peers.run_case(make(), args.target, args.n, args.warmup)
        except Exception as e:  # noqa: BLE001 - a model that cannot load (download, onnxruntime) is one row
            row = {c: None for c in peers.COLUMNS}
            row.update(passed=False, max_abs_err=None, error=f"{type(e).__name__}: {e}")
        row["seconds"] = round(time.perf_counter() - t0, 2)
        res["models"][name] = row
        print(f"{name:32s} " + "  ".join(f"{c[:-3]} {row[c]:.3f}" if row.get(c) is not None else f"{c[:-3]} -"
                                         for c in peers.COLUMNS)
              + f"  host {row.get('host_fallback_instructions', '-')}  max abs {row.get('max_abs_err')}  "
              f"{'PASS' if row['passed'] else 'FAIL'}" + (f"  {row['error']}" if "error" in row else ""), flush=True)
    png = os.path.splitext(out)[0] + ".png"
    why = peers.write_chart(res, png)
    res["chart"] = None if why else os.path.basename(png)
    if why:
        res["chart_reason"] = why
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    n_pass = sum(r["passed"] for r in res["models"].values())
    print(f"{n_pass}/{len(res['models'])} passed; wrote {out}" + (f" and {png}" if not why else f" (no chart: {why})"))
    return 0 if n_pass == len(res["models"]) else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="ref", choices=["ref", "gpu"])
    ap.add_argument("--out", help="JSON to write (required without --peers; with it the default is "
                                  "bench/results/real_models_gpu_h200.json for gpu, real_models_ref_peers.json for ref)")
    ap.add_argument("--only", nargs="*", help="model names to run (default: all)")
    ap.add_argument("--peers", action="store_true", help="time mgx_graph against onnxruntime CPU / CUDA / CUDA graph")
    ap.add_argument("-n", type=int, default=50, help="--peers: timed runs per column (median)")
    ap.add_argument("--warmup", type=int, default=5, help="--peers: untimed runs before the timed ones")
    args = ap.parse_args(argv)
    if args.peers:
        if args.n < 1 or args.warmup < 0:
            ap.error("-n must be at least 1 and --warmup at least 0")
        return run_peers(args)
    if not args.out:
        ap.error("--out is required without --peers")
    import mgx_graph
    from mgx_graph.models.pypi import REAL_MODELS, SILERO_MODELS

    cache = os.environ.get("MGX_GRAPH_CACHE")
    jobs = [(n, lambda t, g, n=n: run_pypi(n, t, g, cache)) for n in sorted(REAL_MODELS)]
    jobs += [("minilm", lambda t, g: run_minilm(t, g, cache))]
    jobs += [(n, lambda t, g, n=n: run_silero(n, t, g, cache)) for n in sorted(SILERO_MODELS)
             if n not in REAL_MODELS]
    rows = []
    for name, job in jobs:
        if args.only and name not in args.only:
            continue
        for hip_graph in (False, True):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    row = job(args.target, hip_graph)
                except (mgx_graph.MgxError, RuntimeError, ValueError) as e:
                    row = {"model": name, "target": args.target, "graph": hip_graph, "pass": False,
                           "error": f"{type(e).__name__}: {e}"}
            rows.append(row)
            print(f"{name:32s} {args.target} graph={'on ' if hip_graph else 'off'} "
                  f"{'PASS' if row['pass'] else 'FAIL'}  max abs {row.get('max_abs_error', float('nan')):.3e}  "
                  f"regions {row.get('regions', '-')}  captures {row.get('captures', '-')}  "
                  f"replays {row.get('replays', '-')}  fallbacks {row.get('fallbacks', '-')}"
                  + (f"  {row['error']}" if "error" in row else ""), flush=True)
    res = {"target": args.target, "rows": rows, "passed": sum(r["pass"] for r in rows), "total": len(rows),
           "machine": machine_info()}
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"{res['passed']}/{res['total']} passed; wrote {args.out}")
    return 0 if res["passed"] == res["total"] else 1


if __name__ == "__main__":
    sys.exit(main())
