"""The prefill step of a fixed-shape decoder: the prompt (or a chunk of it) in one run.

:func:`export_static_prefill` exports, next to the decode step of :mod:`.export`, the same model with
a symbolic number S of new tokens per row (``prefill.onnx``):

    inputs   input_ids                      int64   [B, sequence]   the new tokens (S of them per row)
             cache_position                 int64   [1]             slot of the first new token
             logits_index                   int64   [1]             the column whose logits are returned
             attention_mask                 int64   [B, M]          (B > 1 only) 1 where a row attends to a slot
             position_ids                   int64   [B, sequence]   (B > 1 only) each new token's position
             past_key_values.{i}.key/value  float32 [B, H_kv, M, D]
    outputs  logits                         float32 [B, 1, vocab]   the logits of column ``logits_index``
             present.{i}.key / .value       float32 [B, H_kv, M, D] (slots cache_position .. + S - 1 written)

The new tokens attend causally to each other and to the cache slots before them (transformers'
``StaticCache`` around the incoming caches, as the decode step; with B > 1 the mask is also combined
with ``attention_mask``), so a prompt split in chunks, each run at the slot after the previous one,
gives the logits of one run over the whole prompt.  Only the logits of one column are computed
(transformers' ``logits_to_keep`` with a tensor of indices): a [B, S, vocab] output would be as large
as the rest of the run's memory for long prompts.  The symbolic dimension is named ``sequence``; a
runtime fixes it per length bucket (``dim_params={"sequence": S}``).

The weights are the decode step's: :func:`share_external_data` points every initializer of
``prefill.onnx`` whose bytes the decode step's ``model.onnx.data`` holds at that file, so the folder
holds them once.  :func:`verify_prefill` runs the graph with onnxruntime in two chunks against a
full-sequence torch forward.

torch, onnx and onnxruntime are imported inside the functions that need them.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Callable

from .errors import BuildError, VerificationError
from . import export
from .export import _cache_outputs, _static_cache, graph_io, rename_dim_params, static_step_names

PREFILL_NAME = "prefill.onnx"
#: The name of the symbolic number of new tokens per row.
SEQUENCE_DIM = "sequence"


def static_prefill_names(num_layers: int, batch: int = 1) -> tuple[list[str], list[str], dict[str, str]]:
    """Input names, output names and the alias map of the prefill step (see the module docstring)."""
    inputs, outputs, alias = static_step_names(num_layers, batch)
    return [inputs[0], inputs[1], "logits_index", *inputs[2:]], outputs, alias


def make_static_prefill_module(model: Any, num_layers: int, num_kv_heads: int, head_dim: int, max_cache_len: int,
                               batch: int = 1):
    """Wrap a causal LM as the prefill step of the module docstring:
    ``(input_ids, cache_position, logits_index, [attention_mask, position_ids,] *kv) -> (logits, *kv_out)``."""
    import torch

    config = model.config
    dims = (num_layers, num_kv_heads, head_dim, max_cache_len)

    class StaticPrefill(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = model

        def forward(self, input_ids, cache_position, logits_index, *rest):
            masks = dict(zip(("attention_mask", "position_ids"), rest[:2])) if batch > 1 else {}
            kv = rest[2:] if batch > 1 else rest
            cache = _static_cache(config, kv, cache_position, batch, *dims)
            out = self.lm(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=logits_index, **masks)
            return (out.logits, *_cache_outputs(cache))

    return StaticPrefill().eval()


def export_static_prefill(model: Any, onnx_path: Path, num_layers: int, num_kv_heads: int, head_dim: int,
                          max_cache_len: int, batch: int = 1) -> None:
    """Export ``model`` as the prefill step of ``batch`` rows to ``onnx_path`` (+ its external data).
    Raises BuildError when ``max_cache_len`` < 2 (a one-token prompt is the decode step) or the export
    does not have the symbolic sequence dimension."""
    import torch
    from torch.export import Dim

    if max_cache_len < 2:
        raise BuildError(f"a prefill step needs a cache of at least 2 slots, got max_cache_len={max_cache_len}")
    ins, outs, _ = static_prefill_names(num_layers, batch)
    S = min(3, max_cache_len)
    masks = (torch.ones((batch, max_cache_len), dtype=torch.long), torch.arange(S).repeat(batch, 1))
    args = (torch.zeros((batch, S), dtype=torch.long), torch.zeros((1,), dtype=torch.long),
            torch.tensor([S - 1], dtype=torch.long), *(masks if batch > 1 else ()),
            *[torch.zeros((batch, num_kv_heads, max_cache_len, head_dim)) for _ in range(2 * num_layers)])
    seq = Dim(SEQUENCE_DIM, min=2, max=max_cache_len)
    rest = ((None, {1: seq}) if batch > 1 else ()) + tuple(None for _ in range(2 * num_layers))
    dyn = ({1: seq}, None, None, rest)
    module = make_static_prefill_module(model, num_layers, num_kv_heads, head_dim, max_cache_len, batch)
    export.export_onnx(module, args, onnx_path, ins, outs, dynamic_shapes=dyn)
    symbol = graph_io(onnx_path)[0]["input_ids"][0][1]
    if not isinstance(symbol, str):
        raise BuildError(f"{onnx_path}: expected a symbolic sequence dimension on input_ids, got {symbol!r}")
    rename_dim_params(onnx_path, {symbol: SEQUENCE_DIM})


# -- one copy of the weights ----------------------------------------------------------------------------
def _external(tensor) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def _read(folder: Path, ext: dict[str, str]) -> bytes:
    with open(folder / ext["location"], "rb") as f:
        f.seek(int(ext.get("offset", 0)))
        return f.read(int(ext["length"])) if "length" in ext else f.read()


def _set_external(tensor, location: str, offset: int, length: int) -> None:
    del tensor.external_data[:]
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        tensor.external_data.add(key=k, value=v)


def share_external_data(path: Path, onto: Path) -> int:
    """Point every external initializer of ``path`` whose bytes an external initializer of ``onto`` (an
    ONNX file of the same folder) holds at ``onto``'s data; the others are written again into
    ``path``'s own data file, which is removed when none is left.  Returns the bytes shared."""
    import onnx

    folder = path.parent
    target = onnx.load(str(onto), load_external_data=False)
    held: dict[str, tuple[str, int, int]] = {}
    for t in target.graph.initializer:
        ext = _external(t)
        if t.data_location == onnx.TensorProto.EXTERNAL and "location" in ext:
            data = _read(folder, ext)
            held[hashlib.sha256(data).hexdigest()] = (ext["location"], int(ext.get("offset", 0)), len(data))
    proto = onnx.load(str(path), load_external_data=False)
    own = path.name + ".data"
    rest = path.with_name(own + ".tmp")
    shared, offset = 0, 0
    with open(rest, "wb") as out:
        for t in proto.graph.initializer:
            ext = _external(t)
            if t.data_location != onnx.TensorProto.EXTERNAL or "location" not in ext:
                continue
            data = _read(folder, ext)
            hit = held.get(hashlib.sha256(data).hexdigest())
            if hit is not None:
                _set_external(t, *hit)
                shared += len(data)
                continue
            pad = (-offset) % 64
            out.write(b"\0" * pad)
            offset += pad
            out.write(data)
            _set_external(t, own, offset, len(data))
            offset += len(data)
    if offset:
        os.replace(rest, folder / own)
    else:
        rest.unlink()
        (folder / own).unlink(missing_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    onnx.save(proto, str(tmp))
    os.replace(tmp, path)
    return shared


# -- verification ---------------------------------------------------------------------------------------
def verify_prefill(onnx_path: Path, reference_logits: Callable[[list[int]], Any], token_ids: list[int],
                   num_layers: int, num_kv_heads: int, head_dim: int, max_cache_len: int, batch: int = 1,
                   note: Callable[[str], None] = lambda s: None, atol: float = 1e-3) -> float:
    """Run ``token_ids`` through the prefill graph with onnxruntime in two chunks (the second at the slot
    after the first, the caches fed back; with ``batch`` rows, row b holds the first ``T - b`` tokens
    left-padded and masked) and compare the logits of each chunk's last column with
    ``reference_logits(token_ids)`` (a full-sequence torch forward).  Returns the max abs error; raises
    :class:`VerificationError` if it is >= ``atol``."""
    import numpy as np

    from .verify import ort_session

    T = len(token_ids)
    if not 2 <= T <= max_cache_len or T - (batch - 1) < 1:
        raise ValueError(f"verify_prefill needs 2..{max_cache_len} tokens and at least one per row, got {T}")
    sess = ort_session(onnx_path)
    ins, outs, alias = static_prefill_names(num_layers, batch)
    caches = {n: np.zeros((batch, num_kv_heads, max_cache_len, head_dim), np.float32) for n in alias.values()}
    ref = np.asarray(reference_logits(token_ids), np.float32)
    pads = [min(b, T - 1) for b in range(batch)]
    ids = np.array([[0] * p + list(token_ids[:T - p]) for p in pads], np.int64)
    mask = np.array([[1 if p <= t < T else 0 for t in range(max_cache_len)] for p in pads], np.int64)
    worst = 0.0
    for a, b in ((0, max(T // 2, 1)), (max(T // 2, 1), T)):
        if b - a < 2:  # the graph takes 2 tokens or more per run
            a = max(b - 2, 0)
        feeds = {"input_ids": ids[:, a:b], "cache_position": np.array([a], np.int64),
                 "logits_index": np.array([b - a - 1], np.int64), **caches}
        if batch > 1:
            feeds.update(attention_mask=mask, position_ids=np.maximum(np.arange(a, b)[None, :] -
                                                                      np.array(pads)[:, None], 0))
        got = dict(zip(outs, sess.run(outs, feeds)))
        for r, p in enumerate(pads):
            if b - 1 >= p:  # the column holds a token of row r
                worst = max(worst, float(np.max(np.abs(got["logits"][r, 0] - ref[b - 1 - p]))))
        caches = {alias[o]: got[o] for o in outs[1:]}
    note(f"verify: prefill of {T} tokens in two runs ({batch} row(s)), max abs logits error ORT vs torch = "
         f"{worst:.3e}")
    if not np.isfinite(worst) or worst >= atol:
        raise VerificationError(f"{onnx_path.name}: ORT prefill logits differ from torch by {worst:.3e}")
    return worst
