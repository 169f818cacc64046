"""The operation interface: what an instruction does, and the registry of ops by name.

An :class:`Operation` is what an instruction does.  Like a MIGraphX ``operation`` it has a
``name``, reflected attributes, ``compute_shape`` and (for views) ``output_alias``.  Kernels are
written once against an array namespace ``xp`` (numpy on the ``ref`` target, CuPy on ``gpu``) and
always write into a preallocated ``out`` array, so no buffer is allocated while a graph is captured.
Ops are target-neutral: which kernel a target runs for an op is the target's choice (the gpu target's
kernel table, ``mgx_graph.operators.gpu_lowering``).  The ops themselves live in
``mgx_graph.operators`` and register here (:func:`register_op`).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .shape import Shape

_REGISTRY: dict[str, type] = {}


def register_op(cls):
    """Class decorator: make ``cls`` constructible by name through :func:`make_op`."""
    _REGISTRY[cls.name] = cls
    return cls


def make_op(name: str, **attrs) -> "Operation":
    """Construct the operation registered under ``name`` with attributes ``attrs``.

    Raises KeyError naming the op when nothing is registered under ``name``.
    """
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no operation named '{name}' is registered") from None
    return cls(**attrs)


def op_class(name: str) -> type:
    """The operation class registered under ``name``; KeyError naming the op when there is none."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no operation named '{name}' is registered") from None


def registered_ops() -> list[str]:
    return sorted(_REGISTRY)


def _fmt(v) -> str:
    if isinstance(v, (list, tuple)):
        return "{" + ", ".join(_fmt(x) for x in v) + "}"
    if isinstance(v, np.ndarray):
        return _fmt(v.tolist())
    if isinstance(v, float):
        return repr(v)
    return str(v)


class Operation:
    """Base class of every op.

    Subclasses set ``name`` and implement ``compute_shape``.  Compute ops implement
    ``compute(ctx, out, args, ws)``; view ops set ``is_view = True`` and implement ``view(xp, x, shape)``.
    Ops with submodules (``if``, ``loop``, ``graph_launch``) implement
    ``compute_modules(ctx, queue, out, args, mods, run)`` and may keep state made by ``finalize``.

    Class flags
    -----------
    is_view:      output aliases input 0 (no kernel, no buffer).
    host_only:    must run on the host with the data read back (a graph boundary).
    capturable:   may be recorded into a graph (default True for device kernels).
    foldable:     may be evaluated at compile time when all inputs are literals.
    inplace_ok:   ``out`` may be the same buffer as input 0 (used to bind a KV-cache output onto
                  its input parameter); an op with a tuple of results says which input each one may
                  be written into through :meth:`inplace_input`.
    float32_only: computes in float32 only: ``quantize_fp16`` converts its half inputs to float32
                  and keeps its outputs float32 (converted to half where they meet activations).
    """

    name = "?"
    is_view = False
    host_only = False
    capturable = True
    foldable = True
    inplace_ok = False
    builtin = False
    float32_only = False
    side_effects = False  # kept by dead-code elimination even when nothing reads it
    uses_blas = False  # True: its kernel calls ctx.matmul (the vendor BLAS handle is made at finalize)
    step_kind: str | None = None  # eval-loop step this op needs ("guard", "copy_from_gpu", ...); None: the default

    def __init__(self, **attrs):
        self.attrs = attrs

    def inplace_input(self, index=None):
        """The input whose buffer result ``index`` (a tuple index; None for the one result) may be,
        or None: input 0 for the one result of an ``inplace_ok`` op, nothing else by default."""
        return 0 if index is None and self.inplace_ok else None

    def __getattr__(self, key):
        attrs = self.__dict__.get("attrs")
        if attrs is not None and key in attrs:
            return attrs[key]
        raise AttributeError(key)

    # -- shape -------------------------------------------------------------------------------------
    def compute_shape(self, inputs: list[Shape], mods=()) -> Shape:
        raise NotImplementedError(self.name)

    def output_alias(self, inputs: list[Shape]) -> int | None:
        return 0 if self.is_view else None

    # -- execution ---------------------------------------------------------------------------------
    def compute(self, ctx, out, args, ws) -> None:
        """Write the result into ``out`` (an ``xp`` array of the output shape)."""
        raise NotImplementedError(f"{self.name}: no kernel")

    def view(self, xp, x, shape: Shape):
        raise NotImplementedError(self.name)

    # -- ops with submodules (MIGraphX's compute(ctx, output, args, module_args, run)) ---------------
    def finalize(self, ctx, ins, run):
        """Called once for an instruction with submodules when its program is finalized, before any run
        (its buffers are allocated, ``run`` is the eval loop's callback, see
        :class:`mgx_graph.exec.eval_loop.ModuleRunner`).  Returns a state object reported in ``stats()``
        and released with the program (``stats()`` / ``counters`` / ``release()``), or None."""
        return None

    def compute_modules(self, ctx, queue, out, args, mods, run):
        """Run the instruction on ``queue``: ``out`` is its own buffer (an array, a tuple of arrays, or
        None when it has none), ``args`` the values of its inputs, ``mods`` its submodules.  The op
        decides which submodule runs and how often, through ``run(module, queue, params=None,
        capture=False)``, which issues the module's instructions and returns its return values.
        Returns the instruction's value (``out`` or the submodule's results)."""
        raise NotImplementedError(f"{self.name}: no compute over submodules")

    def call_inputs(self) -> list[int] | None:
        """An op with submodules may name the positions of the inputs its ``compute_modules`` reads
        on every call (after ``finalize``); ``args`` then holds only those, in that order.  None (the
        default): every input, in input order."""
        return None

    def workspace(self, inputs: list[Shape], output: Shape) -> list[Shape]:
        """Scratch buffers the generic kernel needs (planned by memory planning)."""
        return []

    alloc_free = False

    def is_alloc_free(self, inputs: list[Shape]) -> bool:
        """True when :meth:`compute` allocates no temporaries (it can be captured on a GPU as is)."""
        return self.is_view or self.alloc_free

    def launches(self, inputs: list[Shape], output: Shape) -> int:
        """Device kernels the generic kernel issues per run."""
        return 0 if self.is_view else 1

    # -- constant folding --------------------------------------------------------------------------
    def fold(self, values: list[np.ndarray], in_shapes: list[Shape], out_shape: Shape) -> np.ndarray:
        """Evaluate on the host with numpy (used by constant propagation)."""
        if self.is_view:
            return np.array(self.view(np, values[0], out_shape), order="C")
        out = np.empty(out_shape.lens, dtype=out_shape.np_dtype)
        ws = [np.empty(s.lens, s.np_dtype) for s in self.workspace(in_shapes, out_shape)]
        self.compute(HOST, out, values, ws)
        return out

    # -- printing / equality -----------------------------------------------------------------------
    def attr_string(self) -> str:
        items = [(k, v) for k, v in self.attrs.items() if v is not None and not k.startswith("_")]
        if not items:
            return ""
        return "[" + ",".join(f"{k}={_fmt(v)}" for k, v in items) + "]"

    def __str__(self) -> str:
        return self.name + self.attr_string()

    def __repr__(self) -> str:
        return f"<op {self}>"

    def __eq__(self, other):
        return type(self) is type(other) and str(self) == str(other)

    def __hash__(self):
        return hash(str(self))


def numpy_reduce(kind: str, x, axes, out) -> None:
    """Reduce ``x`` over ``axes`` into ``out`` (keepdims shape) with numpy: sum, mean, max, min, prod.
    float16 sums, means and products accumulate in float32, as the gpu target's kernels do (a float16
    ``out`` would otherwise hold the running sum: a mean of many values overflows before its division)."""
    fns: dict[str, Callable[..., Any]] = {"sum": np.sum, "mean": np.mean, "max": np.amax, "min": np.amin,
                                          "prod": np.prod}
    if x.dtype == np.float16 and kind in ("sum", "mean", "prod"):
        out[...] = fns[kind](x, axis=tuple(axes), keepdims=True, dtype=np.float32)
        return
    fns[kind](x, axis=tuple(axes), keepdims=True, out=out)


class HostKernelContext:
    """What a kernel sees when it runs on the host (the ref target, constant folding)."""

    name = "ref"
    xp = np
    reduce = staticmethod(numpy_reduce)

    @staticmethod
    def matmul(a, b, out) -> None:
        np.matmul(a, b, out=out)


HOST = HostKernelContext()
