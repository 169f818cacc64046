"""The device sampling tail (``operators/token_sampling.cu`` through
:class:`~mgx_graph.operators.token_sampling_gpu.SampleAdvance`) against mgx_graph.llm.sampling's numpy rule on
the same Philox draws: on the host (tests/attn_host.py runs the kernels as fibers, block after block)
and on the gpu target; and sampled generation pipelined on the device, equal across runs and to the
host rule."""
import types

import numpy as np
import pytest

import attn_host
from mgx_graph.operators.token_sampling_gpu import SampleAdvance
from mgx_graph.llm.sampling import SamplingConfig, TokenSampler

# what the host shim of attn_host lacks and token_sampling.cu uses
_EXTRA = r"""
static inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}
static inline unsigned atomicMin(unsigned* p, unsigned v) {
    std::atomic_ref<unsigned> r(*p);
    unsigned o = r.load();
    while (v < o && !r.compare_exchange_weak(o, v)) {}
    return o;
}
static inline int atomicMax(int* p, int v) {
    std::atomic_ref<int> r(*p);
    int o = r.load();
    while (v > o && !r.compare_exchange_weak(o, v)) {}
    return o;
}
static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
#define __shfl_down_sync(m, v, o) __shfl_sync(m, v, (int)((threadIdx.x & 31) + (o)))
#define __shfl_up_sync(m, v, o) __shfl_sync(m, v, (int)((threadIdx.x & 31) - (o)))
"""

CONFIGS = [dict(temperature=0.7, top_p=0.9), dict(top_k=50, top_p=0.9, temperature=0.7),
           dict(top_k=5, repetition_penalty=1.3), dict(top_k=None, min_p=0.05, temperature=1.5),
           dict(top_k=None, top_p=0.999, temperature=2.0),  # many candidates: the bisection path
           dict(top_k=None),  # no filter: every token a candidate
           dict(top_k=1), dict(repetition_penalty=1.5)]  # greedy with a penalty


def _cfg_id(c):
    return ",".join(f"{k}={v}" for k, v in c.items())


def _config(cfg):
    return SamplingConfig(do_sample=cfg != CONFIGS[-1], **cfg)


def _logits(rng, rows, v, dtype):
    x = rng.standard_normal((rows, v)) * 3
    x[:, rng.integers(0, v, 4)] += 6  # a few likely tokens, as a language model's row
    return x.astype(dtype)


def _host_tail():
    import os

    import mgx_graph.operators as ops

    with open(os.path.join(os.path.dirname(ops.__file__), "token_sampling.cu")) as f:
        src = f.read()
    lib = {}

    def run(dev, x, ids, cfg, seed, step):
        key = x.dtype.name
        if key not in lib:
            ctype = "__half" if key == "float16" else "float"
            lib[key] = attn_host.build(_EXTRA + f"typedef {ctype} T;\n" + src)
        so, sigs = lib[key]
        for name, grid, block, args in dev.launches(x, ids, cfg, seed, step):
            args = [a if isinstance(a, np.ndarray) or not isinstance(a, np.uint64) or int(a) else None
                    for a in args]
            args = [int(a) if isinstance(a, np.uint64) else a for a in args]
            attn_host.launch(so, sigs, name, grid, block[0], args)

    return run


def _compare(run_tail, ctx, dtype, rows, v, cfg, steps, seed=2024):
    """Run ``steps`` steps of the tail and of the host rule on the same logits; returns the agreement."""
    rng = np.random.default_rng(v + rows)
    config = _config(cfg)
    dev = SampleAdvance(ctx, rows, v, dtype)
    host = TokenSampler(config, rows, v)
    host.seed = seed
    seen = np.zeros((rows, v), bool)
    seen[:, rng.integers(0, v, 10)] = True
    if host.seen is not None:
        host.seen[:] = seen
    dev.set_seen(seen, ctx.queue)
    ctx.synchronize(ctx.queue)
    same = total = 0
    for step in range(steps):
        x = _logits(rng, rows, v, dtype)
        want = host.choose(x)
        ids = ctx.xp.full((rows,), -1, np.int64)
        run_tail(dev, ctx.xp.asarray(x), ids, config, seed, step)
        got = np.asarray(ctx.to_host(ids, ctx.queue))
        same += int((got == want).sum())
        total += rows
        for r in range(rows):
            host.observe(r, [int(got[r])])  # both go on from the device's ids
        if config.repetition_penalty != 1.0:
            seen_dev = np.asarray(ctx.to_host(dev.seen, ctx.queue)).astype(bool)
            np.testing.assert_array_equal(seen_dev, host.seen)
    return same / total


@pytest.mark.skipif(not attn_host.available(), reason="needs g++")
@pytest.mark.parametrize("cfg", CONFIGS, ids=_cfg_id)
def test_kernels_on_the_host_follow_the_rule(cfg):
    from mgx_graph.targets import make_context

    run, ctx = _host_tail(), make_context("ref")

    def small(dev, *a):  # ts_select with 128 threads (each a fiber here)
        dev.select_threads = 128
        run(dev, *a)

    for dtype, rows, v in [("float32", 2, 2500), ("float16", 1, 4099)]:
        agree = _compare(small, ctx, dtype, rows, v, cfg, steps=4)
        assert agree == 1.0, (dtype, agree)


def _band_logits(rows, v):
    """Rows whose top-p band of 0.25-nat bins (tokens 20 and 10) is narrower than top-k's 50 tokens, where
    the mass of the 48 others decides top-p: token 10 (e**-0.1) has mass 1 above it, kept with p = 0.5 only
    when Z is the mass of all 50 top-k tokens (~2.19), not of the band (~1.90)."""
    x = np.full((rows, v), -20.0, np.float32)
    x[:, 20], x[:, 10] = 0.0, -0.1
    x[:, 100:148] = -5.0 - 0.01 * np.arange(48, dtype=np.float32)
    return x


def _check_band(run_tail, ctx, select_threads):
    config, rows, v = SamplingConfig(do_sample=True, top_k=50, top_p=0.5, seed=7), 8, 300
    x = _band_logits(rows, v)
    want = TokenSampler(config, rows, v).choose(x)
    assert {10, 20} <= set(want.tolist())  # the rule keeps both: the draws take each in some row
    dev = SampleAdvance(ctx, rows, v, "float32")
    dev.select_threads = select_threads
    ids = ctx.xp.full((rows,), -1, np.int64)
    run_tail(dev, ctx.xp.asarray(x), ids, config, 7, 0)
    np.testing.assert_array_equal(np.asarray(ctx.to_host(ids, ctx.queue)), want)


@pytest.mark.skipif(not attn_host.available(), reason="needs g++")
def test_top_p_total_is_the_mass_of_every_top_k_token_on_the_host():
    from mgx_graph.targets import make_context

    _check_band(_host_tail(), make_context("ref"), 128)


# -- gpu ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpu_ctx():
    from mgx_graph.runtime import gpu_available
    from mgx_graph.targets import make_context

    if not gpu_available():
        pytest.skip("needs a usable GPU")
    return make_context("gpu")


def _gpu_tail(dev, x, ids, cfg, seed, step):
    dev(x.reshape(-1), ids, cfg, seed, step)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", CONFIGS, ids=_cfg_id)
@pytest.mark.parametrize("dtype, rows, v", [("float32", 4, 49152), ("float16", 2, 128256), ("float32", 3, 1000)])
def test_kernels_on_the_gpu_follow_the_rule(gpu_ctx, cfg, dtype, rows, v):
    steps = 8 if "top_p=0.999" in _cfg_id(cfg) or cfg == dict(top_k=None) else 60
    with gpu_ctx.on_queue(gpu_ctx.queue):
        agree = _compare(_gpu_tail, gpu_ctx, dtype, rows, v, cfg, steps)
    assert agree >= (1.0 if cfg == CONFIGS[-1] else 0.999), agree


@pytest.mark.gpu
def test_sampled_generation_pipelines_on_the_device(model_cache, gpu_target):
    import mgx_graph
    from mgx_graph.llm.generation import Decoder, generate
    from mgx_graph.models import build

    try:
        info = build("llama", cache_dir=model_cache, progress=False, max_cache_len=32)
    except ImportError as e:
        pytest.skip(f"model export needs the [export] extra: {e}")
    prog = mgx_graph.compile(str(info.onnx_path), target="gpu", hip_graph=True)
    dec = Decoder(prog)
    prompt = [5, 9, 2, 77, 31, 8]
    opts = dict(do_sample=True, temperature=0.7, top_p=0.9, repetition_penalty=1.2, seed=3)
    a = generate(dec, prompt, 20, **opts)
    b = generate(dec, prompt, 20, **opts)
    host = generate(dec, prompt, 20, output_logits=True, **opts)  # the host rule on the read logits
    assert len(a.tokens) == 20 and a.tokens == b.tokens
    assert a.tokens == host.tokens
    assert dec._sample is not None  # the device tail ran
    assert generate(dec, prompt, 20, **{**opts, "seed": 4}).tokens != a.tokens


@pytest.mark.gpu
def test_top_p_total_is_the_mass_of_every_top_k_token_on_the_gpu(gpu_ctx):
    with gpu_ctx.on_queue(gpu_ctx.queue):
        _check_band(_gpu_tail, gpu_ctx, 1024)
