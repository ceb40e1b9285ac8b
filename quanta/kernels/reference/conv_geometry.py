"""Convolution / pooling geometry shared by the reference kernels (no ops registered here).

For one spatial axis with input size ``D``, kernel ``k``, stride ``s``, dilation ``d`` and
pads ``p_begin``, ``p_end`` (ONNX ``pads`` order is all begins, then all ends)::

    extent = d·(k − 1) + 1                                       (dilated kernel)
    out    = floor((D + p_begin + p_end − extent) / s) + 1       (ceil with ceil_mode, pooling)

``auto_pad`` (ONNX Conv/ConvInteger/QLinearConv/pools):

- ``NOTSET``: the explicit ``pads`` (default all 0);
- ``VALID``: no padding;
- ``SAME_UPPER`` / ``SAME_LOWER``: ``out = ceil(D / s)`` and
  ``total = max(0, (out − 1)·s + extent − D)``; SAME_UPPER puts the extra pixel of an odd
  ``total`` at the end (``p_begin = total // 2``), SAME_LOWER at the beginning
  (``p_begin = total − total // 2``).

API (float Conv in ``nn.py`` and the pools can reuse it):

- :func:`conv_attrs` — normalise ONNX attributes into a :class:`ConvGeometry`;
- :func:`resolve_pads` — pads from ``auto_pad``;
- :func:`output_spatial` — output sizes;
- :func:`im2col` — patches ``(N, C, *kernel, *out)`` of an already zero-point-shifted or
  float input, padding with ``pad_value``;
- :func:`conv_nd` — grouped N-d convolution of any numeric dtype via im2col + matmul;
- :func:`is_depthwise` — one input and one output channel per group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from quanta.kernels.reference.registry import OpError

__all__ = [
    "ConvGeometry",
    "conv_attrs",
    "conv_nd",
    "im2col",
    "is_depthwise",
    "output_spatial",
    "resolve_pads",
]

AUTO_PAD_MODES = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")


def is_depthwise(group: int, w_shape: Sequence[int]) -> bool:
    """A Conv with weight ``[M, C/group, *kernel]`` whose every group has one input and one
    output channel (M == group, C/group == 1): the depthwise kernels' condition, quanta's
    and ONNX Runtime's alike (a channel multiplier above 1 takes the GEMM path).

    >>> is_depthwise(32, (32, 1, 3, 3)), is_depthwise(16, (32, 1, 3, 3)), is_depthwise(1, (1, 1, 3))
    (True, False, False)
    """
    return group > 1 and len(w_shape) >= 3 and w_shape[1] == 1 and w_shape[0] == group


@dataclass(frozen=True)
class ConvGeometry:
    """Resolved geometry: every field has one entry per spatial axis (``pads``: 2 per axis)."""

    kernel_shape: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]  # ONNX order: (b_1, .., b_n, e_1, .., e_n)
    out_shape: tuple[int, ...]


def resolve_pads(
    in_spatial: Sequence[int],
    kernel_shape: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[int] | None = None,
    auto_pad: str = "NOTSET",
) -> tuple[int, ...]:
    """Pads in ONNX order ``(begins..., ends...)`` for ``auto_pad`` (module docstring).

    >>> resolve_pads([5], [2], [2], [1], auto_pad="SAME_UPPER"), resolve_pads([5], [2], [2], [1], auto_pad="SAME_LOWER")
    ((0, 1), (1, 0))
    """
    n = len(in_spatial)
    if auto_pad in ("NOTSET", ""):
        p = tuple(int(v) for v in pads) if pads is not None else (0,) * (2 * n)
        if len(p) != 2 * n:
            raise OpError(f"pads: expected {2 * n} values (begin and end for {n} spatial axes), got {len(p)}")
        if any(v < 0 for v in p):
            raise OpError(f"pads: expected values >= 0, got {list(p)}")
        return p
    if auto_pad == "VALID":
        return (0,) * (2 * n)
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise OpError(f"auto_pad: expected one of {', '.join(AUTO_PAD_MODES)}, got {auto_pad!r}")
    begins, ends = [], []
    for size, k, s, d in zip(in_spatial, kernel_shape, strides, dilations):
        out = math.ceil(size / s)
        total = max(0, (out - 1) * s + d * (k - 1) + 1 - size)
        small, big = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else big)
        ends.append(big if auto_pad == "SAME_UPPER" else small)
    return tuple(begins + ends)


def output_spatial(
    in_spatial: Sequence[int],
    kernel_shape: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[int],
    ceil_mode: bool = False,
) -> tuple[int, ...]:
    """``out = floor_or_ceil((D + p_begin + p_end − extent) / s) + 1`` per axis.

    With ``ceil_mode`` (pooling), a last window that would start inside the end padding is
    dropped, as ONNX Runtime and PyTorch do.

    >>> output_spatial([7], [3], [2], [2], [1, 0])
    (2,)
    """
    n = len(in_spatial)
    out = []
    for i, (size, k, s, d) in enumerate(zip(in_spatial, kernel_shape, strides, dilations)):
        extent = d * (k - 1) + 1
        span = size + pads[i] + pads[i + n] - extent
        if span < 0:
            raise OpError(
                f"kernel: expected a dilated kernel extent <= padded input ({size + pads[i] + pads[i + n]}) "
                f"on spatial axis {i}, got {extent}"
            )
        o = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (o - 1) * s >= size + pads[i]:
            o -= 1
        out.append(o)
    return tuple(out)


def conv_attrs(
    x_shape: Sequence[int],
    w_spatial: Sequence[int] | None,
    *,
    kernel_shape: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
    dilations: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    auto_pad: str = "NOTSET",
    ceil_mode: bool = False,
) -> ConvGeometry:
    """Normalise ONNX conv/pool attributes for an input of shape ``(N, C, *spatial)``.

    ``w_spatial`` is ``w.shape[2:]`` for a convolution (``kernel_shape``, if given, must
    agree), or None for pooling (``kernel_shape`` required).
    """
    if len(x_shape) < 3:
        raise OpError(f"x: expected rank >= 3 (N, C, spatial...), got shape {tuple(x_shape)}")
    spatial = tuple(int(v) for v in x_shape[2:])
    n = len(spatial)
    if kernel_shape is None:
        if w_spatial is None:
            raise OpError("kernel_shape: expected the attribute, got none")
        kernel_shape = tuple(int(v) for v in w_spatial)
    kernel_shape = tuple(int(v) for v in kernel_shape)
    if w_spatial is not None and tuple(w_spatial) != kernel_shape:
        raise OpError(f"kernel_shape: expected the spatial shape of w {tuple(w_spatial)}, got {kernel_shape}")
    if len(kernel_shape) != n:
        raise OpError(f"kernel_shape: expected {n} values for {n} spatial axes, got {len(kernel_shape)}")
    strides = tuple(int(v) for v in strides) if strides else (1,) * n
    dilations = tuple(int(v) for v in dilations) if dilations else (1,) * n
    for name, vals in (("strides", strides), ("dilations", dilations)):
        if len(vals) != n or any(v < 1 for v in vals):
            raise OpError(f"{name}: expected {n} values >= 1, got {list(vals)}")
    p = resolve_pads(spatial, kernel_shape, strides, dilations, pads, auto_pad)
    out = output_spatial(spatial, kernel_shape, strides, dilations, p, ceil_mode)
    return ConvGeometry(kernel_shape, strides, dilations, p, out)


def im2col(x: np.ndarray, geom: ConvGeometry, pad_value: int | float = 0) -> np.ndarray:
    """Patches of ``x`` (N, C, *spatial) as an array (N, C, *kernel_shape, *out_shape).

    ``cols[n, c, k_1.., o_1..] = x_padded[n, c, o_1·s_1 + k_1·d_1, ..]``. Padding uses
    ``pad_value`` (0 for an input whose zero point is already subtracted). The result is a
    fresh array. Ceil-mode windows that run past the end padding see ``pad_value`` too.
    """
    n = len(geom.kernel_shape)
    pad_width = [(0, 0), (0, 0)]
    for i in range(n):
        extent = geom.dilations[i] * (geom.kernel_shape[i] - 1) + 1
        need = (geom.out_shape[i] - 1) * geom.strides[i] + extent  # last window's end
        have = x.shape[2 + i] + geom.pads[i] + geom.pads[i + n]
        pad_width.append((geom.pads[i], geom.pads[i + n] + max(0, need - have)))
    xp = np.pad(x, pad_width, mode="constant", constant_values=pad_value)
    extents = [geom.dilations[i] * (geom.kernel_shape[i] - 1) + 1 for i in range(n)]
    win = np.lib.stride_tricks.sliding_window_view(xp, extents, axis=tuple(range(2, 2 + n)))
    # win: (N, C, *positions, *extent); keep every s-th position and every d-th tap.
    sl = (slice(None), slice(None))
    sl += tuple(slice(0, (geom.out_shape[i] - 1) * geom.strides[i] + 1, geom.strides[i]) for i in range(n))
    sl += tuple(slice(None, None, geom.dilations[i]) for i in range(n))
    win = win[sl]
    order = (0, 1, *range(2 + n, 2 + 2 * n), *range(2, 2 + n))
    return np.ascontiguousarray(win.transpose(order))


def conv_nd(
    x: np.ndarray, w: np.ndarray, geom: ConvGeometry, group: int = 1, pad_value: int | float = 0
) -> np.ndarray:
    """Grouped N-d convolution (cross-correlation, as ONNX Conv) in the dtype of ``x``/``w``.

    ``y[n, g·Mg + m, o] = Σ_{c < C/group, k} w[g·Mg + m, c, k] · x_pad[n, g·C/group + c, o·s + k·d]``.
    The caller picks the accumulation dtype (int64 for integer convs, then wraps).
    """
    n_batch, c_in = x.shape[:2]
    m_out = w.shape[0]
    if group < 1 or c_in % group or m_out % group:
        raise OpError(f"group: expected a divisor of C={c_in} and M={m_out}, got {group}")
    if w.shape[1] * group != c_in:
        raise OpError(f"w: expected shape[1] * group == C ({c_in}), got shape {w.shape} with group {group}")
    cols = im2col(x, geom, pad_value)  # (N, C, *k, *out)
    kk = math.prod(geom.kernel_shape)
    oo = math.prod(geom.out_shape)
    cg = c_in // group
    cols = cols.reshape(n_batch, group, cg * kk, oo)
    wg = w.reshape(group, m_out // group, cg * kk)
    y = np.matmul(wg[None], cols)  # (N, G, Mg, O); w is broadcast, never copied per batch
    return y.reshape(n_batch, m_out, *geom.out_shape)
