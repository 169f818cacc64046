"""Wheels of distributions already installed in this Python's environment, for an offline install elsewhere.

The GPU machine has no network, and the wheels of mgx_graph[cuda13,llm] weigh several GB (cuBLAS alone is
most of it), more than can travel with the working tree; but its image has most of them installed. This
script, run with that image's Python, walks the requirements of mgx_graph's wheel (with the extras asked for)
through the installed distributions, and writes one wheel per installed distribution of that closure into
``--out``, from its own files as its ``RECORD`` lists them:

    python3 bench/repack_installed.py --wheel .whl/gpu/mgx_graph-*.whl --extras cuda13,llm --out /tmp/wheelhouse

Then ``pip install --no-index --find-links /tmp/wheelhouse --find-links .whl/gpu 'mgx_graph-...whl[cuda13,llm]'``
installs into a fresh venv from the two folders alone (bench/clean_install_gpu.sh). A wheel made here holds the
distribution's files inside site-packages and its ``.dist-info`` (``METADATA``, ``WHEEL``, entry points,
licenses) with a new ``RECORD``; compiled ``__pycache__`` files are left out, and so are files outside
site-packages (console scripts: pip makes them again from ``entry_points.txt``). Requirements that are not
installed here are listed at the end (they must come from the other folder); an installed version that does
not satisfy a requirement is listed too (pip then takes another from the other folder, or says why not).
Needs ``packaging`` (installed wherever pip is).
"""
from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import importlib.metadata as md
import io
import re
import sys
import zipfile
from pathlib import Path, PurePosixPath

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

SKIP_DIST_INFO = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
STORED_FROM = 4 << 20  # files this large go into the wheel uncompressed (shared libraries: quick, little lost)


def wheel_requirements(wheel: Path) -> list[Requirement]:
    """The ``Requires-Dist`` lines of ``wheel``'s METADATA."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode("utf-8")
    return [Requirement(line.split(":", 1)[1].strip()) for line in text.splitlines()
            if line.startswith("Requires-Dist:")]


def wanted(req: Requirement, extras: set) -> bool:
    """Whether ``req`` applies here with ``extras`` asked of the distribution that requires it."""
    if req.marker is None:
        return True
    return any(req.marker.evaluate({"extra": e}) for e in (extras or {""}))


def closure(roots: list[Requirement], extras: set) -> tuple[dict, list, list]:
    """``({name: installed Distribution}, [requirements not installed], [(requirement, installed version)
    not satisfying it])`` over the requirements ``roots`` (of a distribution asked with ``extras``)."""
    found: dict = {}
    missing: list = []
    unsatisfied: list = []
    asked: dict = {}  # name -> extras already walked
    todo = [(r, extras) for r in roots]
    while todo:
        req, parent_extras = todo.pop()
        if not wanted(req, parent_extras):
            continue
        name = canonicalize_name(req.name)
        want = set(req.extras)
        if name in asked and want <= asked[name]:
            continue
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            missing.append(str(req))
            asked[name] = asked.get(name, set()) | want
            continue
        if req.specifier and not req.specifier.contains(dist.version, prereleases=True):
            unsatisfied.append((str(req), dist.version))
        asked[name] = asked.get(name, set()) | want
        found[name] = dist
        todo += [(Requirement(r), asked[name]) for r in (dist.requires or [])]
    return found, sorted(set(missing)), unsatisfied


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel_tag(wheel_text: str) -> str:
    """The file-name tag of the ``Tag:`` lines of a WHEEL file (``cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64``)."""
    tags = [ln.split(":", 1)[1].strip() for ln in wheel_text.splitlines() if ln.startswith("Tag:")]
    if not tags:
        raise ValueError("WHEEL lists no Tag")
    parts = [sorted({t.split("-")[i] for t in tags}, key=[t.split("-")[i] for t in tags].index) for i in range(3)]
    return "-".join(".".join(p) for p in parts)


def repack(dist, out: Path) -> tuple[Path, int, list]:
    """One wheel of the installed ``dist`` in ``out``: ``(path, bytes, files left out)``."""
    files = dist.files
    if not files:
        raise ValueError("no RECORD (installed without one)")
    site = Path(dist.locate_file(""))
    info = next(PurePosixPath(str(f)).parts[0] for f in files if str(f).endswith(".dist-info/METADATA"))
    wheel_text = (site / info / "WHEEL").read_text(encoding="utf-8")
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
    path = out / f"{name}-{dist.version.replace('-', '_')}-{wheel_tag(wheel_text)}.whl"
    records, left_out = [], []
    with zipfile.ZipFile(path, "w") as z:
        for f in files:
            rel = PurePosixPath(str(f))
            if rel.parts[0] == ".." or "__pycache__" in rel.parts or rel.suffix == ".pyc":
                left_out.append(str(rel))
                continue
            if rel.parts[0] == info and rel.name in SKIP_DIST_INFO:
                continue
            src = site / rel
            if not src.is_file():
                left_out.append(f"{rel} (missing)")
                continue
            data = src.read_bytes()
            zi = zipfile.ZipInfo.from_file(src, str(rel))
            zi.compress_type = zipfile.ZIP_STORED if len(data) >= STORED_FROM else zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
            records.append((str(rel), _hash(data), str(len(data))))
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(records + [(f"{info}/RECORD", "", "")])
        z.writestr(f"{info}/RECORD", buf.getvalue())
    return path, path.stat().st_size, left_out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheel", required=True, type=Path, help="the wheel whose requirements are walked (mgx_graph's)")
    ap.add_argument("--extras", default="", help="its extras, comma-separated (e.g. cuda13,llm)")
    ap.add_argument("--out", required=True, type=Path, help="the folder for the wheels (made if needed)")
    args = ap.parse_args(argv)
    extras = {e.strip() for e in args.extras.split(",") if e.strip()}
    args.out.mkdir(parents=True, exist_ok=True)
    found, missing, unsatisfied = closure(wheel_requirements(args.wheel), extras)
    print(f"{sys.executable} (Python {sys.version.split()[0]}): {len(found)} installed distributions in the "
          f"closure of {args.wheel.name}[{','.join(sorted(extras))}]")
    total, failed = 0, []
    for name, dist in sorted(found.items()):
        try:
            path, size, left_out = repack(dist, args.out)
        except (OSError, ValueError, StopIteration) as e:
            failed.append(f"{name} {dist.version}: {e}")
            continue
        total += size
        note = f"; left out {len(left_out)} files outside site-packages or compiled" if left_out else ""
        print(f"  {path.name}  {size / 1e6:.1f} MB{note}")
    print(f"repacked: {len(found) - len(failed)} wheels, {total / 1e6:.0f} MB -> {args.out}")
    for req, version in unsatisfied:
        print(f"installed here but not satisfying {req}: {version}")
    for req in missing:
        print(f"not installed here (must come from the other folder): {req}")
    for line in failed:
        print(f"not repacked: {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
