"""Native quanta::MlasAveragePool: ONNX Runtime's float32 AveragePool in MlasPool's order
(reference/mlas_pool.py, eqs. (AP-M1)-(AP-M5)). No C++ kernel: the binder runs NumPy.

The twin adds one kernel tap at a time over all windows, which suits many small windows
(PaddleOCR's [1, 480, 3, 80] -> [1, 480, 1, 40]). A pool with many taps and few windows
(a squeeze-excite mean written as AveragePool with kernel = strides = the input,
MediaPipe's selfie segmenter: [1, 16, 128, 128] -> [1, 16, 1, 1], 16,384 taps) would be
thousands of NumPy calls there. For the generic order (AP-M3) this module gathers each
window's positions row-major into a last axis and sums them with ``np.add.accumulate``
(docs/float-ops.md, eq. (AP-M6)),
which adds element by element in order: (AP-M3)'s m = f32(m + x) from the first
position instead of from +0, the same float32 values except that a window of only −0
ends at −0, which the final + 0 makes +0 (MLAS's m starts at +0 and is never −0). The
padding is the twin's −0, which adds nothing in either order."""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.ir.types import F32 as IR_F32
from quanta.kernels.reference.mlas_pool import (
    GENERIC,
    QUANTA_DOMAIN,
    divide_by_count,
    mlas_average_pool,
    output_sizes,
    padded_input,
    pool_args,
    pool_kind,
)
from quanta.kernels.reference.registry import OpError
from quanta.targets.base import Kernel
from quanta.targets.native import register_binder

F32 = np.dtype(np.float32)

#: the generic order gathers its windows when a window has at least this many taps ...
GATHER_MIN_TAPS = 16
#: ... and the gathered windows hold at most this many elements (or twice the input's)
GATHER_MAX_ELEMENTS = 1 << 22


def average_pool(
    x: np.ndarray, kernel, strides=None, pads=None, count_include_pad: int = 0, nchwc: bool = False
) -> np.ndarray | None:
    """The twin's :func:`mlas_average_pool`, bit for bit; the generic order (AP-M3) of a
    pool with many taps per window summed window by window (module docstring)."""
    args = pool_args(x, kernel, strides, pads)
    if args is None:
        return None
    x, kernel, strides, pads = args
    d, spatial = x.ndim - 2, x.shape[2:]
    taps = int(np.prod(kernel))
    if pool_kind(spatial, kernel, strides, pads, nchwc) != GENERIC or taps < GATHER_MIN_TAPS:
        return mlas_average_pool(x, kernel, strides, pads, count_include_pad, nchwc)
    out = output_sizes(spatial, kernel, strides, pads)
    if any(o < 1 for o in out):
        return None
    gathered = x.shape[0] * x.shape[1] * int(np.prod(out)) * taps
    if gathered > max(GATHER_MAX_ELEMENTS, 2 * x.size):
        return mlas_average_pool(x, kernel, strides, pads, count_include_pad, nchwc)
    xp = padded_input(x, GENERIC, out, kernel, strides, pads)
    view = np.lib.stride_tricks.sliding_window_view(xp, kernel, axis=tuple(range(2, 2 + d)))
    view = view[
        (slice(None), slice(None), *(slice(None, o * s, s) for o, s in zip(out, strides, strict=True)))
    ]
    rows = view.reshape(x.shape[:2] + tuple(out) + (taps,))  # row-major within each window
    m = np.add(np.add.accumulate(rows, axis=-1, dtype=np.float32)[..., -1], np.float32(0))
    return divide_by_count(m, spatial, kernel, strides, pads, count_include_pad)


def _mlas_average_pool(
    ctx: Any,
    x: Any,
    *,
    out: np.ndarray | None = None,
    kernel_shape: list[int],
    strides: list[int] | None = None,
    pads: list[int] | None = None,
    count_include_pad: int = 0,
    nchwc: int = 0,
    **attrs: Any,
) -> np.ndarray:
    del ctx, attrs  # unused
    y = average_pool(np.asarray(x), kernel_shape, strides, pads, int(count_include_pad), bool(nchwc))
    if y is None:
        raise OpError(
            "MlasAveragePool: a pool MlasPool's order is not modelled for (the rewrite refuses these)"
        )
    if out is None:
        return y
    np.copyto(out, y)
    return out


@register_binder("MlasAveragePool", QUANTA_DOMAIN)
def bind_mlas_average_pool(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta::MlasAveragePool on float32: :func:`average_pool` (module docstring)."""
    del model  # unused
    x = node.input(0)
    if x is not None and x.type is not None and x.type.elem is not None and x.type.elem != IR_F32:
        return None, f"native MlasAveragePool takes float32, got {x.type.elem}"
    return Kernel(_mlas_average_pool, "native", "numpy:mlas_average_pool", out=True), ""
