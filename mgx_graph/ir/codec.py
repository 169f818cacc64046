"""The IR of a program as plain data: the modules, instructions, op names and attributes, shapes and
instruction metadata of a saved program (:mod:`mgx_graph.mxr.save_load`), and the arrays they hold.

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
import binascii
import math

import numpy as np

from ..errors import CompileError, MgxError, ParseError
from .instruction import Instruction, Literal, Param, Return
from .module import Module
from .operation import op_class
from .program import Program
from .shape import TYPE_NAMES, Shape

NOT_SAVED_META = ("kernel", "shared_literal")  # re-selected on load; a loaded program uploads every literal


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
        _fields(d, ("name", "instructions"), where, "kept module")
        m = Module(_text(d["name"], where, "module name"))
        m.output_names = _str_list(d.get("output_names", []), where, "output_names")
        for k, e in enumerate(_list(d["instructions"], "instructions", where)):
            w = f"{where}, module {m.name}:@{k}"
            _fields(e, ("op", "attrs", "inputs", "shape", "meta"), w, "instruction")
            inputs = [m.instructions[j] for j in _refs(e["inputs"], w, k)]
            ins = Instruction(_decode_op(e, self, w), inputs, [], self.decode(e["shape"], w), m)
            ins.meta.update(_meta(self.decode(e["meta"], w), w))
            ins.label = _text(e.get("label", ""), w, "label")
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
        """The value ``v`` encodes; ParseError naming ``where`` and the tag for anything malformed (a wrong
        type, a dtype that is not a tensor type, bad base64 or protobuf bytes, nesting deeper than
        :data:`MAX_DEPTH`)."""
        try:
            return self._decode(v, where, 0)
        except MgxError:
            raise
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError, RecursionError,
                binascii.Error) as e:
            raise ParseError(f"{where}: malformed value ({type(e).__name__}: {str(e)[:200]})") from None

    def _decode(self, v, where: str, depth: int):
        if depth > MAX_DEPTH:
            raise ParseError(f"{where}: a value nested deeper than {MAX_DEPTH} levels")
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, list):
            return [self._decode(x, where, depth + 1) for x in v]
        if not isinstance(v, dict) or len(v) not in (1, 2) or (len(v) == 2 and set(v) != {"array", "object"}):
            raise ParseError(f"{where}: malformed value {_brief_json(v)}")
        kind = "array" if len(v) == 2 else next(iter(v))
        body, sub = v[kind], depth + 1
        if kind == "float":
            if not isinstance(body, (str, int, float)) or isinstance(body, bool):
                raise ParseError(f"{where}: malformed float {_brief_json(body)}")
            return float(body)
        if kind == "tuple":
            return tuple(self._decode(x, where, sub) for x in _list(body, "tuple", where))
        if kind == "dict":
            out = {}
            for pair in _list(body, "dict", where):
                if not isinstance(pair, list) or len(pair) != 2:
                    raise ParseError(f"{where}: malformed dict entry {_brief_json(pair)}")
                out[self._decode(pair[0], where, sub)] = self._decode(pair[1], where, sub)
            return out
        if kind == "array":
            if v.get("object") not in (None, "str", "bytes") or not isinstance(body, str):
                raise ParseError(f"{where}: malformed array reference {_brief_json(v)}")
            return self._stored(body, v.get("object"), where)
        if kind == "scalar":
            dt, x = _pair(body, "scalar", where)
            dtype = _tensor_dtype(dt, where)
            if dtype.kind not in "biuf" or not isinstance(x, (bool, int, float, dict)):
                raise ParseError(f"{where}: malformed scalar {_brief_json(body)}")
            return dtype.type(self._decode(x, where, sub))
        if kind == "dtype":
            return _tensor_dtype(body, where)
        if kind == "shape":
            return decode_shape(body, where)
        if kind == "onnx":
            name, data = _pair(body, "onnx", where)
            if not isinstance(name, str) or not isinstance(data, str):
                raise ParseError(f"{where}: malformed onnx value {_brief_json(body)}")
            return _onnx_message(name, data, where)
        if kind == "module":
            try:
                return self._decoded_module(body, where)
            except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
                raise ParseError(f"{where}: malformed kept module ({type(e).__name__}: {e})") from None
        raise ParseError(f"{where}: unknown value tag '{str(kind)[:40]}'")

    def _stored(self, key: str, obj, where: str) -> np.ndarray:
        a = self.arrays.get(key)
        if a is None:
            raise ParseError(f"{where}: array '{key}' is not in the file")
        a = a[0] if isinstance(a, tuple) else a
        return a.astype(object) if obj in ("str", "bytes") else a


def _onnx_message(full_name: str, data: str, where: str):
    import onnx
    from google.protobuf.message import DecodeError

    cls = {"onnx.NodeProto": onnx.NodeProto, "onnx.GraphProto": onnx.GraphProto, "onnx.TensorProto": onnx.TensorProto,
           "onnx.ModelProto": onnx.ModelProto, "onnx.AttributeProto": onnx.AttributeProto}.get(full_name)
    if cls is None:
        raise ParseError(f"{where}: unknown onnx message type '{full_name[:80]}'")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ParseError(f"{where}: an {full_name} value is not valid base64 ({e})") from None
    m = cls()
    try:
        m.ParseFromString(raw)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ParseError(f"{where}: an {full_name} value is not a valid protobuf ({type(e).__name__}: {e})") from None
    return m


MAX_DEPTH = 64  # nesting of a stored value
MAX_RANK = 64


def _brief_json(v) -> str:
    """At most 80 characters of ``v`` (a JSON value), without walking all of a deep one."""
    if isinstance(v, (list, dict)):
        return f"<{type(v).__name__} of {len(v)}>"
    return repr(v)[:80]


def _list(v, tag: str, where: str) -> list:
    if not isinstance(v, list):
        raise ParseError(f"{where}: malformed {tag}: expected a list, given {_brief_json(v)}")
    return v


def _pair(v, tag: str, where: str):
    if not isinstance(v, list) or len(v) != 2:
        raise ParseError(f"{where}: malformed {tag}: expected [2 items], given {_brief_json(v)}")
    return v


def _tensor_dtype(name, where: str) -> np.dtype:
    """The numpy dtype ``name`` when it is a tensor type of the IR (:data:`~mgx_graph.ir.shape.TYPE_NAMES`)."""
    if not isinstance(name, str) or name not in TYPE_NAMES:
        raise ParseError(f"{where}: dtype {_brief_json(name)} is not a tensor type (expected one of "
                         f"{', '.join(TYPE_NAMES)})")
    return np.dtype(name)


def _index_list(v, where: str, what: str) -> list:
    if not isinstance(v, list) or len(v) > MAX_RANK or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
        given = str(v[:8])[:120] if isinstance(v, list) else _brief_json(v)
        raise ParseError(f"{where}: shape {what}: expected at most {MAX_RANK} non-negative ints, given {given}")
    return v


def decode_shape(body, where: str) -> Shape:
    """A ``{"shape": [dtype, lens, strides]}`` body: a tensor dtype, non-negative lens and strides of one
    rank (at most 64), and at most 2**63 - 1 bytes spanned; ParseError naming ``where`` otherwise."""
    if not isinstance(body, list) or len(body) != 3:
        raise ParseError(f"{where}: malformed shape: expected [dtype, lens, strides], given {_brief_json(body)}")
    dtype = _tensor_dtype(body[0], where)
    lens, strides = _index_list(body[1], where, "lens"), _index_list(body[2], where, "strides")
    if len(lens) != len(strides):
        raise ParseError(f"{where}: shape with {len(lens)} lens and {len(strides)} strides")
    span = 1 + sum((d - 1) * st for d, st in zip(lens, strides)) if all(lens) else 0
    if math.prod(lens) >= 1 << 63 or span * max(dtype.itemsize, 1) >= 1 << 63:
        raise ParseError(f"{where}: shape {lens} of {dtype.name} spans more than 2**63 - 1 bytes")
    return Shape(dtype.name, tuple(lens), tuple(strides))


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
    Raises ParseError naming the instruction and field at fault for anything malformed (an unknown op,
    a bad reference, a field of the wrong type, a shape or attribute that does not decode)."""
    codec = ValueCodec(arrays)
    prog = Program()
    _fields(doc, ("modules",), "program", "program")
    mods, built = [], []
    for md in _list(doc["modules"], "modules", "program"):
        _fields(md, ("name", "instructions"), "program", "module")
        name = _text(md["name"], "program", "module name")
        if name in prog.modules and prog.modules[name] in mods:
            raise ParseError(f"program: two modules named '{name[:80]}'")
        m = prog.modules[name] if name in prog.modules else prog.create_module(name)
        m.output_names = _str_list(md.get("output_names", []), f"module {name}", "output_names")
        mods.append(m)
    if "main" not in prog.modules or prog.modules["main"] not in mods:
        raise ParseError("program: no module 'main'")
    for m, md in zip(mods, doc["modules"]):
        for k, d in enumerate(_list(md["instructions"], "instructions", f"module {m.name}")):
            where = _where(m, k)
            _fields(d, ("op", "attrs", "inputs", "modules", "shape", "meta"), where, "instruction")
            try:
                ins = Instruction(_decode_op(d, codec, where), [], [], codec.decode(d["shape"], where), m)
                ins.meta.update(_meta(codec.decode(d["meta"], where), where))
                ins.label = _text(d.get("label", ""), where, "label")
            except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
                raise ParseError(f"{where} ({str(d.get('op', '?'))[:40]}): {type(e).__name__}: {e}") from None
            m.instructions.append(ins)
            built.append((ins, d, where))
    _link(prog, mods, built)
    prog.metadata.update(_str_dict(codec.decode(doc.get("metadata", {"dict": []}), "program metadata"),
                                   "program metadata"))
    symbolic = _str_dict(codec.decode(doc.get("symbolic_inputs", {"dict": []}), "program symbolic inputs"),
                         "program symbolic inputs")
    for name, dims in symbolic.items():
        if not isinstance(dims, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                 for x in dims):
            raise ParseError(f"program symbolic inputs: input '{name}': expected a list of dim indices, given "
                             f"{_brief_json(dims)}")
    prog.symbolic_inputs.update(symbolic)
    return prog


def _fields(d, names: tuple, where: str, what: str) -> None:
    if not isinstance(d, dict):
        raise ParseError(f"{where}: malformed {what}: expected an object, given {_brief_json(d)}")
    missing = [n for n in names if n not in d]
    if missing:
        raise ParseError(f"{where}: malformed {what}: field '{missing[0]}' is missing")


def _text(v, where: str, what: str) -> str:
    if not isinstance(v, str):
        raise ParseError(f"{where}: {what}: expected a str, given {_brief_json(v)}")
    return v


def _str_list(v, where: str, what: str) -> list:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ParseError(f"{where}: {what}: expected a list of str, given {_brief_json(v)}")
    return list(v)


def _str_dict(v, where: str) -> dict:
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise ParseError(f"{where}: expected a dict with str keys, given {type(v).__name__}")
    return v


def _meta(v, where: str) -> dict:
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise ParseError(f"{where}: meta: expected a dict with str keys, given {type(v).__name__}")
    return v


def _refs(v, where: str, before: int) -> list:
    """The inputs of an instruction of a kept module: indices of earlier instructions."""
    if not isinstance(v, list) or not all(isinstance(j, int) and not isinstance(j, bool) and 0 <= j < before
                                          for j in v):
        given = str(v[:8])[:120] if isinstance(v, list) else _brief_json(v)
        raise ParseError(f"{where}: inputs: expected indices of earlier instructions (0 to {before - 1}), given {given}")
    return v


def _decode_op(d: dict, codec: ValueCodec, where: str):
    name = _text(d["op"], where, "op")
    attrs = codec.decode(d["attrs"], where)
    if not isinstance(attrs, dict) or not all(isinstance(k, str) for k in attrs):
        raise ParseError(f"{where} ({name[:40]}): attrs: expected a dict with str keys, given {type(attrs).__name__}")
    if name in ("@param", "@literal", "@return"):
        want = {"@param": ["parameter"], "@literal": ["value"], "@return": []}[name]
        if sorted(attrs) != want:
            raise ParseError(f"{where} ({name}): attrs: expected {want}, given {sorted(attrs)}")
    if name == "@param":
        shape = codec.decode(d["shape"], where)
        if not isinstance(attrs["parameter"], str) or not isinstance(shape, Shape):
            raise ParseError(f"{where} (@param): expected a parameter name and a shape")
        return Param(attrs["parameter"], shape)
    if name == "@literal":
        if not isinstance(attrs["value"], np.ndarray):
            raise ParseError(f"{where} (@literal): value: expected an array, given {type(attrs['value']).__name__}")
        return Literal(attrs["value"])
    if name == "@return":
        return Return()
    try:
        return rebuild_op(name, attrs)
    except KeyError:
        raise ParseError(f"{where}: unknown operation '{name[:80]}' (saved by another mgx_graph version?)") from None
    except ValueError as e:
        raise ParseError(f"{where}: {e}") from None


def _link(prog: Program, mods: list, built: list) -> None:
    """Give each instruction its inputs (and consumer lists) and submodules."""
    for ins, d, where in built:
        try:
            refs = d["inputs"]
            if not isinstance(refs, list) or not all(
                    isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                                and x >= 0 for x in r) for r in refs):
                raise ValueError(f"inputs: expected [[module index, instruction index], ...] of non-negative ints, "
                                 f"given {_brief_json(refs)}")
            ins.inputs = [mods[mi].instructions[k] for mi, k in refs]
            ins.module_inputs = [prog.modules[n] for n in _str_list(d["modules"], where, "modules")]
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise ParseError(f"{where} ({ins.op.name}): bad reference ({type(e).__name__}: {e})") from None
        for v in ins.inputs:
            v.outputs.append(ins)
