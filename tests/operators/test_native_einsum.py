"""Einsum lowered to diagonal views, reduce_sum, transposes and batched dot, against onnxruntime CPU
(numpy.einsum where onnxruntime rejects an equation), on each target, eager and in a graph."""
import numpy as np
import pytest
from onnx import helper

import mgx_graph
from native_util import run_native
from util import make_model

R = np.random.default_rng(5)

CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bij,bkj->bik", [(2, 3, 4), (2, 5, 4)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("ij->j", [(3, 4)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("iij->ji", [(3, 3, 2)]),
    ("i,i", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),
    ("...i,...i->...", [(2, 3, 4), (3, 4)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 8), (2, 3, 5, 8)]),
    ("bhqk,bhkd->bqhd", [(2, 3, 4, 5), (2, 3, 5, 8)]),
    ("ijk,ikl,lm->jm", [(2, 3, 4), (2, 4, 5), (5, 3)]),
    ("abc,cd,de->abe", [(2, 3, 4), (4, 5), (5, 2)]),
    ("ij,ij->ij", [(3, 4), (3, 4)]),
    ("ijk,jk->i", [(2, 3, 4), (3, 4)]),
    ("ab,cd->abcd", [(2, 3), (4, 2)]),
    ("iji,j->i", [(3, 4, 3), (4,)]),
]


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("eq,shapes", CASES, ids=[c[0] for c in CASES])
def test_einsum(target, hip_graph, eq, shapes):
    feeds = {f"x{k}": R.uniform(-1, 1, size=s).astype(np.float32) for k, s in enumerate(shapes)}
    model = make_model([helper.make_node("Einsum", list(feeds), ["y"], equation=eq)], feeds, ["y"], opset=12)
    want = np.einsum(eq, *feeds.values()).astype(np.float32)
    repeated = any(len(set(t)) < len(t) for t in eq.split("->")[0].replace("...", "").split(","))
    prog = run_native(model, feeds, target, hip_graph, ["diagonal"] if repeated else [], tol=(1e-5, 1e-5),
                      expect=[np.asarray(want)])
    assert ("diagonal" in prog.print()) == repeated


@pytest.mark.parametrize("eq,shapes", [c for c in CASES if "..." not in c[0] and c[0] != "iji,j->i"][:12])
def test_einsum_matches_onnxruntime(target, eq, shapes):
    feeds = {f"x{k}": R.uniform(-1, 1, size=s).astype(np.float32) for k, s in enumerate(shapes)}
    model = make_model([helper.make_node("Einsum", list(feeds), ["y"], equation=eq)], feeds, ["y"], opset=12)
    run_native(model, feeds, target, False, [], tol=(1e-5, 1e-5))


def test_einsum_broadcast_size_one_label(target):
    feeds = {"a": R.uniform(-1, 1, size=(2, 1)).astype(np.float32), "b": R.uniform(-1, 1, size=(3,)).astype(np.float32)}
    model = make_model([helper.make_node("Einsum", ["a", "b"], ["y"], equation="ij,j->i")], feeds, ["y"], opset=12)
    run_native(model, feeds, target, False, ["dot"], expect=[np.einsum("ij,j->i", feeds["a"], feeds["b"])])


@pytest.mark.parametrize("dtype,tol", [(np.float64, (1e-12, 1e-12)), (np.float16, (2e-2, 2e-2)), (np.int64, (0, 0))])
def test_einsum_types(target, dtype, tol):
    feeds = {"a": R.uniform(-3, 3, size=(2, 3, 4)).astype(dtype), "b": R.uniform(-3, 3, size=(2, 4, 3)).astype(dtype)}
    model = make_model([helper.make_node("Einsum", ["a", "b"], ["y"], equation="bij,bjk->bik")], feeds, ["y"],
                       opset=12)
    run_native(model, feeds, target, False, ["dot"], tol=tol)


@pytest.mark.parametrize("eq,shapes,why", [("ij,jk,kl->il", [(2, 3), (3, 4)], "input terms"),
                                           ("i1,j->ij", [(2, 3), (3,)], "bad term"),
                                           ("ij->k", [(2, 3)], "output labels"),
                                           ("ijk,jk->ik", [(2, 3), (3, 4)], "does not match"),
                                           ("...ij->ij", [(4, 2, 3)], "keep the '...'"),
                                           ("ij,jk->ik", [(2, 3), (4, 5)], "sizes 3 and 4")])
def test_einsum_bad_equation_names_the_node(eq, shapes, why):
    feeds = {f"x{k}": np.zeros(s, np.float32) for k, s in enumerate(shapes)}
    node = helper.make_node("Einsum", list(feeds), ["y"], equation=eq)
    model = make_model([node], feeds, ["y"], opset=12, output_types={"y": 1})
    with pytest.raises(mgx_graph.ParseError, match=f"Einsum.*{why}"):
        mgx_graph.compile(model, target="ref", hip_graph=False)
