"""``program.save(path)`` / ``mgx_graph.load(path)`` (.mxr): round trips of static programs (If / Loop,
fp16, graph regions, a KV-cache decode step bound in place) and of a dynamic-shape program, outputs
against onnxruntime; no pass runs on load and graphs are captured anew; the file holds no pickle;
corrupt, foreign and other-version files are typed errors."""
import json
import os
import re
import zipfile

import numpy as np
import pytest

import mgx_graph
from mgx_graph.mxr import save_load as mxr
from test_compiled_program import _chain
from test_control_flow import if_model, loop_model
from test_graph_launch import chain_model
from util import ort_run

R = np.random.default_rng(31)
X = R.normal(size=(3, 4)).astype(np.float32)


def _saved(prog, tmp_path, name="prog.mxr"):
    path = tmp_path / name
    prog.save(path)
    return path


def _no_pass_runs(monkeypatch):
    from mgx_graph.passes import PassManager

    def refuse(self, program):
        raise AssertionError("a pass ran on load")

    monkeypatch.setattr(PassManager, "run", refuse)


def _close(got, want, rtol=1e-5, atol=1e-6):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_static_round_trip_runs_no_pass(target, hip_graph, tmp_path, monkeypatch):
    model = chain_model(9)
    prog = mgx_graph.compile(model, target=target, hip_graph=hip_graph)
    path = _saved(prog, tmp_path)
    with zipfile.ZipFile(path) as zf:  # self-describing: JSON and .npy members, no pickle anywhere
        header = json.loads(zf.read("program.json"))
        arrays = [n for n in zf.namelist() if n.startswith("arrays/")]
        for n in arrays:
            np.lib.format.read_array(zf.open(n), allow_pickle=False)
    assert header["format"] == "mgx_graph program" and header["format_version"] == mxr.FORMAT_VERSION
    assert header["mgx_graph_version"] == mgx_graph.__version__ and header["kind"] == "static"
    assert header["target"] == target and len(arrays) == 6  # 3 weights, 3 biases
    _no_pass_runs(monkeypatch)
    loaded = mgx_graph.load(path)
    assert loaded.print() == prog.print()  # the IR after the passes, graph_launch submodules included
    assert (loaded.target, loaded.hip_graph, loaded.fp16) == (target, hip_graph, False)
    assert loaded.memory_plan.arena_bytes == prog.memory_plan.arena_bytes == header["memory"]["arena_bytes"]
    assert loaded.memory_plan.literal_bytes == prog.memory_plan.literal_bytes
    for _ in range(4):
        x = R.normal(size=(3, 4)).astype(np.float32)
        _close(loaded.run({"x": x}), ort_run(model, {"x": x}))
        assert loaded.run({"x": x})[0].tobytes() == prog.run({"x": x})[0].tobytes()
    assert loaded.stats()["launches_per_run"] == prog.stats()["launches_per_run"]


def test_graphs_are_captured_again_on_load(target, tmp_path, unfused):
    model = chain_model(9)
    prog = mgx_graph.compile(model, target=target, hip_graph=True, warmup=1)
    for _ in range(4):
        prog.run({"x": X})
    assert (prog.stats()["captures"], prog.stats()["replays"]) == (1, 2)
    loaded = mgx_graph.load(_saved(prog, tmp_path))
    assert loaded.options["warmup"] == 1
    st = loaded.stats()
    assert (st["captures"], st["replays"], st["warmups"]) == (0, 0, 0)
    for _ in range(4):
        _close(loaded.run({"x": X}), ort_run(model, {"x": X}))
    st = loaded.stats()
    assert (st["warmups"], st["captures"], st["replays"], st["fallbacks"]) == (1, 1, 2, 0)
    assert st["launches_per_run"] == 1


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_fused_kernels_round_trip(target, hip_graph, tmp_path):
    """``pointwise`` / ``fused_reduce`` keep their submodule on the op once lowered: it is saved with
    the op and the loaded program prints and computes as the saved one."""
    model = chain_model(9)
    prog = mgx_graph.compile(model, target=target, hip_graph=hip_graph, min_partition_size=1)
    assert "pointwise" in prog.print()
    loaded = mgx_graph.load(_saved(prog, tmp_path, "fused.mxr"))
    assert loaded.print() == prog.print()
    for _ in range(3):
        _close(loaded.run({"x": X}), ort_run(model, {"x": X}))


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_if_and_loop_round_trip(target, hip_graph, tmp_path):
    model = if_model()
    prog = mgx_graph.compile(model, target=target, hip_graph=hip_graph, min_partition_size=2)
    loaded = mgx_graph.load(_saved(prog, tmp_path, "if.mxr"))
    assert "main:if0:then" in loaded.print() and loaded.print() == prog.print()
    for i in range(6):
        x = R.normal(size=(3, 4)).astype(np.float32) + (1.0 if i % 2 else -1.0)  # both branches
        _close(loaded.run({"x": x}), ort_run(model, {"x": x}))
    model = loop_model(scan=False)  # carried values only: a static program whose trip count is read at run time
    prog = mgx_graph.compile(model, target=target, hip_graph=hip_graph, min_partition_size=1)
    assert prog.dispatcher is None
    loaded = mgx_graph.load(_saved(prog, tmp_path, "loop.mxr"))
    assert re.search(r"= loop\b", loaded.print()) and loaded.print() == prog.print()
    for M in (4, 0, 6):
        feeds = {"M": np.array(M, np.int64), "a0": R.normal(size=3).astype(np.float32)}
        _close(loaded.run(feeds), ort_run(model, feeds))


def test_fp16_round_trip(target, tmp_path):
    model = chain_model(9)
    prog = mgx_graph.compile(model, target=target, fp16=True)
    loaded = mgx_graph.load(_saved(prog, tmp_path))
    assert loaded.fp16 and loaded.get_parameter_shapes()["x"].dtype == "float16"
    x = R.normal(size=(3, 4)).astype(np.float32)
    got = loaded.run({"x": x.astype(np.float16)})
    assert got[0].dtype == np.float16
    np.testing.assert_allclose(got[0].astype(np.float32), ort_run(model, {"x": x})[0], rtol=1e-2, atol=1e-2)
    assert got[0].tobytes() == prog.run({"x": x.astype(np.float16)})[0].tobytes()


def test_dynamic_program_saves_its_model_and_recompiles(target, tmp_path, capfd, unfused):
    model = _chain(["n", 4])
    prog = mgx_graph.compile(model, target=target, hip_graph=True, warmup=1, max_specializations=3)
    assert prog.dispatcher is not None
    prog.run({"x": X})
    path = _saved(prog, tmp_path)
    with zipfile.ZipFile(path) as zf:
        assert json.loads(zf.read("program.json"))["kind"] == "dynamic"
        assert zf.read("model.onnx") == model.SerializeToString()
    loaded = mgx_graph.load(path)
    assert loaded.dispatcher is not None and loaded.options["max_specializations"] == 3
    assert loaded.dispatcher.cap == 3 and loaded.hip_graph
    for rows in (3, 5, 3, 5, 3):
        x = R.normal(size=(rows, 4)).astype(np.float32)
        _close(loaded.run({"x": x}), ort_run(model, {"x": x}))
    st = loaded.stats()
    # spec 0 (n = 1) compiled by the load, then one specialization per row count, as after a compile
    assert st["specialization_compiles"] == 2 and st["specializations"] == 3
    assert st["captures"] == 2 and st["fallbacks"] == 0


def test_kv_cache_decode_step_round_trip(model_cache, target, tmp_path):
    import onnxruntime as ort

    from mgx_graph.llm.generation import Decoder, generate
    from mgx_graph.models import build

    try:
        info = build("gpt2", cache_dir=model_cache, progress=False, n_layer=2, n_embd=64, n_head=4, vocab_size=256,
                     max_cache_len=16)
    except ImportError as e:
        pytest.skip(f"model export needs the [export] extra: {e}")
    prog = mgx_graph.compile(str(info.onnx_path), target=target, hip_graph=True)
    assert prog.alias
    prompt = [5, 9, 2, 77]
    before = generate(Decoder(prog), prompt, 6, info.config["eos_token_ids"]).tokens
    path = _saved(prog, tmp_path)
    prog.release()
    loaded = mgx_graph.load(path)
    assert loaded.alias == prog.alias and loaded.hip_graph
    dec = Decoder(loaded)
    assert generate(dec, prompt, 6, info.config["eos_token_ids"]).tokens == before
    assert loaded.stats()["captures"] == 1 and loaded.stats()["replays"] >= 5
    sess = ort.InferenceSession(str(info.onnx_path), providers=["CPUExecutionProvider"])
    feeds = {i.name: np.zeros(i.shape, np.float32) for i in sess.get_inputs() if i.name.startswith("past")}
    dec = Decoder(mgx_graph.load(path))
    dec.step(prompt[0])
    feeds.update(input_ids=np.array([[prompt[0]]], np.int64), cache_position=np.array([0], np.int64))
    want = sess.run(None, feeds)[0]
    np.testing.assert_allclose(dec.program.context.to_host(dec.last_logits, dec.program.queue), want, rtol=1e-4,
                               atol=1e-4)


def test_loaded_program_raises_typed_errors_and_stays_usable(tmp_path):
    model = chain_model(6)
    loaded = mgx_graph.load(_saved(mgx_graph.compile(model, target="ref"), tmp_path))
    with pytest.raises(mgx_graph.ParameterError, match=r"parameter 'x': expected shape \[3, 4\], got \[4, 3\]"):
        loaded.run({"x": X.T.copy()})
    _close(loaded.run({"x": X}), ort_run(model, {"x": X}))
    with pytest.raises(mgx_graph.CompileError, match=r"device_id 2: the ref target runs on the host"):
        mgx_graph.load(tmp_path / "prog.mxr", device_id=2)


# -- bad files ------------------------------------------------------------------------------------------
def _rewrite(src, dst, edit=None, drop=(), header=None):
    """Copy the zip ``src`` to ``dst``, its program.json changed by ``edit(dict)`` or replaced by ``header``."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            if item.filename in drop:
                continue
            data = zin.read(item.filename)
            if item.filename == "program.json":
                if header is not None:
                    data = header
                elif edit is not None:
                    doc = json.loads(data)
                    edit(doc)
                    data = json.dumps(doc).encode()
            zout.writestr(item, data)
    return dst


def _first(doc, op):
    return next(i for i in doc["program"]["modules"][0]["instructions"] if i["op"] == op)


@pytest.fixture
def good_file(tmp_path, unfused):
    return _saved(mgx_graph.compile(chain_model(6), target="ref"), tmp_path, "good.mxr")


def test_corrupt_and_foreign_files_are_parse_errors(good_file, tmp_path):
    raw = good_file.read_bytes()
    (tmp_path / "short.mxr").write_bytes(raw[: len(raw) // 2])
    flipped = bytearray(raw)
    at = raw.index(b"\x93NUMPY") + 200  # inside the first stored array's data
    flipped[at] ^= 0xFF
    (tmp_path / "flipped.mxr").write_bytes(bytes(flipped))
    (tmp_path / "text.mxr").write_text("not a program")
    cases = [
        (tmp_path / "missing.mxr", r"missing\.mxr: no such file"),
        (tmp_path / "text.mxr", r"text\.mxr: not a valid saved program \(\.mxr zip\): BadZipFile"),
        (tmp_path / "short.mxr", r"short\.mxr: not a valid saved program \(\.mxr zip\)"),
        (tmp_path / "flipped.mxr", r"flipped\.mxr: not a valid saved program \(\.mxr zip\): BadZipFile: Bad CRC-32"),
        (_rewrite(good_file, tmp_path / "nohead.mxr", drop=("program.json",)), r"not a saved mgx_graph program \(no "
                                                                               r"program\.json\)"),
        (_rewrite(good_file, tmp_path / "json.mxr", header=b"{oops"), r"program\.json is not valid JSON"),
        (_rewrite(good_file, tmp_path / "other.mxr", edit=lambda d: d.update(format="migraphx")),
         r"not a saved mgx_graph program \(program\.json does not say format 'mgx_graph program'\)"),
        (_rewrite(good_file, tmp_path / "old.mxr",
                  edit=lambda d: d.update(format_version=0, mgx_graph_version="0.0.1")),
         r"old\.mxr: format version 0 \(written by mgx_graph 0\.0\.1\); this mgx_graph reads version 1"),
        (_rewrite(good_file, tmp_path / "op.mxr", edit=lambda d: _first(d, "tanh").update(op="tanh_v9")),
         r"instruction main:@\d+: unknown operation 'tanh_v9'"),
        (_rewrite(good_file, tmp_path / "ref.mxr", edit=lambda d: _first(d, "tanh").update(inputs=[[0, 999]])),
         r"instruction main:@\d+ \(tanh\): bad reference \(IndexError"),
        (_rewrite(good_file, tmp_path / "shape.mxr",
                  edit=lambda d: _first(d, "tanh").update(shape={"shape": ["float32", [9, 9], [9, 1]]})),
         r"module 'main', instruction @\d+ \(tanh\): has shape float_type, \{9, 9\}"),
        (_rewrite(good_file, tmp_path / "arr.mxr", drop=("arrays/a0.npy",)), r"array 'a0' is not in the file"),
        (_rewrite(good_file, tmp_path / "kind.mxr", edit=lambda d: d.update(kind="cached")),
         r"unknown program kind 'cached'"),
        (_rewrite(good_file, tmp_path / "tpu.mxr", edit=lambda d: d.update(target="tpu")), r"unknown target 'tpu'"),
    ]
    for path, msg in cases:
        with pytest.raises(mgx_graph.ParseError, match=msg):
            mgx_graph.load(path)
    assert mgx_graph.load(good_file).run({"x": X})[0].shape == (3, 4)


def test_a_target_that_cannot_run_here_is_a_compile_error(good_file, tmp_path):
    from mgx_graph.runtime import gpu_available

    if gpu_available():
        pytest.skip("this machine runs gpu programs")
    path = _rewrite(good_file, tmp_path / "gpu.mxr", edit=lambda d: d.update(target="gpu"))
    with pytest.raises(mgx_graph.CompileError, match=r"gpu\.mxr: saved for target 'gpu', which cannot run here"):
        mgx_graph.load(path)


def test_what_cannot_be_saved_is_a_compile_error_and_no_file_is_left(tmp_path, unfused):
    prog = mgx_graph.compile(chain_model(6), target="ref")
    op = next(i.op for i in prog.get_main_module().instructions if i.op.name == "tanh")
    op.attrs["hook"] = print  # a code object: never written
    with pytest.raises(mgx_graph.CompileError, match=r"instruction main:@\d+ tanh: a value of type "
                                                      r"builtins\.builtin_function_or_method cannot be saved"):
        prog.save(tmp_path / "x.mxr")
    assert os.listdir(tmp_path) == []
