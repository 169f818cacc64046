"""memory_coloring: no two buffers whose lives overlap share bytes (property test over random DAGs), and
programs still compute the right values with the packed arena."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from onnx import helper

import mgx_graph
from mgx_graph.passes.memory_coloring import _align
from util import make_model, ort_run


@st.composite
def random_dag(draw):
    n = draw(st.integers(3, 18))
    vals = {"x": 4, "w": 2}  # name -> width; every value is [3, width]
    nodes = []
    for k in range(n):
        kind = draw(st.sampled_from(["unary", "binary", "reduce", "concat", "slice"]))
        names = sorted(vals)
        a = draw(st.sampled_from(names))
        out = f"v{k}"
        if kind == "unary":
            nodes.append(helper.make_node(draw(st.sampled_from(["Neg", "Tanh", "Abs", "Sigmoid"])), [a], [out]))
            vals[out] = vals[a]
        elif kind == "binary":
            same = [v for v in names if vals[v] == vals[a] or vals[v] == 1]
            b = draw(st.sampled_from(same))
            nodes.append(helper.make_node(draw(st.sampled_from(["Add", "Mul", "Sub"])), [a, b], [out]))
            vals[out] = vals[a]
        elif kind == "reduce":
            nodes.append(helper.make_node("ReduceSum", [a, "ax1"], [out], keepdims=1))
            vals[out] = 1
        elif kind == "concat":
            b = draw(st.sampled_from(names))
            nodes.append(helper.make_node("Concat", [a, b], [out], axis=1))
            vals[out] = vals[a] + vals[b]
        else:
            if vals[a] < 2:
                nodes.append(helper.make_node("Neg", [a], [out]))
                vals[out] = vals[a]
            else:
                nodes.append(helper.make_node("Slice", [a, "s0", "s1", "ax1"], [f"{out}s"]))
                nodes.append(helper.make_node("Neg", [f"{out}s"], [out]))
                vals[out] = 1
    outs = draw(st.lists(st.sampled_from(sorted(vals)), min_size=1, max_size=3, unique=True))
    return nodes, outs, vals


@settings(max_examples=60, deadline=None)
@given(random_dag(), st.booleans())
def test_live_buffers_never_overlap(dag, hip_graph):
    nodes, outs, widths = dag
    outs = [o for o in outs if o not in ("x", "w")] or [nodes[-1].output[0]]
    fin = []
    for o in outs:
        fin.append(helper.make_node("Identity", [o], [f"out_{o}"]))
    init = {"ax1": np.array([1], np.int64), "s0": np.array([0], np.int64), "s1": np.array([1], np.int64)}
    model = make_model(nodes + fin, {"x": np.zeros((3, 4), np.float32), "w": np.zeros((3, 2), np.float32)},
                       [f"out_{o}" for o in outs], init)
    prog = mgx_graph.compile(model, target="ref", hip_graph=hip_graph, min_partition_size=2)
    plan = prog.memory_plan
    bufs = plan.buffers
    for i, a in enumerate(bufs):
        assert a.offset + _align(a.size) <= plan.arena_bytes
        for b in bufs[i + 1:]:
            if a.start <= b.end and b.start <= a.end:  # lives overlap
                assert a.offset + _align(a.size) <= b.offset or b.offset + _align(b.size) <= a.offset, (a, b)
    rng = np.random.default_rng(len(nodes))
    feeds = {"x": rng.normal(size=(3, 4)).astype(np.float32), "w": rng.normal(size=(3, 2)).astype(np.float32)}
    want = ort_run(model, feeds)
    for _ in range(3 if hip_graph else 1):
        for g, e in zip(prog.run(feeds), want):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("unfused")
def test_packing_reuses_dead_buffers():
    """A chain of n equal-size kernels needs two buffers (ping-pong), not n."""
    nodes = []
    cur = "x"
    for k in range(12):
        nodes.append(helper.make_node("Neg" if k % 2 else "Tanh", [cur], [f"v{k}"]))
        cur = f"v{k}"
    nodes.append(helper.make_node("Identity", [cur], ["y"]))
    model = make_model(nodes, {"x": np.zeros((64, 64), np.float32)}, ["y"])
    prog = mgx_graph.compile(model, target="ref")
    assert prog.memory_plan.arena_bytes == 2 * 64 * 64 * 4
    assert prog.stats()["scratch_bytes"] == prog.memory_plan.arena_bytes
