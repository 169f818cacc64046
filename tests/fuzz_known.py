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


# onnxruntime's words for a node that breaks its op's schema (input count, attribute names / types / sizes)
SCHEMA = (r"has input size \d+ not in range|is marked single but has an empty string|Unrecognized attribute"
          r"|Mismatched attribute type|Required attribute '\w+' is missing|Attribute \w+ has incorrect size")
PARSERS = r"mgx_graph/onnx/parse_\w+\.py|operators/\w+\.py\", line \d+, in (__init__|compute_shape|_geometry)"

KNOWN: list[Known] = [
    Known("onnx-*", "accepted", "", r"Invalid 'mode' attribute value",
          "F5: Pad mode '' / 'NOTSET' (not constant / reflect / edge / wrap) is accepted as constant"),
    Known("onnx-*", "accepted", "", r"Unsupported model IR version|Missing model IR version",
          "F6: the model's ir_version is not checked: 0 (missing) or above onnx's (18, 127) is accepted"),
    Known("onnx-*", "accepted", "", r"of output arg \(\w+\) of node \(\w*\) does not match expected type",
          "F7: a graph output's declared elem_type is not checked against the computed one (y declared "
          "float8e4m3fn, computed float32: accepted, a float32 output)"),
    Known("onnx-*", "accepted", "", r"Type parameter \(\w+\) of Optype \(\w+\) bound to different types"
          r"|Type '[\w()]+' of input parameter \(\w+\) of operator \(\w+\) in node \(\w*\) is invalid",
          "F8: input types are not checked against the op's type constraints (Pad of a bool x with a float "
          "constant_value; Split at opset 1 with an int64 second input)"),
    Known("onnx-*", "accepted", "", r"Out of bounds dimensions|ValidateEmbeddedTensorProto",
          "F9: an initializer with a negative dim is accepted: numpy's reshape infers -1 (z dims [-1, 2] with "
          "8 values becomes [4, 2])"),
]
