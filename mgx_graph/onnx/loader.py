"""Reading an ONNX model: the protobuf, its external data, and the facts about its inputs that do not
need a parse (which dims are symbolic), plus the light copy onnx shape inference runs on."""
from __future__ import annotations

import os
import zipfile

import numpy as np
import onnx

from ..errors import ParseError
from .external_data import external_tensors, load_external, location_of
from .topology import sort_graph


def load_model(path_or_model, external_data_dir: str | None = None) -> onnx.ModelProto:
    """Load an ONNX model from a path, bytes or ModelProto.

    External tensor data is read from ``external_data_dir`` (default: the model file's folder), only
    from regular files inside that folder, within their sizes (:mod:`.external_data`).  An in-memory
    model (bytes, ModelProto) has no folder: its external tensors need ``external_data_dir``.  A
    ModelProto without external tensors is returned as is; one with them is copied first (the
    caller's message is not changed).
    Raises ParseError: no such file, not a valid ONNX protobuf, or external data missing, outside the
    folder, not a regular file, out of its file's bounds, or of another size than the tensor needs.
    """
    if isinstance(path_or_model, onnx.ModelProto):
        if not external_tensors(path_or_model):
            return path_or_model
        m = onnx.ModelProto()
        m.CopyFrom(path_or_model)
        _in_memory_external(m, external_data_dir, "<ModelProto>")
        return m
    if isinstance(path_or_model, (bytes, bytearray, memoryview)):
        try:
            m = onnx.load_from_string(bytes(path_or_model))
        except Exception as e:  # protobuf DecodeError
            raise ParseError(f"<bytes>: not a valid ONNX protobuf ({type(e).__name__}: {e})") from None
        _in_memory_external(m, external_data_dir, "<bytes>")
        return m
    path = os.fspath(path_or_model)
    if not os.path.exists(path):
        raise ParseError(f"{path}: no such file")
    try:
        m = onnx.load(path, load_external_data=False)
    except Exception as e:
        hint = "; a saved program (.mxr) is opened with mgx_graph.load" if path.endswith(".mxr") or \
            (os.path.isfile(path) and zipfile.is_zipfile(path)) else ""
        raise ParseError(f"{path}: not a valid ONNX protobuf ({type(e).__name__}: {e}){hint}") from None
    load_external(m, os.fspath(external_data_dir) if external_data_dir else os.path.dirname(os.path.abspath(path)),
                  path)
    return m


def _in_memory_external(m: onnx.ModelProto, external_data_dir, where: str) -> None:
    """External data of a model with no folder: from ``external_data_dir`` only, never the current directory."""
    if external_data_dir:
        load_external(m, os.fspath(external_data_dir), where)
        return
    ext = external_tensors(m)
    if ext:
        raise ParseError(f"{where}: tensor '{ext[0].name}' keeps its data in an external file "
                         f"('{location_of(ext[0])[:200]}') and an in-memory model has no folder: pass "
                         "external_data_dir (the folder that holds the file)")


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
