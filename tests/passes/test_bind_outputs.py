"""bind_outputs and detect_alias on hand-built programs: which outputs are written in place."""
import json

import numpy as np
import pytest

from mgx_graph import CompileError, Program
from mgx_graph.passes import BindOutputs, PassContext
from mgx_graph.passes.bind_outputs import detect_alias

from irtools import S, assert_same_ir, lit, op, run_pass


def _cache_update(read_after=False, transposed=False):
    """present = scatternd(past, [[1]], update) (through a transpose of past when ``transposed``)."""
    prog = Program()
    m = prog.get_main_module()
    past = m.add_parameter("past", S("float32", 3, 2))
    upd = m.add_parameter("update", S("float32", 1, 3 if transposed else 2))
    src = m.add_instruction(op("transpose", permutation=[1, 0]), [past]) if transposed else past
    w = m.add_instruction(op("scatternd"), [src, lit(m, [[1]], "int64"), upd])
    out = m.add_instruction(op("transpose", permutation=[1, 0]), [w]) if transposed else w
    outs, names = [out], ["present"]
    if read_after:
        outs.append(m.add_instruction(op("neg"), [past]))
        names.append("other")
    m.add_return(outs, names)
    return prog, w


def test_scatter_into_the_cache_is_bound():
    prog, w = _cache_update()
    p = BindOutputs({"present": "past"})
    ctx = PassContext("ref")
    run_pass(p, prog, ctx=ctx)
    want, ww = _cache_update()
    ww.meta.update(bind_param="past", bind_layout=S("float32", 3, 2))  # the cache's own layout
    assert_same_ir(prog, want, meta=("bind_param", "bind_layout"))
    assert ctx.result.alias == {"present": "past"} and p.bound == {"present": "past"} and p.skipped == {}


def test_writer_behind_layout_views_takes_the_parameter_layout():
    """present = transpose(scatternd(transpose(past))): the scatter writes the transposed view of the
    cache, so its output is that strided layout and the returned transpose is the cache itself."""
    prog, w = _cache_update(transposed=True)
    run_pass(BindOutputs({"present": "past"}), prog)
    want, ww = _cache_update(transposed=True)
    layout = S("float32", 2, 3, strides=(1, 2))
    ww.meta.update(bind_param="past", bind_layout=layout)
    ww.shape = layout
    out = ww.outputs[0]
    out.shape = out.op.compute_shape([layout])
    assert_same_ir(prog, want, meta=("bind_param", "bind_layout"))
    ret = prog.get_main_module().get_return()
    assert ret.inputs[0].shape == S("float32", 3, 2)  # lands in the cache with its own layout


def test_a_read_after_the_write_is_refused_naming_the_reader():
    prog, _ = _cache_update(read_after=True)
    before = prog.print()
    with pytest.raises(CompileError, match=r"'past' is read by neg after scatternd writes 'present'"):
        BindOutputs({"present": "past"}).apply(prog, None)
    assert prog.print() == before


def test_not_strict_records_why_a_pair_is_skipped():
    prog, w = _cache_update(read_after=True)
    p = BindOutputs({"present": "past", "nothing": "past"}, strict=False)
    ctx = PassContext("ref")
    run_pass(p, prog, ctx=ctx)
    assert p.bound == {} and ctx.result.alias == {}
    assert "read by neg" in p.skipped["present"]
    assert "'nothing' is not an output" in p.skipped["nothing"]
    assert ctx.result.alias_skipped == p.skipped
    assert "bind_param" not in w.meta


@pytest.mark.parametrize("case, message", [
    ("param", "produced by @param, which cannot write in place"),
    ("shape", r"output 'present' \(float32\[2\]\) and parameter 'past' \(float32\[3,2\]\) differ"),
    ("unknown", "'cache' is not a parameter"),
])
def test_impossible_pairs_raise(case, message):
    prog = Program()
    m = prog.get_main_module()
    past = m.add_parameter("past", S("float32", 3, 2))
    small = m.add_parameter("small", S("float32", 2))
    out = {"param": past, "shape": m.add_instruction(op("neg"), [small]),
           "unknown": m.add_instruction(op("neg"), [past])}[case]
    m.add_return([out], ["present"])
    with pytest.raises(CompileError, match=message):
        BindOutputs({"present": "cache" if case == "unknown" else "past"}).apply(prog, None)


def _named_io(outputs: dict, params: dict):
    prog = Program()
    m = prog.get_main_module()
    ps = {n: m.add_parameter(n, s) for n, s in params.items()}
    first = next(iter(ps.values()))
    outs = [m.add_instruction(op("convert", target_type=s.dtype), [first]) if s.lens == first.shape.lens else
            m.add_instruction(op("multibroadcast", out_lens=list(s.lens)), [lit(m, [0.0])])
            for s in outputs.values()]
    m.add_return(outs, list(outputs))
    return prog


def test_detect_alias_pairs_kv_cache_names_with_equal_shapes():
    f = S("float32", 1, 2, 4, 8)
    prog = _named_io({"logits": S("float32", 1, 2, 4, 8), "present.0.key": f, "present_state": f,
                      "conv_cache_out": f, "h_out": f, "present.1.key": f, "present_bad": S("float32", 1, 2, 4, 7)},
                     {"past_key_values.0.key": f, "past_state": f, "conv_cache_in": f, "h_in": f,
                      "past_bad": f})
    assert detect_alias(prog) == {"present.0.key": "past_key_values.0.key", "present_state": "past_state",
                                  "conv_cache_out": "conv_cache_in", "h_out": "h_in"}


def test_detect_alias_prefers_model_metadata():
    f = S("float32", 2)
    prog = _named_io({"present_a": f, "b": f}, {"past_a": f, "c": f})
    meta = {"mgx_graph.alias": json.dumps({"b": "c", "gone": "c"})}
    assert detect_alias(prog, meta) == {"b": "c"}
