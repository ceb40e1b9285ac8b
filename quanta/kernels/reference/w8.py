"""quanta::MatMulW8: a float MatMul whose constant weight is stored as 8-bit integers
(reference twin; docs/float-ops.md "Weight-only 8-bit MatMul").

::

    w[k, n] = f32( f32(q[k, n] − zp[n]) · scale[n] )                               eq. (W8)
    y       = a @ w                                                                 eq. (W8M)

``q`` int8 or uint8 ``[K, N]``, ``scale`` float32 (one per column ``[N]``, or a scalar),
``zero_point`` of ``q``'s type (``[N]`` or a scalar; absent: 0). ``q − zp`` is an integer
of at most 9 bits, exact in float32, so (W8) rounds once: it is DequantizeLinear's value
and, with no zero point, ``Mul(Cast(q, to=FLOAT), scale)``'s, bit for bit (the rewrite
``WeightOnlyMatMul`` makes from those nodes changes no byte of the weight). (W8M) is a
float32 GEMM summed in the BLAS's order here (np.matmul), so the native kernel
(``_native.matmul_w8_f32``) is compared with it within the float GEMM family's bound
(FG1), not bit for bit; against the native float MatMul of the dequantized weight it is
bit for bit.
"""

from __future__ import annotations

import numpy as np

from quanta.kernels.reference.registry import OpContext, OpError, register

__all__ = ["QUANTA_DOMAIN", "dequantize_w8", "matmul_w8"]

QUANTA_DOMAIN = "quanta"
_Q_TYPES = (np.dtype(np.int8), np.dtype(np.uint8))


def dequantize_w8(q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None = None) -> np.ndarray:
    """The float32 weight of eq. (W8); ``scale`` and ``zero_point`` broadcast along the
    columns (the last axis)."""
    d = np.asarray(q).astype(np.float32)
    if zero_point is not None:
        d = d - np.asarray(zero_point).astype(np.float32)  # an integer of at most 9 bits: exact
    return np.multiply(d, np.asarray(scale, np.float32), dtype=np.float32)


def _check(a: np.ndarray, q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None) -> None:
    if a.dtype != np.float32:
        raise OpError(f"MatMulW8: A: expected float32, got {a.dtype}")
    if q.dtype not in _Q_TYPES or q.ndim != 2 or a.ndim < 1 or a.shape[-1] != q.shape[0]:
        raise OpError(
            f"MatMulW8: Q: expected int8 or uint8 [{a.shape[-1] if a.ndim else '?'}, N], "
            f"got {q.dtype} {list(q.shape)}"
        )
    n = q.shape[1]
    if scale.dtype != np.float32 or scale.size not in (1, n) or scale.ndim > 1:
        raise OpError(
            f"MatMulW8: scale: expected float32 [{n}] or a scalar, got {scale.dtype} {list(scale.shape)}"
        )
    if zero_point is not None and (
        zero_point.dtype != q.dtype or zero_point.size not in (1, n) or zero_point.ndim > 1
    ):
        raise OpError(
            f"MatMulW8: zero_point: expected {q.dtype} [{n}] or a scalar, "
            f"got {zero_point.dtype} {list(zero_point.shape)}"
        )


def matmul_w8(
    a: np.ndarray, q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None = None
) -> np.ndarray:
    """Eqs. (W8), (W8M)."""
    return np.matmul(a, dequantize_w8(q, scale, zero_point))


@register("MatMulW8", QUANTA_DOMAIN)
def matmul_w8_op(
    ctx: OpContext, a: np.ndarray, q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None = None
) -> np.ndarray:
    """quanta::MatMulW8 (module docstring)."""
    del ctx  # unused
    a, q, scale = np.asarray(a), np.asarray(q), np.asarray(scale)
    zp = None if zero_point is None else np.asarray(zero_point)
    _check(a, q, scale, zp)
    return matmul_w8(a, q, scale, zp)
