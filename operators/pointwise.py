"""Pointwise (elementwise) operations with numpy-style multidirectional broadcasting.

Each op has one kernel written against ``xp`` (numpy or CuPy).  On the gpu target the ops that would
need several array-library calls run as one elementwise kernel of a CUDA / HIP statement, their entry in
the kernel table (:mod:`.pointwise_gpu`).

ONNX spec: https://onnx.ai/onnx/operators/ (Add, Sub, ..., Where, Cast, Clip).
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.shape import Shape, broadcast_lens
from .base import Operation, check_inputs, register_op

FLOATS = ("float16", "float32", "float64")


class Pointwise(Operation):
    nargs: int | tuple[int, int] = 1
    out_dtype: str | None = None  # None: same as input 0
    alloc_free = False  # the xp kernel allocates no temporaries (safe to capture as is)
    inplace_ok = True  # out may be input 0's buffer (same shape and layout): elementwise

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, self.nargs)
        lens = broadcast_lens(*[s.lens for s in inputs], where=self.name)
        return Shape(self.out_dtype or inputs[0].dtype, lens)


# ---------------------------------------------------------------------------------------------------
# unary
# ---------------------------------------------------------------------------------------------------
def _unary(name, fn, out_dtype=None, floats_only=False):
    def compute(self, ctx, out, args, ws):
        fn(ctx.xp, args[0], out)

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        if floats_only and inputs[0].dtype not in FLOATS:
            raise ShapeError(f"{self.name}: needs a floating-point input, got {inputs[0].dtype}")
        return Shape(self.out_dtype or inputs[0].dtype, inputs[0].lens)

    cls = type(name, (Pointwise,), {"name": name, "compute": compute, "compute_shape": compute_shape,
                                    "out_dtype": out_dtype, "alloc_free": name not in ("sigmoid",)})
    return register_op(cls)


def _erf(xp, x, out):
    if xp is np:
        from scipy.special import erf
    else:  # CuPy
        from cupyx.scipy.special import erf
    erf(x, out=out)


def _sigmoid_ref(xp, x, out):
    xp.negative(x, out=out)
    xp.exp(out, out=out)
    xp.add(out, 1, out=out)
    xp.reciprocal(out, out=out)


def _recip(xp, x, out):
    if x.dtype.kind == "f":
        xp.reciprocal(x, out=out)
    else:
        xp.floor_divide(1, x, out=out)


Neg = _unary("neg", lambda xp, x, o: xp.negative(x, out=o))
Abs = _unary("abs", lambda xp, x, o: xp.absolute(x, out=o))
Sqrt = _unary("sqrt", lambda xp, x, o: xp.sqrt(x, out=o), floats_only=True)
Recip = _unary("recip", _recip)
Exp = _unary("exp", lambda xp, x, o: xp.exp(x, out=o), floats_only=True)
Log = _unary("log", lambda xp, x, o: xp.log(x, out=o), floats_only=True)
Sin = _unary("sin", lambda xp, x, o: xp.sin(x, out=o), floats_only=True)
Cos = _unary("cos", lambda xp, x, o: xp.cos(x, out=o), floats_only=True)
Tan = _unary("tan", lambda xp, x, o: xp.tan(x, out=o), floats_only=True)
Tanh = _unary("tanh", lambda xp, x, o: xp.tanh(x, out=o), floats_only=True)
Asin = _unary("asin", lambda xp, x, o: xp.arcsin(x, out=o), floats_only=True)
Acos = _unary("acos", lambda xp, x, o: xp.arccos(x, out=o), floats_only=True)
Atan = _unary("atan", lambda xp, x, o: xp.arctan(x, out=o), floats_only=True)
Sinh = _unary("sinh", lambda xp, x, o: xp.sinh(x, out=o), floats_only=True)
Cosh = _unary("cosh", lambda xp, x, o: xp.cosh(x, out=o), floats_only=True)
Asinh = _unary("asinh", lambda xp, x, o: xp.arcsinh(x, out=o), floats_only=True)
Acosh = _unary("acosh", lambda xp, x, o: xp.arccosh(x, out=o), floats_only=True)
Atanh = _unary("atanh", lambda xp, x, o: xp.arctanh(x, out=o), floats_only=True)
Floor = _unary("floor", lambda xp, x, o: xp.floor(x, out=o))
Ceil = _unary("ceil", lambda xp, x, o: xp.ceil(x, out=o))
Round = _unary("nearbyint", lambda xp, x, o: xp.rint(x, out=o))
Sign = _unary("sign", lambda xp, x, o: xp.sign(x, out=o))
Erf = _unary("erf", _erf, floats_only=True)
Sigmoid = _unary("sigmoid", _sigmoid_ref, floats_only=True)
Relu = _unary("relu", lambda xp, x, o: xp.maximum(x, 0, out=o))
IsNaN = _unary("isnan", lambda xp, x, o: xp.isnan(x, out=o), out_dtype="bool")
Not = _unary("not", lambda xp, x, o: xp.logical_not(x, out=o), out_dtype="bool")
BitNot = _unary("bitwise_not", lambda xp, x, o: xp.invert(x, out=o))


@register_op
class IsInf(Pointwise):
    name = "isinf"
    out_dtype = "bool"
    alloc_free = True

    def __init__(self, detect_positive=1, detect_negative=1):
        super().__init__(detect_positive=int(detect_positive), detect_negative=int(detect_negative))

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        if self.detect_positive and self.detect_negative:
            xp.isinf(x, out=out)
        elif self.detect_positive:
            xp.equal(x, np.inf, out=out)
        elif self.detect_negative:
            xp.equal(x, -np.inf, out=out)
        else:
            out[...] = False


class _Param1(Pointwise):
    """Unary op with float attributes (alpha, beta, ...)."""

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        if inputs[0].dtype not in FLOATS:
            raise ShapeError(f"{self.name}: needs a floating-point input, got {inputs[0].dtype}")
        return Shape(inputs[0].dtype, inputs[0].lens)


@register_op
class LeakyRelu(_Param1):
    name = "leaky_relu"

    def __init__(self, alpha=0.01):
        super().__init__(alpha=float(alpha))

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        out[...] = xp.where(x >= 0, x, x * x.dtype.type(self.alpha))


@register_op
class Elu(_Param1):
    name = "elu"

    def __init__(self, alpha=1.0):
        super().__init__(alpha=float(alpha))

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        out[...] = xp.where(x > 0, x, (xp.exp(x) - 1) * x.dtype.type(self.alpha))


@register_op
class Selu(_Param1):
    name = "selu"

    def __init__(self, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
        super().__init__(alpha=float(alpha), gamma=float(gamma))

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        t = x.dtype.type
        out[...] = xp.where(x > 0, x * t(self.gamma), (xp.exp(x) * t(self.alpha) - t(self.alpha)) * t(self.gamma))


@register_op
class Celu(_Param1):
    name = "celu"

    def __init__(self, alpha=1.0):
        super().__init__(alpha=float(alpha))

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        a = x.dtype.type(self.alpha)
        out[...] = xp.maximum(x, 0) + xp.minimum(0, a * (xp.exp(x / a) - 1))


@register_op
class HardSigmoid(_Param1):
    name = "hard_sigmoid"

    def __init__(self, alpha=0.2, beta=0.5):
        super().__init__(alpha=float(alpha), beta=float(beta))

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        t = x.dtype.type
        xp.multiply(x, t(self.alpha), out=out)
        xp.add(out, t(self.beta), out=out)
        xp.clip(out, 0, 1, out=out)


@register_op
class HardSwish(_Param1):
    name = "hard_swish"

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        t = x.dtype.type
        out[...] = x * xp.clip(x / t(6) + t(0.5), 0, 1)


@register_op
class Softplus(_Param1):
    name = "softplus"

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        out[...] = xp.logaddexp(x, x.dtype.type(0))


@register_op
class Softsign(_Param1):
    name = "softsign"

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        out[...] = x / (1 + xp.abs(x))


@register_op
class ThresholdedRelu(_Param1):
    name = "thresholded_relu"

    def __init__(self, alpha=1.0):
        super().__init__(alpha=float(alpha))

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        out[...] = xp.where(x > x.dtype.type(self.alpha), x, 0)


@register_op
class Gelu(_Param1):
    name = "gelu"

    def __init__(self, approximate="none"):
        super().__init__(approximate=str(approximate))

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        t = x.dtype.type
        if self.approximate == "tanh":
            inner = (x + t(0.044715) * x * x * x) * t(np.sqrt(2.0 / np.pi))
            out[...] = t(0.5) * x * (1 + xp.tanh(inner))
        else:
            e = xp.empty_like(x)
            _erf(xp, x * t(1 / np.sqrt(2.0)), e)
            out[...] = t(0.5) * x * (1 + e)


@register_op
class QuickGelu(_Param1):
    """``y = x * sigmoid(alpha * x)`` (onnxruntime com.microsoft::QuickGelu; alpha 1.702 by default)."""

    name = "quick_gelu"
    alloc_free = True

    def __init__(self, alpha=1.702):
        super().__init__(alpha=float(alpha))

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        t = x.dtype.type
        with _quiet_overflow(xp):
            xp.multiply(x, t(-self.alpha), out=out)
            xp.exp(out, out=out)
        xp.add(out, t(1), out=out)
        xp.true_divide(x, out, out=out)


def _quiet_overflow(xp):
    """exp of a large argument is inf by design here (x / inf = 0): no numpy warning for it."""
    import contextlib

    return np.errstate(over="ignore") if xp is np else contextlib.nullcontext()


@register_op
class Shrink(_Param1):
    name = "shrink"

    def __init__(self, bias=0.0, lambd=0.5):
        super().__init__(bias=float(bias), lambd=float(lambd))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        return Shape(inputs[0].dtype, inputs[0].lens)

    def compute(self, ctx, out, args, ws):
        xp, x = ctx.xp, args[0]
        b, l = self.bias, self.lambd
        out[...] = xp.where(x < -l, x + b, xp.where(x > l, x - b, 0)).astype(x.dtype)


# ---------------------------------------------------------------------------------------------------
# binary
# ---------------------------------------------------------------------------------------------------
def _binary(name, fn, out_dtype=None, same_type=True):
    def compute(self, ctx, out, args, ws):
        fn(ctx.xp, args[0], args[1], out)

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 2)
        if same_type and inputs[0].dtype != inputs[1].dtype:
            raise ShapeError(f"{self.name}: input types differ ({inputs[0].dtype} vs {inputs[1].dtype})")
        lens = broadcast_lens(inputs[0].lens, inputs[1].lens, where=self.name)
        return Shape(self.out_dtype or inputs[0].dtype, lens)

    cls = type(name, (Pointwise,), {"name": name, "nargs": 2, "compute": compute,
                                    "compute_shape": compute_shape, "out_dtype": out_dtype,
                                    "alloc_free": name != "div"})
    return register_op(cls)


def _div(xp, a, b, out):
    if out.dtype.kind == "f":
        xp.true_divide(a, b, out=out)
    else:  # integer division truncates toward zero (C semantics, as onnxruntime)
        q = xp.floor_divide(a, b)
        fix = (xp.remainder(a, b) != 0) & ((a < 0) != (b < 0))
        out[...] = q + fix


def _pow(xp, a, b, out):
    xp.power(a, b, out=out, casting="unsafe")


Add = _binary("add", lambda xp, a, b, o: xp.add(a, b, out=o))
Sub = _binary("sub", lambda xp, a, b, o: xp.subtract(a, b, out=o))
Mul = _binary("mul", lambda xp, a, b, o: xp.multiply(a, b, out=o))
Div = _binary("div", _div)
Pow = _binary("pow", _pow, same_type=False)
Max = _binary("max", lambda xp, a, b, o: xp.maximum(a, b, out=o))
Min = _binary("min", lambda xp, a, b, o: xp.minimum(a, b, out=o))
Equal = _binary("equal", lambda xp, a, b, o: xp.equal(a, b, out=o), out_dtype="bool")
Less = _binary("less", lambda xp, a, b, o: xp.less(a, b, out=o), out_dtype="bool")
Greater = _binary("greater", lambda xp, a, b, o: xp.greater(a, b, out=o), out_dtype="bool")
LessEq = _binary("less_equal", lambda xp, a, b, o: xp.less_equal(a, b, out=o), out_dtype="bool")
GreaterEq = _binary("greater_equal", lambda xp, a, b, o: xp.greater_equal(a, b, out=o), out_dtype="bool")
And = _binary("logical_and", lambda xp, a, b, o: xp.logical_and(a, b, out=o), out_dtype="bool")
Or = _binary("logical_or", lambda xp, a, b, o: xp.logical_or(a, b, out=o), out_dtype="bool")
Xor = _binary("logical_xor", lambda xp, a, b, o: xp.logical_xor(a, b, out=o), out_dtype="bool")
BitAnd = _binary("bitwise_and", lambda xp, a, b, o: xp.bitwise_and(a, b, out=o))
BitOr = _binary("bitwise_or", lambda xp, a, b, o: xp.bitwise_or(a, b, out=o))
BitXor = _binary("bitwise_xor", lambda xp, a, b, o: xp.bitwise_xor(a, b, out=o))


@register_op
class Mod(Pointwise):
    name = "mod"
    nargs = 2
    alloc_free = True

    def __init__(self, fmod=0):
        super().__init__(fmod=int(fmod))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 2)
        return Shape(inputs[0].dtype, broadcast_lens(inputs[0].lens, inputs[1].lens, where=self.name))

    def compute(self, ctx, out, args, ws):
        xp = ctx.xp
        (xp.fmod if self.fmod else xp.remainder)(args[0], args[1], out=out)


@register_op
class BitShift(Pointwise):
    name = "bitshift"
    nargs = 2
    alloc_free = True

    def __init__(self, direction="LEFT"):
        super().__init__(direction=str(direction))

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 2)
        return Shape(inputs[0].dtype, broadcast_lens(inputs[0].lens, inputs[1].lens, where=self.name))

    def compute(self, ctx, out, args, ws):
        xp = ctx.xp
        (xp.left_shift if self.direction == "LEFT" else xp.right_shift)(args[0], args[1], out=out)


@register_op
class PRelu(Pointwise):
    name = "prelu"
    nargs = 2

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 2)
        return Shape(inputs[0].dtype, broadcast_lens(inputs[0].lens, inputs[1].lens, where=self.name))

    def compute(self, ctx, out, args, ws):
        xp, x, s = ctx.xp, args[0], args[1]
        out[...] = xp.where(x >= 0, x, x * s)


# ---------------------------------------------------------------------------------------------------
# ternary / conversions
# ---------------------------------------------------------------------------------------------------
@register_op
class Where(Pointwise):
    name = "where"
    nargs = 3

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 3)
        if inputs[0].dtype != "bool":
            raise ShapeError(f"where: condition must be bool, got {inputs[0].dtype}")
        if inputs[1].dtype != inputs[2].dtype:
            raise ShapeError(f"where: branch types differ ({inputs[1].dtype} vs {inputs[2].dtype})")
        lens = broadcast_lens(*[s.lens for s in inputs], where=self.name)
        return Shape(inputs[1].dtype, lens)

    def compute(self, ctx, out, args, ws):
        xp = ctx.xp
        out[...] = xp.where(args[0], args[1], args[2])


@register_op
class Clip(Pointwise):
    """clip(x, min, max) as onnxruntime computes it: ``y = x < min ? min : x``, then
    ``y = max < y ? max : y``, so a NaN input stays NaN and a NaN bound is ignored.  Missing bounds are
    given as None (the ONNX parser passes the type's lowest / largest value instead)."""

    name = "clip"
    nargs = (1, 3)

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, (1, 3))
        return Shape(inputs[0].dtype, inputs[0].lens)

    def compute(self, ctx, out, args, ws):
        xp = ctx.xp
        lo = args[1] if len(args) > 1 and args[1] is not None else None
        hi = args[2] if len(args) > 2 and args[2] is not None else None
        y = args[0]
        if lo is not None:
            y = xp.where(y < lo, lo, y)
        if hi is not None:
            y = xp.where(hi < y, hi, y)
        xp.copyto(out, y)


@register_op
class Convert(Pointwise):
    """ONNX Cast: convert to ``target_type`` (numpy dtype name)."""

    name = "convert"
    alloc_free = True

    def __init__(self, target_type="float32"):
        super().__init__(target_type=np.dtype(target_type).name)

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        return Shape(self.target_type, inputs[0].lens)

    def compute(self, ctx, out, args, ws):
        # float -> int truncates toward zero (a C cast) in numpy, CuPy and onnxruntime alike
        ctx.xp.copyto(out, args[0], casting="unsafe")


@register_op
class Identity(Pointwise):
    """A copy (``contiguous`` in MIGraphX terms): makes a standard-layout buffer of its input."""

    name = "contiguous"
    alloc_free = True

    def compute_shape(self, inputs, mods=()):
        check_inputs(self, inputs, 1)
        return Shape(inputs[0].dtype, inputs[0].lens)

    def compute(self, ctx, out, args, ws):
        ctx.xp.copyto(out, args[0])


Div.is_alloc_free = lambda self, inputs: inputs[0].dtype in FLOATS
