"""Fuzz: mutated saved programs (``.mxr``: zip bytes, program.json fields, arrays/*.npy headers and data,
the member list).  ``mgx_graph.load`` must raise an MgxError or give a program whose run raises an MgxError
or returns the saved program's outputs (onnxruntime CPU's, checked on the unmutated file); where the
mutation may change what the program computes, the outputs must have the shapes and dtypes the program
declares.  Loads run under the memory cap and the open audit (fuzz_oracle.py).  Derandomized."""
from __future__ import annotations

import os
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import mgx_graph
from fuzz_mutate import mutate_bytes
from fuzz_mxr import (expected_shapes, mutate_json, mutate_members, mutate_npy, read_members, write_members)
from fuzz_oracle import OpenAudit, count, differ, fail, memory_cap, run_ort
from fuzz_seeds import make_feeds, seed

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")
FUZZ = settings(derandomize=True, deadline=None, database=None, print_blob=False,
                suppress_health_check=list(HealthCheck))
NAMES = ["matmul_add", "conv_relu", "gather_softmax", "concat_slice", "split_where", "dynamic_batch"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """``{seed: (archive bytes, feeds, onnxruntime's outputs)}``, each program saved from a compile."""
    folder = tmp_path_factory.mktemp("mxr")
    out = {}
    for name in NAMES:
        m = seed(name)
        feeds = make_feeds(m, np.random.default_rng(1))
        prog = mgx_graph.compile(m, target="ref", hip_graph=False)
        path = folder / f"{name}.mxr"
        prog.save(path)
        prog.release()
        state, expected = run_ort(m.SerializeToString(), feeds)
        assert state == "ok", expected
        out[name] = (path.read_bytes(), feeds, expected)
    return out


def check_load(data: bytes, folder, feeds, expected, semantic: bool, case: str) -> str:
    """Load ``data`` (written to ``folder``/case.mxr) and judge it (see the module docstring): ``refused``,
    ``loaded`` or ``known-defect``."""
    return count("mxr", _load(data, folder, feeds, expected, semantic, case))


def _load(data: bytes, folder, feeds, expected, semantic: bool, case: str) -> str:
    path = os.path.join(folder, "case.mxr")
    with open(path, "wb") as f:
        f.write(data)
    prog = None
    with memory_cap(), OpenAudit() as audit:
        try:
            prog = mgx_graph.load(path)
            outs = [np.asarray(o).copy() for o in prog.run(feeds)]
        except mgx_graph.MgxError:
            return "refused"
        except Exception as e:  # noqa: BLE001
            fail("mxr", "memory" if isinstance(e, MemoryError) else "untyped", "", case, e)
            return "known-defect"
        finally:
            if prog is not None:
                prog.release()
    bad = audit.outside(folder)
    if bad:
        fail("mxr", "outside", f"opened {bad}", case)
    why = differ(outs, expected)
    if why and semantic:
        declared = expected_shapes(prog)
        got = [(o.dtype, o.shape) for o in outs]
        why = None if declared is None or declared == got else f"outputs {got}, the program declares {declared}"
    if why:
        fail("mxr", "mismatch", why, case)
    return "loaded"


def test_saved_programs_match_onnxruntime(saved, tmp_path):
    for name, (data, feeds, expected) in saved.items():
        assert check_load(data, tmp_path, feeds, expected, False, name) == "loaded"


@settings(FUZZ, max_examples=300)
@given(data=st.data(), name=st.sampled_from(NAMES))
def test_fuzz_mxr_bytes(saved, tmp_path_factory, data, name):
    archive, feeds, expected = saved[name]
    mutated, steps = mutate_bytes(data.draw, archive)
    # every member is CRC-checked: a load that succeeds must compute the same
    check_load(mutated, tmp_path_factory.getbasetemp(), feeds, expected, False, f"{name}.mxr: {steps}")


@settings(FUZZ, max_examples=450)
@given(data=st.data(), name=st.sampled_from(NAMES), kind=st.sampled_from(["json", "json", "npy", "members"]))
def test_fuzz_mxr_members(saved, tmp_path_factory, data, name, kind):
    archive, feeds, expected = saved[name]
    members = read_members(archive)
    mutate = {"json": mutate_json, "npy": mutate_npy, "members": mutate_members}[kind]
    members, what, semantic = mutate(data.draw, members)
    check_load(write_members(members), tmp_path_factory.getbasetemp(), feeds, expected, semantic,
               f"{name}.mxr: {what}")


def test_zip_bomb_is_refused_within_the_memory_cap(saved, tmp_path):
    """A program.json that inflates to 1 GiB (from about 1 MiB) is refused within the memory cap."""
    members = read_members(saved["matmul_add"][0])
    chunk, n = b" " * (1 << 20), 1 << 10
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = z.compress(chunk) + z.flush(zlib.Z_FULL_FLUSH)  # byte-aligned, refers only to itself: repeatable
    crc = 0
    for _ in range(n):
        crc = zlib.crc32(chunk, crc)
    bomb = ("program.json", block * n + b"\x03\x00", crc, len(chunk) * n)
    others = [(k, v, zlib.crc32(v), len(v)) for k, v in members.items() if k != "program.json"]
    case = "program.json inflating to 1 GiB"
    assert check_load(_zip([bomb] + others), tmp_path, *saved["matmul_add"][1:], False, case) in ("refused",
                                                                                                   "known-defect")


def _zip(members: list) -> bytes:
    """A zip archive of ``[(name, body, crc, inflated size)]``: deflated where the size differs from the body's."""
    import struct

    out, central = bytearray(), bytearray()
    for name, body, crc, size in members:
        method = 0 if size == len(body) else 8
        fields = (20, 0, method, 0, 0x21, crc, len(body), size, len(name.encode()), 0)
        central += struct.pack("<IH" + "HHHHHIIIHH" + "HHHII", 0x02014B50, 20, *fields, 0, 0, 0, 0, len(out))
        central += name.encode()
        out += struct.pack("<I" + "HHHHHIIIHH", 0x04034B50, *fields) + name.encode() + body
    start = len(out)
    out += central + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(central), start, 0)
    return bytes(out)
