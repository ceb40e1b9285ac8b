"""Compile-time quantization arithmetic that rule checks need (passes may use only
``quanta.ir``, so they cannot call the reference kernels).

Everything here restates docs/quantization-math.md exactly as the reference kernels
compute it, and ``tests/passes/test_qmath.py`` checks it against them bit for bit:

- eq. (2) :func:`quantize_value`: ``q = saturate(round_half_even(float32(x) / float32(scale)) + zero_point)``
  (the division in float32, the precision of an f32 scale; NaN -> qmin);
- eq. (1) real range of a quantized type: ``[(qmin - zp)·scale, (qmax - zp)·scale]``
  (the product in float32);
- :func:`dq_q_is_identity`: when ``Q(DQ(q)) == q`` for every integer ``q`` of the
  type (see the function).
"""

from __future__ import annotations

import math

import numpy as np

from quanta.ir.types import F32, IntType, QuantType

__all__ = ["dq_q_is_identity", "quantize_value", "quantize_values", "real_range", "same_params"]


def quantize_value(x: float, q: QuantType, channel: int = 0) -> int:
    """``saturate(round_half_even(x / scale) + zero_point)`` for one real value, in the
    arithmetic of the reference QuantizeLinear with an f32 scale (eq. (2))."""
    assert isinstance(q.storage, IntType)
    scale = np.float32(q.scale[channel])
    zp = int(q.zero_point[channel])
    r = np.rint(np.divide(np.float32(x), scale, dtype=np.float32))
    if np.isnan(r):
        return q.qmin
    r64 = float(r)
    lo, hi = q.qmin - zp, q.qmax - zp
    return int(min(max(r64, lo), hi)) + zp


def quantize_values(x: float, q: QuantType) -> np.ndarray:
    """:func:`quantize_value` of one real value on every channel of ``q`` at once, int64
    [channels]: the same float32 division, rounding and saturation, elementwise."""
    assert isinstance(q.storage, IntType)
    scale = np.asarray(q.scale, dtype=np.float32).reshape(-1)
    zp = np.asarray(q.zero_point, dtype=np.int64).reshape(-1)
    r = np.rint(np.divide(np.float32(x), scale, dtype=np.float32)).astype(np.float64)
    out = np.clip(r, (q.qmin - zp).astype(np.float64), (q.qmax - zp).astype(np.float64))
    out = np.where(np.isnan(r), 0.0, out).astype(np.int64) + zp
    return np.where(np.isnan(r), q.qmin, out)


def real_range(q: QuantType, channel: int = 0) -> tuple[float, float]:
    """The smallest and largest real values the type represents (eq. (1))."""
    assert isinstance(q.storage, IntType)
    scale = np.float32(q.scale[channel])
    zp = int(q.zero_point[channel])
    lo = float(np.multiply(np.float32(q.qmin - zp), scale, dtype=np.float32))
    hi = float(np.multiply(np.float32(q.qmax - zp), scale, dtype=np.float32))
    return lo, hi


def same_params(a: QuantType, b: QuantType) -> bool:
    """Same storage, expressed type, scales, zero points, axis and block."""
    return a == b


def dq_q_is_identity(q: QuantType) -> str | None:
    """None when ``QuantizeLinear(DequantizeLinear(v, s, z), s, z) == v`` for every
    integer ``v`` of ``q``; else the reason it may not be.

    With ``d = v - z`` (exact in int64, |d| <= 2^17 for storage of at most 16 bits),
    DequantizeLinear gives ``fl(d·s)`` and QuantizeLinear ``rint(fl(fl(d·s) / s)) + z``.
    Each rounding has relative error <= 2^-24 when the results are normal float32
    numbers, so ``fl(fl(d·s)/s) = d·(1 + e)`` with ``|e| <= 2^-23`` and
    ``|d·e| <= 2^17 · 2^-23 < 0.5``: rint gives back ``d``. That needs: integer storage
    of at most 16 bits, a float32 scale (the expressed type), and ``s`` normal with
    ``2^17·s`` finite (no underflow or overflow in ``d·s``).
    """
    if not isinstance(q.storage, IntType):
        return f"storage {q.storage} is not an integer type"
    if q.storage.bits > 16:
        return f"storage {q.storage} is wider than 16 bits (float32 cannot hold every value exactly)"
    if q.expressed != F32:
        return f"expressed type {q.expressed} is not f32"
    tiny = float(np.finfo(np.float32).tiny)
    for s in q.scale:
        if s < tiny or not math.isfinite(s * 2.0**17) or s * 2.0**17 > float(np.finfo(np.float32).max):
            return f"scale {s} is subnormal or too large for exact round trips"
    return None
