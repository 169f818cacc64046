"""Unit tests of individual compiler passes on small hand-built programs."""
import numpy as np
import pytest
from onnx import helper

import mgx_graph
from util import make_model, ort_run

R = np.random.default_rng(3)


def rmsnorm_model(weighted=True, eps=1e-5, d=8):
    nodes = [helper.make_node("Pow", ["x", "two"], ["p"]),
             helper.make_node("ReduceMean", ["p", "ax"], ["m"], keepdims=1),
             helper.make_node("Add", ["m", "eps"], ["a"]),
             helper.make_node("Sqrt", ["a"], ["s"]),
             helper.make_node("Reciprocal", ["s"], ["r"]),
             helper.make_node("Mul", ["x", "r"], ["y0"])]
    init = {"two": np.array(2.0, np.float32), "ax": np.array([-1], np.int64), "eps": np.array(eps, np.float32)}
    if weighted:
        nodes.append(helper.make_node("Mul", ["w", "y0"], ["y"]))
        init["w"] = R.uniform(0.5, 1.5, size=(d,)).astype(np.float32)
    else:
        nodes.append(helper.make_node("Identity", ["y0"], ["y"]))
    return make_model(nodes, {"x": np.zeros((2, 3, d), np.float32)}, ["y"], init)


@pytest.mark.usefixtures("unfused")
@pytest.mark.parametrize("weighted", [True, False])
def test_fuse_norms_rewrites_rmsnorm(target, weighted):
    model = rmsnorm_model(weighted)
    x = R.normal(size=(2, 3, 8)).astype(np.float32) * 3
    prog = mgx_graph.compile(model, target=target, hip_graph=False)
    names = [i.op.name for i in prog.get_main_module().instructions if not i.op.builtin]
    assert names == ["rms_norm"], names
    np.testing.assert_allclose(prog.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_fuse_norms_leaves_other_patterns():
    """pow with exponent 3 is not a norm: nothing is fused and the result is unchanged."""
    model = rmsnorm_model()
    for init in model.graph.initializer:
        if init.name == "two":
            init.CopyFrom(helper.make_tensor("two", 1, [], [3.0]))
    prog = mgx_graph.compile(model, target="ref")
    assert "rms_norm" not in prog.print()
    x = R.normal(size=(2, 3, 8)).astype(np.float32)
    np.testing.assert_allclose(prog.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_rms_norm_fp16_does_not_overflow(target):
    """x**2 of 400 overflows float16 (max 65504); the fused norm accumulates in float32."""
    model = rmsnorm_model()
    x = np.full((2, 3, 8), 400.0, np.float32)
    x[0, 0, 0] = -300.0
    want = ort_run(model, {"x": x})[0]
    prog = mgx_graph.compile(model, target=target, fp16=True)
    got = prog.run({"x": x.astype(np.float16)})[0]
    assert got.dtype == np.float16 and np.all(np.isfinite(got))
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-3, atol=2e-3)


@pytest.mark.usefixtures("unfused")
def test_quantize_keeps_index_arithmetic_in_float32():
    """cos(position * freq) stays float32 and is converted once where it meets the activations."""
    nodes = [helper.make_node("Cast", ["pos"], ["pf"], to=1),
             helper.make_node("Mul", ["pf", "freq"], ["ang"]),
             helper.make_node("Cos", ["ang"], ["c"]),
             helper.make_node("Mul", ["x", "c"], ["y"])]
    model = make_model(nodes, {"x": np.zeros((1, 4), np.float32), "pos": np.zeros((1, 1), np.int64)}, ["y"],
                       {"freq": np.array([1.0, 0.5, 0.25, 0.125], np.float32)})
    prog = mgx_graph.compile(model, target="ref", fp16=True)
    by_name = {i.op.name: i for i in prog.get_main_module().instructions}
    assert by_name["cos"].shape.dtype == "float32"
    assert by_name["x"].shape.dtype == "float16" if "x" in by_name else True
    assert prog.get_parameter_shapes()["x"].dtype == "float16"
    assert prog.get_parameter_shapes()["pos"].dtype == "int64"
    x = np.ones((1, 4), np.float16)
    pos = np.array([[200]], np.int64)
    got = prog.run({"x": x, "pos": pos})[0]
    want = np.cos(np.float32(200) * np.array([1.0, 0.5, 0.25, 0.125], np.float32))
    # float32 angles: the error is float16 rounding of the result only (an fp16 angle would be off by ~0.06)
    np.testing.assert_allclose(got.astype(np.float32)[0], want, atol=1e-3)


def test_quantize_fp16_program_interface():
    model = rmsnorm_model()
    prog = mgx_graph.compile(model, target="ref", fp16=True)
    assert prog.get_parameter_shapes()["x"].dtype == "float16"
    assert prog.get_output_shapes()[0].dtype == "float16"
    with pytest.raises(mgx_graph.ParameterError, match="expected dtype float16"):
        prog.run({"x": np.zeros((2, 3, 8), np.float32)})


# -- dead code, constants, views ---------------------------------------------------------------------------
def test_dead_code_elimination_removes_unused_keeps_interface():
    nodes = [helper.make_node("Neg", ["x"], ["unused"]), helper.make_node("Abs", ["x"], ["y"])]
    model = make_model(nodes, {"x": np.zeros(3, np.float32), "z": np.zeros(2, np.float32)}, ["y"])
    prog = mgx_graph.parse_onnx(model)
    from mgx_graph.passes import EliminateDeadCode

    EliminateDeadCode()(prog)
    names = [i.op.name for i in prog.get_main_module().instructions]
    assert names == ["@param", "@param", "abs", "@return"]
    assert prog.get_parameter_names() == ["x", "z"]  # an unused parameter stays: it is the interface


def test_propagate_constant_folds_literal_expressions():
    from mgx_graph.operators import make_op
    from mgx_graph.passes import PropagateConstant

    prog = mgx_graph.Program()
    m = prog.get_main_module()
    x = m.add_parameter("x", mgx_graph.Shape("float32", (3,)))
    a = m.add_literal(np.array([1.0, 2.0, 3.0], np.float32))
    b = m.add_literal(np.array([0.5], np.float32))
    s = m.add_instruction(make_op("mul", ), [a, b])
    y = m.add_instruction(make_op("add"), [x, s])
    m.add_return([y], ["y"])
    PropagateConstant()(prog)
    lits = [i for i in m.instructions if i.op.name == "@literal"]
    assert any(np.array_equal(l.op.value, np.array([0.5, 1.0, 1.5], np.float32)) for l in lits)
    assert [i.op.name for i in m.instructions if not i.op.builtin] == ["add"]


def test_simplify_reshapes_collapses_view_chains(target):
    nodes = [helper.make_node("Transpose", ["x"], ["t1"], perm=[1, 0, 2]),
             helper.make_node("Transpose", ["t1"], ["t2"], perm=[1, 0, 2]),
             helper.make_node("Unsqueeze", ["t2", "ax"], ["u"]),
             helper.make_node("Reshape", ["u", "s"], ["r"]),
             helper.make_node("Squeeze", ["r", "ax"], ["q"]),
             helper.make_node("Neg", ["q"], ["y"])]
    init = {"ax": np.array([0], np.int64), "s": np.array([1, 6, 4], np.int64)}
    model = make_model(nodes, {"x": np.zeros((2, 3, 4), np.float32)}, ["y"], init)
    prog = mgx_graph.compile(model, target=target)
    views = [i.op.name for i in prog.get_main_module().instructions if i.op.is_view]
    assert views == ["reshape"], views  # transpose pair cancelled, three reshapes became one
    x = R.normal(size=(2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(prog.run({"x": x})[0], ort_run(model, {"x": x})[0])


# -- the hip_graph pass ---------------------------------------------------------------------------------------
def _chain(nodes, src, prefix, n=4):
    cur = src
    for k in range(n):
        nodes.append(helper.make_node("Tanh" if k % 2 else "Neg", [cur], [f"{prefix}{k}"]))
        cur = f"{prefix}{k}"
    return cur


def _regions(prog):
    return [name for name in prog.modules if ":graph_launch" in name]


@pytest.mark.usefixtures("unfused")
def test_hip_graph_pass_is_idempotent_and_names_regions():
    from mgx_graph.passes import HipGraph

    nodes = []
    out = _chain(nodes, "x", "a", 6)
    nodes.append(helper.make_node("Identity", [out], ["y"]))
    model = make_model(nodes, {"x": np.zeros(4, np.float32)}, ["y"])
    prog = mgx_graph.compile(model, target="ref", hip_graph=True)
    assert _regions(prog) == ["main:graph_launch0"]
    before = prog.print()
    HipGraph()(prog)
    assert prog.print() == before


@pytest.mark.usefixtures("unfused")
def test_min_partition_size_is_respected():
    nodes = []
    out = _chain(nodes, "x", "a", 3)
    nodes.append(helper.make_node("Identity", [out], ["y"]))
    model = make_model(nodes, {"x": np.zeros(4, np.float32)}, ["y"])
    assert _regions(mgx_graph.compile(model, target="ref", hip_graph=True)) == []  # 3 < 4
    assert len(_regions(mgx_graph.compile(model, target="ref", hip_graph=True, min_partition_size=3))) == 1


def _boundary_model(kind):
    """4 kernels -> one host-sync instruction of ``kind`` -> 4 kernels."""
    nodes, init, inputs = [], {}, {"x": np.zeros((2, 3), np.float32)}
    a = _chain(nodes, "x", "a")
    if kind == "if":
        then_g = helper.make_graph([helper.make_node("Sigmoid", [a], ["tb"])], "t", [],
                                   [helper.make_tensor_value_info("tb", 1, [2, 3])])
        else_g = helper.make_graph([helper.make_node("Relu", [a], ["eb"])], "e", [],
                                   [helper.make_tensor_value_info("eb", 1, [2, 3])])
        nodes += [helper.make_node("ReduceSum", [a], ["s"], keepdims=0),
                  helper.make_node("Greater", ["s", "zero"], ["c"]),
                  helper.make_node("If", ["c"], ["b"], then_branch=then_g, else_branch=else_g)]
        init["zero"] = np.array(0.0, np.float32)
    elif kind == "loop":
        body = helper.make_graph([helper.make_node("Identity", ["ci"], ["co"]), helper.make_node("Relu", ["v"], ["vo"])],
                                 "body", [helper.make_tensor_value_info("i", 7, []), helper.make_tensor_value_info("ci", 9, []),
                                          helper.make_tensor_value_info("v", 1, [2, 3])],
                                 [helper.make_tensor_value_info("co", 9, []), helper.make_tensor_value_info("vo", 1, [2, 3])])
        nodes.append(helper.make_node("Loop", ["M", "", a], ["b"], body=body))
        inputs["M"] = np.array(2, np.int64)
    elif kind == "nonzero":
        nodes += [helper.make_node("NonZero", [a], ["nz"]), helper.make_node("ReduceSum", ["nz"], ["s"], keepdims=0),
                  helper.make_node("Cast", ["s"], ["sf"], to=1), helper.make_node("Add", [a, "sf"], ["b"])]
    elif kind == "reshape":
        nodes += [helper.make_node("Reshape", [a, "shape"], ["r"]), helper.make_node("Reshape", ["r", "back"], ["b"])]
        inputs["shape"] = np.array([3, 2], np.int64)
        init["back"] = np.array([2, 3], np.int64)
    elif kind == "expand":
        nodes += [helper.make_node("Expand", [a, "shape"], ["b0"]), helper.make_node("ReduceSum", ["b0", "ax"], ["b"], keepdims=0)]
        inputs["shape"] = np.array([2, 2, 3], np.int64)
        init["ax"] = np.array([0], np.int64)
    elif kind == "constantofshape":
        nodes += [helper.make_node("ConstantOfShape", ["shape"], ["k"], value=helper.make_tensor("v", 1, [1], [2.0])),
                  helper.make_node("Mul", [a, "k"], ["b"])]
        inputs["shape"] = np.array([2, 3], np.int64)
    elif kind == "topk":
        nodes += [helper.make_node("TopK", [a, "k"], ["tv", "ti"], axis=1), helper.make_node("ReduceSum", ["tv"], ["s"]),
                  helper.make_node("Add", [a, "s"], ["b"])]
        inputs["k"] = np.array([2], np.int64)
    elif kind == "unique":
        nodes += [helper.make_node("Unique", [a], ["uy", "ui", "uinv", "uc"]), helper.make_node("ReduceSum", ["uy"], ["s"], keepdims=0),
                  helper.make_node("Add", [a, "s"], ["b"])]
    elif kind == "host":
        nodes.append(helper.make_node("Erf", [a], ["b"]))
    out = _chain(nodes, "b", "z")
    nodes.append(helper.make_node("Identity", [out], ["y"]))
    return make_model(nodes, inputs, ["y"], init), inputs


BOUNDARY = {"if": "if", "loop": "loop", "nonzero": "guard", "reshape": "guard", "expand": "guard",
            "constantofshape": "guard", "topk": "guard", "unique": "guard", "host": "copy_from_gpu"}


@pytest.mark.usefixtures("unfused")
@pytest.mark.parametrize("kind", sorted(BOUNDARY))
def test_graph_boundary_at_each_host_sync_kind(kind, target):
    model, inputs = _boundary_model(kind)
    x = R.normal(size=(2, 3)).astype(np.float32)
    inputs = dict(inputs, x=x)
    prog = mgx_graph.compile(model, target=target, hip_graph=True,
                             host_ops=("erf",) if kind == "host" else ())
    outs = [prog.run(inputs)[0] for _ in range(4)]
    want = ort_run(model, inputs)[0]
    for o in outs:
        np.testing.assert_allclose(o, want, rtol=1e-5, atol=1e-6)
    spec = prog if "graph_launch" in prog.print() else prog.dispatcher.last()
    main = spec.get_main_module()
    seq = [i.op.name for i in main.instructions if not i.op.builtin and i.op.name not in ("get_tuple_elem",)]
    b = BOUNDARY[kind]
    assert b in seq, seq
    k = seq.index(b)
    # the run before the boundary and the run after it are separate regions; the boundary is in neither
    assert "graph_launch" in seq[:k] and "graph_launch" in seq[k + 1:], seq
    for name in _regions(spec):
        assert all(i.op.name != b for i in spec.modules[name].instructions)
    st = prog.stats()
    assert st["captures"] == 2 and st["fallbacks"] == 0, st
