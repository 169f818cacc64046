"""Checks of a saved program's ``program.json`` (:mod:`mgx_graph.mxr.save_load`), made before and after the IR is
rebuilt: every field has the type and range it must have, or loading is a ParseError naming the file,
the field, and the expected vs given value.

* :func:`walk_document`: the document nests at most :data:`MAX_DEPTH` levels, and the arrays it
  references (with the dtype and shape each literal declares) are collected, so only those members
  are read and each is checked against its literal before it is inflated;
* :func:`check_options`: the saved compile options, each by name (type and allowed values);
* :func:`check_result`: the saved compile result;
* :func:`check_program`: after decoding, what :func:`~mgx_graph.passes.validate.validate_program`
  does not cover: instruction metadata (keys and types), layouts bound into parameters (non-negative
  strides, inside the parameter's bytes), parameters in standard layout, and a module's output
  names against the values it returns.
"""
from __future__ import annotations

from typing import Any

from ..errors import ParseError
from ..ir.shape import Shape

MAX_DEPTH = 64
CAPTURE_MODES = (None, "thread_local", "global", "relaxed")


def _depth_error(where: str, path: list) -> ParseError:
    return ParseError(f"{where}: {'/'.join(map(str, path[:8]))}...: nested deeper than {MAX_DEPTH} levels")


def walk_document(doc, where: str) -> dict:
    """``{array key: (dtype, lens) or None}`` of the arrays ``doc`` references (a literal's declared dtype
    and lens); raises ParseError when the document nests deeper than :data:`MAX_DEPTH`."""
    refs: dict = {}
    stack: list[tuple[Any, int, list[str | int]]] = [(doc, 0, ["program"])]
    while stack:
        v, depth, path = stack.pop()
        if depth > MAX_DEPTH:
            raise _depth_error(where, path)
        if isinstance(v, list):
            stack.extend((x, depth + 1, path + [k]) if depth < 12 else (x, depth + 1, path) for k, x in enumerate(v))
        elif isinstance(v, dict):
            if len(v) in (1, 2) and isinstance(v.get("array"), str):
                refs.setdefault(v["array"], None)
            if v.get("op") == "@literal":
                _literal_ref(v, refs)
            stack.extend((x, depth + 1, path + [k]) if depth < 12 else (x, depth + 1, path) for k, x in v.items())
    return refs


def _literal_ref(ins: dict, refs: dict) -> None:
    try:
        (key, value), = ins["attrs"]["dict"]
        shape = ins["shape"]["shape"]
        if key == "value" and isinstance(value.get("array"), str):
            refs[value["array"]] = (shape[0], shape[1])
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return  # malformed: the decoder names it


# -- options and result ---------------------------------------------------------------------------
def _is_int(v, low=0):
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _opt_int(low):
    return lambda v: v is None or _is_int(v, low)


def _str_map(v, value_ok):
    return isinstance(v, dict) and all(isinstance(k, str) and value_ok(x) for k, x in v.items())


def _dims(v):
    return isinstance(v, (list, tuple)) and all(_is_int(d) or isinstance(d, str) for d in v)


OPTIONS = {
    "hip_graph": ("a bool", lambda v: isinstance(v, bool)),
    "fp16": ("a bool", lambda v: isinstance(v, bool)),
    "alias": ("'auto', None or {output: parameter}",
              lambda v: v is None or v == "auto" or _str_map(v, lambda x: isinstance(x, str))),
    "min_partition_size": ("an int >= 1", lambda v: _is_int(v, 1)),
    "host_ops": ("a tuple of op names", lambda v: isinstance(v, (tuple, list)) and all(isinstance(x, str) for x in v)),
    "device_id": ("None or a device index (0 to 65535)", lambda v: v is None or (_is_int(v) and v < 1 << 16)),
    "warmup": ("an int >= 0", lambda v: _is_int(v)),
    "debug": ("None or a bool", lambda v: v is None or isinstance(v, bool)),
    "max_graphs": ("None or an int >= 1", _opt_int(1)),
    "max_graph_bytes": ("None or an int >= 1", _opt_int(1)),
    "capture_mode": (f"one of {CAPTURE_MODES}", lambda v: isinstance(v, (str, type(None))) and v in CAPTURE_MODES),
    "validate": ("None or a bool", lambda v: v is None or isinstance(v, bool)),
    "gate_slower": ("None or a bool", lambda v: v is None or isinstance(v, bool)),
}
DYNAMIC_OPTIONS = {
    "target": ("'ref' or 'gpu'", lambda v: v in ("ref", "gpu")),
    "input_dims": ("None or {input: dims}", lambda v: v is None or _str_map(v, _dims)),
    "default_dim_value": ("an int >= 0", lambda v: _is_int(v)),
    "dim_params": ("None or {dim name: int}", lambda v: v is None or _str_map(v, _is_int)),
    "max_specializations": ("an int >= 1", lambda v: _is_int(v, 1)),
}


def check_options(options, kind: str, where: str) -> dict:
    """``options`` (decoded) when each is known for a ``kind`` program and valid; else ParseError."""
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise ParseError(f"{where}: compile options: expected a dict of option names, given {type(options).__name__}")
    known = dict(OPTIONS, **(DYNAMIC_OPTIONS if kind == "dynamic" else {}))
    unknown = sorted(k for k in options if k not in known)
    if unknown:
        raise ParseError(f"{where}: unknown compile options {unknown}")
    for k, v in options.items():
        want, ok = known[k]
        if not ok(v):
            raise ParseError(f"{where}: compile option '{k}': expected {want}, given {str(v)[:80]!r}")
    return options


RESULT = {
    "target": ("'ref' or 'gpu'", lambda v: v in ("ref", "gpu")),
    "hip_graph": ("a bool", lambda v: isinstance(v, bool)),
    "fp16": ("a bool", lambda v: isinstance(v, bool)),
    "host_fallback_ops": ("a list of op names", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)),
    "host_instructions": ("a list of str", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)),
    "alias": ("{output: parameter}", lambda v: _str_map(v, lambda x: isinstance(x, str))),
    "alias_skipped": ("{output: reason}", lambda v: _str_map(v, lambda x: isinstance(x, str))),
}


def check_result(saved, where: str) -> dict:
    """The saved compile result's fields (decoded), each checked; else ParseError."""
    if not isinstance(saved, dict):
        raise ParseError(f"{where}: compile result: expected a dict, given {type(saved).__name__}")
    for k, (want, ok) in RESULT.items():
        if k not in saved:
            raise ParseError(f"{where}: compile result: field '{k}' is missing")
        if not ok(saved[k]):
            raise ParseError(f"{where}: compile result field '{k}': expected {want}, given {str(saved[k])[:80]!r}")
    return {k: saved[k] for k in RESULT}


# -- the decoded program --------------------------------------------------------------------------
def _names(v):
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


META = {
    "bind_param": ("a parameter name or a tuple of names / None",
                   lambda v: isinstance(v, str) or (isinstance(v, tuple) and all(isinstance(x, (str, type(None)))
                                                                                 for x in v))),
    "bind_layout": ("a shape or a tuple of shapes",
                    lambda v: isinstance(v, Shape) or (isinstance(v, tuple) and all(isinstance(x, Shape) for x in v))),
    "fixed_inputs": ("a list of names", _names),
    "gemv": ("a bool", lambda v: isinstance(v, bool)),  # a dot the gpu lowering chose a GEMV kernel for
    "movable_inputs": ("a list of names", _names),
    "on_host": ("a bool", lambda v: isinstance(v, bool)),
    "trip_key": ("a str", lambda v: isinstance(v, str)),
}


def check_program(program, where: str) -> None:
    """The checks of the module docstring over a decoded ``program``; ParseError at the first failure."""
    main = program.modules.get("main")
    for m in program.modules.values():
        for k, ins in enumerate(m.instructions):
            at = f"{where}: instruction {m.name}:@{k} {ins.op.name}"
            _check_instruction(ins, at)
            if "bind_param" in ins.meta and main is not None:
                _check_binding(ins, main, at)
            _check_kept_modules(ins, at, 0)
        _check_outputs(m, where, m is main)


def _is_shape(v) -> bool:
    return isinstance(v, Shape) or (isinstance(v, tuple) and all(isinstance(x, Shape) for x in v))


def _check_instruction(ins, at: str) -> None:
    _check_meta(ins, at)
    if not _is_shape(ins.shape):
        raise ParseError(f"{at}: shape: expected a shape or a tuple of shapes, given {type(ins.shape).__name__}")
    if ins.op.name == "@param" and not (isinstance(ins.shape, Shape) and ins.shape.standard()):
        raise ParseError(f"{at}: parameter '{ins.op.parameter}' must have a standard (packed) layout, given "
                         f"{ins.shape}")


def _computed(ins, at: str):
    try:
        return ins.op.compute_shape([i.shape for i in ins.inputs], ins.module_inputs)
    except Exception as e:  # noqa: BLE001 - any failure of a saved op on its saved inputs is a bad file
        raise ParseError(f"{at}: compute_shape fails on its inputs ({type(e).__name__}: {str(e)[:200]})") from None


def _check_kept_modules(ins, at: str, depth: int) -> None:
    """The modules an op keeps (a fused op's): each instruction's metadata, shape (what compute_shape
    gives), inputs (earlier instructions), and one @return at the end."""
    from ..ir import Module

    for key, sub in ins.op.attrs.items():
        if not isinstance(sub, Module):
            continue
        w = f"{at}: attribute {key} (module {sub.name})"
        if depth > 8:
            raise ParseError(f"{w}: kept modules nested deeper than 8 levels")
        rets = [i for i in sub.instructions if i.op.name == "@return"]
        if not sub.instructions or len(rets) != 1 or sub.instructions[-1] is not rets[0]:
            raise ParseError(f"{w}: must end with its only @return")
        for k, i in enumerate(sub.instructions):
            wi = f"{w}:@{k} {i.op.name}"
            if i.module_inputs:
                raise ParseError(f"{wi}: a kept module's instruction runs no module")
            _check_meta(i, wi)
            if not _is_shape(i.shape):
                raise ParseError(f"{wi}: shape: expected a shape or a tuple of shapes, given {type(i.shape).__name__}")
            if i.op.name not in ("@param", "@return"):
                want = _computed(i, wi)
                if want != i.shape:
                    raise ParseError(f"{wi}: has shape {i.shape} but compute_shape gives {want}")
            _check_kept_modules(i, wi, depth + 1)


def _check_meta(ins, at: str) -> None:
    for key, v in ins.meta.items():
        if key not in META:
            raise ParseError(f"{at}: unknown metadata '{str(key)[:40]}' (known: {', '.join(META)})")
        want, ok = META[key]
        if not ok(v):
            raise ParseError(f"{at}: metadata '{key}': expected {want}, given {str(v)[:80]!r}")


def _check_binding(ins, main, at: str) -> None:
    b = ins.meta["bind_param"]
    shapes = ins.shape if isinstance(ins.shape, tuple) else (ins.shape,)
    names = (b,) if isinstance(b, str) else b
    if len(names) != len(shapes):
        raise ParseError(f"{at}: metadata 'bind_param' names {len(names)} parameters for {len(shapes)} results")
    layout = ins.meta.get("bind_layout")
    if layout is not None:
        want = _computed(ins, at)
        wants = want if isinstance(want, tuple) else (want,)
        if not isinstance(layout, type(ins.shape)) or len(wants) != len(shapes) or any(
                not isinstance(w, Shape) or w.dtype != s.dtype or w.lens != s.lens for w, s in zip(wants, shapes)):
            raise ParseError(f"{at}: metadata 'bind_layout' {layout} is not a layout of what the op computes ({want})")
    for name, s in zip(names, shapes):
        if name is None:
            continue
        p = main.get_parameter(name)
        if p is None:
            raise ParseError(f"{at}: metadata 'bind_param': no parameter '{name}' in module main")
        if not isinstance(s, Shape) or any(st < 0 for st in s.strides) or s.dtype != p.shape.dtype \
                or s.bytes() > p.shape.bytes():
            raise ParseError(f"{at}: the layout {s} bound into parameter '{name}' ({p.shape}) must have its dtype, "
                             "non-negative strides and lie inside its bytes")


def _check_outputs(m, where: str, is_main: bool) -> None:
    ret = m.instructions[-1] if m.instructions else None
    if ret is None or ret.op.name != "@return":
        return  # validate_program names it
    names = m.output_names
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ParseError(f"{where}: module {m.name}: output_names: expected a list of str, given {str(names)[:80]}")
    if (names or is_main) and len(names) != len(ret.inputs):
        raise ParseError(f"{where}: module {m.name}: output_names lists {len(names)} names for the "
                         f"{len(ret.inputs)} values its @return returns")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ParseError(f"{where}: module {m.name}: output_names: each name once (as an ONNX graph's outputs), "
                         f"given {twice[0][:80]!r} {names.count(twice[0])} times")
