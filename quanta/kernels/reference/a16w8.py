"""QLinearMatMul16 / QLinearConv16: integer products with a 16-bit operand, exact (normative).

The 16-bit QDQ groups (ONNX Runtime's quantizer with ``activation_type=QUInt16/QInt16``,
quanta's ``activation_type="int16"``) lower to these ``quanta``-domain operators
(docs/quantization-math.md §A16W8)::

    acc = Σ_k (a[.., i, k] − za) · (b[k, j] − zb[j]) + B[j]        eq. (A1), exact in int64
    y   = saturate(round_half_even(float32(acc) · m[j]) + zy)       eq. (A4) = eq. (6)
    m   = float32(float32(sa · sb[j]) / sy)

Operands are uint8, int8, uint16 or int16 (any mix); the output type is the type of
``y_zero_point`` (8 or 16 bits). Unlike QLinearMatMul's int32 accumulator, ``acc`` is
never wrapped: a 16 × 16-bit product is up to 2^32, so int32 would overflow after one
term, and the sum of K such terms stays below 2^63 for every K < 2^31. ``float32(acc)``
rounds the int64 to nearest, ties to even (numpy's and C's int64 -> float conversion).
``B`` (optional) is int32 with scale ``sa·sb`` and zero point 0, added exactly.

``QLinearConv16`` is the same for ONNX Conv geometry (groups, strides, pads, dilations,
``auto_pad``, 1-D to 3-D): ``Σ_{c, k} (x_pad − zx)(w − zw[m])``, padding holding ``zx``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from quanta.kernels.reference.conv_geometry import conv_attrs, conv_nd
from quanta.kernels.reference.integer_ops import b_param
from quanta.kernels.reference.registry import OpContext, OpError, register
from quanta.kernels.reference.requant import requant_multiplier, requantize

__all__ = ["QUANTA_DOMAIN", "WIDE_TYPES", "bias64", "matmul16_output", "qlinear_conv16", "qlinear_matmul16"]

QUANTA_DOMAIN = "quanta"
WIDE_TYPES = tuple(np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16))


def _check_types(
    op: str, pairs: tuple[tuple[str, np.ndarray, np.ndarray], ...], y_zero_point: np.ndarray
) -> None:
    for name, v, zp in pairs:
        if v.dtype not in WIDE_TYPES:
            raise OpError(f"{op}: {name}: expected uint8, int8, uint16 or int16, got {v.dtype}")
        if zp is not None and zp.dtype != v.dtype:
            raise OpError(f"{op}: {name}_zero_point: expected the type of {name} ({v.dtype}), got {zp.dtype}")
    if np.asarray(y_zero_point).dtype not in WIDE_TYPES:
        raise OpError(f"{op}: y_zero_point: expected uint8, int8, uint16 or int16, got {y_zero_point.dtype}")
    if np.asarray(y_zero_point).size != 1:
        raise OpError(
            f"{op}: y_zero_point: expected a scalar (per tensor), got shape {np.shape(y_zero_point)}"
        )


def bias64(bias: np.ndarray | None, n: int, op: str) -> np.ndarray | None:
    if bias is None:
        return None
    bias = np.asarray(bias)
    if bias.dtype != np.int32 or bias.shape != (n,):
        raise OpError(f"{op}: B: expected int32 of shape ({n},), got {bias.dtype} of shape {bias.shape}")
    return bias.astype(np.int64)


def qlinear_matmul16(
    a: np.ndarray,
    a_scale: np.ndarray | float,
    a_zero_point: np.ndarray | int,
    b: np.ndarray,
    b_scale: np.ndarray | float,
    b_zero_point: np.ndarray | int,
    y_scale: np.ndarray | float,
    y_zero_point: np.ndarray | int,
    bias: np.ndarray | None = None,
    dtype: np.dtype | type | None = None,
) -> np.ndarray:
    """``a @ b`` (numpy.matmul broadcasting, b of rank >= 2) by eqs. (A1), (A4).

    >>> a = np.array([[40000, 20000]], np.uint16); b = np.array([[3], [-2]], np.int8)
    >>> qlinear_matmul16(a, 1.0, 30000, b, 1.0, 0, 4.0, np.int16(0)).tolist()  # (10000·3 + 10000·2) / 4
    [[12500]]
    """
    a = np.asarray(a)
    b = np.asarray(b)
    if dtype is None:
        dtype = np.asarray(y_zero_point).dtype
    if a.ndim < 1 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        raise OpError(f"QLinearMatMul16: expected a [..., K] and b [..., K, N], got {a.shape} and {b.shape}")
    if np.asarray(a_scale).size != 1 or np.asarray(a_zero_point).size != 1:
        raise OpError("QLinearMatMul16: a_scale, a_zero_point: expected scalars (per tensor)")
    za = np.int64(np.asarray(a_zero_point).reshape(()))
    zb = b_param(np.asarray(b_zero_point), b.shape, "b_zero_point").astype(np.int64)
    acc = np.matmul(a.astype(np.int64) - za, b.astype(np.int64) - zb)  # exact: eq. (A1)
    return matmul16_output(acc, a_scale, b_scale, b.shape, y_scale, y_zero_point, bias, dtype)


def matmul16_output(
    acc: np.ndarray,
    a_scale: np.ndarray | float,
    b_scale: np.ndarray | float,
    b_shape: tuple[int, ...],
    y_scale: np.ndarray | float,
    y_zero_point: np.ndarray | int,
    bias: np.ndarray | None,
    dtype: np.dtype | type,
) -> np.ndarray:
    """QLinearMatMul16's output from the exact int64 sums ``acc`` of eq. (A1): the bias,
    then eq. (A4). Shared with the native run-time-b path, which forms ``acc`` another way."""
    b64 = bias64(bias, b_shape[-1], "QLinearMatMul16")
    if b64 is not None:
        acc = acc + b64
    sb = b_param(np.asarray(b_scale, np.float32), b_shape, "b_scale")
    m = requant_multiplier(
        np.asarray(a_scale, np.float32).reshape(()), sb, np.asarray(y_scale, np.float32).reshape(())
    )
    return requantize(acc, m, int(np.asarray(y_zero_point).reshape(())), dtype)


def qlinear_conv16(
    x: np.ndarray,
    x_scale: np.ndarray | float,
    x_zero_point: np.ndarray | int,
    w: np.ndarray,
    w_scale: np.ndarray | float,
    w_zero_point: np.ndarray | int,
    y_scale: np.ndarray | float,
    y_zero_point: np.ndarray | int,
    bias: np.ndarray | None = None,
    *,
    group: int = 1,
    dtype: np.dtype | type | None = None,
    **attrs,
) -> np.ndarray:
    """N-d convolution by eqs. (A1), (A4); ``attrs`` are the ONNX geometry attributes.

    >>> x = np.array([[[1000, 2000, 3000]]], np.int16); w = np.array([[[1, -1]]], np.int8)
    >>> qlinear_conv16(x, 1.0, 0, w, 1.0, 0, 10.0, np.int16(5)).tolist()  # -1000 / 10 + 5
    [[[-95, -95]]]
    """
    x = np.asarray(x)
    w = np.asarray(w)
    if dtype is None:
        dtype = np.asarray(y_zero_point).dtype
    if x.ndim < 3 or w.ndim != x.ndim:
        raise OpError(
            f"QLinearConv16: expected x (N, C, ...) and w (M, C/group, ...) of equal rank >= 3, got {x.shape}, {w.shape}"
        )
    m_out = w.shape[0]
    geom = conv_attrs(x.shape, w.shape[2:], **attrs)
    if np.asarray(x_zero_point).size != 1 or np.asarray(x_scale).size != 1:
        raise OpError("QLinearConv16: x_scale, x_zero_point: expected scalars (per tensor)")
    zw = np.asarray(w_zero_point, np.int64)
    if zw.size not in (1, m_out):
        raise OpError(
            f"QLinearConv16: w_zero_point: expected a scalar or {m_out} values, got shape {zw.shape}"
        )
    channel = (m_out,) + (1,) * (w.ndim - 1)
    zw = zw.reshape(()) if zw.size == 1 else zw.reshape(channel)
    x64 = x.astype(np.int64) - np.int64(np.asarray(x_zero_point).reshape(()))
    acc = conv_nd(x64, w.astype(np.int64) - zw, geom, group, pad_value=0)  # exact: eq. (A1)
    out_channel = (m_out,) + (1,) * (x.ndim - 2)
    b64 = bias64(bias, m_out, "QLinearConv16")
    if b64 is not None:
        acc = acc + b64.reshape(out_channel)
    sw = np.asarray(w_scale, np.float32)
    if sw.size not in (1, m_out):
        raise OpError(f"QLinearConv16: w_scale: expected a scalar or {m_out} values, got shape {sw.shape}")
    sw = sw.reshape(()) if sw.size == 1 else sw.reshape(out_channel)
    m = requant_multiplier(
        np.asarray(x_scale, np.float32).reshape(()), sw, np.asarray(y_scale, np.float32).reshape(())
    )
    return requantize(acc, m, int(np.asarray(y_zero_point).reshape(())), dtype)


def _op(op: str, names: tuple[str, str], fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """quanta::``op`` (module docstring) on ``fn``: the operands' types checked, then ``fn``
    (``attrs``: Conv's for QLinearConv16, none for QLinearMatMul16)."""

    def op_fn(
        ctx: OpContext,
        x: np.ndarray,
        x_scale: np.ndarray,
        x_zero_point: np.ndarray,
        w: np.ndarray,
        w_scale: np.ndarray,
        w_zero_point: np.ndarray,
        y_scale: np.ndarray,
        y_zero_point: np.ndarray,
        B: np.ndarray | None = None,
        **attrs: Any,
    ) -> np.ndarray:
        del ctx  # unused
        _check_types(op, ((names[0], x, x_zero_point), (names[1], w, w_zero_point)), y_zero_point)
        return fn(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B, **attrs)

    op_fn.__name__ = op_fn.__qualname__ = f"{fn.__name__}_op"
    op_fn.__doc__ = f"quanta::{op} (module docstring)."
    return register(op, QUANTA_DOMAIN)(op_fn)


qlinear_matmul16_op = _op("QLinearMatMul16", ("a", "b"), qlinear_matmul16)
qlinear_conv16_op = _op("QLinearConv16", ("x", "w"), qlinear_conv16)
