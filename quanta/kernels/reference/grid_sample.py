"""GridSample over 2-D images, float32, in the order the native kernel follows
(docs/float-ops.md "GridSample", eqs. (GS1)-(GS4)).

X [N, C, H, W], grid [N, Ho, Wo, 2] of normalized (x, y) in [-1, 1] (x along W), Y [N, C,
Ho, Wo]. Every step is one float32 operation:

    (GS1) x = f32(f32(f32(f32(gx + 1) · W) − 1) · 0.5)       align_corners = 0
          x = f32(f32(f32(gx + 1) · 0.5) · (W − 1))           align_corners = 1
          (y the same with gy and H)
    (GS2) border: a NaN coordinate is 0, then x = min(max(x, 0), W − 1);
          zeros: x = min(max(x, −2), W + 1) (every position outside [-1, W] reads zeros
          either way; the clamp keeps the integer conversion defined), NaN reads zeros
    (GS3) linear: x0 = floor(x), dx = f32(x − x0), the weights (f32(1 − dx), dx) of
          columns x0, x0 + 1 (rows the same); nearest: x0 = round half to even (x)
    (GS4) linear: r_j = f32(f32(wx0 · p[y_j, x0]) + f32(wx1 · p[y_j, x0 + 1])) for the
          rows y0, y0 + 1, then y = f32(f32(wy0 · r_0) + f32(wy1 · r_1)); nearest: p[y0, x0]

p[i, j] is X's pixel when (i, j) lies in the image, else 0 (zeros), or the pixel at the
clamped index (border). These are PyTorch's and ONNX's formulas (the ONNX reference
interpolates rows first too); the fixed order makes the native kernel's bytes equal
these. Reflection padding, cubic mode, other dtypes and N-D grids run on
``onnx.reference`` (delegate_to_onnx_reference).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.kernels.reference.registry import OpContext, OpError, register

__all__ = ["grid_sample", "grid_sample_coords", "native_grid_sample_supports"]

F32 = np.float32


def native_grid_sample_supports(x: Any, grid: Any, mode: str, padding_mode: str) -> bool:
    """Whether (GS1)-(GS4) cover this call (else onnx.reference computes it)."""
    return (
        isinstance(x, np.ndarray)
        and isinstance(grid, np.ndarray)
        and x.dtype == F32
        and grid.dtype == F32
        and x.ndim == 4
        and grid.ndim == 4
        and grid.shape[-1] == 2
        and grid.shape[0] == x.shape[0]
        and mode in ("linear", "bilinear", "nearest")
        and padding_mode in ("zeros", "border")
    )


def grid_sample_coords(g: np.ndarray, size: int, align_corners: bool, border: bool) -> np.ndarray:
    """(GS1) and (GS2) for one axis: float32 pixel coordinates of normalized ``g``."""
    one, half = F32(1), F32(0.5)
    with np.errstate(invalid="ignore", over="ignore"):
        if align_corners:
            x = ((g + one) * half) * F32(size - 1)
        else:
            x = ((g + one) * F32(size) - one) * half
        if border:
            x = np.where(np.isnan(x), F32(0), x)
            return np.minimum(np.maximum(x, F32(0)), F32(size - 1))
        return np.minimum(np.maximum(x, F32(-2)), F32(size + 1))  # NaN stays NaN: reads zeros


def _pixels(plane: np.ndarray, yi: np.ndarray, xi: np.ndarray, h: int, w: int, border: bool) -> np.ndarray:
    """p[yi, xi] per channel: plane [C, H, W], yi / xi int64 [P] -> [C, P]."""
    if border:
        return plane[:, np.clip(yi, 0, h - 1), np.clip(xi, 0, w - 1)]
    inside = (yi >= 0) & (yi < h) & (xi >= 0) & (xi < w)
    v = plane[:, np.where(inside, yi, 0), np.where(inside, xi, 0)]
    return np.where(inside, v, F32(0))


@register("GridSample")
def grid_sample(
    ctx: OpContext,
    x: np.ndarray,
    grid: np.ndarray,
    *,
    align_corners: int = 0,
    mode: str = "linear",
    padding_mode: str = "zeros",
) -> np.ndarray:
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    padding_mode = padding_mode.decode() if isinstance(padding_mode, bytes) else str(padding_mode)
    if not native_grid_sample_supports(x, grid, mode, padding_mode):
        from quanta.kernels.reference.delegate import delegate_to_onnx_reference

        attrs = {"align_corners": align_corners, "mode": mode, "padding_mode": padding_mode}
        return delegate_to_onnx_reference(ctx, (x, grid), attrs)[0]
    if grid.shape[0] != x.shape[0]:
        raise OpError(f"GridSample: grid's batch {grid.shape[0]} differs from X's {x.shape[0]}")
    n, c, h, w = x.shape
    _, ho, wo, _ = grid.shape
    border = padding_mode == "border"
    y = np.empty((n, c, ho, wo), F32)
    for b in range(n):
        gx = grid_sample_coords(grid[b, ..., 0].reshape(-1), w, bool(align_corners), border)
        gy = grid_sample_coords(grid[b, ..., 1].reshape(-1), h, bool(align_corners), border)
        bad = np.isnan(gx) | np.isnan(gy)  # zeros padding only (border mapped NaN to 0)
        gx, gy = np.where(bad, F32(-2), gx), np.where(bad, F32(-2), gy)
        if mode == "nearest":
            out = _pixels(x[b], np.rint(gy).astype(np.int64), np.rint(gx).astype(np.int64), h, w, border)
        else:
            x0, y0 = np.floor(gx), np.floor(gy)
            dx, dy = gx - x0, gy - y0
            wx0, wy0 = F32(1) - dx, F32(1) - dy
            xi, yi = x0.astype(np.int64), y0.astype(np.int64)
            rows = []
            for yj in (yi, yi + 1):
                rows.append(
                    _pixels(x[b], yj, xi, h, w, border) * wx0 + _pixels(x[b], yj, xi + 1, h, w, border) * dx
                )
            out = rows[0] * wy0 + rows[1] * dy
        y[b] = out.reshape(c, ho, wo)
    return y
