"""The package ships ``py.typed``: mypy (configured in pyproject.toml) finds no errors in mgx_graph and its
operators."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_finds_no_errors():
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    output = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 0, f"mypy exited with {proc.returncode}:\n{output}"
