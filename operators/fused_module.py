"""The submodule of a fused instruction: its parameters in binding order, the parts of a
``fused_horizontal`` module, the scatter of a ``fused_scatternd`` module.  Shared by the fused ops,
their code generators and the fusion passes."""
from __future__ import annotations

from typing import Any

from ..errors import ShapeError

VIEW_NAMES = ("transpose", "reshape", "squeeze", "unsqueeze", "multibroadcast", "slice")


def module_params(sub) -> list:
    """Parameters of ``sub`` in binding order: ``x0, x1, ...`` by number (other names after, sorted)."""
    def key(p):
        n = p.op.parameter
        return (0, int(n[1:]), "") if n[:1] == "x" and n[1:].isdigit() else (1, 0, n)

    return sorted((p for p in sub.instructions if p.op.name == "@param"), key=key)


def parts_of(sub) -> list:
    """``[(returned instruction, data parameter position or None)]`` of a fused_horizontal submodule:
    the position (in :func:`module_params` order) of each scatter part's data, None for an
    elementwise part.  Raises ShapeError naming the module when it returns fewer than two values, a
    scatter with a reduction, a scatter whose data is not a parameter read by it alone, a parameter
    or literal as a part, or two parts over the same data parameter."""
    ret = sub.get_return()
    outs = list(ret.inputs) if ret is not None else []
    if len(outs) < 2:
        raise ShapeError(f"fused_horizontal: module '{sub.name}' must return two values or more, returns {len(outs)}")
    pos = {id(p): k for k, p in enumerate(module_params(sub))}
    parts: list[tuple[Any, int | None]] = []
    used: set[int] = set()
    for v in outs:
        if v.op.name in ("@param", "@literal"):
            raise ShapeError(f"fused_horizontal: module '{sub.name}' returns {v.op.name}: every part is computed")
        if v.op.name != "scatternd":
            parts.append((v, None))
            continue
        data = v.inputs[0]
        if v.op.reduction != "none":
            raise ShapeError(f"fused_horizontal: module '{sub.name}' returns scatternd[reduction={v.op.reduction}]; "
                             f"only reduction none is fused")
        if id(data) not in pos or any(c is not v for c in data.outputs) or v.inputs.count(data) != 1 \
                or outs.count(v) != 1 or id(data) in used:
            raise ShapeError(f"fused_horizontal: module '{sub.name}': the data of each scatter must be a parameter "
                             f"read by that scatter alone")
        used.add(id(data))
        parts.append((v, pos[id(data)]))
    return parts


def scatter_of(sub):
    """The ``scatternd`` a fused_scatternd submodule returns; ShapeError naming the module when the
    module does not return one scatternd (reduction ``none``) over parameter ``x0``, read by nothing
    else, with updates computed inside the module."""
    ret = sub.get_return()
    outs = ret.inputs if ret is not None else []
    scat = outs[0] if len(outs) == 1 else None
    params = module_params(sub)
    if scat is None or scat.op.name != "scatternd" or scat.op.reduction != "none" or not params:
        got = ", ".join(str(o.op) for o in outs) or "nothing"
        raise ShapeError(f"fused_scatternd: module '{sub.name}' must return one scatternd[reduction=none], "
                         f"returns {got}")
    x0 = params[0]
    if scat.inputs[0] is not x0 or any(c is not scat for c in x0.outputs) or scat.inputs.count(x0) != 1:
        raise ShapeError(f"fused_scatternd: module '{sub.name}': the scatter's data must be parameter "
                         f"{x0.op.parameter}, read by the scatter alone")
    if scat.inputs[2].op.name in ("@param", "@literal"):
        raise ShapeError(f"fused_scatternd: module '{sub.name}': the updates are not computed in the module")
    return scat
