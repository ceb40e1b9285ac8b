"""Pad (the reference twin, nn.pad) specialized per input signature: with constant pads,
axes and fill, and no cropping, every mode is a fixed copy pattern. Constant mode fills
the output and copies x into its interior; reflect, edge and wrap are a gather along
each padded axis by the index vector ``np.pad(np.arange(n), widths, mode)``, which is
the twin's own np.pad applied to the positions (np.pad pads axis by axis, each axis an
index map of the one before, so the axes compose as np.ix_). The same bytes as the
twin, without np.pad's per-call work (30 us for silero-vad's 576-sample reflect pad,
2 us as one np.take)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from quanta.targets.base import Specialization

__all__ = ["pad_specialized"]


def pad_specialized(
    sig: Specialization, *, mode: str = "constant", **attrs: Any
) -> Callable[..., Any] | None:
    """``f(ctx, x, *rest)`` for one signature, or None when the pads are not constants,
    crop, or the opset keeps them in attributes."""
    del attrs  # opset < 11 only (pads as attributes): not specialized
    if sig.ctx is None or sig.ctx.opset < 11 or mode not in ("constant", "reflect", "edge", "wrap"):
        return None
    shape, dtype = sig.shapes[0], sig.dtypes[0]
    if shape is None or dtype is None or dtype.kind == "O" or len(sig.consts) < 2 or sig.consts[1] is None:
        return None
    for k in (2, 3):  # constant_value and axes: constants or omitted
        if k < len(sig.shapes) and sig.shapes[k] is not None and sig.consts[k] is None:
            return None
    rank = len(shape)
    pads = [int(p) for p in np.asarray(sig.consts[1]).reshape(-1)]
    axes_c = sig.consts[3] if len(sig.consts) > 3 else None
    axes = list(range(rank)) if axes_c is None else [int(a) % rank for a in np.asarray(axes_c).reshape(-1)]
    if len(pads) != 2 * len(axes) or min(pads, default=0) < 0 or rank == 0:
        return None
    widths = [(0, 0)] * rank
    for i, a in enumerate(axes):
        widths[a] = (pads[i], pads[len(axes) + i])
    out_shape = tuple(n + b + e for n, (b, e) in zip(shape, widths))
    if sig.out_shape is not None and tuple(sig.out_shape) != out_shape:
        return None
    padded = [a for a in range(rank) if widths[a] != (0, 0)]
    if mode == "constant":
        fill_c = sig.consts[2] if len(sig.consts) > 2 else None
        fill = (
            np.zeros((), dtype)
            if fill_c is None or np.size(fill_c) == 0
            else np.asarray(fill_c).astype(dtype)
        )
        fill = fill.reshape(())
        inner = tuple(slice(b, b + n) for n, (b, _) in zip(shape, widths))

        def constant(ctx: Any, x: np.ndarray, *rest: Any) -> np.ndarray:
            y = np.empty(out_shape, dtype)
            y.fill(fill)
            y[inner] = x
            return y

        return constant
    if not padded:
        return lambda ctx, x, *rest: x.copy()
    if math.prod(shape) == 0:
        return None  # the twin raises its error
    index = {a: np.pad(np.arange(shape[a]), widths[a], mode=mode) for a in padded}
    if len(padded) == 1:
        (axis,) = padded
        idx = index[axis]
        return lambda ctx, x, *rest: np.take(x, idx, axis=axis)
    grid = np.ix_(*[index.get(a, np.arange(shape[a])) for a in range(rank)])
    return lambda ctx, x, *rest: x[grid]
