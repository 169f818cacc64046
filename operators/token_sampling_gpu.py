"""The next token of a decode step on the gpu target: :mod:`mgx_graph.llm.sampling`'s rule as the kernels of
``token_sampling.cu``, queued after the program's logits (no host read of the logits).

:class:`SampleAdvance` holds the workspace of ``rows`` rows of ``vocab`` logits (made once; a launch
allocates nothing) and queues, per step, ``ts_prepare`` (penalty, temperature, the row max; greedy: the
id), then for sampling ``ts_levels`` (the band of 0.25-nat bins below the max that holds every token the
filters can keep; with top-k and top-p both on, every token top-k keeps, whose mass is top-p's total),
``ts_compact`` (those candidates, in vocabulary order) and ``ts_select`` (one block per row: exact
thresholds over the candidates, the Philox draw, the id).  Like
:class:`~mgx_graph.operators.index_ops.ArgmaxAdvance` it writes the id into the next step's
``input_ids``, optionally into page-locked host memory through its device address and the next slot
into ``cache_position``, so sampled decoding pipelines as greedy decoding does.

Speed: the three multi-block kernels read the row once each; ``ts_select`` ranks up to 1024 candidates
in shared memory.  A row with more candidates (a flat distribution and no top-k, or no filter at all)
takes a slower path: bisection over the candidates in global memory by one block.
"""
from __future__ import annotations

import functools
import os

import numpy as np

from ..errors import ShapeError

_HERE = os.path.dirname(os.path.abspath(__file__))
_CTYPES = {"float16": "__half", "float32": "float", "float64": "double"}
_HALF = ("#if defined(__HIPCC_RTC__) || defined(__HIPCC__)\n#include <hip/hip_fp16.h>\n#else\n"
         "#include <cuda_fp16.h>\n#endif\n")
BLOCK, CHUNK, BINS, SELECT = 256, 2048, 65, 1024  # TS_BLOCK, TS_CHUNK, TS_BINS, TS_SELECT in the .cu
MAX_VOCAB = 512 * CHUNK  # TS_MAX_BLOCKS blocks per row


@functools.lru_cache(maxsize=None)
def _module(dtype: str):
    """``token_sampling.cu`` compiled for logits of ``dtype`` (CuPy RawModule)."""
    import cupy

    with open(os.path.join(_HERE, "token_sampling.cu")) as f:
        src = f.read()
    head = _HALF if dtype == "float16" else ""
    no_fma = "-ffp-contract=off" if cupy.cuda.runtime.is_hip else "--fmad=false"  # rounded as on the host
    return cupy.RawModule(code=head + f"typedef {_CTYPES[dtype]} T;\n" + src, options=(no_fma,))


@functools.lru_cache(maxsize=None)
def _function(dtype: str, name: str):
    """Kernel ``name`` of :func:`_module` for ``dtype``, looked up once (a step launches four)."""
    return _module(dtype).get_function(name)


class SampleAdvance:
    """The sampling (or penalized greedy) step tail of ``rows`` rows of ``vocab`` logits of ``dtype``
    on the gpu context ``ctx``.  Raises ShapeError for another dtype or a vocabulary over 2**20."""

    def __init__(self, ctx, rows: int, vocab: int, dtype):
        dtype = np.dtype(dtype)
        if dtype.name not in _CTYPES or not 1 <= int(vocab) <= MAX_VOCAB or int(rows) < 1:
            raise ShapeError(f"SampleAdvance: {rows} rows of {vocab} {dtype} logits: expected float16 / float32 / "
                             f"float64 rows of 1 to {MAX_VOCAB} values")
        self.ctx, self.rows, self.vocab, self.dtype = ctx, int(rows), int(vocab), dtype
        self.blocks = -(-self.vocab // CHUNK)
        xp, b, v, nb = ctx.xp, self.rows, self.vocab, self.blocks
        self.s = xp.empty((b, v), np.float32)
        self.seen = xp.zeros((b, v), np.uint8)
        self.part_m, self.part_i = xp.empty((b, nb), np.float32), xp.empty((b, nb), np.int64)
        self.rowm, self.z = xp.empty((b,), np.float32), xp.empty((b,), np.float32)
        self.count = xp.zeros((2, b), np.uint32)  # each kernel's last block sets its counter back to 0
        self.hist_c, self.hist_m = xp.zeros((b, BINS), np.uint32), xp.zeros((b, BINS), np.uint64)
        self.cut, self.ncand = xp.empty((b,), np.int32), xp.empty((b,), np.uint32)
        self.cs, self.ci = xp.empty((b, nb * CHUNK), np.float32), xp.empty((b, nb * CHUNK), np.int32)
        self.cn = xp.empty((b, nb), np.uint32)
        self.gs, self.gi = xp.empty((b, v), np.float32), xp.empty((b, v), np.int32)
        self.select_threads = SELECT  # threads of ts_select (any multiple of 32 up to 1024 works)

    def set_seen(self, seen, queue) -> None:
        """Queue the seen mask (bool [rows, vocab], host) of a new generation; None clears it."""
        host = np.zeros((self.rows, self.vocab), np.uint8) if seen is None else \
            np.ascontiguousarray(np.asarray(seen).reshape(self.rows, self.vocab), np.uint8)
        self.ctx.copy_from_host(self.seen, host, queue)

    def __call__(self, x, ids, config, seed: int, step: int, host_ptr: int = 0, pos=None, next_pos: int = 0) -> None:
        """Queue the tail on the current queue: ``x`` the logits (rows * vocab contiguous values of
        ``dtype``), ``ids`` int64 [rows] (gets the ids), ``config`` a
        :class:`~mgx_graph.llm.sampling.SamplingConfig`, ``seed`` / ``step`` the draw's key and counter,
        ``host_ptr`` the device address of page-locked memory for ``rows`` int64 (0: none), ``pos`` int64
        (its first element gets ``next_pos``; None: not written).  The chosen ids are also marked in
        :attr:`seen` when the config has a repetition penalty."""
        if x.size != self.rows * self.vocab or x.dtype != self.dtype or not x.flags.c_contiguous \
                or ids.dtype != np.int64 or ids.size != self.rows or not ids.flags.c_contiguous:
            raise ShapeError(f"SampleAdvance: logits {x.dtype}{list(x.shape)} and ids {ids.dtype}{list(ids.shape)}: "
                             f"expected {self.rows}x{self.vocab} contiguous {self.dtype} and int64 [{self.rows}]")
        for name, grid, block, args in self.launches(x, ids, config, seed, step, host_ptr, pos, next_pos):
            _function(self.dtype.name, name)(grid, block, args)

    def launches(self, x, ids, config, seed: int, step: int, host_ptr: int = 0, pos=None, next_pos: int = 0) -> list:
        """``[(kernel name, grid, block, args), ...]`` of :meth:`__call__` (null pointers as ``uint64(0)``)."""
        ctx, b, v, nb = self.ctx, self.rows, self.vocab, self.blocks
        penalized = config.repetition_penalty != 1.0
        seen = self.seen if penalized else np.uint64(0)
        greedy = not config.do_sample
        host, nxt = np.uint64(host_ptr), np.int64(next_pos)
        pos_ptr = np.uint64(ctx.data_ptr(pos)) if pos is not None else np.uint64(0)
        out = [("ts_prepare", (nb, b), (BLOCK,), (
            x, np.int64(v), seen, np.float32(config.repetition_penalty), np.float32(config.temperature), self.s,
            self.part_m, self.part_i, self.rowm, self.count[0], np.int32(greedy), ids, host, seen, pos_ptr, nxt))]
        if greedy:
            return out
        top_k = np.int64(min(config.top_k or 0, v))  # >= vocab: off
        min_p = np.float32(config.min_p if config.min_p is not None else 0.0)
        return out + [
            ("ts_levels", (nb, b), (BLOCK,), (self.s, np.int64(v), self.rowm, self.hist_c, self.hist_m, self.count[1],
                                              top_k, np.float32(config.top_p), min_p, self.cut, self.z, self.ncand)),
            ("ts_compact", (nb, b), (BLOCK,), (self.s, np.int64(v), self.rowm, self.cut, self.cs, self.ci, self.cn)),
            ("ts_select", (b,), (self.select_threads,), (
                self.cs, self.ci, self.cn, np.int32(nb), self.rowm, self.z, self.ncand, np.int64(v), top_k,
                np.float32(config.top_p), min_p, np.uint64(seed), np.int64(step), self.gs, self.gi, ids, host, seen,
                pos_ptr, nxt))]
