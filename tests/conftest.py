import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
# The test folders mirror the package; a test may import another's models and helpers by module name
# (test basenames are unique across the folders).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.extend(os.path.join(_HERE, d) for d in sorted(os.listdir(_HERE))
                if os.path.isdir(os.path.join(_HERE, d)) and not d.startswith(("_", ".")))

from mgx_graph.runtime import gpu_available  # noqa: E402

HAVE_GPU = gpu_available()
TARGETS = ["ref"] + (["gpu"] if HAVE_GPU else [])


# Files that take minutes on a CPU (each builds a real model), longest first: under pytest-xdist they start
# first, so that no worker is still in one of them after the others ran out of files.  The two full SmolLM2
# exports come first: xdist gives the first file to the first worker, the second to the second, then a third
# to a worker left with two tests or fewer (test_smollm2_optimum_full.py has two), so both builds start at
# once on two workers, and test_smollm2.py's build is in the cache before the other files that need it
# (test_gemv_decode.py, test_merge_dots.py) start: they would wait for its lock, their worker idle.
LONGEST_FILES = ("test_smollm2_optimum_full.py", "test_smollm2.py", "test_llm_runner.py", "test_cli_export_archs_more.py",
                 "test_cli_export_archs.py", "test_greedy_host.py")


def pytest_configure(config):
    """Under ``--dist loadfile`` xdist by default sends the files with the most tests first, which leaves
    the few-test files that build real models to the end; the order of :func:`pytest_collection_modifyitems`
    is kept instead."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def _file_rank(items) -> dict:
    """Per test file: 0 .. n-1 for :data:`LONGEST_FILES`, then n for a file with a ``slow`` test, n + 1 else."""
    rank: dict = {}
    for item in items:
        path = item.path
        first = LONGEST_FILES.index(path.name) if path.name in LONGEST_FILES else len(LONGEST_FILES) + 1
        rank[path] = min(rank.get(path, first), first, len(LONGEST_FILES) if "slow" in item.keywords else first)
    return rank


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a usable GPU (CUDA or HIP) with CuPy")
    for item in items:
        if "gpu" in item.keywords and not HAVE_GPU:
            item.add_marker(skip)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the order the files are sent in
        rank = _file_rank(items)
        items.sort(key=lambda item: rank[item.path])  # stable: the collection order within a rank


def pytest_runtest_logreport(report):
    """With ``MGX_FAILURE_LOG`` set, each failed or erroring test phase is appended to that file as it
    happens (the test id, then its report): on the device machine a run cut short by its time limit still
    says why each test failed (pytest's own summary comes only at the end, from the controller)."""
    path = os.environ.get("MGX_FAILURE_LOG")
    if path and report.failed and not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller gets every report
        text = f"=== {report.nodeid} [{report.when}]\n{report.longreprtext[-6000:]}\n"
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)


@pytest.fixture(autouse=True)
def _mgx_graph_logger_restored():
    """The ``mgx_graph`` logger's handlers and level as they were before the test: ``mgx-graph serve``'s
    command adds a stderr handler (on the stream of that moment: a capture closed after the test) and sets
    the level before it opens the model, so a serve call that fails on a bad model (test_cli_errors.py)
    would double the trace lines later tests count and log to a closed stream."""
    import logging

    log = logging.getLogger("mgx_graph")
    handlers, level = list(log.handlers), log.level
    yield
    log.handlers[:] = handlers
    log.setLevel(level)


@pytest.fixture(params=TARGETS)
def target(request):
    return request.param


@pytest.fixture
def gpu_target():
    if not HAVE_GPU:
        pytest.skip("needs a usable GPU")
    return "gpu"


@pytest.fixture(autouse=True)
def _fresh_env(monkeypatch):
    """MIGRAPHX_* variables are read once per process; tests get a fresh read."""
    from mgx_graph import env

    env._reset_for_tests()
    yield
    env._reset_for_tests()


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory):
    """Cache folder for built models: $MGX_GRAPH_CACHE when set (reused across runs), else a temp dir.

    Under pytest-xdist the workers of one run share one temp folder (beside their own base temps), so a
    model is built once per run; ``mgx_graph.models.build`` locks each build in the cache, and a worker
    that needs a model another is building waits for it."""
    env = os.environ.get("MGX_GRAPH_CACHE")
    if env:
        return env
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "models"
        shared.mkdir(exist_ok=True)
        return str(shared)
    return str(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def run_shared(tmp_path_factory):
    """A folder of this test run shared by its pytest-xdist workers (beside their own base temps), for
    what one test file computes and others reuse within the run (tests/shared_oracle.py); never kept
    across runs, unlike ``model_cache`` with $MGX_GRAPH_CACHE."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "shared"
        shared.mkdir(exist_ok=True)
        return str(shared)
    return str(tmp_path_factory.mktemp("shared"))


@pytest.fixture(scope="module")
def silero(model_cache):
    """``silero(name)``: the path of a silero-vad model (models/pypi.py), the test skipped when it cannot be had."""
    from mgx_graph.models.pypi import silero_path

    def path(name):
        try:
            return silero_path(name, model_cache)
        except RuntimeError as e:
            pytest.skip(str(e))
    return path


@pytest.fixture(scope="module")
def llama(model_cache):
    """The decode step of a random LLaMA (models/llama.py, KV 16), built once per test module."""
    from mgx_graph.models import build

    try:
        return build("llama", cache_dir=model_cache, progress=False, max_cache_len=16)
    except ImportError as e:
        pytest.skip(f"model export needs the [export] extra: {e}")


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def tiny(request, model_cache):
    """A small random gpt2 and llama decode step (KV 16), one per parameter, built once per module."""
    from mgx_graph.models import build

    opts = {"gpt2": dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, max_cache_len=16),
            "llama": dict(max_cache_len=16)}[request.param]
    try:
        return build(request.param, cache_dir=model_cache, progress=False, **opts)
    except ImportError as e:  # torch / transformers missing
        pytest.skip(f"model export needs the [export] extra: {e}")


@pytest.fixture
def gemv_on(monkeypatch):
    """MIGRAPHX_GEMV=1 for the test (the default too; a test may set it itself)."""
    from mgx_graph import env

    monkeypatch.setenv("MIGRAPHX_GEMV", "1")
    env._reset_for_tests()
    yield
    env._reset_for_tests()


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def unfused(monkeypatch):
    """Compile without the kernel fusion passes (``fuse_attention``, ``fuse_reduce``, ``fuse_pointwise``):
    for tests that use chains of elementwise ops as a stand-in for so many kernels (graph regions, memory
    packing) or look at instructions the fusion would fold into one ``pointwise`` / ``fused_reduce``."""
    monkeypatch.setenv("MIGRAPHX_DISABLE_PASSES", "fuse_kernels")
