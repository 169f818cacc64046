"""fuse_converts on hand-built programs (a convert to the same type goes, a widening inner convert is
skipped, a narrowing one stays) and in a compiled ref program against numpy."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import mgx_graph
from mgx_graph import Program
from mgx_graph.passes.fuse_converts import FuseConverts, exact_in

from irtools import S, assert_same_ir, op, run_pass


def _main(*shapes):
    prog = Program()
    m = prog.get_main_module()
    return prog, m, [m.add_parameter(f"x{k}", s) for k, s in enumerate(shapes)]


def test_same_type_convert_goes_and_widening_pair_becomes_one():
    prog, m, (x, y) = _main(S("float16", 2, 3), S("float32", 2, 3))
    a = m.add_instruction(op("convert", target_type="float32"), [x])
    a = m.add_instruction(op("convert", target_type="float64"), [a])  # float16 -> float64 directly
    b = m.add_instruction(op("convert", target_type="float32"), [y])  # float32 -> float32: y itself
    m.add_return([m.add_instruction(op("neg"), [a]), m.add_instruction(op("abs"), [b])])
    before = len(m.instructions)

    want, w, (wx, wy) = _main(S("float16", 2, 3), S("float32", 2, 3))
    wa = w.add_instruction(op("convert", target_type="float64"), [wx])
    w.add_return([w.add_instruction(op("neg"), [wa]), w.add_instruction(op("abs"), [wy])])
    got = run_pass(FuseConverts(), prog)
    assert_same_ir(got, want)
    assert len(got.get_main_module().instructions) == before - 2


def test_narrowing_or_shared_inner_convert_stays():
    prog, m, (x, y) = _main(S("float32", 4), S("int8", 4))
    a = m.add_instruction(op("convert", target_type="float16"), [x])  # rounds: must stay
    a = m.add_instruction(op("convert", target_type="float32"), [a])
    b = m.add_instruction(op("convert", target_type="int32"), [y])  # read twice: stays
    c = m.add_instruction(op("convert", target_type="float32"), [b])
    m.add_return([a, b, c])
    before = [str(i.op) for i in m.instructions]
    got = run_pass(FuseConverts(), prog)
    assert [str(i.op) for i in got.get_main_module().instructions] == before


@pytest.mark.parametrize("a,b,exact", [("float16", "float32", True), ("float32", "float16", False),
                                       ("int8", "float16", True), ("int32", "float32", False),
                                       ("int32", "float64", True), ("int64", "float64", False),
                                       ("bool", "int8", True), ("uint8", "int8", False)])
def test_exact_in_agrees_with_a_round_trip(a, b, exact):
    assert exact_in(a, b) is exact
    info = np.iinfo(a) if np.dtype(a).kind in "iu" else (np.finfo(a) if np.dtype(a).kind == "f" else None)
    vals = (np.array([0, 1], a) if info is None else
            np.array([info.min, info.max, 1, 0], a) if np.dtype(a).kind in "iu" else
            np.array([info.min, info.max, info.eps, info.tiny, 1 / 3], a))
    with np.errstate(over="ignore", invalid="ignore"):
        assert np.array_equal(vals.astype(b).astype(a), vals) or not exact


def _cast_chain_model():
    """x float16 -> Cast float32 -> Cast float64 -> Relu; x -> Cast float16 (its own type) -> Neg."""
    nodes = [helper.make_node("Cast", ["x"], ["a"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["a"], ["b"], to=TensorProto.DOUBLE),
             helper.make_node("Relu", ["b"], ["y"]),
             helper.make_node("Cast", ["x"], ["c"], to=TensorProto.FLOAT16),
             helper.make_node("Neg", ["c"], ["z"])]
    g = helper.make_graph(nodes, "casts", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [3, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None),
                           helper.make_tensor_value_info("z", TensorProto.FLOAT16, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _simplified_converts(disabled=()) -> int:
    """The converts left after the pipeline's ``simplify`` group (before fusions hide them in kernels)."""
    from mgx_graph.onnx import parse_onnx
    from mgx_graph.passes import PassContext, PassManager, PipelineOptions
    from mgx_graph.targets import pipeline

    prog = parse_onnx(_cast_chain_model())
    groups = [g for g in pipeline("ref", PipelineOptions()) if g.name == "simplify"]
    PassManager(groups, PassContext("ref"), disabled=set(disabled)).run(prog)
    return sum(i.op.name == "convert" for i in prog.get_main_module().instructions)


def test_pipeline_drops_converts_and_values_equal_numpy():
    assert _simplified_converts({"fuse_converts"}) == 2  # the parser already drops the Cast to float16
    assert _simplified_converts() == 1
    x = np.random.default_rng(3).normal(size=(3, 5)).astype(np.float16)
    y, z = mgx_graph.compile(_cast_chain_model(), target="ref", hip_graph=False).run({"x": x})
    np.testing.assert_array_equal(y, np.maximum(x.astype(np.float32).astype(np.float64), 0))
    np.testing.assert_array_equal(z, -x)
