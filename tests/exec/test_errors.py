"""Bad input gets a typed error naming the node / parameter / shape at fault, and leaves the program
usable: after each error the same program still runs correct inputs correctly."""
import os

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import mgx_graph
from util import make_model, ort_run


def good_model():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    return make_model(nodes, {"x": np.zeros((2, 3), np.float32)}, ["y"],
                      {"w": np.arange(12, dtype=np.float32).reshape(3, 4) / 7})


X = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)


def check_still_works(prog, model=None):
    want = ort_run(model or good_model(), {"x": X})[0]
    for _ in range(4):  # enough calls for warmup, capture and replay when graphs are on
        np.testing.assert_allclose(prog.run({"x": X})[0], want, rtol=1e-6)


def test_malformed_protobuf(tmp_path):
    f = tmp_path / "bad.onnx"
    f.write_bytes(b"\x08\x07garbage\xff\xff\xff")
    with pytest.raises(mgx_graph.ParseError, match=r"bad.onnx: not a valid ONNX protobuf"):
        mgx_graph.compile(str(f), target="ref")


def test_empty_file(tmp_path):
    f = tmp_path / "empty.onnx"
    f.write_bytes(b"")
    with pytest.raises(mgx_graph.ParseError, match="empty graph"):
        mgx_graph.compile(str(f), target="ref")


def _ort_refuses(data: bytes) -> str:
    import onnxruntime as ort
    with pytest.raises(Exception) as info:
        ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": X})
    return str(info.value)


def test_graph_without_outputs():
    """A graph whose outputs were lost (one flipped bit turns graph.output into value_info): onnxruntime
    refuses to run it, and so do we, by name, instead of compiling a program that returns nothing."""
    model = good_model()
    model.graph.value_info.extend(model.graph.output)
    del model.graph.output[:]
    _ort_refuses(model.SerializeToString())
    with pytest.raises(mgx_graph.ParseError, match="declares no outputs"):
        mgx_graph.compile(model, target="ref")


def test_name_not_utf8():
    """A string field holding invalid UTF-8 (protobuf hands it over as bytes): a ParseError naming the
    field, as onnxruntime refuses the model, never a TypeError from deep in the parser."""
    model = good_model()
    model.graph.node[1].op_type = "Rel\u00e9"
    data = model.SerializeToString().replace("Rel\u00e9".encode(), b"Rel\xff\xfe")
    _ort_refuses(data)
    with pytest.raises(mgx_graph.ParseError, match=r"graph.node\[1\]: field 'op_type' is not valid UTF-8"):
        mgx_graph.compile(data, target="ref")
    check_still_works(mgx_graph.compile(good_model(), target="ref"))


def test_missing_external_data(tmp_path):
    model = good_model()
    path = tmp_path / "ext.onnx"
    from onnx.external_data_helper import convert_model_to_external_data

    convert_model_to_external_data(model, all_tensors_to_one_file=True, location="ext.onnx.data", size_threshold=0)
    onnx.save_model(model, str(path))
    assert mgx_graph.compile(str(path), target="ref").run({"x": X})[0].shape == (2, 4)
    os.remove(tmp_path / "ext.onnx.data")
    with pytest.raises(mgx_graph.ParseError, match=r"external data file 'ext.onnx.data' of tensor 'w' not found"):
        mgx_graph.compile(str(path), target="ref")


def test_unknown_op_names_node_op_domain_opset():
    model = good_model()
    model.graph.node[1].op_type = "FrobnicateXYZ"
    model.graph.node[1].name = "frob1"
    with pytest.raises(mgx_graph.UnsupportedOpError) as e:
        mgx_graph.compile(model, target="ref")
    assert (e.value.node, e.value.op_type, e.value.domain, e.value.opset) == ("frob1", "FrobnicateXYZ", "", 18)
    assert "node 'frob1': unsupported operator ai.onnx::FrobnicateXYZ (opset 18)" in str(e.value)


def test_unknown_domain():
    model = good_model()
    model.graph.node[1].domain = "com.example"
    model.opset_import.append(helper.make_opsetid("com.example", 3))
    with pytest.raises(mgx_graph.UnsupportedOpError, match=r"com.example::Relu \(opset 3\)"):
        mgx_graph.compile(model, target="ref")


def test_opset_out_of_range():
    model = good_model()
    model.opset_import[0].version = 99
    with pytest.raises(mgx_graph.ParseError, match="opset 99 is out of the supported range"):
        mgx_graph.compile(model, target="ref")


def test_input_dims_names_an_unknown_input():
    with pytest.raises(mgx_graph.ParseError, match=r"input_dims names 'nope'.*\(inputs: x\)"):
        mgx_graph.compile(good_model(), target="ref", input_dims={"nope": [1]})


def test_shape_error_names_the_node():
    nodes = [helper.make_node("Add", ["x", "b"], ["y"], name="add_bad")]
    model = make_model(nodes, {"x": np.zeros((2, 3), np.float32)}, ["y"], {"b": np.zeros((4,), np.float32)})
    with pytest.raises(mgx_graph.ShapeError, match=r"node 'add_bad' \(Add\).*cannot broadcast"):
        mgx_graph.compile(model, target="ref")


@pytest.mark.parametrize("hip_graph", [False, True])
def test_run_time_errors_leave_the_program_usable(target, hip_graph):
    prog = mgx_graph.compile(good_model(), target=target, hip_graph=hip_graph, min_partition_size=1)
    check_still_works(prog)
    bad = [
        ({"x": X.astype(np.float64)}, r"parameter 'x': expected dtype float32, got float64"),
        ({"x": X[:1]}, r"parameter 'x': expected shape \[2, 3\], got \[1, 3\]"),
        ({"x": X.reshape(6)}, r"parameter 'x': expected rank 2 float32\[2,3\], got rank 1 \[6\]"),
        ({}, r"parameter 'x' is missing"),
        ({"x": X, "z": X}, r"unknown parameter\(s\) \['z'\]"),
        ([X], r"parameters must be a dict"),
    ]
    for feeds, msg in bad:
        with pytest.raises(mgx_graph.ParameterError, match=msg):
            prog.run(feeds)
        check_still_works(prog)


def test_device_arrays_must_be_contiguous_and_on_the_device(target):
    prog = mgx_graph.compile(good_model(), target=target, hip_graph=True)
    xp = prog.context.xp
    wide = xp.asarray(np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6))
    with pytest.raises(mgx_graph.ParameterError, match=r"parameter 'x': device array must be C-contiguous"):
        prog.run_async({"x": wide[:, ::2]})
    if target == "gpu":
        with pytest.raises(mgx_graph.ParameterError, match=r"parameter 'x': expected a gpu device array"):
            prog.run_async({"x": X})
    else:
        with pytest.raises(mgx_graph.ParameterError, match=r"parameter 'x': expected a ref device array"):
            prog.run_async({"x": X.tolist()})
    check_still_works(prog)


def test_kernel_error_names_the_instruction_and_the_program_recovers():
    nodes = [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)]
    model = make_model(nodes, {"ids": np.zeros((2,), np.int64)}, ["y"], {"table": np.eye(4, dtype=np.float32)})
    prog = mgx_graph.compile(model, target="ref")
    with pytest.raises(mgx_graph.ExecutionError, match=r"instruction main:@\d+ gather.*index out of range"):
        prog.run({"ids": np.array([1, 9], np.int64)})
    np.testing.assert_array_equal(prog.run({"ids": np.array([1, 3], np.int64)})[0], np.eye(4)[[1, 3]])


def test_cli_reports_errors_without_a_traceback(tmp_path, capsys):
    from mgx_graph.cli.main import main

    f = tmp_path / "bad.onnx"
    f.write_bytes(b"nope")
    assert main(["compile", str(f), "--target", "ref"]) == 1
    assert main(["generate", "no-such-model", "--prompt", "hi"]) == 1
    assert main(["compile", str(f), "--input-dim", "@x", "one"]) == 1
    err = capsys.readouterr().err
    assert "not a valid ONNX protobuf" in err and "unknown model 'no-such-model'" in err
    assert "dims must be integers" in err and "Traceback" not in err


def test_cli_generate_refuses_an_encoder(monkeypatch, capsys):
    from types import SimpleNamespace

    import mgx_graph.cli.main as cli
    import mgx_graph.cli.model_arg as model_arg

    encoder = SimpleNamespace(name="minilm", config={"kind": "encoder"}, tokenizer_dir="/nonexistent",
                              onnx_path="/nonexistent/model.onnx")
    monkeypatch.setattr(model_arg, "load_model", lambda name, progress=True: encoder)
    assert cli.main(["generate", "minilm", "--prompt", "hi", "--target", "ref"]) == 1
    err = capsys.readouterr().err
    assert "'minilm' is an encoder model, not a decoder" in err
    assert "use 'run' or 'verify'" in err and "Traceback" not in err
    # the registry name is refused before anything is downloaded or built
    monkeypatch.setattr(model_arg, "load_model", lambda name, progress=True: pytest.fail("built the model"))
    assert cli.main(["generate", "minilm", "--prompt", "hi"]) == 1
    assert "is an encoder model" in capsys.readouterr().err


def test_cli_verify_run_perf(tmp_path, capsys):
    from mgx_graph.cli.main import main

    path = tmp_path / "m.onnx"
    onnx.save(good_model(), str(path))
    assert main(["verify", str(path), "--target", "ref", "--hip-graph"]) == 0
    out = capsys.readouterr().out
    assert out.count("PASSED") == 3 and "vs onnxruntime" in out
    assert main(["run", str(path), "--target", "ref", "--output-dir", str(tmp_path / "o")]) == 0
    assert np.load(tmp_path / "o" / "y.npy").shape == (2, 4)
    assert main(["perf", str(path), "--target", "ref", "-n", "5", "--hip-graph"]) == 0
    out = capsys.readouterr().out
    for line in ("Summary:", "Rate:", "Total time:", "Percentiles (90%, 95%, 99%)", "Total instructions time:",
                 "Overhead time:", "Overhead:", "Launches per run: 2", "Graph (graph_launch) total time:"):
        assert line in out, line


@pytest.mark.usefixtures("unfused")
def test_cli_verify_compares_a_replay_and_perf_reads_env(tmp_path, capsys, monkeypatch):
    from mgx_graph import settings as mgx_settings
    from mgx_graph.cli.main import main

    # an int input that indexes a 2-row table (like token_type_ids): the random inputs must be valid indices
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"]), helper.make_node("Relu", ["e"], ["r"]),
             helper.make_node("Neg", ["r"], ["n"]), helper.make_node("Exp", ["n"], ["x"]),
             helper.make_node("Abs", ["x"], ["y"])]
    model = make_model(nodes, {"ids": np.zeros((3, 5), np.int64)}, ["y"],
                       {"table": np.arange(8, dtype=np.float32).reshape(2, 4) - 3})
    path = tmp_path / "g.onnx"
    onnx.save(model, str(path))
    assert main(["verify", str(path), "--target", "ref", "--hip-graph"]) == 0
    out = capsys.readouterr().out
    assert "replays 1," in out and out.strip().endswith("PASSED")
    monkeypatch.setenv("MIGRAPHX_HIP_GRAPH", "1")
    mgx_settings.reset()  # the MIGRAPHX_* table is read once per process, all variables at once
    onnx.save(good_model(), str(path))
    assert main(["perf", str(path), "--target", "ref", "-n", "3"]) == 0
    assert "Graph (graph_launch) total time:" in capsys.readouterr().out
