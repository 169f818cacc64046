"""The ``MIGRAPHX_*`` environment variables mgx_graph reads, as one typed table.

:data:`TABLE` lists every variable once: its name, the :class:`Settings` field it fills, its type
(``bool``, ``int``, ``str`` or ``list``: comma separated), its default, the values it takes and a one-line
doc, in one of three groups (``graph``, ``compile``, ``kernel``).  :meth:`Settings.from_env` reads them
all at once and checks them: a value outside what a variable takes is a
:class:`~mgx_graph.errors.ParameterError` naming the variable, the value and what it expects.

As in MIGraphX, the process reads the table once (:func:`current`, on first use) and keeps it;
changing a variable later in the same process has no effect.  A compile takes the table once and
hands it down: the pass context carries it (``PassContext.settings``), the compile result keeps it
(``CompileResult.settings``), and the kernel code under ``operators/`` reads the switches of the compile
in progress through :func:`active` (the table :func:`using` installed, else :func:`current`).

``docs/settings.md`` holds the table as :func:`markdown` renders it; ``mgx-graph settings`` prints it
with the current values (:func:`report`).
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import sys
import threading
from dataclasses import dataclass, fields
from typing import Any

from .errors import ParameterError

TRUE = ("1", "enable", "enabled", "yes", "true", "on")
FALSE = ("0", "disable", "disabled", "no", "false", "off")
GROUPS = {"graph": ("Graphs", ""), "compile": ("Compiler passes", ""),
          "kernel": ("GPU kernels", "These change which kernel the `gpu` target runs, for A/B runs; the defaults "
                     "are the faster choices measured on an H200 ([benchmarks.md](benchmarks.md#settings-measured)).")}


@dataclass(frozen=True)
class Setting:
    """One variable: ``name``, the :class:`Settings` ``field`` it fills, ``type`` (``bool`` / ``int`` /
    ``str`` / ``list``), ``default``, ``low`` .. ``high`` (an ``int``'s range, None: unbounded), ``group``
    and a one-line ``doc`` (markdown)."""

    name: str
    field: str
    type: str
    default: Any
    group: str
    doc: str
    low: int | None = None
    high: int | None = None

    def expects(self) -> str:
        """What the variable takes, in words."""
        if self.type == "bool":
            return f"one of {'/'.join(TRUE)} (on) or {'/'.join(FALSE)} (off)"
        if self.type == "int":
            if self.high is not None:
                return f"an integer in {self.low} .. {self.high}"
            return "an integer" + (f" >= {self.low}" if self.low is not None else "")
        return "comma-separated names" if self.type == "list" else "a string"

    def parse(self, raw: str | None):
        """The value of ``raw`` (the environment's string; None or blank: the default).  ParameterError
        naming the variable, the value and what it expects when ``raw`` is none of those."""
        if raw is None or not raw.strip():
            return self.default
        v = raw.strip()
        if self.type == "bool":
            if v.lower() in TRUE or v.lower() in FALSE:
                return v.lower() in TRUE
        elif self.type == "int":
            try:
                n = int(v)
            except ValueError:
                n = None
            if n is not None and (self.low is None or n >= self.low) and (self.high is None or n <= self.high):
                return n
        elif self.type == "list":
            return tuple(n.strip().lower() for n in v.split(",") if n.strip())
        else:
            return v
        raise ParameterError(f"{self.name}={raw!r}: expected {self.expects()}")

    def takes(self) -> str:
        """What the variable takes, in a table cell."""
        if self.type == "int":
            if self.high is not None:
                return f"integer {self.low} .. {self.high}"
            return "integer" + (f" >= {self.low}" if self.low is not None else "")
        return {"bool": "switch", "list": "names, comma separated"}.get(self.type, "string")

    def shown(self, value) -> str:
        """``value`` as the table shows it."""
        if self.type == "bool":
            return "on" if value else "off"
        if self.type == "list":
            return ",".join(value) if value else "none"
        if self.name == "MIGRAPHX_HIP_GRAPH_MAX_BYTES" and value == 1 << 30:
            return "1 GiB"
        return str(value)


def _s(name, field, type_, default, group, doc, low=None, high=None) -> Setting:
    return Setting(name, field, type_, default, group, doc, low, high)


TABLE: tuple[Setting, ...] = (
    _s("MIGRAPHX_HIP_GRAPH", "hip_graph", "bool", False, "graph",
       "Turns the `hip_graph` pass on when `compile(hip_graph=None)` (the CLI's default without `--hip-graph`). "
       "Off: the eager path, with no `graph_launch` anywhere and byte-identical results."),
    _s("MIGRAPHX_HIP_GRAPH_DEBUG", "hip_graph_debug", "bool", False, "graph",
       "Logs one line per `WARMUP`, `CAPTURE`, `UPDATE`, `REPLAY`, `FALLBACK`, `EAGER`, `EVICT`, `DISABLE`, "
       "`VALIDATE` or `QUEUE` (no capture queue could be made: the capture records on the queue itself) event, "
       "with the region, a key summary and the reason (logger `mgx_graph.graph`, printed to stderr); a "
       "dynamic-shape program also logs `SPECIALIZE`, `RESPECIALIZE`, `PREFIX`, `PRUNE` and its own `EVICT` "
       "(logger `mgx_graph.dynamic`), with graphs or without. `compile(debug=True)` does the same for one "
       "program."),
    _s("MIGRAPHX_HIP_GRAPH_MAX", "hip_graph_max", "int", 8, "graph",
       "Graph execs per region, and captures per region over its lifetime (`compile(max_graphs=)`).", 1),
    _s("MIGRAPHX_HIP_GRAPH_MAX_BYTES", "hip_graph_max_bytes", "int", 1 << 30, "graph",
       "Device memory of all graph execs of a program, in bytes (`compile(max_graph_bytes=)`).", 1),
    _s("MIGRAPHX_HIP_GRAPH_VALIDATE", "hip_graph_validate", "bool", False, "graph",
       "Validation mode: the first 3 replays of each key, and every 100th after, also run eagerly into separate "
       "buffers and are compared ([api.md](api.md#the-graph-cache))."),
    _s("MIGRAPHX_TRACE_EVAL", "trace_eval", "int", 0, "graph",
       "Any integer above 0 forces every region to run eagerly (graphs are not used).", 0),
    _s("MIGRAPHX_NATIVE_REPLAY", "native_replay", "bool", True, "graph",
       "`0` keeps every replay of a one-region program (a decode step) on the Python path instead of one C call "
       "(`cpp/replay.c`, built as `mgx_graph._native` at install when a C compiler is present; "
       "[api.md](api.md#outputs-repeated-calls-and-bound-state))."),
    _s("MIGRAPHX_HOST_READER_POLL", "host_reader_poll", "bool", False, "graph",
       "`1` makes the greedy loop wait for each next id by polling its event from the calling thread "
       "(`hipEventQuery`) instead of blocking in `hipEventSynchronize`."),
    _s("MIGRAPHX_TRACE_COMPILE", "trace_compile", "bool", False, "compile",
       "Logs the program after each pass (logger `mgx_graph.compile`, printed to stderr)."),
    _s("MIGRAPHX_TIME_PASSES", "time_passes", "bool", False, "compile",
       "Logs the time each pass takes, then the time the validations between passes took (logger "
       "`mgx_graph.compile`, printed to stderr)."),
    _s("MIGRAPHX_DISABLE_PASSES", "disable_passes", "list", (), "compile",
       "Skips the passes or pass groups named, comma separated (e.g. `fuse_norms` or `graph`), for A/B runs. "
       "`lowering` and `memory_coloring` cannot be skipped, and an unknown name is a `CompileError`."),
    _s("MIGRAPHX_DISABLE_VALIDATE_PASSES", "disable_validate_passes", "bool", False, "compile",
       "Turns off the validation of the program after each pass (on by default)."),
    _s("MIGRAPHX_GEMV", "gemv", "bool", True, "kernel",
       "`0` runs a one-row `dot` against a constant weight with cuBLAS / hipBLAS instead of the gemv kernel "
       "(`operators/gemv.cu`) on gpu; `gemv_layout` and `fuse_gemv` then change nothing (on `ref` too)."),
    _s("MIGRAPHX_GEMV_NARROW", "gemv_narrow", "bool", True, "kernel",
       "`0` keeps 32 threads per column in a GEMV of many columns of short rows. By default such a GEMV takes "
       "fewer (down to 4) while each thread's loads of its row fit the prefetch registers and the grid keeps 264 "
       "blocks (SmolLM2's lm_head, 49152 x 576, runs 3072 blocks of 16 columns instead of 6144 of 8, each "
       "normalizing the row once)."),
    _s("MIGRAPHX_GEMV_NBITS", "gemv_nbits", "bool", True, "kernel",
       "`0` runs every `matmul_nbits` (MatMulNBits) on gpu as one dequantization kernel into a workspace and a "
       "cuBLAS / hipBLAS GEMM. By default one to 8 rows of A (decode) run the fused GEMV of "
       "`operators/gemv_nbits.cu` instead, which reads the packed weight once and dequantizes it in registers."),
    _s("MIGRAPHX_PDL", "pdl", "bool", True, "kernel",
       "`0` turns off programmatic dependent launch of the generated and own kernels (`operators/*.cu` through "
       "`compiled_function`) inside graph captures. On by default on compute capability 9.0 and later (no-ops "
       "elsewhere and on HIP): each such kernel starts with `griddepcontrol.wait`, except the GEMV kernels "
       "(`gemv.cu`, the generated `fused_gemv`, and `gemv_nbits.cu` over an initializer's packed weight), which "
       "first load the leading chunks of their constant weight into registers and wait after that, so the next "
       "kernel's launch and weight loads overlap the running one."),
    _s("MIGRAPHX_ATTN_SPLIT_ROWS", "attn_split_rows", "int", 256, "kernel",
       "Cache rows one block of the gpu decode-attention kernel walks; a longer cache is split over blocks and "
       "merged by a second kernel.", 1),
    _s("MIGRAPHX_ATTN_LANES", "attn_lanes", "bool", True, "kernel",
       "`0` turns off `mgx_attn_lanes`, the default decode-attention kernel for key and value head sizes that "
       "are equal and a power of two of 16-byte loads: one block per query row, each key's dot product and "
       "value sum split over lanes that hold their query columns in registers, a warp's K / V / mask reads for "
       "32 keys issued before any arithmetic, the planned sizes and strides compiled in."),
    _s("MIGRAPHX_ATTN_LANES_BRANCHLESS", "attn_lanes_branchless", "bool", True, "kernel",
       "`0` compiles `mgx_attn_lanes` with the branches that skip a chunk or a warp with no visible key. "
       "Without them (the default) the skipped keys' weights are exp(-inf) = 0 and the compiler keeps each "
       "chunk's V reads together with its K reads."),
    _s("MIGRAPHX_ATTN_WARP", "attn_warp", "bool", True, "kernel",
       "`0` runs the block decode-attention kernel (`mgx_attn_split`) for every shape; by default shapes with "
       "at most 16 query rows per KV head and a power-of-two value head size that `mgx_attn_lanes` does not "
       "take run the warp kernel (`mgx_attn_warp`: 32-lane groups own key ranges, no barrier in the key loop)."),
    _s("MIGRAPHX_ATTN_WARPS", "attn_warps", "int", 8, "kernel",
       "Warps (32-lane groups) per block of the warp decode-attention kernel, rounded down to a power of two "
       "and halved while the block's shared memory does not fit, for sweeps (2 / 4 / 8 / 16) without a code "
       "change.", 1, 32),
    _s("MIGRAPHX_ATTN_V_EARLY", "attn_v_early", "bool", True, "kernel",
       "`0` makes the warp decode-attention kernel load a key's V row once its softmax weights are known. By "
       "default each lane loads the V rows it will add for a 32-key step together with the K rows, before the "
       "scores, so the V reads do not wait for the softmax; plans whose lanes would hold more than 64 V "
       "elements (e.g. head size 128 over 256 keys with 8 warps) keep the other order."),
)
BY_NAME = {s.name: s for s in TABLE}


@dataclass(frozen=True)
class Settings:
    """The value of every variable of :data:`TABLE` (field names: :attr:`Setting.field`)."""

    hip_graph: bool = False
    hip_graph_debug: bool = False
    hip_graph_max: int = 8
    hip_graph_max_bytes: int = 1 << 30
    hip_graph_validate: bool = False
    trace_eval: int = 0
    native_replay: bool = True
    host_reader_poll: bool = False
    trace_compile: bool = False
    time_passes: bool = False
    disable_passes: tuple = ()
    disable_validate_passes: bool = False
    gemv: bool = True
    gemv_narrow: bool = True
    gemv_nbits: bool = True
    pdl: bool = True
    attn_split_rows: int = 256
    attn_lanes: bool = True
    attn_lanes_branchless: bool = True
    attn_warp: bool = True
    attn_warps: int = 8
    attn_v_early: bool = True

    @classmethod
    def from_env(cls, environ=None) -> "Settings":
        """Every variable of :data:`TABLE` read from ``environ`` (default: ``os.environ``) at once;
        ParameterError naming the first one whose value it does not take."""
        environ = os.environ if environ is None else environ
        return cls(**{s.field: s.parse(environ.get(s.name)) for s in TABLE})

    def value(self, name: str) -> Any:
        """The value of variable ``name`` (KeyError for a name not in :data:`TABLE`)."""
        return getattr(self, BY_NAME[name].field)


_lock = threading.Lock()
_current: list = []  # [Settings] once read
_active: contextvars.ContextVar = contextvars.ContextVar("mgx_graph_settings", default=None)


def current() -> Settings:
    """The process's settings: the environment read on first use and kept (ParameterError, and nothing
    kept, when a variable has a value it does not take)."""
    with _lock:
        if not _current:
            _current.append(Settings.from_env())
        return _current[0]


def reset() -> None:
    """Forget the kept settings: the next :func:`current` reads the environment again (tests only;
    MIGraphX never re-reads)."""
    with _lock:
        _current.clear()


def active() -> Settings:
    """The settings of the compile in progress on this thread (:func:`using`), else :func:`current`."""
    s = _active.get()
    return s if s is not None else current()


@contextlib.contextmanager
def using(settings: Settings):
    """Make ``settings`` what :func:`active` returns inside the ``with`` block (this thread / context)."""
    token = _active.set(settings)
    try:
        yield settings
    finally:
        _active.reset(token)


class _StderrHandler(logging.StreamHandler):
    """A handler writing to whatever ``sys.stderr`` is at each record (so a redirected stderr gets it)."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def trace_logger(name: str) -> logging.Logger:
    """Logger ``name`` set to print its DEBUG records to stderr as bare lines (``%(message)s``): what a
    trace variable (``MIGRAPHX_HIP_GRAPH_DEBUG``, ``MIGRAPHX_TRACE_COMPILE``, ...) or option turns on.  The
    records still propagate to the handlers the application configured."""
    log = logging.getLogger(name)
    with _lock:
        if not any(isinstance(h, _StderrHandler) for h in log.handlers):
            log.addHandler(_StderrHandler())
        if log.level == logging.NOTSET or log.level > logging.DEBUG:
            log.setLevel(logging.DEBUG)
    return log


def rows(settings: Settings | None = None) -> list[dict]:
    """One dict per variable: ``name``, ``group``, ``type``, ``value`` (of ``settings``, default
    :func:`current`), ``default``, ``expects`` and ``doc``."""
    s = settings if settings is not None else current()
    return [{"name": t.name, "group": t.group, "type": t.type,
             "value": list(s.value(t.name)) if t.type == "list" else s.value(t.name),
             "default": list(t.default) if t.type == "list" else t.default, "expects": t.expects(), "doc": t.doc}
            for t in TABLE]


def report(as_json: bool = False, environ=None) -> str:
    """What ``mgx-graph settings`` prints: each variable, its value now, its default and its doc (text),
    or a JSON list of :func:`rows`.  ParameterError when a variable's value is invalid."""
    s = Settings.from_env(environ)
    if as_json:
        return json.dumps(rows(s), indent=2)
    lines = []
    for key, (title, _) in GROUPS.items():
        lines.append(f"{title}:")
        for t in (t for t in TABLE if t.group == key):
            lines.append(f"  {t.name} = {t.shown(s.value(t.name))}  (default {t.shown(t.default)})")
            lines.append(f"      {t.doc}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def markdown() -> str:
    """The variable tables of ``docs/settings.md`` (one per group), as generated from :data:`TABLE`."""
    out = []
    for key, (title, intro) in GROUPS.items():
        out += [f"### {title}", ""] + ([intro, ""] if intro else [])
        out += ["| variable | takes | default | effect |", "|---|---|---|---|"]
        out += [f"| `{t.name}` | {t.takes()} | {t.shown(t.default)} | {t.doc} |" for t in TABLE if t.group == key]
        out.append("")
    return "\n".join(out)
