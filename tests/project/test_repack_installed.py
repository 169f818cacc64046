"""bench/repack_installed.py: a wheel made from an installed distribution installs with pip (offline) to the same
files, and the requirement walk finds the installed closure of mgx_graph's extras."""
from __future__ import annotations

import filecmp
import importlib.metadata as md
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
import repack_installed as rp  # noqa: E402

from packaging.requirements import Requirement  # noqa: E402


def test_wheel_tag_of_several_tags():
    text = "Wheel-Version: 1.0\nTag: cp312-cp312-manylinux_2_17_x86_64\nTag: cp312-cp312-manylinux2014_x86_64\n"
    assert rp.wheel_tag(text) == "cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64"
    assert rp.wheel_tag("Tag: py2-none-any\nTag: py3-none-any\n") == "py2.py3-none-any"
    with pytest.raises(ValueError):
        rp.wheel_tag("Wheel-Version: 1.0\n")


@pytest.mark.parametrize("name", ["tqdm", "numpy"])  # pure Python; compiled, with a console script
def test_a_repacked_wheel_installs_to_the_same_files(tmp_path, name):
    dist = md.distribution(name)
    path, size, left_out = rp.repack(dist, tmp_path)
    assert path.name.startswith(f"{name}-{dist.version}-") and size == path.stat().st_size
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        assert not [n for n in names if "__pycache__" in n or n.startswith("..")]
        record = z.read(next(n for n in names if n.endswith(".dist-info/RECORD"))).decode()
    listed = {line.split(",")[0] for line in record.splitlines()}
    assert listed == names  # RECORD lists every file, itself included
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--target", str(target), str(path)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PIP_CONFIG_FILE": os.devnull})
    assert r.returncode == 0, r.stderr[-2000:]
    site = Path(dist.locate_file(""))
    compared = 0
    for f in dist.files:
        rel = str(f)
        if rel.startswith("..") or "__pycache__" in rel or ".dist-info/" in rel or not (site / rel).is_file():
            continue
        assert filecmp.cmp(site / rel, target / rel, shallow=False), rel
        compared += 1
    assert compared > 10
    installed = md.Distribution.at(next(target.glob("*.dist-info")))
    assert installed.version == dist.version and installed.metadata["Name"] == dist.metadata["Name"]


def test_the_walk_follows_extras_and_markers():
    """onnx's requirements are walked (numpy, protobuf, ...); an extra not asked for is not; a requirement that
    is not installed is reported, not walked."""
    roots = [Requirement("onnx>=1.16"), Requirement('pytest; extra == "test"'),
             Requirement('no-such-dist-anywhere>=1; extra == "cuda13"')]
    found, missing, _ = rp.closure(roots, set())
    assert {"onnx", "numpy", "protobuf"} <= set(found) and "pytest" not in found and missing == []
    found, missing, _ = rp.closure(roots, {"test", "cuda13"})
    assert "pytest" in found and "pluggy" in found
    assert missing == ['no-such-dist-anywhere>=1; extra == "cuda13"']
    _, _, unsatisfied = rp.closure([Requirement("numpy<1")], set())
    assert unsatisfied == [("numpy<1", md.version("numpy"))]
