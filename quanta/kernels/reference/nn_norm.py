"""Float normalizations (ai.onnx BatchNormalization, LayerNormalization,
GroupNormalization, InstanceNormalization, LRN; quanta::LayerNormDiv, quanta::RMSNormDiv).

All of them but RMSNormDiv (which subtracts no mean: var is the mean square) are
``y = (x - mean) / sqrt(var + epsilon) * scale + bias`` over different axes, with the
population variance (divide by the element count, not count - 1):

    BatchNormalization     per channel (axis 1); mean/var are inputs (inference) or the
                           batch statistics over every axis but 1 (training_mode, opset 14+)
    LayerNormalization     over axes [axis, rank); scale/bias broadcast to x.shape[axis:]
    GroupNormalization     over (channels of one group, spatial) per (n, group); scale/bias
                           are per group in opset 18 and per channel from opset 21
    InstanceNormalization  over spatial per (n, channel); scale/bias per channel
    quanta::LayerNormDiv   LayerNormalization as exports write it out (ReduceMean, Sub,
                           Pow, ReduceMean, Add, Sqrt, Div[, Mul][, Add]): divides by the
                           standard deviation instead of multiplying by its reciprocal
    quanta::RMSNormDiv     T5's RMS norm as exports write it out (Pow, ReduceMean, Add,
                           Sqrt, Div[, Mul][, Mul][, Add]): no mean subtracted, x divided
                           by the root mean square or multiplied by its reciprocal

Statistics are computed in float32 for narrower float inputs (LayerNormalization and
GroupNormalization: in ``stash_type``), in float64 for float64 inputs. float32
GroupNormalization (stash type float32) and InstanceNormalization follow eqs. (L1)-(L3),
(L4'), (L5') and (IN1) of docs/float-ops.md, the native kernel's order.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from quanta.kernels.reference.float_ops import layer_norm_div_rows, layer_norm_rows, rms_norm_rows
from quanta.kernels.reference.nn import compute_dtype, from_compute, to_compute
from quanta.kernels.reference.registry import OpContext, OpError, refuses, register

# TensorProto element types that stash_type may name.
_STASH_DTYPES = {1: np.dtype(np.float32), 11: np.dtype(np.float64), 10: np.dtype(np.float16)}


def _stash_dtype(op: str, stash_type: int) -> np.dtype:
    if stash_type == 16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if stash_type not in _STASH_DTYPES:
        raise OpError(f"{op}: stash_type expected a float element type (1, 10, 11 or 16), got {stash_type}")
    return _STASH_DTYPES[stash_type]


def _compute_in(x: np.ndarray, stash: np.dtype) -> np.dtype:
    """Statistics dtype: the stash type, widened to float64 when x itself is float64."""
    return np.dtype(np.float64) if x.dtype == np.float64 else compute_dtype(stash)


def _per_channel(v: np.ndarray, ndim: int, dtype: np.dtype) -> np.ndarray:
    """A (C,) vector shaped (C, 1, ..., 1) to broadcast over (N, C, *spatial)."""
    return np.asarray(v).astype(dtype, copy=False).reshape(-1, *([1] * (ndim - 2)))


# ------------------------------------------------------------------ BatchNormalization


@refuses("BatchNormalization")
def _batch_norm_refusal(attrs: dict[str, Any], given: list[bool]) -> str | None:
    del given
    return (
        None
        if int(attrs.get("spatial", 1))
        else "spatial=0 (opset < 9, per-element statistics) is not supported"
    )


@register("BatchNormalization")
def batch_normalization(
    ctx: OpContext,
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    input_mean: np.ndarray,
    input_var: np.ndarray,
    *,
    epsilon: float = 1e-5,
    momentum: float = 0.9,
    training_mode: int = 0,
    spatial: int = 1,
    is_test: int = 0,
) -> np.ndarray | tuple[np.ndarray, ...]:
    """Inference: y = (x - input_mean) / sqrt(input_var + epsilon) * scale + bias.

    training_mode=1 (opset 14+) normalizes with the batch statistics and also returns
    running_mean = input_mean * momentum + mean * (1 - momentum) (and running_var alike)."""
    del is_test  # opset < 7 attribute; the number of outputs decides, as in later opsets
    if not spatial:
        raise OpError("BatchNormalization: spatial=0 (opset < 9, per-element statistics) is not supported")
    c = x.shape[1] if x.ndim >= 2 else 0
    for name, v in (("scale", scale), ("B", bias), ("input_mean", input_mean), ("input_var", input_var)):
        if np.shape(v) != (c,):
            raise OpError(f"BatchNormalization: {name} expected shape ({c},), got {np.shape(v)}")
    dtype = compute_dtype(x.dtype)
    xc = to_compute(x)
    training = bool(training_mode) if ctx.opset >= 14 else ctx.n_outputs > 1
    if not training:
        mean = _per_channel(input_mean, x.ndim, dtype)
        var = _per_channel(input_var, x.ndim, dtype)
    else:
        if ctx.opset < 14:
            raise OpError(
                "BatchNormalization: training outputs (mean, var, saved_mean, saved_var) before opset 14 "
                "are not supported"
            )
        axes = (0, *range(2, x.ndim))
        mean = xc.mean(axis=axes, keepdims=True)
        var = xc.var(axis=axes, keepdims=True)
    y = (xc - mean) / np.sqrt(var + dtype.type(epsilon))
    y = y * _per_channel(scale, x.ndim, dtype) + _per_channel(bias, x.ndim, dtype)
    y = from_compute(y, x.dtype)
    if not training or ctx.n_outputs == 1:
        return y
    stat_dtype = compute_dtype(input_mean.dtype)
    running_mean = input_mean.astype(stat_dtype) * momentum + mean.reshape(-1) * (1 - momentum)
    running_var = input_var.astype(stat_dtype) * momentum + var.reshape(-1) * (1 - momentum)
    return (y, from_compute(running_mean, input_mean.dtype), from_compute(running_var, input_var.dtype))


# ------------------------------------------------------------------ LayerNormalization


@register("LayerNormalization")
def layer_normalization(
    ctx: OpContext,
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    axis: int = -1,
    epsilon: float = 1e-5,
    stash_type: int = 1,
) -> np.ndarray | tuple[np.ndarray, ...]:
    """Normalize over axes [axis, rank). Outputs Y (x's dtype) and, when asked, Mean and
    InvStdDev = 1 / sqrt(var + epsilon), both of shape x.shape[:axis] + (1,) * (rank - axis)
    in the stash type."""
    if not -x.ndim <= axis < x.ndim:
        raise OpError(f"LayerNormalization: axis expected in [{-x.ndim}, {x.ndim - 1}], got {axis}")
    axis %= x.ndim
    stash = _stash_dtype("LayerNormalization", stash_type)
    if x.dtype == np.float32 and stash == np.float32:
        return _layer_normalization_f32(ctx, x, scale, bias, axis, epsilon)
    dtype = _compute_in(x, stash)
    xc = x.astype(dtype)
    axes = tuple(range(axis, x.ndim))
    mean = xc.mean(axis=axes, keepdims=True)
    inv_std = 1 / np.sqrt(np.square(xc - mean).mean(axis=axes, keepdims=True) + dtype.type(epsilon))
    y = (xc - mean) * inv_std * scale.astype(dtype)
    if bias is not None:
        y = y + bias.astype(dtype)
    y = from_compute(y, x.dtype)
    if ctx.n_outputs == 1:
        return y
    return (y, mean.astype(stash), inv_std.astype(stash))[: ctx.n_outputs]


def _layer_normalization_f32(
    ctx: OpContext, x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, axis: int, epsilon: float
) -> np.ndarray | tuple[np.ndarray, ...]:
    """float32 x, stash_type 1: quanta's algorithm (float_ops.layer_norm_rows, eqs.
    (L1)-(L4) of docs/float-ops.md), bit-identical to the native kernel, then (L5)
    y = f32(f32(f32(d · inv_std) · scale) + bias) with numpy broadcasting of scale/bias."""
    lead = x.shape[:axis]
    d, mean, inv_std = layer_norm_rows(
        x.reshape(math.prod(lead), math.prod(x.shape[axis:])), np.float32(epsilon)
    )
    stat_shape = lead + (1,) * (x.ndim - axis)
    y = (d * inv_std[:, None]).reshape(x.shape) * scale.astype(np.float32, copy=False)  # (L5)
    if bias is not None:
        y = y + bias.astype(np.float32, copy=False)
    if ctx.n_outputs == 1:
        return y
    return (y, mean.reshape(stat_shape), inv_std.reshape(stat_shape))[: ctx.n_outputs]


@register("LayerNormDiv", "quanta")
def layer_norm_div(
    ctx: OpContext,
    x: np.ndarray,
    scale: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    *,
    axis: int = -1,
    epsilon: float = 1e-5,
) -> np.ndarray:
    """float32 x normalized over axes [axis, rank) by eqs. (L1)-(L3), (L4'), (L5') of
    docs/float-ops.md, y = f32(d / f32(sqrt(f32(var + epsilon)))), then
    f32(y · scale) and f32(· + bias) with numpy broadcasting (each optional): bit for bit
    the written-out chain FuseLayerNorm replaces (passes/rules/fuse_layer_norm.py)."""
    del ctx  # unused: one output, no opset differences
    if x.dtype != np.float32:
        raise OpError(f"LayerNormDiv: float32 x expected, got {x.dtype}")
    if not -x.ndim <= axis < x.ndim:
        raise OpError(f"LayerNormDiv: axis expected in [{-x.ndim}, {x.ndim - 1}], got {axis}")
    axis %= x.ndim
    rows = x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))
    y = layer_norm_div_rows(rows, np.float32(epsilon)).reshape(x.shape)
    if scale is not None:
        y = y * scale.astype(np.float32, copy=False)
    if bias is not None:
        y = y + bias.astype(np.float32, copy=False)
    return y


@register("RMSNormDiv", "quanta")
def rms_norm_div(
    ctx: OpContext,
    x: np.ndarray,
    scale: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    *,
    axis: int = -1,
    epsilon: float = 1e-6,
    reciprocal: int = 0,
) -> np.ndarray:
    """float32 x normalized over axes [axis, rank) by its root mean square, eqs. (RMS1),
    (RMS2), then (RMS3) y = f32(x / s) or, with ``reciprocal``, (RMS3') y = f32(x · f32(1 / s)),
    then (RMS4) f32(y · scale) and f32(· + bias) with numpy broadcasting (each optional):
    bit for bit the written-out chain FuseRMSNorm replaces (passes/rules/fuse_rms_norm.py)."""
    del ctx  # unused: one output, no opset differences
    if x.dtype != np.float32:
        raise OpError(f"RMSNormDiv: float32 x expected, got {x.dtype}")
    if not -x.ndim <= axis < x.ndim:
        raise OpError(f"RMSNormDiv: axis expected in [{-x.ndim}, {x.ndim - 1}], got {axis}")
    axis %= x.ndim
    rows = x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))
    y = rms_norm_rows(rows, np.float32(epsilon), reciprocal=bool(reciprocal)).reshape(x.shape)
    if scale is not None:
        y = y * scale.astype(np.float32, copy=False)
    if bias is not None:
        y = y + bias.astype(np.float32, copy=False)
    return y


# ------------------------------------------------------------------ GroupNormalization


@register("GroupNormalization")
def group_normalization(
    ctx: OpContext,
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    *,
    num_groups: int,
    epsilon: float = 1e-5,
    stash_type: int = 1,
) -> np.ndarray:
    """x (N, C, *spatial): statistics per (n, group of C / num_groups channels).

    Opset 18: scale and bias have num_groups elements, one per group (applied to all of
    the group's channels). Opset 21: they have C elements, one per channel."""
    if x.ndim < 2:
        raise OpError(f"GroupNormalization: expected x (N, C, ...), got shape {x.shape}")
    n, c = x.shape[:2]
    if num_groups < 1 or c % num_groups:
        raise OpError(
            f"GroupNormalization: channels {c} must be a positive multiple of num_groups {num_groups}"
        )
    per_channel = ctx.opset >= 21
    expected = c if per_channel else num_groups
    for name, v in (("scale", scale), ("bias", bias)):
        if np.size(v) != expected:
            what = "C" if per_channel else "num_groups"
            raise OpError(
                f"GroupNormalization (opset {ctx.opset}): {name} expected {what} = {expected} elements, "
                f"got shape {np.shape(v)}"
            )
    stash = _stash_dtype("GroupNormalization", stash_type) if ctx.opset >= 21 else np.dtype(np.float32)
    dtype = _compute_in(x, stash)
    gamma = np.asarray(scale, dtype=dtype).reshape(-1)
    beta = np.asarray(bias, dtype=dtype).reshape(-1)
    if not per_channel:
        gamma, beta = np.repeat(gamma, c // num_groups), np.repeat(beta, c // num_groups)
    if x.dtype == np.float32 and dtype == np.float32:
        return _normalized_rows_affine(x, n * num_groups, epsilon, gamma, beta)
    grouped = x.astype(dtype).reshape(n, num_groups, -1)
    mean = grouped.mean(axis=-1, keepdims=True)
    var = np.square(grouped - mean).mean(axis=-1, keepdims=True)
    normalized = ((grouped - mean) / np.sqrt(var + dtype.type(epsilon))).reshape(x.shape)
    y = normalized * _per_channel(gamma, x.ndim, dtype) + _per_channel(beta, x.ndim, dtype)
    return from_compute(y, x.dtype)


def _normalized_rows_affine(
    x: np.ndarray, rows: int, epsilon: float, gamma: np.ndarray, beta: np.ndarray
) -> np.ndarray:
    """float32 x (N, C, *spatial) as ``rows`` rows (one per (n, channel) or (n, group)),
    each normalized by eqs. (L1)-(L3), (L4'), (L5') of docs/float-ops.md — the function
    bodies' ReduceMean, Sub, ReduceMean of the squares, Add, Sqrt, Div — then (IN1)
    y = f32(f32(z · gamma[c]) + beta[c]) per channel: what the native kernel computes
    (targets/native/float_ops.py), bit for bit."""
    z = layer_norm_div_rows(x.reshape(rows, -1), np.float32(epsilon)).reshape(x.shape)
    shape = (-1, *([1] * (x.ndim - 2)))
    return z * gamma.reshape(shape) + beta.reshape(shape)  # (IN1)


# --------------------------------------------------------------- InstanceNormalization


@register("InstanceNormalization")
def instance_normalization(
    ctx: OpContext, x: np.ndarray, scale: np.ndarray, bias: np.ndarray, *, epsilon: float = 1e-5
) -> np.ndarray:
    del ctx  # unused
    if x.ndim < 3 or np.shape(scale) != (x.shape[1],) or np.shape(bias) != (x.shape[1],):
        raise OpError(
            f"InstanceNormalization: expected x (N, C, spatial...) and scale, B of shape (C,), got "
            f"{x.shape}, {np.shape(scale)}, {np.shape(bias)}"
        )
    if x.dtype == np.float32:
        f32 = np.float32
        return _normalized_rows_affine(
            x, x.shape[0] * x.shape[1], epsilon, scale.astype(f32), bias.astype(f32)
        )
    dtype = compute_dtype(x.dtype)
    xc = to_compute(x)
    axes = tuple(range(2, x.ndim))
    mean = xc.mean(axis=axes, keepdims=True)
    var = np.square(xc - mean).mean(axis=axes, keepdims=True)
    y = (xc - mean) / np.sqrt(var + dtype.type(epsilon))
    y = y * _per_channel(scale, x.ndim, dtype) + _per_channel(bias, x.ndim, dtype)
    return from_compute(y, x.dtype)


# -------------------------------------------------------------------------------- LRN


@register("LRN")
def lrn(
    ctx: OpContext,
    x: np.ndarray,
    *,
    size: int,
    alpha: float = 0.0001,
    beta: float = 0.75,
    bias: float = 1.0,
) -> np.ndarray:
    """y = x / (bias + alpha / size * square_sum) ^ beta, where square_sum[n, c] sums x^2
    over channels [c - floor((size - 1) / 2), c + ceil((size - 1) / 2)] that exist."""
    del ctx  # unused
    if x.ndim < 3 or size < 1:
        raise OpError(f"LRN: expected x (N, C, spatial...) and size >= 1, got {x.shape} and size={size}")
    xc = to_compute(x)
    before, after = (size - 1) // 2, math.ceil((size - 1) / 2)
    squares = np.pad(np.square(xc), [(0, 0), (before, after)] + [(0, 0)] * (x.ndim - 2))
    square_sum = np.lib.stride_tricks.sliding_window_view(squares, size, axis=1).sum(axis=-1)
    y = xc / (bias + alpha / size * square_sum) ** beta
    return from_compute(y, x.dtype)
