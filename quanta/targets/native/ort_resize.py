"""Native quanta::OrtResizeLinear: ONNX Runtime's float32 bilinear Resize (reference/
ort_resize.py, eqs. (RB1)-(RB3)) on the C++ kernel ``ort_resize_linear_f32``
(kernels/cpp/ort_spatial/ort_spatial.h), bit for bit the twin.

(RB1)'s taps of each axis are the twin's own (``ort_bilinear_axis``), computed once per
input shape and attributes and cached; the kernel runs (RB2)-(RB3) per output row (AVX2:
8 columns a step, the four input values gathered), threads over the output rows
(tests/kernels/test_ort_spatial.py)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.ir.types import F32 as IR_F32
from quanta.kernels.reference.ort_resize import (
    QUANTA_DOMAIN,
    ort_bilinear_axis,
    ort_resize_args,
    ort_resize_geometry,
)
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.native._cache import BoundedCache
from quanta.targets.native._specialize import guarded, step_threads

try:
    from quanta.kernels import _native
except ImportError:  # the binders only run when the extension is built
    _native = None

__all__ = ["bind_ort_resize_linear", "resize_linear", "resize_taps"]

F32 = np.float32


def resize_taps(h: int, w: int, scale_h: float, scale_w: float, n_h: int, n_w: int, mode: str) -> tuple:
    """(RB1) of both axes as the kernel takes them: (y1, y2, dy1, dy2, x1, x2, dx1, dx2),
    indices int32 and distances float32, from the twin's ``ort_bilinear_axis``."""
    y1, y2, dy1, dy2 = ort_bilinear_axis(h, n_h, scale_h, mode)
    x1, x2, dx1, dx2 = ort_bilinear_axis(w, n_w, scale_w, mode)
    i32 = np.int32
    return (y1.astype(i32), y2.astype(i32), dy1, dy2, x1.astype(i32), x2.astype(i32), dx1, dx2)


def resize_linear(
    x: np.ndarray,
    scale_h: float,
    scale_w: float,
    n_h: int,
    n_w: int,
    mode: str,
    *,
    num_threads: int = 1,
    out: np.ndarray | None = None,
    taps: BoundedCache | None = None,
) -> np.ndarray:
    """The twin's ``ort_resize_linear`` of ``x [..., H, W]`` on the C++ kernel; ``taps``
    caches (RB1) per geometry."""
    x = np.ascontiguousarray(x, F32)
    h, w = x.shape[-2:]
    key = (h, w, scale_h, scale_w, n_h, n_w, mode)
    build = functools.partial(resize_taps, h, w, scale_h, scale_w, n_h, n_w, mode)
    t = build() if taps is None else taps.get(key, build)
    return _native.ort_resize_linear_f32(x, *t, num_threads, out)


def _ort_resize_linear(
    ctx: Any,
    x: Any,
    *,
    out: np.ndarray | None = None,
    taps: BoundedCache,
    scales: list[float],
    sizes: list[int],
    coordinate_transformation_mode: str = "half_pixel",
    **attrs: Any,
) -> np.ndarray:
    del attrs  # unused
    threads = max(1, int(getattr(ctx, "num_threads", 1)))
    args = ort_resize_args(x, scales, sizes, coordinate_transformation_mode)
    return resize_linear(*args, num_threads=threads, out=out, taps=taps)


def _ort_resize_linear_specialized(sig: Specialization, **attrs: Any) -> Any:
    """One float32 x shape: (RB1)'s taps computed here, once, and each run one
    ``ort_resize_linear_f32`` call into the planned output, which a native program
    records. None: the generic call."""
    shape = sig.shapes[0]
    if shape is None or len(shape) < 2 or sig.dtypes[0] != F32 or 0 in shape or sig.out is None:
        return None
    mode = attrs.get("coordinate_transformation_mode", "half_pixel")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    s_h, s_w, n_h, n_w = ort_resize_geometry(tuple(shape), attrs["scales"], attrs["sizes"])
    t = resize_taps(shape[-2], shape[-1], s_h, s_w, n_h, n_w, mode)
    threads, out = step_threads(sig), sig.out
    kernel = _native.ort_resize_linear_f32

    def run(x: np.ndarray, *rest: Any) -> np.ndarray:
        return kernel(x, *t, threads, out)

    return guarded(run, _ort_resize_linear, attrs, out, reads=1, recordable=True)


@register_binder("OrtResizeLinear", QUANTA_DOMAIN)
def bind_ort_resize_linear(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta::OrtResizeLinear on float32: :func:`resize_linear` (module docstring)."""
    del model  # unused
    if _native is None or not hasattr(_native, "ort_resize_linear_f32"):
        return None, "the native extension is not built with ort_resize_linear_f32"
    x = node.input(0)
    if x is not None and x.type is not None and x.type.elem is not None and x.type.elem != IR_F32:
        return None, f"native OrtResizeLinear takes float32, got {x.type.elem}"
    kernel = Kernel(
        _ort_resize_linear,
        "native",
        "native:ort_resize_linear_f32",
        params={"taps": BoundedCache()},
        out=True,
    )
    return kernel, ""
