"""Every CUDA source the gpu target compiles at run time builds with NVRTC, checked without a GPU.

On the device CuPy hands these sources to NVRTC at the first launch; a source that does not build fails
every program that needs it, and GPU time is scarce.  Here NVRTC runs on the CPU (``tests/nvrtc.py``,
NVIDIA's wheels) over:

* the kernel files each op family compiles per element type (``line_ops.cu``, ``topk.cu``, ``sampling.cu``,
  ``nms.cu``, ``scatternd.cu``, ``gathernd.cu``, ``lstm.cu``, ``dq_lstm.cu``, ``token_sampling.cu``,
  ``llm_kernels.cu``, the full reductions), made by the op family's own function under a stand-in ``cupy``
  that records the source and the options;
* the sources code generation makes for lowered programs (fused pointwise kernels, fused GEMVs, decode
  attention, rotary / KV writes, MatMulNBits' GEMV and dequantization), recorded where lowering hands them
  to ``precompile``, each also with the programmatic-launch prelude (``with_grid_dependency``).

Each builds to sm_90 machine code (the device tests' Hopper), so ptxas runs too: a kernel over the
static shared-memory limit or out of registers fails here.  A source that fails shows NVRTC's log.
Skipped where the NVRTC wheel is not installed.
"""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from mgx_graph.operators import (attention_gpu, fused_gemv_codegen, fused_gpu, gpu, gpu_kernel, index_gpu, index_ops,
                                 llm_gpu, lstm_gpu, quantized_gpu, token_sampling_gpu, topk_gpu, vision_gpu)
from mgx_graph.operators.programmatic_launch import with_grid_dependency
from nvrtc import nvrtc

pytestmark = pytest.mark.skipif(nvrtc() is None, reason="needs NVIDIA's NVRTC wheel (cuda-toolkit[nvrtc,cudart])")


def _assert_compiles(sources: list) -> None:
    """Each ``(what, source, options)`` builds; the failures, with NVRTC's log, in one message."""
    failed = []
    for what, source, options in sources:
        ok, log = nvrtc().compile(source, options=options)
        if not ok:
            failed.append(f"--- {what}\n{log[:3000]}")
    assert not failed, f"{len(failed)} of {len(sources)} sources do not compile:\n" + "\n".join(failed)


# -- kernel files, per element type --------------------------------------------------------------------
class _Recorder(types.ModuleType):
    """A stand-in ``cupy``: ``RawModule(code=..., options=...)`` records the source; nothing is compiled."""

    def __init__(self):
        super().__init__("cupy")
        self.sources: list = []
        self.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(is_hip=False))
        recorder = self

        class RawModule:
            def __init__(self, code, options=(), **kw):
                recorder.sources.append((code, tuple(options)))

            def get_function(self, name):
                return name
        self.RawModule = RawModule


def _module_sources(monkeypatch, builders: dict) -> list:
    """``(what, source, options)`` of each builder (an lru_cached function, called through ``__wrapped__``
    so no cache keeps what the stand-in returned) with its arguments."""
    fake = _Recorder()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    out = []
    for what, (fn, args) in builders.items():
        before = len(fake.sources)
        getattr(fn, "__wrapped__", fn)(*args)
        assert len(fake.sources) == before + 1, f"{what} compiled {len(fake.sources) - before} modules"
        code, options = fake.sources[-1]
        out.append((what, code, options))
    return out


FLOATS = ("float16", "float32", "float64")


def _file_builders() -> dict:
    b: dict = {}
    for dt in index_ops.NUMERIC:
        b[f"line_ops.cu {dt}"] = (index_ops.line_module, (dt,))
    for dt in topk_gpu.TYPES:
        b[f"topk.cu {dt}"] = (topk_gpu.topk_module, (dt,))
    for dt in FLOATS:
        b[f"sampling.cu {dt}"] = (vision_gpu.sampling_module, (dt,))
        b[f"lstm.cu {dt}"] = (lstm_gpu.lstm_step_function, (dt,))
        b[f"token_sampling.cu {dt}"] = (token_sampling_gpu._module, (dt,))
    b["nms.cu"] = (vision_gpu._nms_module, ())
    b["scatternd.cu"] = (gpu._scatternd_module, ())
    b["gathernd.cu"] = (index_gpu._gathernd_module, ())
    b["dq_lstm.cu"] = (lstm_gpu.dq_lstm_module, ())
    return b


FILE_BUILDERS = _file_builders()


@pytest.mark.parametrize("family", sorted({k.split()[0] for k in FILE_BUILDERS}))
def test_kernel_files_compile_for_every_element_type(monkeypatch, family):
    builders = {k: v for k, v in FILE_BUILDERS.items() if k.split()[0] == family}
    _assert_compiles(_module_sources(monkeypatch, builders))


def test_llm_kernels_and_full_reductions_compile():
    sources = [(f"llm_kernels.cu {dt}", llm_gpu.kernel_source(dt), ()) for dt in ("float16", "float32")]
    sources += [(f"full reduction {kind} {dt}", gpu.full_reduction_source(kind, dt), ())
                for kind in ("sum", "mean", "prod", "max", "min") for dt in ("float16", "float32", "float64", "int64")]
    _assert_compiles(sources)


# -- generated sources of lowered programs ---------------------------------------------------------------
@pytest.fixture
def generated(monkeypatch):
    """The ``(name, source)`` pairs lowering hands to ``precompile`` while the fixture is active."""
    seen: dict = {}

    def record(source, name, pdl=None):
        seen[source] = name
        return None  # as without CuPy: the kernel compiles at its first launch
    for mod in (gpu_kernel, attention_gpu, fused_gemv_codegen, fused_gpu):
        monkeypatch.setattr(mod, "precompile", record)
    return seen


def _both_launches(seen: dict, what: str) -> list:
    out = []
    for k, (source, name) in enumerate(sorted(seen.items(), key=lambda kv: kv[1])):
        out.append((f"{what}: {name} #{k}", source, ()))
        out.append((f"{what}: {name} #{k} (programmatic launch)", with_grid_dependency(source), ()))
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
def test_a_lowered_decoder_step_compiles(generated, dtype):
    """onnxruntime-genai's decoder layout (GroupQueryAttention, SkipSimplifiedLayerNormalization, packed
    QKV): fused pointwise kernels, decode attention, rotary and KV writes, with and without fuse_rotary_kv."""
    from test_llm_kernels import _lower_gpu, genai_decoder

    model, _ = genai_decoder(layers=2, dtype=dtype)
    _lower_gpu(model)
    _lower_gpu(model, {"fuse_rotary_kv"})
    names = set(generated.values())
    assert any("attn" in n or "attention" in n for n in names), names  # the corpus holds what it claims
    _assert_compiles(_both_launches(generated, f"decoder {np.dtype(dtype).name}"))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_lowered_fused_gemv_compiles(generated, dtype):
    """The own export's layer: residual add, RMSNorm, one-row dot and SiLU-gate epilogue in one fused GEMV."""
    from mgx_graph.compiler import compile_program  # noqa: F401  (registers the pipeline's compiler)
    from test_fuse_gemv import _fuse, _layer

    from mgx_graph.passes.lowering import Lowering

    for K, L, epilogue in ((64, 24, True), (576, 40, True), (96, 20, False)):
        prog, _ = _layer(dtype, K, L, epilogue=epilogue)
        _fuse(prog, "gpu")
        Lowering("gpu").apply(prog, None)
    assert generated, "no generated source was recorded"
    _assert_compiles(_both_launches(generated, f"fused gemv {dtype}"))


def test_matmul_nbits_kernels_compile():
    """The fused int4 / int8 GEMV (1 and 4 rows) and the dequantization, for every zero point kind, both
    element types and the block sizes of the builder."""
    W = quantized_gpu.Weights
    sources = []
    for dtype in ("float32", "float16"):
        for bits in (4, 8):
            for block in (16, 32, 128):
                for zp in ("none", "packed", "float"):
                    w = W(dtype, dtype, bits, block, 448, 40, zp, dtype if zp == "float" else None, dtype)
                    tag = f"{dtype} {w.tag}"
                    for M in (1, 4):
                        src = quantized_gpu.make_gemv_plan(w, M).source()
                        sources += [(f"gemv_nbits {tag} M={M}", src, ()),
                                    (f"gemv_nbits {tag} M={M} (programmatic launch)", with_grid_dependency(src), ())]
                    sources.append((f"dequant_nbits {tag}", quantized_gpu.DequantPlan(w).source(), ()))
    _assert_compiles(sources)


def test_a_source_that_does_not_build_fails_the_check():
    """The check can fail: NVRTC's error reaches the assertion message."""
    with pytest.raises(AssertionError, match="identifier \"undefined_value\" is undefined"):
        _assert_compiles([("broken", 'extern "C" __global__ void k(float* y) { y[0] = undefined_value; }', ())])
