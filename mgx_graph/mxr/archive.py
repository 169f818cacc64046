"""Reading the members of a saved program (``.mxr``, a zip) within bounds checked before inflating.

A saved program is data from whoever wrote it.  Before a member is read, :class:`Archive` checks the
sizes the zip declares for it, which bound what ``zipfile`` inflates:

* its size is at most the member's cap: ``program.json`` :data:`MAX_HEADER_BYTES` (256 MiB),
  ``model.onnx`` :data:`MAX_MODEL_BYTES` (2 GiB, protobuf's own limit), an array
  :data:`MAX_ARRAY_BYTES`;
* its compressed size fits in the file, a stored member's size is its compressed size, and a
  compressed member inflates at most :data:`MAX_RATIO` times (a zip bomb is refused unread);
* no two members share bytes: each member's span, from its local header to the end of its
  compressed data, is disjoint from every other's (checked when the file is opened).  A zip whose
  members overlap could make every member inflate the same compressed block, so that a small file
  declares far more in all than :data:`MAX_RATIO` times its size; with disjoint spans, everything
  read inflates to at most :data:`MAX_RATIO` times the file's size;
* an array's ``.npy`` header (read alone, at most 10,000 characters) gives a dtype of a tensor
  (numbers, bool, fixed-width strings: no pickled object), a shape whose bytes plus the header are
  exactly the member's size, and, for a literal, the dtype and shape its instruction declares.

Only the arrays the program references are read.  Every refusal is a ParseError naming the file,
the member and the sizes.
"""
from __future__ import annotations

import math
import os
import re
import struct
import zipfile
import zlib

import numpy as np

from ..errors import ParseError

MAX_HEADER_BYTES = 256 << 20
MAX_MODEL_BYTES = 2 << 30
MAX_ARRAY_BYTES = 1 << 40
MAX_RATIO = 100
LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, ..., file name length, extra field length
READ_CHUNK = 16 << 20
ARRAY_KEY = re.compile(r"[A-Za-z0-9_]{1,64}")
ARRAY_KINDS = "biufSU"  # bool, integers, floats, complex, fixed-width bytes / str


class Archive:
    """An open saved program's zip (``zf``), ``where`` naming the file, ``size`` its bytes."""

    def __init__(self, zf: zipfile.ZipFile, where: str):
        self.zf, self.where = zf, where
        self.size = os.fstat(zf.fp.fileno()).st_size \
            if zf.fp is not None and hasattr(zf.fp, "fileno") else None
        self._check_disjoint()

    def _check_disjoint(self) -> None:
        """Refuse members whose spans (local header, name, extra field, compressed data) overlap."""
        fp, spans = self.zf.fp, []
        if fp is None:
            return
        for info in self.zf.infolist():
            fp.seek(info.header_offset)
            head = fp.read(LOCAL_HEADER.size)
            if len(head) != LOCAL_HEADER.size or LOCAL_HEADER.unpack(head)[0] != b"PK\x03\x04":
                raise ParseError(f"{self.where}: member {info.filename}: no local header at byte {info.header_offset}")
            _, name_len, extra_len = LOCAL_HEADER.unpack(head)
            end = info.header_offset + LOCAL_HEADER.size + name_len + extra_len + info.compress_size
            if self.size is not None and end > self.size:
                self._check_compressed_size(info)
                raise ParseError(f"{self.where}: member {info.filename}: its compressed data ends at byte {end}, "
                                 f"past the end of the file ({self.size} bytes)")
            spans.append((info.header_offset, end, info.filename))
        spans.sort()
        for (start0, end0, name0), (start1, end1, name1) in zip(spans, spans[1:]):
            if start1 < end0:
                raise ParseError(f"{self.where}: members {name0} (bytes {start0}..{end0}) and {name1} (bytes "
                                 f"{start1}..{end1}) overlap: each member must hold its own bytes")

    def _check_compressed_size(self, info: zipfile.ZipInfo) -> None:
        if self.size is not None and info.compress_size > self.size:
            raise ParseError(f"{self.where}: member {info.filename}: declares {info.compress_size} compressed bytes "
                             f"in a file of {self.size} bytes")

    def info(self, name: str, cap: int) -> zipfile.ZipInfo:
        """The entry of member ``name``, its declared sizes checked (KeyError when absent)."""
        info = self.zf.getinfo(name)
        head = f"{self.where}: member {name}"
        if info.file_size > cap:
            raise ParseError(f"{head}: declares {info.file_size} bytes, more than the {cap} bytes a {name} may have")
        self._check_compressed_size(info)
        if info.compress_type == zipfile.ZIP_STORED:
            if info.compress_size != info.file_size:
                raise ParseError(f"{head}: stored uncompressed with {info.compress_size} bytes but declares "
                                 f"{info.file_size} bytes")
        elif info.file_size > MAX_RATIO * max(info.compress_size, 1):
            raise ParseError(f"{head}: {info.compress_size} compressed bytes declare {info.file_size} bytes, more than "
                             f"{MAX_RATIO} times as many (a zip bomb?)")
        return info

    def read(self, name: str, cap: int) -> bytes:
        """The bytes of member ``name`` (KeyError when absent), its sizes checked first."""
        info = self.info(name, cap)
        with self.zf.open(info) as f:
            return _read_exactly(f, info.file_size, self.where, name)

    def array(self, key: str, want=None) -> np.ndarray:
        """The array ``arrays/<key>.npy``; ``want``: ``(dtype name, lens)`` a literal declares, or None."""
        if not isinstance(key, str) or not ARRAY_KEY.fullmatch(key):
            raise ParseError(f"{self.where}: array key {str(key)[:80]!r} is not a valid name")
        name = f"arrays/{key}.npy"
        try:
            info = self.info(name, MAX_ARRAY_BYTES)
        except KeyError:
            raise ParseError(f"{self.where}: array '{key}' is not in the file") from None
        with self.zf.open(info) as f:
            shape, fortran, dtype = _npy_header(f, self.where, name)
            count = math.prod(shape)
            nbytes = count * dtype.itemsize
            head = f.tell() if f.seekable() else None
            if head is not None and head + nbytes != info.file_size:
                raise ParseError(f"{self.where}: member {name}: its header declares shape {list(shape)} of {dtype} "
                                 f"({nbytes} bytes) but the member holds {info.file_size - head} bytes of data")
            if want is not None:
                _check_literal(want, shape, dtype, self.where, name)
            buf = _read_into(f, nbytes, self.where, name)
        a = np.frombuffer(buf, dtype=dtype, count=count) if count else np.empty(0, dtype)
        return a.reshape(shape[::-1]).T if fortran else a.reshape(shape)


def _read_exactly(f, n: int, where: str, name: str) -> bytes:
    data = f.read(n)
    if len(data) != n or f.read(1):  # reading to the end checks the CRC
        raise ParseError(f"{where}: member {name}: expected {n} bytes, read {len(data)}")
    return data


def _read_into(f, n: int, where: str, name: str) -> bytearray:
    """``n`` bytes of ``f`` read into one buffer a chunk at a time (no second copy of the whole)."""
    buf = bytearray(n)
    view, pos = memoryview(buf), 0
    while pos < n:
        got = f.readinto(view[pos:pos + READ_CHUNK])
        if not got:
            break
        pos += got
    view.release()
    if pos != n or f.read(1):  # reading to the end checks the CRC
        raise ParseError(f"{where}: member {name}: expected {n} bytes, read {pos}")
    return buf


def _npy_header(f, where: str, name: str):
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        reader = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, fortran, dtype = reader(f, max_header_size=10000)
    except (zipfile.BadZipFile, zlib.error, OSError):
        raise  # the zip itself (a CRC, a corrupt stream): load() names it
    except Exception as e:  # noqa: BLE001 - numpy's header parser raises ValueError, SyntaxError, TokenError, ...
        raise ParseError(f"{where}: member {name}: not a valid .npy array ({type(e).__name__}: {str(e)[:200]})") \
            from None
    if dtype.kind not in ARRAY_KINDS or dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise ParseError(f"{where}: member {name}: dtype {dtype} is not a tensor type")
    if any(d < 0 for d in shape):
        raise ParseError(f"{where}: member {name}: negative dims {list(shape)}")
    return shape, fortran, dtype


def _check_literal(want, shape, dtype, where: str, name: str) -> None:
    wdtype, wlens = want
    if list(shape) != list(wlens):
        raise ParseError(f"{where}: member {name}: shape {list(shape)}, but its literal declares {list(wlens)}")
    if wdtype != "object" and dtype.name != wdtype:
        raise ParseError(f"{where}: member {name}: dtype {dtype.name}, but its literal declares {wdtype}")
    if wdtype == "object" and dtype.kind not in "SU":
        raise ParseError(f"{where}: member {name}: dtype {dtype.name}, but its literal declares strings")
