"""Compilation and execution API attached to :class:`mgx_graph.ir.Program`.

``Program.compile(target, ...)`` runs the pass pipeline and finalizes an executor on the target:

    eliminate_dead_code, propagate_constant, simplify_reshapes, fuse_norms, eliminate_dead_code,
    [quantize_fp16, propagate_constant], fuse_reduce, fuse_pointwise, eliminate_dead_code, [bind_outputs],
    lowering, [hip_graph], memory_coloring

``hip_graph=None`` reads ``MIGRAPHX_HIP_GRAPH`` once (on for 1/enable/enabled/yes/true).  With it off
no ``graph_launch`` exists anywhere and execution is the plain eager path.
"""
from __future__ import annotations

import os

from . import env
from .errors import CompileError, DeviceError, MgxError
from .executor import Executor
from .ir import Program
from .passes import PassContext, PassManager, PipelineOptions
from .passes.bind_outputs import detect_alias
from .targets import make_context, pipeline, resolve_target


OUT_OF_MEMORY = ("hipErrorOutOfMemory", "hipErrorMemoryAllocation")  # HIP's name; CUDA's, renamed by check()


def hip_graph_from_env() -> bool:
    """``MIGRAPHX_HIP_GRAPH`` as read once by MIGraphX-style env handling."""
    return env.enabled("MIGRAPHX_HIP_GRAPH")


def _compile(self: Program, target: str = "auto", *, hip_graph: bool | None = None, fp16: bool = False,
             alias: dict | str | None = "auto", warmup: int = 2, min_partition_size: int = 4,
             debug: bool | None = None, budget=None, host_ops=(), max_graphs: int | None = None,
             max_graph_bytes: int | None = None, capture_mode: str | None = None, validate: bool | None = None,
             gate_slower: bool | None = None, _label: str = "") -> Program:
    """Run the pass pipeline and lower the program to ``target`` (``ref``, ``gpu`` or ``auto``).

    Parameters
    ----------
    hip_graph: wrap capturable runs in ``graph_launch`` (None: read ``MIGRAPHX_HIP_GRAPH``).
    fp16: run in half precision (float32 literals, parameters and outputs become float16).
    alias: ``{output name: parameter name}`` to write outputs in place into parameters (KV cache);
        ``"auto"`` detects the pairs of a fixed-shape decode export; None or {} binds nothing.
    warmup: eager runs per graph key before capture (default 2).
    min_partition_size: fewest kernel launches a run needs to become a graph_launch region.
    debug: print the WARMUP/CAPTURE/REPLAY/FALLBACK trace (None: ``MIGRAPHX_HIP_GRAPH_DEBUG``).
    host_ops: op names to run on the host with explicit copies around them, as the gpu target does
        for ops it has no kernel for (host fallback); e.g. to rule out a suspect device kernel.
    max_graphs: graph execs kept per region (LRU; beyond it a new key updates the oldest exec) and
        captures per region over its lifetime (beyond it: eager); default ``MIGRAPHX_HIP_GRAPH_MAX`` or 8.
    max_graph_bytes: device memory for all graph execs (``MIGRAPHX_HIP_GRAPH_MAX_BYTES``, default 1 GiB).
    capture_mode: ``thread_local`` (default), ``global`` or ``relaxed`` (CUDA/HIP stream capture modes).
    validate: run eager next to the first replays of each key (and every 100th after) and compare;
        a mismatch disables the key (``MIGRAPHX_HIP_GRAPH_VALIDATE``).
    gate_slower: time the first replays against the warmups and stop using a graph that is slower.

    Raises CompileError (unknown/unusable target, impossible alias, or more memory than the device
    has: the message names the largest parameters / instructions and their bytes) or ShapeError.
    """
    if self._compiled is not None:
        raise CompileError("program is already compiled")
    tname = resolve_target(target)
    hip_graph = hip_graph_from_env() if hip_graph is None else bool(hip_graph)
    if alias == "auto":
        alias_map, strict = detect_alias(self, getattr(self, "metadata", None)), False
    else:
        alias_map, strict = dict(alias or {}), True
    options = PipelineOptions(fp16=fp16, hip_graph=hip_graph, alias=alias_map, strict_alias=strict,
                              host_ops=tuple(host_ops or ()), min_partition_size=min_partition_size)
    manager = PassManager(pipeline(tname, options), PassContext(tname))
    self.alias = {}
    manager.run(self)
    binder = manager.find("bind_outputs")
    self.alias_skipped = dict(binder.skipped) if binder is not None else {}
    if budget is None:
        from .graph_launch import GraphBudget, GraphOptions

        budget = GraphBudget(GraphOptions.from_env(warmup=warmup, debug=debug or None, max_graphs=max_graphs,
                                                   max_graph_bytes=max_graph_bytes, capture_mode=capture_mode,
                                                   validate=validate, gate_slower=gate_slower))
    ctx = make_context(tname)
    try:  # a failed finalize leaves nothing allocated and no queue open
        _check_memory(self, ctx)
        try:
            self._compiled = Executor(self, ctx, budget=budget, label=_label)
        except DeviceError as e:
            if e.code not in OUT_OF_MEMORY:
                raise
            raise CompileError(_memory_message(self, ctx, str(e))) from e
    except BaseException:
        ctx.close()
        raise
    self.target = tname
    self.hip_graph = hip_graph
    self.fp16 = fp16
    return self


def memory_demand(self: Program) -> tuple[int, dict, list]:
    """Device bytes a compiled (planned) program allocates at finalize: ``(total, {"scratch arena": n,
    "literals": n, "parameters": n}, [(bytes, what)] of the largest buffers, largest first)``."""
    plan = self.memory_plan
    params = [i for i in self.get_main_module().instructions if i.op.name == "@param"]
    pbytes = sum((p.shape.bytes() + 255) // 256 * 256 for p in params if p.shape.dtype != "object")
    parts = {"scratch arena": plan.arena_bytes, "literals": plan.literal_bytes, "parameters": pbytes}
    largest = [(p.shape.bytes(), f"parameter '{p.op.parameter}' {p.shape.brief()}") for p in params
               if p.shape.dtype != "object"] + list(plan.largest)
    largest.sort(key=lambda t: -t[0])
    return sum(parts.values()), parts, largest[:3]


def _memory_message(self: Program, ctx, detail: str) -> str:
    need, parts, largest = memory_demand(self)
    split = ", ".join(f"{k} {v}" for k, v in parts.items())
    big = "; ".join(f"{what}: {n} bytes" for n, what in largest)
    return f"the program needs {need} bytes of {ctx.name} memory ({split}): {detail}; largest: {big}"


def _check_memory(self: Program, ctx) -> None:
    """CompileError (naming the largest parameters / instructions) when the program needs more bytes than
    the device has in all (``hipMemGetInfo`` total; the host's physical memory on ``ref``)."""
    need = memory_demand(self)[0]
    total = ctx.runtime.hipMemGetInfo()[1]
    if need > total:
        raise CompileError(_memory_message(self, ctx, f"the device has {total} bytes in all"))


def _executor(self: Program) -> Executor:
    if self._compiled is None:
        d = getattr(self, "_dispatch", None)
        last = d.last() if d is not None else None
        if last is not None:
            return last._compiled
        if d is not None and d.released:
            raise MgxError("the program was released")
        raise MgxError("program is not compiled: call compile() first" if d is None else
                       "program is specialized at its first run (its shapes depend on run-time values)")
    return self._compiled


def _run(self: Program, params: dict) -> list:
    """Run with host (numpy) inputs; returns host copies of the outputs (blocks until done).

    ``params`` maps every parameter name to a numpy array of exactly the parameter's shape and dtype.
    Raises ParameterError naming the parameter and the expected vs given shape/dtype.
    """
    d = getattr(self, "_dispatch", None)
    if d is not None:
        return d.run(params, device=False)
    return _executor(self).run(params)


def _run_async(self: Program, params: dict, queue=None) -> list:
    """Run with device arrays (CuPy on ``gpu``, numpy on ``ref``) on ``queue`` (a stream handle, int;
    default: the context's queue) without synchronizing.  Returns device arrays that alias the
    program's output buffers: they are valid until the next run (copy them to keep them).

    A queue given here must outlive the program (its release synchronizes it); a release while a
    capture is open on it frees nothing until that capture ends."""
    d = getattr(self, "_dispatch", None)
    if d is not None:
        return d.run(params, device=True, queue=queue)
    return _executor(self).run_async(params, queue)


def _stats(self: Program) -> dict:
    """Counters: captures, replays, fallbacks, eager runs, warmups, launches per run (last run and
    eager), per-region details (instructions, graph nodes, keys, failure reasons), scratch bytes."""
    d = getattr(self, "_dispatch", None)
    if d is not None:
        return d.stats()
    return _executor(self).stats()


def _release(self: Program) -> None:
    """Synchronize, destroy graphs, free device memory.  Safe to call more than once; later runs raise
    MgxError.  While a capture is open on a queue the program used (its own, or one given to
    ``run_async``), the frees wait until that capture ends (``hipFree`` would invalidate it)."""
    d = getattr(self, "_dispatch", None)
    if d is not None:
        d.release()
    if self._compiled is not None:
        self._compiled.close()


def _queue(self: Program) -> int:
    return _executor(self).ctx.queue


def _context(self: Program):
    return _executor(self).ctx


def _is_compiled(self: Program) -> bool:
    return self._compiled is not None


def _param_buffer(self: Program, name: str):
    return _executor(self).param_buffers[name]


def _del(self):
    try:
        _release(self)
    except Exception:
        pass


Program.compile = _compile
Program.run = _run
Program.run_async = _run_async
Program.stats = _stats
Program.release = _release
Program.queue = property(_queue)
Program.context = property(_context)
Program.is_compiled = _is_compiled
Program.param_buffer = _param_buffer
Program.__del__ = _del


def compile(model, *, target: str = "auto", hip_graph: bool | None = None, input_dims: dict | None = None,
            default_dim_value: int = 1, dim_params: dict | None = None, fp16: bool = False,
            alias: dict | str | None = "auto", warmup: int = 2, min_partition_size: int = 4,
            debug: bool | None = None, external_data_dir: str | None = None, max_specializations: int = 8,
            host_ops=(), max_graphs: int | None = None, max_graph_bytes: int | None = None,
            capture_mode: str | None = None, validate: bool | None = None, gate_slower: bool | None = None) -> Program:
    """Parse an ONNX model and compile it for ``target``; see :func:`parse_onnx` and
    :meth:`Program.compile` for the parameters and the errors raised.

    When inputs have symbolic dims (not fixed by ``input_dims``) or shapes depend on data, the returned
    program dispatches each call to a specialization for that call's shapes and values (compiled on
    first use, at most ``max_specializations`` kept; see :mod:`mgx_graph.dynamic`).
    """
    from .dynamic import Dispatcher
    from .onnx import load_model, parse_onnx, symbolic_inputs
    from .operators.dynamic import NeedsValue

    proto = load_model(model, external_data_dir)
    parse_kw = dict(default_dim_value=default_dim_value, dim_params=dim_params)
    try:
        prog = parse_onnx(proto, input_dims=input_dims, **parse_kw)
    except NeedsValue:
        prog = None
    except MemoryError as e:  # e.g. a huge constant folded on the host
        raise CompileError(f"out of host memory while parsing the model ({e})") from None
    symbolic = symbolic_inputs(proto, input_dims)
    if dim_params:
        symbolic = {}  # every symbolic dim is given a value
    tname = resolve_target(target)
    hip_graph = hip_graph_from_env() if hip_graph is None else bool(hip_graph)
    from .graph_launch import GraphBudget, GraphOptions

    budget = GraphBudget(GraphOptions.from_env(warmup=warmup, debug=debug or None, max_graphs=max_graphs,
                                               max_graph_bytes=max_graph_bytes, capture_mode=capture_mode,
                                               validate=validate, gate_slower=gate_slower))
    ckw = dict(hip_graph=hip_graph, fp16=fp16, warmup=warmup, min_partition_size=min_partition_size, debug=debug,
               budget=budget, host_ops=tuple(host_ops))
    if prog is not None and not symbolic:
        return prog.compile(tname, alias=alias, **ckw)
    if alias not in (None, "auto", {}):
        raise CompileError("alias (outputs written in place) needs static shapes; this model has run-time shapes "
                           f"(symbolic inputs: {sorted(symbolic)})")
    disp = Dispatcher(proto, parse_kw, ckw, tname, max_specializations=max_specializations, debug=bool(debug))
    if prog is None:
        prog = Program()
        prog.metadata = {}
    else:
        prog.compile(tname, alias=None, _label="[spec 0] ", **ckw)
        shapes = tuple(sorted((n, tuple(s.lens)) for n, s in prog.get_parameter_shapes().items()))
        disp._insert(shapes, {}, prog)
    prog._dispatch = disp
    return prog
