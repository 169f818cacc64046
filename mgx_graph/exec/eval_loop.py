"""The eval loop of a compiled program: every module as a list of steps, issued in order.

Each module's instructions become steps through the table of :mod:`mgx_graph.exec.steps`.  A run issues
the steps of ``main`` on the queue with no host synchronization between instructions; only the
instructions that need the host synchronize (``if`` and ``loop`` read their condition and trip
count, ``copy_from_gpu`` before a host-fallback op, ``guard``).  Ops with submodules (``if``,
``loop``, ``graph_launch``) get the loop's :class:`ModuleRunner` as their ``run`` callback: the op
decides which module runs and how often (a ``graph_launch`` warms up, captures and replays through
its own state), the callback runs it.

A plain run issues a module's steps with every run of consecutive view steps taken as one step
(:func:`mgx_graph.exec.steps.view_group`: the views are made again only when a source changed), so the
views over a region's tuple of results cost one step; a capture, ``profile_steps`` and the step
labels see every instruction's own step.  ``epoch`` counts the executor's full binds of the
parameters: within one epoch the parameter objects and their layouts are unchanged (see
:mod:`mgx_graph.graph.replay`), which lets a step reuse what it derived from them.
"""
from __future__ import annotations

from ..errors import ExecutionError, MgxError
from ..operators.dynamic import SpecializationMiss
from .program_buffers import slot_getter
from .steps import STEP_BUILDERS, StepContext, step_kind, view_group


class ModuleRunner:
    """The ``run`` callback the eval loop passes to every op with submodules.

    ``run(module, queue, params=None, capture=False)`` binds ``params`` (``{parameter name: array}``)
    to the module's parameters, issues the module's steps on ``queue`` (for a capture: under the
    context's capture guard, launches not counted) and returns the module's return values (a list).
    The rest serves ``finalize``: :meth:`value` (an instruction's current value), :meth:`moves`
    (whether it is bound per call), :meth:`bind`, :meth:`outputs`, :meth:`add_launches` (kernels an op
    issues itself: copies, graph launches), and the program's graph ``budget`` and region ``label``.
    """

    def __init__(self, loop: "EvalLoop", buffers, budget, label: str):
        self._loop, self._buffers = loop, buffers
        self._env, slot = buffers.env, buffers.slot
        self._params = {m.name: {i.op.parameter: slot[id(i)] for i in m.instructions if i.op.name == "@param"}
                        for m in buffers.modules}
        self._returns = {m.name: slot_getter([slot[id(i)] for i in m.get_return().inputs] if m.get_return() else [])
                         for m in buffers.modules}
        self.budget, self.label = budget, label

    @property
    def epoch(self) -> int:
        """The eval loop's bind epoch (see :class:`EvalLoop`)."""
        return self._loop.epoch

    def __call__(self, module, queue, params=None, capture: bool = False) -> list:
        if params:
            self.bind(module, params)
        loop = self._loop
        loop.run_module(module.name, queue, capture=capture)
        if not capture:
            loop.launches += loop.launch_totals[module.name]
        return self.outputs(module)

    def bind(self, module, params: dict) -> None:
        """Make ``module``'s parameters named in ``params`` read those arrays."""
        slots, env = self._params[module.name], self._env
        for name, a in params.items():
            env[slots[name]] = a

    def outputs(self, module) -> list:
        """The current return values of ``module`` (a new list)."""
        return list(self._returns[module.name](self._env))

    def returns_of(self, module):
        """``read(env)``: the return values of ``module`` in ``env`` (a tuple), in one C call."""
        return self._returns[module.name]

    def value(self, ins):
        """The current value of instruction ``ins`` (an array, a tuple of arrays, or None)."""
        return self._buffers.value(ins)

    def moves(self, ins) -> bool:
        """Whether the value of ``ins`` is bound per call (its pointer may change between calls)."""
        return id(ins) in self._buffers.movable

    def add_launches(self, n: int) -> None:
        self._loop.launches += n


class EvalLoop:
    """The steps of every module of one finalized program.

    ``steps[name]`` / ``labels[name]`` (``"<module>:@<n> <op>"``) per module, ``launch_totals[name]``
    the kernels one eager run of the module issues itself, ``states`` the states of finalized ops
    with submodules (the ``graph_launch`` regions), ``launches`` the kernels of the current run;
    ``plain[name]`` / ``plain_labels[name]`` the steps of a plain run (consecutive views grouped);
    ``epoch`` the number of full parameter binds so far (the executor counts them).
    Building finalizes every op with submodules (parents first).
    """

    def __init__(self, ctx, buffers, budget, label: str = ""):
        self.ctx, self.env = ctx, buffers.env
        self.steps: dict[str, list] = {}
        self.labels: dict[str, list] = {}
        self.launch_totals: dict[str, int] = {}
        self.plain: dict[str, list] = {}
        self.plain_labels: dict[str, list] = {}
        self.states: list = []
        self.launches = 0
        self.epoch = 0
        self.memos: list = []  # [epoch, sources] of every view group
        self.runner = ModuleRunner(self, buffers, budget, label)
        sc = StepContext(ctx, buffers, self.runner, self.states)
        for m in buffers.modules:
            self._build(m, sc)

    def _build(self, m, sc: StepContext) -> None:
        steps, labels, total, views = [], [], 0, []
        plain: list = []
        plain_labels: list = []
        for n, ins in enumerate(m.instructions):
            kind = step_kind(ins, sc.movable)
            if kind is None:
                continue
            step, launches = STEP_BUILDERS[kind](sc, ins)
            steps.append(step)
            labels.append(f"{m.name}:@{n} {ins.op}")
            total += launches
            if kind == "view":
                views.append((ins, step, labels[-1]))
                continue
            self._flush_views(sc, views, plain, plain_labels)
            plain.append(step)
            plain_labels.append(labels[-1])
        self._flush_views(sc, views, plain, plain_labels)
        self.steps[m.name], self.labels[m.name], self.launch_totals[m.name] = steps, labels, total
        self.plain[m.name], self.plain_labels[m.name] = plain, plain_labels

    def _flush_views(self, sc: StepContext, views: list, plain: list, plain_labels: list) -> None:
        """Append the pending view steps to a plain run's steps (two or more as one group)."""
        if len(views) == 1:
            plain.append(views[0][1])
            plain_labels.append(views[0][2])
        elif views:
            plain.append(view_group(sc, [ins for ins, _, _ in views], [lab for _, _, lab in views], self))
            plain_labels.append(f"{views[0][2]} (+{len(views) - 1} views)")
        views.clear()

    def run(self, main, queue) -> list:
        """One run of ``main`` on ``queue``; returns its outputs (the arrays in their slots)."""
        self.launches = 0
        return self.runner(main, queue)

    def run_module(self, name: str, queue, capture: bool = False) -> None:
        """Issue the steps of module ``name`` on ``queue``.  An error other than the typed ones is an
        ExecutionError naming the instruction; during a capture errors propagate as they are (the
        graph cache ends the capture and falls back)."""
        env = self.env
        if capture:
            guard = getattr(self.ctx, "set_guard_where", None)
            with self.ctx.capture_guard(name):
                for step, label in zip(self.steps[name], self.labels[name]):
                    if guard is not None:
                        guard(label)
                    step(env, queue)
            return
        k = 0
        try:
            for k, step in enumerate(self.plain[name]):
                step(env, queue)
        except (MgxError, SpecializationMiss, KeyboardInterrupt):
            raise
        except Exception as e:
            raise ExecutionError(f"instruction {self.plain_labels[name][k]}: {type(e).__name__}: {e}") from e

    def forget(self) -> None:
        """Drop what the view groups remember (references to the last call's values)."""
        for memo in self.memos:
            memo[0], memo[1] = -1, ()

    def walk(self, name: str, queue) -> None:
        """Go through the steps of module ``name`` running none of them (a dry run)."""
        env = self.env
        for _ in self.steps[name]:
            _nothing(env, queue)


def _nothing(env, queue) -> None:
    return None
