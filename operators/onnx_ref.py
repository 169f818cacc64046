"""Host kernel for the long tail of ONNX ops: one node evaluated with ``onnx.reference``.

``onnx_op`` carries a NodeProto.  Its output shapes come from onnx shape inference on a one-node
model with the instruction's input shapes (constant inputs included, so shape-determining values are
known); when they depend on data, the frontend specializes on the shapes a reference run produces and
the kernel re-checks them on every run.  The kernel is ``onnx.reference.ReferenceEvaluator`` over that
one-node model (libraries before own code), so it runs on the host: the gpu target wraps it in
``copy_from_gpu`` / ``copy_to_gpu`` (host fallback).  ``onnx.reference`` has known bugs (research
notes): BatchNormalization with ``momentum`` in opset 9-13, GlobalMaxPool on 3-D input and Softmax
before opset 13 are implemented by mgx_graph itself and never reach this op.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import ExecutionError, ShapeError
from ..ir.shape import NUMPY_TO_ONNX, Shape, onnx_dtype
from .base import Operation, register_op
from .dynamic import SpecializationMiss


def one_node_model(node, in_shapes, consts, opsets, ir_version=8):
    """A model with ``node`` alone; inputs typed from ``in_shapes`` (None for omitted inputs)."""
    inputs, inits = [], []
    for name, s in zip(node.input, in_shapes):
        if not name or s is None:
            continue
        if name in consts:
            inits.append(numpy_helper.from_array(np.asarray(consts[name]), name))
        else:
            inputs.append(helper.make_tensor_value_info(name, NUMPY_TO_ONNX[s.dtype], list(s.lens)))
    outs = [helper.make_tensor_value_info(o, 0, None) for o in node.output if o]
    g = helper.make_graph([node], "one", inputs, outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    m.ir_version = ir_version
    return m


def infer_outputs(node, in_shapes, consts, opsets):
    """[(dtype, lens or None)] per output from onnx shape inference (lens None: not static)."""
    m = one_node_model(node, in_shapes, consts, opsets)
    try:
        inf = onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    except Exception:
        return None
    res = []
    for o in inf.graph.output:
        tt = o.type.tensor_type
        if not o.type.HasField("tensor_type") or tt.elem_type == 0:
            res.append(None)
            continue
        try:
            dt = onnx_dtype(tt.elem_type, o.name)
        except ShapeError:
            return None
        if not tt.HasField("shape") or not all(d.HasField("dim_value") for d in tt.shape.dim):
            res.append((dt, None))
        else:
            res.append((dt, [d.dim_value for d in tt.shape.dim]))
    return res


@register_op
class OnnxOp(Operation):
    """An ONNX node run by onnx.reference on the host (see the module docstring)."""

    name = "onnx_op"
    foldable = True

    def __init__(self, node=None, shapes=(), opsets=None, key=""):
        super().__init__(op_type=node.op_type if node is not None else "?", _node=node,
                         _shapes=[Shape(dt, lens) for dt, lens in shapes], _opsets=dict(opsets or {}), _key=key)
        self._sess = None

    @classmethod
    def from_attrs(cls, attrs: dict) -> "OnnxOp":
        """The op whose ``attrs`` are ``attrs`` (as a saved program stores them: ``_node``, ``_shapes``
        as Shapes, ``_opsets``, ``_key``)."""
        shapes = [(s.dtype, s.lens) for s in attrs["_shapes"]]
        return cls(attrs["_node"], shapes, attrs["_opsets"], attrs["_key"])

    def compute_shape(self, inputs, mods=()):
        shapes = self.attrs["_shapes"]
        return shapes[0] if len(shapes) == 1 else tuple(shapes)

    def _session(self, args):
        if self._sess is None:
            from onnx.reference import ReferenceEvaluator

            node = self.attrs["_node"]
            shapes = [Shape(np.asarray(a).dtype.name, np.shape(a)) if a is not None else None for a in args]
            self._sess = ReferenceEvaluator(one_node_model(node, shapes, {}, self.attrs["_opsets"]))
        return self._sess

    def compute(self, ctx, out, args, ws):
        node = self.attrs["_node"]
        host = [np.asarray(a) for a in args]
        names = [n for n in node.input if n]
        feeds = dict(zip(names, host))
        _check_ignored_inputs(node, feeds)
        res = self._session(host).run(None, feeds)
        outs = out if isinstance(out, tuple) else (out,)
        got = [np.asarray(r) for r in res]
        want = [tuple(s.lens) for s in self.attrs["_shapes"]]
        shapes = [g.shape for g in got]
        if [tuple(s) for s in shapes] != want:
            if self.attrs["_key"]:
                raise SpecializationMiss(self.attrs["_key"], encode_shapes(shapes), encode_shapes(want))
            raise ShapeError(f"node '{node.name or node.op_type}' ({node.op_type}): reference output shapes "
                             f"{shapes} != compiled {want}")
        for o, g in zip(outs, got):
            o[...] = g.astype(o.dtype, copy=False)

    def attr_string(self):
        return f"[op_type={self.attrs['op_type']}]"


def _check_ignored_inputs(node, feeds) -> None:
    """ExecutionError (naming the node, the expected and the given values) for the values of an input
    that onnx.reference ignores but that change the result: an LSTM's ``sequence_lens`` other than the
    sequence length everywhere (the frontend rejects constant ones; this checks fed ones per run)."""
    if node.op_type != "LSTM" or len(node.input) < 5 or not node.input[4]:
        return
    layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
    T = feeds[node.input[0]].shape[1 if layout else 0]
    lens = np.asarray(feeds[node.input[4]]).reshape(-1)
    if np.any(lens != T):
        raise ExecutionError(f"node '{node.name or node.op_type}' (LSTM): sequence_lens {lens.tolist()}, expected "
                             f"{T} (the sequence length) in every row: shorter sequences are not supported")


def encode_shapes(shapes) -> np.ndarray:
    """Shapes of several outputs as one int64 vector: ``[n, rank0, d.., rank1, d.., ...]``."""
    flat = [len(shapes)]
    for s in shapes:
        flat.append(len(s))
        flat.extend(int(d) for d in s)
    return np.asarray(flat, np.int64)


def decode_shapes(v) -> list:
    v = [int(x) for x in np.asarray(v).reshape(-1)]
    n, pos, res = v[0], 1, []
    for _ in range(n):
        r = v[pos]
        res.append(v[pos + 1:pos + 1 + r])
        pos += 1 + r
    return res
