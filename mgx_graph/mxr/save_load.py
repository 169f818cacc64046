"""Saved programs (``.mxr``), as MIGraphX's ``migraphx::save`` / ``migraphx::load``.

A saved program is a self-describing zip archive, with no pickled object and no code in it:

* ``program.json``: ``{"format": "mgx_graph program", "format_version": 1, "mgx_graph_version",
  "kind": "static" | "dynamic", "target", "options", ...}``; for a static program also ``"result"``
  (the :class:`~mgx_graph.passes.compile_result.CompileResult` less the memory plan), ``"memory"`` (the
  plan's arena and literal bytes) and ``"program"``: the IR after the passes (lowered, with its
  ``graph_launch`` submodules), as :mod:`mgx_graph.ir.codec` writes it;
* ``arrays/<key>.npy``: the literal values and array attributes (numpy's ``.npy`` format, the members
  of an ``.npz``; read with ``allow_pickle=False``);
* ``model.onnx``: the ONNX model of a dynamic-shape program.

``options`` are the compile options as given (:attr:`CompiledProgram.options`; None where the
environment decides, read again at load as a compile would).

:func:`load` rebuilds a static program without running the passes: the ops are made from their
names and attributes, the program is validated, kernels are re-selected from the lowered ops
(:meth:`Lowering.select_kernels <mgx_graph.passes.lowering.Lowering.select_kernels>`), the memory plan
is recomputed (deterministic: the same IR gives the same plan), and graphs are captured anew (after
the warmup runs, as in a fresh compile).  A dynamic-shape program is saved as its ONNX model and
compile options: loading compiles it again (spec 0 where the model allows) and its specializations
compile on first use, as after :func:`mgx_graph.compile`.

A saved program is data from whoever wrote it: :func:`load` checks every member's declared sizes
before inflating it and reads only the arrays the program references (:mod:`mgx_graph.mxr.archive`),
checks every field of ``program.json`` (:mod:`mgx_graph.mxr.checks`, :mod:`mgx_graph.ir.codec`), and
refuses a ``model.onnx`` that refers to external data; each failure is a ParseError naming the file
and the member or field (README.md, "Trust model").
"""
from __future__ import annotations

import json
import os
import zipfile
import zlib

import numpy as np

from ..errors import CompileError, MgxError, ParseError, ShapeError
from ..exec.compiled import CompiledProgram, register_saver
from ..passes.compile_result import CompileResult
from .archive import MAX_HEADER_BYTES, MAX_MODEL_BYTES, Archive
from .checks import check_options, check_program, check_result, walk_document

FORMAT = "mgx_graph program"
FORMAT_VERSION = 1
HEADER = "program.json"
MODEL = "model.onnx"
ARRAYS = "arrays/"
RESULT_FIELDS = ("target", "hip_graph", "fp16", "host_fallback_ops", "host_instructions", "alias", "alias_skipped")


def save(compiled, path) -> None:
    """Write ``compiled`` (a :class:`~mgx_graph.exec.compiled.CompiledProgram`) to ``path`` (see the module
    docstring); the file appears whole or not at all.  Raises CompileError naming the instruction
    when a value of the program cannot be stored (or an op would not rebuild from its attributes), or
    a dynamic program's model is too large for one protobuf (2 GiB); OSError when ``path`` cannot be
    written."""
    from ..version import __version__
    from ..ir.codec import ValueCodec, encode_program

    codec = ValueCodec()
    header = {"format": FORMAT, "format_version": FORMAT_VERSION, "mgx_graph_version": __version__,
              "target": compiled.target, "options": codec.encode(dict(compiled.options), "compile options")}
    arrays: dict = {}
    model = None
    if compiled.dispatcher is not None:
        header["kind"] = "dynamic"
        try:
            model = compiled.dispatcher.model.SerializeToString()
        except ValueError as e:  # protobuf refuses messages over 2 GiB
            raise CompileError(f"the model of this dynamic-shape program cannot be saved: {e}") from None
    else:
        doc, arrays = encode_program(compiled.program)
        r, plan = compiled.result, compiled.result.memory_plan
        header.update(kind="static", program=doc,
                      result=codec.encode({k: getattr(r, k) for k in RESULT_FIELDS}, "compile result"),
                      memory={"arena_bytes": plan.arena_bytes, "literal_bytes": plan.literal_bytes})
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    try:
        _write(tmp, header, arrays, model)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _write(path: str, header: dict, arrays: dict, model) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        zf.writestr(HEADER, json.dumps(header, allow_nan=False), compress_type=zipfile.ZIP_DEFLATED)
        for key, (a, _) in arrays.items():
            with zf.open(f"{ARRAYS}{key}.npy", "w", force_zip64=a.nbytes > (1 << 30)) as f:
                np.lib.format.write_array(f, a, allow_pickle=False)
        if model is not None:
            zf.writestr(MODEL, model)


def load(path, *, device_id: int | None = None):
    """The :class:`~mgx_graph.exec.compiled.CompiledProgram` saved in ``path`` by :func:`save`, finalized on
    its target (see the module docstring).  ``device_id``: the GPU to load it on (None: the device it
    was compiled for when one was given, else the current device).

    The file is data: every member's size is checked before it is inflated
    (:mod:`mgx_graph.mxr.archive`), every field of ``program.json`` before it is used
    (:mod:`mgx_graph.mxr.checks`), and a dynamic program's model must hold all its tensors (no
    external data).  Raises ParseError naming the file and the member / field: not a saved program,
    corrupt (a bad zip, CRC or JSON, a missing member, a member larger than its bound, an unknown op,
    a malformed or invalid program), or written in another format version; CompileError when its
    target cannot run here (``gpu`` without a usable GPU) or the program needs more memory than the
    device has; DeviceError for a device id out of range."""
    where = os.fspath(path)
    if not os.path.exists(where):
        raise ParseError(f"{where}: no such file")
    if not os.path.isfile(where):
        raise ParseError(f"{where}: not a regular file")
    try:
        with zipfile.ZipFile(where) as zf:
            return _load_archive(Archive(zf, where), where, device_id)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, OSError, EOFError, NotImplementedError,
            RuntimeError) as e:
        if isinstance(e, MgxError):
            raise
        raise ParseError(f"{where}: not a valid saved program (.mxr zip): {type(e).__name__}: {e}") from None


def _load_archive(archive: Archive, where: str, device_id):
    header = _header(archive, where)
    if header["kind"] == "dynamic":
        try:
            model = archive.read(MODEL, MAX_MODEL_BYTES)
        except KeyError:
            raise ParseError(f"{where}: a dynamic-shape program without its {MODEL}") from None
        return _load_dynamic(model, header, where, device_id)
    if not isinstance(header.get("program"), dict):
        raise ParseError(f"{where}: a static program without its 'program' field")
    refs = walk_document(header["program"], where)
    arrays = {key: archive.array(key, want if _plain_want(want) else None) for key, want in refs.items()}
    return _load_static(header, arrays, where, device_id)


def _plain_want(want) -> bool:
    return (isinstance(want, (list, tuple)) and len(want) == 2 and isinstance(want[0], str) and isinstance(want[1], list)
            and all(isinstance(d, int) and not isinstance(d, bool) for d in want[1]))


def _header(archive: Archive, where: str) -> dict:
    try:
        data = archive.read(HEADER, MAX_HEADER_BYTES)
    except KeyError:
        raise ParseError(f"{where}: not a saved mgx_graph program (no {HEADER})") from None
    try:
        header = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, integers too long to convert
        raise ParseError(f"{where}: {HEADER} is not valid JSON ({str(e)[:200]})") from None
    except RecursionError:
        raise ParseError(f"{where}: {HEADER} nests deeper than JSON is read here") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ParseError(f"{where}: not a saved mgx_graph program ({HEADER} does not say format '{FORMAT}')")
    version = header.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version != FORMAT_VERSION:
        raise ParseError(f"{where}: format version {str(version)[:40]} (written by mgx_graph "
                         f"{str(header.get('mgx_graph_version', '?'))[:40]}); this mgx_graph reads version "
                         f"{FORMAT_VERSION}")
    if header.get("kind") not in ("static", "dynamic"):
        raise ParseError(f"{where}: unknown program kind {str(header.get('kind'))[:40]!r}")
    return header


def _target(header: dict, where: str) -> str:
    from ..targets import resolve_target

    saved = header.get("target")
    if saved not in ("ref", "gpu"):
        raise ParseError(f"{where}: unknown target {str(saved)[:40]!r}")
    try:
        return resolve_target(saved)
    except CompileError as e:
        raise CompileError(f"{where}: saved for target '{saved}', which cannot run here: {e}") from None


def _options(header: dict, where: str, device_id) -> dict:
    from ..ir.codec import ValueCodec

    options = ValueCodec().decode(header.get("options", {"dict": []}), f"{where}: compile options")
    options = check_options(options, header["kind"], where)
    if device_id is not None:
        options["device_id"] = device_id
    return options


def _load_dynamic(data: bytes, header: dict, where: str, device_id):
    import onnx

    from ..onnx.external_data import external_tensors, location_of
    from ..compiler import compile as compile_model

    target = _target(header, where)
    options = _options(header, where, device_id)
    try:
        model = onnx.load_from_string(data)
    except Exception as e:  # protobuf DecodeError
        raise ParseError(f"{where}: {MODEL} is not a valid ONNX protobuf ({type(e).__name__}: {e})") from None
    ext = external_tensors(model)
    if ext:
        raise ParseError(f"{where}: member {MODEL}: tensor '{ext[0].name}' refers to external data "
                         f"('{location_of(ext[0])[:200]}'); a saved program must hold all its data")
    options["target"] = target
    try:
        return compile_model(model, **options)
    except (ParseError, ShapeError) as e:
        raise ParseError(f"{where}: member {MODEL}: {e}") from None
    except CompileError as e:
        if str(e).startswith(("the program needs", "out of host memory")):  # the file may be fine
            raise
        raise ParseError(f"{where}: member {MODEL}: {e}") from None


def _load_static(header: dict, arrays: dict, where: str, device_id):
    from ..ir.codec import ValueCodec, decode_program
    from ..passes.lowering import Lowering
    from ..passes.memory_coloring import MemoryColoring
    from ..passes.validate import validate_program
    from ..compiler import finalize, graph_budget
    from ..targets import resolve_device

    target = _target(header, where)
    options = _options(header, where, device_id)
    try:
        program = decode_program(header["program"], arrays)
        saved = check_result(ValueCodec().decode(header.get("result"), f"{where}: compile result"), where)
        result = CompileResult(**saved)
        check_program(program, where)
        validate_program(program)
    except MgxError as e:
        raise ParseError(f"{where}: {e}" if not str(e).startswith(where) else str(e)) from None
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RecursionError, OverflowError) as e:
        raise ParseError(f"{where}: malformed program ({type(e).__name__}: {str(e)[:200]})") from None
    if result.target != target:
        raise ParseError(f"{where}: the compile result names target {result.target!r}, the file {target!r}")
    from .. import settings as mgx_settings

    result.settings = mgx_settings.current()  # this process's MIGRAPHX_* table (a bad value: its own error)
    try:
        with mgx_settings.using(result.settings):
            Lowering(target).select_kernels(program)
        result.memory_plan = MemoryColoring().plan(program)
    except Exception as e:  # noqa: BLE001 - a validated program the target cannot take is still a bad file
        raise ParseError(f"{where}: the program does not lower to '{target}' ({type(e).__name__}: "
                         f"{str(e)[:200]})") from None
    device = resolve_device(target, options.get("device_id"))
    try:
        executor = finalize(program, result, device, graph_budget(options))
    except CompileError as e:
        if str(e).startswith("the program needs"):  # more memory than the device has: the file may be fine
            raise
        raise ParseError(f"{where}: {e}") from None
    except MgxError:
        raise
    except Exception as e:  # noqa: BLE001 - finalize left nothing allocated
        raise ParseError(f"{where}: the program cannot be made ready to run ({type(e).__name__}: "
                         f"{str(e)[:200]})") from None
    return CompiledProgram(program, result, executor=executor, options=options)


register_saver(save)  # CompiledProgram.save runs save
