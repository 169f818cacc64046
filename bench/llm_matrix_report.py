"""The report of ``bench/llm_matrix.py``: the file's rows merged across workloads, the flags that compare rows
(``tokens_equal_genai``), the issue's acceptance checks computed from the rows, the table and the chart.

Checks (:func:`checks`; each entry names its cell, the value, the limit, the numbers that decided it and
``pass``), over the measured mgx_graph rows and the onnxruntime-genai row of the same workload, batch,
prompt length and sampling:

* ``sampled_over_greedy``: sampled ms/step over greedy ms/step of the same cell, <= 1.05 (every batch);
* ``prefill_over_genai``: prefill ms over onnxruntime-genai's, <= 1.0 (both layouts, every prompt);
* ``decode_over_genai``: ms/step over onnxruntime-genai's at batch 1 on SmolLM2's own export (W1, W1R),
  <= 0.5;
* ``tokens_per_s_over_genai``: tokens/s over onnxruntime-genai's at the workload's largest batch (16 in
  the default matrix), >= 1.5;
* ``tokens_equal_genai`` (greedy rows of the genai layout), ``rows_equal_alone`` (batched rows) and
  ``seed_reproducible`` (sampled rows): the row's flag is True.

Rows of other benchmarks in the same file (the models users bring: int4, 8B) are kept as they are; they
enter the checks where they have the fields.
"""
from __future__ import annotations

import json
import os

KEY = ("workload", "model", "layout", "weights", "system", "batch", "prompt_tokens", "sampling")
CELL = ("workload", "model", "layout", "batch", "prompt_tokens", "sampling")
SMOLLM2 = ("W1", "W1R")
LIMITS = {"sampled_over_greedy": ("<=", 1.05), "prefill_over_genai": ("<=", 1.0), "decode_over_genai": ("<=", 0.5),
          "tokens_per_s_over_genai": (">=", 1.5)}
FLAGS = ("tokens_equal_genai", "rows_equal_alone", "seed_reproducible")


def cell_key(row: dict) -> tuple:
    return tuple(row.get(k) for k in KEY)


def measured(row: dict) -> bool:
    return row.get("ms_per_step") is not None and not row.get("error") and not row.get("skipped")


def start(path: str, workload: str, resume: bool) -> dict:
    """The document a run writes: the file at ``path`` (when it is one of ours) less this workload's rows
    (with ``resume``: less its rows that measured nothing), else an empty one."""
    doc: dict = {"machine": {}, "runs": {}, "rows": [], "summary": {}}
    if os.path.isfile(path):
        try:
            with open(path) as f:
                old = json.load(f)
        except (OSError, ValueError):
            old = {}
        if isinstance(old, dict) and isinstance(old.get("rows"), list):
            doc.update({k: v for k, v in old.items() if k in ("machine", "runs", "rows")})
            doc["runs"] = dict(doc.get("runs") or {})
    doc["rows"] = [r for r in doc["rows"] if r.get("workload") != workload or (resume and measured(r))]
    return doc


def _peer(rows: list, r: dict):
    """The measured onnxruntime-genai row of ``r``'s workload, batch, prompt length and sampling, or None."""
    return next((x for x in rows if x.get("system") == "onnxruntime_genai" and measured(x) and
                 all(x.get(k) == r.get(k) for k in ("workload", "batch", "prompt_tokens", "sampling"))), None)


def _cut(tokens: list, eos) -> list:
    """``tokens`` up to and with the first ``eos`` (onnxruntime-genai pads a finished row after it)."""
    return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


def annotate(rows: list) -> None:
    """``tokens_equal_genai`` of every measured greedy mgx_graph row with a peer row: each row's first ids
    equal onnxruntime-genai's (cut at its eos surrogate); ``tokens_compared``: how many."""
    for r in rows:
        r.pop("tokens_equal_genai", None)
        r.pop("tokens_compared", None)
        if r.get("system") != "mgx_graph" or r.get("sampling") != "greedy" or not measured(r):
            continue
        og = _peer(rows, r)
        mine = r.get("rows_first_tokens")
        if og is None or not mine or not og.get("rows_first_tokens"):
            continue
        theirs = [_cut(t, og.get("eos_surrogate")) for t in og["rows_first_tokens"]]
        r["tokens_equal_genai"] = len(mine) == len(theirs) and all(a[:len(b)] == b for a, b in zip(mine, theirs))
        r["tokens_compared"] = sum(len(b) for b in theirs)


def _ratio(name: str, r: dict, num: float, den: float, numbers: dict) -> dict:
    op, limit = LIMITS[name]
    value = float(f"{num / den:.4g}")
    return {"check": name, **{k: r.get(k) for k in CELL}, "value": value, "limit": f"{op} {limit}",
            "pass": value <= limit if op == "<=" else value >= limit, "numbers": numbers}


def _ratio_checks(rows: list, r: dict, big: dict) -> list:
    out = []
    if r["sampling"] == "sampled":
        g = next((x for x in rows if x.get("system") == "mgx_graph" and x.get("sampling") == "greedy" and measured(x)
                  and all(x.get(k) == r.get(k) for k in ("workload", "model", "layout", "batch", "prompt_tokens"))),
                 None)
        if g is not None:
            out.append(_ratio("sampled_over_greedy", r, r["ms_per_step"], g["ms_per_step"],
                              {"sampled_ms_per_step": r["ms_per_step"], "greedy_ms_per_step": g["ms_per_step"]}))
    og = _peer(rows, r)
    if og is None:
        return out
    if r.get("prefill_ms") and og.get("prefill_ms"):
        out.append(_ratio("prefill_over_genai", r, r["prefill_ms"], og["prefill_ms"],
                          {"prefill_ms": r["prefill_ms"], "genai_prefill_ms": og["prefill_ms"]}))
    if r["batch"] == 1 and r["layout"] == "own" and r["workload"] in SMOLLM2:
        out.append(_ratio("decode_over_genai", r, r["ms_per_step"], og["ms_per_step"],
                          {"ms_per_step": r["ms_per_step"], "genai_ms_per_step": og["ms_per_step"]}))
    if r["batch"] > 1 and r["batch"] == big.get(r["workload"]) and r.get("tokens_per_s") and og.get("tokens_per_s"):
        out.append(_ratio("tokens_per_s_over_genai", r, r["tokens_per_s"], og["tokens_per_s"],
                          {"tokens_per_s": r["tokens_per_s"], "genai_tokens_per_s": og["tokens_per_s"]}))
    return out


def checks(rows: list) -> list:
    """The acceptance checks of the module docstring, from the rows."""
    mgx = [r for r in rows if r.get("system") == "mgx_graph" and measured(r)]
    big: dict = {}
    for r in mgx:
        big[r["workload"]] = max(big.get(r["workload"], 0), r["batch"])
    out = []
    for r in mgx:
        out += _ratio_checks(rows, r, big)
        for flag in FLAGS:
            if flag in r and (flag != "tokens_equal_genai" or r["layout"] == "genai"):
                out.append({"check": flag, **{k: r.get(k) for k in CELL}, "value": r[flag], "limit": "True",
                            "pass": r[flag] is True,
                            "numbers": {"tokens_compared": r.get("tokens_compared"),
                                        "rows_alone_checked": r.get("rows_alone_checked")}})
    return out


def finish(doc: dict) -> None:
    """Recompute the flags and the summary of ``doc`` from its rows."""
    annotate(doc["rows"])
    found = checks(doc["rows"])
    by: dict = {}
    for c in found:
        b = by.setdefault(c["check"], {"checked": 0, "passed": 0})
        b["checked"] += 1
        b["passed"] += bool(c["pass"])
    doc["summary"] = {"checks": found, "by_check": by, "passed": sum(bool(c["pass"]) for c in found),
                      "failed": sum(not c["pass"] for c in found), "all_passed": all(c["pass"] for c in found)}


COLUMNS = ("workload", "system", "layout", "weights", "batch", "prompt", "sampling", "prefill ms", "ms/step",
           "tok/s", "kernels", "host us", "flags / why not")


def _flags(r: dict) -> str:
    if r.get("skipped") or r.get("error"):
        return ("skipped: " if r.get("skipped") else "error: ") + str(r.get("skipped") or r.get("error"))[:70]
    return " ".join(f"{k}={r[k]}" for k in ("deterministic", "seed_reproducible", "rows_equal_alone",
                                             "tokens_equal_genai") if k in r)


def table(rows: list, header: bool = True) -> str:
    """Fixed-width lines: the header (``header``) and one per row."""
    def fmt(v):
        return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)

    widths = (5, 17, 6, 5, 5, 6, 8, 10, 9, 9, 7, 8, 0)
    lines = [COLUMNS] if header else []
    for r in rows:
        lines.append((r.get("workload"), r.get("system"), r.get("layout"), r.get("weights"), r.get("batch"),
                      r.get("prompt_tokens"), r.get("sampling"), r.get("prefill_ms"), r.get("ms_per_step"),
                      r.get("tokens_per_s"), r.get("kernels_per_step"), r.get("host_us_per_step"), _flags(r)))
    return "\n".join("  ".join(fmt(v).ljust(w) for v, w in zip(line, widths)).rstrip() for line in lines)


def summary_text(summary: dict) -> str:
    lines = [f"checks: {summary.get('passed', 0)} passed, {summary.get('failed', 0)} failed"]
    for c in summary.get("checks", []):
        if not c["pass"] or c["check"] in LIMITS:
            lines.append(f"  {'ok  ' if c['pass'] else 'FAIL'} {c['check']:24s} {c['workload']} {c['layout']} "
                         f"b{c['batch']} p{c['prompt_tokens']} {c['sampling']}: {c['value']} ({c['limit']})")
    return "\n".join(lines)


def plot(path: str) -> str | None:
    """A PNG beside ``path``: ms/step and prefill ms per cell (workload, batch, prompt, sampling), one bar per
    system and layout (log scale); None without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path) as f:
        doc = json.load(f)
    rows = [r for r in doc["rows"] if measured(r) and r.get("system") in ("mgx_graph", "onnxruntime_genai")]
    cells = sorted({(r["workload"], r["batch"], r["prompt_tokens"], r["sampling"]) for r in rows})
    order = [("mgx_graph", "own"), ("mgx_graph", "genai"), ("onnxruntime_genai", "genai")]
    series = [s for s in order if any((r["system"], r["layout"]) == s for r in rows)]
    fig, axes = plt.subplots(2, 1, figsize=(max(8.0, 0.55 * len(cells) * max(len(series), 1)), 8))
    width = 0.8 / max(len(series), 1)
    for ax, metric in zip(axes, ("ms_per_step", "prefill_ms")):
        for k, (system, layout) in enumerate(series):
            ys = [next((r[metric] for r in rows if (r["workload"], r["batch"], r["prompt_tokens"], r["sampling"]) == c
                        and (r["system"], r["layout"]) == (system, layout) and r.get(metric)), 0) for c in cells]
            ax.bar([i + k * width for i in range(len(cells))], ys, width,
                   label=f"{system} ({layout} layout)" if system == "mgx_graph" else system)
        ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(cells))],
                      [f"{w} b{b}\np{n} {s[:3]}" for w, b, n, s in cells], fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel(metric.replace("_", " "))
        ax.legend(fontsize=7)
    m = doc.get("machine", {})
    fig.suptitle(f"LLM matrix: mgx_graph vs onnxruntime-genai - {m.get('gpu', m.get('cpu', '?'))} "
                 f"{str(m.get('date', ''))[:10]}", fontsize=9)
    fig.tight_layout()
    png = os.path.splitext(path)[0] + ".png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png
