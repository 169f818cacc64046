"""The tiny seed models the fuzz tests mutate: a few nodes each, every one compiled and run in milliseconds."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T, helper as h, numpy_helper


def _init(name, a):
    return numpy_helper.from_array(np.asarray(a), name)


def _model(nodes, inputs, outputs, inits, opset=17):
    """``inputs`` / ``outputs``: ``[(name, elem type, dims)]``; dims None leaves the shape out."""
    g = h.make_graph(nodes, "seed", [h.make_tensor_value_info(*i) for i in inputs],
                     [h.make_tensor_value_info(*o) for o in outputs], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def matmul_add():
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 7 - 0.5
    return _model([h.make_node("MatMul", ["x", "w"], ["t"]), h.make_node("Add", ["t", "b"], ["y"])],
                  [("x", T.FLOAT, [2, 3])], [("y", T.FLOAT, [2, 4])],
                  [_init("w", w), _init("b", np.linspace(-1, 1, 4, dtype=np.float32))])


def conv_relu():
    w = (np.arange(54, dtype=np.float32).reshape(3, 2, 3, 3) % 5 - 2) / 4
    conv = h.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1],
                       dilations=[1, 1], group=1)
    pool = h.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    return _model([conv, h.make_node("Relu", ["c"], ["r"]), pool], [("x", T.FLOAT, [1, 2, 5, 5])],
                  [("y", T.FLOAT, [1, 3, 2, 2])], [_init("w", w), _init("b", np.array([0.1, -0.2, 0.3], np.float32))])


def reshape_transpose():
    nodes = [h.make_node("Reshape", ["x", "s"], ["r"]), h.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 1]),
             h.make_node("Flatten", ["t"], ["y"], axis=1)]
    return _model(nodes, [("x", T.FLOAT, [2, 3, 4])], [("y", T.FLOAT, [2, 12])],
                  [_init("s", np.array([4, 3, 2], np.int64))])


def gather_softmax():
    data = np.arange(20, dtype=np.float32).reshape(5, 4) / 10
    nodes = [h.make_node("Gather", ["d", "i"], ["g"], axis=0), h.make_node("Softmax", ["g"], ["y"], axis=-1)]
    return _model(nodes, [("i", T.INT64, [3])], [("y", T.FLOAT, [3, 4])], [_init("d", data)])


def concat_slice():
    nodes = [h.make_node("Concat", ["x", "z"], ["c"], axis=1),
             h.make_node("Slice", ["c", "st", "en", "ax", "sp"], ["y"])]
    inits = [_init("z", np.ones((4, 2), np.float32)), _init("st", np.array([1, 0], np.int64)),
             _init("en", np.array([4, 6], np.int64)), _init("ax", np.array([0, 1], np.int64)),
             _init("sp", np.array([1, 2], np.int64))]
    return _model(nodes, [("x", T.FLOAT, [4, 3])], [("y", T.FLOAT, [3, 3])], inits)


def pad_reduce():
    nodes = [h.make_node("Pad", ["x", "p", "v"], ["q"], mode="constant"),
             h.make_node("ReduceSum", ["q", "a"], ["y"], keepdims=1)]
    inits = [_init("p", np.array([0, 1, 0, 0, 1, 0], np.int64)), _init("v", np.array(0.5, np.float32)),
             _init("a", np.array([1], np.int64))]
    return _model(nodes, [("x", T.FLOAT, [2, 3, 4])], [("y", T.FLOAT, [2, 1, 4])], inits)


def split_where():
    nodes = [h.make_node("Split", ["x", "n"], ["a", "b"], axis=1),
             h.make_node("Greater", ["a", "b"], ["m"]), h.make_node("Where", ["m", "a", "b"], ["w"]),
             h.make_node("Cast", ["w"], ["y"], to=T.INT32), h.make_node("Unsqueeze", ["w", "u"], ["y2"])]
    inits = [_init("n", np.array([2, 2], np.int64)), _init("u", np.array([0], np.int64))]
    return _model(nodes, [("x", T.FLOAT, [3, 4])], [("y", T.INT32, [3, 2]), ("y2", T.FLOAT, [1, 3, 2])], inits)


def dynamic_batch():
    """A symbolic batch dim: compiled as a dynamic-shape program (saved with its ONNX model)."""
    nodes = [h.make_node("MatMul", ["x", "w"], ["t"]), h.make_node("Sigmoid", ["t"], ["y"])]
    return _model(nodes, [("x", T.FLOAT, ["N", 3])], [("y", T.FLOAT, ["N", 2])],
                  [_init("w", np.array([[1, -1], [0.5, 2], [-3, 0.25]], np.float32))])


SEEDS = {f.__name__: f for f in (matmul_add, conv_relu, reshape_transpose, gather_softmax, concat_slice, pad_reduce,
                                 split_where, dynamic_batch)}
STATIC_SEEDS = [k for k in SEEDS if k != "dynamic_batch"]


def seed(name: str) -> onnx.ModelProto:
    m = SEEDS[name]()
    onnx.checker.check_model(m, full_check=True)
    return m


def feed_value(dtype: np.dtype, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    """Random values of ``dtype``: normal floats, small ints (index-like: some out of range), random bools."""
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        lo = 0 if dtype.kind == "u" else -2
        return rng.integers(lo, 6, size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    return None


MAX_FEED_ELEMENTS = 1 << 16


def make_feeds(model: onnx.ModelProto, rng: np.random.Generator, symbolic: int = 2) -> dict | None:
    """Random inputs for the graph inputs of ``model`` (not the initializers) as declared; symbolic dims
    take ``symbolic``.  None when no input can be made: an unknown or non-numeric type, a negative dim,
    or more than ``MAX_FEED_ELEMENTS`` elements."""
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        if vi.type.WhichOneof("value") != "tensor_type":
            return None
        tt = vi.type.tensor_type
        try:
            dtype = np.dtype(h.tensor_dtype_to_np_dtype(tt.elem_type))
        except (KeyError, TypeError, ValueError):
            return None
        if not tt.HasField("shape"):
            return None
        dims = [d.dim_value if d.HasField("dim_value") else symbolic for d in tt.shape.dim]
        if any(d < 0 for d in dims) or int(np.prod(dims, dtype=object)) > MAX_FEED_ELEMENTS:
            return None
        v = feed_value(dtype, tuple(dims), rng)
        if v is None:
            return None
        feeds[vi.name] = v
    return feeds
