"""onnxruntime contrib op com.microsoft::DynamicQuantizeLSTM (what onnxruntime.quantization.quantize_dynamic
makes of an LSTM) against onnxruntime CPU, and the errors for contrib ops and variants that are not
supported."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mgx_graph


def ort_oracle(model, feeds, threads):
    """onnxruntime CPU with ``threads`` intra-op threads. Its quantized LSTM quantizes the recurrent GEMM
    input in groups of ceil(batch / threads) rows, so with threads >= batch it is one row at a time."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def dq_lstm_model(T=7, B=2, I=5, H=4, direction="bidirectional", per_column=False, signed=True, seed=0, **attrs):
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
    node = helper.make_node("DynamicQuantizeLSTM", ["x", "W", "R", "B", "", "h0", "c0", "", "ws", "wz", "rs", "rz"],
                            ["y", "yh", "yc"], domain="com.microsoft", hidden_size=H, direction=direction, **attrs)
    g = helper.make_graph([node], "dq_lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, B, I])],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "yh", "yc")],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


CASES = {"bidirectional": {}, "per_column_scales": dict(per_column=True), "uint8_weights": dict(signed=False),
         "forward_batch3": dict(direction="forward", B=3), "reverse": dict(direction="reverse", per_column=True)}


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_dynamic_quantize_lstm_matches_onnxruntime(case, target, hip_graph):
    kw = CASES[case]
    model = dq_lstm_model(**kw)
    B = kw.get("B", 2)
    x = np.random.default_rng(1).normal(size=(7, B, 5)).astype(np.float32)
    want = ort_oracle(model, {"x": x}, threads=B)
    prog = mgx_graph.compile(model, target=target, hip_graph=hip_graph, min_partition_size=1)
    for _ in range(3 if hip_graph else 1):
        got = prog.run({"x": x})
        for g, w in zip(got, want):
            assert g.shape == w.shape
            # the same uint8 quantization of every GEMM input as onnxruntime, so only float rounding differs
            np.testing.assert_allclose(g, w, atol=1e-6, rtol=0)


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
