#!/usr/bin/env bash
# Wheels and a model for a clean install of mgx_graph[cuda13,llm] (and serve's, for the serve benchmark) on the GPU machine, which has no network:
# everything it installs travels with the working tree (64 MiB at most), and its image already holds most of
# what the install needs (CuPy 14, cuda-bindings, the CUDA 13 library wheels, numpy, onnx, transformers, ...:
# bench/gpu_image_packages.txt). So this script, run here with network access to PyPI:
#
#   1. builds mgx_graph's wheel (cp310-abi3: one wheel for the GPU machine's CPython 3.12);
#   2. resolves mgx_graph[cuda13,llm] for CPython 3.12 on Linux x86-64 from PyPI, metadata only, and writes the
#      whole set to .whl/gpu/full_set.txt (name==version per line);
#   3. downloads into .whl/gpu/ the wheels of that set the image does not have (nvmath-python, ...), and into
#      .whl/gpu/fresh/ cuda-pathfinder and cuda-core, small, in case the image's are older than nvmath-python
#      asks (the install takes the image's when they do, these otherwise);
#   4. exports a tiny random Llama (bench/tiny_checkpoint.py; fp16, the cuda graph) with `mgx-graph export`
#      into .whl/gpu-model/tiny-llama-fp16 (needs the genai-export extra in this venv).
#
# .whl/ is ignored by git. On the GPU machine, bench/clean_install_gpu.sh repacks the rest of the set from the
# image's own site-packages (bench/repack_installed.py) and installs from the two folders alone.
#
# Usage, in the repository root:
#   bash bench/download_gpu_wheels.sh           # .whl/gpu + .whl/gpu-model: about 13 MB
#   bash bench/download_gpu_wheels.sh --all     # also .whl/gpu-all: every wheel of the set (several GB; for a
#                                               # machine with nothing installed, not to carry)
# then on the GPU machine, from the repository root with .whl/ copied beside the sources:
#   OUT=/path/to/logs bash bench/clean_install_gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
GPU_PYTHON=3.12        # the GPU machine's CPython (3.12.3)
EXTRAS=cuda13,llm,serve   # serve: fastapi, uvicorn (not in the image) for `mgx-graph serve` and bench/serve_load.py
WHL=.whl/gpu
MODEL=.whl/gpu-model/tiny-llama-fp16
FRESH="cuda-pathfinder cuda-core"   # downloaded even though the image has them
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64
           --platform linux_x86_64)
TARGET=(--only-binary=:all: --python-version "$GPU_PYTHON" --implementation cp --abi "cp${GPU_PYTHON/./}" --abi abi3
        --abi none "${PLATFORMS[@]}")

all=0
[ "${1:-}" = "--all" ] && all=1

rm -rf "$WHL" && mkdir -p "$WHL"
echo "== 1. mgx_graph's wheel"
"$PY" -m pip wheel . --no-deps -q -w "$WHL"
ours=$(ls "$WHL"/mgx_graph-*.whl)
echo "$ours"

echo "== 2. mgx_graph[$EXTRAS] resolved for CPython $GPU_PYTHON, Linux x86-64"
"$PY" -m pip install -q --dry-run --ignore-installed --target "$(mktemp -d)" --report "$WHL/report.json" \
    "${TARGET[@]}" "$ours[$EXTRAS]"
"$PY" - "$WHL" <<'EOF'
import json, sys
from pathlib import Path
folder = Path(sys.argv[1])
rows = sorted((i["metadata"]["name"].lower().replace("_", "-"), i["metadata"]["version"])
              for i in json.loads((folder / "report.json").read_text())["install"])
(folder / "full_set.txt").write_text("".join(f"{n}=={v}\n" for n, v in rows))
print(f"{len(rows)} distributions -> {folder / 'full_set.txt'}")
EOF
rm "$WHL/report.json"

echo "== 3. the wheels the GPU machine's image lacks; $FRESH into $WHL/fresh"
have=" $(grep -v '^#' bench/gpu_image_packages.txt | tr '\n' ' ') "
need=() fresh=()
while IFS= read -r req; do
    name=${req%%==*}
    [ "$name" = mgx-graph ] && continue
    if [[ " $FRESH " == *" $name "* ]]; then fresh+=("$req"); elif [[ "$have" != *" $name "* ]]; then need+=("$req"); fi
done < "$WHL/full_set.txt"
echo "${need[@]}" "| fresh:" "${fresh[@]}"
"$PY" -m pip download -q --no-deps "${TARGET[@]}" -d "$WHL" "${need[@]}"
"$PY" -m pip download -q --no-deps "${TARGET[@]}" -d "$WHL/fresh" "${fresh[@]}"
ls -lR "$WHL"

echo "== 4. a tiny random Llama, exported for the cuda graph at fp16"
rm -rf "$MODEL" "$MODEL-checkpoint"
"$PY" bench/tiny_checkpoint.py "$MODEL-checkpoint" >/dev/null
"$PY" -m mgx_graph export "$MODEL-checkpoint" "$MODEL" --precision fp16
rm -rf "$MODEL-checkpoint"

if [ "$all" = 1 ]; then
    echo "== every wheel of the set -> .whl/gpu-all"
    rm -rf .whl/gpu-all && mkdir -p .whl/gpu-all && cp "$ours" .whl/gpu-all/
    grep -v '^mgx-graph==' "$WHL/full_set.txt" | xargs "$PY" -m pip download -q --no-deps "${TARGET[@]}" -d .whl/gpu-all
    du -sh .whl/gpu-all
fi
du -sh "$WHL" "$(dirname "$MODEL")"
total=$(du -sk "$WHL" "$(dirname "$MODEL")" | awk '{s += $1} END {print s}')
if [ "$total" -gt $((56 * 1024)) ]; then
    echo "too large to travel with the working tree: ${total} KiB in .whl/gpu and .whl/gpu-model" >&2
    exit 1
fi
