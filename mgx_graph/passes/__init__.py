"""Compiler passes over the IR, in MIGraphX style.  Each pass is a callable object with a ``name``;
:func:`run_passes` runs a list of them and, when ``MIGRAPHX_TRACE_COMPILE`` is enabled, prints the
program after each pass (as MIGraphX does)."""
from __future__ import annotations

import sys
import time

from .. import env


def run_passes(program, passes, trace: bool | None = None) -> None:
    trace = env.enabled("MIGRAPHX_TRACE_COMPILE") if trace is None else trace
    timing = env.enabled("MIGRAPHX_TIME_PASSES")
    for p in passes:
        t0 = time.perf_counter()
        p(program)
        if timing:
            print(f"Pass {p.name}: {(time.perf_counter() - t0) * 1e3:.3f}ms", file=sys.stderr)
        if trace:
            print(f"Pass: {p.name}", file=sys.stderr)
            print(program.print(), file=sys.stderr)


from .eliminate_dead_code import EliminateDeadCode  # noqa: E402
from .propagate_constant import PropagateConstant  # noqa: E402
from .quantize_fp16 import QuantizeFp16  # noqa: E402
from .fuse_norms import FuseNorms  # noqa: E402
from .simplify_reshapes import SimplifyReshapes  # noqa: E402
from .bind_outputs import BindOutputs  # noqa: E402
from .lowering import Lowering  # noqa: E402
from .hip_graph import HipGraph  # noqa: E402
from .memory_coloring import MemoryColoring  # noqa: E402

__all__ = ["run_passes", "EliminateDeadCode", "PropagateConstant", "QuantizeFp16", "FuseNorms", "SimplifyReshapes", "BindOutputs", "Lowering",
           "HipGraph", "MemoryColoring"]
