"""Files the command line reads, crafted: a corrupt saved program (``.mxr``) given to ``run`` / ``perf`` /
``compile`` / ``verify`` or to :func:`mgx_graph.load` is reported as not a valid saved program (never as an
ONNX protobuf), a bad ``--input`` file as one line naming the flag, the file and the fault (a ``.npy``
header declaring more data than the file holds is refused before anything is allocated), and
``mgx-graph generate`` on a folder whose ``tokenizer.json`` is malformed prints one ``mgx-graph: error:``
line naming the file, exit status 1 or 2, no traceback (the real entry point, in a subprocess)."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mgx_graph
from mgx_graph.errors import ParseError
from test_cli_errors import ERROR, one_error, run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def relu_model():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli_files")
    onnx.save(relu_model(), str(d / "relu.onnx"))
    mgx_graph.compile(relu_model(), target="ref").save(str(d / "good.mxr"))
    good = (d / "good.mxr").read_bytes()
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0xFF
    corrupt = {"random": os.urandom(300), "zip_magic": b"PK\x03\x04 not really a zip", "empty": b"",
               "truncated": good[: len(good) // 2], "flipped": bytes(flipped),
               "onnx_named_mxr": relu_model().SerializeToString()[:-3]}
    for name, data in corrupt.items():
        (d / f"{name}.mxr").write_bytes(data)
    with zipfile.ZipFile(d / "other.zip", "w") as zf:
        zf.writestr("notes.txt", "a zip, but no saved program")
    return d, sorted(corrupt)


@pytest.mark.parametrize("command", ["run", "perf", "compile", "verify"])
def test_a_corrupt_saved_program_is_named_as_such_by_every_command(files, command, capsys, tmp_path):
    d, names = files
    for name in names:
        rc, _, err = run_cli(capsys, command, d / f"{name}.mxr", "--target", "ref", *(
            ["--output-dir", tmp_path] if command == "run" else []))
        line = one_error(rc, err, (command, name))
        assert "ONNX protobuf" not in line, (command, line)
        says = [f"{name}.mxr: not a valid saved program (.mxr zip)"]
        if command == "verify":  # a zip with program.json: verify takes models only, whole or not
            says.append(f"{name}.mxr is a saved program: verify compares with onnxruntime")
        assert any(s in line for s in says), (command, line)
    rc, _, err = run_cli(capsys, command, d / "other.zip", "--target", "ref")
    assert "other.zip: not a saved mgx_graph program (no program.json)" in one_error(rc, err, (command, "zip"))


def test_load_names_a_corrupt_saved_program_and_compile_points_at_load(files):
    d, names = files
    for name in names:
        with pytest.raises(ParseError) as e:
            mgx_graph.load(str(d / f"{name}.mxr"))
        assert str(e.value).startswith(str(d / f"{name}.mxr")) and "saved program" in str(e.value), str(e.value)
        assert "ONNX protobuf" not in str(e.value)
    with pytest.raises(ParseError, match=r"not a valid ONNX protobuf .*a saved program \(\.mxr\) is opened with "
                                         r"mgx_graph\.load"):
        mgx_graph.compile(str(d / "random.mxr"), target="ref")


def _npy_header(path, shape, descr="<f4", data=b""):
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": descr, "fortran_order": False, "shape": shape})
        f.write(data)


def test_bad_input_files_are_one_line_naming_the_file(files, tmp_path, capsys):
    d, _ = files
    t = tmp_path
    (t / "garbage.npy").write_bytes(b"hello, not numpy")
    _npy_header(t / "huge.npy", (10 ** 12,), data=b"\0" * 16)   # 4 TB declared, 16 bytes held
    np.save(t / "objects.npy", np.array([{"a": 1}, 2], dtype=object), allow_pickle=True)
    np.save(t / "short.npy", np.ones((2, 3), np.float32))
    (t / "short.npy").write_bytes((t / "short.npy").read_bytes()[:-5])
    (t / "header.npy").write_bytes(b"\x93NUMPY\x01\x00\x14\x00{'descr': <f4\n     \n")
    (t / "folder.npy").mkdir()
    ext = numpy_helper.from_array(np.ones((2, 3), np.float32), "x")
    ext.ClearField("raw_data")
    ext.data_location = TensorProto.EXTERNAL
    ext.external_data.add(key="location", value="/etc/hostname")
    (t / "external.pb").write_bytes(ext.SerializeToString())
    dims = numpy_helper.from_array(np.ones((2, 3), np.float32), "x")
    dims.dims[:] = [1000, 1000]
    (t / "dims.pb").write_bytes(dims.SerializeToString())
    (t / "garbage.pb").write_bytes(b"\xff" * 40)
    cases = {"garbage.npy": "not a valid .npy file", "huge.npy": "its header declares float32[1000000000000] (4000000000000 "
             "bytes) but the file holds 16 bytes", "objects.npy": "holds object values",
             "short.npy": "its header declares float32[2, 3] (24 bytes) but the file holds 19 bytes",
             "header.npy": "not a valid .npy file", "folder.npy": "not a regular file",
             "external.pb": "the tensor keeps its data in an external file", "dims.pb": "cannot read tensor",
             "garbage.pb": "not a valid TensorProto"}
    for name, says in cases.items():
        rc, _, err = run_cli(capsys, "run", d / "relu.onnx", "--target", "ref", "--input", f"x={t / name}",
                             "--output-dir", t / "out")
        line = one_error(rc, err, name)
        assert f"--input x={t / name}: {says}" in line, (name, line)


def test_a_fortran_order_npy_input_reads_as_numpy_reads_it(files, tmp_path, capsys):
    d, _ = files
    x = np.asfortranarray(np.arange(-3, 3, dtype=np.float32).reshape(2, 3))
    np.save(tmp_path / "x.npy", x)
    rc, _, err = run_cli(capsys, "run", d / "relu.onnx", "--target", "ref", "--input", f"x={tmp_path / 'x.npy'}",
                         "--output-dir", tmp_path / "out")
    assert rc == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), np.maximum(np.load(tmp_path / "x.npy"), 0))


TOKENIZERS = {"truncated": b'{"version": "1.0", "model": ', "non_utf8": b"\xff\xfe{}", "array": b"[1, 2]",
              "deep": b"[" * 100_000, "huge_int": b'{"version": 1' + b"9" * 5000 + b"}",
              "bad_model": b'{"model": {"type": "BPE", "vocab": 5, "merges": []}}'}


@pytest.mark.parametrize("case", sorted(TOKENIZERS))
def test_generate_on_a_folder_with_a_malformed_tokenizer_json(tmp_path, case):
    from test_llm_folder_errors import genai_folder

    folder = genai_folder(tmp_path)
    (folder / "tokenizer.json").write_bytes(TOKENIZERS[case])
    env = dict(os.environ)
    env.pop("MGX_GRAPH_DEBUG", None)
    r = subprocess.run([sys.executable, "-m", "mgx_graph", "generate", str(folder), "--prompt", "hi", "--target",
                        "ref"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    line = one_error(r.returncode, r.stderr, case)
    assert line.startswith(ERROR) and "tokenizer.json" in line, (case, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
