"""The ONNX parser core on graph structure: nodes listed out of topological order (subgraphs
included, with reads of outer names defined by later-listed nodes) run as onnxruntime runs them; a
tensor name defined twice and a cycle are ParseErrors naming the nodes, where onnxruntime also
refuses the model."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import mgx_graph
from mgx_graph.onnx.topology import topological_order
from util import make_model, ort_run

N = helper.make_node
F = TensorProto.FLOAT


def _vi(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits=None, opset=18):
    """A model built as given, node order untouched (no shape inference on it)."""
    g = helper.make_graph(nodes, "g", inputs, outputs,
                          [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _reordered(model, order):
    """A copy of ``model`` with its main-graph nodes listed in ``order`` (indices into the original list)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    copies = []
    for i in order:
        c = onnx.NodeProto()
        c.CopyFrom(model.graph.node[i])
        copies.append(c)
    del out.graph.node[:]
    out.graph.node.extend(copies)
    return out


def _out_of_order(nodes) -> bool:
    """True when some node reads a name that a later-listed node produces (this graph only)."""
    later = set()
    for n in reversed(list(nodes)):
        if any(x in later for x in n.input):
            return True
        later |= set(n.output)
    return False


def _ort_session(model):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _ort_refuses(model) -> str:
    """onnxruntime's message refusing ``model`` (the test fails when it accepts it)."""
    with pytest.raises(Exception) as e:
        _ort_session(model)
    return str(e.value)


# -- nodes out of topological order ------------------------------------------------------------------
def dag_model():
    """Two outputs from a DAG with a diamond, a two-output node (Split), a Constant and initializers."""
    nodes = [N("Add", ["x", "y"], ["s"]), N("Relu", ["s"], ["r"]),
             N("Split", ["r"], ["p", "q"], axis=1, num_outputs=2), N("Concat", ["q", "p"], ["c"], axis=1),
             N("MatMul", ["c", "w"], ["mm"]), N("Add", ["mm", "b"], ["z"]),
             N("Constant", [], ["k"], value=onnx.numpy_helper.from_array(np.array(0.5, np.float32))),
             N("Mul", ["z", "k"], ["zk"]), N("Tanh", ["s"], ["t"]), N("ReduceSum", ["t"], ["rs"], keepdims=0),
             N("Add", ["zk", "rs"], ["out1"]), N("Sub", ["c", "x"], ["out2"])]
    rng = np.random.default_rng(3)
    return make_model(nodes, {"x": np.zeros((3, 4), np.float32), "y": np.zeros(4, np.float32)}, ["out1", "out2"],
                      {"w": rng.normal(size=(4, 5)).astype(np.float32), "b": rng.normal(size=5).astype(np.float32)})


def _dag_orders(n):
    rng = np.random.default_rng(7)
    orders = [list(reversed(range(n)))]
    while len(orders) < 5:
        perm = [int(i) for i in rng.permutation(n)]
        if perm not in orders:
            orders.append(perm)
    return orders


@pytest.mark.parametrize("k", range(5))
def test_shuffled_nodes_match_onnxruntime(target, k):
    base = dag_model()
    model = _reordered(base, _dag_orders(len(base.graph.node))[k])
    assert _out_of_order(model.graph.node)
    prog = mgx_graph.compile(model, target=target)
    rng = np.random.default_rng(k)
    for _ in range(3):
        feeds = {"x": rng.normal(size=(3, 4)).astype(np.float32), "y": rng.normal(size=4).astype(np.float32)}
        want = ort_run(model, feeds)
        got = prog.run(feeds)
        assert len(got) == len(want) == 2
        for g, e in zip(got, want):
            assert g.shape == e.shape
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_output_names_of_a_shuffled_model(target):
    """``output_names`` keeps only the nodes an output needs (Tanh / ReduceSum feed out1 alone)."""
    base = dag_model()
    model = _reordered(base, _dag_orders(len(base.graph.node))[1])
    full = mgx_graph.parse_onnx(model).print()
    assert "tanh" in full and "reduce_sum" in full
    prog = mgx_graph.parse_onnx(model, output_names=["out2"])
    assert "tanh" not in prog.print() and "reduce_sum" not in prog.print()
    prog.compile(target)
    rng = np.random.default_rng(9)
    feeds = {"x": rng.normal(size=(3, 4)).astype(np.float32), "y": rng.normal(size=4).astype(np.float32)}
    got = prog.run(feeds)
    assert len(got) == 1
    np.testing.assert_allclose(got[0], _ort_session(model).run(["out2"], feeds)[0], rtol=1e-6)


def test_topological_order_is_stable():
    """A sorted list keeps its order; a shuffled one comes back valid, independent nodes in listed order."""
    base = dag_model()
    nodes = list(base.graph.node)
    assert [i for i, _ in topological_order(nodes)] == list(range(len(nodes)))
    for order in _dag_orders(len(nodes)):
        listed = [nodes[i] for i in order]
        got = [i for i, _ in topological_order(listed)]
        assert sorted(got) == list(range(len(listed)))
        defined = {"x", "y", "w", "b"}
        for i in got:
            assert all(x in defined for x in listed[i].input), listed[i]
            defined |= set(listed[i].output)
        # nodes that read no node output are ready from the start: they keep their listed order
        produced = {o for n in listed for o in n.output}
        roots = [i for i, n in enumerate(listed) if not any(x in produced for x in n.input)]
        assert len(roots) >= 2 and [i for i in got if i in roots] == roots


def if_model(branches_sorted=True):
    """y = tanh(If(sum(x) > 0) ...) whose branches read z = 2 * x and z3 = 3 * x, computed by nodes listed
    after the If; the then-branch holds a nested If (on sum(x) < 1.5) reading 'a' of the then-branch.
    ``branches_sorted=False`` lists the branches' nodes out of order too (onnxruntime wants sorted
    subgraphs, so its oracle runs the sorted model)."""
    inner_then = helper.make_graph([N("Add", ["a", "z3"], ["ia"])], "inner_then", [], [_vi("ia", [3, 4])])
    inner_else = helper.make_graph([N("Sub", ["a", "z3"], ["ib"])], "inner_else", [], [_vi("ib", [3, 4])])
    then_nodes = [N("Mul", ["z", "z"], ["a"]), N("If", ["c2"], ["ta"], then_branch=inner_then, else_branch=inner_else),
                  N("Add", ["ta", "x"], ["t_out"])]
    else_nodes = [N("Neg", ["z"], ["e1"]), N("Sub", ["e1", "x"], ["e_out"])]
    if not branches_sorted:
        then_nodes, else_nodes = [then_nodes[2], then_nodes[1], then_nodes[0]], else_nodes[::-1]
    then_g = helper.make_graph(then_nodes, "then", [], [_vi("t_out", [3, 4])])
    else_g = helper.make_graph(else_nodes, "else", [], [_vi("e_out", [3, 4])])
    nodes = [N("If", ["c"], ["y0"], then_branch=then_g, else_branch=else_g), N("Tanh", ["y0"], ["y"]),
             N("Greater", ["s", "zero"], ["c"]), N("Less", ["s", "lim"], ["c2"]),
             N("ReduceSum", ["x"], ["s"], keepdims=0), N("Mul", ["x", "two"], ["z"]), N("Mul", ["x", "three"], ["z3"])]
    init = {"zero": np.array(0.0, np.float32), "lim": np.array(1.5, np.float32), "two": np.array(2.0, np.float32),
            "three": np.array(3.0, np.float32)}
    return _model(nodes, [_vi("x", [3, 4])], [_vi("y", [3, 4])], init)


@pytest.mark.parametrize("branches_sorted", [True, False], ids=["branches_sorted", "branches_shuffled"])
@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_if_branch_reads_a_name_defined_later(target, hip_graph, branches_sorted):
    model, oracle = if_model(branches_sorted), if_model(True)
    assert _out_of_order(model.graph.node)
    if not branches_sorted:
        then_g = next(a.g for a in model.graph.node[0].attribute if a.name == "then_branch")
        assert _out_of_order(then_g.node)
    prog = mgx_graph.compile(model, target=target, hip_graph=hip_graph, min_partition_size=2)
    assert "if(" in prog.print()  # both branches compiled: the condition is a run-time value
    rng = np.random.default_rng(5)
    seen = set()
    for i in range(9):
        x = (rng.normal(size=(3, 4)) * 0.1 + (-0.5, 0.05, 0.5)[i % 3]).astype(np.float32)
        s = float(x.sum())
        seen.add((s > 0, s < 1.5))
        np.testing.assert_allclose(prog.run({"x": x})[0], ort_run(oracle, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert seen == {(False, True), (True, True), (True, False)}  # else, then/inner then, then/inner else


def test_loop_body_reads_a_name_defined_later(target):
    """acc = a0; M times: acc = acc + w, where w = 3 * v comes from a node listed after the Loop."""
    body = helper.make_graph([N("Add", ["acc_in", "w"], ["acc_out"]), N("Identity", ["cond_in"], ["cond_out"])],
                             "body", [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL),
                                      _vi("acc_in", [3])],
                             [_vi("cond_out", [], TensorProto.BOOL), _vi("acc_out", [3])])
    nodes = [N("Loop", ["M", "", "a0"], ["acc"], body=body), N("Mul", ["v", "three"], ["w"])]
    model = _model(nodes, [_vi("M", [], TensorProto.INT64), _vi("a0", [3]), _vi("v", [3])], [_vi("acc", [3])],
                   {"three": np.array(3.0, np.float32)})
    prog = mgx_graph.compile(model, target=target)
    rng = np.random.default_rng(2)
    for M in (3, 0, 5):
        feeds = {"M": np.array(M, np.int64), "a0": rng.normal(size=3).astype(np.float32),
                 "v": rng.normal(size=3).astype(np.float32)}
        np.testing.assert_allclose(prog.run(feeds)[0], ort_run(model, feeds)[0], rtol=1e-5, atol=1e-6)


def test_shuffled_data_dependent_shapes(target):
    """Shapes that depend on run-time values (a Reshape fed by computed dims, NonZero) with the nodes
    listed backwards: the program parsed up to the node that needs a value computes it."""
    nodes = [N("Transpose", ["idx"], ["out2"]), N("NonZero", ["r"], ["idx"]), N("Relu", ["x"], ["r"]),
             N("Reshape", ["x", "dims"], ["out1"]), N("Concat", ["rows", "minus1"], ["dims"], axis=0),
             N("Add", ["k", "zero"], ["rows"])]
    model = _model(nodes, [_vi("x", [4, 6]), _vi("k", [1], TensorProto.INT64)],
                   [_vi("out1", None), _vi("out2", None, TensorProto.INT64)],
                   {"zero": np.array([0], np.int64), "minus1": np.array([-1], np.int64)})
    prog = mgx_graph.compile(model, target=target)
    rng = np.random.default_rng(4)
    for k in (2, 3, 2, 8):
        feeds = {"x": rng.normal(size=(4, 6)).astype(np.float32), "k": np.array([k], np.int64)}
        got, want = prog.run(feeds), ort_run(model, feeds)
        for g, e in zip(got, want):
            assert g.shape == e.shape
            np.testing.assert_array_equal(g, e)


# -- cycles ----------------------------------------------------------------------------------------
def test_cycle_names_its_nodes(target):
    nodes = [N("Identity", ["t"], ["y"], name="after"), N("Add", ["x", "u"], ["t"], name="first"),
             N("Neg", ["t"], ["u"], name="second")]
    model = _model(nodes, [_vi("x", [2])], [_vi("y", [2])])
    assert "acyclic" in _ort_refuses(model)
    with pytest.raises(mgx_graph.ParseError) as e:
        mgx_graph.compile(model, target=target)
    msg = str(e.value)
    assert "graph 'g' has a cycle" in msg
    assert "'first' (Add)" in msg and "'second' (Neg)" in msg and "'after'" not in msg


def test_self_loop_is_a_cycle(target):
    model = _model([N("Add", ["x", "t"], ["t"], name="selfish"), N("Identity", ["t"], ["y"])],
                   [_vi("x", [2])], [_vi("y", [2])])
    assert "acyclic" in _ort_refuses(model)
    with pytest.raises(mgx_graph.ParseError, match=r"has a cycle: node 'selfish' \(Add\) -> node 'selfish'"):
        mgx_graph.compile(model, target=target)


def test_cycle_inside_a_branch(target):
    """Found even in a branch a constant condition never takes."""
    then_g = helper.make_graph([N("Add", ["x", "u"], ["t"], name="loop_a"), N("Neg", ["t"], ["u"], name="loop_b")],
                               "then", [], [_vi("t", [2])])
    else_g = helper.make_graph([N("Neg", ["x"], ["e"])], "else", [], [_vi("e", [2])])
    nodes = [N("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="branch")]
    model = _model(nodes, [_vi("x", [2])], [_vi("y", [2])], {"c": np.array(False)})
    _ort_refuses(model)
    with pytest.raises(mgx_graph.ParseError,
                       match=r"subgraph 'then' of node 'branch' \(If\) has a cycle: .*'loop_a'.*'loop_b'"):
        mgx_graph.compile(model, target=target)


# -- a tensor name defined twice --------------------------------------------------------------------
def _dup_two_nodes():
    return _model([N("Neg", ["x"], ["t"], name="first"), N("Abs", ["x"], ["t"], name="second"),
                   N("Identity", ["t"], ["y"])], [_vi("x", [2])], [_vi("y", [2])])


def _dup_graph_input():
    return _model([N("Neg", ["x"], ["x"], name="shadow"), N("Identity", ["x"], ["y"])],
                  [_vi("x", [2])], [_vi("y", [2])])


def _dup_initializer():
    return _model([N("Neg", ["x"], ["w"], name="shadow"), N("Add", ["x", "w"], ["y"])],
                  [_vi("x", [2])], [_vi("y", [2])], {"w": np.ones(2, np.float32)})


def _dup_same_node():
    return _model([N("Split", ["x"], ["t", "t"], axis=0, num_outputs=2, name="twice"),
                   N("Identity", ["t"], ["y"])], [_vi("x", [2])], [_vi("y", [1])])


def _dup_later_definer_listed_first():
    """The second definer is listed first: the error still names both (listing order decides)."""
    return _model([N("Identity", ["t"], ["y"]), N("Abs", ["x"], ["t"], name="first"),
                   N("Neg", ["x"], ["t"], name="second")], [_vi("x", [2])], [_vi("y", [2])])


def _dup_subgraph_shadows_outer():
    then_g = helper.make_graph([N("Mul", ["x", "x"], ["z"], name="inner")], "then", [], [_vi("z", [2])])
    else_g = helper.make_graph([N("Neg", ["x"], ["e"])], "else", [], [_vi("e", [2])])
    nodes = [N("Neg", ["x"], ["z"], name="outer"), N("ReduceSum", ["x"], ["s"], keepdims=0),
             N("Greater", ["s", "zero"], ["c"]),
             N("If", ["c"], ["y0"], then_branch=then_g, else_branch=else_g, name="branch"),
             N("Add", ["y0", "z"], ["y"])]
    return _model(nodes, [_vi("x", [2])], [_vi("y", [2])], {"zero": np.array(0.0, np.float32)})


DUPLICATES = {
    "two_nodes": (_dup_two_nodes, "t", r"node 'second' \(Abs\): output 't' is already defined by node 'first' \(Neg\)"),
    "graph_input": (_dup_graph_input, "x", r"node 'shadow' \(Neg\): output 'x' is already defined by graph input 'x'"),
    "initializer": (_dup_initializer, "w", r"node 'shadow' \(Neg\): output 'w' is already defined by initializer 'w'"),
    "same_node": (_dup_same_node, "t", r"node 'twice' \(Split\): output 't' is already defined by node 'twice'"),
    "listed_first": (_dup_later_definer_listed_first, "t",
                     r"node 'second' \(Neg\): output 't' is already defined by node 'first' \(Abs\)"),
    "subgraph": (_dup_subgraph_shadows_outer, "z",
                 r"node 'inner' \(Mul\) in subgraph 'then' of node 'branch' \(If\): output 'z' is already defined "
                 r"by node 'outer' \(Neg\) of an enclosing graph"),
}


@pytest.mark.parametrize("case", sorted(DUPLICATES))
def test_name_defined_twice(target, case):
    build, tensor, pattern = DUPLICATES[case]
    model = build()
    assert tensor in _ort_refuses(model)  # the oracle refuses it too
    with pytest.raises(mgx_graph.ParseError, match=pattern) as e:
        mgx_graph.compile(model, target=target)
    assert "SSA" in str(e.value)


def test_shadowing_onnxruntime_accepts(target):
    """Not duplicates: a branch output named as its If's output, the same name in sibling branches, and a
    Loop body input named as an outer tensor (the body reads its own)."""
    then_g = helper.make_graph([N("Mul", ["x", "x"], ["y"]), N("Neg", ["x"], ["t"])], "then", [], [_vi("y", [2])])
    else_g = helper.make_graph([N("Neg", ["x"], ["t"]), N("Add", ["t", "x"], ["e"])], "else", [], [_vi("e", [2])])
    body = helper.make_graph([N("Identity", ["cond"], ["cond_out"]), N("Add", ["x", "x"], ["acc_out"])], "body",
                             [_vi("i", [], TensorProto.INT64), _vi("cond", [], TensorProto.BOOL), _vi("x", [2])],
                             [_vi("cond_out", [], TensorProto.BOOL), _vi("acc_out", [2])])
    nodes = [N("ReduceSum", ["x"], ["s"], keepdims=0), N("Greater", ["s", "zero"], ["c"]),
             N("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
             N("Loop", ["M", "", "y"], ["acc"], body=body), N("Add", ["acc", "x"], ["out"])]
    model = _model(nodes, [_vi("x", [2]), _vi("M", [], TensorProto.INT64)], [_vi("out", [2])],
                   {"zero": np.array(0.0, np.float32)})
    prog = mgx_graph.compile(model, target=target)
    for x, M in (([1.0, 2.0], 3), ([-1.0, -2.0], 2), ([0.5, -3.0], 0)):
        feeds = {"x": np.array(x, np.float32), "M": np.array(M, np.int64)}
        np.testing.assert_allclose(prog.run(feeds)[0], _ort_session(model).run(None, feeds)[0], rtol=1e-6)


def test_undefined_input_names_the_node_and_the_name(target):
    model = _model([N("Add", ["x", "nowhere"], ["y"], name="reader")], [_vi("x", [2])], [_vi("y", [2])])
    assert "nowhere" in _ort_refuses(model)
    with pytest.raises(mgx_graph.ParseError, match=r"node 'reader' \(Add\): input 'nowhere' is not defined"):
        mgx_graph.compile(model, target=target)


def test_a_parser_registered_for_a_new_domain_is_used(target):
    """What a new op needs: a function registered with ``@parser``; unregistered ones in that domain
    stay UnsupportedOpError, and the message lists the registered ones."""
    from mgx_graph.onnx import op_parser

    @op_parser.parser("ScaleBy", domain="com.example.test")
    def _parse_scale_by(p, m, node, ins):
        k = p.lit(m, np.array(op_parser.attr(node, "k", 1.0), dtype=ins[0].shape.dtype))
        return p.add(m, "mul", [ins[0], k])

    def model(op_type):
        m = _model([N(op_type, ["x"], ["y"], domain="com.example.test", k=2.5)], [_vi("x", [3])], [_vi("y", [3])])
        m.opset_import.append(helper.make_opsetid("com.example.test", 1))
        return m

    try:
        x = np.array([1.0, -2.0, 0.5], np.float32)
        np.testing.assert_allclose(mgx_graph.compile(model("ScaleBy"), target=target).run({"x": x})[0], x * 2.5)
        with pytest.raises(mgx_graph.UnsupportedOpError, match=r"com.example.test::ScaleTo.*com.example.test::ScaleBy"):
            mgx_graph.compile(model("ScaleTo"), target=target)
    finally:
        op_parser._PARSERS.pop(("com.example.test", "ScaleBy"))
    with pytest.raises(mgx_graph.UnsupportedOpError, match=r"com.example.test::ScaleBy"):
        mgx_graph.compile(model("ScaleBy"), target=target)
