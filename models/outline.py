"""The one outline every model build follows, and what the decoders share within it.

A build runs the steps of :class:`~.progress.Steps` in order:

1. ``fetch weights`` -- locate (or download) the checkpoint; skipped for random weights;
2. ``load``          -- the torch model (and its tokenizer), as a :class:`Loaded`;
3. ``export``        -- the ONNX graph ``model.onnx`` + ``model.onnx.data`` (a fixed-shape decoder
   also ``prefill.onnx``, its prefill step over the same weight file); the tokenizer,
   if any, is saved to ``tokenizer/`` next to it (or into the folder itself, see
   :attr:`BuildOutline.tokenizer_dir`);
4. ``verify``        -- onnxruntime against torch (skipped with ``verify=False``);
5. ``save``          -- metadata and ``model.json``, done by :func:`mgx_graph.models.build`.

A builder declares only what differs, as a :class:`BuildOutline` of callables. The decoders
share the fixed-shape decode step (:func:`export_static`, :func:`verify_static`) and the
``config`` layout of :func:`decoder_config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .errors import require_modules
from .export import export_static_step, graph_io
from .prefill_export import PREFILL_NAME, export_static_prefill, share_external_data, verify_prefill
from .verify import reference_logits, verify_batched_step, verify_static_step

Note = Callable[[str], None]

#: Modules (of the ``[export]`` extra) that every build needs.
EXPORT_MODULES = ("torch", "transformers", "onnxscript")

ONNX_NAME = "model.onnx"
TOKENIZER_DIR = "tokenizer"


@dataclass(frozen=True)
class DecoderShape:
    """Sizes of a decoder and of its fixed-shape decode step (all ints).

    The KV cache tensors are float32 [batch, num_kv_heads, max_cache_len, head_dim], two per layer;
    ``batch`` is 1 unless the step was exported for several rows (then it also takes an
    attention mask and per-row positions, see :func:`.export.make_static_step_module`).
    """

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    max_cache_len: int
    vocab_size: int
    batch: int = 1

    @property
    def cache_dims(self) -> tuple[int, int, int, int]:
        """``(num_layers, num_kv_heads, head_dim, max_cache_len)``: the arguments of the static-step helpers."""
        return self.num_layers, self.num_kv_heads, self.head_dim, self.max_cache_len


@dataclass
class Loaded:
    """What the load step hands to the later steps.

    Attributes:
        model: the torch module (eval mode, float32, CPU).
        shape: the decoder's sizes, or None for an encoder.
        source: the checkpoint the oracle reloads the model from (GGUF file, model folder),
            or None when the weights are rebuilt from ``config`` (random weights).
        tokenizer: a transformers tokenizer saved next to the graph, or None.
        extra: builder-specific values (the random-weights record, parameter count...).
        tokenizer_dir: set by the export step once the tokenizer is saved.
        verified: what the verify step returned (kept in the config by some builders).
    """

    model: Any
    shape: DecoderShape | None = None
    source: Path | None = None
    tokenizer: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    tokenizer_dir: Path | None = None
    verified: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BuildOutline:
    """How one model is built; :meth:`build_into` runs the steps of the module docstring.

    Attributes:
        name: the registry name (``"gpt2"``), used in messages.
        load: ``(source, opts, note) -> Loaded``; ``source`` is what ``fetch`` returned (None
            without a fetch).
        export: ``(loaded, onnx_path, opts, note) -> alias`` (output name -> input name).
        verify: ``(loaded, onnx_path, opts, note) -> dict | None``; raises VerificationError.
        describe: ``(loaded, opts, root) -> config`` (``ModelInfo.config``).
        fetch: ``(opts, root, note) -> source``, or None when there is nothing to fetch.
        nothing_to_fetch: why the fetch step is skipped when ``fetch`` is None.
        requires: modules the build needs (checked before anything runs).
        verify_requires: modules the verify step needs in addition.
        tokenizer_dir: where the tokenizer is saved, relative to the model folder: ``"tokenizer"``,
            or ``"."`` for the folder itself (next to ``model.onnx``, as optimum lays it out).
    """

    name: str
    load: Callable[[Any, dict[str, Any], Note], Loaded]
    export: Callable[[Loaded, Path, dict[str, Any], Note], dict[str, str]]
    verify: Callable[[Loaded, Path, dict[str, Any], Note], dict[str, Any] | None]
    describe: Callable[[Loaded, dict[str, Any], Path], dict[str, Any]]
    fetch: Callable[[dict[str, Any], Path, Note], Any] | None = None
    nothing_to_fetch: str = "random weights, nothing to fetch"
    requires: tuple[str, ...] = EXPORT_MODULES
    verify_requires: tuple[str, ...] = ("onnxruntime",)
    tokenizer_dir: str = TOKENIZER_DIR

    def check_requirements(self, opts: dict[str, Any]) -> None:
        """Raise :class:`~.errors.MissingExtraError` if a module that a build with the
        normalized options ``opts`` imports is missing (:attr:`requires`, plus
        :attr:`verify_requires` when ``opts["verify"]``)."""
        require_modules(self.name, self.requires)
        if opts.get("verify"):
            require_modules(self.name, self.verify_requires, "verifying the export (verify=False skips it)")

    def build_into(self, out_dir: Path, opts: dict[str, Any], steps, root: Path) -> dict[str, Any]:
        """Build into ``out_dir``: ``model.onnx`` + ``model.onnx.data`` (+ the tokenizer).

        ``steps`` is a :class:`~.progress.Steps`; ``root`` the cache root. Returns the
        ModelInfo fields (paths relative to ``out_dir`` where they lie inside it). Raises
        :class:`~.errors.MissingExtraError` for a missing module, else :class:`~.errors.BuildError`
        / :class:`~.errors.VerificationError`.
        """
        self.check_requirements(opts)
        source = None
        if self.fetch is None:
            steps.skip("fetch weights", self.nothing_to_fetch)
        else:
            with steps.step("fetch weights"):
                source = self.fetch(opts, root, steps.note)
        with steps.step("load"):
            loaded = self.load(source, opts, steps.note)
        onnx_path = Path(out_dir) / ONNX_NAME
        with steps.step("export"):
            alias = self.export(loaded, onnx_path, opts, steps.note)
            if loaded.tokenizer is not None:
                loaded.tokenizer_dir = Path(out_dir) / self.tokenizer_dir
                loaded.tokenizer.save_pretrained(str(loaded.tokenizer_dir))
            files = [onnx_path.with_name(n) for n in (ONNX_NAME, ONNX_NAME + ".data", PREFILL_NAME,
                                                      PREFILL_NAME + ".data")]
            size = sum(f.stat().st_size for f in files if f.is_file())
            steps.note(f"exported {size / 1e6:.1f} MB (opset 18, external data)")
        if opts["verify"]:
            with steps.step("verify"):
                loaded.verified = self.verify(loaded, onnx_path, opts, steps.note) or {}
        else:
            steps.skip("verify", "verify=False")
        inputs, outputs = graph_io(onnx_path)
        prefill = Path(out_dir) / PREFILL_NAME
        return {
            "onnx_path": ONNX_NAME,
            "prefill_onnx_path": PREFILL_NAME if prefill.is_file() else None,
            "tokenizer_dir": self.tokenizer_dir if loaded.tokenizer is not None else None,
            "alias": alias,
            "inputs": inputs,
            "outputs": outputs,
            "hf_dir_or_gguf": str(loaded.source) if loaded.source is not None else None,
            "config": self.describe(loaded, opts, root),
        }


# --------------------------------------------------------------------------------------
# what the decoders share


def export_static(loaded: Loaded, onnx_path: Path, opts: dict[str, Any], note: Note) -> dict[str, str]:
    """Export ``loaded.model`` as the fixed-shape decode step of ``loaded.shape`` (``batch`` rows) and its
    prefill step (:func:`export_prefill`); returns the alias map."""
    alias = export_static_step(loaded.model, onnx_path, *loaded.shape.cache_dims, batch=loaded.shape.batch)
    export_prefill(loaded, onnx_path, note)
    return alias


def export_prefill(loaded: Loaded, onnx_path: Path, note: Note) -> None:
    """``prefill.onnx`` next to the decode step ``onnx_path``: the prompt in one run
    (:mod:`.prefill_export`), its weights read from the decode step's data file.  Nothing for a cache of
    one slot (a one-token prompt is the decode step)."""
    shape = loaded.shape
    if shape.max_cache_len < 2:
        note("no prefill step: the cache has one slot")
        return
    path = onnx_path.with_name(PREFILL_NAME)
    export_static_prefill(loaded.model, path, *shape.cache_dims, batch=shape.batch)
    shared = share_external_data(path, onnx_path)
    note(f"prefill step {PREFILL_NAME}: {shared / 1e6:.1f} MB of weights read from {onnx_path.name}.data")


def verify_static(loaded: Loaded, onnx_path: Path, token_ids: list[int], note: Note) -> float:
    """Decode ``token_ids`` through the exported step with onnxruntime and compare every
    step's logits with one torch forward (:func:`~.verify.verify_static_step`). A step of
    several rows decodes left-padded prefixes of ``token_ids``, one length per row
    (:func:`~.verify.verify_batched_step`).  The prefill step, when there is one, runs them in two
    chunks against the same forward first (:func:`~.prefill_export.verify_prefill`)."""
    ref = reference_logits(loaded.model)
    shape = loaded.shape
    prefill = onnx_path.with_name(PREFILL_NAME)
    if prefill.is_file() and len(token_ids) >= max(2, shape.batch):
        verify_prefill(prefill, ref, token_ids, *shape.cache_dims, batch=shape.batch, note=note)
    if shape.batch > 1:
        return verify_batched_step(onnx_path, ref, token_ids, *shape.cache_dims, batch=shape.batch, note=note)
    return verify_static_step(onnx_path, ref, token_ids, *shape.cache_dims, note=note)


def decoder_config(
    architecture: str,
    kind: str,
    shape: DecoderShape,
    eos_token_ids: list[int],
    bos: int | None,
    pad: int | None,
    **extra: Any,
) -> dict[str, Any]:
    """``ModelInfo.config`` of a decoder: architecture, kind ("static" | "dynamic"), the sizes
    of ``shape``, eos_token_ids, bos, pad, then the builder's ``extra`` entries, in that order.
    ``batch`` is there only when it is more than 1 (a config without it, as every build made
    before the option existed, is a one-row step: read it as ``config.get("batch", 1)``)."""
    return {
        "architecture": architecture,
        "kind": kind,
        "num_layers": shape.num_layers,
        "num_kv_heads": shape.num_kv_heads,
        "num_heads": shape.num_heads,
        "head_dim": shape.head_dim,
        "hidden_size": shape.hidden_size,
        "max_cache_len": shape.max_cache_len,
        "vocab_size": shape.vocab_size,
        **({"batch": shape.batch} if shape.batch > 1 else {}),
        "eos_token_ids": list(eos_token_ids),
        "bos": bos,
        "pad": pad,
        **extra,
    }
