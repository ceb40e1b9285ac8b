"""Elementwise math reference ops (ai.onnx): arithmetic, comparison, logic, bitwise, Cast.

Every binary op broadcasts numpy-style (ONNX multidirectional broadcasting is the same
rule) and returns the element type of its first input. The semantics pinned here, each
evaluated by ``tests/kernels/reference/test_tensor_ops.py``:

- integer ``Div`` truncates toward zero, as C does:  ``-7 / 2 = -3``   (numpy's ``//``
  floors: ``-4``);
- ``Mod`` with ``fmod=0`` (integers; floats from opset 28) takes the sign of the
  divisor: ``-7 mod 2 = 1``; with ``fmod=1`` it takes the sign of the dividend (C
  ``fmod``): ``fmod(-7, 2) = -1``;
- ``Round`` rounds half to even: ``0.5 -> 0``, ``1.5 -> 2``, ``-2.5 -> -2``;
- ``Pow`` returns the base's element type (``int32 ** float32 -> int32``); a float32
  base with one exponent of 1, 2, 3 or 0.5 is ``x``, ``x · x``, ``(x · x) · x`` or
  ``sqrt(x)`` (POW_EXACT_FORMS);
- integer overflow wraps (two's complement), as numpy does.

``Cast`` follows the ONNX table: float -> float8 saturates to ±FLT_MAX by default
(``saturate=1``; NaN stays NaN), float -> integer truncates toward zero, integer ->
narrower integer keeps the low bits. bfloat16, float8, float4, int4 and int2 go through
``ml_dtypes``; string <-> number casts parse/print with Python's float syntax.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import ml_dtypes
import numpy as np

from quanta.kernels.reference.float_ops import atan_f32, cos_f32, exp_f32, log_f32, pow_f32, sin_f32
from quanta.kernels.reference.registry import OpError, register

__all__ = ["ONNX_DTYPES", "STRING", "cast_to", "onnx_dtype"]

# TensorProto.DataType -> numpy dtype. 8 (STRING) is numpy ``object`` holding ``str``.
# The narrow float and integer types come from ml_dtypes; a type that the installed
# ml_dtypes lacks (float6 and int2 need >= 0.5) is absent, and Cast to it is an OpError.
STRING = 8
_NUMPY_TYPES = {
    1: np.float32,
    2: np.uint8,
    3: np.int8,
    4: np.uint16,
    5: np.int16,
    6: np.int32,
    7: np.int64,
    STRING: object,
    9: np.bool_,
    10: np.float16,
    11: np.float64,
    12: np.uint32,
    13: np.uint64,
    14: np.complex64,
    15: np.complex128,
}
_ML_DTYPES = {
    16: "bfloat16",
    17: "float8_e4m3fn",
    18: "float8_e4m3fnuz",
    19: "float8_e5m2",
    20: "float8_e5m2fnuz",
    21: "uint4",
    22: "int4",
    23: "float4_e2m1fn",
    24: "float8_e8m0fnu",
    25: "uint2",
    26: "int2",
    27: "float6_e2m3fn",
    28: "float6_e3m2fn",
}
ONNX_DTYPES: dict[int, np.dtype] = {code: np.dtype(t) for code, t in _NUMPY_TYPES.items()} | {
    code: np.dtype(getattr(ml_dtypes, name)) for code, name in _ML_DTYPES.items() if hasattr(ml_dtypes, name)
}
_FLOAT8 = {17, 18, 19, 20}
_E8M0 = 24


def onnx_dtype(to: int, op: str = "Cast") -> np.dtype:
    """The numpy dtype of an ONNX ``TensorProto.DataType`` code."""
    try:
        return ONNX_DTYPES[int(to)]
    except KeyError:
        raise OpError(f"{op}: expected a TensorProto data type in {sorted(ONNX_DTYPES)}, got {to}") from None


def _is_int(a: np.ndarray) -> bool:
    return np.issubdtype(a.dtype, np.integer)


# ---------------------------------------------------------------------------------
# unary


def _unary(op_type: str, fn: np.ufunc) -> None:
    def op(ctx, x: np.ndarray) -> np.ndarray:
        del ctx  # unused
        with np.errstate(all="ignore"):
            return np.asarray(fn(x))

    op.__name__ = op.__qualname__ = op_type.lower()
    register(op_type)(op)


for _name, _fn in {
    "Neg": np.negative,
    "Abs": np.absolute,
    "Sqrt": np.sqrt,
    "Reciprocal": np.reciprocal,
    "Floor": np.floor,
    "Ceil": np.ceil,
    "Round": np.rint,  # half to even
    "Sign": np.sign,
    "Tan": np.tan,
    "Asin": np.arcsin,
    "Acos": np.arccos,
    "Sinh": np.sinh,
    "Cosh": np.cosh,
    "Asinh": np.arcsinh,
    "Acosh": np.arccosh,
    "Atanh": np.arctanh,
    "Not": np.logical_not,
    "BitwiseNot": np.invert,
    "IsNaN": np.isnan,
}.items():
    _unary(_name, _fn)


def _float32_defined(
    op_type: str, f32_fn: Callable[[np.ndarray], np.ndarray], np_fn: np.ufunc, why: str
) -> None:
    """float32: quanta's own definition of the function (docs/float-ops.md), whose bytes do
    not depend on the NumPy build or the CPU; other types: the NumPy function."""

    def op(ctx, x: np.ndarray) -> np.ndarray:
        del ctx  # unused
        if x.dtype == np.float32:
            return f32_fn(x)
        with np.errstate(all="ignore"):
            return np.asarray(np_fn(x))

    op.__name__ = op.__qualname__ = op_type.lower()
    op.__doc__ = f"float32: quanta's {op_type.lower()}, {why}; other types: np.{np_fn.__name__}."
    register(op_type)(op)


_float32_defined(
    "Exp", exp_f32, np.exp, "eqs. (E1)-(E6) (np.exp's float32 SIMD code differs between builds and CPUs)"
)
_float32_defined(
    "Log", log_f32, np.log, "eqs. (LN1)-(LN6) (np.log's float32 SIMD code differs between builds and CPUs)"
)
_float32_defined(
    "Cos",
    cos_f32,
    np.cos,
    "eqs. (CS1)-(CS6) (np.cos's float32 SIMD code is not correctly rounded and differs between builds)",
)
_float32_defined(
    "Atan",
    atan_f32,
    np.arctan,
    "eqs. (AT1)-(AT4) (np.arctan's float32 SIMD code is not correctly rounded and differs between builds)",
)


@register("Sin")
def sin(ctx, x: np.ndarray) -> np.ndarray:
    """float32: quanta's sin, eqs. (CS1)-(CS5), (SN1) of docs/float-ops.md (np.sin's float32
    SIMD code is not correctly rounded and differs between builds); other types: np.sin."""
    del ctx  # unused
    if x.dtype == np.float32:
        return sin_f32(x)
    with np.errstate(all="ignore"):
        return np.asarray(np.sin(x))


@register("IsInf")
def isinf(ctx, x: np.ndarray, detect_negative: int = 1, detect_positive: int = 1) -> np.ndarray:
    del ctx  # unused
    out = np.zeros(x.shape, dtype=bool)
    if detect_positive:
        out |= np.isposinf(x)
    if detect_negative:
        out |= np.isneginf(x)
    return out


@register("Identity")
def identity(ctx, x: np.ndarray) -> tuple[np.ndarray]:
    del ctx  # unused
    return (x,)  # a tuple: a sequence input (a list) is one output, not one per tensor


# ---------------------------------------------------------------------------------
# binary arithmetic (result has the first input's element type)


def _binary(op_type: str, fn: np.ufunc) -> None:
    def op(ctx, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        del ctx  # unused
        with np.errstate(all="ignore"):
            return np.asarray(fn(a, b)).astype(a.dtype, copy=False)

    op.__name__ = op.__qualname__ = op_type.lower()
    register(op_type)(op)


for _name, _fn in {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "BitwiseAnd": np.bitwise_and,
    "BitwiseOr": np.bitwise_or,
    "BitwiseXor": np.bitwise_xor,
}.items():
    _binary(_name, _fn)


def int_div_trunc(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division truncating toward zero (C semantics): ``-7 / 2 = -3``.

    numpy's ``//`` floors; the floor quotient is one too small exactly when the
    remainder is non-zero and the operands have opposite signs. Division by zero is
    undefined in ONNX; here it gives 0 (numpy's result), never an exception.
    """
    with np.errstate(all="ignore"):
        q = np.floor_divide(a, b)
        r = np.remainder(a, b)
    adjust = (r != 0) & ((a < 0) != (b < 0))
    return np.asarray(q + adjust.astype(q.dtype))


@register("Div")
def div(ctx, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    del ctx  # unused
    if _is_int(a) and _is_int(b):
        return int_div_trunc(a, b).astype(a.dtype, copy=False)
    with np.errstate(all="ignore"):
        return np.asarray(np.divide(a, b)).astype(a.dtype, copy=False)


@register("Mod")
def mod(ctx, a: np.ndarray, b: np.ndarray, fmod: int = 0) -> np.ndarray:
    # Floats with fmod=0 are an error before opset 28 and floor-mod from 28 on; numpy's
    # np.mod is that floor-mod (sign of the divisor) for both, so no opset switch is needed.
    del ctx  # unused
    with np.errstate(all="ignore"):
        out = np.fmod(a, b) if fmod else np.mod(a, b)
    return np.asarray(out).astype(a.dtype, copy=False)


#: float32 Pow with one exponent in this table is computed by these exact IEEE forms
#: (docs/float-ops.md "Pow"): powf / NumPy's SIMD power are not correctly rounded and
#: differ between builds, these are one or two correctly rounded operations
POW_EXACT_FORMS = {
    1.0: lambda x: x.copy(),
    2.0: lambda x: x * x,
    3.0: lambda x: (x * x) * x,
    0.5: np.sqrt,
}


def pow_exponent(y: np.ndarray) -> float | None:
    """The exponent of a float32 Pow that takes an exact form (POW_EXACT_FORMS), else None."""
    if y.size != 1 or y.dtype.kind not in "fiu":
        return None
    e = float(np.asarray(y).reshape(()))
    return e if e in POW_EXACT_FORMS else None


def pow_general_exponent(y: np.ndarray) -> float | None:
    """The exponent of a float32 Pow computed by (PW1)-(PW3) (float_ops.pow_f32): one
    finite element, a float32 value, not one of POW_EXACT_FORMS; else None."""
    if y.size != 1 or y.dtype.kind not in "fiu" or pow_exponent(y) is not None:
        return None
    e = float(np.asarray(y).reshape(()))
    return e if np.isfinite(e) and float(np.float32(e)) == e else None


@register("Pow")
def pow_(ctx, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    del ctx  # unused
    if x.dtype == np.float32 and y.ndim <= x.ndim and pow_exponent(y) is not None:
        with np.errstate(all="ignore"):
            return np.asarray(POW_EXACT_FORMS[pow_exponent(y)](x), np.float32)
    if x.dtype == np.float32 and y.ndim <= x.ndim and pow_general_exponent(y) is not None:
        # powf and NumPy's SIMD power differ between builds: quanta's own pow, (PW1)-(PW3)
        return pow_f32(x, pow_general_exponent(y))
    with np.errstate(all="ignore"):
        if _is_int(x) and _is_int(y) and np.any(y < 0):
            # numpy refuses integer ** negative integer; in real arithmetic the result
            # truncates to 0 except for bases ±1, which float64 computes exactly.
            out = np.power(x.astype(np.float64), y.astype(np.float64))
        else:
            out = np.power(x, y)
    return np.asarray(out).astype(x.dtype)


@register("BitShift")
def bitshift(ctx, x: np.ndarray, y: np.ndarray, direction: str = "") -> np.ndarray:
    """x << y or x >> y; a signed right shift is arithmetic (sign-extending).

    A shift amount that is negative or >= the bit width gives what the sign extension
    alone produces: -1 for a right shift of a negative x, 0 otherwise (opset 28 text;
    earlier opsets only allow unsigned types, where this is 0 as well).
    """
    del ctx  # unused
    if direction not in ("LEFT", "RIGHT"):
        raise OpError(f"BitShift: expected direction 'LEFT' or 'RIGHT', got {direction!r}")
    bits = x.dtype.itemsize * 8
    x, y = np.broadcast_arrays(x, y)
    in_range = (y >= 0) & (y < bits)
    amount = np.where(in_range, y, 0).astype(x.dtype)
    if direction == "LEFT":
        shifted, overflow = np.left_shift(x, amount), np.zeros_like(x)
    else:
        shifted = np.right_shift(x, amount)
        overflow = np.where(x < 0, -1, 0).astype(x.dtype) if x.dtype.kind == "i" else np.zeros_like(x)
    return np.asarray(np.where(in_range, shifted, overflow)).astype(x.dtype, copy=False)


# ---------------------------------------------------------------------------------
# comparison and logic (bool results)


def _compare(op_type: str, fn: np.ufunc) -> None:
    def op(ctx, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        del ctx  # unused
        return np.asarray(fn(a, b), dtype=bool)

    op.__name__ = op.__qualname__ = op_type.lower()
    register(op_type)(op)


for _name, _fn in {
    "Equal": np.equal,
    "Less": np.less,
    "LessOrEqual": np.less_equal,
    "Greater": np.greater,
    "GreaterOrEqual": np.greater_equal,
    "And": np.logical_and,
    "Or": np.logical_or,
    "Xor": np.logical_xor,
}.items():
    _compare(_name, _fn)


@register("Where")
def where(ctx, condition: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    del ctx  # unused
    return np.asarray(np.where(condition, x, y)).astype(x.dtype, copy=False)


# ---------------------------------------------------------------------------------
# variadic


def _variadic(op_type: str, fn: np.ufunc) -> None:
    def op(ctx, *xs: np.ndarray) -> np.ndarray:
        del ctx  # unused
        if not xs:
            raise OpError(f"{op_type}: expected at least one input, got 0")
        with np.errstate(all="ignore"):
            out = functools.reduce(fn, xs)
        return np.asarray(out).astype(xs[0].dtype, copy=False)

    op.__name__ = op.__qualname__ = op_type.lower()
    register(op_type)(op)


_variadic("Max", np.maximum)  # NaN propagates
_variadic("Min", np.minimum)
_variadic("Sum", np.add)


@register("Mean")
def mean(ctx, *xs: np.ndarray) -> np.ndarray:
    del ctx  # unused
    if not xs:
        raise OpError("Mean: expected at least one input, got 0")
    total = np.asarray(functools.reduce(np.add, xs)).astype(xs[0].dtype, copy=False)
    return np.asarray(total / np.array(len(xs), dtype=total.dtype)).astype(total.dtype, copy=False)


# ---------------------------------------------------------------------------------
# Cast


def _parse_number(s: str) -> float:
    t = s.strip()
    low = t.lower()
    if low in ("inf", "+inf", "infinity", "+infinity"):
        return float("inf")
    if low in ("-inf", "-infinity"):
        return float("-inf")
    return float(t)  # "nan", "1e-5", "100.5" ...


def _parse_int(s: str) -> int:
    try:
        return int(s.strip())
    except ValueError:  # "100.5" -> 100 (undefined in ONNX; truncation as for floats)
        return int(_parse_number(s))


def _to_string(x: np.ndarray) -> np.ndarray:
    """Numbers -> str in plain notation (numpy's shortest round-trip form of each
    element type); NaN and ±Inf use the literals ONNX reserves ("NaN", "INF", "-INF")."""
    if x.dtype.kind in "iub":
        flat = [str(v) for v in x.ravel().tolist()]
    else:
        values = x.ravel() if x.dtype.kind == "f" else x.astype(np.float32).ravel()
        flat = [_float_to_string(v) for v in values]
    return np.array(flat, dtype=object).reshape(x.shape)


def _float_to_string(v: np.floating) -> str:
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "INF" if v > 0 else "-INF"
    return str(v)


def _cast_e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """float -> float8e8m0 (unsigned power of two 2^(e-127), e in 0..254; 255 is NaN).

    The float32 exponent field is the result; a non-zero mantissa rounds it by
    ``round_mode``: "up" (the default, as CUDA does) adds one, "down" truncates,
    "nearest" adds one from half the mantissa range up (a tie, exactly 1.5 * 2^e, rounds
    up for normal inputs, as onnx.reference does; e8m0 has no mantissa bit to be even).
    With ``saturate`` Inf and overflow give E8M0_MAX (254) and zero gives E8M0_MIN (0);
    without, those give NaN (the ONNX Cast table; onnx.reference maps Inf to NaN even
    with ``saturate``, and 0 to E8M0_MIN without it). Non-zero values below E8M0_MIN
    round like any other (to 2^-127, or up to 2^-126), in both modes. Negative inputs
    are undefined in ONNX; their sign is ignored here.
    """
    x32 = np.asarray(x, dtype=np.float32)
    bits = x32.view(np.uint32)
    exponent = ((bits >> 23) & 0xFF).astype(np.int32)
    mantissa = bits & 0x7FFFFF
    special = exponent == 0xFF
    if round_mode == "up":
        exponent = exponent + (mantissa != 0)
    elif round_mode == "nearest":
        half = (mantissa & 0x400000) != 0
        rest = (mantissa & 0x3FFFFF) != 0
        exponent = exponent + (half & (rest | (exponent > 0)))
    elif round_mode != "down":
        raise OpError(f"Cast: expected round_mode 'up', 'down' or 'nearest', got {round_mode!r}")
    if saturate:
        out = np.where(special, 0xFE, np.minimum(exponent, 0xFE))
    else:
        zero = (bits & 0x7FFFFFFF) == 0
        out = np.where(special | (exponent > 0xFE) | zero, 0xFF, exponent)
    out = np.where(np.isnan(x32), 0xFF, out)
    return out.astype(np.uint8).view(ml_dtypes.float8_e8m0fnu)


def cast_to(x: np.ndarray, to: int, saturate: int = 1, round_mode: str = "up") -> np.ndarray:
    """Cast ``x`` to the ONNX data type ``to`` with the ONNX Cast rules (module docstring)."""
    to = int(to)
    dtype = onnx_dtype(to)
    if to == STRING:
        return x.copy() if x.dtype == object else _to_string(x)
    if x.dtype == object or x.dtype.kind in "US":
        if dtype.kind in "iu":  # exact for integers beyond 2^53 ("9007199254740993")
            parsed = [_parse_int(str(s)) for s in x.ravel()]
            return np.array(parsed, dtype=object).reshape(x.shape).astype(dtype)
        x = np.array([_parse_number(str(s)) for s in x.ravel()], dtype=np.float64).reshape(x.shape)
    if to == _E8M0:
        return _cast_e8m0(x.astype(np.float32), bool(saturate), round_mode)
    if to in _FLOAT8 and saturate and x.dtype != np.bool_:
        info = ml_dtypes.finfo(dtype)
        # Inf and anything that would round above FLT_MAX become ±FLT_MAX; NaN stays.
        # Clipping in the source float type (float32 for the others, exact for them)
        # keeps one rounding step, float64 -> float8 directly.
        wide = x if x.dtype in (np.float16, np.float32, np.float64) else x.astype(np.float32)
        return np.clip(wide, float(info.min), float(info.max)).astype(dtype)
    with np.errstate(all="ignore"):
        return np.asarray(x.astype(dtype))


@register("Cast")
def cast(ctx, x: np.ndarray, to: int | None = None, saturate: int = 1, round_mode: str = "up") -> np.ndarray:
    del ctx  # unused
    if to is None:
        raise OpError("Cast: expected attribute 'to', got none")
    return cast_to(x, to, saturate, round_mode)


@register("CastLike")
def cast_like(
    ctx, x: np.ndarray, target_type: np.ndarray, saturate: int = 1, round_mode: str = "up"
) -> np.ndarray:
    del ctx  # unused
    for code, dtype in ONNX_DTYPES.items():
        if dtype == target_type.dtype:
            return cast_to(x, code, saturate, round_mode)
    raise OpError(f"CastLike: expected target_type of an ONNX element type, got {target_type.dtype}")
