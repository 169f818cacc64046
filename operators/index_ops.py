"""Scans, one-hot encodings, reversals and selections along an axis (ONNX CumSum, OneHot,
ReverseSequence, Compress, Hardmax, the diagonal view of Einsum), the line kernels ArgMax / ArgMin use
on the gpu target and TopK's NaN-aware order.

The gpu kernels (:mod:`.index_gpu`) are in ``line_ops.cu`` (compiled per element type, here) or are
CuPy elementwise kernels; all write into ``out`` and declared workspaces, so they are captured.  NaN
rules follow onnxruntime (CPU): ArgMax / ArgMin start from the first element and a NaN never compares;
Hardmax marks the first maximum of the non-NaN values.

ONNX spec: https://onnx.ai/onnx/operators/ (the operators named above).
"""
from __future__ import annotations

import functools
import os

import numpy as np

from ..errors import ExecutionError, ShapeError
from ..ir.shape import Shape
from .base import Operation, check_inputs, normalize_axis, register_op

_HERE = os.path.dirname(os.path.abspath(__file__))
_CTYPES = {"float16": "__half", "float32": "float", "float64": "double", "int8": "signed char",
           "uint8": "unsigned char", "int16": "short", "uint16": "unsigned short", "int32": "int",
           "uint32": "unsigned int", "int64": "long long", "uint64": "unsigned long long"}
NUMERIC = tuple(_CTYPES)
FLOATS = ("float16", "float32", "float64")
BLOCK = 256  # threads per block of the line kernels (MGX_BLOCK in line_ops.cu)


@functools.lru_cache(maxsize=None)
def line_module(dtype: str):
    """The ``line_ops.cu`` module compiled for element type ``dtype`` (CuPy RawModule)."""
    import cupy

    with open(os.path.join(_HERE, "line_ops.cu")) as f:
        src = f.read()
    acc = "float" if dtype == "float16" else _CTYPES[dtype]
    head = _HALF_HEADER if dtype == "float16" else ""
    return cupy.RawModule(code=head + f"typedef {_CTYPES[dtype]} T;\ntypedef {acc} ACC;\n" + src)


@functools.lru_cache(maxsize=None)
def line_function(dtype: str, name: str):
    """Kernel ``name`` of :func:`line_module` for ``dtype``, looked up once (launch paths call it per run)."""
    return line_module(dtype).get_function(name)


_HALF_HEADER = """#if defined(__HIPCC_RTC__) || defined(__HIPCC__)
#include <hip/hip_fp16.h>
#else
#include <cuda_fp16.h>
#endif
"""


def _lines(lens, axis):
    """(outer, n, inner) of a standard layout around ``axis``."""
    outer = int(np.prod(lens[:axis])) if axis else 1
    inner = int(np.prod(lens[axis + 1:])) if axis + 1 < len(lens) else 1
    return outer, int(lens[axis]), inner


def _standard(x: Shape) -> list[Shape]:
    """A workspace holding a standard copy of ``x`` when it is a strided view, else none."""
    return [] if x.standard() else [Shape(x.dtype, x.lens)]


def _staged(ctx, x, ws):
    if ws:
        ctx.xp.copyto(ws[0], x)
        return ws[0]
    return x


# ---------------------------------------------------------------------------------------------------
# ArgMax / ArgMin on the gpu target (the ops themselves are in reduce.py)
# ---------------------------------------------------------------------------------------------------
def argext_host(xp, x, axis: int, is_min: bool, last: bool):
    """ArgMax / ArgMin of ``x`` along ``axis`` (int64, axis removed) with onnxruntime's NaN rule:
    a line whose first element is NaN gives 0; otherwise NaNs are skipped and the first (``last``:
    the final) position of the extreme value is returned."""
    n = x.shape[axis]
    if x.dtype.kind != "f":
        xs = xp.flip(x, axis=axis) if last else x
        r = (xp.argmin if is_min else xp.argmax)(xs, axis=axis)
        return (n - 1) - r if last else r
    nan = xp.isnan(x)
    fill = np.inf if is_min else -np.inf
    clean = xp.where(nan, x.dtype.type(fill), x)
    ext = (xp.amin if is_min else xp.amax)(clean, axis=axis, keepdims=True)
    hit = (x == ext)  # NaN never equals: only real positions of the extreme value
    if last:
        r = (n - 1) - xp.argmax(xp.flip(hit, axis=axis), axis=axis)
    else:
        r = xp.argmax(hit, axis=axis)
    first_nan = xp.take(nan, 0, axis=axis)
    return xp.where(first_nan | ~xp.any(hit, axis=axis), 0, r)


ROW_BLOCK = 1024  # threads per block of mgx_argmax_rows (MGX_ROW_BLOCK in line_ops.cu)


def argmax_rows(ctx, x, out) -> None:
    """``out[r] = numpy.argmax(x[r])`` for each row of ``x`` [rows, n] (float16 / float32 / float64,
    each row contiguous), written into ``out`` (int64 [rows], contiguous) on the current queue: the
    first index of the largest value, or of the first NaN when a row has one.  On the gpu target one
    kernel of one block per row (``mgx_argmax_rows``: 16-byte loads where the rows allow them, no
    allocation, capturable); elsewhere ``xp.argmax``.  Raises ShapeError for another layout or type."""
    xp = ctx.xp
    if x.ndim != 2 or out.shape != (x.shape[0],) or out.dtype != np.int64 or x.shape[1] < 1:
        raise ShapeError(f"argmax_rows: x {list(x.shape)} ({x.dtype}) and out {list(out.shape)} ({out.dtype}): "
                         f"expected x [rows, n >= 1] and out int64 [rows]")
    if x.dtype.name not in FLOATS or x.strides[1] != x.itemsize or not out.flags.c_contiguous:
        raise ShapeError(f"argmax_rows: x of {x.dtype} with strides {x.strides}: expected float16 / float32 / "
                         f"float64 rows with contiguous elements and a contiguous out")
    if xp is np:
        np.argmax(x, axis=1, out=out)
        return
    rows, n = x.shape
    stride = x.strides[0] // x.itemsize if rows > 1 else n
    vec = ctx.data_ptr(x) % 16 == 0 and (rows == 1 or (stride * x.itemsize) % 16 == 0)
    block = min(ROW_BLOCK, 1 << max(5, (n - 1).bit_length()))
    k = line_function(x.dtype.name, "mgx_argmax_rows")
    k((rows,), (block,), (x, out, np.int64(n), np.int64(stride), np.int32(vec)))


ADVANCE_MAX_BLOCKS = 4 * BLOCK  # most blocks of mgx_argmax_advance (its last block merges one candidate each)


def advance_plan(n: int, itemsize: int) -> tuple[int, int]:
    """``(blocks, chunk)`` of ``mgx_argmax_advance`` over ``n`` values of ``itemsize`` bytes: one 16-byte
    load per thread of a block (at most :data:`ADVANCE_MAX_BLOCKS` blocks, then more per thread), each
    block's ``chunk`` a whole number of 16-byte vectors."""
    v = 16 // itemsize
    blocks = min(ADVANCE_MAX_BLOCKS, -(-n // (BLOCK * v)))
    chunk = -(-(-(-n // blocks)) // v) * v  # ceil(n / blocks), rounded up to whole vectors
    return -(-n // chunk), chunk


class ArgmaxAdvance:
    """The greedy decode loop's step tail on the gpu target, one launch (``line_ops.cu``'s
    ``mgx_argmax_advance``) for a logits row of ``n`` values of ``dtype`` (float16 / float32 / float64):
    ``numpy.argmax`` of the row (the first largest value, or the first NaN) written to the next step's
    input id, to page-locked host memory through its device address (the read-back needs no copy) and,
    optionally, the next step's slot to ``cache_position``.  The row is split over several blocks (one
    16-byte load per thread where the row start is aligned; the row of one block of ``mgx_argmax_rows``
    takes about 10 us at SmolLM2's 49152 on an H200); the last block to finish merges their candidates.
    Holds its workspace (a candidate per block and the blocks' counter), made here once: a launch
    allocates nothing.  Raises ShapeError for an empty row or another dtype."""

    def __init__(self, ctx, n: int, dtype):
        dtype = np.dtype(dtype)
        if dtype.name not in FLOATS or int(n) < 1:
            raise ShapeError(f"ArgmaxAdvance: a row of {n} {dtype} values: expected n >= 1 float16 / float32 / "
                             f"float64")
        self.ctx, self.n, self.dtype = ctx, int(n), dtype
        self.blocks, self.chunk = advance_plan(self.n, dtype.itemsize)
        xp = ctx.xp
        acc = np.float32 if dtype == np.float16 else dtype
        self.part_v = xp.empty((self.blocks,), acc)
        self.part_i = xp.empty((self.blocks,), np.int64)
        self.count = xp.zeros((1,), np.uint32)  # the kernel's last block sets it back to 0

    def __call__(self, x, ids, host_ptr: int, pos=None, next_pos: int = 0) -> None:
        """Queue the step tail on the current queue: ``x`` the logits (``n`` values of ``dtype``,
        contiguous), ``ids`` int64 (its first element gets the id), ``host_ptr`` the device address of
        page-locked host memory for one int64 (:meth:`~mgx_graph.targets.host_reader.HostReader.start_written`),
        ``pos`` int64 (its first element gets ``next_pos``; None: not written).  Raises ShapeError for other
        logits, or ids / pos that are not int64 arrays of at least one element (the kernel writes one int64
        to each)."""
        if x.size != self.n or x.dtype != self.dtype or not x.flags.c_contiguous or ids.dtype != np.int64 \
                or ids.size < 1:
            raise ShapeError(f"ArgmaxAdvance: logits {x.dtype}{list(x.shape)} and ids {ids.dtype}{list(ids.shape)}: "
                             f"expected {self.n} contiguous {self.dtype} values and int64 ids of at least one element")
        if pos is not None and (pos.dtype != np.int64 or pos.size < 1):
            raise ShapeError(f"ArgmaxAdvance: pos {pos.dtype}{list(pos.shape)}: expected int64 of at least one "
                             f"element (the kernel writes one int64 there)")
        ctx = self.ctx
        vec = int(ctx.data_ptr(x) % 16 == 0)
        k = line_function(self.dtype.name, "mgx_argmax_advance")
        pos_ptr = np.uint64(ctx.data_ptr(pos)) if pos is not None else np.uint64(0)
        k((self.blocks,), (BLOCK,), (x, np.int64(self.n), np.int64(self.chunk), np.int32(vec), ids,
                                     np.uint64(host_ptr), pos_ptr, np.int64(next_pos), self.part_v, self.part_i,
                                     self.count))


# ---------------------------------------------------------------------------------------------------
# TopK's order (the op is in shape_ops.py)
# ---------------------------------------------------------------------------------------------------
def _stable_argsort(xp, key, axis):
    return xp.argsort(key, axis=axis, kind="stable") if xp is np else xp.argsort(key, axis=axis)  # CuPy: stable


def topk_order(xp, x, axis: int, largest: bool):
    """Positions along ``axis`` in TopK order: descending (``largest``) or ascending, ties by the lower
    index, NaN ranked above +inf (first when largest, last otherwise) as onnxruntime (CPU, from 1.32)
    orders them.

    NaNs are ordered by an explicit second stable pass rather than by the sort itself, since numpy
    and CuPy do not place NaN keys alike."""
    nan = xp.isnan(x) if x.dtype.kind == "f" else None
    key = xp.where(nan, x.dtype.type(0), x) if nan is not None else x
    if x.dtype.kind == "b":
        key = -x.astype(np.int8) if largest else x.astype(np.int8)
    elif x.dtype.kind == "u" and largest:
        key = np.iinfo(x.dtype).max - x  # unsigned: negation wraps around
    elif x.dtype.kind == "i" and largest:
        key = ~x  # -1 - x: descending without the wrap of -x at the type's minimum
    elif largest:
        key = -key
    order = _stable_argsort(xp, key, axis)
    if nan is not None:  # NaNs to the front (largest) or the back, each group keeping its order
        flag = xp.take_along_axis(nan, order, axis).astype(np.int8)
        order = xp.take_along_axis(order, _stable_argsort(xp, -flag if largest else flag, axis), axis)
    return order


# ---------------------------------------------------------------------------------------------------
# Hardmax
# ---------------------------------------------------------------------------------------------------
@register_op
class Hardmax(Operation):
    """ONNX Hardmax (opset 13: along ``axis``; the parser flattens for older opsets): 1 at the first
    maximum of each line's non-NaN values, 0 elsewhere; a line starting with NaN is all 0 (onnxruntime's
    rule: its line maximum starts from the first element and a NaN never compares; no element equals a
    NaN maximum; docs/nan_semantics.md).  Float types."""

    name = "hardmax"

    def __init__(self, axis=-1):
        super().__init__(axis=int(axis))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        x = inputs[0]
        if x.dtype not in FLOATS:
            raise ShapeError(f"{self.name}: needs a floating-point input, got {x.dtype}")
        normalize_axis(self.axis, x.ndim, self.name)
        return Shape(x.dtype, x.lens)

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        a = self.axis % x.ndim
        nan = xp.isnan(x)
        top = xp.amax(xp.where(nan, x.dtype.type(-np.inf), x), axis=a, keepdims=True)
        hit = x == top
        first = xp.expand_dims(xp.argmax(hit, axis=a), a)
        pos = xp.arange(x.shape[a]).reshape([-1 if i == a else 1 for i in range(x.ndim)])
        lead = xp.take(x, xp.zeros(1, dtype=np.int64), axis=a)
        out[...] = (pos == first) & xp.any(hit, axis=a, keepdims=True) & (lead == lead)


# ---------------------------------------------------------------------------------------------------
# CumSum
# ---------------------------------------------------------------------------------------------------
@register_op
class CumSum(Operation):
    """ONNX CumSum along ``axis`` (resolved by the parser from the ``axis`` input); ``exclusive``
    starts each line from 0, ``reverse`` scans from the end.  float16 accumulates in float32 (as
    onnxruntime); integer types wrap.  Output: the input's shape and type."""

    name = "cumsum"
    identity = 0  # the value an exclusive scan starts from

    def __init__(self, axis=0, exclusive=0, reverse=0):
        super().__init__(axis=int(axis), exclusive=int(exclusive), reverse=int(reverse))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        x = inputs[0]
        if x.dtype not in NUMERIC:
            raise ShapeError(f"{self.name}: needs a numeric input, got {x.dtype}")
        normalize_axis(self.axis, max(x.ndim, 1), self.name)
        return Shape(x.dtype, x.lens)

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        if x.ndim == 0:
            xp.copyto(out, self.identity if self.exclusive else x)
            return
        a = self.axis % x.ndim
        o = out
        if self.reverse:
            x, o = xp.flip(x, axis=a), xp.flip(out, axis=a)
        acc = np.float32 if x.dtype == np.float16 else x.dtype
        if self.exclusive:
            head = (slice(None),) * a
            o[head + (slice(0, 1),)] = self.identity
            o[head + (slice(1, None),)] = getattr(xp, self.name)(x[head + (slice(0, -1),)], axis=a, dtype=acc)
        else:
            o[...] = getattr(xp, self.name)(x, axis=a, dtype=acc)


@register_op
class CumProd(CumSum):
    """ONNX CumProd (opset 26) along ``axis``: the running product, as CumSum (``exclusive`` starts
    each line from 1).  float16 accumulates in float32; integer types wrap.  Output: the input's shape
    and type."""

    name = "cumprod"
    identity = 1


# ---------------------------------------------------------------------------------------------------
# OneHot
# ---------------------------------------------------------------------------------------------------
@register_op
class OneHot(Operation):
    """ONNX OneHot.  Inputs: ``indices`` (int32/int64, already unsqueezed at the depth axis by the
    parser), ``positions`` (``0..depth-1`` laid along that axis, same type) and ``values``
    (``[off, on]``).  ``out = on where (indices < 0 ? indices + depth : indices) == positions else off``;
    indices outside ``[-depth, depth)`` give an all-``off`` line, as onnxruntime."""

    name = "onehot"

    def __init__(self, depth=1):
        super().__init__(depth=int(depth))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 3)
        ind, pos, val = inputs
        if ind.dtype != pos.dtype or ind.dtype not in ("int32", "int64"):
            raise ShapeError(f"{self.name}: indices/positions must be int32/int64 of one type, got "
                             f"{ind.dtype}/{pos.dtype}")
        if val.elements() != 2:
            raise ShapeError(f"{self.name}: values must hold 2 elements [off, on], got {list(val.lens)}")
        lens = np.broadcast_shapes(tuple(ind.lens), tuple(pos.lens))
        return Shape(val.dtype, lens)

    def compute(self, ctx, out, args, ws):
        xp = ctx.xp
        ind, pos, val = args
        flat = val.reshape(-1)
        d = ind.dtype.type(self.depth)
        out[...] = xp.where(xp.where(ind < 0, ind + d, ind) == pos, flat[1], flat[0])


# ---------------------------------------------------------------------------------------------------
# ReverseSequence
# ---------------------------------------------------------------------------------------------------
@register_op
class ReverseSequence(Operation):
    """ONNX ReverseSequence: inputs ``x`` (rank >= 2) and ``sequence_lens`` ([batch], int32/int64);
    for each batch entry b the first ``sequence_lens[b]`` steps along ``time_axis`` are reversed, the
    rest copied.  ``batch_axis`` / ``time_axis`` are 0 and 1 in either order.  A length outside
    ``[0, time steps]`` raises ExecutionError on the host (as onnxruntime); the gpu kernel clamps it."""

    name = "reverse_sequence"

    def __init__(self, batch_axis=1, time_axis=0):
        super().__init__(batch_axis=int(batch_axis), time_axis=int(time_axis))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 2)
        x, lens = inputs
        if sorted((self.batch_axis, self.time_axis)) != [0, 1] or x.ndim < 2:
            raise ShapeError(f"{self.name}: batch_axis/time_axis must be 0 and 1 of a rank >= 2 input, got "
                             f"{self.batch_axis}/{self.time_axis} for {list(x.lens)}")
        if lens.dtype not in ("int32", "int64") or list(lens.lens) != [x.lens[self.batch_axis]]:
            raise ShapeError(f"{self.name}: sequence_lens must be int32/int64 [{x.lens[self.batch_axis]}], got "
                             f"{lens.dtype} {list(lens.lens)}")
        return Shape(x.dtype, x.lens)

    def compute(self, ctx, out, args, ws):
        xp, (x, lens) = ctx.xp, args
        T = x.shape[self.time_axis]
        if xp is np and lens.size and (lens.min() < 0 or lens.max() > T):
            bad = int(lens[(lens < 0) | (lens > T)][0])
            raise ExecutionError(f"{self.name}: sequence length {bad} is outside [0, {T}] (time axis "
                                 f"{self.time_axis} of {list(x.shape)})")
        tshape, bshape = [1] * x.ndim, [1] * x.ndim
        tshape[self.time_axis], bshape[self.batch_axis] = T, lens.shape[0]
        t = xp.arange(T).reshape(tshape)
        L = xp.clip(lens.astype(np.int64), 0, T).reshape(bshape)
        idx = xp.where(t < L, L - 1 - t, t)  # the source step of each (batch, step)
        out[...] = xp.take_along_axis(x, xp.broadcast_to(idx, x.shape), self.time_axis)


# ---------------------------------------------------------------------------------------------------
# Compress
# ---------------------------------------------------------------------------------------------------
@register_op
class Compress(Operation):
    """ONNX Compress along ``axis``: the slices of ``x`` where ``condition`` (1-D bool, already cut to
    the axis length by the parser) is true.  ``count`` (the number of true entries) is the value the
    program is specialized for; a ``guard`` on the device-side count re-checks it every run."""

    name = "compress"

    def __init__(self, axis=0, count=0):
        super().__init__(axis=int(axis), count=int(count))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 2)
        x, cond = inputs
        a = normalize_axis(self.axis, x.ndim, self.name)
        if cond.dtype != "bool" or cond.ndim != 1 or cond.lens[0] > x.lens[a]:
            raise ShapeError(f"{self.name}: condition must be 1-D bool of at most {x.lens[a]} entries, got "
                             f"{cond.dtype} {list(cond.lens)}")
        lens = list(x.lens)
        lens[a] = self.count
        return Shape(x.dtype, lens)

    def compute(self, ctx, out, args, ws):
        xp, (x, cond) = ctx.xp, args
        idx = xp.flatnonzero(cond)
        if idx.size != self.count:
            raise ExecutionError(f"{self.name}: condition has {idx.size} true entries, the program was "
                                 f"specialized for {self.count}")
        xp.take(x, idx, axis=self.axis % x.ndim, out=out)


# ---------------------------------------------------------------------------------------------------
# diagonal (a view; Einsum with a label repeated in one operand)
# ---------------------------------------------------------------------------------------------------
@register_op
class Diagonal(Operation):
    """A view of the diagonal of ``x``: ``labels`` has one label per axis; axes sharing a label become
    one axis (their lengths must agree; its stride is the sum of theirs), ordered by each label's
    first appearance.  ``labels=[0, 0]`` of a ``[n, n]`` matrix is its main diagonal ``[n]``.  No kernel."""

    name = "diagonal"
    is_view = True
    alloc_free = True

    def __init__(self, labels=()):
        super().__init__(labels=[int(v) for v in labels])

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        x = inputs[0]
        if len(self.labels) != x.ndim:
            raise ShapeError(f"{self.name}: {len(self.labels)} labels for rank {x.ndim}")
        lens: dict = {}
        strides: dict = {}
        for ax, lab in enumerate(self.labels):
            if lab not in lens:
                lens[lab], strides[lab] = x.lens[ax], x.strides[ax]
            elif lens[lab] != x.lens[ax]:
                raise ShapeError(f"{self.name}: axes labelled {lab} have lengths {lens[lab]} and {x.lens[ax]} "
                                 f"(input {list(x.lens)})")
            else:
                strides[lab] += x.strides[ax]
        return Shape(x.dtype, list(lens.values()), list(strides.values()))

    def view(self, xp, x, shape):
        return xp.lib.stride_tricks.as_strided(x, shape.lens, shape.byte_strides())

    def launches(self, inputs, output):
        return 0
