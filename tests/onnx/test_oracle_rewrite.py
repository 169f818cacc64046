"""The onnxruntime oracles of the tests against numpy's int64 integer GEMMs: ``util.ort_run`` (int8
operands given as uint8 + 128, ``util.uint8_operands``) and ``models.oracle.ort_cpu_options``, at the
extremes where onnxruntime's uint8 x int8 GEMM adds pairs of products in saturating int16 on x64 CPUs
without VNNI (255 * -128 twice is -65280).  No target runs here: these check the oracles themselves."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from util import make_model, ort_run, uint8_operands

A = np.full((2, 16), 255, np.uint8)  # the worst case of the saturating pair sums
B = np.full((16, 2), -128, np.int8)
I32 = {"y": TensorProto.INT32, "y2": TensorProto.INT32}


def exact(a, b, za=0, zb=0):
    return (a.astype(np.int64) - np.asarray(za, np.int64)) @ (b.astype(np.int64) - np.asarray(zb, np.int64))


def test_an_int8_operand_computed_in_the_graph_is_shifted():
    """b is made by a node (a Cast here; a QuantizeLinear with an int8 zero point in QDQ models)."""
    nodes = [helper.make_node("Cast", ["bi"], ["b8"], to=TensorProto.INT8),
             helper.make_node("MatMulInteger", ["a", "b8"], ["y"])]
    m = make_model(nodes, {"a": A}, ["y"], {"bi": B.astype(np.int32)}, opset=10, output_types=I32)
    np.testing.assert_array_equal(ort_run(m, {"a": A})[0], exact(A, B))


def test_a_computed_int8_zero_point_is_shifted():
    nodes = [helper.make_node("Cast", ["zi"], ["z8"], to=TensorProto.INT8),
             helper.make_node("MatMulInteger", ["a", "b", "", "z8"], ["y"])]
    m = make_model(nodes, {"a": A}, ["y"], {"b": B, "zi": np.array(3, np.int32)}, opset=10, output_types=I32)
    np.testing.assert_array_equal(ort_run(m, {"a": A})[0], exact(A, B, zb=3))


def test_a_scalar_zero_point_fed_at_run_time():
    feeds = {"a": A, "bz": np.array(5, np.int8)}
    m = make_model([helper.make_node("MatMulInteger", ["a", "b", "", "bz"], ["y"])], feeds, ["y"], {"b": B},
                   opset=10, output_types=I32)
    np.testing.assert_array_equal(ort_run(m, feeds)[0], exact(A, B, zb=5))


def test_a_shared_operand_without_zero_point_adds_one_initializer():
    a2 = np.full((2, 16), 200, np.uint8)
    nodes = [helper.make_node("MatMulInteger", ["a", "b"], ["y"]), helper.make_node("MatMulInteger", ["a2", "b"], ["y2"])]
    m = make_model(nodes, {"a": A, "a2": a2}, ["y", "y2"], {"b": B}, opset=10, output_types=I32)
    rewritten, _ = uint8_operands(m, {"a": A, "a2": a2})
    names = [t.name for t in rewritten.graph.initializer]
    assert len(names) == len(set(names)), names
    got = ort_run(m, {"a": A, "a2": a2})
    np.testing.assert_array_equal(got[0], exact(A, B))
    np.testing.assert_array_equal(got[1], exact(a2, B))


def test_int8_times_int8_is_left_as_it_is():
    """An int8 x int8 node whose first operand is computed: nothing to shift (it is exact)."""
    c = np.full((2, 16), -128, np.int32)
    nodes = [helper.make_node("Cast", ["c"], ["c8"], to=TensorProto.INT8),
             helper.make_node("MatMulInteger", ["c8", "b"], ["y"]), helper.make_node("MatMulInteger", ["a", "b"], ["y2"])]
    m = make_model(nodes, {"c": c, "a": A}, ["y", "y2"], {"b": B}, opset=10, output_types=I32)
    rewritten, _ = uint8_operands(m, {"c": c, "a": A})
    assert list(rewritten.graph.node[1].input) == ["c8", "b"]
    got = ort_run(m, {"c": c, "a": A})
    np.testing.assert_array_equal(got[0], exact(c, B))
    np.testing.assert_array_equal(got[1], exact(A, B))


def test_per_channel_zero_points_and_conv_padding():
    bz = np.array([-7, 100], np.int8)
    m = make_model([helper.make_node("MatMulInteger", ["a", "b", "", "bz"], ["y"])], {"a": A}, ["y"],
                   {"b": B, "bz": bz}, opset=10, output_types=I32)
    np.testing.assert_array_equal(ort_run(m, {"a": A})[0], exact(A, B, zb=bz))
    x = np.full((1, 2, 4, 4), -128, np.int8)  # int8 input, padded: the padding is x's zero point
    w = np.full((3, 2, 3, 3), 255, np.uint8)
    m = make_model([helper.make_node("ConvInteger", ["x", "w", "xz"], ["y"], pads=[1, 1, 1, 1])], {"x": x}, ["y"],
                   {"w": w, "xz": np.array(-100, np.int8)}, opset=10, output_types=I32)
    xs = np.pad(x.astype(np.int64) + 100, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((1, 3, 4, 4), np.int64)
    for i in range(4):
        for j in range(4):
            want[0, :, i, j] = np.einsum("chw,ochw->o", xs[0, :, i:i + 3, j:j + 3], w.astype(np.int64))
    np.testing.assert_array_equal(ort_run(m, {"x": x})[0], want)


def _session(model, so):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def test_ort_cpu_options_is_exact_for_int8_weights():
    from mgx_graph.models.oracle import ort_cpu_options

    m = make_model([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], {"a": A}, ["y"], {"b": B}, opset=10,
                   output_types=I32)
    np.testing.assert_array_equal(_session(m, ort_cpu_options()).run(None, {"a": A})[0], exact(A, B))


def test_ort_cpu_options_refuses_options_that_make_it_a_no_op():
    """onnxruntime applies session.x64quantprecision as a graph transformer of level ORT_ENABLE_EXTENDED
    (int8 initializers rewritten to uint8): below that level it changes nothing."""
    import onnxruntime as ort

    from mgx_graph.models.oracle import ort_cpu_options

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    with pytest.raises(ValueError, match="ORT_ENABLE_EXTENDED"):
        ort_cpu_options(so)
