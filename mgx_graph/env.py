"""MIGraphX-style environment variables.

As in MIGraphX (``MIGRAPHX_DECLARE_ENV_VAR`` / ``enabled()``), each variable is read once, on first
use, and cached; changing it later in the same process has no effect.  ``enabled`` accepts
``1|enable|enabled|yes|true`` (case-insensitive); anything else, or unset, is off.

Variables used by mgx_graph:

====================================  ==========================================================
``MIGRAPHX_HIP_GRAPH``                turn the graph_launch pass on when ``compile(hip_graph=None)``
``MIGRAPHX_HIP_GRAPH_DEBUG``          print one line per WARMUP / CAPTURE / UPDATE / REPLAY / FALLBACK /
                                      EAGER / EVICT / DISABLE / VALIDATE / QUEUE event to stderr (dynamic
                                      programs: SPECIALIZE / RESPECIALIZE / PREFIX / PRUNE / EVICT too)
``MIGRAPHX_HIP_GRAPH_MAX``            graph execs per region and captures per region over its life (8)
``MIGRAPHX_HIP_GRAPH_MAX_BYTES``      device memory of all graph execs of a program (1 GiB)
``MIGRAPHX_HIP_GRAPH_VALIDATE``       run eager next to early replays and compare (validation mode)
``MIGRAPHX_TRACE_COMPILE``            print the program after each compiler pass
``MIGRAPHX_TIME_PASSES``              print the time each compiler pass takes, then the time all
                                      validations between passes took
``MIGRAPHX_DISABLE_PASSES``           comma-separated pass or group names the pass manager skips (A/B
                                      runs), e.g. ``fuse_norms`` or ``graph``; ``lowering`` and
                                      ``memory_coloring`` cannot be skipped; an unknown name is a
                                      CompileError
``MIGRAPHX_DISABLE_VALIDATE_PASSES``  do not validate the program after each pass (validation is on
                                      by default)
``MIGRAPHX_TRACE_EVAL``               force eager runs of every region (graphs are not used)
``MIGRAPHX_ATTN_SPLIT_ROWS``          cache rows per block of the gpu decode-attention kernel: a longer
                                      cache is split over blocks and merged by a second kernel (256)
``MIGRAPHX_ATTN_WARP``                ``0``: the gpu decode attention runs the block kernel
                                      (``mgx_attn_split``) for every shape instead of the warp kernel
                                      (``mgx_attn_warp``) for few query rows per KV head (on by default)
``MIGRAPHX_ATTN_LANES``               ``0``: the gpu decode attention does not run ``mgx_attn_lanes`` (the
                                      default for equal key / value head sizes of a power of two of
                                      16-byte loads: one block per query head, a key split over lanes)
``MIGRAPHX_ATTN_LANES_BRANCHLESS``    ``0``: ``mgx_attn_lanes`` with branches that skip keyless chunks and
                                      warps (off by default: without them the K and V loads issue together,
                                      6 us/token faster in SmolLM2's fp16 step on an H200)
``MIGRAPHX_ATTN_WARPS``               warps (32-lane groups) per block of ``mgx_attn_warp`` (8), clamped
                                      to a power of two in 1 .. 32 and to the shared memory
``MIGRAPHX_ATTN_V_EARLY``             ``0``: ``mgx_attn_warp`` loads V rows after the softmax weights
                                      instead of together with the K rows (on by default where a lane
                                      holds at most 64 V elements)
``MIGRAPHX_GEMV``                     ``0``: a one-row ``dot`` against a constant weight runs as a BLAS GEMM
                                      on gpu instead of the gemv kernel (on by default), and
                                      ``fuse_gemv`` does not fuse
``MIGRAPHX_GEMV_NARROW``              ``0``: a GEMV of many columns of short rows keeps 32 threads per column
                                      instead of fewer (down to 4, so each thread holds more of its row and
                                      the grid has fewer blocks; on by default)
``MIGRAPHX_HOST_READER_POLL``         ``1``: a page-locked read-back (the greedy loop's next id) is waited for by
                                      polling its event from the calling thread instead of blocking in
                                      ``hipEventSynchronize`` (off by default)
``MIGRAPHX_NATIVE_REPLAY``            ``0``: a repeated replay of a one-region program runs the Python path
                                      instead of one C call (``mgx_graph._native``,
                                      :mod:`mgx_graph.graph.native_replay`; on by default where the module is built)
``MIGRAPHX_PDL``                      ``0``: generated and own kernels launch without programmatic dependent
                                      launch inside captures (on by default on compute capability 9.0+)
====================================  ==========================================================
"""
from __future__ import annotations

import os
import threading

_TRUE = {"1", "enable", "enabled", "yes", "true"}
_cache: dict[str, str | None] = {}
_lock = threading.Lock()
_read: set[str] = set()


def string_value_of(name: str, default: str | None = None) -> str | None:
    """Return the cached string value of environment variable ``name`` (read once)."""
    with _lock:
        if name not in _cache:
            _cache[name] = os.environ.get(name)
            _read.add(name)
        v = _cache[name]
    return default if v is None else v


def enabled(name: str, default: bool = False) -> bool:
    """True when ``name`` is set to one of 1/enable/enabled/yes/true (read once, cached); ``default``
    when it is unset or empty."""
    v = string_value_of(name)
    if v is None or not v.strip():
        return default
    return v.strip().lower() in _TRUE


def value_of(name: str, default: int = 0) -> int:
    """Integer value of ``name`` (read once); ``default`` when unset or not an integer."""
    v = string_value_of(name)
    if v is None:
        return default
    try:
        return int(v.strip())
    except ValueError:
        return 1 if v.strip().lower() in _TRUE else default


def get_all_envs() -> list[str]:
    """Names of every variable read so far (as MIGraphX's ``get_all_envs``)."""
    return sorted(_read)


def _reset_for_tests() -> None:
    """Forget cached values (tests only: real MIGraphX never re-reads)."""
    with _lock:
        _cache.clear()
