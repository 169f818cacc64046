"""bench/llm_matrix.py end to end on a CPU (``--target ref``, ``--tiny``, onnxruntime-genai's CPU build): the rows'
schema, greedy rows of the genai layout against onnxruntime-genai's own greedy decode of each prompt (an
independent oracle, tests/genai_oracle.py), batched rows against the same prompt alone, a sampled run with
seed 0 repeated outside the bench, the summary's checks against the rows they come from, the merge of a
second workload into the same file, and skipped / failed cells that do not stop the run."""
import json
import os
import shutil
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")
sys.path.insert(0, BENCH)

import llm_matrix  # noqa: E402
import llm_matrix_report as report  # noqa: E402
import peer_models  # noqa: E402

STEPS = 6
BATCHES, PROMPTS = (1, 2), (8, 20)
ARGS = ["W2", "--target", "ref", "--tiny", "--batches", "1,2", "--prompts", "8,20", "--steps", str(STEPS),
        "--repeats", "1", "--budget-s", "900"]
ROW_KEYS = {"workload", "model", "layout", "weights", "system", "batch", "prompt_tokens", "sampling", "prefill_ms",
            "ms_per_step", "tokens_per_s", "kernels_per_step", "host_us_per_step", "first_tokens", "rows_first_tokens",
            "kv_cache"}


class _Cache:
    """``MGX_GRAPH_CACHE`` set to the session's model cache while a run lasts."""

    def __init__(self, path):
        self.path, self.old = path, None

    def __enter__(self):
        self.old = os.environ.get("MGX_GRAPH_CACHE")
        os.environ["MGX_GRAPH_CACHE"] = self.path

    def __exit__(self, *exc):
        if self.old is None:
            os.environ.pop("MGX_GRAPH_CACHE")
        else:
            os.environ["MGX_GRAPH_CACHE"] = self.old


@pytest.fixture(scope="module")
def run(tmp_path_factory, model_cache):
    pytest.importorskip("onnxruntime_genai")
    out = tmp_path_factory.mktemp("llm_matrix") / "matrix.json"
    with _Cache(model_cache):
        assert llm_matrix.main([*ARGS, "--out", str(out)]) == 0
    return out, json.loads(out.read_text())


def _rows(doc, **want):
    return [r for r in doc["rows"] if all(r.get(k) == v for k, v in want.items())]


@pytest.mark.slow
def test_every_cell_has_a_measured_row(run):
    out, doc = run
    assert {"machine", "runs", "rows", "summary"} <= set(doc) and doc["machine"]["cpu_count"] >= 1
    rows = doc["rows"]
    kinds = [("mgx_graph", "own"), ("mgx_graph", "genai"), ("onnxruntime_genai", "genai")]
    assert sorted((r["system"], r["layout"], r["batch"], r["prompt_tokens"], r["sampling"]) for r in rows) == \
        sorted((s, lay, b, n, x) for s, lay in kinds for b in BATCHES for n in PROMPTS for x in ("greedy", "sampled"))
    for r in rows:
        assert not r.get("error") and not r.get("skipped"), r
        assert ROW_KEYS <= set(r), ROW_KEYS - set(r)
        assert r["workload"] == "W2" and r["weights"] == "fp32" and r["kv_cache"] == 32
        assert r["prefill_ms"] > 0 and r["ms_per_step"] > 0 and r["tokens_per_s"] > 0
        assert r["generated_per_row"] == STEPS and len(r["rows_first_tokens"]) == r["batch"]
        assert r["first_tokens"] == r["rows_first_tokens"][0] and len(r["first_tokens"]) == STEPS
        mgx = r["system"] == "mgx_graph"
        assert (r["kernels_per_step"] > 0 and r["host_us_per_step"] > 0) if mgx else r["kernels_per_step"] is None
        assert r[{"greedy": "deterministic", "sampled": "seed_reproducible"}[r["sampling"]]] is True
    prompts = doc["runs"]["W2"]["prompts"]
    assert {n: [len(p) for p in ps] for n, ps in prompts.items()} == {"8": [8, 8], "20": [20, 20]}
    assert prompts["8"][0] != prompts["8"][1]
    pytest.importorskip("matplotlib")
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_greedy_genai_layout_rows_are_onnxruntime_genais_own_greedy_tokens(run):
    from genai_oracle import og_greedy

    _, doc = run
    folder, prompts = doc["runs"]["W2"]["genai_folder"], doc["runs"]["W2"]["prompts"]
    checked = 0
    for r in _rows(doc, system="mgx_graph", layout="genai", sampling="greedy"):
        assert r["tokens_equal_genai"] is True and r["tokens_compared"] > 0
        for k, mine in enumerate(r["rows_first_tokens"]):
            want = og_greedy(folder, prompts[str(r["prompt_tokens"])][k], STEPS, cpu=True)
            assert len(want) >= 1 and mine[:len(want)] == want, (r["batch"], r["prompt_tokens"], k, mine, want)
            checked += 1
    assert checked == sum(BATCHES) * len(PROMPTS)


@pytest.mark.slow
def test_batched_rows_equal_the_same_prompt_alone(run):
    _, doc = run
    for r in _rows(doc, system="mgx_graph", batch=2):
        assert r["rows_equal_alone"] is True
        assert r["rows_alone_checked"] == ({"0": True, "1": True} if r["sampling"] == "greedy" else {"0": True})
        alone = _rows(doc, system="mgx_graph", batch=1, layout=r["layout"], prompt_tokens=r["prompt_tokens"],
                      sampling=r["sampling"])[0]
        assert r["rows_first_tokens"][0] == alone["first_tokens"]  # row 0's draws are row 0's alone too
    assert not any("rows_equal_alone" in r for r in _rows(doc, batch=1))


@pytest.mark.slow
def test_a_sampled_run_with_seed_0_gives_the_same_tokens_again(run):
    import mgx_graph
    from mgx_graph.llm.decoder import Decoder
    from mgx_graph.llm.generation import generate
    from mgx_graph.models import load_info

    _, doc = run
    row = _rows(doc, system="mgx_graph", layout="own", batch=1, prompt_tokens=8, sampling="sampled")[0]
    info = load_info(doc["runs"]["W2"]["export"])
    dec = Decoder(mgx_graph.compile(str(info.onnx_path), target="ref"), prefill=info.prefill_onnx_path)
    prompt = doc["runs"]["W2"]["prompts"]["8"][0]
    got = [generate(dec, prompt, STEPS, **llm_matrix.MGX_SEARCH["sampled"]).tokens for _ in range(2)]
    other = generate(dec, prompt, STEPS, **{**llm_matrix.MGX_SEARCH["sampled"], "seed": 1}).tokens
    dec.release()
    assert got[0] == got[1] == row["first_tokens"] and other != got[0]
    greedy = _rows(doc, system="mgx_graph", layout="own", batch=1, prompt_tokens=8, sampling="greedy")[0]
    assert row["first_tokens"] != greedy["first_tokens"]


@pytest.mark.slow
def test_summary_checks_are_computed_from_the_rows(run):
    _, doc = run
    found = doc["summary"]["checks"]
    by = doc["summary"]["by_check"]
    assert by["sampled_over_greedy"]["checked"] == 8 and by["prefill_over_genai"]["checked"] == 16
    assert by["tokens_per_s_over_genai"]["checked"] == 8 and "decode_over_genai" not in by  # W2 is no SmolLM2
    assert by["tokens_equal_genai"]["checked"] == 4 and by["rows_equal_alone"]["checked"] == 8
    assert doc["summary"]["passed"] + doc["summary"]["failed"] == len(found)
    for c in found:
        cell = {k: c[k] for k in ("workload", "layout", "batch", "prompt_tokens", "sampling")}
        mine = _rows(doc, system="mgx_graph", **cell)[0]
        og = _rows(doc, system="onnxruntime_genai", **{**cell, "layout": "genai"})[0]
        if c["check"] == "sampled_over_greedy":
            greedy = _rows(doc, system="mgx_graph", **{**cell, "sampling": "greedy"})[0]
            want = mine["ms_per_step"] / greedy["ms_per_step"]
            assert c["numbers"] == {"sampled_ms_per_step": mine["ms_per_step"],
                                    "greedy_ms_per_step": greedy["ms_per_step"]}
        elif c["check"] == "prefill_over_genai":
            want = mine["prefill_ms"] / og["prefill_ms"]
        elif c["check"] == "tokens_per_s_over_genai":
            assert c["batch"] == 2
            want = mine["tokens_per_s"] / og["tokens_per_s"]
        else:
            assert c["value"] is mine[c["check"]] is True and c["pass"] is True
            continue
        assert c["value"] == pytest.approx(want, rel=1e-3)
        assert c["pass"] == (c["value"] >= 1.5 if c["check"].startswith("tokens_per_s") else
                             c["value"] <= report.LIMITS[c["check"]][1])


@pytest.mark.slow
def test_a_second_workload_merges_and_bad_cells_do_not_stop_the_run(run, tmp_path, model_cache, monkeypatch):
    """W1R into the file of the W2 run: onnxruntime-genai reported missing (its rows and the genai layout's
    skipped), the sampled cell failing (an error row), the greedy one measured; W2's rows kept as they were."""
    out, first = run
    merged = tmp_path / "matrix.json"
    shutil.copy(out, merged)
    monkeypatch.setattr(llm_matrix, "unavailable",
                        lambda system, target: None if system == "mgx_graph" else "not installed: onnxruntime_genai")
    real = llm_matrix.MgxRunner.run

    def fail_sampled(self, prompts, steps, sampling):
        if sampling == "sampled":
            raise RuntimeError("a made-up failure")
        return real(self, prompts, steps, sampling)

    monkeypatch.setattr(llm_matrix.MgxRunner, "run", fail_sampled)
    with _Cache(model_cache):
        rc = llm_matrix.main(["W1R", "--target", "ref", "--tiny", "--batches", "1", "--prompts", "8", "--steps", "4",
                              "--repeats", "1", "--budget-s", "900", "--out", str(merged)])
    doc = json.loads(merged.read_text())
    assert rc == 0 and set(doc["runs"]) == {"W2", "W1R"}
    assert _rows(doc, workload="W2") == [{**r} for r in first["rows"]]
    mine = {(r["system"], r["layout"], r["sampling"]): r for r in _rows(doc, workload="W1R")}
    assert len(mine) == 6
    assert mine["mgx_graph", "own", "greedy"]["ms_per_step"] > 0
    assert mine["mgx_graph", "own", "sampled"]["error"] == "RuntimeError: a made-up failure"
    assert "not installed" in mine["mgx_graph", "genai", "greedy"]["skipped"]
    assert mine["onnxruntime_genai", "genai", "sampled"]["skipped"] == "not installed: onnxruntime_genai"
    assert {c["workload"] for c in doc["summary"]["checks"]} == {"W2"}  # W1R has nothing to compare
    again = report.start(str(merged), "W1R", resume=True)
    assert [(r["system"], r["sampling"]) for r in again["rows"] if r["workload"] == "W1R"] == [("mgx_graph", "greedy")]
    assert len(report.start(str(merged), "W1R", resume=False)["rows"]) == len(first["rows"])


def _row(system, layout, batch, sampling, ms, prefill, tps, toks=None, workload="W1R", **extra):
    return {"workload": workload, "model": "m", "layout": layout, "weights": "fp16", "system": system, "batch": batch,
            "prompt_tokens": 37, "sampling": sampling, "ms_per_step": ms, "prefill_ms": prefill, "tokens_per_s": tps,
            "rows_first_tokens": toks or [[1, 2, 3]] * batch, **extra}


def test_checks_on_made_up_rows():
    rows = [_row("onnxruntime_genai", "genai", 1, "greedy", 4.0, 10.0, 200.0, [[1, 2, 9, 9]], eos_surrogate=9),
            _row("mgx_graph", "own", 1, "greedy", 1.0, 5.0, 900.0, [[1, 2, 9, 4]], deterministic=True),
            _row("mgx_graph", "genai", 1, "greedy", 3.0, 12.0, 300.0, [[1, 3, 9, 4]]),
            _row("mgx_graph", "own", 1, "sampled", 1.1, 5.0, 800.0, seed_reproducible=True),
            _row("onnxruntime_genai", "genai", 16, "greedy", 4.0, 10.0, 1000.0),
            _row("mgx_graph", "own", 16, "greedy", 2.0, 8.0, 1400.0, rows_equal_alone=False),
            _row("mgx_graph", "own", 4, "greedy", 2.0, 8.0, 99.0),
            _row("mgx_graph", "own", 1, "greedy", 9.0, 1.0, 1.0, workload="W2", skipped="not installed")]
    doc = {"rows": rows}
    report.finish(doc)
    assert rows[1]["tokens_equal_genai"] is True and rows[1]["tokens_compared"] == 3  # cut after genai's eos
    assert rows[2]["tokens_equal_genai"] is False and "tokens_equal_genai" not in rows[3]
    got = {(c["check"], c["layout"], c["batch"], c["sampling"]): (c["value"], c["pass"]) for c in doc["summary"]["checks"]}
    assert got == {
        ("prefill_over_genai", "own", 1, "greedy"): (0.5, True), ("decode_over_genai", "own", 1, "greedy"): (0.25, True),
        ("prefill_over_genai", "genai", 1, "greedy"): (1.2, False), ("tokens_equal_genai", "genai", 1, "greedy"): (False, False),
        ("sampled_over_greedy", "own", 1, "sampled"): (1.1, False), ("seed_reproducible", "own", 1, "sampled"): (True, True),
        ("prefill_over_genai", "own", 16, "greedy"): (0.8, True), ("tokens_per_s_over_genai", "own", 16, "greedy"): (1.4, False),
        ("rows_equal_alone", "own", 16, "greedy"): (False, False)}
    assert doc["summary"]["passed"] == 4 and doc["summary"]["failed"] == 5 and doc["summary"]["all_passed"] is False
    assert "FAIL tokens_per_s_over_genai" in report.summary_text(doc["summary"])


def test_cache_slots_plan_and_flags():
    works = peer_models.workloads(tiny=False)
    w1r, w2 = works["W1R"], works["W2"]
    assert [llm_matrix.cache_slots(w1r, n, 64, None) for n in (37, 1000)] == [256, 1088]
    assert [llm_matrix.cache_slots(w2, n, 64, None) for n in (37, 1000)] == [1024, 1088]
    assert llm_matrix.cache_slots(w2, 37, 64, 512) == 512
    args = llm_matrix.parse_args(["W1R", "--target", "ref"])
    assert (args.batches, args.prompts, args.steps, args.repeats) == ([1, 4, 16], [37, 1000], 64, 3)
    groups = llm_matrix.plan(args, w1r)
    assert len(groups) == 3 * 2 * 3 and groups[0] == {"system": "mgx_graph", "layout": "own", "batch": 1, "kv": 256,
                                                      "cells": [(37, "greedy"), (37, "sampled")]}
    tiny = llm_matrix.parse_args(["W2", "--tiny", "--layouts", "genai", "--systems", "mgx_graph", "--kv", "24"])
    assert tiny.batches == [1, 2] and tiny.steps == 8
    assert [(g["system"], g["layout"], g["kv"]) for g in llm_matrix.plan(tiny, works["W2"])] == [("mgx_graph", "genai", 24)] * 2
    for bad in (["W3"], ["W1", "--sampling", "beam"], ["W1", "--batches", "0"], ["W1", "--steps", "1"],
                ["W1", "--layouts", "optimum"]):
        with pytest.raises(SystemExit):
            llm_matrix.parse_args(bad)
