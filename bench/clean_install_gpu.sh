#!/usr/bin/env bash
# A clean install of mgx_graph[cuda13,llm] on the GPU machine, offline, and a generate on the gpu target.
#
# Before, here (network to PyPI), in the repository root:
#   bash bench/download_gpu_wheels.sh     # .whl/gpu (mgx_graph's wheel, nvmath-python, ...) and .whl/gpu-model
# On the GPU machine, in the repository root with .whl/ copied beside the sources (about 18 MB; .whl/ is ignored
# by git, so it travels only when named):
#   OUT=/path/to/logs bash bench/clean_install_gpu.sh          # writes $OUT/clean_install_gpu.log
#
# What it does:
#   1. bench/repack_installed.py, with the machine's own python3 (the image's, which holds torch): wheels of the
#      installed distributions that mgx_graph[cuda13,llm] needs (CuPy, cuda-bindings, the CUDA 13 library wheels
#      of cuda-toolkit[cublas,cudart,cufft,nvrtc], numpy, onnx, transformers, ...) into $WHEELHOUSE;
#   2. a fresh venv ($VENV) without the system site-packages (and so without torch);
#   3. pip install --no-index --find-links .whl/gpu --find-links $WHEELHOUSE 'mgx_graph-*.whl[cuda13,llm]' (again
#      with .whl/gpu/fresh, newer cuda-pathfinder and cuda-core, if the image's do not satisfy nvmath-python);
#   4. checks that torch is not importable there, that NVRTC (a CuPy kernel including cuda_fp16.h), cuBLAS
#      (nvmath-python), cuFFT (cupy.fft) and cudart load from the venv's own wheels (/proc/self/maps), with no
#      CUDA_PATH / CUDA_HOME and no toolkit folder on PATH or LD_LIBRARY_PATH;
#   5. mgx-graph generate on the tiny Llama (fp16, graphs on) on gpu, then on ref; the same prompt through
#      mgx_graph.llm.LLM on both targets, tokens printed side by side.
# Exit status 0 when steps 1 to 5 passed (the gpu / ref token comparison is printed, not required: fp16 on the
# GPU against numpy). Variables: OUT (default ./clean_install_out), VENV (/tmp/mgx-clean-venv), WHEELHOUSE
# (/tmp/mgx-wheelhouse), SYS_PYTHON (python3), EXTRAS (cuda13,llm).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/clean_install_out}
VENV=${VENV:-/tmp/mgx-clean-venv}
WHEELHOUSE=${WHEELHOUSE:-/tmp/mgx-wheelhouse}
SYS_PYTHON=${SYS_PYTHON:-python3}
CARRY=.whl/gpu
MODEL=.whl/gpu-model/tiny-llama-fp16
EXTRAS=${EXTRAS:-cuda13,llm}
mkdir -p "$OUT"
exec > >(tee "$OUT/clean_install_gpu.log") 2>&1
failed=()
step() { echo; echo "== $*"; }

step "machine"
date -u +%Y-%m-%dT%H:%MZ
git log -1 --format='%h %s' 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
"$SYS_PYTHON" -c 'import sys; print(sys.executable, sys.version.split()[0])'
echo "CUDA_PATH=${CUDA_PATH:-} CUDA_HOME=${CUDA_HOME:-}"
echo "PATH=$PATH"
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
ours=$(ls "$CARRY"/mgx_graph-*.whl 2>/dev/null | head -1)
if [ -z "$ours" ] || [ ! -f "$MODEL/genai_config.json" ]; then
    echo "missing $CARRY/mgx_graph-*.whl or $MODEL: run bench/download_gpu_wheels.sh first and bring .whl/ along"
    exit 2
fi
ls -l "$CARRY"

step "1. wheels of what the image has installed"
rm -rf "$WHEELHOUSE"
"$SYS_PYTHON" bench/repack_installed.py --wheel "$ours" --extras "$EXTRAS" --out "$WHEELHOUSE" || failed+=(repack)

step "2. a fresh venv without system site-packages"
rm -rf "$VENV"
if "$SYS_PYTHON" -m venv "$VENV" 2>/dev/null; then
    PIP=("$VENV/bin/python" -m pip)
else  # a Python without ensurepip: the image's pip installs into the venv
    "$SYS_PYTHON" -m venv --without-pip "$VENV"
    PIP=("$SYS_PYTHON" -m pip --python "$VENV/bin/python")
fi
cat "$VENV/pyvenv.cfg"

step "3. pip install --no-index from $CARRY and $WHEELHOUSE"
install=("${PIP[@]}" install --no-index --no-cache-dir --find-links "$CARRY" --find-links "$WHEELHOUSE")
if ! "${install[@]}" "$ours[$EXTRAS]"; then
    echo "-- again with $CARRY/fresh"
    "${install[@]}" --find-links "$CARRY/fresh" "$ours[$EXTRAS]" || { failed+=(install); echo "install failed"; }
fi
"${PIP[@]}" list 2>/dev/null

# The venv alone: no toolkit folder on PATH / LD_LIBRARY_PATH (the driver's folders stay), no CUDA_PATH.
clean_path=$(echo "$PATH" | tr ':' '\n' | grep -v -i -e cuda -e '/opt/torch' | paste -sd: -)
clean_ld=$(echo "${LD_LIBRARY_PATH:-}" | tr ':' '\n' | grep -v -i -e 'cuda[-/0-9.]*/\(lib\|targets\)' -e site-packages \
           | paste -sd: -)
RUN=(env -u CUDA_PATH -u CUDA_HOME -u PYTHONPATH PATH="$VENV/bin:$clean_path" LD_LIBRARY_PATH="$clean_ld")
echo "venv commands run with: PATH=$VENV/bin:$clean_path LD_LIBRARY_PATH=$clean_ld"

step "4. torch absent; NVRTC, cuBLAS, cuFFT and cudart from the venv's wheels"
"${RUN[@]}" "$VENV/bin/python" -I - "$MODEL" <<'EOF' || failed+=(libraries)
import importlib.util, sys
venv = sys.prefix
print("python:", sys.executable, sys.version.split()[0])
assert importlib.util.find_spec("torch") is None, "torch is importable in the clean venv"
print("torch: not installed")
import cupy, nvmath
from cuda import pathfinder
print("cupy", cupy.__version__, "| nvmath-python", nvmath.__version__, "| cuda.pathfinder", pathfinder.__version__,
      "| cupy.cuda.get_cuda_path():", cupy.cuda.get_cuda_path())
src = '#include <cuda_fp16.h>\nextern "C" __global__ void half_it(const float* x, float* y) {' \
      ' y[threadIdx.x] = __half2float(__float2half(x[threadIdx.x] * 0.5f)); }'
x = cupy.arange(32, dtype=cupy.float32)
y = cupy.empty_like(x)
cupy.RawModule(code=src).get_function("half_it")((1,), (32,), (x, y))
assert (y.get() == x.get() * 0.5).all()
print("NVRTC: a kernel including cuda_fp16.h compiled and ran")
from nvmath.bindings import cublas
h = cublas.create(); print("cuBLAS: version", cublas.get_version(h)); cublas.destroy(h)
f = cupy.fft.fft(cupy.ones(64, dtype=cupy.complex64)); assert abs(complex(f[0].get()) - 64) < 1e-3
print("cuFFT: a 64-point FFT")
from mgx_graph.runtime import device_runtime
rt = device_runtime(); print("mgx_graph runtime:", rt.platform, rt.runtime_version(), rt.device_name())
for name in ("nvrtc", "cublas", "cublasLt", "cufft", "cudart"):
    try:
        print(f"cuda.pathfinder {name}: {pathfinder.load_nvidia_dynamic_lib(name).abs_path}")
    except Exception as e:
        print(f"cuda.pathfinder {name}: {type(e).__name__}: {e}")
loaded = {}
for line in open("/proc/self/maps"):
    path = line.split()[-1] if "/" in line else ""
    for lib in ("libnvrtc.so", "libnvrtc-builtins", "libcublas.so", "libcublasLt.so", "libcufft.so", "libcudart.so",
                "libcuda.so"):
        if f"/{lib}" in path:
            loaded.setdefault(lib, set()).add(path)
bad = []
for lib, paths in sorted(loaded.items()):
    for p in sorted(paths):
        inside = p.startswith(venv)
        print(f"loaded {lib}: {p} ({'the venv' if inside else 'outside the venv'})")
        if lib != "libcuda.so" and not inside:  # the driver is the machine's; the rest must be the wheels'
            bad.append(p)
for lib in ("libnvrtc.so", "libcublas.so", "libcufft.so"):
    if lib not in loaded:
        bad.append(f"{lib} not loaded")
print("RESULT libraries:", "PASSED" if not bad else f"FAILED {bad}")
sys.exit(1 if bad else 0)
EOF

step "5. mgx-graph generate on gpu (graphs on), then on ref"
"${RUN[@]}" "$VENV/bin/mgx-graph" generate "$MODEL" --target gpu --hip-graph --prompt "the water is" \
    --max-new-tokens 16 --no-stream || failed+=(generate-gpu)
"${RUN[@]}" "$VENV/bin/mgx-graph" generate "$MODEL" --target ref --prompt "the water is" --max-new-tokens 16 \
    --no-stream || failed+=(generate-ref)
"${RUN[@]}" "$VENV/bin/python" -I - "$MODEL" <<'EOF' || failed+=(llm)
import sys
from mgx_graph.llm import LLM
prompt = "the water is long and"
got = {}
for target, graphs in (("gpu", True), ("ref", False)):
    with LLM(sys.argv[1], target=target, hip_graph=graphs, max_length=64) as llm:
        res = llm.generate(prompt, max_new_tokens=24)
        got[target] = res.token_ids
        print(f"{target}: {res.token_ids} {res.text!r}")
        if target == "gpu":
            print("gpu graph stats:", llm.runner.stats() if hasattr(llm.runner, "stats") else "n/a")
print("tokens gpu == ref (fp16 on the GPU against numpy; printed, not required):", got["gpu"] == got["ref"])
EOF

step "result"
if [ ${#failed[@]} -eq 0 ]; then echo "RESULT: PASSED"; exit 0; fi
echo "RESULT: FAILED (${failed[*]})"
exit 1
