"""Saved programs (``.mxr``) on the ``mgx-graph`` command line: ``compile --output`` writes one, and
``compile``, ``run`` and ``perf`` take one where they take a model, as migraphx-driver takes ``.mxr``.

A saved program fixes what the flags would choose at compile time: its target, graphs (``--hip-graph``)
and precision (``--fp16``); a flag that asks for something else is a UsageError.  Its inputs are the
program's parameters (a static program: exactly their shapes and dtypes; a dynamic one: the inputs
of the ONNX model it holds), so the input flags work as for a model.  ``verify`` compares against
onnxruntime and ref compiles of the ONNX model, which a static saved program does not hold: it takes
models only.
"""
from __future__ import annotations

import os
import zipfile

from onnx import helper

from ..ir.shape import NUMPY_TO_ONNX
from .inputs import UsageError


def is_saved_program(path: str) -> bool:
    """Whether ``path`` is to be read as a saved program: a file named ``.mxr`` or a zip (an ONNX model is
    neither), damaged or not: :func:`mgx_graph.load` then names the fault, where reading it as ONNX would
    only say that it is no ONNX protobuf."""
    if not os.path.isfile(path):
        return False
    return path.endswith(".mxr") or zipfile.is_zipfile(path)


def is_intact_saved_program(path: str) -> bool:
    """Whether ``path`` is a zip holding ``program.json`` (what ``CompiledProgram.save`` writes)."""
    from ..mxr.save_load import HEADER

    try:
        with zipfile.ZipFile(path) as zf:
            return HEADER in zf.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return False


def interface_model(prog):
    """An ONNX model with no nodes declaring the inputs and outputs of the static program ``prog``, in
    its own dtypes (what the input flags are checked and planned against)."""
    inputs = [helper.make_tensor_value_info(n, NUMPY_TO_ONNX[s.dtype], list(s.lens))
              for n, s in prog.get_parameter_shapes().items()]
    outputs = [helper.make_tensor_value_info(n, 0, None) for n in prog.get_output_names()]
    return helper.make_model(helper.make_graph([], "saved", inputs, outputs))


def open_saved(path: str, args):
    """``(program, model)``: the program saved in ``path`` (loaded) and the ONNX model its inputs come
    from.  Raises UsageError when ``--target``, ``--hip-graph`` or ``--fp16`` ask for another program
    than the one saved."""
    from ..mxr.save_load import load

    prog = load(path)
    asked = [(args.target not in ("auto", prog.target), f"--target {args.target}", f"target {prog.target}"),
             (bool(args.hip_graph) and not prog.hip_graph, "--hip-graph", "no graphs (compiled without --hip-graph)"),
             (bool(args.fp16) and not prog.fp16, "--fp16", "float32 (compiled without --fp16)")]
    for wrong, flag, has in asked:
        if wrong:
            prog.release()
            raise UsageError(f"{path} is a saved program with {has}; {flag} cannot change it (compile the model "
                             f"again with the flags you want)")
    model = prog.dispatcher.model if prog.dispatcher is not None else interface_model(prog)
    return prog, model
