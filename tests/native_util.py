"""Checks shared by the tests/test_native_*.py files: run a model on a target, eager or in a graph
(min_partition_size=1, 4 runs: warmups, capture, replays), compare every output with an oracle
(onnxruntime CPU by default; NaN positions must match), and check that the program is native."""
from __future__ import annotations

import numpy as np

import mgx_graph
from util import ort_run


def program_text(prog) -> str:
    """The printed program, or every specialization of a program compiled per run-time value."""
    d = getattr(prog, "dispatcher", None)
    if d is not None and len(d.specs):
        return "\n".join(p.print() for p in d.specs.programs())
    return prog.print()


def kernels(prog) -> list:
    """(op name, kernel) of every lowered instruction, of every specialization."""
    d = getattr(prog, "dispatcher", None)
    progs = d.specs.programs() if d is not None and len(d.specs) else [prog]
    return [(i.op.name, i.meta["kernel"]) for p in progs for m in p.modules.values() for i in m.instructions
            if "kernel" in i.meta]


def check_outputs(got, expect, tol=(1e-5, 1e-6), what=""):
    assert len(got) == len(expect), what
    for k, (g, e) in enumerate(zip(got, expect)):
        g, e = np.asarray(g), np.asarray(e)
        assert g.shape == e.shape, (what, k, g.shape, e.shape)
        assert g.dtype == e.dtype, (what, k, g.dtype, e.dtype)
        if e.dtype.kind in "fc":
            np.testing.assert_array_equal(np.isnan(g), np.isnan(e), err_msg=f"{what} output {k}: NaN positions")
            np.testing.assert_allclose(g, e, rtol=tol[0], atol=tol[1], err_msg=f"{what} output {k}")
        else:
            np.testing.assert_array_equal(g, e, err_msg=f"{what} output {k}")


def run_native(model, feeds, target, hip_graph, ops, tol=(1e-5, 1e-6), expect=None):
    """Compile ``model`` for ``target`` and check it against ``expect`` (default: onnxruntime).

    ``ops``: op names the compiled program must contain; no ``onnx_op`` may remain, no instruction may
    fall back to the host and, on the gpu target, every kernel of ``ops`` must be capturable."""
    if expect is None:
        expect = ort_run(model, feeds)
    prog = mgx_graph.compile(model, target=target, hip_graph=hip_graph, min_partition_size=1)
    for run in range(4 if hip_graph else 1):
        check_outputs(prog.run(feeds), expect, tol, f"run {run}")
    text = program_text(prog)
    assert "onnx_op" not in text, text
    for name in ops:
        assert name in text, (name, text)
    assert prog.stats()["fallbacks"] == 0, prog.stats()
    for name, k in kernels(prog):
        assert k.label != "host fallback", (name, text)
        if target == "gpu" and name in ops:
            assert k.capturable, (name, k.label)
    return prog
