"""The steps of the eval loop: one small builder per kind of instruction, chosen from a table.

A step is ``step(env, queue)``: it issues one instruction on ``queue``, reading its inputs from and
writing its result to ``env`` (the slot values, :mod:`mgx_graph.exec.program_buffers`).  :func:`step_kind`
names the kind of an instruction from what it is, never from its op name:

``kernel``          a device kernel whose inputs or output are bound per call (read from ``env`` per run);
``static_kernel``   a device kernel over fixed buffers only (its arrays resolved once, here);
``host``            a host-fallback kernel (numpy on host buffers);
``view``            a view of a movable value (computed per run; views of fixed values need no step);
``guard``, ``copy_from_gpu``, ``copy_to_gpu``: the kinds those ops declare (``Operation.step_kind``);
``modules``         an op with submodules (``if``, ``loop``, ``graph_launch``): finalized here, run by
                    its own ``compute_modules`` through the eval loop's ``run`` callback.

:data:`STEP_BUILDERS` maps each kind to its builder; a builder returns ``(step, launches)``, the
launches being the device kernels one run of the step issues (for ``launches_per_run``).
"""
from __future__ import annotations

from operator import is_

import numpy as np

from ..errors import ExecutionError
from ..operators.base import HOST
from ..operators.dynamic import SpecializationMiss
from ..passes.analysis import on_host
from .program_buffers import host_value, slot_getter


class StepContext:
    """What the builders read: the target context ``ctx``, the program's ``buffers``
    (:class:`~mgx_graph.exec.program_buffers.ProgramBuffers`), the eval loop's ``run`` callback, and
    ``states``, where the states of finalized ops with submodules are collected."""

    def __init__(self, ctx, buffers, run, states: list):
        self.ctx, self.buffers, self.run, self.states = ctx, buffers, run, states
        self.env, self.slot, self.movable = buffers.env, buffers.slot, buffers.movable

    def slots(self, ins) -> tuple[int, list[int]]:
        """The slot of ``ins`` and the slots of its inputs."""
        return self.slot[id(ins)], [self.slot[id(i)] for i in ins.inputs]

    def workspace(self, ins, kernel) -> list:
        """The kernel's scratch buffers: arena arrays at the planned offsets."""
        offsets = self.buffers.plan.workspace.get(id(ins), [])
        return [self.ctx.array(self.buffers.arena, o, s) for o, s in zip(offsets, kernel.workspace)]


def step_kind(ins, movable: set) -> str | None:
    """The step kind of instruction ``ins`` (see the module docstring); None when it needs no step
    (builtins, views of fixed values)."""
    op = ins.op
    if op.builtin:
        return None
    if ins.module_inputs:
        return "modules"
    if op.step_kind is not None:
        return op.step_kind
    if op.is_view:
        return "view" if id(ins) in movable else None
    if on_host(ins):
        return "host"
    fixed = id(ins) not in movable and not any(id(i) in movable for i in ins.inputs)
    return "static_kernel" if fixed and getattr(op, "on_launch", None) is None else "kernel"


def _kernel(sc: StepContext, ins):
    out, in_slots = sc.slots(ins)
    k = ins.meta["kernel"]
    launch, fn, ws, ctx = sc.ctx.launch, k.fn, sc.workspace(ins, k), sc.ctx
    hook = getattr(ins.op, "on_launch", None)
    if hook is None:
        def step(env, queue):
            launch(queue, fn, env[out], [env[s] for s in in_slots], ws)
    else:
        def step(env, queue):
            hook(ctx, queue)
            launch(queue, fn, env[out], [env[s] for s in in_slots], ws)
    return step, k.launches


def _static_kernel(sc: StepContext, ins):
    out, in_slots = sc.slots(ins)
    k = ins.meta["kernel"]
    launch, fn, ws = sc.ctx.launch, k.fn, sc.workspace(ins, k)
    dst, args = sc.env[out], [sc.env[s] for s in in_slots]

    def step(env, queue):
        launch(queue, fn, dst, args, ws)

    return step, k.launches


def _host(sc: StepContext, ins):
    out, in_slots = sc.slots(ins)
    k = ins.meta["kernel"]
    fn, ws = k.fn, [host_value(s) for s in k.workspace]

    def step(env, queue):
        fn(HOST, env[out], [env[s] for s in in_slots], ws)

    return step, 0


def _view(sc: StepContext, ins):
    out, (src, *_) = sc.slots(ins)
    view, xp, shape = ins.op.view, sc.ctx.xp, ins.shape

    def step(env, queue):
        env[out] = view(xp, env[src], shape)

    return step, 0


def view_group(sc: StepContext, members: list, labels: list, loop):
    """One step for consecutive view instructions ``members`` (their ``labels`` name a failing one).

    The views are remade only when a source from outside the group is another object than at the
    last remake, or ``loop.epoch`` changed (a parameter was bound anew, and its layout may differ);
    else their slots still hold the views of the same sources (only this step and the members' own
    steps write them).  The memo is listed in ``loop.memos`` (reset when the program is released).
    A view that fails raises ExecutionError naming its instruction."""
    xp = sc.ctx.xp
    items = []
    for ins in members:
        out, (src, *_) = sc.slots(ins)
        items.append((out, src, ins.op.view, ins.shape))
    made = {out for out, *_ in items}
    sources = slot_getter(sorted({src for _, src, _, _ in items if src not in made}))
    memo = [-1, ()]  # (epoch, sources) of the last remake
    loop.memos.append(memo)

    def step(env, queue):
        srcs = sources(env)
        if memo[0] == loop.epoch and all(map(is_, srcs, memo[1])):
            return
        memo[0] = -1
        for k, (out, src, view, shape) in enumerate(items):
            try:
                env[out] = view(xp, env[src], shape)
            except Exception as e:
                raise ExecutionError(f"instruction {labels[k]}: {type(e).__name__}: {e}") from e
        memo[0], memo[1] = loop.epoch, srcs

    return step


def _guard(sc: StepContext, ins):
    out, (src, *_) = sc.slots(ins)
    op, ctx = ins.op, sc.ctx
    expected = op.expected

    def step(env, queue):
        x = env[src]
        observed = op.observe(ctx.to_host(x, queue))
        if observed.shape != expected.shape or not np.array_equal(observed, expected):
            raise SpecializationMiss(op.key, observed, expected)
        env[out] = x

    return step, 0


def _copy_from_gpu(sc: StepContext, ins):
    out, (src, *_) = sc.slots(ins)
    ctx = sc.ctx

    def step(env, queue):
        dst = env[out]
        dst[...] = ctx.to_host(env[src], queue)

    return step, 0


def _copy_to_gpu(sc: StepContext, ins):
    out, (src, *_) = sc.slots(ins)
    ctx = sc.ctx

    def step(env, queue):
        ctx.copy_from_host(env[out], env[src], queue)

    return step, 1


def _modules(sc: StepContext, ins):
    """Finalize the op (its state, if it has one, is reported and released with the program), then run
    it through its ``compute_modules`` with the eval loop's ``run`` callback.  An op with
    ``call_inputs()`` gets only those inputs as ``args`` (one C call reads them)."""
    out, in_slots = sc.slots(ins)
    op, ctx, run, mods = ins.op, sc.ctx, sc.run, list(ins.module_inputs)
    state = op.finalize(ctx, ins, run)
    if state is not None:
        sc.states.append(state)
    compute = op.compute_modules
    picks = op.call_inputs()
    if picks is not None:
        read = slot_getter([in_slots[k] for k in picks])

        def step(env, queue):
            env[out] = compute(ctx, queue, env[out], read(env), mods, run)

        return step, 0

    def step_all(env, queue):
        env[out] = compute(ctx, queue, env[out], [env[s] for s in in_slots], mods, run)

    return step_all, 0


STEP_BUILDERS = {
    "kernel": _kernel,
    "static_kernel": _static_kernel,
    "host": _host,
    "view": _view,
    "guard": _guard,
    "copy_from_gpu": _copy_from_gpu,
    "copy_to_gpu": _copy_to_gpu,
    "modules": _modules,
}
