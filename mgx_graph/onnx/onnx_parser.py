"""The parser core: an ONNX model -> an mgx_graph :class:`~mgx_graph.ir.Program`.

:class:`OnnxParser` walks the graph in topological order and hands each node to the parser its op
type registered (:mod:`mgx_graph.onnx.op_parser`; the ``parse_*`` modules hold them, one per op
family).  Input dims are fixed at parse time, as in MIGraphX's ``parse_onnx(map_input_dims=...,
default_dim_value=...)``; every instruction whose inputs are literals is folded into a literal while
parsing, so shape arithmetic (``Shape`` -> ``Gather`` -> ``Concat`` -> ``Reshape`` ...) leaves static
shapes; onnx shape inference (with data propagation) cross-checks every statically known output shape.
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import onnx

from ..errors import ParseError, ShapeError, UnsupportedOpError
from ..ir import Instruction, Module, Program
from ..ir.fold import fold_instruction  # noqa: F401  (mgx_graph.onnx.fold_instruction)
from ..ir.shape import Shape, onnx_dtype
from ..operators import make_op
from ..operators.dynamic import NeedsValue
from . import op_parser
from .loader import load_model, symbolic_inputs, without_weights
from .schema_check import check_input_types, check_model, check_output_type, read_tensor
from .topology import check_acyclic, check_definitions, needed_nodes, node_label, topological_order, used_names

MIN_OPSET, MAX_OPSET = 1, onnx.defs.onnx_opset_version()


class OnnxParser:
    """The state of one parse: the program built so far, the instruction each tensor name maps to
    (``values``), the node being parsed (``node``, ``node_name``, for messages) and the helpers node
    parsers build instructions with.  ``known``: ``{"fn:tensor": value}`` run-time values this parse
    specializes for (see :meth:`specialize`)."""

    def __init__(self, model: onnx.ModelProto, input_dims, default_dim_value, dim_params, check_shapes,
                 known=None):
        self.model = model
        self.known = dict(known or {})
        self.tensor_of: dict[int, str] = {}
        self.cur_module: Module | None = None  # the module being parsed into
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
        self.guessed = False  # a loop trip count was guessed: later shapes may differ from onnx inference
        self.node: Any = None  # the NodeProto being parsed
        self.node_name = ""
        self.declared: dict[str, int] = {}  # graph output -> declared element type

    # -- helpers for node parsers ------------------------------------------------------------------
    def err(self, msg) -> ParseError:
        """A ParseError naming the node being parsed."""
        return ParseError(f"node '{self.node_name}' ({self.node.op_type}): {msg}")

    def add(self, m: Module, name, inputs, **attrs) -> Instruction:
        """Add op ``name`` (``make_op(name, **attrs)``) to ``m``, folded into a literal when its inputs are
        literals.  Raises ShapeError naming the node when the op rejects the input shapes."""
        try:
            op = make_op(name, **attrs)
            ins = m.add_instruction(op, inputs)
        except ShapeError as e:
            raise ShapeError(f"node '{self.node_name}' ({self.node.op_type}): {e}") from None
        return fold_instruction(m, ins)

    def lit(self, m: Module, value) -> Instruction:
        """Add ``value`` (array-like) to ``m`` as a literal."""
        return m.add_literal(np.asarray(value))

    def const(self, ins: Instruction | None, what: str) -> np.ndarray | None:
        """The value of ``ins`` at compile time: a literal, or the value this program is specialized
        for (a ``guard`` re-checks it at run time).  Raises NeedsValue when it is not known yet."""
        if ins is None:
            return None
        if ins.op.name == "@literal":
            return ins.op.value
        return self.specialize(ins, "value", what)

    def specialize(self, ins: Instruction, fn: str, what: str, guess=None):
        """``fn(ins)`` (see :mod:`mgx_graph.operators.dynamic`) from ``known``, re-checked by a ``guard``;
        raises NeedsValue (with the program parsed so far) when it is not known, ParseError when ``ins``
        is no named tensor."""
        tensor = self.tensor_of.get(id(ins))
        if tensor is None:
            raise self.err(f"input '{what}' depends on run-time values in a way that cannot be specialized")
        key = f"{fn}:{tensor}"
        if key not in self.known:
            nv = NeedsValue(tensor, fn, self.node_name, guess)
            nv.program, nv.ins = self.program, ins  # the program parsed so far computes it (a prefix)
            raise nv
        expected = np.asarray(self.known[key])
        if self.cur_module is None:
            raise self.err(f"input '{what}' is specialized outside the parse of a graph")
        self.cur_module.add_instruction(make_op("guard", key=key, fn=fn, expected=expected), [ins])
        return expected

    def contiguous(self, m, x):
        """``x``, or a standard-layout copy of it."""
        return x if x.shape.standard() else self.add(m, "contiguous", [x])

    def reshape(self, m, x, lens):
        """``x`` reshaped to ``lens`` (a copy first when its strides do not allow a view)."""
        from ..operators.views import reshape_strides

        lens = [int(d) for d in lens]
        if list(x.shape.lens) == lens and x.shape.standard():
            return x
        if reshape_strides(x.shape, lens) is None:
            x = self.add(m, "contiguous", [x])
        return self.add(m, "reshape", [x], dims=lens)

    # -- graph -----------------------------------------------------------------------------------
    def parse(self, output_names=None) -> Program:
        """Parse the model's graph into ``self.program`` (returning only ``output_names`` when given)."""
        g = self.model.graph
        check_model(self.model)
        self.declared = {o.name: o.type.tensor_type.elem_type for o in g.output if o.type.HasField("tensor_type")}
        check_definitions(g)
        check_acyclic(g)
        m = self.program.get_main_module()
        inits = {t.name for t in g.initializer}
        declared = [i.name for i in g.input if i.name not in inits]
        for name in self.input_dims:
            if name not in declared:
                raise ParseError(f"input_dims names '{name}', which is not an input of the model "
                                 f"(inputs: {', '.join(declared) or 'none'})")
        for t in g.initializer:
            self.values[t.name] = m.add_literal(read_tensor(t, f"initializer '{t.name}'"))
        outs = output_names or [o.name for o in g.output]
        if not outs:
            raise ParseError(f"the graph declares no outputs ({len(g.node)} nodes): nothing to compute")
        needed = None
        if output_names:
            needed = needed_nodes(g, outs)
            used = used_names(g, needed) | set(outs)
        for vi in g.input:
            if vi.name in inits:
                continue
            if output_names and vi.name not in used:
                continue
            self.values[vi.name] = m.add_parameter(vi.name, self._input_shape(vi))
            self.tensor_of[id(self.values[vi.name])] = vi.name
        self._run_shape_inference()
        self.parse_nodes(m, g, needed)
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
        stripped = without_weights(self.model)
        shapes = self.program.get_parameter_shapes()
        for vi in stripped.graph.input:
            if vi.name in shapes:
                tt = vi.type.tensor_type
                del tt.shape.dim[:]
                for d in shapes[vi.name].lens:
                    tt.shape.dim.add().dim_value = d
        try:
            inf = onnx.shape_inference.infer_shapes(stripped, data_prop=_propagation_is_bounded(stripped))
        except Exception as e:  # onnx's own inference can reject valid models; it is only a check
            warnings.warn(f"onnx shape inference failed ({type(e).__name__}); shapes are not cross-checked")
            return
        for vi in list(inf.graph.value_info) + list(inf.graph.output):
            tt = vi.type.tensor_type
            if vi.type.HasField("tensor_type") and tt.HasField("shape") and \
                    all(d.HasField("dim_value") and d.dim_value >= 0 for d in tt.shape.dim):
                self.inferred[vi.name] = tuple(d.dim_value for d in tt.shape.dim)

    def parse_nodes(self, m: Module, g, needed: set | None = None) -> None:
        """Parse the nodes of graph ``g`` (a GraphProto) into module ``m``, in topological order;
        only those whose index in ``g.node`` is in ``needed`` when it is given."""
        outer_module = self.cur_module
        self.cur_module = m
        try:
            self._parse_nodes(m, g, needed)
        finally:
            self.cur_module = outer_module

    def _parse_nodes(self, m: Module, g, needed) -> None:
        for idx, node in topological_order(g.node, f"graph '{g.name}'"):
            if needed is not None and idx not in needed:
                continue
            self.node = node
            self.node_name = node_label(node, idx)
            fn = self._parser_of(node)
            ins = self._inputs_of(node)
            check_input_types(self, node, ins)
            outs = fn(self, m, node, ins)
            self._bind_outputs(m, node, outs)

    def _parser_of(self, node):
        domain = node.domain or ""
        fn = op_parser.lookup(domain, node.op_type)
        if fn is None:
            raise UnsupportedOpError(self.node_name, node.op_type, domain, self.opsets.get(domain, 0),
                                     "only the ai.onnx and ai.onnx.ml domains are supported (and "
                                     + ", ".join(f"{d}::{o}" for d, o in op_parser.other_domain_ops()) + ")")
        return fn

    def _inputs_of(self, node) -> list:
        ins: list[Instruction | None] = []
        for name in node.input:
            if name == "":
                ins.append(None)
            elif name not in self.values:
                raise self.err(f"input '{name}' is not defined (no graph input, initializer or node output "
                               f"of this graph or an enclosing one has that name)")
            else:
                ins.append(self.values[name])
        return ins

    def _bind_outputs(self, m: Module, node, outs) -> None:
        if not isinstance(outs, (list, tuple)):
            outs = [outs]
        for name, val in zip(node.output, outs):
            if name == "" or val is None:
                continue
            self._check(name, val)
            if name in self.declared and m is self.program.get_main_module():
                check_output_type(self, name, self.declared[name], val)
            self.values[name] = val
            self.tensor_of.setdefault(id(val), name)

    def _check(self, name, val: Instruction) -> None:
        want = self.inferred.get(name)
        if want is None or isinstance(val.shape, tuple) or self.node.op_type in ("Loop", "Scan") or self.guessed:
            return
        if tuple(val.shape.lens) != want:
            raise ShapeError(f"node '{self.node_name}' ({self.node.op_type}): output '{name}' has shape "
                             f"{list(val.shape.lens)} but onnx shape inference gives {list(want)}")

    # -- subgraphs -------------------------------------------------------------------------------
    def parse_subgraph(self, g, name: str, params=None) -> Module:
        """Parse subgraph ``g`` into a new submodule ``name``; outer-scope names stay visible.

        ``params``: list of (name, Shape) for the submodule's parameters (default: none).
        Raises ParseError when an output of ``g`` is not produced."""
        sub = self.program.create_module(name)
        saved = dict(self.values)
        saved_node, saved_name = self.node, self.node_name
        try:
            for t in g.initializer:
                self.values[t.name] = sub.add_literal(read_tensor(t, f"subgraph '{name}': initializer '{t.name}'"))
            for pname, shape in (params or []):
                self.values[pname] = sub.add_parameter(pname, shape)
                self.tensor_of[id(self.values[pname])] = pname
            self.parse_nodes(sub, g)
            rets = []
            for o in g.output:
                if o.name not in self.values:
                    raise ParseError(f"subgraph '{name}': output '{o.name}' is not produced")
                rets.append(self.values[o.name])
            sub.add_return(rets, [o.name for o in g.output])
        finally:
            self.values = saved
            self.node, self.node_name = saved_node, saved_name
        return sub

    def inline_subgraph(self, m: Module, g) -> list:
        """Parse subgraph ``g`` (no inputs) straight into ``m``; returns the instructions of its outputs."""
        saved = dict(self.values)
        saved_node, saved_name = self.node, self.node_name
        try:
            for t in g.initializer:
                self.values[t.name] = m.add_literal(read_tensor(t, f"initializer '{t.name}'"))
            self.parse_nodes(m, g)
            return [self.values[o.name] for o in g.output]
        finally:
            self.values = saved
            self.node, self.node_name = saved_node, saved_name


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

    Nodes may be listed in any order that has no cycle (they are parsed in a stable topological
    order, a subgraph's reads of outer names counting as inputs of the node that owns it).

    Raises
    ------
    ParseError: unreadable / malformed file, missing external data, bad ``input_dims``, a tensor name
        defined twice (names the node, the tensor and the earlier definer), a cycle (names its nodes).
    UnsupportedOpError: an op, domain or opset this frontend does not implement (names the node).
    ShapeError: inconsistent shapes (names the node).
    """
    m = load_model(model, external_data_dir)
    prog = OnnxParser(m, input_dims, default_dim_value, dim_params, check_shapes, known_values).parse(output_names)
    prog.metadata.update({p.key: p.value for p in m.metadata_props})
    prog.symbolic_inputs.update(symbolic_inputs(m, input_dims))
    return prog


PROPAGATED_ELEMENTS = 1 << 26  # onnx's data propagation materializes ConstantOfShape values on the host


def _propagation_is_bounded(model: onnx.ModelProto) -> bool:
    """False when a ConstantOfShape of a literal shape is larger than onnx's data propagation should
    materialize (it allocates the whole tensor, and an overcommitting host kills the process for it)."""
    g = model.graph
    lits = {t.name: onnx.numpy_helper.to_array(t) for t in g.initializer}
    for n in g.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            lits[n.output[0]] = onnx.numpy_helper.to_array(n.attribute[0].t)
    for n in g.node:
        if n.op_type == "ConstantOfShape" and n.input and n.input[0] in lits:
            if math.prod(int(d) for d in lits[n.input[0]].reshape(-1)) > PROPAGATED_ELEMENTS:
                return False
    return True
