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
