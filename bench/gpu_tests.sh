#!/usr/bin/env bash
# The gpu tests on the device machine, in one call.
#
# Before, here (network to PyPI), in the repository root:
#   bash bench/download_gpu_wheels.sh     # .whl/gpu: what the machine's image lacks (nvmath-python, ...)
# On the GPU machine, in the repository root with .whl/ carried beside the sources:
#   OUT=/path/to/logs bash bench/gpu_tests.sh [PYTEST PATHS...]      (default: tests)
#
# What it does: installs .whl/gpu's wheels (not mgx_graph's own) into $SITE with no index and no dependencies,
# installs this checkout editable (no build isolation: the image's setuptools), writes the machine's details,
# then runs `pytest -k gpu -v` over the paths with $JOBS workers under a limit of $LIMIT_S seconds. Each test's
# result line is in $OUT/gpu_tests.log as it completes, and each failure's report in $OUT/gpu_failures.log as it
# happens (tests/conftest.py, MGX_FAILURE_LOG), so a run the limit cuts short still says what failed and why.
# Variables: OUT (./gpu_tests_out), SITE (/tmp/mgx-gpu-site), JOBS (12), LIMIT_S (480), PYTEST_K (gpu).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_tests_out}
SITE=${SITE:-/tmp/mgx-gpu-site}
mkdir -p "$OUT" "$SITE"
{
  date -u
  git rev-parse --short HEAD 2>/dev/null || cat .dev/commit 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  wheels=$(ls .whl/gpu/*.whl 2>/dev/null | grep -v '/mgx_graph-')
  [ -n "$wheels" ] && python3 -m pip install -q --no-index --no-deps --target "$SITE" $wheels
  export PYTHONPATH=$SITE
  python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
  python3 - <<'PY'
import sys, importlib
for m in ("cupy", "nvmath", "onnx", "onnxruntime", "torch", "transformers", "mgx_graph"):
    try:
        mod = importlib.import_module(m)
        print(m, getattr(mod, "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print(m, "MISSING", type(e).__name__, e)
print("python", sys.version.split()[0])
PY
} > "$OUT/machine.txt" 2>&1
export PYTHONPATH=$SITE MGX_FAILURE_LOG=$OUT/gpu_failures.log
: > "$MGX_FAILURE_LOG"
timeout "${LIMIT_S:-480}" python3 -m pytest -p no:cacheprovider -q -v -rfE -n "${JOBS:-12}" -k "${PYTEST_K:-gpu}" \
  "${@:-tests}" > "$OUT/gpu_tests.log" 2>&1
echo "exit $? (124: the time limit)" >> "$OUT/gpu_tests.log"
grep -cE "^\[gw[0-9]+\] \[ *[0-9]+%\] PASSED" "$OUT/gpu_tests.log" | sed 's/^/passed: /' >> "$OUT/machine.txt"
