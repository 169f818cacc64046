"""The progress display of a model build, on stderr.

On a terminal: one tqdm bar over the build steps (:data:`Steps.NAMES`); every note and every line
that other code prints while the build runs (the ONNX exporter's messages, warnings, log records)
is written above the bar through ``tqdm.write``, so nothing overwrites the bar or is overwritten
by it. When stderr is not a terminal (a log file, a pipe, a notebook): plain lines, one when each
step starts and one per note, never a carriage return. Other tqdm bars (transformers' weight
loading, the GGUF de-quantization loop, huggingface_hub) are created disabled during a build
(:func:`quiet_third_party`).
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import re
import sys
import threading
import time
from types import ModuleType
from typing import Any, Callable, Iterator

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def visible_text(raw: str) -> str:
    """What a terminal would show of one line ``raw`` (no newline in it): each carriage return
    moves back to column 0 and the text after it overwrites what was there; ANSI escape
    sequences are dropped; trailing blanks are stripped."""
    cells: list[str] = []
    col = 0
    for ch in _ANSI.sub("", raw):
        if ch == "\r":
            col = 0
            continue
        if col < len(cells):
            cells[col] = ch
        else:
            cells.append(ch)
        col += 1
    return "".join(cells).rstrip()


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class _LineWriter(io.TextIOBase):
    """A text stream that hands every complete line to ``emit`` (see :func:`visible_text`);
    blank lines are dropped. After :meth:`detach_to_original` it writes straight through to
    ``original`` (for anything that kept a reference to it after the build)."""

    def __init__(self, emit: Callable[[str], None], original: Any):
        super().__init__()
        self._emit = emit
        self._original = original
        self._pending = ""
        self._lock = threading.Lock()
        self._active = True

    def write(self, s: str) -> int:
        if not self._active:
            return self._original.write(s)
        with self._lock:
            lines = (self._pending + s).split("\n")
            self._pending = lines.pop()
        for line in lines:
            text = visible_text(line)
            if text:
                self._emit(text)
        return len(s)

    def flush(self) -> None:
        if not self._active:
            self._original.flush()

    def drain(self) -> None:
        """Emit an unfinished last line, if any."""
        with self._lock:
            rest, self._pending = self._pending, ""
        text = visible_text(rest)
        if text:
            self._emit(text)

    def detach_to_original(self) -> None:
        self.drain()
        self._active = False

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._original.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._original, "encoding", None) or "utf-8"


def _all_loggers() -> list[logging.Logger]:
    found = [logging.getLogger()]
    found += [lg for lg in list(logging.Logger.manager.loggerDict.values()) if isinstance(lg, logging.Logger)]
    return found


def _retarget_log_handlers(replace: dict[int, Any]) -> list[tuple[logging.StreamHandler, Any]]:
    """Point every logging StreamHandler (not file handlers) whose stream is a key of
    ``replace`` (by ``id``) at the mapped stream; returns the (handler, previous stream) pairs."""
    changed = []
    for lg in _all_loggers():
        for handler in list(lg.handlers):
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                new = replace.get(id(handler.stream))
                if new is not None:
                    changed.append((handler, handler.setStream(new)))
    return changed


class Steps:
    """The display over the fixed build steps, written to ``stream`` (default: ``sys.stderr``).

    Use ``with steps.step("export"): ...`` around each step and :meth:`skip` for a step with
    nothing to do; the seconds spent in every step are kept in :attr:`seconds`. On a terminal
    the steps drive one tqdm bar; otherwise each step prints one plain line
    ``[model] step k/5: name`` when it starts. :meth:`note` prints one line above the bar;
    :meth:`routed` sends everything else printed during the build the same way. With
    ``enabled=False`` nothing is printed.
    """

    NAMES = ("fetch weights", "load", "export", "verify", "save")

    def __init__(self, model_name: str, enabled: bool = True, stream: Any = None):
        self.enabled = enabled
        self.model_name = model_name
        self.seconds: dict[str, float] = {}
        self.stream = stream if stream is not None else sys.stderr
        self.tty = enabled and _is_terminal(self.stream)
        self._count = 0
        self._current: str | None = None
        self._t0 = time.perf_counter()
        self._closed = False
        self._bar = None
        if self.tty:
            from tqdm import tqdm

            self._bar = tqdm(
                total=len(self.NAMES), desc=model_name, unit="step", file=self.stream, leave=True,
                bar_format="{desc}: {n_fmt}/{total_fmt} steps [{elapsed}]",
            )

    def _begin(self, name: str, why: str | None = None) -> None:
        if name not in self.NAMES:
            raise ValueError(f"unknown build step {name!r}; known: {list(self.NAMES)}")
        self._count += 1
        self._current = name
        if self._bar is not None:
            self._bar.set_description_str(f"{self.model_name}: {name}")
            if why is not None:
                self.note(f"{name}: {why}")
        elif self.enabled:
            tail = f" (skipped: {why})" if why is not None else ""
            self.write(f"[{self.model_name}] step {self._count}/{len(self.NAMES)}: {name}{tail}")

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Run the body as build step ``name`` (one of :data:`NAMES`; else ``ValueError``)."""
        self._begin(name)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(time.perf_counter() - t0, 3)
        self._current = None
        if self._bar is not None:
            self._bar.update(1)

    def skip(self, name: str, why: str = "skipped") -> None:
        """Mark step ``name`` as done without doing anything, saying ``why``."""
        self._begin(name, why)
        self.seconds[name] = 0.0
        self._current = None
        if self._bar is not None:
            self._bar.update(1)

    def write(self, line: str) -> None:
        """Print one line (above the bar on a terminal); carriage returns are resolved first."""
        if not self.enabled:
            return
        text = visible_text(line)
        if self._bar is not None and not self._closed:
            self._bar.write(text, file=self.stream)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def note(self, message: str) -> None:
        """Print ``[model] message`` as one line (only when progress is enabled)."""
        self.write(f"[{self.model_name}] {message}")

    @contextlib.contextmanager
    def routed(self) -> Iterator[None]:
        """While the body runs, send every line printed to ``sys.stdout`` / ``sys.stderr`` and
        every record of a logging StreamHandler on them through :meth:`write`. A no-op when
        progress is disabled."""
        if not self.enabled:
            yield
            return
        saved_out, saved_err = sys.stdout, sys.stderr
        out_writer, err_writer = _LineWriter(self.write, saved_out), _LineWriter(self.write, saved_err)
        to_writers = {id(saved_out): out_writer, id(saved_err): err_writer}
        if id(self.stream) not in to_writers:
            to_writers[id(self.stream)] = err_writer
        changed = _retarget_log_handlers(to_writers)
        sys.stdout, sys.stderr = out_writer, err_writer
        try:
            yield
        finally:
            sys.stdout, sys.stderr = saved_out, saved_err
            out_writer.detach_to_original()
            err_writer.detach_to_original()
            for handler, previous in changed:
                if handler.stream is out_writer or handler.stream is err_writer:
                    handler.setStream(previous)
            # Handlers made during the build on the then sys.stdout / sys.stderr.
            _retarget_log_handlers({id(out_writer): saved_out, id(err_writer): saved_err})

    def close(self, ok: bool = True) -> None:
        """End the display: the bar's last state says done / failed; without a terminal one
        summary line with the seconds per step. Calling it again does nothing."""
        if self._closed:
            return
        total = time.perf_counter() - self._t0
        if self._bar is not None:
            self._bar.set_description_str(f"{self.model_name}: {'done' if ok else 'failed'}", refresh=False)
            self._bar.close()
        elif self.enabled:
            if ok:
                times = ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items() if k in self.NAMES)
                self.write(f"[{self.model_name}] done: {self._count} steps in {total:.1f} s ({times})")
            else:
                where = f"in step {self._current}" if self._current else f"after {self._count} of {len(self.NAMES)} steps"
                self.write(f"[{self.model_name}] failed {where}, {total:.1f} s after the start")
        self._closed = True


@contextlib.contextmanager
def quiet_third_party(show_warnings: bool) -> Iterator[None]:
    """While the body runs, every tqdm bar created (transformers' weight loading, the GGUF
    de-quantization loop, huggingface_hub, any other library) is created disabled; with
    ``show_warnings=False`` transformers' warnings are hidden too (verbosity error). Bars
    made before (the build's own) are untouched; everything is restored afterwards."""
    with _tqdm_disabled():
        hf_logging: ModuleType | None
        try:
            from transformers.utils import logging as hf_logging
        except ImportError:
            hf_logging = None
        if hf_logging is None or show_warnings:
            yield
            return
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            yield
        finally:
            hf_logging.set_verbosity(verbosity)


#: Index of ``disable`` among the positional parameters of ``tqdm.__init__``.
_TQDM_DISABLE_POS = 10


@contextlib.contextmanager
def _tqdm_disabled() -> Iterator[None]:
    """Make ``tqdm.std.tqdm.__init__`` (which every tqdm flavour runs) force ``disable=True``."""
    try:
        from tqdm import std
    except ImportError:  # pragma: no cover - tqdm is a core dependency
        yield
        return
    original = std.tqdm.__init__

    @functools.wraps(original)
    def init(self, *args, **kwargs):
        if len(args) > _TQDM_DISABLE_POS:
            args = args[:_TQDM_DISABLE_POS] + (True,) + args[_TQDM_DISABLE_POS + 1:]
        else:
            kwargs["disable"] = True
        original(self, *args, **kwargs)

    std.tqdm.__init__ = init  # type: ignore[method-assign]  # patched for the body only, restored below
    try:
        yield
    finally:
        std.tqdm.__init__ = original  # type: ignore[method-assign]  # the class's own initializer again
