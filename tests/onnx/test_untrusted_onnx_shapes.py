"""ONNX models whose parse-time values are sized by declared shapes or attributes: EyeLike, Trilu's mask,
Dropout's mask, the default bias / states of RNN, GRU, LSTM, DynamicQuantizeLSTM and CausalConvWithState,
attention's positions and padded masks, AveragePool's divisor, MaxPool's index offsets, Resize's tables and
extrapolation mask, the window ops, MelWeightMatrix and STFT's default window.

A model of a few hundred bytes declaring a huge shape parses with little memory (tracemalloc) and no
literal over FOLD_LIMIT, and its compile is a typed error (the memory check), or, for a table that only the
host computes (MaxPool's index maps, Resize's tables), a CompileError naming the node and the sizes before
the table is made.  A valid model just over FOLD_LIMIT, whose values are then computed at run time, and a
small one, equal onnxruntime CPU (numpy, the spec's formula, for CausalConvWithState, which onnxruntime has
no kernel for); the gpu test runs the run-time cases on the gpu target.
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper as h

import mgx_graph
from mgx_graph.errors import CompileError, MgxError, ParseError
from mgx_graph.ir.fold import FOLD_LIMIT
from mgx_graph.onnx.onnx_parser import parse_onnx
from mgx_graph.onnx.parse_constant import TABLE_LIMIT
from native_util import check_outputs
from util import ort_run

HUGE = 300_000  # a dim: HUGE x HUGE elements is 9e10 (360 GB of float32)
SMALL_PEAK = 16 << 20
OVER = 2049  # OVER x OVER > FOLD_LIMIT (2048 x 2048)
R = np.random.default_rng(28)
F32 = TP.FLOAT


def model(nodes, inputs: dict, inits=(), outputs=("y",), opset=18, ms=False):
    """``inputs``: name -> (ONNX element type, dims); outputs typed by onnx's shape inference."""
    ins = [h.make_tensor_value_info(n, t, list(d)) for n, (t, d) in inputs.items()]
    g = h.make_graph(nodes, "g", ins, [h.make_tensor_value_info(o, 0, None) for o in outputs], list(inits))
    ops = [h.make_opsetid("", opset)] + ([h.make_opsetid("com.microsoft", 1)] if ms else [])
    m = h.make_model(g, opset_imports=ops, ir_version=10)
    inferred = {v.name: v.type for v in onnx.shape_inference.infer_shapes(m).graph.output}
    for o in m.graph.output:  # float where onnx infers nothing (com.microsoft ops)
        o.type.tensor_type.elem_type = (inferred[o.name].tensor_type.elem_type if o.name in inferred else 0) or F32
    return m


def scalar(name, value, t=TP.INT64, dims=()):
    return h.make_tensor(name, t, list(dims), [value] if not isinstance(value, list) else value)


def feeds_of(m) -> dict:
    out = {}
    for vi in m.graph.input:
        t = vi.type.tensor_type
        dims = [d.dim_value for d in t.shape.dim]
        dt = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
        out[vi.name] = R.uniform(-2, 2, size=dims).astype(dt) if dt.kind == "f" else np.zeros(dims, dt)
    return out


# -- the models: ``fn(size)`` with size "huge", "over" (just over FOLD_LIMIT, computed at run time) or "small"
def eyelike(size):
    R_, C = {"huge": (HUGE, HUGE), "over": (OVER, OVER + 3), "small": (3, 5)}[size]
    return model([h.make_node("EyeLike", ["x"], ["y"], k=2 if size != "small" else -1, dtype=TP.INT32)],
                 {"x": (F32, [R_, C])})


def trilu(size):
    dims = {"huge": [1, HUGE, HUGE], "over": [1, OVER, OVER + 1], "small": [2, 3, 4]}[size]
    return model([h.make_node("Trilu", ["x", "k"], ["y"], upper=int(size == "small"))], {"x": (F32, dims)},
                 [scalar("k", -2 if size != "small" else 1)])


def dropout_mask(size):
    dims = {"huge": [HUGE, HUGE], "over": [OVER, OVER], "small": [2, 3]}[size]
    return model([h.make_node("Dropout", ["x"], ["y", "mask"])], {"x": (F32, dims)}, outputs=("y", "mask"))


def _recurrent(op, gates, size):
    B = {"huge": 10 ** 9, "over": FOLD_LIMIT // 4 + 1, "small": 3}[size]
    H, I = 4, 2
    W = h.make_tensor("W", F32, [1, gates * H, I], R.uniform(-1, 1, gates * H * I).tolist())
    Rw = h.make_tensor("R", F32, [1, gates * H, H], R.uniform(-1, 1, gates * H * H).tolist())
    return model([h.make_node(op, ["x", "W", "R"], ["y", "y_h"], hidden_size=H)], {"x": (F32, [2, B, I])},
                 [W, Rw], outputs=("y", "y_h"))


def gru_defaults(size):
    return _recurrent("GRU", 3, size)


def lstm_defaults(size):
    return _recurrent("LSTM", 4, size)


def attention_mask_pad(size):
    """Causal attention with a mask: the huge one's mask is padded to T keys (onnxruntime wants T)."""
    S, T = {"huge": (10 ** 5, 10 ** 5), "small": (3, 5)}[size]
    return model([h.make_node("Attention", ["q", "k", "v", "mask"], ["y"], is_causal=1)],
                 {"q": (F32, [1, 1, S, 8]), "k": (F32, [1, 1, T, 8]), "v": (F32, [1, 1, T, 8]),
                  "mask": (F32, [S, 2 if size == "huge" else T])}, opset=23)


def mha_positions(size):
    B, S = {"huge": (10 ** 5, 10 ** 5), "small": (2, 3)}[size]
    return model([h.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], domain="com.microsoft", num_heads=2)],
                 {n: (F32, [B, S, 8]) for n in "qkv"}, ms=True)


def avgpool(size):
    dims = {"huge": [1, 1, HUGE, HUGE // 3], "over": [1, 2, OVER + 1, OVER + 1], "small": [1, 2, 5, 6]}[size]
    return model([h.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              strides=[1, 1] if size != "small" else [2, 2], ceil_mode=int(size == "small"))],
                 {"x": (F32, dims)})


def avgpool_1d(size):
    n = {"huge": 10 ** 11, "over": FOLD_LIMIT + 7, "small": 11}[size]
    return model([h.make_node("AveragePool", ["x"], ["y"], kernel_shape=[4], pads=[3, 2], dilations=[2],
                              ceil_mode=1)], {"x": (F32, [1, 1, n])}, opset=19)


def maxpool_offsets(size):
    N = {"huge": HUGE, "over": OVER, "small": 2}[size]
    return model([h.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2], strides=[2])],
                 {"x": (F32, [N, N, 4])}, outputs=("y", "i"))


def resize_mask(size):
    n = {"huge": 10 ** 5, "over": 2100, "small": 7}[size]
    roi = h.make_tensor("roi", F32, [8], [0, 0, -0.5, -0.25, 1, 1, 1.5, 1.25])
    return model([h.make_node("Resize", ["x", "roi", "", "sizes"], ["y"], mode="linear",
                              coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=7.0)],
                 {"x": (F32, [1, 1, 3, 2])}, [roi, scalar("sizes", [1, 1, n, n], dims=[4])])


def window(size):
    n = {"huge": 10 ** 10, "over": FOLD_LIMIT + 3, "small": 10}[size]
    return model([h.make_node("BlackmanWindow", ["n"], ["y"], periodic=0)], {}, [scalar("n", n)], opset=17)


def mel(size):
    M, n = {"huge": (10 ** 5, 10 ** 6), "over": (1025, 8192), "small": (8, 64)}[size]
    inits = [scalar("M", M), scalar("n", n), scalar("sr", 16000), scalar("lo", 0.0, F32), scalar("hi", 7900.0, F32)]
    return model([h.make_node("MelWeightMatrix", ["M", "n", "sr", "lo", "hi"], ["y"])], {}, inits, opset=17)


def stft_window(size):
    L = {"huge": 10 ** 10, "small": 16}[size]
    return model([h.make_node("STFT", ["s", "step", "", "n"], ["y"])], {"s": (F32, [1, L, 1])},
                 [scalar("step", 4), scalar("n", L if size == "huge" else 8)], opset=17)


def causal_conv(size):
    B, C, K = {"huge": (10 ** 5, 10 ** 5, 64), "over": (1, FOLD_LIMIT // 3 + 1, 4), "small": (2, 3, 4)}[size]
    return model([h.make_node("CausalConvWithState", ["x", "w"], ["y", "state"])],
                 {"x": (F32, [B, C, 2]), "w": (F32, [C, 1, K])}, outputs=("y", "state"), opset=27)


def conv_oracle(feeds):
    x, w = feeds["x"], feeds["w"]
    B, C, L = x.shape
    K = w.shape[2]
    padded = np.concatenate([np.zeros((B, C, K - 1), x.dtype), x], axis=2).astype(np.float64)
    y = sum(padded[:, :, i:i + L] * w[None, :, 0, i, None] for i in range(K))
    return [y.astype(x.dtype), padded[:, :, L:].astype(x.dtype)]


HUGE_PARSE = {"eyelike": eyelike, "trilu": trilu, "dropout_mask": dropout_mask, "gru_defaults": gru_defaults,
              "lstm_defaults": lstm_defaults, "attention_mask_pad": attention_mask_pad, "mha_positions": mha_positions,
              "avgpool": avgpool, "avgpool_1d": avgpool_1d, "maxpool_offsets": maxpool_offsets,
              "resize_mask": resize_mask, "window": window, "mel": mel, "stft_window": stft_window,
              "causal_conv": causal_conv}
OVER_CASES = ["eyelike", "trilu", "dropout_mask", "gru_defaults", "lstm_defaults", "avgpool", "avgpool_1d",
              "maxpool_offsets", "resize_mask", "window", "mel", "causal_conv"]
NO_ORT = {"causal_conv": conv_oracle}  # onnxruntime CPU has no CausalConvWithState kernel


def parse_small(m):
    """The program of ``m`` parsed under tracemalloc: asserts a small peak and no literal over FOLD_LIMIT."""
    data = m.SerializeToString()
    assert len(data) < 1000, len(data)
    tracemalloc.start()
    try:
        prog = parse_onnx(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < SMALL_PEAK, peak
    literals = [i.shape.elements() for mod in prog.module_order() for i in mod if i.op.name == "@literal"]
    assert max(literals, default=0) <= FOLD_LIMIT, literals
    return prog


@pytest.mark.parametrize("case", sorted(HUGE_PARSE))
def test_a_huge_declared_shape_parses_without_allocating_it(case):
    parse_small(HUGE_PARSE[case]("huge"))


@pytest.mark.parametrize("case", ["eyelike", "trilu", "dropout_mask", "avgpool", "maxpool_offsets"])
def test_a_huge_declared_shape_compiles_to_the_memory_check(case):
    with pytest.raises(CompileError, match="the program needs"):
        mgx_graph.compile(HUGE_PARSE[case]("huge"), target="ref")


def _expect(case, m, feeds):
    return NO_ORT[case](feeds) if case in NO_ORT else ort_run(m, feeds)


def _check(case, size, target):
    m = HUGE_PARSE[case](size)
    feeds = feeds_of(m)
    prog = mgx_graph.compile(m, target=target)
    check_outputs(prog.run(feeds), _expect(case, m, feeds), tol=(1e-5, 1e-5), what=f"{case} {size}")
    return prog


@pytest.mark.parametrize("case", sorted(HUGE_PARSE))
def test_small_models_equal_onnxruntime(case):
    _check(case, "small", "ref")


@pytest.mark.parametrize("case", OVER_CASES)
def test_values_computed_at_run_time_equal_onnxruntime(case):
    prog = _check(case, "over", "ref")
    literals = [i.shape.elements() for i in prog.program.get_main_module() if i.op.name == "@literal"]
    assert max(literals, default=0) <= FOLD_LIMIT, literals


@pytest.mark.gpu
@pytest.mark.parametrize("case", OVER_CASES)
def test_values_computed_at_run_time_equal_onnxruntime_on_gpu(gpu_target, case):
    _check(case, "over", gpu_target)


# -- host tables refused before they are made; crafted attributes that made numpy allocate or raise
def _refused(m, error, *says):
    with pytest.raises(error) as e:
        parse_small_or_raise(m)
    for s in says:
        assert s in str(e.value), str(e.value)


def parse_small_or_raise(m):
    tracemalloc.start()
    try:
        parse_onnx(m.SerializeToString())
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < SMALL_PEAK, peak


def test_maxpool_index_maps_over_the_table_limit_are_refused():
    m = model([h.make_node("MaxPool", ["x"], ["y", "i"], name="pool", kernel_shape=[2, 2])],
              {"x": (F32, [1, 1, HUGE, HUGE])}, outputs=("y", "i"))
    _refused(m, CompileError, "node 'pool' (MaxPool)", "kernel_shape [2, 2]", str(TABLE_LIMIT))


@pytest.mark.parametrize("sizes,scales,mode,antialias,says", [
    (None, [1, 1, 1e9, 1], "nearest", 0, "1 taps x 1000000000 output positions"),
    ([1, 1, 1], None, "linear", 1, "taps x 1 output positions"),  # a window of 4e9 taps: 1 / (1 / 1e9)
    ([1, 1, 0], None, "linear", 1, "inf"),                         # scale 0: an infinite window
])
def test_resize_tables_over_the_table_limit_are_refused(sizes, scales, mode, antialias, says):
    n = 10 ** 9 if sizes == [1, 1, 1] else 8
    dims = [1, 1, 1, 1] if scales else [1, 1, n]
    names = ["x", "", "scales" if scales else "", "sizes" if sizes else ""]
    inits = [h.make_tensor("scales", F32, [4], scales)] if scales else [scalar("sizes", sizes, dims=[3])]
    m = model([h.make_node("Resize", names, ["y"], name="rs", mode=mode, antialias=antialias)],
              {"x": (F32, dims)}, inits)
    _refused(m, CompileError, "node 'rs' (Resize)", says, "TABLE_LIMIT")


def test_a_pooling_kernel_over_max_pool_taps_is_refused_and_one_at_the_bound_runs():
    """kernel 1e9 over one element (pads 1e9 - 1: valid ONNX) is refused before the op pads its input to the
    kernel's extent; kernel MAX_POOL_TAPS with strides of as much gives onnxruntime's two windows."""
    from mgx_graph.errors import UnsupportedOpError
    from mgx_graph.onnx.parse_spatial import MAX_POOL_TAPS

    def pool(k, name="ap"):
        return model([h.make_node("AveragePool", ["x"], ["y"], name=name, kernel_shape=[k], strides=[k],
                                  pads=[k - 1, k - 1])], {"x": (F32, [1, 1, 1])})

    _refused(pool(10 ** 9), UnsupportedOpError, "node 'ap'", "kernel_shape [1000000000]", str(MAX_POOL_TAPS))
    m = pool(MAX_POOL_TAPS)
    parse_small(m)
    feeds = {"x": np.array([[[3.0]]], np.float32)}
    check_outputs(mgx_graph.compile(m, target="ref").run(feeds), ort_run(m, feeds))


@pytest.mark.parametrize("build,error,says", [
    (lambda: model([h.make_node("ConstantOfShape", ["s"], ["y"], name="c")], {}, [scalar("s", [2, -3], dims=[2])]),
     ParseError, "node 'c' (ConstantOfShape): a value of shape [2, -3]"),
    (lambda: model([h.make_node("DynamicQuantizeLSTM", ["x", "w", "r", "", "", "", "", "", "ws", "", "rs"], ["y"],
                                name="dq", domain="com.microsoft", hidden_size=10 ** 9)],
                   {"x": (F32, [1, 2, 3]), "w": (TP.INT8, [1, 3, 16]), "r": (TP.INT8, [1, 4, 16]),
                    "ws": (F32, [1]), "rs": (F32, [1])}, ms=True),
     ParseError, "'hidden_size' = 1000000000 must be an int >= 1 matching R int8[1,4,16]"),
])
def test_crafted_attributes_are_typed_errors(build, error, says):
    with pytest.raises(MgxError) as e:
        parse_small_or_raise(build())
    assert isinstance(e.value, error) and says in str(e.value), repr(e.value)
