"""The random-weight LLaMA of :mod:`.llama` exported with a dynamic past length (optimum's layout,
see :mod:`.optimum`): ``model.onnx`` + ``config.json``, no tokenizer (eos = pad = ``vocab_size - 1``).

Options: those of :mod:`.llama` except ``batch`` (the export has a symbolic batch);
``max_cache_len`` is the model's ``max_position_embeddings`` (the longest window a runner may use).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from . import llama, optimum
from .outline import BuildOutline

NAME = "llama-optimum"
DEFAULTS = {k: v for k, v in llama.DEFAULTS.items() if k != "batch"}
NOT_HASHED = llama.NOT_HASHED


def normalize_options(options: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults and validate (as :func:`.llama.normalize_options`). Raises ``ValueError``."""
    if "batch" in options:
        raise ValueError(f"{NAME}: no batch option (the export has a symbolic batch)")
    opts = llama.normalize_options(options)
    opts.pop("batch", None)
    return opts


def hash_extra(opts: dict[str, Any], root: Path) -> dict[str, Any]:
    """Nothing outside the options identifies a random-weight LLaMA."""
    return {}


def _export(loaded, onnx_path: Path, opts: dict[str, Any], note) -> dict[str, str]:
    s = loaded.shape
    optimum.export(loaded.model, onnx_path, s.num_layers, s.num_kv_heads, s.head_dim, s.max_cache_len)
    optimum.finish_folder(loaded.model, onnx_path.parent)
    return {}


def _verify(loaded, onnx_path: Path, opts: dict[str, Any], note) -> None:
    llama.RANDOM.verify_rebuild(loaded, opts, note)
    optimum.verify(onnx_path, loaded.model, opts["n_layer"], opts["vocab_size"], note)


def _describe(loaded, opts: dict[str, Any], root: Path) -> dict[str, Any]:
    special = loaded.extra["special"]
    return optimum.describe(loaded.shape, [special], special, llama=loaded.extra["record"])


OUTLINE = BuildOutline(NAME, load=llama.RANDOM.load, export=_export, verify=_verify, describe=_describe)

#: Build into ``out_dir``; see :meth:`.outline.BuildOutline.build_into`.
build_into = OUTLINE.build_into

#: Raise MissingExtraError if a module the build needs is missing.
check_requirements = OUTLINE.check_requirements


def load_torch_model(info) -> Any:
    """The torch ``LlamaForCausalLM`` the graph of ``info`` was exported from (weights hash checked)."""
    return llama.rebuild_from_info(info.config)
