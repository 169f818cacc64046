"""Running a compiled program: the executor (memory, parameter binding), the eval loop and its steps,
and :class:`~mgx_graph.exec.compiled.CompiledProgram`.  Imports the IR, the operators, the runtime,
``mgx_graph.graph`` and ``mgx_graph.passes.analysis``; never the compiler."""
