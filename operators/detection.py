"""Object-detection ops: ONNX NonMaxSuppression.

The number of selected boxes depends on the data.  ``nms`` therefore writes every selected
``[batch, class, box]`` row into a buffer of the largest possible size and the count into a scalar;
the parser guards the count (the one value the host reads back) and slices the buffer to it.  On the
gpu target both steps are kernels of ``nms.cu`` over declared workspaces (:mod:`.vision_gpu`), so they
are captured.

ONNX spec: https://onnx.ai/onnx/operators/onnx__NonMaxSuppression.html; the selection rules follow
onnxruntime's CPU kernel (strict ``score > score_threshold`` and ``IoU > iou_threshold``, ties by the
lower box index, zero-area boxes never suppress).
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.shape import Shape
from .base import Operation, register_op


def _corners(b: np.ndarray, center: int):
    """(x_lo, x_hi, y_lo, y_hi) of boxes ``b`` [..., 4] in float32, as onnxruntime computes them."""
    if center == 0:  # [y1, x1, y2, x2]
        return (np.minimum(b[..., 1], b[..., 3]), np.maximum(b[..., 1], b[..., 3]),
                np.minimum(b[..., 0], b[..., 2]), np.maximum(b[..., 0], b[..., 2]))
    w, h = b[..., 2] / np.float32(2), b[..., 3] / np.float32(2)
    return b[..., 0] - w, b[..., 0] + w, b[..., 1] - h, b[..., 1] + h


def suppressed_by(box: np.ndarray, others: np.ndarray, center: int, iou_threshold: np.float32) -> np.ndarray:
    """Which of ``others`` [K, 4] have IoU > ``iou_threshold`` with ``box`` [4] (bool [K])."""
    x1lo, x1hi, y1lo, y1hi = _corners(box, center)
    x2lo, x2hi, y2lo, y2hi = _corners(others, center)
    with np.errstate(invalid="ignore", over="ignore"):
        ixlo, ixhi = np.maximum(x1lo, x2lo), np.minimum(x1hi, x2hi)
        iylo, iyhi = np.maximum(y1lo, y2lo), np.minimum(y1hi, y2hi)
        inter = (ixhi - ixlo) * (iyhi - iylo)
        a1 = (x1hi - x1lo) * (y1hi - y1lo)
        a2 = (x2hi - x2lo) * (y2hi - y2lo)
        union = a1 + a2 - inter
        ok = (ixhi > ixlo) & (iyhi > iylo) & (inter > 0) & (a1 > 0) & (a2 > 0) & (union > 0)
        iou = np.where(ok, inter / np.where(ok, union, np.float32(1)), np.float32(0))
    return ok & (iou > iou_threshold)


def select_class(boxes: np.ndarray, scores: np.ndarray, max_out: int, iou: np.float32, center: int,
                 score_threshold) -> list:
    """Greedy selection for one (batch, class): box indices in the order they are kept."""
    keep = ~np.isnan(scores)
    if score_threshold is not None:
        keep &= scores > score_threshold
    cand = np.flatnonzero(keep)
    order = cand[np.argsort(-scores[cand], kind="stable")]  # descending, ties by lower index
    kept: list[int] = []
    while order.size and len(kept) < max_out:
        i = int(order[0])
        kept.append(i)
        rest = order[1:]
        order = rest[~suppressed_by(boxes[i], boxes[rest], center, iou)]
    return kept


@register_op
class NonMaxSuppression(Operation):
    """``nms(boxes [B, N, 4], scores [B, C, N], iou_threshold [], score_threshold [] (when has_score))``
    -> (rows int64 [B*C*min(max_out, N), 3] with the selected ``[batch, class, box]`` first, count int64 []).

    ``max_out`` is max_output_boxes_per_class (> 0; the parser handles 0); ``center_point_box`` 0 means
    boxes ``[y1, x1, y2, x2]``, 1 means ``[x_center, y_center, width, height]``.  float32 only.
    """

    name = "nms"
    float32_only = True  # float32 boxes and scores only; quantize_fp16 keeps it in float32

    def __init__(self, max_out=1, center_point_box=0, has_score=0):
        super().__init__(max_out=int(max_out), center_point_box=int(center_point_box), has_score=int(has_score))

    def compute_shape(self, inputs, mods=()):
        n_in = 4 if self.has_score else 3
        if len(inputs) != n_in:
            raise ShapeError(f"{self.name}: expects {n_in} inputs, got {len(inputs)}")
        boxes, scores = inputs[0], inputs[1]
        if boxes.ndim != 3 or boxes.lens[2] != 4 or scores.ndim != 3 or scores.lens[0] != boxes.lens[0] \
                or scores.lens[2] != boxes.lens[1]:
            raise ShapeError(f"{self.name}: boxes must be [B, N, 4] and scores [B, C, N], got {list(boxes.lens)} "
                             f"and {list(scores.lens)}")
        if any(s.dtype != "float32" for s in inputs):
            raise ShapeError(f"{self.name}: boxes, scores and thresholds must be float32, got "
                             f"{[s.dtype for s in inputs]}")
        if any(s.elements() != 1 for s in inputs[2:]):
            raise ShapeError(f"{self.name}: thresholds must hold one value, got {[list(s.lens) for s in inputs[2:]]}")
        if self.max_out < 1:
            raise ShapeError(f"{self.name}: max_out must be >= 1, got {self.max_out}")
        return (Shape("int64", [self._cap(boxes, scores), 3]), Shape("int64", []))

    def _cap(self, boxes: Shape, scores: Shape) -> int:
        return scores.lens[0] * scores.lens[1] * min(self.max_out, boxes.lens[1])

    def compute(self, ctx, out, args, ws):
        boxes, scores = np.asarray(args[0]), np.asarray(args[1])
        iou = np.float32(np.asarray(args[2]).reshape(-1)[0])
        sthr = np.float32(np.asarray(args[3]).reshape(-1)[0]) if self.has_score else None
        rows = []
        for b in range(scores.shape[0]):
            for c in range(scores.shape[1]):
                for i in select_class(boxes[b], scores[b, c], self.max_out, iou, self.center_point_box, sthr):
                    rows.append((b, c, i))
        sel, count = out
        sel.fill(0)
        if rows:
            sel[:len(rows)] = np.asarray(rows, np.int64)
        count[...] = len(rows)
