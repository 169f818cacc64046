"""The compiled program: what :func:`mgx_graph.compile` and :meth:`mgx_graph.ir.Program.compile` return.

One type over both kinds of program:

* *static* (every shape known at compile time): one :class:`~mgx_graph.exec.executor.Executor`;
* *dynamic* (symbolic input dims, or shapes that depend on values): a
  :class:`~mgx_graph.dynamic.Dispatcher` of specializations, each itself a static compiled program,
  compiled on first use for each call's shapes (and values).  When the model could also be compiled
  for its default dims at compile time, that specialization (spec 0) is the program's ``executor``.

Both run through the same ``run`` / ``run_async`` / ``stats`` / ``release`` and report the same
counters (:class:`~mgx_graph.graph.counters.GraphCounters`).  The IR the program was compiled from (the
lowered IR, with ``graph_launch`` submodules) and the typed compile result
(:class:`~mgx_graph.passes.compile_result.CompileResult`) stay readable.
"""
from __future__ import annotations

import numpy as np

from ..errors import CompileError, MgxError
from ..graph.counters import GraphCounters
from ..passes.compile_result import CompileResult


_saver = None  # save(compiled, path), set by register_saver


def register_saver(save) -> None:
    """Set what :meth:`CompiledProgram.save` runs: ``save(compiled, path)``.  The saved-program layer
    (:mod:`mgx_graph.mxr.save_load`) registers itself when it is imported, as ``import mgx_graph`` does,
    so that the run time imports nothing of it."""
    global _saver
    _saver = save


class CompiledProgram:
    """A program compiled for a target (see the module docstring).

    ``program``: the :class:`~mgx_graph.ir.Program` (lowered IR; for a dynamic program the one of
    spec 0, or an empty program); ``result``: its :class:`CompileResult`; ``executor``: the
    executor of a static program (or of spec 0), None otherwise; ``dispatcher``: the
    specializations of a dynamic program, None for a static one; ``options``: the keyword options it
    was compiled with (those of :func:`mgx_graph.compile` for a dynamic program, of
    :func:`mgx_graph.compiler.compile_program` for a static one; None where the environment decides).
    """

    def __init__(self, program, result: CompileResult, executor=None, dispatcher=None, options: dict | None = None):
        if executor is None and dispatcher is None:
            raise ValueError("a compiled program needs an executor or a dispatcher")
        self.program = program
        self.result = result
        self.executor = executor
        self.dispatcher = dispatcher
        self.options = dict(options or {})

    # -- running ---------------------------------------------------------------------------------
    def run(self, params: dict) -> list[np.ndarray]:
        """Run and return host (numpy) copies of the outputs (blocks until done).

        ``params`` maps every parameter name to an array of exactly the parameter's shape and dtype (a
        dynamic program: of a shape its model allows): numpy, or anything :mod:`mgx_graph.exec.interop`
        reads (torch tensors, JAX / CuPy arrays, DLPack or ``__cuda_array_interface__`` objects on the
        program's device, nested lists).  Each value is copied once into the program's parameter
        buffer (from host memory, or device to device), so the caller's arrays are never written, not
        even by an output bound in place.  Arrays bound with :meth:`bind_state` play no part: ``run``
        takes every parameter, state ones included.  Raises ParameterError naming the parameter and the
        expected vs given shape / dtype / device, MgxError once released."""
        if self.dispatcher is not None:
            return self.dispatcher.run(params, device=False)
        return self.executor.run(params)

    def run_async(self, params: dict, queue=None, copy: bool = False) -> list:
        """Run on ``queue`` (a stream handle, int; default: the context's queue) without synchronizing.

        ``params``: arrays in the program's memory (``gpu``: device ``device_id``; ``ref``: the host):
        CuPy / numpy arrays, or any DLPack / ``__cuda_array_interface__`` object there (torch tensors,
        JAX arrays), bound without a copy when C-contiguous with the parameter's shape and dtype (an
        output bound in place with ``alias`` then writes the caller's memory).  A value in host memory
        (``gpu``) or non-contiguous is a ParameterError, or with ``copy=True`` copied once into the
        parameter's buffer on ``queue``; a wrong shape or dtype, or memory on another device, is always
        a ParameterError naming the parameter.  Returns the target's arrays (CuPy / numpy) that alias the
        program's output buffers: they are valid until the next run (copy them to keep them).

        After :meth:`bind_state`, ``params`` holds the parameters not bound as state (naming a state
        parameter too binds the array given for that call instead).

        A queue given here must outlive the program (its release synchronizes it); a release while a
        capture is open on it frees nothing until that capture ends."""
        if self.dispatcher is not None:
            return self.dispatcher.run(params, device=True, queue=queue, copy=copy)
        return self.executor.run_async(params, queue, copy)

    def bind_state(self, params) -> int:
        """Bind parameters once as state (a decode step's KV cache): later ``run_async`` calls take only
        the other parameters.

        ``params``: ``{name: array}`` for some of the parameters, each the target's own array (numpy on
        ``ref``, CuPy on ``gpu`` device ``device_id``), C-contiguous, of exactly the parameter's shape and
        dtype (``get_parameter_shapes()``), writable when an output is bound onto it (``alias``).  The
        program keeps its own view of each (``a.view()``: the same memory, kept alive; an in-place
        reshape of the caller's object changes nothing the program reads); an output bound in place
        writes that memory every run, so the caller reads the updated state from its array.

        A ``run_async`` then binds exactly what ``{**state, **params}`` would bind (copies, staging,
        graph keys alike), but a repeated call compares only the arrays it brings (``fast_path_hits``).
        A call that names a state parameter uses the array given for that call (the full path, not
        recorded).  ``run``, ``profile_steps`` and ``dry_run`` ignore the state and take every
        parameter.  ``None`` or ``{}`` drops the state; ``release`` drops it too.

        Returns :attr:`state_serial` of this binding.  Raises ParameterError naming the parameter
        (unknown name, not the target's array, wrong shape / dtype, device, layout, read-only) before
        anything changes (the previous state stays bound); MgxError for a dynamic-shape program (its
        specializations are compiled per call's shapes, so a fixed array cannot be bound ahead) unless
        ``params`` is empty, and once released."""
        if self.dispatcher is not None:
            if params:
                raise MgxError("bind_state needs a static program: this one is dynamic (a specialization is "
                               "compiled per call's shapes), pass every parameter to run_async")
            return 0
        return self.executor.bind_state(params)

    @property
    def state_serial(self) -> int:
        """The number of the current :meth:`bind_state` binding (0: none yet; a dynamic program: 0)."""
        return 0 if self.dispatcher is not None else self.executor.state.serial

    def stats(self) -> dict:
        """Counters: captures, replays, fallbacks, eager runs, warmups, launches per run (last run and
        eager), per-region details (instructions, graph nodes, keys, failure reasons), scratch bytes,
        ``host_fallback_instructions`` (the instructions that run on the host in place of a device kernel,
        :attr:`CompileResult.host_instructions`), ``fast_path_hits`` (``run_async`` calls that repeated
        the previous one) and ``replay_plan_hits`` (those of them replayed without the eval loop: the replay
        path, :mod:`mgx_graph.graph.replay`); a static program adds ``runs``, a dynamic
        one its specialization counts (its hit counts summed over every specialization)."""
        if self.dispatcher is not None:
            return self.dispatcher.stats()
        st = self.executor.stats()
        st["host_fallback_instructions"] = len(self.result.host_instructions)
        return st

    def counters(self) -> GraphCounters:
        """The graph counters ``stats()`` reports, summed over every region (and specialization)."""
        if self.dispatcher is not None:
            return self.dispatcher.counters()
        return self.executor.counters()

    def release(self) -> None:
        """Synchronize, destroy graphs, free device memory.  Safe to call more than once; later runs raise
        MgxError.  While a capture is open on a queue the program used (its own, or one given to
        ``run_async``) or on any queue a capture was begun on through the runtime layer (another
        program's graph region: the garbage collector may run this on the capturing thread), the frees
        wait until that capture ends (``hipFree`` would invalidate it)."""
        if self.dispatcher is not None:
            self.dispatcher.release()
        if self.executor is not None:
            self.executor.close()

    @property
    def released(self) -> bool:
        """True once :meth:`release` ran: the program's memory, queue and graphs are gone, and so is the
        memory of any array it handed out (``param_buffer``, outputs of ``run_async``)."""
        if self.dispatcher is not None:
            return self.dispatcher.released
        return self.executor is None or self.executor.released

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass

    # -- the executor behind queue / context / param_buffer ----------------------------------------
    def is_compiled(self) -> bool:
        """True when an executor exists now: a static program, or a dynamic one with spec 0."""
        return self.executor is not None

    def active_executor(self):
        """The executor ``queue``, ``context`` and ``param_buffer`` refer to: the program's own (static,
        or spec 0 while the dispatcher keeps it), else the most recently used specialization's.  Raises
        MgxError when a dynamic program has run no specialization yet, or was released."""
        if self.executor is not None and (self.dispatcher is None or not self.executor.released):
            return self.executor
        last = self.dispatcher.last()
        if last is not None:
            return last.executor
        if self.dispatcher.released:
            raise MgxError("the program was released")
        raise MgxError("program is specialized at its first run (its shapes depend on run-time values)")

    @property
    def queue(self) -> int:
        """The queue (stream handle) runs use by default.  A dynamic-shape program has one for all its
        specializations (they are evicted under it, it stays) until :meth:`release`: the outputs of any
        ``run_async`` without a queue are ready on it; it exists before the first run too, also for a
        program whose shapes are known only then.  A ``run_async`` given a destroyed queue raises
        ParameterError; a released program raises MgxError."""
        if self.dispatcher is not None:
            return self.dispatcher.queue()
        return self.active_executor().ctx.queue

    @property
    def context(self):
        """The target context (``xp``, ``to_host``, ``synchronize``, ``runtime``, ...)."""
        return self.active_executor().ctx

    def param_buffer(self, name: str):
        """The program's own device buffer of parameter ``name`` (what ``run`` uploads into)."""
        return self.active_executor().param_buffers[name]

    @property
    def device_id(self) -> int:
        """The device the program runs on: the GPU id on ``gpu`` (``compile(..., device_id=N)``, else the
        device current at compile time), 0 on ``ref``."""
        if self.executor is not None:
            return self.executor.ctx.device_id
        last = self.dispatcher.last()
        if last is not None:
            return last.device_id
        if self.options.get("device_id") is not None or self.target == "ref":
            return self.options.get("device_id") or 0
        from ..runtime import device_runtime

        return device_runtime().hipGetDevice()

    # -- saving ------------------------------------------------------------------------------------
    def save(self, path) -> None:
        """Save the program to ``path`` (MIGraphX's ``.mxr``; see :mod:`mgx_graph.mxr.save_load`); load it with
        :func:`mgx_graph.load`.  A static program is saved as its IR after the passes, its literals, its
        compile options and target: loading runs no pass (kernels are re-selected, the memory plan
        recomputed, graphs captured anew).  A dynamic-shape program is saved as its ONNX model and
        compile options: its specializations compile again on load and on first use.  Raises
        CompileError naming what cannot be saved; OSError when ``path`` cannot be written."""
        if _saver is None:
            raise CompileError("no saver is registered: import mgx_graph (it registers mgx_graph.mxr.save_load)")
        _saver(self, path)

    # -- the compile result ------------------------------------------------------------------------
    @property
    def target(self) -> str:
        return self.result.target

    @property
    def hip_graph(self) -> bool:
        return self.result.hip_graph

    @property
    def fp16(self) -> bool:
        return self.result.fp16

    @property
    def alias(self) -> dict:
        """``{output name: parameter name}`` bound in place."""
        return self.result.alias

    @property
    def alias_skipped(self) -> dict:
        return self.result.alias_skipped

    @property
    def memory_plan(self):
        return self.result.memory_plan

    @property
    def host_fallback_ops(self) -> list:
        return self.result.host_fallback_ops

    @property
    def host_instructions(self) -> list:
        """The instructions that run on the host in place of a device kernel (``"module:@index op"``)."""
        return self.result.host_instructions

    # -- the IR ------------------------------------------------------------------------------------
    @property
    def modules(self) -> dict:
        return self.program.modules

    @property
    def metadata(self) -> dict:
        return self.program.metadata

    def get_main_module(self):
        return self.program.get_main_module()

    def module_order(self) -> list:
        return self.program.module_order()

    def get_parameter_names(self) -> list[str]:
        return self.program.get_parameter_names()

    def get_parameter_shapes(self) -> dict:
        return self.program.get_parameter_shapes()

    def get_output_shapes(self) -> list:
        return self.program.get_output_shapes()

    def get_output_names(self) -> list[str]:
        return self.program.get_output_names()

    def instruction_count(self) -> int:
        return self.program.instruction_count()

    def print(self, file=None) -> str:
        """The lowered program, one instruction per line (``graph_launch`` submodules included)."""
        return self.program.print(file)

    def __str__(self) -> str:
        return self.program.print()
