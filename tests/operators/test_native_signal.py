"""Native DFT (real / complex, forward / inverse, RFFT / IRFFT, every axis, padded / truncated lengths,
opsets 17 and 20), STFT, the Hann / Hamming / Blackman windows and MelWeightMatrix against onnxruntime CPU
(numpy where onnxruntime lacks a case or differs from the spec) on each target, eager and in a graph;
typed errors for bad attributes."""
import numpy as np
import pytest
from onnx import TensorProto

import mgx_graph
from mgx_graph.errors import ExecutionError, ParseError
from native_util import program_text, run_native
from util import one_node_model, ort_run, ort_version

R = np.random.default_rng(9)
OUT = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.float16: TensorProto.FLOAT16}


def model(op, feeds, inits, inputs, out_type=TensorProto.FLOAT, opset=20, **attrs):
    return one_node_model(op, inputs, feeds, inits, out_type, opset, **attrs)


def dft_model(x, axis=None, length=None, opset=20, **attrs):
    inits = {}
    names = ["x", "", ""]
    if length is not None:
        inits["n"] = np.array(length, np.int64)
        names[1] = "n"
    if axis is not None and opset >= 20:
        inits["a"] = np.array(axis, np.int64)
        names[2] = "a"
    elif axis is not None:
        attrs["axis"] = axis
    while names[-1] == "":
        names.pop()
    return model("DFT", {"x": x}, inits, names, OUT[x.dtype.type], opset, **attrs)


def cplx(a):
    return a[..., 0] + 1j * a[..., 1] if a.shape[-1] == 2 else a[..., 0]


def real_rep(y, dtype):
    return np.stack([y.real, y.imag], -1).astype(dtype)


XR = R.standard_normal((2, 8, 6, 1)).astype(np.float32)
XC = R.standard_normal((2, 8, 6, 2)).astype(np.float32)
TOL = (1e-4, 1e-4)


@pytest.mark.parametrize("axis", [1, 2, -2, -3])
@pytest.mark.parametrize("kind", ["real", "complex"])
@pytest.mark.parametrize("inverse", [0, 1])
def test_dft(target, axis, kind, inverse):
    x = XR if kind == "real" else XC
    run_native(dft_model(x, axis, inverse=inverse), {"x": x}, target, False, ["dft"], tol=TOL)


@pytest.mark.parametrize("length", [5, 8, 12, 13])
@pytest.mark.parametrize("case", ["forward", "rfft", "inverse"])
def test_dft_length(target, length, case):
    x = XC if case == "inverse" else XR
    attrs = dict(inverse=1) if case == "inverse" else dict(onesided=1) if case == "rfft" else {}
    run_native(dft_model(x, 1, length, **attrs), {"x": x}, target, False, ["dft"], tol=TOL)


@pytest.mark.parametrize("axis", [1, 2])
def test_rfft(target, axis):
    run_native(dft_model(XR, axis, onesided=1), {"x": XR}, target, False, ["dft"], tol=TOL)


@pytest.mark.parametrize("length", [None, 10, 9, 4, 15])
def test_irfft_against_numpy(target, length):
    """IRFFT (onesided inverse): numpy.fft.irfft is the oracle (onnxruntime differs for odd lengths)."""
    spec = np.fft.rfft(R.standard_normal((3, 10, 4)), axis=1)
    x = real_rep(spec, np.float32)
    want = np.fft.irfft(spec, n=length, axis=1)[..., None].astype(np.float32)
    run_native(dft_model(x, 1, length, inverse=1, onesided=1), {"x": x}, target, False, ["dft"], tol=TOL,
               expect=[want])


@pytest.mark.parametrize("kind", ["real", "complex"])
def test_dft_opset17_axis_attribute(target, kind):
    x = XR if kind == "real" else XC
    run_native(dft_model(x, 2, opset=17), {"x": x}, target, False, ["dft"], tol=TOL)
    run_native(dft_model(x, opset=17, inverse=1), {"x": x}, target, False, ["dft"], tol=TOL)  # axis 1 default


def test_dft_float64(target):
    x = XC.astype(np.float64)
    run_native(dft_model(x, -2, 11), {"x": x}, target, False, ["dft"], tol=(1e-10, 1e-10))


def test_dft_float16_against_numpy(target):
    x = XR.astype(np.float16)
    want = real_rep(np.fft.fft(cplx(x.astype(np.float64)), axis=1), np.float16)
    run_native(dft_model(x, 1), {"x": x}, target, False, ["dft"], tol=(1e-2, 2e-2), expect=[want])


def test_dft_run_time_length(target):
    """dft_length fed at run time: the program is specialized for its value (re-checked every run)."""
    m = model("DFT", {"x": XR, "n": np.array(12, np.int64)}, {"a": np.array(1, np.int64)}, ["x", "n", "a"])
    prog = run_native(m, {"x": XR, "n": np.array(12, np.int64)}, target, False, ["dft"], tol=TOL)
    feeds = {"x": XR, "n": np.array(6, np.int64)}
    np.testing.assert_allclose(prog.run(feeds)[0], ort_run(m, feeds)[0], rtol=1e-4, atol=1e-4)


def ramp():
    """The node suite's test_dft_inverse input: x[0, i, j] = 10 i + j + 0j, [1, 10, 10, 2] float32."""
    x = np.zeros((1, 10, 10, 2), np.float32)
    x[..., 0] = np.arange(100, dtype=np.float32).reshape(1, 10, 10)
    return x


def ramp_inverse():
    """The float64 inverse DFT of :func:`ramp` along axis 1 (1/10 scaled) as float32 [1, 10, 10, 2]: row 5
    (the Nyquist bin of a real column) is real, its imaginary parts are exactly 0."""
    return real_rep(np.fft.ifft(cplx(ramp().astype(np.float64)), axis=1), np.float32)


@pytest.mark.parametrize("opset", [19, 20])
@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_inverse_dft_of_the_suite_ramp_against_float64(target, opset, hip_graph):
    """Inverse DFT of the suite's ramp (axis attribute at opset 19, axis input at 20) against numpy in
    float64, within float32 rounding; the suite's own expected output is numpy's complex64 result, whose
    Nyquist imaginary parts hold 1.9e-7 of rounding (the spec value is 0), more than its atol of 1e-7."""
    x = ramp()
    run_native(dft_model(x, 1, opset=opset, inverse=1), {"x": x}, target, hip_graph, ["dft"], tol=(1e-5, 1e-5),
               expect=[ramp_inverse()])


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_dft_graph_mode(target, hip_graph):
    run_native(dft_model(XR, 1, 10, onesided=1), {"x": XR}, target, hip_graph, ["dft"], tol=TOL)
    run_native(dft_model(XC, 2, inverse=1), {"x": XC}, target, hip_graph, ["dft"], tol=TOL)


def test_dft_errors():
    with pytest.raises(ParseError, match=r"axis 3 is outside \[-4, -2\] and \[0, 2\]"):
        mgx_graph.compile(dft_model(XR, 3), target="ref")
    with pytest.raises(ParseError, match=r"one-sided forward DFT \(RFFT\) needs real input"):
        mgx_graph.compile(dft_model(XC, 1, onesided=1), target="ref")
    with pytest.raises(ParseError, match=r"one-sided inverse DFT \(IRFFT\) needs complex input"):
        mgx_graph.compile(dft_model(XR, 1, inverse=1, onesided=1), target="ref")
    with pytest.raises(ParseError, match=r"dft_length 0 must be >= 1"):
        mgx_graph.compile(dft_model(XR, 1, 0), target="ref")


# -- STFT ----------------------------------------------------------------------------------------------
SIG = R.standard_normal((2, 40, 1)).astype(np.float32)


def stft_model(x, step, win=None, length=None, **attrs):
    inits = {"s": np.array(step, np.int64)}
    names = ["x", "s", "", ""]
    if win is not None:
        inits["w"] = win
        names[2] = "w"
    if length is not None:
        inits["l"] = np.array(length, np.int64)
        names[3] = "l"
    while names[-1] == "":
        names.pop()
    return model("STFT", {"x": x}, inits, names, OUT[x.dtype.type], 17, **attrs)


@pytest.mark.parametrize("onesided", [0, 1])
@pytest.mark.parametrize("case", ["hann8_step5", "window_and_length", "no_window", "step1", "one_frame"])
def test_stft(target, case, onesided):
    step, win, length = {"hann8_step5": (5, np.hanning(8), None), "window_and_length": (3, np.hamming(10), 10),
                         "no_window": (4, None, 16), "step1": (1, np.blackman(6), None),
                         "one_frame": (7, None, 40)}[case]
    win = None if win is None else win.astype(np.float32)
    run_native(stft_model(SIG, step, win, length, onesided=onesided), {"x": SIG}, target, False, ["stft"], tol=TOL)


# onnxruntime up to 1.30 starts the frames of a complex signal [B, T, 2] at twice their offset (it reads
# past the signal); 1.31 fixed it.  Before that, numpy alone is the oracle of a complex signal.
ORT_STFT_COMPLEX = ort_version() >= (1, 31)


def stft_numpy(x, step: int, win) -> np.ndarray:
    """Two-sided STFT by numpy: frame ``f`` is ``x[:, f*step : f*step + len(win)]`` (complex when the last
    dim is 2) times ``win``, its DFT of length ``len(win)``; returns ``[B, F, len(win), 2]`` in x's type."""
    sig, n = cplx(x.astype(np.float64)), len(win)
    frames = np.stack([sig[:, f * step:f * step + n] for f in range((sig.shape[1] - n) // step + 1)], 1)
    return real_rep(np.fft.fft(frames * np.asarray(win, np.float64), axis=-1), x.dtype)


def stft_complex_oracle(x, step: int, win) -> np.ndarray:
    """The numpy STFT, checked against onnxruntime's where its complex-signal STFT is right."""
    want = stft_numpy(x, step, win)
    if ORT_STFT_COMPLEX:
        np.testing.assert_allclose(ort_run(stft_model(x, step, win, onesided=0), {"x": x})[0], want, rtol=1e-4,
                                   atol=1e-4)
    return want


def test_stft_numpy_oracle_on_a_real_signal():
    """The numpy oracle against onnxruntime on a real signal (a path its STFT has always had right)."""
    win = np.hanning(8).astype(np.float32)
    np.testing.assert_allclose(stft_numpy(SIG, 5, win), ort_run(stft_model(SIG, 5, win, onesided=0), {"x": SIG})[0],
                               rtol=1e-4, atol=1e-4)


def test_stft_complex_signal(target):
    x = R.standard_normal((2, 30, 2)).astype(np.float32)
    win = np.hanning(8).astype(np.float32)
    run_native(stft_model(x, 4, win, onesided=0), {"x": x}, target, False, ["stft"], tol=TOL,
               expect=[stft_complex_oracle(x, 4, win)])


def test_stft_float64(target):
    x = SIG.astype(np.float64)
    run_native(stft_model(x, 3, np.hanning(9)), {"x": x}, target, False, ["stft"], tol=(1e-10, 1e-10))


def test_stft_graph_mode(target):
    run_native(stft_model(SIG, 5, np.hanning(8).astype(np.float32)), {"x": SIG}, target, True, ["stft"], tol=TOL)


def test_stft_errors():
    with pytest.raises(ParseError, match=r"window length 8 differs from frame_length 10"):
        mgx_graph.compile(stft_model(SIG, 5, np.hanning(8).astype(np.float32), 10), target="ref")
    with pytest.raises(ParseError, match=r"one-sided STFT needs a real signal"):
        x = R.standard_normal((1, 20, 2)).astype(np.float32)
        mgx_graph.compile(stft_model(x, 5, np.hanning(8).astype(np.float32)), target="ref")
    with pytest.raises(ParseError, match=r"frame_step 0 must be >= 1"):
        mgx_graph.compile(stft_model(SIG, 0, np.hanning(8).astype(np.float32)), target="ref")


# -- windows and MelWeightMatrix -----------------------------------------------------------------------
@pytest.mark.parametrize("out_type", [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
def test_windows(target, op, periodic, out_type):
    m = model(op, {}, {"n": np.array(10, np.int64)}, ["n"], out_type, 17, periodic=periodic, output_datatype=out_type)
    run_native(m, {}, target, False, [], tol=(1e-6, 1e-7))


def test_window_sizes_and_float16(target):
    for size in (1, 2, 3, 7, 64):
        for periodic in (0, 1):
            m = model("BlackmanWindow", {}, {"n": np.array(size, np.int64)}, ["n"], TensorProto.FLOAT, 17,
                      periodic=periodic)
            run_native(m, {}, target, False, [], tol=(1e-6, 1e-7))
    m = model("HammingWindow", {}, {"n": np.array(9, np.int64)}, ["n"], TensorProto.FLOAT16, 17,
              output_datatype=TensorProto.FLOAT16)
    want = (25 / 46 - 21 / 46 * np.cos(2 * np.pi * np.arange(9) / 9)).astype(np.float16)
    run_native(m, {}, target, False, [], tol=(1e-3, 1e-3), expect=[want])
    with pytest.raises(ParseError, match=r"symmetric window of size 1 is NaN"):
        mgx_graph.compile(model("HannWindow", {}, {"n": np.array(1, np.int64)}, ["n"], TensorProto.INT64, 17,
                                periodic=0, output_datatype=TensorProto.INT64), target="ref")


def test_window_run_time_size(target):
    """A size fed at run time: the program is specialized for it and holds the window as a literal."""
    m = model("HannWindow", {"n": np.array(12, np.int32)}, {}, ["n"], TensorProto.FLOAT, 17)
    prog = run_native(m, {"n": np.array(12, np.int32)}, target, False, [], tol=(1e-6, 1e-7))
    np.testing.assert_allclose(prog.run({"n": np.array(5, np.int32)})[0], ort_run(m, {"n": np.array(5, np.int32)})[0],
                               rtol=1e-6, atol=1e-7)


MEL = [(8, 16, 8192, 0.0, 4096.0), (20, 512, 16000, 20.0, 7000.0), (40, 400, 22050, 125.0, 7600.0)]


def _mel_feeds(args):
    return dict(zip(["m", "d", "r", "lo", "hi"], [np.array(args[0], np.int64), np.array(args[1], np.int64),
                                                   np.array(args[2], np.int64), np.array(args[3], np.float32),
                                                   np.array(args[4], np.float32)]))


@pytest.mark.parametrize("args", MEL)
def test_mel_weight_matrix_literal(target, args):
    m = model("MelWeightMatrix", {}, _mel_feeds(args), ["m", "d", "r", "lo", "hi"], TensorProto.FLOAT, 17)
    prog = run_native(m, {}, target, False, [])
    assert "mel_weight_matrix" not in str(prog)  # folded at parse time


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("args", MEL)
def test_mel_weight_matrix_run_time_edges(target, args, hip_graph):
    f = _mel_feeds(args)
    feeds = {k: f[k] for k in ("r", "lo", "hi")}
    m = model("MelWeightMatrix", feeds, {k: f[k] for k in ("m", "d")}, ["m", "d", "r", "lo", "hi"],
              TensorProto.DOUBLE, 17, output_datatype=TensorProto.DOUBLE)
    prog = run_native(m, feeds, target, hip_graph, [], tol=(1e-12, 1e-12))
    assert "mel_weight_matrix" in program_text(prog)  # native (not capturable on gpu: small temporaries)


def test_mel_weight_matrix_out_of_range():
    f = _mel_feeds((5, 9, 1000, 100.0, 500.0))
    with pytest.raises(ParseError, match=r"upper_edge_hertz 500.0 maps to spectrogram bin 5, outside the 5 bins"):
        mgx_graph.compile(model("MelWeightMatrix", {}, f, ["m", "d", "r", "lo", "hi"], TensorProto.FLOAT, 17),
                          target="ref")
    feeds = {k: f[k] for k in ("r", "lo", "hi")}
    m = model("MelWeightMatrix", feeds, {k: f[k] for k in ("m", "d")}, ["m", "d", "r", "lo", "hi"],
              TensorProto.FLOAT, 17)
    prog = mgx_graph.compile(m, target="ref")
    with pytest.raises(ExecutionError, match=r"upper_edge_hertz 500.0 maps to spectrogram bin 5, outside the 5 bins"):
        prog.run(feeds)
    ok = dict(feeds, hi=np.array(300.0, np.float32))
    np.testing.assert_allclose(prog.run(ok)[0], ort_run(m, ok)[0])


# -- the gpu kernels' data movement, with numpy standing in for CuPy and numpy.fft for the cuFFT plan -----
@pytest.fixture
def host_fft_glue(monkeypatch):
    from mgx_graph.operators import make_op, signal_gpu
    from mgx_graph.operators.gpu_lowering import table_kernel
    from mgx_graph.ir.shape import Shape

    def plan_fft(self, ctx, src, dst, n, batch, inverse):  # cuFFT semantics: the inverse is not scaled
        cdt = np.complex128 if src.dtype == np.float64 else np.complex64
        a, b = src.reshape(batch, n * 2).view(cdt), dst.reshape(batch, n * 2).view(cdt)
        b[...] = np.fft.ifft(a, axis=1) * n if inverse else np.fft.fft(a, axis=1)

    monkeypatch.setattr(signal_gpu._Plans, "fft", plan_fft)

    class Ctx:
        xp = np

    def run(name, args, **attrs):
        op = make_op(name, **attrs)
        shapes = [Shape(a.dtype.name, a.shape) for a in args]
        out_shape = op.compute_shape(shapes)
        k = table_kernel(op, shapes, out_shape)
        assert k.capturable
        out = np.full(out_shape.lens, np.nan, out_shape.np_dtype)
        k.fn(Ctx, out, args, [np.full(s.lens, np.nan, s.np_dtype) for s in k.workspace])  # workspaces start as garbage
        return out

    return run


def test_dft_gpu_glue(host_fft_glue):
    for x in (XR, XC):
        for axis in (1, 2):
            for length in (5, 8, 13):
                for inverse in (0, 1):
                    want = ort_run(dft_model(x, axis, length, inverse=inverse), {"x": x})[0]
                    got = host_fft_glue("dft", [x], axis=axis, length=length, inverse=inverse)
                    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    want = ort_run(dft_model(XR, 2, 9, onesided=1), {"x": XR})[0]
    np.testing.assert_allclose(host_fft_glue("dft", [XR], axis=2, length=9, onesided=1), want, rtol=1e-4, atol=1e-4)
    spec = np.fft.rfft(R.standard_normal((3, 10, 4)), axis=1)
    for length in (10, 9, 4, 15, 1):
        got = host_fft_glue("dft", [real_rep(spec, np.float32)], axis=1, length=length, inverse=1, onesided=1)
        np.testing.assert_allclose(got[..., 0], np.fft.irfft(spec, n=length, axis=1), rtol=1e-4, atol=1e-4)


def test_stft_gpu_glue(host_fft_glue):
    win = np.hanning(8).astype(np.float32)
    for onesided in (0, 1):
        want = ort_run(stft_model(SIG, 5, win, onesided=onesided), {"x": SIG})[0]
        got = host_fft_glue("stft", [SIG, win], frame_step=5, frame_length=8, onesided=onesided)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    x = R.standard_normal((2, 30, 2)).astype(np.float32)
    np.testing.assert_allclose(host_fft_glue("stft", [x, win], frame_step=4, frame_length=8, onesided=0),
                               stft_complex_oracle(x, 4, win), rtol=1e-4, atol=1e-4)


def test_inverse_dft_gpu_glue_of_the_suite_ramp(host_fft_glue):
    """The gpu kernel's data movement (transformed axis moved last, unscaled cuFFT inverse, the 1/n scale
    into out) on the suite's ramp: equal to the float64 inverse within float32 rounding, the Nyquist
    row's imaginary parts included."""
    got = host_fft_glue("dft", [ramp()], axis=1, length=10, inverse=1)
    np.testing.assert_allclose(got, ramp_inverse(), rtol=1e-5, atol=1e-5)
