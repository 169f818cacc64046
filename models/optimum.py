"""Decoders exported the way optimum / transformers.js export them: a dynamic past length.

Graph interface (L layers, kv = KV heads, hd = head dim; ``batch``, ``seq`` and ``past`` symbolic):

    inputs   input_ids                      int64   [batch, seq]
             attention_mask                 int64   [batch, past + seq]
             position_ids                   int64   [batch, seq]
             past_key_values.{i}.key/value  float32 [batch, kv, past, hd]
    outputs  logits                         float32 [batch, seq, vocab]
             present.{i}.key/value          float32 [batch, kv, past + seq, hd]

The folder also holds the model's ``config.json`` (``save_pretrained``) and, when it has one, the
tokenizer files next to ``model.onnx`` (optimum's layout), so :func:`mgx_graph.llm.open_decoder.open_decoder`
recognises it by ``config.json`` + ``model.onnx`` and runs it through
:class:`mgx_graph.llm.optimum_runner.OptimumRunner`.

``"llama-optimum"``: the random-weight LLaMA of :mod:`.llama` (its options, less ``batch``);
``"smollm2-optimum"``: SmolLM2-135M-Instruct from the GGUF of :mod:`.smollm2` (options ``gguf``,
``num_layers``, ``verify``). The verify step runs a prefill and three decode steps through
onnxruntime against the torch logits.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import BuildError, VerificationError
from .export import export_onnx, rename_dim_params
from .verify import VERIFY_ATOL, ort_session


def io_names(num_layers: int) -> tuple[list[str], list[str]]:
    """(input names, output names) of the dynamic-past export."""
    kv = [f"{i}.{t}" for i in range(num_layers) for t in ("key", "value")]
    return (["input_ids", "attention_mask", "position_ids", *[f"past_key_values.{n}" for n in kv]],
            ["logits", *[f"present.{n}" for n in kv]])


def make_module(model, num_layers: int):
    """A torch module ``(input_ids, attention_mask, position_ids, *past) -> (logits, *present)``."""
    import torch
    from transformers import DynamicCache

    class DynamicPastStep(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = model

        def forward(self, input_ids, attention_mask, position_ids, *kv):
            cache = DynamicCache(ddp_cache_data=[(kv[2 * i], kv[2 * i + 1]) for i in range(num_layers)])
            out = self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          cache=cache, use_cache=True)
            return (out.logits, *[t for layer in out.cache.layers for t in (layer.keys, layer.values)])

    return DynamicPastStep().eval()


def export(model, onnx_path: Path, num_layers: int, num_kv_heads: int, head_dim: int, max_len: int) -> None:
    """Export ``model`` (a transformers causal LM) with symbolic batch / seq / past. Raises BuildError."""
    import torch
    from torch.export import Dim

    ins, outs = io_names(num_layers)
    B, S, P = 2, 3, 5
    args = (torch.zeros((B, S), dtype=torch.long), torch.ones((B, P + S), dtype=torch.long),
            torch.arange(P, P + S).repeat(B, 1),
            *[torch.zeros((B, num_kv_heads, P, head_dim)) for _ in range(2 * num_layers)])
    batch, seq, past = Dim("batch", max=1024), Dim("seq", max=max_len), Dim("past", max=max_len)
    dyn = ({0: batch, 1: seq}, {0: batch, 1: Dim.AUTO}, {0: batch, 1: seq},
           tuple({0: batch, 2: past} for _ in range(2 * num_layers)))
    export_onnx(make_module(model, num_layers), args, onnx_path, ins, outs, dynamic_shapes=dyn)
    from .export import graph_io

    inputs, _ = graph_io(onnx_path)
    names = {inputs["input_ids"][0][0]: "batch", inputs["input_ids"][0][1]: "seq",
             inputs["past_key_values.0.key"][0][2]: "past"}
    if not all(isinstance(s, str) for s in names):
        raise BuildError(f"{onnx_path}: expected symbolic batch / seq / past dimensions, got {list(names)}")
    total = inputs["attention_mask"][0][1]
    if isinstance(total, str) and total not in names:
        names[total] = "past + seq"
    rename_dim_params(onnx_path, names)


def verify(onnx_path: Path, model, num_layers: int, vocab_size: int, note) -> float:
    """Prefill 4 tokens (past 0, batch 2), then 3 steps feeding present back as past, through
    onnxruntime against the torch logits of the whole sequence. Raises VerificationError."""
    import numpy as np
    import torch

    ids = np.random.default_rng(1234).integers(0, vocab_size, size=(2, 7), dtype=np.int64)
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ids), use_cache=False).logits.numpy()
    sess = ort_session(onnx_path)
    ins, outs = io_names(num_layers)
    shape = sess.get_inputs()[3].shape
    past = {n: np.zeros((2, shape[1], 0, shape[3]), np.float32) for n in ins[3:]}
    worst = 0.0
    for start, end in [(0, 4), (4, 5), (5, 6), (6, 7)]:
        feeds = {"input_ids": ids[:, start:end], "attention_mask": np.ones((2, end), np.int64),
                 "position_ids": np.tile(np.arange(start, end), (2, 1)), **past}
        got = dict(zip(outs, sess.run(outs, feeds)))
        worst = max(worst, float(np.max(np.abs(got["logits"] - ref[:, start:end]))))
        past = {p: got[o] for p, o in zip(ins[3:], outs[1:])}
    note(f"verify: prefill 4 + 3 decode steps (batch 2), max abs logits error ORT vs torch = {worst:.3e}")
    if not np.isfinite(worst) or worst >= VERIFY_ATOL:
        raise VerificationError(f"{onnx_path.name}: ORT logits differ from torch by {worst:.3e}")
    return worst


def finish_folder(model, out_dir: Path, tokenizer=None, eos_token_ids: list[int] | None = None) -> None:
    """Write ``config.json`` (and the tokenizer files) next to ``model.onnx``.

    A ``quantization_config`` (a GGUF checkpoint's) is left out: the graph holds the de-quantized
    float32 weights. ``eos_token_ids``, when given, become the config's ``eos_token_id`` (one id, or
    the list), which :func:`mgx_graph.llm.optimum_runner.read_folder` reads back."""
    import copy

    config = copy.deepcopy(model.config)
    if getattr(config, "quantization_config", None) is not None:
        del config.quantization_config
    if eos_token_ids is not None:
        ids = [int(e) for e in eos_token_ids]
        config.eos_token_id = ids[0] if len(ids) == 1 else ids
    config.save_pretrained(str(out_dir))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out_dir))


def describe(shape, eos: list[int], pad: int, bos: int | None = None, **extra: Any) -> dict[str, Any]:
    """``ModelInfo.config`` of a dynamic-past export (kind ``"optimum"``); ``bos`` defaults to ``pad``."""
    return {"kind": "optimum", "num_layers": shape.num_layers, "num_kv_heads": shape.num_kv_heads,
            "head_dim": shape.head_dim, "vocab_size": shape.vocab_size, "max_cache_len": shape.max_cache_len,
            "eos_token_ids": list(eos), "bos": pad if bos is None else bos, "pad_token_id": pad, **extra}
