"""Per-op C bodies of the generated fused kernels (``pointwise`` / ``fused_reduce`` on the gpu target).

:func:`op_body` gives, for one elementwise instruction, a C statement computing ``y`` from its
inputs, named as the elementwise statements of the kernel table name them (:mod:`.gpu_lowering`,
:mod:`.pointwise_gpu`): ``x`` (one input), ``a`` / ``b`` (two), ``c`` / ``a`` / ``b`` (``where``),
``x`` / ``lo`` / ``hi`` (``clip``).  Ops with a statement in the table use it as it is (float
attributes substituted, :func:`.gpu_lowering.gpu_body`); the others are written here with the numpy
semantics of their ``xp`` kernel (NaN-propagating ``max`` / ``min``, integer division by zero giving
0, Python-style ``mod``, ...).

Inside a kernel every value lives in its *register type* (:func:`reg_type`): float16 data is held
and computed in float32 (only an explicit ``convert`` to float16 rounds to half), float32 in float,
float64 in double, integers and bool in their own C type.  In a body, ``T`` is the register type of
the result and ``C`` the float compute type (``double`` when a float64 is involved, else ``float``).
Math functions are the C ones with an ``f`` suffix when ``C`` is float (``expf``, ``erff``, ...), so
the source needs no overloads from NVRTC, hipRTC or a host compiler.
"""
from __future__ import annotations

import re

import numpy as np

from .gpu_lowering import gpu_body

FLOATS = ("float16", "float32", "float64")
INTS = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")
SUPPORTED = FLOATS + INTS + ("bool",)

CTYPES = {"bool": "bool", "int8": "signed char", "uint8": "unsigned char", "int16": "short",
          "uint16": "unsigned short", "int32": "int", "uint32": "unsigned int", "int64": "long long",
          "uint64": "unsigned long long", "float16": "__half", "float32": "float", "float64": "double"}

_MATH = ("exp", "expm1", "log", "log1p", "sqrt", "sin", "cos", "tan", "tanh", "asin", "acos", "atan", "sinh",
         "cosh", "asinh", "acosh", "atanh", "erf", "floor", "ceil", "rint", "fabs", "pow", "fmod")
_MATH_RE = re.compile(r"\b(" + "|".join(_MATH) + r")\(")


def reg_type(dtype: str) -> str:
    """C type a value of numpy dtype ``dtype`` is held in inside a kernel (float16 -> float)."""
    return "float" if dtype == "float16" else CTYPES[dtype]


def compute_type(dtypes) -> str:
    return "double" if "float64" in dtypes else "float"


def specialize_math(body: str, ctype: str) -> str:
    """``exp(`` -> ``expf(`` (and the other C math functions) when the compute type is float."""
    return body if ctype == "double" else _MATH_RE.sub(lambda mt: mt.group(1) + "f(", body)


def c_constant(value, dtype: str) -> str:
    """A C expression of exactly ``value`` in the register type of ``dtype`` (non-finite floats
    through their bit patterns, finite ones as shortest round-trip decimals)."""
    if dtype == "bool":
        return "true" if bool(value) else "false"
    if dtype in INTS:
        n = int(value)
        if dtype == "int64" and n == -(1 << 63):
            return "(-9223372036854775807LL - 1)"
        suffix = "ULL" if dtype.startswith("u") else "LL"
        return f"(({CTYPES[dtype]}){n}{suffix})"
    if dtype == "float64":
        d = float(value)
        if not np.isfinite(d):
            return f"mgx_f64(0x{np.float64(d).view(np.uint64):016x}ULL)"
        return f"({np.format_float_scientific(np.float64(d), unique=True)})"
    v = np.float32(value)  # float16 values are exact in float
    if not np.isfinite(v):
        return f"mgx_f32(0x{v.view(np.uint32):08x}u)"
    return f"({np.format_float_scientific(v, unique=True)}f)"


# ---------------------------------------------------------------------------------------------------
# bodies: (predicate on (input dtypes, output dtype), body) per op name
# ---------------------------------------------------------------------------------------------------
def _floats(ins, out):
    return all(d in FLOATS for d in ins) and out in FLOATS


def _numeric(ins, out):
    return all(d in FLOATS + INTS for d in ins) and out in FLOATS + INTS


def _numeric_inputs(ins, out):
    return all(d in FLOATS + INTS for d in ins)


def _ints_or_bool(ins, out):
    return all(d in INTS + ("bool",) for d in ins)


def _any(ins, out):
    return all(d in SUPPORTED for d in ins)


_UNARY_FLOAT = {n: f"y = {fn}(x)" for n, fn in [
    ("sqrt", "sqrt"), ("exp", "exp"), ("log", "log"), ("sin", "sin"), ("cos", "cos"), ("tan", "tan"),
    ("tanh", "tanh"), ("asin", "asin"), ("acos", "acos"), ("atan", "atan"), ("sinh", "sinh"), ("cosh", "cosh"),
    ("asinh", "asinh"), ("acosh", "acosh"), ("atanh", "atanh"), ("erf", "erf"), ("floor", "floor"),
    ("ceil", "ceil"), ("nearbyint", "rint")]}

_TABLE = {
    "add": (_numeric, "y = (T)(a + b)"),
    "sub": (_numeric, "y = (T)(a - b)"),
    "mul": (_numeric, "y = (T)(a * b)"),
    "equal": (_any, "y = a == b"),
    "less": (_numeric_inputs, "y = a < b"),
    "greater": (_numeric_inputs, "y = a > b"),
    "less_equal": (_numeric_inputs, "y = a <= b"),
    "greater_equal": (_numeric_inputs, "y = a >= b"),
    "logical_and": (_any, "y = (bool)a && (bool)b"),
    "logical_or": (_any, "y = (bool)a || (bool)b"),
    "logical_xor": (_any, "y = (bool)a != (bool)b"),
    "bitwise_and": (_ints_or_bool, "y = (T)(a & b)"),
    "bitwise_or": (_ints_or_bool, "y = (T)(a | b)"),
    "bitwise_xor": (_ints_or_bool, "y = (T)(a ^ b)"),
    "recip": (_floats, "y = C(1) / x"),
    "not": (_any, "y = !(bool)x"),
    "contiguous": (_any, "y = x"),
    "where": (_any, None),  # the op's statement in the kernel table
    **{n: (_floats, b) for n, b in _UNARY_FLOAT.items()},
}
_FLOAT_OR_INT = {  # name: (float body, integer body)
    "div": ("y = a / b", "y = b == 0 ? T(0) : (T)(a / b)"),
    "max": ("y = (a > b || a != a) ? a : b", "y = a > b ? a : b"),
    "min": ("y = (a < b || a != a) ? a : b", "y = a < b ? a : b"),
    "neg": ("y = -x", "y = (T)(-x)"),
    "abs": ("y = fabs(x)", "y = (T)(x < 0 ? -x : x)"),
    "sign": ("y = x != x ? x : (T)((x > T(0)) - (x < T(0)))", "y = (T)((x > 0) - (x < 0))"),
    "relu": ("y = x < T(0) ? T(0) : x", "y = x < 0 ? T(0) : x"),
}


def _mod_body(op, floats: bool) -> str:
    if op.fmod:
        return "y = fmod(a, b)" if floats else "y = b == 0 ? T(0) : (T)(a % b)"
    if floats:  # numpy remainder: the sign of the divisor
        return "{ C r = fmod((C)a, (C)b); y = (T)((r != C(0) && ((r < C(0)) != (b < 0))) ? r + b : r); }"
    return "if (b == 0) { y = T(0); } else { T r = (T)(a % b); y = (T)((r != 0 && ((r < 0) != (b < 0))) ? r + b : r); }"


def _clip_body(floats: bool) -> str:
    if floats:  # maximum then minimum, NaN propagating as numpy's
        return "{ T t = (x > lo || x != x) ? x : lo; y = (t < hi || t != t) ? t : hi; }"
    return "{ T t = x > lo ? x : lo; y = t < hi ? t : hi; }"


def _isinf_body(op) -> str:
    pos = "x == (C)mgx_f64(0x7ff0000000000000ULL)"
    neg = "x == (C)mgx_f64(0xfff0000000000000ULL)"
    parts = ([pos] if op.detect_positive else []) + ([neg] if op.detect_negative else [])
    return "y = " + (" || ".join(f"({p})" for p in parts) if parts else "false")


def _convert_body(in_dtype: str, out_dtype: str) -> str:
    if out_dtype == "float16":  # round to half, then hold it in float
        return "y = __half2float(__float2half_rn((float)x))"
    if out_dtype == "bool":
        return "y = x != 0"
    if out_dtype.startswith("u") and in_dtype in FLOATS:  # through int64: wraps as numpy does on x86
        return "y = (T)(long long)x"
    return "y = (T)x"


def op_body(op, in_dtypes, out_dtype) -> str | None:
    """The C statement computing ``y`` for ``op`` with inputs of ``in_dtypes`` and a result of
    ``out_dtype`` (numpy names), or None when the op (or this typing of it) has no fused body."""
    in_dtypes, name = tuple(in_dtypes), op.name
    if any(d not in SUPPORTED for d in in_dtypes) or out_dtype not in SUPPORTED:
        return None
    floats = all(d in FLOATS for d in in_dtypes)
    ints = all(d in INTS for d in in_dtypes)
    if name == "convert":
        return _convert_body(in_dtypes[0], out_dtype)
    if name == "isnan":
        return "y = x != x" if floats else "y = false"
    if name == "isinf":
        return _isinf_body(op) if floats else "y = false"
    if name == "bitwise_not":
        return "y = !x" if in_dtypes[0] == "bool" else ("y = (T)(~x)" if ints else None)
    if name == "mod":
        return _mod_body(op, floats) if (floats or ints) else None
    if name == "clip":
        return _clip_body(floats) if len(in_dtypes) == 3 and (floats or ints) else None
    if name == "pow":
        return "y = (T)pow((C)a, (C)b)" if out_dtype in FLOATS and all(d != "bool" for d in in_dtypes) else None
    if name in _FLOAT_OR_INT:
        fbody, ibody = _FLOAT_OR_INT[name]
        if name in ("abs", "relu") and ints and in_dtypes[0].startswith("u"):
            return "y = x"
        return fbody if floats else (ibody if ints else None)
    entry = _TABLE.get(name)
    if entry is not None:
        ok, body = entry
        return (body or gpu_body(op)) if ok(in_dtypes, out_dtype) else None
    body = gpu_body(op)
    if body is not None and floats:  # sigmoid, leaky_relu, elu, gelu, prelu, ...
        return body
    return None


def arg_names(op, n: int) -> list[str]:
    """The names a body uses for the op's ``n`` inputs."""
    if op.name == "where":
        return ["c", "a", "b"]
    if op.name == "clip":
        return ["x", "lo", "hi"][:n]
    return ["x"] if n == 1 else ["a", "b"] if n == 2 else [f"x{k}" for k in range(n)]
