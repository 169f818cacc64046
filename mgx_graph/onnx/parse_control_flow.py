"""Control flow: If, Loop and Scan, their subgraphs parsed into submodules of the program
(``p.parse_subgraph``; outer-scope names stay visible inside them).

- ``If`` with a constant condition inlines the branch taken; when a branch cannot be compiled for
  these shapes (or the branches return different shapes) it specializes on the condition.
- ``Loop`` becomes a ``loop`` instruction; with scan outputs its trip count must be static, known from
  literals or specialized for (``trip_count:<node>``).
- ``Scan`` (opset >= 9) becomes a ``loop`` with a static trip count.

ONNX operator spec: https://onnx.ai/onnx/operators/
"""
from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from ..errors import ParseError, ShapeError, UnsupportedOpError
from ..ir.shape import Shape
from ..operators import make_op
from ..operators.dynamic import NeedsValue
from .op_parser import attr, check_axis, check_count, parser


def _tuple_elems(m, ins) -> list:
    """The elements of a tuple-valued instruction (``ins`` itself when it is not a tuple)."""
    if not isinstance(ins.shape, tuple):
        return [ins]
    return [m.add_instruction(make_op("get_tuple_elem", index=k), [ins]) for k in range(len(ins.shape))]


def _next_subgraph_id(p) -> int:
    n = p.sub_counter
    p.sub_counter += 1
    return n


@parser("If")
def _parse_if(p, m, node, ins):
    cond = ins[0]
    then_g, else_g = attr(node, "then_branch"), attr(node, "else_branch")
    if len(then_g.output) != len(else_g.output) or len(node.output) > len(then_g.output):
        raise p.err(f"then_branch has {len(then_g.output)} outputs and else_branch {len(else_g.output)}: expected "
                    f"the same count, at least the node's {len(node.output)}")
    if cond.op.name == "@literal":  # constant condition: inline the branch taken
        return p.inline_subgraph(m, then_g if bool(cond.op.value.reshape(-1)[0]) else else_g)
    n = _next_subgraph_id(p)
    made = []
    try:
        then_m = p.parse_subgraph(then_g, f"{m.name}:if{n}:then")
        made.append(then_m)
        else_m = p.parse_subgraph(else_g, f"{m.name}:if{n}:else")
        made.append(else_m)
        op = make_op("if")
        op.compute_shape([cond.shape], [then_m, else_m])
    except UnsupportedOpError:
        raise
    except (ShapeError, ParseError, NeedsValue):
        # a branch cannot be compiled for these shapes (or the branches return different shapes):
        # specialize on the condition and inline the branch taken
        for sub in made:
            p.program.remove_module(sub.name)
        taken = bool(np.asarray(p.specialize(cond, "value", "cond")).reshape(-1)[0])
        return p.inline_subgraph(m, then_g if taken else else_g)
    return _tuple_elems(m, m.add_instruction(op, [cond], [then_m, else_m]))


def _literal_true(ins) -> bool:
    return ins.op.name == "@literal" and bool(ins.op.value.reshape(-1)[0])


def _loop_trip_count(p, node, M, cond, sub, cond_name: str, n_carried: int) -> int:
    """The trip count of a Loop with scan outputs: static when ``M`` is a literal and the condition
    stays true, else the value specialized for (``trip_count:<node>``).  Raises NeedsValue with a
    guess when it is not known yet."""
    key = f"trip_count:{p.node_name}"
    ret = sub.get_return().inputs
    passthrough = ret[0] is sub.get_parameter(cond_name) or _literal_true(ret[0])
    if M.op.name == "@literal" and _literal_true(cond) and passthrough:
        return int(M.op.value.reshape(-1)[0])
    if key in p.known:
        p.guessed = True
        return int(np.asarray(p.known[key]))
    guess = int(M.op.value.reshape(-1)[0]) if M.op.name == "@literal" and int(M.op.value.reshape(-1)[0]) < (1 << 40) \
        else 1
    scan_name = node.output[1 + n_carried] if len(node.output) > 1 + n_carried else ""
    if scan_name in p.inferred and p.inferred[scan_name]:
        guess = int(p.inferred[scan_name][0])  # onnx shape inference knows the trip count
    raise NeedsValue(p.node_name, "trip_count", p.node_name, guess)


@parser("Loop")
def _parse_loop(p, m, node, ins):
    body = attr(node, "body")
    M = ins[0] if len(ins) > 0 and ins[0] is not None else p.lit(m, np.array(1 << 62, np.int64))
    cond = ins[1] if len(ins) > 1 and ins[1] is not None else p.lit(m, np.array(True))
    v_init = list(ins[2:])
    if len(body.input) != 2 + len(v_init) or len(body.output) < 1 + len(v_init):
        raise p.err(f"body has {len(body.input)} inputs and {len(body.output)} outputs: expected 2 + {len(v_init)} "
                    f"inputs (iteration, condition, the loop-carried values) and at least 1 + {len(v_init)} outputs")
    names = [i.name for i in body.input]
    params = [(names[0], Shape("int64", [])), (names[1], Shape("bool", []))] + \
             [(nm, Shape(v.shape.dtype, v.shape.lens)) for nm, v in zip(names[2:], v_init)]
    sub = p.parse_subgraph(body, f"{m.name}:loop{_next_subgraph_id(p)}", params)
    n_carried = len(v_init)
    n_scan = len(body.output) - 1 - n_carried
    trip = _loop_trip_count(p, node, M, cond, sub, names[1], n_carried) if n_scan > 0 else -1
    op = make_op("loop", param_names=names, trip_count=trip, n_carried=n_carried)
    loop = m.add_instruction(op, [M, cond] + v_init, [sub])
    loop.meta["trip_key"] = f"trip_count:{p.node_name}"
    return _tuple_elems(m, loop)


def _scan_body(p, m, body, states, scans, in_axes, in_dirs, L: int):
    """The Scan body as a loop body: parameters (iteration, condition, states), each scan input's
    slice gathered at the iteration (from the end for reverse directions), then the body's nodes.
    Returns (submodule, its parameter names)."""
    n_state = len(states)
    iter_name, cond_name = f"{p.node_name}:iter", f"{p.node_name}:cond"
    names = [iter_name, cond_name] + [i.name for i in body.input[:n_state]]
    sub = p.program.create_module(f"{m.name}:scan{_next_subgraph_id(p)}")
    saved = dict(p.values)
    saved_node, saved_name = p.node, p.node_name
    try:
        it = sub.add_parameter(iter_name, Shape("int64", []))
        sub.add_parameter(cond_name, Shape("bool", []))
        for vi, st in zip(body.input[:n_state], states):
            p.values[vi.name] = sub.add_parameter(vi.name, Shape(st.shape.dtype, st.shape.lens))
        p.cur_module = sub
        for vi, x, a, d in zip(body.input[n_state:], scans, in_axes, in_dirs):
            a = a % x.shape.ndim
            idx = it
            if d:
                idx = p.add(sub, "sub", [p.lit(sub, np.array(L - 1, np.int64)), it])
            p.values[vi.name] = p.add(sub, "gather", [x, idx], axis=a)
        for t in body.initializer:
            p.values[t.name] = sub.add_literal(numpy_helper.to_array(t))
        p.parse_nodes(sub, body)
        rets = [sub.add_literal(np.array(True))] + [p.values[o.name] for o in body.output]
        sub.add_return(rets)
    finally:
        p.values = saved
        p.node, p.node_name = saved_node, saved_name
        p.cur_module = m
    return sub, names


def _scan_outputs(p, m, ys, out_axes, out_dirs) -> list:
    """Stacked scan outputs (iterations on axis 0) reversed / moved to their axes."""
    res = []
    for y, a, d in zip(ys, out_axes, out_dirs):
        if d:
            y = p.add(m, "slice", [y], axes=[0], starts=[-1], ends=[-(1 << 62)], steps=[-1])
        r = y.shape.ndim
        a = check_axis(p, a, r, "scan_output_axes")
        if a:
            perm = list(range(1, a + 1)) + [0] + list(range(a + 1, r))
            y = p.add(m, "transpose", [y], permutation=perm)
        res.append(y)
    return res


@parser("Scan")
def _parse_scan(p, m, node, ins):
    """Scan (opset >= 9) as a ``loop`` with a static trip count: each iteration gathers its slice of the
    scan inputs, and the stacked scan outputs are moved to their axes / directions afterwards."""
    if p.opset < 9:
        raise UnsupportedOpError(p.node_name, "Scan", "", p.opset, "opset 8 (batched Scan)")
    body = attr(node, "body")
    n_scan_in = attr(node, "num_scan_inputs")
    if not 1 <= n_scan_in <= len(ins) or len(body.input) != len(ins) or len(body.output) < len(ins) - n_scan_in:
        raise p.err(f"'num_scan_inputs' = {n_scan_in} with {len(ins)} inputs and a body of {len(body.input)} inputs, "
                    f"{len(body.output)} outputs: expected 1..{len(ins)} scan inputs and a body input per node input")
    n_state = len(ins) - n_scan_in
    states, scans = list(ins[:n_state]), list(ins[n_state:])
    n_scan_out = len(body.output) - n_state
    in_axes = check_count(p, attr(node, "scan_input_axes") or [0] * n_scan_in, n_scan_in, "scan_input_axes",
                          "one per scan input")
    in_axes = [check_axis(p, a, x.shape.ndim, "scan_input_axes") for a, x in zip(in_axes, scans)]
    in_dirs, out_axes, out_dirs = (
        check_count(p, attr(node, k) or [0] * n, n, k, why) for k, n, why in (
            ("scan_input_directions", n_scan_in, "one per scan input"),
            ("scan_output_axes", n_scan_out, "one per scan output"),
            ("scan_output_directions", n_scan_out, "one per scan output")))
    for k, v in (("scan_input_directions", in_dirs), ("scan_output_directions", out_dirs)):
        if any(d not in (0, 1) for d in v):
            raise p.err(f"'{k}' = {v} must hold 0 (forward) or 1 (reverse) values")
    lens = {x.shape.lens[a % x.shape.ndim] for x, a in zip(scans, in_axes)}
    if len(lens) != 1:
        raise p.err(f"scan inputs have different lengths {sorted(lens)}")
    L = lens.pop()
    sub, names = _scan_body(p, m, body, states, scans, in_axes, in_dirs, L)
    op = make_op("loop", param_names=names, trip_count=L, n_carried=n_state)
    loop = m.add_instruction(op, [p.lit(m, np.array(L, np.int64)), p.lit(m, np.array(True))] + states, [sub])
    loop.meta["trip_key"] = f"trip_count:{p.node_name}"
    outs = _tuple_elems(m, loop)
    return outs[:n_state] + _scan_outputs(p, m, outs[n_state:], out_axes, out_dirs)
