"""QLinearConv: integer convolution + bias + float requantization (normative reference).

    acc[n, m, o] = Σ_{c, k} (x_pad[n, g·C/G + c, o·s + k·d] − zx) · (w[m, c, k] − zw[m])   eq. (4)
                   + B[m]                                       (int32, wrapping)
    y = saturate(round_half_even(float32(acc) · m_[m]) + zy)    eq. (6)
    m_[m] = float32(float32(sx · sw[m]) / sy)
    y = min(max(y, lo), hi)       with output_clamp = [lo, hi]  eq. (6c)

``output_clamp`` (quanta's attribute, lowered graphs only: a Relu / Clip whose table was a
pure clamp of y's codes, folded by passes/lower/fold_code_clamp.py) clamps the codes after
requantization; absent, y spans its type's range.

Padding holds the real value 0, i.e. the quantized value ``zx``. ``x_scale``,
``x_zero_point``, ``y_scale``, ``y_zero_point`` are per tensor; ``w_scale`` and
``w_zero_point`` per tensor or per output channel (``[M]``). ``B`` is int32 with scale
``sx·sw`` and zero point 0. Geometry (groups, strides, pads, dilations, ``auto_pad``,
1-D/2-D/3-D) comes from conv_geometry.py.

Rounding then adding ``zy``, in float32, as ONNX Runtime does (see qlinear_matmul.py and
docs/quantization-math.md for where the ONNX reference implementation differs).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.kernels.reference.conv_geometry import conv_attrs
from quanta.kernels.reference.integer_ops import conv_integer, wrap_int32
from quanta.kernels.reference.registry import OpContext, OpError, register
from quanta.kernels.reference.requant import requant_multiplier, requantize

__all__ = ["output_clamp_bounds", "qlinear_conv"]

_EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))


def _scalar(v: np.ndarray | float | int, what: str) -> np.ndarray:
    v = np.asarray(v)
    if v.size != 1:
        raise OpError(f"{what}: expected a scalar (per-tensor), got shape {v.shape}")
    return v.reshape(())


def qlinear_conv(
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
    output_clamp: tuple[int, int] | list[int] | None = None,
    **attrs,
) -> np.ndarray:
    """Quantized N-d convolution (eqs. (4), (6), (6c)); ``attrs`` are the ONNX geometry attributes.

    ``dtype`` is the output storage type, default the dtype of ``y_zero_point``;
    ``output_clamp`` ``[lo, hi]``: codes of y, ``qmin <= lo <= hi <= qmax``.

    >>> x = np.array([[[1, 2, 3, 4]]], np.uint8); w = np.array([[[1, 1]]], np.uint8)
    >>> qlinear_conv(x, 0.5, 1, w, 1.0, 0, 1.0, np.uint8(0)).tolist()  # acc 1, 3, 5 -> 0.5, 1.5, 2.5
    [[[0, 2, 2]]]
    """
    x = np.asarray(x)
    w = np.asarray(w)
    if dtype is None:
        dtype = np.asarray(y_zero_point).dtype
    m_out = w.shape[0]
    geom = conv_attrs(x.shape, w.shape[2:], **attrs)
    acc = conv_integer(x, w, _scalar(x_zero_point, "x_zero_point"), w_zero_point, geometry=geom, group=group)
    channel_shape = (m_out,) + (1,) * (x.ndim - 2)
    if bias is not None:
        bias = np.asarray(bias)
        if bias.dtype != np.int32 or bias.shape != (m_out,):
            raise OpError(f"B: expected int32 of shape ({m_out},), got {bias.dtype} of shape {bias.shape}")
        acc = wrap_int32(acc.astype(np.int64) + bias.reshape(channel_shape))
    sw = np.asarray(w_scale, np.float32)
    if sw.size == 1:
        sw = sw.reshape(())
    elif sw.shape == (m_out,):
        sw = sw.reshape(channel_shape)
    else:
        raise OpError(
            f"w_scale: expected a scalar or a 1-D tensor of {m_out} (output channels), got shape {sw.shape}"
        )
    m = requant_multiplier(_scalar(x_scale, "x_scale").astype(np.float32), sw, _scalar(y_scale, "y_scale"))
    y = requantize(acc, m, int(_scalar(y_zero_point, "y_zero_point")), dtype)
    if output_clamp is None:
        return y
    lo, hi = output_clamp_bounds(output_clamp, y.dtype)
    return np.clip(y, lo, hi).astype(y.dtype)


def output_clamp_bounds(output_clamp: tuple[int, int] | list[int], dtype: np.dtype) -> tuple[int, int]:
    """``(lo, hi)`` of an ``output_clamp`` attribute, checked against the codes of ``dtype``.

    Incorrect: ``output_clamp=[128, 224]`` on an int8 output; ``[9, 3]``.
    Correct: ``output_clamp=[128, 224]`` on a uint8 output (Quark's Relu6 at zero point 128).

    >>> output_clamp_bounds([128, 224], np.dtype(np.uint8))
    (128, 224)
    """
    info = np.iinfo(dtype)
    bounds = [int(v) for v in output_clamp]
    if len(bounds) != 2 or not info.min <= bounds[0] <= bounds[1] <= info.max:
        raise OpError(
            f"output_clamp: expected [lo, hi] with {info.min} <= lo <= hi <= {info.max} (codes of {dtype}), "
            f"got {list(output_clamp)}"
        )
    return bounds[0], bounds[1]


@register("QLinearConv")
def qlinear_conv_op(
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
    """ONNX QLinearConv-10; ``attrs`` are Conv's (group and the geometry of conv_attrs)."""
    del ctx  # unused
    for name, v in (("x", x), ("w", w), ("y_zero_point", y_zero_point)):
        if v.dtype not in _EIGHT_BIT:
            raise OpError(f"{name}: expected int8 or uint8, got {v.dtype}")
    for name, zp, v in (("x_zero_point", x_zero_point, x), ("w_zero_point", w_zero_point, w)):
        if zp.dtype != v.dtype:
            raise OpError(f"{name}: expected the type of its input ({v.dtype}), got {zp.dtype}")
    return qlinear_conv(
        x,
        x_scale,
        x_zero_point,
        w,
        w_scale,
        w_zero_point,
        y_scale,
        y_zero_point,
        B,
        **attrs,
    )
