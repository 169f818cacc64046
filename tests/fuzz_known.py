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
]
