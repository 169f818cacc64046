"""Checked reads of the JSON files of a model folder (``genai_config.json``, ``config.json``,
``generation_config.json``, the tokenizer's files).

Every field goes through :meth:`Fields.get` with a check (:class:`Int`, :class:`Ids`, :class:`Str`,
:class:`NameTemplate`, :class:`Obj`), so a malformed file is a ParameterError that names the file, the
field, what was expected and what was given.  A file that is missing, unreadable, not UTF-8, not JSON or
not a JSON object is a ParameterError naming the file.  A path named by a field (:meth:`Fields.path`)
must stay inside the folder: an absolute path, one through ``..`` or one whose symbolic links resolve
outside the folder is a ParseError; so is any file read here (:func:`resolve_in`).
"""
from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import ParameterError, ParseError
from ..onnx.external_data import is_inside

_MISSING = object()


def _given(value) -> str:
    """``value`` as the error message shows it (its repr, cut at 80 characters)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def resolve_in(path, folder, where: str | None = None) -> str:
    """The real path of ``path`` (symbolic links resolved), which must be inside the real path of
    ``folder``: ParseError naming the file (``where``) and where it resolves to otherwise, or a name
    holding a NUL byte (no file can have it)."""
    if "\x00" in os.fspath(path) or "\x00" in os.fspath(folder):
        raise ParseError(f"{where or _given(os.fspath(path))}: a file name holding a NUL byte")
    root, real = os.path.realpath(folder), os.path.realpath(path)
    if not is_inside(root, real):
        raise ParseError(f"{where or path}: resolves to {real}, outside the model's folder {folder}")
    return real


def read_json(path, what: str = "", folder=None) -> dict:
    """The JSON object in ``path``, a regular file inside ``folder`` (default: the folder holding it) with
    symbolic links resolved.  ParseError when it resolves outside the folder; ParameterError naming
    ``path`` (and ``what`` the file is for) when it is missing, not a regular file, unreadable, not
    UTF-8, not JSON (nested too deeply or with an integer too long included) or not a JSON object."""
    path = Path(path)
    where = f"{path}{f' ({what})' if what else ''}"
    real = resolve_in(path, path.parent if folder is None else folder, where)
    raw = _read_regular(real, where)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ParameterError(f"{where}: not UTF-8 text (byte {e.start}: {raw[e.start:e.start + 1]!r})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ParameterError(f"{where}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except RecursionError:
        raise ParameterError(f"{where}: not valid JSON here (nested too deeply)") from None
    except ValueError as e:  # an integer of more digits than int() converts
        raise ParameterError(f"{where}: not valid JSON here ({str(e)[:120]})") from None
    if not isinstance(data, dict):
        shown = json.dumps(data)
        raise ParameterError(f"{where}: expected a JSON object, got {shown if len(shown) <= 80 else shown[:77] + '...'}")
    return data


def _read_regular(real: str, where: str) -> bytes:
    """The bytes of the regular file ``real`` (a FIFO or a device is refused without blocking)."""
    try:
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise ParameterError(f"{where}: no such file") from None
    except OSError as e:
        raise ParameterError(f"{where}: cannot read the file: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ParameterError(f"{where}: not a regular file")
        try:
            return f.read()
        except OSError as e:
            raise ParameterError(f"{where}: cannot read the file: {e.strerror or e}") from None


class _Bad(Exception):
    """A check failed: the field's value is not what the check expects."""


@dataclass(frozen=True)
class Int:
    """An int (not a bool) in ``low..high`` (``high`` None: no upper bound)."""

    low: int = 0
    high: int | None = None

    @property
    def expected(self) -> str:
        return f"an int in {self.low}..{self.high}" if self.high is not None else f"an int >= {self.low}"

    def __call__(self, v):
        if isinstance(v, bool) or not isinstance(v, int) or v < self.low or (self.high is not None and v > self.high):
            raise _Bad
        return v


@dataclass(frozen=True)
class Ids:
    """One token id or a non-empty list of them, each an int in ``0..vocab - 1``; gives a list."""

    vocab: int | None
    empty_ok: bool = False

    @property
    def expected(self) -> str:
        ids = f"a token id in 0..{self.vocab - 1}" if self.vocab else "a token id (an int >= 0)"
        return f"{ids} or a {'' if self.empty_ok else 'non-empty '}list of them"

    def __call__(self, v):
        items = v if isinstance(v, list) else [v]
        one = Int(0, self.vocab - 1 if self.vocab else None)
        if not items and not self.empty_ok:
            raise _Bad
        return [one(t) for t in items]


@dataclass(frozen=True)
class Str:
    """A non-empty string."""

    expected: str = "a non-empty string"

    def __call__(self, v):
        if not isinstance(v, str) or not v:
            raise _Bad
        return v


@dataclass(frozen=True)
class Choices:
    """A list of ``length`` strings, each one of ``allowed``."""

    allowed: tuple
    length: int

    @property
    def expected(self) -> str:
        return f"a list of {self.length} of {', '.join(map(repr, self.allowed))}"

    def __call__(self, v):
        if not isinstance(v, list) or len(v) != self.length or any(x not in self.allowed for x in v):
            raise _Bad
        return list(v)


@dataclass(frozen=True)
class NameTemplate:
    """A name pattern with exactly one ``%d`` (the layer index) and no other ``%``."""

    expected: str = "a name with one '%d' (the layer index), e.g. 'past_key_values.%d.key'"

    def __call__(self, v):
        if not isinstance(v, str) or v.count("%") != 1 or "%d" not in v:
            raise _Bad
        return v


@dataclass(frozen=True)
class Obj:
    """A JSON object (a dict)."""

    expected: str = "a JSON object"

    def __call__(self, v):
        if not isinstance(v, dict):
            raise _Bad
        return v


class Fields:
    """Checked access to the JSON object ``data`` read from ``path``; ``prefix`` is its dotted place in
    the file ("model.decoder." for a section)."""

    def __init__(self, path, data: dict, prefix: str = ""):
        self.path, self.data, self.prefix = Path(path), data, prefix

    @classmethod
    def read(cls, path, what: str = "") -> "Fields":
        """The fields of the JSON object in ``path`` (:func:`read_json`)."""
        return cls(path, read_json(path, what))

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def get(self, key: str, check, default=_MISSING):
        """The value of ``key`` passed through ``check``.  A missing or null key gives ``default``
        when one is given; else ParameterError naming the file and the field, expected vs given."""
        name = self.prefix + key
        v = self.data.get(key)
        if v is None:
            if default is not _MISSING:
                return default
            got = "null" if key in self.data else "missing"
            raise ParameterError(f"{self.path}: field '{name}': expected {check.expected}, got {got}")
        try:
            return check(v)
        except _Bad:
            raise ParameterError(f"{self.path}: field '{name}': expected {check.expected}, "
                                 f"got {_given(v)}") from None

    def section(self, key: str) -> "Fields":
        """The fields of the object under ``key`` (required)."""
        return Fields(self.path, self.get(key, Obj()), f"{self.prefix}{key}.")

    def path_in(self, key: str, folder) -> Path:
        """The file named by ``key``, inside ``folder``: ParseError for an absolute path or one that
        leaves the folder through ``..``; ParameterError when it does not exist."""
        v = self.get(key, Str("a file name relative to the folder"))
        if "\x00" in v:
            raise ParseError(f"{self.path}: field '{self.prefix}{key}': expected a file name, got {_given(v)} "
                             f"(a NUL byte)")
        norm = os.path.normpath(v)
        if os.path.isabs(v) or os.path.isabs(norm) or norm == ".." or norm.startswith(".." + os.sep):
            raise ParseError(f"{self.path}: field '{self.prefix}{key}': expected a path inside {folder} "
                             f"(relative, without '..'), got {_given(v)}")
        full = Path(folder) / norm
        resolve_in(full, folder, f"{self.path}: field '{self.prefix}{key}': {_given(v)}")
        try:
            is_file = full.is_file()
        except OSError as e:  # a name too long for the file system, ...
            raise ParameterError(f"{self.path}: field '{self.prefix}{key}': {_given(v)}: {e.strerror or e}") from None
        if not is_file:
            raise ParameterError(f"{self.path}: field '{self.prefix}{key}': {_given(v)} is not a file in {folder}")
        return full

    def fail(self, key: str, message: str) -> ParameterError:
        """A ParameterError naming the file and the field ``key`` with ``message``."""
        return ParameterError(f"{self.path}: field '{self.prefix}{key}': {message}")


MODEL_JSON = "model.json"


def load_built_info(folder):
    """The :class:`~mgx_graph.models.ModelInfo` of a folder built by :mod:`mgx_graph.models` (its
    ``model.json``), the fields the runtime reads checked; ParameterError naming what the folder lacks,
    or the file and the field."""
    from ..models import load_info

    folder = Path(folder)
    if not folder.is_dir():
        raise ParameterError(f"{folder}: no such folder")
    if not (folder / MODEL_JSON).is_file():
        near = [n for n in ("genai_config.json", "config.json", "model.onnx") if (folder / n).is_file()]
        raise ParameterError(f"{folder} is not a model folder: it needs genai_config.json (onnxruntime-genai), "
                             f"config.json + model.onnx (optimum) or {MODEL_JSON} (built by mgx_graph.models)"
                             + (f"; it has only {', '.join(near)}" if near else ""))
    f = Fields.read(folder / MODEL_JSON, "a model built by mgx_graph.models")
    f.get("name", Str())
    onnx_path = Path(f.get("onnx_path", Str()))
    if not (folder / onnx_path).is_file():
        raise f.fail("onnx_path", f"{str(onnx_path)!r} is not a file")
    f.get("inputs", Obj())
    f.get("outputs", Obj())
    cfg = f.section("config")
    vocab = cfg.get("vocab_size", Int(1), None)
    for key in ("batch", "max_cache_len", "num_layers"):
        cfg.get(key, Int(1), None)
    cfg.get("kind", Str(), None)
    cfg.get("eos_token_ids", Ids(vocab, empty_ok=True), None)
    try:
        return load_info(folder)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise ParameterError(f"{folder / MODEL_JSON}: cannot read the model description "
                             f"({type(e).__name__}: {e})") from None


TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


# what transformers' tokenizers may open in their folder: their own files, vocabularies, chat templates and
# config.json (which names the tokenizer's class)
TOKENIZER_FILES = re.compile(r"(tokenizer|vocab|merges|chat_template|special_tokens_map|added_tokens|spiece|"
                             r"sentencepiece|config\.json).*|.*\.(jinja|model|tiktoken|txt)")
TEMPLATE_DIR = "additional_chat_templates"


def check_tokenizer_files(folder) -> None:
    """ParseError naming the file when a file of ``folder`` that a tokenizer may read (:data:`TOKENIZER_FILES`,
    and everything under ``additional_chat_templates/``) resolves outside the folder."""
    folder = Path(folder)
    with os.scandir(folder) as entries:
        names = sorted(e.name for e in entries if TOKENIZER_FILES.fullmatch(e.name) or e.name == TEMPLATE_DIR)
    for name in names:
        resolve_in(folder / name, folder, f"{folder / name} (a tokenizer file)")
    templates = folder / TEMPLATE_DIR
    if templates.is_dir():
        for sub, _, files in os.walk(templates):
            for name in files:
                resolve_in(Path(sub) / name, folder, f"{Path(sub) / name} (a chat template)")


def load_tokenizer(folder):
    """``transformers.AutoTokenizer.from_pretrained(folder)`` after checking its files (none resolving
    outside the folder: :func:`check_tokenizer_files`) and its JSON files (each present one a UTF-8 JSON
    object); ParseError / ParameterError naming the folder and the file when it cannot be loaded."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ParameterError(f"{folder}: the tokenizer folder does not exist")
    check_tokenizer_files(folder)
    for name in TOKENIZER_JSON:
        if (folder / name).exists():
            read_json(folder / name, "a tokenizer file", folder)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:  # tokenizers / transformers raise plain Exception for a corrupt file
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        raise ParameterError(f"{folder}: cannot load the tokenizer (tokenizer.json, tokenizer_config.json): "
                             f"{type(e).__name__}: {first}") from None
