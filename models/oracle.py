"""Reference (oracle) helpers: the torch/transformers answer for a built model.

* :func:`hf_greedy_tokens` -- greedy ``model.generate`` with the very torch model the
  ONNX graph was exported from (the GGUF for smollm2, the seeded random GPT-2 / LLaMA
  rebuilt from ``model.json`` for gpt2 / llama, checked against the recorded weights hash).
* :func:`chat_prompt_ids` -- token ids of a one-turn chat prompt (with the generation
  prompt appended), from the tokenizer saved next to the model.
* :func:`ort_greedy_tokens` -- the same greedy decode run through onnxruntime with the
  exported graph, feeding the caches back; handy as a second reference for executors.
* :func:`decode_tokens` -- ids back to text.
* :func:`ort_cpu_options` -- onnxruntime session options for its CPU run used as an oracle (exact
  integer GEMMs).
* :func:`tokenize_batch` / :func:`hf_sentence_embeddings` -- for the ``"minilm"`` encoder:
  the three graph inputs of a batch of sentences (padded to the longest) and the torch
  sentence embeddings (mean pooling + L2 normalization, sentence-transformers' recipe).

torch, transformers and onnxruntime are imported only when these functions are called.
Loaded torch models and tokenizers are kept in a small in-process cache.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import ModelInfo, _builder
from .errors import require_modules

_MODELS: dict[tuple, Any] = {}
_TOKENIZERS: dict[str, Any] = {}
_MAX_CACHED_MODELS = 2


def ort_cpu_options(so=None):
    """``so`` (or new ``onnxruntime.SessionOptions``) with ``session.x64quantprecision`` set to ``"1"``,
    for onnxruntime's CPU run used as an oracle.  Without it onnxruntime's x64 uint8 x int8 GEMM
    (MatMulInteger, ConvInteger, the quantized LSTM's GEMMs) may add pairs of products in saturating int16
    (``vpmaddubsw``): a dot product whose pair sums pass 32767 comes out clipped, where the ONNX spec defines
    exact int32 accumulation.  onnxruntime 1.31.1 and 1.32.0 alike take that path on the CI CPU (AMD
    EPYC, AVX2 without VNNI; microsoft/onnxruntime#16105); CPUs with VNNI do not saturate.  The entry works through a graph transformer that rewrites int8
    *initializers* as uint8: it needs ``graph_optimization_level`` ORT_ENABLE_EXTENDED or higher (the
    default), and int8 weights fed at run time or computed in the graph still saturate (measured with
    onnxruntime 1.32.0 on that CPU; ``tests/util.py::uint8_operands`` covers those).  Returns the options;
    raises ValueError when ``so`` has a lower optimization level, ImportError without onnxruntime."""
    import onnxruntime as ort

    so = ort.SessionOptions() if so is None else so
    level = so.graph_optimization_level
    if level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC):
        raise ValueError(f"ort_cpu_options: session.x64quantprecision does nothing at {level}: it needs "
                         f"ORT_ENABLE_EXTENDED or higher")
    so.add_session_config_entry("session.x64quantprecision", "1")
    return so


def _key(info: ModelInfo) -> tuple:
    import json

    # Random-weight builders keep their rebuild record (with the weights hash) under their own name.
    record = info.config.get(info.name)
    digest = record.get("weights_sha256") if isinstance(record, dict) else None
    return (info.name, str(info.hf_dir_or_gguf), json.dumps(info.options, sort_keys=True, default=str),
            json.dumps(digest))


def load_torch_model(info: ModelInfo):
    """The torch model (eval mode, float32, CPU) that ``info``'s ONNX was exported from: a
    causal LM, or the ``BertModel`` (without the pooling) for ``"minilm"``.

    Raises ``BuildError`` (from :mod:`mgx_graph.models`) if it cannot be rebuilt exactly,
    ``MissingExtraError`` (a BuildError) if torch or transformers are not installed.
    """
    key = _key(info)
    model = _MODELS.get(key)
    if model is None:
        from .progress import quiet_third_party

        require_modules(info.name, ("torch", "transformers"), "the torch reference")
        builder = _builder(info.name)  # the registry's module ("llama-optimum" -> .llama_optimum)
        with quiet_third_party(show_warnings=False):
            model = builder.load_torch_model(info)
        while len(_MODELS) >= _MAX_CACHED_MODELS:
            _MODELS.pop(next(iter(_MODELS)))
        _MODELS[key] = model
    return model


def _tokenizer(info: ModelInfo):
    if info.tokenizer_dir is None:
        raise ValueError(f"model {info.name!r} has no tokenizer")
    key = str(info.tokenizer_dir)
    tok = _TOKENIZERS.get(key)
    if tok is None:
        require_modules(info.name, ("transformers",), "the tokenizer")
        from ..llm.folder_config import load_tokenizer

        tok = load_tokenizer(key)  # ParameterError naming a corrupt tokenizer file
        _TOKENIZERS[key] = tok
    return tok


def _check_length(info: ModelInfo, prompt_ids: list[int], max_new_tokens: int) -> None:
    if not prompt_ids:
        raise ValueError("prompt_ids must not be empty")
    if max_new_tokens < 0:
        raise ValueError("max_new_tokens must be >= 0")
    limit = int(info.config["max_cache_len"])
    if len(prompt_ids) + max_new_tokens > limit:
        raise ValueError(
            f"prompt ({len(prompt_ids)}) + max_new_tokens ({max_new_tokens}) exceeds max_cache_len={limit}"
        )
    vocab = int(info.config["vocab_size"])
    bad = [t for t in prompt_ids if not 0 <= int(t) < vocab]
    if bad:
        raise ValueError(f"token ids out of range [0, {vocab}): {bad[:5]}")


def _cut_at_eos(tokens: list[int], eos: list[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


def hf_greedy_tokens(info: ModelInfo, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation of ``prompt_ids`` by the torch model: ``generate(do_sample=False)``.

    Returns the new token ids only (at most ``max_new_tokens``); generation stops after
    the first token in ``info.config["eos_token_ids"]``, which is included.

    Raises ``ValueError`` if the prompt is empty, has ids outside the vocabulary, or
    prompt + ``max_new_tokens`` exceeds ``max_cache_len`` (the exported graph could not
    decode that far); ``MissingExtraError`` (a BuildError) without torch / transformers.
    """
    require_modules(info.name, ("torch", "transformers"), "the torch reference")
    import torch
    from transformers import GenerationConfig

    _check_length(info, prompt_ids, max_new_tokens)
    if max_new_tokens == 0:
        return []
    model = load_torch_model(info)
    eos = [int(e) for e in info.config["eos_token_ids"]]
    pad = info.config.get("pad")
    gen = GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=int(pad) if pad is not None else eos[0],
        bos_token_id=info.config.get("bos"),
    )
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gen)
    return _cut_at_eos([int(t) for t in out[0, ids.shape[1]:].tolist()], eos)


def chat_prompt_ids(info: ModelInfo, prompt_text: str) -> list[int]:
    """Token ids of ``[{"role": "user", "content": prompt_text}]`` through the model's chat
    template, with ``add_generation_prompt=True``.

    Needs only ``transformers``/``tokenizers`` (no torch). Raises ``ValueError`` for a
    model without a tokenizer (gpt2, llama).
    """
    tok = _tokenizer(info)
    out = tok.apply_chat_template(
        [{"role": "user", "content": prompt_text}], add_generation_prompt=True, tokenize=True
    )
    if hasattr(out, "keys") and "input_ids" in out:
        out = out["input_ids"]
    return [int(t) for t in out]


def decode_tokens(info: ModelInfo, token_ids: list[int], skip_special_tokens: bool = True) -> str:
    """Text of ``token_ids`` with the model's tokenizer. Raises ``ValueError`` without one."""
    return _tokenizer(info).decode(list(token_ids), skip_special_tokens=skip_special_tokens)


def ort_greedy_tokens(info: ModelInfo, prompt_ids: list[int], max_new_tokens: int, session=None) -> list[int]:
    """Greedy decode through onnxruntime (CPU) with the exported graph.

    Static models: the prompt is fed one token per step (``cache_position`` = index),
    then each argmax is fed back; ``present.*`` outputs become the next ``past_key_values.*``
    inputs (via ``info.alias``). Dynamic models: the prompt is prefilled in one call with
    an empty cache, then one token per call. Returns the new ids, stopping after an eos
    (included), like :func:`hf_greedy_tokens`. Raises ``ValueError`` for a step of several rows
    (``config["batch"] > 1``).
    """
    import numpy as np

    from .verify import ort_session

    if int(info.config.get("batch", 1)) > 1:
        raise ValueError(f"ort_greedy_tokens decodes one row; model {info.name!r} has a step of "
                         f"{info.config['batch']} rows")
    _check_length(info, prompt_ids, max_new_tokens)
    if max_new_tokens == 0:
        return []
    sess = session if session is not None else ort_session(info.onnx_path, info.name)
    out_names = [o.name for o in sess.get_outputs()]
    eos = set(int(e) for e in info.config["eos_token_ids"])
    cfg = info.config
    past_names = [n for n in info.inputs if n.startswith("past_key_values.")]
    new: list[int] = []

    if cfg["kind"] == "static":
        shape = (1, cfg["num_kv_heads"], cfg["max_cache_len"], cfg["head_dim"])
        feeds = {n: np.zeros(shape, np.float32) for n in past_names}
        seq = list(prompt_ids)
        pos = 0
        while True:
            feeds["input_ids"] = np.array([[seq[pos]]], np.int64)
            feeds["cache_position"] = np.array([pos], np.int64)
            outs = dict(zip(out_names, sess.run(out_names, feeds)))
            for o, i in info.alias.items():
                feeds[i] = outs[o]
            pos += 1
            if pos < len(prompt_ids):
                continue
            tok = int(np.argmax(outs["logits"][0, -1]))
            new.append(tok)
            seq.append(tok)
            if tok in eos or len(new) >= max_new_tokens:
                return new
    else:
        shape = (1, cfg["num_kv_heads"], 0, cfg["head_dim"])
        past = {n: np.zeros(shape, np.float32) for n in past_names}
        chunk = list(prompt_ids)
        total = 0
        while True:
            total += len(chunk)
            feeds = {
                "input_ids": np.array([chunk], np.int64),
                "attention_mask": np.ones((1, total), np.int64),
                **past,
            }
            outs = dict(zip(out_names, sess.run(out_names, feeds)))
            past = {n: outs[n.replace("past_key_values.", "present.", 1)] for n in past_names}
            tok = int(np.argmax(outs["logits"][0, -1]))
            new.append(tok)
            if tok in eos or len(new) >= max_new_tokens:
                return new
            chunk = [tok]


# --------------------------------------------------------------------------------------
# sentence encoders ("minilm")


def _encoder_builder(info: ModelInfo):
    if info.config.get("kind") != "encoder":
        raise ValueError(f"model {info.name!r} is not a sentence encoder (kind {info.config.get('kind')!r})")
    return importlib.import_module(f".{info.name}", __package__)


def tokenize_batch(info: ModelInfo, sentences) -> dict:
    """The graph inputs for ``sentences`` (a list of str, or one str): ``input_ids``,
    ``attention_mask``, ``token_type_ids`` as int64 numpy arrays [B, S], padded to the
    longest sentence and truncated at ``info.config["max_seq_length"]`` (256), as
    sentence-transformers does. Needs only ``transformers``/``tokenizers`` (no torch).
    Raises ``ValueError`` for a model that is not an encoder or for an empty list.
    """
    builder = _encoder_builder(info)
    if isinstance(sentences, str):
        sentences = [sentences]
    sentences = list(sentences)
    if not sentences:
        raise ValueError("sentences must not be empty")
    max_len = int(info.config.get("max_seq_length") or builder.MAX_SEQ_LENGTH)
    return builder.tokenize(_tokenizer(info), sentences, max_length=max_len)


def hf_sentence_embeddings(info: ModelInfo, sentences):
    """Sentence embeddings float32 [B, hidden] from the torch model ``info``'s ONNX was
    exported from: ``BertModel`` on :func:`tokenize_batch`'s inputs, then the mean of the
    last hidden state over the unmasked tokens, L2-normalized (sentence-transformers'
    Pooling(mean) + Normalize). ``sentences`` may also be such a dict of inputs.
    """
    builder = _encoder_builder(info)
    feeds = sentences if isinstance(sentences, dict) else tokenize_batch(info, sentences)
    return builder.torch_sentence_embeddings(load_torch_model(info), feeds)
