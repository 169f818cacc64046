"""Saved programs (.mxr) with crafted program.json fields: each malformed field is a ParseError naming
the file and the field (expected vs given), never a raw numpy / json / protobuf / recursion error,
and the process stays usable (no file descriptor or thread left behind; a good file still loads and
matches onnxruntime).  A sweep replaces, deletes and duplicates every field of a few saved programs
and requires a ParseError or a program that runs (or refuses its inputs) with typed errors."""
import base64
import copy
import json
import os
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import mgx_graph
from mgx_graph import env as mgx_env
from test_compiled_program import _chain
from test_graph_launch import chain_model
from untrusted_zip import members_of, stored, write_zip
from util import ort_run

GARBAGE = base64.b64encode(b"\xff\xff\xff\xff\x0fgarbage bytes").decode()
X = np.random.default_rng(7).normal(size=(3, 4)).astype(np.float32)


def attr_model():
    """y = softmax(transpose(x), axis=1): ops with attributes."""
    g = helper.make_graph([helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
                           helper.make_node("Softmax", ["t"], ["y"], axis=1)], "attrs",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def add_model():
    w = onnx.numpy_helper.from_array(np.array([0.5, -1, 2, 0.25], np.float32), "w")
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "add",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


UNFUSED = {"MIGRAPHX_DISABLE_PASSES": "fuse_kernels"}
PROGRAMS = {  # name: (model, compile options, environment)
    "chain": (lambda: chain_model(3), {}, {}),  # a fused op keeping its module
    "attrs": (attr_model, {}, UNFUSED),
    "graph": (lambda: chain_model(6), dict(hip_graph=True, warmup=1), UNFUSED),  # submodules
    "alias": (add_model, dict(alias={"y": "x"}), {}),  # bind_param / bind_layout
    "dynamic": (lambda: _chain(["n", 4]), {}, {}),
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{name: (members {name: bytes}, program.json as a dict, model)} of the programs above."""
    out = {}
    for name, (make, kw, env) in PROGRAMS.items():
        path = tmp_path_factory.mktemp("saved") / f"{name}.mxr"
        model = make()
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            mgx_env._reset_for_tests()  # variables are read once per process
            mgx_graph.compile(model, target="ref", **kw).save(path)
        mgx_env._reset_for_tests()
        raw = members_of(path)
        out[name] = (raw, json.loads(raw["program.json"]), model)
    return out


def crafted(tmp_path, saved, name, edit=None, text=None, fname="bad.mxr"):
    raw, doc, _ = saved[name]
    doc = copy.deepcopy(doc)
    if edit is not None:
        edit(doc)
    members = {k: stored(v) for k, v in raw.items()}
    members["program.json"] = stored(text if text is not None else json.dumps(doc).encode())
    write_zip(tmp_path / fname, members)
    return tmp_path / fname


def ins(doc, op, module=0):
    return next(i for i in doc["program"]["modules"][module]["instructions"] if i["op"] == op)


def options(doc):
    return dict(doc["options"]["dict"])


def set_option(key, value):
    def edit(doc):
        doc["options"]["dict"] = [[k, value if k == key else v] for k, v in doc["options"]["dict"]]
        if key not in options(doc):
            doc["options"]["dict"].append([key, value])
    return edit


def nested(n):
    v = 0
    for _ in range(n):
        v = [v]
    return v


def deep_json(n: int) -> bytes:
    return (b'{"format": "mgx_graph program", "format_version": 1, "kind": "static", "program": {"modules": '
            + b"[" * n + b"]" * n + b"}}")


def set_meta(key, value):
    return lambda d: ins(d, "add").update(meta={"dict": [[k, v] for k, v in ins(d, "add")["meta"]["dict"]
                                                         if k != key] + [[key, value]]})


CASES = [
    # (program, edit, expected message after the file name)
    ("attrs", lambda d: d.update(format_version=True), r"format version True"),
    ("attrs", lambda d: d.update(format_version=1.0), r"format version 1\.0"),
    ("attrs", lambda d: ins(d, "@param").update(shape={"shape": ["float32", [3, 4], [-4, 1]]}),
     r"shape strides: expected at most 64 non-negative ints"),
    ("attrs", lambda d: ins(d, "@param").update(shape={"shape": ["float32", [3, 4], [0, 0]]}),
     r"parameter 'x' must have a standard \(packed\) layout"),
    ("attrs", lambda d: ins(d, "@param").update(shape={"shape": ["float128", [3, 4], [4, 1]]}),
     r"dtype 'float128' is not a tensor type"),
    ("attrs", lambda d: ins(d, "@param").update(shape={"shape": ["foo", [3, 4], [4, 1]]}),
     r"dtype 'foo' is not a tensor type"),
    ("attrs", lambda d: ins(d, "@param").update(shape={"shape": ["float32", [-3, 4], [4, 1]]}),
     r"shape lens: expected at most 64 non-negative ints"),
    ("attrs", lambda d: ins(d, "@param").update(shape={"shape": ["float32", [2 ** 40, 2 ** 40], [2 ** 40, 1]]}),
     r"spans more than 2\*\*63 - 1 bytes"),
    ("attrs", lambda d: ins(d, "@param").update(shape={"shape": ["float32", [3, 4], [4]]}),
     r"shape with 2 lens and 1 strides"),
    ("attrs", lambda d: ins(d, "transpose").update(attrs={"onnx": ["onnx.NodeProto", GARBAGE]}),
     r"an onnx\.NodeProto value is not a valid protobuf"),
    ("attrs", lambda d: ins(d, "transpose").update(attrs={"onnx": ["onnx.NodeProto", "not base64!"]}),
     r"an onnx\.NodeProto value is not valid base64"),
    ("attrs", lambda d: ins(d, "transpose").update(attrs={"onnx": ["onnx.FunctionProto", ""]}),
     r"unknown onnx message type 'onnx\.FunctionProto'"),
    ("attrs", lambda d: ins(d, "transpose").update(attrs={"dict": [["permutation", "abc"]]}),
     r"instruction main:@\d+ \(transpose\)|compute_shape fails|does not rebuild"),
    ("attrs", lambda d: ins(d, "transpose").update(attrs={"dict": [["permutation", [0, 0]]]}),
     r"transpose|compute_shape"),
    ("attrs", lambda d: ins(d, "softmax").update(attrs={"dict": [["axis", 7]]}), r"softmax|compute_shape"),
    ("attrs", lambda d: ins(d, "softmax").update(attrs={"dict": [["axis", nested(70)]]}),
     r"nested deeper than 64 levels"),
    ("attrs", set_option("capture_mode", "turbo"),
     r"compile option 'capture_mode': expected one of \(None, 'thread_local', 'global', 'relaxed'\), given 'turbo'"),
    ("attrs", set_option("warmup", "2"), r"compile option 'warmup': expected an int >= 0, given '2'"),
    ("attrs", set_option("hip_graph", 1), r"compile option 'hip_graph': expected a bool, given '1'"),
    ("attrs", set_option("max_graphs", -1), r"compile option 'max_graphs': expected None or an int >= 1"),
    ("attrs", set_option("evil", True), r"unknown compile options \['evil'\]"),
    ("attrs", lambda d: d["program"]["modules"][0].update(output_names=["y", "y2", "y3"]),
     r"module main: output_names lists 3 names for the 1 values its @return returns"),
    ("attrs", lambda d: d["program"]["modules"][0].update(output_names=[]),
     r"module main: output_names lists 0 names for the 1 values its @return returns"),
    ("attrs", lambda d: d["program"]["modules"][0].update(output_names="y"),
     r"output_names: expected a list of str"),
    ("attrs", lambda d: (ins(d, "@return").update(inputs=ins(d, "@return")["inputs"] * 2),
                         d["program"]["modules"][0].update(output_names=["y", "y"])),
     r"output_names: each name once \(as an ONNX graph's outputs\), given 'y' 2 times"),
    ("attrs", lambda d: ins(d, "softmax").update(inputs=[[0, 3]]), r"defined after it"),
    ("attrs", lambda d: ins(d, "softmax").update(inputs=[[0, 99]]), r"bad reference \(IndexError"),
    ("attrs", lambda d: ins(d, "softmax").update(inputs=[[0, -1]]), r"bad reference .*non-negative ints"),
    ("attrs", lambda d: ins(d, "softmax").update(inputs=[[7, 0]]), r"bad reference \(IndexError"),
    ("attrs", lambda d: ins(d, "softmax").update(inputs=[[True, 1]]), r"bad reference .*non-negative ints"),
    ("attrs", lambda d: ins(d, "softmax").update(modules=["nowhere"]), r"bad reference \(KeyError"),
    ("attrs", lambda d: ins(d, "softmax").update(op=["softmax"]), r"op: expected a str"),
    ("attrs", lambda d: ins(d, "softmax").update(label={"x": 1}), r"label: expected a str"),
    ("attrs", lambda d: ins(d, "softmax").pop("shape"), r"field 'shape' is missing"),
    ("attrs", lambda d: ins(d, "@param").update(attrs={"dict": [["parameter", 5]]}),
     r"expected a parameter name and a shape"),
    ("attrs", lambda d: ins(d, "softmax").update(meta={"dict": [["on_host", "yes"]]}),
     r"metadata 'on_host': expected a bool, given 'yes'"),
    ("attrs", lambda d: ins(d, "softmax").update(meta={"dict": [["evil", 1]]}), r"unknown metadata 'evil'"),
    ("attrs", lambda d: ins(d, "softmax").update(shape={"float": [1]}), r"malformed float"),
    ("attrs", lambda d: ins(d, "softmax").update(shape={"scalar": ["object", 1]}), r"malformed scalar"),
    ("attrs", lambda d: ins(d, "softmax").update(shape={"tuple": 5}), r"malformed tuple: expected a list"),
    ("attrs", lambda d: ins(d, "softmax").update(shape={"dict": [[[1], 2]]}), r"malformed value \(TypeError"),
    ("attrs", lambda d: ins(d, "softmax").update(shape={"evil": 1}), r"unknown value tag 'evil'"),
    ("attrs", lambda d: ins(d, "softmax").update(shape={"a": 1, "b": 2}), r"malformed value"),
    ("attrs", lambda d: d["program"].update(modules=d["program"]["modules"] * 2), r"two modules named 'main'"),
    ("attrs", lambda d: d["program"]["modules"][0].update(name="other"), r"no module 'main'"),
    ("attrs", lambda d: d["program"].update(symbolic_inputs={"dict": [["x", [-1]]]}),
     r"input 'x': expected a list of dim indices"),
    ("attrs", lambda d: d.update(result={"dict": [["target", "ref"]]}), r"compile result: field 'hip_graph' is "
                                                                        r"missing"),
    ("attrs", lambda d: d["result"]["dict"].__setitem__(1, ["hip_graph", "no"]),
     r"compile result field 'hip_graph': expected a bool"),
    ("attrs", lambda d: d.update(program=[]), r"a static program without its 'program' field"),
    ("attrs", lambda d: ins(d, "@literal" if any(i["op"] == "@literal" for i in
                                                 d["program"]["modules"][0]["instructions"]) else "@param")
     .update(op="@literal", attrs={"dict": [["value", 5]]}), r"\(@literal\): value: expected an array"),
    ("graph", lambda d: ins(d, "graph_launch").update(modules=["main"]), r"encloses it \(a cycle\)"),
    ("graph", lambda d: ins(d, "graph_launch")["meta"]["dict"].__setitem__(1, ["fixed_inputs", []]),
     r"input placement lists"),
    ("graph", lambda d: ins(d, "mul", 1).update(inputs=[[1, 0]]), r"mul|compute_shape"),
    ("chain", lambda d: ins(d, "pointwise")["attrs"]["dict"][0][1]["module"]["instructions"][3].update(inputs=[]),
     r"attribute _module \(module main:pointwise0\):@3 mul: compute_shape fails"),
    ("chain", lambda d: ins(d, "pointwise")["attrs"]["dict"][0][1]["module"]["instructions"][3].update(inputs=[0, 5]),
     r"inputs: expected indices of earlier instructions \(0 to 2\)"),
    ("chain", lambda d: ins(d, "pointwise")["attrs"]["dict"][0][1]["module"]["instructions"][3].update(shape=1),
     r"shape: expected a shape or a tuple of shapes, given int"),
    ("alias", set_meta("bind_param", "nope"), r"metadata 'bind_param': no parameter 'nope' in module main"),
    ("alias", set_meta("bind_layout", {"shape": ["float32", [3, 4], [0, 0]]}),
     r"has shape float_type, \{3, 4\}, \{4, 1\} but|bind_layout"),
    ("alias", lambda d: (set_meta("bind_layout", {"shape": ["float32", [3, 9], [9, 1]]})(d),
                         ins(d, "add").update(shape={"shape": ["float32", [3, 9], [9, 1]]})),
     r"metadata 'bind_layout' .* is not a layout of what the op computes"),
    ("alias", lambda d: ins(d, "add").update(inputs=[]), r"compute_shape fails|add"),
    ("dynamic", set_option("capture_mode", "turbo"), r"compile option 'capture_mode'"),
    ("dynamic", set_option("input_dims", {"dict": [["x", [2 ** 70, 4]]]}), r"member model\.onnx: parameter 'x'"),
    ("dynamic", set_option("max_specializations", 0), r"compile option 'max_specializations': expected an int >= 1"),
    ("dynamic", set_option("model", "x"), r"unknown compile options \['model'\]"),
]


@pytest.mark.parametrize("case", range(len(CASES)), ids=lambda k: f"{CASES[k][0]}-{k}")
def test_a_crafted_field_is_a_parse_error_naming_it(tmp_path, saved, case):
    name, edit, msg = CASES[case]
    path = crafted(tmp_path, saved, name, edit)
    with pytest.raises(mgx_graph.ParseError, match=r"bad\.mxr: (.*)?(" + msg + ")"):
        mgx_graph.load(path)


@pytest.mark.parametrize("text, msg", [
    (deep_json(100_000), r"program\.json nests deeper than JSON is read here|program\.json is not valid JSON"),
    (deep_json(500), r"nested deeper than 64 levels"),
    (b'{"format": "mgx_graph program", "format_version": 1, "kind": "static", "n": ' + b"9" * 5000 + b"}",
     r"program\.json is not valid JSON"),
    (b"\xff\xfe{}", r"program\.json is not valid JSON"),
])
def test_a_program_json_that_is_not_json_to_read(tmp_path, saved, text, msg):
    with pytest.raises(mgx_graph.ParseError, match=r"bad\.mxr: (.*)?(" + msg + ")"):
        mgx_graph.load(crafted(tmp_path, saved, "attrs", text=text))


BAD_VALUES = [None, -1, 2 ** 70, "x", [], {}, [[-1]], True, 1.5, nested(80), {"array": "a0"},
              {"onnx": ["onnx.NodeProto", "!!"]}, {"shape": ["float32", [-1], [1]]}]


def leaves(v, path=()):
    if path:
        yield path
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    for k, x in items:
        yield from leaves(x, path + (k,))


def variants(doc):
    for path in leaves(doc):
        parent = doc
        for p in path[:-1]:
            parent = parent[p]
        for bad in BAD_VALUES:
            yield path, lambda d, path=path, bad=bad: _at(d, path).__setitem__(path[-1], copy.deepcopy(bad))
        if isinstance(parent, dict):
            yield path, lambda d, path=path: _at(d, path).pop(path[-1])
        else:
            yield path, lambda d, path=path: _at(d, path).append(copy.deepcopy(_at(d, path)[path[-1]]))


def _at(d, path):
    for p in path[:-1]:
        d = d[p]
    return d


def fds():
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0


@pytest.mark.parametrize("name", ["attrs", "alias", "chain"])
def test_every_field_swept_gives_a_parse_error_or_a_working_program(tmp_path, saved, name):
    _, doc, model = saved[name]
    before_fds, before_threads = fds(), threading.active_count()
    refused = loaded = 0
    for path, edit in variants(doc):
        d = copy.deepcopy(doc)
        edit(d)
        f = crafted(tmp_path, saved, name, text=json.dumps(d).encode())
        try:
            prog = mgx_graph.load(f)
        except mgx_graph.ParseError:
            refused += 1
            continue
        except mgx_graph.MgxError as e:  # typed, but a loaded file's fault must be a ParseError
            pytest.fail(f"{path}: {type(e).__name__}: {e}")
        loaded += 1
        feeds = {n: np.ones(s.lens, s.dtype) for n, s in prog.program.get_parameter_shapes().items()}
        try:
            prog.run(feeds)
        except mgx_graph.MgxError:
            pass
        prog.release()
    assert refused > 100 and loaded > 0
    assert fds() == before_fds and threading.active_count() == before_threads
    good = crafted(tmp_path, saved, name)
    np.testing.assert_allclose(mgx_graph.load(good).run({"x": X})[0], ort_run(model, {"x": X})[0],
                               rtol=1e-5, atol=1e-6)


def test_every_metadata_key_the_code_sets_is_known_to_the_load_checks():
    """A key some pass or lowering writes into ``ins.meta`` (and a saved program then holds) must be one the
    load checks know, or programs using it would not load (a gpu-only key once did not)."""
    import re
    from pathlib import Path

    from mgx_graph.ir.codec import NOT_SAVED_META
    from mgx_graph.mxr.checks import META

    root = Path(__file__).resolve().parents[2]
    set_keys = set()
    for folder in ("mgx_graph", "operators"):
        for path in (root / folder).rglob("*.py"):
            set_keys |= set(re.findall(r"meta\[\"(\w+)\"\]\s*=(?!=)", path.read_text()))
    assert set_keys, "no metadata writes found: the pattern is stale"
    assert set_keys - set(NOT_SAVED_META) <= set(META), sorted(set_keys - set(NOT_SAVED_META) - set(META))
