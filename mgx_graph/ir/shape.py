"""Shapes in MIGraphX's terms: an element type, lens (dims) and strides (in elements).

A *standard* shape is packed row-major.  View instructions (transpose, slice, broadcast, ...) give
non-standard strides over the same buffer, exactly as MIGraphX shapes do.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
from onnx import TensorProto

from ..errors import ShapeError

# numpy dtype name -> MIGraphX type name
TYPE_NAMES = {
    "bool": "bool_type",
    "float16": "half_type",
    "float32": "float_type",
    "float64": "double_type",
    "uint8": "uint8_type",
    "int8": "int8_type",
    "uint16": "uint16_type",
    "int16": "int16_type",
    "int32": "int32_type",
    "int64": "int64_type",
    "uint32": "uint32_type",
    "uint64": "uint64_type",
    "object": "string_type",  # ONNX STRING: numpy object arrays, host only (ref target)
}

ONNX_TO_NUMPY: dict[int, str] = {
    TensorProto.BOOL: "bool",
    TensorProto.FLOAT16: "float16",
    TensorProto.FLOAT: "float32",
    TensorProto.DOUBLE: "float64",
    TensorProto.UINT8: "uint8",
    TensorProto.INT8: "int8",
    TensorProto.UINT16: "uint16",
    TensorProto.INT16: "int16",
    TensorProto.INT32: "int32",
    TensorProto.INT64: "int64",
    TensorProto.UINT32: "uint32",
    TensorProto.UINT64: "uint64",
    TensorProto.STRING: "object",
}
NUMPY_TO_ONNX = {v: k for k, v in ONNX_TO_NUMPY.items()}


def onnx_dtype(elem_type: int, where: str = "") -> str:
    """numpy dtype name for an ONNX ``TensorProto`` element type; raises ShapeError if unsupported."""
    try:
        return ONNX_TO_NUMPY[elem_type]
    except KeyError:
        name = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else elem_type
        raise ShapeError(f"{where}: unsupported element type {name}") from None


def standard_strides(lens) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(lens):
        strides.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class Shape:
    """Element type (numpy dtype name), lens and strides (in elements).

    ``Shape("float32", (2, 3))`` is standard (row-major packed).  ``strides`` may be given for views;
    a stride of 0 marks a broadcast dimension.
    """

    dtype: str
    lens: tuple
    strides: tuple = None  # type: ignore[assignment]  # None: standard strides, filled in by __post_init__

    if TYPE_CHECKING:  # the generated __init__ takes any sequences (__post_init__ makes them tuples)
        def __init__(self, dtype: str, lens: Sequence[int], strides: Sequence[int] | None = None) -> None: ...

    def __post_init__(self):
        lens = tuple(int(d) for d in self.lens)
        object.__setattr__(self, "lens", lens)
        object.__setattr__(self, "dtype", np.dtype(self.dtype).name)
        if self.strides is None:
            object.__setattr__(self, "strides", standard_strides(lens))
        else:
            object.__setattr__(self, "strides", tuple(int(s) for s in self.strides))
        if len(self.strides) != len(lens):
            raise ShapeError(f"shape {lens}: {len(self.strides)} strides given for rank {len(lens)}")
        if any(d < 0 for d in lens):
            raise ShapeError(f"shape {lens}: negative dimension")

    # -- queries -----------------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.lens)

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    def elements(self) -> int:
        return math.prod(self.lens)

    def element_space(self) -> int:
        """Number of elements spanned in memory (1 + max linear index), 0 for empty shapes."""
        if self.elements() == 0:
            return 0
        return 1 + sum((d - 1) * s for d, s in zip(self.lens, self.strides))

    def bytes(self) -> int:
        """Bytes spanned in memory by this shape (``element_space() * itemsize``)."""
        return self.element_space() * self.itemsize

    def standard(self) -> bool:
        """Packed row-major (strides of size-1 dims do not matter)."""
        std = standard_strides(self.lens)
        return self.elements() == 0 or all(d == 1 or s == t for d, s, t in zip(self.lens, self.strides, std))

    def packed(self) -> bool:
        return self.element_space() == self.elements()

    def broadcasted(self) -> bool:
        return any(s == 0 and d > 1 for d, s in zip(self.lens, self.strides))

    def with_lens(self, lens) -> "Shape":
        return Shape(self.dtype, tuple(lens))

    def with_type(self, dtype) -> "Shape":
        return Shape(np.dtype(dtype).name, self.lens, self.strides)

    def as_standard(self) -> "Shape":
        return Shape(self.dtype, self.lens)

    def type_string(self) -> str:
        return TYPE_NAMES.get(self.dtype, self.dtype + "_type")

    def byte_strides(self) -> tuple[int, ...]:
        return tuple(s * self.itemsize for s in self.strides)

    def __str__(self) -> str:
        lens = ", ".join(str(d) for d in self.lens)
        strides = ", ".join(str(s) for s in self.strides)
        return f"{self.type_string()}, {{{lens}}}, {{{strides}}}"

    def brief(self) -> str:
        return f"{self.dtype}[{','.join(str(d) for d in self.lens)}]"


MAX_TENSOR_BYTES = (1 << 63) - 1  # byte offsets and element counts are int64 (ONNX dims, numpy, CUDA sizes)


def check_size(shape, what: str) -> None:
    """ShapeError naming ``what`` (a parameter, an instruction) when ``shape`` (or an element of a tuple
    of shapes) has more elements, or spans more bytes, than an int64 can count (2^63 - 1): no tensor
    that large can be indexed, sized (``Size``) or allocated."""
    for s in (shape if isinstance(shape, tuple) else (shape,)):
        if not isinstance(s, Shape):
            continue
        n = s.elements()
        if n > MAX_TENSOR_BYTES or s.bytes() > MAX_TENSOR_BYTES:
            raise ShapeError(f"{what}: shape {s.brief()} has {n} elements ({n * s.itemsize} bytes of "
                             f"{s.dtype}), more than the {MAX_TENSOR_BYTES} an int64 can count")


def broadcast_lens(*lens_list, where: str = "") -> tuple[int, ...]:
    """Numpy/ONNX multidirectional broadcast of several lens tuples; ShapeError if incompatible."""
    rank = max((len(l) for l in lens_list), default=0)
    out = []
    for i in range(rank):
        dims = {l[len(l) - rank + i] for l in lens_list if len(l) - rank + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ShapeError(f"{where}: cannot broadcast shapes {[tuple(l) for l in lens_list]}")
        out.append(dims.pop() if dims else 1)
    return tuple(out)
