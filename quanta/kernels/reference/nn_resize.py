"""Resize (ai.onnx, opsets 10-19): nearest / linear / cubic, every coordinate
transformation mode, antialias, exclude_outside, keep_aspect_ratio_policy and axes.

Resize is separable: each resized axis is interpolated on its own, one after the other,
in float64 (as the ONNX reference does), and the result is cast once to x's dtype
(integers rounded half to even and saturated).

Per axis, with input length ``n``, scale ``s`` and output length ``o``:

    (1) o = floor(n * s) when ``scales`` is given; from ``sizes`` s = o / n, and with
        keep_aspect_ratio_policy not_larger / not_smaller one s = min / max over the
        resized axes and o = floor(s * n + 0.5)
    (2) every output index y maps to a source coordinate x, with L = length_resized:
        o from ``sizes`` (stretch), n * s otherwise (fractional when it comes from a scale,
        the spec's ``output_width``):
          half_pixel            x = (y + 0.5) / s - 0.5
          half_pixel_symmetric  x = (n / 2) * (1 - o / L) + (y + 0.5) / s - 0.5
          pytorch_half_pixel    x = (y + 0.5) / s - 0.5 if L > 1 else 0
          align_corners         x = y * (n - 1) / (L - 1)   (0 when L == 1)
          asymmetric            x = y / s
          tf_crop_and_resize    x = roi_start * (n - 1) + y * (roi_end - roi_start) * (n - 1) / (L - 1)
                                (the roi midpoint when L == 1); x outside [0, n - 1]
                                gives extrapolation_value
    (3) nearest: index = round(x) by nearest_mode (round_prefer_floor rounds x.5 down),
        clamped to [0, n - 1]
        linear / cubic: y = sum_j w_j * x[clamp(j)] over the taps j around x, with
        w_j = K(j - x): K(d) = max(0, 1 - |d|) (linear) or the Keys cubic kernel with
        coefficient a (cubic). antialias (when s < 1) stretches the kernel:
        w_j = K((j - x) * s), normalized to sum 1. exclude_outside sets w_j = 0 for taps
        outside [0, n) and renormalizes (linear and cubic only; nearest always clamps).

Known difference from ONNX Runtime (1.32): for align_corners and tf_crop_and_resize with
a scale that makes n * s fractional, ONNX Runtime uses the integer o as L;
this reference follows the spec and the ONNX reference evaluator (L = n * s), as
the node tests test_resize_downsample_scales_{linear,cubic}_align_corners require. With
``sizes``, or whenever n * s is an integer, the two agree.

Opset 10 has only ``scales`` and ``mode``; its coordinate mapping is asymmetric and
nearest rounds down (the Upsample semantics it replaced).
"""

from __future__ import annotations

import math

import numpy as np

from quanta.kernels.reference.registry import OpContext, OpError, register

_COORDINATE_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _source_coordinates(
    mode: str, n: int, o: int, s: float, length_resized: float, roi: tuple[float, float]
) -> np.ndarray:
    """Equation (2): the source coordinate of every output index along one axis."""
    y = np.arange(o, dtype=np.float64)
    if mode == "half_pixel":
        return (y + 0.5) / s - 0.5
    if mode == "half_pixel_symmetric":
        offset = (n / 2) * (1 - o / length_resized)
        return offset + (y + 0.5) / s - 0.5
    if mode == "pytorch_half_pixel":
        return (y + 0.5) / s - 0.5 if length_resized > 1 else np.zeros(o)
    if mode == "align_corners":
        return y * (n - 1) / (length_resized - 1) if length_resized != 1 else np.zeros(o)
    if mode == "asymmetric":
        return y / s
    if mode == "tf_crop_and_resize":
        start, end = roi
        if length_resized == 1:
            return np.full(o, 0.5 * (start + end) * (n - 1))
        return start * (n - 1) + y * (end - start) * (n - 1) / (length_resized - 1)
    raise OpError(f"Resize: coordinate_transformation_mode expected one of {_COORDINATE_MODES}, got {mode!r}")


def _nearest_index(x: np.ndarray, nearest_mode: str) -> np.ndarray:
    if nearest_mode == "round_prefer_floor":
        index = np.ceil(x - 0.5)
    elif nearest_mode == "round_prefer_ceil":
        index = np.floor(x + 0.5)
    elif nearest_mode == "floor":
        index = np.floor(x)
    elif nearest_mode == "ceil":
        index = np.ceil(x)
    else:
        raise OpError(f"Resize: nearest_mode expected one of {_NEAREST_MODES}, got {nearest_mode!r}")
    return index.astype(np.int64)


def _cubic_kernel(d: np.ndarray, a: float) -> np.ndarray:
    """Keys (1981) cubic convolution kernel with coefficient a."""
    d = np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _taps_and_weights(
    x: np.ndarray, n: int, s: float, mode: str, cubic_coeff_a: float, antialias: bool, exclude_outside: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Equation (3) for linear / cubic: (o, taps) source indices and weights."""
    support = 1.0 if mode == "linear" else 2.0
    stretch = min(s, 1.0) if antialias else 1.0  # kernel argument scale
    half_width = math.ceil(support / stretch)
    first = np.floor(x).astype(np.int64) - half_width + 1
    taps = first[:, None] + np.arange(2 * half_width)[None, :]
    distance = (taps - x[:, None]) * stretch
    if mode == "linear":
        weights = np.maximum(0.0, 1 - np.abs(distance))
    else:
        weights = _cubic_kernel(distance, cubic_coeff_a)
    if antialias:
        weights = weights / weights.sum(axis=1, keepdims=True)
    if exclude_outside:
        weights = np.where((taps < 0) | (taps >= n), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    return np.clip(taps, 0, n - 1), weights


def weighted_taps(data: np.ndarray, axis: int, taps: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(3) along ``axis`` in float64: y_q = x[taps[q, 0]] · w[q, 0] + x[taps[q, 1]] · w[q, 1]
    + ..., added in tap order from the first product (np.sum's pairwise grouping and
    its +0 start depend on the axis' position; the native kernel adds in this order)."""
    shape = [1] * data.ndim
    shape[axis] = taps.shape[0]
    result = None
    for t in range(taps.shape[1]):
        term = np.take(data, taps[:, t], axis=axis) * weights[:, t].reshape(shape)
        result = term if result is None else result + term
    return result


def _resize_axis(
    data: np.ndarray,
    axis: int,
    o: int,
    s: float,
    length_resized: float,
    roi: tuple[float, float],
    attrs: dict,
) -> np.ndarray:
    n = data.shape[axis]
    x = _source_coordinates(attrs["coordinate_transformation_mode"], n, o, s, length_resized, roi)
    if attrs["mode"] == "nearest":
        index = np.clip(_nearest_index(x, attrs["nearest_mode"]), 0, n - 1)
        result = np.take(data, index, axis=axis)
    else:
        taps, weights = _taps_and_weights(
            x, n, s, attrs["mode"], attrs["cubic_coeff_a"], attrs["antialias"], attrs["exclude_outside"]
        )
        result = weighted_taps(data, axis, taps, weights)
    if attrs["coordinate_transformation_mode"] == "tf_crop_and_resize":
        outside = ((x < 0) | (x > n - 1)).reshape([-1 if a == axis else 1 for a in range(data.ndim)])
        result = np.where(outside, attrs["extrapolation_value"], result)
    return result


def _optional(v: np.ndarray | None) -> np.ndarray | None:
    return None if v is None or np.size(v) == 0 else np.asarray(v)


ResizeStep = tuple[int, int, float, float, tuple[float, float]]


def resize_plan(
    ctx: OpContext,
    x_shape: tuple[int, ...],
    roi: np.ndarray | None = None,
    scales: np.ndarray | None = None,
    sizes: np.ndarray | None = None,
    *,
    antialias: int = 0,
    axes: list[int] | None = None,
    coordinate_transformation_mode: str = "half_pixel",
    cubic_coeff_a: float = -0.75,
    exclude_outside: int = 0,
    extrapolation_value: float = 0.0,
    keep_aspect_ratio_policy: str = "stretch",
    mode: str = "nearest",
    nearest_mode: str = "round_prefer_floor",
) -> np.ndarray:
    if ctx.opset < 11:  # Resize-10(X, scales)
        roi, scales, sizes = None, roi, None
        coordinate_transformation_mode, nearest_mode = "asymmetric", "floor"
    roi, scales, sizes = _optional(roi), _optional(scales), _optional(sizes)
    if coordinate_transformation_mode != "tf_crop_and_resize":
        roi = None  # the spec: roi only takes effect with tf_crop_and_resize
    rank = len(x_shape)
    axis_list = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
    if mode not in ("nearest", "linear", "cubic"):
        raise OpError(f"Resize: mode expected 'nearest', 'linear' or 'cubic', got {mode!r}")
    if (scales is None) == (sizes is None):
        raise OpError(
            "Resize: expected exactly one of scales and sizes, got "
            + ("both" if scales is not None else "neither")
        )
    given = scales if scales is not None else sizes
    if given.size != len(axis_list):
        raise OpError(f"Resize: expected {len(axis_list)} scales or sizes (one per axis), got {given.size}")
    if roi is not None and roi.size != 2 * len(axis_list):
        raise OpError(f"Resize: roi expected {2 * len(axis_list)} values (starts, ends), got {roi.size}")

    in_shape = [x_shape[a] for a in axis_list]
    if scales is not None:
        scale = [float(v) for v in scales.reshape(-1)]
        if min(scale) <= 0:
            raise OpError(f"Resize: scales expected > 0, got {scale}")
        out_shape = [math.floor(n * s) for n, s in zip(in_shape, scale)]
        length_resized = [n * s for n, s in zip(in_shape, scale)]
    else:
        out_shape = [int(v) for v in sizes.reshape(-1)]
        scale = [o / n for o, n in zip(out_shape, in_shape)]
        length_resized = [float(o) for o in out_shape]
        if keep_aspect_ratio_policy in ("not_larger", "not_smaller"):
            common = min(scale) if keep_aspect_ratio_policy == "not_larger" else max(scale)
            scale = [common] * len(scale)
            out_shape = [int(common * n + 0.5) for n in in_shape]
            length_resized = [common * n for n in in_shape]
        elif keep_aspect_ratio_policy != "stretch":
            raise OpError(
                f"Resize: keep_aspect_ratio_policy expected stretch, not_larger or not_smaller, "
                f"got {keep_aspect_ratio_policy!r}"
            )

    attrs = {
        "mode": mode,
        "coordinate_transformation_mode": coordinate_transformation_mode,
        "nearest_mode": nearest_mode,
        "cubic_coeff_a": cubic_coeff_a,
        "antialias": bool(antialias),
        "exclude_outside": bool(exclude_outside),
        "extrapolation_value": extrapolation_value,
    }
    k = len(axis_list)
    steps: list[ResizeStep] = []
    for i, axis in enumerate(axis_list):
        axis_roi = (0.0, 1.0) if roi is None else (float(roi[i]), float(roi[k + i]))
        if out_shape[i] == in_shape[i] and scale[i] == 1.0 and axis_roi == (0.0, 1.0):
            continue  # identity along this axis under every coordinate mode
        steps.append((axis, out_shape[i], scale[i], length_resized[i], axis_roi))
    return attrs, steps


def resize_axis_tables(n: int, step: ResizeStep, attrs: dict) -> tuple[np.ndarray, np.ndarray | None]:
    """Equation (3) for one step of :func:`resize_plan` on an axis of length ``n``: the
    nearest source index per output index (weights None), or the linear / cubic taps
    [o, T] and weights [o, T]."""
    _, o, s, length_resized, roi = step
    x = _source_coordinates(attrs["coordinate_transformation_mode"], n, o, s, length_resized, roi)
    if attrs["mode"] == "nearest":
        return np.clip(_nearest_index(x, attrs["nearest_mode"]), 0, n - 1), None
    return _taps_and_weights(
        x, n, s, attrs["mode"], attrs["cubic_coeff_a"], attrs["antialias"], attrs["exclude_outside"]
    )


@register("Resize")
def resize(
    ctx: OpContext,
    x: np.ndarray,
    roi: np.ndarray | None = None,
    scales: np.ndarray | None = None,
    sizes: np.ndarray | None = None,
    **attributes,
) -> np.ndarray:
    attrs, steps = resize_plan(ctx, x.shape, roi, scales, sizes, **attributes)
    data = x.astype(np.float64)
    for axis, o, s, length_resized, axis_roi in steps:
        data = _resize_axis(data, axis, o, s, length_resized, axis_roi, attrs)
    return resize_output(data, x.dtype)


def resize_output(data: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The float64 result in x's dtype: integers rounded half to even and saturated."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.clip(np.rint(data), info.min, info.max).astype(dtype)
    return data.astype(dtype)
