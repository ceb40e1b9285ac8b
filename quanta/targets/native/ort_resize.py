"""Native quanta::OrtResizeLinear: ONNX Runtime's float32 bilinear Resize (reference/
ort_resize.py, eqs. (RB1)-(RB3)). No C++ kernel: NumPy, in (RB3)'s operations and order,
arranged for speed. The twin gathers the output rows first (x[y1], x[y2]: arrays of the
output's height) and then the columns along the last axis, which is slow; this binder
gathers the columns of the input's rows first (c1 = x[..., x1], c2 = x[..., x2]: the
input's height by the output's width), then the rows of those (contiguous row copies), and
runs (RB3)'s four products and three sums in place. Gathers move values and the
arithmetic is the twin's, element by element, so the bytes are the twin's
(tests/kernels/test_ort_resize.py): [1, 64, 96, 112] -> 2x, 1 thread, 16-19 ms against
the twin's 40 ms and ONNX Runtime's 23-26 ms (load ~20)."""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.ir.types import F32 as IR_F32
from quanta.kernels.reference.ort_resize import QUANTA_DOMAIN, ort_bilinear_axis, ort_resize_args
from quanta.targets.base import Kernel
from quanta.targets.native import register_binder

F32 = np.float32


def resize_linear(x: np.ndarray, scale_h: float, scale_w: float, n_h: int, n_w: int, mode: str) -> np.ndarray:
    """The twin's ``ort_resize_linear``, bit for bit, columns gathered first (module
    docstring)."""
    x = np.asarray(x, F32)
    h, w = x.shape[-2:]
    y1, y2, dy1, dy2 = ort_bilinear_axis(h, n_h, scale_h, mode)
    x1, x2, dx1, dx2 = ort_bilinear_axis(w, n_w, scale_w, mode)
    c1, c2 = np.take(x, x1, axis=-1), np.take(x, x2, axis=-1)
    w22 = np.multiply(dx2[None, :], dy2[:, None], dtype=F32)
    w12 = np.multiply(dx1[None, :], dy2[:, None], dtype=F32)
    w21 = np.multiply(dx2[None, :], dy1[:, None], dtype=F32)
    w11 = np.multiply(dx1[None, :], dy1[:, None], dtype=F32)
    y = np.take(c1, y1, axis=-2)
    np.multiply(y, w22, out=y)
    t = np.take(c2, y1, axis=-2)
    np.multiply(t, w12, out=t)
    np.add(y, t, out=y)
    np.take(c1, y2, axis=-2, out=t)
    np.multiply(t, w21, out=t)
    np.add(y, t, out=y)
    np.take(c2, y2, axis=-2, out=t)
    np.multiply(t, w11, out=t)
    np.add(y, t, out=y)
    return y


def _ort_resize_linear(
    ctx: Any,
    x: Any,
    *,
    out: np.ndarray | None = None,
    scales: list[float],
    sizes: list[int],
    coordinate_transformation_mode: str = "half_pixel",
    **attrs: Any,
) -> np.ndarray:
    del ctx, attrs  # unused
    y = resize_linear(*ort_resize_args(x, scales, sizes, coordinate_transformation_mode))
    if out is None:
        return y
    np.copyto(out, y)
    return out


@register_binder("OrtResizeLinear", QUANTA_DOMAIN)
def bind_ort_resize_linear(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta::OrtResizeLinear on float32: :func:`resize_linear` (module docstring)."""
    del model  # unused
    x = node.input(0)
    if x is not None and x.type is not None and x.type.elem is not None and x.type.elem != IR_F32:
        return None, f"native OrtResizeLinear takes float32, got {x.type.elem}"
    return Kernel(_ort_resize_linear, "native", "numpy:ort_resize_linear", out=True), ""
