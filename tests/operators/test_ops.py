"""Every supported op, one node at a time, against onnxruntime (CPU) on each target, eager and in a
graph (min_partition_size=1 so even one kernel becomes a graph_launch region; 4 runs cover warmup,
capture and replay)."""
import numpy as np
import pytest
from onnx import helper

from util import make_model, ort_run
import mgx_graph

R = np.random.default_rng(42)


def f32(*shape, lo=-2.0, hi=2.0):
    return R.uniform(lo, hi, size=shape).astype(np.float32)


def node(op, ins, outs=("y",), **attrs):
    return helper.make_node(op, list(ins), list(outs), **attrs)


CASES = []


def case(name, nodes, inputs, init=None, opset=18, outs=("y",), tol=(1e-5, 1e-6)):
    CASES.append(pytest.param(nodes, inputs, init or {}, opset, list(outs), tol, id=name))


X = f32(2, 3, 4)
POS = f32(2, 3, 4, lo=0.1, hi=3.0)
for op in ["Neg", "Abs", "Exp", "Sin", "Cos", "Tanh", "Sigmoid", "Relu", "Erf", "Floor", "Ceil", "Sign",
           "Softplus", "Softsign", "HardSwish", "Round", "Atan", "Sinh"]:
    case(op, [node(op, ["x"])], {"x": X}, tol=(2e-5, 2e-6))
for op in ["Sqrt", "Reciprocal", "Log"]:
    case(op, [node(op, ["x"])], {"x": POS})
case("IsNaN", [node("IsNaN", ["x"])], {"x": np.array([1.0, np.nan, -np.inf, 0.0], np.float32)})
case("IsInf", [node("IsInf", ["x"], detect_negative=0)], {"x": np.array([1.0, np.nan, -np.inf, np.inf], np.float32)})
case("Not", [node("Not", ["x"])], {"x": np.array([True, False, True])})
case("LeakyRelu", [node("LeakyRelu", ["x"], alpha=0.2)], {"x": X})
case("Elu", [node("Elu", ["x"], alpha=0.5)], {"x": X})
case("Selu", [node("Selu", ["x"])], {"x": X})
case("HardSigmoid", [node("HardSigmoid", ["x"], alpha=0.3, beta=0.4)], {"x": X})
case("Gelu", [node("Gelu", ["x"])], {"x": X}, opset=20)
case("Gelu_tanh", [node("Gelu", ["x"], approximate="tanh")], {"x": X}, opset=20)
A, B = f32(2, 3, 4), f32(3, 1)
for op in ["Add", "Sub", "Mul", "Div", "Max", "Min"]:
    case(op + "_bcast", [node(op, ["a", "b"])], {"a": A, "b": f32(4)})
    case(op + "_bcast2", [node(op, ["a", "b"])], {"a": f32(2, 3, 1), "b": f32(1, 4)})
for op in ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"]:
    case(op, [node(op, ["a", "b"])], {"a": np.round(A), "b": np.round(f32(4))})
case("And", [node("And", ["a", "b"])], {"a": A > 0, "b": f32(4) > 0})
case("Or", [node("Or", ["a", "b"])], {"a": A > 0, "b": f32(4) > 0})
case("Pow_scalar", [node("Pow", ["a", "b"])], {"a": POS}, {"b": np.array(2.0, np.float32)})
case("Pow", [node("Pow", ["a", "b"])], {"a": POS, "b": f32(4)}, tol=(2e-5, 1e-5))
case("Div_int", [node("Div", ["a", "b"])], {"a": np.array([7, -7, 7, -7], np.int64), "b": np.array([2, 2, -2, -2], np.int64)})
case("Mod", [node("Mod", ["a", "b"])], {"a": np.array([7, -7, 7, -7], np.int64), "b": np.array([3, 3, -3, -3], np.int64)})
case("Mod_fmod", [node("Mod", ["a", "b"], fmod=1)], {"a": f32(5), "b": np.full(5, 0.7, np.float32)})
case("Sum3", [node("Sum", ["a", "b", "c"])], {"a": A, "b": f32(4), "c": f32(3, 1)})
case("Mean2", [node("Mean", ["a", "b"])], {"a": A, "b": f32(4)})
case("Where", [node("Where", ["c", "a", "b"])], {"c": f32(3, 4) > 0, "a": A, "b": f32(4)})
case("Where_int", [node("Where", ["c", "a", "b"])], {"c": f32(3) > 0, "a": np.arange(3), "b": np.zeros(1, np.int64)})
case("Cast_f2i", [node("Cast", ["x"], to=7)], {"x": X * 3})
case("Cast_i2f", [node("Cast", ["x"], to=1)], {"x": np.arange(-3, 5, dtype=np.int64)})
case("Cast_f2h", [node("Cast", ["x"], to=10)], {"x": X}, tol=(1e-3, 1e-3))
case("Cast_b2f", [node("Cast", ["x"], to=1)], {"x": X > 0})
case("Clip", [node("Clip", ["x", "lo", "hi"])], {"x": X}, {"lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32)})
case("Clip_min", [node("Clip", ["x", "lo"])], {"x": X}, {"lo": np.array(-0.5, np.float32)})
case("Clip_opset6", [node("Clip", ["x"], min=-0.3, max=0.2)], {"x": X}, opset=6 + 1 if False else 9)
case("Identity", [node("Identity", ["x"], ["t"]), node("Neg", ["t"])], {"x": X})
case("Reshape", [node("Reshape", ["x", "s"])], {"x": X}, {"s": np.array([0, -1], np.int64)})
case("Reshape_allowzero", [node("Reshape", ["x", "s"], allowzero=0)], {"x": X}, {"s": np.array([4, 0, 2], np.int64)})
case("Transpose", [node("Transpose", ["x"], ["t"], perm=[2, 0, 1]), node("Neg", ["t"])], {"x": X})
case("Transpose_reshape", [node("Transpose", ["x"], ["t"], perm=[0, 2, 1]), node("Reshape", ["t", "s"])],
     {"x": X}, {"s": np.array([2, 12], np.int64)})
case("Squeeze", [node("Squeeze", ["x", "a"], ["t"]), node("Neg", ["t"])], {"x": f32(2, 1, 3)}, {"a": np.array([1], np.int64)})
case("Unsqueeze", [node("Unsqueeze", ["x", "a"], ["t"]), node("Neg", ["t"])], {"x": X}, {"a": np.array([0, -1], np.int64)})
case("Flatten", [node("Flatten", ["x"], ["t"], axis=2), node("Neg", ["t"])], {"x": X})
case("Slice", [node("Slice", ["x", "s", "e", "a", "st"], ["t"]), node("Neg", ["t"])], {"x": f32(6, 5)},
     {"s": np.array([1, -4], np.int64), "e": np.array([100, 5], np.int64), "a": np.array([0, 1], np.int64),
      "st": np.array([2, 1], np.int64)})
case("Slice_neg_step", [node("Slice", ["x", "s", "e", "a", "st"])], {"x": f32(6, 5)},
     {"s": np.array([-1], np.int64), "e": np.array([-100], np.int64), "a": np.array([0], np.int64),
      "st": np.array([-2], np.int64)})
case("Concat", [node("Concat", ["a", "b", "c"], axis=1)], {"a": f32(2, 1, 4), "b": f32(2, 3, 4), "c": f32(2, 2, 4)})
case("Concat_strided", [node("Transpose", ["a"], ["t"], perm=[1, 0]), node("Concat", ["t", "b"], axis=0)],
     {"a": f32(3, 2), "b": f32(1, 3)})
case("Split", [node("Split", ["x", "s"], ["y", "z"], axis=2)], {"x": X}, {"s": np.array([1, 3], np.int64)},
     outs=("y", "z"))
case("Split_equal", [node("Split", ["x"], ["y", "z"], axis=-1, num_outputs=2)], {"x": X}, outs=("y", "z"))
case("Gather0", [node("Gather", ["x", "i"], axis=0)], {"x": f32(5, 3)}, {"i": np.array([[0, 4], [-1, 2]], np.int64)})
case("Gather1", [node("Gather", ["x", "i"], axis=1)], {"x": f32(2, 5, 3)}, {"i": np.array([3, 0, -2], np.int64)})
case("Gather_scalar", [node("Gather", ["x", "i"], axis=0)], {"x": f32(5, 3)}, {"i": np.array(2, np.int64)})
case("Gather_rt", [node("Gather", ["x", "i"], axis=0)], {"x": f32(7, 3), "i": np.array([6, 0, 3], np.int64)})
case("GatherElements", [node("GatherElements", ["x", "i"], axis=1)], {"x": f32(3, 4)},
     {"i": np.array([[0, 3], [1, -1], [2, 2]], np.int64)})
case("GatherND", [node("GatherND", ["x", "i"])], {"x": f32(3, 4, 2)}, {"i": np.array([[0, 1], [2, 3]], np.int64)})
case("ScatterND", [node("ScatterND", ["x", "i", "u"])], {"x": f32(4, 3, 2), "u": f32(2, 3, 2)},
     {"i": np.array([[3], [-4]], np.int64)})
case("ScatterND_rt", [node("ScatterND", ["x", "i", "u"])],
     {"x": f32(5, 4), "i": np.array([[1, 2], [4, 0]], np.int64), "u": f32(2)})
case("ScatterND_add", [node("ScatterND", ["x", "i", "u"], reduction="add")], {"x": f32(4, 3), "u": f32(3, 3)},
     {"i": np.array([[1], [1], [2]], np.int64)})
case("ScatterElements", [node("ScatterElements", ["x", "i", "u"], axis=1)], {"x": f32(3, 4), "u": f32(3, 2)},
     {"i": np.array([[0, 3], [1, 2], [2, 0]], np.int64)})
case("Expand", [node("Expand", ["x", "s"], ["t"]), node("Neg", ["t"])], {"x": f32(3, 1)}, {"s": np.array([2, 3, 4], np.int64)})
case("Expand_contig", [node("Expand", ["x", "s"], ["t"]), node("Reshape", ["t", "r"])], {"x": f32(3, 1)},
     {"s": np.array([2, 3, 4], np.int64), "r": np.array([6, 4], np.int64)})
case("Tile", [node("Tile", ["x", "r"])], {"x": f32(2, 3)}, {"r": np.array([2, 3], np.int64)})
case("Pad", [node("Pad", ["x", "p", "v"])], {"x": f32(2, 3)}, {"p": np.array([1, 0, 2, 1], np.int64), "v": np.array(0.5, np.float32)})
case("Pad_reflect", [node("Pad", ["x", "p"], mode="reflect")], {"x": f32(3, 4)}, {"p": np.array([0, 2, 0, 1], np.int64)})
case("Shape_Range", [node("Shape", ["x"], ["s"]), node("Cast", ["s"], ["y"], to=1)], {"x": X})
case("ConstantOfShape", [node("ConstantOfShape", ["s"], ["c"], value=helper.make_tensor("v", 1, [1], [0.25])),
                         node("Add", ["c", "x"])], {"x": f32(2, 3)}, {"s": np.array([2, 3], np.int64)})
for op in ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceSumSquare",
           "ReduceLogSumExp", "ReduceL1"]:
    case(op, [node(op, ["x", "a"], keepdims=1)], {"x": POS}, {"a": np.array([-1], np.int64)}, tol=(2e-5, 1e-6))
    case(op + "_nokeep", [node(op, ["x", "a"], keepdims=0)], {"x": POS}, {"a": np.array([0, 2], np.int64)}, tol=(2e-5, 1e-6))
case("ReduceSum_all", [node("ReduceSum", ["x"], keepdims=0)], {"x": X})
case("ReduceMean_opset13", [node("ReduceMean", ["x"], axes=[1], keepdims=1)], {"x": X}, opset=13)
case("Softmax", [node("Softmax", ["x"], axis=-1)], {"x": X})
case("Softmax_axis1", [node("Softmax", ["x"], axis=1)], {"x": X})
case("Softmax_opset11", [node("Softmax", ["x"])], {"x": X}, opset=11)
case("LogSoftmax", [node("LogSoftmax", ["x"], axis=-1)], {"x": X})
case("ArgMax", [node("ArgMax", ["x"], axis=1, keepdims=0)], {"x": X})
case("ArgMin_last", [node("ArgMin", ["x"], axis=-1, select_last_index=1)], {"x": np.round(X)})
case("MatMul", [node("MatMul", ["a", "b"])], {"a": f32(3, 4)}, {"b": f32(4, 5)})
case("MatMul_batched", [node("MatMul", ["a", "b"])], {"a": f32(2, 3, 4), "b": f32(2, 4, 5)})
case("MatMul_bcast", [node("MatMul", ["a", "b"])], {"a": f32(2, 1, 3, 4), "b": f32(3, 4, 5)})
case("MatMul_shared_b", [node("MatMul", ["a", "b"])], {"a": f32(2, 3, 4)}, {"b": f32(4, 5)})
case("MatMul_1d", [node("MatMul", ["a", "b"])], {"a": f32(4)}, {"b": f32(4, 5)})
case("MatMul_1d_b", [node("MatMul", ["a", "b"])], {"a": f32(2, 3, 4), "b": f32(4)})
case("MatMul_transposed", [node("Transpose", ["a"], ["t"], perm=[0, 2, 1]), node("MatMul", ["t", "b"])],
     {"a": f32(2, 4, 3), "b": f32(2, 4, 5)})
case("MatMul_transposed_b", [node("Transpose", ["b"], ["t"], perm=[0, 1, 3, 2]), node("MatMul", ["a", "t"])],
     {"a": f32(1, 3, 2, 4), "b": f32(1, 3, 5, 4)})
case("MatMul_sliced", [node("Slice", ["a", "s", "e", "ax"], ["t"]), node("MatMul", ["t", "b"])],
     {"a": f32(3, 8), "b": f32(4, 2)}, {"s": np.array([2], np.int64), "e": np.array([6], np.int64),
                                       "ax": np.array([1], np.int64)})
case("MatMul_f64", [node("MatMul", ["a", "b"])], {"a": R.normal(size=(3, 4)), "b": R.normal(size=(4, 2))},
     tol=(1e-12, 1e-12))
case("MatMul_int", [node("MatMul", ["a", "b"])], {"a": np.arange(6).reshape(2, 3), "b": np.arange(6).reshape(3, 2)})
case("Gemm", [node("Gemm", ["a", "b", "c"], alpha=0.5, beta=2.0, transB=1)], {"a": f32(3, 4)},
     {"b": f32(5, 4), "c": f32(5)})
case("Gemm_transA", [node("Gemm", ["a", "b"], transA=1)], {"a": f32(4, 3), "b": f32(4, 5)})
case("LayerNorm", [node("LayerNormalization", ["x", "s", "b"], axis=-1, epsilon=1e-5)], {"x": X},
     {"s": f32(4), "b": f32(4)}, tol=(1e-4, 1e-5))
case("LayerNorm_axis1", [node("LayerNormalization", ["x", "s"], axis=1)], {"x": X}, {"s": f32(3, 4)}, tol=(1e-4, 1e-5))
case("Dropout", [node("Dropout", ["x"])], {"x": X})
case("Constant", [node("Constant", [], ["c"], value_floats=[1.0, 2.0, 3.0, 4.0]), node("Mul", ["x", "c"])], {"x": X})


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("nodes,inputs,init,opset,outs,tol", CASES)
def test_op_matches_onnxruntime(target, hip_graph, nodes, inputs, init, opset, outs, tol):
    model = make_model(nodes, inputs, outs, init, opset=opset)
    expect = ort_run(model, inputs)
    prog = mgx_graph.compile(model, target=target, hip_graph=hip_graph, min_partition_size=1)
    kernels = [i.meta["kernel"] for m in prog.modules.values() for i in m.instructions if "kernel" in i.meta]
    if hip_graph and kernels and all(k.capturable for k in kernels):
        assert "graph_launch" in prog.print()
    for run in range(4 if hip_graph else 1):
        got = prog.run(inputs)
        assert len(got) == len(expect)
        for g, e in zip(got, expect):
            assert g.shape == e.shape, (run, g.shape, e.shape)
            assert g.dtype == e.dtype, (run, g.dtype, e.dtype)
            if e.dtype.kind in "fc":
                np.testing.assert_allclose(g, e, rtol=tol[0], atol=tol[1], err_msg=f"run {run}")
            else:
                np.testing.assert_array_equal(g, e, err_msg=f"run {run}")
    st = prog.stats()
    assert st["fallbacks"] == 0, st
    prog.release()
