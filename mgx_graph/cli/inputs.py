"""Inputs of the ``mgx-graph`` model commands (compile, verify, run, perf).

The model's declared inputs (``graph.input`` less the initializers) decide everything, so a program
whose shapes depend on run-time values (specialized at its first run, see :mod:`mgx_graph.dynamic`)
gets its inputs the same way as a static one:

* shapes: ``--input-dim @name d1 d2 ...`` (several inputs in one flag, the flag repeatable), else the
  shape of a value given with ``--input``; a named symbolic dim (``dim_param``) fixed on one input
  takes that size on every other input; any other symbolic dim is set to 1 and recorded, so that an
  error can say which dims were set and how to give them;
* values: ``--input name=file.npy|file.pb`` or ``--input name=LITERAL`` (a number or a nested list,
  in the model's dtype for that input; a number fills a non-scalar input), ``--fill0`` / ``--fill1``
  (the named inputs, or all of them, filled with 0 / 1, as in migraphx-driver), else seeded random
  values: floats in [-1, 1), integers in {0, 1}, bools; a scalar integer input that the graph compares
  with a constant (``Equal(sr, 16000)`` in silero-vad) takes that constant.

Every bad flag raises :class:`UsageError` naming the flag, the input and the expected vs given value.
"""
from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field

import numpy as np

from ..ir.shape import ONNX_TO_NUMPY

#: ops through which a scalar input keeps its value on the way to a comparison
_PASS_THROUGH = ("Identity", "Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Gather", "Expand")


class UsageError(Exception):
    """A command-line flag is malformed or contradicts the model (the message names flag and input)."""


@dataclass
class ModelInput:
    """One declared input: ``dims`` holds an int per fixed dim and the ``dim_param`` string ('' when
    unnamed) per symbolic dim; ``dims`` is None when the model declares no shape (taken as a scalar)."""

    name: str
    dtype: np.dtype
    dims: list | None
    compared_with: object = None

    def brief(self) -> str:
        if self.dims is None:
            return f"{self.dtype.name}[?]"
        return f"{self.dtype.name}[" + ", ".join(str(d) if isinstance(d, int) else (d or "?") for d in self.dims) + "]"


def model_inputs(proto) -> dict:
    """``{name: ModelInput}`` for the inputs of an ``onnx.ModelProto``, in declaration order.
    Raises UsageError for an input that is not a tensor or has an element type numpy cannot hold."""
    g = proto.graph
    inits = {t.name for t in g.initializer}
    consts = _constant_scalars(g)
    res = {}
    for vi in g.input:
        if vi.name in inits:
            continue
        if not vi.type.HasField("tensor_type"):
            raise UsageError(f"input '{vi.name}' is not a tensor: the CLI cannot make a value for it")
        tt = vi.type.tensor_type
        if tt.elem_type not in ONNX_TO_NUMPY:
            raise UsageError(f"input '{vi.name}' has ONNX element type {tt.elem_type}, which numpy cannot hold")
        dims = None
        if tt.HasField("shape"):
            dims = [int(d.dim_value) if d.HasField("dim_value") and d.dim_value >= 0 else d.dim_param
                    for d in tt.shape.dim]
        res[vi.name] = ModelInput(vi.name, np.dtype(ONNX_TO_NUMPY[tt.elem_type]), dims)
    for name, inp in res.items():
        if inp.dtype.kind in "iub" and inp.dims is not None and all(d == 1 for d in inp.dims):
            inp.compared_with = _compared_constant(g, name, consts)
    return res


def _constant_scalars(g) -> dict:
    from onnx import numpy_helper

    consts = {}
    for t in g.initializer:
        if int(np.prod(t.dims)) == 1:
            consts[t.name] = numpy_helper.to_array(t).reshape(())
    for n in g.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            v = numpy_helper.to_array(n.attribute[0].t)
            if v.size == 1:
                consts[n.output[0]] = v.reshape(())
    return consts


def _compared_constant(g, name: str, consts: dict):
    """The constant that ``Equal`` compares input ``name`` with (through pass-through ops), or None."""
    derived = {name}
    for n in g.node:
        if n.op_type in _PASS_THROUGH and n.input and n.input[0] in derived:
            derived.update(o for o in n.output if o)
        elif n.op_type == "Equal" and len(n.input) == 2:
            a, b = n.input
            if a in derived and b in consts:
                return consts[b]
            if b in derived and a in consts:
                return consts[a]
    return None


def parse_input_dims(groups, inputs: dict | None = None) -> dict:
    """``--input-dim`` values (a list per flag, e.g. ``['@input', '1', '512', '@state', '2', '1', '128']``)
    -> ``{name: [ints]}``.  Raises UsageError for a missing ``@name``, a non-integer or negative dim, an
    input named twice and, given the model's ``inputs``, a name the model does not declare or a rank or
    fixed dim that differs."""
    dims: dict = {}
    for tokens in groups or []:
        if not tokens or not tokens[0].startswith("@") or len(tokens[0]) < 2:
            raise UsageError(f"--input-dim expects @name d1 d2 ... [@name2 d1 ...], got '{' '.join(tokens)}'")
        name: str | None = None
        cur: list[int] = []
        for tok in tokens + ["@"]:
            if tok.startswith("@"):
                if name is not None:
                    _add_dims(dims, name, cur, inputs)
                name, cur = tok[1:], []
                continue
            try:
                cur.append(int(tok))
            except ValueError:
                raise UsageError(f"--input-dim @{name} {tok}: dims must be integers") from None
    return dims


def _add_dims(dims: dict, name: str, lens: list, inputs: dict | None) -> None:
    flag = f"--input-dim @{name} {' '.join(map(str, lens))}".rstrip()
    if not name:
        raise UsageError("--input-dim: '@' must be followed by an input name")
    if name in dims:
        raise UsageError(f"--input-dim names '@{name}' twice")
    if any(d < 0 for d in lens):
        raise UsageError(f"{flag}: dims must be 0 or more")
    if inputs is not None:
        if name not in inputs:
            raise UsageError(f"{flag}: the model has no input '{name}' (inputs: {', '.join(inputs) or 'none'})")
        _check_against_model(flag, inputs[name], lens)
    dims[name] = lens


def _check_against_model(what: str, inp: ModelInput, lens) -> None:
    if inp.dims is None:
        return
    if len(lens) != len(inp.dims):
        raise UsageError(f"{what}: rank {len(lens)} {list(lens)}, but the model's input '{inp.name}' is "
                         f"{inp.brief()} (rank {len(inp.dims)})")
    for k, (d, given) in enumerate(zip(inp.dims, lens)):
        if isinstance(d, int) and d != given:
            raise UsageError(f"{what}: axis {k} is {given}, but the model fixes it to {d} "
                             f"(input '{inp.name}' is {inp.brief()})")


@dataclass
class Defaulted:
    """A symbolic dim the CLI set to 1: input name, axis and the model's ``dim_param`` ('' unnamed)."""

    name: str
    axis: int
    dim_param: str


@dataclass
class InputPlan:
    """Shapes and values of every model input, from the command line (see the module docstring)."""

    inputs: dict
    dims: dict = field(default_factory=dict)          # name -> [ints] for every input
    given: dict = field(default_factory=dict)         # name -> array (--input)
    fills: dict = field(default_factory=dict)         # name -> 0 or 1
    defaulted: list = field(default_factory=list)     # [Defaulted]
    chosen: dict = field(default_factory=dict)        # name -> constant the model compares it with
    seed: int = 0

    def feeds(self) -> dict:
        """``{name: numpy array}`` for every input: given, filled, compared constant, else random."""
        rng = np.random.default_rng(self.seed)
        out = {}
        for name in sorted(self.inputs):
            inp, lens = self.inputs[name], self.dims[name]
            if name not in self.given:
                _check_host_size(name, inp.dtype, lens)
            if name in self.given:
                out[name] = self.given[name]
            elif name in self.fills:
                out[name] = np.full(lens, self.fills[name], dtype=inp.dtype)
            elif name in self.chosen:
                out[name] = np.full(lens, self.chosen[name], dtype=inp.dtype)
            else:
                out[name] = _random(rng, name, inp.dtype, lens)
        return {n: out[n] for n in self.inputs}

    def describe(self) -> str:
        """One line: each input's shape and where its value comes from."""
        parts = []
        for name, inp in self.inputs.items():
            src = ("given" if name in self.given else f"fill {self.fills[name]}" if name in self.fills else
                   f"= {np.asarray(self.chosen[name]).item()} (compared with it in the model)"
                   if name in self.chosen else "random")
            parts.append(f"{name} {inp.dtype.name}{self.dims[name]} {src}")
        return "; ".join(parts)

    def defaulted_note(self) -> str:
        """Which symbolic dims were set to 1 and how to set them ('' when none were)."""
        if not self.defaulted:
            return ""
        per: dict = {}
        for d in self.defaulted:
            per.setdefault(d.name, []).append(d)
        said, flags, py = [], [], []
        for name, ds in per.items():
            axes = ", ".join(f"axis {d.axis} ({repr(d.dim_param) if d.dim_param else 'unnamed'})" for d in ds)
            said.append(f"input '{name}' {axes}")
            at = {d.axis for d in ds}
            lens = [f"<d{k}>" if k in at else str(v) for k, v in enumerate(self.dims[name])]
            flags.append(f"@{name} {' '.join(lens)}")
            py.append(f"'{name}': [{', '.join(lens)}]")
        return (f"symbolic dims were set to 1: {'; '.join(said)}. Give their sizes with "
                f"--input-dim {' '.join(flags)} (Python: mgx_graph.compile(..., input_dims={{{', '.join(py)}}}))")


def _check_host_size(name: str, dtype, lens) -> None:
    """ShapeError naming input ``name`` when its values would not fit in the host's memory (checked before
    numpy is asked to allocate them)."""
    import math
    import os

    from ..errors import ShapeError

    n = math.prod(int(d) for d in lens)
    nbytes = n * np.dtype(dtype).itemsize
    try:
        host = int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        host = 64 << 30
    if nbytes > host:
        raise ShapeError(f"input '{name}' {np.dtype(dtype).name}{list(lens)}: {n} elements, {nbytes} bytes, more "
                         f"than the host's {host} bytes of memory (give smaller sizes with --input-dim)")


def _random(rng, name, dtype, lens):
    if dtype.kind == "f":
        return rng.uniform(-1, 1, size=lens).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 2, size=lens).astype(dtype)
    if dtype.kind == "b":
        return rng.random(size=lens) > 0.5
    raise UsageError(f"input '{name}': cannot make random {dtype.name} values; give it with --input {name}=...")


def random_inputs(shapes: dict, seed: int = 0) -> dict:
    """Seeded random values for ``{name: Shape}``: floats in [-1, 1), ints in {0, 1} (valid indices for
    any table with two rows or more, e.g. token_type_ids), bools.  Raises UsageError for other dtypes."""
    rng = np.random.default_rng(seed)
    return {n: _random(rng, n, np.dtype(s.dtype), list(s.lens)) for n, s in sorted(shapes.items())}


def plan_inputs(proto, input_dim=None, input_specs=None, fill0=None, fill1=None, seed: int = 0) -> InputPlan:
    """Resolve every input's shape and value source from the flags (see the module docstring).

    ``input_dim``: the ``--input-dim`` token lists; ``input_specs``: ``name=value`` strings; ``fill0`` /
    ``fill1``: None (flag absent), [] (all inputs) or names.  Raises UsageError."""
    inputs = model_inputs(proto)
    plan = InputPlan(inputs, seed=seed)
    fixed = parse_input_dims(input_dim, inputs)
    scalars: dict = {}
    for spec in input_specs or []:
        name, value = _parse_spec(spec, inputs, plan.given, scalars)
        if np.ndim(value) == 0 and inputs[name].dims:   # a number for a non-scalar input: fill it
            scalars[name] = value
            continue
        plan.given[name] = value
        lens = list(np.shape(value))
        _check_against_model(f"--input {name}", inputs[name], lens)
        if name in fixed and fixed[name] != lens:
            raise UsageError(f"--input {name} has shape {lens}, but --input-dim @{name} gives {fixed[name]}")
        fixed[name] = lens
    _resolve_dims(plan, fixed)
    for name, v in scalars.items():
        plan.given[name] = np.full(plan.dims[name], v, dtype=inputs[name].dtype)
    _plan_fills(plan, fill0, fill1)
    for name, inp in inputs.items():
        if name not in plan.given and name not in plan.fills and inp.compared_with is not None:
            plan.chosen[name] = inp.compared_with
    return plan


def _resolve_dims(plan: InputPlan, fixed: dict) -> None:
    symbols: dict = {}
    for name, lens in fixed.items():
        for d, v in zip(plan.inputs[name].dims or [], lens):
            if isinstance(d, str) and d not in ("", "?"):
                symbols.setdefault(d, v)
    for name, inp in plan.inputs.items():
        if name in fixed:
            plan.dims[name] = list(fixed[name])
            continue
        lens = []
        for k, d in enumerate(inp.dims or []):
            if isinstance(d, int):
                lens.append(d)
            elif d in symbols:
                lens.append(symbols[d])
            else:
                lens.append(1)
                plan.defaulted.append(Defaulted(name, k, d))
        plan.dims[name] = lens


def _plan_fills(plan: InputPlan, fill0, fill1) -> None:
    for flag, names, value in (("--fill0", fill0, 0), ("--fill1", fill1, 1)):
        if names is None:
            continue
        for n in dict.fromkeys(names):
            if n not in plan.inputs:
                raise UsageError(f"{flag} names '{n}', which is not an input of the model "
                                 f"(inputs: {', '.join(plan.inputs) or 'none'})")
            if n in plan.given:
                raise UsageError(f"{flag} names '{n}', which --input already gives")
            if n in plan.fills:
                raise UsageError(f"'{n}' is named by both --fill0 and --fill1")
        if names:
            for n in names:
                plan.fills[n] = value
    for flag, names, value in (("--fill0", fill0, 0), ("--fill1", fill1, 1)):
        if names == []:   # the flag alone: every input not given otherwise
            if fill0 == [] and fill1 == []:
                raise UsageError("--fill0 and --fill1 both given without names: which inputs get which?")
            for n in plan.inputs:
                if n not in plan.given and n not in plan.fills:
                    plan.fills[n] = value


def _parse_spec(spec: str, inputs: dict, given: dict, scalars: dict):
    if "=" not in spec:
        raise UsageError(f"--input expects name=file.npy|file.pb|value, got '{spec}'")
    name, value = spec.split("=", 1)
    if name not in inputs:
        raise UsageError(f"--input names '{name}', which is not an input of the model "
                         f"(inputs: {', '.join(inputs) or 'none'})")
    if name in given or name in scalars:
        raise UsageError(f"--input gives '{name}' twice")
    inp = inputs[name]
    if value.endswith((".npy", ".pb")) or os.path.isfile(value):
        arr = _load_file(name, value)
        if arr.dtype != inp.dtype:
            raise UsageError(f"--input {name}={value}: the file holds {arr.dtype.name}{list(arr.shape)}, but the "
                             f"model's input '{name}' is {inp.brief()}; save it as {inp.dtype.name}")
        return name, arr
    return name, _literal(name, value, inp)


def _load_file(name: str, path: str) -> np.ndarray:
    """The array of ``--input name=path``: a ``.pb`` TensorProto holding its data, else a ``.npy`` file whose
    header is checked against the file's size before its data is read.  UsageError (one line naming the
    flag, the file and the fault) for anything else."""
    where = f"--input {name}={path}"
    if not os.path.isfile(path):
        raise UsageError(f"{where}: no such file" if not os.path.exists(path) else f"{where}: not a regular file")
    if path.endswith(".pb"):
        return _load_pb(where, path)
    return _load_npy(where, path)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


def _load_pb(where: str, path: str) -> np.ndarray:
    import onnx

    from ..errors import ParseError
    from ..onnx.schema_check import read_tensor

    t = onnx.TensorProto()
    try:
        with open(path, "rb") as f:
            t.ParseFromString(f.read())
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError, OSError
        raise UsageError(f"{where}: not a valid TensorProto (.pb) file ({_one_line(e)})") from None
    if t.data_location == onnx.TensorProto.EXTERNAL:
        raise UsageError(f"{where}: the tensor keeps its data in an external file; an input file must hold it")
    try:
        return read_tensor(t, where)
    except ParseError as e:
        raise UsageError(str(e).splitlines()[0]) from None


def _load_npy(where: str, path: str) -> np.ndarray:
    fmt = np.lib.format
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        try:
            version = fmt.read_magic(f)
            reader = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, fortran, dtype = reader(f, max_header_size=10000)
        except Exception as e:  # noqa: BLE001 - numpy raises ValueError, SyntaxError, EOFError ... on a bad header
            raise UsageError(f"{where}: not a valid .npy file ({_one_line(e)})") from None
        if dtype.hasobject or dtype.kind not in "biufcSU" or dtype.fields is not None or dtype.subdtype is not None:
            raise UsageError(f"{where}: holds {dtype} values; an input must hold numbers, booleans or strings")
        count = 1
        for d in shape:
            count *= d
        data = size - f.tell()
        if count * dtype.itemsize != data:
            raise UsageError(f"{where}: its header declares {dtype.name}{list(shape)} ({count * dtype.itemsize} "
                             f"bytes) but the file holds {data} bytes of data")
        flat = np.fromfile(f, dtype=dtype, count=count)
    return flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)


def _literal(name: str, text: str, inp: ModelInput) -> np.ndarray:
    where = f"--input {name}={text}"
    src = {"true": "True", "false": "False"}.get(text.strip().lower(), text)
    try:
        v = ast.literal_eval(src)
        raw = np.asarray(v)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise UsageError(f"{where}: neither a file nor a literal (a number such as 16000, or a list such as "
                         f"[[1, 2], [3, 4]])") from None
    dt = inp.dtype
    if raw.dtype == object and dt.kind in "iu" and all(type(v) is int for v in raw.ravel()):
        info = np.iinfo(dt)  # Python ints beyond int64 / uint64
        raise UsageError(f"{where}: out of the range of {dt.name} ({info.min}..{info.max})")
    if raw.dtype.kind not in "biuf":
        raise UsageError(f"{where}: a literal must hold numbers or booleans, got {raw.dtype.name}")
    if dt.kind == "b":
        if not np.isin(raw, (0, 1)).all():
            raise UsageError(f"{where}: input '{name}' is bool; values must be 0/1 or true/false")
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        if raw.dtype.kind == "f" and not np.array_equal(raw, np.round(raw)):
            raise UsageError(f"{where}: input '{name}' is {dt.name}; the value must be an integer")
        if raw.size and (raw.min() < info.min or raw.max() > info.max):
            raise UsageError(f"{where}: out of the range of {dt.name} ({info.min}..{info.max})")
    return raw.astype(dt)
