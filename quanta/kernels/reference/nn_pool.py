"""Float pooling (ai.onnx MaxPool, AveragePool, LpPool, GlobalAveragePool, GlobalMaxPool).

Window geometry (pads from auto_pad, output size, ceil_mode) is nn_conv.window_geometry.
With ``ceil_mode`` the last window may run past the end padding; those positions are
outside the tensor and never count:

    MaxPool      y = max over the window's positions inside the input
    AveragePool  y = sum(x over the window) / count, where count is the number of window
                 positions inside the input (count_include_pad=0) or inside the input and
                 its explicit pads (count_include_pad=1)
    LpPool       y = (sum |x|^p over the window) ^ (1/p), padding contributes 0

MaxPool's optional second output (Indices) is the flat index of the maximum in the input
tensor (N, C, *spatial): ``(n * C + c) * prod(spatial) + ravel(position)``, the spatial
position raveled row-major (storage_order=0) or column-major (storage_order=1). Ties go to
the first position in row-major window order.
"""

from __future__ import annotations

import math

import numpy as np

from quanta.kernels.reference.nn import from_compute, to_compute
from quanta.kernels.reference.nn_conv import conv_windows, spatial_defaults, window_geometry
from quanta.kernels.reference.registry import OpContext, OpError, register


def _geometry(op, x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
    if x.ndim < 3:
        raise OpError(f"{op}: expected x (N, C, spatial...), got shape {x.shape}")
    if kernel_shape is None:
        raise OpError(f"{op}: expected the kernel_shape attribute, got none")
    n_spatial = x.ndim - 2
    strides, dilations, pads = spatial_defaults(op, n_spatial, kernel_shape, strides, dilations, pads)
    begin, end, out = window_geometry(op, x.shape[2:], kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    # With ceil_mode the last window can need positions past the end padding.
    beyond = [
        max(0, (o - 1) * s + (k - 1) * d + 1 - (n + pb + pe))
        for o, s, k, d, n, pb, pe in zip(out, strides, kernel_shape, dilations, x.shape[2:], begin, end)
    ]
    return strides, dilations, begin, end, beyond, out


def _padded_windows(x, kernel_shape, strides, dilations, begin, end, beyond, out, fill):
    """(N, C, *out, K) windows over x padded by ``fill`` (explicit pads + ceil overhang)."""
    widths = [(0, 0), (0, 0), *((pb, pe + bx) for pb, pe, bx in zip(begin, end, beyond))]
    xp = np.pad(x, widths, mode="constant", constant_values=fill)
    windows = conv_windows(xp, kernel_shape, strides, dilations, out)
    return windows.reshape(*windows.shape[: 2 + len(out)], -1)


@register("MaxPool")
def max_pool(
    ctx: OpContext,
    x: np.ndarray,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: list[int] | None = None,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    storage_order: int = 0,
    strides: list[int] | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    strides, dilations, begin, end, beyond, out = _geometry(
        "MaxPool", x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode
    )
    xc = to_compute(x)  # exact: max only selects
    fill = np.iinfo(xc.dtype).min if xc.dtype.kind in "iu" else -np.inf
    windows = _padded_windows(xc, kernel_shape, strides, dilations, begin, end, beyond, out, fill)
    y = from_compute(windows.max(axis=-1), x.dtype)
    if ctx.n_outputs < 2:
        return y

    n_spatial = len(out)
    spatial = x.shape[2:]
    kernel_offset = np.unravel_index(windows.argmax(axis=-1), kernel_shape)  # per axis, (N, C, *out)
    position = []
    for axis in range(n_spatial):
        start = np.arange(out[axis]) * strides[axis] - begin[axis]
        start = start.reshape([-1 if a == axis else 1 for a in range(n_spatial)])
        position.append(start + kernel_offset[axis] * dilations[axis])
    order = "F" if storage_order == 1 else "C"
    flat = np.ravel_multi_index(position, spatial, order=order)
    plane = np.arange(x.shape[0] * x.shape[1]).reshape(x.shape[0], x.shape[1], *([1] * n_spatial))
    indices = (plane * math.prod(spatial) + flat).astype(np.int64)
    return y, indices


@register("AveragePool")
def average_pool(
    ctx: OpContext,
    x: np.ndarray,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    count_include_pad: int = 0,
    dilations: list[int] | None = None,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    del ctx  # unused
    strides, dilations, begin, end, beyond, out = _geometry(
        "AveragePool", x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode
    )
    total = _padded_windows(to_compute(x), kernel_shape, strides, dilations, begin, end, beyond, out, 0).sum(axis=-1)
    # Which positions count, as a (1, 1, *spatial) mask windowed exactly like x.
    n_spatial = len(out)
    if count_include_pad:
        counted = np.ones([1, 1, *(n + pb + pe for n, pb, pe in zip(x.shape[2:], begin, end))], dtype=np.int64)
        count_begin, count_end = [0] * n_spatial, [0] * n_spatial
    else:
        counted = np.ones([1, 1, *x.shape[2:]], dtype=np.int64)
        count_begin, count_end = begin, end
    count = _padded_windows(counted, kernel_shape, strides, dilations, count_begin, count_end, beyond, out, 0)
    # count >= 1: window_geometry keeps every window starting inside the input or its begin pad.
    return from_compute(total / count.sum(axis=-1), x.dtype)


@register("LpPool")
def lp_pool(
    ctx: OpContext,
    x: np.ndarray,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: list[int] | None = None,
    kernel_shape: list[int] | None = None,
    p: int = 2,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    del ctx  # unused
    strides, dilations, begin, end, beyond, out = _geometry(
        "LpPool", x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode
    )
    magnitude = np.abs(to_compute(x)) ** p
    total = _padded_windows(magnitude, kernel_shape, strides, dilations, begin, end, beyond, out, 0).sum(axis=-1)
    return from_compute(total ** (1.0 / p), x.dtype)


@register("GlobalAveragePool")
def global_average_pool(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    del ctx  # unused
    axes = tuple(range(2, x.ndim))
    return from_compute(to_compute(x).mean(axis=axes, keepdims=True), x.dtype)


@register("GlobalMaxPool")
def global_max_pool(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    del ctx  # unused
    axes = tuple(range(2, x.ndim))
    return from_compute(to_compute(x).max(axis=axes, keepdims=True), x.dtype)
