"""A reduction over every element (ReduceMin / ReduceMax / ReduceSum / ReduceMean / ReduceProd with all
axes, as DynamicQuantizeLinear reduces its input): against onnxruntime CPU (with a NaN in the input:
numpy) on every target, and on gpu
captured into a graph (one block of our own kernel; CuPy's two-pass reduction allocates a temporary,
which a capture refuses)."""
import numpy as np
import onnx
import pytest

import mgx_graph
from mgx_graph.operators.gpu import FULL_REDUCE_MAX, full_reduction_source

from util import one_node_model, ort_run

OPS = ["ReduceMin", "ReduceMax", "ReduceSum", "ReduceMean", "ReduceProd"]


def _case(op, dtype, shape, nan=False, keepdims=0):
    rng = np.random.default_rng(len(op) + len(shape))
    x = rng.uniform(0.5, 1.5, size=shape).astype(dtype)
    if nan:
        x.reshape(-1)[x.size // 3] = np.nan
    out = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16,
           "int32": onnx.TensorProto.INT32}[dtype]
    if dtype == "int32":
        x = rng.integers(-50, 50, size=shape).astype(np.int32)
    model = one_node_model(op, ["x"], {"x": x}, {}, out, 18, keepdims=keepdims)
    # two more nodes after the reduction (min_partition_size=1 below: the program is one graph region)
    y = model.graph.output[0].name
    model.graph.node[0].output[0] = "r"
    model.graph.node.extend([onnx.helper.make_node("Neg", ["r"], ["n"]), onnx.helper.make_node("Neg", ["n"], [y])])
    return model, {"x": x}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype, shape, nan", [("float32", (1, 64, 160), False), ("float32", (3, 5, 7), True),
                                               ("float16", (2, 300), False), ("int32", (40, 30), False)])
def test_full_reduction_matches_onnxruntime(target, op, dtype, shape, nan, tmp_path):
    if op == "ReduceProd" and dtype != "int32":
        shape = (3, 5, 7)  # a product of thousands of values leaves the float range
    model, feeds = _case(op, dtype, shape, nan)
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    # with a NaN: numpy's reductions (NaN propagates, as on ref; onnxruntime's CPU min / max skip it)
    want = getattr(np, {"ReduceMin": "min", "ReduceMax": "max", "ReduceSum": "sum", "ReduceMean": "mean",
                        "ReduceProd": "prod"}[op])(feeds["x"]) if nan else ort_run(model, feeds)[0]
    prog = mgx_graph.compile(path, target=target, hip_graph=True, min_partition_size=1)
    for _ in range(4):  # warmups, capture, replays
        got = prog.run(feeds)[0]
        rtol = 2e-3 if dtype == "float16" else 1e-5
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=rtol, atol=1e-6)
    st = prog.stats()
    if target == "gpu":
        assert st["fallbacks"] == 0 and st["captures"] == 1 and st["replays"] >= 1
    prog.release()


def test_the_kernel_source_names_its_type_and_combination():
    src = full_reduction_source("max", "float16")
    assert "typedef __half T;" in src and "typedef float A;" in src and "a != a" in src
    assert "r / (A)n" in full_reduction_source("mean", "float32")
    assert FULL_REDUCE_MAX >= 1 << 20
