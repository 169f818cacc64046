"""External tensor data of an ONNX model, read only from inside the model's folder.

An ONNX tensor may keep its bytes in a file next to the model (``data_location: EXTERNAL`` with
``location`` / ``offset`` / ``length`` entries).  The model and its folder are data from whoever made
them, so :func:`load_external` reads such a tensor only when:

* ``location`` is a relative path with no ``..`` part, and the file it names, all symbolic links
  resolved, is inside the folder (an absolute path, ``../secret`` or a link out of the folder is
  refused);
* the file is a regular file (a FIFO, a device or a folder is refused without being opened for read);
* ``offset`` and ``length`` are non-negative integers inside the file, and ``length`` is the size the
  tensor's dims and type need (without a ``length``, that size is read from ``offset``), all checked
  before a byte is read; keys other than the spec's (``location``, ``offset``, ``length``,
  ``checksum``; onnx's own ``basepath`` too, as onnxruntime refuses it), or one given twice, are refused.

An in-memory model (bytes, a ``ModelProto``) has no folder: its external tensors need an explicit
one (``external_data_dir``), never the process's current directory.  Every refusal is a ParseError
naming the model and the tensor.
"""
from __future__ import annotations

import math
import os
import stat

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto

from ..errors import ParseError


def _graph_tensors(g: onnx.GraphProto):
    yield from g.initializer
    for s in g.sparse_initializer:
        yield s.values
        yield s.indices
    yield from _node_tensors(g.node)


def _node_tensors(nodes):
    for n in nodes:
        for a in n.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            for s in ([a.sparse_tensor] if a.HasField("sparse_tensor") else []) + list(a.sparse_tensors):
                yield s.values
                yield s.indices
            if a.type == AttributeProto.GRAPH or a.HasField("g"):
                yield from _graph_tensors(a.g)
            for sub in a.graphs:
                yield from _graph_tensors(sub)


def all_tensors(model: onnx.ModelProto):
    """Every tensor of ``model``: initializers (sparse ones too) and node attributes, in subgraphs and
    functions as well."""
    yield from _graph_tensors(model.graph)
    for f in model.functions:
        yield from _node_tensors(f.node)


def is_external(t: TensorProto) -> bool:
    return t.HasField("data_location") and t.data_location == TensorProto.EXTERNAL


def external_tensors(model: onnx.ModelProto) -> list:
    """The tensors of ``model`` whose data is in an external file."""
    return [t for t in all_tensors(model) if is_external(t)]


def location_of(t: TensorProto) -> str:
    return {e.key: e.value for e in t.external_data}.get("location", "")


def load_external(model: onnx.ModelProto, base: str, where: str) -> None:
    """Read every external tensor of ``model`` from the folder ``base`` into the tensor itself (see
    the module docstring for what is refused); ``where`` names the model in errors."""
    tensors = external_tensors(model)
    if not tensors:
        return
    if not os.path.isdir(base):
        raise ParseError(f"{where}: the external data folder '{base}' is not a folder")
    root = os.path.realpath(base)
    for t in tensors:
        data = _read(t, root, base, where)
        t.raw_data = data
        t.data_location = TensorProto.DEFAULT
        del t.external_data[:]


KEYS = ("location", "offset", "length", "checksum")  # the ONNX spec's external_data keys, as onnxruntime reads them


def _entries(t: TensorProto, where: str) -> tuple[str, int, int | None]:
    keys = [e.key for e in t.external_data]
    odd = sorted({k for k in keys if k not in KEYS or keys.count(k) > 1})
    if odd:
        raise ParseError(f"{where}: tensor '{t.name}': external data keys {[k[:40] for k in odd[:5]]} are unknown or "
                         f"repeated (expected each of {', '.join(KEYS)} at most once)")
    info = {e.key: e.value for e in t.external_data}
    loc = info.get("location", "")
    fields: dict[str, int | None] = {}
    for key in ("offset", "length"):
        v = info.get(key)
        if v is None:
            fields[key] = None
            continue
        if not v.isdigit() or len(v) > 20:
            raise ParseError(f"{where}: tensor '{t.name}': external data {key} must be a non-negative integer, "
                             f"given {v[:40]!r}")
        fields[key] = int(v)
    return loc, fields["offset"] or 0, fields["length"]


def is_inside(root: str, real: str) -> bool:
    """True when the resolved path ``real`` is strictly inside the resolved folder ``root``."""
    return os.path.commonpath([root, real]) == root and real != root


def _resolve(t: TensorProto, loc: str, root: str, base: str, where: str) -> str:
    """The real path of ``loc`` inside ``root``, or a ParseError."""
    head = f"{where}: tensor '{t.name}': external data location {loc[:200]!r}"
    parts = loc.replace("\\", "/").split("/")
    if not loc or "\0" in loc or os.path.isabs(loc) or loc.startswith(("/", "\\")) or ".." in parts \
            or os.path.splitdrive(loc)[0]:
        raise ParseError(f"{head}: must be a relative path inside the model's folder {base}")
    real = os.path.realpath(os.path.join(root, loc))
    if not is_inside(root, real):
        raise ParseError(f"{head}: resolves to {real}, outside the model's folder {base}")
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise ParseError(f"{where}: external data file '{loc}' of tensor '{t.name}' not found in {base}") from None
    except OSError as e:
        raise ParseError(f"{head}: cannot be read ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ParseError(f"{head}: not a regular file")
    return real


def _expected_bytes(t: TensorProto, where: str) -> int | None:
    """The bytes the tensor's dims and type need (None for a type with no fixed size)."""
    if t.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        raise ParseError(f"{where}: tensor '{t.name}': a {TensorProto.DataType.Name(t.data_type)} tensor cannot "
                         "keep its data in an external file")
    try:
        np_type = onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
    except (KeyError, ValueError, TypeError):
        return None
    if any(d < 0 for d in t.dims):
        raise ParseError(f"{where}: tensor '{t.name}': negative dims {list(t.dims)}")
    four = [getattr(TensorProto, n, None) for n in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")]
    bits = {k: (2 if n.endswith("2") else 4) for k, n in zip(four, ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2"))
            if k is not None}.get(t.data_type)
    n = math.prod(t.dims)
    if bits is not None:
        return (n * bits + 7) // 8
    return n * np.dtype(np_type).itemsize


def _read(t: TensorProto, root: str, base: str, where: str) -> bytes:
    loc, offset, length = _entries(t, where)
    real = _resolve(t, loc, root, base, where)
    try:
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise ParseError(f"{where}: tensor '{t.name}': external data file '{loc}' cannot be opened ({e.strerror})") \
            from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced since the check
            raise ParseError(f"{where}: tensor '{t.name}': external data location '{loc}': not a regular file")
        size = st.st_size
        if offset > size:
            raise ParseError(f"{where}: tensor '{t.name}': external data offset {offset} is past the end of "
                             f"'{loc}' ({size} bytes)")
        want = _expected_bytes(t, where)
        if length is None:  # no length entry: the tensor's own size from the offset (else the rest of the file)
            length = want if want is not None else size - offset
        if offset + length > size:
            raise ParseError(f"{where}: tensor '{t.name}': external data offset {offset} + length {length} is past "
                             f"the end of '{loc}' ({size} bytes)")
        if want is not None and length != want:
            raise ParseError(f"{where}: tensor '{t.name}': dims {list(t.dims)} need {want} bytes, its external data "
                             f"in '{loc}' has {length}")
        chunks, got = [], 0
        while got < length:
            chunk = os.pread(fd, min(length - got, 1 << 30), offset + got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        data = b"".join(chunks)
        if len(data) != length:
            raise ParseError(f"{where}: tensor '{t.name}': read {len(data)} of {length} bytes from '{loc}'")
        return data
    finally:
        os.close(fd)
