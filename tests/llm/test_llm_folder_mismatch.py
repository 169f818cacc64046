"""LLM folders whose graph runs but disagrees with their config, and names no file can have: typed errors
naming the file and the field (expected vs given), raised before any generation."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mgx_graph.errors import ParameterError, ParseError
from mgx_graph.llm.open_decoder import open_decoder
from mgx_graph.llm.runner import GenaiLayout, GenaiRunner
from test_llm_folder_errors import GENAI, HD, KV, LAYERS, OPTIMUM, VOCAB, _with, genai_folder

PAST = {f"past_key_values.{i}.{t}": (TensorProto.FLOAT, ["B", KV, "P", HD]) for i in range(LAYERS) for t in ("key", "value")}
PRESENT = [f"present.{i}.{t}" for i in range(LAYERS) for t in ("key", "value")]


def _runnable_graph(path, inputs: dict, outputs: list, width: int = VOCAB) -> None:
    """A graph that compiles: logits [B, S, width] gathered from a table by the ids, each present output
    its past input plus zero (the same shape, so it binds in place)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["logits"])]
    nodes += [helper.make_node("Add", [o.replace("present", "past_key_values"), "zero"], [o]) for o in outputs
              if o.startswith("present")]
    inits = [numpy_helper.from_array(rng.random((VOCAB, width)).astype(np.float32), "table"),
             numpy_helper.from_array(np.zeros(1, np.float32), "zero")]
    ins = [helper.make_tensor_value_info(n, t, d) for n, (t, d) in inputs.items()]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs]
    model = helper.make_model(helper.make_graph(nodes, "g", ins, outs, inits), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def _genai(tmp_path, cfg=GENAI, width=VOCAB):
    folder = genai_folder(tmp_path, cfg)
    _runnable_graph(folder / "model.onnx", {"input_ids": (TensorProto.INT64, ["B", "S"]),
                                            "attention_mask": (TensorProto.INT64, ["B", "T"]), **PAST},
                    ["logits", *PRESENT], width)
    return folder


def test_the_runnable_folder_runs(tmp_path):
    """The good folder of the cases below: the runner's logits are the table's rows of the ids."""
    runner = GenaiRunner(_genai(tmp_path), max_length=8, target="ref")
    logits = runner.run(2, np.array([[3, 7]]), np.array([2]))
    table = numpy_helper.to_array(onnx.load(str(runner.layout.onnx_path)).graph.initializer[0])
    np.testing.assert_array_equal(np.asarray(logits)[0], table[[3, 7]])


@pytest.mark.parametrize("vocab", [16, 10 ** 12])
def test_vocab_size_must_be_the_logits_width(tmp_path, vocab):
    folder = _genai(tmp_path, _with("model.vocab_size", vocab))
    with pytest.raises(ParameterError) as e:
        GenaiRunner(folder, max_length=8, target="ref")
    msg = str(e.value)
    assert "genai_config.json: field 'model.vocab_size'" in msg and f"{vocab}, but the logits" in msg, msg
    assert f"[1, 1, {VOCAB}]" in msg, msg


def test_a_logits_width_other_than_the_vocabulary_is_refused(tmp_path):
    with pytest.raises(ParameterError, match=f"'model.vocab_size': {VOCAB}, but .* is \\[1, 1, 40\\]"):
        open_decoder(str(_genai(tmp_path, width=40)), target="ref", max_length=8)


def test_a_file_name_with_a_nul_byte_is_a_parse_error(tmp_path):
    folder = genai_folder(tmp_path, _with("model.decoder.filename", "model.onnx\x00"))
    with pytest.raises(ParseError, match=r"field 'model.decoder.filename': expected a file name, got 'model.onnx\\x00'"):
        GenaiLayout.read(folder)
    with pytest.raises(ParseError, match="NUL byte"):
        open_decoder(str(folder), target="ref", max_length=8)


def test_an_optimum_decoder_without_present_outputs_is_named(tmp_path):
    folder = tmp_path / "optimum"
    folder.mkdir()
    _runnable_graph(folder / "model.onnx", {"input_ids": (TensorProto.INT64, ["B", "S"]),
                                            "attention_mask": (TensorProto.INT64, ["B", "T"]),
                                            "position_ids": (TensorProto.INT64, ["B", "S"]), **PAST}, ["logits"])
    (folder / "config.json").write_text(json.dumps(OPTIMUM))
    with pytest.raises(ParameterError, match="model.onnx: an optimum decoder must output 'present.0.key'"):
        open_decoder(str(folder), target="ref", max_length=8)


def test_an_optimum_present_that_does_not_grow_is_named(tmp_path):
    """present = past (Identity) instead of past with the new tokens appended: refused when compiled, naming the
    output and the dims it needs (it had been a numpy broadcast error at the first run)."""
    folder = tmp_path / "optimum"
    folder.mkdir()
    _runnable_graph(folder / "model.onnx", {"input_ids": (TensorProto.INT64, ["B", "S"]),
                                            "attention_mask": (TensorProto.INT64, ["B", "T"]),
                                            "position_ids": (TensorProto.INT64, ["B", "S"]), **PAST},
                    ["logits", *PRESENT])  # each present is its past plus zero: the past's dims
    (folder / "config.json").write_text(json.dumps(OPTIMUM))
    with pytest.raises(ParameterError, match=r"output 'present.0.key' is \[1, 2, 8, 4\] for 1 new token\(s\) over a "
                                             r"past of 8; .*: \[1, 2, 9, 4\]"):
        open_decoder(str(folder), target="ref", max_length=8).run(1, np.array([[3]]), np.array([1]))


def test_a_file_name_too_long_for_the_file_system_is_named(tmp_path):
    folder = genai_folder(tmp_path, _with("model.decoder.filename", "a" * 5000))
    with pytest.raises(ParameterError, match="field 'model.decoder.filename': 'aaaa.*File name too long"):
        GenaiLayout.read(folder)
