"""The mgx-graph command line on small models against onnxruntime CPU: the input flags (--input-dim with
several inputs, literal --input values, --fill0 / --fill1), the symbolic-dims hint, the --fp16 warnings,
perf's report and JSON, saved programs, the help texts in docs/cli.md, and the packaging metadata.  The
value-dependent silero-vad runs are in :mod:`test_cli_silero`.

``python tests/cli/test_cli.py`` rewrites the help blocks of docs/cli.md's "Help texts" section."""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mgx_graph.cli.main import help_texts, main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def ort_outputs(path_or_model, feeds):
    import onnxruntime as ort

    src = path_or_model if isinstance(path_or_model, str) else path_or_model.SerializeToString()
    return ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, feeds)


def check_perf_report(r: dict, n: int) -> None:
    """The figures of a perf report agree with each other (sums, orders, percents)."""
    assert r["iterations"] == n and r["batch_size"] == 1
    ins = r["instructions"]
    assert ins and all(i["ms"] > 0 for i in ins)
    assert math.isclose(sum(i["ms"] for i in ins), r["instructions_time_ms"], rel_tol=1e-9)
    assert sum(o["count"] for o in r["ops"]) == len(ins)
    assert math.isclose(sum(o["ms"] for o in r["ops"]), r["instructions_time_ms"], rel_tol=1e-9)
    assert [o["ms"] for o in r["ops"]] == sorted((o["ms"] for o in r["ops"]), reverse=True)
    assert r["min_ms"] <= r["total_time_ms"] <= r["max_ms"] and r["min_ms"] <= r["median_ms"] <= r["max_ms"]
    assert r["min_ms"] <= r["p90_ms"] <= r["p95_ms"] <= r["p99_ms"] <= r["max_ms"]
    assert math.isclose(r["rate_per_sec"], 1000.0 / r["total_time_ms"])
    assert 0 < r["overhead_dry_run_ms"] and 0 <= r["overhead_outside_instructions_ms"] < r["profiled_run_ms"]
    assert math.isclose(r["overhead_dry_run_percent"], 100 * r["overhead_dry_run_ms"] / r["total_time_ms"])
    assert math.isclose(r["overhead_outside_instructions_percent"],
                        100 * r["overhead_outside_instructions_ms"] / r["profiled_run_ms"])


# -- small models --------------------------------------------------------------------------------
def sym_model():
    """z = (x + y) * float(k): x, y float32 [N, 4] sharing the symbol N; k an int64 scalar."""
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
           helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
           helper.make_tensor_value_info("k", TensorProto.INT64, [])]
    nodes = [helper.make_node("Add", ["x", "y"], ["s"]), helper.make_node("Cast", ["k"], ["kf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["s", "kf"], ["z"])]
    m = helper.make_model(helper.make_graph(nodes, "sym", ins, [helper.make_tensor_value_info("z", 1, None)]),
                          opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


@pytest.fixture
def sym(tmp_path):
    path = tmp_path / "sym.onnx"
    onnx.save(sym_model(), str(path))
    return str(path)


def run_z(capsys, tmp_path, sym, target, *flags):
    rc, out, err = cli(capsys, "run", sym, "--target", target, "--output-dir", tmp_path / "o", "--json", *flags)
    assert rc == 0, err
    return json.loads(out), np.load(tmp_path / "o" / "z.npy"), err


def test_input_dim_takes_several_inputs_in_one_flag(sym, target, tmp_path, capsys):
    one, z1, err1 = run_z(capsys, tmp_path, sym, target, "--input-dim", "@x", "3", "4", "@y", "3", "4", "--fill1")
    two, z2, _ = run_z(capsys, tmp_path, sym, target, "--input-dim", "@x", "3", "4", "--input-dim", "@y", "3", "4",
                       "--fill1")
    assert one["inputs"] == two["inputs"] == {"x": {"dtype": "float32", "shape": [3, 4]},
                                              "y": {"dtype": "float32", "shape": [3, 4]},
                                              "k": {"dtype": "int64", "shape": []}}
    ones = np.ones((3, 4), np.float32)
    want = ort_outputs(sym_model(), {"x": ones, "y": ones, "k": np.array(1, np.int64)})[0]
    np.testing.assert_array_equal(z1, want)
    np.testing.assert_array_equal(z2, want)
    assert "symbolic dims set to 1" not in err1
    # N set on x is N on y too: no dim defaulted to 1
    doc, z, err = run_z(capsys, tmp_path, sym, target, "--input-dim", "@x", "5", "4")
    assert doc["inputs"]["y"]["shape"] == [5, 4] and z.shape == (5, 4) and "symbolic dims" not in err
    bad = {("@x", "one"): "--input-dim @x one: dims must be integers",
           ("@x", "3", "4", "@x", "3", "4"): "--input-dim names '@x' twice",
           ("@q", "1"): "the model has no input 'q' (inputs: x, y, k)",
           ("@x", "3"): "rank 1 [3], but the model's input 'x' is float32[N, 4] (rank 2)",
           ("@x", "3", "5"): "axis 1 is 5, but the model fixes it to 4",
           ("x", "3", "4"): "--input-dim expects @name d1 d2",
           ("@x", "-1", "4"): "dims must be 0 or more"}
    for flags, msg in bad.items():
        rc, out, err = cli(capsys, "run", sym, "--target", target, "--input-dim", *flags)
        assert rc == 1 and msg in err and "Traceback" not in err, (flags, err)


def test_literal_inputs_take_the_models_dtype(sym, target, tmp_path, capsys):
    y = [[1, 2, 3, 4], [5, 6, 7, 8]]
    doc, z, err = run_z(capsys, tmp_path, sym, target, "--input", "k=7", "--input", "x=0.5", "--input", f"y={y}")
    assert doc["inputs"] == {"x": {"dtype": "float32", "shape": [2, 4]}, "y": {"dtype": "float32", "shape": [2, 4]},
                             "k": {"dtype": "int64", "shape": []}}  # y's literal sets N = 2 for x too
    want = ort_outputs(sym_model(), {"x": np.full((2, 4), 0.5, np.float32), "y": np.array(y, np.float32),
                                     "k": np.array(7, np.int64)})[0]
    np.testing.assert_array_equal(z, want)
    np.save(tmp_path / "f64.npy", np.zeros((2, 4)))
    bad = {("k=2.5",): "--input k=2.5: input 'k' is int64; the value must be an integer",
           ("k=abc",): "neither a file nor a literal",
           ("nope=1",): "--input names 'nope', which is not an input of the model (inputs: x, y, k)",
           (f"x={tmp_path / 'f64.npy'}",): "the file holds float64[2, 4], but the model's input 'x' is float32[N, 4]",
           ("k=7", "k=8"): "--input gives 'k' twice",
           ("x=[1, 2]",): "rank 1 [2], but the model's input 'x' is float32[N, 4]",
           (f"x={tmp_path / 'missing.npy'}",): "no such file",
           ("k=99999999999999999999",): "out of the range of int64",
           ("k",): "--input expects name=file.npy|file.pb|value"}
    for specs, msg in bad.items():
        flags = [a for s in specs for a in ("--input", s)]
        rc, out, err = cli(capsys, "run", sym, "--target", target, *flags)
        assert rc == 1 and msg in err and "Traceback" not in err, (specs, err)


def test_fill0_and_fill1(sym, target, tmp_path, capsys):
    cases = {("--fill1", "x", "y", "--input", "k=3"): (1, 1, 3),
             ("--fill0", "--fill1", "x", "--input", "k=2"): (1, 0, 2),   # --fill0 alone: every other input
             ("--fill1",): (1, 1, 1)}
    for flags, (xv, yv, kv) in cases.items():
        doc, z, _ = run_z(capsys, tmp_path, sym, target, "--input-dim", "@x", "2", "4", *flags)
        feeds = {"x": np.full((2, 4), xv, np.float32), "y": np.full((2, 4), yv, np.float32),
                 "k": np.array(kv, np.int64)}
        np.testing.assert_array_equal(z, ort_outputs(sym_model(), feeds)[0])
        assert (z == (xv + yv) * kv).all()
    bad = {("--fill0", "x", "--fill1", "x"): "'x' is named by both --fill0 and --fill1",
           ("--fill0", "q"): "--fill0 names 'q', which is not an input of the model",
           ("--fill0", "--fill1"): "--fill0 and --fill1 both given without names",
           ("--input", "k=1", "--fill0", "k"): "--fill0 names 'k', which --input already gives"}
    for flags, msg in bad.items():
        rc, out, err = cli(capsys, "run", sym, "--target", target, *flags)
        assert rc == 1 and msg in err, (flags, err)


def conv_model():
    """A 3x3 Conv (no padding) then a 2x2 MaxPool on x [1, 1, H, W]: H = W = 1 cannot work."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "H", "W"])
    w = numpy_helper.from_array(np.linspace(-1, 1, 9, dtype=np.float32).reshape(1, 1, 3, 3), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv3x3"),
             helper.make_node("MaxPool", ["c"], ["y"], name="pool2x2", kernel_shape=[2, 2])]
    m = helper.make_model(helper.make_graph(nodes, "conv", [x], [helper.make_tensor_value_info("y", 1, None)], [w]),
                          opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def test_symbolic_dims_set_to_one_are_named_in_the_error(target, tmp_path, capsys):
    path = tmp_path / "conv.onnx"
    onnx.save(conv_model(), str(path))
    for cmd in ("compile", "verify", "run", "perf"):
        extra = {"run": ["--output-dir", tmp_path], "perf": ["-n", "2"]}.get(cmd, [])
        rc, out, err = cli(capsys, cmd, path, "--target", target, *extra)
        assert rc == 1, (cmd, out, err)
        assert "warning: symbolic dims set to 1: x[2], x[3]" in err
        assert "node 'conv3x3' (Conv)" in err  # the underlying error's node
        assert "symbolic dims were set to 1: input 'x' axis 2 ('H'), axis 3 ('W')" in err
        assert "--input-dim @x 1 1 <d2> <d3>" in err and "input_dims={'x': [1, 1, <d2>, <d3>]}" in err
    rc, out, err = cli(capsys, "verify", path, "--target", target, "--input-dim", "@x", "1", "1", "8", "8")
    assert rc == 0 and out.strip().endswith("PASSED") and "symbolic dims" not in err


def test_symbolic_dims_hint_on_ppocr_cls(model_cache, tmp_path, capsys):
    from mgx_graph.models.pypi import model_path

    try:
        path = model_path("ppocr_cls", model_cache)
    except RuntimeError as e:
        pytest.skip(str(e))
    rc, out, err = cli(capsys, "run", path, "--target", "ref", "--output-dir", tmp_path)
    assert rc == 1
    assert re.search(r"node '[^']+' \((MaxPool|AveragePool)\)", err), err
    assert "input 'x' axis 0 (unnamed), axis 2 ('?'), axis 3 ('?')" in err and "--input-dim @x <d0> 3 <d2> <d3>" in err


def int_model():
    """y = table[ids]: integer input only; the float32 weights are indexed, not computed from a float input."""
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [3])
    table = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(4, 2) / 3, "table")
    m = helper.make_model(helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"])], "int", [ids],
                                            [helper.make_tensor_value_info("y", 1, None)], [table]),
                          opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def test_fp16_warns_where_it_cannot_help(sym, target, tmp_path, capsys):
    doc, z, err = run_z(capsys, tmp_path, sym, target, "--fp16", "--input-dim", "@x", "2", "4", "--fill1",
                        "--input", "k=3")
    assert ("numpy emulates float16" in err) is (target == "ref")
    assert "has no effect" not in err
    assert z.dtype == np.float16 and (z == 6).all()  # it did run in half precision
    path = tmp_path / "int.onnx"
    onnx.save(int_model(), str(path))
    rc, out, err = cli(capsys, "run", path, "--target", target, "--fp16", "--input", "ids=[3, 0, 2]",
                       "--output-dir", tmp_path / "i")
    assert rc == 0, err
    assert "--fp16 has no effect on this model: it has no float32 inputs" in err
    y = np.load(tmp_path / "i" / "y.npy")
    want = ort_outputs(int_model(), {"ids": np.array([3, 0, 2], np.int64)})[0]
    assert y.dtype == np.float32  # unchanged, as the warning says
    np.testing.assert_array_equal(y, want)


def test_perf_progress_offload_copy_and_layout(sym, target, capsys):
    rc, out, err = cli(capsys, "perf", sym, "--target", target, "--input-dim", "@x", "2", "4", "-n", "3",
                       "--enable-offload-copy", "--json")
    assert rc == 0, err
    r = json.loads(out)
    check_perf_report(r, 3)
    assert r["offload_copy"] is True
    assert "perf:" in err  # the progress bar, on stderr
    rc, out, err = cli(capsys, "perf", sym, "--target", target, "--input-dim", "@x", "2", "4", "-n", "3",
                       "--no-progress")
    assert rc == 0 and "perf:" not in err
    ops = out.split("Summary:\n")[1].split("\n\n")[0].splitlines()
    assert ops and all(re.fullmatch(r"[\w:]+: [\d.e+-]+ms / \d+ = [\d.e+-]+ms, \d+%", ln) for ln in ops), ops
    per_ins = out.split("\n\nSummary:")[0].splitlines()
    assert per_ins and all(re.fullmatch(r"main:@\d+ .+: [\d.e+-]+ms, \d+%", ln) for ln in per_ins), per_ins
    rc, out, err = cli(capsys, "perf", sym, "--target", target, "-n", "0")
    assert rc == 2 and "argument -n/--iterations: expected an int >= 1, got '0'" in err


def test_json_on_every_command_that_reports_numbers(sym, target, tmp_path, capsys):
    for cmd in ("compile", "verify", "run", "perf"):
        extra = {"run": ["--output-dir", tmp_path], "perf": ["-n", "2", "--no-progress"]}.get(cmd, [])
        rc, out, err = cli(capsys, cmd, sym, "--target", target, "--input-dim", "@x", "2", "4", "--json", *extra)
        assert rc == 0, (cmd, err)
        doc = json.loads(out)
        assert doc["target"] == target and doc["inputs"]["x"]["shape"] == [2, 4], cmd


# -- saved programs (compile -o, then run / perf / compile take the .mxr) ----------------------------
def test_compile_output_saves_a_program_run_and_perf_take(sym, target, tmp_path, capsys):
    saved = tmp_path / "sym.mxr"
    rc, out, err = cli(capsys, "compile", sym, "--target", target, "--hip-graph", "--input-dim", "@x", "2", "4",
                       "-o", saved, "--json")
    assert rc == 0, err
    assert json.loads(out)["saved"] == str(saved) and saved.is_file()
    rng = np.random.default_rng(3)
    feeds = {"x": rng.normal(size=(2, 4)).astype(np.float32), "y": rng.normal(size=(2, 4)).astype(np.float32),
             "k": np.array(3, np.int64)}
    for n in ("x", "y"):
        np.save(tmp_path / f"{n}.npy", feeds[n])
    rc, out, err = cli(capsys, "run", saved, "--input", f"x={tmp_path / 'x.npy'}", "--input", f"y={tmp_path / 'y.npy'}",
                       "--input", "k=3", "--output-dir", tmp_path / "o", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert (doc["target"], doc["hip_graph"]) == (target, True)  # as compiled, though --target is auto here
    np.testing.assert_allclose(np.load(tmp_path / "o" / "z.npy"), ort_outputs(sym_model(), feeds)[0], rtol=1e-6)
    rc, out, err = cli(capsys, "perf", saved, "-n", "3", "--no-progress", "--json")
    assert rc == 0, err
    check_perf_report(json.loads(out), 3)
    rc, out, err = cli(capsys, "compile", saved, "--print")
    assert rc == 0 and f"Compiled [ {target} + graph_launch ]: {saved}" in out and 'module: "main"' in out, err


def test_a_saved_program_refuses_flags_it_cannot_honour(sym, tmp_path, capsys):
    saved = tmp_path / "sym.mxr"
    assert cli(capsys, "compile", sym, "--target", "ref", "--input-dim", "@x", "2", "4", "-o", saved)[0] == 0
    for flags, msg in ((["--hip-graph"], "with no graphs (compiled without --hip-graph); --hip-graph cannot change it"),
                       (["--fp16"], "with float32 (compiled without --fp16); --fp16 cannot change it"),
                       (["--input-dim", "@x", "5", "4"], "@x"),
                       (["--target", "gpu"], "target")):
        rc, out, err = cli(capsys, "run", saved, "--output-dir", tmp_path / "o", *flags)
        assert rc == 1 and msg in err, (flags, err)
    rc, out, err = cli(capsys, "verify", saved)
    assert rc == 1 and "is a saved program: verify compares with onnxruntime and ref compiles" in err, err


def range_model():
    """y = float(range(n)) * 2: the output's length is the value of n."""
    nodes = [helper.make_node("Range", ["zero", "n", "one"], ["r"]), helper.make_node("Cast", ["r"], ["f"], to=1),
             helper.make_node("Mul", ["f", "two"], ["y"])]
    init = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
            numpy_helper.from_array(np.array(1, np.int64), "one"),
            numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    g = helper.make_graph(nodes, "range", [helper.make_tensor_value_info("n", TensorProto.INT64, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], init)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def test_a_value_dependent_model_saves_and_specializes_again(target, tmp_path, capsys):
    path, saved = tmp_path / "range.onnx", tmp_path / "range.mxr"
    onnx.save(range_model(), str(path))
    rc, out, err = cli(capsys, "compile", path, "--target", target, "--input", "n=5", "-o", saved, "--json")
    assert rc == 0 and json.loads(out)["specialized"] is True, err
    with zipfile.ZipFile(saved) as zf:
        assert json.loads(zf.read("program.json"))["kind"] == "dynamic"
    rc, out, err = cli(capsys, "run", saved, "--input", "n=7", "--output-dir", tmp_path / "o")
    assert rc == 0, err
    want = ort_outputs(range_model(), {"n": np.array(7, np.int64)})[0]
    got = np.load(tmp_path / "o" / "y.npy")
    assert got.shape == (7,)
    np.testing.assert_array_equal(got, want)


# -- help texts ----------------------------------------------------------------------------------
def _parsers():
    import argparse

    from mgx_graph.cli.main import build_parser

    ap = build_parser()
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    return {"": ap, **sub.choices}


def test_every_flag_has_help_with_its_default():
    for name, p in _parsers().items():
        fmt = p._get_formatter()
        for a in p._actions:
            if not a.option_strings or a.dest in ("help", "version"):
                continue
            text = fmt._get_help_string(a)
            assert a.help and ("default" in text or a.required), (name, a.option_strings, text)
    assert "timed runs of each kind (default: 100)" in help_texts()["mgx-graph perf --help"].replace("\n ", " ")


BLOCK = re.compile(r"<!-- (mgx-graph[^>]*--help) -->\n```text\n(.*?)```\n", re.S)


CLI_DOC = os.path.join(ROOT, "docs", "cli.md")


def _help_section(text: str):
    start = text.index("\n## Help texts\n")
    end = text.find("\n## ", start + 1)
    return start, (end if end >= 0 else len(text))


def test_cli_doc_shows_each_commands_help_exactly():
    with open(CLI_DOC, encoding="utf-8") as f:
        text = f.read()
    start, end = _help_section(text)
    shown = dict(BLOCK.findall(text[start:end]))
    want = help_texts()
    assert list(shown) == list(want), "run `python tests/cli/test_cli.py` to rewrite the help blocks"
    for cmd, help_text in want.items():
        assert shown[cmd] == help_text, f"{cmd} differs from docs/cli.md: run `python tests/cli/test_cli.py`"


def update_cli_doc() -> None:
    """Rewrite the help blocks of docs/cli.md's "Help texts" section."""
    path = CLI_DOC
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start, end = _help_section(text)
    section = text[start:end]
    first = BLOCK.search(section)
    head = section[:first.start()] if first else section.rstrip("\n") + "\n\n"
    blocks = "".join(f"<!-- {cmd} -->\n```text\n{h}```\n\n" for cmd, h in help_texts().items())
    with open(path, "w", encoding="utf-8") as f:
        f.write(text[:start] + head + blocks.rstrip("\n") + "\n" + text[end:])


# -- packaging -----------------------------------------------------------------------------------
def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_license_and_single_version_source():
    import importlib.metadata

    import mgx_graph

    with open(os.path.join(ROOT, "LICENSE"), encoding="utf-8") as f:
        lic = f.read()
    assert lic.startswith("MIT License\n") and "Copyright (c) 2026 The mgx_graph authors" in lic
    assert "Permission is hereby granted, free of charge" in lic
    proj = _pyproject()
    assert proj["project"]["license"] == "MIT" and "LICENSE" in proj["project"]["license-files"]
    assert "version" not in proj["project"] and "version" in proj["project"]["dynamic"]
    assert proj["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "mgx_graph.version.__version__"}
    assert "py.typed" in proj["tool"]["setuptools"]["package-data"]["mgx_graph"]
    assert os.path.isfile(os.path.join(ROOT, "mgx_graph", "py.typed"))
    written = {}
    for name in ("__init__.py", "version.py"):
        with open(os.path.join(ROOT, "mgx_graph", name), encoding="utf-8") as f:
            written[name] = len(re.findall(r"^__version__ = ", f.read(), re.M))
    assert written == {"__init__.py": 0, "version.py": 1}  # __init__ imports it from version.py
    assert importlib.metadata.version("mgx_graph") == mgx_graph.__version__  # the installed metadata


def test_built_wheel_has_version_license_and_py_typed(tmp_path):
    """Build the wheel from a copy of the sources (setuptools' PEP 517 backend, no network): one wheel for
    every CPython >= 3.10 (cp310-abi3, the native replay built against the limited API where a C compiler
    is present), and no warning from setuptools about this project's configuration."""
    import mgx_graph

    src = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for d in ("operators", "models"):
        shutil.copytree(os.path.join(ROOT, d), src / d, ignore=skip)
    shutil.copytree(os.path.join(ROOT, "mgx_graph"), src / "mgx_graph", symlinks=True,
                    ignore=lambda d, names: [n for n in skip(d, names)] +
                    [n for n in names if os.path.islink(os.path.join(d, n))])
    shutil.copytree(os.path.join(ROOT, "cpp"), src / "cpp", ignore=skip)
    for f in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(os.path.join(ROOT, f), src / f)
    code = "import sys; from setuptools import build_meta as b; print(b.build_wheel(sys.argv[1]))"
    r = subprocess.run([sys.executable, "-W", "default", "-c", code, str(tmp_path / "dist")], cwd=src,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    warned = re.findall(r"^.*\b\w*(?:Warning|_ExperimentalConfiguration|InformationOnly)\b: .*$", r.stderr, re.M)
    assert warned == [], warned  # e.g. `[tool.setuptools.ext-modules]` "is still *experimental*"
    wheel = tmp_path / "dist" / r.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert wheel.name.startswith(f"mgx_graph-{mgx_graph.__version__}-cp310-abi3-"), wheel.name
    assert all(n.endswith(".abi3.so") for n in names if "_native" in n and n.endswith(".so")), names
    assert f"\nVersion: {mgx_graph.__version__}\n" in meta and "License-Expression: MIT" in meta
    assert "mgx_graph/py.typed" in names and any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert {"mgx_graph/cli/main.py", "mgx_graph/cli/inputs.py", "mgx_graph/cli/perf.py"} <= set(names)
    for extra in ("cuda", "cuda12", "cuda13", "rocm", "export", "test"):
        assert f"Provides-Extra: {extra}\n" in meta


def test_extras_pin_matching_releases():
    from packaging.requirements import Requirement

    extras = {k: {Requirement(r).name: Requirement(r) for r in v}
              for k, v in _pyproject()["project"]["optional-dependencies"].items()}
    assert set(extras["cuda12"]) == {"cupy-cuda12x", "cuda-bindings", "nvmath-python", "cuda-toolkit"}
    assert set(extras["cuda13"]) == {"cupy-cuda13x", "cuda-bindings", "nvmath-python", "cuda-toolkit"}
    for major in (12, 13):  # the CUDA libraries from PyPI, of the same major as CuPy's build and cuda-bindings
        ctk = extras[f"cuda{major}"]["cuda-toolkit"]
        assert ctk.extras == {"cublas", "cudart", "cufft", "nvrtc"}
        assert ctk.specifier.contains(f"{major}.4.1") and not ctk.specifier.contains(f"{major + 1}.0.0")
        assert not ctk.specifier.contains(f"{major - 1}.8.0")
        cupy = extras[f"cuda{major}"][f"cupy-cuda{major}x"].specifier  # CuPy 14 finds the CUDA wheels
        assert cupy.contains("14.2.0") and not cupy.contains("13.6.0")
        assert not extras[f"cuda{major}"]["nvmath-python"].specifier.contains("0.5.0")
    cb12, cb13 = extras["cuda12"]["cuda-bindings"].specifier, extras["cuda13"]["cuda-bindings"].specifier
    assert cb12.contains("12.9.10") and not cb12.contains("13.0.0")
    assert cb13.contains("13.5.0") and not cb13.contains("12.9.10") and not cb13.contains("14.0.0")
    assert {k: str(v) for k, v in extras["cuda"].items()} == {k: str(v) for k, v in extras["cuda13"].items()}
    rocm = extras["rocm"]
    assert set(rocm) == {"hip-python", "cupy-rocm-7-0"}  # CuPy built against ROCm 7.0
    hip = rocm["hip-python"].specifier  # hip-python's ROCm 7.0 releases carry hipblas in their wheel
    assert hip.contains("7.0.2.555.40") and hip.contains("7.0.0.555.40")
    assert not hip.contains("7.1.1.562.43") and not hip.contains("6.4.4.555.40") and not hip.contains("10.0.0.0.1.2")
    tf = extras["export"]["transformers"].specifier
    assert tf.contains("5.24.0") and not tf.contains("5.17.0") and not tf.contains("5.23.0")


if __name__ == "__main__":
    update_cli_doc()


def test_inputs_larger_than_host_memory_are_a_typed_error_before_any_allocation(tmp_path, capsys):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [10 ** 6, 10 ** 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "huge.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    for cmd in ("run", "compile", "perf"):
        rc, out, err = cli(capsys, cmd, path)
        assert rc != 0 and "input 'x' float32[1000000, 1000000]: 1000000000000 elements, 4000000000000 bytes" in err, err


def test_perf_of_a_decode_step_binds_its_cache_in_place_as_generate_does(model_cache, target, capsys):
    """`perf` compiles with the outputs bound in place (alias "auto"), so a decode step launches what
    it launches under `generate` (no copy of the cache per run), and the present outputs still equal
    onnxruntime's under `verify`."""
    import mgx_graph
    from mgx_graph.models import build

    try:
        info = build("llama", cache_dir=model_cache, progress=False)
    except ImportError as e:
        pytest.skip(f"model export needs the [export] extra: {e}")
    from mgx_graph.llm.generation import Decoder

    prog = mgx_graph.compile(str(info.onnx_path), target=target)
    Decoder(prog).step(1)  # the Decoder refuses a program whose cache is not bound in place
    want = prog.stats()["launches_per_run"]
    plain = mgx_graph.compile(str(info.onnx_path), target=target, alias=None)
    rc, out, err = cli(capsys, "perf", str(info.onnx_path), "--target", target, "-n", "2", "--no-progress", "--json")
    assert rc == 0, err
    got = json.loads(out)["launches_per_run"]
    plain.run({n: np.zeros(s.lens, s.np_dtype) for n, s in plain.get_parameter_shapes().items()})
    assert got == want < plain.stats()["launches_per_run"], (got, want)
    rc, out, err = cli(capsys, "verify", str(info.onnx_path), "--target", target)
    assert rc == 0 and "FAILED" not in out, out + err


def test_run_writes_outputs_whose_file_names_collide_to_separate_files(tmp_path, capsys):
    """Output names that differ but make the same file name ("a/b", "a_b", "A_B") are each saved, with the
    values onnxruntime gives for that output (the later ones take their index in the file name)."""
    import onnxruntime as ort

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("Relu", ["x"], ["a/b"]), helper.make_node("Neg", ["x"], ["a_b"]),
             helper.make_node("Abs", ["x"], ["A_B"])]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("a/b", "a_b", "A_B")]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], outs), opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    value = np.array([[-1.5, 2, -3], [4, -5, 6]], np.float32)
    np.save(tmp_path / "x.npy", value)
    rc, out, err = cli(capsys, "run", path, "--target", "ref", "--input", f"x={tmp_path / 'x.npy'}",
                       "--output-dir", tmp_path / "o", "--json")
    assert rc == 0, err
    saved = json.loads(out)["outputs"]
    want = dict(zip(("a/b", "a_b", "A_B"), ort.InferenceSession(m.SerializeToString()).run(None, {"x": value})))
    assert len({s["path"] for s in saved}) == 3
    for s in saved:
        np.testing.assert_array_equal(np.load(s["path"]), want[s["output"]], err_msg=s["output"])
