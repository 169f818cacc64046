"""Compiler passes over the IR, in MIGraphX style, one file per pass named after it.

Each pass is a :class:`Pass` with a ``name`` and ``apply(program, ctx)``; :class:`PassManager` runs a
target's pipeline of them (validating the program after each pass, tracing and timing them under
``MIGRAPHX_TRACE_COMPILE`` / ``MIGRAPHX_TIME_PASSES``, skipping ``MIGRAPHX_DISABLE_PASSES``).  The
pipeline itself is defined in ``mgx_graph/targets/pipeline.py``, which imports each pass from its module.
"""
from __future__ import annotations

from .pass_manager import (ModulePass, Pass, PassContext, PassGroup, PassManager, PipelineOptions,  # noqa: F401
                           run_passes)
from .validate import InvalidProgram, validate_program  # noqa: F401
from .eliminate_dead_code import EliminateDeadCode  # noqa: E402
from .propagate_constant import PropagateConstant  # noqa: E402
from .quantize_fp16 import QuantizeFp16  # noqa: E402
from .fuse_norms import FuseNorms  # noqa: E402
from .merge_dots import MergeDots  # noqa: E402
from .fuse_attention import FuseAttention  # noqa: E402
from .fuse_reduce import FuseReduce  # noqa: E402
from .fuse_pointwise import FusePointwise  # noqa: E402
from .fuse_scatternd import FuseScatterND  # noqa: E402
from .fuse_horizontal import FuseHorizontal  # noqa: E402
from .fuse_rotary_kv import FuseRotaryKv  # noqa: E402
from .simplify_reshapes import SimplifyReshapes  # noqa: E402
from .gemv_layout import GemvLayout  # noqa: E402
from .fuse_gemv import FuseGemv  # noqa: E402
from .bind_outputs import BindOutputs  # noqa: E402
from .lowering import Lowering  # noqa: E402
from .hip_graph import HipGraph  # noqa: E402
from .memory_coloring import MemoryColoring  # noqa: E402

__all__ = ["Pass", "ModulePass", "PassContext", "PassGroup", "PassManager", "PipelineOptions", "run_passes",
           "InvalidProgram", "validate_program", "EliminateDeadCode", "PropagateConstant", "QuantizeFp16",
           "FuseNorms", "MergeDots", "FuseAttention", "FuseReduce", "FusePointwise", "FuseScatterND", "FuseHorizontal",
           "FuseRotaryKv", "SimplifyReshapes", "GemvLayout", "FuseGemv", "BindOutputs", "Lowering",
           "HipGraph", "MemoryColoring"]
