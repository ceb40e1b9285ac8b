"""Requantization: int32 accumulator -> narrow storage integer (normative reference).

Two forms, both named in docs/quantization-math.md:

Float form, eq. (6) — what the ONNX spec describes and ONNX Runtime computes::

    m   = float32(float32(sx * sw) / sy)                      (per output channel if sw is)
    y   = saturate(round_half_even(float32(acc) * m) + zy)    every product in float32

Every step is a float32 operation, as ONNX Runtime's C++ does it (``a_scale * b_scale[i] /
y_scale`` in ``float``, then ``MlasRequantizeOutput``: ``float(acc) * scale``, clamp to
``[qmin - zy, qmax - zy]``, round to nearest even, add ``zy``). The onnx.reference
implementation of QLinearMatMul/QLinearConv computes the product in float64 under NumPy 2
promotion rules; the two differ on concrete ties (docs section "Where ONNX Runtime and the
ONNX reference differ"; ``test_requant.py`` pins both).

Fixed-point form, eq. (7) — gemmlowp / TFLite, for integer-only targets::

    m  ≈ multiplier · 2^(shift - 31),   multiplier ∈ [2^30, 2^31)   (quantize_multiplier)
    y  = saturate(RDBPOT(SRDHM(acc · 2^max(shift, 0), multiplier), max(-shift, 0)) + zy)

SRDHM (SaturatingRoundingDoublingHighMul) rounds half *up* (toward +inf, as the ARM
VQRDMULH instruction it emulates); RDBPOT (RoundingDivideByPOT) rounds half *away from
zero*. Neither is half-to-even, so the fixed-point form differs from the float form on
ties (golden vectors in ``test_requant.py``).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

__all__ = [
    "quantize_multiplier",
    "requant_multiplier",
    "requantize",
    "requantize_fixed_point",
    "rounding_divide_by_pot",
    "saturating_rounding_doubling_high_mul",
    "storage_range",
]

_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1


def storage_range(dtype: np.dtype | type) -> tuple[int, int]:
    """``(qmin, qmax)`` of an integer storage type (int2..int32, uint2..uint32)."""
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
    else:  # ml_dtypes int2/int4/uint2/uint4 have kind 'V'
        info = ml_dtypes.iinfo(dt)
    return int(info.min), int(info.max)


def requant_multiplier(sx: np.ndarray | float, sw: np.ndarray | float, sy: np.ndarray | float) -> np.ndarray:
    """``m = float32(float32(sx * sw) / sy)``, elementwise (eq. (6)).

    Each operation is rounded to float32 in that order, as ONNX Runtime computes
    ``a_scale * b_scale[i] / y_scale`` in C++ ``float`` arithmetic. ``sw`` may be a vector
    (per output channel); the result then has its shape.

    >>> requant_multiplier(0.5, np.array([0.25, 0.125], np.float32), 2.0)
    array([0.0625 , 0.03125], dtype=float32)
    """
    sx32 = np.asarray(sx, dtype=np.float32)
    sw32 = np.asarray(sw, dtype=np.float32)
    sy32 = np.asarray(sy, dtype=np.float32)
    prod = np.multiply(sx32, sw32, dtype=np.float32)
    return np.asarray(np.divide(prod, sy32, dtype=np.float32), dtype=np.float32)


def requantize(
    acc: np.ndarray,
    multiplier: np.ndarray | float,
    zero_point: np.ndarray | int,
    dtype: np.dtype | type,
) -> np.ndarray:
    """``y = saturate(round_half_even(float32(acc) * m) + zy)`` in ``dtype`` (eq. (6)).

    ``acc`` is an integer array (the int32 accumulator); ``multiplier`` a float32 scalar or
    an array broadcastable against ``acc`` (per-channel); ``zero_point`` likewise. The
    product is a float32 multiplication (as ONNX Runtime's ``MlasRequantizeOutput``); the
    result is clamped to ``[qmin - zy, qmax - zy]`` in float32 *before* rounding, which is
    the same as saturating after rounding (rounding is monotone and the bounds are
    integers) and keeps huge products and infinities out of the integer cast.

    Ties round to even, for both signs:

    >>> requantize(np.array([5, -5, 7, -7], np.int32), np.float32(0.5), 3, np.int8)
    array([ 5,  1,  7, -1], dtype=int8)
    """
    acc = np.asarray(acc)
    if acc.dtype.kind not in "iu":
        raise TypeError(f"requantize: expected an integer accumulator, got {acc.dtype}")
    m = np.asarray(multiplier, dtype=np.float32)
    zp = np.asarray(zero_point).astype(np.int64)
    qmin, qmax = storage_range(dtype)
    prod = np.multiply(acc.astype(np.float32), m, dtype=np.float32)
    lo = (qmin - zp).astype(np.float32)
    hi = (qmax - zp).astype(np.float32)
    clipped = np.minimum(np.maximum(prod, lo), hi)
    # NaN (a NaN multiplier) saturates to qmin - zy rather than hitting an undefined cast.
    clipped = np.where(np.isnan(clipped), lo, clipped)
    rounded = np.rint(clipped).astype(np.int64)  # np.rint: round half to even
    return np.clip(rounded + zp, qmin, qmax).astype(dtype)


# --------------------------------------------------------------------------------------
# Fixed-point requantization, eq. (7) (gemmlowp fixedpoint.h, TFLite quantization_util.cc)
# --------------------------------------------------------------------------------------


def quantize_multiplier(m: float) -> tuple[int, int]:
    """``m -> (multiplier, shift)`` with ``m ≈ multiplier · 2^(shift - 31)`` (eq. (7)).

    As TFLite ``QuantizeMultiplier``: ``m = q · 2^shift`` with ``q ∈ [0.5, 1)`` (frexp),
    ``multiplier = round_half_away(q · 2^31)``; if that rounds up to ``2^31`` it is halved
    and ``shift`` incremented; ``shift < -31`` flushes to ``(0, 0)``. ``shift > 0`` is a
    left shift of the accumulator (``m >= 1``), ``shift <= 0`` a rounding right shift.

    >>> quantize_multiplier(0.5)
    (1073741824, 0)
    >>> quantize_multiplier(0.75)
    (1610612736, 0)
    >>> quantize_multiplier(0.1)
    (1717986918, -3)
    """
    m = float(m)
    if m < 0 or not math.isfinite(m):
        raise ValueError(f"quantize_multiplier: expected a finite multiplier >= 0, got {m}")
    if m == 0.0:
        return 0, 0
    q, shift = math.frexp(m)
    q_fixed = math.floor(q * (1 << 31) + 0.5)  # TfLiteRound: half away from zero (q > 0)
    if q_fixed == 1 << 31:
        q_fixed //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    if shift > 30:
        raise ValueError(f"quantize_multiplier: multiplier {m} too large for a 32-bit shift")
    return int(q_fixed), int(shift)


def saturating_rounding_doubling_high_mul(a: np.ndarray, b: np.ndarray | int) -> np.ndarray:
    """gemmlowp ``SaturatingRoundingDoublingHighMul``: ``round(a·b / 2^31)``, int32.

    The nudge is ``2^30`` for ``a·b >= 0`` and ``1 - 2^30`` otherwise, and the division
    truncates toward zero as C++ does; together that is ``floor(a·b/2^31 + 1/2)``: ties
    round half *up* (toward +inf), exactly as ARM VQRDMULH. The one overflow case
    ``a == b == INT32_MIN`` saturates to ``INT32_MAX``.

    >>> saturating_rounding_doubling_high_mul(np.array([5, -5, 7, -7], np.int32), 1 << 30)
    array([ 3, -2,  4, -3], dtype=int32)
    """
    a64 = np.asarray(a).astype(np.int64)
    b64 = np.asarray(b).astype(np.int64)
    ab = a64 * b64  # |ab| <= 2^62: no int64 overflow
    nudge = np.where(ab >= 0, np.int64(1 << 30), np.int64(1 - (1 << 30)))
    num = ab + nudge
    # C++ integer division truncates toward zero; NumPy's // floors.
    high = np.where(num >= 0, num >> 31, -((-num) >> 31))
    overflow = (a64 == _INT32_MIN) & (b64 == _INT32_MIN)
    return np.where(overflow, np.int64(_INT32_MAX), high).astype(np.int32)


def rounding_divide_by_pot(x: np.ndarray, exponent: np.ndarray | int) -> np.ndarray:
    """gemmlowp ``RoundingDivideByPOT``: ``x / 2^exponent`` rounded half away from zero.

    ``mask = 2^e - 1; remainder = x & mask; threshold = (mask >> 1) + (x < 0)``;
    result ``(x >> e) + (remainder > threshold)`` (arithmetic shift).

    >>> rounding_divide_by_pot(np.array([5, -5, 6, -6], np.int32), 2)
    array([ 1, -1,  2, -2], dtype=int32)
    """
    x64 = np.asarray(x).astype(np.int64)
    e = np.asarray(exponent).astype(np.int64)
    if np.any(e < 0) or np.any(e > 31):
        raise ValueError(f"rounding_divide_by_pot: expected 0 <= exponent <= 31, got {exponent}")
    mask = (np.int64(1) << e) - 1
    remainder = x64 & mask
    threshold = (mask >> 1) + (x64 < 0).astype(np.int64)
    return ((x64 >> e) + (remainder > threshold).astype(np.int64)).astype(np.int32)


def requantize_fixed_point(
    acc: np.ndarray,
    multiplier: np.ndarray | int,
    shift: np.ndarray | int,
    zero_point: np.ndarray | int,
    dtype: np.dtype | type,
) -> np.ndarray:
    """Integer-only requantization (eq. (7)), as TFLite ``MultiplyByQuantizedMultiplier``.

    ``y = saturate(RDBPOT(SRDHM(acc · 2^left, multiplier), right) + zy)`` with
    ``left = max(shift, 0)``, ``right = max(-shift, 0)``. ``multiplier``/``shift`` may be
    per-channel arrays broadcastable against ``acc``. ``acc · 2^left`` wraps in int32 as
    the C++ does (callers keep ``m < 1`` for GEMM outputs, so ``left == 0``).

    Ties are not half-to-even (unlike eq. (6)). With ``shift == 0`` only SRDHM rounds
    (half up); with a right shift SRDHM rounds first and RDBPOT (half away from zero)
    second, a double rounding:

    >>> mult, shift = quantize_multiplier(0.5)
    >>> requantize_fixed_point(np.array([5, -5, 7, -7], np.int32), mult, shift, 3, np.int8)
    array([6, 1, 7, 0], dtype=int8)
    """
    acc = np.asarray(acc)
    if acc.dtype.kind not in "iu":
        raise TypeError(f"requantize_fixed_point: expected an integer accumulator, got {acc.dtype}")
    shift = np.asarray(shift).astype(np.int64)
    left = np.maximum(shift, 0)
    right = np.maximum(-shift, 0)
    shifted = (acc.astype(np.int64) << left).astype(np.int32)  # wraps like int32 C++ (two's complement)
    scaled = rounding_divide_by_pot(saturating_rounding_doubling_high_mul(shifted, multiplier), right)
    qmin, qmax = storage_range(dtype)
    zp = np.asarray(zero_point).astype(np.int64)
    return np.clip(scaled.astype(np.int64) + zp, qmin, qmax).astype(dtype)
