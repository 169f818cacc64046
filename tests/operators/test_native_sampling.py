"""Native GridSample (4-D and 5-D, every mode, padding mode and align_corners) and RoiAlign (avg / max,
half_pixel / output_half_pixel, sampling ratios, rois partly or wholly outside the image) against
onnxruntime CPU on each target, eager and in a graph; typed errors for bad attributes and shapes."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import mgx_graph
from mgx_graph.errors import ExecutionError, ParseError, UnsupportedOpError
from native_util import run_native
from util import make_model, ort_run

R = np.random.default_rng(3)
F32 = TensorProto.FLOAT


def grid(shape, lo=-1.4, hi=1.4, dtype=np.float32):
    g = R.uniform(lo, hi, size=shape).astype(dtype)
    # exact corners, centre and half-pixel ties (W = 6, H = 5 with align_corners 0: 1/6 steps)
    special = np.array([-1.0, 1.0, 0.0, 0.5, -0.5, 1 / 6, -1 / 3, 2.0, -2.0, 1 / 5], dtype)
    flat = g.reshape(-1)
    flat[:special.size] = special
    return g


def gs_model(x, g, opset=20, **attrs):
    node = helper.make_node("GridSample", ["x", "g"], ["y"], **attrs)
    out = {np.float64: TensorProto.DOUBLE, np.float16: TensorProto.FLOAT16}.get(x.dtype.type, F32)
    return make_model([node], {"x": x, "g": g}, ["y"], opset=opset, output_types={"y": out})


X4 = R.standard_normal((2, 3, 5, 6)).astype(np.float32)
G4 = grid((2, 4, 7, 2))
X5 = R.standard_normal((2, 2, 4, 5, 6)).astype(np.float32)
G5 = grid((2, 3, 4, 5, 3))


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("pad", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_grid_sample_2d(target, mode, pad, align):
    m = gs_model(X4, G4, mode=mode, padding_mode=pad, align_corners=align)
    run_native(m, {"x": X4, "g": G4}, target, False, ["grid_sample"], tol=(1e-5, 1e-5))


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("pad", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_grid_sample_3d(target, mode, pad, align):
    m = gs_model(X5, G5, mode=mode, padding_mode=pad, align_corners=align)
    run_native(m, {"x": X5, "g": G5}, target, False, ["grid_sample"], tol=(1e-5, 1e-5))


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_grid_sample_opset16_names(target, mode):
    m = gs_model(X4, G4, opset=16, mode=mode, padding_mode="border")
    run_native(m, {"x": X4, "g": G4}, target, False, ["grid_sample"], tol=(1e-5, 1e-5))


def test_grid_sample_far_reflection(target):
    """Coordinates several image widths outside reflect back and forth (also one-pixel-wide axes)."""
    x = R.standard_normal((1, 2, 1, 4)).astype(np.float32)
    g = grid((1, 3, 9, 2), -7.0, 7.0)
    for align in (0, 1):
        for mode in ("linear", "nearest", "cubic"):
            m = gs_model(x, g, mode=mode, padding_mode="reflection", align_corners=align)
            run_native(m, {"x": x, "g": g}, target, False, ["grid_sample"], tol=(1e-5, 1e-5))


def test_grid_sample_float64(target):
    x, g = X4.astype(np.float64), G4.astype(np.float64)
    m = gs_model(x, g, mode="cubic", padding_mode="reflection")
    run_native(m, {"x": x, "g": g}, target, False, ["grid_sample"], tol=(1e-12, 1e-12))


def test_grid_sample_float16_close_to_float32(target):
    x, g = X4.astype(np.float16), G4.astype(np.float16)
    want = ort_run(gs_model(x.astype(np.float32), g.astype(np.float32)), {"x": x.astype(np.float32),
                                                                         "g": g.astype(np.float32)})
    m = gs_model(x, g)
    run_native(m, {"x": x, "g": g}, target, False, ["grid_sample"], tol=(5e-3, 5e-3),
               expect=[want[0].astype(np.float16)])


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_grid_sample_graph_mode(target, hip_graph):
    m = gs_model(X5, G5, mode="linear", padding_mode="zeros")
    run_native(m, {"x": X5, "g": G5}, target, hip_graph, ["grid_sample"], tol=(1e-5, 1e-5))


def test_grid_sample_errors():
    with pytest.raises(ParseError, match=r"'mode' = 'linear' is not one of bilinear, nearest, bicubic \(opset 16\)"):
        mgx_graph.compile(gs_model(X4, G4, opset=16, mode="linear"), target="ref")
    with pytest.raises(ParseError, match=r"'padding_mode' = 'wrap' is not one of"):
        mgx_graph.compile(gs_model(X4, G4, padding_mode="wrap"), target="ref")
    with pytest.raises(UnsupportedOpError, match=r"cubic mode with 3 spatial dims"):
        mgx_graph.compile(gs_model(X5, G5, mode="cubic"), target="ref")
    with pytest.raises(UnsupportedOpError, match=r"3 spatial dims .*: 2 supported"):
        mgx_graph.compile(gs_model(X5, G5, opset=16), target="ref")
    bad = make_model([helper.make_node("GridSample", ["x", "g"], ["y"])], {"x": X4, "g": G5[:, 0]}, ["y"], opset=20,
                     output_types={"y": F32})
    with pytest.raises((ParseError, mgx_graph.ShapeError), match=r"grid \[2, 4, 5, 3\] does not match X"):
        mgx_graph.compile(bad, target="ref")


# -- RoiAlign ------------------------------------------------------------------------------------------
XR = R.standard_normal((2, 3, 10, 12)).astype(np.float32)
ROIS = np.array([[0, 0, 9, 9], [1.3, 2.2, 7.9, 5.1], [-2, -3, 4, 20], [5, 5, 5.2, 5.1], [0, 0, 30, 30],
                 [11.5, 9.5, 14, 13], [3, 4, 2, 1]], np.float32)  # inside, partly / wholly out, tiny, inverted
BATCH = np.array([0, 1, 0, 1, 1, 0, 1], np.int64)


def ra_model(opset=16, **attrs):
    node = helper.make_node("RoiAlign", ["x", "rois", "b"], ["y"], **attrs)
    return make_model([node], {"x": XR, "rois": ROIS, "b": BATCH}, ["y"], opset=opset, output_types={"y": F32})


FEEDS = {"x": XR, "rois": ROIS, "b": BATCH}


@pytest.mark.parametrize("sampling_ratio", [0, 1, 2])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align(target, mode, ctm, sampling_ratio):
    m = ra_model(mode=mode, coordinate_transformation_mode=ctm, sampling_ratio=sampling_ratio, output_height=3,
                 output_width=4, spatial_scale=0.9)
    run_native(m, FEEDS, target, False, ["roi_align"], tol=(1e-5, 1e-5))


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_opset10_defaults(target, mode):
    m = ra_model(opset=10, mode=mode)
    run_native(m, FEEDS, target, False, ["roi_align"], tol=(1e-5, 1e-5))


def test_roi_align_large_rois_float64(target):
    x = R.standard_normal((1, 2, 40, 50))
    rois = np.array([[0, 0, 49, 39], [2.5, 1.5, 47.5, 30.5], [10, 10, 11, 11]])
    b = np.zeros(3, np.int64)
    node = helper.make_node("RoiAlign", ["x", "rois", "b"], ["y"], output_height=5, output_width=6, spatial_scale=1.0)
    m = make_model([node], {"x": x, "rois": rois, "b": b}, ["y"], opset=16, output_types={"y": TensorProto.DOUBLE})
    run_native(m, {"x": x, "rois": rois, "b": b}, target, False, ["roi_align"], tol=(1e-10, 1e-12))


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_roi_align_graph_mode(target, hip_graph):
    m = ra_model(mode="avg", output_height=2, output_width=2, sampling_ratio=0)
    run_native(m, FEEDS, target, hip_graph, ["roi_align"], tol=(1e-5, 1e-5))


def test_roi_align_bad_batch_index_at_run_time():
    prog = mgx_graph.compile(ra_model(), target="ref")
    with pytest.raises(ExecutionError, match=r"batch index 2 is outside \[0, 2\)"):
        prog.run(dict(FEEDS, b=np.array([0, 1, 2, 0, 0, 0, 0], np.int64)))
    np.testing.assert_allclose(prog.run(FEEDS)[0], ort_run(ra_model(), FEEDS)[0], rtol=1e-5, atol=1e-5)


def test_roi_align_errors():
    with pytest.raises(ParseError, match=r"'mode' = 'sum' is not one of 'avg', 'max'"):
        mgx_graph.compile(ra_model(mode="sum"), target="ref")
    with pytest.raises(ParseError, match=r"output_height 0 / output_width 1 must be >= 1"):
        mgx_graph.compile(ra_model(output_height=0), target="ref")


# -- the gpu kernels' arithmetic, built for the host ----------------------------------------------------
@pytest.fixture
def host_sampling_cu(monkeypatch):
    """operators/sampling.cu compiled with g++ and launched through the glue of the ops' entries in the
    gpu kernel table (operators/vision_gpu.py)."""
    import os

    import cu_host
    from mgx_graph.operators import sampling, vision_gpu

    if not cu_host.available():
        pytest.skip("needs g++")
    path = os.path.join(os.path.dirname(sampling.__file__), "sampling.cu")

    class Module:
        def __init__(self, dtype):
            c = "double" if dtype == "float64" else "float"
            self.lib = cu_host.build(path, c, c)

        def get_function(self, name):
            return lambda grid, block, args: cu_host.launch(self.lib, name, *args)

    monkeypatch.setattr(vision_gpu, "sampling_module", Module)

    def run(name, args, **attrs):
        from mgx_graph.operators import make_op
        from mgx_graph.operators.gpu_lowering import table_kernel
        from mgx_graph.ir.shape import Shape

        op = make_op(name, **attrs)
        shapes = [Shape(a.dtype.name, a.shape) for a in args]
        out_shape = op.compute_shape(shapes)
        out = np.full(out_shape.lens, np.nan, out_shape.np_dtype)
        table_kernel(op, shapes, out_shape).fn(None, out, [np.ascontiguousarray(a) for a in args], [])
        return out

    return run


@pytest.mark.parametrize("nd", [2, 3])
def test_grid_sample_kernel_on_host(host_sampling_cu, nd):
    x, g = (X4, G4) if nd == 2 else (X5, G5)
    for mode in ["linear", "nearest", "cubic"][:3 if nd == 2 else 2]:
        for pad in ["zeros", "border", "reflection"]:
            for align in (0, 1):
                want = ort_run(gs_model(x, g, mode=mode, padding_mode=pad, align_corners=align), {"x": x, "g": g})[0]
                got = host_sampling_cu("grid_sample", [x, g], mode=mode, padding_mode=pad, align_corners=align)
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{mode} {pad} {align}")
    x64, g64 = x.astype(np.float64), g.astype(np.float64)
    want = ort_run(gs_model(x64, g64, mode="nearest", padding_mode="reflection"), {"x": x64, "g": g64})[0]
    np.testing.assert_allclose(host_sampling_cu("grid_sample", [x64, g64], mode="nearest",
                                                padding_mode="reflection"), want, rtol=1e-12, atol=1e-12)


def test_roi_align_kernel_on_host(host_sampling_cu):
    for mode in ("avg", "max"):
        for ctm in ("half_pixel", "output_half_pixel"):
            for sr in (0, 2):
                m = ra_model(mode=mode, coordinate_transformation_mode=ctm, sampling_ratio=sr, output_height=3,
                             output_width=4, spatial_scale=0.9)
                got = host_sampling_cu("roi_align", [XR, ROIS, BATCH], mode=mode, output_height=3, output_width=4,
                                       sampling_ratio=sr, spatial_scale=0.9, half_pixel=int(ctm == "half_pixel"))
                np.testing.assert_allclose(got, ort_run(m, FEEDS)[0], rtol=1e-5, atol=1e-5, err_msg=f"{mode} {ctm} {sr}")
