"""com.microsoft QLinearConv: the ai.onnx QLinearConv with a ``channels_last`` layout option
(normative reference; ONNX Runtime's contrib op, which its NhwcTransformer produces).

    channels_last = 0:  x [N, C, *spatial]  ->  y [N, M, *out]     (exactly ai.onnx QLinearConv)
    channels_last = 1:  x [N, *spatial, C]  ->  y [N, *out, M]

w stays ``[M, C/group, *kernel]`` in both layouts; the scales, zero points, bias and the
geometry attributes mean what they mean for the ai.onnx op. The arithmetic is that op's
(eqs. (4), (6) of docs/quantization-math.md): this twin moves the channel axis of x to
position 1, calls ``qlinear_conv.qlinear_conv`` and moves the channel axis of y back, so
the two layouts give the same numbers by construction::

    ms_qlinear_conv(x_nhwc, ..., channels_last=1) == moveaxis(qlinear_conv(moveaxis(x_nhwc, -1, 1), ...), 1, -1)

Incorrect / correct (the rank check):

    x [8, 8] with w [4, 8, 3]            -> OpError "x: expected rank 3 (1-D) or more ..."
    x [1, 8, 8] with w [4, 8, 3, 3]      -> OpError "x: expected rank 4 like w ..."
    x [1, 9, 8] (N, W, C) with w [4, 8, 3], channels_last=1   -> y [1, OW, 4]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.kernels.reference.qlinear_conv import qlinear_conv_op
from quanta.kernels.reference.registry import MS_DOMAIN, OpContext, OpError, register

__all__ = ["ms_qlinear_conv_op"]


@register("QLinearConv", MS_DOMAIN)
def ms_qlinear_conv_op(
    ctx: OpContext,
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray,
    w: np.ndarray,
    w_scale: np.ndarray,
    w_zero_point: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
    B: np.ndarray | None = None,
    *,
    channels_last: int = 0,
    **attrs: Any,
) -> np.ndarray:
    """com.microsoft QLinearConv (ONNX Runtime contrib op, opset 1); ``attrs`` are Conv's.

    >>> x = np.array([[[1], [2], [3], [4]]], np.uint8)  # [N, W, C], C = 1
    >>> w = np.array([[[1, 1]]], np.uint8)
    >>> args = (np.float32(0.5), np.uint8(1), w, np.float32(1), np.uint8(0), np.float32(1), np.uint8(0))
    >>> ms_qlinear_conv_op(OpContext(), x, *args, channels_last=1).tolist()  # acc 1, 3, 5
    [[[0], [2], [2]]]
    """
    x = np.asarray(x)
    w = np.asarray(w)
    if channels_last not in (0, 1):
        raise OpError(f"channels_last: expected 0 or 1, got {channels_last}")
    if x.ndim < 3:
        raise OpError(
            f"x: expected rank 3 (1-D) or more ([N, C, *spatial], or [N, *spatial, C] with channels_last), "
            f"got shape {x.shape}"
        )
    if w.ndim != x.ndim:
        layout = "[N, *spatial, C]" if channels_last else "[N, C, *spatial]"
        raise OpError(f"x: expected rank {w.ndim} like w {layout}, got shape {x.shape}")
    y = qlinear_conv_op(
        ctx,
        np.moveaxis(x, -1, 1) if channels_last else x,
        x_scale,
        x_zero_point,
        w,
        w_scale,
        w_zero_point,
        y_scale,
        y_zero_point,
        B,
        **attrs,
    )
    return np.ascontiguousarray(np.moveaxis(y, 1, -1)) if channels_last else y
