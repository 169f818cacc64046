"""What compiling a program produces besides the lowered IR.

The passes fill one :class:`CompileResult` through the pass context (``ctx.result``) instead of
setting attributes on the program: ``lowering`` writes the host-fallback list, ``bind_outputs`` the
outputs bound in place and the pairs it skipped, ``memory_coloring`` the memory plan.  The compile
step sets the target name and the flags before the pipeline runs; the executor reads the memory plan
at finalize, and the compiled program exposes the whole result (``CompiledProgram.result``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from ..settings import Settings
    from .analysis import MemoryPlan


@dataclass
class CompileResult:
    """The typed result of one compile.

    target: the target compiled for (``ref`` or ``gpu``).
    hip_graph: whether the ``graph`` group (the ``hip_graph`` pass) ran.
    fp16: whether the ``precision`` group (``quantize_fp16``) ran.
    memory_plan: the scratch arena / literal area layout (:class:`~mgx_graph.passes.analysis.MemoryPlan`,
        offsets in bytes); None until ``memory_coloring`` ran.
    host_fallback_ops: sorted names of the ops lowering put on the host.
    host_instructions: every instruction that runs on the host in place of a device kernel, as
        ``"module:@index op"`` (:func:`~mgx_graph.passes.lowering.host_instructions`).
    alias: ``{output name: parameter name}`` bound in place by ``bind_outputs``.
    alias_skipped: ``{output name: reason}`` of the requested pairs ``bind_outputs`` could not bind
        (only when the pairs were detected, not given: a given pair that cannot bind is a CompileError).
    shared_literals: the :class:`~mgx_graph.passes.share_literals.LiteralTable` of the program whose
        literals this one reads (``compile(..., share_literals=)``), or None.  Not saved in a ``.mxr``.
    settings: the :class:`~mgx_graph.settings.Settings` the compile ran with (the ``MIGRAPHX_*`` table it
        read once); what the compiled program's run-time switches come from.  Not saved in a ``.mxr``.
    """

    target: str = "ref"
    hip_graph: bool = False
    fp16: bool = False
    memory_plan: "MemoryPlan | None" = None
    host_fallback_ops: list = field(default_factory=list)
    host_instructions: list = field(default_factory=list)
    alias: dict = field(default_factory=dict)
    alias_skipped: dict = field(default_factory=dict)
    settings: "Settings | None" = None
    shared_literals: Any = None
