"""Float convolutions (ai.onnx Conv, ConvTranspose, Col2Im).

Window geometry (pads from auto_pad, output sizes) and im2col come from conv_geometry.py,
shared with the quantized convolutions and the pools.

Conv is im2col + one matmul per group (conv_geometry.conv_nd), computed in float32 for
narrower float inputs:

    y[n, g*M/G + m, p] = sum_(c, k) w[g*M/G + m, c, k] * x_padded[n, g*C/G + c, p*s + k*d] + b[m]

ConvTranspose is its adjoint. One matmul gives every input position's contribution to
each kernel offset, and col2im scatter-adds them into an output canvas:

    canvas[n, g*M/G + m, i*s + k*d] += sum_c w[g*C/G + c, m, k] * x[n, g*C/G + c, i]

The canvas has ``full = s * (in - 1) + d * (k - 1) + 1`` positions per axis; the output is
``canvas[pad_begin : pad_begin + out]``, reading zero outside the canvas (output_padding,
or a negative pad_begin derived from output_shape). Col2Im is the same scatter without the
matmul: its input already holds the columns.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from quanta.kernels.reference.conv_geometry import conv_attrs, conv_nd
from quanta.kernels.reference.nn import compute_dtype, from_compute, to_compute
from quanta.kernels.reference.registry import OpContext, OpError, register

# ------------------------------------------------------------------------ scatter / crop


def _scatter_windows(
    cols: np.ndarray, canvas_shape: Sequence[int], strides: Sequence[int], dilations: Sequence[int]
) -> np.ndarray:
    """The adjoint of conv_geometry.im2col: cols (N, C, *kernel, *positions) is added into a
    zero canvas (N, C, *canvas_shape) at ``position*s + k*d``."""
    n_spatial = len(strides)
    kernel = cols.shape[2 : 2 + n_spatial]
    positions = cols.shape[2 + n_spatial :]
    canvas = np.zeros((*cols.shape[:2], *canvas_shape), dtype=cols.dtype)
    for offset in itertools.product(*(range(k) for k in kernel)):
        target = tuple(
            slice(k * d, k * d + (p - 1) * s + 1, s)
            for k, d, p, s in zip(offset, dilations, positions, strides)
        )
        canvas[(slice(None), slice(None), *target)] += cols[(slice(None), slice(None), *offset)]
    return canvas


def _crop_spatial(canvas: np.ndarray, begin: Sequence[int], out_shape: Sequence[int]) -> np.ndarray:
    """canvas[..., begin : begin + out] per spatial axis; indices outside the canvas (a
    negative begin, or past its end) read as zero."""
    n_spatial = len(out_shape)
    lead = [max(0, -b) for b in begin]
    trail = [max(0, b + o - c) for b, o, c in zip(begin, out_shape, canvas.shape[2:])]
    if any(lead) or any(trail):
        canvas = np.pad(canvas, [(0, 0), (0, 0), *zip(lead, trail)])
    index = tuple(slice(b + le, b + le + o) for b, le, o in zip(begin, lead, out_shape))
    assert len(index) == n_spatial
    return canvas[(slice(None), slice(None), *index)]


# ------------------------------------------------------------------------------ Conv


@register("Conv")
def conv(
    ctx: OpContext,
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    *,
    group: int = 1,
    **attrs: Any,
) -> np.ndarray:
    """x (N, C, *in), w (M, C/group, *kernel), b (M) -> y (N, M, *out); ``attrs`` are the
    geometry attributes of conv_attrs (auto_pad, dilations, kernel_shape, pads, strides)."""
    del ctx  # unused
    if x.ndim < 3 or w.ndim != x.ndim:
        raise OpError(
            f"Conv: expected x (N, C, spatial...) and w of the same rank, got {x.shape} and {w.shape}"
        )
    geom = conv_attrs(x.shape, w.shape[2:], **attrs)
    dtype = compute_dtype(x.dtype)
    y = conv_nd(to_compute(x), w.astype(dtype, copy=False), geom, group)
    if b is not None:
        y = y + b.astype(dtype, copy=False).reshape(-1, *([1] * (x.ndim - 2)))
    return from_compute(y, x.dtype)


@register("Conv", "quanta")
def fused_conv(
    ctx: OpContext,
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    *,
    activation: str = "Relu",
    activation_params: Sequence[float] | None = None,
    **attrs: object,
) -> np.ndarray:
    """quanta::Conv: ai.onnx Conv, then the fused activation, in the output type: what
    the Conv and the nodes it replaces compute, bit for bit (each is those nodes'
    reference arithmetic). ``"Relu"``: max(y, 0); ``"Clip"`` with ``activation_params=[lo,
    hi]``: min(max(y, lo), hi) (FuseActivationIntoProducer); ``"SiLU"``: Mul(y,
    Sigmoid(y)); ``"HardSwish"``; ``"HardSigmoid"`` with ``[alpha, beta]``;
    ``"ClipMulDiv"`` with ``[b, lo, hi, d]``: Div(Mul(y, Clip(Add(y, b), lo, hi)), d);
    ``"LeakyRelu"`` with ``[alpha, floor]``: LeakyRelu, then Max(·, floor) when floor >
    -inf (passes/rules/fuse_float_gate.py). NaN stays NaN."""
    y = conv(ctx, x, w, b, **attrs)  # type: ignore[arg-type]
    if activation in FUSED_GATES:
        return fused_gate(y, activation, activation_params, ctx.node_name)
    return fused_clamp(y, activation, activation_params, ctx.node_name)


def fused_clamp(y: np.ndarray, activation: str, params: Sequence[float] | None, node: str = "") -> np.ndarray:
    """min(max(y, lo), hi) in y's type for a fused Relu / Clip (NumPy's maximum then
    minimum: a NaN stays NaN), each bound only when finite."""
    lo, hi = fused_clamp_bounds(activation, params, node)
    if lo > -math.inf:
        y = np.maximum(y, y.dtype.type(lo))
    if hi < math.inf:
        y = np.minimum(y, y.dtype.type(hi))
    return y


#: fused activations other than a clamp, with their parameter count
FUSED_GATES = {"SiLU": 0, "HardSwish": 0, "HardSigmoid": 2, "ClipMulDiv": 4, "LeakyRelu": 2}


def fused_gate(y: np.ndarray, activation: str, params: Sequence[float] | None, node: str = "") -> np.ndarray:
    """The gated activations of quanta::Conv on the Conv's output ``y``: the reference
    functions of the nodes they replace, in the same order (fuse_float_gate.py)."""
    from quanta.kernels.reference import nn

    p = [float(v) for v in (params or [])]
    if len(p) != FUSED_GATES[activation]:
        raise OpError(
            f"{node or 'fused op'}: activation {activation} takes {FUSED_GATES[activation]} activation_params, got {p}"
        )
    t = y.dtype.type
    if activation == "SiLU":
        return y * nn.sigmoid(None, y)  # type: ignore[arg-type]
    if activation == "HardSwish":
        return nn.hard_swish(None, y)  # type: ignore[arg-type]
    if activation == "HardSigmoid":
        return nn.hard_sigmoid(None, y, alpha=p[0], beta=p[1])  # type: ignore[arg-type]
    if activation == "LeakyRelu":  # [alpha, floor]: LeakyRelu, then Max(·, floor) unless -inf
        y = nn.leaky_relu(None, y, alpha=p[0])  # type: ignore[arg-type]
        return np.maximum(y, t(p[1])) if p[1] > -math.inf else y
    g = y + t(p[0])  # ClipMulDiv: Add, Clip, Mul, Div
    if p[1] > -math.inf:
        g = np.maximum(g, t(p[1]))
    if p[2] < math.inf:
        g = np.minimum(g, t(p[2]))
    return (y * g) / t(p[3])


def fused_clamp_bounds(
    activation: str, params: Sequence[float] | None, node: str = ""
) -> tuple[float, float]:
    """``(lo, hi)`` of a fused clamp attribute pair; an unknown one is an error."""
    if activation == "Relu":
        return 0.0, math.inf
    if activation == "Clip":
        p = list(params or [])
        if len(p) != 2:
            raise OpError(f"{node or 'fused op'}: activation Clip takes activation_params [lo, hi], got {p}")
        return float(p[0]), float(p[1])
    raise OpError(
        f"{node or 'fused op'}: activation {activation!r} is not one of Relu, Clip, {', '.join(FUSED_GATES)}"
    )


def conv_transpose_geometry(
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    *,
    auto_pad: str = "NOTSET",
    dilations: Sequence[int] | None = None,
    group: int = 1,
    kernel_shape: Sequence[int] | None = None,
    output_padding: Sequence[int] | None = None,
    output_shape: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
) -> tuple[int, list[int], list[int], list[int], list[int], list[int]]:
    """ConvTranspose's geometry (conv_transpose's docstring): M, strides, dilations, the
    un-cropped canvas ``full``, the crop's ``begin`` and the output spatial shape."""
    n_spatial = len(x_shape) - 2
    c = x_shape[1]
    in_shape = list(x_shape[2:])
    kernel = list(w_shape[2:])
    if kernel_shape is not None and list(kernel_shape) != kernel:
        raise OpError(f"ConvTranspose: kernel_shape {list(kernel_shape)} differs from the weight's {kernel}")
    if w_shape[0] != c or c % group:
        raise OpError(
            f"ConvTranspose: expected w.shape[0] = C divisible by group, got C={c}, w {tuple(w_shape)}, group={group}"
        )
    m = w_shape[1] * group
    strides = [1] * n_spatial if strides is None else list(strides)
    dilations = [1] * n_spatial if dilations is None else list(dilations)
    pads = [0] * (2 * n_spatial) if pads is None else list(pads)
    output_padding = [0] * n_spatial if output_padding is None else list(output_padding)
    full = [s * (i - 1) + (k - 1) * d + 1 for i, k, s, d in zip(in_shape, kernel, strides, dilations)]

    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if output_shape is not None:
            out = list(output_shape)[-n_spatial:]
        else:
            out = [i * s for i, s in zip(in_shape, strides)]
        total = [f + op - o for f, op, o in zip(full, output_padding, out)]
        if auto_pad == "SAME_UPPER":
            begin = [t // 2 for t in total]
        else:
            begin = [t - t // 2 for t in total]
    elif auto_pad in ("NOTSET", "VALID"):
        if auto_pad == "VALID":
            pads = [0] * (2 * n_spatial)
        begin = pads[:n_spatial]
        out = [
            f + op - pb - pe
            for f, op, pb, pe in zip(full, output_padding, pads[:n_spatial], pads[n_spatial:])
        ]
    else:
        raise OpError(
            f"ConvTranspose: auto_pad expected NOTSET, SAME_UPPER, SAME_LOWER or VALID, got {auto_pad!r}"
        )
    if min(out) < 1:
        raise OpError(f"ConvTranspose: output spatial shape must be positive, got {out}")

    return m, strides, dilations, full, begin, out


@register("ConvTranspose")
def conv_transpose(
    ctx: OpContext,
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    *,
    group: int = 1,
    **attrs: Any,
) -> np.ndarray:
    """x (N, C, *in), w (C, M/group, *kernel), b (M) -> y (N, M, *out); ``attrs`` are the
    keywords of conv_transpose_geometry (auto_pad, dilations, kernel_shape, output_padding,
    output_shape, pads, strides).

    Per axis the un-cropped result has ``full = s * (n - 1) + dk`` positions, and

    - ``output_shape`` given: out = output_shape, total = full + output_padding - out
      split as in SAME_UPPER when auto_pad is SAME_UPPER, else the larger half at the begin
      (the explicit pads are ignored, as the spec says);
    - SAME_UPPER / SAME_LOWER: the same with out = n * s;
    - otherwise out = full + output_padding - pad_begin - pad_end.
    """
    del ctx  # unused
    if x.ndim < 3 or w.ndim != x.ndim:
        raise OpError(
            f"ConvTranspose: expected x (N, C, spatial...) and w of the same rank, got {x.shape} and {w.shape}"
        )
    n, c = x.shape[:2]
    in_shape = list(x.shape[2:])
    kernel = list(w.shape[2:])
    m, strides, dilations, full, begin, out = conv_transpose_geometry(x.shape, w.shape, group=group, **attrs)

    # cols[n, g, (m, k), p] = sum_c w[g, c, m, k] * x[n, g, c, p]
    dtype = compute_dtype(x.dtype)
    wc = w.astype(dtype, copy=False).reshape(group, c // group, -1).transpose(0, 2, 1)
    xc = to_compute(x).reshape(n, group, c // group, math.prod(in_shape))
    cols = np.matmul(wc, xc).reshape(n, m, *kernel, *in_shape)
    canvas = _scatter_windows(cols, full, strides, dilations)
    y = _crop_spatial(canvas, begin, out)
    if b is not None:
        y = y + b.astype(dtype, copy=False).reshape(m, *([1] * len(in_shape)))
    return from_compute(y, x.dtype)


@register("Col2Im")
def col2im(
    ctx: OpContext,
    x: np.ndarray,
    image_shape: np.ndarray,
    block_shape: np.ndarray,
    *,
    dilations: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """x (N, C * prod(block_shape), L) -> y (N, C, *image_shape): every column of x is a
    block, added into the padded image at its sliding-window position (blocks in row-major
    order, as Conv's im2col produces them), then the pads are cropped."""
    del ctx  # unused
    image = [int(v) for v in np.asarray(image_shape).reshape(-1)]
    block = [int(v) for v in np.asarray(block_shape).reshape(-1)]
    n_spatial = len(image)
    geom = conv_attrs(
        (1, 1, *image), None, kernel_shape=block, strides=strides, dilations=dilations, pads=pads
    )
    begin, end, positions = geom.pads[:n_spatial], geom.pads[n_spatial:], geom.out_shape
    k = math.prod(block)
    if x.ndim != 3 or x.shape[1] % k or x.shape[2] != math.prod(positions):
        raise OpError(
            f"Col2Im: expected x (N, C * {k}, {math.prod(positions)}) for blocks {block} over image {image}, "
            f"got {x.shape}"
        )
    cols = to_compute(x).reshape(x.shape[0], x.shape[1] // k, *block, *positions)
    padded = [i + pb + pe for i, pb, pe in zip(image, begin, end)]
    canvas = _scatter_windows(cols, padded, geom.strides, geom.dilations)
    return from_compute(_crop_spatial(canvas, begin, image), x.dtype)
