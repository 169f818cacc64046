"""Block-quantized weights: onnxruntime's com.microsoft::MatMulNBits (what onnxruntime-genai's model
builder and onnxruntime's ``matmul_nbits_quantizer`` make of a MatMul with int4 weights).

The weights stay packed in memory.  On ``ref`` (and for types the gpu kernels do not take) each run
dequantizes them into a workspace (a few elementwise kernels) and multiplies through the same GEMM path
as ``dot``, so the op allocates nothing and can be captured.  On ``gpu`` the kernels of
:mod:`.quantized_gpu` (``gemv_nbits.cu``) run instead: a fused dequantizing GEMV for a few rows (decode),
one dequantization kernel and a vendor-BLAS GEMM for more (prefill).

Source: onnxruntime ContribOperators.md, MatMulNBits: ``W[n, k] = (q[n, k] - zero_point[n, g(k)]) *
scale[n, g(k)]`` with ``g(k) = k // block_size`` (or ``g_idx[k]``), ``Y = A @ W^T (+ bias)``.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.shape import Shape
from .base import Operation, check_inputs, register_op
from .normalization_contrib import FLOATS

ZERO_POINTS = ("none", "packed", "float")


@register_op
class MatMulNBits(Operation):
    """``Y[..., N] = A[..., K] @ dequantize(B)^T (+ bias)``.

    Inputs, in this order (those present per ``zero_points`` / ``g_idx`` / ``bias``):
    A float [..., K] (standard layout); B uint8 [N, k_blocks, block_size * bits / 8] (``bits`` values
    per byte, the first in the low bits); scales [N, k_blocks] of A's type; zero points: ``packed``
    uint8 [N, ceil(k_blocks * bits / 8)] packed like B, or ``float`` [N, k_blocks] of a float type, or
    ``none`` (2^(bits-1)); g_idx int32 [K] (the block of each k; values in [0, k_blocks)); bias [N].
    k_blocks = ceil(K / block_size).  Output: A's type, [..., N].  bits: 2, 4 or 8.
    Raises ShapeError for inputs that do not match K / N / bits / block_size.
    """
    uses_blas = True  # its kernel calls ctx.matmul: the queue's BLAS handle must exist before a capture

    name = "matmul_nbits"
    alloc_free = True

    def __init__(self, K=0, N=0, bits=4, block_size=32, zero_points="none", g_idx=0, bias=0, kernel=None,
                 _const_b=0):
        # kernel: the gpu kernel's label, set at lowering (printed); _const_b: B is an initializer
        super().__init__(K=int(K), N=int(N), bits=int(bits), block_size=int(block_size),
                         zero_points=str(zero_points), g_idx=int(g_idx), bias=int(bias),
                         kernel=None if kernel is None else str(kernel), _const_b=int(_const_b))

    @property
    def k_blocks(self) -> int:
        return -(-self.K // self.block_size)

    def split_inputs(self, items):
        """(A, B, scales, zero points, g_idx, bias) of ``items`` (inputs or arguments), None where absent."""
        it = iter(items)
        a, b, scales = next(it), next(it), next(it)
        zp = next(it) if self.zero_points != "none" else None
        g = next(it) if self.g_idx else None
        bias = next(it) if self.bias else None
        return a, b, scales, zp, g, bias

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 3 + (self.zero_points != "none") + self.g_idx + self.bias)
        if self.bits not in (2, 4, 8) or self.zero_points not in ZERO_POINTS or self.block_size < 1:
            raise ShapeError(f"{self.name}: bits {self.bits} (2, 4 or 8), block size {self.block_size} or zero "
                             f"points '{self.zero_points}' not supported")
        a, b, scales, zp, g, bias = self.split_inputs(inputs)
        K, N, kb = self.K, self.N, self.k_blocks
        blob = self.block_size * self.bits // 8
        if a.dtype not in FLOATS or a.ndim < 1 or a.lens[-1] != K:
            raise ShapeError(f"{self.name}: A {a.brief()} must be float with last dim K = {K}")
        want = {"B": (b, "uint8", (N, kb, blob)), "scales": (scales, None, (N, kb))}
        if zp is not None:
            zlen = -(-kb * self.bits // 8) if self.zero_points == "packed" else kb
            want["zero_points"] = (zp, "uint8" if self.zero_points == "packed" else None, (N, zlen))
        if g is not None:
            want["g_idx"] = (g, "int32", (K,))
        if bias is not None:
            want["bias"] = (bias, None, (N,))
        for what, (s, dt, lens) in want.items():
            if tuple(s.lens) != lens or (s.dtype != dt if dt else s.dtype not in FLOATS):
                raise ShapeError(f"{self.name}: {what} {s.brief()} must be {dt or 'float'} {list(lens)} "
                                 f"(K={K}, N={N}, bits={self.bits}, block_size={self.block_size})")
        return Shape(a.dtype, list(a.lens[:-1]) + [N])

    def workspace(self, inputs, output):
        a = inputs[0]
        N, K, kp = self.N, self.K, self.k_blocks * self.block_size
        ws = [Shape("uint8", [N, kp]), Shape(a.dtype, [N, kp])]
        if self.zero_points == "packed":
            per = 8 // self.bits
            ws.append(Shape("uint8", [N, inputs[3].lens[1] * per]))
        if self.g_idx:
            zdt = {"none": a.dtype, "packed": "uint8", "float": inputs[3].dtype if self.zero_points == "float"
                   else a.dtype}[self.zero_points]
            ws += [Shape(zdt, [N, K]), Shape(inputs[2].dtype, [N, K])]
        return ws

    def compute(self, ctx, out, args, ws):
        xp = ctx.xp
        a, b, scales, zp, g, bias = self.split_inputs(args)
        N, K, kb, bs = self.N, self.K, self.k_blocks, self.block_size
        q, w = ws[0], ws[1]
        _unpack(xp, b, q.reshape(N, kb, bs // (8 // self.bits), 8 // self.bits), self.bits)
        xp.copyto(w, q)
        if self.zero_points == "packed":
            zq = ws[2]
            _unpack(xp, zp, zq.reshape(N, zp.shape[1], 8 // self.bits), self.bits)
            zp = zq[:, :kb]
        if g is None:
            self._dequantize_blocks(xp, w.reshape(N, kb, bs), scales, zp)
        else:
            self._dequantize_groups(xp, w[:, :K], scales, zp, g, ws[-2], ws[-1])
        if a.size == 0:
            return
        a2 = a.reshape(-1, K)
        o2 = out.reshape(-1, N)
        ctx.matmul(a2, w[:, :K].T, o2)
        if bias is not None:
            xp.add(o2, bias, out=o2)

    def _dequantize_blocks(self, xp, w3, scales, zp):
        """w3 [N, k_blocks, block_size] = (q - zero point of the block) * scale of the block."""
        if zp is None:
            xp.subtract(w3, w3.dtype.type(1 << (self.bits - 1)), out=w3)
        else:
            xp.subtract(w3, zp[:, :, None], out=w3)
        xp.multiply(w3, scales[:, :, None], out=w3)

    def _dequantize_groups(self, xp, wk, scales, zp, g, gz, gs):
        """wk [N, K] = (q - zero point of block g_idx[k]) * scale of block g_idx[k]."""
        if xp is np and g.size and (g.min() < 0 or g.max() >= self.k_blocks):
            raise IndexError(f"g_idx value {int(g.min() if g.min() < 0 else g.max())} is out of range "
                             f"[0, {self.k_blocks})")
        if zp is None:
            xp.subtract(wk, wk.dtype.type(1 << (self.bits - 1)), out=wk)
        else:
            xp.take(zp, g, axis=1, out=gz)
            xp.subtract(wk, gz, out=wk)
        xp.take(scales, g, axis=1, out=gs)
        xp.multiply(wk, gs, out=wk)

    def launches(self, inputs, output):
        per = 8 // self.bits
        unpack = 2 * per - (self.bits == 8)
        n = unpack + 1 + 2 + (unpack if self.zero_points == "packed" else 0) + 1 + self.bias
        return n + (2 if self.g_idx else 0) - (1 if self.g_idx and self.zero_points == "none" else 0)


def _unpack(xp, packed, dst, bits):
    """``dst[..., j] = (packed >> (bits * j)) & (2^bits - 1)`` for the ``8 // bits`` values of each byte
    (dst: a uint8 view [*packed.shape, 8 // bits])."""
    per = 8 // bits
    for j in range(per):
        d = dst[..., j]
        xp.right_shift(packed, np.uint8(bits * j), out=d)
        if bits * (j + 1) < 8:
            xp.bitwise_and(d, np.uint8((1 << bits) - 1), out=d)


@register_op
class GatherBlockQuantized(Operation):
    """Rows of a block-quantized table, dequantized: onnxruntime's com.microsoft::GatherBlockQuantized
    with uint8 data (the embedding of an int4 model whose table is shared with the lm_head MatMulNBits).

    Inputs: data uint8 [R, *mid, Cp] (``8 // bits`` values per byte along the last axis, the first in
    the low bits; C = Cp * 8 // bits values per row); indices int32 / int64 of any shape, values in
    [-R, R); scales float [R, *mid, ceil(C / block_size)]; with ``zero_points``: uint8 [R, *mid,
    ceil(ceil(C / block_size) * bits / 8)] packed like data (else 2^(bits-1)). Gather axis 0, quantize
    axis the last (onnxruntime's only layout for uint8 data). Output: the scales' type,
    [*indices, *mid, C], ``(q - zero point of the block) * scale of the block``.

    Runs as a take of the packed rows, their scales (and zero points) into workspaces, an unpack and a
    few elementwise kernels into ``out`` (nothing allocated: capturable). An index outside [-R, R) raises
    IndexError on the ref target (onnxruntime's CPU kernel writes zeros; the gpu target wraps it).
    Raises ShapeError for inputs that do not match. Source: onnxruntime ContribOperators.md and
    contrib_ops/cpu/quantization/gather_block_quantized.cc.
    """

    name = "gather_block_quantized"
    alloc_free = True

    def __init__(self, bits=4, block_size=128, zero_points=0):
        super().__init__(bits=int(bits), block_size=int(block_size), zero_points=int(zero_points))

    def _blocks(self, data) -> tuple[int, int, int]:
        """(values per row C, blocks per row, packed zero point bytes per row)."""
        per = 8 // self.bits
        C = data.lens[-1] * per
        nb = -(-C // self.block_size)
        return C, nb, -(-nb // per)

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 3 + self.zero_points)
        if self.bits not in (2, 4, 8) or self.block_size < 1:
            raise ShapeError(f"{self.name}: bits {self.bits} (2, 4 or 8) or block size {self.block_size} not supported")
        data, idx, scales = inputs[:3]
        if data.dtype != "uint8" or data.ndim < 2:
            raise ShapeError(f"{self.name}: data {data.brief()} must be uint8 of rank >= 2")
        if idx.dtype not in ("int32", "int64"):
            raise ShapeError(f"{self.name}: indices {idx.brief()} must be int32 or int64")
        C, nb, zb = self._blocks(data)
        want = {"scales": (scales, list(data.lens[:-1]) + [nb])}
        if self.zero_points:
            want["zero_points"] = (inputs[3], list(data.lens[:-1]) + [zb])
        for what, (s, lens) in want.items():
            ok = s.dtype == "uint8" if what == "zero_points" else s.dtype in FLOATS
            if list(s.lens) != lens or not ok:
                raise ShapeError(f"{self.name}: {what} {s.brief()} must be {'uint8' if what == 'zero_points' else 'float'}"
                                 f" {lens} (data {data.brief()}, bits={self.bits}, block_size={self.block_size})")
        return Shape(scales.dtype, list(idx.lens) + list(data.lens[1:-1]) + [C])

    def workspace(self, inputs, output):
        data, idx, scales = inputs[:3]
        rows = list(idx.lens) + list(data.lens[1:-1])
        _, nb, zb = self._blocks(data)
        ws = [Shape("uint8", rows + [data.lens[-1]]), Shape(scales.dtype, rows + [nb])]
        if self.bits != 8:
            ws.append(Shape("uint8", list(output.lens)))
        if self.zero_points:
            ws.append(Shape("uint8", rows + [zb]))
            if self.bits != 8:
                ws.append(Shape("uint8", rows + [zb * (8 // self.bits)]))
        return ws

    def compute(self, ctx, out, args, ws):
        xp = ctx.xp
        data, idx, scales = args[:3]
        if xp is np:
            R = data.shape[0]
            if idx.size and (idx.min() < -R or idx.max() >= R):
                bad = int(idx.min() if idx.min() < -R else idx.max())
                raise IndexError(f"{self.name}: index {bad} out of range [{-R}, {R})")
        if out.size == 0:
            return
        per = 8 // self.bits
        packed, sc = ws[0], ws[1]
        xp.take(data, idx, axis=0, out=packed)
        xp.take(scales, idx, axis=0, out=sc)
        q = packed
        if self.bits != 8:
            q = ws[2]
            _unpack(xp, packed, q.reshape(packed.shape + (per,)), self.bits)
        xp.copyto(out, q)
        zp = None
        if self.zero_points:
            zpacked = ws[2 + (self.bits != 8)]
            xp.take(args[3], idx, axis=0, out=zpacked)
            zp = zpacked
            if self.bits != 8:
                zp = ws[-1]
                _unpack(xp, zpacked, zp.reshape(zpacked.shape + (per,)), self.bits)
            zp = zp[..., :sc.shape[-1]]
        self._dequantize(xp, out, sc, zp)

    def _dequantize(self, xp, out, sc, zp):
        """``out = (out - zero point) * scale`` blockwise along the last axis: the whole blocks through a
        [..., blocks, block_size] view, a last partial block through its own slice."""
        bs, C = self.block_size, out.shape[-1]
        full = C // bs
        parts = []
        if full:
            w = out if full * bs == C else out[..., :full * bs]
            parts.append((w.reshape(out.shape[:-1] + (full, bs)), slice(0, full), (Ellipsis, slice(None), None)))
        if full * bs < C:
            parts.append((out[..., full * bs:], slice(full, full + 1), (Ellipsis, slice(None))))
        for w, blocks, expand in parts:
            if zp is None:
                xp.subtract(w, w.dtype.type(1 << (self.bits - 1)), out=w)
            else:
                xp.subtract(w, zp[..., blocks][expand], out=w)
            xp.multiply(w, sc[..., blocks][expand], out=w)

    def launches(self, inputs, output):
        per = 8 // self.bits
        unpack = 0 if self.bits == 8 else 2 * per - 1
        parts = (output.lens[-1] >= self.block_size) + (output.lens[-1] % self.block_size > 0)
        return 2 + unpack + 1 + (1 + unpack if self.zero_points else 0) + 2 * parts
