"""Float convolutions (ai.onnx Conv, ConvTranspose, Col2Im) and the window geometry they
share with pooling (nn_pool.py).

Geometry, per spatial axis, with input size ``n``, kernel ``k``, stride ``s``, dilation
``d`` and the dilated extent ``dk = (k - 1) * d + 1``:

    (1) explicit pads:  out = floor((n + pad_begin + pad_end - dk) / s) + 1
    (2) ceil_mode:      out = ceil(...) of (1), minus 1 when that last window would start
                        beyond the input and its begin padding ((out - 1) * s >= n + pad_begin)
    (3) SAME_UPPER / SAME_LOWER: out = ceil(n / s),
                        total = max(0, (out - 1) * s + dk - n); UPPER puts total // 2 at the
                        begin (the odd element at the end), LOWER puts it at the end
    (4) VALID:          pads 0, out from (1)

Conv is im2col + one matmul per group:

    cols[n, g, (c, kernel offset), p] = x_padded[n, g*C/G + c, p*s + kernel offset*d]
    y[n, g*M/G + m, p]                = sum_(c, k) w[g*M/G + m, c, k] * cols[n, g, (c, k), p] + b

ConvTranspose is the adjoint: a matmul gives every input position's contribution to each
kernel offset, and those are scatter-added (col2im) into an output canvas at ``i*s + k*d``;
the canvas is then cropped by the pads (or zero-extended when they are negative).

conv_geometry.py (owned by the quantized-ops helper) did not exist when this module was
written, so the geometry lives here; ops reuse :func:`window_geometry`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from quanta.kernels.reference.nn import compute_dtype, from_compute, to_compute
from quanta.kernels.reference.registry import OpContext, OpError, register

__all__ = ["conv_windows", "spatial_defaults", "window_geometry"]


# --------------------------------------------------------------------------- geometry


def spatial_defaults(
    op: str,
    n_spatial: int,
    kernel_shape: Sequence[int],
    strides: Sequence[int] | None,
    dilations: Sequence[int] | None,
    pads: Sequence[int] | None,
) -> tuple[list[int], list[int], list[int]]:
    """strides, dilations, pads with their ONNX defaults (1, 1, 0), checked for length."""
    strides = [1] * n_spatial if strides is None else list(strides)
    dilations = [1] * n_spatial if dilations is None else list(dilations)
    pads = [0] * (2 * n_spatial) if pads is None else list(pads)
    for name, value, n in (("kernel_shape", kernel_shape, n_spatial), ("strides", strides, n_spatial),
                           ("dilations", dilations, n_spatial), ("pads", pads, 2 * n_spatial)):
        if len(value) != n:
            raise OpError(f"{op}: {name} expected {n} values for {n_spatial} spatial axes, got {list(value)}")
    if min(strides) < 1 or min(dilations) < 1:
        raise OpError(f"{op}: strides and dilations expected >= 1, got {strides} and {dilations}")
    return strides, dilations, pads


def window_geometry(
    op: str,
    in_shape: Sequence[int],
    kernel_shape: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[int],
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
) -> tuple[list[int], list[int], list[int]]:
    """(pads_begin, pads_end, out_shape) for a sliding window; equations (1)-(4)."""
    n_spatial = len(in_shape)
    begin, end, out = [], [], []
    for i in range(n_spatial):
        n, k, s, d = in_shape[i], kernel_shape[i], strides[i], dilations[i]
        dk = (k - 1) * d + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-n // s)
            total = max(0, (o - 1) * s + dk - n)
            small, large = total // 2, total - total // 2
            pb, pe = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
        elif auto_pad == "VALID":
            pb, pe = 0, 0
            o = (n - dk) // s + 1
        elif auto_pad == "NOTSET":
            pb, pe = pads[i], pads[n_spatial + i]
            span = n + pb + pe - dk
            if ceil_mode:
                o = -(-span // s) + 1
                if (o - 1) * s >= n + pb:
                    o -= 1
            else:
                o = span // s + 1
        else:
            raise OpError(f"{op}: auto_pad expected NOTSET, SAME_UPPER, SAME_LOWER or VALID, got {auto_pad!r}")
        if o < 1:
            raise OpError(
                f"{op}: window of extent {dk} (kernel {k}, dilation {d}) does not fit spatial axis {i} "
                f"of size {n} with pads ({pb}, {pe})"
            )
        begin.append(pb)
        end.append(pe)
        out.append(o)
    return begin, end, out


def conv_windows(
    x_padded: np.ndarray,
    kernel_shape: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    out_shape: Sequence[int],
) -> np.ndarray:
    """View of shape (N, C, *out_shape, *kernel_shape): window element
    ``[n, c, o..., k...] = x_padded[n, c, o*s + k*d ...]``. ``x_padded`` must cover the last
    window."""
    n_spatial = len(kernel_shape)
    extent = [(k - 1) * d + 1 for k, d in zip(kernel_shape, dilations)]
    windows = sliding_window_view(x_padded, extent, axis=tuple(range(2, 2 + n_spatial)))
    index = (
        (slice(None), slice(None))
        + tuple(slice(0, (o - 1) * s + 1, s) for o, s in zip(out_shape, strides))
        + tuple(slice(None, None, d) for d in dilations)
    )
    return windows[index]


def _pad_spatial(x: np.ndarray, begin: Sequence[int], end: Sequence[int], value: float = 0) -> np.ndarray:
    if not any(begin) and not any(end):
        return x
    if min(begin) < 0 or min(end) < 0:
        raise OpError(f"pads expected >= 0, got begin {list(begin)} end {list(end)}")
    widths = [(0, 0), (0, 0), *zip(begin, end)]
    return np.pad(x, widths, mode="constant", constant_values=value)


def _scatter_windows(
    cols: np.ndarray, canvas_shape: Sequence[int], strides: Sequence[int], dilations: Sequence[int]
) -> np.ndarray:
    """The adjoint of :func:`conv_windows`: cols (N, C, *kernel, *positions) is added into a
    zero canvas (N, C, *canvas_shape) at ``position*s + k*d``."""
    n_spatial = len(strides)
    kernel = cols.shape[2 : 2 + n_spatial]
    positions = cols.shape[2 + n_spatial :]
    canvas = np.zeros((*cols.shape[:2], *canvas_shape), dtype=cols.dtype)
    for offset in itertools.product(*(range(k) for k in kernel)):
        target = tuple(
            slice(k * d, k * d + (p - 1) * s + 1, s) for k, d, p, s in zip(offset, dilations, positions, strides)
        )
        canvas[(slice(None), slice(None), *target)] += cols[(slice(None), slice(None), *offset)]
    return canvas


def _crop_spatial(canvas: np.ndarray, begin: Sequence[int], out_shape: Sequence[int]) -> np.ndarray:
    """canvas[..., begin : begin + out] per spatial axis; indices outside the canvas (a
    negative begin, or past its end) read as zero."""
    n_spatial = len(out_shape)
    lead = [max(0, -b) for b in begin]
    trail = [max(0, b + o - c) for b, o, c in zip(begin, out_shape, canvas.shape[2:])]
    if any(lead) or any(trail):
        canvas = np.pad(canvas, [(0, 0), (0, 0), *zip(lead, trail)])
    index = tuple(slice(b + le, b + le + o) for b, le, o in zip(begin, lead, out_shape))
    assert len(index) == n_spatial
    return canvas[(slice(None), slice(None), *index)]


# ------------------------------------------------------------------------------ Conv


@register("Conv")
def conv(
    ctx: OpContext,
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """x (N, C, *in), w (M, C/group, *kernel), b (M) -> y (N, M, *out)."""
    del ctx  # unused
    if x.ndim < 3 or w.ndim != x.ndim:
        raise OpError(f"Conv: expected x (N, C, spatial...) and w of the same rank, got {x.shape} and {w.shape}")
    n_spatial = x.ndim - 2
    n, c = x.shape[:2]
    m = w.shape[0]
    kernel = list(w.shape[2:])
    if kernel_shape is not None and list(kernel_shape) != kernel:
        raise OpError(f"Conv: kernel_shape {list(kernel_shape)} differs from the weight's {kernel}")
    if c != w.shape[1] * group or m % group:
        raise OpError(
            f"Conv: expected x channels = w.shape[1] * group and M divisible by group, got C={c}, "
            f"w {w.shape}, group={group}"
        )
    strides, dilations, pads = spatial_defaults("Conv", n_spatial, kernel, strides, dilations, pads)
    begin, end, out = window_geometry("Conv", x.shape[2:], kernel, strides, dilations, pads, auto_pad)

    xc = _pad_spatial(to_compute(x), begin, end)
    windows = conv_windows(xc, kernel, strides, dilations, out)  # (N, C, *out, *kernel)
    # im2col: (N, C, *kernel, *out) -> (N, G, C/G * K, P)
    order = (0, 1, *range(2 + n_spatial, 2 + 2 * n_spatial), *range(2, 2 + n_spatial))
    cols = windows.transpose(order).reshape(n, group, (c // group) * math.prod(kernel), math.prod(out))
    wc = w.astype(compute_dtype(x.dtype), copy=False).reshape(group, m // group, -1)
    y = np.matmul(wc, cols).reshape(n, m, *out)  # (G, M/G, CK) @ (N, G, CK, P)
    if b is not None:
        y = y + b.astype(y.dtype, copy=False).reshape(m, *([1] * n_spatial))
    return from_compute(y, x.dtype)


@register("ConvTranspose")
def conv_transpose(
    ctx: OpContext,
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    output_padding: list[int] | None = None,
    output_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """x (N, C, *in), w (C, M/group, *kernel), b (M) -> y (N, M, *out).

    Per axis the un-cropped result has ``full = s * (n - 1) + dk`` positions, and

    - ``output_shape`` given: out = output_shape, total = full + output_padding - out
      split as in SAME_UPPER when auto_pad is SAME_UPPER, else the larger half at the begin
      (the explicit pads are ignored, as the spec says);
    - SAME_UPPER / SAME_LOWER: the same with out = n * s;
    - otherwise out = full + output_padding - pad_begin - pad_end.
    """
    del ctx  # unused
    if x.ndim < 3 or w.ndim != x.ndim:
        raise OpError(
            f"ConvTranspose: expected x (N, C, spatial...) and w of the same rank, got {x.shape} and {w.shape}"
        )
    n_spatial = x.ndim - 2
    n, c = x.shape[:2]
    in_shape = list(x.shape[2:])
    kernel = list(w.shape[2:])
    if kernel_shape is not None and list(kernel_shape) != kernel:
        raise OpError(f"ConvTranspose: kernel_shape {list(kernel_shape)} differs from the weight's {kernel}")
    if w.shape[0] != c or c % group:
        raise OpError(
            f"ConvTranspose: expected w.shape[0] = C divisible by group, got C={c}, w {w.shape}, group={group}"
        )
    m = w.shape[1] * group
    strides, dilations, pads = spatial_defaults("ConvTranspose", n_spatial, kernel, strides, dilations, pads)
    output_padding = [0] * n_spatial if output_padding is None else list(output_padding)
    full = [s * (i - 1) + (k - 1) * d + 1 for i, k, s, d in zip(in_shape, kernel, strides, dilations)]

    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if output_shape is not None:
            out = list(output_shape)[-n_spatial:]
        else:
            out = [i * s for i, s in zip(in_shape, strides)]
        total = [f + op - o for f, op, o in zip(full, output_padding, out)]
        if auto_pad == "SAME_UPPER":
            begin = [t // 2 for t in total]
        else:
            begin = [t - t // 2 for t in total]
    elif auto_pad in ("NOTSET", "VALID"):
        if auto_pad == "VALID":
            pads = [0] * (2 * n_spatial)
        begin = pads[:n_spatial]
        out = [f + op - pb - pe for f, op, pb, pe in zip(full, output_padding, pads[:n_spatial], pads[n_spatial:])]
    else:
        raise OpError(f"ConvTranspose: auto_pad expected NOTSET, SAME_UPPER, SAME_LOWER or VALID, got {auto_pad!r}")
    if min(out) < 1:
        raise OpError(f"ConvTranspose: output spatial shape must be positive, got {out}")

    # cols[n, g, (m, k), p] = sum_c w[g, c, m, k] * x[n, g, c, p]
    dtype = compute_dtype(x.dtype)
    wc = w.astype(dtype, copy=False).reshape(group, c // group, -1).transpose(0, 2, 1)
    xc = to_compute(x).reshape(n, group, c // group, math.prod(in_shape))
    cols = np.matmul(wc, xc).reshape(n, m, *kernel, *in_shape)
    canvas = _scatter_windows(cols, full, strides, dilations)
    y = _crop_spatial(canvas, begin, out)
    if b is not None:
        y = y + b.astype(dtype, copy=False).reshape(m, *([1] * n_spatial))
    return from_compute(y, x.dtype)


@register("Col2Im")
def col2im(
    ctx: OpContext,
    x: np.ndarray,
    image_shape: np.ndarray,
    block_shape: np.ndarray,
    *,
    dilations: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """x (N, C * prod(block_shape), L) -> y (N, C, *image_shape): every column of x is a
    block, added into the padded image at its sliding-window position (blocks in row-major
    order, as Conv's im2col produces them), then the pads are cropped."""
    del ctx  # unused
    image = [int(v) for v in np.asarray(image_shape).reshape(-1)]
    block = [int(v) for v in np.asarray(block_shape).reshape(-1)]
    n_spatial = len(image)
    strides, dilations, pads = spatial_defaults("Col2Im", n_spatial, block, strides, dilations, pads)
    begin, end, positions = window_geometry("Col2Im", image, block, strides, dilations, pads)
    k = math.prod(block)
    if x.ndim != 3 or x.shape[1] % k or x.shape[2] != math.prod(positions):
        raise OpError(
            f"Col2Im: expected x (N, C * {k}, {math.prod(positions)}) for blocks {block} over image {image}, "
            f"got {x.shape}"
        )
    cols = to_compute(x).reshape(x.shape[0], x.shape[1] // k, *block, *positions)
    padded = [i + pb + pe for i, pb, pe in zip(image, begin, end)]
    canvas = _scatter_windows(cols, padded, strides, dilations)
    return from_compute(_crop_spatial(canvas, begin, image), x.dtype)
