"""merge_dots folds the bias adds of a group only for a bias that varies along N alone: crafted models
whose addend varies along the rows, along a batch dim, broadcasts the dot's output to a higher rank, or
has another type keep their adds (checked on the parsed program with the pass run alone), and every
model's outputs equal onnxruntime CPU's with the whole pipeline, merge_dots on."""
import numpy as np
import pytest
from onnx import helper

import mgx_graph
from mgx_graph.onnx.onnx_parser import parse_onnx
from mgx_graph.passes import MergeDots

from irtools import run_pass
from util import make_model, ort_run

R = np.random.default_rng(29)
M, K, NS = 3, 8, (4, 6, 2)


def rand(*lens, dtype="float32"):
    return R.normal(size=lens).astype(dtype)


def _bias(kind, n):
    """The addend of the dot of N = ``n`` columns (x is [M, K], [2, M, K] for ``batch``)."""
    if kind == "vector":
        return rand(n)
    if kind == "scalar":
        return rand()
    if kind == "rows_equal":
        return np.repeat(rand(1, n), M, axis=0)
    if kind == "rows":
        return rand(M, n)
    if kind == "column":
        return rand(M, 1)
    if kind == "batch":
        return rand(2, 1, n)
    if kind == "higher_rank":
        return rand(2, M, n)
    raise ValueError(kind)


def biased_model(kind):
    """Three MatMuls of x by constant weights, each plus a constant addend of ``kind``, each read by a
    MatMul (so the adds stand alone: merge_dots may fold them)."""
    x_lens = (2, M, K) if kind == "batch" else (M, K)
    init, nodes, outs = {}, [], []
    for k, n in enumerate(NS):
        init.update({f"w{k}": rand(K, n), f"b{k}": _bias(kind, n), f"r{k}": rand(n, 5)})
        nodes += [helper.make_node("MatMul", ["x", f"w{k}"], [f"d{k}"]),
                  helper.make_node("Add", [f"d{k}", f"b{k}"] if k != 1 else [f"b{k}", f"d{k}"], [f"a{k}"]),
                  helper.make_node("MatMul", [f"a{k}", f"r{k}"], [f"y{k}"])]
        outs.append(f"y{k}")
    return make_model(nodes, {"x": np.zeros(x_lens, np.float32)}, outs, init), x_lens


FOLDED = {"vector": True, "scalar": True, "rows_equal": True, "rows": False, "column": False, "batch": False,
          "higher_rank": False}


@pytest.mark.parametrize("kind", sorted(FOLDED))
def test_only_a_bias_along_n_is_folded(kind):
    model, _ = biased_model(kind)
    prog = parse_onnx(model)
    run_pass(MergeDots(), prog)
    main = prog.get_main_module()
    merged = [i for i in main.instructions if i.op.name == "dot" and i.shape.lens[-1] == sum(NS)]
    adds = [i for i in main.instructions if i.op.name == "add"]
    assert len(merged) == 1, prog  # the three projections of x are one dot in every case
    assert len(adds) == (1 if FOLDED[kind] else 3), (kind, prog)


@pytest.mark.parametrize("kind", sorted(FOLDED))
def test_outputs_equal_onnxruntime(kind, target):
    model, x_lens = biased_model(kind)
    feeds = {"x": rand(*x_lens)}
    got = mgx_graph.compile(model, target=target).run(feeds)
    for g, w in zip(got, ort_run(model, feeds)):
        assert g.shape == w.shape, (kind, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_an_integer_addend_of_a_float_dot_is_refused_not_folded():
    """Add of float32 and int64 is no valid ONNX: the parser refuses it, naming the node, before any pass."""
    model, _ = biased_model("vector")
    for t in model.graph.initializer:
        if t.name == "b0":
            t.CopyFrom(helper.make_tensor("b0", 7, [NS[0]], list(range(NS[0]))))
    with pytest.raises(mgx_graph.errors.ParseError, match="Add"):
        mgx_graph.compile(model, target="ref")
