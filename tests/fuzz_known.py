"""Known defects the fuzz tests still meet: each entry lets the matching fuzz cases pass while the defect is open.

An entry is ``Known(family, kind, error, message, reproducer)``: a failure of ``family`` (``onnx-bytes``,
``onnx-structure``, ``mxr``, ``external-data``) and ``kind`` (``untyped``: an exception that is not an
MgxError; ``mismatch``: outputs that differ from onnxruntime's or from the saved program's; ``accepted``:
a model onnxruntime refuses that mgx_graph compiles and runs; ``outside``: a file opened outside the
model folder; ``memory``: over the memory bound) whose exception type name is ``error`` (``""``: any)
and whose description matches the regular expression ``message``.  Remove an entry once its defect is
fixed: the cases it covered must then pass on their own.
"""
from __future__ import annotations

import re
from typing import NamedTuple


class Known(NamedTuple):
    family: str
    kind: str
    error: str
    message: str
    reproducer: str

    def matches(self, family: str, kind: str, error: str, text: str) -> bool:
        """``family`` (``onnx-*``: both ONNX families), ``kind`` (``|``-separated kinds) and ``error``
        match; ``message`` is searched in the failure's text, case and traceback."""
        fam = self.family == family or (self.family.endswith("*") and family.startswith(self.family[:-1]))
        return (fam and kind in self.kind.split("|") and self.error in ("", error)
                and re.search(self.message, text, re.S) is not None)


KNOWN: list[Known] = [
    Known("mxr", "untyped", "error", r"while decompressing data",
          "M1: a corrupt deflated member (program.json) raises zlib.error from load(), not ParseError"),
    Known("mxr", "untyped", "", r"mxr\.py\", line \d+, in _options|in graph_budget|onnx_parser\.py\", line \d+, in __init__",
          "M2: compile options are decoded and used unchecked: options {'dict': [[k]]} (ValueError: not enough "
          "values to unpack), a list key (TypeError: unhashable), capture_mode 7 (ValueError in graph_budget), "
          "input_dims 7 on a dynamic program (AttributeError in the parser)"),
    Known("mxr", "untyped", "", r"ir_codec\.py\", line \d+, in decode",
          "M3: ValueCodec.decode raises ValueError / TypeError on malformed tagged values outside the "
          "program ({'float': 'bogus'}, {'dict': [[1]]})"),
    Known("mxr", "untyped", "TokenError", r"_read_array_header",
          "M4: an .npy member whose header length is wrong raises tokenize.TokenError from numpy, not ParseError"),
    Known("mxr", "memory", "MemoryError", r"read_array",
          "M5: an .npy member's header shape is allocated before its size is checked against the member: "
          "shape (2**40,) raises MemoryError (4 TiB)"),
    Known("mxr", "untyped", "RecursionError", r"decoding a JSON",
          "M6: program.json nested 100000 deep raises RecursionError from json.loads"),
    Known("mxr", "memory", "MemoryError", r"in _header|inflating to 1 GiB",
          "M7: program.json is read whole: a member inflating to 1 GiB (1 MiB on disk) raises MemoryError "
          "under the cap; the member's size is not bounded"),
    Known("external-data", "outside", "", r"without external_data_dir read the weights of the working folder",
          "E1: compile(model bytes) without external_data_dir reads external data relative to the current "
          "working directory (onnx.numpy_helper.to_array with base_dir '')"),
    Known("external-data", "accepted", "", r"model format error",
          "E2: unknown or repeated external_data keys ('foo', two 'location') are accepted; onnxruntime refuses"),
    Known("onnx-*", "mismatch", "", r"nan location mismatch.*MaxPool",
          "F4: MaxPool propagates NaN (numpy max); onnxruntime's MaxPool skips NaN ([[nan, 1], [2, 3]] -> 3)"),
]
