"""Writing crafted saved programs for the untrusted-loading tests: zips whose members are given as raw
(possibly compressed) bytes with the sizes they declare, and deflate streams of gigabytes of zeros
built in milliseconds (a block of 16 MiB of zeros, compressed after a full flush, is the same bytes
each time)."""
import json
import struct
import zlib

import numpy as np

BLOCK = 1 << 24


def deflated(prefix: bytes, zeros: int = 0) -> tuple:
    """``(8, raw deflate stream, crc32, size)`` of ``prefix`` followed by ``zeros`` zero bytes (a multiple of
    16 MiB)."""
    assert zeros % BLOCK == 0
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = c.compress(prefix) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(b"\0" * BLOCK) + c.flush(zlib.Z_FULL_FLUSH)
    tail = c.flush()
    crc = zlib.crc32(prefix)
    z = b"\0" * BLOCK
    for _ in range(zeros // BLOCK):
        crc = zlib.crc32(z, crc)
    return 8, head + block * (zeros // BLOCK) + tail, crc, len(prefix) + zeros


def stored(data: bytes) -> tuple:
    return 0, data, zlib.crc32(data), len(data)


def write_zip(path, members: dict, sizes: dict | None = None) -> None:
    """A zip of ``members`` ({name: (method, raw bytes, crc32, size) from :func:`deflated` / :func:`stored`});
    ``sizes``: {name: (compressed size, size)} to declare instead of the true ones."""
    sizes = sizes or {}
    out, central = bytearray(), bytearray()
    for name, (method, raw, crc, size) in members.items():
        csize, usize = sizes.get(name, (len(raw), size))
        fname = name.encode()
        offset = len(out)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, crc, csize, usize, len(fname), 0)
        out += fname + raw
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0x21, crc, csize, usize,
                               len(fname), 0, 0, 0, 0, 0, offset) + fname
    count = len(members)
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, count, count, len(central), len(out), 0)
    with open(path, "wb") as f:
        f.write(bytes(out + central + end))


def npy_header(dtype: str, shape: tuple) -> bytes:
    """The .npy (version 1.0) header of an array of ``dtype`` and ``shape``."""
    d = {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": tuple(shape)}
    text = repr(d)
    pad = 64 - (10 + len(text) + 1) % 64
    text = text + " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1")


def npy(a: np.ndarray) -> bytes:
    return npy_header(a.dtype.str, a.shape) + np.ascontiguousarray(a).tobytes()


def members_of(path) -> dict:
    """{name: bytes} of a saved program."""
    import zipfile

    with zipfile.ZipFile(path) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def header_of(members: dict) -> dict:
    return json.loads(members["program.json"])


def _local_header(name: str, method: int, crc: int, csize: int, usize: int) -> bytes:
    fname = name.encode()
    return struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, crc, csize, usize, len(fname), 0) + fname


def _stored_block_head(n: int) -> bytes:
    """The head of a non-final stored deflate block of ``n`` bytes (byte-aligned)."""
    return b"\x00" + struct.pack("<HH", n, n ^ 0xFFFF)


def write_overlapping_zip(path, doc: dict, count: int, zeros: int = BLOCK) -> list:
    """A zip whose ``count`` members ``arrays/o<i>.npy`` (uint8 arrays) share their bytes: member i's deflate
    stream quotes member i+1's local header in a stored block and then runs on into its data, and every
    stream ends in one shared run of ``zeros`` deflated zeros.  Each member declares 100 times its
    compressed size (truncating what it inflates), so each passes a per-member ratio check.  ``doc``: a
    saved program's ``program.json`` whose main module gets ``count`` literals returned.  Returns the
    declared sizes."""
    names = [f"arrays/o{i}.npy" for i in range(count)]
    _, kernel, _, _ = deflated(b"", zeros)
    hlen = len(_local_header(names[0], 8, 0, 0, 0))
    nlen = len(npy_header("|u1", (10 ** 9,)))
    # physical layout: [LFH_i, stored(npy_i), stored-head(LFH_{i+1})] for each i, then the kernel
    offsets, pos = [], 0
    for i in range(count):
        offsets.append(pos)
        pos += hlen + 5 + nlen + (5 if i + 1 < count else 0)
    end = pos + len(kernel)
    csizes = [end - (offsets[i] + hlen) for i in range(count)]
    usizes = [min(100 * csizes[i], (count - i) * nlen + (count - 1 - i) * hlen + zeros) for i in range(count)]
    npys = [npy_header("|u1", (u - nlen,)) for u in usizes]
    assert all(len(h) == nlen for h in npys)
    heads, crcs = [b""] * count, [0] * count
    for i in reversed(range(count)):  # member i's content holds member i+1's local header: build from the back
        prefix = b"".join(npys[j] + (heads[j + 1] if j + 1 < count else b"") for j in range(i, count))
        crc, left, z = zlib.crc32(prefix[:usizes[i]]), usizes[i] - min(len(prefix), usizes[i]), b"\0" * BLOCK
        while left > 0:
            crc, left = zlib.crc32(z[:min(left, BLOCK)], crc), left - BLOCK
        heads[i], crcs[i] = _local_header(names[i], 8, crc, csizes[i], usizes[i]), crc
    body = bytearray()
    for i in range(count):
        body += heads[i] + _stored_block_head(nlen) + npys[i] + (_stored_block_head(hlen) if i + 1 < count else b"")
    body += kernel
    lits = [{"op": "@literal", "attrs": {"dict": [["value", {"array": f"o{i}"}]]}, "inputs": [], "modules": [],
             "shape": {"shape": ["uint8", [usizes[i] - nlen], [1]]}, "meta": {"dict": []}, "label": ""}
            for i in range(count)]
    ret = {"op": "@return", "attrs": {"dict": []}, "inputs": [[0, i] for i in range(count)], "modules": [],
           "shape": {"tuple": [lit["shape"] for lit in lits]}, "meta": {"dict": []}, "label": ""}
    main = doc["program"]["modules"][0]
    main["instructions"], main["output_names"] = lits + [ret], [f"y{i}" for i in range(count)]
    pj = json.dumps(doc).encode()
    entries = [(n, 8, crcs[i], csizes[i], usizes[i], offsets[i]) for i, n in enumerate(names)]
    entries.append(("program.json", 0, zlib.crc32(pj), len(pj), len(pj), len(body)))
    body += _local_header("program.json", 0, zlib.crc32(pj), len(pj), len(pj)) + pj
    central = bytearray()
    for name, method, crc, csize, usize, offset in entries:
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0x21, crc, csize, usize,
                               len(name.encode()), 0, 0, 0, 0, 0, offset) + name.encode()
    tail = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), len(central), len(body), 0)
    with open(path, "wb") as f:
        f.write(bytes(body + central + tail))
    return usizes
