"""Malformed LLM folders and generation arguments are typed errors that name what is wrong.

Every field of ``genai_config.json`` (onnxruntime-genai), ``config.json`` / ``generation_config.json``
(optimum) and ``model.json`` that the runners read, the tokenizer's files, and every argument of
``generate()`` and the runners: a ParameterError naming the file and the field (or the argument),
expected vs given; a path leaving the folder a ParseError.  The good folders and a tiny decode step
are checked against values written here and numpy, so each check can fail.
"""
from __future__ import annotations

import copy
import json
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from mgx_graph.errors import ParameterError, ParseError
from mgx_graph.llm.folder_config import load_tokenizer
from mgx_graph.llm.open_decoder import open_decoder
from mgx_graph.llm.runner import GenaiLayout, GenaiRunner
from mgx_graph.llm.optimum_runner import OptimumRunner, read_folder

VOCAB, LAYERS, KV, HD = 32, 2, 2, 4


def _save_graph(path, inputs: dict, outputs: list) -> None:
    """An ONNX graph declaring ``inputs`` ({name: (elem type, dims)}) and ``outputs`` (names), no nodes:
    what the folder readers look at before anything is compiled."""
    ins = [helper.make_tensor_value_info(n, t, d) for n, (t, d) in inputs.items()]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs]
    onnx.save(helper.make_model(helper.make_graph([], "g", ins, outs)), str(path))


GENAI = {"model": {
    "bos_token_id": 1, "context_length": 64, "eos_token_id": [2, 3], "pad_token_id": 0, "type": "llama",
    "vocab_size": VOCAB,
    "decoder": {"filename": "model.onnx", "head_size": HD, "hidden_size": 8, "num_attention_heads": 4,
                "num_hidden_layers": LAYERS, "num_key_value_heads": KV,
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                           "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"}}}}


def genai_folder(tmp_path, cfg=None, raw: bytes | None = None):
    """A folder with ``genai_config.json`` (``cfg`` as JSON, or ``raw`` bytes) and a graph of its names."""
    folder = tmp_path / "genai"
    folder.mkdir(exist_ok=True)
    past = {f"past_key_values.{i}.{t}": (TensorProto.FLOAT, ["B", KV, "P", HD])
            for i in range(LAYERS) for t in ("key", "value")}
    _save_graph(folder / "model.onnx", {"input_ids": (TensorProto.INT64, ["B", "S"]),
                                        "attention_mask": (TensorProto.INT64, ["B", "T"]), **past},
                ["logits"] + [f"present.{i}.{t}" for i in range(LAYERS) for t in ("key", "value")])
    data = raw if raw is not None else json.dumps(GENAI if cfg is None else cfg).encode()
    (folder / "genai_config.json").write_bytes(data)
    return folder


def _with(path: str, value, base=GENAI):
    """A deep copy of ``base`` with the dotted ``path`` set to ``value`` (``DELETE``: removed)."""
    cfg = copy.deepcopy(base)
    *keys, last = path.split(".")
    node = cfg
    for k in keys:
        node = node[k]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return cfg


class _Delete:
    def __repr__(self) -> str:  # a stable test id (an object's default repr holds its address)
        return "<deleted>"


DELETE = _Delete()


def test_a_good_genai_config_reads_every_field(tmp_path):
    lay = GenaiLayout.read(genai_folder(tmp_path))
    d = GENAI["model"]["decoder"]
    assert (lay.num_layers, lay.num_kv_heads, lay.head_size) == (d["num_hidden_layers"], d["num_key_value_heads"],
                                                                 d["head_size"])
    assert (lay.vocab_size, lay.context_length, lay.eos_token_ids, lay.pad_token_id) == (VOCAB, 64, [2, 3], 0)
    assert lay.onnx_path.name == "model.onnx" and lay.cache_names()[:2] == ["past_key_values.0.key",
                                                                           "past_key_values.0.value"]
    lay.check_graph()


GENAI_BAD = [  # (field, value, what the message must hold)
    ("model.eos_token_id", "abc", "expected a token id in 0..31 or a non-empty list of them, got 'abc'"),
    ("model.eos_token_id", [], "got []"),
    ("model.eos_token_id", [2, 1.5], "got [2, 1.5]"),
    ("model.eos_token_id", VOCAB, f"got {VOCAB}"),
    ("model.eos_token_id", -1, "got -1"),
    ("model.eos_token_id", True, "got True"),
    ("model.eos_token_id", DELETE, "got missing"),
    ("model.vocab_size", "lots", "expected an int >= 1, got 'lots'"),
    ("model.vocab_size", 0, "got 0"),
    ("model.vocab_size", 32.0, "got 32.0"),
    ("model.pad_token_id", "x", "expected an int in -1..31, got 'x'"),
    ("model.pad_token_id", 99, "got 99"),
    ("model.bos_token_id", -3, "got -3"),
    ("model.context_length", 0, "expected an int >= 1, got 0"),
    ("model.context_length", None, "got null"),
    ("model.decoder.num_hidden_layers", "2", "got '2'"),
    ("model.decoder.num_key_value_heads", 0, "got 0"),
    ("model.decoder.head_size", [4], "got [4]"),
    ("model.decoder.hidden_size", -8, "got -8"),
    ("model.decoder.num_attention_heads", 3, "expected a multiple of num_key_value_heads (2), got 3"),
    ("model.decoder.inputs.input_ids", 7, "expected a non-empty string, got 7"),
    ("model.decoder.inputs.past_key_names", "past.key", "one '%d'"),
    ("model.decoder.outputs.present_value_names", "present.%d.%d", "got 'present.%d.%d'"),
    ("model.decoder.outputs.logits", DELETE, "got missing"),
    ("model.decoder.inputs", [], "expected a JSON object, got []"),
    ("model.decoder", DELETE, "expected a JSON object, got missing"),
    ("model", "x", "expected a JSON object, got 'x'"),
    ("model.decoder.filename", "nothere.onnx", "'nothere.onnx' is not a file in"),
    ("model.decoder.filename", 5, "got 5"),
]


@pytest.mark.parametrize("field,value,says", GENAI_BAD, ids=[f"{f}={v!r}"[:60] for f, v, _ in GENAI_BAD])
def test_each_malformed_genai_field_is_named(tmp_path, field, value, says):
    folder = genai_folder(tmp_path, _with(field, value))
    with pytest.raises(ParameterError) as e:
        GenaiLayout.read(folder)
    msg = str(e.value)
    assert str(folder / "genai_config.json") in msg and f"field '{field}'" in msg and says in msg, msg


@pytest.mark.parametrize("raw,says", [(b"\xff\xfe{}", "not UTF-8 text"), (b'{"model": ', "not valid JSON"),
                                      (b"[]", "expected a JSON object"), (b"", "not valid JSON"),
                                      (b"null", "expected a JSON object, got null")])
def test_a_genai_config_that_is_not_a_json_object(tmp_path, raw, says):
    folder = genai_folder(tmp_path, raw=raw)
    with pytest.raises(ParameterError, match="genai_config.json") as e:
        GenaiLayout.read(folder)
    assert says in str(e.value)


def test_a_missing_genai_config_names_the_file(tmp_path):
    with pytest.raises(ParameterError, match="no genai_config.json"):
        GenaiLayout.read(tmp_path)
    with pytest.raises(ParameterError, match="genai_config.json .*config.json \\+ model.onnx .*model.json"):
        open_decoder(str(tmp_path))  # no model.json either: not a FileNotFoundError


@pytest.mark.parametrize("name", ["/etc/passwd", "../model.onnx", "sub/../../model.onnx", ".."])
def test_a_path_outside_the_folder_is_a_parse_error(tmp_path, name):
    folder = genai_folder(tmp_path, _with("model.decoder.filename", name))
    (tmp_path / "model.onnx").write_bytes((folder / "model.onnx").read_bytes())  # it exists, yet is refused
    with pytest.raises(ParseError, match="model.decoder.filename.*inside"):
        GenaiLayout.read(folder)


def test_decoder_inputs_the_runner_does_not_feed(tmp_path):
    cfg = _with("model.decoder.inputs.cache_indirection", "cache_indirection")
    with pytest.raises(ParameterError, match=r"decoder inputs \['cache_indirection'\] are not supported"):
        GenaiLayout.read(genai_folder(tmp_path, cfg))


@pytest.mark.parametrize("value, says", [
    (["conv", "full_attention"], "conv layers need inputs.past_conv_names and outputs.present_conv_names"),
    (["full_attention"], "expected a list of 2 of"),
    (["full_attention", "mamba"], "expected a list of 2 of")])
def test_layer_types_are_checked(tmp_path, value, says):
    cfg = _with("model.decoder.layer_types", value)
    with pytest.raises(ParameterError, match=rf"field 'model.decoder.layer_types': .*{re.escape(says)}"):
        GenaiLayout.read(genai_folder(tmp_path, cfg))


def test_position_ids_named_by_the_config_must_be_a_graph_input(tmp_path):
    """The runner feeds position_ids where the config names them; a name the graph lacks is refused by name."""
    cfg = _with("model.decoder.inputs.position_ids", "position_ids")
    layout = GenaiLayout.read(genai_folder(tmp_path, cfg))
    assert layout.position_ids == "position_ids"
    with pytest.raises(ParameterError, match=r"field 'model.decoder.inputs.position_ids': 'position_ids' is not one"):
        layout.check_graph()


@pytest.mark.parametrize("field,value,says", [
    ("model.decoder.num_hidden_layers", 3, "'past_key_values.2.key' is not one of the inputs"),
    ("model.decoder.num_hidden_layers", 10 ** 15, "has 6 inputs"),  # refused before any name list is built
    ("model.decoder.outputs.logits", "scores", "'scores' is not one of the outputs"),
    ("model.decoder.head_size", 8, "has 4 on axis 3"),
    ("model.decoder.num_key_value_heads", 1, "has 2 on axis 1")])
def test_genai_names_and_sizes_must_match_the_graph(tmp_path, field, value, says):
    cfg = _with(field, value)
    if field.endswith("num_key_value_heads"):
        cfg = _with("model.decoder.num_attention_heads", 4, cfg)
    lay = GenaiLayout.read(genai_folder(tmp_path, cfg))
    with pytest.raises(ParameterError, match="genai_config.json") as e:
        lay.check_graph()
    assert says in str(e.value), str(e.value)
    with pytest.raises(ParameterError):  # the runner checks the graph before compiling anything
        GenaiRunner(lay.folder, max_length=8, target="ref")


def test_a_garbage_genai_graph_is_a_parse_error(tmp_path):
    folder = genai_folder(tmp_path)
    (folder / "model.onnx").write_bytes(b"not a protobuf \x00\xff" * 3)
    with pytest.raises(ParseError, match="model.onnx: not a valid ONNX protobuf"):
        GenaiRunner(folder, max_length=8, target="ref")


@pytest.mark.parametrize("kw,says", [
    (dict(batch=0), "batch must be a positive int, got 0"), (dict(batch=True), "batch"),
    (dict(max_length=0), "max_length must be an int in 1..64"), (dict(max_length=65), "got 65"),
    (dict(max_length=8.0), "got 8.0"), (dict(target="tpu"), "target must be one of"),
    (dict(hip_graph="yes"), "hip_graph must be"), (dict(fp16=1), "fp16 must be")])
def test_runner_arguments_are_checked(tmp_path, kw, says):
    folder = genai_folder(tmp_path)
    with pytest.raises(ParameterError, match=says):
        GenaiRunner(folder, **{"max_length": 8, "target": "ref", **kw})


def test_open_decoder_arguments(tmp_path):
    folder = genai_folder(tmp_path)
    with pytest.raises(ParameterError, match="max_length must be a positive int, got 0"):
        open_decoder(str(folder), max_length=0)  # not taken as "use the default"
    with pytest.raises(ParameterError, match="batch must be a positive int"):
        open_decoder(str(folder), batch=-1)
    with pytest.raises(ParameterError, match="model must be a folder path"):
        open_decoder(42)


# -- optimum-style folders ---------------------------------------------------------------------------
OPTIMUM = {"vocab_size": VOCAB, "max_position_embeddings": 128, "eos_token_id": 5, "pad_token_id": None,
           "num_hidden_layers": LAYERS, "num_key_value_heads": KV, "num_attention_heads": 4, "head_dim": HD}


def optimum_folder(tmp_path, cfg=None, raw: bytes | None = None, generation=None):
    folder = tmp_path / "optimum"
    folder.mkdir(exist_ok=True)
    past = {f"past_key_values.{i}.{t}": (TensorProto.FLOAT, ["B", KV, "P", HD])
            for i in range(LAYERS) for t in ("key", "value")}
    _save_graph(folder / "model.onnx", {"input_ids": (TensorProto.INT64, ["B", "S"]),
                                        "attention_mask": (TensorProto.INT64, ["B", "T"]),
                                        "position_ids": (TensorProto.INT64, ["B", "S"]), **past}, ["logits"])
    (folder / "config.json").write_bytes(raw if raw is not None else json.dumps(OPTIMUM if cfg is None else cfg).encode())
    if generation is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation))
    return folder


def test_a_good_optimum_folder_and_its_generation_config(tmp_path):
    got = read_folder(optimum_folder(tmp_path))
    assert got == {"num_layers": LAYERS, "num_kv_heads": KV, "head_size": HD, "vocab_size": VOCAB,
                   "context_length": 128, "eos_token_ids": [5], "pad_token_id": 5}
    got = read_folder(optimum_folder(tmp_path, generation={"eos_token_id": [6, 7], "pad_token_id": 1}))
    assert (got["eos_token_ids"], got["pad_token_id"]) == ([6, 7], 1)  # as transformers' generate takes them


def test_pad_token_id_minus_one_means_none(tmp_path):
    """Configs that write ``pad_token_id: -1`` (no pad token) pad with the first end-of-sequence id, as
    transformers' generate does when a config has no pad token."""
    (tmp_path / "g").mkdir()
    lay = GenaiLayout.read(genai_folder(tmp_path / "g", _with("model.pad_token_id", -1)))
    assert lay.pad_token_id == lay.eos_token_ids[0]
    cfg = dict(OPTIMUM, pad_token_id=-1)
    (tmp_path / "o").mkdir()
    got = read_folder(optimum_folder(tmp_path / "o", cfg))
    assert got["pad_token_id"] == got["eos_token_ids"][0]


OPTIMUM_BAD = [
    ("vocab_size", "lots", "expected an int >= 1, got 'lots'"),
    ("vocab_size", DELETE, "got missing"),
    ("eos_token_id", "abc", "got 'abc'"), ("eos_token_id", [], "got []"),
    ("pad_token_id", "x", "expected an int in -1..31, got 'x'"),
    ("max_position_embeddings", 0, "got 0"),
    ("num_hidden_layers", 3, "expected 2 (as model.onnx has), got 3"),
    ("num_key_value_heads", 4, "expected 2 (as model.onnx has), got 4"),
    ("head_dim", "4", "got '4'"),
    ("num_attention_heads", 3, "expected a multiple of the 2 key / value heads, got 3"),
]


@pytest.mark.parametrize("field,value,says", OPTIMUM_BAD, ids=[f"{f}={v!r}" for f, v, _ in OPTIMUM_BAD])
def test_each_malformed_optimum_field_is_named(tmp_path, field, value, says):
    folder = optimum_folder(tmp_path, _with(field, value, OPTIMUM))
    with pytest.raises(ParameterError) as e:
        read_folder(folder)
    msg = str(e.value)
    assert str(folder / "config.json") in msg and f"field '{field}'" in msg and says in msg, msg


@pytest.mark.parametrize("raw,says", [(b"[]", "expected a JSON object, got []"),
                                      (b"\xc3\x28", "not UTF-8"), (b"{,}", "not valid JSON")])
def test_an_optimum_config_that_is_not_a_json_object(tmp_path, raw, says):
    with pytest.raises(ParameterError, match="config.json") as e:
        OptimumRunner(optimum_folder(tmp_path, raw=raw), max_length=8, target="ref")
    assert says in str(e.value)


def test_a_malformed_generation_config_is_named(tmp_path):
    folder = optimum_folder(tmp_path, generation={"eos_token_id": "abc"})
    with pytest.raises(ParameterError, match=r"generation_config.json: field 'eos_token_id': .* got 'abc'"):
        read_folder(folder)
    (folder / "generation_config.json").write_text("[1]")
    with pytest.raises(ParameterError, match="generation_config.json .*: expected a JSON object, got \\[1\\]"):
        read_folder(folder)


def test_optimum_past_dims_must_be_fixed(tmp_path):
    folder = optimum_folder(tmp_path)
    _save_graph(folder / "model.onnx", {"input_ids": (TensorProto.INT64, ["B", "S"]),
                                        "attention_mask": (TensorProto.INT64, ["B", "T"]),
                                        "position_ids": (TensorProto.INT64, ["B", "S"]),
                                        "past_key_values.0.key": (TensorProto.FLOAT, ["B", "kv", "P", HD]),
                                        "past_key_values.0.value": (TensorProto.FLOAT, ["B", "kv", "P", HD])},
                ["logits"])
    with pytest.raises(ParameterError, match="past_key_values.0.key has dims"):
        read_folder(folder)


# -- built model folders and tokenizers -----------------------------------------------------------------
def test_a_malformed_model_json_is_named(tmp_path):
    from mgx_graph.llm.folder_config import load_built_info

    (tmp_path / "model.onnx").write_bytes(b"")
    good = {"name": "x", "onnx_path": "model.onnx", "inputs": {}, "outputs": {},
            "config": {"vocab_size": 10, "eos_token_ids": [3], "kind": "static"}}
    for cfg, says in ((_with("config.eos_token_ids", ["a"], good), "field 'config.eos_token_ids'"),
                      (_with("config.batch", 0, good), "field 'config.batch': expected an int >= 1, got 0"),
                      (_with("onnx_path", "gone.onnx", good), "field 'onnx_path': 'gone.onnx' is not a file"),
                      ([], "expected a JSON object")):
        (tmp_path / "model.json").write_text(json.dumps(cfg))
        with pytest.raises(ParameterError, match="model.json") as e:
            load_built_info(tmp_path)
        assert says in str(e.value), str(e.value)
    (tmp_path / "model.json").write_text(json.dumps(good))
    assert load_built_info(tmp_path).config["eos_token_ids"] == [3]


def _save_tokenizer(folder) -> dict:
    """A small word-level tokenizer saved as tokenizer.json; returns its vocabulary."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    folder.mkdir(exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return vocab


@pytest.mark.parametrize("name,raw,says", [
    ("tokenizer.json", b"\x00\xffgarbage", "tokenizer.json (a tokenizer file): not UTF-8"),
    ("tokenizer.json", b'{"version": "1.0", "model": ', "tokenizer.json (a tokenizer file): not valid JSON"),
    ("tokenizer.json", b"[]", "expected a JSON object, got []"),
    ("tokenizer.json", b'{"model": {"type": "Nonsense"}}', "cannot load the tokenizer"),
    ("tokenizer_config.json", b'"x"', "tokenizer_config.json (a tokenizer file): expected a JSON object, got \"x\"")])
def test_a_corrupt_tokenizer_is_a_parameter_error(tmp_path, name, raw, says):
    pytest.importorskip("transformers")
    vocab = _save_tokenizer(tmp_path / "tok")
    ids = load_tokenizer(tmp_path / "tok")("hello world")["input_ids"]
    assert ids == [vocab["hello"], vocab["world"]]  # the good one loads
    (tmp_path / "tok" / name).write_bytes(raw)
    with pytest.raises(ParameterError, match=str(tmp_path / "tok")) as e:
        load_tokenizer(tmp_path / "tok")
    assert says in str(e.value), str(e.value)


# -- generate() and Decoder arguments ------------------------------------------------------------------
@pytest.fixture(scope="module")
def step():
    """``(decode step, table)``: a one-row step whose logits are ``table[input_ids] + 0 * cache_position``,
    so greedy decoding follows ``argmax(table[token])`` (the numpy oracle)."""
    import mgx_graph

    rng = np.random.default_rng(0)
    table = rng.standard_normal((VOCAB, VOCAB)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["g"]),
             helper.make_node("Cast", ["cache_position"], ["cf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["cf", "zero"], ["z"]),
             helper.make_node("Add", ["g", "z"], ["logits"])]
    g = helper.make_graph(nodes, "step", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 1]),
                                          helper.make_tensor_value_info("cache_position", TensorProto.INT64, [1])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1, VOCAB])],
                          [onnx.numpy_helper.from_array(table, "table"),
                           onnx.numpy_helper.from_array(np.zeros(1, np.float32), "zero")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return mgx_graph.compile(model, target="ref"), table


def _greedy_oracle(table, prompt, n):
    out, tok = [], prompt[-1]
    for _ in range(n):
        tok = int(np.argmax(table[tok]))
        out.append(tok)
    return out


class _Chars:
    @staticmethod
    def decode(ids, skip_special_tokens=True):
        return "".join(chr(97 + int(t) % 26) for t in ids)


GENERATE_BAD = [
    (dict(stop=5), "stop must be a non-empty str or a list of them, got int 5"),
    (dict(stop=[""]), "stop must be"), (dict(stop=["a", 3]), "an entry is 3"),
    (dict(stop={"a"}), "got set"),
    (dict(max_new_tokens=-1), "max_new_tokens must be an int >= 0"), (dict(max_new_tokens=2.0), "max_new_tokens"),
    (dict(max_new_tokens=True), "max_new_tokens"),
    (dict(temperature=0, do_sample=True), r"temperature must be in \(0"),
    (dict(temperature="hot"), "temperature must be a number"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"), (dict(top_p=0), "top_p"),
    (dict(top_k=-2), "top_k must be a non-negative int"), (dict(top_k=1.5), "top_k"),
    (dict(min_p=-0.1), r"min_p must be in \[0, 1\]"), (dict(repetition_penalty=0), "repetition_penalty"),
    (dict(seed=-1), "seed must be a non-negative int"), (dict(seed="s"), "seed"),
    (dict(do_sample="yes"), "do_sample must be True or False"),
    (dict(eos_token_id=5.0), "eos_token_id must be a token id in 0..31"), (dict(eos_token_id=[VOCAB]), "eos_token_id"),
    (dict(eos_token_id="abc"), "eos_token_id"),
    (dict(pad_token_id=[1]), "pad_token_id must be a token id in 0..31, got"), (dict(pad_token_id=-1), "pad_token_id"),
    (dict(on_token=5), "on_token must be a callable"), (dict(streamer="x"), "streamer must be a callable"),
    (dict(tokenizer=_Delete()), "tokenizer must have decode"), (dict(output_logits="no"), "output_logits"),
    (dict(stop="x"), "pass tokenizer="),
]


@pytest.mark.parametrize("kw,says", GENERATE_BAD, ids=[repr(k)[:50] for k, _ in GENERATE_BAD])
def test_each_generate_argument_is_checked_and_the_decoder_stays_usable(step, kw, says):
    from mgx_graph.llm.generation import Decoder, generate

    prog, table = step
    dec = Decoder(prog)
    prompt = [3, 7]
    args = {"max_new_tokens": 4, **kw}
    with pytest.raises(ParameterError, match=says):
        generate(dec, prompt, **args)
    res = generate(dec, prompt, 4, tokenizer=_Chars())
    assert res.tokens == _greedy_oracle(table, prompt, 4) and res.text == _Chars.decode(res.tokens)


@pytest.mark.parametrize("prompt,says", [(5, "prompt_ids must be a list"), ("12", "prompt_ids must be a list"),
                                         ([], "empty prompt"), ([[1], 2], "mixes token ids and lists"),
                                         ([1, VOCAB], "token ids must be ints in 0..31"), ([1, 2.0], "token ids"),
                                         ([[1], [2]], "at most 1 rows")])
def test_prompt_ids_are_checked(step, prompt, says):
    from mgx_graph.llm.generation import Decoder, generate

    with pytest.raises(ParameterError, match=says):
        generate(Decoder(step[0]), prompt, 2)


def test_decoder_arguments_are_checked(step):
    from mgx_graph.llm.generation import Decoder

    prog, table = step
    dec = Decoder(prog)
    for call, says in ((lambda: dec.step(VOCAB), "token must be a token id in 0..31"),
                       (lambda: dec.step("1"), "token must be"),
                       (lambda: dec.greedy_tokens(1, -1), "count must be an int >= 0"),
                       (lambda: dec.feed([]), r"tokens must hold 1 values"),
                       (lambda: Decoder("prog"), "Decoder takes a compiled program")):
        with pytest.raises(ParameterError, match=says):
            call()
    dec.position = 0
    assert dec.step(4) == int(np.argmax(table[4]))


def test_generate_needs_a_decoder_and_a_streamer_a_file():
    from mgx_graph.llm.generation import generate
    from mgx_graph.llm.streaming import TextStreamer

    with pytest.raises(ParameterError, match="decoder must be a Decoder"):
        generate(None, [1, 2], 2)
    with pytest.raises(ParameterError, match="file must have write"):
        TextStreamer(file=5)
