"""The mgx-graph command line on silero-vad, a value-dependent model (sr selects a branch): compile /
verify / run / perf against onnxruntime CPU, eager and with graphs, --fp16, and a saved program that
keeps its input dims; the helpers are those of :mod:`test_cli` (the ``silero`` fixture: conftest.py)."""
import json
import re

import numpy as np
import pytest
from test_cli import check_perf_report, cli, ort_outputs

DIMS = ["--input-dim", "@input", "1", "512", "@state", "2", "1", "128"]
SILERO = ["silero_vad.onnx", "silero_vad_op18_ifless.onnx"]


# -- silero-vad: a value-dependent model (sr selects a branch) --------------------------------------
@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("name", SILERO)
def test_silero_verify_and_compile(silero, name, target, hip_graph, capsys):
    path = silero(name)
    hg = ["--hip-graph"] if hip_graph else []
    rc, out, err = cli(capsys, "verify", path, "--target", target, *DIMS, *hg)
    assert rc == 0, err
    lines = out.strip().splitlines()
    assert lines[-1] == "PASSED"
    assert sum("vs onnxruntime" in ln and ln.endswith(": PASSED") for ln in lines) == 2  # output, stateN
    assert "sr int64[] = 16000" in out  # the constant the model compares sr with
    if hip_graph:
        assert re.search(r"graph: captures [1-9]\d*, replays [1-9]\d*, fallbacks 0", out), out
    rc, out, err = cli(capsys, "verify", path, "--target", target, *DIMS, *hg, "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["passed"] is True and doc["hip_graph"] is hip_graph
    against_ort = [o for o in doc["outputs"] if o["against"] == "onnxruntime"]
    assert [o["output"] for o in against_ort] == ["output", "stateN"]
    assert all(o["passed"] and o["max_abs_error"] < 1e-4 for o in against_ort), against_ort

    rc, out, err = cli(capsys, "compile", path, "--target", target, *DIMS, *hg, "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["inputs"] == {"input": {"dtype": "float32", "shape": [1, 512]},
                             "state": {"dtype": "float32", "shape": [2, 1, 128]},
                             "sr": {"dtype": "int64", "shape": []}}
    assert doc["specialized"] is (name == "silero_vad.onnx")  # its If on sr == 16000 is decided at run time
    assert (len(doc["regions"]) > 0) is hip_graph
    assert all(r["instructions"] > 0 and ":graph_launch" in r["module"] for r in doc["regions"])
    rc, out, err = cli(capsys, "compile", path, "--target", target, *DIMS, *hg, "--print")
    assert rc == 0, err
    assert 'module: "main"' in out and bool(re.search(r"= graph_launch\b", out)) is hip_graph
    assert f"graph_launch regions: {len(doc['regions'])}" in out


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("name", SILERO)
def test_silero_run_saves_onnxruntime_outputs(silero, name, target, hip_graph, tmp_path, capsys):
    path = silero(name)
    rng = np.random.default_rng(7)
    x = (0.3 * rng.standard_normal((1, 512))).astype(np.float32)
    state = rng.uniform(-0.5, 0.5, (2, 1, 128)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "state.npy", state)
    hg = ["--hip-graph"] if hip_graph else []
    rc, out, err = cli(capsys, "run", path, "--target", target, "--input", f"input={tmp_path / 'x.npy'}",
                       "--input", f"state={tmp_path / 'state.npy'}", "--input", "sr=16000",
                       "--output-dir", tmp_path / "out", *hg, "--json")
    assert rc == 0, err
    assert "symbolic dims set to 1" not in err  # the given arrays fix every shape
    doc = json.loads(out)
    want = ort_outputs(path, {"input": x, "state": state, "sr": np.array(16000, np.int64)})
    assert [o["output"] for o in doc["outputs"]] == ["output", "stateN"]
    for o, w in zip(doc["outputs"], want):
        got = np.load(o["path"])
        assert got.shape == w.shape and got.dtype == w.dtype
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("name", SILERO)
def test_silero_perf_summary_and_json(silero, name, target, hip_graph, capsys):
    path = silero(name)
    hg = ["--hip-graph"] if hip_graph else []
    rc, out, err = cli(capsys, "perf", path, "--target", target, *DIMS, *hg, "-n", "4", "--no-progress")
    assert rc == 0, err
    assert "perf:" not in err
    for line in ("\nSummary:\n", "\nBatch size: 1\n", "\nRate: ", " inferences/sec\n", "\nTotal time: ",
                 "\nPercentiles (90%, 95%, 99%): (", "\nTotal instructions time: ", "\nOverhead time: ",
                 "\nOverhead: ", "\nLaunches per run: "):
        assert line in out, line
    m = re.search(r"Overhead time: ([\d.e+-]+)ms, ([\d.e+-]+)ms\nOverhead: (\d+)%, (\d+)%", out)
    assert m, out
    assert float(m.group(1)) > 0 and float(m.group(2)) >= 0
    assert ("Graph (graph_launch) total time:" in out) is hip_graph
    rc, out, err = cli(capsys, "perf", path, "--target", target, *DIMS, *hg, "-n", "4", "--no-progress", "--json")
    assert rc == 0, err
    r = json.loads(out)
    check_perf_report(r, 4)
    assert r["offload_copy"] is False
    if hip_graph:
        assert r["graph"]["fallbacks"] == 0 and r["graph"]["replays"] >= 4


def test_silero_fp16_verify(silero, target, capsys):
    """--fp16 on a value-dependent model: the specialization and its prefix programs take half inputs."""
    rc, out, err = cli(capsys, "verify", silero("silero_vad.onnx"), "--target", target, *DIMS, "--fp16", "--atol", "1e-2",
                       "--rtol", "5e-2", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["passed"] and {o["dtype"] for o in doc["outputs"]} == {"float16"}
    assert all(0 < o["max_abs_error"] < 1e-2 for o in doc["outputs"] if o["against"] == "onnxruntime")


def test_a_saved_dynamic_program_keeps_its_input_dims(silero, target, tmp_path, capsys):
    """A value-dependent model saved with --input-dim runs from the .mxr alone: its inputs take the saved dims."""
    path = silero("silero_vad.onnx")
    saved = tmp_path / "silero.mxr"
    rc, out, err = cli(capsys, "compile", path, "--target", target, "--input-dim", "@input", "1", "512", "@state", "2",
                       "1", "128", "-o", saved)
    assert rc == 0, err
    rng = np.random.default_rng(5)
    x = (0.3 * rng.normal(size=(1, 512))).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    rc, out, err = cli(capsys, "run", saved, "--input", f"input={tmp_path / 'x.npy'}", "--input", "sr=16000",
                       "--fill0", "state", "--output-dir", tmp_path / "o")
    assert rc == 0, err
    want = ort_outputs(path, {"input": x, "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)})
    np.testing.assert_allclose(np.load(tmp_path / "o" / "output.npy"), want[0], rtol=1e-4, atol=1e-5)
