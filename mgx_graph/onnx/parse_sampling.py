"""ONNX parsers for the sampling ops GridSample, RoiAlign and AffineGrid: one native ``grid_sample`` /
``roi_align`` / ``affine_grid`` instruction each (operators/sampling.py).

GridSample: opsets 16-19 name the modes bilinear / nearest / bicubic and take 4-D inputs, opset 20 names
them linear / nearest / cubic and adds N-D inputs (here 4-D and 5-D; cubic 4-D only, as onnxruntime).
The grid is converted to X's type.  RoiAlign: opset 10 has no coordinate_transformation_mode (it behaves as
output_half_pixel); opset 16 defaults to half_pixel.
AffineGrid (opset 20): the ``size`` input must be known at compile time.
Source: ONNX operator spec (GridSample-16/20/22, RoiAlign-10/16/22, AffineGrid-20).
"""
from __future__ import annotations

import numpy as np

from .op_parser import attr, check_choice, check_count, check_min, decode, parser, require_float, unsupported

_MODES_16 = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}
_MODES_20 = {"linear": "linear", "nearest": "nearest", "cubic": "cubic"}
_PADDING = ("zeros", "border", "reflection")


@parser("GridSample")
def _p_grid_sample(p, m, node, ins):
    """GridSample (X [N, C, *S], grid [N, *O, nd]) -> [N, C, *O]."""
    x, g = ins[0], ins[1]
    require_float(p, x, "X")
    require_float(p, g, "grid")
    modes = _MODES_20 if p.opset >= 20 else _MODES_16
    mode = decode(attr(node, "mode", b"linear" if p.opset >= 20 else b"bilinear"))
    if mode not in modes:
        raise p.err(f"'mode' = '{mode}' is not one of {', '.join(modes)} (opset {p.opset})")
    mode = modes[mode]
    pad = decode(attr(node, "padding_mode", b"zeros"))
    if pad not in _PADDING:
        raise p.err(f"'padding_mode' = '{pad}' is not one of {', '.join(_PADDING)}")
    align = int(bool(attr(node, "align_corners", 0)))  # any nonzero value is on, as onnxruntime reads it
    nd = x.shape.ndim - 2
    if nd != 2 and (p.opset < 20 or nd != 3):
        raise unsupported(p, node, f"{nd} spatial dims (X {list(x.shape.lens)}): 2" +
                          (" or 3" if p.opset >= 20 else "") + " supported")
    if mode == "cubic" and nd != 2:
        raise unsupported(p, node, "cubic mode with 3 spatial dims (onnxruntime has it for 2 only)")
    if g.shape.ndim != x.shape.ndim or g.shape.lens[-1] != nd or g.shape.lens[0] != x.shape.lens[0]:
        raise p.err(f"grid {list(g.shape.lens)} does not match X {list(x.shape.lens)} (expected [N, *O, {nd}])")
    if g.shape.dtype != x.shape.dtype:
        g = p.add(m, "convert", [g], target_type=x.shape.dtype)
    return p.add(m, "grid_sample", [p.contiguous(m, x), p.contiguous(m, g)], mode=mode, padding_mode=pad,
                 align_corners=align)


@parser("RoiAlign")
def _p_roi_align(p, m, node, ins):
    """RoiAlign (X [N, C, H, W], rois [R, 4], batch_indices [R] int64) -> [R, C, output_height, output_width]."""
    x, rois, b = ins[0], ins[1], ins[2]
    require_float(p, x, "X")
    if rois.shape.dtype != x.shape.dtype:
        raise p.err(f"rois type {rois.shape.dtype} differs from X type {x.shape.dtype}")
    if b.shape.dtype != "int64":
        raise p.err(f"batch_indices must be int64, got {b.shape.dtype}")
    mode = decode(attr(node, "mode", b"avg"))
    if mode not in ("avg", "max"):
        raise p.err(f"'mode' = '{mode}' is not one of 'avg', 'max'")
    # any coordinate_transformation_mode other than half_pixel is output_half_pixel, as onnxruntime reads it
    ctm = decode(attr(node, "coordinate_transformation_mode", b"half_pixel" if p.opset >= 16 else b"output_half_pixel"))
    oh, ow = int(attr(node, "output_height", 1)), int(attr(node, "output_width", 1))
    sr = int(attr(node, "sampling_ratio", 0))
    if oh < 1 or ow < 1 or sr < 0:
        raise p.err(f"output_height {oh} / output_width {ow} must be >= 1 and sampling_ratio {sr} >= 0")
    if x.shape.ndim != 4 or rois.shape.ndim != 2 or rois.shape.lens[1] != 4 or b.shape.ndim != 1 \
            or b.shape.lens[0] != rois.shape.lens[0]:
        raise p.err(f"X {list(x.shape.lens)}, rois {list(rois.shape.lens)}, batch_indices {list(b.shape.lens)}: "
                    f"expected [N, C, H, W], [R, 4], [R]")
    return p.add(m, "roi_align", [p.contiguous(m, x), p.contiguous(m, rois), p.contiguous(m, b)], mode=mode,
                 output_height=oh, output_width=ow, sampling_ratio=sr,
                 spatial_scale=float(attr(node, "spatial_scale", 1.0)), half_pixel=int(ctm == "half_pixel"))


@parser("AffineGrid")
def _p_affine_grid(p, m, node, ins):
    """AffineGrid (theta [N, 2, 3] or [N, 3, 4], size [N, C, H, W] or [N, C, D, H, W]) -> [N, H, W, 2] or
    [N, D, H, W, 3]."""
    theta = ins[0]
    require_float(p, theta, "theta")
    align = check_choice(p, int(attr(node, "align_corners", 0)), (0, 1), "align_corners")
    lens = list(theta.shape.lens)
    if lens[1:] not in ([2, 3], [3, 4]):
        raise p.err(f"theta {lens} must be [N, 2, 3] (2-D) or [N, 3, 4] (3-D)")
    if len(ins) < 2 or ins[1] is None:
        raise p.err("input 'size' is missing")
    nd = lens[1]
    size = check_count(p, np.asarray(p.const(ins[1], "size")).reshape(-1), nd + 2, "size",
                       f"theta {lens} is {nd}-D")
    check_min(p, size, 1, "size")
    if size[0] != lens[0]:
        raise p.err(f"size {size} has batch {size[0]}, theta {lens} has {lens[0]}")
    return p.add(m, "affine_grid", [p.contiguous(m, theta)], size=size, align_corners=align)
