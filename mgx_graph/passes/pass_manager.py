"""The pass manager: runs a target's pipeline of compiler passes over a program, as MIGraphX's
``run_passes`` (``src/pass_manager.cpp``).

A pass is a :class:`Pass`: a ``name`` and ``apply(program, ctx)``, which rewrites the program in
place (a :class:`ModulePass` does it module by module).  A target declares its pipeline as named
:class:`PassGroup` s (``simplify``, ``fuse``, ``precision``, ``alias``, ``lower``, ``graph``,
``memory``), the compile options selecting which groups run (see ``mgx_graph/targets/ref.py`` and
``gpu.py``).  :class:`PassManager` runs the selected passes in order and, after each one:

* validates the program (:func:`mgx_graph.passes.validate.validate_program`), raising
  :class:`~mgx_graph.passes.validate.InvalidProgram` (a CompileError) naming the pass that broke it and
  the instruction at fault.  On by default (the input program is checked too);
  ``MIGRAPHX_DISABLE_VALIDATE_PASSES=1`` or ``validate=False`` turns it off;
* logs ``Pass: <name>`` and the program with ``MIGRAPHX_TRACE_COMPILE``;
* logs ``Pass <name>: <ms>ms`` with ``MIGRAPHX_TIME_PASSES`` (the pass alone), then a last line with
  the time all validations took.

Those lines go to the ``mgx_graph.compile`` logger, which then prints them to stderr
(:func:`mgx_graph.settings.trace_logger`).  The passes run with the pass context's settings active
(:func:`mgx_graph.settings.using`): the kernel switches the lowering reads are those of this compile.

``MIGRAPHX_DISABLE_PASSES=name,...`` skips the passes or groups named (for A/B runs).  ``lowering``
and ``memory_coloring`` cannot be skipped (the executor needs kernels and a memory plan); a name
that is neither a pass nor a group of the pipeline is a CompileError, so a typo never goes unnoticed.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from .. import settings as mgx_settings
from ..errors import CompileError
from .compile_result import CompileResult
from .validate import InvalidProgram, validate_program


@dataclass
class PassContext:
    """What a pass may read besides the program, and where it writes what it found.

    target: the name of the target compiled for (``ref`` or ``gpu``).
    result: the :class:`~mgx_graph.passes.compile_result.CompileResult` the passes fill (memory plan,
        host-fallback ops, outputs bound in place); a fresh one for ``target`` when not given.
    settings: the :class:`~mgx_graph.settings.Settings` of this compile (default: the result's, else the
        process's, :func:`mgx_graph.settings.current`); the result keeps the same object.
    """

    target: str = "ref"
    result: CompileResult = None  # type: ignore[assignment]  # None: a fresh one for target, made by __post_init__
    settings: mgx_settings.Settings = None  # type: ignore[assignment]  # None: the process's table, set by __post_init__

    def __post_init__(self):
        if self.result is None:
            self.result = CompileResult(target=self.target)
        if self.settings is None:
            self.settings = self.result.settings or mgx_settings.current()
        self.result.settings = self.settings


class Pass:
    """A compiler pass: ``name`` and ``apply(program, ctx)``, which rewrites ``program`` (a
    :class:`mgx_graph.ir.Program`) in place and returns None.  ``required`` marks a pass whose result
    the executor needs (``MIGRAPHX_DISABLE_PASSES`` may not skip it)."""

    name = "?"
    required = False

    def apply(self, program, ctx: PassContext) -> None:
        raise NotImplementedError(self.name)

    def __call__(self, program, ctx: PassContext | None = None) -> None:
        """Run this pass alone (no validation, trace or timing)."""
        self.apply(program, ctx if ctx is not None else PassContext())

    def __repr__(self) -> str:
        return f"<pass {self.name}>"


class ModulePass(Pass):
    """A pass that rewrites each module on its own: ``apply`` runs :meth:`apply_module` over the
    program's modules, parents first (``Program.module_order``, taken once: modules the pass creates
    are not visited)."""

    def apply(self, program, ctx: PassContext) -> None:
        for m in program.module_order():
            self.apply_module(m, ctx)

    def apply_module(self, module, ctx: PassContext) -> None:
        raise NotImplementedError(self.name)


@dataclass
class PassGroup:
    """A named step of a pipeline: its passes run in order when ``enabled`` (chosen by an option)."""

    name: str
    passes: list
    enabled: bool = True


@dataclass(frozen=True)
class PipelineOptions:
    """The compile options that select groups and passes of a target's pipeline.

    fp16: add the ``precision`` group (quantize_fp16, propagate_constant).
    hip_graph: add the ``graph`` group (hip_graph, with ``min_partition_size`` launches per region).
    alias: ``{output name: parameter name}`` pairs for bind_outputs (the ``outputs`` group, which always
        runs: it also copies outputs that would expose a literal or a caller's input); ``strict_alias``: a pair that cannot be bound raises CompileError instead of
        being skipped.
    host_ops: op names lowering puts on the host.
    shared_literals: the :class:`~mgx_graph.passes.share_literals.LiteralTable` of another program whose
        literals this one reads from its memory (the ``share`` group); None: every literal is uploaded.
    """

    fp16: bool = False
    hip_graph: bool = False
    alias: dict = field(default_factory=dict)
    strict_alias: bool = True
    host_ops: tuple = ()
    min_partition_size: int = 4
    shared_literals: Any = None


def disabled_from_env() -> set[str]:
    """Names in ``MIGRAPHX_DISABLE_PASSES`` (comma separated, read once; empty when unset)."""
    return set(mgx_settings.current().disable_passes)


LOGGER = "mgx_graph.compile"  # the trace and timing lines of MIGRAPHX_TRACE_COMPILE / MIGRAPHX_TIME_PASSES


class PassManager:
    """Runs ``pipeline`` (PassGroups, or bare passes, each then a group of its own) over a program.

    ``validate``, ``trace`` and ``timing`` default to the context's settings (``MIGRAPHX_DISABLE_VALIDATE_PASSES``,
    ``MIGRAPHX_TRACE_COMPILE``, ``MIGRAPHX_TIME_PASSES``); ``disabled`` (pass or group names) to
    ``MIGRAPHX_DISABLE_PASSES``.  Raises CompileError for a disabled name that is unknown or required.
    """

    def __init__(self, pipeline, ctx: PassContext | None = None, *, validate: bool | None = None,
                 trace: bool | None = None, timing: bool | None = None, disabled=None):
        self.groups = [g if isinstance(g, PassGroup) else PassGroup(g.name, [g]) for g in pipeline]
        self.ctx = ctx if ctx is not None else PassContext()
        s = self.ctx.settings
        self.validate = not s.disable_validate_passes if validate is None else bool(validate)
        self.trace = s.trace_compile if trace is None else bool(trace)
        self.timing = s.time_passes if timing is None else bool(timing)
        self.disabled = {n.lower() for n in (s.disable_passes if disabled is None else disabled)}
        self._check_disabled()

    def _check_disabled(self) -> None:
        groups = {g.name for g in self.groups}
        passes = {p.name: p for g in self.groups for p in g.passes}
        unknown = sorted(self.disabled - groups - set(passes))
        if unknown:
            raise CompileError(f"MIGRAPHX_DISABLE_PASSES: unknown pass or group {', '.join(repr(n) for n in unknown)} "
                               f"(passes: {', '.join(passes)}; groups: {', '.join(groups)})")
        for g in self.groups:
            for p in g.passes:
                if p.required and (p.name in self.disabled or g.name in self.disabled):
                    raise CompileError(f"MIGRAPHX_DISABLE_PASSES: pass '{p.name}' (group '{g.name}') cannot be "
                                       f"disabled: the executor needs its result")

    def scheduled(self) -> list[tuple[str, Pass]]:
        """``(group name, pass)`` of every pass that runs, in order (enabled groups, not disabled)."""
        return [(g.name, p) for g in self.groups if g.enabled and g.name not in self.disabled
                for p in g.passes if p.name not in self.disabled]

    def skipped(self) -> list[tuple[str, Pass]]:
        """``(group name, pass)`` of the passes of enabled groups that ``disabled`` skips."""
        run = {id(p) for _, p in self.scheduled()}
        return [(g.name, p) for g in self.groups if g.enabled for p in g.passes if id(p) not in run]

    def find(self, name: str) -> Pass | None:
        """The first scheduled pass called ``name`` (None when it does not run)."""
        return next((p for _, p in self.scheduled() if p.name == name), None)

    def run(self, program) -> None:
        """Run the scheduled passes over ``program`` in place.  Errors a pass raises propagate as they
        are; an invalid program after a pass raises InvalidProgram naming the pass."""
        validate_s = 0.0
        memo: dict = {}
        log = mgx_settings.trace_logger(LOGGER) if self.trace or self.timing else logging.getLogger(LOGGER)
        if self.validate:
            validate_s += self._validate(program, None, memo)
        if self.trace or self.timing:
            for _, p in self.skipped():
                log.debug("Pass %s: skipped (MIGRAPHX_DISABLE_PASSES)", p.name)
        with mgx_settings.using(self.ctx.settings):
            for _, p in self.scheduled():
                t0 = time.perf_counter()
                p.apply(program, self.ctx)
                if self.timing:
                    log.debug("Pass %s: %.3fms", p.name, (time.perf_counter() - t0) * 1e3)
                if self.trace:
                    log.debug("Pass: %s", p.name)
                    log.debug("%s", program.print())
                if self.validate:
                    validate_s += self._validate(program, p.name, memo)
        if self.timing and self.validate:
            log.debug("Validation: %.3fms", validate_s * 1e3)

    @staticmethod
    def _validate(program, pass_name: str | None, memo: dict) -> float:
        t0 = time.perf_counter()
        try:
            validate_program(program, memo)
        except InvalidProgram as e:
            raise e.blame(pass_name) from None
        return time.perf_counter() - t0


def run_passes(program, passes, trace: bool | None = None, ctx: PassContext | None = None,
               validate: bool | None = None) -> None:
    """Run a list of passes (or PassGroups) over ``program`` through a :class:`PassManager`."""
    PassManager(passes, ctx, validate=validate, trace=trace).run(program)
