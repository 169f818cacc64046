"""Native ONNX Attention (opsets 23-24: grouped heads, masks, is_causal, softcap, scale, past / present KV,
qk_matmul_output_mode, softmax_precision, nonpad_kv_seqlen) against onnxruntime CPU, on each target,
eager and in a graph."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import mgx_graph
from mgx_graph.errors import ParseError, UnsupportedOpError
import attn_oracle
from native_util import run_native
from util import make_model

R = np.random.default_rng(11)


def f(*shape, dtype=np.float32):
    return R.uniform(-1.5, 1.5, size=shape).astype(dtype)


def _model(inputs, outputs=("y",), opset=23, **attrs):
    names = [n if n in inputs else "" for n in ("q", "k", "v", "mask", "pk", "pv", "nonpad")]
    while names and names[-1] == "":
        names.pop()
    node = helper.make_node("Attention", names, list(outputs), **attrs)
    m = make_model([node], inputs, [o for o in outputs if o], opset=opset)
    m.ir_version = 10
    return m


def _qkv(B=2, N=4, Nkv=2, S=3, T=5, H=8, Hv=6, rank=4, dtype=np.float32):
    if rank == 4:
        return {"q": f(B, N, S, H, dtype=dtype), "k": f(B, Nkv, T, H, dtype=dtype), "v": f(B, Nkv, T, Hv, dtype=dtype)}
    return {"q": f(B, S, N * H, dtype=dtype), "k": f(B, T, Nkv * H, dtype=dtype), "v": f(B, T, Nkv * Hv, dtype=dtype)}


CASES = {
    "plain": ({}, {}),
    "mha": ({"Nkv": 4}, {}),
    "scaled": ({}, {"scale": 0.05}),
    "causal": ({}, {"is_causal": 1}),
    "softcap": ({}, {"softcap": 1.5}),
    "causal_softcap_scale": ({"S": 5}, {"is_causal": 1, "softcap": 2.0, "scale": 0.2}),
}


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("rank", [4, 3])
@pytest.mark.parametrize("case", list(CASES))
def test_attention(target, hip_graph, rank, case):
    dims, attrs = CASES[case]
    feeds = _qkv(rank=rank, **dims)
    if rank == 3:
        attrs = dict(attrs, q_num_heads=4, kv_num_heads=dims.get("Nkv", 2))
    run_native(_model(feeds, **attrs), feeds, target, hip_graph, ["dot", "softmax"], tol=(1e-4, 1e-5))


@pytest.mark.parametrize("mask_shape,dtype", [((3, 5), np.float32), ((2, 1, 3, 5), np.float32),
                                              ((2, 4, 3, 5), np.float32), ((3, 5), np.bool_),
                                              ((2, 4, 3, 5), np.bool_), ((4, 3, 5), np.float32)])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_mask(target, mask_shape, dtype, causal):
    feeds = _qkv()
    if dtype == np.bool_:
        mask = R.uniform(size=mask_shape) > 0.3
        mask[..., 0] = True  # every row sees a key (onnxruntime's fully masked rows differ by version)
    else:
        mask = f(*mask_shape)
    feeds["mask"] = mask
    run_native(_model(feeds, is_causal=causal), feeds, target, False, ["dot", "softmax"], tol=(1e-4, 1e-5))


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_past_present(target, hip_graph, causal):
    feeds = _qkv(S=2, T=2)
    feeds.update(pk=f(2, 2, 4, 8), pv=f(2, 2, 4, 6), mask=f(2, 6))
    model = _model(feeds, outputs=("y", "present_key", "present_value"), is_causal=causal)
    run_native(model, feeds, target, hip_graph, ["dot", "concat"], tol=(1e-4, 1e-5))


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_qk_output(target, mode):
    feeds = _qkv()
    feeds["mask"] = f(3, 5)
    model = _model(feeds, outputs=("y", "", "", "qk"), qk_matmul_output_mode=mode, softcap=(2.0 if mode == 1 else 0.0))
    run_native(model, feeds, target, False, ["dot"], tol=(1e-4, 1e-5))


def test_attention_float16(target):
    feeds = _qkv(dtype=np.float16)
    run_native(_model(feeds, is_causal=1), feeds, target, False, ["dot"], tol=(5e-3, 5e-3))


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("B,N,S,T,H", [(2, 3, 4, 6, 8), (1, 2, 16, 16, 64), (1, 2, 5, 40, 32)])
def test_attention_causal_float16_against_float64(target, hip_graph, B, N, S, T, H):
    """is_causal in float16 (the first shapes are the node suite's test_attention_4d_causal_fp16: fewer
    queries than keys, query s sees keys 0..s) against the float64 oracle, within the float16 rounding
    of the scaled Q and K, the scores and the probabilities (about 1e-3 here)."""
    feeds = _qkv(B=B, N=N, Nkv=N, S=S, T=T, H=H, Hv=H, dtype=np.float16)
    want = attn_oracle.attention(feeds["q"], feeds["k"], feeds["v"], 1 / np.sqrt(H),
                                 visible=np.tril(np.ones((S, T), bool)))
    run_native(_model(feeds, is_causal=1), feeds, target, hip_graph, ["dot"], tol=(3e-3, 3e-3),
               expect=[want.astype(np.float16)])


def test_attention_nonpad_kv_seqlen(target):
    """opset 24 external cache: keys at or past nonpad_kv_seqlen[b] are hidden; with is_causal query s of
    batch b sees keys j <= s + nonpad[b] - S (oracle: numpy, the spec's function body)."""
    feeds = _qkv(S=2, T=6, Nkv=4)
    feeds["nonpad"] = np.array([4, 6], np.int64)
    prog = mgx_graph.compile(_model(feeds, opset=24, is_causal=1), target=target)
    got = prog.run(feeds)[0]
    q, k, v = feeds["q"], feeds["k"], feeds["v"]
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(8)
    i, j = np.arange(2)[:, None], np.arange(6)[None]
    allowed = (j[None] <= i[None] + (feeds["nonpad"] - 2)[:, None, None]) & (j[None] < feeds["nonpad"][:, None, None])
    s = np.where(allowed[:, None], s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(got, (e / e.sum(-1, keepdims=True)) @ v, rtol=1e-4, atol=1e-5)
    assert "onnx_op" not in prog.print()


def test_attention_fully_masked_row_is_zero(target):
    """A query row with every key masked gives Y = 0 (the spec), not NaN (oracle: numpy)."""
    feeds = _qkv(S=2, T=3)
    feeds["mask"] = np.array([[False, False, False], [True, False, True]])
    prog = mgx_graph.compile(_model(feeds), target=target)
    got = prog.run(feeds)[0]
    assert np.all(got[:, :, 0] == 0)
    q, k, v = feeds["q"], np.repeat(feeds["k"], 2, axis=1), np.repeat(feeds["v"], 2, axis=1)
    s = (q[:, :, 1:] @ k.transpose(0, 1, 3, 2) / np.sqrt(8))[..., [0, 2]]
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(got[:, :, 1:], (e / e.sum(-1, keepdims=True)) @ v[:, :, [0, 2]], rtol=1e-4, atol=1e-5)


def test_attention_errors():
    feeds = _qkv()
    with pytest.raises(UnsupportedOpError, match="qk_matmul_output_mode=5"):
        mgx_graph.compile(_model(feeds, outputs=("y", "", "", "qk"), qk_matmul_output_mode=5), target="ref")
    bad = dict(feeds, k=f(2, 3, 5, 8), v=f(2, 3, 5, 6))
    with pytest.raises(ParseError, match="do not match Q"):
        mgx_graph.compile(_model(bad), target="ref")
    three = _qkv(rank=3)
    with pytest.raises(ParseError, match="'q_num_heads' = 5 dividing"):
        mgx_graph.compile(_model(three, q_num_heads=5, kv_num_heads=2), target="ref")
    feeds["mask"] = f(3, 7)
    with pytest.raises(ParseError, match="attn_mask"):
        mgx_graph.compile(_model(feeds), target="ref")
