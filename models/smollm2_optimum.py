"""SmolLM2-135M-Instruct (the GGUF of :mod:`.smollm2`) exported with a dynamic past length in
optimum's layout (see :mod:`.optimum`): ``model.onnx`` + ``model.onnx.data``, ``config.json`` and the
tokenizer files (with the chat template) in the same folder, so ``mgx-graph generate FOLDER`` and
:func:`mgx_graph.llm.open_decoder.open_decoder` find them there.

Graph interface (L = 30, or ``num_layers``; ``batch``, ``seq`` and ``past`` symbolic):
``input_ids`` / ``position_ids`` int64 [batch, seq], ``attention_mask`` int64 [batch, past + seq],
``past_key_values.{i}.key|value`` float32 [batch, 3, past, 64] -> ``logits`` float32
[batch, seq, 49152], ``present.{i}.key|value`` float32 [batch, 3, past + seq, 64].

Options (defaults): ``gguf`` (None: located as :func:`.smollm2.locate_gguf` does), ``num_layers``
(None = all 30; fewer keeps the first layers, a smaller deterministic model for tests), ``verify``
(True: prefill and three decode steps through onnxruntime against torch, then the saved tokenizer's
chat-template ids against the GGUF tokenizer's). ``max_cache_len`` in ``model.json`` is the model's
``max_position_embeddings`` (8192): the longest window a runner may use.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from . import optimum, smollm2
from .options import fill_options
from .outline import BuildOutline, Loaded

NAME = "smollm2-optimum"
DEFAULTS: dict[str, Any] = {"gguf": None, "num_layers": None, "verify": True}
NOT_HASHED = smollm2.NOT_HASHED


def normalize_options(options: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults and validate (``num_layers`` in 1..30, 30 read as None). Raises ``ValueError``."""
    opts = fill_options(NAME, options, DEFAULTS)
    smollm2.normalize_source(NAME, opts)
    return opts


def hash_extra(opts: dict[str, Any], root: Path) -> dict[str, Any]:
    """The weight source, as :func:`.smollm2.hash_extra` (nothing is downloaded)."""
    return smollm2.hash_extra(opts, root)


def _load(gguf: Path, opts: dict[str, Any], note) -> Loaded:
    return smollm2.load_decoder(gguf, opts["num_layers"], None, 1, note)


def _export(loaded: Loaded, onnx_path: Path, opts: dict[str, Any], note) -> dict[str, str]:
    s = loaded.shape
    optimum.export(loaded.model, onnx_path, s.num_layers, s.num_kv_heads, s.head_dim, s.max_cache_len)
    eos = smollm2.eos_ids(loaded.model, loaded.tokenizer)
    optimum.finish_folder(loaded.model, onnx_path.parent, eos_token_ids=eos)
    return {}


def _verify(loaded: Loaded, onnx_path: Path, opts: dict[str, Any], note) -> None:
    optimum.verify(onnx_path, loaded.model, loaded.shape.num_layers, loaded.shape.vocab_size, note)
    smollm2.verify_saved_tokenizer(loaded.tokenizer, loaded.tokenizer_dir, note)


def _describe(loaded: Loaded, opts: dict[str, Any], root: Path) -> dict[str, Any]:
    import torch
    import transformers

    model, tok = loaded.model, loaded.tokenizer
    eos = smollm2.eos_ids(model, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    bos = tok.bos_token_id if tok.bos_token_id is not None else model.config.bos_token_id
    return optimum.describe(loaded.shape, eos, pad, bos=bos, architecture=model.config.model_type,
                            gguf_file=loaded.source.name, source=hash_extra(opts, root),
                            num_params=loaded.extra["num_params"], torch=torch.__version__,
                            transformers=transformers.__version__)


#: Fetch the GGUF, load, export, verify: ``model.onnx`` (+ ``.data``), ``config.json``, tokenizer files.
OUTLINE = BuildOutline(NAME, load=_load, export=_export, verify=_verify, describe=_describe,
                       fetch=smollm2.fetch_gguf, requires=smollm2.REQUIRES,
                       verify_requires=("onnxruntime", "jinja2"), tokenizer_dir=".")

#: Build into ``out_dir``; see :meth:`.outline.BuildOutline.build_into`.
build_into = OUTLINE.build_into

#: Raise MissingExtraError if a module the build needs is missing.
check_requirements = OUTLINE.check_requirements


def load_torch_model(info) -> Any:
    """The torch ``LlamaForCausalLM`` the graph of ``info`` was exported from (the GGUF, same layer cut).
    Raises BuildError when the recorded GGUF is gone."""
    return smollm2.load_torch_model(info)
