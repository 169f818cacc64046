"""Checks of an ONNX model against the ONNX spec, as onnxruntime makes them when it loads a model.

Before parsing (:func:`check_model`): the model's ``ir_version``; every node of the ONNX domains, in the
main graph and in every subgraph, against its op's schema (input / output counts, a required input
given as '', unknown / missing required / mistyped attributes, with messages naming the formal input
or attribute; then ``onnx.checker.check_node`` for the rest); the dims of every
stored tensor (initializers, tensor attributes).  Nodes go to the checker one by one with their
subgraphs and large tensors left out, so the check costs little for models with GB of weights.

While parsing: each node's input element types against the type constraints of its op's schema
(:func:`check_input_types`) and each graph output's declared element type against the computed one
(:func:`check_output_type`).  Ops of other domains (com.microsoft) and ONNX-domain op types without
an onnx schema (SimplifiedLayerNormalization) are left to their parsers.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, numpy_helper

from ..errors import ParseError
from ..ir.shape import NUMPY_TO_ONNX
from .op_parser import ONNX_DOMAINS
from .topology import node_label

SMALL_TENSOR = 4096  # bytes: a tensor attribute above this goes to the checker as an empty tensor
ELEM_NAMES: dict[int, str] = {TensorProto.FLOAT: "float", TensorProto.DOUBLE: "double", TensorProto.STRING: "string"}
_TYPE_NAMES = {v: k for k, v in AttributeProto.AttributeType.items()}


def check_model(model: onnx.ModelProto) -> None:
    """ParseError for a model onnxruntime refuses on loading: no or an unknown ``ir_version``, a node
    that breaks its op's schema, a stored tensor with a negative dim."""
    if not model.HasField("ir_version"):
        raise ParseError("missing model IR version: the model does not set ir_version")
    if not 1 <= model.ir_version <= onnx.IR_VERSION:
        raise ParseError(f"unsupported model IR version {model.ir_version}: expected 1..{onnx.IR_VERSION} "
                         f"(the installed onnx package's)")
    check_text(model.graph, "graph")
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = model.ir_version
    ctx.opset_imports = {o.domain: o.version for o in model.opset_import}
    _check_graph(model.graph, ctx, onnx.checker.C.LexicalScopeContext(), "")


def check_text(msg, where: str) -> None:
    """ParseError when a string field of ``msg`` or of a message below it is not valid UTF-8 (protobuf
    then hands it over as bytes; onnxruntime refuses such a model)."""
    for field, value in msg.ListFields():
        if field.type == field.TYPE_STRING:
            for text in ([value] if isinstance(value, (str, bytes)) else value):
                if not isinstance(text, str):
                    raise ParseError(f"{where}: field '{field.name}' is not valid UTF-8 text: {bytes(text)[:40]!r}")
        elif field.type == field.TYPE_MESSAGE:
            single = hasattr(value, "ListFields")
            for k, item in enumerate([value] if single else value):
                check_text(item, f"{where}.{field.name}" if single else f"{where}.{field.name}[{k}]")


def _check_graph(g, ctx, lex, where: str) -> None:
    for t in g.initializer:
        check_dims(t, f"{where}initializer '{t.name}'")
    for idx, node in enumerate(g.node):
        label = f"{where}node '{node_label(node, idx)}' ({node.op_type})"
        for a in node.attribute:
            if a.type == AttributeProto.TENSOR:
                check_dims(a.t, f"{label}: attribute '{a.name}'")
            elif a.type == AttributeProto.TENSORS:
                for t in a.tensors:
                    check_dims(t, f"{label}: attribute '{a.name}'")
            elif a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
                for sub in ([a.g] if a.type == AttributeProto.GRAPH else a.graphs):
                    _check_graph(sub, ctx, lex, f"{label}: attribute '{a.name}': ")
        domain = "" if node.domain == "ai.onnx" else node.domain
        if domain not in ONNX_DOMAINS or not onnx.defs.has(node.op_type, domain):
            continue
        if domain == "":
            _check_schema(node, opset_of(ctx, ""), label)
        if _deprecated(node.op_type, opset_of(ctx, domain), domain):
            continue
        try:
            onnx.checker.C.check_node(_light_copy(node, domain).SerializeToString(), ctx, lex)
        except onnx.checker.ValidationError as e:
            raise ParseError(f"{label}: {_first_line(e)}") from None
        except UnicodeDecodeError:  # the checker's message quotes a name that is not UTF-8
            raise ParseError(f"{label}: breaks its op's schema, and a name or string in it is not "
                             f"valid UTF-8") from None


def opset_of(ctx, domain: str) -> int:
    """The opset ``ctx`` imports for ``domain`` (``""`` and ``ai.onnx`` alike); 0 when none."""
    imports = ctx.opset_imports
    return imports.get(domain, imports.get("ai.onnx", 0) if domain == "" else 0)


@functools.lru_cache(maxsize=None)
def _deprecated(op_type: str, opset: int, domain: str) -> bool:
    """True when onnx marks the op's schema at ``opset`` deprecated (onnxruntime, built with another onnx
    release, may still run it: GroupNormalization-18)."""
    try:
        return onnx.defs.get_schema(op_type, opset, domain).deprecated
    except onnx.defs.SchemaError:
        return False


def _check_schema(node, opset: int, label: str) -> None:
    """Input / output counts, required inputs given as '' and attributes of an ai.onnx ``node`` against
    its op's schema at ``opset``, with messages naming the formal input or the attribute (onnx's checker
    then checks the rest)."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, "")
    except onnx.defs.SchemaError:
        return
    n_in, n_out = len(node.input), len(node.output)
    if not schema.min_input <= n_in <= schema.max_input:
        raise ParseError(f"{label}: {n_in} inputs: expected {schema.min_input}..{schema.max_input} for "
                         f"{node.op_type} at opset {opset}")
    if not schema.min_output <= n_out <= schema.max_output:
        raise ParseError(f"{label}: {n_out} outputs: expected {schema.min_output}..{schema.max_output} for "
                         f"{node.op_type} at opset {opset}")
    optional = onnx.defs.OpSchema.FormalParameterOption.Optional
    for i, name in enumerate(node.input):
        formal = schema.inputs[min(i, len(schema.inputs) - 1)] if schema.inputs else None
        if name == "" and formal is not None and formal.option != optional:
            raise ParseError(f"{label}: input {i} ('{formal.name}') is required but given as ''")
    _check_attributes(node, schema, opset, label)


def _check_attributes(node, schema, opset: int, label: str) -> None:
    defined = schema.attributes
    for a in node.attribute:
        if a.ref_attr_name:
            continue
        want = defined.get(a.name)
        if want is None:
            raise ParseError(f"{label}: attribute '{a.name}' is not an attribute of {node.op_type} at opset {opset} "
                             f"(it has {', '.join(sorted(defined)) or 'none'})")
        if a.type and int(a.type) != int(want.type):
            raise ParseError(f"{label}: attribute '{a.name}' is {_TYPE_NAMES.get(a.type, a.type)}: expected "
                             f"{_TYPE_NAMES.get(int(want.type), want.type)}")
    given = {a.name for a in node.attribute}
    for name, spec in defined.items():
        if spec.required and name not in given:
            raise ParseError(f"{label}: required attribute '{name}' is missing")


def _light_copy(node, domain: str):
    """``node`` (in ``domain``) with each subgraph replaced by an empty graph and each large tensor attribute by an
    empty tensor of its type (they are checked on their own)."""
    out = onnx.NodeProto(op_type=node.op_type, domain=domain, name=node.name)
    out.input.extend(node.input)
    out.output.extend(node.output)
    for a in node.attribute:
        if a.type == AttributeProto.GRAPH:
            out.attribute.add(name=a.name, type=a.type, g=onnx.GraphProto(name=a.g.name or "subgraph"))
        elif a.type == AttributeProto.GRAPHS:
            b = out.attribute.add(name=a.name, type=a.type)
            b.graphs.extend(onnx.GraphProto(name=s.name or "subgraph") for s in a.graphs)
        elif a.type == AttributeProto.TENSOR and a.t.ByteSize() > SMALL_TENSOR:
            out.attribute.add(name=a.name, type=a.type, t=TensorProto(data_type=a.t.data_type, dims=[0]))
        else:
            out.attribute.append(a)
    return out


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def check_dims(t: TensorProto, where: str) -> None:
    """ParseError when tensor ``t`` has a negative dim (numpy's reshape would infer it)."""
    bad = [int(d) for d in t.dims if d < 0]
    if bad:
        raise ParseError(f"{where}: dims {list(t.dims)} has a negative dim: expected dims >= 0")


def read_tensor(t: TensorProto, where: str) -> np.ndarray:
    """The value of tensor ``t`` as a numpy array; ParseError when its dims are negative or do not match
    its data (``where`` names it in the message)."""
    check_dims(t, where)
    try:
        value = numpy_helper.to_array(t)
    except Exception as e:  # noqa: BLE001  (numpy / onnx raise ValueError, TypeError ... on bad data)
        raise ParseError(f"{where}: cannot read tensor ({type(e).__name__}: {e})") from None
    if value.size != math.prod(int(d) for d in t.dims):
        raise ParseError(f"{where}: has {value.size} values but dims {list(t.dims)} hold "
                         f"{math.prod(int(d) for d in t.dims)}")
    return value


# -- types --------------------------------------------------------------------------------------------
def type_string(dtype: str) -> str | None:
    """onnx's name of the tensor type of element type ``dtype`` (a numpy dtype name), e.g.
    ``tensor(float)``; ``None`` for element types that have no ONNX counterpart here."""
    elem = NUMPY_TO_ONNX.get(dtype)
    if elem is None:
        return None
    return f"tensor({ELEM_NAMES.get(elem, TensorProto.DataType.Name(elem).lower())})"


@functools.lru_cache(maxsize=None)
def _constraints(op_type: str, opset: int, domain: str):
    """``(formal inputs, {type parameter: allowed type strings})`` of the op's schema at ``opset``;
    ``None`` when onnx has none."""
    try:
        s = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None
    allowed = {c.type_param_str: frozenset(c.allowed_type_strs) for c in s.type_constraints}
    return tuple(s.inputs), allowed


def check_input_types(p, node, ins) -> None:
    """ParseError (``p.err``) when an input's element type is not allowed by the op's type constraints,
    or two inputs bound to one type parameter differ (onnxruntime refuses both)."""
    domain = node.domain or ""
    if domain not in ONNX_DOMAINS or not onnx.defs.has(node.op_type, domain):
        return
    domain = "" if domain == "ai.onnx" else domain
    found = _constraints(node.op_type, p.opsets.get(domain, 0) if domain else p.opset, domain)
    if found is None:
        return
    formals, allowed = found
    bound: dict[str, tuple[str, str]] = {}
    for k, (name, x) in enumerate(zip(node.input, ins)):
        if x is None or not formals or (k >= len(formals) and
                                        formals[-1].option != onnx.defs.OpSchema.FormalParameterOption.Variadic):
            continue
        f = formals[min(k, len(formals) - 1)]
        given = None if isinstance(x.shape, tuple) else type_string(x.shape.dtype)
        if given is None:
            continue
        ok = allowed.get(f.type_str, frozenset([f.type_str]))
        if given not in ok:
            raise p.err(f"input {k} ('{name}', parameter '{f.name}') has type {given}: expected one of "
                        f"{', '.join(sorted(ok))}")
        if f.type_str in allowed and (k < len(formals) - 1 or f.is_homogeneous):
            first = bound.setdefault(f.type_str, (given, name))
            if first[0] != given:
                raise p.err(f"type parameter {f.type_str} is bound to {first[0]} by input '{first[1]}' and to "
                            f"{given} by input {k} ('{name}'): expected one type")


def check_output_type(p, name: str, declared: int, x) -> None:
    """ParseError (``p.err``) when graph output ``name`` declares element type ``declared`` (a
    ``TensorProto`` data type, 0 for none) and ``x`` computes another."""
    if not declared or isinstance(x.shape, tuple):
        return
    given = type_string(x.shape.dtype)
    want = ELEM_NAMES.get(declared, TensorProto.DataType.Name(declared).lower()) \
        if declared in TensorProto.DataType.values() else str(declared)
    if given is not None and given != f"tensor({want})":
        raise p.err(f"graph output '{name}' is declared tensor({want}) but the node computes {given}")
