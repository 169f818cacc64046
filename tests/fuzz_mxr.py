"""Mutations of saved programs (``.mxr`` zip archives) for the fuzz tests: the zip bytes, ``program.json``'s
fields, the ``arrays/*.npy`` members (header and data) and the member list.  Each returns the new archive
bytes and a description; ``semantic`` tells whether the change may legitimately change the outputs."""
from __future__ import annotations

import io
import json
import zipfile

import numpy as np
from hypothesis import strategies as st

DEEP = "\u0000deep\u0000"  # replaced by a deeply nested list in the written JSON
# program.json fields the outputs do not depend on (the rest of "program", the arrays and model.onnx do)
NOT_SEMANTIC_KEYS = ("label", "meta", "mgx_graph_version", "options", "result", "memory", "metadata")
VALUES = [None, True, False, 0, -1, 1, 7, 2 ** 31, 2 ** 63, -(2 ** 63), 2 ** 80, 1.5, -0.0, 1e308, "", "x", "a0",
          "@param", "add", [], [0], [-1, 0], [0, 10 ** 6], {}, {"tuple": []}, {"dict": [[1]]}, {"array": "a0"},
          {"array": "../../x"}, {"array": "nope"}, {"float": "nan"}, {"float": "bogus"}, {"scalar": ["float32", 1]},
          {"scalar": ["object", 1]}, {"dtype": "V8"}, {"shape": ["float32", [2 ** 40], [1]]},
          {"shape": ["float32", [-1], [1]]}, {"onnx": ["onnx.NodeProto", "!!"]}, {"module": {}}, DEEP]


def read_members(data: bytes) -> dict:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def write_members(members) -> bytes:
    """An archive of ``members`` (``[(name, bytes)]`` or a dict; names may repeat), program.json deflated."""
    buf = io.BytesIO()
    items = members.items() if isinstance(members, dict) else members
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, b in items:
            zf.writestr(zipfile.ZipInfo(name), b,
                        compress_type=zipfile.ZIP_DEFLATED if name == "program.json" else zipfile.ZIP_STORED)
    return buf.getvalue()


def _paths(v, path=()):
    """Every (path, value) of a JSON document, the root first."""
    yield path, v
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _paths(x, path + (k,))
    elif isinstance(v, list):
        for k, x in enumerate(v):
            yield from _paths(x, path + (k,))


def mutate_json(draw, members: dict) -> tuple[dict, str, bool]:
    doc = json.loads(members["program.json"])
    paths = list(_paths(doc))
    path, old = paths[draw(st.integers(0, len(paths) - 1))]
    kind = draw(st.sampled_from(["replace", "replace", "replace", "remove", "duplicate", "swap"]))
    if not path:
        kind = "replace"
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    if kind == "remove":
        del parent[path[-1]]
        what = "removed"
    elif kind == "duplicate" and isinstance(old, list) and old:
        old.append(old[draw(st.integers(0, len(old) - 1))])
        what = "an element duplicated"
    else:
        new = _swapped(old) if kind == "swap" else draw(st.sampled_from(VALUES))
        if path:
            parent[path[-1]] = new
        else:
            doc = new
        what = f"= {new!r}"[:120]
    text = json.dumps(doc)
    if DEEP in text or json.dumps(DEEP) in text:
        text = text.replace(json.dumps(DEEP), "[" * 100000 + "]" * 100000)
    members = dict(members, **{"program.json": text.encode()})
    semantic = not any(k in NOT_SEMANTIC_KEYS for k in path if isinstance(k, str))
    return members, f"program.json {'/'.join(map(str, path))} {what}", semantic


def _swapped(v):
    """The same content in another JSON type."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, str):
        return [v]
    if isinstance(v, list):
        return {str(k): x for k, x in enumerate(v)}
    if isinstance(v, dict):
        return list(v.values())
    return 0


NPY_HEADERS = ["{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }",
               "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }",
               "{'descr': '<f4', 'fortran_order': False, 'shape': (), }",
               "{'descr': '<f4', 'fortran_order': True, 'shape': (4, 3), }",
               "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }",
               "{'descr': '|O', 'fortran_order': False, 'shape': (3,), }",
               "{'descr': '<U5', 'fortran_order': False, 'shape': (2,), }",
               "{'descr': 'V8', 'fortran_order': False, 'shape': (2,), }",
               "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,), }",
               "{'descr': '>f4', 'fortran_order': False, 'shape': (12,), }",
               "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 2), }",
               "{'descr': '<f4', 'shape': (3,), }", "{}", "[1, 2]", "__import__('os')", "{'descr': '<f4'"]


def _npy(header: str, data: bytes, version: int = 1) -> bytes:
    h = header.encode("latin1")
    pad = 64 - (10 + len(h) + 1) % 64
    h = h + b" " * pad + b"\n"
    return b"\x93NUMPY" + bytes([version, 0]) + len(h).to_bytes(2, "little") + h + data


def mutate_npy(draw, members: dict) -> tuple[dict, str, bool]:
    names = sorted(n for n in members if n.startswith("arrays/"))
    if not names:
        return members, "no arrays", False
    name = draw(st.sampled_from(names))
    old = members[name]
    arr = np.lib.format.read_array(io.BytesIO(old), allow_pickle=False)
    kind = draw(st.sampled_from(["header", "header", "data-cut", "data-extend", "array", "raw-header-length"]))
    if kind == "header":
        header = draw(st.sampled_from(NPY_HEADERS))
        new = _npy(header, arr.tobytes())
        what = header
    elif kind == "data-cut":
        cut = draw(st.integers(0, max(len(old) - 1, 0)))
        new, what = old[:cut], f"cut to {cut} bytes"
    elif kind == "data-extend":
        new, what = old + b"\x00" * draw(st.integers(1, 64)), "data extended"
    elif kind == "raw-header-length":
        n = draw(st.sampled_from([0, 1, 0xFFFF]))
        new, what = old[:8] + n.to_bytes(2, "little") + old[10:], f"header length {n}"
    else:
        shape = draw(st.sampled_from([(), (0,), (1,), arr.shape[::-1], arr.shape + (1,), (arr.size + 1,)]))
        dtype = draw(st.sampled_from([arr.dtype, np.dtype("float64"), np.dtype("int64"), np.dtype("bool"),
                                      np.dtype("float16"), np.dtype("U3")]))
        buf = io.BytesIO()
        np.save(buf, np.resize(arr, shape).astype(dtype), allow_pickle=False)
        new, what = buf.getvalue(), f"an array {dtype}{list(shape)}"
    return dict(members, **{name: new}), f"{name}: {what}", True


def mutate_members(draw, members: dict) -> tuple[list, str, bool]:
    """Drop, rename, repeat or add a member (names that climb out of the archive included)."""
    items = list(members.items())
    kind = draw(st.sampled_from(["drop", "rename", "repeat", "add"]))
    k = draw(st.integers(0, len(items) - 1))
    name = items[k][0]
    if kind == "drop":
        del items[k]
        return items, f"{name} dropped", True
    new = draw(st.sampled_from(["arrays/../../escape.npy", "/abs/program.json", "arrays/a9.npy", "program.json",
                                "model.onnx", "arrays/a0.npy", "arrays/\u00e9.npy", "arrays/.npy"]))
    if kind == "rename":
        items[k] = (new, items[k][1])
        return items, f"{name} renamed {new}", True
    if kind == "repeat":
        items.append(items[k])
        return items, f"{name} twice", True
    items.append((new, items[k][1]))
    return items, f"{name} copied as {new}", True


def expected_shapes(prog) -> list | None:
    """``[(dtype, lens)]`` a static program declares for its outputs, or None (dynamic)."""
    try:
        return [(np.dtype(s.dtype), tuple(s.lens)) for s in prog.get_output_shapes()]
    except Exception:  # noqa: BLE001  (a dynamic program has no fixed output shapes)
        return None
