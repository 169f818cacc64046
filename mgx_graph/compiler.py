"""Compiling a program: the target's pass pipeline, the typed result, and the executor.

:func:`compile_program` (what ``Program.compile(target, ...)`` calls) runs the target's pipeline
through the pass manager (``mgx_graph/targets/ref.py`` / ``gpu.py`` ``pipeline()``):

    simplify: eliminate_dead_code, propagate_constant, simplify_reshapes
    fuse: fuse_norms, eliminate_dead_code
    precision (fp16): quantize_fp16, propagate_constant
    fuse_kernels: fuse_attention, fuse_reduce, fuse_pointwise, eliminate_dead_code
    outputs: bind_outputs
    lower: lowering
    graph (hip_graph): hip_graph
    memory: memory_coloring

which fills a :class:`~mgx_graph.passes.compile_result.CompileResult`, then finalizes an
:class:`~mgx_graph.exec.executor.Executor` on the target and returns a
:class:`~mgx_graph.exec.compiled.CompiledProgram`.  :func:`compile` parses an ONNX model first and returns
a dynamic-shape program (a dispatcher of specializations) when shapes are not all known.

``hip_graph=None`` reads ``MIGRAPHX_HIP_GRAPH`` once (on for 1/enable/enabled/yes/true).  With it off
no ``graph_launch`` exists anywhere and execution is the plain eager path.
"""
from __future__ import annotations

from typing import Any

from . import settings as mgx_settings
from .dynamic import Dispatcher
from .errors import CompileError, DeviceError, ParameterError
from .exec.compiled import CompiledProgram
from .exec.executor import Executor
from .graph.cache import GraphBudget, GraphOptions
from .ir.program import Program, register_compiler
from .onnx import load_model, parse_onnx, symbolic_inputs
from .operators.dynamic import NeedsValue
from .passes import PassContext, PassManager, PipelineOptions
from .passes.bind_outputs import detect_alias
from .passes.compile_result import CompileResult
from .passes.share_literals import LiteralTable
from .targets import make_context, pipeline, resolve_device, resolve_target


OUT_OF_MEMORY = ("hipErrorOutOfMemory", "hipErrorMemoryAllocation")  # HIP's name; CUDA's, renamed by check()


def hip_graph_from_env() -> bool:
    """``MIGRAPHX_HIP_GRAPH`` as read once by MIGraphX-style env handling (:mod:`mgx_graph.settings`)."""
    return mgx_settings.current().hip_graph


GRAPH_OPTIONS = ("warmup", "debug", "max_graphs", "max_graph_bytes", "capture_mode", "validate", "gate_slower")


def compile_program(program: Program, target: str = "auto", *, hip_graph: bool | None = None, fp16: bool = False,
                    alias: dict | str | None = "auto", warmup: int = 2, min_partition_size: int = 4,
                    debug: bool | None = None, budget=None, host_ops=(), max_graphs: int | None = None,
                    max_graph_bytes: int | None = None, capture_mode: str | None = None,
                    validate: bool | None = None, gate_slower: bool | None = None,
                    device_id: int | None = None, share_literals=None, _label: str = "",
                    _queue: int | None = None) -> CompiledProgram:
    """Run the pass pipeline over ``program`` (in place), lower it to ``target`` (``ref``, ``gpu`` or
    ``auto``) and finalize it; returns the :class:`~mgx_graph.exec.compiled.CompiledProgram`.

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
    device_id: the GPU the program's queue, memory and library handles live on (None: the current
        device; ``ref``: only 0).
    share_literals: a compiled static program of the same target and device whose literals this one
        reads from that program's memory where they hold the same bytes (the ``share_literals`` pass:
        a decoder's prefill programs and its decode step keep one copy of the weights).  Releasing that
        program releases this one.

    Raises CompileError (unknown/unusable target, impossible alias, a program lowered already, a
    device_id other than 0 on ``ref``, or more memory than the device has: the message names the
    largest parameters / instructions and their bytes), DeviceError (a device_id out of range, naming
    it and the device count) or ShapeError.  A failed compile leaves nothing allocated.
    """
    if any("kernel" in i.meta for m in program.module_order() for i in m.instructions):
        raise CompileError("program is already compiled")
    tname = resolve_target(target)
    device_id = resolve_device(tname, device_id)
    hip_graph = hip_graph_from_env() if hip_graph is None else bool(hip_graph)
    given = dict(hip_graph=hip_graph, fp16=bool(fp16), alias=alias, min_partition_size=min_partition_size,
                 host_ops=tuple(host_ops or ()), device_id=device_id, warmup=warmup, debug=debug,
                 max_graphs=max_graphs, max_graph_bytes=max_graph_bytes, capture_mode=capture_mode,
                 validate=validate, gate_slower=gate_slower)
    if alias == "auto":
        alias_map, strict = detect_alias(program, program.metadata), False
    elif isinstance(alias, str):
        raise ParameterError(f"alias must be a dict, None or 'auto', got {alias!r}")
    else:
        alias_map, strict = dict(alias or {}), True
    table = literal_table(share_literals, tname, device_id)
    if table is not None and device_id is None and tname != "ref":
        device_id = table.owner.ctx.device_id  # the device of the memory it reads
    options = PipelineOptions(fp16=fp16, hip_graph=hip_graph, alias=alias_map, strict_alias=strict,
                              host_ops=tuple(host_ops or ()), min_partition_size=min_partition_size,
                              shared_literals=table)
    pctx = PassContext(tname, CompileResult(target=tname, hip_graph=hip_graph, fp16=bool(fp16), shared_literals=table),
                       settings=mgx_settings.current())  # the table this compile hands down
    PassManager(pipeline(tname, options), pctx).run(program)
    if budget is None:
        budget = graph_budget(given)
    executor = finalize(program, pctx.result, device_id, budget, _label, queue=_queue)
    return CompiledProgram(program, pctx.result, executor=executor, options=given)


def literal_table(owner, target: str, device_id: int | None) -> LiteralTable | None:
    """The :class:`~mgx_graph.passes.share_literals.LiteralTable` of ``owner`` (a compiled static program
    on ``target`` and ``device_id``; None gives None).  Raises ParameterError for anything else, or a
    program released."""
    if owner is None:
        return None
    ex = getattr(owner, "executor", None)
    if not isinstance(owner, CompiledProgram) or ex is None or owner.dispatcher is not None:
        raise ParameterError(f"share_literals must be a compiled static program (mgx_graph.compile with fixed "
                             f"shapes), got {owner!r:.80}")
    if ex.released:
        raise ParameterError("share_literals: the program was released")
    if owner.result.target != target or (device_id is not None and ex.ctx.device_id != device_id):
        raise ParameterError(f"share_literals: the program runs on {owner.result.target} device {ex.ctx.device_id}, "
                             f"this one is compiled for {target} device {device_id}")
    table = LiteralTable(owner.program, owner=ex)
    table.holder = owner  # the program stays alive while a program reading its literals does
    return table


def graph_budget(options: dict) -> GraphBudget:
    """The graph budget of a program compiled with ``options`` (the keyword options of
    :func:`compile_program`; MIGRAPHX_* variables give what they leave None)."""
    given = {k: options.get(k) for k in GRAPH_OPTIONS}
    given["debug"] = given["debug"] or None
    return GraphBudget(GraphOptions.from_env(**given))


def finalize(program: Program, result: CompileResult, device_id: int | None, budget: GraphBudget,
             label: str = "", queue: int | None = None) -> Executor:
    """Make the context of ``result.target`` on ``device_id`` and the :class:`Executor` of the lowered,
    planned ``program``: memory allocated, literals uploaded, ops with submodules finalized.  ``queue``:
    the queue the context runs on, kept by the caller (a dynamic program's), or None for its own.  Raises
    CompileError when the program needs more memory than the device has (or an allocation runs out);
    a failure leaves nothing allocated and no queue open."""
    ctx = make_context(result.target, device_id=device_id, queue=queue)
    try:
        _check_memory(program, result, ctx)
        try:
            return Executor(program, result, ctx, budget=budget, label=label)
        except DeviceError as e:
            if e.code not in OUT_OF_MEMORY:
                raise
            raise CompileError(_memory_message(program, result, ctx, str(e))) from e
    except BaseException:
        ctx.close()
        raise


def memory_demand(program: Program, result: CompileResult) -> tuple[int, dict, list]:
    """Device bytes a compiled (planned) program allocates at finalize: ``(total, {"scratch arena": n,
    "literals": n, "parameters": n}, [(bytes, what)] of the largest buffers, largest first)``."""
    plan = result.memory_plan
    if plan is None:
        raise CompileError("memory_demand needs a compiled program (its memory plan is not made yet)")
    params = [i for i in program.get_main_module().instructions if i.op.name == "@param"]
    pbytes = sum((p.shape.bytes() + 255) // 256 * 256 for p in params if p.shape.dtype != "object")
    parts = {"scratch arena": plan.arena_bytes, "literals": plan.literal_bytes, "parameters": pbytes}
    largest = [(p.shape.bytes(), f"parameter '{p.op.parameter}' {p.shape.brief()}") for p in params
               if p.shape.dtype != "object"] + list(plan.largest)
    largest.sort(key=lambda t: -t[0])
    return sum(parts.values()), parts, largest[:3]


def _memory_message(program: Program, result: CompileResult, ctx, detail: str) -> str:
    need, parts, largest = memory_demand(program, result)
    split = ", ".join(f"{k} {v}" for k, v in parts.items())
    big = "; ".join(f"{what}: {n} bytes" for n, what in largest)
    return f"the program needs {need} bytes of {ctx.name} memory ({split}): {detail}; largest: {big}"


def _check_memory(program: Program, result: CompileResult, ctx) -> None:
    """CompileError (naming the largest parameters / instructions) when the program needs more bytes than
    the device has in all (``hipMemGetInfo`` total; the host's physical memory on ``ref``)."""
    need = memory_demand(program, result)[0]
    total = ctx.memory_info()[1]
    if need > total:
        raise CompileError(_memory_message(program, result, ctx, f"the device has {total} bytes in all"))


def compile(model, *, target: str = "auto", hip_graph: bool | None = None, input_dims: dict | None = None,
            default_dim_value: int = 1, dim_params: dict | None = None, fp16: bool = False,
            alias: dict | str | None = "auto", warmup: int = 2, min_partition_size: int = 4,
            debug: bool | None = None, external_data_dir: str | None = None, max_specializations: int = 8,
            host_ops=(), max_graphs: int | None = None, max_graph_bytes: int | None = None,
            capture_mode: str | None = None, validate: bool | None = None,
            gate_slower: bool | None = None, device_id: int | None = None, share_literals=None) -> CompiledProgram:
    """Parse an ONNX model and compile it for ``target``; see :func:`parse_onnx` and
    :func:`compile_program` for the parameters and the errors raised (``share_literals`` needs a model
    whose shapes are all known: CompileError otherwise).  Returns a
    :class:`~mgx_graph.exec.compiled.CompiledProgram`.

    When inputs have symbolic dims (not fixed by ``input_dims``) or shapes depend on data, the returned
    program dispatches each call to a specialization for that call's shapes and values (compiled on
    first use, at most ``max_specializations`` kept; see :mod:`mgx_graph.dynamic`).
    """
    tname = resolve_target(target)
    device_id = resolve_device(tname, device_id)
    proto = load_model(model, external_data_dir)
    parse_kw: dict[str, Any] = dict(default_dim_value=default_dim_value, dim_params=dim_params)
    try:
        prog = parse_onnx(proto, input_dims=input_dims, **parse_kw)
    except NeedsValue:
        prog = None
    except MemoryError as e:  # e.g. a huge constant folded on the host
        raise CompileError(f"out of host memory while parsing the model ({e})") from None
    symbolic = symbolic_inputs(proto, input_dims)
    if dim_params:
        symbolic = {}  # every symbolic dim is given a value
    hip_graph = hip_graph_from_env() if hip_graph is None else bool(hip_graph)
    graph: dict[str, Any] = dict(warmup=warmup, debug=debug, max_graphs=max_graphs, max_graph_bytes=max_graph_bytes,
                 capture_mode=capture_mode, validate=validate, gate_slower=gate_slower)
    ckw: dict[str, Any] = dict(hip_graph=hip_graph, fp16=fp16, min_partition_size=min_partition_size, budget=graph_budget(graph),
               host_ops=tuple(host_ops), device_id=device_id, **graph)
    if prog is not None and not symbolic:
        return compile_program(prog, tname, alias=alias, share_literals=share_literals, **ckw)
    if share_literals is not None:
        raise CompileError(f"share_literals needs static shapes; this model has run-time shapes (symbolic "
                           f"inputs: {sorted(symbolic)})")
    if alias not in (None, "auto", {}):
        raise CompileError("alias (outputs written in place) needs static shapes; this model has run-time shapes "
                           f"(symbolic inputs: {sorted(symbolic)})")
    options = dict(target=tname, input_dims=input_dims, default_dim_value=default_dim_value, dim_params=dim_params,
                   alias=alias, max_specializations=max_specializations,
                   **{k: v for k, v in ckw.items() if k != "budget"})
    disp = Dispatcher(proto, parse_kw, ckw, tname, compile_program, max_specializations=max_specializations, debug=bool(debug))
    if prog is None:
        return CompiledProgram(Program(), CompileResult(target=tname, hip_graph=hip_graph, fp16=bool(fp16)),
                               dispatcher=disp, options=options)
    try:
        spec0 = compile_program(prog, tname, alias=None, _label="[spec 0] ", _queue=disp.queue(), **ckw)
    except BaseException:
        disp.release()  # its queue: a failed compile leaves nothing open
        raise
    shapes = tuple(sorted((n, tuple(s.lens)) for n, s in prog.get_parameter_shapes().items()))
    disp._insert(shapes, {}, spec0)
    return CompiledProgram(prog, spec0.result, executor=spec0.executor, dispatcher=disp, options=options)


register_compiler(compile_program)  # Program.compile runs compile_program
