"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss lowered to native instructions
(``gather_elements`` / ``gather`` of the target class, ``where`` for ignore_index, reductions; the
pointwise and reduce parts fuse into generated kernels on the gpu target).

``loss[n, d...] = -input[n, target[n, d...], d...] * weight[target[n, d...]]`` (weight 1 without the
weight input; 0 where ``target == ignore_index``).  ``reduction``: ``none`` (loss as is), ``sum``, or
``mean``: ``sum(loss) / sum(weight[target])`` over the non-ignored elements (the spec's definition; a
target outside [0, C) that is not ignore_index reads a clamped class); any other value sums, as
onnxruntime does.  SoftmaxCrossEntropyLoss applies
it to ``log_prob = LogSoftmax(scores, axis=1)`` and returns log_prob as its optional second output.

ONNX operator spec: https://onnx.ai/onnx/operators/onnx__NegativeLogLikelihoodLoss.html and
https://onnx.ai/onnx/operators/onnx__SoftmaxCrossEntropyLoss.html
"""
from __future__ import annotations

import numpy as np

from .op_parser import attr, decode, parser, require_float


def _check(p, node, x, target, weight):
    require_float(p, x)
    xs, ts = x.shape, target.shape
    if xs.ndim < 2 or ts.dtype not in ("int32", "int64") or \
            tuple(ts.lens) != (xs.lens[0],) + tuple(xs.lens[2:]):
        raise p.err(f"target {ts.brief()} must be int32/int64 [N, d1, ...] = {[xs.lens[0]] + list(xs.lens[2:])} "
                    f"for input {xs.brief()} [N, C, d1, ...]")
    if weight is not None and (weight.shape.dtype != xs.dtype or tuple(weight.shape.lens) != (xs.lens[1],)):
        raise p.err(f"weight {weight.shape.brief()} must be {xs.dtype} [C={xs.lens[1]}]")
    reduction = decode(attr(node, "reduction", b"mean"))
    return reduction if reduction in ("none", "mean") else "sum"  # onnxruntime sums for any other value


def nll_loss(p, m, node, x, target, weight):
    """The NegativeLogLikelihoodLoss output instruction for log-probabilities ``x`` [N, C, d...]."""
    reduction = _check(p, node, x, target, weight)
    dt, C = x.shape.dtype, x.shape.lens[1]
    if target.shape.dtype != "int64":
        target = p.add(m, "convert", [target], target_type="int64")
    ii = attr(node, "ignore_index", None)
    keep = None
    if ii is not None:
        keep = p.add(m, "not", [p.add(m, "equal", [target, p.lit(m, np.array(ii, np.int64))])])
    cls = p.add(m, "clip", [target, p.lit(m, np.array(0, np.int64)), p.lit(m, np.array(max(C - 1, 0), np.int64))])
    picked = p.add(m, "gather_elements", [x, p.add(m, "unsqueeze", [cls], axes=[1])], axis=1)
    loss = p.add(m, "neg", [p.add(m, "squeeze", [picked], axes=[1])])
    w = p.add(m, "gather", [weight, cls], axis=0) if weight is not None else None
    zero = p.lit(m, np.array(0, dt))
    if keep is not None:
        w = p.add(m, "where", [keep, w if w is not None else p.lit(m, np.array(1, dt)), zero])
    if w is not None:
        loss = p.add(m, "mul", [loss, w])
    if reduction == "none":
        return loss
    total = p.add(m, "reduce_sum", [loss], axes=[], keepdims=0)
    if reduction == "sum":
        return total
    if w is None:
        return p.add(m, "div", [total, p.lit(m, np.array(max(target.shape.elements(), 0), dt))])
    if w.shape.lens != target.shape.lens:
        w = p.add(m, "multibroadcast", [w], out_lens=list(target.shape.lens))
    return p.add(m, "div", [total, p.add(m, "reduce_sum", [w], axes=[], keepdims=0)])


@parser("NegativeLogLikelihoodLoss")
def _parse_nll(p, m, node, ins):
    """Output: loss (``none``: [N, d1, ...]; else a scalar), the input's type.  ParseError for
    inconsistent shapes or types; UnsupportedOpError for a reduction outside the spec."""
    ins = list(ins) + [None] * (3 - len(ins))
    return nll_loss(p, m, node, ins[0], ins[1], ins[2])


@parser("SoftmaxCrossEntropyLoss")
def _parse_sce(p, m, node, ins):
    """Outputs: loss (as NegativeLogLikelihoodLoss) and log_prob [N, C, d1, ...] (the scores' type)."""
    ins = list(ins) + [None] * (3 - len(ins))
    scores = ins[0]
    require_float(p, scores)
    if scores.shape.ndim < 2:
        raise p.err(f"scores {scores.shape.brief()} must be [N, C, d1, ...]")
    log_prob = p.add(m, "logsoftmax", [scores], axis=1)
    return [nll_loss(p, m, node, log_prob, ins[1], ins[2]), log_prob]
