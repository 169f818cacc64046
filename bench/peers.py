"""The peer benchmark of ``bench/real_models.py --peers``: each real model on mgx_graph (eager and with
graphs) next to onnxruntime CPU, onnxruntime's CUDA execution provider and the CUDA EP with
``enable_cuda_graph``, in one process, on the same inputs.

What is timed (median milliseconds over ``n`` runs, after ``warmup`` untimed runs of the same kind):

* **mgx_graph**: ``Program.run_async`` on device-resident inputs (CuPy arrays on ``gpu``, numpy on
  ``ref``) made once before timing, then ``context.synchronize(queue)``; the whole of both is one run.
  ``host_us_per_run``: the part of a run spent in ``run_async`` before it returns (issuing the work; on
  ``ref`` the work itself runs there).  ``kernels_per_run``: ``stats()["launches_per_run_eager"]`` (kernel
  launches one eager run issues); ``launches_per_run``: ``stats()["launches_per_run"]`` of the last run
  (a graph replay counts one).  Graph mode takes at least 3 untimed runs (warmup, warmup, capture).
* **onnxruntime CPU**: ``InferenceSession.run`` on the host inputs (default threads).
* **onnxruntime CUDA EP**, with and without ``enable_cuda_graph``: every input and output bound to a
  device ``OrtValue`` with a fixed address through ``io_binding()``, ``run_with_iobinding`` (which
  synchronizes the EP's stream before it returns).  A model whose declared output rank differs from
  the produced one (onnxruntime: "Invalid rank for output") gets outputs that onnxruntime allocates
  instead, bound anew before each run (without graph) or kept from the captured run (with graph), and
  ``<column>_output_binding`` "onnxruntime" (:class:`BoundOutputs`).  Where onnxruntime has no CUDA
  provider, or cannot build or capture the model (control flow, nodes placed on the CPU), the column is
  None and ``<column>_reason`` says why.

Errors: ``max_abs_err`` is the largest |mgx_graph - onnxruntime CPU| over every output of the first
run and of a run after the timed ones, eager and graph; ``passed`` applies the model's tolerance
(``mgx_graph.models.pypi``) element-wise, as ``tests/models/test_real_models.py`` does.
"""
from __future__ import annotations

import os
import statistics
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

COLUMNS = ("mgx_eager_ms", "mgx_graph_ms", "ort_cpu_ms", "ort_cuda_ms", "ort_cuda_graph_ms")
LABELS = {"mgx_eager_ms": "mgx_graph eager", "mgx_graph_ms": "mgx_graph graph", "ort_cpu_ms": "onnxruntime CPU",
          "ort_cuda_ms": "onnxruntime CUDA EP", "ort_cuda_graph_ms": "onnxruntime CUDA EP + CUDA graph"}


@dataclass
class Case:
    """One model on one set of inputs: ``feeds`` {input name: numpy array}, the tolerance its outputs
    meet against onnxruntime CPU (|got - want| <= atol + rtol * |want|, and the same argmax along
    ``argmax_axis`` when set)."""

    name: str
    path: str
    feeds: dict
    input_dims: dict | None
    rtol: float
    atol: float
    argmax_axis: int | None = None
    note: str = ""
    want: list = field(default_factory=list)


def pypi_case(name: str, cache) -> Case:
    import onnxruntime as ort

    from mgx_graph.models.pypi import REAL_MODELS, model_path, random_feeds

    m = REAL_MODELS[name]
    path = model_path(name, cache)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = random_feeds(sess, m.input_dims, m.int_high)
    return Case(name, path, feeds, {k: list(v.shape) for k, v in feeds.items()}, m.rtol, m.atol,
                m.argmax_axis, m.note)


def minilm_case(cache, sentences, atol: float) -> Case:
    from mgx_graph.models import build
    from mgx_graph.models.oracle import tokenize_batch

    info = build("minilm", cache_dir=cache, progress=False)
    feeds = tokenize_batch(info, sentences)
    shape = list(feeds["input_ids"].shape)
    return Case("minilm", str(info.onnx_path), feeds, {k: shape for k in feeds}, 0.0, atol)


def silero_case(name: str, cache) -> Case:
    """One chunk of a gated 220 Hz tone plus noise with a seeded nonzero recurrent state."""
    from mgx_graph.models.pypi import SILERO_MODELS, silero_path

    n, has_sr = SILERO_MODELS[name]
    rng = np.random.default_rng(0)
    t = np.arange(n) / 16000.0
    x = (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.normal(size=n)).astype(np.float32)[None]
    feeds = {"input": x, "state": (0.1 * rng.normal(size=(2, 1, 128))).astype(np.float32)}
    if has_sr:
        feeds["sr"] = np.array(16000, np.int64)
    dims = {"input": [1, n], "state": [2, 1, 128]} if has_sr else None
    return Case(name, silero_path(name, cache), feeds, dims, 0.0, 1e-4)


def _median_ms(fn, n: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _check(case: Case, got) -> tuple[float, bool]:
    """(max abs error, within tolerance) of ``got`` against onnxruntime CPU's outputs."""
    from mgx_graph.models.pypi import errors

    err = max((a for a, _ in errors(got, case.want)), default=0.0)
    ok = len(got) == len(case.want) and all(
        g.shape == w.shape and np.allclose(g, w, rtol=case.rtol, atol=case.atol) and
        (case.argmax_axis is None or np.array_equal(g.argmax(case.argmax_axis), w.argmax(case.argmax_axis)))
        for g, w in zip(got, case.want))
    return err, ok


def measure_mgx(case: Case, target: str, hip_graph: bool, n: int, warmup: int) -> dict:
    """Compile ``case`` for ``target``, check its outputs and time it (see the module docstring)."""
    import mgx_graph
    from mgx_graph.cli.perf import device_inputs

    prefix = "mgx_graph" if hip_graph else "mgx_eager"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = mgx_graph.compile(case.path, target=target, hip_graph=hip_graph, input_dims=case.input_dims)
    try:
        err, ok = _check(case, prog.run(case.feeds))
        dev = device_inputs(prog, case.feeds)
        ctx, q = prog.context, prog.queue
        host_us, times = [], []
        for k in range(max(warmup, 3 if hip_graph else 1) + n):
            t0 = time.perf_counter()
            prog.run_async(dev, q)
            t1 = time.perf_counter()
            ctx.synchronize(q)
            t2 = time.perf_counter()
            if k >= max(warmup, 3 if hip_graph else 1):
                host_us.append((t1 - t0) * 1e6)
                times.append((t2 - t0) * 1e3)
        err2, ok2 = _check(case, prog.run(case.feeds))
        st = prog.stats()
    finally:
        prog.release()
    row = {f"{prefix}_ms": statistics.median(times), f"{prefix}_host_us_per_run": statistics.median(host_us),
           f"{prefix}_kernels_per_run": st["launches_per_run_eager"],
           f"{prefix}_launches_per_run": st["launches_per_run"],
           f"{prefix}_max_abs_err": max(err, err2), f"{prefix}_passed": bool(ok and ok2),
           "host_fallback_instructions": st["host_fallback_instructions"]}
    if hip_graph:
        row.update({"mgx_graph_regions": len(st["regions"]), "mgx_graph_captures": st["captures"],
                    "mgx_graph_replays": st["replays"], "mgx_graph_fallbacks": st["fallbacks"]})
    return row


def measure_ort_cpu(case: Case, n: int, warmup: int) -> float:
    import onnxruntime as ort

    sess = ort.InferenceSession(case.path, providers=["CPUExecutionProvider"])
    return _median_ms(lambda: sess.run(None, case.feeds), n, warmup)


def cuda_unavailable() -> str | None:
    """Why onnxruntime's CUDA EP cannot run here (None: it is available)."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return (f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (providers: "
                f"{', '.join(ort.get_available_providers())}); install onnxruntime-gpu (the `peers` extra)")
    return None


REJECTED = "Invalid rank for output"  # onnxruntime's error for an output bound with another rank than declared


class BoundOutputs:
    """The outputs of ``io`` (an IOBinding of ``sess``) on ``device``.

    First one OrtValue per output with the shape of onnxruntime CPU's result (``want``) at a fixed
    address (``binding`` "fixed").  onnxruntime rejects those for a model whose declared output rank
    differs from the one it produces (``REJECTED``); the outputs are then allocated by onnxruntime
    (``bind_output(name, device)``, ``binding`` "onnxruntime"): bound anew before every run when
    ``rebind_each_run``, else (a CUDA-graph session) only after onnxruntime rejected the previous run's,
    so the buffers of the captured run stay bound for the replays (a replay does not validate them).
    ``rejected`` counts the runs onnxruntime rejected and ran again."""

    def __init__(self, ort, sess, io, want, device: str, rebind_each_run: bool):
        self.sess, self.io, self.device, self.rebind_each_run = sess, io, device, rebind_each_run
        self.binding, self.rejected = "fixed", 0
        self.fixed = [ort.OrtValue.ortvalue_from_shape_and_type(list(w.shape), w.dtype, device, 0) for w in want]
        for o, ov in zip(sess.get_outputs(), self.fixed):
            io.bind_ortvalue_output(o.name, ov)

    def _bind_by_onnxruntime(self) -> None:
        self.io.clear_binding_outputs()
        for o in self.sess.get_outputs():
            self.io.bind_output(o.name, self.device)

    def run(self) -> None:
        if self.binding == "onnxruntime" and self.rebind_each_run:
            self._bind_by_onnxruntime()
        try:
            self.sess.run_with_iobinding(self.io)
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own types; anything else is re-raised
            if REJECTED not in str(e):
                raise
            self.binding = "onnxruntime"
            self.rejected += 1
            self._bind_by_onnxruntime()
            self.sess.run_with_iobinding(self.io)

    def values(self) -> list:
        return [ov.numpy() for ov in (self.fixed if self.binding == "fixed" else self.io.get_outputs())]


def measure_ort_bound(case: Case, n: int, warmup: int, provider: str, opts: dict, device: str,
                      cuda_graph: bool) -> tuple[float | None, str | None, float, str | None]:
    """(median ms, None, max abs error vs onnxruntime CPU, output binding) of ``case`` on ``provider``
    (with provider options ``opts``) with every input and output bound on ``device`` through
    ``io_binding()`` (:class:`BoundOutputs`), after at least 2 untimed runs; or (None, reason, nan,
    binding) when it cannot run.  ``cuda_graph``: the session captures a graph (outputs are then not
    re-bound between runs, and a timed run that onnxruntime validated, so not a replay, is a reason)."""
    import onnxruntime as ort

    bound = None
    try:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        providers = [(provider, opts)] + (["CPUExecutionProvider"] if provider != "CPUExecutionProvider" else [])
        sess = ort.InferenceSession(case.path, so, providers=providers)
        if provider not in sess.get_providers():
            return None, f"the {provider} did not load (session providers: {sess.get_providers()})", \
                float("nan"), None
        io = sess.io_binding()
        inputs = {k: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v), device, 0)
                  for k, v in case.feeds.items()}
        for k, v in inputs.items():
            io.bind_ortvalue_input(k, v)
        bound = BoundOutputs(ort, sess, io, case.want, device, rebind_each_run=not cuda_graph)
        for _ in range(max(warmup, 2)):
            bound.run()
        before = bound.rejected
        ms = _median_ms(bound.run, n, 0)
        if cuda_graph and bound.rejected > before:
            return None, (f"onnxruntime validated the outputs it allocates on {bound.rejected - before} of {n} "
                          f"timed runs (declared output rank differs from the produced one): not graph replays"), \
                float("nan"), bound.binding
        got = bound.values()
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own types; the reason is recorded
        return None, f"{type(e).__name__}: {str(e).strip().splitlines()[0][:400] if str(e).strip() else ''}", \
            float("nan"), bound.binding if bound is not None else None
    from mgx_graph.models.pypi import errors

    return ms, None, max((a for a, _ in errors(got, case.want)), default=0.0), bound.binding


def measure_ort_cuda(case: Case, n: int, warmup: int, cuda_graph: bool) -> tuple[float | None, str | None, float,
                                                                                    str | None]:
    """:func:`measure_ort_bound` on the CUDA EP (device "cuda"), ``cuda_graph``: ``enable_cuda_graph``
    (the EP captures after its regular runs, later runs replay); (None, reason, nan, None) where
    onnxruntime has no CUDA EP."""
    reason = cuda_unavailable()
    if reason:
        return None, reason, float("nan"), None
    opts = {"enable_cuda_graph": "1"} if cuda_graph else {}
    return measure_ort_bound(case, n, warmup, "CUDAExecutionProvider", opts, "cuda", cuda_graph)


def run_case(case: Case, target: str, n: int, warmup: int, columns=COLUMNS) -> dict:
    """Every column of ``case``: the row of ``models[name]`` in the JSON (see the module docstring)."""
    import onnxruntime as ort

    import mgx_graph

    case.want = ort.InferenceSession(case.path, providers=["CPUExecutionProvider"]).run(None, case.feeds)
    row = {"inputs": {k: list(np.shape(v)) for k, v in case.feeds.items()}, "rtol": case.rtol, "atol": case.atol,
           "note": case.note, **{c: None for c in COLUMNS}}
    for hip_graph in (False, True):
        col = "mgx_graph_ms" if hip_graph else "mgx_eager_ms"
        if col not in columns:
            continue
        try:
            row.update(measure_mgx(case, target, hip_graph, n, warmup))
        except (mgx_graph.MgxError, RuntimeError, ValueError, MemoryError) as e:
            row[col[:-3] + "_reason"] = f"{type(e).__name__}: {e}"
    if "ort_cpu_ms" in columns:
        row["ort_cpu_ms"] = measure_ort_cpu(case, n, warmup)
    for col, graph in (("ort_cuda_ms", False), ("ort_cuda_graph_ms", True)):
        if col in columns:
            ms, reason, err, binding = measure_ort_cuda(case, n, warmup, graph)
            row[col] = ms
            if binding == "onnxruntime":
                row[col[:-3] + "_output_binding"] = binding
            if reason:
                row[col[:-3] + "_reason"] = reason
            else:
                row[col.replace("_ms", "_max_abs_err")] = err
    modes = [p for p in ("mgx_eager", "mgx_graph") if f"{p}_ms" in columns]
    errs = [row[f"{p}_max_abs_err"] for p in modes if f"{p}_max_abs_err" in row]
    row["max_abs_err"] = max(errs) if errs else None
    row["passed"] = bool(modes) and all(row.get(f"{p}_passed") is True for p in modes)
    return row


def write_chart(res: dict, path: str) -> str | None:
    """A bar chart of the ms columns (log scale, one group of bars per model) as PNG at ``path``;
    returns None, or why no chart was written (matplotlib missing, nothing measured)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed"
    names = list(res["models"])
    cols = [c for c in COLUMNS if any(isinstance(r.get(c), (int, float)) for r in res["models"].values())]
    if not names or not cols:
        return "no time was measured"
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(names) + 2), 5.0))
    width = 0.8 / len(cols)
    values = [r[c] for r in res["models"].values() for c in cols if isinstance(r.get(c), (int, float)) and r[c] > 0]
    bottom = 10 ** np.floor(np.log10(min(values) / 2)) if values else 1e-3
    for k, c in enumerate(cols):
        xs = [i + (k - (len(cols) - 1) / 2) * width for i in range(len(names))]
        pts = [(x, res["models"][m].get(c)) for x, m in zip(xs, names)]
        pts = [(x, y) for x, y in pts if isinstance(y, (int, float)) and y > 0]
        ax.bar([x for x, _ in pts], [y - bottom for _, y in pts], width, bottom=bottom, label=LABELS[c])
        for x, y in pts:
            ax.text(x, y, f"{y:.3g}", ha="center", va="bottom", fontsize=6, rotation=90)
    ax.set_yscale("log")
    ax.set_ylim(bottom=bottom, top=max(values) * 4 if values else None)
    ax.set_ylabel("median ms per run (log scale)")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_title(f"real models, batch 1, target {res['target']}: "
                 f"{res['machine'].get('gpu') or res['machine'].get('cpu', '')}"[:110], fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
