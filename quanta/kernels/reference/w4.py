"""com.microsoft MatMulNBits (4-bit weights per block along K): the reference twin.

ONNX Runtime's contrib operator (``MatMulNBits``, attributes ``K``, ``N``, ``bits``,
``block_size``, ``accuracy_level``)::

    B          uint8 [N, k_blocks, block_size·bits/8]   nibbles, low nibble first
    scales     float [N·k_blocks] (or [N, k_blocks])
    zero_points uint8 [N, ceil(k_blocks·bits/8)] packed like B, or float [N, k_blocks]
               (absent: 2^(bits−1), i.e. 8 for 4 bits)
    w[k, n]    = f32( (q[n, k] − zp[n, k // block_size]) · scale[n, k // block_size] )   eq. (W1)
    Y          = A @ w (+ bias[N])                                                   eq. (W2)

(W1) is exact in float32 (a 4-bit difference times a float32 scale is one rounding);
(W2) is a float32 GEMM whose summation order is the BLAS's (np.matmul here), so the
native kernel is compared against it within the float GEMM family's bound eq. (FG1)
(docs/float-ops.md), not bit for bit. ``accuracy_level`` 4 lets ONNX Runtime quantize A
to int8 per block (its W4A8 path); quanta computes (W2) in float32 for every level, which
is the more accurate result (documented difference, tests/lowbit/test_w4.py).
Only ``bits`` = 4 and no ``g_idx`` (act-order) are supported: other files get an OpError
naming the attribute.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.kernels.reference.quantize import quantize_linear
from quanta.kernels.reference.registry import MS_DOMAIN, OpContext, OpError, refuses, register

__all__ = ["QUANTA_DOMAIN", "dequantize_nbits", "matmul_nbits", "matmul_w4a8", "unpack_nibbles"]

QUANTA_DOMAIN = "quanta"


def unpack_nibbles(packed: np.ndarray, count: int) -> np.ndarray:
    """uint8 [..., bytes] -> uint8 [..., count] values, the low nibble first.

    >>> unpack_nibbles(np.array([[0x21, 0x43]], np.uint8), 3).tolist()
    [[1, 2, 3]]
    """
    p = np.asarray(packed, np.uint8)
    out = np.empty((*p.shape[:-1], p.shape[-1] * 2), np.uint8)
    out[..., 0::2] = p & 0x0F
    out[..., 1::2] = p >> 4
    return out[..., :count]


def dequantize_nbits(
    b: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    *,
    k: int,
    n: int,
    block_size: int,
    bits: int = 4,
) -> np.ndarray:
    """The float32 weight ``w [K, N]`` of eq. (W1)."""
    if bits != 4:
        raise OpError(f"MatMulNBits: bits: only 4 is supported, got {bits}")
    if block_size < 16 or block_size & (block_size - 1):
        raise OpError(f"MatMulNBits: block_size: expected a power of 2 >= 16, got {block_size}")
    k_blocks = -(-k // block_size)
    blob = block_size * bits // 8
    b = np.asarray(b)
    if b.dtype != np.uint8 or b.size != n * k_blocks * blob:
        raise OpError(
            f"MatMulNBits: B: expected uint8 [{n}, {k_blocks}, {blob}] for K={k}, N={n}, block_size={block_size}, "
            f"got {b.dtype} of shape {list(b.shape)}"
        )
    s = np.asarray(scales)
    if s.dtype not in (np.float32, np.float16) or s.size != n * k_blocks:
        raise OpError(
            f"MatMulNBits: scales: expected {n * k_blocks} float values, got {s.dtype} of shape {list(s.shape)}"
        )
    s = s.astype(np.float32).reshape(n, k_blocks)
    q = unpack_nibbles(b.reshape(n, k_blocks * blob), k_blocks * block_size).astype(np.int32)
    if zero_points is None:
        zp = np.full((n, k_blocks), 1 << (bits - 1), np.float32)
    else:
        z = np.asarray(zero_points)
        if z.dtype == np.uint8:
            per_row = -(-k_blocks // 2)
            if z.size != n * per_row:
                raise OpError(
                    f"MatMulNBits: zero_points: expected uint8 [{n}, {per_row}], got shape {list(z.shape)}"
                )
            zp = unpack_nibbles(z.reshape(n, per_row), k_blocks).astype(np.float32)
        elif z.dtype == s.dtype or z.dtype in (np.float32, np.float16):
            if z.size != n * k_blocks:
                raise OpError(
                    f"MatMulNBits: zero_points: expected {n * k_blocks} values, got shape {list(z.shape)}"
                )
            zp = z.astype(np.float32).reshape(n, k_blocks)
        else:
            raise OpError(
                f"MatMulNBits: zero_points: expected uint8 or the scales' float type, got {z.dtype}"
            )
    # eq. (W1): (q - zp) is exact in float32 (|q - zp| < 2^24), one rounding in the product
    w = (q.reshape(n, k_blocks, block_size).astype(np.float32) - zp[:, :, None]) * s[:, :, None]
    return np.ascontiguousarray(w.reshape(n, k_blocks * block_size)[:, :k].T)


def matmul_nbits(a: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """Eq. (W2): ``a [..., K] @ w [K, N] (+ bias)`` in float32."""
    y = np.matmul(np.asarray(a, np.float32), w)
    if bias is not None:
        y = y + np.asarray(bias, np.float32).reshape(-1)
    return y.astype(np.float32, copy=False)


@refuses("MatMulNBits", MS_DOMAIN)
def _nbits_refusal(attrs: dict[str, Any], given: list[bool]) -> str | None:
    del attrs
    return "g_idx (act-order) is not supported" if len(given) > 4 and given[4] else None


@register("MatMulNBits", MS_DOMAIN)
def matmul_nbits_op(
    ctx: OpContext,
    a: np.ndarray,
    b: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None = None,
    g_idx: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    *,
    K: int,
    N: int,
    bits: int = 4,
    block_size: int,
    accuracy_level: int = 0,
) -> np.ndarray:
    """com.microsoft MatMulNBits (module docstring)."""
    del ctx, accuracy_level  # float32 at every level (module docstring)
    if g_idx is not None:
        raise OpError("MatMulNBits: g_idx (act-order) is not supported")
    if a.dtype != np.float32:
        raise OpError(f"MatMulNBits: A: expected float32, got {a.dtype}")
    if a.shape[-1] != K:
        raise OpError(f"MatMulNBits: A: expected a last dimension of K={K}, got shape {list(a.shape)}")
    w = dequantize_nbits(b, scales, zero_points, k=K, n=N, block_size=block_size, bits=bits)
    if bias is not None and np.asarray(bias).size != N:
        raise OpError(f"MatMulNBits: bias: expected {N} values, got shape {list(np.shape(bias))}")
    return matmul_nbits(a, w, bias)


# --------------------------------------------------------------------------------------
# quanta::MatMulW4A8: 8-bit activations, 4-bit weights per block (docs eqs. (W3)-(W5))
# --------------------------------------------------------------------------------------


def matmul_w4a8(
    a: np.ndarray,
    a_scale: np.ndarray | float,
    a_zero_point: np.ndarray | int,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray | None,
    block_size: int,
    y_scale: np.ndarray | None = None,
    y_zero_point: np.ndarray | None = None,
) -> np.ndarray:
    """``a [..., K]`` (uint8/int8, per tensor) times ``b [K, N]`` (int4/uint4, one scale and
    zero point per block of ``block_size`` rows and column: ``b_scale [ceil(K/B), N]``)::

        acc_b = Σ_{k ∈ b} (a_k − za)(w_kn − zw_bn)                     exact       (W3)
        t     = f32(t + f32(f32(acc_b) · f32(sa · sw_bn))),  b = 0, 1 ..  float32    (W4)
        y     = t, or QuantizeLinear(t, sy, zy)                                      (W5)

    >>> import ml_dtypes
    >>> b = np.array([[1], [2], [3], [-4]], ml_dtypes.int4)
    >>> matmul_w4a8(np.array([[10, 11, 12, 13]], np.uint8), 0.5, 10, b, np.array([[1.0], [0.25]], np.float32),
    ...             None, 2).tolist()  # block 0: 0·1 + 1·2 = 2 -> 1.0; block 1: 2·3 − 3·4 = −6 -> −0.75
    [[0.25]]
    """
    a = np.asarray(a)
    b = np.asarray(b)
    if b.ndim != 2 or a.ndim < 1 or a.shape[-1] != b.shape[0]:
        raise OpError(f"MatMulW4A8: expected a [..., K] and b [K, N], got {a.shape} and {b.shape}")
    k, n = b.shape
    kb = -(-k // block_size)
    sb = np.asarray(b_scale, np.float32)
    if sb.shape != (kb, n):
        raise OpError(
            f"MatMulW4A8: b_scale: expected shape [{kb}, {n}] (block {block_size}), got {list(sb.shape)}"
        )
    w = b.astype(np.int64)
    if b_zero_point is not None:
        zb = np.asarray(b_zero_point).astype(np.int64)
        if zb.shape != (kb, n):
            raise OpError(f"MatMulW4A8: b_zero_point: expected shape [{kb}, {n}], got {list(zb.shape)}")
        w = w - np.repeat(zb, block_size, axis=0)[:k]
    a64 = a.astype(np.int64) - np.int64(np.asarray(a_zero_point).reshape(()))
    c = np.multiply(np.float32(np.asarray(a_scale, np.float32).reshape(())), sb, dtype=np.float32)
    t = np.zeros((*a.shape[:-1], n), np.float32)
    for i in range(kb):
        rows = slice(i * block_size, min(k, (i + 1) * block_size))
        acc = np.matmul(a64[..., rows], w[rows])  # eq. (W3), exact
        t = np.add(t, np.multiply(acc.astype(np.float32), c[i], dtype=np.float32), dtype=np.float32)
    if y_scale is None:
        return t
    return quantize_linear(
        t, np.asarray(y_scale, np.float32).reshape(()), np.asarray(y_zero_point).reshape(())
    )


@register("MatMulW4A8", QUANTA_DOMAIN)
def matmul_w4a8_op(
    ctx: OpContext,
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray | None = None,
    y_scale: np.ndarray | None = None,
    y_zero_point: np.ndarray | None = None,
    *,
    k_block: int,
) -> np.ndarray:
    """quanta::MatMulW4A8 (matmul_w4a8); ``k_block`` is the weight's block size along K."""
    del ctx  # unused
    if a.dtype not in (np.uint8, np.int8) or a_zero_point.dtype != a.dtype:
        raise OpError(
            f"MatMulW4A8: a, a_zero_point: expected uint8 or int8 of one type, got {a.dtype}, {a_zero_point.dtype}"
        )
    if b.dtype.name not in ("int4", "uint4"):
        raise OpError(f"MatMulW4A8: b: expected int4 or uint4, got {b.dtype}")
    if (y_scale is None) != (y_zero_point is None):
        raise OpError("MatMulW4A8: y_scale and y_zero_point: give both (quantized output) or neither (float)")
    if y_zero_point is not None and y_zero_point.dtype not in (np.uint8, np.int8):
        raise OpError(f"MatMulW4A8: y_zero_point: expected uint8 or int8, got {y_zero_point.dtype}")
    return matmul_w4a8(a, a_scale, a_zero_point, b, b_scale, b_zero_point, k_block, y_scale, y_zero_point)
