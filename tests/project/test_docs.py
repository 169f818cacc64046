"""The documentation against the code: README.md stays a short user guide, every environment variable
the code reads is in docs/settings.md (and only those), relative links point to files that exist, and
the README's Python tour and command lines run against the current API and argument parsers."""
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
CODE = ("mgx_graph", "operators", "models")
VAR = re.compile(r"\b(?:MIGRAPHX|MGX_GRAPH)_[A-Z0-9_]*[A-Z0-9]\b")
QUOTED_VAR = re.compile(r"""["']((?:MIGRAPHX|MGX_GRAPH)_[A-Z0-9_]*[A-Z0-9])["']""")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def variables_read() -> set:
    """Names the code reads: the quoted MIGRAPHX_* / MGX_GRAPH_* strings of the package's Python files
    (every read goes through mgx_graph.env or os.environ with the name as a literal)."""
    names = set()
    for folder in CODE:
        for path in (ROOT / folder).rglob("*.py"):
            names |= set(QUOTED_VAR.findall(_text(path)))
    return names


def test_readme_is_a_short_guide():
    text = _text(README)
    assert len(text.splitlines()) <= 300, "README.md is the user guide: move details to docs/"
    assert "\n## Trust model\n" in text
    for name in ("MIGRAPHX_HIP_GRAPH", "MIGRAPHX_HIP_GRAPH_DEBUG"):
        assert re.search(rf"`{name}\b", text), name
    for cmd in ("make demo", "make test"):
        assert cmd in text


def test_readme_installs_from_pypi_alone():
    """Every install the README shows takes its packages from PyPI: no other index, no wheel folder or URL."""
    text = _text(README)
    installs = [ln for ln in text.splitlines() if re.search(r"\bpip3? install\b", ln)]
    assert len(installs) >= 5, installs  # the scan sees the Install section
    for line in installs:
        assert not re.search(r"--(extra-)?index-url|\s-i\s|--find-links|\s-f\s|https?://", line), line
    assert "download.pytorch.org" not in text


def test_every_variable_read_is_documented_and_every_documented_one_is_read():
    read = variables_read()
    assert {"MIGRAPHX_HIP_GRAPH", "MIGRAPHX_HIP_GRAPH_DEBUG", "MGX_GRAPH_CACHE"} <= read  # the scan works
    documented = set(VAR.findall(_text(ROOT / "docs" / "settings.md")))
    assert not read - documented, f"read in the code, missing from docs/settings.md: {sorted(read - documented)}"
    assert not documented - read, f"in docs/settings.md, read nowhere in the code: {sorted(documented - read)}"


def test_variables_named_in_the_docs_exist():
    read = variables_read()
    for path in [README] + DOCS:
        unknown = set(VAR.findall(_text(path))) - read
        assert not unknown, f"{path.name} names variables the code does not read: {sorted(unknown)}"


@pytest.mark.parametrize("path", [README] + DOCS, ids=lambda p: p.name)
def test_relative_links_point_to_existing_files(path):
    text = FENCE.sub("", _text(path))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        if not (path.parent / target.split("#")[0]).exists():
            broken.append(target)
    assert not broken, f"{path.name}: links to missing files: {broken}"


def _blocks(path: Path, lang: str) -> list:
    return [body for kind, body in FENCE.findall(_text(path)) if kind == lang]


def _model(path: Path) -> None:
    """A small float model with the README tour's input ``x`` [1, 3, 224, 224]."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 224, 224])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    b = numpy_helper.from_array(np.float32(0.5).reshape(1), "b")
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "b"], ["a"]),
             helper.make_node("Sigmoid", ["a"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "tour", [x], [y], [b]),
                          opset_imports=[helper.make_opsetid("", 17)])
    path.write_bytes(m.SerializeToString())


def test_readme_python_tour_runs(tmp_path, monkeypatch):
    """The README's Python block, run as it is on ref against a small model; its outputs checked with numpy."""
    block = _blocks(README, "python")[0]
    _model(tmp_path / "model.onnx")
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(block, "README.md", "exec"), ns)
    x = ns["x"]
    want = 1 / (1 + np.exp(-(np.maximum(x, 0) + 0.5)))
    np.testing.assert_allclose(ns["y"], want, rtol=1e-5, atol=1e-6)
    assert (tmp_path / "model.mxr").is_file()


def _command_lines():
    for path in [README, ROOT / "docs" / "cli.md"]:
        for body in _blocks(path, ""):
            for line in body.splitlines():
                words = shlex.split(line, comments=True)
                while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
                    words = words[1:]
                if words and words[0] == "mgx-graph":
                    yield path.name, words[1:]


def test_documented_command_lines_parse():
    from mgx_graph.cli.main import build_parser

    lines = list(_command_lines())
    assert {w[0] for _, w in lines} >= {"generate", "compile", "verify", "run", "perf"}
    for name, words in lines:
        try:
            build_parser().parse_args(words)
        except SystemExit:
            pytest.fail(f"{name}: `mgx-graph {' '.join(words)}` does not parse")


def test_readme_llm_example_runs_and_matches_onnxruntime_genai(model_cache, monkeypatch, capsys):
    """The README's LLM block, run as it is (target "auto": ref here), in the test's model cache; its
    chat answer equals onnxruntime-genai's own greedy decode of the chat-template ids."""
    og = pytest.importorskip("onnxruntime_genai")
    pytest.importorskip("transformers")
    block = _blocks(README, "python")[1]
    assert "LLM(" in block
    monkeypatch.setenv("MGX_GRAPH_CACHE", str(model_cache))
    ns: dict = {}
    exec(compile(block, "README.md", "exec"), ns)
    res, llm = ns["res"], ns["llm"]
    model = og.Model(str(llm.runner.layout.folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(res.prompt_token_ids) + 16, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens([list(res.prompt_token_ids)])
    want = []
    while not gen.is_done():
        gen.generate_next_token()
        want.append(int(gen.get_next_tokens()[0]))
    assert res.token_ids == want
    assert res.text in capsys.readouterr().out
