"""mgx-graph: compile and run ONNX models with graph_launch capture and replay.

commands:
  generate MODEL --prompt TEXT   text generation with a decoder (smollm2, gpt2, llama, or a folder)
  serve MODEL                    an OpenAI-compatible HTTP server over a decoder folder, in-flight batching
  export CHECKPOINT OUT          a transformers checkpoint to an onnxruntime-genai folder (their builder)
  compile MODEL.onnx [-o P.mxr]  print the compiled program, its graph_launch regions and scratch size; save it
  verify MODEL.onnx              compare the target with ref and onnxruntime CPU on the same inputs (PASSED/FAILED)
  run MODEL.onnx|P.mxr           one run with random or given inputs; save the outputs
  perf MODEL.onnx|P.mxr          per-instruction times and a summary, like migraphx-driver perf
  settings [--json]              the MIGRAPHX_* variables: value now, default and what each does

Inputs (compile, verify, run, perf): --input-dim sets shapes, --input / --fill0 / --fill1 set values,
the others are seeded random. Models whose shapes depend on run-time values (silero-vad's sr, a
Reshape fed by a computed shape) are specialized for those inputs at their first run.
A program saved by compile -o (P.mxr) runs with the target, graphs and precision it was compiled with.
MIGRAPHX_HIP_GRAPH=1 turns graphs on as --hip-graph does.
An error is one "mgx-graph: error: ..." line on stderr, exit status 1 (2 for a malformed flag, 130
when interrupted); --debug or MGX_GRAPH_DEBUG=1 also prints its traceback.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Any

import numpy as np

from ..serve.server import add_parser as add_serve_parser, cmd_serve
from .errors import Parser, debug_wanted, float_in, int_at_least, report
from .export import add_parser as add_export_parser, cmd_export
from .generate import add_parser as add_generate_parser, cmd_generate  # noqa: F401  (cmd_generate: public)
from .inputs import UsageError, parse_input_dims, plan_inputs, random_inputs  # noqa: F401  (random_inputs: public)
from .model_arg import fp16_warnings, model_path, warn
from .saved import is_intact_saved_program, is_saved_program, open_saved


# -- the model commands -----------------------------------------------------------------------------
class _Session:
    """One model command: the model file (or saved program, ``saved``), its inputs as the flags set them,
    the resolved target.  ``saved_ok``: whether the command takes a saved program (UsageError if not)."""

    def __init__(self, args, saved_ok: bool = True):
        from ..onnx import load_model
        from ..compiler import hip_graph_from_env
        from ..targets import resolve_target

        self.args = args
        parse_input_dims(args.input_dim)  # malformed flags are reported before the model is read
        self.path = model_path(args.model)
        self.saved = self._loaded = None
        if is_saved_program(self.path):
            if not saved_ok:
                if not is_intact_saved_program(self.path):
                    from ..mxr.save_load import load

                    load(self.path).release()  # a damaged file: its ParseError says what is wrong
                raise UsageError(f"{self.path} is a saved program: {args.command} compares with onnxruntime and ref "
                                 f"compiles of the ONNX model, so give the model")
            self.saved, self.proto = open_saved(self.path, args)
            self._loaded = self.saved
        else:
            self.proto = load_model(self.path)
        dims = args.input_dim
        if self.saved is not None and not dims:  # a saved program's inputs keep the dims it was compiled with
            dims = [[tok for n, lens in (self.saved.options.get("input_dims") or {}).items()
                     for tok in [f"@{n}"] + [str(int(d)) for d in lens]]] or None
            dims = dims if dims and dims[0] else None
        self.plan = plan_inputs(self.proto, dims, args.input, args.fill0, args.fill1, args.seed)
        self.target = self.saved.target if self.saved else resolve_target(args.target)
        self.hip_graph = self.saved.hip_graph if self.saved else bool(args.hip_graph) or hip_graph_from_env()
        self.fp16 = self.saved.fp16 if self.saved else bool(args.fp16)
        self.output_names = [o.name for o in self.proto.graph.output]
        if self.plan.defaulted:
            said = ", ".join(f"{d.name}[{d.axis}]" for d in self.plan.defaulted)
            warn(f"symbolic dims set to 1: {said}; set them with --input-dim (an error will say how)")
        if self.saved is None:
            fp16_warnings(args.fp16, self.target, self.proto)
        self.feeds = self.plan.feeds()  # in the model's dtypes (onnxruntime's inputs)
        # quantize_fp16 turns every float32 parameter into a float16 one: the program takes half inputs
        self.prog_feeds = {n: a.astype(np.float16) if self.fp16 and a.dtype == np.float32 else a
                           for n, a in self.feeds.items()}

    @contextlib.contextmanager
    def hinting(self):
        """Errors while dims were set to 1 get a note naming those dims and how to set them."""
        from ..errors import MgxError

        try:
            yield
        except MgxError as e:
            note = self.plan.defaulted_note()
            if not note:
                raise
            raise UsageError(f"{type(e).__name__}: {e}\n  note: {note}") from e

    def compile(self, target=None, hip_graph=None):
        """The program: compiled from the model, or a saved program as it was saved (loaded again after
        the first call)."""
        from ..compiler import compile as compile_model
        from ..mxr.save_load import load

        if self.saved is not None:
            prog, self._loaded = self._loaded or load(self.path), None
            return prog
        hg = self.hip_graph if hip_graph is None else hip_graph
        with self.hinting():
            return compile_model(self.proto, target=target or self.target, hip_graph=hg,
                                 input_dims=self.plan.dims, fp16=self.args.fp16, alias="auto")

    def run(self, prog, times: int = 1) -> list:
        with self.hinting():
            out: list = []
            for _ in range(times):
                out = prog.run(self.prog_feeds)
            return out

    def label(self, hip_graph=None) -> str:
        hg = self.hip_graph if hip_graph is None else hip_graph
        return f"{self.target}{' + graph_launch' if hg else ''}"


def _emit(args, doc: dict, text_lines) -> None:
    if args.json:
        print(json.dumps(doc, indent=2, default=_json_default))
    else:
        for line in text_lines:
            print(line)


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def _specialized(prog):
    """The compiled program that ran: ``prog`` itself, or a dynamic program's last specialization."""
    if prog.is_compiled():
        return prog
    d = prog.dispatcher
    return d.last() if d is not None else None


def _check_output_file(path, flag: str) -> None:
    """UsageError, before anything is compiled, when ``path`` cannot be written as a file: it is a
    folder, or its folder does not exist or is a file."""
    if path is None:
        return
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path}: is a folder; give a file name (e.g. {os.path.join(path, 'model.mxr')})")
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        what = "is not a folder" if os.path.exists(parent) else "does not exist"
        raise UsageError(f"{flag} {path}: {parent} {what}")


def _make_output_dir(path) -> None:
    """Make the folder ``path`` (and its parents) before the model runs; UsageError naming the flag when
    that cannot be done (a file is in the way, no permission)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"--output-dir {path}: is a file, not a folder")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--output-dir {path}: cannot make the folder ({e.strerror or e})") from None


def cmd_compile(args) -> int:
    _check_output_file(args.output, "-o/--output")
    s = _Session(args)
    prog = s.compile()
    dynamic = not prog.is_compiled()
    if dynamic:
        s.run(prog)  # shapes depend on run-time values: specialize for the given inputs
    spec = _specialized(prog)
    regions = [m for m in spec.modules if ":graph_launch" in m]
    st = prog.stats()
    doc = {"model": s.path, "target": s.target, "hip_graph": s.hip_graph, "inputs": _inputs_doc(s),
           "specialized": dynamic, "values": _known_values(prog) if dynamic else {},
           "regions": [{"module": m, "instructions": _n_instructions(spec.modules[m])} for m in regions],
           "scratch_bytes": st["scratch_bytes"], "literal_bytes": st["literal_bytes"]}
    lines = [f"Compiled [ {s.label()} ]: {s.path}", f"inputs: {s.plan.describe()}"]
    if dynamic:
        vals = ", ".join(f"{k}={v}" for k, v in doc["values"].items())
        lines.append("shapes depend on run-time values: specialized for these inputs" +
                     (f" ({vals})" if vals else ""))
    if args.print:
        lines.append(spec.print().rstrip("\n"))
        doc["program"] = spec.print()
    lines.append(f"graph_launch regions: {len(regions)}")
    lines += [f"  {r['module']}: {r['instructions']} instructions" for r in doc["regions"]]
    lines += [f"peak scratch bytes: {st['scratch_bytes']}", f"literal bytes: {st['literal_bytes']}"]
    if args.output:
        try:
            prog.save(args.output)
        except OSError as e:
            raise UsageError(f"-o/--output {args.output}: cannot write the program ({e.strerror or e})") from None
        doc["saved"] = args.output
        lines.append(f"saved: {args.output}")
    _emit(args, doc, lines)
    prog.release()
    return 0


def _n_instructions(module) -> int:
    return sum(1 for i in module.instructions if not i.op.builtin)


def _known_values(prog) -> dict:
    known = prog.dispatcher.last_known()
    return {k: np.asarray(v).tolist() for k, v in sorted(known.items())}


def _inputs_doc(s) -> dict:
    return {n: {"dtype": s.plan.inputs[n].dtype.name, "shape": s.plan.dims[n]} for n in s.plan.inputs}


def _errors(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    diff = np.abs(a - b)
    finite = np.isfinite(diff)
    same_nonfinite = np.array_equal(np.isnan(a), np.isnan(b)) and np.array_equal(np.isinf(a), np.isinf(b))
    absd = float(diff[finite].max()) if finite.any() else 0.0
    rel = float((diff[finite] / np.maximum(np.abs(b[finite]), 1e-12)).max()) if finite.any() else 0.0
    rms = float(np.sqrt(np.mean(diff[finite] ** 2))) if finite.any() else 0.0
    return absd, rel, rms, same_nonfinite


def _compare(k: int, name: str, g, w, label: str, rtol: float, atol: float):
    """One output against one oracle: (passed, report dict, text line).  A float16 output of a
    program run with --fp16 is compared with a float32 oracle in float32."""
    w = np.asarray(w)
    doc: dict[str, Any] = {"output": name, "against": label, "dtype": str(g.dtype), "shape": list(g.shape)}
    what = f"output {k} '{name}' {g.dtype}{list(g.shape)} vs {label}"
    if g.dtype == np.float16 and w.dtype == np.float32:
        g = g.astype(np.float32)
    if g.shape != w.shape or g.dtype != w.dtype:
        doc.update(passed=False, expected_dtype=str(w.dtype), expected_shape=list(w.shape))
        return False, doc, (f"output {k} '{name}': {g.dtype}{list(g.shape)} vs {label} "
                            f"{w.dtype}{list(w.shape)}: FAILED")
    if g.dtype.kind in "fc":
        absd, rel, rms, nf = _errors(g, w)
        good = bool(nf and np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True))
        doc.update(passed=good, max_abs_error=absd, max_rel_error=rel, rms_error=rms)
        return good, doc, (f"{what}: max abs error {absd:.3g}, max rel error {rel:.3g}, rms error {rms:.3g}: "
                           f"{'PASSED' if good else 'FAILED'}")
    good = bool(np.array_equal(g, w))
    doc.update(passed=good, identical=good)
    return good, doc, f"{what}: {'identical' if good else 'different'}: {'PASSED' if good else 'FAILED'}"


def _onnxruntime(path: str, feeds: dict) -> list:
    import onnxruntime as ort

    try:
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        return sess.run(None, feeds)
    except Exception as e:  # the oracle itself refuses these inputs
        raise UsageError(f"onnxruntime CPU cannot run the model on these inputs ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:300]}); give real values with --input") from None


def cmd_verify(args) -> int:
    s = _Session(args, saved_ok=False)
    target = s.compile()
    ref = s.compile(target="ref", hip_graph=False)
    lines = [f"Running [ {s.label()} ]: {s.path}", f"inputs: {s.plan.describe()}"]
    got = s.run(target, 4 if s.hip_graph else 1)  # warmup, warmup, capture, replay: compare a replay
    lines.append("Running [ ref ]")
    want_ref = s.run(ref)
    lines.append("Running [ onnxruntime CPU ]")
    want_ort = _onnxruntime(s.path, s.feeds)
    names = s.output_names or [f"output_{k}" for k in range(len(got))]
    ok, reports = True, []
    for k, (name, g, r, o) in enumerate(zip(names, got, want_ref, want_ort)):
        for label, w in (("onnxruntime", o), ("ref", r)):
            good, doc, line = _compare(k, name, g, w, label, args.rtol, args.atol)
            ok = ok and good
            reports.append(doc)
            lines.append(line)
    st = target.stats()
    if s.hip_graph:
        lines.append(f"graph: captures {st['captures']}, replays {st['replays']}, fallbacks {st['fallbacks']}")
    lines.append("PASSED" if ok else "FAILED")
    doc = {"model": s.path, "target": s.target, "hip_graph": s.hip_graph, "inputs": _inputs_doc(s),
           "rtol": args.rtol, "atol": args.atol, "outputs": reports, "passed": ok,
           "graph": {k: st[k] for k in ("captures", "replays", "fallbacks")}}
    _emit(args, doc, lines)
    target.release()
    ref.release()
    return 0 if ok else 1


def cmd_run(args) -> int:
    s = _Session(args)
    _make_output_dir(args.output_dir)
    prog = s.compile()
    outs = s.run(prog)
    names = s.output_names or [f"output_{k}" for k in range(len(outs))]
    lines, saved = [f"Running [ {s.label()} ]: {s.path}", f"inputs: {s.plan.describe()}"], []
    stems: set[str] = set()
    for k, (name, o) in enumerate(zip(names, outs)):
        safe = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in name) or "output"
        while safe.lower() in stems:  # two names that write the same file: the later one gets its index
            safe = f"{safe}_{k}"
        stems.add(safe.lower())
        path = os.path.join(args.output_dir, f"{safe}.npy")
        np.save(path, o)
        saved.append({"output": name, "dtype": str(o.dtype), "shape": list(o.shape), "path": path})
        lines.append(f"{name}: {o.dtype}{list(o.shape)} -> {path}")
    _emit(args, {"model": s.path, "target": s.target, "hip_graph": s.hip_graph, "inputs": _inputs_doc(s),
                 "outputs": saved}, lines)
    prog.release()
    return 0


def cmd_perf(args) -> int:
    from .perf import format_report, measure, measure_graphs

    s = _Session(args)
    prog = s.compile(hip_graph=False)
    with s.hinting():
        rep = measure(prog, s.prog_feeds, args.iterations, offload=args.enable_offload_copy,
                      progress=not args.no_progress)
    prog.release()  # rep["launches_per_run"]: counted after the timed runs, before the profiled ones
    doc = {"model": s.path, "target": s.target, "inputs": _inputs_doc(s), **rep}
    lines = [format_report(rep), f"Launches per run: {rep['launches_per_run']}"]
    if s.hip_graph and s.saved is None:  # a saved program runs as it was compiled: no eager twin to compare
        g = s.compile(hip_graph=True)
        with s.hinting():
            gr = measure_graphs(g, s.prog_feeds, args.iterations, offload=args.enable_offload_copy,
                                progress=not args.no_progress)
        g.release()
        doc["graph"] = gr
        eager = rep["total_time_ms"]
        lines.append(f"Graph (graph_launch) total time: {gr['total_time_ms']:.6g}ms vs eager {eager:.6g}ms "
                     f"({eager / gr['total_time_ms']:.2f}x); launches per run: {gr['launches_per_run']} vs "
                     f"{rep['launches_per_run']}; regions: {gr['regions']}, captures {gr['captures']}, "
                     f"replays {gr['replays']}, fallbacks {gr['fallbacks']}")
    _emit(args, doc, lines)
    return 0


# -- the parser -------------------------------------------------------------------------------------
class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Raw description, a fixed width, every option's default, and options shown as in Python 3.11
    (``-n N, --iterations N``) on every Python version, so the help texts in docs/cli.md stay exact."""

    def __init__(self, prog):
        super().__init__(prog, width=100, max_help_position=32)

    def _get_help_string(self, action):
        text = action.help or ""
        d = action.default
        if "default" in text or not action.option_strings or d is None or d is False or d == argparse.SUPPRESS:
            return text
        return text + " (default: %(default)s)"

    def _format_action_invocation(self, action):
        if not action.option_strings:
            return super()._format_action_invocation(action)
        if action.nargs == 0:
            return ", ".join(action.option_strings)
        args = self._format_args(action, self._get_default_metavar_for_optional(action))
        return ", ".join(f"{o} {args}" for o in action.option_strings)


def _parser_kw() -> dict:
    kw = {"formatter_class": _HelpFormatter}
    if sys.version_info >= (3, 14):
        kw["color"] = False
    return kw


PERF_HELP = """\
Times the program as migraphx-driver perf does and prints its report. All times are in ms.
  Total time               whole runs, the queue synchronized after each; inputs are device arrays made
                           once (no host copies), unless --enable-offload-copy. Common average: the mean
                           without the top and bottom quartiles; percentiles are sorted[floor(p*(n-1))].
  Total instructions time  each instruction of main timed alone, the queue synchronized after it, over n
                           profiled runs: the sum of the instructions' common averages.
  Overhead time  A, B      A: dry run, runs with no instruction executed (binding the parameters, walking
                           the instructions, collecting the outputs); B: the profiled runs' time outside
                           their instructions (run time minus instruction time, as means). Both are
                           measured, never negative. Overhead percent: A of Total time, B of the
                           profiled run time. (migraphx-driver's second figure is Total time minus Total
                           instructions time, negative whenever the instructions timed alone add up to
                           more than a pipelined run.)
With --hip-graph, also the time of whole runs replayed as graphs, next to eager."""


def _model_options(c, saved: bool) -> None:
    c.add_argument("model", help="an .onnx file, " + ("a program saved by compile -o (.mxr), " if saved else "") +
                                 "a registry name or a built model folder")
    c.add_argument("--target", default="auto", choices=["auto", "gpu", "ref"],
                   help="where to run; auto: gpu if one is usable, else ref")
    c.add_argument("--hip-graph", action="store_true",
                   help="wrap capturable runs in graph_launch (default: off, or on with MIGRAPHX_HIP_GRAPH=1)")
    c.add_argument("--fp16", action="store_true", help="run in half precision (quantize_fp16) (default: off)")
    c.add_argument("--input-dim", nargs="+", action="append", metavar="@name d",
                   help="shapes of inputs, several in one flag: @input 1 512 @state 2 1 128; repeatable "
                        "(default: the model's dims; a symbolic dim is 1, or the size the same dim_param "
                        "has on another input)")
    c.add_argument("--input", action="append", metavar="name=file|value",
                   help="an input's value: a .npy / .pb file, or a literal in the input's dtype (sr=16000, "
                        "x=[[1,2]]; a number fills a whole tensor); repeatable (default: random)")
    c.add_argument("--fill0", nargs="*", metavar="name",
                   help="fill the named inputs, or all others when no name is given, with 0 (default: random)")
    c.add_argument("--fill1", nargs="*", metavar="name",
                   help="fill the named inputs, or all others when no name is given, with 1 (default: random)")
    c.add_argument("--seed", type=int_at_least(0), default=0,
                   help="seed of the random inputs: floats in [-1, 1), integers in {0, 1}; a scalar integer "
                        "the model compares with a constant takes that constant")
    c.add_argument("--json", action="store_true", help="print the report as one JSON object (default: text)")


def add_settings_parser(sub) -> None:
    """``mgx-graph settings [--json]``: each ``MIGRAPHX_*`` variable with its value now, its default and its
    doc (:func:`mgx_graph.settings.report`); an invalid value is the usual one-line error."""
    from ..settings import report

    c = sub.add_parser("settings", help="list the MIGRAPHX_* variables: value now, default, doc",
                       description="Prints every MIGRAPHX_* variable mgx_graph reads, by group, with its value in\n"
                                   "this environment, its default and what it does.", **_parser_kw())
    c.add_argument("--json", action="store_true", help="print a JSON list, one object per variable (default: text)")

    def cmd_settings(args) -> int:
        sys.stdout.write(report(as_json=args.json))
        return 0

    c.set_defaults(fn=cmd_settings)


def build_parser() -> argparse.ArgumentParser:
    from ..version import __version__

    ap = Parser(prog="mgx-graph", description=__doc__, **_parser_kw())
    ap.add_argument("--version", action="version", version=f"mgx-graph {__version__}",
                    help="print the version and exit")
    ap.add_argument("--debug", action="store_true",
                    help="print the traceback of an error (default: off, or on with MGX_GRAPH_DEBUG=1)")
    sub = ap.add_subparsers(dest="command", required=True,
                            metavar="{generate,serve,export,compile,verify,run,perf,settings}")
    add_generate_parser(sub, _parser_kw(), cmd_generate)
    add_serve_parser(sub, _parser_kw(), cmd_serve)
    add_export_parser(sub, _parser_kw(), cmd_export)
    add_settings_parser(sub)
    commands = (
        ("compile", "compile a model and print the program's graph_launch regions",
         "Compiles the model; a model whose shapes depend on run-time values is specialized for the given\n"
         "inputs (one run). Prints the regions, scratch and literal bytes, and with --print the program.\n"
         "With -o, saves the compiled program (.mxr), which compile, run and perf take as MODEL.",
         cmd_compile),
        ("verify", "compare the target with ref and onnxruntime CPU on the same inputs",
         "Runs the target (with graphs: until a replay), ref and onnxruntime CPU on the same inputs and\n"
         "compares every output; exits 0 when all pass, 1 otherwise.", cmd_verify),
        ("run", "one run; outputs saved as .npy", "Runs the model once and saves every output as .npy.", cmd_run),
        ("perf", "per-instruction times and a summary (migraphx-driver perf layout)", PERF_HELP, cmd_perf),
    )
    for name, help_, desc, fn in commands:
        c = sub.add_parser(name, help=help_, description=desc, **_parser_kw())
        _model_options(c, saved=name != "verify")
        c.set_defaults(fn=fn)
        if name == "compile":
            c.add_argument("--print", action="store_true", help="print every module (default: off)")
            c.add_argument("-o", "--output", metavar="FILE",
                           help="save the compiled program to FILE (.mxr), for mgx_graph.load and for compile, run "
                                "and perf as MODEL (default: not saved)")
        elif name == "verify":
            c.add_argument("--rtol", type=float_in(0.0), default=1e-3, help="relative tolerance of float outputs")
            c.add_argument("--atol", type=float_in(0.0), default=1e-4, help="absolute tolerance of float outputs")
        elif name == "run":
            c.add_argument("--output-dir", default="mgx_outputs", help="folder for the outputs' .npy files")
        elif name == "perf":
            c.add_argument("-n", "--iterations", type=int_at_least(1), default=100, help="timed runs of each kind")
            c.add_argument("--enable-offload-copy", action="store_true",
                           help="copy the inputs in and the outputs out in every timed run (default: off: "
                                "inputs stay on the device)")
            c.add_argument("--no-progress", action="store_true",
                           help="no progress bar on stderr (default: shown)")
    return ap


def help_texts() -> dict:
    """``{command line: its --help text}`` for ``mgx-graph`` and each command (as docs/cli.md shows them)."""
    ap = build_parser()
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    return {"mgx-graph --help": ap.format_help(),
            **{f"mgx-graph {name} --help": p.format_help() for name, p in sub.choices.items()}}


def main(argv=None) -> int:
    """Run ``mgx-graph`` with ``argv`` (default: sys.argv[1:]); returns the exit status.  An error is one
    ``mgx-graph: error: ...`` line on stderr (status 1; 2 for a malformed flag, 130 when interrupted),
    with its traceback only under ``--debug`` or MGX_GRAPH_DEBUG=1."""
    args = None
    try:
        args = build_parser().parse_args(argv)
        return args.fn(args)
    except SystemExit as e:  # argparse: --help, --version, a malformed flag
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except BrokenPipeError:  # e.g. piped into head
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except (Exception, KeyboardInterrupt) as e:  # one clear line, not a traceback
        return report(e, debug_wanted(args))


if __name__ == "__main__":
    sys.exit(main())
