"""Float pooling (ai.onnx MaxPool, AveragePool, LpPool, GlobalAveragePool, GlobalMaxPool).

Window geometry (pads from auto_pad, output size, ceil_mode) and the windows themselves
come from conv_geometry.py (conv_attrs, im2col). With ``ceil_mode`` the last window may run
past the end padding; those positions are outside the tensor and never count:

    MaxPool      y = max over the window's positions inside the input
    AveragePool  y = sum(x over the window) / count, where count is the number of window
                 positions inside the input (count_include_pad=0) or inside the input and
                 its explicit pads (count_include_pad=1); float32 sums the window's K
                 positions (pads and overhang +0) in row-major window order by sum16,
                 (R1)-(R3), and divides once: docs/float-ops.md (AP1)-(AP3)
    LpPool       y = (sum |x|^p over the window) ^ (1/p), padding contributes 0

MaxPool's optional second output (Indices) is the flat index of the maximum in the input
tensor (N, C, *spatial): ``(n * C + c) * prod(spatial) + ravel(position)``, the spatial
position raveled row-major (storage_order=0) or column-major (storage_order=1). Ties go to
the first position in row-major window order.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from quanta.kernels.reference.conv_geometry import ConvGeometry, conv_attrs, im2col
from quanta.kernels.reference.float_ops import sum16
from quanta.kernels.reference.nn import from_compute, to_compute
from quanta.kernels.reference.registry import OpContext, OpError, get_op, register


def _geometry(op, x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode) -> ConvGeometry:
    if kernel_shape is None:
        raise OpError(f"{op}: expected the kernel_shape attribute, got none")
    return conv_attrs(
        x.shape,
        None,
        kernel_shape=kernel_shape,
        strides=strides,
        dilations=dilations,
        pads=pads,
        auto_pad=auto_pad,
        ceil_mode=bool(ceil_mode),
    )


def _windows(x: np.ndarray, geom: ConvGeometry, fill) -> np.ndarray:
    """(N, C, K, *out): the K = prod(kernel) window elements of every output position, the
    pads (and any ceil_mode overhang) reading ``fill``."""
    cols = im2col(x, geom, fill)
    return cols.reshape(*x.shape[:2], -1, *geom.out_shape)


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
    geom = _geometry("MaxPool", x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    xc = to_compute(x)  # exact: max only selects
    fill = np.iinfo(xc.dtype).min if xc.dtype.kind in "iu" else -np.inf
    windows = _windows(xc, geom, fill)
    y = from_compute(windows.max(axis=2), x.dtype)
    if ctx.n_outputs < 2:
        return y

    out = geom.out_shape
    n_spatial = len(out)
    spatial = x.shape[2:]
    kernel_offset = np.unravel_index(windows.argmax(axis=2), geom.kernel_shape)  # per axis, (N, C, *out)
    position = []
    for axis in range(n_spatial):
        start = np.arange(out[axis]) * geom.strides[axis] - geom.pads[axis]
        start = start.reshape([-1 if a == axis else 1 for a in range(n_spatial)])
        position.append(start + kernel_offset[axis] * geom.dilations[axis])
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
    geom = _geometry("AveragePool", x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    count = average_pool_count(x.shape, geom, count_include_pad)
    if x.dtype == np.float32 and x.size:
        # (AP1)-(AP3): NumPy's sum over the window axis has no stated order
        windows = np.moveaxis(_windows(x, geom, 0), 2, -1)
        with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN windows: IEEE results
            total = sum16(windows.reshape(-1, windows.shape[-1])).reshape(windows.shape[:-1])
            return total / count.astype(np.float32)
    total = _windows(to_compute(x), geom, 0).sum(axis=2)
    return from_compute(total / count, x.dtype)


def average_pool_count(x_shape: tuple[int, ...], geom: ConvGeometry, count_include_pad: int) -> np.ndarray:
    """AveragePool's divisor per output position, float64 (1, 1, *out): the window positions
    inside the input (count_include_pad=0) or inside the input and its explicit pads (1)."""
    # A (1, 1, *spatial) mask of ones windowed like x, where the pads read 0
    # (count_include_pad=0), or a mask already covering the pads, windowed without padding
    # so that only the ceil_mode overhang reads 0 (count_include_pad=1).
    n_spatial = len(geom.out_shape)
    if count_include_pad:
        padded = [n + geom.pads[i] + geom.pads[n_spatial + i] for i, n in enumerate(x_shape[2:])]
        count = _windows(np.ones([1, 1, *padded]), dataclasses.replace(geom, pads=(0,) * (2 * n_spatial)), 0)
    else:
        count = _windows(np.ones([1, 1, *x_shape[2:]]), geom, 0)
    # count >= 1: the ceil_mode rule keeps every window starting inside the input or its begin pad.
    return count.sum(axis=2)


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
    geom = _geometry("LpPool", x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    total = _windows(np.abs(to_compute(x)) ** p, geom, 0).sum(axis=2)
    return from_compute(total ** (1.0 / p), x.dtype)


@register("GlobalLpPool")
def global_lp_pool(ctx: OpContext, x: np.ndarray, *, p: int = 2) -> np.ndarray:
    """LpPool over the whole spatial extent: (sum |x|^p)^(1/p) per channel, as LpPool."""
    del ctx  # unused
    axes = tuple(range(2, x.ndim))
    total = (np.abs(to_compute(x)) ** p).sum(axis=axes, keepdims=True)
    return from_compute(total ** (1.0 / p), x.dtype)


@register("GlobalAveragePool")
def global_average_pool(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """float32: ReduceMean over the spatial axes, f32(sum16(x) / f32(D)) per channel
    (docs/float-ops.md "Reductions"; NumPy's pairwise mean is not reproducible in C++)."""
    axes = tuple(range(2, x.ndim))
    if x.dtype == np.float32 and x.size and axes:
        return get_op("ReduceMean")(ctx, x, np.array(axes, np.int64), keepdims=1)
    return from_compute(to_compute(x).mean(axis=axes, keepdims=True), x.dtype)


@register("GlobalMaxPool")
def global_max_pool(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """float32: ReduceMax over the spatial axes, (M1)-(M3) per channel."""
    axes = tuple(range(2, x.ndim))
    if x.dtype == np.float32 and x.size and axes:
        return get_op("ReduceMax")(ctx, x, np.array(axes, np.int64), keepdims=1)
    return from_compute(to_compute(x).max(axis=axes, keepdims=True), x.dtype)
