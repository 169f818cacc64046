"""Programmatic dependent launch: the source rewrite (host; a kernel with its own point keeps it), the
GEMV kernel's point after its weight prefetch (source and nvcc's PTX, no GPU needed), the argument
packing (host), and on gpu a captured chain of dependent generated kernels with MIGRAPHX_PDL=1 equal to
numpy."""
import ctypes
import shutil

import numpy as np
import pytest

from mgx_graph.operators.programmatic_launch import PRELUDE, kernel_arguments, with_grid_dependency


def test_every_kernel_body_starts_with_the_grid_dependency():
    src = ('#define NT 64\nextern "C" __global__ void __launch_bounds__(NT) a(const float* x, float* y) {\n'
           '    if (x) { y[0] = x[0]; }\n}\n'
           'static __device__ int helper(int v) { return v; }\n'
           'extern "C" __global__ void MGX_KERNEL(float* y, long long n) { y[n] = (float)helper(1); }\n')
    got = with_grid_dependency(src)
    assert got.startswith(PRELUDE)
    body = got[len(PRELUDE):]
    assert body.count("MGX_GRID_DEPENDENCY();") == 2
    assert "float* y) { MGX_GRID_DEPENDENCY();\n    if (x)" in body
    assert "long long n) { MGX_GRID_DEPENDENCY(); y[n]" in body
    assert "helper(int v) { return v; }" in body  # device functions untouched
    assert body.replace(" MGX_GRID_DEPENDENCY();", "") == src


def test_a_kernel_with_its_own_point_is_left_as_it_is():
    """A body holding ``MGX_GRID_DEPENDENCY();`` (after a nested block: the body runs to its own
    closing brace) gets no second one; a kernel before or after it still gets one first; a source
    whose only kernel has its own point is taken (PRELUDE first) and not refused."""
    own = ('extern "C" __global__ void g(const float* w, const float* x, float* y) {\n'
           '    float v = 0.0f;\n    if (w) { v = w[0]; }\n    MGX_GRID_DEPENDENCY();\n    y[0] = v * x[0];\n}\n')
    other = 'extern "C" __global__ void h(float* y) { if (y) { y[0] = 1.0f; } }\n'
    first = other.replace("{ if", "{ MGX_GRID_DEPENDENCY(); if")
    assert with_grid_dependency(own + other) == PRELUDE + own + first
    assert with_grid_dependency(other + own) == PRELUDE + first + own
    assert with_grid_dependency(own) == PRELUDE + own


def test_the_gemv_kernel_keeps_its_own_point():
    """gemv.cu (both load variants) holds one ``MGX_GRID_DEPENDENCY();``, after its weight prefetch;
    built for PDL it gets the PRELUDE's definition and no second statement."""
    from mgx_graph.operators.gemv_gpu import make_plan

    for vector in (True, False):
        src = make_plan("float16", 1, 1536, 576, True).source(vector)
        got = with_grid_dependency(src)
        assert got == PRELUDE + src and got.count("MGX_GRID_DEPENDENCY();") == 1
        assert src.index("wp[i] = wr[j];") < src.index("MGX_GRID_DEPENDENCY();") < src.index("__syncthreads();")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA toolkit) not found")
@pytest.mark.parametrize("config", ["standalone", "plan"])
def test_the_gemv_kernel_waits_after_its_weight_loads_in_ptx(config, tmp_path):
    """nvcc -arch=sm_90 of gemv.cu on its own (CMake's check_kernels configuration) and of a plan's
    source (x in shared memory, a bias): built for PDL, ``griddepcontrol.wait`` comes after the
    weight's global loads and before every other memory step (the x copy, barriers, stores); built
    without, there is none."""
    import gemv_host
    from mgx_graph.operators.gemv_gpu import kernel_file, make_plan

    src = kernel_file() if config == "standalone" else make_plan("float16", 1, 576, 576, True).source()
    steps = gemv_host.ptx_memory_steps(with_grid_dependency(src), tmp_path / "pdl.cu")
    assert steps.count("griddepcontrol.wait") == 1
    k = steps.index("griddepcontrol.wait")
    assert k >= 1 and set(steps[:k]) == {"ld.global"}, steps[:k + 3]
    assert {"ld.global", "st.shared", "bar.sync", "st.global"} <= set(steps[k + 1:])
    assert "griddepcontrol.wait" not in gemv_host.ptx_memory_steps(src, tmp_path / "plain.cu")


def test_a_source_without_a_kernel_body_is_refused():
    with pytest.raises(ValueError, match="no extern"):
        with_grid_dependency('extern "C" __global__ void a(float* y);\n')


def test_arguments_pack_scalars_by_type_and_refuse_the_unknown():
    vals, types = kernel_arguments((np.int64(3), np.int32(-2), np.float32(0.5), np.float64(2.0)))
    assert vals == (3, -2, 0.5, 2.0)
    assert types == (ctypes.c_longlong, ctypes.c_int, ctypes.c_float, ctypes.c_double)
    assert kernel_arguments((3,)) is None  # a Python int: CuPy's own conversion decides
    assert kernel_arguments((np.zeros(2),)) is None  # a host array is no kernel argument


@pytest.mark.gpu
@pytest.mark.parametrize("tiny", ["llama"], indirect=True)
def test_a_captured_decode_step_with_pdl_gives_the_same_tokens(gpu_target, monkeypatch, tiny):
    """The tiny decoder compiled with MIGRAPHX_PDL=1 (a fresh kernel cache: the sources differ) gives
    the tokens of the same program without it, graphs on, and its kernels were launched
    programmatically inside the capture."""
    import mgx_graph
    from mgx_graph import env
    from mgx_graph.llm.generation import Decoder
    from mgx_graph.operators import gpu_kernel
    from mgx_graph.operators.programmatic_launch import ProgrammaticKernel

    def tokens(pdl: str):
        monkeypatch.setenv("MIGRAPHX_PDL", pdl)
        env._reset_for_tests()
        gpu_kernel.compiled_function.cache_clear()
        prog = mgx_graph.compile(str(tiny.onnx_path), target="gpu", hip_graph=True, fp16=True)
        dec = Decoder(prog)
        out, t = [], 1
        for _ in range(12):
            t = dec.step(t)
            out.append(t)
        st = prog.stats()
        prog.release()
        return out, st

    base, _ = tokens("0")
    before = ProgrammaticKernel.total
    got, st = tokens("1")
    env._reset_for_tests()
    gpu_kernel.compiled_function.cache_clear()
    assert st["captures"] >= 1 and st["replays"] >= 1
    assert ProgrammaticKernel.total > before  # the capture took programmatic launches
    assert got == base
