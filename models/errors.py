"""Errors of the model builders, and the check that the optional extras they need are installed.

Building a model needs the ``[export]`` extra of mgx_graph (torch, transformers, onnxscript, and
for the GGUF checkpoint gguf + accelerate); verifying a build against onnxruntime needs the
``[test]`` extra. :func:`require_modules` turns a missing one into a :class:`MissingExtraError`
that names the module and the ``pip install`` line, before any build folder is made.
"""

from __future__ import annotations

import importlib
from typing import Iterable


class BuildError(RuntimeError):
    """A model could not be built (missing dependency, bad option, failed download...)."""


class VerificationError(BuildError):
    """The exported ONNX graph disagrees with the torch model it was exported from."""


#: The mgx_graph extra (pyproject ``[project.optional-dependencies]``) that installs each module.
EXTRA_OF: dict[str, str] = {
    "torch": "export",
    "transformers": "export",
    "onnxscript": "export",
    "gguf": "export",
    "accelerate": "export",
    "jinja2": "export",
    "onnxruntime": "test",
}


class MissingExtraError(BuildError, ImportError):
    """A module of an optional extra cannot be imported (not installed, or broken).

    A :class:`BuildError`; also an ``ImportError`` (not a ``ModuleNotFoundError``) so that
    callers that skip on a missing optional dependency keep working. Attributes: ``model``
    (the builder or helper that needs it), ``module`` (also ``name``, as for ImportError),
    ``extra`` (``"export"`` or ``"test"``, or the one given) and ``purpose``.
    """

    def __init__(self, model: str, module: str, purpose: str, cause: str = "", extra: str | None = None):
        self.model, self.module, self.purpose = model, module, purpose
        self.extra = extra or EXTRA_OF.get(module, "export")
        detail = f" ({cause})" if cause else ""
        super().__init__(
            f"{model}: {purpose} needs the Python module `{module}`, which cannot be imported{detail}; "
            f"install the [{self.extra}] extra: pip install 'mgx_graph[{self.extra}]'"
        )
        self.name = module


def require_modules(model: str, modules: Iterable[str], purpose: str = "building the model") -> None:
    """Import each of ``modules`` (in order); raise :class:`MissingExtraError` for the first
    one that cannot be imported.

    ``model`` names the builder in the message (``"gpt2"``), ``purpose`` what needs the
    module. A module that is installed but fails to import is reported the same way, with
    the import error's text.
    """
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise MissingExtraError(model, module, purpose, cause=str(e)) from e
