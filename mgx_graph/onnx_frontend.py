"""ONNX frontend: an ONNX model -> an mgx_graph :class:`~mgx_graph.ir.Program`.

Built on the ``onnx`` package: ``onnx.load`` (with external data), ``onnx.checker``-level errors,
``onnx.numpy_helper`` for tensors and ``onnx.shape_inference`` (with data propagation) as a cross
check of every statically known output shape.  Input dims are fixed at parse time, as in MIGraphX's
``parse_onnx(map_input_dims=..., default_dim_value=...)``.  Shape arithmetic (``Shape`` ->
``Gather`` -> ``Concat`` -> ``Reshape`` ...) is folded into literals while parsing, so every
instruction has a static shape.

ONNX operator spec: https://onnx.ai/onnx/operators/
"""
from __future__ import annotations

import math
import os
import warnings
from typing import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from .errors import ParseError, ShapeError, UnsupportedOpError
from .ir import Instruction, Module, Program
from .operators import make_op
from .operators.dynamic import NeedsValue
from .shape import Shape, onnx_dtype

MIN_OPSET, MAX_OPSET = 1, onnx.defs.onnx_opset_version()
DOMAINS = ("", "ai.onnx", "ai.onnx.ml")
FOLD_LIMIT = 1 << 22  # largest literal (elements) that constant folding may create


def _ints(value) -> list:
    """A constant input as a list of Python ints (scalars and 1-D tensors alike)."""
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _decode(v):
    return v.decode() if isinstance(v, bytes) else v


def load_model(path_or_model, external_data_dir: str | None = None) -> onnx.ModelProto:
    """Load an ONNX model from a path, bytes or ModelProto; errors raise :class:`ParseError`."""
    if isinstance(path_or_model, onnx.ModelProto):
        return path_or_model
    if isinstance(path_or_model, (bytes, bytearray)):
        try:
            m = onnx.load_from_string(bytes(path_or_model))
        except Exception as e:  # protobuf DecodeError
            raise ParseError(f"<bytes>: not a valid ONNX protobuf ({type(e).__name__}: {e})") from None
        if external_data_dir:
            _load_external(m, external_data_dir, "<bytes>")
        return m
    path = os.fspath(path_or_model)
    if not os.path.exists(path):
        raise ParseError(f"{path}: no such file")
    try:
        m = onnx.load(path, load_external_data=False)
    except Exception as e:
        raise ParseError(f"{path}: not a valid ONNX protobuf ({type(e).__name__}: {e})") from None
    _load_external(m, external_data_dir or os.path.dirname(os.path.abspath(path)), path)
    return m


def _load_external(m: onnx.ModelProto, base: str, where: str) -> None:
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    for t in _get_all_tensors(m):
        if uses_external_data(t):
            loc = {e.key: e.value for e in t.external_data}.get("location", "?")
            f = os.path.join(base, loc)
            if not os.path.exists(f):
                raise ParseError(f"{where}: external data file '{loc}' of tensor '{t.name}' not found in {base}")
    try:
        onnx.load_external_data_for_model(m, base)
    except Exception as e:
        raise ParseError(f"{where}: cannot load external data ({type(e).__name__}: {e})") from None


class _Parser:
    def __init__(self, model: onnx.ModelProto, input_dims, default_dim_value, dim_params, check_shapes,
                 known=None):
        self.model = model
        self.known = dict(known or {})
        self.tensor_of: dict[int, str] = {}
        self.cur_module = None
        self.sub_counter = 0
        self.opsets = {o.domain or "": o.version for o in model.opset_import}
        self.opset = self.opsets.get("", self.opsets.get("ai.onnx", 0))
        if not model.graph.node and not model.graph.output:
            raise ParseError("the model has an empty graph (no nodes and no outputs): is the file empty?")
        if ("" in self.opsets or "ai.onnx" in self.opsets or not self.opsets) and \
                not MIN_OPSET <= self.opset <= MAX_OPSET:
            raise ParseError(f"model opset {self.opset} is out of the supported range {MIN_OPSET}..{MAX_OPSET} "
                             f"(the installed onnx package's)")
        self.input_dims = {k: [int(d) for d in v] for k, v in (input_dims or {}).items()}
        self.default_dim_value = int(default_dim_value)
        self.dim_params = dict(dim_params or {})
        self.check_shapes = check_shapes
        self.program = Program()
        self.values: dict[str, Instruction] = {}
        self.inferred: dict[str, tuple] = {}
        self.needed = None
        self.guessed = False  # a loop trip count was guessed: later shapes may differ from onnx inference
        self.node = None
        self.node_name = ""

    # -- helpers ---------------------------------------------------------------------------------
    def err(self, msg) -> ParseError:
        return ParseError(f"node '{self.node_name}' ({self.node.op_type}): {msg}")

    def add(self, m: Module, name, inputs, **attrs) -> Instruction:
        try:
            op = make_op(name, **attrs)
            ins = m.add_instruction(op, inputs)
        except ShapeError as e:
            raise ShapeError(f"node '{self.node_name}' ({self.node.op_type}): {e}") from None
        return fold_instruction(m, ins)

    def lit(self, m: Module, value) -> Instruction:
        return m.add_literal(np.asarray(value))

    def const(self, ins: Instruction | None, what: str) -> np.ndarray:
        """The value of ``ins`` at compile time: a literal, or the value this program is specialized
        for (a ``guard`` re-checks it at run time).  Raises NeedsValue when it is not known yet."""
        if ins is None:
            return None
        if ins.op.name == "@literal":
            return ins.op.value
        return self.specialize(ins, "value", what)

    def specialize(self, ins: Instruction, fn: str, what: str, guess=None):
        tensor = self.tensor_of.get(id(ins))
        if tensor is None:
            raise self.err(f"input '{what}' depends on run-time values in a way that cannot be specialized")
        key = f"{fn}:{tensor}"
        if key not in self.known:
            nv = NeedsValue(tensor, fn, self.node_name, guess)
            nv.program, nv.ins = self.program, ins  # the program parsed so far computes it (a prefix)
            raise nv
        expected = np.asarray(self.known[key])
        self.cur_module.add_instruction(make_op("guard", key=key, fn=fn, expected=expected), [ins])
        return expected

    def contiguous(self, m, x):
        return x if x.shape.standard() else self.add(m, "contiguous", [x])

    def reshape(self, m, x, lens):
        from .operators.shape_ops import reshape_strides

        lens = [int(d) for d in lens]
        if list(x.shape.lens) == lens and x.shape.standard():
            return x
        if reshape_strides(x.shape, lens) is None:
            x = self.add(m, "contiguous", [x])
        return self.add(m, "reshape", [x], dims=lens)

    # -- graph -----------------------------------------------------------------------------------
    def parse(self, output_names=None) -> Program:
        g = self.model.graph
        m = self.program.get_main_module()
        inits = {t.name for t in g.initializer}
        declared = [i.name for i in g.input if i.name not in inits]
        for name in self.input_dims:
            if name not in declared:
                raise ParseError(f"input_dims names '{name}', which is not an input of the model "
                                 f"(inputs: {', '.join(declared) or 'none'})")
        for t in g.initializer:
            try:
                self.values[t.name] = m.add_literal(numpy_helper.to_array(t))
            except Exception as e:
                raise ParseError(f"initializer '{t.name}': cannot read tensor ({e})") from None
        outs = output_names or [o.name for o in g.output]
        if output_names:
            self.needed = _needed_nodes(g, outs)
            used = _used_names(g, self.needed) | set(outs)
        for vi in g.input:
            if vi.name in inits:
                continue
            if output_names and vi.name not in used:
                continue
            self.values[vi.name] = m.add_parameter(vi.name, self._input_shape(vi))
            self.tensor_of[id(self.values[vi.name])] = vi.name
        self._run_shape_inference()
        self.parse_nodes(m, g.node)
        rets = []
        for o in outs:
            if o not in self.values:
                raise ParseError(f"graph output '{o}' is not produced by any node")
            rets.append(self.values[o])
        m.add_return(rets, outs)
        return self.program

    def _input_shape(self, vi) -> Shape:
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise ParseError(f"input '{vi.name}': only tensor inputs are supported")
        dtype = onnx_dtype(tt.elem_type, f"input '{vi.name}'")
        if vi.name in self.input_dims:
            lens = self.input_dims[vi.name]
            if tt.HasField("shape") and len(tt.shape.dim) != len(lens):
                raise ParseError(f"input_dims['{vi.name}'] has rank {len(lens)} but the model declares rank "
                                 f"{len(tt.shape.dim)}")
            for d, given in zip(tt.shape.dim if tt.HasField("shape") else [], lens):
                if d.HasField("dim_value") and d.dim_value >= 0 and d.dim_value != given:
                    raise ParseError(f"input_dims['{vi.name}'] = {lens} conflicts with the fixed dims of the model")
            return Shape(dtype, lens)
        lens = []
        for d in tt.shape.dim:
            if d.HasField("dim_value") and d.dim_value >= 0:
                lens.append(d.dim_value)
            elif d.dim_param in self.dim_params:
                lens.append(int(self.dim_params[d.dim_param]))
            else:
                lens.append(self.default_dim_value)
        return Shape(dtype, lens)

    def _run_shape_inference(self) -> None:
        if not self.check_shapes:
            return
        g = self.model.graph
        stripped = _without_weights(self.model)
        shapes = self.program.get_parameter_shapes()
        for vi in stripped.graph.input:
            if vi.name in shapes:
                tt = vi.type.tensor_type
                del tt.shape.dim[:]
                for d in shapes[vi.name].lens:
                    tt.shape.dim.add().dim_value = d
        try:
            inf = onnx.shape_inference.infer_shapes(stripped, data_prop=True)
        except Exception as e:  # onnx's own inference can reject valid models; it is only a check
            warnings.warn(f"onnx shape inference failed ({type(e).__name__}); shapes are not cross-checked")
            return
        for vi in list(inf.graph.value_info) + list(inf.graph.output):
            tt = vi.type.tensor_type
            if vi.type.HasField("tensor_type") and tt.HasField("shape") and \
                    all(d.HasField("dim_value") and d.dim_value >= 0 for d in tt.shape.dim):
                self.inferred[vi.name] = tuple(d.dim_value for d in tt.shape.dim)

    def parse_nodes(self, m: Module, nodes) -> None:
        outer_module = self.cur_module
        self.cur_module = m
        try:
            self._parse_nodes(m, nodes)
        finally:
            self.cur_module = outer_module

    def _parse_nodes(self, m: Module, nodes) -> None:
        for idx, node in enumerate(nodes):
            if self.needed is not None and id(node) not in self.needed:
                continue
            self.node = node
            self.node_name = node.name or f"{node.op_type}_{idx}"
            domain = node.domain or ""
            if domain not in DOMAINS and (domain, node.op_type) not in _CONTRIB_PARSERS:
                raise UnsupportedOpError(self.node_name, node.op_type, domain, self.opsets.get(domain, 0),
                                         "only the ai.onnx and ai.onnx.ml domains are supported (and "
                                         + ", ".join(f"{d}::{o}" for d, o in sorted(_CONTRIB_PARSERS)) + ")")
            fn = _PARSERS.get(node.op_type) if domain in ("", "ai.onnx") else _CONTRIB_PARSERS.get((domain, node.op_type))
            if fn is None:
                fn = _p_generic
            ins = []
            for name in node.input:
                if name == "":
                    ins.append(None)
                elif name not in self.values:
                    raise self.err(f"input '{name}' is not defined before this node")
                else:
                    ins.append(self.values[name])
            outs = fn(self, m, node, ins)
            if not isinstance(outs, (list, tuple)):
                outs = [outs]
            for name, val in zip(node.output, outs):
                if name == "" or val is None:
                    continue
                self._check(name, val)
                self.values[name] = val
                self.tensor_of.setdefault(id(val), name)

    def _check(self, name, val: Instruction) -> None:
        want = self.inferred.get(name)
        if want is None or isinstance(val.shape, tuple) or self.node.op_type in ("Loop", "Scan") or self.guessed:
            return
        if tuple(val.shape.lens) != want:
            raise ShapeError(f"node '{self.node_name}' ({self.node.op_type}): output '{name}' has shape "
                             f"{list(val.shape.lens)} but onnx shape inference gives {list(want)}")


def _subgraph_refs(node) -> set:
    """Names a node's subgraphs read from the enclosing scopes."""
    refs = set()
    for a in node.attribute:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for g in graphs:
            local = {i.name for i in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                local |= set(n.output)
            for n in g.node:
                refs |= {x for x in n.input if x and x not in local}
                refs |= {x for x in _subgraph_refs(n) if x not in local}
    return refs


def _needed_nodes(g, outputs) -> set:
    """ids of the nodes needed to compute ``outputs`` (backward reachability, subgraph reads included)."""
    producer = {}
    for n in g.node:
        for o in n.output:
            producer[o] = n
    need, stack = set(), list(outputs)
    while stack:
        t = stack.pop()
        n = producer.get(t)
        if n is None or id(n) in need:
            continue
        need.add(id(n))
        stack.extend(x for x in n.input if x)
        stack.extend(_subgraph_refs(n))
    return need


def _used_names(g, needed) -> set:
    used = set()
    for n in g.node:
        if id(n) in needed:
            used |= set(n.input) | _subgraph_refs(n)
    return used


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph without its large initializers (declared as inputs instead): enough for shape
    inference and far cheaper to copy than a model with hundreds of MB of weights."""
    m = onnx.ModelProto()
    m.ir_version = model.ir_version
    m.opset_import.extend(model.opset_import)
    g, src = m.graph, model.graph
    g.node.extend(src.node)
    g.input.extend(src.input)
    g.output.extend(src.output)
    declared = {i.name for i in src.input}
    for t in src.initializer:
        if int(np.prod(t.dims)) <= 64:
            g.initializer.append(t)
        elif t.name not in declared:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return m


def fold_instruction(m: Module, ins: Instruction) -> Instruction:
    """Replace ``ins`` by a literal when all its inputs are literals (constant propagation)."""
    op = ins.op
    if not op.foldable or op.builtin or ins.module_inputs or not ins.inputs:
        return ins
    if any(i.op.name != "@literal" for i in ins.inputs):
        return ins
    if isinstance(ins.shape, tuple):
        return ins
    n_out = ins.shape.elements()
    n_in = sum(i.shape.elements() for i in ins.inputs)
    if n_out > FOLD_LIMIT or (op.name == "multibroadcast" and n_out > max(4 * n_in, 4096)):
        return ins
    vals = [i.op.value for i in ins.inputs]
    try:
        value = op.fold(vals, [i.shape for i in ins.inputs], ins.shape)
    except Exception as e:
        raise ShapeError(f"constant folding of {op} failed: {type(e).__name__}: {e}") from None
    lit = m.insert_literal(ins, value)
    m.replace_instruction(ins, lit)
    m.remove_instruction(ins)
    return lit


# ---------------------------------------------------------------------------------------------------
# node parsers
# ---------------------------------------------------------------------------------------------------
_PARSERS: dict[str, Callable] = {}


def parser(*names):
    def deco(fn):
        for n in names:
            _PARSERS[n] = fn
        return fn

    return deco


_UNARY = {
    "Neg": "neg", "Abs": "abs", "Sqrt": "sqrt", "Reciprocal": "recip", "Exp": "exp", "Log": "log",
    "Sin": "sin", "Cos": "cos", "Tan": "tan", "Tanh": "tanh", "Asin": "asin", "Acos": "acos", "Atan": "atan",
    "Sinh": "sinh", "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh",
    "Floor": "floor", "Ceil": "ceil", "Round": "nearbyint", "Sign": "sign", "Erf": "erf", "Sigmoid": "sigmoid",
    "Relu": "relu", "IsNaN": "isnan", "Not": "not", "BitwiseNot": "bitwise_not", "HardSwish": "hard_swish",
    "Softplus": "softplus", "Softsign": "softsign",
}
_BINARY = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Equal": "equal", "Less": "less",
    "Greater": "greater", "LessOrEqual": "less_equal", "GreaterOrEqual": "greater_equal", "And": "logical_and",
    "Or": "logical_or", "Xor": "logical_xor", "BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or",
    "BitwiseXor": "bitwise_xor", "PRelu": "prelu",
}


@parser(*_UNARY)
def _p_unary(p, m, node, ins):
    return p.add(m, _UNARY[node.op_type], [ins[0]])


@parser(*_BINARY)
def _p_binary(p, m, node, ins):
    a, b = ins
    if p.opset < 7 and _attr(node, "broadcast"):
        # legacy broadcast: b's dims line up with a's starting at ``axis`` (default: the trailing dims)
        axis = _attr(node, "axis")
        ra, rb = a.shape.ndim, b.shape.ndim
        axis = ra - rb if axis is None else (axis + ra if axis < 0 else axis)
        trailing = ra - axis - rb
        if trailing > 0:
            b = p.reshape(m, b, list(b.shape.lens) + [1] * trailing)
    elif node.op_type == "PRelu" and p.opset < 9 and b.shape.ndim == 1 and a.shape.ndim > 2 and \
            b.shape.lens[0] == a.shape.lens[1] != a.shape.lens[-1]:
        b = p.reshape(m, b, [b.shape.lens[0]] + [1] * (a.shape.ndim - 2))  # slope per channel (axis 1)
    return p.add(m, _BINARY[node.op_type], [a, b])


@parser("Mod")
def _p_mod(p, m, node, ins):
    return p.add(m, "mod", ins, fmod=_attr(node, "fmod", 0))


@parser("BitShift")
def _p_bitshift(p, m, node, ins):
    return p.add(m, "bitshift", ins, direction=_decode(_attr(node, "direction")))


@parser("Sum", "Max", "Min", "Mean")
def _p_variadic(p, m, node, ins):
    name = {"Sum": "add", "Max": "max", "Min": "min", "Mean": "add"}[node.op_type]
    acc = ins[0]
    for x in ins[1:]:
        acc = p.add(m, name, [acc, x])
    if node.op_type == "Mean" and len(ins) > 1:
        acc = p.add(m, "div", [acc, p.lit(m, np.array(len(ins), dtype=acc.shape.dtype))])
    if len(ins) == 1:
        return acc
    return acc


@parser("LeakyRelu")
def _p_leaky(p, m, node, ins):
    return p.add(m, "leaky_relu", ins, alpha=_attr(node, "alpha", 0.01))


@parser("Elu")
def _p_elu(p, m, node, ins):
    return p.add(m, "elu", ins, alpha=_attr(node, "alpha", 1.0))


@parser("Celu")
def _p_celu(p, m, node, ins):
    return p.add(m, "celu", ins, alpha=_attr(node, "alpha", 1.0))


@parser("Selu")
def _p_selu(p, m, node, ins):
    return p.add(m, "selu", ins, alpha=_attr(node, "alpha", 1.67326319217681884765625),
                 gamma=_attr(node, "gamma", 1.05070102214813232421875))


@parser("HardSigmoid")
def _p_hsig(p, m, node, ins):
    return p.add(m, "hard_sigmoid", ins, alpha=_attr(node, "alpha", 0.2), beta=_attr(node, "beta", 0.5))


@parser("ThresholdedRelu")
def _p_trelu(p, m, node, ins):
    return p.add(m, "thresholded_relu", ins, alpha=_attr(node, "alpha", 1.0))


@parser("Gelu")
def _p_gelu(p, m, node, ins):
    return p.add(m, "gelu", ins, approximate=_decode(_attr(node, "approximate", b"none")))


@parser("Shrink")
def _p_shrink(p, m, node, ins):
    return p.add(m, "shrink", ins, bias=_attr(node, "bias", 0.0), lambd=_attr(node, "lambd", 0.5))


@parser("IsInf")
def _p_isinf(p, m, node, ins):
    return p.add(m, "isinf", ins, detect_positive=_attr(node, "detect_positive", 1),
                 detect_negative=_attr(node, "detect_negative", 1))


@parser("Identity")
def _p_identity(p, m, node, ins):
    return ins[0]


@parser("Dropout")
def _p_dropout(p, m, node, ins):
    if len(ins) > 2 and ins[2] is not None:
        train = p.const(ins[2], "training_mode")
        if bool(np.asarray(train)):
            return _p_generic(p, m, node, ins)  # training mode: a random mask, drawn on the host
    outs = [ins[0]]
    if len(node.output) > 1 and node.output[1]:
        outs.append(p.lit(m, np.ones(ins[0].shape.lens, dtype=bool)))
    return outs


@parser("Cast")
def _p_cast(p, m, node, ins):
    to = onnx_dtype(_attr(node, "to"), f"node '{p.node_name}'")
    if ins[0].shape.dtype == to:
        return ins[0]
    return p.add(m, "convert", ins, target_type=to)


@parser("CastLike")
def _p_castlike(p, m, node, ins):
    to = ins[1].shape.dtype
    if ins[0].shape.dtype == to:
        return ins[0]
    return p.add(m, "convert", [ins[0]], target_type=to)


@parser("Where")
def _p_where(p, m, node, ins):
    return p.add(m, "where", ins)


@parser("Clip")
def _p_clip(p, m, node, ins):
    x = ins[0]
    if p.opset < 11:
        lo, hi = _attr(node, "min"), _attr(node, "max")
        lo = None if lo is None else p.lit(m, np.array(lo, dtype=x.shape.dtype))
        hi = None if hi is None else p.lit(m, np.array(hi, dtype=x.shape.dtype))
    else:
        lo = ins[1] if len(ins) > 1 else None
        hi = ins[2] if len(ins) > 2 else None
    if lo is None and hi is None:
        return x
    if hi is None:
        return p.add(m, "max", [x, lo])
    if lo is None:
        return p.add(m, "min", [x, hi])
    return p.add(m, "min", [p.add(m, "max", [x, lo]), hi])


@parser("Constant")
def _p_constant(p, m, node, ins):
    a = node.attribute[0]
    if a.name == "value":
        v = numpy_helper.to_array(a.t)
    elif a.name == "value_float":
        v = np.array(a.f, dtype=np.float32)
    elif a.name == "value_floats":
        v = np.array(list(a.floats), dtype=np.float32)
    elif a.name == "value_int":
        v = np.array(a.i, dtype=np.int64)
    elif a.name == "value_ints":
        v = np.array(list(a.ints), dtype=np.int64)
    else:
        raise p.err(f"Constant attribute '{a.name}' is not supported")
    return p.lit(m, v)


@parser("ConstantOfShape")
def _p_cos(p, m, node, ins):
    lens = _ints(p.const(ins[0], "input"))
    t = _attr(node, "value")
    v = numpy_helper.to_array(t) if t is not None else np.zeros(1, np.float32)
    return p.lit(m, np.full(lens, v.reshape(-1)[0], dtype=v.dtype))


@parser("Shape")
def _p_shape(p, m, node, ins):
    lens = list(ins[0].shape.lens)
    start, end = _attr(node, "start", 0), _attr(node, "end", None)
    return p.lit(m, np.array(lens[slice(start, end)], dtype=np.int64))


@parser("Size")
def _p_size(p, m, node, ins):
    return p.lit(m, np.array(ins[0].shape.elements(), dtype=np.int64))


@parser("Range")
def _p_range(p, m, node, ins):
    s, l, d = (np.asarray(p.const(i, n)) for i, n in zip(ins, ("start", "limit", "delta")))
    dt = s.dtype
    s, l, d = (v.reshape(-1)[0] for v in (s, l, d))
    n = max(int(np.ceil((l - s) / d)), 0)  # ONNX: number_of_elements = max(ceil((limit - start) / delta), 0)
    return p.lit(m, (s + np.arange(n) * d).astype(dt))


@parser("Reshape")
def _p_reshape(p, m, node, ins):
    x = ins[0]
    if p.opset < 5:
        shape = list(_attr(node, "shape"))
    else:
        shape = _ints(p.const(ins[1], "shape"))
    allowzero = _attr(node, "allowzero", 0)
    lens = []
    for i, d in enumerate(shape):
        if d == 0 and not allowzero:
            lens.append(x.shape.lens[i])
        else:
            lens.append(d)
    if lens.count(-1) > 1:
        raise p.err(f"shape {shape} has more than one -1")
    if -1 in lens:
        known = math.prod(d for d in lens if d != -1)
        if known == 0 or x.shape.elements() % known:
            raise p.err(f"cannot reshape {list(x.shape.lens)} to {shape}")
        lens[lens.index(-1)] = x.shape.elements() // known
    if math.prod(lens) != x.shape.elements():
        raise p.err(f"cannot reshape {list(x.shape.lens)} ({x.shape.elements()} elements) to {shape}")
    return p.reshape(m, x, lens)


@parser("Flatten")
def _p_flatten(p, m, node, ins):
    x = ins[0]
    axis = _attr(node, "axis", 1)
    axis = axis + x.shape.ndim if axis < 0 else axis
    lens = x.shape.lens
    return p.reshape(m, x, [math.prod(lens[:axis]), math.prod(lens[axis:])])


@parser("Transpose")
def _p_transpose(p, m, node, ins):
    x = ins[0]
    perm = _attr(node, "perm", list(reversed(range(x.shape.ndim))))
    if list(perm) == list(range(x.shape.ndim)):
        return x
    return p.add(m, "transpose", [x], permutation=list(perm))


@parser("Squeeze")
def _p_squeeze(p, m, node, ins):
    if p.opset < 13:
        axes = _attr(node, "axes", [])
    else:
        axes = [] if len(ins) < 2 or ins[1] is None else _ints(p.const(ins[1], "axes"))
    return p.add(m, "squeeze", [ins[0]], axes=list(axes))


@parser("Unsqueeze")
def _p_unsqueeze(p, m, node, ins):
    axes = _attr(node, "axes", []) if p.opset < 13 else _ints(p.const(ins[1], "axes"))
    return p.add(m, "unsqueeze", [ins[0]], axes=list(axes))


@parser("Slice")
def _p_slice(p, m, node, ins):
    x = ins[0]
    if p.opset < 10:
        starts, ends = list(_attr(node, "starts")), list(_attr(node, "ends"))
        axes = list(_attr(node, "axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts = _ints(p.const(ins[1], "starts"))
        ends = _ints(p.const(ins[2], "ends"))
        axes = _ints(p.const(ins[3], "axes")) if len(ins) > 3 and ins[3] is not None \
            else list(range(len(starts)))
        steps = _ints(p.const(ins[4], "steps")) if len(ins) > 4 and ins[4] is not None \
            else [1] * len(starts)
    if any(s == 0 for s in steps):
        raise p.err("slice step 0")
    big = 1 << 62
    starts = [max(min(s, big), -big) for s in starts]
    ends = [max(min(e, big), -big) for e in ends]
    return p.add(m, "slice", [x], axes=axes, starts=starts, ends=ends, steps=steps)


@parser("Concat")
def _p_concat(p, m, node, ins):
    ins = [i for i in ins if i is not None]
    axis = _attr(node, "axis")
    nonempty = [i for i in ins if i.shape.elements() > 0]
    if len(nonempty) == 1 and len(ins) > 1:
        return nonempty[0]
    if len(ins) == 1:
        return ins[0]
    return p.add(m, "concat", ins, axis=axis)


@parser("Split")
def _p_split(p, m, node, ins):
    x = ins[0]
    axis = _attr(node, "axis", 0)
    a = axis + x.shape.ndim if axis < 0 else axis
    d = x.shape.lens[a]
    n = len(node.output)
    if p.opset < 13:
        split = _attr(node, "split")
    else:
        split = _ints(p.const(ins[1], "split")) if len(ins) > 1 and ins[1] is not None else None
    if split is None:
        k = _attr(node, "num_outputs", n)
        chunk = -(-d // k)
        split = [min(chunk, d - i * chunk) for i in range(k)]
    if sum(split) != d:
        raise p.err(f"split sizes {list(split)} do not add up to dim {d}")
    outs, pos = [], 0
    for s in split:
        outs.append(p.add(m, "slice", [x], axes=[a], starts=[pos], ends=[pos + s], steps=[1]))
        pos += s
    return outs


@parser("Expand")
def _p_expand(p, m, node, ins):
    from .shape import broadcast_lens

    x = ins[0]
    shape = _ints(p.const(ins[1], "shape"))
    lens = broadcast_lens(x.shape.lens, shape, where=p.node_name)
    if tuple(lens) == tuple(x.shape.lens):
        return x
    return p.add(m, "multibroadcast", [x], out_lens=list(lens))


@parser("Tile")
def _p_tile(p, m, node, ins):
    reps = _ints(p.const(ins[1], "repeats"))
    return p.add(m, "tile", [ins[0]], repeats=reps)


@parser("Pad")
def _p_pad(p, m, node, ins):
    x = ins[0]
    mode = _decode(_attr(node, "mode", b"constant"))
    if p.opset < 11:
        pads, value = list(_attr(node, "pads")), _attr(node, "value", 0.0)
    else:
        pads = _ints(p.const(ins[1], "pads"))
        value = 0.0
        if len(ins) > 2 and ins[2] is not None:
            cv = p.const(ins[2], "constant_value")
            value = float(np.asarray(cv).reshape(-1)[0]) if np.asarray(cv).size else 0.0
        if len(ins) > 3 and ins[3] is not None:
            axes = [int(a) % x.shape.ndim for a in p.const(ins[3], "axes")]
            full = [0] * (2 * x.shape.ndim)
            for i, a in enumerate(axes):
                full[a], full[a + x.shape.ndim] = pads[i], pads[i + len(axes)]
            pads = full
    return p.add(m, "pad", [x], pads=pads, mode=mode, value=value)


@parser("Gather")
def _p_gather(p, m, node, ins):
    return p.add(m, "gather", ins, axis=_attr(node, "axis", 0))


@parser("GatherElements")
def _p_gather_el(p, m, node, ins):
    return p.add(m, "gather_elements", ins, axis=_attr(node, "axis", 0))


@parser("GatherND")
def _p_gathernd(p, m, node, ins):
    return p.add(m, "gathernd", ins, batch_dims=_attr(node, "batch_dims", 0))


@parser("ScatterND")
def _p_scatternd(p, m, node, ins):
    return p.add(m, "scatternd", ins, reduction=_decode(_attr(node, "reduction", b"none")))


@parser("ScatterElements", "Scatter")
def _p_scatter_el(p, m, node, ins):
    return p.add(m, "scatter_elements", ins, axis=_attr(node, "axis", 0),
                 reduction=_decode(_attr(node, "reduction", b"none")))


@parser("MatMul")
def _p_matmul(p, m, node, ins):
    a, b = ins
    a1, b1 = a.shape.ndim == 1, b.shape.ndim == 1
    if a1:
        a = p.add(m, "unsqueeze", [a], axes=[0])
    if b1:
        b = p.add(m, "unsqueeze", [b], axes=[1])
    # broadcast batch dims explicitly when the ranks differ (dot wants equal batch ranks or none)
    r = p.add(m, "dot", [a, b])
    if a1:
        r = p.add(m, "squeeze", [r], axes=[-2])
    if b1:
        r = p.add(m, "squeeze", [r], axes=[-1])
    return r


@parser("Gemm")
def _p_gemm(p, m, node, ins):
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    alpha, beta = _attr(node, "alpha", 1.0), _attr(node, "beta", 1.0)
    if _attr(node, "transA", 0):
        a = p.add(m, "transpose", [a], permutation=[1, 0])
    if _attr(node, "transB", 0):
        b = p.add(m, "transpose", [b], permutation=[1, 0])
    y = p.add(m, "dot", [a, b])
    dt = y.shape.dtype
    if alpha != 1.0:
        y = p.add(m, "mul", [y, p.lit(m, np.array(alpha, dtype=dt))])
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = p.add(m, "mul", [c, p.lit(m, np.array(beta, dtype=c.shape.dtype))])
        y = p.add(m, "add", [y, c])
    return y


def _axes_of(p, node, ins, attr_opset):
    if p.opset < attr_opset:
        return list(_attr(node, "axes", []) or [])
    if len(ins) > 1 and ins[1] is not None:
        return _ints(p.const(ins[1], "axes"))
    return []


_REDUCE = {"ReduceSum": ("reduce_sum", 13), "ReduceMean": ("reduce_mean", 18), "ReduceMax": ("reduce_max", 18),
           "ReduceMin": ("reduce_min", 18), "ReduceProd": ("reduce_prod", 18), "ReduceL1": ("reduce_l1", 18),
           "ReduceL2": ("reduce_l2", 18), "ReduceSumSquare": ("reduce_sum_square", 18),
           "ReduceLogSum": ("reduce_log_sum", 18), "ReduceLogSumExp": ("reduce_log_sum_exp", 18)}


@parser(*_REDUCE)
def _p_reduce(p, m, node, ins):
    name, attr_opset = _REDUCE[node.op_type]
    axes = _axes_of(p, node, ins, attr_opset)
    if not axes and _attr(node, "noop_with_empty_axes", 0):
        return ins[0]
    return p.add(m, name, [ins[0]], axes=axes, keepdims=_attr(node, "keepdims", 1))


@parser("Softmax", "LogSoftmax")
def _p_softmax(p, m, node, ins):
    x = ins[0]
    name = "softmax" if node.op_type == "Softmax" else "logsoftmax"
    if p.opset >= 13:
        return p.add(m, name, [x], axis=_attr(node, "axis", -1))
    axis = _attr(node, "axis", 1)
    axis = axis + x.shape.ndim if axis < 0 else axis
    lens = list(x.shape.lens)
    flat = p.reshape(m, x, [math.prod(lens[:axis]), math.prod(lens[axis:])])
    y = p.add(m, name, [flat], axis=1)
    return p.reshape(m, y, lens)


@parser("ArgMax", "ArgMin")
def _p_argmax(p, m, node, ins):
    return p.add(m, node.op_type.lower(), ins, axis=_attr(node, "axis", 0), keepdims=_attr(node, "keepdims", 1),
                 select_last_index=_attr(node, "select_last_index", 0))


@parser("LayerNormalization")
def _p_layernorm(p, m, node, ins):
    if any(o for o in node.output[1:]) or _attr(node, "stash_type", 1) != 1:
        return _p_generic(p, m, node, ins)  # Mean / InvStdDev outputs: the reference kernel has them
    args = [i for i in ins if i is not None]
    return p.add(m, "layernorm", args, axis=_attr(node, "axis", -1), epsilon=_attr(node, "epsilon", 1e-5))


@parser("BatchNormalization")
def _p_batchnorm(p, m, node, ins):
    """Inference BatchNormalization: y = (x - mean) / sqrt(var + eps) * scale + B, folded into one
    multiply and one add per channel (the ``momentum`` attribute of opsets 9-13 does not matter here)."""
    if _attr(node, "training_mode", 0) or any(o for o in node.output[1:]):
        return _p_generic(p, m, node, ins)
    x, scale, bias, mean, var = ins[:5]
    eps = _attr(node, "epsilon", 1e-5)
    dt = x.shape.dtype
    shape = [x.shape.lens[1]] + [1] * (x.shape.ndim - 2) if x.shape.ndim > 2 else [x.shape.lens[-1]]
    eps_l = p.lit(m, np.array(eps, dtype=dt))
    inv = p.add(m, "recip", [p.add(m, "sqrt", [p.add(m, "add", [var, eps_l])])])
    mul = p.reshape(m, p.add(m, "mul", [scale, inv]), shape)
    add = p.reshape(m, p.add(m, "sub", [bias, p.add(m, "mul", [mean, p.add(m, "mul", [scale, inv])])]), shape)
    return p.add(m, "add", [p.add(m, "mul", [x, mul]), add])


@parser("GlobalAveragePool", "GlobalMaxPool")
def _p_global_pool(p, m, node, ins):
    x = ins[0]
    axes = list(range(2, x.shape.ndim))
    name = "reduce_mean" if node.op_type == "GlobalAveragePool" else "reduce_max"
    return p.add(m, name, [x], axes=axes, keepdims=1)


@parser("Conv")
def _p_conv(p, m, node, ins):
    x, w = ins[0], ins[1]
    nsp = x.shape.ndim - 2
    kshape = _attr(node, "kernel_shape") or list(w.shape.lens[2:])
    strides = list(_attr(node, "strides") or [1] * nsp)
    dil = list(_attr(node, "dilations") or [1] * nsp)
    auto = _decode(_attr(node, "auto_pad", b"NOTSET"))
    pads = list(_attr(node, "pads") or [0] * (2 * nsp))
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * (2 * nsp)
        for i in range(nsp):
            size = x.shape.lens[2 + i]
            out = -(-size // strides[i])
            total = max(0, (out - 1) * strides[i] + dil[i] * (kshape[i] - 1) + 1 - size)
            small, big = total // 2, total - total // 2
            pads[i], pads[i + nsp] = (small, big) if auto == "SAME_UPPER" else (big, small)
    elif auto == "VALID":
        pads = [0] * (2 * nsp)
    args = [x, w] + ([ins[2]] if len(ins) > 2 and ins[2] is not None else [])
    return p.add(m, "convolution", args, padding=pads, stride=strides, dilation=dil, group=_attr(node, "group", 1))


@parser("LSTM")
def _p_lstm(p, m, node, ins):
    if _attr(node, "layout", 0) != 0:
        return _p_generic(p, m, node, ins)  # a variant the device kernel does not cover
    acts = [_decode(a) for a in (_attr(node, "activations") or [])]
    if acts and acts[:3] != ["Sigmoid", "Tanh", "Tanh"]:
        return _p_generic(p, m, node, ins)  # a variant the device kernel does not cover
    if _attr(node, "clip") is not None or _attr(node, "input_forget", 0):
        return _p_generic(p, m, node, ins)  # a variant the device kernel does not cover
    if (len(ins) > 4 and ins[4] is not None) or (len(ins) > 7 and ins[7] is not None):
        return _p_generic(p, m, node, ins)  # a variant the device kernel does not cover
    H = _attr(node, "hidden_size")
    direction = _decode(_attr(node, "direction", b"forward"))
    args = [ins[0], ins[1], ins[2]]
    dt = ins[0].shape.dtype
    D = 2 if direction == "bidirectional" else 1
    B = ins[0].shape.lens[1]
    bias = ins[3] if len(ins) > 3 and ins[3] is not None else p.lit(m, np.zeros((D, 8 * H), dt))
    h0 = ins[5] if len(ins) > 5 and ins[5] is not None else p.lit(m, np.zeros((D, B, H), dt))
    c0 = ins[6] if len(ins) > 6 and ins[6] is not None else p.lit(m, np.zeros((D, B, H), dt))
    t = p.add(m, "lstm", args + [bias, h0, c0], hidden_size=H, direction=direction)
    return [p.add(m, "get_tuple_elem", [t], index=k) for k in range(3)]


def _p_dynamic_quantize_lstm(p, m, node, ins):
    """com.microsoft::DynamicQuantizeLSTM (onnxruntime contrib op; inputs X, W, R, B, sequence_lens,
    initial_h, initial_c, P, W_scale, W_zero_point, R_scale, R_zero_point)."""
    ins = list(ins) + [None] * (12 - len(ins))
    acts = [_decode(a) for a in (_attr(node, "activations") or [])]
    if (acts and acts[:3] != ["Sigmoid", "Tanh", "Tanh"]) or _attr(node, "clip") is not None \
            or _attr(node, "input_forget", 0) or ins[4] is not None or ins[7] is not None:
        raise UnsupportedOpError(p.node_name, node.op_type, node.domain, p.opsets.get(node.domain, 0),
                                 "only default activations, no clip / input_forget / sequence_lens / peepholes")
    if any(ins[k] is None for k in (0, 1, 2, 8, 10)):
        raise p.err("DynamicQuantizeLSTM needs X, W, R, W_scale and R_scale")
    H = _attr(node, "hidden_size")
    direction = _decode(_attr(node, "direction", b"forward"))
    D = 2 if direction == "bidirectional" else 1
    B = ins[0].shape.lens[1]
    dt = ins[0].shape.dtype
    zeros = [p.lit(m, np.zeros((D, 8 * H), dt)), p.lit(m, np.zeros((D, B, H), dt)), p.lit(m, np.zeros((D, B, H), dt))]
    b, h0, c0 = (ins[k] if ins[k] is not None else z for k, z in zip((3, 5, 6), zeros))
    wzp = ins[9] if ins[9] is not None else p.lit(m, np.zeros((D,), ins[1].shape.dtype))
    rzp = ins[11] if ins[11] is not None else p.lit(m, np.zeros((D,), ins[2].shape.dtype))
    t = p.add(m, "dynamic_quantize_lstm", [ins[0], ins[1], ins[2], b, h0, c0, ins[8], wzp, ins[10], rzp],
              hidden_size=H, direction=direction)
    return [p.add(m, "get_tuple_elem", [t], index=k) for k in range(3)]


#: ops outside the ONNX domains that the frontend parses: (domain, op type) -> parser
_CONTRIB_PARSERS = {("com.microsoft", "DynamicQuantizeLSTM"): _p_dynamic_quantize_lstm}


@parser("RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Bernoulli")
def _p_random(p, m, node, ins):
    t = node.op_type
    seed = _attr(node, "seed")
    if t.endswith("Like") or t == "Bernoulli":
        dt = _attr(node, "dtype")
        dtype = onnx_dtype(dt, p.node_name) if dt is not None else ins[0].shape.dtype
        kw = dict(seed=seed, dtype=dtype)
        args = [ins[0]]
    else:
        dtype = onnx_dtype(_attr(node, "dtype", 1), p.node_name)
        kw = dict(seed=seed, dtype=dtype, shape=list(_attr(node, "shape")))
        args = []
    if t.startswith("RandomUniform"):
        return p.add(m, "random_uniform", args, low=_attr(node, "low", 0.0), high=_attr(node, "high", 1.0), **kw)
    if t.startswith("RandomNormal"):
        return p.add(m, "random_normal", args, mean=_attr(node, "mean", 0.0), scale=_attr(node, "scale", 1.0), **kw)
    return p.add(m, "bernoulli", args, **kw)


@parser("NonZero")
def _p_nonzero(p, m, node, ins):
    count = int(p.specialize(ins[0], "count_nonzero", "input"))
    return p.add(m, "nonzero", [ins[0]], count=count)


@parser("TopK")
def _p_topk(p, m, node, ins):
    k = int(np.asarray(p.const(ins[1], "K")).reshape(-1)[0]) if p.opset >= 10 else _attr(node, "k")
    t = p.add(m, "topk", [ins[0]], k=k, axis=_attr(node, "axis", -1), largest=_attr(node, "largest", 1),
              sorted=_attr(node, "sorted", 1))
    return [p.add(m, "get_tuple_elem", [t], index=0), p.add(m, "get_tuple_elem", [t], index=1)]


@parser("Unique")
def _p_unique(p, m, node, ins):
    axis = _attr(node, "axis")
    fn = "unique_count" if axis is None else f"unique_count:{axis}"
    count = int(p.specialize(ins[0], fn, "X"))
    u = p.add(m, "unique", [ins[0]], count=count, axis=axis, sorted=_attr(node, "sorted", 1))
    return [p.add(m, "get_tuple_elem", [u], index=k) for k in range(4)]


def _p_generic(p, m, node, ins):
    """Any other ONNX node: evaluated on the host by onnx.reference (see operators/onnx_ref.py)."""
    from onnx.defs import has as _has_schema

    from .operators.onnx_ref import decode_shapes, encode_shapes, infer_outputs

    domain = node.domain or ""
    if not _has_schema(node.op_type, domain):
        raise UnsupportedOpError(p.node_name, node.op_type, domain, p.opsets.get(domain, p.opset))
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        raise UnsupportedOpError(p.node_name, node.op_type, domain, p.opset, "subgraph attributes")
    present = [(n, i) for n, i in zip(node.input, ins) if n]
    if any(i is None or isinstance(i.shape, tuple) for _, i in present):
        raise UnsupportedOpError(p.node_name, node.op_type, domain, p.opset, "non-tensor inputs")
    in_shapes = [i.shape if (n and i is not None) else None for n, i in zip(node.input, ins)]
    consts = {n: i.op.value for n, i in present if i.op.name == "@literal"}
    inferred = infer_outputs(node, in_shapes, consts, p.opsets)
    outs = [o for o in node.output if o]
    key = f"opshape:{p.node_name}"
    if inferred is not None and len(inferred) == len(outs) and all(o is not None and o[1] is not None
                                                                   for o in inferred):
        shapes = [(dt, lens) for dt, lens in inferred]
        key = ""
    elif key in p.known:
        dts = [int(c) for c in np.asarray(p.known[key + ":dtypes"]).reshape(-1)]
        shapes = [(onnx_dtype(d, p.node_name), lens) for d, lens in zip(dts, decode_shapes(p.known[key]))]
    else:
        def evaluate(values, node=node, opsets=dict(p.opsets)):
            from onnx.reference import ReferenceEvaluator

            from .operators.onnx_ref import one_node_model
            from .shape import NUMPY_TO_ONNX

            shp = [Shape(np.asarray(v).dtype.name, np.shape(v)) for v in values]
            names = [n for n in node.input if n]
            res = ReferenceEvaluator(one_node_model(node, shp, {}, opsets)).run(None, dict(zip(names, values)))
            res = [np.asarray(r) for r in res]
            return {key: encode_shapes([r.shape for r in res]),
                    key + ":dtypes": np.asarray([NUMPY_TO_ONNX[r.dtype.name] for r in res], np.int64)}

        nv = NeedsValue(p.node_name, "opshape", p.node_name, inputs=[i for _, i in present], evaluate=evaluate)
        nv.program = p.program
        raise nv
    op = make_op("onnx_op", node=node, shapes=shapes, opsets=p.opsets, key=key)
    try:
        ins_if = fold_instruction(m, m.add_instruction(op, [i for _, i in present]))
    except ShapeError as e:
        raise ShapeError(f"node '{p.node_name}' ({node.op_type}): {e}") from None
    if len(outs) == 1:
        vals = [ins_if]
    else:
        vals = [p.add(m, "get_tuple_elem", [ins_if], index=k) for k in range(len(outs))]
    it = iter(vals)
    return [next(it) if o else None for o in node.output]


def _parse_subgraph(p, m: Module, g, name: str, params=None):
    """Parse subgraph ``g`` into a new submodule ``name``; outer-scope names stay visible.

    ``params``: list of (name, Shape) for the submodule's parameters (default: ``g``'s inputs)."""
    sub = p.program.create_module(name)
    saved = dict(p.values)
    saved_node, saved_name = p.node, p.node_name
    try:
        for t in g.initializer:
            p.values[t.name] = sub.add_literal(numpy_helper.to_array(t))
        for pname, shape in (params or []):
            p.values[pname] = sub.add_parameter(pname, shape)
            p.tensor_of[id(p.values[pname])] = pname
        p.parse_nodes(sub, g.node)
        rets = []
        for o in g.output:
            if o.name not in p.values:
                raise ParseError(f"subgraph '{name}': output '{o.name}' is not produced")
            rets.append(p.values[o.name])
        sub.add_return(rets, [o.name for o in g.output])
    finally:
        p.values = saved
        p.node, p.node_name = saved_node, saved_name
    return sub


def _inline_subgraph(p, m: Module, g):
    saved = dict(p.values)
    saved_node, saved_name = p.node, p.node_name
    try:
        for t in g.initializer:
            p.values[t.name] = m.add_literal(numpy_helper.to_array(t))
        p.parse_nodes(m, g.node)
        return [p.values[o.name] for o in g.output]
    finally:
        p.values = saved
        p.node, p.node_name = saved_node, saved_name


@parser("If")
def _p_if(p, m, node, ins):
    cond = ins[0]
    then_g, else_g = _attr(node, "then_branch"), _attr(node, "else_branch")
    if cond.op.name == "@literal":  # constant condition: inline the branch taken
        return _inline_subgraph(p, m, then_g if bool(cond.op.value.reshape(-1)[0]) else else_g)
    n = p.sub_counter
    p.sub_counter += 1
    made = []
    try:
        then_m = _parse_subgraph(p, m, then_g, f"{m.name}:if{n}:then")
        made.append(then_m)
        else_m = _parse_subgraph(p, m, else_g, f"{m.name}:if{n}:else")
        made.append(else_m)
        op = make_op("if")
        shape = op.compute_shape([cond.shape], [then_m, else_m])
    except UnsupportedOpError:
        raise
    except (ShapeError, ParseError, NeedsValue):
        # a branch cannot be compiled for these shapes (or the branches return different shapes):
        # specialize on the condition and inline the branch taken
        for sub in made:
            p.program.remove_module(sub.name)
        taken = bool(np.asarray(p.specialize(cond, "value", "cond")).reshape(-1)[0])
        return _inline_subgraph(p, m, then_g if taken else else_g)
    ins_if = m.add_instruction(op, [cond], [then_m, else_m])
    if not isinstance(shape, tuple):
        return [ins_if]
    return [m.add_instruction(make_op("get_tuple_elem", index=k), [ins_if]) for k in range(len(shape))]


@parser("Loop")
def _p_loop(p, m, node, ins):
    body = _attr(node, "body")
    M = ins[0] if len(ins) > 0 and ins[0] is not None else p.lit(m, np.array(1 << 62, np.int64))
    cond = ins[1] if len(ins) > 1 and ins[1] is not None else p.lit(m, np.array(True))
    v_init = list(ins[2:])
    names = [i.name for i in body.input]
    params = [(names[0], Shape("int64", [])), (names[1], Shape("bool", []))] + \
             [(nm, Shape(v.shape.dtype, v.shape.lens)) for nm, v in zip(names[2:], v_init)]
    n = p.sub_counter
    p.sub_counter += 1
    sub = _parse_subgraph(p, m, body, f"{m.name}:loop{n}", params)
    n_carried = len(v_init)
    n_scan = len(body.output) - 1 - n_carried
    trip = -1
    key = f"trip_count:{p.node_name}"
    if n_scan > 0:
        ret = sub.get_return().inputs
        cond_param = sub.get_parameter(names[1])
        cond_const = cond.op.name == "@literal" and bool(cond.op.value.reshape(-1)[0])
        passthrough = ret[0] is cond_param or (ret[0].op.name == "@literal" and bool(ret[0].op.value.reshape(-1)[0]))
        if M.op.name == "@literal" and cond_const and passthrough:
            trip = int(M.op.value.reshape(-1)[0])
        elif key in p.known:
            trip = int(np.asarray(p.known[key]))
            p.guessed = True
        else:
            guess = int(M.op.value.reshape(-1)[0]) if M.op.name == "@literal" and int(M.op.value.reshape(-1)[0]) < (1 << 40) \
                else 1
            scan_name = node.output[1 + n_carried] if len(node.output) > 1 + n_carried else ""
            if scan_name in p.inferred and p.inferred[scan_name]:
                guess = int(p.inferred[scan_name][0])  # onnx shape inference knows the trip count
            raise NeedsValue(p.node_name, "trip_count", p.node_name, guess)
    op = make_op("loop", param_names=names, trip_count=trip, n_carried=n_carried)
    loop = m.add_instruction(op, [M, cond] + v_init, [sub])
    loop.meta["trip_key"] = key
    if not isinstance(loop.shape, tuple):
        return [loop]
    return [m.add_instruction(make_op("get_tuple_elem", index=k), [loop]) for k in range(len(loop.shape))]


@parser("Scan")
def _p_scan(p, m, node, ins):
    """Scan (opset >= 9) as a ``loop`` with a static trip count: each iteration gathers its slice of the
    scan inputs, and the stacked scan outputs are moved to their axes / directions afterwards."""
    if p.opset < 9:
        raise UnsupportedOpError(p.node_name, "Scan", "", p.opset, "opset 8 (batched Scan)")
    body = _attr(node, "body")
    n_scan_in = _attr(node, "num_scan_inputs")
    n_state = len(ins) - n_scan_in
    states, scans = list(ins[:n_state]), list(ins[n_state:])
    in_axes = list(_attr(node, "scan_input_axes") or [0] * n_scan_in)
    in_dirs = list(_attr(node, "scan_input_directions") or [0] * n_scan_in)
    n_scan_out = len(body.output) - n_state
    out_axes = list(_attr(node, "scan_output_axes") or [0] * n_scan_out)
    out_dirs = list(_attr(node, "scan_output_directions") or [0] * n_scan_out)
    lens = {x.shape.lens[a % x.shape.ndim] for x, a in zip(scans, in_axes)}
    if len(lens) != 1:
        raise p.err(f"scan inputs have different lengths {sorted(lens)}")
    L = lens.pop()
    n = p.sub_counter
    p.sub_counter += 1
    iter_name, cond_name = f"{p.node_name}:iter", f"{p.node_name}:cond"
    names = [iter_name, cond_name] + [i.name for i in body.input[:n_state]]
    sub = p.program.create_module(f"{m.name}:scan{n}")
    saved = dict(p.values)
    try:
        it = sub.add_parameter(iter_name, Shape("int64", []))
        sub.add_parameter(cond_name, Shape("bool", []))
        for vi, st in zip(body.input[:n_state], states):
            p.values[vi.name] = sub.add_parameter(vi.name, Shape(st.shape.dtype, st.shape.lens))
        p.cur_module = sub
        for vi, x, a, d in zip(body.input[n_state:], scans, in_axes, in_dirs):
            a = a % x.shape.ndim
            idx = it
            if d:
                idx = p.add(sub, "sub", [p.lit(sub, np.array(L - 1, np.int64)), it])
            p.values[vi.name] = p.add(sub, "gather", [x, idx], axis=a)
        for t in body.initializer:
            p.values[t.name] = sub.add_literal(numpy_helper.to_array(t))
        p.parse_nodes(sub, body.node)
        rets = [sub.add_literal(np.array(True))] + [p.values[o.name] for o in body.output]
        sub.add_return(rets)
    finally:
        p.values = saved
        p.cur_module = m
    op = make_op("loop", param_names=names, trip_count=L, n_carried=n_state)
    loop = m.add_instruction(op, [p.lit(m, np.array(L, np.int64)), p.lit(m, np.array(True))] + states, [sub])
    loop.meta["trip_key"] = f"trip_count:{p.node_name}"
    outs = [loop] if not isinstance(loop.shape, tuple) else \
        [m.add_instruction(make_op("get_tuple_elem", index=k), [loop]) for k in range(len(loop.shape))]
    res = outs[:n_state]
    for y, a, d in zip(outs[n_state:], out_axes, out_dirs):
        if d:
            y = p.add(m, "slice", [y], axes=[0], starts=[-1], ends=[-(1 << 62)], steps=[-1])
        r = y.shape.ndim
        a = a % r
        if a:
            perm = list(range(1, a + 1)) + [0] + list(range(a + 1, r))
            y = p.add(m, "transpose", [y], permutation=perm)
        res.append(y)
    return res


def parse_onnx(model, *, input_dims: dict | None = None, default_dim_value: int = 1,
               dim_params: dict | None = None, external_data_dir: str | None = None,
               check_shapes: bool = True, known_values: dict | None = None,
               output_names: list | None = None) -> Program:
    """Parse an ONNX model into a :class:`~mgx_graph.ir.Program`.

    Parameters
    ----------
    model: path (str / PathLike), serialized bytes, or ``onnx.ModelProto``.
    input_dims: ``{input name: [d0, d1, ...]}`` fixes the dims of those inputs.
    default_dim_value: value for any other symbolic dim (``dim_param``), default 1.
    dim_params: ``{symbol: value}`` fixes a named symbolic dim everywhere it appears.
    external_data_dir: folder holding external tensor data (default: the model's folder).
    check_shapes: cross-check every statically known output shape with onnx shape inference.
    known_values: ``{"fn:tensor": value}`` run-time values the program is specialized for (data-dependent
        shapes); each becomes a ``guard``.  Missing ones raise NeedsValue.
    output_names: compute only these tensors (nodes and inputs not needed for them are dropped).

    Raises
    ------
    ParseError: unreadable / malformed file, missing external data, bad ``input_dims``.
    UnsupportedOpError: an op, domain or opset this frontend does not implement (names the node).
    ShapeError: inconsistent shapes (names the node).
    """
    m = load_model(model, external_data_dir)
    prog = _Parser(m, input_dims, default_dim_value, dim_params, check_shapes, known_values).parse(output_names)
    prog.metadata = {p.key: p.value for p in m.metadata_props}
    prog.symbolic_inputs = symbolic_inputs(m, input_dims)
    return prog


def symbolic_inputs(model: onnx.ModelProto, input_dims: dict | None = None) -> dict:
    """Inputs with dims not fixed by the model nor by ``input_dims``: ``{name: [dim indices]}``."""
    inits = {t.name for t in model.graph.initializer}
    res = {}
    for vi in model.graph.input:
        if vi.name in inits or (input_dims and vi.name in input_dims):
            continue
        dims = [k for k, d in enumerate(vi.type.tensor_type.shape.dim) if not (d.HasField("dim_value") and
                                                                                  d.dim_value >= 0)]
        if dims:
            res[vi.name] = dims
    return res


from . import onnx_parse_misc  # noqa: E402,F401
