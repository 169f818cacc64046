"""LLaMA architecture with seeded random weights, exported as a fixed-shape decode step.

A small ``LlamaForCausalLM(LlamaConfig(...))`` with the op pattern of SmolLM2 (grouped-query
attention with ``n_kv_head < n_head``, rotary position embeddings, RMSNorm, SiLU-gated MLP,
input and output embeddings tied) but a size of one's choosing and no download: it builds
in seconds. No tokenizer; the special token (bos = eos = pad) is ``vocab_size - 1``.

Graph interface (L = n_layer, H_kv = n_kv_head, D = hidden_size / n_head, M = max_cache_len),
the same as SmolLM2's and GPT-2's ``kind="static"``:

    inputs   input_ids                      int64   [1, 1]
             cache_position                 int64   [1]       slot of the new token = tokens already cached
             past_key_values.{i}.key        float32 [1, H_kv, M, D]   i = 0 .. L-1
             past_key_values.{i}.value      float32 [1, H_kv, M, D]
    outputs  logits                         float32 [1, 1, vocab_size]
             present.{i}.key / .value       float32 [1, H_kv, M, D]

``present.{i}.*`` aliases ``past_key_values.{i}.*`` (the row ``cache_position`` is
overwritten by a ScatterND).

With ``batch = B > 1`` the step decodes B left-padded rows in lockstep: ``input_ids`` [B, 1],
``cache_position`` [1] (the slot written in every row), ``attention_mask`` int64 [B, M] and
``position_ids`` int64 [B, 1] come after it, the caches are [B, H_kv, M, D] and the logits
[B, 1, vocab_size] (see :func:`.export.make_static_step_module`). ``batch = 1`` builds the
one-row step above, in the same cache folder as before the option existed.

Options (defaults): ``seed`` (0), ``n_layer`` (2), ``hidden_size`` (64), ``n_head`` (4),
``n_kv_head`` (2; must divide ``n_head``, equal to it gives plain multi-head attention),
``intermediate_size`` (128), ``vocab_size`` (256), ``max_cache_len`` (32, also the
model's ``max_position_embeddings``), ``rms_norm_eps`` (1e-5), ``initializer_range`` (0.2), ``rope_theta``
(10000.0, the RoPE base; SmolLM2's is 100000), ``batch`` (1: rows of the decode step),
``verify`` (True). ``hidden_size / n_head`` must be even (RoPE rotates pairs). ``rope_theta`` at its
default is left out of the cache hash and ``model.json`` (:data:`.options.LATER_OPTIONS`), so the
builds made before the option existed keep their folder.

``initializer_range`` is the std of the normal init of every linear and embedding weight.
transformers' own default, 0.02, makes the attention and MLP branches so small next to
the residual that, through the tied embeddings, the argmax is almost always the input
token: greedy decoding just repeats the last prompt token whatever the context, which
makes a weak oracle check. At 0.2 the continuation depends on the whole prompt.

The weights are drawn like GPT-2's (:func:`.random_weights.seeded_model`); the construction
arguments, the seed and a SHA-256 of the weights go to ``model.json`` under ``"llama"``
so the oracle rebuilds the same module (:func:`rebuild_from_info`). The build steps follow
:class:`.outline.BuildOutline` through :class:`.random_weights.RandomDecoder`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import BuildError
from .options import fill_options, require_batch, require_ints
from .outline import DecoderShape
from .random_weights import RandomDecoder

NAME = "llama"

DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "n_layer": 2,
    "hidden_size": 64,
    "n_head": 4,
    "n_kv_head": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "max_cache_len": 32,
    "rms_norm_eps": 1e-5,
    "initializer_range": 0.2,
    "rope_theta": 10000.0,
    "batch": 1,
    "verify": True,
}

#: Options that do not change the built files (left out of the cache hash).
NOT_HASHED = frozenset({"verify"})


def normalize_options(options: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults and validate. Raises ``ValueError`` on unknown or bad options."""
    opts = fill_options(NAME, options, DEFAULTS)
    require_ints(NAME, opts, ("seed",))
    require_ints(NAME, opts, ("n_layer", "hidden_size", "n_head", "n_kv_head", "intermediate_size",
                              "vocab_size", "max_cache_len"), minimum=1)
    if opts["hidden_size"] % opts["n_head"]:
        raise ValueError(f"llama: hidden_size ({opts['hidden_size']}) must be divisible by n_head ({opts['n_head']})")
    if (opts["hidden_size"] // opts["n_head"]) % 2:
        raise ValueError(f"llama: the head dim hidden_size / n_head = {opts['hidden_size'] // opts['n_head']} must be even")
    if opts["n_head"] % opts["n_kv_head"]:
        raise ValueError(f"llama: n_kv_head ({opts['n_kv_head']}) must divide n_head ({opts['n_head']})")
    if opts["vocab_size"] < 2:
        raise ValueError("llama: vocab_size must be >= 2")
    eps = opts["rms_norm_eps"]
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise ValueError(f"llama: rms_norm_eps must be a float in (0, 1), got {eps!r}")
    opts["rms_norm_eps"] = float(eps)
    std = opts["initializer_range"]
    if isinstance(std, bool) or not isinstance(std, (int, float)) or not 0 < std <= 10:
        raise ValueError(f"llama: initializer_range must be a float in (0, 10], got {std!r}")
    opts["initializer_range"] = float(std)
    theta = opts["rope_theta"]
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 1:
        raise ValueError(f"llama: rope_theta must be a number > 1, got {theta!r}")
    opts["rope_theta"] = float(theta)
    opts["verify"] = bool(opts["verify"])
    require_batch(NAME, opts)
    return opts


def hash_extra(opts: dict[str, Any], root: Path) -> dict[str, Any]:
    """Nothing outside the options identifies a random-weight LLaMA."""
    return {}


def architecture(opts: dict[str, Any]) -> dict[str, Any]:
    """The LlamaConfig keyword arguments for normalized options (eos = bos = pad = vocab_size - 1);
    ``rope_theta`` only where it is not transformers' default (the records of earlier builds have none)."""
    special = opts["vocab_size"] - 1
    theta = {"rope_theta": opts["rope_theta"]} if "rope_theta" in opts else {}
    return {
        "vocab_size": opts["vocab_size"],
        "hidden_size": opts["hidden_size"],
        "intermediate_size": opts["intermediate_size"],
        "num_hidden_layers": opts["n_layer"],
        "num_attention_heads": opts["n_head"],
        "num_key_value_heads": opts["n_kv_head"],
        "max_position_embeddings": opts["max_cache_len"],
        "rms_norm_eps": opts["rms_norm_eps"],
        "initializer_range": opts["initializer_range"],
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "bos_token_id": special,
        "eos_token_id": special,
        "pad_token_id": special,
        **theta,
    }


def _shape(opts: dict[str, Any]) -> DecoderShape:
    return DecoderShape(num_layers=opts["n_layer"], num_heads=opts["n_head"], num_kv_heads=opts["n_kv_head"],
                        head_dim=opts["hidden_size"] // opts["n_head"], hidden_size=opts["hidden_size"],
                        max_cache_len=opts["max_cache_len"], vocab_size=opts["vocab_size"],
                        batch=opts.get("batch", 1))


def _summary(opts: dict[str, Any], n_params: int) -> str:
    return (f"LLaMA n_layer={opts['n_layer']} hidden={opts['hidden_size']} heads={opts['n_head']} "
            f"kv_heads={opts['n_kv_head']} head_dim={opts['hidden_size'] // opts['n_head']} "
            f"ffn={opts['intermediate_size']} vocab={opts['vocab_size']} max_pos={opts['max_cache_len']} "
            f"rope_theta={opts.get('rope_theta', 10000.0):g} seed={opts['seed']}: {n_params / 1e6:.3f} M params")


def _check_tied(model) -> None:
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        raise BuildError("llama: lm_head is not tied to embed_tokens")


RANDOM = RandomDecoder(NAME, "LLaMA", "LlamaConfig", "LlamaForCausalLM", architecture, _shape, _summary, _check_tied)


def make_model(arch: dict[str, Any], seed: int):
    """Build ``LlamaForCausalLM(LlamaConfig(**arch))`` with weights drawn after ``manual_seed(seed)``.

    Returns the module in eval mode, float32, on CPU. The global RNG state is restored.
    """
    return RANDOM.make_model(arch, seed)


def rebuild_from_info(config: dict[str, Any]):
    """Rebuild the torch model described by ``ModelInfo.config`` and check its weights hash.

    Raises :class:`BuildError` if the rebuilt weights differ from the exported ones.
    """
    return RANDOM.rebuild_from_info(config)


OUTLINE = RANDOM.outline()

#: Build into ``out_dir`` (``model.onnx`` + ``model.onnx.data``); see :meth:`.outline.BuildOutline.build_into`.
build_into = OUTLINE.build_into

#: Raise MissingExtraError if a module the build needs is missing; see :meth:`.outline.BuildOutline.check_requirements`.
check_requirements = OUTLINE.check_requirements


def load_torch_model(info) -> Any:
    """The torch ``LlamaForCausalLM`` the ONNX graph of ``info`` was exported from."""
    return rebuild_from_info(info.config)
