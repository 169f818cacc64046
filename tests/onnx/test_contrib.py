"""onnxruntime contrib op com.microsoft::DynamicQuantizeLSTM (what onnxruntime.quantization.quantize_dynamic
makes of an LSTM) against onnxruntime CPU, and the errors for contrib ops and variants that are not
supported."""
import os
import types

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mgx_graph
from native_util import kernels


def ort_oracle(model, feeds, threads):
    """onnxruntime CPU with ``threads`` intra-op threads. Its quantized LSTM quantizes the recurrent GEMM
    input in groups of ceil(batch / threads) rows, so with threads >= batch it is one row at a time."""
    import onnxruntime as ort

    from mgx_graph.models.oracle import ort_cpu_options

    so = ort_cpu_options()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def dq_lstm_model(T=7, B=2, I=5, H=4, direction="bidirectional", per_column=False, signed=True, seed=0,
                  zero_points=False, **attrs):
    """A one-node DynamicQuantizeLSTM model with random int8 (``signed``) or uint8 weights, scales per
    direction or ``per_column``, zero points 0 or (``zero_points``) random ones."""
    rng = np.random.default_rng(seed)
    D = 2 if direction == "bidirectional" else 1
    wdt = np.int8 if signed else np.uint8
    lo, hi = (-128, 128) if signed else (0, 256)
    sc = (D, 4 * H) if per_column else (D,)
    inits = {"W": rng.integers(lo, hi, (D, I, 4 * H)).astype(wdt), "R": rng.integers(lo, hi, (D, H, 4 * H)).astype(wdt),
             "B": rng.normal(size=(D, 8 * H)).astype(np.float32) * 0.1,
             "ws": rng.uniform(0.002, 0.01, sc).astype(np.float32), "wz": np.zeros(sc, wdt),  # onnxruntime: zp 0
             "rs": rng.uniform(0.002, 0.01, sc).astype(np.float32), "rz": np.zeros(sc, wdt),
             "h0": rng.normal(size=(D, B, H)).astype(np.float32) * 0.5,
             "c0": rng.normal(size=(D, B, H)).astype(np.float32) * 0.5}
    if zero_points:
        inits["wz"] = rng.integers(lo // 4, hi // 4, sc).astype(wdt) + (0 if signed else wdt(96))
        inits["rz"] = rng.integers(lo // 4, hi // 4, sc).astype(wdt) + (0 if signed else wdt(96))
    node = helper.make_node("DynamicQuantizeLSTM", ["x", "W", "R", "B", "", "h0", "c0", "", "ws", "wz", "rs", "rz"],
                            ["y", "yh", "yc"], domain="com.microsoft", hidden_size=H, direction=direction, **attrs)
    g = helper.make_graph([node], "dq_lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, B, I])],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "yh", "yc")],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


CASES = {"bidirectional": {}, "per_column_scales": dict(per_column=True), "uint8_weights": dict(signed=False),
         "forward_batch3": dict(direction="forward", B=3), "reverse": dict(direction="reverse", per_column=True),
         "forward_batch1": dict(direction="forward", B=1), "reverse_batch1_uint8": dict(direction="reverse", B=1,
                                                                                       signed=False),
         "bidirectional_batch1_wide": dict(B=1, I=37, H=40, T=5),  # more hidden units than one block's 32
         "zero_points": dict(zero_points=True),  # onnxruntime takes nonzero zero points only per direction
         "zero_points_uint8_batch1": dict(zero_points=True, signed=False, B=1, direction="forward")}


def case_feeds(kw):
    T, B, I = kw.get("T", 7), kw.get("B", 2), kw.get("I", 5)
    return {"x": np.random.default_rng(1).normal(size=(T, B, I)).astype(np.float32)}


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_dynamic_quantize_lstm_matches_onnxruntime(case, target, hip_graph):
    kw = CASES[case]
    model = dq_lstm_model(**kw)
    feeds = case_feeds(kw)
    want = ort_oracle(model, feeds, threads=kw.get("B", 2))
    prog = mgx_graph.compile(model, target=target, hip_graph=hip_graph, min_partition_size=1)
    for _ in range(3 if hip_graph else 1):
        got = prog.run(feeds)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            # the same uint8 quantization of every GEMM input as onnxruntime, so only float rounding differs
            np.testing.assert_allclose(g, w, atol=1e-6, rtol=0)
    assert prog.stats()["host_fallback_instructions"] == 0
    if hip_graph:
        assert prog.stats()["fallbacks"] == 0
    if target == "gpu":
        (k,) = [k for name, k in kernels(prog) if name == "dynamic_quantize_lstm"]
        assert k.label.startswith("dq_lstm.cu") and k.capturable


@pytest.mark.parametrize("case", sorted(CASES))
def test_dynamic_quantize_lstm_in_fp16_program_matches_onnxruntime(case, target):
    """fp16 compile of Y + z (z a second input) with Y_h, Y_c returned as they are: the op keeps float32
    (X converted back from half), Y meets z in half.  Against onnxruntime float32 on X and z rounded to
    half, Y_h / Y_c are the float32 op's (1e-6) and Y + z is within 0.01 (a few float16 spacings at
    |Y + z| < 4); against onnxruntime on the unrounded X, within 0.05: rounding X to half can move an
    element of X by one uint8 quantization step, which moves a gate's pre-activation by about
    x_scale * w_scale * |w| (up to ~0.03 here), and the outputs pass through sigmoid / tanh."""
    kw = CASES[case]
    model = dq_lstm_model(**kw)
    T, B, D, H = kw.get("T", 7), kw.get("B", 2), 1 if "direction" in kw else 2, kw.get("H", 4)
    g = model.graph
    g.input.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [T, D, B, H]))
    g.node.append(helper.make_node("Add", ["y", "z"], ["s"]))
    g.output[0].CopyFrom(helper.make_tensor_value_info("s", TensorProto.FLOAT, None))
    feeds = dict(case_feeds(kw), z=np.random.default_rng(2).normal(size=(T, D, B, H)).astype(np.float32))
    half = {k: v.astype(np.float16) for k, v in feeds.items()}
    prog = mgx_graph.compile(model, target=target, fp16=True, min_partition_size=1)
    got = prog.run(half)
    assert [a.dtype for a in got] == [np.float16, np.float32, np.float32]
    want = ort_oracle(model, {k: v.astype(np.float32) for k, v in half.items()}, threads=B)
    np.testing.assert_allclose(got[0].astype(np.float32), want[0], atol=0.01, rtol=0)
    for a, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(a, w, atol=1e-6, rtol=0)
    for a, w in zip(got, ort_oracle(model, feeds, threads=B)):
        np.testing.assert_allclose(a.astype(np.float32), w, atol=0.05, rtol=0)


def test_dynamic_quantize_lstm_variant_not_supported():
    model = dq_lstm_model(clip=3.0)
    with pytest.raises(mgx_graph.UnsupportedOpError, match=r"DynamicQuantizeLSTM.*clip") as e:
        mgx_graph.compile(model, target="ref")
    assert e.value.domain == "com.microsoft"


def test_other_contrib_op_names_op_and_domain():
    model = dq_lstm_model()
    model.graph.node[0].op_type = "QAttention"
    with pytest.raises(mgx_graph.UnsupportedOpError, match=r"com\.microsoft") as e:
        mgx_graph.compile(model, target="ref")
    assert (e.value.op_type, e.value.domain) == ("QAttention", "com.microsoft")


# -- dq_lstm.cu, built as host C++ (tests/cu_host.py): the gpu kernels' arithmetic without a GPU ------

@pytest.fixture
def host_dq_lstm_cu(monkeypatch):
    import cu_host
    from mgx_graph.operators import dq_lstm, lstm_gpu

    if not cu_host.available():
        pytest.skip("needs g++")
    lib = cu_host.build(os.path.join(os.path.dirname(dq_lstm.__file__), "dq_lstm.cu"))

    class Module:
        def get_function(self, name):
            return lambda grid, block, args: cu_host.launch(lib, name, *args)

    monkeypatch.setattr(lstm_gpu, "dq_lstm_module", Module)


def run_gpu_kernel_on_host(model, x, transposed_x=False):
    """The gpu kernel of the model's one dynamic_quantize_lstm on numpy arrays (the parser's inputs:
    initializers, and zeros for omitted zero points); ``transposed_x``: X given as a non-standard view."""
    from mgx_graph.operators import make_op
    from mgx_graph.operators.gpu_lowering import table_kernel
    from mgx_graph.ir.shape import Shape

    node = model.graph.node[0]
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    op = make_op("dynamic_quantize_lstm", hidden_size=attrs["hidden_size"], direction=attrs["direction"].decode())
    if transposed_x:  # the same values, stored [B, T, I] and seen as [T, B, I]
        x = np.ascontiguousarray(x.transpose(1, 0, 2)).transpose(1, 0, 2)
    args = [x] + [inits[n] for n in ("W", "R", "B", "h0", "c0", "ws", "wz", "rs", "rz")]
    shapes = [Shape(a.dtype.name, a.shape, [s // a.itemsize for s in a.strides]) for a in args]
    out_shapes = op.compute_shape(shapes)
    out = tuple(np.full(s.lens, np.nan, np.float32) for s in out_shapes)
    k = table_kernel(op, shapes, out_shapes)
    ws = [np.full(s.lens, 7, s.np_dtype) for s in k.workspace]  # garbage: the kernels must write before reading
    ctx = types.SimpleNamespace(xp=np)
    k.fn(ctx, out, args, ws)
    return out, k.launches, k.capturable


@pytest.mark.parametrize("case", sorted(CASES))
def test_dq_lstm_cu_matches_onnxruntime(case, host_dq_lstm_cu):
    kw = CASES[case]
    model = dq_lstm_model(**kw)
    x = case_feeds(kw)["x"]
    want = ort_oracle(model, {"x": x}, threads=kw.get("B", 2))
    got, launches, capturable = run_gpu_kernel_on_host(model, x)
    assert capturable and launches == 2 + x.shape[0]  # quantize X, the input GEMM, one kernel per step
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=1e-6, rtol=0)


def test_dq_lstm_cu_copies_a_non_standard_input(host_dq_lstm_cu):
    model = dq_lstm_model(B=3, direction="reverse")
    x = case_feeds(dict(B=3))["x"]
    want = ort_oracle(model, {"x": x}, threads=3)
    got, launches, _ = run_gpu_kernel_on_host(model, x, transposed_x=True)
    assert launches == 1 + 2 + x.shape[0]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-6, rtol=0)


def test_dynamic_quantize_lstm_type_errors():
    from mgx_graph.operators import make_op
    from mgx_graph.ir.shape import Shape

    op = make_op("dynamic_quantize_lstm", hidden_size=4, direction="forward")
    good = [Shape("float32", [3, 2, 5]), Shape("int8", [1, 5, 16]), Shape("int8", [1, 4, 16]),
            Shape("float32", [1, 32]), Shape("float32", [1, 2, 4]), Shape("float32", [1, 2, 4]),
            Shape("float32", [1]), Shape("int8", [1]), Shape("float32", [1, 16]), Shape("int8", [1, 16])]
    assert [list(s.lens) for s in op.compute_shape(good)] == [[3, 1, 2, 4], [1, 2, 4], [1, 2, 4]]
    bad = {2: (Shape("uint8", [1, 4, 16]), r"W and R must both be int8 or both uint8, got int8 and uint8"),
           3: (Shape("float32", [1, 16]), r"B must be float32 \[1, 32\], got float32 \[1, 16\]"),
           6: (Shape("float32", [2]), r"W_scale must be float32 \[1\] or \[1, 16\], got float32 \[2\]"),
           9: (Shape("uint8", [1]), r"R_zero_point must be int8 \[1\] or \[1, 16\], got uint8 \[1\]"),
           0: (Shape("float16", [3, 2, 5]), r"X must be float32")}
    for k, (shape, msg) in bad.items():
        with pytest.raises(mgx_graph.ShapeError, match=msg):
            op.compute_shape(good[:k] + [shape] + good[k + 1:])
    with pytest.raises(mgx_graph.ShapeError, match=r"expects 10 inputs"):
        op.compute_shape(good[:9])


def test_ddddocr_old_has_no_host_instruction(target, model_cache):
    """The real model whose DynamicQuantizeLSTM was its one host instruction on the gpu target (on ref,
    host_instructions reports what the gpu build would run on the host); compiled, not run."""
    from mgx_graph.models.pypi import model_path

    try:
        path = model_path("ddddocr_old", model_cache)
    except RuntimeError as e:
        pytest.skip(str(e))
    prog = mgx_graph.compile(path, target=target, input_dims={"input1": [1, 1, 64, 160]})
    assert "dynamic_quantize_lstm" in prog.print()
    assert prog.stats()["host_fallback_instructions"] == 0, prog.host_instructions


def test_dq_lstm_cu_compiles_for_the_h200():
    """dq_lstm.cu through nvcc (sm_90, no FMA contraction, as the gpu target compiles it), where nvcc is
    installed: a kernel that the device compiler rejects fails here before any GPU run."""
    import shutil
    import subprocess

    from mgx_graph.operators import dq_lstm

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc")
    src = os.path.join(os.path.dirname(dq_lstm.__file__), "dq_lstm.cu")
    r = subprocess.run([nvcc, "-arch=sm_90", "--fmad=false", "-ptx", "-o", os.devnull, src],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
