"""Saved programs (``.mxr``): :func:`~mgx_graph.mxr.save_load.save` / :func:`~mgx_graph.mxr.save_load.load`,
the archive format and the checks of an untrusted file."""
