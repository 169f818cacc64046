"""com.microsoft::MoE, the mixture-of-experts layer onnxruntime-genai's builder writes for GPT-OSS and the
other MoE decoders, composed from IR ops (so every target runs it with the kernels it has).

Inputs: ``input`` [R, H] or [B, S, H], ``router_probs`` [R, E] (the router's logits), ``fc1_experts_weights``
[E, N1, H] and ``fc1_experts_bias`` [E, N1], ``fc2_experts_weights`` [E, H, I] and ``fc2_experts_bias``
[E, H]; N1 is 2 I for ``swiglu`` (gate and linear halves, interleaved with ``swiglu_fusion=1``, one after
the other with ``swiglu_fusion=2``), I for the other activations (``silu``, ``gelu`` (its tanh
approximation, as onnxruntime's MoE kernels compute it), ``relu``, ``identity``).  Each row takes the ``k``
experts of its largest logits, weighted by the softmax over those k (``normalize_routing_weights=1``) or by
the softmax over all E taken at those k; the output is the weighted sum of ``fc2(act(fc1(x)))`` of its
experts.  SwiGLU, as onnxruntime computes it: ``gate = min(gate, limit)``,
``linear = clip(linear, -limit, limit)``, ``gate * sigmoid(alpha * gate) * (linear + beta)``.

Two compositions, equal in value: with few rows (R k <= E: decode) each row's k experts' weights are
gathered and multiplied as a batch of GEMVs, reading only the chosen experts; with more rows (a prompt)
every expert runs over every row and the routing weights, zero outside each row's top k, sum them: no
per-row copies of the weights.  Refused with an UnsupportedOpError naming the attribute: separate gate
weights (``fc3``, ``swiglu_fusion=0``), ``use_sparse_mixer``.
"""
from __future__ import annotations

import numpy as np

from .op_parser import attr, decode, parser
from .parse_contrib import MS, pad_inputs, unsupported

ACTIVATIONS = ("swiglu", "silu", "gelu", "relu", "identity")


def _scalar(p, m, value, like, ndim: int):
    """A literal of ``value`` in ``like``'s element type, shaped to broadcast against rank ``ndim``."""
    return p.lit(m, np.full([1] * ndim, value, dtype=like.shape.np_dtype))


def _activation(p, m, h, axis: int, act: str, fusion: int, limit, alpha: float, beta: float):
    """The expert activation of ``h`` along ``axis`` (N1 there; I after a SwiGLU)."""
    nd = h.shape.ndim
    if act == "relu":
        return p.add(m, "relu", [h])
    if act == "gelu":
        return p.add(m, "gelu", [h], approximate="tanh")  # as onnxruntime's MoE kernels compute it
    if act == "silu":
        return p.add(m, "mul", [h, p.add(m, "sigmoid", [h])])
    if act == "identity":
        return h
    n1 = h.shape.lens[axis]
    if fusion == 1:
        gate = p.add(m, "slice", [h], axes=[axis], starts=[0], ends=[n1], steps=[2])
        lin = p.add(m, "slice", [h], axes=[axis], starts=[1], ends=[n1], steps=[2])
    else:
        gate = p.add(m, "slice", [h], axes=[axis], starts=[0], ends=[n1 // 2])
        lin = p.add(m, "slice", [h], axes=[axis], starts=[n1 // 2], ends=[n1])
    if limit is not None:
        gate = p.add(m, "min", [gate, _scalar(p, m, limit, h, nd)])
        lin = p.add(m, "max", [p.add(m, "min", [lin, _scalar(p, m, limit, h, nd)]), _scalar(p, m, -limit, h, nd)])
    glu = p.add(m, "mul", [gate, p.add(m, "sigmoid", [p.add(m, "mul", [gate, _scalar(p, m, alpha, h, nd)])])])
    return p.add(m, "mul", [glu, p.add(m, "add", [lin, _scalar(p, m, beta, h, nd)])])


def _routing(p, m, router, k: int, normalize: int):
    """(weights [R, k], expert ids [R, k]) of each row's top ``k`` router logits; among equal logits the
    higher expert id is taken first, as onnxruntime's kernels take it (a top k over the experts in reverse
    order, whose ties keep the lower position)."""
    E = router.shape.lens[-1]
    reverse = p.lit(m, np.arange(E - 1, -1, -1, dtype=np.int64))
    t = p.add(m, "topk", [p.add(m, "gather", [router, reverse], axis=1)], k=k, axis=-1, largest=1, sorted=1)
    vals, pos = (p.add(m, "get_tuple_elem", [t], index=i) for i in (0, 1))
    idx = p.add(m, "sub", [p.lit(m, np.full((1, 1), E - 1, np.int64)), pos])
    if normalize:
        return p.add(m, "softmax", [vals], axis=-1), idx
    return p.add(m, "gather_elements", [p.add(m, "softmax", [router], axis=-1), idx], axis=-1), idx


def _experts_of_rows(p, m, x, w, idx, spec):
    """Few rows: each row's k experts, their weights gathered ([R, k, ...]); ``w`` [R, k]."""
    R, H = x.shape.lens
    k = idx.shape.lens[1]
    w1, b1, w2, b2 = spec["weights"]
    h = p.add(m, "dot", [p.add(m, "gather", [w1, idx], axis=0), p.reshape(m, x, [R, 1, H, 1])])
    h = p.reshape(m, h, [R, k, w1.shape.lens[1]])
    if b1 is not None:
        h = p.add(m, "add", [h, p.add(m, "gather", [b1, idx], axis=0)])
    a = _activation(p, m, h, 2, *spec["act"])
    inner = a.shape.lens[2]
    o = p.add(m, "dot", [p.add(m, "gather", [w2, idx], axis=0), p.reshape(m, p.contiguous(m, a), [R, k, inner, 1])])
    o = p.reshape(m, o, [R, k, H])
    if b2 is not None:
        o = p.add(m, "add", [o, p.add(m, "gather", [b2, idx], axis=0)])
    return p.add(m, "reduce_sum", [p.add(m, "mul", [o, p.reshape(m, w, [R, k, 1])])], axes=[1], keepdims=0)


def _every_expert(p, m, x, w, idx, spec):
    """Many rows: every expert over every row, summed with the routing weights (zero outside the top k)."""
    R, H = x.shape.lens
    k = idx.shape.lens[1]
    w1, b1, w2, b2 = spec["weights"]
    E = w1.shape.lens[0]
    xt = p.reshape(m, p.contiguous(m, p.add(m, "transpose", [x], permutation=[1, 0])), [1, H, R])
    h = p.add(m, "dot", [w1, xt])  # [E, N1, R]
    if b1 is not None:
        h = p.add(m, "add", [h, p.reshape(m, b1, [E, w1.shape.lens[1], 1])])
    a = p.contiguous(m, _activation(p, m, h, 1, *spec["act"]))  # [E, I, R]
    o = p.add(m, "dot", [w2, a])  # [E, H, R]
    if b2 is not None:
        o = p.add(m, "add", [o, p.reshape(m, b2, [E, H, 1])])
    experts = p.lit(m, np.arange(E, dtype=np.int64).reshape(1, 1, E))
    chosen = p.add(m, "convert", [p.add(m, "equal", [p.reshape(m, idx, [R, k, 1]), experts])],
                   target_type=x.shape.dtype)
    dense = p.add(m, "reduce_sum", [p.add(m, "mul", [chosen, p.reshape(m, w, [R, k, 1])])], axes=[1], keepdims=0)
    rows = p.contiguous(m, p.add(m, "transpose", [o], permutation=[2, 0, 1]))  # [R, E, H]
    return p.reshape(m, p.add(m, "dot", [p.reshape(m, dense, [R, 1, E]), rows]), [R, H])


def _check(p, node, x, router, w1, b1, w2, b2, act: str, fusion: int) -> None:
    """ParseError (naming the input, the expected and the given shape) for inconsistent operands."""
    if x is None or router is None or w1 is None or w2 is None:
        raise p.err("needs input, router_probs, fc1_experts_weights and fc2_experts_weights")
    if x.shape.ndim not in (2, 3):
        raise p.err(f"input {x.shape.brief()} must be [rows, hidden] or [batch, sequence, hidden]")
    H = x.shape.lens[-1]
    R = int(np.prod(x.shape.lens[:-1]))
    if w1.shape.ndim != 3 or w1.shape.lens[2] != H:
        raise p.err(f"fc1_experts_weights {w1.shape.brief()} must be [experts, fc1 size, {H}] (hidden last)")
    E, n1 = w1.shape.lens[:2]
    inner = n1 // 2 if act == "swiglu" else n1
    if act == "swiglu" and n1 % 2:
        raise p.err(f"fc1_experts_weights {w1.shape.brief()}: a SwiGLU needs an even fc1 size (gate and linear)")
    expect = {"router_probs": (router, [R, E]), "fc2_experts_weights": (w2, [E, H, inner]),
              "fc1_experts_bias": (b1, [E, n1]), "fc2_experts_bias": (b2, [E, H])}
    for name, (v, lens) in expect.items():
        if v is not None and list(v.shape.lens) != lens:
            raise p.err(f"{name} {v.shape.brief()} must be {lens}")
    for name, v in (("router_probs", router), ("fc1_experts_weights", w1), ("fc2_experts_weights", w2),
                    ("fc1_experts_bias", b1), ("fc2_experts_bias", b2)):
        if v is not None and v.shape.dtype != x.shape.dtype:
            raise p.err(f"{name} is {v.shape.dtype}; expected the input's {x.shape.dtype}")


@parser("MoE", domain=MS)
def _parse_moe(p, m, node, ins):
    x, router, w1, b1, w2, b2, w3, b3 = pad_inputs(ins, 8)
    act = decode(attr(node, "activation_type", b"relu"))
    fusion = attr(node, "swiglu_fusion", 0)
    if act not in ACTIVATIONS:
        raise unsupported(p, node, f"attribute activation_type={act!r} (expected one of {', '.join(ACTIVATIONS)})")
    if w3 is not None or b3 is not None or (act == "swiglu" and fusion == 0):
        raise unsupported(p, node, f"separate gate weights (fc3_experts_weights, swiglu_fusion={fusion})")
    if act == "swiglu" and fusion not in (1, 2):
        raise unsupported(p, node, f"attribute swiglu_fusion={fusion} (1: interleaved, 2: gate then linear halves)")
    if attr(node, "use_sparse_mixer", 0):
        raise unsupported(p, node, "attribute use_sparse_mixer=1")
    _check(p, node, x, router, w1, b1, w2, b2, act, fusion)
    E = w1.shape.lens[0]
    k = attr(node, "k", 1)
    if not isinstance(k, int) or not 1 <= k <= E:
        raise p.err(f"attribute k={k!r} must be in 1..{E} (the number of experts)")
    limit = attr(node, "swiglu_limit", None)
    spec = {"weights": (w1, b1, w2, b2),
            "act": (act, fusion, None if limit is None or not np.isfinite(limit) else float(limit),
                    float(attr(node, "activation_alpha", 1.0)), float(attr(node, "activation_beta", 0.0)))}
    lens = list(x.shape.lens)
    rows = p.reshape(m, x, [int(np.prod(lens[:-1])), lens[-1]])
    w, idx = _routing(p, m, router, k, attr(node, "normalize_routing_weights", 0))
    few = rows.shape.lens[0] * k <= E
    y = (_experts_of_rows if few else _every_expert)(p, m, rows, w, idx, spec)
    return p.reshape(m, y, lens)
