"""ONNX models of a few bytes whose parse-time values would be large: Range, ConstantOfShape and OneHot's
depth positions over FOLD_LIMIT elements are computed at run time, never made literals while parsing.
Parsing one of 30M elements allocates little (tracemalloc) and makes no literal over FOLD_LIMIT; one
just over FOLD_LIMIT compiles and runs to onnxruntime's outputs (on ref, and on gpu in the gpu test)."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from onnx import TensorProto as TP, helper as h

import mgx_graph
from mgx_graph.ir.fold import FOLD_LIMIT
from mgx_graph.onnx.onnx_parser import parse_onnx
from util import ort_run

BIG = 30_000_000  # elements: 120 MB of float32 (240 MB while numpy computes it in float64)
SMALL_PEAK = 16 << 20


def _model(node, inits, inputs=(), out_type=TP.FLOAT):
    g = h.make_graph([node], "g", list(inputs), [h.make_tensor_value_info("y", out_type, None)], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 18)], ir_version=10)  # onnxruntime 1.18+ reads it


def range_model(n, dtype=TP.FLOAT, start=0.5, delta=0.25):
    return _model(h.make_node("Range", ["a", "b", "c"], ["y"]),
                  [h.make_tensor("a", dtype, [], [start]), h.make_tensor("b", dtype, [], [start + n * delta]),
                   h.make_tensor("c", dtype, [], [delta])], out_type=dtype)


def constant_of_shape_model(n):
    return _model(h.make_node("ConstantOfShape", ["s"], ["y"], value=h.make_tensor("v", TP.FLOAT, [1], [2.5])),
                  [h.make_tensor("s", TP.INT64, [2], [n // 1000, 1000])])


def onehot_model(n):
    return _model(h.make_node("OneHot", ["i", "d", "v"], ["y"]),
                  [h.make_tensor("d", TP.INT64, [1], [n]), h.make_tensor("v", TP.FLOAT, [2], [0, 1])],
                  inputs=[h.make_tensor_value_info("i", TP.INT64, [3])])


MODELS = {"range": range_model, "range_int32": lambda n: range_model(n, TP.INT32, -7, 3),
          "constant_of_shape": constant_of_shape_model, "onehot": onehot_model}


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_a_tiny_model_does_not_allocate_its_large_value_while_parsing(kind):
    data = MODELS[kind](BIG).SerializeToString()
    assert len(data) < 120
    tracemalloc.start()
    try:
        prog = parse_onnx(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < SMALL_PEAK, peak
    assert prog.get_output_shapes()[0].elements() >= BIG - 1
    literals = [i.shape.elements() for m in prog.module_order() for i in m if i.op.name == "@literal"]
    assert max(literals) <= FOLD_LIMIT, literals


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("n", [1000, FOLD_LIMIT + 5])
def test_values_equal_onnxruntime_below_and_above_the_fold_limit(kind, n):
    model = MODELS[kind](n)
    feeds = {"i": np.array([3, -1, n + 2], np.int64)} if kind == "onehot" else {}
    got = mgx_graph.compile(model, target="ref").run(feeds)[0]
    want = ort_run(model, feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_values_over_the_fold_limit_equal_onnxruntime_on_gpu(gpu_target, kind):
    n = FOLD_LIMIT + 5
    model = MODELS[kind](n)
    feeds = {"i": np.array([3, -1, n + 2], np.int64)} if kind == "onehot" else {}
    got = mgx_graph.compile(model, target=gpu_target).run(feeds)[0]
    want = ort_run(model, feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
