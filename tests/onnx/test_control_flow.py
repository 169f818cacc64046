"""If and Loop on every target, eager and with graph regions inside their bodies, against onnxruntime."""
import re

import numpy as np
import pytest
from onnx import TensorProto, helper

import mgx_graph
from util import make_model, ort_run

R = np.random.default_rng(11)


def if_model():
    """y = tanh(if sum(x) > 0: x * 2 + 1 (4 kernels) else: (x - 2) * x); the branches read x from outside."""
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t1"]), helper.make_node("Add", ["t1", "one"], ["t2"]),
                                helper.make_node("Sigmoid", ["t2"], ["t3"]), helper.make_node("Mul", ["t3", "x"], ["t_out"])],
                               "then", [], [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, [3, 4])])
    else_g = helper.make_graph([helper.make_node("Sub", ["x", "two"], ["e1"]), helper.make_node("Mul", ["e1", "x"], ["e_out"])],
                               "else", [], [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, [3, 4])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y0"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Tanh", ["y0"], ["y"])]
    init = {"two": np.array(2.0, np.float32), "one": np.array(1.0, np.float32), "zero": np.array(0.0, np.float32)}
    return make_model(nodes, {"x": np.zeros((3, 4), np.float32)}, ["y"], init)


@pytest.mark.usefixtures("unfused")
@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_if_both_branches(target, hip_graph):
    model = if_model()
    prog = mgx_graph.compile(model, target=target, hip_graph=hip_graph, min_partition_size=2)
    text = prog.print()
    assert "if(" in text and "main:if0:then" in text
    if hip_graph:
        assert "main:if0:then:graph_launch" in text  # a region inside the branch body
    for i in range(8):
        x = R.normal(size=(3, 4)).astype(np.float32) + (1.0 if i % 2 else -1.0)
        np.testing.assert_allclose(prog.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
    if hip_graph:
        st = prog.stats()
        assert st["fallbacks"] == 0 and st["captures"] >= 2 and st["replays"] >= 2


def loop_model(scan=True):
    """acc = a0; for i < M: acc = acc + i * w; scan: acc * i."""
    outs = [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [3])]
    nodes = [helper.make_node("Cast", ["i"], ["fi"], to=1), helper.make_node("Mul", ["fi", "w"], ["iw"]),
             helper.make_node("Add", ["acc_in", "iw"], ["acc_out"]), helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    if scan:
        nodes.append(helper.make_node("Mul", ["acc_out", "fi"], ["sc"]))
        outs.append(helper.make_tensor_value_info("sc", TensorProto.FLOAT, [3]))
    body = helper.make_graph(nodes, "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                                             helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                                             helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [3])], outs)
    y = ["acc", "scans"] if scan else ["acc"]
    model = make_model([helper.make_node("Loop", ["M", "", "a0"], y, body=body)],
                       {"M": np.array(3, np.int64), "a0": np.zeros(3, np.float32)}, y,
                       {"w": np.array([1.0, -0.5, 0.25], np.float32)})
    return model


@pytest.mark.parametrize("scan", [False, True], ids=["carried", "scan"])
@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_loop_trip_counts(target, scan, hip_graph):
    model = loop_model(scan)
    prog = mgx_graph.compile(model, target=target, hip_graph=hip_graph, min_partition_size=2)
    for M in (4, 4, 2, 6, 0):
        feeds = {"M": np.array(M, np.int64), "a0": R.normal(size=3).astype(np.float32)}
        got, want = prog.run(feeds), ort_run(model, feeds)
        for g, e in zip(got, want):
            assert g.shape == e.shape
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    if scan:  # the scan length is data-dependent: one specialization per trip count seen
        assert prog.stats()["specialization_compiles"] >= 4


def test_loop_with_condition_from_the_body(target):
    """while acc < 10: acc = acc * 2 (termination decided on the device, read by the host each iteration)."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["a_in", "two"], ["a_out"]), helper.make_node("Less", ["a_out", "ten"], ["c_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("a_in", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), helper.make_tensor_value_info("a_out", TensorProto.FLOAT, [])])
    model = make_model([helper.make_node("Loop", ["", "c", "a0"], ["a"], body=body)],
                       {"c": np.array(True), "a0": np.array(1.0, np.float32)}, ["a"],
                       {"two": np.array(2.0, np.float32), "ten": np.array(10.0, np.float32)})
    prog = mgx_graph.compile(model, target=target)
    for a0 in (1.0, 0.3, 7.0, 11.0):
        feeds = {"c": np.array(True), "a0": np.array(a0, np.float32)}
        np.testing.assert_allclose(prog.run(feeds)[0], ort_run(model, feeds)[0])
