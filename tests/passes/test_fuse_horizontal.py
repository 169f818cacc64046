"""fuse_horizontal: a layer's K and V cache writes and its query rotation become one ``fused_horizontal``
(what merges, what does not), the model of one decode layer against onnxruntime (bound in place, eager
and graph, saved and loaded), the generated kernel run on the host against numpy, and the tiny
decoders (kernels per layer after the gpu passes, greedy tokens unchanged)."""
import numpy as np
import pytest
from onnx import helper

import mgx_graph
from mgx_graph import Program
from mgx_graph.operators.fused import evaluate_module
from mgx_graph.operators.fused_horizontal import parts_of
from mgx_graph.operators.fused_horizontal_codegen import horizontal_source
from mgx_graph.passes import (EliminateDeadCode, FuseHorizontal, FusePointwise, FuseScatterND, PassContext,
                              PassManager, PipelineOptions, validate_program)
from mgx_graph.passes.bind_outputs import detect_alias
from mgx_graph.passes.hip_graph import launch_count
from mgx_graph.targets import pipeline

from irtools import S, op, run_pass
from kernel_host import NVCC, run_on_host
from test_fuse_scatternd import _compile, _run_in_place
from util import make_model, ort_run

KIND = "fused_horizontal"


def names_of(prog):
    return [i.op.name for i in prog.get_main_module().instructions]


def fuse(prog):
    for p in (FusePointwise(), FuseScatterND(), FuseHorizontal(), EliminateDeadCode()):
        run_pass(p, prog)
    return prog


# -- IR in, IR out ----------------------------------------------------------------------------------------
def _layer(case="plain"):
    """q / k rotated by cos / sin, k written into past_k and v into past_v at ``idx`` (a layer's decode
    step); ``case`` adds what keeps members apart."""
    prog = Program()
    m = prog.get_main_module()
    f32 = "float32"
    q, k, v = (m.add_parameter(n, S(f32, 1, 2, 8)) for n in ("q", "k", "v"))
    cos, sin = m.add_parameter("cos", S(f32, 1, 1, 8)), m.add_parameter("sin", S(f32, 1, 1, 8))
    pk, pv = m.add_parameter("past_k", S(f32, 6, 2, 8)), m.add_parameter("past_v", S(f32, 6, 2, 8))
    idx = m.add_parameter("idx", S("int64", 1, 1))

    def rope(x):
        rot = m.add_instruction(op("concat", axis=-1), [
            m.add_instruction(op("neg"), [m.add_instruction(op("slice", axes=[2], starts=[4], ends=[8]), [x])]),
            m.add_instruction(op("slice", axes=[2], starts=[0], ends=[4]), [x])])
        return m.add_instruction(op("add"), [m.add_instruction(op("mul"), [x, cos]),
                                             m.add_instruction(op("mul"), [rot, sin])])

    qr = rope(q)
    outs = []
    if case == "q_read_in_between":  # a kernel reads the rotated q before the writes
        outs.append(m.add_instruction(op("reduce_sum", axes=[2]), [qr]))
    vidx = m.add_parameter("idx2", S("int64", 1, 1)) if case == "other_indices" else idx
    kw = m.add_instruction(op("scatternd"), [pk, idx, rope(k)])
    vdata = pk if case == "same_cache" else pv
    vupd = m.add_instruction(op("add"), [v, qr]) if case == "reads_a_member" else v
    red = "add" if case == "reduction" else "none"
    if case == "reads_a_member":
        vupd = m.add_instruction(op("reduce_sum", axes=[0]), [m.add_instruction(op("concat", axis=0), [vupd, kw])])
        vupd = m.add_instruction(op("reshape", dims=[1, 2, 8]), [vupd])
    vw = m.add_instruction(op("scatternd", reduction=red), [vdata, vidx, vupd])
    m.add_return([m.add_instruction(op("mul"), [qr, qr])] + [kw, vw] + outs)
    return prog


def test_k_write_v_write_and_q_rotation_become_one_instruction():
    prog = fuse(_layer())
    validate_program(prog)
    names = names_of(prog)
    assert names.count(KIND) == 1 and "scatternd" not in names and "fused_scatternd" not in names
    assert "pointwise" not in names  # q's rotation (with the q * q that reads it) is a part
    f = next(i for i in prog.get_main_module().instructions if i.op.name == KIND)
    parts = parts_of(f.module_inputs[0])
    kinds = sorted("scatter" if d is not None else p.op.name for p, d in parts)
    assert kinds == ["mul", "scatter", "scatter"]
    assert all(c.op.name == "get_tuple_elem" for c in f.outputs) and len(f.outputs) == 3
    data = {d: f.inputs[d].op.parameter for _, d in parts if d is not None}
    assert sorted(data.values()) == ["past_k", "past_v"]
    assert {f.op.inplace_input(k) for k in range(3)} == set(data) | {None}


@pytest.mark.parametrize("case,left,parts", [
    ("other_indices", {"scatternd": 1, KIND: 1}, ["mul", "scatter"]),
    ("same_cache", {"scatternd": 1, "fused_scatternd": 1, "pointwise": 1}, None),
    ("reduction", {"scatternd": 1, KIND: 1}, ["mul", "scatter"]),
    ("q_read_in_between", {KIND: 1, "pointwise": 1}, ["scatter", "scatter"]),
    ("reads_a_member", {"scatternd": 1, KIND: 1}, ["add", "scatter"])])
def test_what_stays_apart(case, left, parts):
    """Different index inputs: the V write stays apart (k's write and q's rotation merge).  A second
    write into the same cache: nothing merges (moving the k write after it would read the cache it
    wrote).  A scatter with a reduction stays a scatternd.  The rotated q read by a kernel between the
    writes: q stays a pointwise (the writes merge).  The V write reading the K write's result: it stays
    apart."""
    prog = fuse(_layer(case))
    validate_program(prog)
    names = names_of(prog)
    for name, n in left.items():
        assert names.count(name) == n, (case, name, names)
    if parts is None:
        assert KIND not in names
        return
    f = next(i for i in prog.get_main_module().instructions if i.op.name == KIND)
    assert sorted("scatter" if d is not None else p.op.name for p, d in parts_of(f.module_inputs[0])) == parts
    if case in ("reduction", "reads_a_member", "other_indices"):
        v = next(i for i in prog.get_main_module().instructions if i.op.name == "scatternd")
        assert v.inputs[0].op.parameter == "past_v"


def test_pass_is_in_both_pipelines_and_switchable():
    for target in ("ref", "gpu"):
        names = [p.name for g in pipeline(target, PipelineOptions()) for p in g.passes]
        assert names.index("fuse_scatternd") < names.index("fuse_horizontal") < names.index("bind_outputs")
        for disabled, want in ((set(), 1), ({"fuse_horizontal"}, 0)):
            prog = _layer()
            PassManager(pipeline(target, PipelineOptions()), PassContext(target), disabled=disabled).run(prog)
            assert names_of(prog).count(KIND) == want, (target, disabled)


# -- one decode layer against onnxruntime -------------------------------------------------------------------
def _layer_model():
    """present.0.key / value = ScatterND(past^T, pos, RoPE(k)^T / v^T)^T and q_rot = RoPE(q) * 0.25."""
    t, n = helper.make_node, []
    n += [t("Cast", ["pos"], ["pf"], to=1), t("Unsqueeze", ["pf", "ax_last"], ["pf1"]),
          t("Mul", ["pf1", "freq"], ["ang"]), t("Cos", ["ang"], ["cos"]), t("Sin", ["ang"], ["sin"]),
          t("Unsqueeze", ["pos", "ax_last"], ["idx"])]
    for x in ("q", "k"):
        n += [t("Transpose", [x], [f"{x}t"], perm=[0, 2, 1, 3]),
              t("Slice", [f"{x}t", "s0", "s4", "ax3"], [f"{x}1"]), t("Slice", [f"{x}t", "s4", "s8", "ax3"], [f"{x}2"]),
              t("Neg", [f"{x}2"], [f"n{x}2"]), t("Concat", [f"n{x}2", f"{x}1"], [f"{x}rot"], axis=-1),
              t("Mul", [f"{x}t", "cos"], [f"{x}a"]), t("Mul", [f"{x}rot", "sin"], [f"{x}b"]),
              t("Add", [f"{x}a", f"{x}b"], [f"{x}r"])]
    n += [t("Mul", ["qr", "quarter"], ["q_rot"]), t("Transpose", ["kr"], ["krt"], perm=[2, 0, 1, 3])]
    for name, upd in (("key", "krt"), ("value", "v")):
        n += [t("Transpose", [f"past_key_values.0.{name}"], [f"pt_{name}"], perm=[2, 0, 1, 3]),
              t("ScatterND", [f"pt_{name}", "idx", upd], [f"sc_{name}"]),
              t("Transpose", [f"sc_{name}"], [f"present.0.{name}"], perm=[1, 2, 0, 3])]
    init = {"freq": (0.5 ** np.arange(8)).astype(np.float32), "s0": np.array([0], np.int64),
            "s4": np.array([4], np.int64), "s8": np.array([8], np.int64), "ax3": np.array([3], np.int64),
            "ax_last": np.array([-1], np.int64), "quarter": np.array(0.25, np.float32)}
    R = np.random.default_rng(7)
    feeds = {"q": R.normal(size=(1, 1, 3, 8)).astype(np.float32), "k": R.normal(size=(1, 1, 2, 8)).astype(np.float32),
             "v": R.normal(size=(1, 1, 2, 8)).astype(np.float32), "pos": np.array([3], np.int64),
             "past_key_values.0.key": R.normal(size=(1, 2, 6, 8)).astype(np.float32),
             "past_key_values.0.value": R.normal(size=(1, 2, 6, 8)).astype(np.float32)}
    return make_model(n, feeds, ["q_rot", "present.0.key", "present.0.value"], init), feeds


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_layer_matches_onnxruntime_in_place(target, hip_graph):
    model, feeds = _layer_model()
    want = ort_run(model, feeds)
    prog = _compile(model, target, hip_graph=hip_graph)
    assert prog.alias == {"present.0.key": "past_key_values.0.key", "present.0.value": "past_key_values.0.value"}
    names = names_of(prog)
    if not hip_graph:
        assert names.count(KIND) == 1 and "scatternd" not in names and "fused_scatternd" not in names
    for _ in range(2):  # the second run replays the graph when there is one
        cache, outs = _run_in_place(prog, feeds)
        for name, w, g in zip(("q_rot", "key", "value"), want, outs):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=name)
        for name, w in zip(("key", "value"), want[1:]):
            np.testing.assert_allclose(cache[f"past_key_values.0.{name}"], w, rtol=1e-5, atol=1e-6, err_msg=name)
    rows = [r for r in range(6) if r != 3]  # only row 3 was written: the others are the past bit for bit
    for name in ("key", "value"):
        c = f"past_key_values.0.{name}"
        np.testing.assert_array_equal(cache[c][:, :, rows], feeds[c][:, :, rows])
    plain = _compile(model, target, disabled="fuse_horizontal", hip_graph=hip_graph)
    assert prog.stats()["launches_per_run_eager"] == plain.stats()["launches_per_run_eager"] - 2  # 3 -> 1
    if target == "ref":  # the submodule runs the very kernels of the unfused instructions
        for g, w in zip(prog.run(feeds), plain.run(feeds)):
            np.testing.assert_array_equal(g, w)


def test_layer_fp16_and_negative_position_match_onnxruntime(target):
    model, feeds = _layer_model()
    feeds = dict(feeds, pos=np.array([-2], np.int64))  # row 4, counted from the end
    want = ort_run(model, feeds)
    prog = _compile(model, target, fp16=True)
    assert KIND in names_of(prog)
    half = {k: (v.astype(np.float16) if v.dtype == np.float32 else v) for k, v in feeds.items()}
    for name, w, g in zip(("q_rot", "key", "value"), want, prog.run(half)):
        np.testing.assert_allclose(g.astype(np.float32), w, rtol=1e-2, atol=1e-2, err_msg=name)


def test_index_out_of_range_is_an_execution_error_and_the_program_stays_usable():
    model, feeds = _layer_model()
    prog = _compile(model, "ref")
    with pytest.raises(mgx_graph.ExecutionError, match="fused_horizontal.*out of bounds"):
        prog.run(dict(feeds, pos=np.array([9], np.int64)))
    for g, w in zip(prog.run(feeds), ort_run(model, feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_a_saved_program_keeps_the_fused_writes_and_bindings(target, tmp_path):
    model, feeds = _layer_model()
    prog = _compile(model, target)
    path = str(tmp_path / "layer.mxr")
    prog.save(path)
    loaded = mgx_graph.load(path)
    assert KIND in names_of(loaded) and loaded.alias == prog.alias
    cache, outs = _run_in_place(loaded, feeds)
    want = ort_run(model, feeds)
    for g, w in zip(outs, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cache["past_key_values.0.key"], want[1], rtol=1e-5, atol=1e-6)


# -- the generated kernel on the host ----------------------------------------------------------------------
@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not found")
def test_generated_kernel_on_the_host_matches_numpy(tmp_path):
    """The kernel of the bound layer (caches in their transposed in-place layout) against the module's
    instructions run by numpy on the same inputs; only the position's rows of the caches are written."""
    model, feeds = _layer_model()
    prog = _compile(model, "ref", hip_graph=False)
    f = next(i for i in prog.get_main_module().instructions if i.op.name == KIND)
    sub, outs = f.op.module, f.shape
    rng = np.random.default_rng(3)
    args = []
    for i in f.inputs:
        s = i.shape
        a = rng.normal(size=s.lens).astype(s.np_dtype) if s.np_dtype.kind == "f" else np.array([[3]], np.int64)
        args.append(np.ascontiguousarray(a))
    in_shapes = [S(a.dtype.name, *a.shape) for a in args]
    starts = [np.ascontiguousarray(args[d]) if d is not None else np.zeros(s.lens, s.np_dtype)
              for (_, d), s in zip(parts_of(sub), outs)]
    std_outs = tuple(S(s.dtype, *s.lens) for s in outs)
    want = tuple(x.copy() for x in starts)
    ref_ctx = type("Ctx", (), {"xp": np})()
    evaluate_module(sub, ref_ctx, args, want)
    ks = horizontal_source(sub, in_shapes, std_outs)
    assert ks.extent == sum((p.inputs[2] if d is not None else p).shape.elements() for p, d in parts_of(sub))
    got = run_on_host([(ks, args, std_outs, starts)], tmp_path)[0]
    for (p, d), g, w, s0 in zip(parts_of(sub), got, want, starts):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        if d is not None:
            assert (g != s0).any()
            rows = [r for r in range(g.shape[0]) if r != 3]
            np.testing.assert_array_equal(g[rows], s0[rows])


# -- the tiny decoders ----------------------------------------------------------------------------------------
def _lowered(info, fp16, disabled=()):
    prog = mgx_graph.parse_onnx(str(info.onnx_path))
    PassManager(pipeline("gpu", PipelineOptions(fp16=fp16, alias=detect_alias(prog), hip_graph=False)),
                PassContext("gpu"), disabled=set(disabled)).run(prog)
    validate_program(prog)
    return prog


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_tiny_decoder_one_kernel_per_layer_for_the_writes_and_q(tiny, fp16):
    """After the gpu passes (no device needed): one fused_horizontal per layer, bound in place on
    both caches, no scatter left, two kernels and two launches fewer per layer than without the pass."""
    layers = tiny.config["num_layers"]
    fused, plain = _lowered(tiny, fp16), _lowered(tiny, fp16, {"fuse_horizontal"})
    main = fused.get_main_module()
    writers = [i for i in main.instructions if i.op.name == KIND]
    assert len(writers) == layers
    rotary = int(tiny.config["architecture"] != "gpt2")  # the gpt2 query has no rotation
    for w in writers:
        bound = [n for n in w.meta["bind_param"] if n is not None]
        assert len(bound) == 2 and len(w.shape) == 2 + rotary, w.meta["bind_param"]
        assert launch_count(w) == 1  # both caches written in place: no data copy
    assert not any(i.op.name in ("scatternd", "fused_scatternd") for i in main.instructions)
    kernels = [sum(1 for i in p.get_main_module().instructions if "kernel" in i.meta) for p in (fused, plain)]
    launches = [sum(launch_count(i) for i in p.get_main_module().instructions) for p in (fused, plain)]
    saved = (1 + rotary) * layers
    assert kernels[0] == kernels[1] - saved and launches[0] == launches[1] - saved


def test_tiny_decoder_tokens_unchanged(tiny, target):
    from mgx_graph.llm.generation import Decoder, generate
    from mgx_graph.models.oracle import hf_greedy_tokens

    prompt, n_new = [5, 9, 2, 77], 8
    eos = tiny.config["eos_token_ids"]
    prog = _compile(str(tiny.onnx_path), target)
    assert KIND in names_of(prog)
    tokens = generate(Decoder(prog), prompt, n_new, eos).tokens
    plain = _compile(str(tiny.onnx_path), target, disabled="fuse_horizontal")
    assert tokens == generate(Decoder(plain), prompt, n_new, eos).tokens == hf_greedy_tokens(tiny, prompt, n_new)
