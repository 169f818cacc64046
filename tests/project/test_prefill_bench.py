"""bench/prefill.py end to end on a CPU (``--target ref``, ``--tiny``, the random LLaMA of W2 with the KV cache
of bench/w1_peers.py's tiny run, so the two share their builds): the JSON's rows, the first id of every
system against transformers' greedy token on the same weights (an independent oracle), the ratios
against the rows they come from, and the chart."""
import json
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")
sys.path.insert(0, BENCH)

import prefill as prefill_bench  # noqa: E402

pytest.importorskip("torch")
pytest.importorskip("transformers")

LENGTHS = (8, 20)  # 20 > --chunk 8: chunks 8 + 8 + 4


@pytest.fixture(scope="module")
def run(tmp_path_factory, model_cache):
    out = tmp_path_factory.mktemp("prefill_bench") / "prefill.json"
    old = os.environ.get("MGX_GRAPH_CACHE")
    os.environ["MGX_GRAPH_CACHE"] = model_cache
    try:
        rc = prefill_bench.main(["--target", "ref", "--tiny", "--workload", "W2", "--kv", "32", "--chunk", "8",
                                 "--lengths", ",".join(map(str, LENGTHS)), "--repeats", "2", "--budget-s", "900",
                                 "--out", str(out)])
    finally:
        if old is None:
            os.environ.pop("MGX_GRAPH_CACHE")
        else:
            os.environ["MGX_GRAPH_CACHE"] = old
    assert rc == 0
    return out, json.loads(out.read_text())


@pytest.mark.slow
def test_rows_first_ids_and_ratios(run):
    from mgx_graph.models import load_info
    from mgx_graph.models.oracle import hf_greedy_tokens

    out, doc = run
    rows = doc["rows"]
    assert {(r["system"], r["prompt_tokens"]) for r in rows} == {(s, n) for s in prefill_bench.SYSTEMS for n in LENGTHS}
    info = load_info(doc["workload"]["export"])
    for n in LENGTHS:
        prompt = doc["prompts"][str(n)]
        assert len(prompt) == n
        want = hf_greedy_tokens(info, prompt, 1)[0]
        mine = [r for r in rows if r["prompt_tokens"] == n]
        for r in mine:
            if "skipped" in r:  # onnxruntime-genai not installed
                assert r["system"] in ("onnxruntime_genai", "mgx_graph_genai_folder")
                continue
            assert "error" not in r, r
            assert r["prefill_ms"] > 0 and r["prefill_ms_min"] <= r["prefill_ms"] and r["first_token"] == want, r
        one = next(r for r in mine if r["system"] == "mgx_prefill")
        tok = next(r for r in mine if r["system"] == "mgx_tokens")
        assert one["same_first_token_as"] == {"mgx_tokens fp32": True}
        assert doc["ratios"][str(n)]["mgx_prefill_fp32_over_mgx_tokens_fp32"] == \
            pytest.approx(one["prefill_ms"] / tok["prefill_ms"], rel=1e-3)
        assert all(b["captures"] == 1 and b["fallbacks"] == 0 for b in one["buckets"].values())
        assert sorted(one["buckets"]) == (["8"] if n == 8 else ["4", "8"])
    pytest.importorskip("matplotlib")
    assert out.with_suffix(".png").stat().st_size > 0


def test_bad_flags_exit():
    for argv in (["--systems", "nope"], ["--kv", "16", "--lengths", "20"], ["--chunk", "12"]):
        with pytest.raises(SystemExit):
            prefill_bench.parse(argv)
