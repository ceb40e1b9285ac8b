"""The blocked float layout NCHW16c and its operators (quanta::ReorderNchwc, ReorderNchw,
ConvNchwc, MaxPoolNchwc, GlobalAveragePoolNchwc).

An NCHW16c tensor is a plain 5-D array ``[N, Cb, H, W, 16]`` with ``Cb = ceil(C / 16)``
and channel ``c = cb·16 + lane`` (docs/float-ops.md "The blocked layout"). The lanes of
channels ``>= C`` ("pad lanes") exist so that every channel block is a whole SIMD vector;
the reorder into the layout writes 0 there and every operator computes them as if they
were channels of their own: a convolution with zero weights and zero bias for them, a
pool over them. So the twin of each operator is its NCHW operator on all ``Cb·16``
channels, and the exact ones (reorders, pools, elementwise operators on 5-D tensors) are
bit-exact with their native kernels on every lane, pad lanes included. The convolution is
in the float GEMM family (error bound (FG1) against float64, not bit-exact).

Elementwise operators, Concat / Split of whole channel blocks, ReduceMean over the
spatial axes and nearest Resize of H and W need no operator of their own: the standard
ones on the 5-D tensor compute the same elements (passes/lower/nchwc.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from quanta.kernels.reference.nn_conv import FUSED_GATES, conv, fused_clamp, fused_conv
from quanta.kernels.reference.nn_pool import global_average_pool, max_pool
from quanta.kernels.reference.registry import OpContext, OpError, register

__all__ = [
    "BLOCK",
    "blocks",
    "conv_nchwc",
    "from_nchwc",
    "global_average_pool_nchwc",
    "max_pool_nchwc",
    "to_nchwc",
]

#: channels per block: one AVX-512 vector of float32 (two AVX2 vectors)
BLOCK = 16


def blocks(c: int) -> int:
    """Cb: the number of channel blocks that hold ``c`` channels."""
    return -(-int(c) // BLOCK)


def to_nchwc(x: np.ndarray) -> np.ndarray:
    """``[N, C, *spatial]`` -> ``[N, Cb, *spatial, 16]``, pad lanes 0."""
    if x.ndim < 3:
        raise OpError(f"ReorderNchwc: expected x of rank >= 3 (N, C, spatial...), got shape {x.shape}")
    n, c = x.shape[:2]
    cb = blocks(c)
    if cb * BLOCK != c:
        pad = np.zeros((n, cb * BLOCK - c, *x.shape[2:]), x.dtype)
        x = np.concatenate([x, pad], axis=1)
    y = x.reshape(n, cb, BLOCK, *x.shape[2:])
    return np.ascontiguousarray(np.moveaxis(y, 2, -1))


def from_nchwc(x: np.ndarray, c: int | None = None) -> np.ndarray:
    """``[N, Cb, *spatial, 16]`` -> ``[N, c, *spatial]`` (all ``Cb·16`` channels when ``c``
    is None)."""
    if x.ndim < 4 or x.shape[-1] != BLOCK:
        raise OpError(f"ReorderNchw: expected x of shape [N, Cb, spatial..., {BLOCK}], got {x.shape}")
    n, cb = x.shape[:2]
    full = np.moveaxis(x, -1, 2).reshape(n, cb * BLOCK, *x.shape[2:-1])
    if c is None:
        return np.ascontiguousarray(full)
    if not 0 < c <= cb * BLOCK or blocks(c) != cb:
        raise OpError(f"ReorderNchw: channels {c} does not fit {cb} blocks of {BLOCK}")
    return np.ascontiguousarray(full[:, :c])


@register("ReorderNchwc", "quanta")
def reorder_nchwc(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """quanta::ReorderNchwc: NCHW -> NCHW16c (exact: a move; pad lanes 0)."""
    del ctx  # unused
    return to_nchwc(x)


@register("ReorderNchw", "quanta")
def reorder_nchw(ctx: OpContext, x: np.ndarray, *, channels: int) -> np.ndarray:
    """quanta::ReorderNchw: NCHW16c -> NCHW of ``channels`` channels (exact: a move)."""
    del ctx  # unused
    return from_nchwc(x, int(channels))


def _padded_weights(w: np.ndarray, group: int, cin: int, input_nchw: bool) -> tuple[np.ndarray, int]:
    """w ``[M, C/G, *k]`` padded with zero filters to ``Mb·16`` outputs and, for group 1
    with a blocked input, zero input channels to ``Cb·16``; the group count of the padded
    convolution (a depthwise one stays depthwise over all ``Cb·16`` channels)."""
    m = w.shape[0]
    mp = blocks(m) * BLOCK
    if group == 1:
        cp = cin if input_nchw else blocks(cin) * BLOCK
        wp = np.zeros((mp, cp, *w.shape[2:]), w.dtype)
        wp[:m, : w.shape[1]] = w
        return wp, 1
    wp = np.zeros((mp, 1, *w.shape[2:]), w.dtype)
    wp[:m] = w
    return wp, mp


def conv_nchwc(
    ctx: OpContext,
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    s: np.ndarray | None = None,
    *,
    activation: str = "",
    activation_params: Sequence[float] | None = None,
    group: int = 1,
    input_nchw: int = 0,
    **attrs: Any,
) -> np.ndarray:
    """quanta::ConvNchwc: the float Conv (and fused activation, as quanta::Conv) of an
    NCHW16c input (or, with ``input_nchw``, a plain NCHW one: the stem) into NCHW16c, over
    all ``Cb·16`` channels with zero filters and biases for the pad lanes. Group 1 or
    depthwise (group = C = M). ``activation`` empty: none. ``s`` (group 1): an NCHW16c
    tensor of the output's shape added to the Conv's output before the activation, which
    is then a clamp (Relu / Clip): the Conv -> Add -> Relu nodes it replaces, bit for bit
    but for the Conv's summation order."""
    m, cg = w.shape[0], w.shape[1]
    depthwise = group != 1
    if depthwise and (group != m or cg != 1):
        raise OpError(
            f"ConvNchwc: group {group} with weights {w.shape}: only group 1 or depthwise (group = C = M) run blocked"
        )
    if input_nchw and depthwise:
        raise OpError("ConvNchwc: input_nchw takes group 1 only")
    xf = x if input_nchw else from_nchwc(x)
    cin = x.shape[1] if input_nchw else (m if depthwise else cg)
    if not input_nchw and blocks(cin) != x.shape[1]:
        raise OpError(f"ConvNchwc: input of {x.shape[1]} blocks for weights {w.shape} ({cin} channels)")
    if input_nchw and x.shape[1] != cg:
        raise OpError(f"ConvNchwc: input of {x.shape[1]} channels for weights {w.shape}")
    wp, gp = _padded_weights(w, group, cin, bool(input_nchw))
    bp = None
    if b is not None:
        bp = np.zeros(wp.shape[0], b.dtype)
        bp[:m] = b
    if s is not None:
        if depthwise or activation in FUSED_GATES:
            raise OpError("ConvNchwc: a sum operand takes group 1 and no activation or a clamp (Relu / Clip)")
        y = to_nchwc(conv(ctx, xf, wp, bp, group=gp, **attrs))
        if s.shape != y.shape:
            raise OpError(f"ConvNchwc: sum of shape {s.shape} for an output of shape {y.shape}")
        y = y + s
        return fused_clamp(y, activation, activation_params, ctx.node_name) if activation else y
    if activation:
        y = fused_conv(
            ctx, xf, wp, bp, activation=activation, activation_params=activation_params, group=gp, **attrs
        )
    else:
        y = conv(ctx, xf, wp, bp, group=gp, **attrs)
    return to_nchwc(y)


register("ConvNchwc", "quanta")(conv_nchwc)


def max_pool_nchwc(ctx: OpContext, x: np.ndarray, **attrs: Any) -> np.ndarray:
    """quanta::MaxPoolNchwc: ai.onnx MaxPool (one output) of every channel, pad lanes
    included (exact: max selects)."""
    if x.ndim < 4 or x.shape[-1] != BLOCK:
        raise OpError(f"MaxPoolNchwc: expected x of shape [N, Cb, spatial..., {BLOCK}], got {x.shape}")
    one = OpContext(opset=ctx.opset, n_outputs=1, node_name=ctx.node_name, op_type="MaxPool")
    y = max_pool(one, from_nchwc(x), **attrs)
    return to_nchwc(y)  # type: ignore[arg-type]


register("MaxPoolNchwc", "quanta")(max_pool_nchwc)


def global_average_pool_nchwc(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """quanta::GlobalAveragePoolNchwc: ai.onnx GlobalAveragePool of every channel, pad
    lanes included, ``[N, Cb, 1, 1, 16]``: each channel's mean over its H·W values in
    the order GlobalAveragePool sums them (docs/float-ops.md "Reductions")."""
    if x.ndim < 4 or x.shape[-1] != BLOCK:
        raise OpError(
            f"GlobalAveragePoolNchwc: expected x of shape [N, Cb, spatial..., {BLOCK}], got {x.shape}"
        )
    return to_nchwc(global_average_pool(ctx, from_nchwc(x)))


register("GlobalAveragePoolNchwc", "quanta")(global_average_pool_nchwc)
