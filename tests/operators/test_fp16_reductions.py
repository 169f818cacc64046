"""float16 reductions accumulate in float32 (as the gpu kernels do): a mean or sum over many values whose
running total passes float16's 65504 still comes out right, against onnxruntime CPU running the same graph
in float32 on the same values."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import mgx_graph
from util import ort_run


def _model(op, dtype, shape, **attrs):
    node = helper.make_node(op, ["x"] + (["axes"] if op in ("ReduceSum",) else []), ["y"], **attrs)
    inits = [helper.make_tensor("axes", TensorProto.INT64, [2], [2, 3])] if op == "ReduceSum" else []
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", dtype, shape)],
                          [helper.make_tensor_value_info("y", dtype, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("op,attrs", [("GlobalAveragePool", {}), ("ReduceMean", {"axes": [2, 3]}),
                                      ("ReduceSum", {})], ids=["globalaveragepool", "reducemean", "reducesum"])
def test_float16_reduction_of_many_values(op, attrs, target):
    x = np.random.default_rng(0).uniform(10, 16, size=(1, 3, 80, 80)).astype(np.float16)  # sums near 10^5
    want = ort_run(_model(op, TensorProto.FLOAT, list(x.shape), **attrs), {"x": x.astype(np.float32)})[0]
    got = mgx_graph.compile(_model(op, TensorProto.FLOAT16, list(x.shape), **attrs), target=target).run({"x": x})[0]
    got = np.asarray(got, np.float32)
    if op == "ReduceSum":  # a sum past float16's range is inf in float16, as onnxruntime gives
        assert np.isinf(got).all() and (want > 65504).all()
        return
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=2e-3)
