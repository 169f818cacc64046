"""The record of a program's last ``run_async`` call, which a repeated call reuses.

A decode loop passes the same parameter arrays every step (:class:`mgx_graph.llm.generation.Decoder`
rewrites them in place): the same objects, at the same device pointers, with the same shapes,
strides and dtypes.  After a ``run_async`` in which every value was the target's own array as given
(numpy on ``ref``; CuPy on ``gpu``, or a host numpy array copied with ``copy=True``), the executor
keeps a :class:`CallRecord` of it: the queue, the ``copy`` flag, the value objects and their layouts,
and what the call resolved (the copies into parameter buffers, the inputs staged because they overlap
the program's memory).  A call that :meth:`CallRecord.matches` the record skips conversion,
validation, binding and the staging check; it only repeats the work every call does (those copies,
:meth:`CallRecord.repeat`), and the graph regions reuse their keys (:mod:`mgx_graph.graph.launch`).

A call matches when, checked in one pass over the parameters:

* its queue and ``copy`` flag are the record's;
* its dict holds exactly the names the recorded call brought (every parameter not bound as
  state), each bound to the very object of the recorded call
  (the record holds references to them, so no new object can take a recorded object's ``id``);
* every value still has the recorded shape, strides and dtype: numpy lets shape, strides and dtype
  be set on an existing array, so a numpy value's three are compared; CuPy lets only its shape be set
  (the setter reshapes in place, recomputing the strides; ``dtype`` and ``strides`` are read-only
  properties), so a device array's shape alone is compared, which keeps a replayed decode step's check
  of its 62 arrays to one attribute read each.  Neither lets an array's data pointer change (``data``
  is read-only), so the same live object has the same pointer;
* every numpy value of a parameter written in place (``alias``) is still writeable.

The contents of the arrays are not part of it: a decode step rewrites its inputs between calls.

Parameters bound as state (:meth:`mgx_graph.exec.executor.Executor.bind_state`) are not part of it either:
the executor holds its own view of each (an object nobody else holds, so nothing reshapes it), bound
again by every full bind, and the record compares only the names and objects the call brings (a
decode step's two step inputs, not its 60 cache arrays).  A ``bind_state`` drops the record.

Values the call had to convert (DLPack, ``__cuda_array_interface__``, ``numpy.asarray`` of another
object) leave no record: their import is per call (a DLPack import orders the producer's stream before
the run's queue).  Every full bind drops the record (a ``run``, ``profile_steps``, ``dry_run``, a call
that does not match, a call that raised), and so does ``release``.
"""
from __future__ import annotations

from operator import attrgetter, is_, itemgetter

import numpy as np

_LAYOUT = attrgetter("shape", "strides", "dtype")
_SHAPE = attrgetter("shape")
_WRITEABLE = attrgetter("flags.writeable")


def slot_getter(keys):
    """A function returning ``(container[k] for k in keys)`` as a tuple, in one C call (any count)."""
    keys = list(keys)
    if not keys:
        return lambda container: ()
    if len(keys) == 1:
        k = keys[0]
        return lambda container: (container[k],)
    return itemgetter(*keys)


class CallRecord:
    """One recorded ``run_async`` call of an executor (see the module docstring).

    ``names``: the names a call brings (the parameters not bound as state), in the executor's order;
    ``values``: the objects given for them
    (the same order); ``queue``: the call's queue (int); ``copy``: its ``copy`` flag; ``written``: the
    names of the parameters written in place; ``copies``: ``[(parameter buffer, source, on_device)]``
    and ``staged``: ``[(slot, array, buffer)]`` as :meth:`Executor.bind` resolved them.
    """

    __slots__ = ("queue", "copy", "n", "names", "getter", "values", "host", "layouts", "device", "shapes", "writeable",
                 "copies", "staged")

    def __init__(self, names, values, queue: int, copy: bool, written, copies, staged):
        self.queue, self.copy, self.n = queue, bool(copy), len(names)
        self.names = tuple(names)
        self.getter = slot_getter(names)
        self.values = tuple(values)
        self.host = [a for a in self.values if isinstance(a, np.ndarray)]
        self.device = [a for a in self.values if not isinstance(a, np.ndarray)]
        self.layouts = list(map(_LAYOUT, self.host))
        self.shapes = list(map(_SHAPE, self.device))
        self.writeable = [a for n, a in zip(names, self.values) if n in written and isinstance(a, np.ndarray)]
        self.copies, self.staged = list(copies), list(staged)

    def matches(self, params, queue: int, copy) -> bool:
        """Whether a ``run_async(params, queue, copy)`` repeats the recorded call (see the module
        docstring); no state is touched."""
        if queue != self.queue or bool(copy) != self.copy or type(params) is not dict or len(params) != self.n:
            return False
        try:
            values = self.getter(params)
        except KeyError:
            return False
        # the same objects: their current layouts are read from the recorded references
        if not all(map(is_, values, self.values)) or list(map(_SHAPE, self.device)) != self.shapes:
            return False
        return not self.host or (list(map(_LAYOUT, self.host)) == self.layouts and all(map(_WRITEABLE, self.writeable)))

    def repeat(self, executor, queue: int) -> None:
        """The per-call work of the recorded call on ``queue``: its copies into parameter buffers and
        its staged inputs (what the call's bind would issue again)."""
        if self.copies:
            executor._copy_in(queue, self.copies, self.staged)
        elif self.staged:
            executor.staging.stage(queue, self.staged, executor.env)
