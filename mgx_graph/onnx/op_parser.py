"""The registry of node parsers and the attribute helpers every family module uses.

A node parser is a function ``fn(p, m, node, ins)``:

- ``p``: the :class:`~mgx_graph.onnx.onnx_parser.OnnxParser` (``p.add``, ``p.lit``, ``p.const``,
  ``p.reshape``, ``p.err``, ``p.opset`` ...);
- ``m``: the :class:`~mgx_graph.ir.Module` instructions are added to;
- ``node``: the ``onnx.NodeProto``;
- ``ins``: one :class:`~mgx_graph.ir.Instruction` per node input (``None`` for an omitted input).

It returns one instruction, or a list with one entry per node output (``None`` for an output it does
not produce).  ``@parser("OpType", ...)`` registers it for those op types of the ONNX domain;
``@parser("OpType", domain="com.microsoft")`` for another domain.  Op types of the ONNX domains with no
parser of their own go to the fallback (``parse_generic``: the host evaluates them with onnx.reference).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import onnx

#: the ONNX domains (``""`` and ``"ai.onnx"`` are the same one)
ONNX_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")

_PARSERS: dict[tuple[str, str], Callable] = {}  # (domain, op type) -> parser
_FALLBACK: list[Callable] = []


def _key(domain: str, op_type: str) -> tuple[str, str]:
    return ("" if domain in ("", "ai.onnx") else domain), op_type


def parser(*op_types: str, domain: str = ""):
    """Decorator: register the decorated function as the parser of ``op_types`` in ``domain``
    (``""`` is ai.onnx).  A later registration of the same op type replaces the earlier one."""
    def deco(fn):
        for op_type in op_types:
            _PARSERS[_key(domain, op_type)] = fn
        return fn

    return deco


def fallback(fn):
    """Decorator: register the parser of the ONNX-domain op types that have no parser of their own."""
    _FALLBACK[:] = [fn]
    return fn


def lookup(domain: str, op_type: str) -> Callable | None:
    """The parser of ``domain::op_type``: its own, else the fallback for an ONNX domain, else ``None``
    (a domain this frontend does not implement)."""
    fn = _PARSERS.get(_key(domain, op_type))
    if fn is None and domain in ONNX_DOMAINS and _FALLBACK:
        fn = _FALLBACK[0]
    return fn


def other_domain_ops() -> list[tuple[str, str]]:
    """``(domain, op type)`` of every parser registered outside the ONNX domains, sorted."""
    return sorted(k for k in _PARSERS if k[0] not in ONNX_DOMAINS)


def ints(value) -> list:
    """A constant input as a list of Python ints (scalars and 1-D tensors alike)."""
    return [int(v) for v in np.asarray(value).reshape(-1)]


def attr(node, name, default=None):
    """The value of attribute ``name`` of ``node`` (``onnx.helper.get_attribute_value``), else ``default``."""
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def decode(v):
    """A string attribute as ``str`` (onnx returns ``bytes``)."""
    return v.decode() if isinstance(v, bytes) else v


FLOATS = ("float16", "float32", "float64")


def unsupported(p, node, why: str):
    """UnsupportedOpError for a variant of ``node`` that has no native implementation (``why``)."""
    from ..errors import UnsupportedOpError

    return UnsupportedOpError(p.node_name, node.op_type, node.domain or "", p.opset, why)


def require_float(p, x, what="input") -> None:
    """ParseError (through ``p.err``) unless instruction ``x`` is float16/float32/float64."""
    if x.shape.dtype not in FLOATS:
        raise p.err(f"{what} must be float16/float32/float64, got {x.shape.dtype}")


# -- attribute validation: every message names the node (``p.err``), the attribute, the expected range
# -- and the given value
def check_axis(p, axis, rank: int, name: str = "axis", *, upper: int | None = None) -> int:
    """``axis`` of an input of rank ``rank`` as an index ``0..upper`` (``upper`` defaults to ``rank - 1``;
    ``rank`` for the ops whose axis may be one past the last dim, Flatten's); ParseError unless it lies
    in ``[-rank, upper]``."""
    hi = rank - 1 if upper is None else upper
    a = int(axis)
    if not -rank <= a <= hi:
        raise p.err(f"'{name}' = {a} is out of range: expected [{-rank}, {hi}] for input rank {rank}")
    return a + rank if a < 0 else a


def check_axes(p, axes, rank: int, name: str = "axes", *, unique: bool = True) -> list:
    """Each of ``axes`` checked and normalized by :func:`check_axis`; ParseError when one repeats (after
    normalization) and ``unique``."""
    out = [check_axis(p, a, rank, name) for a in axes]
    if unique and len(set(out)) != len(out):
        raise p.err(f"'{name}' = {[int(a) for a in axes]} repeats an axis: expected distinct axes of "
                    f"[{-rank}, {rank - 1}] for input rank {rank}")
    return out


def check_perm(p, perm, rank: int, name: str = "perm") -> list:
    """``perm`` as a list; ParseError unless it is a permutation of ``0..rank-1``."""
    perm = [int(v) for v in perm]
    if sorted(perm) != list(range(rank)):
        raise p.err(f"'{name}' = {perm} is not a permutation of 0..{rank - 1} (input rank {rank})")
    return perm


def check_count(p, values, n: int, name: str, why: str) -> list:
    """``values`` as a list of ints; ParseError unless it has ``n`` of them (``why``: where ``n`` comes from)."""
    values = [int(v) for v in values]
    if len(values) != n:
        raise p.err(f"'{name}' = {values} has {len(values)} values: expected {n} ({why})")
    return values


def check_min(p, values, lo: int, name: str) -> list:
    """``values`` (one int or a list) as a list of ints; ParseError unless each is ``>= lo``."""
    vals = [int(v) for v in np.asarray(values).reshape(-1)]
    if any(v < lo for v in vals):
        shown = vals if np.ndim(values) else vals[0]
        raise p.err(f"'{name}' = {shown} is out of range: expected values >= {lo}")
    return vals


def element_type(p, value, name: str) -> str:
    """The numpy dtype name of the ONNX element type ``value`` of attribute ``name``: ParseError when
    ``value`` is no ONNX element type, ShapeError (naming the node) when it has no numpy counterpart."""
    from ..ir.shape import onnx_dtype

    if value not in onnx.TensorProto.DataType.values() or not value:
        raise p.err(f"'{name}' = {value} is not an ONNX element type (TensorProto.DataType)")
    return onnx_dtype(value, f"node '{p.node_name}' ({p.node.op_type}): '{name}'")


def check_choice(p, value, allowed, name: str):
    """``value`` (a string attribute, or an int flag); ParseError listing ``allowed`` unless it is one of them."""
    if value not in allowed:
        raise p.err(f"'{name}' = {value!r} is not one of {', '.join(repr(a) for a in allowed)}")
    return value
