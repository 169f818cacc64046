"""Transposed convolution (ONNX ConvTranspose) as GEMM + col2im.

x ``[N, C, *S]``, w ``[C, M/group, *K]``, optional bias ``[M]`` -> y ``[N, M, *O]``.  Per image one
(group-batched) GEMM ``col[g] = w[g]^T @ x[g]`` gives every kernel tap's contribution ``[M/group * prod(K),
prod(S)]``; col2im then adds, for each kernel offset ``j`` (a small static loop), the ``[N, M, *S]`` slab of
taps into the strided view ``full[..., i*s + j*d]`` of a zeroed scratch buffer of the uncropped output;
the output is the window ``full[..., pb:pb + O]`` of it, plus the bias.  Everything writes into ``out`` or
declared workspaces, and the GEMM runs as vendor BLAS on the gpu target, so the op can be captured.
The parser resolves pads, ``output_padding``, ``output_shape`` and ``auto_pad`` into ``pads_begin`` and
``out_lens``.  Source: ONNX operator spec, ConvTranspose-22.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ShapeError
from ..ir.shape import Shape
from .base import Operation, check_inputs, register_op


def accumulate_taps(xp, grid, taps, kernel, blocks, stride, dilation):
    """col2im: ``grid[..., b*s + j*d] += taps[..., j, b]`` for every kernel offset ``j`` (a small static loop)
    and block ``b``; ``grid`` is ``[lead..., *spatial]``, ``taps`` ``[lead..., *kernel, *blocks]``."""
    lead = (slice(None),) * (grid.ndim - len(kernel))
    for j in np.ndindex(*kernel):
        dst = grid[lead + tuple(slice(jj * d, jj * d + (b - 1) * st + 1, st)
                                for jj, d, b, st in zip(j, dilation, blocks, stride))]
        xp.add(dst, taps[lead + j], out=dst)


@register_op
class ConvTranspose(Operation):
    """See the module docstring.  Attributes: ``stride``, ``dilation``, ``pads_begin``, ``out_lens`` (one
    int per spatial axis) and ``group``.  Inputs must be standard (packed) arrays: the parser makes them so.
    Raises ShapeError when the channel counts do not match ``group`` or the output would be empty."""
    uses_blas = True  # its kernel calls ctx.matmul: the queue's BLAS handle must exist before a capture

    name = "conv_transpose"
    alloc_free = True

    def __init__(self, stride=(), dilation=(), pads_begin=(), out_lens=(), group=1):
        super().__init__(stride=[int(s) for s in stride], dilation=[int(d) for d in dilation],
                         pads_begin=[int(p) for p in pads_begin], out_lens=[int(o) for o in out_lens],
                         group=int(group))

    def _full(self, x_lens, w_lens):
        nsp = len(x_lens) - 2
        return [max((x_lens[2 + i] - 1) * self.stride[i] + (w_lens[2 + i] - 1) * self.dilation[i] + 1,
                    self.pads_begin[i] + self.out_lens[i]) for i in range(nsp)]

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, (2, 3))
        x, w = inputs[0], inputs[1]
        g = self.group
        nsp = x.ndim - 2
        if nsp < 1 or w.ndim != x.ndim:
            raise ShapeError(f"conv_transpose: input {list(x.lens)} and weights {list(w.lens)} ranks do not match")
        if g < 1 or x.lens[1] != w.lens[0] or x.lens[1] % g:
            raise ShapeError(f"conv_transpose: input channels {x.lens[1]} do not match weights {list(w.lens)} "
                             f"(expected [C, M/group, ...] with C divisible by group {g})")
        if w.dtype != x.dtype:
            raise ShapeError(f"conv_transpose: input type {x.dtype} != weight type {w.dtype}")
        for what in ("stride", "dilation", "pads_begin", "out_lens"):
            if len(getattr(self, what)) != nsp:
                raise ShapeError(f"conv_transpose: {what} {getattr(self, what)} does not have {nsp} values")
        if any(o <= 0 for o in self.out_lens):
            raise ShapeError(f"conv_transpose: empty output {self.out_lens} for input {list(x.lens)}")
        M = w.lens[1] * g
        if len(inputs) > 2 and tuple(inputs[2].lens) != (M,):
            raise ShapeError(f"conv_transpose: bias {list(inputs[2].lens)} != [{M}]")
        return Shape(x.dtype, [x.lens[0], M] + self.out_lens)

    def workspace(self, inputs, output):
        x, w = inputs[0], inputs[1]
        g = self.group
        rows = w.lens[1] * math.prod(w.lens[2:])
        return [Shape(x.dtype, [x.lens[0], g, rows, math.prod(x.lens[2:])]),
                Shape(x.dtype, [x.lens[0], w.lens[1] * g] + self._full(x.lens, w.lens))]

    def compute(self, ctx, out, args, ws):
        xp = ctx.xp
        x, w = args[0], args[1]
        col, full = ws
        N, C = x.shape[:2]
        g = self.group
        Mg = w.shape[1]
        K, S = tuple(w.shape[2:]), tuple(x.shape[2:])
        nsp = len(S)
        P = math.prod(S)
        xr = x.reshape(N, g, C // g, P)
        wt = w.reshape(g, C // g, Mg * math.prod(K)).transpose(0, 2, 1)  # [g, Mg * prod(K), C/g]
        for n in range(N):
            ctx.matmul(wt, xr[n], col[n])
        full.fill(0)
        accumulate_taps(xp, full.reshape((N, g, Mg) + tuple(full.shape[2:])), col.reshape((N, g, Mg) + K + S),
                        K, S, self.stride, self.dilation)
        xp.copyto(out, full[(slice(None), slice(None)) + tuple(slice(pb, pb + o) for pb, o in
                                                              zip(self.pads_begin, self.out_lens))])
        if len(args) > 2:
            xp.add(out, args[2].reshape((-1,) + (1,) * nsp), out=out)

    def launches(self, inputs, output):
        x, w = inputs[0], inputs[1]
        return x.lens[0] + 1 + math.prod(w.lens[2:]) + 1 + (len(inputs) > 2)


@register_op
class Col2Im(Operation):
    """ONNX Col2Im: columns ``[N, C * prod(block), L]`` -> image ``[N, C, *image_shape]``, summing the
    overlapping blocks (``L`` = the number of block positions, row-major).  A zeroed padded scratch image
    takes every kernel offset's ``[N, C, *blocks]`` slab through one strided add (a small static loop), then
    the unpadded window is copied into ``out``.  Attributes (one int per spatial axis): ``image``,
    ``kernel``, ``stride``, ``dilation``, ``pads_begin``, ``pads_end``.  Source: ONNX Col2Im-18.
    Raises ShapeError when the input does not hold ``C * prod(block)`` rows of ``L`` blocks."""

    name = "col2im"
    alloc_free = True

    def __init__(self, image=(), kernel=(), stride=(), dilation=(), pads_begin=(), pads_end=()):
        super().__init__(**{k: [int(v) for v in vals] for k, vals in dict(
            image=image, kernel=kernel, stride=stride, dilation=dilation, pads_begin=pads_begin,
            pads_end=pads_end).items()})

    def blocks(self):
        return [(i + pb + pe - d * (k - 1) - 1) // s + 1 for i, k, s, d, pb, pe in
                zip(self.image, self.kernel, self.stride, self.dilation, self.pads_begin, self.pads_end)]

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        x = inputs[0]
        kprod, blocks = math.prod(self.kernel), self.blocks()
        if x.ndim != 3 or x.lens[1] % kprod or any(b < 1 for b in blocks) or x.lens[2] != math.prod(blocks):
            raise ShapeError(f"col2im: input {list(x.lens)} is not [N, C * {kprod}, {math.prod(blocks)}] "
                             f"for image {self.image}, block {self.kernel} ({blocks} block positions)")
        return Shape(x.dtype, [x.lens[0], x.lens[1] // kprod] + self.image)

    def workspace(self, inputs, output):
        return [Shape(output.dtype, list(output.lens[:2]) + [i + pb + pe for i, pb, pe in
                                                              zip(self.image, self.pads_begin, self.pads_end)])]

    def compute(self, ctx, out, args, ws):
        xp, x, full = ctx.xp, args[0], ws[0]
        N, C = out.shape[:2]
        blocks = self.blocks()
        full.fill(0)
        accumulate_taps(xp, full, x.reshape((N, C) + tuple(self.kernel) + tuple(blocks)), self.kernel, blocks,
                        self.stride, self.dilation)
        xp.copyto(out, full[(slice(None), slice(None)) + tuple(slice(pb, pb + i) for pb, i in
                                                              zip(self.pads_begin, self.image))])

    def launches(self, inputs, output):
        return 2 + math.prod(self.kernel)
