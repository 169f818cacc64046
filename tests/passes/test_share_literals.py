"""share_literals: a program compiled with ``share_literals=owner`` reads the owner's literals from the
owner's memory (same bytes; or, for a dot weight, the owner's transposed copy through a transpose view).
Hand-built programs, then small ONNX models against onnxruntime and numpy; the owner's release."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mgx_graph
from mgx_graph import Program
from mgx_graph.compiler import compile_program
from mgx_graph.errors import CompileError, MgxError, ParameterError
from mgx_graph.passes.share_literals import META, LiteralTable, ShareLiterals

from irtools import S, lit, op, run_pass
from util import ort_run

R = np.random.default_rng(5)
W = R.normal(size=(64, 32)).astype(np.float32)     # 8 KiB: shared
B = R.normal(size=(32,)).astype(np.float32)        # 128 bytes: too small to share


def _dense(rows: int, weight=W) -> Program:
    """``y = dot(x [rows, 64], weight) + B``."""
    p = Program()
    m = p.get_main_module()
    x = m.add_parameter("x", S("float32", rows, 64))
    d = m.add_instruction(op("dot"), [x, lit(m, weight)])
    b = m.add_instruction(op("multibroadcast", out_lens=[rows, 32]), [lit(m, B)])
    m.add_return([m.add_instruction(op("add"), [d, b])])
    return p


def _literals(prog: Program) -> list:
    return [i for m in prog.module_order() for i in m.instructions if i.op.name == "@literal"]


def test_same_bytes_are_read_from_the_owner_ir():
    owner, prog = _dense(1), _dense(4, W.copy())
    table = LiteralTable(owner)
    assert [i.op.value.shape for i in table.instructions] == [(64, 32)]  # the bias is under MIN_BYTES
    run_pass(ShareLiterals(table), prog)
    shared = [i for i in _literals(prog) if META in i.meta]
    assert len(shared) == 1 and shared[0].op.value is table.instructions[0].op.value  # one host array too
    assert [i.op.name for i in shared[0].outputs] == ["dot"]


def test_a_transposed_owner_weight_becomes_a_transpose_view_of_it():
    owner = Program()
    m = owner.get_main_module()
    m.add_return([lit(m, np.ascontiguousarray(W.T))])  # the gpu's gemv layout: [N, K]
    prog = _dense(4)
    run_pass(ShareLiterals(LiteralTable(owner)), prog)
    dot = next(i for i in prog.get_main_module().instructions if i.op.name == "dot")
    view = dot.inputs[1]
    assert view.op.name == "transpose" and view.inputs[0].op.name == "@literal" and META in view.inputs[0].meta
    np.testing.assert_array_equal(np.transpose(view.inputs[0].op.value, (1, 0)), W)


@pytest.mark.parametrize("transposed", [False, True], ids=["rows", "gemv_layout"])
def test_a_column_block_of_an_owner_weight_becomes_a_slice_view_of_it(transposed):
    """merge_dots may concatenate other weights in the owner ([W | V] there, W alone here)."""
    wide = np.concatenate([R.normal(size=(64, 16)).astype(np.float32), W], axis=1)  # W at columns 16..47
    owner = Program()
    m = owner.get_main_module()
    m.add_return([lit(m, np.ascontiguousarray(wide.T) if transposed else wide)])
    prog = _dense(4)
    run_pass(ShareLiterals(LiteralTable(owner)), prog)
    dot = next(i for i in prog.get_main_module().instructions if i.op.name == "dot")
    chain, v = [], dot.inputs[1]
    while v.op.name != "@literal":
        chain.append(v.op.name)
        v = v.inputs[0]
    assert chain == (["slice", "transpose"] if transposed else ["slice"]) and META in v.meta
    sl = dot.inputs[1].op
    assert (sl.starts, sl.ends) == ([16], [48])


def test_a_transposed_match_needs_dot_readers_and_equal_bytes():
    owner = Program()
    m = owner.get_main_module()
    m.add_return([lit(m, np.ascontiguousarray(W.T))])
    p = Program()
    m = p.get_main_module()
    x = m.add_parameter("x", S("float32", 64, 32))
    w = lit(m, W)
    m.add_return([m.add_instruction(op("add"), [x, w])])  # read by an add: no view in its place
    run_pass(ShareLiterals(LiteralTable(owner)), p)
    assert not any(META in i.meta for i in _literals(p))
    other = W.copy()
    other[7, 3] += 1  # one element off: the sampled key may match, the bytes do not
    q = _dense(4, other)
    run_pass(ShareLiterals(LiteralTable(_dense(1))), q)
    assert not any(META in i.meta for i in _literals(q))


def test_compiled_borrower_reads_the_owner_memory_and_matches_numpy(target):
    owner = compile_program(_dense(1), target=target)
    prog = compile_program(_dense(4), target=target, share_literals=owner)
    st = prog.memory_plan
    assert st.shared_literal_bytes == W.nbytes and st.literal_bytes < W.nbytes
    x = R.normal(size=(4, 64)).astype(np.float32)
    np.testing.assert_allclose(prog.run({"x": x})[0], x @ W + B, rtol=1e-5, atol=1e-5)
    x1 = x[:1]
    np.testing.assert_allclose(owner.run({"x": x1})[0], x1 @ W + B, rtol=1e-5, atol=1e-5)
    owner.release()  # the borrower goes with it: its shared literals are the owner's memory
    with pytest.raises(MgxError, match="released"):
        prog.run({"x": x})


def test_compiled_borrower_reads_a_column_block_and_matches_numpy(target):
    wide = np.concatenate([R.normal(size=(64, 16)).astype(np.float32), W], axis=1)
    owner = compile_program(_dense_wide(wide), target=target)
    prog = compile_program(_dense(4), target=target, share_literals=owner)
    assert prog.memory_plan.shared_literal_bytes == wide.nbytes  # the owner's literal it reads a block of
    x = R.normal(size=(4, 64)).astype(np.float32)
    np.testing.assert_allclose(prog.run({"x": x})[0], x @ W + B, rtol=1e-5, atol=1e-5)


def _dense_wide(wide) -> Program:
    p = Program()
    m = p.get_main_module()
    x = m.add_parameter("x", S("float32", 1, 64))
    m.add_return([m.add_instruction(op("dot"), [x, lit(m, wide)])])
    return p


def _matmul_model(rows, dims=None):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims or [rows, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm", [x], [y],
                          [numpy_helper.from_array(W, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def test_onnx_models_share_weights_and_match_onnxruntime(target):
    one = mgx_graph.compile(_matmul_model(1), target=target)
    many = mgx_graph.compile(_matmul_model(8), target=target, share_literals=one)
    assert many.memory_plan.shared_literal_bytes == W.nbytes and many.memory_plan.literal_bytes == 0
    x = R.normal(size=(8, 64)).astype(np.float32)
    np.testing.assert_allclose(many.run({"x": x})[0], ort_run(_matmul_model(8), {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_saved_borrower_loads_with_its_own_copy(tmp_path):
    owner = mgx_graph.compile(_matmul_model(1), target="ref")
    many = mgx_graph.compile(_matmul_model(8), target="ref", share_literals=owner)
    many.save(tmp_path / "m.mxr")
    owner.release()
    loaded = mgx_graph.load(tmp_path / "m.mxr")
    assert loaded.memory_plan.shared_literal_bytes == 0 and loaded.memory_plan.literal_bytes >= W.nbytes
    x = R.normal(size=(8, 64)).astype(np.float32)
    np.testing.assert_allclose(loaded.run({"x": x})[0], x @ W, rtol=1e-5, atol=1e-5)


def test_refused_owners():
    with pytest.raises(ParameterError, match="share_literals must be a compiled static program"):
        mgx_graph.compile(_matmul_model(8), target="ref", share_literals="model.onnx")
    owner = mgx_graph.compile(_matmul_model(1), target="ref")
    with pytest.raises(CompileError, match="share_literals needs static shapes"):
        mgx_graph.compile(_matmul_model(8, ["n", 64]), target="ref", share_literals=owner)
    dynamic = mgx_graph.compile(_matmul_model(8, ["n", 64]), target="ref")
    with pytest.raises(ParameterError, match="share_literals must be a compiled static program"):
        mgx_graph.compile(_matmul_model(8), target="ref", share_literals=dynamic)
    owner.release()
    with pytest.raises(ParameterError, match="was released"):
        mgx_graph.compile(_matmul_model(8), target="ref", share_literals=owner)
