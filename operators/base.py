"""Helpers shared by the ops: input-count and axis checks; the op interface itself is
:mod:`mgx_graph.ir.operation` (re-exported here, the name every op module imports it by).
"""
from __future__ import annotations

from typing import Any, Callable

from ..errors import ShapeError
from ..ir.operation import (HOST, HostKernelContext, Operation, make_op, numpy_reduce, op_class,  # noqa: F401
                            register_op, registered_ops)
from ..ir.shape import Shape


def check_inputs(op: Operation, inputs: list[Shape], n: int | tuple[int, int]) -> None:
    lo, hi = (n, n) if isinstance(n, int) else n
    if not lo <= len(inputs) <= hi:
        want = str(lo) if lo == hi else f"{lo}..{hi}"
        raise ShapeError(f"{op.name}: expects {want} inputs, got {len(inputs)}")


def normalize_axis(axis: int, rank: int, op: str) -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < max(rank, 1):
        raise ShapeError(f"{op}: axis {axis} out of range for rank {rank}")
    return a


KernelFn = Callable[..., None]
