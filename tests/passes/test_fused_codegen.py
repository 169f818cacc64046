"""Generated fused kernels without a GPU: the sources compile with ``nvcc --cubin`` (the device build, as
NVRTC / hipRTC get it), and built for the host (``-DMGX_HOST_TEST``) their per-element / per-row code
computes what numpy computes for the same submodule (the ops' own ``ref`` kernels).  Skipped when
nvcc is missing."""
import numpy as np
import pytest

import mgx_graph
from mgx_graph import Program
from mgx_graph.operators.base import HOST
from mgx_graph.operators.fused import evaluate_module
from mgx_graph.operators.fused_codegen import pointwise_source
from mgx_graph.operators.fused_gpu import fused_kernel
from mgx_graph.operators.fused_reduce_codegen import reduce_source
from mgx_graph.operators.fused_scatter_codegen import scatternd_source
from mgx_graph.passes import PassContext, PassManager, PipelineOptions
from mgx_graph.targets import pipeline

from irtools import S, op
from kernel_host import NVCC, nvcc_compile, run_on_host, strided

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not found")

SOURCES = {"pointwise": pointwise_source, "reduce": reduce_source, "scatternd": scatternd_source}
RTOL = {"float16": 4e-3, "float32": 2e-5, "float64": 1e-12}
ATOL = {"float16": 4e-3, "float32": 2e-5, "float64": 1e-12}


def _module(in_shapes, build):
    """A submodule ``t`` with parameters ``x0..`` of ``in_shapes``; ``build(m, params)`` returns the
    value it returns (or a list of them)."""
    sub = Program().create_module("t")
    params = [sub.add_parameter(f"x{k}", s) for k, s in enumerate(in_shapes)]
    ret = build(sub, params)
    sub.add_return(ret if isinstance(ret, list) else [ret])
    return sub


def _out_shape(sub):
    outs = sub.get_output_shapes()
    return outs[0] if len(outs) == 1 else tuple(outs)


def _inputs(in_shapes, rng, special=False):
    bases, views = [], []
    for s in in_shapes:
        b, v = strided(s, rng)
        if special and b.dtype.kind == "f" and b.size >= 4:
            b[:4] = [np.nan, np.inf, -np.inf, 0.0]
        bases.append(b)
        views.append(v)
    return bases, views


def _reference(sub, views, out_shape):
    shapes = out_shape if isinstance(out_shape, tuple) else (out_shape,)
    outs = tuple(np.empty(s.lens, s.np_dtype) for s in shapes)
    with np.errstate(all="ignore"):
        evaluate_module(sub, HOST, views, outs if isinstance(out_shape, tuple) else outs[0])
    return outs if isinstance(out_shape, tuple) else outs[0]


def _compare(got, want, label, half=False):
    """Exact for integers and bool; floats within the rounding of their type, or of float16 when a
    float16 value is involved (the kernel holds it in float32 where numpy rounds it per op)."""
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=label)
    else:
        dt = "float16" if half else want.dtype.name
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=RTOL[dt], atol=ATOL[dt],
                                   err_msg=label)


def _check_on_host(tmp_path, items, rng):
    """``items``: ``[(label, submodule, in_shapes, out_shape, kind, special)]``: every kernel run on
    the host against numpy."""
    cases, wants, halves = [], [], []
    for label, sub, in_shapes, out_shape, kind, special in items:
        halves.append(any(i.shape.dtype == "float16" for i in sub.instructions if i.op.name != "@return"))
        ks = SOURCES[kind](sub, in_shapes, out_shape)
        bases, views = _inputs(in_shapes, rng, special)
        if kind == "scatternd":  # the output holds the data (input 0) when the kernel starts
            start = np.zeros(max(out_shape.element_space(), 1), out_shape.np_dtype)
            np.lib.stride_tricks.as_strided(start, out_shape.lens, out_shape.byte_strides())[...] = views[0]
            cases.append((ks, bases, out_shape, [start]))
        else:
            cases.append((ks, bases, out_shape))
        wants.append(_reference(sub, views, out_shape))
    for (label, *_), got, want, half in zip(items, run_on_host(cases, tmp_path), wants, halves):
        for k, (g, w) in enumerate(zip(got, want) if isinstance(want, tuple) else [(got, want)]):
            _compare(g, w, f"{label} output {k}", half)


# -- single ops over every body ---------------------------------------------------------------------------
F32 = S("float32", 3, 5)
F32_T = S("float32", 3, 5, strides=(1, 3))          # a transposed layout
F32_B = S("float32", 3, 5, strides=(0, 1))          # a broadcast row
UNARY_FLOAT = ["neg", "abs", "sqrt", "recip", "exp", "log", "sin", "cos", "tan", "tanh", "asin", "acos", "atan",
               "sinh", "cosh", "asinh", "acosh", "atanh", "floor", "ceil", "nearbyint", "sign", "erf", "sigmoid",
               "relu", "isnan", "not", "contiguous", "softsign", "hard_swish", "softplus"]
SPECIAL_OK = {"neg", "abs", "sqrt", "exp", "log", "tanh", "floor", "ceil", "sign", "erf", "sigmoid", "relu",
              "isnan", "not", "contiguous", "add", "mul", "max", "min", "where", "clip", "isinf", "convert"}


def _unary(name, dtype="float32", shape=None, **attrs):
    s = shape or S(dtype, 3, 5)
    sub = _module([s], lambda m, p: m.add_instruction(op(name, **attrs), [p[0]]))
    return (f"{name}[{dtype}]", sub, [s], sub.get_output_shapes()[0], "pointwise", name in SPECIAL_OK)


def _binary(name, dtype="float32", shapes=None, **attrs):
    shapes = shapes or [S(dtype, 3, 5), S(dtype, 5)]
    sub = _module(shapes, lambda m, p: m.add_instruction(op(name, **attrs), [p[0], p[1]]))
    return (f"{name}[{dtype}]", sub, shapes, sub.get_output_shapes()[0], "pointwise", name in SPECIAL_OK)


def test_float_op_bodies_match_numpy(tmp_path, rng):
    items = [_unary(n) for n in UNARY_FLOAT] + [_unary(n, "float16") for n in ("exp", "tanh", "sigmoid", "neg")]
    items += [_unary(n, shape=F32_T) for n in ("exp", "neg")] + [_unary("sqrt", "float64")]
    items += [_unary("leaky_relu", alpha=0.2), _unary("elu", alpha=0.7), _unary("selu"), _unary("celu", alpha=1.5),
              _unary("hard_sigmoid", alpha=0.3, beta=0.4), _unary("thresholded_relu", alpha=0.1),
              _unary("gelu"), _unary("gelu", approximate="tanh"), _unary("isinf"),
              _unary("isinf", detect_negative=0), _unary("convert", target_type="float16"),
              _unary("convert", target_type="int32"), _unary("convert", target_type="uint8"),
              _unary("convert", target_type="bool"), _unary("convert", "float16", target_type="float32")]
    items += [_binary(n) for n in ("add", "sub", "mul", "div", "pow", "max", "min", "equal", "less", "greater",
                                   "less_equal", "greater_equal", "prelu")]
    items += [_binary("mod", fmod=1), _binary("mod", fmod=0), _binary("add", shapes=[F32_T, F32_B]),
              _binary("mul", "float16"), _binary("max", "float16")]
    clip = [F32, S("float32"), S("float32")]
    sub = _module(clip, lambda m, p: m.add_instruction(op("clip"), p))
    items.append(("clip", sub, clip, sub.get_output_shapes()[0], "pointwise", True))
    cond = [S("bool", 3, 5), F32_T, S("float32", 1, 5)]
    sub = _module(cond, lambda m, p: m.add_instruction(op("where"), p))
    items.append(("where", sub, cond, sub.get_output_shapes()[0], "pointwise", True))
    _check_on_host(tmp_path, items, rng)


def test_integer_and_bool_op_bodies_match_numpy(tmp_path, rng):
    items = [_binary(n, d) for d in ("int8", "int32", "int64", "uint8")
             for n in ("add", "sub", "mul", "div", "max", "min", "equal", "less", "bitwise_and", "bitwise_xor")]
    items += [_binary("mod", d, fmod=f) for d in ("int32", "int64") for f in (0, 1)]
    items += [_unary(n, d) for d in ("int8", "int64") for n in ("neg", "abs", "sign", "relu", "bitwise_not")]
    items += [_unary("convert", "int64", target_type=t) for t in ("float32", "float16", "bool", "int8")]
    items += [_binary(n, "bool") for n in ("logical_and", "logical_or", "logical_xor", "equal", "bitwise_or")]
    items += [_unary(n, "bool") for n in ("not", "bitwise_not", "convert")]
    _check_on_host(tmp_path, items, rng)


# -- views, broadcasts and concat of internal values -------------------------------------------------------
def _views_chain(m, p):
    """exp(x) [4, 6] -> transpose -> reshape [2, 12] -> slice step 2 -> unsqueeze, + broadcast y."""
    e = m.add_instruction(op("exp"), [p[0]])
    t = m.add_instruction(op("transpose", permutation=[1, 0]), [e])
    c = m.add_instruction(op("contiguous"), [t])  # reshape needs a standard input
    r = m.add_instruction(op("reshape", dims=[2, 12]), [c])
    s = m.add_instruction(op("slice", axes=[1], starts=[1], ends=[12], steps=[2]), [r])
    u = m.add_instruction(op("unsqueeze", axes=[0]), [s])
    b = m.add_instruction(op("multibroadcast", out_lens=[3, 2, 6]), [u])
    return m.add_instruction(op("add"), [b, p[1]])


def _rotate_half(m, p):
    """q * cos + concat(-q2, q1) * sin with q1 / q2 the halves of q (slices of a parameter)."""
    q, cos, sin = p
    q1 = m.add_instruction(op("slice", axes=[2], starts=[0], ends=[4]), [q])
    q2 = m.add_instruction(op("slice", axes=[2], starts=[4], ends=[8]), [q])
    n = m.add_instruction(op("neg"), [q2])
    cat = m.add_instruction(op("concat", axis=-1), [n, q1])
    a = m.add_instruction(op("mul"), [q, cos])
    b = m.add_instruction(op("mul"), [cat, sin])
    return m.add_instruction(op("add"), [a, b])


def _three_way_concat(m, p):
    a = m.add_instruction(op("neg"), [p[0]])
    b = m.add_instruction(op("exp"), [p[1]])
    return m.add_instruction(op("concat", axis=1), [a, b, a])


def test_views_and_concat_index_arithmetic_matches_numpy(tmp_path, rng):
    items = []
    for label, shapes, build in [
        ("views", [S("float32", 4, 6), S("float32", 6)], _views_chain),
        ("rotate_half", [S("float16", 2, 3, 8, strides=(8, 16, 1)), S("float32", 8), S("float32", 8)],
         lambda m, p: _rotate_half(m, [p[0], m.add_instruction(op("convert", target_type="float16"), [p[1]]),
                                       m.add_instruction(op("convert", target_type="float16"), [p[2]])])),
        ("concat3", [S("float32", 2, 3), S("float32", 2, 1)], _three_way_concat),
    ]:
        sub = _module(shapes, build)
        items.append((label, sub, shapes, sub.get_output_shapes()[0], "pointwise", False))
    _check_on_host(tmp_path, items, rng)


# -- reductions -------------------------------------------------------------------------------------------
def _reduce_items():
    items = []

    def add(label, shapes, build):
        sub = _module(shapes, build)
        items.append((label, sub, shapes, _out_shape(sub), "reduce", False))

    for name in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min"):
        add(name, [S("float32", 3, 2, 37)], lambda m, p, n=name: m.add_instruction(op(n, axes=[-1]), [p[0]]))
    add("x - max (strided x)", [S("float32", 4, 37, strides=(1, 4))],
        lambda m, p: m.add_instruction(op("sub"), [p[0], m.add_instruction(op("reduce_max", axes=[1]), [p[0]])]))
    for dt in ("float32", "float16", "float64"):
        def softmax(m, p):
            s = m.add_instruction(op("add"), [m.add_instruction(op("mul"), [p[0], p[1]]), p[2]])
            y = m.add_instruction(op("softmax", axis=-1), [s])
            return m.add_instruction(op("where"), [m.add_instruction(op("isnan"), [y]), p[1], y])
        add(f"softmax[{dt}]", [S(dt, 2, 3, 300), S(dt), S(dt, 1, 1, 300)], softmax)
    add("logsoftmax", [S("float32", 5, 64)], lambda m, p: m.add_instruction(op("logsoftmax", axis=1), [p[0]]))
    add("rms_norm+convert", [S("float16", 1, 3, 576), S("float16", 576)],
        lambda m, p: m.add_instruction(op("convert", target_type="float32"),
                                       [m.add_instruction(op("rms_norm", axis=-1, epsilon=1e-5), [p[0], p[1]])]))
    def residual_norm(m, p):  # the sum is a second output (read by the next residual add)
        h = m.add_instruction(op("add"), [p[0], p[1]])
        return [m.add_instruction(op("rms_norm", axis=-1, epsilon=1e-5), [h, p[2]]), h]
    add("add+rms_norm, sum out", [S("float16", 1, 2, 96), S("float16", 1, 2, 96), S("float16", 96)], residual_norm)
    add("rms_norm (no weight)", [S("float32", 7, 10)],
        lambda m, p: m.add_instruction(op("rms_norm", axis=-1, epsilon=1e-6), [p[0]]))
    add("layernorm", [S("float32", 2, 5, 33), S("float32", 33), S("float32", 33)],
        lambda m, p: m.add_instruction(op("layernorm", axis=-1, epsilon=1e-5), p))
    return items


def test_reduce_kernels_match_numpy(tmp_path, rng):
    _check_on_host(tmp_path, _reduce_items(), rng)


# -- the decode step of a random LLaMA -------------------------------------------------------------------
def _lowered_decode_step(fp16, model_cache):
    from mgx_graph.models import build

    try:
        info = build("llama", cache_dir=model_cache, progress=False, max_cache_len=16)
    except ImportError as e:
        pytest.skip(f"model export needs the [export] extra: {e}")
    prog = mgx_graph.parse_onnx(str(info.onnx_path))
    # fuse_gemv off: the norms stay fused_reduce kernels (fused_gemv has its own host test, test_fuse_gemv.py)
    PassManager(pipeline("gpu", PipelineOptions(fp16=fp16)), PassContext("gpu"), disabled={"fuse_gemv"}).run(prog)
    return [i for i in prog.get_main_module().instructions if getattr(i.op, "fused", False)]


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_decode_step_kernels_match_numpy(tmp_path, rng, fp16, model_cache):
    """Every fused kernel of the gpu lowering of the step (RoPE, GQA repeat, SiLU, RMSNorm, masked
    softmax, the query rotation with the K / V cache writes as one horizontal kernel) computed on the host
    from random inputs, against numpy running its submodule."""
    fused = _lowered_decode_step(fp16, model_cache)
    kinds = {"pointwise": "pointwise", "fused_reduce": "reduce", "fused_horizontal": "horizontal"}
    assert {i.op.name for i in fused} == set(kinds)
    items = []
    for ins in fused:
        k, kind = ins.meta["kernel"], kinds[ins.op.name]
        # a cache not bound in place (no alias here) is copied first: one more launch per cache written
        copies = sum(1 for i in ins.op.module.instructions if i.op.name == "scatternd") if kind == "horizontal" else 0
        assert k.launches == 1 + copies and k.capturable and k.label.startswith(f"{kind} (generated")
        if kind == "horizontal":  # run on the host with its caches' start values in test_fuse_horizontal.py
            continue
        items.append((str(ins.op), ins.op.module, [i.shape for i in ins.inputs], ins.shape, kind, False))
    _check_on_host(tmp_path, items, rng)


def test_sources_compile_with_nvcc(tmp_path, model_cache):
    """The device build of a few generated sources (pointwise with concat / views / broadcasts, every
    reduction kind, integer ops) compiles with ``nvcc --cubin`` (the device build)."""
    items = _reduce_items()[::2] + [_binary("mod", "int64", fmod=0), _unary("gelu", "float16")]
    sources = [(pointwise_source if kind == "pointwise" else reduce_source)(sub, ins, out).source
               for _, sub, ins, out, kind, _ in items]
    sources += [i.meta["kernel"].fn.source.source for i in _lowered_decode_step(True, model_cache)[:4]]
    for n, src in enumerate(sources):
        res = nvcc_compile(src, tmp_path / f"k{n}.cu")
        assert res.returncode == 0, res.stderr[-3000:]


def test_launch_refuses_arrays_of_other_strides():
    """The strides are compiled in: an argument laid out otherwise raises (before any launch)."""
    s = S("float32", 4, 6)
    sub = _module([s, s], lambda m, p: m.add_instruction(op("add"), [m.add_instruction(op("neg"), [p[0]]), p[1]]))
    k = fused_kernel("pointwise", sub, [s, s], s)
    a = np.zeros((6, 4), np.float32).T  # [4, 6] transposed: strides (4, 16) bytes
    with pytest.raises(ValueError, match="argument 0 has strides"):
        k.fn(None, np.zeros((4, 6), np.float32), [a, np.zeros((4, 6), np.float32)], [])
