"""The ``mgx-graph`` command line (``python -m mgx_graph``): :func:`mgx_graph.cli.main.main` and one module
per group of commands."""
