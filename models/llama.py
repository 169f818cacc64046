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

Options (defaults): ``seed`` (0), ``n_layer`` (2), ``hidden_size`` (64), ``n_head`` (4),
``n_kv_head`` (2; must divide ``n_head``, equal to it gives plain multi-head attention),
``intermediate_size`` (128), ``vocab_size`` (256), ``max_cache_len`` (32, also the
model's ``max_position_embeddings``), ``rms_norm_eps`` (1e-5), ``initializer_range`` (0.2),
``verify`` (True). ``hidden_size / n_head`` must be even (RoPE rotates pairs).

``initializer_range`` is the std of the normal init of every linear and embedding weight.
transformers' own default, 0.02, makes the attention and MLP branches so small next to
the residual that, through the tied embeddings, the argmax is almost always the input
token: greedy decoding just repeats the last prompt token whatever the context, which
makes a weak oracle check. At 0.2 the continuation depends on the whole prompt.

The weights are drawn like GPT-2's (:func:`._common.seeded_model`); the construction
arguments, the seed and a SHA-256 of the weights go to ``model.json`` under ``"llama"``
so the oracle rebuilds the same module (:func:`rebuild_from_info`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._common import (
    BuildError,
    VerificationError,
    export_static_step,
    fill_options,
    graph_io,
    random_verify_tokens,
    random_weights_record,
    rebuild_random_model,
    reference_logits,
    require_ints,
    seeded_model,
    verify_static_step,
)

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
    opts["verify"] = bool(opts["verify"])
    return opts


def hash_extra(opts: dict[str, Any], root: Path) -> dict[str, Any]:
    """Nothing outside the options identifies a random-weight LLaMA."""
    return {}


def architecture(opts: dict[str, Any]) -> dict[str, Any]:
    """The LlamaConfig keyword arguments for normalized options (eos = bos = pad = vocab_size - 1)."""
    special = opts["vocab_size"] - 1
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
    }


def make_model(arch: dict[str, Any], seed: int):
    """Build ``LlamaForCausalLM(LlamaConfig(**arch))`` with weights drawn after ``manual_seed(seed)``.

    Returns the module in eval mode, float32, on CPU. The global RNG state is restored.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**arch)
    return seeded_model(lambda: LlamaForCausalLM(config), seed)


def rebuild_from_info(config: dict[str, Any]):
    """Rebuild the torch model described by ``ModelInfo.config`` and check its weights hash.

    Raises :class:`BuildError` if the rebuilt weights differ from the exported ones.
    """
    return rebuild_random_model(config[NAME], make_model, "LLaMA")


def build_into(out_dir: Path, opts: dict[str, Any], steps, root: Path) -> dict[str, Any]:
    """Build the model into ``out_dir`` (``model.onnx`` + ``model.onnx.data``).

    Returns the ModelInfo fields (paths relative to ``out_dir`` where they lie inside it).
    Raises :class:`BuildError` / :class:`VerificationError`.
    """
    L, H, H_kv = opts["n_layer"], opts["n_head"], opts["n_kv_head"]
    E = opts["hidden_size"]
    D = E // H
    M = opts["max_cache_len"]
    arch = architecture(opts)

    steps.skip("fetch weights", "random weights, nothing to fetch")

    with steps.step("load"):
        model = make_model(arch, opts["seed"])
        if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
            raise BuildError("llama: lm_head is not tied to embed_tokens")
        record = random_weights_record(model, arch, opts["seed"])
        digest, n_params = record["weights_sha256"], record["num_params"]
        steps.note(f"LLaMA n_layer={L} hidden={E} heads={H} kv_heads={H_kv} head_dim={D} "
                   f"ffn={opts['intermediate_size']} vocab={opts['vocab_size']} max_pos={M} "
                   f"seed={opts['seed']}: {n_params / 1e6:.3f} M params")

    onnx_path = out_dir / "model.onnx"
    with steps.step("export"):
        alias = export_static_step(model, onnx_path, L, H_kv, D, M)

    if opts["verify"]:
        with steps.step("verify"):
            rebuild_random_model(record, make_model, "LLaMA", error=VerificationError)
            steps.note(f"verify: rebuilt with seed {opts['seed']}: identical weights (sha256 {digest[:16]})")
            toks = random_verify_tokens(opts["vocab_size"], M)
            verify_static_step(onnx_path, reference_logits(model), toks, L, H_kv, D, M, note=steps.note)
    else:
        steps.skip("verify", "verify=False")

    inputs, outputs = graph_io(onnx_path)
    special = arch["eos_token_id"]
    return {
        "onnx_path": "model.onnx",
        "tokenizer_dir": None,
        "alias": alias,
        "inputs": inputs,
        "outputs": outputs,
        "hf_dir_or_gguf": None,
        "config": {
            "architecture": "llama",
            "kind": "static",
            "num_layers": L,
            "num_kv_heads": H_kv,
            "num_heads": H,
            "head_dim": D,
            "hidden_size": E,
            "max_cache_len": M,
            "vocab_size": opts["vocab_size"],
            "eos_token_ids": [special],
            "bos": special,
            "pad": special,
            NAME: record,
        },
    }


def load_torch_model(info) -> Any:
    """The torch ``LlamaForCausalLM`` the ONNX graph of ``info`` was exported from."""
    return rebuild_from_info(info.config)
