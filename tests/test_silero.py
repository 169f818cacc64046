"""Real models from the PyPI package silero-vad (voice activity detection): streaming 30 chunks with
the recurrent state fed back, against onnxruntime CPU, on every target, eager and with graphs."""
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import mgx_graph

VERSION = "6.2.3"
MODELS = {  # file -> (chunk samples, has sr input)
    "silero_vad.onnx": (512, True),                 # 25 If nodes, 4 LSTM
    "silero_vad_op18_ifless.onnx": (512, True),     # 1 If, LSTM unrolled into Gemm/Tanh/Sigmoid
    "silero_vad_openvino_16k.onnx": (576, False),   # fully static, 1 LSTM
}


def fetch_pypi_package(name: str, version: str, cache: str) -> str:
    """Download (once) and unpack a PyPI wheel into ``cache``; returns the unpacked folder."""
    dest = os.path.join(cache, "pypi", f"{name}-{version}")
    if os.path.isdir(dest):
        return dest
    wheels = os.path.join(cache, "pypi", "wheels")
    os.makedirs(wheels, exist_ok=True)
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", wheels,
                        f"{name}=={version}"], capture_output=True, text=True)
    whl = [f for f in os.listdir(wheels) if f.lower().startswith(name.replace("-", "_")) and version in f]
    if r.returncode != 0 or not whl:
        pytest.skip(f"cannot download {name}=={version}: {r.stderr.strip()[-200:]}")
    tmp = dest + ".tmp"
    with zipfile.ZipFile(os.path.join(wheels, whl[0])) as z:
        z.extractall(tmp)
    os.replace(tmp, dest)
    return dest


@pytest.fixture(scope="module")
def silero_dir(model_cache):
    return os.path.join(fetch_pypi_package("silero-vad", VERSION, model_cache), "silero_vad", "data")


def stream(path, n, has_sr, prog, chunks=30, seed=0):
    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    t = np.arange(n * chunks) / 16000.0
    audio = (0.3 * np.sin(2 * np.pi * 220 * t) * (rng.random(t.size) > 0.3) + 0.05 * rng.normal(size=t.size))
    state = np.zeros((2, 1, 128), np.float32)
    worst = 0.0
    for c in range(chunks):
        feeds = {"input": audio[c * n:(c + 1) * n].astype(np.float32)[None], "state": state}
        if has_sr:
            feeds["sr"] = np.array(16000, np.int64)
        want = sess.run(None, feeds)
        got = prog.run(feeds)
        for g, e in zip(got, want):
            assert g.shape == e.shape
            err = float(np.max(np.abs(g - e)))
            assert err < 1e-4, (c, err)
            worst = max(worst, err)
        state = got[1]
    return worst


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_silero_streaming_matches_onnxruntime(silero_dir, name, target, hip_graph):
    n, has_sr = MODELS[name]
    path = os.path.join(silero_dir, name)
    dims = {"input": [1, n], "state": [2, 1, 128]} if has_sr else None
    prog = mgx_graph.compile(path, target=target, hip_graph=hip_graph, input_dims=dims)
    stream(path, n, has_sr, prog)
    st = prog.stats()
    assert st["fallbacks"] == 0
    if hip_graph:
        assert st["captures"] >= 1 and st["replays"] == st["captures"] * (30 - 3)
