"""Native QuantizeLinear / DequantizeLinear (per tensor, per axis, blocked; 8- and 16-bit types; NaN, inf
and ties) and QLinearMatMul / QLinearConv against onnxruntime CPU on each target, eager and in a graph;
numpy where onnxruntime has no kernel; typed errors for bad parameters and unsupported types."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import mgx_graph
from mgx_graph.errors import ParseError, UnsupportedOpError
from native_util import run_native
from util import one_node_model

R = np.random.default_rng(5)
TYPES = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8, "uint16": TensorProto.UINT16,
         "int16": TensorProto.INT16, "int32": TensorProto.INT32, "float32": TensorProto.FLOAT,
         "float16": TensorProto.FLOAT16}


def model(op, feeds, inits, out_type, opset, inputs=None, **attrs):
    """One ``op`` node over ``feeds`` (graph inputs) and ``inits`` (initializers), input order ``inputs``."""
    return one_node_model(op, inputs or (list(feeds) + list(inits)), feeds, inits, out_type, opset, **attrs)


def qrange(dtype):
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def zeros(dtype, shape, lo=-20, hi=20):
    a, b = qrange(dtype)
    return R.integers(max(a, lo), min(b, hi) + 1, shape).astype(dtype)


def scales(shape, dtype=np.float32):
    return (R.random(shape) * 0.9 + 0.1).astype(dtype)


X = (R.standard_normal((2, 6, 5)) * 40).astype(np.float32)


@pytest.mark.parametrize("dtype", ["uint8", "int8", "uint16", "int16"])
@pytest.mark.parametrize("case", ["tensor", "axis1", "axis_last", "axis0", "block2_axis1", "block4_axis1",
                                  "block3_axis2", "block1_axis0"])
def test_quantize(target, case, dtype):
    opset, attrs, shape = 21, {}, ()
    if case.startswith("axis"):
        axis = {"axis1": 1, "axis_last": -1, "axis0": 0}[case]
        attrs["axis"] = axis
        shape = (X.shape[axis],)
    elif case.startswith("block"):
        b, axis = int(case[5]), int(case[-1])
        attrs.update(axis=axis, block_size=b)
        shape = tuple(-(-d // b) if i == axis else d for i, d in enumerate(X.shape))
    m = model("QuantizeLinear", {"x": X}, {"s": scales(shape), "z": zeros(dtype, shape)}, TYPES[dtype], opset, **attrs)
    run_native(m, {"x": X}, target, False, ["quantize_linear"])


@pytest.mark.parametrize("dtype", ["uint8", "int8", "uint16", "int16"])
def test_quantize_special_values(target, dtype):
    """Ties round to even, NaN goes to the type's lowest value, +-inf and overflow saturate."""
    x = np.array([np.nan, np.inf, -np.inf, 2.5, 3.5, -2.5, -3.5, 1e10, -1e10, 0.5, 1.5, -0.5, 1e5, -1e5], np.float32)
    m = model("QuantizeLinear", {"x": x}, {"s": np.float32(1.0), "z": np.array(3, dtype)}, TYPES[dtype], 21)
    prog = run_native(m, {"x": x}, target, False, ["quantize_linear"])
    got = prog.run({"x": x})[0]
    lo, hi = qrange(dtype)
    assert got[0] == lo and got[1] == hi and got[2] == lo
    assert got[3:7].tolist() == [max(lo, min(hi, v)) for v in (5, 7, 1, -1)]


@pytest.mark.parametrize("opset", [10, 13, 19])
def test_quantize_older_opsets_and_defaults(target, opset):
    """No zero point: uint8; opset 10 has no axis attribute (per tensor only)."""
    m = model("QuantizeLinear", {"x": X}, {"s": np.float32(0.35)}, TensorProto.UINT8, opset)
    run_native(m, {"x": X}, target, False, ["quantize_linear"])


def test_quantize_output_dtype_attribute(target):
    m = model("QuantizeLinear", {"x": X}, {"s": scales((2, 2, 5))}, TensorProto.INT16, 21, axis=1, block_size=3,
              output_dtype=TensorProto.INT16)
    run_native(m, {"x": X}, target, False, ["quantize_linear"])


def test_quantize_float16(target):
    x = X.astype(np.float16)
    m = model("QuantizeLinear", {"x": x}, {"s": scales((6,), np.float16), "z": zeros("int8", (6,))},
              TensorProto.INT8, 19)
    run_native(m, {"x": x}, target, False, ["quantize_linear"])


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_quantize_run_time_scale(target, hip_graph):
    """Scale and zero point fed at run time (not folded), per axis."""
    feeds = {"x": X, "s": scales((6,)), "z": zeros("uint8", (6,), 0, 40)}
    m = model("QuantizeLinear", feeds, {}, TensorProto.UINT8, 13)
    run_native(m, feeds, target, hip_graph, ["quantize_linear"])


def test_quantize_int32_input_against_numpy(target):
    """int32 x and scale (onnxruntime has no kernel for them): numpy's rint(x / s) + zp, saturated."""
    x = R.integers(-2000, 2000, (3, 4)).astype(np.int32)
    m = model("QuantizeLinear", {"x": x}, {"s": np.int32(7), "z": np.int8(-3)}, TensorProto.INT8, 19)
    want = np.clip(np.rint(x / 7.0) - 3, -128, 127).astype(np.int8)
    run_native(m, {"x": x}, target, False, ["quantize_linear"], expect=[want])


def test_quantize_precision_float16_against_numpy(target):
    """opset 23 ``precision`` FLOAT16: the division runs in float16."""
    x = X.astype(np.float16)
    m = model("QuantizeLinear", {"x": x}, {"s": np.float16(0.37), "z": np.uint8(9)}, TensorProto.UINT8, 23,
              precision=TensorProto.FLOAT16)
    want = np.clip(np.rint(x / np.float16(0.37)).astype(np.float32) + 9, 0, 255).astype(np.uint8)
    run_native(m, {"x": x}, target, False, ["quantize_linear"], expect=[want])


@pytest.mark.parametrize("dtype", ["uint8", "int8", "uint16", "int16", "int32"])
@pytest.mark.parametrize("case", ["tensor", "axis1", "axis_last", "block2_axis1", "block3_axis2"])
def test_dequantize(target, case, dtype):
    lo, hi = qrange(dtype) if dtype != "int32" else (-2 ** 30, 2 ** 30)
    q = R.integers(lo, hi, X.shape, dtype=np.int64).astype(dtype)
    attrs, shape = {}, ()
    if case.startswith("axis"):
        axis = {"axis1": 1, "axis_last": -1}[case]
        attrs["axis"] = axis
        shape = (X.shape[axis],)
    elif case.startswith("block"):
        b, axis = int(case[5]), int(case[-1])
        attrs.update(axis=axis, block_size=b)
        shape = tuple(-(-d // b) if i == axis else d for i, d in enumerate(X.shape))
    inits = {"s": scales(shape)}
    if dtype != "int32":  # an int32 x takes no zero point (onnxruntime)
        inits["z"] = zeros(dtype, shape)
    m = model("DequantizeLinear", {"x": q}, inits, TensorProto.FLOAT, 21, **attrs)
    run_native(m, {"x": q}, target, False, ["dequantize_linear"])


@pytest.mark.parametrize("opset", [10, 13, 19])
def test_dequantize_older_opsets(target, opset):
    q = R.integers(0, 256, X.shape).astype(np.uint8)
    m = model("DequantizeLinear", {"x": q}, {"s": np.float32(0.21), "z": np.uint8(17)}, TensorProto.FLOAT, opset)
    run_native(m, {"x": q}, target, False, ["dequantize_linear"])


def test_dequantize_float16_scale(target):
    q = R.integers(-128, 128, X.shape).astype(np.int8)
    m = model("DequantizeLinear", {"x": q}, {"s": scales((6,), np.float16), "z": zeros("int8", (6,))},
              TensorProto.FLOAT16, 19)
    run_native(m, {"x": q}, target, False, ["dequantize_linear"], tol=(1e-3, 1e-3))


def test_dequantize_output_dtype_against_numpy(target):
    """opset 23 ``output_dtype`` FLOAT with a float16 scale."""
    q = R.integers(0, 256, X.shape).astype(np.uint8)
    s = np.float16(0.3)
    m = model("DequantizeLinear", {"x": q}, {"s": s, "z": np.uint8(10)}, TensorProto.FLOAT, 23,
              output_dtype=TensorProto.FLOAT)
    want = ((q.astype(np.float32) - 10) * np.float32(s)).astype(np.float32)
    run_native(m, {"x": q}, target, False, ["dequantize_linear"], expect=[want])


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_dequantize_run_time_params(target, hip_graph):
    q = R.integers(-128, 128, X.shape).astype(np.int8)
    feeds = {"x": q, "s": scales((5,)), "z": zeros("int8", (5,))}
    m = model("DequantizeLinear", feeds, {}, TensorProto.FLOAT, 13, axis=2)
    run_native(m, feeds, target, hip_graph, ["dequantize_linear"])


# -- QLinearMatMul -------------------------------------------------------------------------------------
MM_CASES = {
    "2d": ((4, 7), (7, 5)), "3d": ((2, 4, 7), (2, 7, 5)), "bcast": ((3, 4, 7), (7, 5)),
    "a1d": ((7,), (7, 5)), "b1d": ((2, 4, 7), (7,)),
}


@pytest.mark.parametrize("types", [("uint8", "uint8", "uint8"), ("uint8", "int8", "uint8"), ("int8", "int8", "int8")])
@pytest.mark.parametrize("case", list(MM_CASES))
@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul(target, case, types, per_column):
    ta, tb, ty = types
    sa, sb = MM_CASES[case]
    if per_column and len(sb) == 1:
        pytest.skip("a 1-D b has one column")
    a = R.integers(*qrange(ta), sa, endpoint=True).astype(ta)
    b = R.integers(*qrange(tb), sb, endpoint=True).astype(tb)
    N = sb[-1] if len(sb) > 1 else 1
    bshape = ((N,) if len(sb) == 2 else sb[:-2] + (1, N)) if per_column else ()  # onnxruntime's forms
    inits = {"as": np.float32(0.02), "az": zeros(ta, ()), "b": b, "bs": scales(bshape) * 0.05, "bz": zeros(tb, bshape),
             "ys": np.float32(0.7), "yz": zeros(ty, ())}
    order = ["a", "as", "az", "b", "bs", "bz", "ys", "yz"]
    m = model("QLinearMatMul", {"a": a}, inits, TYPES[ty], 10, inputs=order)
    run_native(m, {"a": a}, target, False, ["quantize_linear", "dot"])


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_qlinear_matmul_run_time_inputs(target, hip_graph):
    feeds = {"a": R.integers(0, 256, (3, 6)).astype(np.uint8), "b": R.integers(-128, 128, (6, 4)).astype(np.int8),
             "as": np.array(0.03, np.float32), "ys": np.array(0.4, np.float32)}
    inits = {"az": np.uint8(120), "bs": np.float32(0.01), "bz": np.int8(0), "yz": np.uint8(100)}
    order = ["a", "as", "az", "b", "bs", "bz", "ys", "yz"]
    m = model("QLinearMatMul", feeds, inits, TensorProto.UINT8, 10, inputs=order)
    run_native(m, feeds, target, hip_graph, ["quantize_linear", "dot"])


# -- QLinearConv ---------------------------------------------------------------------------------------
CONV = {
    "plain": dict(),
    "pads_strides": dict(pads=[1, 0, 2, 1], strides=[2, 1]),
    "dilations": dict(dilations=[2, 1], pads=[1, 1, 1, 1]),
    "group": dict(group=2, pads=[1, 1, 1, 1]),
    "same_upper": dict(auto_pad="SAME_UPPER", strides=[2, 2]),
}


@pytest.mark.parametrize("types", [("uint8", "uint8", "uint8"), ("uint8", "int8", "uint8"), ("int8", "int8", "int8")])
@pytest.mark.parametrize("geo", list(CONV))
@pytest.mark.parametrize("per_channel,bias", [(False, False), (True, True)], ids=["tensor", "channel_bias"])
def test_qlinear_conv(target, types, geo, per_channel, bias):
    tx, tw, ty = types
    attrs = CONV[geo]
    g = attrs.get("group", 1)
    C, M = 4, 6
    x = R.integers(*qrange(tx), (2, C, 7, 6), endpoint=True).astype(tx)
    w = R.integers(*qrange(tw), (M, C // g, 3, 3), endpoint=True).astype(tw)
    ws = (M,) if per_channel else ()
    wz = np.zeros(ws, tw) if tw == "int8" else zeros(tw, ws, 100, 140)  # onnxruntime: symmetric int8 weights
    inits = {"xs": np.float32(0.05), "xz": zeros(tx, ()), "w": w, "ws": scales(ws) * 0.02, "wz": wz,
             "ys": np.float32(0.9), "yz": zeros(ty, ())}
    order = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
    if bias:
        inits["B"] = R.integers(-500, 500, (M,)).astype(np.int32)
        order.append("B")
    m = model("QLinearConv", {"x": x}, inits, TYPES[ty], 10, inputs=order, **attrs)
    run_native(m, {"x": x}, target, False, ["quantize_linear", "convolution"])


def test_qlinear_conv_graph_mode(target):
    x = R.integers(0, 256, (1, 3, 8, 8)).astype(np.uint8)
    inits = {"xs": np.float32(0.05), "xz": np.uint8(128), "w": R.integers(-128, 128, (4, 3, 3, 3)).astype(np.int8),
             "ws": np.float32(0.01), "wz": np.int8(0), "ys": np.float32(0.5), "yz": np.uint8(64),
             "B": np.arange(4, dtype=np.int32) * 50}
    order = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "B"]
    m = model("QLinearConv", {"x": x}, inits, TensorProto.UINT8, 10, inputs=order, pads=[1, 1, 1, 1])
    run_native(m, {"x": x}, target, True, ["quantize_linear", "convolution"])


# -- errors --------------------------------------------------------------------------------------------
def _compile(m):
    return mgx_graph.compile(m, target="ref")


def test_bad_quantization_parameters():
    with pytest.raises(ParseError, match=r"y_scale \[4\] is neither a scalar nor 1-D of length 6"):
        _compile(model("QuantizeLinear", {"x": X}, {"s": scales((4,))}, TensorProto.UINT8, 13))
    with pytest.raises(ParseError, match=r"x_scale \[2, 2, 5\] does not match x \[2, 6, 5\] blocked by 2 on axis 1 "
                                         r"\(expected \[2, 3, 5\]\)"):
        q = np.zeros(X.shape, np.uint8)
        _compile(model("DequantizeLinear", {"x": q}, {"s": scales((2, 2, 5))}, TensorProto.FLOAT, 21, block_size=2))
    with pytest.raises(ParseError, match=r"scale \[6\] must be a scalar before opset 13"):
        _compile(model("QuantizeLinear", {"x": X}, {"s": scales((6,))}, TensorProto.UINT8, 10))
    with pytest.raises(ParseError, match=r"axis 3 is out of range for x \[2, 6, 5\]"):
        _compile(model("QuantizeLinear", {"x": X}, {"s": scales((5,))}, TensorProto.UINT8, 13, axis=3))


def test_unsupported_quantized_types():
    with pytest.raises(UnsupportedOpError, match=r"output_dtype INT4"):
        _compile(model("QuantizeLinear", {"x": X}, {"s": np.float32(1.0)}, TensorProto.INT4, 21,
                       output_dtype=TensorProto.INT4))
    with pytest.raises(UnsupportedOpError, match=r"output_dtype FLOAT8E4M3FN"):
        _compile(model("QuantizeLinear", {"x": X}, {"s": np.float32(1.0)}, TensorProto.FLOAT8E4M3FN, 21,
                       output_dtype=TensorProto.FLOAT8E4M3FN))
    with pytest.raises(ParseError, match=r"output_dtype INT8 differs from the zero point type uint8"):
        _compile(model("QuantizeLinear", {"x": X}, {"s": np.float32(1.0), "z": np.uint8(0)}, TensorProto.INT8, 21,
                       output_dtype=TensorProto.INT8))
    with pytest.raises(UnsupportedOpError, match=r"precision BFLOAT16"):
        _compile(model("QuantizeLinear", {"x": X}, {"s": np.float32(1.0)}, TensorProto.UINT8, 23,
                       precision=TensorProto.BFLOAT16))


def test_bad_qlinear_parameters():
    a = np.zeros((3, 4), np.uint8)
    inits = {"as": np.float32(0.1), "az": np.uint8(0), "b": np.zeros((4, 5), np.uint8), "bs": scales((3,)),
             "bz": np.uint8(0), "ys": np.float32(1.0), "yz": np.uint8(0)}
    order = ["a", "as", "az", "b", "bs", "bz", "ys", "yz"]
    with pytest.raises(ParseError, match=r"b_scale \[3\] must be a scalar, 1-D of 5 values or \[1, 5\]"):
        _compile(model("QLinearMatMul", {"a": a}, inits, TensorProto.UINT8, 10, inputs=order))
    inits.update(bs=np.float32(0.1), yz=np.array([0, 1], np.uint8))
    with pytest.raises(ParseError, match=r"y_zero_point must be one uint8 / int8 value"):
        _compile(model("QLinearMatMul", {"a": a}, inits, TensorProto.UINT8, 10, inputs=order))
    x = np.zeros((1, 2, 4, 4), np.uint8)
    cinit = {"xs": np.float32(0.1), "xz": np.uint8(0), "w": np.zeros((3, 2, 2, 2), np.uint8), "ws": np.float32(0.1),
             "wz": np.uint8(0), "ys": np.float32(1.0), "yz": np.uint8(0), "B": np.zeros((4,), np.int32)}
    with pytest.raises(ParseError, match=r"B must be int32 \[3\], got int32 \[4\]"):
        _compile(model("QLinearConv", {"x": x}, cinit, TensorProto.UINT8, 10,
                       inputs=["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "B"]))


def test_qlinear_matmul_per_row_a_against_numpy(target):
    """a's scale and zero point per row (the spec allows it, onnxruntime does not): numpy with the float32
    multiplier a_scale * b_scale / y_scale."""
    a = R.integers(0, 256, (4, 6)).astype(np.uint8)
    b = R.integers(-128, 128, (6, 3)).astype(np.int8)
    sa, za = scales((4,)) * 0.05, R.integers(100, 150, (4,)).astype(np.uint8)
    sb, sy, zy = scales((3,)) * 0.05, np.float32(0.02), np.uint8(90)
    inits = {"as": sa, "az": za, "b": b, "bs": sb, "bz": np.int8(0), "ys": sy, "yz": zy}
    m = model("QLinearMatMul", {"a": a}, inits, TensorProto.UINT8, 10,
              inputs=["a", "as", "az", "b", "bs", "bz", "ys", "yz"])
    acc = (a.astype(np.int64) - za[:, None]) @ b.astype(np.int64)
    mult = (sa[:, None] * sb[None, :]) / sy
    want = np.clip(np.rint(acc.astype(np.float32) * mult) + zy, 0, 255).astype(np.uint8)
    run_native(m, {"a": a}, target, False, ["quantize_linear", "dot"], expect=[want])


@pytest.mark.parametrize("qtype,lo,hi", [(TensorProto.INT4, -8, 7), (TensorProto.UINT4, 0, 15)], ids=["int4", "uint4"])
def test_dequantize_4bit_initializers(target, qtype, lo, hi):
    """Blocked 4-bit weights (initializers) with a run-time scale: the values are widened to 8 bits."""
    q, zp = R.integers(lo, hi + 1, (6, 8)), R.integers(lo, hi + 1, (3, 8))
    node = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=0, block_size=2)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("s", TensorProto.FLOAT, [3, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [helper.make_tensor("q", qtype, [6, 8], q.reshape(-1).tolist()),
                           helper.make_tensor("z", qtype, [3, 8], zp.reshape(-1).tolist())])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 9
    run_native(m, {"s": scales((3, 8))}, target, False, ["dequantize_linear"])
