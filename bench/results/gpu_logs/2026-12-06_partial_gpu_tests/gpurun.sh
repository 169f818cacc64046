#!/usr/bin/env bash
# One device call: machine details, then the GPU tests of the files issues 28/29 touched, then the rest.
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD MGX_GRAPH_QUIET=1
{ date -u; cat .dev/commit; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader;
  python3 -c "import sys,torch,cupy,onnx,onnxruntime;print(sys.version.split()[0],'torch',torch.__version__,'cupy',cupy.__version__,'onnx',onnx.__version__,'ort',onnxruntime.__version__)"; nproc; } > $OUT/machine.txt 2>&1
P="tests/operators/test_gpu_kernel_table.py tests/graph tests/onnx/test_untrusted_onnx_shapes.py tests/onnx/test_untrusted_onnx_sizes.py tests/passes/test_merge_dots_bias.py tests/operators/test_matmul_nbits.py tests/llm/test_prefill.py tests/exec/test_reliability.py tests/runtime tests/exec/test_errors.py"
timeout ${T1:-85} python3 -m pytest -p no:cacheprovider -v -n 12 -rfE -k gpu $P > $OUT/gpu_priority.log 2>&1; echo "rc=$?" >> $OUT/gpu_priority.log
IGN=$(for f in $P; do echo --ignore=$f; done)
timeout ${T2:-70} python3 -m pytest -p no:cacheprovider -v -n 12 -rfE -k gpu tests $IGN --dist loadfile > $OUT/gpu_rest.log 2>&1; echo "rc=$?" >> $OUT/gpu_rest.log
date -u >> $OUT/machine.txt
