"""GPT-2 architecture with seeded random weights, exported as a decode step.

Two export kinds:

``kind="static"`` (default) -- a fixed-shape decode step, same interface as SmolLM2:

    inputs   input_ids                     int64   [1, 1]
             cache_position                int64   [1]
             past_key_values.{i}.key       float32 [1, n_head, max_cache_len, head_dim]
             past_key_values.{i}.value     float32 [1, n_head, max_cache_len, head_dim]
    outputs  logits                        float32 [1, 1, vocab_size]
             present.{i}.key / .value      float32 [1, n_head, max_cache_len, head_dim]

  ``present.{i}.*`` aliases ``past_key_values.{i}.*`` (identical shapes). With ``batch = B > 1``
  the step decodes B left-padded rows: ``input_ids`` [B, 1], ``cache_position`` [1], then
  ``attention_mask`` int64 [B, max_cache_len] and ``position_ids`` int64 [B, 1], caches
  [B, n_head, max_cache_len, head_dim], logits [B, 1, vocab_size]
  (see :func:`.export.make_static_step_module`).

``kind="dynamic"`` -- a growing KV cache with symbolic dimensions:

    inputs   input_ids                     int64   [batch, seq]
             attention_mask                int64   [batch, past + seq]
             past_key_values.{i}.key/value float32 [batch, n_head, past, head_dim]
    outputs  logits                        float32 [batch, seq, vocab_size]
             present.{i}.key/value         float32 [batch, n_head, past + seq, head_dim]

  No alias (the shapes differ). ``past`` may be 0 for the first (prefill) call.

The weights are drawn from torch's RNG after ``torch.manual_seed(seed)`` (inside
``torch.random.fork_rng`` so the caller's RNG state is untouched). The construction
arguments, the seed and a SHA-256 of the weights are written to ``model.json`` so an
oracle can rebuild the same module (:func:`rebuild_from_info`). Those helpers are shared
with :mod:`.llama` and live in :mod:`.random_weights`; the build steps follow
:class:`.outline.BuildOutline`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import BuildError, VerificationError
from .export import export_onnx, graph_io, rename_dim_params
from .options import fill_options, require_batch, require_ints
from .outline import DecoderShape, Loaded, export_static
from .random_weights import RandomDecoder, weights_sha256  # noqa: F401  (kept as gpt2.weights_sha256)
from .verify import VERIFY_ATOL, ort_session

NAME = "gpt2"

DEFAULTS: dict[str, Any] = {
    "kind": "static",
    "seed": 0,
    "n_layer": 2,
    "n_embd": 128,
    "n_head": 4,
    "vocab_size": 50257,
    "max_cache_len": 64,
    "batch": 1,
    "verify": True,
}

#: Options that do not change the built files (left out of the cache hash).
NOT_HASHED = frozenset({"verify"})


def normalize_options(options: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults and validate. Raises ``ValueError`` on unknown or bad options."""
    opts = fill_options(NAME, options, DEFAULTS)
    if opts["kind"] not in ("static", "dynamic"):
        raise ValueError(f"gpt2: kind must be 'static' or 'dynamic', got {opts['kind']!r}")
    require_ints(NAME, opts, ("seed",))
    require_ints(NAME, opts, ("n_layer", "n_embd", "n_head", "vocab_size", "max_cache_len"), minimum=1)
    if opts["n_embd"] % opts["n_head"]:
        raise ValueError(f"gpt2: n_embd ({opts['n_embd']}) must be divisible by n_head ({opts['n_head']})")
    if opts["vocab_size"] < 2:
        raise ValueError("gpt2: vocab_size must be >= 2")
    opts["verify"] = bool(opts["verify"])
    if require_batch(NAME, opts) > 1 and opts["kind"] != "static":
        raise ValueError(f"gpt2: batch={opts['batch']} is for kind='static' (the dynamic step has a symbolic batch)")
    return opts


def hash_extra(opts: dict[str, Any], root: Path) -> dict[str, Any]:
    """Nothing outside the options identifies a random-weight GPT-2."""
    return {}


def architecture(opts: dict[str, Any]) -> dict[str, Any]:
    """The GPT2Config keyword arguments for normalized options (eos = bos = vocab_size - 1)."""
    special = opts["vocab_size"] - 1
    return {
        "n_layer": opts["n_layer"],
        "n_embd": opts["n_embd"],
        "n_head": opts["n_head"],
        "vocab_size": opts["vocab_size"],
        "n_positions": opts["max_cache_len"],
        "bos_token_id": special,
        "eos_token_id": special,
        "pad_token_id": special,
    }


def _shape(opts: dict[str, Any]) -> DecoderShape:
    H, E = opts["n_head"], opts["n_embd"]
    return DecoderShape(num_layers=opts["n_layer"], num_heads=H, num_kv_heads=H, head_dim=E // H, hidden_size=E,
                        max_cache_len=opts["max_cache_len"], vocab_size=opts["vocab_size"],
                        batch=opts.get("batch", 1))


def _summary(opts: dict[str, Any], n_params: int) -> str:
    return (f"GPT-2 n_layer={opts['n_layer']} n_embd={opts['n_embd']} n_head={opts['n_head']} "
            f"vocab={opts['vocab_size']} n_positions={opts['max_cache_len']} seed={opts['seed']}: "
            f"{n_params / 1e6:.2f} M params")


RANDOM = RandomDecoder(NAME, "GPT-2", "GPT2Config", "GPT2LMHeadModel", architecture, _shape, _summary)


def make_model(arch: dict[str, Any], seed: int):
    """Build ``GPT2LMHeadModel(GPT2Config(**arch))`` with weights drawn after ``manual_seed(seed)``.

    Returns the module in eval mode, float32, on CPU. The global RNG state is restored.
    """
    return RANDOM.make_model(arch, seed)


def rebuild_from_info(config: dict[str, Any]):
    """Rebuild the torch model described by ``ModelInfo.config`` and check its weights hash.

    Raises :class:`BuildError` if the rebuilt weights differ from the ones that were
    exported (for example under another torch/transformers version).
    """
    return RANDOM.rebuild_from_info(config)


# --------------------------------------------------------------------------------------


def _make_dynamic_module(model, num_layers: int):
    import torch
    from transformers import DynamicCache

    class DynamicDecodeStep(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = model

        def forward(self, input_ids, attention_mask, *kv):
            cache = DynamicCache(ddp_cache_data=[(kv[2 * i], kv[2 * i + 1]) for i in range(num_layers)])
            out = self.lm(input_ids=input_ids, attention_mask=attention_mask, cache=cache, use_cache=True)
            flat = []
            for layer in out.cache.layers:
                flat.append(layer.keys)
                flat.append(layer.values)
            return (out.logits, *flat)

    return DynamicDecodeStep().eval()


def _name_dynamic_dims(onnx_path: Path) -> None:
    """Give the exporter's symbols (s0, s1, ...) readable names: batch, seq, past."""
    inputs, _ = graph_io(onnx_path)
    batch, seq = inputs["input_ids"][0]
    past = inputs["past_key_values.0.key"][0][2]
    total = inputs["attention_mask"][0][1]
    mapping = {}
    for sym, name in ((batch, "batch"), (seq, "seq"), (past, "past")):
        if not isinstance(sym, str):
            raise BuildError(f"gpt2 dynamic: expected a symbolic {name} dimension, got {sym!r}")
        mapping[sym] = name
    if isinstance(total, str) and total not in mapping:
        mapping[total] = "past + seq"
    rename_dim_params(onnx_path, mapping)


def _verify_dynamic(onnx_path: Path, model, opts, note) -> float:
    """Prefill (past = 0, batch 2), then 3 single-token steps feeding present back as past."""
    import numpy as np
    import torch

    L, H = opts["n_layer"], opts["n_head"]
    D = opts["n_embd"] // H
    total = min(7, opts["max_cache_len"])
    prefill = max(1, total - 3)
    rng = np.random.default_rng(1234)
    ids = rng.integers(0, opts["vocab_size"], size=(2, total), dtype=np.int64)
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ids), use_cache=False).logits.numpy()

    sess = ort_session(onnx_path)
    out_names = [o.name for o in sess.get_outputs()]
    past = {f"past_key_values.{i}.{kv}": np.zeros((2, H, 0, D), np.float32) for i in range(L) for kv in ("key", "value")}
    worst, per_step = 0.0, []
    chunks = [(0, prefill)] + [(p, p + 1) for p in range(prefill, total)]
    for start, end in chunks:
        feeds = {
            "input_ids": ids[:, start:end],
            "attention_mask": np.ones((2, end), np.int64),
            **past,
        }
        outs = dict(zip(out_names, sess.run(out_names, feeds)))
        err = float(np.max(np.abs(outs["logits"] - ref[:, start:end])))
        per_step.append(err)
        worst = max(worst, err)
        for i in range(L):
            for kv in ("key", "value"):
                present = outs[f"present.{i}.{kv}"]
                if present.shape != (2, H, end, D):
                    raise VerificationError(f"present.{i}.{kv} has shape {present.shape}, expected {(2, H, end, D)}")
                past[f"past_key_values.{i}.{kv}"] = present
    note(f"verify: prefill {prefill} tokens (past=0, batch 2) + {total - prefill} decode steps, "
         f"max abs logits error ORT vs torch = {worst:.3e} (per call: {', '.join(f'{e:.1e}' for e in per_step)})")
    if not np.isfinite(worst) or worst >= VERIFY_ATOL:
        raise VerificationError(f"{onnx_path.name}: ORT logits differ from torch by {worst:.3e} (tolerance {VERIFY_ATOL:.0e})")
    return worst


def _export_dynamic(loaded: Loaded, onnx_path: Path, opts: dict[str, Any], note) -> dict[str, str]:
    """Export the growing-cache step (symbolic batch, seq, past); no alias."""
    import torch
    from torch.export import Dim

    L, H, D, max_len = opts["n_layer"], opts["n_head"], loaded.shape.head_dim, opts["max_cache_len"]
    past_names = [f"past_key_values.{i}.{kv}" for i in range(L) for kv in ("key", "value")]
    in_names = ["input_ids", "attention_mask", *past_names]
    out_names = ["logits", *[f"present.{i}.{kv}" for i in range(L) for kv in ("key", "value")]]
    module = _make_dynamic_module(loaded.model, L)
    B, S, P = 2, 3, 5
    if S + P > max_len:
        S, P = 2, max(2, max_len - 2)
    if S + P > max_len:
        raise BuildError(f"gpt2 dynamic: max_cache_len={max_len} is too small to export (needs >= 4)")
    args = (
        torch.zeros((B, S), dtype=torch.long),
        torch.ones((B, P + S), dtype=torch.long),
        *[torch.zeros((B, H, P, D)) for _ in range(2 * L)],
    )
    batch, seq, past = Dim("batch", max=1024), Dim("seq", max=max_len), Dim("past", max=max_len)
    dyn = (
        {0: batch, 1: seq},
        {0: batch, 1: Dim.AUTO},
        tuple({0: batch, 2: past} for _ in range(2 * L)),
    )
    export_onnx(module, args, onnx_path, in_names, out_names, dynamic_shapes=dyn)
    _name_dynamic_dims(onnx_path)
    return {}


def _export(loaded: Loaded, onnx_path: Path, opts: dict[str, Any], note) -> dict[str, str]:
    if opts["kind"] == "static":
        return export_static(loaded, onnx_path, opts, note)
    return _export_dynamic(loaded, onnx_path, opts, note)


def _verify(loaded: Loaded, onnx_path: Path, opts: dict[str, Any], note) -> None:
    if opts["kind"] == "static":
        RANDOM.verify_static(loaded, onnx_path, opts, note)
    else:
        RANDOM.verify_rebuild(loaded, opts, note)
        _verify_dynamic(onnx_path, loaded.model, opts, note)


OUTLINE = RANDOM.outline(export=_export, verify=_verify)

#: Build into ``out_dir`` (``model.onnx`` + ``model.onnx.data``); see :meth:`.outline.BuildOutline.build_into`.
build_into = OUTLINE.build_into

#: Raise MissingExtraError if a module the build needs is missing; see :meth:`.outline.BuildOutline.check_requirements`.
check_requirements = OUTLINE.check_requirements


def load_torch_model(info) -> Any:
    """The torch ``GPT2LMHeadModel`` the ONNX graph of ``info`` was exported from."""
    return rebuild_from_info(info.config)
