"""Fuzz: the external data references of a model in a folder (location climbing out with ``..``, absolute,
through a symlink, long, empty, a folder; offset and length out of range; the data_location flag).
Compiling the model (from its path, or from bytes with ``external_data_dir``, or from bytes with none)
must open no file outside the model folder (open audit), and otherwise obey the onnxruntime oracle
(fuzz_oracle.py).  Derandomized."""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from onnx import TensorProto

from fuzz_oracle import OpenAudit, check_model, count, fail, memory_cap, run_mgx
from fuzz_seeds import make_feeds, seed

DECOY = 1e6  # the value of every weight outside the model folder: outputs this large were read from there
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")
FUZZ = settings(derandomize=True, deadline=None, database=None, print_blob=False,
                suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    """``root/secret.bin`` (outside; as long as the weights, so a read of it would succeed, its values
    ``DECOY``), ``root/cwd/weights.bin`` (the same, in the working folder), and ``root/model/``: model.onnx
    with its weights in weights.bin, a symlink ``link_out`` to the secret and a subfolder ``sub``."""
    root = tmp_path_factory.mktemp("ext")
    model_dir, cwd = root / "model", root / "cwd"
    model_dir.mkdir()
    cwd.mkdir()
    (model_dir / "sub").mkdir()
    m = seed("matmul_add")
    onnx.save_model(m, str(model_dir / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    size = (model_dir / "weights.bin").stat().st_size
    decoy = np.full(size // 4, DECOY, np.float32).tobytes()
    (root / "secret.bin").write_bytes(decoy)
    (cwd / "weights.bin").write_bytes(decoy)
    os.symlink(root / "secret.bin", model_dir / "link_out")
    return root, onnx.load(str(model_dir / "model.onnx"), load_external_data=False)


def _locations(root) -> list[str]:
    return ["../secret.bin", str(root / "secret.bin"), "sub/../../secret.bin", "link_out", "a" * 300,
            "a/" * 2000 + "w", "", ".", "/", "sub", "weights.bin\x00x", "~/secret.bin", "//" + str(root / "secret.bin"),
            "C:\\secret.bin", "./weights.bin", "sub/../weights.bin", "%2e%2e/secret.bin", "file:../secret.bin",
            "weights.bin"]


def _mutate(draw, m: onnx.ModelProto, root) -> str:
    tensors = [t for t in m.graph.initializer]
    t = draw(st.sampled_from(tensors))
    kind = draw(st.sampled_from(["location", "location", "location", "offset", "length", "flag", "extra-key"]))
    entries = {e.key: e for e in t.external_data}
    if kind == "location":
        v = draw(st.sampled_from(_locations(root)))
        (entries.get("location") or t.external_data.add(key="location")).value = v
        return f"{t.name}: location {v[:60]!r}"
    if kind in ("offset", "length"):
        v = draw(st.sampled_from([-1, 0, 1, 4, 47, 48, 2 ** 31, 2 ** 62, "x"]))
        e = entries.get(kind) or t.external_data.add(key=kind)
        e.value = str(v)
        return f"{t.name}: {kind} {v}"
    if kind == "flag":
        if draw(st.booleans()):
            t.data_location = TensorProto.DEFAULT
            return f"{t.name}: data_location DEFAULT with external_data entries"
        del t.external_data[:]
        return f"{t.name}: data_location EXTERNAL without entries"
    t.external_data.add(key=draw(st.sampled_from(["location", "checksum", "basepath", "foo"])), value="../secret.bin")
    return f"{t.name}: extra key {t.external_data[-1].key}"


@settings(FUZZ, max_examples=240)
@given(data=st.data(), how=st.sampled_from(["path", "bytes+dir", "bytes"]))
def test_fuzz_external_data(layout, data, how):
    root, base = layout
    m = onnx.ModelProto()
    m.CopyFrom(base)
    steps = [_mutate(data.draw, m, root) for _ in range(data.draw(st.integers(1, 2)))]
    folder = root / "model"
    path = folder / f"case_{how.replace('+', '_')}.onnx"
    raw = m.SerializeToString()
    path.write_bytes(raw)
    case = f"{how}: {'; '.join(steps)}"
    model, kw = {"path": (str(path), {}), "bytes+dir": (raw, {"external_data_dir": str(folder)}),
                 "bytes": (raw, {})}[how]
    feeds = make_feeds(m, np.random.default_rng(0))
    here = os.getcwd()
    os.chdir(root / "cwd")
    try:
        with memory_cap(), OpenAudit() as audit:
            state, ours = run_mgx(model, feeds, **kw)
    finally:
        os.chdir(here)
    count("external-data", f"{how} {state}")
    bad = audit.outside(str(folder))
    if bad:
        fail("external-data", "outside", f"opened {bad}; mgx_graph: {state} {ours!r:.300}", case)
    if state == "untyped":
        fail("external-data", "memory" if isinstance(ours, MemoryError) else "untyped", "", case, ours)
    if state == "ok" and how == "bytes" and max(float(np.abs(o).max(initial=0)) for o in ours) >= DECOY / 10:
        # the audit sees Python's opens; this sees a read by any code (onnx's C++ included).  In the model
        # folder, such a read gives other values than onnxruntime's: the comparison below finds it.
        fail("external-data", "outside", f"a model given as bytes without external_data_dir read the weights "
             f"of the working folder: outputs {ours}", case)
    if state == "ok" and how != "bytes":
        # compiled: it must then give onnxruntime's outputs (onnxruntime reads the model from its folder)
        check_model(str(path), feeds, "external-data", case, new_input=False)
