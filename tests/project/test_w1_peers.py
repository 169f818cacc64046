"""bench/w1_peers.py end to end on a CPU (``--target ref``, ``--tiny``): the JSON's schema, one row per
system, and every system's greedy tokens against transformers' own ``generate`` on the same random
LLaMA (an independent oracle), onnxruntime-genai's CPU generator included; the ratios and the kernel
counts against the rows they come from."""
import json
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")
sys.path.insert(0, BENCH)

import peer_models  # noqa: E402
import peer_systems  # noqa: E402
import w1_peers  # noqa: E402

pytest.importorskip("onnxruntime_genai")
pytest.importorskip("torch")
pytest.importorskip("transformers")

TOKENS = 4
ROW_KEYS = {"workload", "system", "precision", "device", "ms_per_token", "kernels_per_token", "prefill_ms",
            "host_us_per_token", "first_tokens", "same_first_tokens_as", "prefill_mode", "timed_steps"}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, model_cache):
    out = tmp_path_factory.mktemp("w1_peers") / "peers.json"
    old = os.environ.get("MGX_GRAPH_CACHE")
    os.environ["MGX_GRAPH_CACHE"] = model_cache
    try:
        rc = w1_peers.main(["--target", "ref", "--tiny", "--workloads", "W2", "--precisions", "fp32",
                            "--tokens", str(TOKENS), "--out", str(out), "--budget-s", "900"])
    finally:
        if old is None:
            os.environ.pop("MGX_GRAPH_CACHE")
        else:
            os.environ["MGX_GRAPH_CACHE"] = old
    assert rc == 0
    with open(out) as f:
        doc = json.load(f)
    return out, doc


def _oracle(doc):
    """transformers' greedy continuation of the run's prompt on the same seeded random LLaMA."""
    from mgx_graph.models import load_info
    from mgx_graph.models.oracle import hf_greedy_tokens

    info = load_info(doc["workloads"]["W2"]["export"])
    return hf_greedy_tokens(info, doc["workloads"]["W2"]["prompt"], TOKENS + 1)


@pytest.mark.slow
def test_schema_and_one_row_per_system(tiny_run):
    _, doc = tiny_run
    assert {"machine", "results", "ratios", "workloads", "target"} <= set(doc)
    assert doc["target"] == "ref" and doc["machine"]["cpu_count"] >= 1
    work = doc["workloads"]["W2"]
    assert len(work["prompt"]) == work["prompt_tokens"] == 8 and work["kv_cache"] == 32
    rows = doc["results"]
    assert sorted(r["system"] for r in rows) == sorted(w1_peers.SYSTEMS)
    for r in rows:
        assert not r.get("error") and not r.get("skipped"), r
        assert ROW_KEYS <= set(r), (r["system"], ROW_KEYS - set(r))
        assert r["workload"] == "W2" and r["precision"] == "fp32" and r["device"] == "cpu"
        assert r["ms_per_token"] > 0 and r["prefill_ms"] > 0 and r["timed_steps"] == TOKENS
        assert len(r["first_tokens"]) == TOKENS + 1 and all(isinstance(t, int) for t in r["first_tokens"])
    by = {r["system"]: r for r in rows}
    assert by["mgx_graph"]["prefill_mode"].startswith("token by token")
    assert by["mgx_graph_genai_folder"]["prefill_mode"].startswith("one run")
    assert by["onnxruntime_genai"]["kernels_per_token"] is None


@pytest.mark.slow
def test_every_system_gives_transformers_greedy_tokens(tiny_run):
    _, doc = tiny_run
    want = _oracle(doc)
    assert len(want) >= 2  # generate stops at the model's eos; the rows ignore it
    for r in doc["results"]:
        assert r["first_tokens"][:len(want)] == want, (r["system"], r["first_tokens"], want)
    by = {r["system"]: r for r in doc["results"]}
    assert by["onnxruntime_genai"]["first_tokens"] == by["mgx_graph"]["first_tokens"]
    assert by["onnxruntime_genai"]["same_first_tokens_as"] == {"mgx_graph fp32": True, "torch_cuda_graph fp32": True}
    assert all(all(v) for v in (r["same_first_tokens_as"].values() for r in doc["results"]))


@pytest.mark.slow
def test_kernel_counts_ratios_and_chart(tiny_run):
    out, doc = tiny_run
    by = {r["system"]: r for r in doc["results"]}
    graph, eager = by["mgx_graph"], by["mgx_eager"]
    assert graph["captures"] == 1 and graph["fallbacks"] == 0 and graph["launches_per_token"] == 1
    assert graph["kernels_per_token"] == sum(graph["graph_nodes"]) == eager["kernels_per_token"] > 0
    assert eager["launches_per_token"] == eager["kernels_per_token"] and eager["captures"] == 0
    assert graph["host_us_per_token"] > 0 and by["ort_cuda_graph"]["host_us_per_token"] is None
    r = doc["ratios"]["W2"]["mgx_graph_fp32_over_onnxruntime_genai_fp32"]
    og = by["onnxruntime_genai"]
    assert r["ms_per_token"] == pytest.approx(graph["ms_per_token"] / og["ms_per_token"], rel=1e-2)
    assert r["prefill_ms"] == pytest.approx(graph["prefill_ms"] / og["prefill_ms"], rel=1e-2)
    pytest.importorskip("matplotlib")
    png = out.with_suffix(".png")
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_agreement_and_ratios_on_made_up_rows():
    rows = [{"workload": "W1", "system": "mgx_graph", "precision": "fp32", "first_tokens": [1, 2, 3],
             "ms_per_token": 2.0, "prefill_ms": 9.0},
            {"workload": "W1", "system": "mgx_graph", "precision": "fp16", "first_tokens": [1, 2, 4],
             "ms_per_token": 1.0, "prefill_ms": 6.0},
            {"workload": "W1", "system": "onnxruntime_genai", "precision": "fp16", "first_tokens": [1, 2, 3],
             "ms_per_token": 4.0, "prefill_ms": 3.0},
            {"workload": "W2", "system": "mgx_graph", "precision": "fp16", "first_tokens": [7],
             "ms_per_token": 3.0, "prefill_ms": 1.0},
            {"workload": "W2", "system": "onnxruntime_genai", "precision": "fp16", "skipped": "not installed",
             "first_tokens": None, "ms_per_token": None, "prefill_ms": None}]
    w1_peers.add_agreement(rows)
    assert rows[1]["same_first_tokens_as"] == {"mgx_graph fp32": False}
    assert rows[2]["same_first_tokens_as"] == {"mgx_graph fp32": True}
    assert rows[0]["same_first_tokens_as"] == {}
    assert rows[3]["same_first_tokens_as"] == {} and "same_first_tokens_as" not in rows[4]
    assert w1_peers.ratios(rows) == {"W1": {"mgx_graph_fp16_over_onnxruntime_genai_fp16":
                                            {"ms_per_token": 0.25, "prefill_ms": 2.0}}}


def test_plan_orders_and_filters_systems():
    works = peer_models.workloads(tiny=False)
    assert works["W2"].precisions == ("fp16",) and works["W1"].precisions == ("fp16", "fp32")
    assert works["W2"].options["n_layer"] == 16 and works["W2"].options["vocab_size"] == 128256
    p = w1_peers.plan(works["W1"], w1_peers.SYSTEMS, "gpu")
    assert p[:2] == [("mgx_graph", "fp16"), ("onnxruntime_genai", "fp16")]
    assert ("mgx_eager", "fp32") in p and ("ort_cuda_graph", "fp32") in p and len(p) == 9
    p2 = w1_peers.plan(works["W2"], ("mgx_graph", "onnxruntime_genai"), "ref")
    assert p2 == [("mgx_graph", "fp16"), ("onnxruntime_genai", "fp32")]


def test_missing_package_and_spent_budget_give_skipped_rows(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "onnxruntime_genai" else real(n, *a))
    assert w1_peers.unavailable("onnxruntime_genai", "ref") == "not installed: onnxruntime_genai"
    assert w1_peers.unavailable("mgx_graph", "ref") is None

    class Bench:
        work = peer_models.workloads(tiny=True)["W2"]
        args = w1_peers.parse_args(["--target", "ref", "--budget-s", "1"])
        clock = w1_peers.Clock(1.0)
        why = None

    row = w1_peers.run_row(Bench(), "onnxruntime_genai", "fp32")
    assert row["skipped"] == "not installed: onnxruntime_genai" and row["ms_per_token"] is None
    row = w1_peers.run_row(Bench(), "mgx_graph", "fp32")
    assert "time budget" in row["skipped"] and row["first_tokens"] is None


def test_bad_flags_exit():
    for argv in (["--workloads", "W3"], ["--systems", "vllm"], ["--tokens", "0"], ["--precisions", "int4"]):
        with pytest.raises(SystemExit):
            w1_peers.parse_args(argv)


def test_timeboxed_build_reports_failure_and_timeout(tmp_path, monkeypatch):
    monkeypatch.setenv("MGX_GRAPH_CACHE", str(tmp_path))
    why = peer_models.run_timeboxed(["build", "no-such-model", "{}"], 60)
    assert "failed (exit 1)" in why and "unknown model" in why
    assert "no time left" in peer_models.run_timeboxed(["build", "llama", "{}"], 0.5)
    # an export imports torch and traces the model: far more than the 1.5 s it is given here
    why = peer_models.run_timeboxed(["build", "llama", '{"seed": 7, "verify": false}'], 1.5)
    assert "did not finish within" in why
    assert not (tmp_path / "models" / "llama").exists()


class _Counter:
    """A runner whose next id is the fed id + 1 (the prompt's last + 1 after a prefill)."""

    prefill_mode = "one run"

    def __init__(self):
        self.resets, self.fed, self.last_host_s = 0, [], None

    def reset(self):
        self.resets += 1

    def prefill(self, prompt):
        return prompt[-1] + 1

    def step(self, token):
        self.fed.append(token)
        self.last_host_s = 2e-6 if token % 2 else None
        return token + 1


def test_measure_warms_then_times_from_a_new_sequence():
    r = _Counter()
    row = peer_systems.measure(r, [5, 9], tokens=20, warm_steps=3)
    assert r.resets == 2
    assert r.fed == [10, 11, 12] + list(range(10, 30))  # the warm pass, then the timed one from the prompt
    assert row["first_tokens"] == list(range(10, 26)) and row["generated"] == 21 and row["timed_steps"] == 20
    assert row["host_us_per_token"] == pytest.approx(2.0) and row["prefill_mode"] == "one run"


def test_mgx_details_counts_graph_nodes_or_eager_launches():
    st = {"regions": [{"graph_nodes": [40, 41]}, {"graph_nodes": [7]}, {"graph_nodes": []}],
          "launches_per_run": 5, "launches_per_run_eager": 60, "captures": 2, "replays": 9, "fallbacks": 0}
    d = peer_systems.mgx_details(st, hip_graph=True)
    assert d["graph_nodes"] == [41, 7] and d["kernels_per_token"] == 41 + 7 + 3  # 2 replays + 3 launches outside
    assert peer_systems.mgx_details(st, hip_graph=False)["kernels_per_token"] == 60
    assert peer_systems.mgx_details({**st, "fallbacks": 1}, hip_graph=True)["kernels_per_token"] == 60


def test_tiny_defaults_tokens_to_what_the_tiny_caches_hold():
    assert w1_peers.parse_args([]).tokens == 96
    assert w1_peers.parse_args(["--tiny", "--tokens", "30"]).tokens == 30  # given: kept (and skipped if too long)
    tokens = w1_peers.parse_args(["--tiny"]).tokens
    for work in peer_models.workloads(tiny=True).values():
        assert work.prompt_tokens + max(tokens, w1_peers.WARM_STEPS) + 1 <= work.kv, work.name


class _FakeStep(_Counter):
    prefill_mode = "token by token"

    def details(self):
        return {}

    def close(self):
        pass


def _fake_build(monkeypatch, why=None):
    """The workloads' builds made up: a model (with ``why`` None) whose runner is a _FakeStep, or none."""
    from types import SimpleNamespace

    info = SimpleNamespace(directory="fake", onnx_path="fake/model.onnx", config={"vocab_size": 256})
    monkeypatch.setattr(peer_models, "registry_build", lambda *a: (None, why) if why else (info, None))
    monkeypatch.setattr(peer_models, "prompt_ids", lambda work, info: list(range(1, work.prompt_tokens + 1)))
    monkeypatch.setattr(w1_peers.Workbench, "runner", lambda self, system, precision: (_FakeStep(), None))


def test_tiny_run_without_tokens_measures_and_exits_0(tmp_path, monkeypatch):
    _fake_build(monkeypatch)
    out = tmp_path / "peers.json"
    rc = w1_peers.main(["--target", "ref", "--tiny", "--systems", "mgx_graph", "--precisions", "fp32",
                        "--out", str(out)])
    rows = json.loads(out.read_text())["results"]
    assert [(r["workload"], r.get("skipped"), r.get("error")) for r in rows] == [("W1", None, None), ("W2", None, None)]
    assert all(r["timed_steps"] == w1_peers.TINY_TOKENS for r in rows) and rc == 0


def test_run_where_every_row_is_skipped_exits_1(tmp_path, monkeypatch, capsys):
    _fake_build(monkeypatch, why="no build here")
    out = tmp_path / "peers.json"
    rc = w1_peers.main(["--target", "ref", "--tiny", "--workloads", "W2", "--systems", "mgx_graph,mgx_eager",
                        "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1 and "nothing measured" in err and err.count("no build here") >= 2, err
    assert [r["skipped"] for r in json.loads(out.read_text())["results"]] == ["no build here"] * 2


def test_nothing_measured_counts_only_the_rows_of_the_run():
    ok = {"workload": "W1", "system": "mgx_graph", "precision": "fp16", "ms_per_token": 1.0}
    bad = {"workload": "W2", "system": "mgx_graph", "precision": "fp16", "error": "RuntimeError: x"}
    assert w1_peers.nothing_measured([ok, bad], ["W1", "W2"]) is None
    msg = w1_peers.nothing_measured([ok, bad], ["W2"])  # W1's row kept from an earlier run (--append)
    assert "W2 mgx_graph fp16: RuntimeError: x" in msg and "1 rows" in msg
    assert "0 rows" in w1_peers.nothing_measured([], ["W1"])
