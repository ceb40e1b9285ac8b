"""quanta OrtResizeLinear: ONNX Runtime's float32 bilinear Resize of the last two axes, as
its CPU kernel (upsample.cc, UpsampleBilinear) computes it (docs/float-ops.md, "ONNX
Runtime's float bilinear Resize", eqs. (RB1)-(RB3)):

    (RB1) per output row / column q: c = f32 source coordinate of q (the mode's formula in
          float32; half_pixel: f32(f32(f32(q + 0.5) / s) - 0.5)), clamped to [0, n - 1];
          i1 = min(int(c), n - 1), i2 = min(i1 + 1, n - 1); d1 = |c - i1|, d2 = |c - i2|;
          d1 = d2 = 0.5 where i1 = i2
    (RB2) the four weights f32(dx2 · dy2), f32(dx1 · dy2), f32(dx2 · dy1), f32(dx1 · dy1)
    (RB3) y = ((w22 · x[i1, j1] + w12 · x[i1, j2]) + w21 · x[i2, j1]) + w11 · x[i2, j2],
          every product and sum one float32 rounding, in this order

quanta's own Resize ((Z1)-(Z2): float64 taps, one rounding) is the ONNX value rounded once;
ORT's differs from it by an ulp on some elements, which moves a DynamicQuantizeLinear
scale after the Resize (ORT's `quantize_dynamic` file of MediaPipe's selfie segmenter:
0.17 on a probability). Measured bit for bit against ORT 1.32 (tests/kernels/test_ort_resize.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.kernels.reference.registry import OpContext, OpError, register

__all__ = [
    "ORT_RESIZE_MODES",
    "QUANTA_DOMAIN",
    "ort_bilinear_axis",
    "ort_resize_geometry",
    "ort_resize_linear",
]

F32 = np.float32
QUANTA_DOMAIN = "quanta"
#: coordinate_transformation_mode values whose (RB1) formula is modelled
ORT_RESIZE_MODES = ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel")


def _source(q: np.ndarray, scale: float, n_in: int, n_out: int, mode: str) -> np.ndarray:
    """(RB1)'s source coordinate of each output index, in float32 as ORT computes it."""
    s = F32(scale)
    if mode == "half_pixel":
        return np.subtract(np.divide(np.add(q, F32(0.5), dtype=F32), s, dtype=F32), F32(0.5), dtype=F32)
    if mode == "asymmetric":
        return np.divide(q, s, dtype=F32)
    if mode == "pytorch_half_pixel":
        c = np.subtract(np.divide(np.add(q, F32(0.5), dtype=F32), s, dtype=F32), F32(0.5), dtype=F32)
        return c if n_out > 1 else np.zeros_like(c)
    if mode == "align_corners":
        if n_out == 1:
            return np.zeros_like(q)
        return np.divide(np.multiply(q, F32(n_in - 1), dtype=F32), F32(n_out - 1), dtype=F32)
    raise ValueError(f"OrtResizeLinear: coordinate_transformation_mode {mode!r} is not modelled")


def ort_bilinear_axis(
    n_in: int, n_out: int, scale: float, mode: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(RB1) for one axis: i1, i2 and the float32 distances d1, d2 of every output index."""
    q = np.arange(n_out, dtype=F32)
    c = np.maximum(F32(0), np.minimum(_source(q, scale, n_in, n_out, mode), F32(n_in - 1)))
    i1 = np.minimum(c.astype(np.int64), n_in - 1)
    i2 = np.minimum(i1 + 1, n_in - 1)
    d1 = np.abs(np.subtract(c, i1.astype(F32), dtype=F32))
    d2 = np.abs(np.subtract(c, i2.astype(F32), dtype=F32))
    same = i1 == i2
    d1[same] = F32(0.5)
    d2[same] = F32(0.5)
    return i1, i2, d1, d2


def ort_resize_linear(
    x: np.ndarray, scale_h: float, scale_w: float, n_h: int, n_w: int, mode: str
) -> np.ndarray:
    """ORT's bilinear Resize of ``x [..., H, W]`` (float32) to ``[..., n_h, n_w]`` with
    the scales ORT reads (the ``scales`` input, or n_out / n_in from ``sizes``),
    (RB1)-(RB3)."""
    x = np.asarray(x, F32)
    h, w = x.shape[-2:]
    y1, y2, dy1, dy2 = ort_bilinear_axis(h, n_h, scale_h, mode)
    x1, x2, dx1, dx2 = ort_bilinear_axis(w, n_w, scale_w, mode)
    r1, r2 = x[..., y1, :], x[..., y2, :]
    x11, x21, x12, x22 = r1[..., x1], r1[..., x2], r2[..., x1], r2[..., x2]
    col1, col2 = dx1[None, :], dx2[None, :]
    row1, row2 = dy1[:, None], dy2[:, None]
    w22 = np.multiply(col2, row2, dtype=F32)
    w12 = np.multiply(col1, row2, dtype=F32)
    w21 = np.multiply(col2, row1, dtype=F32)
    w11 = np.multiply(col1, row1, dtype=F32)
    y = np.add(np.multiply(w22, x11, dtype=F32), np.multiply(w12, x21, dtype=F32), dtype=F32)
    y = np.add(y, np.multiply(w21, x12, dtype=F32), dtype=F32)
    return np.add(y, np.multiply(w11, x22, dtype=F32), dtype=F32)


@register("OrtResizeLinear", QUANTA_DOMAIN)
def ort_resize_linear_op(
    ctx: OpContext,
    x: np.ndarray,
    *,
    scales: list[float],
    sizes: list[int],
    coordinate_transformation_mode: str = "half_pixel",
    **attrs: Any,
) -> np.ndarray:
    """quanta OrtResizeLinear-1: ORT's float32 bilinear Resize of the last two axes
    (module docstring). ``scales`` of those two axes; ``sizes`` [0, 0] when the node gave
    scales (the output is then int(f32(n) · f32(s)), as ORT sizes it), else the output
    sizes (and ``scales`` f32(n_out) / f32(n_in), as ORT reads sizes)."""
    del ctx, attrs  # unused
    return ort_resize_linear(*ort_resize_args(x, scales, sizes, coordinate_transformation_mode))


def ort_resize_args(
    x: Any, scales: list[float], sizes: list[int], mode: str | bytes
) -> tuple[np.ndarray, float, float, int, int, str]:
    """The node's input checked and its attributes read: (x, scale_h, scale_w, n_h, n_w,
    mode), the arguments of :func:`ort_resize_linear` (and of the native binder's
    column-first form)."""
    x = np.asarray(x)
    if x.dtype != F32 or x.ndim < 2:
        raise OpError(f"OrtResizeLinear: float32 input of rank >= 2 expected, got {x.dtype} of rank {x.ndim}")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    s_h, s_w, n_h, n_w = ort_resize_geometry(x.shape, scales, sizes)
    return x, s_h, s_w, n_h, n_w, mode


def ort_resize_geometry(
    shape: tuple[int, ...], scales: list[float], sizes: list[int]
) -> tuple[float, float, int, int]:
    """The scales and output sizes ORT uses for the last two axes of ``shape``: from
    ``sizes`` when given (not [0, 0]), f32(n_out) / f32(n_in); from ``scales``,
    int(f32(n_in) · f32(s))."""
    h, w = shape[-2:]
    if int(sizes[0]) > 0:
        n_h, n_w = int(sizes[0]), int(sizes[1])
        return float(F32(n_h) / F32(h)), float(F32(n_w) / F32(w)), n_h, n_w
    s_h, s_w = F32(scales[0]), F32(scales[1])
    return float(s_h), float(s_w), int(F32(h) * s_h), int(F32(w) * s_w)
