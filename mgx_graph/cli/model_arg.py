"""The model argument of the commands: a registry name, a folder built by ``mgx_graph.models`` or a
file; and the warnings the commands print about it."""
from __future__ import annotations

import os
import sys

import numpy as np

from ..llm.folder_config import load_built_info
from .inputs import UsageError, model_inputs


def article(word: str) -> str:
    return ("an " if word[:1] in "aeiou" else "a ") + word


def warn(msg: str) -> None:
    print(f"mgx-graph: warning: {msg}", file=sys.stderr)


def load_model(name: str, progress: bool = True):
    from ..models import build, list_models

    if os.path.isdir(name):
        return load_built_info(name)  # ParameterError naming what the folder lacks or a malformed field
    if name not in list_models():
        if os.path.exists(name):
            raise UsageError(f"{name} is a file: give a model folder or a registry name ({', '.join(list_models())})")
        if os.sep in name or name.endswith((".onnx", ".mxr", ".json")):
            raise UsageError(f"{name}: no such file or folder")
        raise UsageError(f"unknown model '{name}': use one of {', '.join(list_models())} or a built model folder")
    return build(name, progress=progress)


FP16_ON_REF = ("--fp16 on the ref target: numpy emulates float16 arithmetic, so this runs slower than "
               "float32 (use it to check half-precision results, not for speed)")
FP16_NO_EFFECT = ("--fp16 has no effect on this model: it has no float32 inputs, and quantize_fp16 converts "
                  "only what is computed from a float32 parameter (integer inputs such as token ids, and the "
                  "weights they index, stay float32)")


def fp16_warnings(fp16: bool, target: str, proto=None) -> None:
    """Warn where --fp16 cannot help: on ``ref`` (slower), on a model with no float32 input (no effect)."""
    if not fp16:
        return
    if target == "ref":
        warn(FP16_ON_REF)
    if proto is None:
        return
    float_in = any(i.dtype == np.float32 for i in model_inputs(proto).values())
    subgraphs = any(a.type in (5, 10) for n in proto.graph.node for a in n.attribute)  # GRAPH, GRAPHS
    if not float_in and not subgraphs:  # quantize_fp16 then leaves every instruction as it is
        warn(FP16_NO_EFFECT)


def model_path(name: str) -> str:
    """An .onnx or .mxr path, or a registry name / built model folder (its model.onnx)."""
    if os.path.isfile(name) or name.endswith((".onnx", ".mxr")):
        return name
    return str(load_model(name).onnx_path)
