"""fuse_scatternd: hand-built programs against hand-built expected programs (a scatter whose updates a
fused pointwise computes becomes one ``fused_scatternd``; every case the pass must leave alone), the
generated kernel run on the host against numpy, a KV-cache write model against onnxruntime (fused,
unfused, bound in place), and the random LLaMA decode step (kernels per step, greedy tokens)."""
import numpy as np
import pytest
from onnx import helper

import mgx_graph
from mgx_graph import Program, ShapeError
from mgx_graph.operators.fused_scatter import FusedScatterND
from mgx_graph.operators.fused_scatter_codegen import scatternd_source
from mgx_graph.passes import (BindOutputs, EliminateDeadCode, FusePointwise, FuseScatterND, Lowering, PassContext,
                              PassManager, PipelineOptions, validate_program)
from mgx_graph.passes.bind_outputs import detect_alias
from mgx_graph.passes.hip_graph import launch_count
from mgx_graph.targets import pipeline

from irtools import S, assert_same_ir, lit, op, run_pass
from kernel_host import NVCC, run_on_host, strided
from util import make_model, ort_run

KIND = "fused_scatternd"


def fused(m, inputs, body):
    """Expected-program helper: a ``fused_scatternd`` over a new submodule ``<module>:fused_scatternd<n>``
    whose parameters ``x0..`` take ``inputs``; ``body(sub, params)`` builds it and returns the scatter."""
    n = sum(1 for name in m.program.modules if name.startswith(f"{m.name}:{KIND}"))
    sub = m.program.create_module(f"{m.name}:{KIND}{n}")
    params = [sub.add_parameter(f"x{k}", i.shape) for k, i in enumerate(inputs)]
    sub.add_return([body(sub, params)])
    return m.add_instruction(op(KIND, module=sub), inputs, [sub])


def fuse(prog, exclude=()):
    """fuse_pointwise then fuse_scatternd (their order in the pipelines), then dead-code elimination."""
    run_pass(FusePointwise(exclude), prog)
    run_pass(FuseScatterND(exclude), prog)
    return run_pass(EliminateDeadCode(), prog)


def ins_of(prog, name):
    """The instructions ``name`` of the main module."""
    return [i for i in prog.get_main_module().instructions if i.op.name == name]


# -- IR in, IR out --------------------------------------------------------------------------------------------
def _rope_k_write(m, p, scale=True):
    """The static-cache key write of a decode step: p = (data [P, 1, Nkv, H] (a transposed view of
    the cache), k2, k1, k (the halves and the whole of k [1, Nkv, 1, H]), cos, sin, indices [1, 1]);
    rotate_half RoPE, * 0.5, convert to float16, transpose to [1, 1, Nkv, H], scatter."""
    half = lit(m, 0.5) if scale else None
    data, k2, k1, k, cos, sin, idx = p
    rot = m.add_instruction(op("concat", axis=-1), [m.add_instruction(op("neg"), [k2]), k1])
    r = m.add_instruction(op("add"), [m.add_instruction(op("mul"), [k, cos]), m.add_instruction(op("mul"), [rot, sin])])
    if scale:
        r = m.add_instruction(op("mul"), [r, half])
    h = m.add_instruction(op("convert", target_type="float16"), [r])
    ht = m.add_instruction(op("transpose", permutation=[2, 0, 1, 3]), [h])
    return m.add_instruction(op("scatternd"), [data, idx, ht])


def _cache_program(expected, extra_read=False):
    prog = Program()
    m = prog.get_main_module()
    k = m.add_parameter("k", S("float32", 1, 1, 2, 8))
    cos, sin = m.add_parameter("cos", S("float32", 1, 1, 1, 8)), m.add_parameter("sin", S("float32", 1, 1, 1, 8))
    past = m.add_parameter("past", S("float16", 1, 2, 6, 8))
    pos = m.add_parameter("pos", S("int64", 1, 1))
    kt = m.add_instruction(op("transpose", permutation=[0, 2, 1, 3]), [k])
    k1 = m.add_instruction(op("slice", axes=[3], starts=[0], ends=[4]), [kt])
    k2 = m.add_instruction(op("slice", axes=[3], starts=[4], ends=[8]), [kt])
    pt = m.add_instruction(op("transpose", permutation=[2, 0, 1, 3]), [past])
    args = [pt, k2, k1, kt, cos, sin, pos]
    s = fused(m, args, _rope_k_write) if expected else _rope_k_write(m, args)
    m.add_return([m.add_instruction(op("transpose", permutation=[1, 2, 0, 3]), [s])], ["present"])
    return prog


def test_rope_then_scatter_becomes_one_fused_scatternd():
    prog = fuse(_cache_program(False))
    assert_same_ir(prog, _cache_program(True))
    assert list(prog.modules) == ["main", "main:fused_scatternd0"]  # the pointwise module is taken in
    assert not ins_of(prog, "pointwise") and not any(i.op.name == "@literal" for i in prog.get_main_module())
    f = ins_of(prog, KIND)[0]
    assert f.op.inplace_ok and f.shape == S("float16", 6, 1, 2, 8)


def _lone_convert(expected):
    """present_v = scatternd(transpose(past), pos, reshape(convert(v))): one elementwise producer."""
    prog = Program()
    m = prog.get_main_module()
    v = m.add_parameter("v", S("float32", 1, 16))
    past = m.add_parameter("past", S("float16", 2, 6, 8))
    pos = m.add_parameter("pos", S("int64", 1, 1))
    pt = m.add_instruction(op("transpose", permutation=[1, 0, 2]), [past])

    def body(s, p):
        c = s.add_instruction(op("convert", target_type="float16"), [p[1]])
        return s.add_instruction(op("scatternd"), [p[0], p[2], s.add_instruction(op("reshape", dims=[1, 2, 8]), [c])])

    s = fused(m, [pt, v, pos], body) if expected else body(m, [pt, v, pos])
    m.add_return([s])
    return prog


def test_a_lone_elementwise_producer_is_fused_too():
    assert_same_ir(fuse(_lone_convert(False)), _lone_convert(True))


def _left_alone(case):
    """A program whose scatter must not be fused (``case`` says why)."""
    prog = Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", S("float32", 2, 4))
    past = m.add_parameter("past", S("float32", 5, 4))
    other = m.add_parameter("other", S("float32", 5, 4))
    idx = m.add_parameter("idx", S("int64", 2, 1))
    outs = []
    if case == "view_of_a_dot":  # the V write: updates are a view of a GEMM, already one kernel
        w = m.add_parameter("w", S("float32", 4, 4))
        u = m.add_instruction(op("reshape", dims=[2, 4]), [m.add_instruction(op("dot"), [x, w])])
    elif case == "reads_its_own_cache":  # the kernel would read what it overwrites in place
        u = m.add_instruction(op("add"), [m.add_instruction(op("slice", axes=[0], starts=[0], ends=[2]), [past]), x])
    else:
        src = x
        if case == "written_in_between":
            src = m.add_instruction(op("slice", axes=[0], starts=[1], ends=[3]), [other])
        u = m.add_instruction(op("tanh"), [m.add_instruction(op("mul"), [src, lit(m, 2.0)])])
    if case == "written_in_between":  # `other` may be overwritten in place before the scatter
        outs.append(m.add_instruction(op("scatternd"), [other, idx, x]))
    if case == "view_read_twice":
        t = m.add_instruction(op("reshape", dims=[2, 4]), [u])
        outs.append(m.add_instruction(op("neg"), [t]))
        u = t
    if case == "read_elsewhere":
        outs.append(u)
    reduction = "add" if case == "reduction_add" else "none"
    outs.insert(0, m.add_instruction(op("scatternd", reduction=reduction), [past, idx, u]))
    m.add_return(outs)
    return prog


LEFT_ALONE = ["read_elsewhere", "view_read_twice", "reduction_add", "view_of_a_dot", "reads_its_own_cache",
              "written_in_between", "excluded"]


@pytest.mark.parametrize("case", LEFT_ALONE)
def test_scatters_the_pass_must_leave_alone(case):
    exclude = ("scatternd",) if case == "excluded" else ()
    prog = _left_alone(case)
    run_pass(FusePointwise(exclude), prog)
    before = prog.print()
    run_pass(FuseScatterND(exclude), prog)
    assert prog.print() == before
    assert not ins_of(prog, KIND)


def test_the_left_alone_builders_do_fuse_without_the_obstacle():
    """The same builder with nothing in the way is fused (so each case above tests its obstacle)."""
    prog = _left_alone("plain")
    fuse(prog)
    assert len(ins_of(prog, KIND)) == 1 and not ins_of(prog, "scatternd")


def test_pass_is_in_both_pipelines_and_switchable():
    for target in ("ref", "gpu"):
        names = [p.name for g in pipeline(target, PipelineOptions()) for p in g.passes]
        assert names.index("fuse_pointwise") < names.index("fuse_scatternd") < names.index("bind_outputs")
        for disabled, want in ((set(), 1), ({"fuse_scatternd"}, 0), ({"fuse_kernels"}, 0)):
            prog = _cache_program(False)
            PassManager(pipeline(target, PipelineOptions()), PassContext(target), disabled=disabled).run(prog)
            assert len(ins_of(prog, KIND)) == want, (target, disabled)
            assert len(ins_of(prog, "scatternd")) == 1 - want


def test_bound_in_place_and_lowered_one_launch():
    """Bound onto the cache the gpu kernel issues one launch (no copy of the data); unbound, two."""
    for alias, launches in (({"present": "past"}, 1), ({}, 2)):
        prog = _cache_program(False)
        passes = [FusePointwise(), FuseScatterND(), EliminateDeadCode(), BindOutputs(alias), Lowering("gpu")]
        PassManager(passes, PassContext("gpu")).run(prog)
        f = ins_of(prog, KIND)[0]
        assert f.module_inputs == [] and list(prog.modules) == ["main"]
        assert f.meta.get("bind_param") == alias.get("present")
        k = f.meta["kernel"]
        assert k.label.startswith("scatternd (generated mgx_scatternd_") and k.capturable and not k.workspace
        assert launch_count(f) == launches
        assert str(f.op) == ("fused_scatternd[module=main:fused_scatternd0,"
                             "kernel=neg_concat_mul_mul_add_mul_convert_scatternd]")


def test_op_checks_its_module():
    sub = Program().create_module("t")
    x0, x1 = sub.add_parameter("x0", S("float32", 4, 2)), sub.add_parameter("x1", S("float32", 1, 2))
    sub.add_return([sub.add_instruction(op("neg"), [x1])])
    with pytest.raises(ShapeError, match="must return one scatternd"):
        FusedScatterND(module=sub).compute_shape([x0.shape, x1.shape])
    sub = Program().create_module("t")
    p = [sub.add_parameter(f"x{k}", s) for k, s in enumerate([S("float32", 4, 2), S("int64", 1, 1),
                                                               S("float32", 1, 2)])]
    upd = sub.add_instruction(op("add"), [p[2], sub.add_instruction(op("slice", axes=[0], starts=[0], ends=[1]),
                                                                    [p[0]])])
    sub.add_return([sub.add_instruction(op("scatternd"), [p[0], p[1], upd])])
    with pytest.raises(ShapeError, match="read by the scatter alone"):
        FusedScatterND(module=sub).compute_shape([i.shape for i in p])
    assert not FusedScatterND(module=sub).inplace_ok


# -- the generated kernel on the host ---------------------------------------------------------------------
def _numpy_rope_write(data, k, cos, sin, idx):
    """Expected result of the _cache_program scatter, in numpy alone."""
    kt = k.transpose(0, 2, 1, 3)
    rot = np.concatenate([-kt[..., 4:], kt[..., :4]], axis=-1)
    h = ((kt * cos + rot * sin) * np.float32(0.5)).astype(np.float16).transpose(2, 0, 1, 3)
    out = data.copy()
    for r in range(idx.shape[0]):
        out[tuple(idx[r])] = h[r]
    return out


def _general_module(data, idx, upd_in):
    """scatternd(x0, x1, exp(x2) * 2) with any index depth."""
    sub = Program().create_module("g")
    p = [sub.add_parameter(f"x{k}", s) for k, s in enumerate([data, idx, upd_in])]
    e = sub.add_instruction(op("mul"), [sub.add_instruction(op("exp"), [p[2]]), lit(sub, 2.0)])
    sub.add_return([sub.add_instruction(op("scatternd"), [p[0], p[1], e])])
    return sub


@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not found")
def test_generated_kernel_on_the_host_matches_numpy(tmp_path, rng):
    cases, wants = [], []
    # 1. the RoPE key write into a transposed float16 cache layout (the in-place binding's layout)
    prog = fuse(_cache_program(False))
    sub = prog.modules["main:fused_scatternd0"]
    f = ins_of(prog, KIND)[0]
    in_shapes = [i.shape for i in f.inputs]
    out_layout = in_shapes[0]  # the output written where the data lies: the strided view of the cache
    bases, views = zip(*[strided(s, rng) for s in in_shapes])
    idx = np.array([[4]], np.int64)
    bases, views = list(bases), list(views)
    bases[-1], views[-1] = idx, idx
    k = rng.normal(size=(1, 1, 2, 8)).astype(np.float32)
    kt = k.transpose(0, 2, 1, 3)
    cos, sin = views[4], views[5]
    for j, v in ((1, kt[..., 4:]), (2, kt[..., :4]), (3, kt)):  # k2, k1, k as the views they are
        views[j][...] = v
    data = views[0].copy()
    cases.append((scatternd_source(sub, in_shapes, out_layout), bases, out_layout, [bases[0].copy()]))
    wants.append(_numpy_rope_write(data, k, cos, sin, idx))
    # 2. two-level int32 indices, negative ones, trailing dims; 3. an out-of-range index drops its row
    for label, rows in (("negative", [[1, -1], [0, 2], [-2, 0]]), ("out_of_range", [[1, 1], [2, 0], [0, 7]])):
        shapes = [S("float32", 2, 3, 2, 5), S("int32", 3, 2), S("float32", 3, 2, 5)]
        gsub = _general_module(*shapes)
        idx = np.array(rows, np.int32)
        upd = rng.normal(size=(3, 2, 5)).astype(np.float32)
        data = rng.normal(size=(2, 3, 2, 5)).astype(np.float32)
        want = data.copy()
        for r, (a, b) in enumerate(rows):
            if -2 <= a < 2 and -3 <= b < 3:
                want[a, b] = np.exp(upd[r]) * np.float32(2.0)
        cases.append((scatternd_source(gsub, shapes, shapes[0]), [data, idx, upd], shapes[0], [data.copy()]))
        wants.append(want)
    got = run_on_host(cases, tmp_path)
    np.testing.assert_allclose(got[0].astype(np.float32), wants[0].astype(np.float32), rtol=4e-3, atol=4e-3)
    untouched = [r for r in range(6) if r != 4]
    np.testing.assert_array_equal(got[0][untouched], wants[0][untouched])  # other cache rows: not written
    for g, w in zip(got[1:], wants[1:]):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


# -- a KV-cache write model against onnxruntime -------------------------------------------------------------
def _kv_model():
    """present.0.key = ScatterND(past^T, pos, (RoPE(k))^T)^T; present.0.value = the same of v, no RoPE."""
    t, n = helper.make_node, []
    n += [t("Transpose", ["k"], ["kt"], perm=[0, 2, 1, 3]), t("Cast", ["pos"], ["pf"], to=1),
          t("Unsqueeze", ["pf", "ax_last"], ["pf1"]), t("Mul", ["pf1", "freq"], ["ang"]),
          t("Cos", ["ang"], ["cos"]), t("Sin", ["ang"], ["sin"]),
          t("Slice", ["kt", "s0", "s4", "ax3"], ["k1"]), t("Slice", ["kt", "s4", "s8", "ax3"], ["k2"]),
          t("Neg", ["k2"], ["nk2"]), t("Concat", ["nk2", "k1"], ["rot"], axis=-1),
          t("Mul", ["kt", "cos"], ["a"]), t("Mul", ["rot", "sin"], ["b"]), t("Add", ["a", "b"], ["kr"]),
          t("Transpose", ["kr"], ["krt"], perm=[2, 0, 1, 3]), t("Unsqueeze", ["pos", "ax_last"], ["idx"])]
    for name, upd in (("key", "krt"), ("value", "v")):
        n += [t("Transpose", [f"past_key_values.0.{name}"], [f"pt_{name}"], perm=[2, 0, 1, 3]),
              t("ScatterND", [f"pt_{name}", "idx", upd], [f"sc_{name}"]),
              t("Transpose", [f"sc_{name}"], [f"present.0.{name}"], perm=[1, 2, 0, 3])]
    init = {"freq": (0.5 ** np.arange(8)).astype(np.float32), "s0": np.array([0], np.int64),
            "s4": np.array([4], np.int64), "s8": np.array([8], np.int64), "ax3": np.array([3], np.int64),
            "ax_last": np.array([-1], np.int64)}
    R = np.random.default_rng(5)
    feeds = {"k": R.normal(size=(1, 1, 2, 8)).astype(np.float32), "v": R.normal(size=(1, 1, 2, 8)).astype(np.float32),
             "pos": np.array([3], np.int64),
             "past_key_values.0.key": R.normal(size=(1, 2, 6, 8)).astype(np.float32),
             "past_key_values.0.value": R.normal(size=(1, 2, 6, 8)).astype(np.float32)}
    return make_model(n, feeds, ["present.0.key", "present.0.value"], init), feeds


def _compile(model, target, disabled=None, **kw):
    """Compile with ``MIGRAPHX_DISABLE_PASSES=disabled`` (read afresh for this compile only)."""
    import os

    from mgx_graph import env

    old = os.environ.pop("MIGRAPHX_DISABLE_PASSES", None)
    if disabled:
        os.environ["MIGRAPHX_DISABLE_PASSES"] = disabled
    env._reset_for_tests()
    try:
        return mgx_graph.compile(model, target=target, **kw)
    finally:
        os.environ.pop("MIGRAPHX_DISABLE_PASSES", None)
        if old is not None:
            os.environ["MIGRAPHX_DISABLE_PASSES"] = old
        env._reset_for_tests()


def _run_in_place(prog, feeds):
    """run_async with device copies of the feeds (the caches bound in place); returns the cache
    arrays after the run and the outputs, on the host."""
    ctx = prog.context
    with ctx.on_queue(prog.queue):
        dev = {k: ctx.xp.array(v) for k, v in feeds.items()}  # copies: the feeds stay as they were
    outs = prog.run_async(dev)
    got = [ctx.to_host(o, prog.queue) for o in outs]
    return {k: ctx.to_host(v, prog.queue) for k, v in dev.items()}, got


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_kv_write_matches_onnxruntime_in_place(target, hip_graph):
    model, feeds = _kv_model()
    want = ort_run(model, feeds)
    prog = _compile(model, target, disabled="fuse_horizontal", hip_graph=hip_graph)  # fuse_scatternd alone
    assert prog.alias == {"present.0.key": "past_key_values.0.key", "present.0.value": "past_key_values.0.value"}
    kinds = [i.op.name for i in prog.get_main_module().instructions]
    assert kinds.count(KIND) == 1 and kinds.count("scatternd") == 1  # the key write fused; the value write as it was
    for _ in range(2):  # the second run replays the graph when there is one; the same rows are written
        cache, outs = _run_in_place(prog, feeds)
        for name, w, g in zip(("key", "value"), want, outs):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=name)
            np.testing.assert_allclose(cache[f"past_key_values.0.{name}"], w, rtol=1e-6, atol=1e-6, err_msg=name)
    rows = [r for r in range(6) if r != 3]  # only row 3 was written: the others are the past bit for bit
    for name in ("key", "value"):
        cache_name = f"past_key_values.0.{name}"
        np.testing.assert_array_equal(cache[cache_name][:, :, rows], feeds[cache_name][:, :, rows])
    plain = _compile(model, target, disabled="fuse_scatternd,fuse_horizontal", hip_graph=hip_graph)
    assert not any(i.op.name == KIND for i in plain.get_main_module().instructions)
    assert prog.stats()["launches_per_run_eager"] == plain.stats()["launches_per_run_eager"] - 1
    if target == "ref":  # the submodule runs the very kernels of the unfused instructions
        for g, w in zip(prog.run(feeds), plain.run(feeds)):
            np.testing.assert_array_equal(g, w)


def test_negative_position_and_fp16_match_onnxruntime(target):
    model, feeds = _kv_model()
    feeds = dict(feeds, pos=np.array([-2], np.int64))  # row 4, counted from the end
    want = ort_run(model, feeds)
    prog = _compile(model, target, disabled="fuse_horizontal", fp16=True)
    assert sum(i.op.name == KIND for i in prog.get_main_module().instructions) >= 1
    half = {k: (v.astype(np.float16) if v.dtype == np.float32 else v) for k, v in feeds.items()}
    for name, w, g in zip(("key", "value"), want, prog.run(half)):
        np.testing.assert_allclose(g.astype(np.float32), w, rtol=1e-2, atol=1e-2, err_msg=name)


def test_an_index_out_of_range_is_an_execution_error_on_ref():
    """An ExecutionError naming the fused instruction, and the program runs on after it (the gpu
    kernel drops such a write instead: see the host test above)."""
    model, feeds = _kv_model()
    prog = _compile(model, "ref", disabled="fuse_horizontal")
    with pytest.raises(mgx_graph.ExecutionError, match="fused_scatternd.*out of bounds"):
        prog.run(dict(feeds, pos=np.array([9], np.int64)))
    np.testing.assert_allclose(prog.run(feeds)[0], ort_run(model, feeds)[0], rtol=1e-6, atol=1e-6)


def test_a_saved_program_keeps_the_fused_write(target, tmp_path):
    model, feeds = _kv_model()
    prog = _compile(model, target, disabled="fuse_horizontal")
    path = str(tmp_path / "kv.mxr")
    prog.save(path)
    loaded = mgx_graph.load(path)
    assert any(i.op.name == KIND for i in loaded.get_main_module().instructions)
    assert loaded.alias == prog.alias
    for g, w in zip(loaded.run(feeds), ort_run(model, feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_reduction_add_with_duplicate_indices_stays_a_scatternd(target):
    """ONNX ScatterND reduction='add' sums duplicate rows: that scatter keeps its own kernel."""
    nodes = [helper.make_node("Exp", ["u"], ["e"]),
             helper.make_node("ScatterND", ["data", "idx", "e"], ["y"], reduction="add")]
    R = np.random.default_rng(2)
    feeds = {"data": R.normal(size=(4, 3)).astype(np.float32), "u": R.normal(size=(3, 3)).astype(np.float32)}
    model = make_model(nodes, feeds, ["y"], {"idx": np.array([[1], [3], [1]], np.int64)})
    prog = _compile(model, target)
    names = [i.op.name for i in prog.get_main_module().instructions]
    assert KIND not in names and "scatternd" in names
    np.testing.assert_allclose(prog.run(feeds)[0], ort_run(model, feeds)[0], rtol=1e-6, atol=1e-6)


# -- the decode step of a random LLaMA --------------------------------------------------------------------------
# (the `llama` fixture: tests/conftest.py)


def _lowered(info, fp16, disabled=()):
    prog = mgx_graph.parse_onnx(str(info.onnx_path))
    alias = detect_alias(prog)
    PassManager(pipeline("gpu", PipelineOptions(fp16=fp16, alias=alias)), PassContext("gpu"),
                disabled=set(disabled)).run(prog)
    validate_program(prog)
    return prog


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_decode_step_one_kernel_fewer_per_layer(llama, fp16):
    layers = llama.config["num_layers"]
    fused_prog = _lowered(llama, fp16, {"fuse_horizontal"})  # fuse_scatternd alone
    plain_prog = _lowered(llama, fp16, {"fuse_scatternd", "fuse_horizontal"})
    main = fused_prog.get_main_module()
    writers = [i for i in main.instructions if i.op.name == KIND]
    assert len(writers) >= layers and all("bind_param" in i.meta for i in writers)  # each key write, in place
    kernels = [sum(1 for i in p.get_main_module().instructions if "kernel" in i.meta) for p in (fused_prog, plain_prog)]
    launches = [sum(launch_count(i) for i in p.get_main_module().instructions) for p in (fused_prog, plain_prog)]
    assert kernels[0] == kernels[1] - len(writers) and launches[0] == launches[1] - len(writers)


def test_decode_step_tokens_unchanged_on_ref(llama):
    from mgx_graph.llm.generation import Decoder, generate
    from mgx_graph.models.oracle import hf_greedy_tokens

    prompt, n_new = [5, 9, 2, 77], 8
    eos = llama.config["eos_token_ids"]
    prog = _compile(str(llama.onnx_path), "ref", disabled="fuse_horizontal")
    assert any(i.op.name == KIND for i in prog.get_main_module().instructions)
    fused_tokens = generate(Decoder(prog), prompt, n_new, eos).tokens
    plain = _compile(str(llama.onnx_path), "ref", disabled="fuse_scatternd,fuse_horizontal")
    assert fused_tokens == generate(Decoder(plain), prompt, n_new, eos).tokens == hf_greedy_tokens(llama, prompt, n_new)
