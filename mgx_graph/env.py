"""MIGraphX-style environment variables: the names of :mod:`mgx_graph.settings`' table.

The table (:data:`mgx_graph.settings.TABLE`) is the one list of the ``MIGRAPHX_*`` variables, their
types, defaults and docs; it is read once per process (:func:`mgx_graph.settings.current`).  This module
keeps MIGraphX's ``get_all_envs`` and the reset tests use.
"""
from __future__ import annotations

from . import settings


def get_all_envs() -> list[str]:
    """Names of every variable mgx_graph reads (as MIGraphX's ``get_all_envs``)."""
    return sorted(settings.BY_NAME)


def _reset_for_tests() -> None:
    """Forget the settings read (tests only: real MIGraphX never re-reads)."""
    settings.reset()
