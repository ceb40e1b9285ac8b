"""com.microsoft MatMulNBits (4- and 8-bit weights per block along K): the reference twin.

ONNX Runtime's contrib operator (``MatMulNBits``, attributes ``K``, ``N``, ``bits``,
``block_size``, ``accuracy_level``)::

    B          uint8 [N, k_blocks, block_size·bits/8]   4 bits: nibbles, low nibble first;
               8 bits: one code a byte
    scales     float [N·k_blocks] (or [N, k_blocks])
    zero_points uint8 [N, ceil(k_blocks·bits/8)] packed like B, or float [N, k_blocks]
               (absent: 2^(bits−1), i.e. 8 for 4 bits, 128 for 8 bits)
    w[k, n]    = f32( (q[n, k] − zp[n, k // block_size]) · scale[n, k // block_size] )   eq. (W1)
    Y          = A @ w (+ bias[N])                                                   eq. (W2)

(W1) is exact in float32 (a 4- or 8-bit difference times a float32 scale is one rounding);
(W2) is a float32 GEMM whose summation order is the BLAS's (np.matmul here), so the
native kernel is compared against it within the float GEMM family's bound eq. (FG1)
(docs/float-ops.md), not bit for bit.

``accuracy_level`` 4 with integer zero points (uint8 or absent) follows ONNX Runtime's
int8 path instead (``matmul_nbits_a8``, docs eqs. (W6)-(W9)): A quantized to int8
symmetric per row and block of K by ONNX Runtime's rule (scale max|a| / 127, codes
rne(a · 127 / max|a|)), exact integer block dots, float32 block sums in block order,
bit-exact with the native kernel; 8-bit codes take the same path (docs eq. (NB8-1)), as
ONNX Runtime runs them. Levels 0-3 (and float zero points) compute (W2). Only ``bits`` 4
and 8 and no ``g_idx`` (act-order) are supported: other files get an OpError naming the
attribute.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.kernels.reference.quantize import quantize_linear
from quanta.kernels.reference.registry import MS_DOMAIN, OpContext, OpError, refuses, register

__all__ = [
    "QUANTA_DOMAIN",
    "dequantize_nbits",
    "matmul_nbits",
    "matmul_nbits_a8",
    "matmul_w4a8",
    "nbits_codes",
    "quantize_rows_a8",
    "unpack_nibbles",
    "weight_of_codes",
]

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


def nbits_codes(
    b: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    *,
    k: int,
    n: int,
    block_size: int,
    bits: int = 4,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """The checked operands of MatMulNBits: codes ``q`` int32 [N, kb·B], zero points
    float32 [N, kb], scales float32 [N, kb], and whether the zero points are integers
    (uint8 or absent). ``bits`` 4 packs two codes a byte (low nibble first), 8 one."""
    if bits not in (4, 8):
        raise OpError(f"MatMulNBits: bits: only 4 and 8 are supported, got {bits}")
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
    codes = b.reshape(n, k_blocks * blob)
    q = (unpack_nibbles(codes, k_blocks * block_size) if bits == 4 else codes).astype(np.int32)
    if zero_points is None:
        zp = np.full((n, k_blocks), 1 << (bits - 1), np.float32)
    else:
        z = np.asarray(zero_points)
        if z.dtype == np.uint8:
            per_row = -(-k_blocks * bits // 8)
            if z.size != n * per_row:
                raise OpError(
                    f"MatMulNBits: zero_points: expected uint8 [{n}, {per_row}], got shape {list(z.shape)}"
                )
            zr = z.reshape(n, per_row)
            zp = (unpack_nibbles(zr, k_blocks) if bits == 4 else zr).astype(np.float32)
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
    return q, zp, s, zero_points is None or np.asarray(zero_points).dtype == np.uint8


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
    q, zp, s, _ = nbits_codes(b, scales, zero_points, k=k, n=n, block_size=block_size, bits=bits)
    return weight_of_codes(q, zp, s, k)


def weight_of_codes(q: np.ndarray, zp: np.ndarray, s: np.ndarray, k: int) -> np.ndarray:
    """Eq. (W1) on :func:`nbits_codes`' operands: the float32 weight ``w [K, N]``."""
    n, k_blocks = zp.shape
    block_size = q.shape[1] // k_blocks
    # (q - zp) is exact in float32 (|q - zp| < 2^24), one rounding in the product
    w = (q.reshape(n, k_blocks, block_size).astype(np.float32) - zp[:, :, None]) * s[:, :, None]
    return np.ascontiguousarray(w.reshape(n, k_blocks * block_size)[:, :k].T)


def quantize_rows_a8(a: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Eq. (W6): ``a [..., K]`` float32 -> int8 codes ``[..., kb, block]`` (int64; a short last
    block padded with 0) and scales ``[..., kb]`` float32, per row and block of K::

        m = max |a_k|,  sa = f32(m / 127),  r = f32(127 / m) (0 if m = 0),  qa = rne(f32(a_k · r))

    ONNX Runtime's rule for MatMulNBits at accuracy_level 4 (MLAS's QuantizeARow_CompInt8).
    A block whose maximum is not finite gets codes 0 and scale NaN.

    >>> q, s = quantize_rows_a8(np.array([[0.5, -1.0, 0.25, 2.0]], np.float32), 2)
    >>> q.tolist(), s.tolist()  # block 0: m 1, r 127; block 1: m 2, r 63.5 (15.875 -> 16)
    ([[[64, -127], [16, 127]]], [[0.007874015718698502, 0.015748031437397003]])
    """
    a = np.asarray(a, np.float32)
    k = a.shape[-1]
    kb = -(-k // block)
    ap = np.zeros((*a.shape[:-1], kb * block), np.float32)
    ap[..., :k] = a
    ap = ap.reshape(*a.shape[:-1], kb, block)
    m = np.abs(ap).max(axis=-1)
    finite = np.isfinite(m)
    with np.errstate(divide="ignore", invalid="ignore"):
        sa = np.where(finite, np.divide(m, np.float32(127), dtype=np.float32), np.float32(np.nan))
        r = np.where(finite & (m != 0), np.divide(np.float32(127), m, dtype=np.float32), np.float32(0))
        v = np.multiply(ap, r[..., None], dtype=np.float32)
    v = np.where(finite[..., None], v, np.float32(0))
    return np.rint(v).astype(np.int64), sa.astype(np.float32)


def matmul_nbits_a8(
    a: np.ndarray,
    q: np.ndarray,
    zp: np.ndarray,
    scales: np.ndarray,
    block: int,
    bias: np.ndarray | None = None,
) -> np.ndarray:
    """Eqs. (W6)-(W9): ``a [..., K]`` float32 times the 4- or 8-bit codes ``q [K, N]`` with integer
    zero points ``zp [kb, N]`` and scales ``scales [kb, N]`` per block of ``block`` rows::

        acc_b = Σ_{k ∈ b} qa_k (q_kn − zp_bn)                        exact        (W7)
        t     = f32(t + f32(f32(acc_b) · f32(sa_b · s_bn))),  b = 0, 1 ..         (W8)
        y     = t, or f32(t + bias_n)                                              (W9)

    >>> q = np.array([[9], [7], [8], [10]])  # zp 8: w' = 1, -1, 0, 2
    >>> matmul_nbits_a8(np.array([[1.0, -1.0, 0.5, 0.25]], np.float32), q, np.array([[8], [8]]),
    ...                 np.array([[0.5], [1.0]], np.float32), 2).tolist()  # 254·(0.5/127) + 128·(0.5/127)
    [[1.503937005996704]]
    """
    k, n = q.shape
    kb = -(-k // block)
    qa, sa = quantize_rows_a8(a, block)
    w = np.zeros((kb * block, n), np.int64)
    w[:k] = np.asarray(q, np.int64) - np.repeat(np.asarray(zp, np.int64), block, axis=0)[:k]
    # float64 products of integers below 2^53 are exact: the block dot of (W7)
    w64 = w.reshape(kb, block, n).astype(np.float64)
    s = np.asarray(scales, np.float32)
    t = np.zeros((*qa.shape[:-2], n), np.float32)
    for b in range(kb):
        acc = np.matmul(qa[..., b, :].astype(np.float64), w64[b]).astype(np.float32)
        c = np.multiply(sa[..., b, None], s[b], dtype=np.float32)
        t = np.add(t, np.multiply(acc, c, dtype=np.float32), dtype=np.float32)
    if bias is not None:
        t = np.add(t, np.asarray(bias, np.float32).reshape(-1), dtype=np.float32)
    return t


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
    del ctx  # unused
    if g_idx is not None:
        raise OpError("MatMulNBits: g_idx (act-order) is not supported")
    if a.dtype != np.float32:
        raise OpError(f"MatMulNBits: A: expected float32, got {a.dtype}")
    if a.shape[-1] != K:
        raise OpError(f"MatMulNBits: A: expected a last dimension of K={K}, got shape {list(a.shape)}")
    if bias is not None and np.asarray(bias).size != N:
        raise OpError(f"MatMulNBits: bias: expected {N} values, got shape {list(np.shape(bias))}")
    q, zp, s, integer_zp = nbits_codes(b, scales, zero_points, k=K, n=N, block_size=block_size, bits=bits)
    if accuracy_level == 4 and integer_zp:
        return matmul_nbits_a8(a, q[:, :K].T, zp.T.astype(np.int64), s.T, block_size, bias)
    return matmul_nbits(a, weight_of_codes(q, zp, s, K), bias)


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
