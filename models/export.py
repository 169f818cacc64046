"""Export a torch module to ONNX, and read or rewrite what the exported file declares.

* :func:`export_static_step` -- a causal LM as a fixed-shape decode step with the KV cache in and
  out (:func:`make_static_step_module`, names from :func:`static_step_names`), of one row or of
  ``batch`` rows with an attention mask and per-row positions (left padding).
* :func:`export_onnx` -- ``torch.export.export`` then ``torch.onnx.export`` (dynamo, opset 18,
  external data), with the exporter's harmless warnings hidden.
* :func:`rename_dim_params`, :func:`graph_io`, :func:`op_histogram`, :func:`write_metadata` --
  symbolic dimension names, declared inputs / outputs, op counts and ``metadata_props`` of an
  ONNX file (the external data is never rewritten).

torch, transformers and onnx are imported inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

from .errors import BuildError

#: Metadata key (in the ONNX ``metadata_props``) that holds the output->input alias map as JSON.
ALIAS_METADATA_KEY = "mgx_graph.alias"


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Redirect Python-level stdout to stderr (the ONNX exporter prints progress lines)."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def static_step_names(num_layers: int, batch: int = 1) -> tuple[list[str], list[str], dict[str, str]]:
    """Input names, output names and the alias map of a fixed-shape decode step.

    With ``batch > 1`` the inputs are ``input_ids, cache_position, attention_mask, position_ids``
    then the caches (see :func:`make_static_step_module`); with ``batch == 1`` there is no
    ``attention_mask`` / ``position_ids``.
    """
    past = [f"past_key_values.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    present = [f"present.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    masks = ["attention_mask", "position_ids"] if batch > 1 else []
    inputs = ["input_ids", "cache_position", *masks, *past]
    outputs = ["logits", *present]
    return inputs, outputs, dict(zip(present, past))


def _static_cache(config: Any, kv: tuple, cache_position: Any, batch: int, num_layers: int, num_kv_heads: int,
                  head_dim: int, max_cache_len: int):
    """A transformers ``StaticCache`` whose layers are the incoming cache tensors ``kv`` and whose
    write slot (``cumulative_length``) is ``cache_position[0]``."""
    import torch
    from transformers import StaticCache

    cache: Any = StaticCache(config=config, max_cache_len=max_cache_len)  # its layers get keys / values below
    if len(cache.layers) != num_layers:
        raise BuildError(f"static cache has {len(cache.layers)} layers, expected {num_layers}")
    cache.early_initialization(batch, num_kv_heads, head_dim, torch.float32, cache_position.device)
    for i, layer in enumerate(cache.layers):
        layer.keys = kv[2 * i]
        layer.values = kv[2 * i + 1]
        layer.cumulative_length = cache_position[0].clone()
    return cache


def _cache_outputs(cache: Any) -> list:
    flat = []
    for layer in cache.layers:
        flat.append(layer.keys.clone())
        flat.append(layer.values.clone())
    return flat


def make_static_step_module(model: Any, num_layers: int, num_kv_heads: int, head_dim: int, max_cache_len: int,
                            batch: int = 1):
    """Wrap a causal LM as ``(input_ids, cache_position, *kv) -> (logits, *kv_out)``.

    ``input_ids`` is int64 [1, 1], ``cache_position`` int64 [1] (the slot the new token is
    written to, equal to the number of tokens already in the cache), each of the
    ``2 * num_layers`` cache tensors is float32 [1, num_kv_heads, max_cache_len, head_dim]
    (key, value, key, value, ... by layer). The outputs are the logits [1, 1, vocab] and the
    updated caches with the same shapes. A transformers ``StaticCache`` is built around the
    incoming tensors; its in-place ``index_copy_`` becomes a ScatterND in ONNX, and the
    ``.clone()`` on the returned caches makes the exporter keep the update as an output.

    With ``batch = B > 1`` the step is ``(input_ids, cache_position, attention_mask, position_ids,
    *kv) -> (logits, *kv_out)`` for B rows decoded in lockstep with left padding: ``input_ids``
    int64 [B, 1]; ``cache_position`` int64 [1], the slot written in every row; ``attention_mask``
    int64 [B, max_cache_len], 1 where a row attends to a slot (transformers' 2-D padding mask,
    combined in the model with the causal mask ``slot <= cache_position``); ``position_ids``
    int64 [B, 1], each row's position of its token (the rotary / learned position embedding:
    the slot minus the row's left padding); caches [B, num_kv_heads, max_cache_len, head_dim];
    logits [B, 1, vocab].
    """
    import torch

    config = model.config
    dims = (num_layers, num_kv_heads, head_dim, max_cache_len)

    class StaticDecodeStep(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = model

        def forward(self, input_ids, cache_position, *kv):
            cache = _static_cache(config, kv, cache_position, 1, *dims)
            out = self.lm(input_ids=input_ids, cache=cache, use_cache=True)
            return (out.logits, *_cache_outputs(cache))

    class BatchedDecodeStep(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = model

        def forward(self, input_ids, cache_position, attention_mask, position_ids, *kv):
            cache = _static_cache(config, kv, cache_position, batch, *dims)
            out = self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          cache=cache, use_cache=True)
            return (out.logits, *_cache_outputs(cache))

    return (StaticDecodeStep() if batch == 1 else BatchedDecodeStep()).eval()


def static_step_example_args(num_layers: int, num_kv_heads: int, head_dim: int, max_cache_len: int,
                             batch: int = 1) -> tuple:
    """Example inputs for :func:`make_static_step_module`: ids [B,1], position [1], (with B > 1:
    attention mask [B, max_cache_len] of ones, position ids [B,1]), caches; zeros elsewhere."""
    import torch

    masks = (torch.ones((batch, max_cache_len), dtype=torch.long), torch.zeros((batch, 1), dtype=torch.long))
    return (
        torch.zeros((batch, 1), dtype=torch.long),
        torch.zeros((1,), dtype=torch.long),
        *(masks if batch > 1 else ()),
        *[torch.zeros((batch, num_kv_heads, max_cache_len, head_dim)) for _ in range(2 * num_layers)],
    )


def export_static_step(
    model: Any, onnx_path: Path, num_layers: int, num_kv_heads: int, head_dim: int, max_cache_len: int,
    batch: int = 1,
) -> dict[str, str]:
    """Export ``model`` as a fixed-shape decode step of ``batch`` rows (see
    :func:`make_static_step_module`) to ``onnx_path`` with the names of :func:`static_step_names`;
    returns the alias map."""
    in_names, out_names, alias = static_step_names(num_layers, batch)
    module = make_static_step_module(model, num_layers, num_kv_heads, head_dim, max_cache_len, batch)
    args = static_step_example_args(num_layers, num_kv_heads, head_dim, max_cache_len, batch)
    export_onnx(module, args, onnx_path, in_names, out_names)
    return alias


def export_onnx(
    module: Any,
    args: tuple,
    path: Path,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_shapes: Any = None,
    opset: int = 18,
) -> None:
    """Export ``module`` with the dynamo exporter to ``path`` (+ ``path.data`` external data).

    ``torch.export.export(strict=False)`` runs first, then ``torch.onnx.export`` on the
    resulting ExportedProgram. Raises :class:`BuildError` if the produced graph does not
    have exactly the requested input/output names.
    """
    import torch
    import onnx

    path = Path(path)
    with torch.no_grad(), stdout_to_stderr(), _quiet_exporter():
        ep = torch.export.export(module, args, dynamic_shapes=dynamic_shapes, strict=False)
        torch.onnx.export(
            ep,
            args,
            str(path),
            dynamo=True,
            opset_version=opset,
            input_names=list(input_names),
            output_names=list(output_names),
            external_data=True,
            optimize=True,
            verbose=False,
        )
    proto = onnx.load(str(path), load_external_data=False)
    got_in = [i.name for i in proto.graph.input]
    got_out = [o.name for o in proto.graph.output]
    if got_in != list(input_names) or got_out != list(output_names):
        raise BuildError(
            f"exported graph has unexpected I/O names:\n inputs {got_in}\n outputs {got_out}"
        )


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Hide the exporter's harmless warnings (missing torchvision ops, deprecations)."""
    import logging
    import warnings

    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        logger.setLevel(level)


def rename_dim_params(path: Path, mapping: dict[str, str]) -> None:
    """Rename symbolic dimensions (``dim_param``) of an ONNX file in place.

    ``mapping`` maps exporter symbols such as ``"s33"`` to readable names such as
    ``"batch"``; symbols inside expressions (``"s18 + s70"``) are renamed too. Graph
    inputs, outputs and value_info are rewritten; the external data is untouched.
    """
    import re

    import onnx

    if not mapping:
        return
    pattern = re.compile(r"\b(" + "|".join(re.escape(k) for k in sorted(mapping, key=len, reverse=True)) + r")\b")
    proto = onnx.load(str(path), load_external_data=False)
    for vi in [*proto.graph.input, *proto.graph.output, *proto.graph.value_info]:
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param"):
                d.dim_param = pattern.sub(lambda m: mapping[m.group(1)], d.dim_param)
    tmp = path.with_name(path.name + ".tmp")
    onnx.save(proto, str(tmp))
    os.replace(tmp, path)


_ONNX_TO_NUMPY = {1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64", 9: "bool", 10: "float16", 11: "float64"}


def graph_io(path: Path) -> tuple[dict[str, tuple[list, str]], dict[str, tuple[list, str]]]:
    """Read the declared inputs and outputs of an ONNX file.

    Returns two dicts name -> (shape, numpy dtype string); a symbolic dimension is given
    by its ``dim_param`` string, an unknown one by ``None``.
    """
    import onnx

    proto = onnx.load(str(path), load_external_data=False)

    def one(vi) -> tuple[list, str]:
        tt = vi.type.tensor_type
        dims: list = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param"):
                dims.append(d.dim_param)
            else:
                dims.append(None)
        return dims, _ONNX_TO_NUMPY.get(tt.elem_type, str(tt.elem_type))

    return ({v.name: one(v) for v in proto.graph.input}, {v.name: one(v) for v in proto.graph.output})


def op_histogram(path: Path) -> dict[str, int]:
    """Count the nodes of an ONNX file per op type (subgraphs included), most frequent first."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    counts: dict[str, int] = {}

    def walk(graph) -> None:
        for node in graph.node:
            key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
            counts[key] = counts.get(key, 0) + 1
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for g in attr.graphs:
                        walk(g)

    walk(proto.graph)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def write_metadata(path: Path, props: dict[str, str]) -> None:
    """Set (or replace) ``metadata_props`` entries of an ONNX file in place.

    Only the graph file is rewritten; the external data file and the references to it
    are left untouched.
    """
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    keep = [p for p in proto.metadata_props if p.key not in props]
    del proto.metadata_props[:]
    for p in keep:
        proto.metadata_props.add(key=p.key, value=p.value)
    for k, v in props.items():
        proto.metadata_props.add(key=k, value=v)
    tmp = path.with_name(path.name + ".tmp")
    onnx.save(proto, str(tmp))
    os.replace(tmp, path)
