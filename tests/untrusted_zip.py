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
