"""The fallback for ONNX-domain ops with no parser of their own: an ``onnx_op`` instruction that the
host evaluates with ``onnx.reference`` (see :mod:`mgx_graph.operators.onnx_ref`).  Output shapes come
from onnx shape inference on the one node, else from evaluating the node once at parse time on the
values this program is specialized for.
"""
from __future__ import annotations

import numpy as np
import onnx

from ..errors import ShapeError, UnsupportedOpError
from ..ir.fold import fold_instruction
from ..ir.shape import Shape, onnx_dtype
from ..operators import make_op
from ..operators.dynamic import NeedsValue
from .op_parser import fallback


@fallback
def parse_generic(p, m, node, ins):
    """Any other ONNX node: evaluated on the host by onnx.reference (see operators/onnx_ref.py)."""
    from onnx.defs import has as _has_schema

    from ..operators.onnx_ref import decode_shapes, encode_shapes, infer_outputs

    domain = node.domain or ""
    if not _has_schema(node.op_type, domain):
        raise UnsupportedOpError(p.node_name, node.op_type, domain, p.opsets.get(domain, p.opset))
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        raise UnsupportedOpError(p.node_name, node.op_type, domain, p.opset, "subgraph attributes")
    present = [(n, i) for n, i in zip(node.input, ins) if n]
    if any(i is None or isinstance(i.shape, tuple) for _, i in present):
        raise UnsupportedOpError(p.node_name, node.op_type, domain, p.opset, "non-tensor inputs")
    in_shapes = [i.shape if (n and i is not None) else None for n, i in zip(node.input, ins)]
    consts = {n: i.op.value for n, i in present if i.op.name == "@literal"}
    inferred = infer_outputs(node, in_shapes, consts, p.opsets)
    outs = [o for o in node.output if o]
    key = f"opshape:{p.node_name}"
    if inferred is not None and len(inferred) == len(outs) and all(o is not None and o[1] is not None
                                                                   for o in inferred):
        shapes = [(dt, lens) for dt, lens in inferred]
        key = ""
    elif key in p.known:
        dts = [int(c) for c in np.asarray(p.known[key + ":dtypes"]).reshape(-1)]
        shapes = [(onnx_dtype(d, p.node_name), lens) for d, lens in zip(dts, decode_shapes(p.known[key]))]
    else:
        def evaluate(values, node=node, opsets=dict(p.opsets)):
            from onnx.reference import ReferenceEvaluator

            from ..operators.onnx_ref import one_node_model
            from ..ir.shape import NUMPY_TO_ONNX

            shp = [Shape(np.asarray(v).dtype.name, np.shape(v)) for v in values]
            names = [n for n in node.input if n]
            res = ReferenceEvaluator(one_node_model(node, shp, {}, opsets)).run(None, dict(zip(names, values)))
            res = [np.asarray(r) for r in res]
            return {key: encode_shapes([r.shape for r in res]),
                    key + ":dtypes": np.asarray([NUMPY_TO_ONNX[r.dtype.name] for r in res], np.int64)}

        nv = NeedsValue(p.node_name, "opshape", p.node_name, inputs=[i for _, i in present], evaluate=evaluate)
        nv.program = p.program
        raise nv
    op = make_op("onnx_op", node=node, shapes=shapes, opsets=p.opsets, key=key)
    try:
        ins_if = fold_instruction(m, m.add_instruction(op, [i for _, i in present]))
    except ShapeError as e:
        raise ShapeError(f"node '{p.node_name}' ({node.op_type}): {e}") from None
    if len(outs) == 1:
        vals = [ins_if]
    else:
        vals = [p.add(m, "get_tuple_elem", [ins_if], index=k) for k in range(len(outs))]
    it = iter(vals)
    return [next(it) if o else None for o in node.output]
