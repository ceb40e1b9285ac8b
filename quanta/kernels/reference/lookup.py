"""quanta QLinearLookup: an 8-bit elementwise function as a 256-entry table (normative).

``y = table[bits(x)]``, ``bits(x)`` the byte of the code (uint8: ``x``; int8: ``x mod 256``,
so -128..-1 index 128..255). With attribute ``axis`` the table is ``[C, 256]``, a table per
index along that axis: ``y[..., c, ...] = table[c, bits(x[..., c, ...])]`` (a group whose
constants vary along the channel axis, e.g. a BatchNormalization). The table is built at compile time by lowering
(quanta/passes/lower/lookup.py) from the float group it replaces, run on the 256 codes by
the reference kernels: ``table[bits(c)] = q(f(dq(c)))``. The scale and zero-point
inputs describe the quantized types of ``x`` and ``y`` (as QLinearSigmoid's do); the
table alone defines the values.

Inputs: ``x`` (uint8 or int8), ``x_scale``, ``x_zero_point``, ``y_scale``,
``y_zero_point``, ``table`` ([256], or [C, 256] with ``axis``, of y's type: uint8 or int8
whatever x's is). A 16-bit ``x`` (uint16 or int16) takes one table of 65536 entries of a
16-bit y, indexed by the code's 16 bits (``x mod 65536``), and no ``axis`` (a table per
channel would take C·128 KiB: per-channel 16-bit groups lower to QLinearAffine16). Attributes:
``function``, the ops the table holds, for reading (``"Mul/Sigmoid"``); ``axis`` (optional),
the axis the tables are indexed by.
"""

from __future__ import annotations

import numpy as np

from quanta.kernels.reference.registry import OpContext, OpError, register

__all__ = ["QUANTA_DOMAIN", "qlinear_lookup"]

QUANTA_DOMAIN = "quanta"


def qlinear_lookup(x: np.ndarray, table: np.ndarray, axis: int | None = None) -> np.ndarray:
    """``y = table[bits(x)]``; with ``axis``, ``y[..., c, ...] = table[c, bits(x[..., c, ...])]``.

    >>> qlinear_lookup(np.array([-128, -1, 0, 5], np.int8), np.arange(256, dtype=np.uint8).view(np.int8))
    array([-128,   -1,    0,    5], dtype=int8)
    >>> qlinear_lookup(np.array([[1, 2], [1, 2]], np.uint8), np.arange(512).reshape(2, 256).astype(np.uint8), 0)
    array([[1, 2],
           [1, 2]], dtype=uint8)
    """
    x = np.asarray(x)
    table = np.asarray(table)
    eight = (np.dtype(np.uint8), np.dtype(np.int8))
    sixteen = (np.dtype(np.uint16), np.dtype(np.int16))
    if x.dtype in sixteen:
        if axis is not None or table.dtype not in sixteen or table.shape != (65536,):
            raise OpError(
                f"table: expected shape (65536,) of uint16 or int16 for a 16-bit X (one table per tensor), "
                f"got shape {table.shape} of {table.dtype}"
                + (f" with axis {axis}" if axis is not None else "")
            )
        return table[x.view(np.uint16)]
    if x.dtype not in eight:
        raise OpError(f"X: expected int8, uint8, int16 or uint16, got {x.dtype}")
    if axis is None:
        if table.dtype not in eight or table.shape != (256,):
            raise OpError(
                f"table: expected shape (256,) of uint8 or int8, got shape {table.shape} of {table.dtype}"
            )
        return table[x.view(np.uint8)]
    if not -x.ndim <= axis < x.ndim:
        raise OpError(f"axis {axis} is not an axis of X of shape {x.shape}")
    axis %= x.ndim
    channels = x.shape[axis]
    if table.dtype not in eight or table.shape != (channels, 256):
        raise OpError(
            f"table: expected shape ({channels}, 256) of uint8 or int8 (a table per index of axis {axis}), "
            f"got shape {table.shape} of {table.dtype}"
        )
    index = np.arange(channels).reshape((channels,) + (1,) * (x.ndim - 1 - axis))
    return table[index, x.view(np.uint8)]


@register("QLinearLookup", QUANTA_DOMAIN)
def qlinear_lookup_op(
    ctx: OpContext,
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None,
    table: np.ndarray,
    *,
    function: str = "",
    axis: int | None = None,
) -> np.ndarray:
    """quanta QLinearLookup-1 (module docstring)."""
    del ctx, x_scale, x_zero_point, y_scale, y_zero_point, function  # the table holds them
    return qlinear_lookup(x, table, axis)
