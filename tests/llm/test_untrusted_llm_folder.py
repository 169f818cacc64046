"""Model folders as untrusted data: a file of the folder that is a symbolic link out of it (a config, the
ONNX model, a tokenizer file, the chat template) is a ParseError naming the file and where it resolves,
before it is opened; a config nested too deeply, with an integer too long to convert, or that is a FIFO
is a ParameterError naming the file.  Links that stay inside the folder still load."""
from __future__ import annotations

import json
import os

import pytest

from mgx_graph.errors import ParameterError, ParseError
from mgx_graph.llm.folder_config import load_tokenizer, read_json
from mgx_graph.llm.optimum_runner import read_folder
from mgx_graph.llm.runner import GenaiLayout
from test_llm_folder_errors import GENAI, _save_tokenizer, genai_folder, optimum_folder

SECRET = "secret-outside"


def _link_out(tmp_path, folder, name, content: bytes) -> str:
    """Replace ``folder/name`` by a link to a file outside the folder holding ``content``; its real path."""
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    target = outside / name.replace("/", "_")
    target.write_bytes(content)
    (folder / name).unlink(missing_ok=True)
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, folder / name)
    return os.path.realpath(target)


@pytest.mark.parametrize("name", ["genai_config.json", "model.onnx"])
def test_genai_files_linked_out_of_the_folder(tmp_path, name):
    folder = genai_folder(tmp_path)
    assert GenaiLayout.read(folder).context_length == GENAI["model"]["context_length"]
    real = _link_out(tmp_path, folder, name, (folder / name).read_bytes())  # the same bytes, outside
    with pytest.raises(ParseError, match=rf"{name}.*resolves to {real}, outside the model's folder"):
        GenaiLayout.read(folder)


@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "model.onnx"])
def test_optimum_files_linked_out_of_the_folder(tmp_path, name):
    folder = optimum_folder(tmp_path, generation={"eos_token_id": [6]})
    assert read_folder(folder)["eos_token_ids"] == [6]
    real = _link_out(tmp_path, folder, name, (folder / name).read_bytes())
    with pytest.raises(ParseError, match=rf"{name}.*resolves to {real}, outside the model's folder"):
        read_folder(folder)


def test_a_link_inside_the_folder_is_followed(tmp_path):
    folder = genai_folder(tmp_path)
    (folder / "sub").mkdir()
    os.replace(folder / "genai_config.json", folder / "sub" / "real.json")
    os.symlink("sub/real.json", folder / "genai_config.json")
    assert GenaiLayout.read(folder).vocab_size == GENAI["model"]["vocab_size"]


@pytest.mark.parametrize("name", ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json",
                                  "special_tokens_map.json", "additional_chat_templates/tool.jinja", "vocab.txt"])
def test_tokenizer_files_linked_out_of_the_folder(tmp_path, name):
    pytest.importorskip("transformers")
    vocab = _save_tokenizer(tmp_path / "tok")
    content = (tmp_path / "tok" / "tokenizer.json").read_bytes() if name == "tokenizer.json" else b"{}"
    real = _link_out(tmp_path, tmp_path / "tok", name, SECRET.encode() if name.endswith(".jinja") else content)
    with pytest.raises(ParseError, match=rf"{name}.*resolves to {real}, outside the model's folder"):
        load_tokenizer(tmp_path / "tok")
    os.unlink(tmp_path / "tok" / name)
    if name != "tokenizer.json":  # the folder without the link loads
        assert load_tokenizer(tmp_path / "tok")("hello")["input_ids"] == [vocab["hello"]]


def test_a_chat_template_inside_the_folder_is_read(tmp_path):
    pytest.importorskip("transformers")
    _save_tokenizer(tmp_path / "tok")
    (tmp_path / "tok" / "templates").mkdir()
    (tmp_path / "tok" / "templates" / "t.jinja").write_text("{{ messages[0]['content'] }}")
    os.symlink("templates/t.jinja", tmp_path / "tok" / "chat_template.jinja")
    assert load_tokenizer(tmp_path / "tok").chat_template == "{{ messages[0]['content'] }}"


@pytest.mark.parametrize("raw, says", [
    (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
    (b'{"model": {"vocab_size": ' + b"9" * 5000 + b"}}", "integer string conversion"),
])
def test_json_too_deep_or_with_huge_integers(tmp_path, raw, says):
    folder = genai_folder(tmp_path, raw=raw)
    with pytest.raises(ParameterError, match=rf"{folder / 'genai_config.json'}.*not valid JSON.*{says}"):
        GenaiLayout.read(folder)
    (tmp_path / "x.json").write_bytes(raw)
    with pytest.raises(ParameterError, match=says):
        read_json(tmp_path / "x.json")


def test_a_fifo_tokenizer_config_is_refused_without_blocking(tmp_path):
    _save_tokenizer(tmp_path / "tok")
    os.mkfifo(tmp_path / "tok" / "tokenizer_config.json")
    with pytest.raises(ParameterError, match="tokenizer_config.json.*not a regular file"):
        load_tokenizer(tmp_path / "tok")
