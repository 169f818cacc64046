"""The fuzz tests' verdicts: run a (mutated) model on mgx_graph and on onnxruntime CPU, compare, and
report a failure unless it is a known defect (fuzz_known.py).

Rules: mgx_graph raises only MgxError subclasses; where onnxruntime runs the model, mgx_graph's outputs
equal onnxruntime's (count, shapes, dtypes, values with NaN at the same places) or mgx_graph refuses with
an MgxError; where onnxruntime refuses it, mgx_graph refuses it too.  Every case runs under a memory cap
(:func:`memory_cap`) and, where files are involved, an open audit (:class:`OpenAudit`).

``MGX_FUZZ_REPORT=<file>`` appends each unknown failure to that file (one JSON line) instead of failing
the test, to list all the findings of a run rather than stop at the first; ``MGX_FUZZ_STATS=<file>``
writes the count of each outcome and known defect met at exit.
"""
from __future__ import annotations

import atexit
import base64
import collections
import contextlib
import json
import os
import sys
import traceback

import numpy as np

import mgx_graph
from fuzz_known import KNOWN

MEMORY_CAP = 512 << 20  # bytes of address space a case may add
# onnxruntime refusals that say nothing about the model's validity: no kernel for it; an opset version
# onnxruntime does not know as released ("under development")
ORT_NO_VERDICT = ("NOT_IMPLEMENTED", "ValidateOpsetForDomain")


STATS: collections.Counter = collections.Counter()


def count(family: str, outcome: str, new_input: bool = True) -> str:
    """Count ``outcome`` of a case of ``family`` (and the case, when ``new_input``); returns ``outcome``."""
    STATS[f"{family} {outcome}"] += 1
    STATS["inputs"] += new_input
    return outcome


@atexit.register
def _write_stats():
    if os.environ.get("MGX_FUZZ_STATS") and STATS:
        with open(os.environ["MGX_FUZZ_STATS"], "w") as f:
            json.dump(dict(sorted(STATS.items())), f, indent=1)


# -- failures -----------------------------------------------------------------------------------------
def fail(family: str, kind: str, detail: str, case: str, exc: BaseException | None = None,
         blob: bytes = b"") -> None:
    """Report a failure of ``kind`` (see fuzz_known.py) unless a known defect covers it."""
    error = type(exc).__name__ if exc is not None else ""
    text = f"{error}: {exc}\n{detail}" if exc is not None else detail
    tb = "".join(traceback.format_exception(exc)) if exc is not None else ""
    for k in KNOWN:
        if k.matches(family, kind, error, f"{text}\n{case}\n{tb}"):
            STATS[f"known {k.reproducer.split(':')[0]}"] += 1
            return
    report = os.environ.get("MGX_FUZZ_REPORT")
    if report:
        with open(report, "a") as f:
            f.write(json.dumps({"family": family, "kind": kind, "error": error, "detail": text[:2000],
                                "case": case[:4000], "traceback": tb[-3000:],
                                "blob": base64.b64encode(blob).decode("ascii") if isinstance(blob, bytes) and len(blob) < 65536 else str(blob)}) + "\n")
        return
    raise AssertionError(f"[{family}] {kind}: {text[:2000]}\ncase: {case[:4000]}\n{tb[-4000:]}")


# -- memory -------------------------------------------------------------------------------------------
def _address_space() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


@contextlib.contextmanager
def memory_cap(extra: int = MEMORY_CAP):
    """Limit the process's address space to its current size plus ``extra`` bytes (Linux; a no-op
    elsewhere): a size bomb then fails with MemoryError instead of taking the machine."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        now = _address_space()
    except (ImportError, OSError, ValueError):
        yield
        return
    cap = now + extra if now else resource.RLIM_INFINITY
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


# -- the open audit -----------------------------------------------------------------------------------
class OpenAudit:
    """Records the paths opened (``open`` audit events: builtins.open, io.open, os.open, ...) while active.
    The audit hook is added once per process and does nothing while no audit is active."""

    _active: list | None = None
    _installed = False

    def __enter__(self):
        if not OpenAudit._installed:
            sys.addaudithook(OpenAudit._hook)
            OpenAudit._installed = True
        self.paths: list[str] = []
        OpenAudit._active = self.paths
        return self

    def __exit__(self, *exc):
        OpenAudit._active = None

    @staticmethod
    def _hook(event, args):
        paths = OpenAudit._active
        if paths is not None and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            paths.append(os.fsdecode(args[0]))

    def outside(self, *folders: str) -> list[str]:
        """The opened paths (symlinks resolved) in none of ``folders``, Python's install (site-packages) and
        mgx_graph's own package folders."""
        from mgx_graph import operators

        own = (os.path.dirname(mgx_graph.__file__), os.path.dirname(operators.__file__))  # its modules
        allowed = [os.path.realpath(p) for p in (*folders, sys.prefix, sys.base_prefix, sys.exec_prefix, *own)]
        bad = []
        for p in self.paths:
            r = os.path.realpath(p)
            if not any(r == a or r.startswith(a + os.sep) for a in allowed):
                bad.append(f"{p} -> {r}")
        return bad


# -- running ------------------------------------------------------------------------------------------
def run_ort(model: bytes, feeds: dict | None):
    """``("ok", outputs)`` (``("ok", None)`` when ``feeds`` is None: the session was made), or
    ``("refused", exception)``."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        return "ok", (None if feeds is None else sess.run(None, feeds))
    except Exception as e:  # noqa: BLE001  (onnxruntime's refusals have several types)
        return "refused", e


def run_mgx(model, feeds: dict | None, **kw):
    """``("ok", outputs)`` (``None`` when ``feeds`` is None: compiled only), ``("typed", MgxError)`` or
    ``("untyped", exception)``; MemoryError (the cap) counts as untyped."""
    prog = None
    try:
        prog = mgx_graph.compile(model, target="ref", hip_graph=False, **kw)
        return "ok", (None if feeds is None else [np.asarray(o).copy() for o in prog.run(feeds)])
    except mgx_graph.MgxError as e:
        return "typed", e
    except Exception as e:  # noqa: BLE001  (anything else is a finding)
        return "untyped", e
    finally:
        if prog is not None:
            with contextlib.suppress(Exception):
                prog.release()


def differ(ours: list, theirs: list, rtol: float = 1e-4, atol: float = 1e-5) -> str | None:
    """Why two output lists differ (count, shape, dtype, values; NaN must sit at the same places), or None."""
    if len(ours) != len(theirs):
        return f"{len(ours)} outputs, expected {len(theirs)}"
    for k, (a, b) in enumerate(zip(ours, theirs)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"output {k}: {a.dtype}{list(a.shape)}, expected {b.dtype}{list(b.shape)}"
        try:
            if a.dtype.kind in "fc":
                tol = (1e-2, 1e-2) if a.dtype.itemsize <= 2 else (rtol, atol)
                np.testing.assert_allclose(a, b, rtol=tol[0], atol=tol[1], equal_nan=True)
            else:
                np.testing.assert_array_equal(a, b)
        except AssertionError as e:
            return f"output {k}: {str(e)[:1500]}"
    return None


def check_model(model, feeds: dict | None, family: str, case: str, new_input: bool = True) -> str:
    """Run ``model`` (bytes or a path) on both under the memory cap and judge it (see the module docstring);
    returns the outcome (``match``, ``both-refused``, ``typed-refusal``, ``compiled``,
    ``onnxruntime-unsupported``, ``known-defect``)."""
    return count(family, _judge(model, feeds, family, case), new_input)


def _judge(model: bytes, feeds: dict | None, family: str, case: str) -> str:
    with memory_cap():
        ort_state, theirs = run_ort(model, feeds)
        mgx_state, ours = run_mgx(model, feeds)
    if mgx_state == "untyped":
        kind = "memory" if isinstance(ours, MemoryError) else "untyped"
        fail(family, kind, f"onnxruntime: {ort_state} {_brief(theirs)}", case, ours, model)
        return "known-defect"
    if mgx_state == "typed":
        return "both-refused" if ort_state == "refused" else "typed-refusal"
    if ort_state == "refused" and any(w in str(theirs) for w in ORT_NO_VERDICT):
        return "onnxruntime-unsupported"  # onnxruntime has no kernel for it or a policy: no verdict on the model
    if ort_state == "refused":
        fail(family, "accepted", f"onnxruntime refused it: {_brief(theirs)}", case, blob=model)
        return "known-defect"
    if feeds is None:
        return "compiled"
    why = differ(ours, theirs)
    if why:
        fail(family, "mismatch", why, case, blob=model)
        return "known-defect"
    return "match"


def _brief(v) -> str:
    if isinstance(v, BaseException):
        return f"{type(v).__name__}: {str(v)[:600]}"
    return "" if v is None else f"{len(v)} outputs"


def describe(model_bytes: bytes, limit: int = 3000) -> str:
    """A mutated model as text for a report: its graph when it parses, else its bytes in hex."""
    import onnx

    try:
        return str(onnx.load_from_string(model_bytes))[:limit]
    except Exception:  # noqa: BLE001
        return model_bytes.hex()[:limit]
