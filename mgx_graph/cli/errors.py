"""How ``mgx-graph`` reports a bad argument, file or folder: one ``mgx-graph: error: ...`` line on
stderr and exit status 1 (2 for a flag argparse refuses, 130 for Ctrl-C), never a traceback unless
``--debug`` or ``MGX_GRAPH_DEBUG=1`` asks for one.

Also the argparse value types that check numbers where the flags are parsed (``--max-length 0`` is an
error there, not a value replaced later by a default).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import traceback

PREFIX = "mgx-graph: error: "
DEBUG_ENV = "MGX_GRAPH_DEBUG"


def debug_wanted(args=None) -> bool:
    """Whether a traceback is printed: ``--debug`` or ``MGX_GRAPH_DEBUG`` set to 1/yes/true/enable(d)."""
    env = os.environ.get(DEBUG_ENV, "").strip().lower() in {"1", "yes", "true", "enable", "enabled"}
    return env or bool(getattr(args, "debug", False))


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose error is the usage, then one ``mgx-graph: error: ...`` line (exit 2)."""

    def error(self, message):
        self.print_usage(sys.stderr)
        cmd = self.prog.split(" ", 1)[1] if " " in self.prog else ""
        self.exit(2, f"{PREFIX}{cmd + ': ' if cmd else ''}{message}\n")


def int_at_least(low: int):
    """An argparse type: an int >= ``low``."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = None
        if v is None or v < low:
            raise argparse.ArgumentTypeError(f"expected an int >= {low}, got {text!r}")
        return v
    parse.__name__ = f"int >= {low}"
    return parse


def int_in(low: int, high: int):
    """An argparse type: an int in ``low..high``."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = None
        if v is None or not low <= v <= high:
            raise argparse.ArgumentTypeError(f"expected an int in {low}..{high}, got {text!r}")
        return v
    parse.__name__ = f"int in {low}..{high}"
    return parse


def float_in(low: float, high: float = math.inf, low_open: bool = False):
    """An argparse type: a finite float in ``[low, high]`` (``(low, high]`` with ``low_open``)."""
    span = f"{'(' if low_open else '['}{low:g}, {high:g}]" if high != math.inf else \
        f"{'>' if low_open else '>='} {low:g}"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = math.nan
        if not math.isfinite(v) or (v <= low if low_open else v < low) or v > high:
            raise argparse.ArgumentTypeError(f"expected a number {'in ' if '[' in span or '(' in span else ''}"
                                             f"{span}, got {text!r}")
        return v
    parse.__name__ = f"number {span}"
    return parse


def describe(e: BaseException) -> str:
    """The error line's text for ``e`` (without the ``mgx-graph: error:`` prefix)."""
    from .inputs import UsageError
    from ..errors import MgxError
    from ..models.errors import BuildError  # a model build's errors (MissingExtraError too) name what they need

    if isinstance(e, (MgxError, UsageError, BuildError)):
        return str(e)
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 text ({e.reason} at byte {e.start})"
    if isinstance(e, json.JSONDecodeError):
        return f"not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})"
    if isinstance(e, OSError) and e.strerror:
        where = f"{e.filename}: " if e.filename is not None else ""
        return f"{where}{e.strerror}" + (f" ({e.filename2})" if getattr(e, "filename2", None) else "")
    known = (OSError, ValueError, ImportError, RuntimeError, LookupError)
    text = f"{type(e).__name__}: {e}"
    return text if isinstance(e, known) else f"internal error: {text} (run with --debug for the traceback)"


def report(e: BaseException, debug: bool) -> int:
    """Print ``e`` as one error line (after its traceback when ``debug``); returns the exit status."""
    if debug:
        traceback.print_exception(type(e), e, e.__traceback__)
    if isinstance(e, KeyboardInterrupt):
        print(f"{PREFIX}interrupted", file=sys.stderr)
        return 130
    print(PREFIX + describe(e), file=sys.stderr)
    return 1
