"""Saved programs (.mxr) that declare more than they hold: zip bombs (a member of 1.5 GiB in a file of
1.5 MB, used or not), a program.json that inflates to 1.5 GiB, a .npy header claiming 10^13
elements over 16 bytes, sizes past the end of the file, arrays unlike their literal.  Each is a
ParseError naming the member and the sizes, raised before anything is inflated: the bytes read from
members are counted (zipfile.ZipExtFile.read) and the peak of Python allocations stays small
(tracemalloc)."""
import json
import os
import tracemalloc
import zipfile

import numpy as np
import pytest

import mgx_graph
from test_graph_launch import chain_model
from untrusted_zip import (deflated, header_of, members_of, npy, npy_header, stored, write_overlapping_zip,
                           write_zip)
from util import ort_run

BOMB = 3 << 29  # 1.5 GiB
SMALL = 16 << 20  # at most this many bytes read / allocated while refusing a bomb
X = np.random.default_rng(5).normal(size=(3, 4)).astype(np.float32)


@pytest.fixture
def good(tmp_path, unfused):
    """(members of a saved static program as write_zip takes them, its model)."""
    model = chain_model(6)
    path = tmp_path / "good.mxr"
    mgx_graph.compile(model, target="ref").save(path)
    raw = members_of(path)
    members = {n: (deflated(d) if n == "program.json" else stored(d)) for n, d in raw.items()}
    return members, model


@pytest.fixture
def inflated(monkeypatch):
    """``reset()``; ``count()``: bytes read from zip members since; ``peak()``: tracemalloc's peak since."""
    total = [0]
    real = zipfile.ZipExtFile.read

    def read(self, n=-1):
        data = real(self, n)
        total[0] += len(data)
        return data

    monkeypatch.setattr(zipfile.ZipExtFile, "read", read)
    tracemalloc.start()

    def reset():
        total[0] = 0
        tracemalloc.reset_peak()

    yield type("Inflated", (), {"count": staticmethod(lambda: total[0]), "reset": staticmethod(reset),
                                "peak": staticmethod(lambda: tracemalloc.get_traced_memory()[1])})
    tracemalloc.stop()


def refused(path, msg, inflated):
    inflated.reset()
    with pytest.raises(mgx_graph.ParseError, match=msg):
        mgx_graph.load(path)
    assert inflated.count() < SMALL and inflated.peak() < SMALL


def test_an_unused_bomb_member_is_never_read(tmp_path, good, inflated):
    members, model = good
    members["arrays/zz.npy"] = deflated(npy_header("<f4", (BOMB // 4,)), BOMB)
    path = tmp_path / "unused.mxr"
    write_zip(path, members)
    assert os.path.getsize(path) < 2 << 20
    inflated.reset()
    prog = mgx_graph.load(path)
    assert inflated.count() < SMALL and inflated.peak() < SMALL
    np.testing.assert_allclose(prog.run({"x": X})[0], ort_run(model, {"x": X})[0], rtol=1e-5, atol=1e-6)


def test_a_used_bomb_member_is_refused_unread(tmp_path, good, inflated):
    members, _ = good
    members["arrays/a0.npy"] = deflated(npy_header("<f4", (BOMB // 4,)), BOMB)
    write_zip(tmp_path / "used.mxr", members)
    size = BOMB + len(npy_header("<f4", (BOMB // 4,)))
    refused(tmp_path / "used.mxr", rf"used\.mxr: member arrays/a0\.npy: \d+ compressed bytes declare {size} bytes, "
                                   r"more than 100 times as many", inflated)


def test_a_program_json_inflating_to_gigabytes_is_refused_unread(tmp_path, good, inflated):
    members, _ = good
    members["program.json"] = deflated(members_of_json(members), BOMB)  # valid JSON: trailing whitespace
    write_zip(tmp_path / "json.mxr", members)
    refused(tmp_path / "json.mxr", r"json\.mxr: member program\.json: declares \d+ bytes, more than the 268435456 "
                                   r"bytes a program\.json may have", inflated)


def members_of_json(members) -> bytes:
    import zlib

    _, raw, _, _ = members["program.json"]
    return zlib.decompress(raw, -15)


def test_program_json_and_model_caps(tmp_path, good, inflated, monkeypatch):
    members, _ = good
    write_zip(tmp_path / "capped.mxr", members)
    monkeypatch.setattr(mgx_graph.mxr.save_load, "MAX_HEADER_BYTES", 1000)
    refused(tmp_path / "capped.mxr", r"member program\.json: declares \d+ bytes, more than the 1000 bytes", inflated)


def test_a_dynamic_programs_model_bomb_is_refused_unread(tmp_path, inflated):
    from test_compiled_program import _chain

    path = tmp_path / "dyn.mxr"
    mgx_graph.compile(_chain(["n", 4]), target="ref").save(path)
    members = {n: stored(d) for n, d in members_of(path).items()}
    members["model.onnx"] = deflated(members["model.onnx"][1], BOMB)
    write_zip(path, members)
    refused(path, r"dyn\.mxr: member model\.onnx: \d+ compressed bytes declare \d+ bytes, more than 100 times",
            inflated)


def test_an_npy_header_claiming_more_than_its_member_holds(tmp_path, good, inflated):
    members, model = good
    members["arrays/a0.npy"] = stored(npy_header("<f4", (10 ** 13,)) + b"\0" * 16)
    write_zip(tmp_path / "claim.mxr", members)
    refused(tmp_path / "claim.mxr", r"claim\.mxr: member arrays/a0\.npy: its header declares shape \[10000000000000\] "
                                    r"of float32 \(40000000000000 bytes\) but the member holds 16 bytes of data",
            inflated)
    members["arrays/a0.npy"] = stored(npy(np.zeros(4, np.float32)))
    members["arrays/a7.npy"] = stored(npy_header("<f4", (10 ** 13,)) + b"\0" * 16)  # unreferenced: not read
    write_zip(tmp_path / "ok.mxr", members)
    assert mgx_graph.load(tmp_path / "ok.mxr").run({"x": X})[0].shape == (3, 4)


@pytest.mark.parametrize("array, msg", [
    (np.zeros(5, np.float32), r"member arrays/a0\.npy: shape \[5\], but its literal declares \[4\]"),
    (np.zeros(4, np.float64), r"member arrays/a0\.npy: dtype float64, but its literal declares float32"),
    (np.zeros(4, object), r"member arrays/a0\.npy: not a valid \.npy array|dtype object is not a tensor type"),
])
def test_an_array_unlike_its_literal_is_refused_unread(tmp_path, good, inflated, array, msg):
    members, _ = good
    data = npy(array) if array.dtype != object else npy_header("|O", (4,)) + b"\0" * 32
    members["arrays/a0.npy"] = stored(data)
    write_zip(tmp_path / "lit.mxr", members)
    refused(tmp_path / "lit.mxr", msg, inflated)


def test_sizes_past_the_end_of_the_file(tmp_path, good, inflated):
    members, _ = good
    write_zip(tmp_path / "past.mxr", members, sizes={"arrays/a0.npy": (BOMB, BOMB)})
    size = os.path.getsize(tmp_path / "past.mxr")
    refused(tmp_path / "past.mxr", rf"member arrays/a0\.npy: declares {BOMB} compressed bytes in a file of {size} "
                                   "bytes", inflated)
    write_zip(tmp_path / "lie.mxr", members, sizes={"arrays/a0.npy": (len(members["arrays/a0.npy"][1]), BOMB)})
    refused(tmp_path / "lie.mxr", rf"member arrays/a0\.npy: stored uncompressed with \d+ bytes but declares {BOMB}",
            inflated)


def test_an_array_key_that_is_a_path_is_refused(tmp_path, good, inflated):
    members, _ = good
    doc = header_of({"program.json": members_of_json(members)})
    lit = next(i for i in doc["program"]["modules"][0]["instructions"] if i["op"] == "@literal")
    lit["attrs"]["dict"][0][1]["array"] = "../../program"
    members["program.json"] = deflated(json.dumps(doc).encode())
    write_zip(tmp_path / "key.mxr", members)
    refused(tmp_path / "key.mxr", r"key\.mxr: array key '\.\./\.\./program' is not a valid name", inflated)


def test_a_corrupt_deflated_member_is_a_parse_error(tmp_path, good, inflated):
    members, _ = good
    method, raw, crc, size = members["program.json"]
    members["program.json"] = (method, b"\xff" * 8 + raw[8:], crc, size)
    write_zip(tmp_path / "zlib.mxr", members)
    refused(tmp_path / "zlib.mxr", r"zlib\.mxr: not a valid saved program \(\.mxr zip\): (error|BadZipFile)", inflated)


def test_members_sharing_one_compressed_block_are_refused_unread(tmp_path, good, inflated):
    """Each member's deflate stream runs on into the next member's and all end in one run of deflated zeros:
    every member passes the per-member ratio check, yet together they would inflate to far more than 100
    times the file."""
    members, _ = good
    doc = header_of({"program.json": members_of_json(members)})
    path = tmp_path / "overlap.mxr"
    sizes = write_overlapping_zip(path, doc, 4)
    assert sum(sizes) > 200 * os.path.getsize(path)
    with zipfile.ZipFile(path) as zf:  # zipfile itself reads each member (with a valid CRC)
        assert [len(zf.read(f"arrays/o{i}.npy")) for i in range(4)] == sizes
    refused(path, r"overlap\.mxr: members arrays/o0\.npy \(bytes 0\.\.\d+\) and arrays/o1\.npy \(bytes \d+\.\.\d+\) "
                  r"overlap", inflated)
