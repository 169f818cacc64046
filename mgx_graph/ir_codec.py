"""The IR of a program as plain data: the modules, instructions, op names and attributes, shapes and
instruction metadata of a saved program (:mod:`mgx_graph.mxr`), and the arrays they hold.

:func:`encode_program` turns a lowered program into a JSON-able document plus ``{key: numpy array}``
(literal values, array attributes); :func:`decode_program` rebuilds the program from them, every op
through its constructor.  No code object is stored, only op names, values and references:

* a module: ``{"name", "output_names", "instructions": [...]}`` in :meth:`Program.module_order`
  (``main`` first);
* an instruction: ``{"op": name, "attrs": value, "inputs": [[module index, instruction index], ...],
  "modules": [submodule names], "shape": value, "meta": value, "label": str}`` (``@param``: the
  attribute ``parameter``; ``@literal``: ``value``, an array);
* a value: JSON null / bool / int / str / list as they are, every other kind a one-key tagged object:
  ``{"float": repr}`` (nan / inf included), ``{"tuple": [...]}``, ``{"dict": [[key, value], ...]}``,
  ``{"array": key}`` (``{"array": key, "object": "str"}`` for a string tensor), ``{"scalar": [dtype,
  value]}``, ``{"dtype": name}``, ``{"shape": [dtype, lens, strides]}`` and ``{"onnx": [message type,
  base64 protobuf]}`` (the node of an ``onnx_op``).

The kernels an instruction runs (``meta["kernel"]``) are not stored: they are re-selected from the
lowered ops on load.  Saving checks that every op rebuilds from its stored attributes to the same
attributes (CompileError naming the instruction otherwise), so a file never holds an op that would
load as something else.
"""
from __future__ import annotations

import base64
import math

import numpy as np

from .errors import CompileError, ParseError
from .ir import Instruction, Literal, Module, Param, Program, Return
from .operators.base import op_class
from .shape import Shape

NOT_SAVED_META = ("kernel",)  # re-selected on load


# -- values ------------------------------------------------------------------------------------------
class ValueCodec:
    """Encodes and decodes values (see the module docstring); arrays go to ``arrays`` (``{key: array}``),
    one key per array object."""

    def __init__(self, arrays: dict | None = None):
        self.arrays = {} if arrays is None else arrays
        self._keys: dict[int, str] = {}

    def encode(self, v, where: str):
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return int(v)
        if isinstance(v, float):
            return v if math.isfinite(v) else {"float": repr(v)}
        if isinstance(v, list):
            return [self.encode(x, where) for x in v]
        if isinstance(v, tuple):
            return {"tuple": [self.encode(x, where) for x in v]}
        if isinstance(v, dict):
            return {"dict": [[self.encode(k, where), self.encode(x, where)] for k, x in v.items()]}
        if isinstance(v, np.ndarray):
            return self._array(v, where)
        if isinstance(v, np.generic):
            return {"scalar": [v.dtype.name, self.encode(v.item(), where)]}
        if isinstance(v, np.dtype):
            return {"dtype": v.name}
        if isinstance(v, Shape):
            return {"shape": [v.dtype, list(v.lens), list(v.strides)]}
        if hasattr(v, "SerializeToString") and hasattr(v, "DESCRIPTOR"):  # an onnx protobuf message
            return {"onnx": [v.DESCRIPTOR.full_name, base64.b64encode(v.SerializeToString()).decode("ascii")]}
        if isinstance(v, Module):  # a submodule an op keeps (a fused op's, once lowering detached it)
            return {"module": self._module(v, where)}
        raise CompileError(f"{where}: a value of type {type(v).__module__}.{type(v).__name__} cannot be saved")

    def _module(self, m: Module, where: str) -> dict:
        """A module outside the program's module list: its instructions read only each other."""
        index = {id(i): k for k, i in enumerate(m.instructions)}
        out = []
        for k, ins in enumerate(m.instructions):
            w = f"{where}, module {m.name}:@{k} {ins.op.name}"
            try:
                inputs = [index[id(v)] for v in ins.inputs]
            except KeyError:
                raise CompileError(f"{w}: reads an instruction outside its module") from None
            if ins.module_inputs:
                raise CompileError(f"{w}: a kept module with submodules cannot be saved")
            meta = {key: v for key, v in ins.meta.items() if key not in NOT_SAVED_META}
            out.append({"op": ins.op.name, "attrs": _op_attrs(ins, self, w), "inputs": inputs,
                        "shape": self.encode(ins.shape, w), "meta": self.encode(meta, w), "label": ins.label})
        return {"name": m.name, "output_names": list(m.output_names), "instructions": out}

    def _decoded_module(self, d: dict, where: str) -> Module:
        m = Module(str(d["name"]))
        m.output_names = list(d.get("output_names", []))
        for k, e in enumerate(d["instructions"]):
            w = f"{where}, module {m.name}:@{k}"
            ins = Instruction(_decode_op(e, self, w), [m.instructions[j] for j in e["inputs"]], [],
                              self.decode(e["shape"], w), m)
            ins.meta.update(self.decode(e["meta"], w))
            ins.label = str(e.get("label", ""))
            for v in ins.inputs:
                v.outputs.append(ins)
            m.instructions.append(ins)
        return m

    def _array(self, a: np.ndarray, where: str) -> dict:
        key = self._keys.get(id(a))
        if key is not None:
            return self.arrays[key][1]
        tag = {"array": f"a{len(self.arrays)}"}
        stored = a
        if a.dtype == object:
            flat = a.reshape(-1)
            if all(isinstance(x, str) for x in flat):
                stored, tag["object"] = a.astype(np.str_), "str"
            elif all(isinstance(x, bytes) for x in flat):
                stored, tag["object"] = a.astype(np.bytes_), "bytes"
            else:
                raise CompileError(f"{where}: an object array holding other values than strings cannot be saved")
            if not np.array_equal(stored.astype(object), a):  # numpy's fixed-width strings drop trailing NULs
                raise CompileError(f"{where}: a string tensor with trailing NUL characters cannot be saved")
        self._keys[id(a)] = tag["array"]
        self.arrays[tag["array"]] = (stored if stored.flags.c_contiguous else stored.copy(order="C"), tag)
        return tag

    def decode(self, v, where: str):
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, list):
            return [self.decode(x, where) for x in v]
        if not isinstance(v, dict) or len(v) not in (1, 2):
            raise ParseError(f"{where}: malformed value {str(v)[:80]}")
        kind, body = next(iter(v.items()))
        if kind == "float":
            return float(body)
        if kind == "tuple":
            return tuple(self.decode(x, where) for x in body)
        if kind == "dict":
            return {self.decode(k, where): self.decode(x, where) for k, x in body}
        if kind == "array":
            return self._stored(body, v.get("object"), where)
        if kind == "scalar":
            return np.dtype(body[0]).type(self.decode(body[1], where))
        if kind == "dtype":
            return np.dtype(body)
        if kind == "shape":
            return Shape(body[0], tuple(body[1]), tuple(body[2]))
        if kind == "onnx":
            return _onnx_message(body[0], base64.b64decode(body[1]), where)
        if kind == "module":
            try:
                return self._decoded_module(body, where)
            except (KeyError, TypeError, ValueError, IndexError) as e:
                raise ParseError(f"{where}: malformed kept module ({type(e).__name__}: {e})") from None
        raise ParseError(f"{where}: unknown value tag '{kind}'")

    def _stored(self, key: str, obj, where: str) -> np.ndarray:
        a = self.arrays.get(key)
        if a is None:
            raise ParseError(f"{where}: array '{key}' is not in the file")
        a = a[0] if isinstance(a, tuple) else a
        return a.astype(object) if obj in ("str", "bytes") else a


def _onnx_message(full_name: str, data: bytes, where: str):
    import onnx

    cls = {"onnx.NodeProto": onnx.NodeProto, "onnx.GraphProto": onnx.GraphProto, "onnx.TensorProto": onnx.TensorProto,
           "onnx.ModelProto": onnx.ModelProto, "onnx.AttributeProto": onnx.AttributeProto}.get(full_name)
    if cls is None:
        raise ParseError(f"{where}: unknown onnx message type '{full_name}'")
    m = cls()
    m.ParseFromString(data)
    return m


def same_value(a, b) -> bool:
    """Whether two attribute values are equal in kind and content (arrays by dtype, shape and values, nan
    equal to nan; protobuf messages by their serialization)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if type(a) is not type(b) and not (isinstance(a, (int, float)) and isinstance(b, (int, float))
                                       and not isinstance(a, bool) and not isinstance(b, bool)):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if hasattr(a, "SerializeToString") and hasattr(a, "DESCRIPTOR"):
        return a.SerializeToString() == b.SerializeToString()
    return bool(a == b)


# -- ops -----------------------------------------------------------------------------------------------
def rebuild_op(name: str, attrs: dict):
    """The op ``name`` with attributes ``attrs``, made by its constructor: ``cls(**attrs)``, else with
    the leading underscores of private attribute names dropped, else ``cls.from_attrs(attrs)``; the
    first whose attributes equal ``attrs``.  Raises KeyError (no such op) or ValueError (none fits)."""
    cls = op_class(name)
    plain = {k.lstrip("_"): v for k, v in attrs.items()}
    makers = [lambda: cls(**attrs), lambda: cls(**plain)]
    if hasattr(cls, "from_attrs"):
        makers.append(lambda: cls.from_attrs(attrs))
    for make in makers:
        try:
            op = make()
        except Exception:  # a constructor that does not take these attributes
            continue
        if same_value(op.attrs, attrs):
            return op
    raise ValueError(f"operation '{name}' does not rebuild from its attributes {sorted(attrs)}")


# -- programs ------------------------------------------------------------------------------------------
def _where(m, k: int, ins=None) -> str:
    op = f" {ins.op.name}" if ins is not None else ""
    return f"instruction {m.name}:@{k}{op}"


def encode_program(program: Program) -> tuple[dict, dict]:
    """``(document, arrays)`` of ``program`` (see the module docstring); ``arrays`` maps a key to
    ``(array, tag)``.  Raises CompileError naming the instruction when a value cannot be stored or an
    op would not rebuild from its attributes."""
    codec = ValueCodec()
    modules = program.module_order()
    index = {id(i): [mi, k] for mi, m in enumerate(modules) for k, i in enumerate(m.instructions)}
    docs = []
    for m in modules:
        out = []
        for k, ins in enumerate(m.instructions):
            where = _where(m, k, ins)
            try:
                inputs = [index[id(v)] for v in ins.inputs]
            except KeyError:
                raise CompileError(f"{where}: reads an instruction of no module of the program") from None
            meta = {key: v for key, v in ins.meta.items() if key not in NOT_SAVED_META}
            out.append({"op": ins.op.name, "attrs": _op_attrs(ins, codec, where), "inputs": inputs,
                        "modules": [s.name for s in ins.module_inputs], "shape": codec.encode(ins.shape, where),
                        "meta": codec.encode(meta, where), "label": ins.label})
        docs.append({"name": m.name, "output_names": list(m.output_names), "instructions": out})
    doc = {"modules": docs, "metadata": codec.encode(dict(program.metadata), "program metadata"),
           "symbolic_inputs": codec.encode(dict(program.symbolic_inputs), "program symbolic inputs")}
    return doc, codec.arrays


def _op_attrs(ins, codec: ValueCodec, where: str):
    op = ins.op
    if op.name == "@param":
        return codec.encode({"parameter": op.parameter}, where)
    if op.name == "@literal":
        return codec.encode({"value": op.value}, where)
    if op.name == "@return":
        return codec.encode({}, where)
    enc = codec.encode(dict(op.attrs), where)
    try:
        rebuild_op(op.name, ValueCodec(codec.arrays).decode(enc, where))
    except (KeyError, ValueError) as e:
        raise CompileError(f"{where}: cannot be saved: {e}") from None
    return enc


def decode_program(doc: dict, arrays: dict) -> Program:
    """The program of ``doc`` and ``arrays`` (``{key: array}``) as :func:`encode_program` made them.
    Raises ParseError naming the instruction at fault for anything malformed (an unknown op, a bad
    reference, a shape or attribute that does not decode)."""
    codec = ValueCodec(arrays)
    prog = Program()
    mods, built = [], []
    for md in doc["modules"]:
        m = prog.modules[md["name"]] if md["name"] in prog.modules else prog.create_module(md["name"])
        m.output_names = list(md.get("output_names", []))
        mods.append(m)
    for m, md in zip(mods, doc["modules"]):
        for k, d in enumerate(md["instructions"]):
            where = _where(m, k)
            try:
                ins = Instruction(_decode_op(d, codec, where), [], [], codec.decode(d["shape"], where), m)
                ins.meta.update(codec.decode(d["meta"], where))
                ins.label = str(d.get("label", ""))
            except (KeyError, TypeError, ValueError, IndexError) as e:
                raise ParseError(f"{where} ({d.get('op', '?') if isinstance(d, dict) else '?'}): "
                                 f"{type(e).__name__}: {e}") from None
            m.instructions.append(ins)
            built.append((ins, d, where))
    _link(prog, mods, built)
    prog.metadata.update(codec.decode(doc.get("metadata", {"dict": []}), "program metadata"))
    prog.symbolic_inputs.update(codec.decode(doc.get("symbolic_inputs", {"dict": []}), "program symbolic inputs"))
    return prog


def _decode_op(d: dict, codec: ValueCodec, where: str):
    name, attrs = d["op"], codec.decode(d["attrs"], where)
    if name == "@param":
        return Param(attrs["parameter"], codec.decode(d["shape"], where))
    if name == "@literal":
        return Literal(attrs["value"])
    if name == "@return":
        return Return()
    try:
        return rebuild_op(name, attrs)
    except KeyError:
        raise ParseError(f"{where}: unknown operation '{name}' (saved by another mgx_graph version?)") from None


def _link(prog: Program, mods: list, built: list) -> None:
    """Give each instruction its inputs (and consumer lists) and submodules."""
    for ins, d, where in built:
        try:
            ins.inputs = [mods[mi].instructions[k] for mi, k in d["inputs"]]
            ins.module_inputs = [prog.modules[n] for n in d["modules"]]
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise ParseError(f"{where} ({ins.op.name}): bad reference ({type(e).__name__}: {e})") from None
        for v in ins.inputs:
            v.outputs.append(ins)
