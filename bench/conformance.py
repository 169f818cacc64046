"""ONNX conformance report: the node cases of the ONNX backend suite on mgx_graph, per target and graph
mode, next to onnxruntime (CPU), written to ``docs/conformance.md``.

Each run of a target writes ``bench/results/conformance_<target>.json`` (pass / fail / excluded per
case and graph mode); the markdown is generated from every such file present, so the ``ref`` results
(run anywhere) and the ``gpu`` results (run on a GPU machine) end up in one report.

    python bench/conformance.py --target ref            # + onnxruntime, writes the JSON and the report
    python bench/conformance.py --target gpu            # on a GPU machine
    python bench/conformance.py --report-only
    # in parallel: one process per mode and shard, then join them
    python bench/conformance.py --target gpu --mode eager --shard 0/4 --out-dir OUT   # ... 1/4 .. 3/4, graph
    python bench/conformance.py --target gpu --merge --out-dir OUT
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import sys
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from machine import machine_info  # noqa: E402


def _compare(got, want, rtol, atol) -> bool:
    if len(got) != len(want):
        return False
    for g, e in zip(got, want):
        g, e = np.asarray(g), np.asarray(e)
        if e.dtype == object or g.dtype == object:
            if g.shape != e.shape or not all(a == b for a, b in zip(g.ravel(), e.ravel())):
                return False
            continue
        if g.shape != e.shape or g.dtype != e.dtype:
            return False
        if e.dtype.kind in "fc":
            if not np.allclose(g, e, rtol=rtol, atol=atol, equal_nan=True):
                return False
        elif not np.array_equal(g, e):
            return False
    return True


def op_of(case) -> str:
    nodes = case.model.graph.node
    name = case.name.lower().replace("_", "")
    for n in nodes:
        if n.op_type.lower() in name:
            return n.op_type
    return nodes[0].op_type if nodes else "?"


def _normalize(x):
    from onnx import TensorProto, numpy_helper

    return numpy_helper.to_array(x) if isinstance(x, TensorProto) else x


def run_cases(backend_cls, device, cases, excluded, deadline=None, hosts=None) -> dict:
    """``{case name: "pass" | "fail[: error type]" | "excluded" | "not run"}`` for ``cases`` on
    ``backend_cls`` (an onnx backend) on ``device``; ``excluded``: name patterns not run.  When ``hosts``
    (a dict) is given, it gets ``{case name: stats()["host_fallback_instructions"]}`` for each passing
    case of a backend whose prepared rep has a ``program`` (mgx_graph)."""
    res = {}
    for c in cases:
        if deadline is not None and time.time() > deadline:
            res[c.name] = "not run"
            continue
        if any(re.search(p, c.name + "_" + device.lower()) or re.search(p, c.name) for p in excluded):
            res[c.name] = "excluded"
            continue
        try:
            inputs, outputs = c.data_sets[0]
            inputs = [_normalize(x) for x in inputs]
            outputs = [_normalize(x) for x in outputs]
            rep = backend_cls.prepare(c.model, device)
            got = rep.run(inputs)
            ok = _compare(got, outputs, c.rtol, c.atol)
            res[c.name] = "pass" if ok else "fail"
            if hasattr(rep, "program"):
                if ok and hosts is not None:
                    hosts[c.name] = int(rep.program.stats()["host_fallback_instructions"])
                rep.program.release()
        except Exception as e:  # noqa: BLE001 - a crash is a failure of that case
            res[c.name] = f"fail: {type(e).__name__}"
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", choices=["ref", "gpu"], default="ref")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--report", default=None, help="markdown report (default: docs/conformance.md with the default "
                                                    "--out-dir, else OUT_DIR/conformance.md)")
    ap.add_argument("--max-seconds", type=float, default=None, help="time budget per graph mode")
    ap.add_argument("--mode", choices=["eager", "graph", "both"], default="both", help="graph modes to run")
    ap.add_argument("--shard", default=None, metavar="K/N",
                    help="run every N-th case from the K-th (0-based) and write conformance_<target>.<mode>.K-of-N.json; "
                         "--merge joins the shards")
    ap.add_argument("--merge", action="store_true", help="join the shard files of --target in --out-dir into "
                                                          "conformance_<target>.json (and the report)")
    args = ap.parse_args(argv)
    if args.report is None:
        default_out = os.path.join(ROOT, "bench", "results")
        args.report = os.path.join(ROOT, "docs", "conformance.md") if os.path.abspath(args.out_dir) == default_out \
            else os.path.join(args.out_dir, "conformance.md")
    warnings.filterwarnings("ignore")
    if args.merge:
        try:
            merge_shards(args.out_dir, args.target)
        except ValueError as e:
            print(f"conformance: {e}", file=sys.stderr)
            return 1
    elif not args.report_only:
        run_target(args)
    write_report(args.out_dir, args.report)
    return 0


def run_target(args) -> None:
    """Run the node cases of ``args.target`` (the modes / shard asked for) and write the JSON."""
    from onnx.backend.test.loader import load_model_tests

    from mgx_graph.backend import KNOWN_FAILURES, MgxBackendEager, MgxBackendGraph

    cases = load_model_tests(kind="node")
    n_all = len(cases)
    if args.shard:
        k, n = (int(x) for x in args.shard.split("/"))
        cases = cases[k::n]
    device = "CUDA" if args.target == "gpu" else "CPU"
    data = {"target": args.target, "date": datetime.date.today().isoformat(), "cases": n_all,
            "op_of": {c.name: op_of(c) for c in cases}, "results": {}, "host_instructions": {}}
    modes = [("eager", MgxBackendEager), ("graph", MgxBackendGraph)]
    for mode, cls in [mc for mc in modes if args.mode in (mc[0], "both")]:
        t0 = time.time()
        deadline = t0 + args.max_seconds if args.max_seconds else None
        hosts = data["host_instructions"][mode] = {}
        data["results"][mode] = run_cases(cls, device, cases, KNOWN_FAILURES, deadline, hosts)
        native, passed = native_count(data["results"][mode], hosts)
        print(f"{args.target} {mode}: {collections.Counter(v.split(':')[0] for v in data['results'][mode].values())}"
              f", native {native}/{passed} in {time.time() - t0:.0f} s", flush=True)
    if args.target == "ref" and args.mode == "both" and not args.shard:
        try:
            import onnxruntime.backend as ortb

            data["onnxruntime"] = run_cases(ortb, "CPU", cases, [])
        except ImportError:
            pass
    data["machine"] = machine_info()
    os.makedirs(args.out_dir, exist_ok=True)
    name = f"conformance_{args.target}.json"
    if args.shard or args.mode != "both":
        name = f"conformance_{args.target}.{args.mode}.{(args.shard or '0/1').replace('/', '-of-')}.json"
    with open(os.path.join(args.out_dir, name), "w") as f:
        json.dump(data, f, indent=0)


def merge_shards(out_dir: str, target: str) -> None:
    """Join ``conformance_<target>.<mode>.<K>-of-<N>.json`` files into ``conformance_<target>.json``; a
    ValueError when a mode's shards do not cover every case exactly once."""
    import glob

    parts = sorted(glob.glob(os.path.join(out_dir, f"conformance_{target}.*-of-*.json")))
    if not parts:
        raise ValueError(f"no shard files conformance_{target}.*-of-*.json in {out_dir}")
    merged = None
    for p in parts:
        with open(p) as f:
            d = json.load(f)
        if merged is None:
            merged = {k: d[k] for k in ("target", "date", "cases", "machine")}
            merged.update(op_of={}, results={}, host_instructions={})
        merged["op_of"].update(d["op_of"])
        for mode, r in d["results"].items():
            got = merged["results"].setdefault(mode, {})
            if set(got) & set(r):
                raise ValueError(f"{p}: cases already in another shard of mode {mode}")
            got.update(r)
            merged["host_instructions"].setdefault(mode, {}).update(d["host_instructions"].get(mode, {}))
    for mode, r in merged["results"].items():
        if len(r) != merged["cases"]:
            raise ValueError(f"mode {mode}: the shards hold {len(r)} of {merged['cases']} cases")
    with open(os.path.join(out_dir, f"conformance_{target}.json"), "w") as f:
        json.dump(merged, f, indent=0)


def native_count(results: dict, hosts: dict | None):
    """``(native, passed)``: of the passing cases in ``results`` (``{case: "pass" | ...}``), those whose
    compiled program ran no instruction on the host (``hosts[case] == 0``, ``hosts`` as filled by
    :func:`run_cases`); None when ``hosts`` is None (a run from before the count existed)."""
    passed = [k for k, v in results.items() if v == "pass"]
    if hosts is None:
        return None
    return sum(1 for k in passed if hosts.get(k) == 0), len(passed)


def _native_cells(d: dict, mode: str) -> list[str]:
    nc = native_count(d["results"][mode], d.get("host_instructions", {}).get(mode))
    if nc is None:
        return ["not measured", "not measured"]
    native, passed = nc
    return [str(native), f"{100 * native / max(passed, 1):.1f}%"]


def _summary_rows(runs: dict, ort_pass: set) -> list[str]:
    ref_pass = {m: {k for k, v in runs["ref"]["results"][m].items() if v == "pass"} for m in ("eager", "graph")} \
        if "ref" in runs else {}
    lines = ["| target | graph | date | machine | cases | passed | failed | excluded | of the cases onnxruntime passes | "
             "of the cases ref passes | native | native, % of passed |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for t, d in runs.items():
        mach = d.get("machine", {}).get("gpu") or d.get("machine", {}).get("cpu", "")
        for mode in ("eager", "graph"):
            r = d["results"][mode]
            c = collections.Counter(v.split(":")[0] for v in r.values())
            passed = {k for k, v in r.items() if v == "pass"}
            of_ort = f"{len(passed & ort_pass)}/{len(ort_pass)} ({100 * len(passed & ort_pass) / max(len(ort_pass), 1):.1f}%)" \
                if ort_pass else "n/a"
            rp = ref_pass.get(mode, set())
            of_ref = f"{len(passed & rp)}/{len(rp)} ({100 * len(passed & rp) / max(len(rp), 1):.1f}%)" if rp else "n/a"
            lines.append(f"| {t} | {'on' if mode == 'graph' else 'off'} | {d['date']} | {mach} | {d['cases']} | "
                         f"{c['pass']} | {c['fail']} | {c['excluded']} | {of_ort} | {of_ref} | "
                         + " | ".join(_native_cells(d, mode)) + " |"
                         + (f" ({c['not run']} not run: time budget)" if c["not run"] else ""))
    return lines


def _host_rows(runs: dict, op_of_case: dict) -> list[str]:
    """Per op type, the passing cases that ran an instruction on the host, per measured target and mode."""
    cols = [(t, m) for t, d in runs.items() for m in ("eager", "graph") if m in d.get("host_instructions", {})]
    if not cols:
        return []
    counts = {}
    for t, m in cols:
        d = runs[t]
        for k, n in d["host_instructions"][m].items():
            if n and d["results"][m].get(k) == "pass":
                counts.setdefault(op_of_case.get(k, "?"), collections.Counter())[(t, m)] += 1
    lines = ["", "## Passing cases with host instructions, per op type", "",
             "Cases that pass but whose compiled program runs instructions on the host (`onnx_op` through "
             "`onnx.reference`, or another op with no device kernel): the cases counted as not native above.", "",
             "| op | " + " | ".join(f"{t} {m}" for t, m in cols) + " |", "|---|" + "---|" * len(cols)]
    lines += [f"| {op} | " + " | ".join(str(c[col]) for col in cols) + " |" for op, c in sorted(counts.items())]
    return lines


def _per_op_rows(runs: dict, op_of_case: dict, ort: dict) -> list[str]:
    ops = sorted(set(op_of_case.values()))
    cols = [(t, m) for t in runs for m in ("eager", "graph")]
    lines = ["", "## Per op type", "", "pass / fail / excluded, per target and graph mode" +
             (", and onnxruntime's passes" if ort else ""), "",
             "| op | " + " | ".join(f"{t} {'graph' if m == 'graph' else 'eager'}" for t, m in cols) +
             (" | onnxruntime |" if ort else " |"),
             "|---|" + "---|" * (len(cols) + (1 if ort else 0))]
    for op in ops:
        names = [k for k, v in op_of_case.items() if v == op]
        row = [op]
        for t, m in cols:
            r = runs[t]["results"][m]
            c = collections.Counter(r.get(n, "excluded").split(":")[0] for n in names)
            row.append(f"{c['pass']} / {c['fail']} / {c['excluded']}")
        if ort:
            row.append(str(sum(1 for n in names if ort.get(n) == "pass")))
        lines.append("| " + " | ".join(row) + " |")
    return lines


def write_report(out_dir: str, path: str) -> None:
    """``path`` (markdown) from every ``conformance_<target>.json`` in ``out_dir``; nothing when none."""
    runs = {}
    for t in ("ref", "gpu"):
        p = os.path.join(out_dir, f"conformance_{t}.json")
        if os.path.exists(p):
            with open(p) as f:
                runs[t] = json.load(f)
    if not runs:
        return
    ort = runs.get("ref", {}).get("onnxruntime", {})
    ort_pass = {k for k, v in ort.items() if v == "pass"}
    lines = ["# ONNX conformance", "",
             "The node cases of the ONNX backend test suite (generated by the installed `onnx` package) run through "
             "`mgx_graph.backend` on each target, with graphs off (eager) and on (`graph_launch`, "
             "min_partition_size 1), compared to the expected outputs with each case's tolerances. "
             "`excluded`: the known failures listed with their reasons in `mgx_graph.backend.KNOWN_FAILURES`. "
             "`native`: passing cases whose compiled program runs no instruction on the host in place of a device "
             "kernel (no `onnx_op`, no host fallback: `stats()[\"host_fallback_instructions\"] == 0`; on `ref` the "
             "instructions the `gpu` build would run on the host); `not measured`: a run from before this count. "
             "Generated by `bench/conformance.py`.", ""]
    lines += _summary_rows(runs, ort_pass)
    if ort:
        c = collections.Counter(ort.values())
        lines += ["", f"onnxruntime (CPU) on the same cases: {c['pass']} pass, {len(ort) - c['pass']} fail."]
    from mgx_graph.backend import KNOWN_FAILURES

    lines += ["", "## Known failures (excluded)", "", "| pattern | reason |", "|---|---|"]
    lines += [f"| `{p}` | {r} |" for p, r in KNOWN_FAILURES.items()]
    op_of_case = next(iter(runs.values()))["op_of"]
    lines += _host_rows(runs, op_of_case)
    lines += _per_op_rows(runs, op_of_case, ort)
    failing = []
    for t, d in runs.items():
        for m in ("eager", "graph"):
            failing += [f"- {t} {m}: `{k}` ({v})" for k, v in d["results"][m].items() if v.startswith("fail")]
    if failing:
        lines += ["", "## Failing cases (not excluded)", ""] + failing
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
