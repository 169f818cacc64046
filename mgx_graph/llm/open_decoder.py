"""Opening a model as a decoder: an onnxruntime-genai folder, an optimum-style folder, a registry name or a
folder built by ``mgx_graph.models`` (:func:`open_decoder`)."""
from __future__ import annotations

from pathlib import Path

from ..compiler import compile as compile_model
from ..errors import ParameterError
from ..models import build, list_models
from .folder_config import load_built_info
from .generation import Decoder
from .optimum_runner import OptimumRunner, is_optimum_folder, read_folder
from .runner import FOLDER_MODELS, GenaiLayout, GenaiRunner, is_genai_folder, positive_int


def open_decoder(model, *, batch: int = 1, max_length: int | None = None, target: str = "auto",
                 hip_graph: bool | None = None, fp16: bool = False):
    """A runner for ``model``: an onnxruntime-genai folder, a registry name or a built model folder.

    An onnxruntime-genai folder (or the registry name ``smollm2-genai``) gives a :class:`GenaiRunner`
    of ``max_length`` cache rows (default: 256, at most the context length); an optimum-style folder
    (``config.json`` + ``model.onnx``, or the registry names ``llama-optimum`` / ``smollm2-optimum``) an
    :class:`~mgx_graph.llm.optimum_runner.OptimumRunner` of a ``max_length`` window (default 64, at most the
    context length); anything else a
    :class:`~mgx_graph.llm.generation.Decoder` over the model's fixed-shape decode step (``batch`` rows;
    ``max_length`` must then be None: the step's cache length is fixed when it is built), with the
    model's prefill step when it has one (prompts in one run, :mod:`mgx_graph.llm.prefill`). Returns
    ``(runner, tokenizer folder or None, eos ids, info or None)``. Raises ParameterError.
    """
    if not isinstance(model, (str, Path)):
        raise ParameterError(f"model must be a folder path or a registry name (str), got {model!r}")
    positive_int("batch", batch)
    if max_length is not None:
        positive_int("max_length", max_length)
    info = None
    folder = Path(model) if Path(model).is_dir() else None
    if folder is None and model in list_models():
        info = build(model) if model in FOLDER_MODELS or batch == 1 else build(model, batch=batch)
        folder = info.directory
    if folder is None:
        raise ParameterError(f"{model!r} is neither a model folder nor a registry name ({list_models()})")
    if is_genai_folder(folder):
        lay = GenaiLayout.read(folder)
        m = max_length if max_length is not None else min(256, lay.context_length)
        runner = GenaiRunner(folder, batch=batch, max_length=m, target=target, hip_graph=hip_graph, fp16=fp16)
        return runner, folder, lay.eos_token_ids, info
    if is_optimum_folder(folder):
        if max_length is None:
            max_length = min(64, read_folder(folder)["context_length"])
        runner = OptimumRunner(folder, batch=batch, max_length=max_length, target=target, hip_graph=hip_graph,
                               fp16=fp16)
        tok = folder if (folder / "tokenizer.json").is_file() else None
        return runner, tok, runner.info["eos_token_ids"], info
    if max_length is not None:
        raise ParameterError("max_length applies to onnxruntime-genai and optimum-style folders; a decode step's cache length is "
                             "fixed when it is built (max_cache_len)")
    info = info or load_built_info(folder)
    prog = compile_model(str(info.onnx_path), target=target, hip_graph=hip_graph, fp16=fp16)
    return Decoder(prog, prefill=prefill_path(info)), info.tokenizer_dir, list(info.config.get("eos_token_ids", [])), info


def prefill_path(info):
    """The prefill step of a built model (``info.prefill_onnx_path``) when the folder has it, else None (a
    model built before prefill steps were exported: its prompts run token by token)."""
    path = getattr(info, "prefill_onnx_path", None)
    return path if path is not None and Path(path).is_file() else None

