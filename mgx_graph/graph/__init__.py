"""Graph capture and replay: the ``graph_launch`` op, its cache of graph execs, the capture queues and
the fast replay paths.  Imports the IR, the operators, the runtime, ``mgx_graph.exec`` and
``mgx_graph.passes.analysis``; never the compiler."""
