"""Compile generated fused kernels with nvcc and run them on the host (tests without a GPU).

The generated source keeps its per-element / per-row work in ``MGX_HD`` functions; built with
``-DMGX_HOST_TEST`` they are ``__host__ __device__``, and a generated ``main`` calls them for every
element (``mgx_elem``) or every row with one thread (``mgx_row``) on buffers read from files.  So
the index arithmetic, broadcasting, op bodies, conversions and accumulation of the kernel are
checked numerically here (the block's shared-memory combination runs with one thread only).
"""
from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np

from mgx_graph.operators.fused_codegen import PRELUDE

NVCC = shutil.which("nvcc")

_IO = r"""
#include <cstdio>
#include <cstdlib>
#include <string>
static void* mgx_read(const std::string& path, size_t* size) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) { std::perror(path.c_str()); std::exit(2); }
    std::fseek(f, 0, SEEK_END);
    long n = std::ftell(f);
    std::fseek(f, 0, SEEK_SET);
    void* p = std::malloc(n > 0 ? n : 1);
    if (n > 0 && std::fread(p, 1, n, f) != (size_t)n) { std::exit(3); }
    std::fclose(f);
    *size = (size_t)n;
    return p;
}
static void mgx_write(const std::string& path, const void* p, size_t n) {
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f || std::fwrite(p, 1, n, f) != n) { std::exit(4); }
    std::fclose(f);
}
"""


def strided(shape, rng) -> tuple[np.ndarray, np.ndarray]:
    """Random data laid out as ``shape`` (its strides): ``(base buffer, view of it)``."""
    n = max(shape.element_space(), 1)
    dt = shape.np_dtype
    if dt.kind == "f":
        base = rng.normal(size=n).astype(dt)
    elif dt.kind == "b":
        base = rng.integers(0, 2, size=n).astype(bool)
    else:
        base = rng.integers(0, 8 if dt.kind == "u" else 9, size=n).astype(dt) - (0 if dt.kind == "u" else dt.type(4))
    view = np.lib.stride_tricks.as_strided(base, shape.lens, shape.byte_strides())
    return base, view


def host_source(kernels) -> str:
    """One translation unit running every :class:`KernelSource` of ``kernels`` on files in argv[1]."""
    parts = [PRELUDE, _IO]
    runs, spaces = [], {}
    for n, ks in enumerate(kernels):
        assert ks.source.startswith(PRELUDE)
        if ks.name not in spaces:  # the same kernel (same source) is defined once
            spaces[ks.name] = f"k{len(spaces)}"
            parts.append(f"namespace {spaces[ks.name]} {{\n{ks.source[len(PRELUDE):]}\n}}\n")
        ns = spaces[ks.name]
        lines = [f"static void run{n}(const std::string& d) {{"]
        outputs = [name for ctype, name in ks.params if not ctype.startswith("const")]
        for ctype, name in ks.params:
            lines.append(f"    size_t sz_{name};")
            lines.append(f'    {ctype} {name} = ({ctype})mgx_read(d + "/k{n}_{name}.bin", &sz_{name});')
        names = ", ".join(name for _, name in ks.params)
        if ks.kind in ("pointwise", "scatternd", "horizontal"):  # one call per element (of the updates, for a scatter)
            lines.append(f"    for (long long i = 0; i < {ks.extent}LL; ++i) {ns}::mgx_elem(i, {names});")
        else:
            lines.append(f"    {ks.acc} sm[1];")
            lines.append(f"    for (long long r = 0; r < {ks.extent}LL; ++r) {ns}::mgx_row(r, 0, 1, sm, {names});")
        lines += [f'    mgx_write(d + "/k{n}_{y}.out", {y}, sz_{y});' for y in outputs]
        lines.append("}")
        runs.append("\n".join(lines))
    parts += runs
    parts.append("int main(int argc, char** argv) {\n    std::string d = argv[1];\n" +
                 "".join(f"    run{n}(d);\n" for n in range(len(kernels))) + "    return 0;\n}\n")
    return "\n".join(parts)


def _outputs(ks, out_shape):
    shapes = out_shape if isinstance(out_shape, tuple) else (out_shape,)
    return list(zip([name for ctype, name in ks.params if not ctype.startswith("const")], shapes))


def run_on_host(cases, workdir) -> list:
    """``cases``: ``[(KernelSource, [input base buffers], output Shape or tuple of Shapes[, [output
    base buffers]])]``: outputs start as those buffers when given (a scatter's output holds its data
    before the kernel runs), else as zeros.  Builds one host program with nvcc, runs it and returns
    each kernel's output(s) viewed with their shapes (a tuple for several)."""
    workdir = str(workdir)
    for n, (ks, bases, out_shape, *start) in enumerate(cases):
        for (_, name), b in zip(ks.params, bases):
            np.ascontiguousarray(b).tofile(os.path.join(workdir, f"k{n}_{name}.bin"))
        for k, (name, s) in enumerate(_outputs(ks, out_shape)):
            first = start[0][k] if start else np.zeros(max(s.element_space(), 1), s.np_dtype)
            np.ascontiguousarray(first).tofile(os.path.join(workdir, f"k{n}_{name}.bin"))
    src = os.path.join(workdir, "host.cu")
    with open(src, "w") as f:
        f.write(host_source([c[0] for c in cases]))
    exe = os.path.join(workdir, "host")
    subprocess.run([NVCC, "-DMGX_HOST_TEST", "-O1", "-o", exe, src], check=True, capture_output=True, text=True)
    subprocess.run([exe, workdir], check=True, capture_output=True, text=True)
    outs = []
    for n, (ks, _, out_shape, *_) in enumerate(cases):
        got = []
        for name, s in _outputs(ks, out_shape):
            flat = np.fromfile(os.path.join(workdir, f"k{n}_{name}.out"), s.np_dtype)
            got.append(np.lib.stride_tricks.as_strided(flat, s.lens, s.byte_strides()).copy())
        outs.append(tuple(got) if isinstance(out_shape, tuple) else got[0])
    return outs


def nvcc_compile(source: str, path) -> subprocess.CompletedProcess:
    """``nvcc --cubin`` of ``source`` written to ``path``: the device build only (front end, cicc, ptxas),
    as NVRTC compiles it; no host pass, which a runtime-compiled source never gets."""
    with open(path, "w") as f:
        f.write(source)
    return subprocess.run([NVCC, "--cubin", str(path), "-o", str(path) + ".cubin"], capture_output=True, text=True)
