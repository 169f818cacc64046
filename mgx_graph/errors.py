"""Typed errors raised by mgx_graph.

Every error message names the thing at fault (ONNX node, op type, parameter, shape) and, where it
applies, the expected and the given value.  A program that raised one of these stays usable: the
executor validates inputs before it touches any buffer, and a failed capture leaves no graph behind.
"""
from __future__ import annotations


class MgxError(Exception):
    """Base class of every error mgx_graph raises on purpose."""


class ParseError(MgxError):
    """The ONNX file cannot be read or is malformed (bad protobuf, missing external data, bad graph)."""


class UnsupportedOpError(ParseError):
    """An ONNX node uses an op, domain or opset this frontend does not implement.

    Attributes ``node``, ``op_type``, ``domain`` and ``opset`` name the offending node.
    """

    def __init__(self, node: str, op_type: str, domain: str, opset: int, detail: str = ""):
        self.node, self.op_type, self.domain, self.opset = node, op_type, domain, opset
        dom = domain or "ai.onnx"
        msg = f"node '{node}': unsupported operator {dom}::{op_type} (opset {opset})"
        super().__init__(msg + (f": {detail}" if detail else ""))


class ShapeError(MgxError):
    """Shapes or dtypes of an instruction's inputs are inconsistent (compile time)."""


class CompileError(MgxError):
    """A compiler pass or the lowering to a target failed."""


class ParameterError(MgxError, ValueError):
    """A run was given a missing, unknown, or mis-shaped / mis-typed parameter."""


class DeviceError(MgxError, RuntimeError):
    """A runtime (CUDA / HIP / host queue) call failed; ``code`` holds the error name."""

    def __init__(self, call: str, code: str, detail: str = ""):
        self.call, self.code = call, code
        super().__init__(f"{call} failed with {code}" + (f": {detail}" if detail else ""))


class CaptureError(DeviceError):
    """Graph capture of a region failed (the region then runs eagerly)."""


class ExecutionError(MgxError, RuntimeError):
    """A kernel failed at run time (e.g. an index out of range); the message names the instruction.
    The program stays usable: the next run starts from scratch."""
