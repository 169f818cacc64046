"""A program: a set of modules with a root module ``main``."""
from __future__ import annotations

from ..errors import CompileError, MgxError, ShapeError
from .module import Module
from .shape import Shape

_compiler = None  # compile_program(program, target, **options), set by register_compiler


def register_compiler(compile_program) -> None:
    """Set what :meth:`Program.compile` runs: ``compile_program(program, target, **options)``.  The
    compile layer (:mod:`mgx_graph.compiler`) registers itself when it is imported, as ``import
    mgx_graph`` does, so that the IR imports nothing above it."""
    global _compiler
    _compiler = compile_program


class Program:
    """A set of modules with a root module ``main``.

    Created by :func:`mgx_graph.parse_onnx`; :meth:`compile` runs the passes, lowers it to a target
    and returns the :class:`~mgx_graph.exec.compiled.CompiledProgram`, which this program keeps in
    ``compiled``, so that :meth:`run` / :meth:`run_async` / :meth:`stats` / :meth:`release` here
    run it too.  ``metadata``: the model's metadata properties (``{key: value}``);
    ``symbolic_inputs``: the inputs whose dims were left symbolic (``{name: [dim indices]}``).
    """

    def __init__(self):
        self.modules: dict[str, Module] = {}
        self.create_module("main")
        self.metadata: dict = {}
        self.symbolic_inputs: dict = {}
        self.compiled = None  # the CompiledProgram made by compile()

    def create_module(self, name: str) -> Module:
        if name in self.modules:
            raise ShapeError(f"module '{name}' already exists")
        m = Module(name, self)
        self.modules[name] = m
        return m

    def remove_module(self, name: str) -> None:
        self.modules.pop(name, None)

    def get_main_module(self) -> Module:
        return self.modules["main"]

    def module_order(self) -> list[Module]:
        """Modules reachable from main, children before parents are not guaranteed: parents first."""
        seen, order = set(), []

        def visit(m: Module):
            if m.name in seen:
                return
            seen.add(m.name)
            order.append(m)
            for ins in m.instructions:
                for sm in ins.module_inputs:
                    visit(sm)

        visit(self.get_main_module())
        return order

    # MIGraphX-style queries
    def get_parameter_names(self) -> list[str]:
        return self.get_main_module().get_parameter_names()

    def get_parameter_shapes(self) -> dict[str, Shape]:
        return self.get_main_module().get_parameter_shapes()

    def get_output_shapes(self) -> list:
        return self.get_main_module().get_output_shapes()

    def get_output_names(self) -> list[str]:
        return list(self.get_main_module().output_names)

    def print(self, file=None) -> str:
        text = "".join(m.print() + "\n" for m in self.module_order())
        if file is not None:
            file.write(text)
        return text

    def __str__(self) -> str:
        return self.print()

    def instruction_count(self) -> int:
        return sum(len(m) for m in self.module_order())

    # -- compiling (the target code lives in mgx_graph.compiler, which registers itself) -----------
    def compile(self, target: str = "auto", **options):
        """Run the target's pass pipeline over this program (in place) and finalize it on ``target``
        (``ref``, ``gpu`` or ``auto``); returns the :class:`~mgx_graph.exec.compiled.CompiledProgram`, also
        kept in ``compiled``.  ``options`` and the errors raised: :func:`mgx_graph.compiler.compile_program`;
        CompileError when the program is compiled already."""
        if self.compiled is not None:
            raise CompileError("program is already compiled")
        if _compiler is None:
            raise CompileError("no compiler is registered: import mgx_graph (it registers mgx_graph.compiler)")
        self.compiled = _compiler(self, target, **options)
        return self.compiled

    def _require_compiled(self):
        if self.compiled is None:
            raise MgxError("program is not compiled: call compile() first")
        return self.compiled

    def is_compiled(self) -> bool:
        """True once :meth:`compile` made an executor (see ``CompiledProgram.is_compiled``)."""
        return self.compiled is not None and self.compiled.is_compiled()

    def run(self, params: dict) -> list:
        """:meth:`CompiledProgram.run <mgx_graph.exec.compiled.CompiledProgram.run>` of the compiled program
        (MgxError when not compiled)."""
        return self._require_compiled().run(params)

    def run_async(self, params: dict, queue=None, copy: bool = False) -> list:
        """:meth:`CompiledProgram.run_async <mgx_graph.exec.compiled.CompiledProgram.run_async>`."""
        return self._require_compiled().run_async(params, queue, copy)

    def stats(self) -> dict:
        """:meth:`CompiledProgram.stats <mgx_graph.exec.compiled.CompiledProgram.stats>`."""
        return self._require_compiled().stats()

    def release(self) -> None:
        """Release the compiled program (nothing when not compiled); safe to call more than once."""
        if self.compiled is not None:
            self.compiled.release()

    @property
    def queue(self) -> int:
        """The compiled program's default queue (stream handle)."""
        return self._require_compiled().queue

    @property
    def context(self):
        """The compiled program's target context."""
        return self._require_compiled().context

    def param_buffer(self, name: str):
        """The compiled program's own device buffer of parameter ``name``."""
        return self._require_compiled().param_buffer(name)
