"""The native replay extension, the one thing pyproject.toml does not declare.

``mgx_graph._native`` is ``cpp/replay.c`` built against CPython's limited API (3.10 and later), so one
``cp310-abi3`` wheel serves every CPython >= 3.10. It is optional: without a C compiler the build goes
on without it and mgx_graph replays its graphs through the Python path. Everything else (metadata,
dependencies, extras, packages, data) is in pyproject.toml.
"""
import warnings

from setuptools import Extension, setup

# An editable install of this layout (operators/ and models/ mapped to mgx_graph.operators and
# mgx_graph.models) goes through setuptools' import finder, which prints a notice that a folder named
# like the package in the working directory may shadow it. Here that folder is the package itself, so
# the notice (information only, not a warning about this project) is not shown.
try:
    from setuptools.warnings import InformationOnly
except ImportError:  # pragma: no cover - a setuptools without it prints nothing of the kind
    pass
else:
    warnings.filterwarnings("ignore", message=r"Editable installation\.", category=InformationOnly)

setup(
    ext_modules=[Extension("mgx_graph._native", sources=["cpp/replay.c"], py_limited_api=True, optional=True)],
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
