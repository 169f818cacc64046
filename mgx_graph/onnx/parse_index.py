"""Index and selection ops: Hardmax, CumSum, OneHot, Trilu, EyeLike, ReverseSequence, Compress and
NonMaxSuppression (their output sizes depend on data: the count is computed on the device and
guarded), and Einsum (lowered to diagonal views, reductions, transposes and batched ``dot``).

ONNX operator spec: https://onnx.ai/onnx/operators/
"""
from __future__ import annotations

import math

import numpy as np

from ..ir.fold import FOLD_LIMIT
from .op_parser import attr, check_axis, check_choice, decode, element_type, parser, require_float
from .parse_constant import iota


@parser("Hardmax")
def _p_hardmax(p, m, node, ins):
    x = ins[0]
    require_float(p, x)
    if x.shape.elements() == 0:  # an empty input: an empty output
        check_axis(p, attr(node, "axis", -1 if p.opset >= 13 else 1), x.shape.ndim)
        return x
    if p.opset >= 13:
        return p.add(m, "hardmax", [x], axis=check_axis(p, attr(node, "axis", -1), x.shape.ndim))
    a = check_axis(p, attr(node, "axis", 1), x.shape.ndim)  # opsets 1-12: the input is coerced to 2-D at axis
    lens = list(x.shape.lens)
    flat = p.reshape(m, x, [math.prod(lens[:a]), math.prod(lens[a:])])
    return p.reshape(m, p.add(m, "hardmax", [flat], axis=1), lens)


def _scalar_const(p, ins, what):
    v = np.asarray(p.const(ins, what)).reshape(-1)
    if v.size != 1:
        raise p.err(f"{what} must hold one value, got {v.size}")
    return v[0]


@parser("CumSum", "CumProd")
def _p_cumsum(p, m, node, ins):
    x = ins[0]
    axis = check_axis(p, _scalar_const(p, ins[1], "axis"), max(x.shape.ndim, 1))
    flags = {k: check_choice(p, int(attr(node, k, 0)), (0, 1), k) for k in ("exclusive", "reverse")}
    return p.add(m, node.op_type.lower(), [x], axis=axis, **flags)


@parser("OneHot")
def _p_onehot(p, m, node, ins):
    ind, depth_in, values = ins[:3]
    depth = int(_scalar_const(p, depth_in, "depth"))
    if depth < 1:
        raise p.err(f"depth must be positive, got {depth}")
    if values.shape.elements() != 2:
        raise p.err(f"values must be [off_value, on_value], got {list(values.shape.lens)}")
    r = ind.shape.ndim + 1
    a = check_axis(p, attr(node, "axis", -1), r)
    if ind.shape.dtype != "int64":  # float indices are truncated, as a cast to int64 does
        ind = p.add(m, "convert", [ind], target_type="int64")
    ind = p.add(m, "unsqueeze", [ind], axes=[a])
    pos = iota(p, m, depth, [depth] + [1] * (r - a - 1))  # no literal over FOLD_LIMIT elements
    return p.add(m, "onehot", [ind, pos, values], depth=depth)


@parser("Trilu")
def _p_trilu(p, m, node, ins):
    """Zeroes the elements above (``upper=0``) or below (``upper=1``) the k-th diagonal of the last two
    dims: a ``where`` with a mask (a literal up to FOLD_LIMIT elements, else computed at run time)."""
    x = ins[0]
    if x.shape.ndim < 2:
        raise p.err(f"input must have rank >= 2, got {list(x.shape.lens)}")
    k = int(_scalar_const(p, ins[1], "k")) if len(ins) > 1 and ins[1] is not None else 0
    R, C = x.shape.lens[-2:]
    upper = attr(node, "upper", 1)
    if R == 0 or C == 0 or (k <= 1 - R if upper else k >= C - 1):  # every element kept
        return x
    zero = p.lit(m, np.zeros((), dtype=x.shape.dtype))
    return p.add(m, "where", [_diagonal_mask(p, m, R, C, k, ">=" if upper else "<="), x, zero])


def _diagonal_mask(p, m, R: int, C: int, k: int, rule: str):
    """The bool [R, C] of ``j - i rule k`` (``rule``: ``>=``, ``<=`` or ``==``): a literal up to FOLD_LIMIT
    elements, else instructions over run-time positions (no R x C array while parsing)."""
    if R * C <= FOLD_LIMIT:
        diff = np.arange(C)[None, :] - np.arange(R)[:, None]
        return p.lit(m, diff >= k if rule == ">=" else diff <= k if rule == "<=" else diff == k)
    diff = p.add(m, "sub", [iota(p, m, C, [1, C]), iota(p, m, R, [R, 1])])
    op = {">=": "greater_equal", "<=": "less_equal", "==": "equal"}[rule]
    return p.add(m, op, [diff, p.lit(m, np.array(k, np.int64))])


@parser("EyeLike")
def _p_eyelike(p, m, node, ins):
    x = ins[0]
    if x.shape.ndim != 2:
        raise p.err(f"input must be 2-D, got {list(x.shape.lens)}")
    dt = attr(node, "dtype")
    dtype = element_type(p, dt, "dtype") if dt is not None else x.shape.dtype
    R, C = x.shape.lens
    k = int(attr(node, "k", 0))
    if R * C <= FOLD_LIMIT:
        return p.lit(m, np.eye(R, C, k=k, dtype=dtype))
    return p.add(m, "convert", [_diagonal_mask(p, m, R, C, k, "==")], target_type=np.dtype(dtype).name)


@parser("ReverseSequence")
def _p_reverse_sequence(p, m, node, ins):
    x, lens = ins[:2]
    t = int(attr(node, "time_axis", 0))
    if lens.op.name == "@literal" and x.shape.ndim >= 2 and t in (0, 1):
        v = np.asarray(lens.op.value).reshape(-1)
        if v.size and (v.min() < 0 or v.max() > x.shape.lens[t]):
            raise p.err(f"sequence_lens {v.tolist()} has values outside [0, {x.shape.lens[t]}] (time_axis {t} of "
                        f"{list(x.shape.lens)})")
    return p.add(m, "reverse_sequence", ins[:2], batch_axis=attr(node, "batch_axis", 1),
                 time_axis=attr(node, "time_axis", 0))


def _guarded_count(p, m, count_ins, what: str) -> int:
    """The value of the device-side scalar ``count_ins``, which this program is specialized for: a
    ``guard`` reads it back (the only host synchronization) and re-dispatches when it changes."""
    p.tensor_of.setdefault(id(count_ins), f"{p.node_name}:{what}")
    return int(np.asarray(p.const(count_ins, what)).reshape(-1)[0])


@parser("Compress")
def _p_compress(p, m, node, ins):
    x, cond = ins[:2]
    if cond.shape.dtype != "bool":
        raise p.err(f"condition must be a bool tensor, got {cond.shape.dtype} {list(cond.shape.lens)}")
    if cond.shape.ndim != 1:  # onnxruntime reads any condition as its values in order
        cond = p.reshape(m, cond, [cond.shape.elements()])
    axis = attr(node, "axis")
    if axis is None:
        x, a = p.reshape(m, x, [x.shape.elements()]), 0
    else:
        a = check_axis(p, axis, x.shape.ndim)
    dim = x.shape.lens[a]
    if cond.shape.lens[0] > dim:  # entries past the axis length are discarded
        cond = p.add(m, "slice", [cond], axes=[0], starts=[0], ends=[dim], steps=[1])
    n = p.add(m, "reduce_sum", [p.add(m, "convert", [cond], target_type="int64")], axes=[0], keepdims=0)
    count = _guarded_count(p, m, n, "count")
    return p.add(m, "compress", [x, cond], axis=a, count=count)


@parser("NonMaxSuppression")
def _p_nms(p, m, node, ins):
    ins = list(ins) + [None] * (5 - len(ins))
    boxes, scores, max_in, iou_in, score_in = ins[:5]
    center = check_choice(p, attr(node, "center_point_box", 0), (0, 1), "center_point_box")
    max_out = int(_scalar_const(p, max_in, "max_output_boxes_per_class")) if max_in is not None else 0
    if iou_in is None:
        iou_in = p.lit(m, np.zeros((), np.float32))
    elif iou_in.op.name == "@literal":
        v = float(np.asarray(iou_in.op.value).reshape(-1)[0])
        if not 0.0 <= v <= 1.0:
            raise p.err(f"iou_threshold must be in [0, 1], got {v}")
    bl, sl = list(boxes.shape.lens), list(scores.shape.lens)
    if len(bl) != 3 or bl[2] != 4:
        raise p.err(f"boxes must be [B, N, 4], got {bl}")
    if len(sl) != 3 or sl[0] != bl[0] or sl[2] != bl[1]:
        raise p.err(f"scores must be [B, C, N] = [{bl[0]}, C, {bl[1]}] (boxes {bl}), got {sl}")
    B, C, N = scores.shape.lens
    if max_out <= 0 or B * C * N == 0:
        return p.lit(m, np.zeros((0, 3), np.int64))
    args = [boxes, scores, iou_in] + ([score_in] if score_in is not None else [])
    t = p.add(m, "nms", args, max_out=max_out, center_point_box=center, has_score=int(score_in is not None))
    rows = p.add(m, "get_tuple_elem", [t], index=0)
    count = _guarded_count(p, m, p.add(m, "get_tuple_elem", [t], index=1), "count")
    return p.add(m, "slice", [rows], axes=[0], starts=[0], ends=[count], steps=[1])


def _einsum_labels(p, eq: str, ranks: list) -> tuple[list, list]:
    """(labels of each input, labels of the output) of ``eq``.  A label is a letter, or ``'.k'`` for the
    k-th broadcast (``...``) dim, the operands' ``...`` dims aligned to the right as numpy does.
    Implicit output (no ``->``): the ``...`` dims, then the letters used once, in ASCII order."""
    lhs, arrow, rhs = eq.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise p.err(f"equation '{eq}' has {len(terms)} input terms for {len(ranks)} inputs")

    def split(term):
        head, dots, tail = term.partition("...")
        if "." in head + tail or not all(c.isascii() and c.isalpha() for c in head + tail):
            raise p.err(f"equation '{eq}': bad term '{term}' (letters and one '...' only)")
        return list(head), bool(dots), list(tail)

    parts = [split(t) for t in terms]
    n_ell = []
    for (head, dots, tail), r, term in zip(parts, ranks, terms):
        e = r - len(head) - len(tail)
        if e < 0 or (e and not dots):
            raise p.err(f"equation '{eq}': term '{term}' does not match an input of rank {r}")
        n_ell.append(e)
    E = max(n_ell, default=0)
    labels = [h + [f".{E - e + j}" for j in range(e)] + t for (h, _, t), e in zip(parts, n_ell)]
    if arrow:
        head, dots, tail = split(rhs)
        if E and not dots:
            raise p.err(f"equation '{eq}': the output must keep the '...' dims")
        out = head + ([f".{j}" for j in range(E)] if dots else []) + tail
    else:
        letters = [c for ls in labels for c in ls if not c.startswith(".")]
        out = [f".{j}" for j in range(E)] + sorted(c for c in set(letters) if letters.count(c) == 1)
    used = {c for ls in labels for c in ls}
    if len(set(out)) != len(out) or not set(out) <= used:
        raise p.err(f"equation '{eq}': output labels must be distinct and appear in an input")
    return labels, out


def _permute(p, m, x, perm):
    return x if list(perm) == list(range(len(perm))) else p.add(m, "transpose", [x], permutation=list(perm))


def _sum_labels(p, m, x, labels, keep):
    """Take the diagonal of repeated labels, then sum the labels not in ``keep``."""
    uniq = list(dict.fromkeys(labels))
    if len(uniq) < len(labels):
        x = p.add(m, "diagonal", [x], labels=[uniq.index(c) for c in labels])
    drop = [i for i, c in enumerate(uniq) if c not in keep]
    if drop:
        x = p.add(m, "reduce_sum", [x], axes=drop, keepdims=0)
    return x, [c for c in uniq if c in keep]


def _contract(p, m, a, la, b, lb, keep):
    """a (labels la) times b (labels lb), summed over the shared labels not in ``keep``, as one
    ``dot`` of ``[batch..., a-only, contracted] x [batch..., contracted, b-only]``."""
    batch = [c for c in la if c in lb and c in keep]
    summed = [c for c in la if c in lb and c not in keep]
    a_only = [c for c in la if c not in lb]
    b_only = [c for c in lb if c not in la]

    def size(x, labs, c):
        return x.shape.lens[labs.index(c)]

    for c in batch + summed:
        na, nb = size(a, la, c), size(b, lb, c)
        if na != nb and 1 not in (na, nb):
            raise p.err(f"equation label '{c}' has sizes {na} and {nb} in the two operands")
        if na != nb and c in summed:  # a summed dim of size 1 broadcasts to the other operand's length
            x, labs, n = (a, la, nb) if na == 1 else (b, lb, na)
            lens = list(x.shape.lens)
            lens[labs.index(c)] = n
            x = p.add(m, "multibroadcast", [x], out_lens=lens)
            a, b = (x, b) if na == 1 else (a, x)
    at = _permute(p, m, a, [la.index(c) for c in batch + a_only + summed])
    bt = _permute(p, m, b, [lb.index(c) for c in batch + summed + b_only])
    k = math.prod(size(a, la, c) for c in summed)
    pa, pb = math.prod(size(a, la, c) for c in a_only), math.prod(size(b, lb, c) for c in b_only)
    a2 = p.reshape(m, at, [size(a, la, c) for c in batch] + [pa, k])
    b2 = p.reshape(m, bt, [size(b, lb, c) for c in batch] + [k, pb])
    r = p.add(m, "dot", [a2, b2])
    lens = list(r.shape.lens[:len(batch)]) + [size(a, la, c) for c in a_only] + [size(b, lb, c) for c in b_only]
    return p.reshape(m, r, lens), batch + a_only + b_only


@parser("Einsum")
def _p_einsum(p, m, node, ins):
    """Lowered to diagonal views, reduce_sum, transposes, reshapes and batched dot (left to right)."""
    eq = decode(attr(node, "equation"))
    if not eq:
        raise p.err("missing equation")
    if len({x.shape.dtype for x in ins}) != 1:
        raise p.err(f"inputs have different types {[x.shape.dtype for x in ins]}")
    labels, out = _einsum_labels(p, eq, [x.shape.ndim for x in ins])
    later = [set(out).union(*labels[k + 1:]) for k in range(len(ins))]  # labels needed after operand k
    ops = [_sum_labels(p, m, x, ls, set(out).union(*(labels[:k] + labels[k + 1:])))
           for k, (x, ls) in enumerate(zip(ins, labels))]
    acc, la = ops[0]
    for k in range(1, len(ops)):
        b, lb = ops[k]
        acc, la = _sum_labels(p, m, acc, la, later[k] | set(lb))
        b, lb = _sum_labels(p, m, b, lb, later[k] | set(la))
        acc, la = _contract(p, m, acc, la, b, lb, later[k])
    acc, la = _sum_labels(p, m, acc, la, set(out))
    return _permute(p, m, acc, [la.index(c) for c in out])
