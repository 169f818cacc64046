"""Control flow, host transfers and guards: the instructions that make a graph boundary.

``if`` and ``loop`` take submodules (MIGraphX's ``if`` / ``loop`` with ``module_inputs``); their
condition and trip count are read on the host, so they cannot be recorded into a GPU graph.  Runs of
kernels inside their bodies can still be wrapped in ``graph_launch`` by the ``hip_graph`` pass.  Like
every op with submodules they run through ``compute_modules(ctx, queue, out, args, mods, run)``: the
op picks the module and how often it runs, the eval loop's ``run`` callback runs it.

``copy_from_gpu`` / ``copy_to_gpu`` move a value between the device and a fixed host buffer around a
host-fallback instruction (an op the gpu target does not implement runs on the ``ref`` kernel).

``guard`` reads a runtime value on the host and checks it against the value the program was
specialized for (a data-dependent shape); on a mismatch the run is abandoned and re-dispatched.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.shape import Shape
from .base import Operation, check_inputs, register_op
from .dynamic import SpecializationMiss, reduce_for_key


def _host_scalar(ctx, x, queue):
    """The first element of device array ``x``, read on the host (waits for ``queue``)."""
    return np.asarray(ctx.to_host(x, queue)).reshape(-1)[0]


def _same(a: Shape, b: Shape) -> bool:
    return tuple(a.lens) == tuple(b.lens) and a.dtype == b.dtype


@register_op
class If(Operation):
    """``if(cond)`` with ``module_inputs = [then, else]``; outputs of both branches must agree."""

    name = "if"
    capturable = False
    foldable = False
    host_only = True

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        if inputs[0].elements() != 1 or inputs[0].dtype != "bool":
            raise ShapeError(f"if: condition must be a single bool, got {inputs[0].brief()}")
        a, b = mods[0].get_output_shapes(), mods[1].get_output_shapes()
        if len(a) != len(b) or not all(_same(x, y) for x, y in zip(a, b)):
            raise ShapeError(f"if: branches return different shapes {[s.brief() for s in a]} vs "
                             f"{[s.brief() for s in b]} (a data-dependent shape)")
        outs = tuple(Shape(s.dtype, s.lens) for s in a)
        return outs[0] if len(outs) == 1 else outs

    def compute_modules(self, ctx, queue, out, args, mods, run):
        """Read the condition on the host, run the branch it picks (``mods[0]`` when true, else
        ``mods[1]``) and copy the branch's results into this instruction's buffers ``out``."""
        branch = mods[0] if bool(_host_scalar(ctx, args[0], queue)) else mods[1]
        results = run(branch, queue)
        own = out if isinstance(out, tuple) else (out,)
        for dst, src in zip(own, results):
            ctx.copy(queue, dst, src)
        run.add_launches(len(own))
        return out


@register_op
class Loop(Operation):
    """ONNX Loop: inputs ``(M, cond, v_initial...)``, ``module_inputs = [body]``.

    The body's parameters are ``iteration_num``, ``cond_in`` and the carried values (``param_names``
    in ONNX order); it returns ``cond_out``, the carried values and the scan outputs.  The output is
    the final carried values followed by the scan outputs stacked over ``trip_count`` iterations
    (``trip_count`` is the number of iterations this program was specialized for; -1 when there are
    no scan outputs).
    """

    name = "loop"
    capturable = False
    foldable = False
    host_only = True

    def __init__(self, param_names=(), trip_count=-1, n_carried=0):
        super().__init__(param_names=list(param_names), trip_count=int(trip_count), n_carried=int(n_carried))

    def compute_shape(self, inputs, mods=()):
        body = mods[0]
        outs = body.get_output_shapes()
        n = self.n_carried
        carried = [Shape(s.dtype, s.lens) for s in inputs[2:2 + n]]
        for k, (c, o) in enumerate(zip(carried, outs[1:1 + n])):
            if not _same(c, o):
                raise ShapeError(f"loop: carried value {k} changes shape {c.brief()} -> {o.brief()} in the body")
        scans = [Shape(s.dtype, (self.trip_count,) + tuple(s.lens)) for s in outs[1 + n:]]
        res = tuple(carried + scans)
        return res[0] if len(res) == 1 else res

    def finalize(self, ctx, ins, run):
        """Find the loop-owned buffers the body reads its iteration number and condition from (None
        for one the body does not declare) and the key a trip-count mismatch is reported under."""
        body = ins.module_inputs[0]
        params = [body.get_parameter(n) for n in self.param_names[:2]]
        self._loop_vars = [run.value(p) if p is not None else None for p in params]
        self._trip_key = ins.meta.get("trip_key", "")
        return None

    def compute_modules(self, ctx, queue, out, args, mods, run):
        """Run the body while the condition holds and fewer than ``M`` iterations ran (both read on the
        host, the condition after every iteration): carried values start from ``v_initial`` and are
        updated in place, iteration ``i``'s scan outputs go to row ``i``.  Raises SpecializationMiss
        when a program with scan outputs ran another number of iterations than ``trip_count``."""
        body, n, trip = mods[0], self.n_carried, self.trip_count
        own = out if isinstance(out, tuple) else (out,)
        carried, scans = own[:n], own[n:]
        it_buf, cond_buf = self._loop_vars
        limit = int(_host_scalar(ctx, args[0], queue))
        cond = bool(_host_scalar(ctx, args[1], queue))
        for dst, src in zip(carried, args[2:2 + n]):
            ctx.copy(queue, dst, src)
        i = 0
        while cond and i < limit:
            if it_buf is not None:
                ctx.fill(queue, it_buf, i)
            if cond_buf is not None:
                ctx.fill(queue, cond_buf, cond)
            rets = run(body, queue)
            cond = bool(_host_scalar(ctx, rets[0], queue))
            if i < trip:  # scan outputs first: they may read a carried value about to be updated
                for dst, src in zip(scans, rets[1 + n:]):
                    ctx.copy(queue, dst[i, ...], src)
            _update_carried(ctx, queue, carried, rets[1:1 + n])
            run.add_launches(n + len(scans))
            i += 1
        if scans and i != trip:  # scan outputs were specialized for another trip count
            raise SpecializationMiss(self._trip_key, np.asarray(i, np.int64), np.asarray(trip, np.int64))
        return out


def _update_carried(ctx, queue, carried, results) -> None:
    """Copy the body's results into the carried buffers; a result that is another carried buffer is
    copied aside first (its value must be read before that buffer is overwritten)."""
    ptr = ctx.data_ptr
    own_ptrs = {ptr(d) for d in carried}
    pairs = [(d, ctx.xp.array(src, copy=True) if ptr(src) in own_ptrs and ptr(src) != ptr(d) else src)
             for d, src in zip(carried, results)]
    for dst, src in pairs:
        if ptr(src) != ptr(dst):
            ctx.copy(queue, dst, src)


class _HostCopy(Operation):
    """A copy between a device buffer and a fixed host buffer (a graph boundary); shape of the input."""

    capturable = False
    foldable = False

    def compute_shape(self, inputs, mods=()):
        return Shape(inputs[0].dtype, inputs[0].lens)


@register_op
class CopyFromGpu(_HostCopy):
    """Device -> host copy into a fixed host buffer, then a queue synchronization."""

    name = "copy_from_gpu"
    step_kind = "copy_from_gpu"


@register_op
class CopyToGpu(_HostCopy):
    """Host -> device copy of a host buffer into the instruction's device buffer."""

    name = "copy_to_gpu"
    step_kind = "copy_to_gpu"


@register_op
class Guard(Operation):
    """Checks on the host that ``fn(input)`` equals ``expected`` (``fn``: value | count_nonzero |
    trip_count ...); the output is the input (a view), so consumers are ordered after the check."""

    name = "guard"
    step_kind = "guard"
    capturable = False
    foldable = False
    side_effects = True
    is_view = True

    def __init__(self, key="", fn="value", expected=None):
        super().__init__(key=str(key), fn=str(fn), _expected=np.asarray(expected))

    @property
    def expected(self):
        return self.attrs["_expected"]

    def compute_shape(self, inputs, mods=()):
        x = inputs[0]
        return Shape(x.dtype, x.lens, x.strides)

    def view(self, xp, x, shape):
        return x

    def observe(self, host_value) -> np.ndarray:
        return reduce_for_key(self.fn, host_value)

    def attr_string(self):
        return f"[key={self.key}]"
