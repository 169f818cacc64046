"""The gpu target's kernel table: which kernel each op runs on the gpu target, in one place.

As MIGraphX's gpu ``lowering`` keeps one map from op name to the function that lowers an instruction
of that op (``src/targets/gpu/lowering.cpp``), the gpu target keeps one table here, keyed by op name
(the fused ops by theirs: ``pointwise``, ``fused_reduce``, ``fused_scatternd``, ``fused_horizontal``,
``fused_gemv``).  Ops describe semantics only (``compute_shape``, ``compute`` on ``xp``); no op class
has a gpu-specific method or attribute.  An entry is one of:

* a **lowering function**, registered with ``@gpu_kernel_for("name", ...)``:
  ``fn(op, inputs, output, ins) -> GpuKernel | None`` (``inputs`` / ``output``: the instruction's
  shapes; ``ins``: the instruction, or None when a kernel is asked for shapes alone).  None: the
  function does not take these shapes or types, and the op's generic kernel runs;
* an **elementwise body**, registered with :func:`gpu_body_for`: one CUDA / HIP statement computing
  ``y`` from ``x`` (one input), ``a`` / ``b`` (two) or ``c`` / ``a`` / ``b`` (``where``), with ``T``
  the element type and ``C`` the compute type (``float`` for half and float, ``double`` for double);
  an upper-case attribute name (``ALPHA``) stands for that float attribute.  The op runs as one CuPy
  elementwise kernel, and the generated fused kernels take the same statement
  (:mod:`.fused_exprs`);
* **host**: the ops in :data:`HOST_ONLY` have no device kernel (host fallback on gpu).

The functions live beside the kernels they build, one module per family (``gpu.py``: dot, scatternd,
rms_norm; ``pointwise_gpu.py``; ``index_gpu.py``; ``vision_gpu.py``; ``signal_gpu.py``;
``lstm_gpu.py``; ``topk_gpu.py``; ``llm_gpu.py``; ``fused_gpu.py``), each imported by
``operators/__init__.py``, so the table is complete once ``mgx_graph.operators`` is imported.

:func:`select_gpu_kernel` picks, for one instruction, a kernel that writes into its preplanned output
without allocating (so it can be captured): its table entry's kernel when it gives one, else the op's
generic ``xp`` kernel when it allocates no temporaries, else the generic kernel marked *not
capturable* (the graph pass makes it a boundary).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Union

from ..ir.shape import Shape
from .gpu_kernel import GpuKernel

LoweringFn = Callable[[Any, list, Any, Any], Union[GpuKernel, None]]
Body = Union[str, Callable[[Any], str]]

_KERNELS: dict[str, LoweringFn] = {}
_BODIES: dict[str, Body] = {}
HOST_ONLY = frozenset({"onnx_op", "unique"})  # no device kernel: run on the host (onnx.reference, np.unique)


def _claim(name: str) -> None:
    if name in _KERNELS or name in _BODIES or name in HOST_ONLY:
        raise ValueError(f"gpu kernel table: op '{name}' already has an entry")


def gpu_kernel_for(*names: str) -> Callable[[LoweringFn], LoweringFn]:
    """Decorator: ``fn(op, inputs, output, ins)`` lowers the ops named ``names`` on the gpu target
    (ValueError when one already has an entry)."""
    def register(fn: LoweringFn) -> LoweringFn:
        for name in names:
            _claim(name)
            _KERNELS[name] = fn
        return fn
    return register


def gpu_body_for(name: str, body: Body) -> None:
    """Op ``name`` runs as one elementwise kernel of statement ``body`` (a string, or a function of the
    op giving one: see the module docstring); ValueError when the op already has an entry."""
    _claim(name)
    _BODIES[name] = body


def table() -> dict[str, str]:
    """Every entry of the table: op name -> ``"kernel"``, ``"elementwise"`` or ``"host"``."""
    res = {n: "kernel" for n in _KERNELS}
    res.update({n: "elementwise" for n in _BODIES})
    res.update({n: "host" for n in HOST_ONLY})
    return dict(sorted(res.items()))


def runs_on_gpu(op, inputs: list) -> bool:
    """Whether the gpu target runs ``op`` with inputs ``inputs`` on the device (else: host fallback)."""
    return op.name not in HOST_ONLY


def gpu_body(op) -> str | None:
    """The elementwise statement of ``op`` with its float attributes substituted, or None."""
    body = _BODIES.get(op.name)
    if body is None:
        return None
    text = body if isinstance(body, str) else body(op)
    for k, v in op.attrs.items():
        if isinstance(v, float):
            text = text.replace(k.upper(), repr(float(v)))
    return text


def table_kernel(op, inputs: list[Shape], output, ins=None) -> GpuKernel | None:
    """The kernel ``op``'s table entry gives for these shapes, or None (no entry, or the entry does not
    take them)."""
    fn = _KERNELS.get(op.name)
    if fn is not None:
        return fn(op, inputs, output, ins)
    if op.name in _BODIES:
        return _elementwise_kernel(op, inputs, output)
    return None


def select_gpu_kernel(op, inputs: list[Shape], output, ins=None) -> GpuKernel:
    """The kernel of ``op`` on the gpu target (see the module docstring); ``ins``: the instruction
    (entries such as ``dot``'s read its inputs), None for shapes alone."""
    k = table_kernel(op, inputs, output, ins)
    if k is not None:
        return k
    ws = op.workspace(inputs, output)
    launches = op.launches(inputs, output)
    if op.is_alloc_free(inputs):
        return GpuKernel(op.compute, launches, ws, True, "generic")
    return GpuKernel(op.compute, launches, ws, False, "generic (allocates: not capturable)")


# ---------------------------------------------------------------------------------------------------
# elementwise kernels from a body
# ---------------------------------------------------------------------------------------------------
_PARAMS = {
    1: ("T x", "T y"),
    2: ("T a, T b", "T y"),
}


@functools.lru_cache(maxsize=None)
def _compile_elementwise(name: str, in_params: str, out_params: str, body: str, compute: str):
    import cupy

    return cupy.ElementwiseKernel(in_params, out_params, body, f"mgx_{name}", preamble=f"typedef {compute} C;")


def _elementwise_kernel(op, in_shapes, out_shape) -> GpuKernel:
    body = gpu_body(op)
    assert body is not None
    if op.name == "where":
        in_params, out_params = "bool c, T a, T b", "T y"
    else:
        in_params, out_params = _PARAMS[len(in_shapes)]
    compute = "double" if out_shape.dtype == "float64" else "float"
    label = f"elementwise {op.name}"

    def run(ctx, out, args, ws):
        kern = _compile_elementwise(op.name + "_" + compute, in_params, out_params, body, compute)
        kern(*args, out)

    return GpuKernel(run, 1, [], True, label)
