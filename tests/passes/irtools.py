"""Helpers of the per-pass tests: programs are built by hand with the Module API (not through
ONNX), one pass runs, and the printed result is compared with a hand-built expected program."""
from __future__ import annotations

import numpy as np

from mgx_graph import Program, Shape
from mgx_graph.operators import make_op
from mgx_graph.passes import PassContext, validate_program


def S(dtype, *lens, strides=None) -> Shape:
    return Shape(dtype, lens, strides)


def op(name, **attrs):
    return make_op(name, **attrs)


def lit(m, value, dtype="float32"):
    return m.add_literal(np.asarray(value, dtype))


def kernel_str(k) -> str:
    return f"{k.label}/{k.launches}" + ("" if k.capturable else "/no-capture") + \
        (f"/ws{len(k.workspace)}" if k.workspace else "")


def text(prog: Program, meta=()) -> str:
    """``prog.print()``; with ``meta`` keys, each instruction line ends with ``; key=value`` for the
    keys it has (``kernel`` as label/launches[/no-capture])."""
    if not meta:
        return prog.print()
    out = []
    for m in prog.module_order():
        lines = m.print().splitlines()
        out.append(lines[0])
        for ins, line in zip(m.instructions, lines[1:]):
            notes = []
            for key in meta:
                if key in ins.meta:
                    v = ins.meta[key]
                    notes.append(f"{key}={kernel_str(v) if key == 'kernel' else v}")
            out.append(line + ("  ; " + " ".join(notes) if notes else ""))
        out.append("")
    return "\n".join(out) + "\n"


def assert_same_ir(got: Program, want: Program, meta=()) -> None:
    """The two programs print the same (both printed when they differ)."""
    g, w = text(got, meta), text(want, meta)
    if g != w:
        print("--- got\n" + g + "--- want\n" + w)
    assert g == w


def run_pass(p, prog: Program, target: str = "ref", ctx: PassContext | None = None) -> Program:
    """Run one pass alone (with ``ctx``, whose ``result`` collects what the pass records, or a fresh
    context for ``target``), then check that the result is valid IR."""
    p.apply(prog, ctx if ctx is not None else PassContext(target))
    validate_program(prog)
    return prog
