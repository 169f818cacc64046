"""Helpers of the MatMulNBits tests: random block-quantized weights packed as onnxruntime lays them out, the
one-node model, its oracles (onnxruntime CPU, and the spec in float64 numpy where onnxruntime's CPU kernel
refuses the case: 8-bit weights with float zero points), tolerances, and ``gemv_nbits.cu`` built for the
host (``attn_host``: g++, one std::thread per CUDA thread) with the device built-ins it uses."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import helper, numpy_helper

import attn_host
from util import NP2ONNX, ort_run

# device built-ins of gemv_nbits.cu that attn_host's shim lacks: a 16-byte float vector and the byte permute
HOST_PREFIX = r"""
#define __align__(n) __attribute__((aligned(n)))
struct float4 { float x, y, z, w; };
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
}
"""


def pack_bits(vals: np.ndarray, bits: int) -> np.ndarray:
    """uint8 values < 2^bits along the last axis -> bytes, the first value in the low bits."""
    per = 8 // bits
    v = vals.reshape(vals.shape[:-1] + (-1, per)).astype(np.uint8)
    out = np.zeros(v.shape[:-1], np.uint8)
    for j in range(per):
        out |= (v[..., j] << (bits * j)).astype(np.uint8)
    return out


@dataclass
class Quantized:
    """One random MatMulNBits weight: the ONNX inputs (``B``, ``scales`` flat, ``zero_points`` flat when
    present), the values ``q`` [N, k_blocks * block] and the zero points / scales per block as float64."""

    bits: int
    block: int
    K: int
    N: int
    zp: str
    inputs: dict
    q: np.ndarray
    zf: np.ndarray
    sf: np.ndarray

    @property
    def kb(self) -> int:
        return -(-self.K // self.block)

    def arrays(self) -> dict:
        """The op's operands as the instruction holds them: B [N, kb, blob], scales and zero points [N, ...]."""
        out = {"B": self.inputs["B"], "scales": self.inputs["scales"].reshape(self.N, self.kb)}
        if "zero_points" in self.inputs:
            out["zero_points"] = self.inputs["zero_points"].reshape(self.N, -1)
        return out

    def dequantized(self, g_idx=None) -> np.ndarray:
        """W [N, K] in float64 per the spec: (q - z) * s of each k's block (``g_idx[k]``, else k // block)."""
        g = np.arange(self.K) // self.block if g_idx is None else np.asarray(g_idx)
        return (self.q[:, :self.K] - self.zf[:, g]) * self.sf[:, g]


def quantized(rng, K: int, N: int, bits: int, block: int, zp: str, dtype) -> Quantized:
    kb = -(-K // block)
    q = rng.integers(0, 1 << bits, (N, kb * block)).astype(np.uint8)
    scales = rng.uniform(0.01, 0.1, (N, kb)).astype(dtype)
    inputs = {"B": pack_bits(q, bits).reshape(N, kb, block * bits // 8), "scales": scales.reshape(-1)}
    if zp == "packed":
        z = rng.integers(0, 1 << bits, (N, kb)).astype(np.uint8)
        padded = np.zeros((N, -(-kb * bits // 8) * (8 // bits)), np.uint8)
        padded[:, :kb] = z
        inputs["zero_points"] = pack_bits(padded, bits).reshape(-1)
        zf = z.astype(np.float64)
    elif zp == "float":
        zfl = rng.uniform(0, (1 << bits) - 1, (N, kb)).astype(dtype)
        inputs["zero_points"] = zfl.reshape(-1)
        zf = zfl.astype(np.float64)
    else:
        zf = np.full((N, kb), 1 << (bits - 1), np.float64)
    return Quantized(bits, block, K, N, zp, inputs, q, zf, scales.astype(np.float64))


def nbits_model(w: Quantized, a: np.ndarray, bias=None, g_idx=None, b_input: bool = False):
    """``y = MatMulNBits(a, B, scales[, zero_points][, g_idx][, bias])`` with the weights as initializers
    (``b_input``: B a graph input instead); returns (model, feeds)."""
    inits = dict(w.inputs)
    names = ["a", "B", "scales", "zero_points" if w.zp != "none" else "", "", ""]
    if g_idx is not None:
        names[4], inits["g_idx"] = "g_idx", np.asarray(g_idx, np.int32)
    if bias is not None:
        names[5], inits["bias"] = "bias", bias
    while not names[-1]:
        names.pop()
    feeds = {"a": a}
    if b_input:
        feeds["B"] = inits.pop("B")
    node = helper.make_node("MatMulNBits", names, ["y"], domain="com.microsoft", name="mm", K=w.K, N=w.N,
                            bits=w.bits, block_size=w.block)
    ins = [helper.make_tensor_value_info(n, NP2ONNX[v.dtype], list(v.shape)) for n, v in feeds.items()]
    g = helper.make_graph([node], "nbits", ins, [helper.make_tensor_value_info("y", NP2ONNX[a.dtype], None)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model, feeds


def spec_output(w: Quantized, a: np.ndarray, bias=None, g_idx=None) -> np.ndarray:
    """The spec's ``a @ W^T (+ bias)`` in float64, as a's type."""
    y = a.astype(np.float64) @ w.dequantized(g_idx).T
    if bias is not None:
        y = y + bias.astype(np.float64)
    return y.astype(a.dtype)


def expected(model, feeds, w: Quantized, bias=None) -> list:
    """onnxruntime CPU's output, or the spec's where onnxruntime refuses the case (8 bits, float zero points)."""
    if w.bits == 8 and w.zp == "float":
        return [spec_output(w, feeds["a"], bias)]
    return ort_run(model, feeds)


def tolerance(want: np.ndarray) -> tuple:
    """(rtol, atol) against onnxruntime: float32 1e-4 relative to the output's largest magnitude (sums of
    a few hundred terms in another order); float16 4e-3 of it (the output's half rounding, 2 ulps at its
    top, plus the order of the float32 sums on gpu or numpy's half arithmetic on ref)."""
    top = max(1.0, float(np.abs(want.astype(np.float64)).max())) if want.size else 1.0
    rel = 4e-3 if want.dtype == np.float16 else 1e-4
    return rel, rel * top


def host_function(source: str, name: str):
    """``fn(grid, block, args)`` running kernel ``name`` of ``source`` on the host, as a compiled RawModule
    function is called."""
    lib, sigs = attn_host.build(HOST_PREFIX + source)

    def fn(grid, block, args):
        attn_host.launch(lib, sigs, name, grid, block[0], list(args))
    return fn


class HostCtx:
    """What the gpu launch of ``matmul_nbits`` reads of its context, over numpy arrays."""

    xp = np

    @staticmethod
    def data_ptr(a) -> int:
        return a.__array_interface__["data"][0]

    @staticmethod
    def matmul(a, b, out) -> None:
        np.matmul(a, b, out=out)
