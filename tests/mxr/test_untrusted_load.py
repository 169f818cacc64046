"""Loading untrusted models: ONNX external data is read only from regular files inside the model's
folder, within their sizes; an in-memory model's external data needs an explicit folder; a saved
program (.mxr) must hold all its data.  Each attack asserts the typed error, the name it carries,
and that the file outside the folder was never opened and its bytes appear in no output; the good
cases are checked against onnxruntime."""
import builtins
import io
import os
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mgx_graph
from mgx_graph.cli.main import main as cli_main
from util import ort_run

SECRET = b"TOPSECRET-BYTES!"  # 16 bytes: four float32 values, the size of the weight w
W = np.array([0.5, -1.0, 2.0, 0.25], np.float32)
X = np.arange(12, dtype=np.float32).reshape(3, 4) / 7


def add_model(dims=("n", 4), location=None, offset=None, length=None):
    """y = x + w, w a float32 [4] initializer; with ``location`` its data is external at that path."""
    w = numpy_helper.from_array(W, "w")
    if location is not None:
        w.ClearField("raw_data")
        w.data_location = TensorProto.EXTERNAL
        for k, v in (("location", location), ("offset", offset), ("length", length)):
            if v is not None:
                w.external_data.add(key=k, value=str(v))
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "add",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


@pytest.fixture
def opened(monkeypatch):
    """The real paths of every file opened by path (builtins.open, io.open, os.open) while the test runs."""
    seen = []

    def record(real):
        def wrapper(file, *a, **kw):
            if isinstance(file, (str, bytes, os.PathLike)):
                seen.append(os.path.realpath(os.fsdecode(file)))
            return real(file, *a, **kw)
        return wrapper

    monkeypatch.setattr(builtins, "open", record(builtins.open))
    monkeypatch.setattr(io, "open", record(io.open))
    monkeypatch.setattr(os, "open", record(os.open))
    return seen


@pytest.fixture
def secret(tmp_path, monkeypatch):
    """A folder holding secret.bin (the sentinel bytes), made the current directory; returns its path."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "secret.bin").write_bytes(SECRET)
    monkeypatch.chdir(cwd)
    return str((cwd / "secret.bin").resolve())


def model_folder(tmp_path, model, files=None):
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    for name, data in (files or {}).items():
        (folder / name).write_bytes(data)
    path = folder / "model.onnx"
    onnx.save(model, str(path))
    return path


def assert_untouched(opened, secret, *outputs):
    assert secret not in opened
    for a in outputs:
        assert SECRET not in np.asarray(a).tobytes()


# -- a saved program holds all its data -------------------------------------------------------------
def evil_mxr(tmp_path):
    """A dynamic-shape program whose model.onnx stores w as external data named secret.bin."""
    path = tmp_path / "evil.mxr"
    mgx_graph.compile(add_model(), target="ref").save(path)
    evil = add_model(location="secret.bin").SerializeToString()
    tmp = tmp_path / "evil.tmp"
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(tmp, "w") as zout:
        for item in zin.infolist():
            zout.writestr(item, evil if item.filename == "model.onnx" else zin.read(item.filename))
    os.replace(tmp, path)
    return path


def test_saved_program_with_external_data_is_refused(tmp_path, secret, opened):
    path = evil_mxr(tmp_path)
    with pytest.raises(mgx_graph.ParseError, match=r"evil\.mxr: member model\.onnx: tensor 'w' refers to external "
                                                   r"data \('secret\.bin'\)"):
        mgx_graph.load(path)
    assert_untouched(opened, secret)


def test_cli_run_of_a_saved_program_with_external_data_writes_nothing(tmp_path, secret, opened, capsys):
    path = evil_mxr(tmp_path)
    rc = cli_main(["run", str(path), "--fill0", "--input-dim", "@x", "1", "4"])
    out, err = capsys.readouterr()
    assert rc != 0 and "tensor 'w'" in err and "model.onnx" in err
    assert not [f for f in os.listdir(".") if f.endswith(".npy")]
    assert SECRET.decode() not in out + err
    assert_untouched(opened, secret)


# -- in-memory models -------------------------------------------------------------------------------
@pytest.mark.parametrize("form", ["bytes", "proto"])
def test_in_memory_model_with_external_data_needs_a_folder(tmp_path, secret, opened, form):
    model = add_model(dims=(3, 4), location="secret.bin")
    given = model.SerializeToString() if form == "bytes" else model
    with pytest.raises(mgx_graph.ParseError, match=r"tensor 'w' keeps its data in an external file \('secret\.bin'\)"
                                                   r".*external_data_dir"):
        mgx_graph.compile(given, target="ref")
    with pytest.raises(mgx_graph.ParseError, match=r"tensor 'w'"):
        mgx_graph.parse_onnx(given)
    assert_untouched(opened, secret)


@pytest.mark.parametrize("form", ["bytes", "proto"])
def test_in_memory_model_reads_external_data_from_the_folder_given(tmp_path, secret, opened, form):
    folder = tmp_path / "weights"
    folder.mkdir()
    (folder / "secret.bin").write_bytes(W.tobytes())  # same name as the cwd's file: only the folder's is read
    model = add_model(dims=(3, 4), location="secret.bin")
    given = model.SerializeToString() if form == "bytes" else model
    prog = mgx_graph.compile(given, target="ref", external_data_dir=str(folder))
    y = prog.run({"x": X})[0]
    np.testing.assert_allclose(y, ort_run(add_model(dims=(3, 4)), {"x": X})[0], rtol=1e-6)
    assert_untouched(opened, secret, y)
    if form == "proto":
        assert model.graph.initializer[0].data_location == TensorProto.EXTERNAL  # the caller's model unchanged


# -- a model folder ------------------------------------------------------------------------------------
def test_external_data_inside_the_folder_loads_like_onnxruntime(tmp_path, secret, opened):
    path = model_folder(tmp_path, add_model(dims=(3, 4), location="sub/w.bin", offset=8, length=16))
    os.mkdir(path.parent / "sub")
    (path.parent / "sub" / "w.bin").write_bytes(b"padding!" + W.tobytes())
    y = mgx_graph.compile(str(path), target="ref").run({"x": X})[0]
    import onnxruntime as ort

    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    np.testing.assert_allclose(y, want, rtol=1e-6)
    assert_untouched(opened, secret, y)


def escapes(tmp_path, secret):
    """(location, extra setup) pairs of external data that leave the model folder."""
    return {
        "absolute": (secret, None),
        "dotdot": ("../cwd/secret.bin", None),
        "dotdot-inside": ("sub/../../cwd/secret.bin", None),
        "symlink": ("link.bin", lambda folder: os.symlink(secret, folder / "link.bin")),
        "dir-symlink": ("d/secret.bin", lambda folder: os.symlink(os.path.dirname(secret), folder / "d")),
        "basepath": ("secret.bin", None),
    }


@pytest.mark.parametrize("case", ["absolute", "dotdot", "dotdot-inside", "symlink", "dir-symlink", "basepath"])
def test_external_data_outside_the_folder_is_refused(tmp_path, secret, opened, case):
    location, setup = escapes(tmp_path, secret)[case]
    model = add_model(dims=(3, 4), location=location)
    if case == "basepath":  # onnx writes it; onnxruntime refuses it
        model.graph.initializer[0].external_data.add(key="basepath", value=os.path.dirname(secret))
    path = model_folder(tmp_path, model)
    if setup is not None:
        setup(path.parent)
    msg = r"keys \['basepath'\] are unknown" if case == "basepath" else r"location .*(outside the model's folder|" \
                                                                         r"relative path inside)"
    with pytest.raises(mgx_graph.ParseError, match=rf"model\.onnx: tensor 'w': external data {msg}"):
        mgx_graph.compile(str(path), target="ref")
    assert_untouched(opened, secret)


def test_fifo_and_folder_are_refused_without_reading(tmp_path, opened):
    path = model_folder(tmp_path, add_model(dims=(3, 4), location="pipe"))
    os.mkfifo(path.parent / "pipe")  # opening it for read would block: never opened
    with pytest.raises(mgx_graph.ParseError, match=r"tensor 'w': external data location 'pipe': not a regular file"):
        mgx_graph.compile(str(path), target="ref")
    assert str((path.parent / "pipe").resolve()) not in opened
    os.remove(path.parent / "pipe")
    os.mkdir(path.parent / "pipe")
    with pytest.raises(mgx_graph.ParseError, match=r"tensor 'w': external data location 'pipe': not a regular file"):
        mgx_graph.compile(str(path), target="ref")


@pytest.mark.parametrize("offset, length, msg", [
    (32, None, r"offset 32 is past the end of 'w\.bin' \(16 bytes\)"),
    (8, 16, r"offset 8 \+ length 16 is past the end of 'w\.bin' \(16 bytes\)"),
    (None, 10 ** 15, r"offset 0 \+ length 1000000000000000 is past the end of 'w\.bin' \(16 bytes\)"),
    (None, 12, r"dims \[4\] need 16 bytes, its external data in 'w\.bin' has 12"),
    ("-4", None, r"external data offset must be a non-negative integer, given '-4'"),
    (None, "1e3", r"external data length must be a non-negative integer, given '1e3'"),
])
def test_external_data_bounds_are_checked_before_reading(tmp_path, offset, length, msg, monkeypatch):
    path = model_folder(tmp_path, add_model(dims=(3, 4), location="w.bin", offset=offset, length=length),
                        {"w.bin": W.tobytes()})
    reads = []
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, at: reads.append(n) or real(fd, n, at))
    with pytest.raises(mgx_graph.ParseError, match=rf"model\.onnx: tensor 'w': (external data )?{msg}"):
        mgx_graph.compile(str(path), target="ref")
    assert reads == []


def test_missing_external_file_names_the_tensor(tmp_path):
    path = model_folder(tmp_path, add_model(dims=(3, 4), location="gone.bin"))
    with pytest.raises(mgx_graph.ParseError, match=r"external data file 'gone\.bin' of tensor 'w' not found in"):
        mgx_graph.compile(str(path), target="ref")


def test_onnx_saved_external_data_with_several_tensors_in_one_file(tmp_path):
    """What onnx.save writes (aligned offsets and lengths, every tensor in one file) loads as onnxruntime
    reads it."""
    model = add_model(dims=(3, 4))
    b = numpy_helper.from_array(np.linspace(-1, 1, 4).astype(np.float32), "b")
    model.graph.initializer.append(b)
    model.graph.node[0].output[0] = "s"
    model.graph.node.append(helper.make_node("Mul", ["s", "b"], ["y"]))
    folder = tmp_path / "m"
    folder.mkdir()
    onnx.save_model(model, str(folder / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    stored = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    assert all(t.data_location == TensorProto.EXTERNAL for t in stored.graph.initializer)
    import onnxruntime as ort

    want = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": X})
    np.testing.assert_allclose(mgx_graph.compile(str(folder / "model.onnx"), target="ref").run({"x": X})[0],
                               want[0], rtol=1e-6)


@pytest.mark.parametrize("extra", [("foo", "1"), ("location", "w.bin")])
def test_unknown_or_repeated_external_data_keys_are_refused(tmp_path, extra):
    model = add_model(dims=(3, 4), location="w.bin")
    model.graph.initializer[0].external_data.add(key=extra[0], value=extra[1])
    path = model_folder(tmp_path, model, {"w.bin": W.tobytes()})
    with pytest.raises(mgx_graph.ParseError, match=rf"tensor 'w': external data keys \['{extra[0]}'\] are unknown or "
                                                   "repeated"):
        mgx_graph.compile(str(path), target="ref")
