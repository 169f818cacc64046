"""ONNX parsers for the spatial ops: pooling (MaxPool, AveragePool, LpPool, GlobalLpPool), ConvTranspose,
Resize / Upsample, DepthToSpace / SpaceToDepth.

Each parser resolves the node's attributes (``auto_pad``, ``ceil_mode``, ``output_shape``, scales or
sizes ...) into a static geometry at parse time and emits native instructions (operators/pooling.py,
operators/conv_transpose.py, operators/resize.py); attribute values the implementation does not cover
raise :class:`UnsupportedOpError` naming the node and the value.  Output shapes follow onnxruntime (CPU)
where it and the spec text differ only in wording; combinations where they disagree are refused.
ONNX operator spec: https://onnx.ai/onnx/operators/
"""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedOpError
from ..ir.fold import FOLD_LIMIT
from ..operators.pooling import max_pool_index_maps, pool_counts, pool_divisor
from ..operators.resize import COORDINATE_MODES, NEAREST_MODES, axis_tables, is_identity, table_taps
from .op_parser import attr, check_choice, check_min, decode, parser
from .parse_constant import check_table, count, iota

_AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
#: the most taps along one axis of a pooling kernel: the pooling op folds its taps in one at a time and pads
#: its input to the kernel's extent, so a larger kernel is refused before anything is planned
MAX_POOL_TAPS = 1 << 16


def _ints(value) -> list:
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _unsupported(p, node, detail):
    return UnsupportedOpError(p.node_name, node.op_type, node.domain or "", p.opset, detail)


def _spatial_attrs(p, node, x, kernel=None):
    """(kernel, strides, dilations, pads, auto_pad) of a windowed op over ``x`` [N, C, *S], checked."""
    nsp = x.shape.ndim - 2
    if nsp < 1:
        raise p.err(f"X must be [N, C, spatial...] (rank >= 3), got {list(x.shape.lens)}")
    def given(name, default):  # an attribute given empty is checked as given (onnxruntime refuses it)
        v = attr(node, name)
        return list(default if v is None else v)

    kernel = given("kernel_shape", kernel or [])
    strides, dil, pads = given("strides", [1] * nsp), given("dilations", [1] * nsp), given("pads", [0] * (2 * nsp))
    auto = check_choice(p, decode(attr(node, "auto_pad", b"NOTSET")) or "NOTSET", _AUTO_PADS, "auto_pad")
    for what, v, n in (("kernel_shape", kernel, nsp), ("strides", strides, nsp), ("dilations", dil, nsp),
                       ("pads", pads, 2 * nsp)):
        if len(v) != n:
            raise p.err(f"{what} {v} has {len(v)} values, expected {n} for input {list(x.shape.lens)}")
    if any(k < 1 for k in kernel) or any(s < 1 for s in strides) or any(d < 1 for d in dil):
        raise p.err(f"kernel_shape {kernel}, strides {strides} and dilations {dil} must be >= 1")
    if any(v < 0 for v in pads):
        raise p.err(f"pads {pads} must be >= 0")
    return kernel, strides, dil, pads, auto


def _pool_geometry(p, node, x, kernel, strides, dil, pads, auto, ceil):
    """(pads_begin, pads_end, out_lens) of a pooling op, as onnxruntime computes them (spec formulas;
    with ``ceil_mode`` a last window starting inside the end pad is dropped)."""
    nsp = x.shape.ndim - 2
    pb, pe, out = [], [], []
    for i in range(nsp):
        size, k, s, d = x.shape.lens[2 + i], kernel[i], strides[i], dil[i]
        keff = (k - 1) * d + 1
        if auto == "VALID":
            b = e = 0
        elif auto in ("SAME_UPPER", "SAME_LOWER"):
            if d != 1:
                raise _unsupported(p, node, f"auto_pad {auto} with dilations {dil} (onnxruntime and the ONNX "
                                            "shape inference disagree on its output shape)")
            total = max(0, (-(-size // s) - 1) * s + keff - size)
            b = total // 2 if auto == "SAME_UPPER" else total - total // 2
            e = total - b
        else:
            b, e = pads[i], pads[i + nsp]
            if b >= k or e >= k:
                raise p.err(f"pads {pads} must be smaller than kernel_shape {kernel} (as onnxruntime requires)")
        num = size + b + e - keff
        o = (-(-num // s) if ceil else num // s) + 1
        if ceil and o > 0 and (o - 1) * s >= size + b:
            o -= 1
        pb.append(b)
        pe.append(e)
        out.append(o)
    return pb, pe, out


def _pool_common(p, node, x):
    kernel, strides, dil, pads, auto = _spatial_attrs(p, node, x)
    if not kernel:
        raise p.err("kernel_shape is required")
    if max(kernel) > MAX_POOL_TAPS:
        raise _unsupported(p, node, f"kernel_shape {kernel}: at most {MAX_POOL_TAPS} taps along an axis")
    ceil = int(attr(node, "ceil_mode", 0)) == 1  # onnxruntime floors for any other value
    pb, pe, out = _pool_geometry(p, node, x, kernel, strides, dil, pads, auto, ceil)
    return dict(kernel=kernel, stride=strides, dilation=dil, pads_begin=pb, out_lens=out), pe


@parser("MaxPool")
def _p_maxpool(p, m, node, ins):
    x = ins[0]
    if x.shape.dtype not in ("float16", "float32", "float64", "int8", "uint8"):
        raise _unsupported(p, node, f"input type {x.shape.dtype}")
    geo, _ = _pool_common(p, node, x)
    order = int(attr(node, "storage_order", 0))
    if order not in (0, 1):
        raise p.err(f"storage_order {order} must be 0 or 1")
    want_indices = len(node.output) > 1 and bool(node.output[1])
    if not want_indices:
        return p.add(m, "pooling", [x], mode="max", **geo)
    N, C = x.shape.lens[:2]
    check_table(p, count(geo["kernel"]) * max(count(geo["out_lens"]), 1),
                f"the index maps of output 'Indices' (kernel_shape {geo['kernel']} x output {geo['out_lens']})")
    maps, _ = max_pool_index_maps(1, 1, x.shape.lens[2:], geo["kernel"], geo["stride"], geo["dilation"],
                                  geo["pads_begin"], geo["out_lens"], order == 1)
    nsp = x.shape.ndim - 2  # (n * C + c) * prod(S) per [n, c]: no N x C literal over FOLD_LIMIT
    nc = p.add(m, "mul", [iota(p, m, N * C, [N, C] + [1] * nsp), p.lit(m, np.array(count(x.shape.lens[2:]), np.int64))])
    t = p.add(m, "pooling", [x, p.lit(m, maps), nc], mode="max", indices=True, **geo)
    return [p.add(m, "get_tuple_elem", [t], index=0), p.add(m, "get_tuple_elem", [t], index=1)]


@parser("AveragePool")
def _p_avgpool(p, m, node, ins):
    x = ins[0]
    if x.shape.dtype not in ("float16", "float32", "float64"):
        raise _unsupported(p, node, f"input type {x.shape.dtype}")
    geo, pe = _pool_common(p, node, x)
    include = int(attr(node, "count_include_pad", 0))
    return p.add(m, "pooling", [x, _avg_divisor(p, m, x, geo, pe, include)], mode="average", **geo)


def _avg_divisor(p, m, x, geo, pe, include):
    """The divisor ``[1, 1, *out]`` of AveragePool: a literal up to FOLD_LIMIT elements, else the product of
    each axis's tap counts computed at run time (each axis a literal up to FOLD_LIMIT windows, else computed
    from run-time window indices), so no table of the output's size is made while parsing."""
    args = (x.shape.lens[2:], geo["kernel"], geo["stride"], geo["dilation"], geo["pads_begin"], pe, geo["out_lens"])
    if count(geo["out_lens"]) <= FOLD_LIMIT:
        return p.lit(m, pool_divisor(*args, include, x.shape.dtype))
    nsp, div = len(geo["out_lens"]), None
    for a, (s, k, st, d, pb, e, o) in enumerate(zip(*args)):
        shape = [1] * (2 + nsp)
        shape[2 + a] = o
        if o <= FOLD_LIMIT:
            c = p.lit(m, pool_counts(s, k, st, d, pb, e, o, include).reshape(shape))
        else:
            c = p.reshape(m, _run_time_counts(p, m, s, k, st, d, pb, e, o, include), shape)
        div = c if div is None else p.add(m, "mul", [div, c])
    return p.add(m, "convert", [div], target_type=x.shape.dtype)


def _run_time_counts(p, m, size, k, st, d, pb, pe, o, include):
    """:func:`~mgx_graph.operators.pooling.pool_counts` of ``o`` windows as instructions (float64, ``[o]``)."""
    def lit(v):
        return p.lit(m, np.array(v, np.float64))

    lo, hi = (-pb, size + pe) if include else (0, size)
    a = p.add(m, "sub", [p.add(m, "mul", [iota(p, m, o, dtype="float64"), lit(st)]), lit(pb)])
    first = p.add(m, "max", [p.add(m, "ceil", [p.add(m, "div", [p.add(m, "sub", [lit(lo), a]), lit(d)])]), lit(0.0)])
    last = p.add(m, "min", [p.add(m, "floor", [p.add(m, "div", [p.add(m, "sub", [lit(hi - 1), a]), lit(d)])]),
                            lit(k - 1.0)])
    return p.add(m, "max", [p.add(m, "add", [p.add(m, "sub", [last, first]), lit(1.0)]), lit(0.0)])


def _lp_p(p, node):
    """The int ``p`` of LpPool / GlobalLpPool; onnxruntime takes any value (``p <= 0`` included: p = 0
    gives the window size to the power inf, p < 0 infinity at zeros)."""
    return float(int(attr(node, "p", 2)))


@parser("LpPool")
def _p_lppool(p, m, node, ins):
    x = ins[0]
    if x.shape.dtype not in ("float16", "float32", "float64"):
        raise _unsupported(p, node, f"input type {x.shape.dtype}")
    geo, _ = _pool_common(p, node, x)
    return p.add(m, "pooling", [x], mode="lp", p=_lp_p(p, node), **geo)


@parser("GlobalLpPool")
def _p_global_lppool(p, m, node, ins):
    """(sum over the spatial dims of |x|^p)^(1/p), keepdims: abs, pow, one reduction, pow."""
    x = ins[0]
    if x.shape.ndim < 3:
        raise p.err(f"input X must be [N, C, spatial...], got {list(x.shape.lens)}")
    pv = _lp_p(p, node)
    dt = x.shape.dtype
    y = p.add(m, "abs", [x])
    if pv != 1.0:
        y = p.add(m, "pow", [y, p.lit(m, np.array(pv, dt))])
    y = p.add(m, "reduce_sum", [y], axes=list(range(2, x.shape.ndim)), keepdims=1)
    if pv != 1.0:
        y = p.add(m, "pow", [y, p.lit(m, np.array(1.0 / pv if pv else np.inf, dt))])
    return y


def _conv_transpose_geometry(p, node, x, w, strides, dil, pads, auto):
    """(pads_begin, out_lens) of ConvTranspose: ``output_shape`` (pads ignored) or ``auto_pad`` SAME_*
    (output ``S * stride``) distribute the total padding as the spec says (SAME_UPPER: the smaller half
    first); otherwise ``out = (S - 1) * s + output_padding + (K - 1) * d + 1 - pads``."""
    nsp = x.shape.ndim - 2
    op_ = list(attr(node, "output_padding") or [0] * nsp)
    os_ = attr(node, "output_shape")
    if len(op_) != nsp:
        raise p.err(f"output_padding {op_} has {len(op_)} values, expected {nsp}")
    if os_ is not None and len(os_) != nsp:
        raise p.err(f"output_shape {list(os_)} has {len(os_)} values, expected {nsp} (the spatial dims)")
    if auto in ("SAME_UPPER", "SAME_LOWER") and any(op_) and os_ is None:
        raise _unsupported(p, node, f"auto_pad {auto} with output_padding {op_} (onnxruntime and the ONNX "
                                    "shape inference disagree on its output shape)")
    pb, out = [], []
    for i in range(nsp):
        S, K, s, d = x.shape.lens[2 + i], w.shape.lens[2 + i], strides[i], dil[i]
        if not 0 <= op_[i] < max(s, d):
            raise p.err(f"output_padding {op_} must be >= 0 and less than max(stride, dilation) "
                        f"({max(s, d)}) on spatial axis {i}")
        natural = (S - 1) * s + op_[i] + (K - 1) * d + 1
        if os_ is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
            o = int(os_[i]) if os_ is not None else S * s
            if o > natural + max(s, d) - 1 - op_[i]:
                raise p.err(f"output_shape {list(os_ or [])} is inconsistent with input {list(x.shape.lens)}, "
                            f"kernel {list(w.shape.lens[2:])}, strides {strides}, dilations {dil}: at most "
                            f"{natural + max(s, d) - 1 - op_[i]} on spatial axis {i}")
            total = max(0, natural - o)
            b = total // 2 if auto == "SAME_UPPER" else total - total // 2
            if os_ is None:
                o = natural - total  # SAME_*: S * stride, or less where the kernel does not reach it
        elif auto == "VALID":
            b, o = 0, natural
        else:
            b, o = pads[i], natural - pads[i] - pads[i + nsp]
        pb.append(b)
        out.append(o)
    return pb, out


@parser("ConvTranspose")
def _p_conv_transpose(p, m, node, ins):
    x, w = ins[0], ins[1]
    if x.shape.dtype not in ("float16", "float32", "float64"):
        raise _unsupported(p, node, f"input type {x.shape.dtype}")
    if w.shape.ndim != x.shape.ndim:
        raise p.err(f"W {list(w.shape.lens)} and X {list(x.shape.lens)} ranks differ")
    kernel, strides, dil, pads, auto = _spatial_attrs(p, node, x, list(w.shape.lens[2:]))
    if list(kernel) != list(w.shape.lens[2:]):
        raise p.err(f"kernel_shape {kernel} does not match the weights {list(w.shape.lens)}")
    group = int(attr(node, "group", 1))
    if group < 1 or x.shape.lens[1] % group or w.shape.lens[0] != x.shape.lens[1]:
        raise p.err(f"'group' = {group} does not fit X {list(x.shape.lens)} and W {list(w.shape.lens)}: expected "
                    f"group >= 1 dividing C = {x.shape.lens[1]} = W dim 0")
    pb, out = _conv_transpose_geometry(p, node, x, w, strides, dil, pads, auto)
    args = [p.contiguous(m, x), p.contiguous(m, w)]
    if len(ins) > 2 and ins[2] is not None:
        args.append(ins[2])
    return p.add(m, "conv_transpose", args, stride=strides, dilation=dil, pads_begin=pb, out_lens=out,
                 group=group)


_RESIZE_MODES = ("nearest", "linear", "cubic")


def _resize_attrs(p, node, x):
    """The interpolation attributes of Resize / Upsample at this opset, validated."""
    legacy = node.op_type == "Upsample" or p.opset < 11
    mode = decode(attr(node, "mode", b"nearest"))
    ctm = "asymmetric" if legacy else decode(attr(node, "coordinate_transformation_mode", b"half_pixel"))
    nearest = "simple" if legacy else decode(attr(node, "nearest_mode", b"round_prefer_floor"))
    a = dict(mode=mode, coord_mode=ctm, nearest_mode=nearest, cubic_a=float(attr(node, "cubic_coeff_a", -0.75)),
             exclude_outside=bool(attr(node, "exclude_outside", 0)), antialias=bool(attr(node, "antialias", 0)))
    # Upsample and Resize-10 take cubic as onnxruntime does (their spec lists nearest and linear)
    check_choice(p, mode, _RESIZE_MODES, "mode")
    check_choice(p, ctm, COORDINATE_MODES, "coordinate_transformation_mode")
    check_choice(p, nearest, NEAREST_MODES[:4] if not legacy else NEAREST_MODES, "nearest_mode")
    if a["antialias"] and mode == "nearest":
        raise _unsupported(p, node, "antialias=1 with mode 'nearest' (antialiasing applies to linear and cubic)")
    if a["exclude_outside"] and (mode == "nearest" or (mode == "linear" and not a["antialias"])):
        raise _unsupported(p, node, f"exclude_outside=1 with mode '{mode}' and antialias={int(a['antialias'])} "
                                    "(onnxruntime accepts it only for cubic, or linear with antialias)")
    if mode != "nearest" and not x.shape.dtype.startswith("float"):
        raise _unsupported(p, node, f"mode '{mode}' on {x.shape.dtype} input (only nearest for integer types)")
    return a


def _resize_inputs(p, node, ins, r):
    """(scales or None, sizes or None, roi or None, axes) as given by the node."""
    legacy_attr = node.op_type == "Upsample" and p.opset < 9
    axes = list(range(r))
    if legacy_attr:
        scales = attr(node, "scales")
        return (None if scales is None else np.asarray(scales, np.float32)), None, None, axes
    if node.op_type == "Upsample" or p.opset < 11:
        return np.asarray(p.const(ins[1], "scales"), np.float32).reshape(-1), None, None, axes
    if attr(node, "axes") is not None:
        axes = [int(v) + r if int(v) < 0 else int(v) for v in attr(node, "axes")]
        if len(set(axes)) != len(axes) or any(not 0 <= v < r for v in axes):
            raise p.err(f"axes {list(attr(node, 'axes'))} must be distinct and within rank {r}")

    def value(k, what, dtype):
        if len(ins) <= k or ins[k] is None:
            return None
        v = np.asarray(p.const(ins[k], what), dtype).reshape(-1)
        return v if v.size else None

    return value(2, "scales", np.float32), value(3, "sizes", np.int64), value(1, "roi", np.float64), axes


def _resize_geometry(p, node, x, ins):
    """(scales per axis float32, output lens, roi per axis (start, end), exact ratio per axis (num, den) or
    None, fractional ``scale * length`` per axis or None), as onnxruntime derives them."""
    lens = list(x.shape.lens)
    r = len(lens)
    scales_in, sizes, roi_in, axes = _resize_inputs(p, node, ins, r)
    if (scales_in is None) == (sizes is None):
        raise p.err("exactly one of 'scales' and 'sizes' must be given (non-empty)")
    given = scales_in if scales_in is not None else sizes
    if len(given) != len(axes):
        raise p.err(f"{'scales' if sizes is None else 'sizes'} {given.tolist()} has {len(given)} values, expected "
                    f"{len(axes)} (one per axis of {list(axes)})")
    scales, out, exact, widths = [np.float32(1.0)] * r, list(lens), [None] * r, [None] * r
    for a, v in zip(axes, given):
        if scales_in is not None:
            if not v > 0 or (node.op_type == "Upsample" and v < 1):
                raise p.err(f"'scales' = {scales_in.tolist()} must be {'>= 1' if node.op_type == 'Upsample' else '> 0'}")
            scales[a], out[a] = np.float32(v), int(np.float32(v) * np.float32(lens[a]))
            if out[a] and np.float32(out[a] / lens[a]) == scales[a]:
                exact[a] = (out[a], lens[a])
            width = float(np.float32(v)) * lens[a]  # the ONNX reference's (float64) output width
            if width != out[a]:
                widths[a] = width
        else:
            if v < 0 or (lens[a] == 0 and v != 0):
                raise p.err(f"sizes {sizes.tolist()} cannot be produced from input {lens}")
            out[a] = int(v)
            scales[a] = np.float32(v) / np.float32(lens[a]) if lens[a] else np.float32(1.0)
            exact[a] = (int(v), lens[a]) if lens[a] and v else None
    policy = check_choice(p, decode(attr(node, "keep_aspect_ratio_policy", b"stretch")),
                          ("stretch", "not_larger", "not_smaller"), "keep_aspect_ratio_policy")
    if sizes is not None and policy != "stretch":
        pick = (min if policy == "not_larger" else max)(axes, key=lambda a: scales[a])
        s, ratio = scales[pick], exact[pick]
        for a in axes:
            scales[a], exact[a] = s, ratio
            out[a] = int(np.floor(np.float32(s) * np.float32(lens[a]) + np.float32(0.5)))
    roi = [(0.0, 1.0)] * r
    if roi_in is not None:
        if len(roi_in) != 2 * len(axes):
            raise p.err(f"roi {roi_in.tolist()} has {len(roi_in)} values, expected {2 * len(axes)}")
        for k, a in enumerate(axes):
            roi[a] = (float(roi_in[k]), float(roi_in[len(axes) + k]))
    return scales, out, roi, exact, widths


def _resized_axes(scales, lens, out):
    """Axes the interpolation runs on: the scaled ones.  As onnxruntime does, an axis of scale 1 maps onto
    itself whatever the mode and coordinate transform, and an op that changes no dim is the identity."""
    if list(out) == list(lens):
        return set()
    return {a for a in range(len(lens)) if scales[a] != 1.0}


@parser("Resize", "Upsample")
def _p_resize(p, m, node, ins):
    x = ins[0]
    at = _resize_attrs(p, node, x)
    scales, out, roi, exact, widths = _resize_geometry(p, node, x, ins)
    dt = x.shape.dtype
    args, axes, masks = [x], [], []
    active = _resized_axes(scales, x.shape.lens, out)
    for a, (n_in, n_out) in enumerate(zip(x.shape.lens, out)):
        if a not in active:
            continue
        taps = table_taps(at["mode"], scales[a], at["antialias"])
        check_table(p, taps * max(n_out, 1), f"the interpolation tables of axis {a} ({taps:g} taps x {n_out} "
                                             f"output positions)")
        idx, w, ext = axis_tables(at["mode"], n_in, n_out, scales[a], at["coord_mode"], at["nearest_mode"],
                                  at["cubic_a"], at["exclude_outside"], at["antialias"], roi[a], exact[a],
                                  widths[a] if at["coord_mode"] == "align_corners" and not at["antialias"]
                                  else None)
        if is_identity(idx, w, ext, n_in, n_out):
            continue
        axes.append(a)
        args.append(p.lit(m, idx))
        if at["mode"] != "nearest":
            args.append(p.lit(m, w.astype(dt)))
        if ext is not None and ext.any():
            shape = [1] * len(out)
            shape[a] = n_out
            masks.append(ext.reshape(shape))
    if not axes:
        return x
    extrapolate = bool(masks)
    if extrapolate:  # the union of the axes' masks: a literal up to FOLD_LIMIT elements, else made at run time
        mask = p.lit(m, masks[0])
        for mk in masks[1:]:
            mask = p.add(m, "logical_or", [mask, p.lit(m, mk)])
        args += [p.lit(m, np.array(attr(node, "extrapolation_value", 0.0)).astype(dt)), mask]
    return p.add(m, "resize", args, axes=axes, weighted=at["mode"] != "nearest", extrapolate=extrapolate)


def _blocksize(p, node, x):
    if x.shape.ndim != 4:
        raise p.err(f"input must be 4-D [N, C, H, W], got {list(x.shape.lens)}")
    return check_min(p, attr(node, "blocksize", 0), 1, "blocksize")[0]


@parser("DepthToSpace")
def _p_depth_to_space(p, m, node, ins):
    """[N, C, H, W] -> [N, C / b^2, H * b, W * b] as reshape, transpose, reshape (DCR or CRD order)."""
    x = ins[0]
    b = _blocksize(p, node, x)
    N, C, H, W = x.shape.lens
    mode = check_choice(p, decode(attr(node, "mode", b"DCR")), ("DCR", "CRD"), "mode")
    if C % (b * b):
        raise p.err(f"channels {C} are not divisible by blocksize^2 = {b * b}")
    if mode == "DCR":
        t = p.reshape(m, x, [N, b, b, C // (b * b), H, W])
        perm = [0, 3, 4, 1, 5, 2]
    else:
        t = p.reshape(m, x, [N, C // (b * b), b, b, H, W])
        perm = [0, 1, 4, 2, 5, 3]
    return p.reshape(m, p.add(m, "transpose", [t], permutation=perm), [N, C // (b * b), H * b, W * b])


@parser("SpaceToDepth")
def _p_space_to_depth(p, m, node, ins):
    """[N, C, H, W] -> [N, C * b^2, H / b, W / b] as reshape, transpose, reshape (DCR or CRD order)."""
    x = ins[0]
    b = _blocksize(p, node, x)
    N, C, H, W = x.shape.lens
    mode = check_choice(p, decode(attr(node, "mode", b"DCR")), ("DCR", "CRD"), "mode")
    if H % b or W % b:
        raise p.err(f"spatial dims {H} x {W} are not divisible by blocksize {b}")
    t = p.reshape(m, x, [N, C, H // b, b, W // b, b])
    perm = [0, 3, 5, 1, 2, 4] if mode == "DCR" else [0, 1, 3, 5, 2, 4]
    t = p.add(m, "transpose", [t], permutation=perm)
    return p.reshape(m, t, [N, C * b * b, H // b, W // b])


@parser("CenterCropPad")
def _p_center_crop_pad(p, m, node, ins):
    """Crop (centered, the extra element at the end) or zero-pad each axis to ``shape``: one ``pad`` with
    negative pads where it crops."""
    x = ins[0]
    r = x.shape.ndim
    shape = _ints(p.const(ins[1], "shape"))
    axes = [int(a) + r if int(a) < 0 else int(a) for a in (attr(node, "axes") or range(r))]
    if len(shape) != len(axes) or len(set(axes)) != len(axes) or any(not 0 <= a < r for a in axes):
        raise p.err(f"shape {shape} and axes {list(axes)} must match and be distinct axes of rank {r}")
    pads = [0] * (2 * r)
    for a, want in zip(axes, shape):
        if want < 0:
            raise p.err(f"shape {shape} must be >= 0")
        diff = want - x.shape.lens[a]
        half = abs(diff) // 2
        pads[a], pads[a + r] = (half, diff - half) if diff >= 0 else (-half, diff + half)
    if not any(pads):
        return x
    return p.add(m, "pad", [x], pads=pads, mode="constant", value=0.0)


@parser("Col2Im")
def _p_col2im(p, m, node, ins):
    x = ins[0]
    image = _ints(p.const(ins[1], "image_shape"))
    block = _ints(p.const(ins[2], "block_shape"))
    n = len(image)
    strides = list(attr(node, "strides") or [1] * n)
    dil = list(attr(node, "dilations") or [1] * n)
    pads = list(attr(node, "pads") or [0] * (2 * n))
    if len(block) != n or len(strides) != n or len(dil) != n or len(pads) != 2 * n:
        raise p.err(f"image_shape {image}, block_shape {block}, strides {strides}, dilations {dil} and pads "
                    f"{pads} do not all describe {n} spatial axes")
    if any(v < 1 for v in block + strides + dil) or any(v < 0 for v in pads):
        raise p.err(f"block_shape {block}, strides {strides}, dilations {dil} must be >= 1 and pads {pads} >= 0")
    return p.add(m, "col2im", [p.contiguous(m, x)], image=image, kernel=block, stride=strides, dilation=dil,
                 pads_begin=pads[:n], pads_end=pads[n:])
