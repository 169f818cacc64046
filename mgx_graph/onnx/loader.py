"""Reading an ONNX model: the protobuf, its external data, and the facts about its inputs that do not
need a parse (which dims are symbolic), plus the light copy onnx shape inference runs on."""
from __future__ import annotations

import os

import numpy as np
import onnx

from ..errors import ParseError
from .topology import sort_graph


def load_model(path_or_model, external_data_dir: str | None = None) -> onnx.ModelProto:
    """Load an ONNX model from a path, bytes or ModelProto (a ModelProto is returned as is).

    External tensor data is read from ``external_data_dir`` (default: the model file's folder).
    Raises ParseError: no such file, not a valid ONNX protobuf, or external data missing / unreadable.
    """
    if isinstance(path_or_model, onnx.ModelProto):
        return path_or_model
    if isinstance(path_or_model, (bytes, bytearray)):
        try:
            m = onnx.load_from_string(bytes(path_or_model))
        except Exception as e:  # protobuf DecodeError
            raise ParseError(f"<bytes>: not a valid ONNX protobuf ({type(e).__name__}: {e})") from None
        if external_data_dir:
            _load_external(m, external_data_dir, "<bytes>")
        return m
    path = os.fspath(path_or_model)
    if not os.path.exists(path):
        raise ParseError(f"{path}: no such file")
    try:
        m = onnx.load(path, load_external_data=False)
    except Exception as e:
        raise ParseError(f"{path}: not a valid ONNX protobuf ({type(e).__name__}: {e})") from None
    _load_external(m, external_data_dir or os.path.dirname(os.path.abspath(path)), path)
    return m


def _load_external(m: onnx.ModelProto, base: str, where: str) -> None:
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    for t in _get_all_tensors(m):
        if uses_external_data(t):
            loc = {e.key: e.value for e in t.external_data}.get("location", "?")
            f = os.path.join(base, loc)
            if not os.path.exists(f):
                raise ParseError(f"{where}: external data file '{loc}' of tensor '{t.name}' not found in {base}")
    try:
        onnx.load_external_data_for_model(m, base)
    except Exception as e:
        raise ParseError(f"{where}: cannot load external data ({type(e).__name__}: {e})") from None


def without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph without its large initializers (declared as inputs instead), its nodes in topological
    order: enough for shape inference and far cheaper to copy than a model with hundreds of MB of weights."""
    m = onnx.ModelProto()
    m.ir_version = model.ir_version
    m.opset_import.extend(model.opset_import)
    g, src = m.graph, model.graph
    g.name = src.name
    g.node.extend(src.node)
    g.input.extend(src.input)
    g.output.extend(src.output)
    declared = {i.name for i in src.input}
    for t in src.initializer:
        if int(np.prod(t.dims)) <= 64:
            g.initializer.append(t)
        elif t.name not in declared:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    sort_graph(g)
    return m


def symbolic_inputs(model: onnx.ModelProto, input_dims: dict | None = None) -> dict:
    """Inputs with dims not fixed by the model nor by ``input_dims``: ``{name: [dim indices]}``."""
    inits = {t.name for t in model.graph.initializer}
    res = {}
    for vi in model.graph.input:
        if vi.name in inits or (input_dims and vi.name in input_dims):
            continue
        dims = [k for k, d in enumerate(vi.type.tensor_type.shape.dim) if not (d.HasField("dim_value") and
                                                                                  d.dim_value >= 0)]
        if dims:
            res[vi.name] = dims
    return res
