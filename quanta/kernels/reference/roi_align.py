"""RoiAlign, float32, in the order the native kernel follows (docs/float-ops.md "RoiAlign",
eqs. (RA1)-(RA4)): ONNX Runtime's algorithm, which ONNX's reference copies.

X [N, C, H, W], rois [R, 4] (x1, y1, x2, y2), batch_indices [R] -> Y [R, C, PH, PW]. Per
roi, every step one float32 operation (s = spatial_scale, o = 0.5 for half_pixel, 0 for
output_half_pixel, the mode of opsets 10-15)::

    (RA1) start = f32(f32(x1 · s) − o), end = f32(f32(x2 · s) − o)  (y the same);
          size = f32(end − start), at least 1 for output_half_pixel; bin = f32(size / P);
          G = sampling_ratio if > 0 else ceil(f32(size / P)) samples per bin and axis (0 for
          a size that is not finite; no samples: the output is 0)
    (RA2) sample (p, i): f32(f32(start + f32(p · bin)) + f32(f32(f32(i + 0.5) · bin) / G))
    (RA3) a sample outside [−1, H] x [−1, W] has weights 0 at pixel 0; else y = max(y, 0),
          (a NaN sample is outside), y0 = trunc(y), y1 = y0 + 1, or y0 = y1 = H − 1 and
          y = H − 1 from y0 >= H − 1;
          ly = f32(y − y0), hy = f32(1 − ly) (x the same); weights f32(hy·hx), f32(hy·lx),
          f32(ly·hx), f32(ly·lx) of (y0, x0), (y0, x1), (y1, x0), (y1, x1)
    (RA4) avg: acc = 0, then per sample in (i_y, i_x) order
          acc = f32(acc + f32(f32(f32(w1·v1 + w2·v2) + w3·v3) + w4·v4)) (each product rounded),
          y = f32(acc / max(G_y·G_x, 1)); max: per sample m = max(max(max(w1·v1, w2·v2),
          w3·v3), w4·v4), y the running maximum from the first sample (max(a, b) = a < b ?
          b : a), 0 without samples

Other dtypes run on onnx.reference.
"""

from __future__ import annotations

import math

import numpy as np

from quanta.kernels.reference.registry import OpContext, OpError, register

__all__ = ["roi_align", "roi_align_mode"]

F32 = np.float32


def roi_align_mode(ctx: OpContext, coordinate_transformation_mode: str | bytes | None) -> bool:
    """True for half_pixel (the default from opset 16), False for output_half_pixel."""
    if coordinate_transformation_mode is None:
        return ctx.opset >= 16
    mode = coordinate_transformation_mode
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in ("half_pixel", "output_half_pixel"):
        raise OpError(
            f"RoiAlign: coordinate_transformation_mode expected half_pixel or output_half_pixel, got {mode!r}"
        )
    return mode == "half_pixel"


def _axis(start: np.float32, size: np.float32, pooled: int, grid: int, extent: int):
    """(RA2)-(RA3) along one axis: per (bin, sample) the low / high pixel, the weights
    (low, high) and whether the sample is inside [-1, extent]."""
    bin_size = F32(size / F32(pooled))
    p = np.arange(pooled, dtype=F32)[:, None]
    i = np.arange(grid, dtype=F32)[None, :]
    pos = (start + p * bin_size) + ((i + F32(0.5)) * bin_size) / F32(grid)  # [P, G]
    inside = (pos >= F32(-1)) & (pos <= F32(extent))  # NaN: outside
    pos = np.where(inside, np.where(pos <= F32(0), F32(0), pos), F32(0))
    low = np.trunc(pos).astype(np.int64)
    top = low >= extent - 1
    low = np.where(top, extent - 1, low)
    high = np.where(top, extent - 1, low + 1)
    pos = np.where(top, F32(extent - 1), pos).astype(F32)
    frac = (pos - low.astype(F32)).astype(F32)
    return low, high, (F32(1) - frac).astype(F32), frac, inside


def _grid(sampling_ratio: int, bins_per_pixel: np.float32) -> int:
    """(RA1)'s samples per bin along an axis; 0 for a size that is not finite."""
    if sampling_ratio > 0:
        return int(sampling_ratio)
    return math.ceil(bins_per_pixel) if np.isfinite(bins_per_pixel) else 0


def _term(
    plane: np.ndarray, inside: np.ndarray, wy: np.ndarray, wx: np.ndarray, yi: np.ndarray, xi: np.ndarray
):
    """One corner's f32(f32(wy · wx) · v) for every sample [C, PH, GH, PW, GW] (weight 0
    at pixel 0 outside, (RA3))."""
    wgt = np.where(inside, wy[:, :, None, None] * wx[None, None, :, :], F32(0))
    yy = np.where(inside, yi[:, :, None, None], 0)
    xx = np.where(inside, xi[None, None, :, :], 0)
    return wgt * plane[:, yy, xx]


def _max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C++'s std::max(a, b) = a < b ? b : a (a NaN b keeps a)."""
    return np.where(a < b, b, a)


@register("RoiAlign")
def roi_align(
    ctx: OpContext,
    x: np.ndarray,
    rois: np.ndarray,
    batch_indices: np.ndarray,
    *,
    coordinate_transformation_mode: str | None = None,
    mode: str = "avg",
    output_height: int = 1,
    output_width: int = 1,
    sampling_ratio: int = 0,
    spatial_scale: float = 1.0,
) -> np.ndarray:
    half_pixel = roi_align_mode(ctx, coordinate_transformation_mode)
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if x.dtype != F32 or rois.dtype != F32:
        from quanta.kernels.reference.delegate import delegate_to_onnx_reference

        attrs = {
            "mode": mode,
            "output_height": output_height,
            "output_width": output_width,
            "sampling_ratio": sampling_ratio,
            "spatial_scale": spatial_scale,
        }
        if coordinate_transformation_mode is not None:
            attrs["coordinate_transformation_mode"] = coordinate_transformation_mode
        return delegate_to_onnx_reference(ctx, (x, rois, batch_indices), attrs)[0]
    if mode not in ("avg", "max"):
        raise OpError(f"RoiAlign: mode expected avg or max, got {mode!r}")
    if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4 or np.shape(batch_indices) != (rois.shape[0],):
        raise OpError(
            f"RoiAlign: expected X [N, C, H, W], rois [R, 4], batch_indices [R], got {x.shape}, {rois.shape}, "
            f"{np.shape(batch_indices)}"
        )
    n, c, h, w = x.shape
    batch = np.asarray(batch_indices).astype(np.int64)
    if ((batch < 0) | (batch >= n)).any():
        raise OpError(f"RoiAlign: batch_indices expected in [0, {n}), got {batch.tolist()}")
    ph, pw = int(output_height), int(output_width)
    s, o = F32(spatial_scale), F32(0.5 if half_pixel else 0.0)
    y = np.zeros((rois.shape[0], c, ph, pw), F32)
    for r, (x1, y1, x2, y2) in enumerate(rois):
        start_w, start_h = F32(x1 * s) - o, F32(y1 * s) - o  # (RA1)
        size_w, size_h = F32(F32(x2 * s) - o) - start_w, F32(F32(y2 * s) - o) - start_h
        if not half_pixel:
            size_w, size_h = max(size_w, F32(1)), max(size_h, F32(1))
        gh, gw = _grid(sampling_ratio, F32(size_h / F32(ph))), _grid(sampling_ratio, F32(size_w / F32(pw)))
        count = F32(max(gh * gw, 1))
        if gh <= 0 or gw <= 0:
            continue  # no samples: 0 (avg: 0 / count; max: 0)
        ylo, yhi, hy, ly, yin = _axis(start_h, size_h, ph, gh, h)
        xlo, xhi, hx, lx, xin = _axis(start_w, size_w, pw, gw, w)
        plane = x[batch[r]]  # [C, H, W]
        # samples [PH, GH, PW, GW] -> (bin y, bin x, sample y, sample x)
        inside = yin[:, :, None, None] & xin[None, None, :, :]

        t1, t2, t3, t4 = (
            _term(plane, inside, wy, wx, yi, xi)
            for wy, wx, yi, xi in (
                (hy, hx, ylo, xlo),
                (hy, lx, ylo, xhi),
                (ly, hx, yhi, xlo),
                (ly, lx, yhi, xhi),
            )
        )
        acc = np.zeros((c, ph, pw), F32) if mode == "avg" else None
        for iy in range(gh):  # (RA4): samples in (i_y, i_x) order
            for ix in range(gw):
                sel = (slice(None), slice(None), iy, slice(None), ix)
                if mode == "avg":
                    acc = acc + (((t1[sel] + t2[sel]) + t3[sel]) + t4[sel])
                else:
                    v = _max(_max(_max(t1[sel], t2[sel]), t3[sel]), t4[sel])
                    acc = v if acc is None else _max(acc, v)
        y[r] = acc / count if mode == "avg" else acc
    return y
