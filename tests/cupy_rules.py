"""Kernels of chosen ops run on the host under CuPy's rules, without a GPU.

:func:`strict_xp` is a numpy stand-in for ``xp`` that records what CuPy would do differently: allocate
(a call without ``out``), copy (an input or ``where`` mask that shares memory with ``out`` through
another view object: CuPy's ufuncs copy such an input first, an allocation that a capture refuses),
reject (an ``out`` whose shape is not the broadcast shape, a ``take`` into another dtype, a cast
``copyto`` does not allow).  :func:`strict_kernels` makes the lowered kernels of the named ops run their
``compute`` with it and with a ``matmul`` that asks the gpu target's GEMM planner whether the operands
need a copy."""
import types

import numpy as np

UFUNCS = ("add", "subtract", "multiply", "true_divide", "exp", "expm1", "tanh", "abs", "logaddexp", "maximum",
          "minimum", "less", "less_equal", "greater", "greater_equal", "logical_and", "logical_not", "right_shift",
          "bitwise_and", "sqrt", "reciprocal", "negative", "equal")


def _aliased(a, out) -> bool:
    return isinstance(a, np.ndarray) and a is not out and np.may_share_memory(a, out)


def strict_xp(found: list):
    def ufunc(name):
        fn = getattr(np, name)

        def call(*args, out=None, **kw):
            if out is None:
                found.append(f"{name} without out allocates")
                return fn(*args, **kw)
            arrays = [a for a in args if isinstance(a, np.ndarray)]
            if np.broadcast_shapes(*[a.shape for a in arrays], out.shape) != out.shape:
                found.append(f"{name}: out {out.shape} is not the broadcast shape")
            if any(_aliased(a, out) for a in arrays):
                found.append(f"{name}: an input shares memory with out through another view (CuPy copies it)")
            return fn(*args, out=out, **kw)
        return call

    def copyto(dst, src, casting="same_kind", where=None):
        if isinstance(src, np.ndarray):
            if not np.can_cast(src.dtype, dst.dtype, casting):
                found.append(f"copyto {src.dtype} -> {dst.dtype} is not a {casting} cast")
            if _aliased(src, dst):
                found.append("copyto: source shares memory with the destination")
        if _aliased(where, dst):
            found.append("copyto: the where mask shares memory with the destination (CuPy copies it)")
        np.copyto(dst, src, casting=casting, where=True if where is None else where)

    def take(a, idx, axis=None, out=None):
        if out is None or out.dtype != a.dtype:
            found.append("take without out, or into another dtype")
        return np.take(a, idx, axis=axis, out=out)

    def clip(a, lo, hi, out=None):
        if out is None:
            found.append("clip without out allocates")
        elif _aliased(a, out):
            found.append("clip: the input shares memory with out through another view (CuPy copies it)")
        return np.clip(a, lo, hi, out=out)

    ns = types.SimpleNamespace(**{n: ufunc(n) for n in UFUNCS})
    ns.copyto, ns.take, ns.clip, ns.lib, ns.finfo = copyto, take, clip, np.lib, np.finfo
    return ns


def strict_kernels(monkeypatch, ops):
    """Lowering gives the ops named in ``ops`` kernels that run ``compute`` with :func:`strict_xp`;
    returns ``(found, ran)``: what CuPy would not do, and the op names run."""
    from mgx_graph.operators.base import numpy_reduce
    from mgx_graph.operators.gpu import _dot_kernel
    from mgx_graph.passes import lowering
    from mgx_graph.ir.shape import Shape

    found, ran = [], []

    def shape(a):
        return Shape(a.dtype.name, a.shape, [s // a.itemsize for s in a.strides])

    def matmul(a, b, out):
        k = _dot_kernel(None, [shape(a), shape(b)], Shape(out.dtype.name, out.shape))
        if k is None or k.workspace:
            found.append(f"matmul operands {a.shape}/{a.strides} x {b.shape}/{b.strides} need a copy for BLAS")
        np.matmul(a, b, out=out)

    ctx = types.SimpleNamespace(name="gpu-rules", xp=strict_xp(found), reduce=numpy_reduce, matmul=matmul)
    select = lowering.Lowering.select

    def strict_select(self, op, in_shapes, out_shape, ins, target=None):
        k = select(self, op, in_shapes, out_shape, ins, target)
        if op.name in ops:
            def fn(_ctx, out, args, ws, op=op):
                ran.append(op.name)
                op.compute(ctx, out, args, ws)
            k.fn = fn
        return k

    monkeypatch.setattr(lowering.Lowering, "select", strict_select)
    return found, ran
