"""com.microsoft NhwcMaxPool: MaxPool on channels-last uint8/int8 tensors (ONNX Runtime's
contrib op, which its NhwcTransformer produces for quantized MaxPool; quanta's
channels-last pass does the same).

    x [N, *spatial, C]  ->  y [N, *out, C],   y = moveaxis(MaxPool(moveaxis(x, -1, 1)), 1, -1)

with the ai.onnx MaxPool attributes (auto_pad, ceil_mode, dilations, kernel_shape, pads,
strides) meaning what they mean there; no Indices output. Max only selects, so the
result is exact in any order.
"""

from __future__ import annotations

import numpy as np

from quanta.kernels.reference.nn_pool import max_pool
from quanta.kernels.reference.registry import MS_DOMAIN, OpContext, OpError, register

__all__ = ["nhwc_max_pool"]


@register("NhwcMaxPool", MS_DOMAIN)
def nhwc_max_pool(
    ctx: OpContext,
    x: np.ndarray,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: list[int] | None = None,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """com.microsoft NhwcMaxPool-1.

    >>> x = np.arange(8, dtype=np.uint8).reshape(1, 2, 2, 2)  # N, H, W, C
    >>> nhwc_max_pool(OpContext(), x, kernel_shape=[2, 2]).tolist()
    [[[[6, 7]]]]
    """
    x = np.asarray(x)
    if x.dtype not in (np.uint8, np.int8):
        raise OpError(f"x: expected uint8 or int8, got {x.dtype}")
    if x.ndim < 3:
        raise OpError(f"x: expected rank >= 3 ([N, *spatial, C]), got shape {x.shape}")
    attrs = {"auto_pad": auto_pad, "ceil_mode": ceil_mode}
    for name, value in (
        ("dilations", dilations),
        ("kernel_shape", kernel_shape),
        ("pads", pads),
        ("strides", strides),
    ):
        if value is not None:
            attrs[name] = value
    y = max_pool(OpContext(opset=12, n_outputs=1), np.moveaxis(x, -1, 1), **attrs)
    return np.ascontiguousarray(np.moveaxis(y, 1, -1))
