"""Graph capture and replay: the ``graph_launch`` op, its state (the cache of graph execs), the replay path
of a repeated call (in Python and, armed from it, in C), validation mode, the capture queues and the
counters.  Imports the IR, the operators, the runtime, ``mgx_graph.exec`` and ``mgx_graph.passes.analysis``;
never the compiler."""
