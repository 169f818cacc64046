"""Native normalizations (InstanceNormalization, GroupNormalization, MeanVarianceNormalization,
LpNormalization, LRN, RMSNormalization) against onnxruntime CPU, on each target, eager and in a graph."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import mgx_graph
from native_util import run_native
from util import make_model

R = np.random.default_rng(7)
F32 = TensorProto.FLOAT


def f(*shape, dtype=np.float32, lo=-2.0, hi=2.0):
    return R.uniform(lo, hi, size=shape).astype(dtype)


def _model(op, inputs, init=None, opset=18, out_type=F32, **attrs):
    names = list(inputs) + list(init or {})
    node = helper.make_node(op, names, ["y"], **attrs)
    return make_model([node], inputs, ["y"], init, opset=opset, output_types={"y": out_type})


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("shape,eps", [((2, 3, 5), 1e-5), ((1, 4, 3, 5), 1e-3), ((2, 2, 2, 3, 4), 1e-5)])
def test_instance_norm(target, hip_graph, shape, eps):
    x = f(*shape)
    C = shape[1]
    model = _model("InstanceNormalization", {"x": x}, {"s": f(C), "b": f(C)}, epsilon=eps)
    run_native(model, {"x": x}, target, hip_graph, ["mean_var_norm"], tol=(1e-4, 1e-5))


def test_instance_norm_float16(target):
    x = f(2, 3, 6, dtype=np.float16)
    model = _model("InstanceNormalization", {"x": x}, {"s": f(3, dtype=np.float16), "b": f(3, dtype=np.float16)},
                   out_type=TensorProto.FLOAT16)
    run_native(model, {"x": x}, target, False, ["mean_var_norm"], tol=(1e-2, 1e-2))


def test_instance_norm_float64_against_numpy(target):
    # onnxruntime has no float64 InstanceNormalization kernel: numpy is the oracle
    x = R.normal(size=(2, 3, 4, 5))
    s, b = R.normal(size=3), R.normal(size=3)
    model = _model("InstanceNormalization", {"x": x}, {"s": s, "b": b}, out_type=TensorProto.DOUBLE)
    mu, var = x.mean(axis=(2, 3), keepdims=True), x.var(axis=(2, 3), keepdims=True)
    want = (x - mu) / np.sqrt(var + 1e-5) * s[:, None, None] + b[:, None, None]
    run_native(model, {"x": x}, target, False, ["mean_var_norm"], tol=(1e-12, 1e-12), expect=[want])


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("opset,shape,groups", [(18, (2, 4, 3), 2), (18, (1, 6, 2, 3), 3), (21, (2, 4, 3), 2),
                                                 (21, (3, 6, 2, 2), 6), (21, (2, 6, 5), 1)])
def test_group_norm(target, hip_graph, opset, shape, groups):
    x = f(*shape)
    n = groups if opset < 21 else shape[1]
    model = _model("GroupNormalization", {"x": x}, {"s": f(n), "b": f(n)}, opset=opset, num_groups=groups,
                   epsilon=1e-4)
    run_native(model, {"x": x}, target, hip_graph, ["mean_var_norm"], tol=(1e-4, 1e-5))


def test_group_norm_bad_groups_names_the_node():
    x = f(2, 6, 3)
    model = _model("GroupNormalization", {"x": x}, {"s": f(6), "b": f(6)}, opset=21, num_groups=4)
    with pytest.raises(mgx_graph.ParseError, match=r"GroupNormalization.*num_groups=4"):
        mgx_graph.compile(model, target="ref")


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("axes", [None, [0, 2, 3], [1], [2, 3], [0, 1, 2, 3]])
def test_mean_variance_normalization(target, hip_graph, axes):
    x = f(2, 3, 4, 5)
    attrs = {} if axes is None else {"axes": axes}
    model = _model("MeanVarianceNormalization", {"x": x}, opset=13, **attrs)
    run_native(model, {"x": x}, target, hip_graph, ["mean_var_norm"], tol=(1e-4, 1e-5))


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("p,axis", [(2, -1), (1, -1), (2, 0), (1, 1), (2, 1)])
def test_lp_norm(target, hip_graph, p, axis):
    x = f(3, 4, 5)
    x[1, :, 2] = 0.0  # a zero line along axis 1
    x[:, 0, 3] = 0.0  # and one along axis 0
    x[2, 3, :] = 0.0  # and along the last axis
    model = _model("LpNormalization", {"x": x}, opset=1, p=p, axis=axis)
    run_native(model, {"x": x}, target, hip_graph, ["lp_norm"], tol=(1e-5, 1e-6))


def test_lp_norm_nan_and_inf_lines(target):
    x = np.array([[1.0, np.nan, 2.0], [3.0, 4.0, 0.0], [np.inf, 1.0, 1.0], [0.0, 0.0, 0.0]], np.float32)
    model = _model("LpNormalization", {"x": x}, opset=22, p=2, axis=1)
    run_native(model, {"x": x}, target, False, ["lp_norm"])


def test_lp_norm_bad_p_is_unsupported():
    x = f(2, 3)
    model = _model("LpNormalization", {"x": x}, opset=22, p=3)
    with pytest.raises(mgx_graph.UnsupportedOpError, match=r"p=3"):
        mgx_graph.compile(model, target="ref")


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("size,alpha,beta,bias", [(3, 1e-4, 0.75, 1.0), (1, 0.5, 0.5, 2.0), (7, 0.1, 1.2, 1.5),
                                                  (5, 1e-2, 0.75, 1.0), (9, 1e-3, 0.6, 0.8)])
def test_lrn(target, hip_graph, size, alpha, beta, bias):
    x = f(2, 6, 3, 4)
    model = _model("LRN", {"x": x}, opset=13, size=size, alpha=alpha, beta=beta, bias=bias)
    run_native(model, {"x": x}, target, hip_graph, ["lrn"], tol=(1e-5, 1e-6))


def test_lrn_rank3_against_numpy(target):
    # onnxruntime's LRN takes 4-D inputs and odd sizes only; the spec allows [N, C, D1, ...] and any size
    x = f(2, 5, 7)
    size, alpha, beta, bias = 4, 0.2, 0.7, 1.3
    model = _model("LRN", {"x": x}, opset=13, size=size, alpha=alpha, beta=beta, bias=bias)
    sq = np.pad(x.astype(np.float64) ** 2, [(0, 0), ((size - 1) // 2, size // 2), (0, 0)])
    s = sum(sq[:, k:k + 5] for k in range(size))
    want = (x / (bias + alpha / size * s) ** beta).astype(np.float32)
    run_native(model, {"x": x}, target, False, ["lrn"], tol=(1e-5, 1e-6), expect=[want])


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("shape,axis,sshape", [((2, 4, 8), -1, (8,)), ((2, 4, 3), 1, (4, 3)), ((3, 5), 0, (3, 5)),
                                               ((2, 3, 4), -2, (1, 4))])
def test_rms_normalization(target, hip_graph, shape, axis, sshape):
    x = f(*shape)
    model = _model("RMSNormalization", {"x": x}, {"s": f(*sshape)}, opset=23, axis=axis, epsilon=1e-4)
    run_native(model, {"x": x}, target, hip_graph, ["rms_norm"], tol=(1e-5, 1e-6))


@pytest.mark.parametrize("dtype,tol", [(np.float16, (2e-3, 2e-3)), (np.float64, (1e-10, 1e-12))])
def test_rms_normalization_types(target, dtype, tol):
    x = f(3, 8, dtype=dtype)
    otype = {np.float16: TensorProto.FLOAT16, np.float64: TensorProto.DOUBLE}[dtype]
    model = _model("RMSNormalization", {"x": x}, {"s": f(8, dtype=dtype)}, opset=23, out_type=otype)
    run_native(model, {"x": x}, target, False, ["rms_norm"], tol=tol)
