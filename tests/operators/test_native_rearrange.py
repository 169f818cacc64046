"""Native DepthToSpace (DCR / CRD), SpaceToDepth, CenterCropPad and Col2Im against onnxruntime (CPU) on
every target; the compiled program holds no ``onnx_op``."""
import math

import numpy as np
import pytest
from onnx import helper

import mgx_graph
from mgx_graph.errors import ParseError, ShapeError
from util import make_model, ort_run

R = np.random.default_rng(13)


def check(node, feeds, target, init=None, opset=18, hip_graph=False):
    m = make_model([node], feeds, list(node.output), init, opset=opset)
    want = ort_run(m, feeds)
    prog = mgx_graph.compile(m, target=target, hip_graph=hip_graph)
    assert "onnx_op" not in str(prog)
    for _ in range(3 if hip_graph else 1):
        got = prog.run(feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("blocksize,shape", [(2, (2, 8, 3, 4)), (3, (1, 18, 2, 3))])
def test_depth_to_space(mode, blocksize, shape, target):
    x = R.standard_normal(shape).astype(np.float32)
    check(helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=blocksize, mode=mode), {"x": x}, target)


@pytest.mark.parametrize("blocksize,shape", [(2, (2, 3, 4, 6)), (3, (1, 2, 6, 9))])
def test_space_to_depth(blocksize, shape, target):
    x = R.standard_normal(shape).astype(np.float32)
    check(helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=blocksize), {"x": x}, target)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth_inverts_depth_to_space(mode, target):
    """SpaceToDepth (opset 28 has ``mode``) undoes DepthToSpace of the same mode (onnxruntime's DepthToSpace
    gives the input); the identity is the oracle."""
    x = R.standard_normal((1, 8, 3, 5)).astype(np.float32)
    nodes = [helper.make_node("SpaceToDepth", ["x"], ["t"], blocksize=2, mode=mode),
             helper.make_node("DepthToSpace", ["t"], ["y"], blocksize=2, mode=mode)]
    x = R.standard_normal((1, 2, 4, 6)).astype(np.float32)
    m = make_model(nodes, {"x": x}, ["y"], opset=28)
    prog = mgx_graph.compile(m, target=target)
    assert "onnx_op" not in str(prog)
    np.testing.assert_array_equal(prog.run({"x": x})[0], x)
    t = mgx_graph.compile(make_model(nodes[:1], {"x": x}, ["t"], opset=28), target=target).run({"x": x})[0]
    want = x.reshape(1, 2, 2, 2, 3, 2).transpose((0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4))
    np.testing.assert_array_equal(t, want.reshape(1, 8, 2, 3))


def test_depth_to_space_round_trip_graph_mode(target):
    x = R.standard_normal((1, 8, 3, 5)).astype(np.float32)
    nodes = [helper.make_node("DepthToSpace", ["x"], ["t"], blocksize=2, mode="CRD"),
             helper.make_node("SpaceToDepth", ["t"], ["y"], blocksize=2)]
    m = make_model(nodes, {"x": x}, ["y"], opset=13)
    prog = mgx_graph.compile(m, target=target, hip_graph=True)
    for _ in range(3):
        got = prog.run({"x": x})[0]
    np.testing.assert_allclose(got, ort_run(m, {"x": x})[0])


@pytest.mark.parametrize("shape,axes", [([3, 4, 9, 4], None), ([4, 9], [2, 3]), ([8, 2], [-1, 1]), ([2, 5, 6, 7], None),
                                        ([1, 5, 5, 8], None)],
                         ids=["crop_and_pad", "axes", "negative_axes", "identity", "odd_crop_pad"])
def test_center_crop_pad(shape, axes, target):
    x = R.standard_normal((2, 5, 6, 7)).astype(np.float32)
    kw = {} if axes is None else dict(axes=axes)
    check(helper.make_node("CenterCropPad", ["x", "s"], ["y"], **kw), {"x": x}, target,
          {"s": np.array(shape, np.int64)})


COL2IM = {
    "2d": ([5, 5], [2, 2], {}),
    "2d_strided_padded_dilated": ([6, 7], [3, 2], dict(strides=[2, 1], pads=[1, 0, 1, 1], dilations=[1, 2])),
    "1d": ([9], [3], dict(strides=[2])),
    "3d": ([4, 5, 6], [2, 2, 3], {}),
}


@pytest.mark.parametrize("name", list(COL2IM))
def test_col2im(name, target):
    image, block, kw = COL2IM[name]
    n = len(image)
    st, d, pd = kw.get("strides", [1] * n), kw.get("dilations", [1] * n), kw.get("pads", [0] * (2 * n))
    L = math.prod((image[i] + pd[i] + pd[i + n] - d[i] * (block[i] - 1) - 1) // st[i] + 1 for i in range(n))
    x = R.standard_normal((2, 3 * math.prod(block), L)).astype(np.float32)
    check(helper.make_node("Col2Im", ["x", "i", "b"], ["y"], **kw), {"x": x}, target,
          {"i": np.array(image, np.int64), "b": np.array(block, np.int64)})


def test_rearrange_bad_inputs_raise_typed_errors():
    x = R.standard_normal((1, 6, 3, 4)).astype(np.float32)
    m = make_model([helper.make_node("DepthToSpace", ["x"], ["y"], name="d2s", blocksize=2)], {"x": x}, ["y"])
    with pytest.raises(ParseError, match="d2s.*not divisible by blocksize"):
        mgx_graph.compile(m, target="ref")
    m = make_model([helper.make_node("DepthToSpace", ["x"], ["y"], name="d2s", blocksize=1, mode="XYZ")], {"x": x},
                   ["y"])
    with pytest.raises(ParseError, match="d2s.*'mode' = 'XYZ' is not one of 'DCR', 'CRD'"):
        mgx_graph.compile(m, target="ref")
    c = R.standard_normal((1, 12, 7)).astype(np.float32)  # 7 columns, but a 5x5 image with 2x2 blocks has 16
    m = make_model([helper.make_node("Col2Im", ["x", "i", "b"], ["y"], name="c2i")], {"x": c}, ["y"],
                   {"i": np.array([5, 5], np.int64), "b": np.array([2, 2], np.int64)})
    with pytest.raises(ShapeError, match="c2i"):
        mgx_graph.compile(m, target="ref")
