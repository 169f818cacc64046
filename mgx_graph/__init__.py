"""mgx_graph: a MIGraphX-style ONNX executor with a ``graph_launch`` compiler pass.

    import mgx_graph
    prog = mgx_graph.compile("model.onnx", target="auto", hip_graph=True)   # a CompiledProgram
    outputs = prog.run({"x": x})          # numpy in, numpy out
    print(prog)                           # the compiled program, one instruction per line
    print(prog.stats())                   # captures, replays, fallbacks, launches per run, ...
    prog.save("model.mxr")                # the compiled program; mgx_graph.load("model.mxr") runs it again
"""
from . import operators  # noqa: F401  (registers ops)
from .passes.compile_result import CompileResult  # noqa: F401
from .exec.compiled import CompiledProgram  # noqa: F401
from .graph.counters import GraphCounters  # noqa: F401
from .errors import (CaptureError, CompileError, DeviceError, ExecutionError, MgxError, ParameterError,  # noqa: F401
                     ParseError, ShapeError, UnsupportedOpError)
from .graph.launch import GraphLaunch  # noqa: F401  (registers graph_launch)
from .ir import Instruction, Module, Program  # noqa: F401
from .mxr.save_load import load  # noqa: F401
from .onnx import parse_onnx  # noqa: F401
from .compiler import compile, hip_graph_from_env  # noqa: F401
from .runtime import gpu_available  # noqa: F401
from .version import __version__  # noqa: F401
from .ir.shape import Shape  # noqa: F401


__all__ = ["compile", "load", "parse_onnx", "Program", "CompiledProgram", "CompileResult", "GraphCounters", "Module",
           "Instruction", "Shape", "gpu_available", "MgxError", "ParseError", "UnsupportedOpError", "ShapeError",
           "CompileError", "ParameterError", "DeviceError", "CaptureError", "ExecutionError", "hip_graph_from_env",
           "__version__"]
