"""Native kernels of the blocked float layout NCHW16c (kernels/cpp/nchwc; the pass that
builds the regions: passes/lower/nchwc.py).

=========================  ===========================  ==============================
operator                   native call                  twin (reference/nchwc.py)
=========================  ===========================  ==============================
quanta::ReorderNchwc       ``reorder_nchwc_f32``        to_nchwc (exact)
quanta::ReorderNchw        ``reorder_nchw_f32``         from_nchwc (exact)
quanta::ConvNchwc          ``conv_nchwc_f32``, weights  conv_nchwc (within eq. (FG1))
                           packed at compile time
quanta::MaxPoolNchwc       ``max_pool_nchwc_f32``       max_pool_nchwc (exact)
quanta::GlobalAverage...   ``global_avg_pool_nchwc_f32``  global_average_pool_nchwc (exact)
=========================  ===========================  ==============================

An input that is not float32 runs on the twin (counted in RUNTIME_FALLBACKS).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels.reference.nn_conv import FUSED_GATES, fused_clamp_bounds
from quanta.kernels.reference.registry import OpError
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.native._specialize import guarded
from quanta.targets.native._values import threads as _threads
from quanta.targets.native.float_gemm import (
    POST_KINDS,
    _constant,
    _f32,
    _kernel,
    _not_f32,
    _with_fallback,
)

try:
    from quanta.kernels import _native
except ImportError:  # the binders only run when the extension is built
    _native = None

__all__ = [
    "bind_conv_nchwc",
    "bind_global_average_pool_nchwc",
    "bind_max_pool_nchwc",
    "bind_reorder_nchw",
    "bind_reorder_nchwc",
]

QUANTA = "quanta"
_F32 = np.dtype(np.float32)


def _missing(name: str) -> str:
    if _native is None:
        return "the native extension is not built"
    if not hasattr(_native, name):
        return f"the native extension has no {name}"
    return ""


def _specialized(
    fn: Callable[..., Any], name: str, specialize: Callable[..., Any], **params: Any
) -> tuple[Kernel, str]:
    """The generic kernel ``fn`` with its ``specialize`` hook (every blocked step has one)."""
    kern, why = _kernel(fn, name, **params)
    kern.specialize = specialize
    return kern, why


def _bind_one_input(
    node: Node, name: str, fn: Callable[..., Any], specialize: Callable[..., Any]
) -> tuple[Kernel | None, str]:
    """A float32 step of one layout input (a reorder, a blocked pool) on ``_native.name``."""
    reason = _missing(name) or _not_f32(node.op_type, ("x", node.input(0)))
    if reason:
        return None, reason
    return _specialized(fn, name, specialize)


# -- reorders ----------------------------------------------------------------------------


@_with_fallback("ReorderNchwc", QUANTA)
def _reorder_nchwc(ctx: Any, x: Any, *, out: np.ndarray | None) -> np.ndarray:
    return _native.reorder_nchwc_f32(_f32(x), out=out, num_threads=_threads(ctx))


@_with_fallback("ReorderNchw", QUANTA)
def _reorder_nchw(ctx: Any, x: Any, *, out: np.ndarray | None, channels: int) -> np.ndarray:
    return _native.reorder_nchw_f32(_f32(x), int(channels), out=out, num_threads=_threads(ctx))


@register_binder("ReorderNchwc", QUANTA)
def bind_reorder_nchwc(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """NCHW -> NCHW16c, float32."""
    del model  # unused
    return _bind_one_input(node, "reorder_nchwc_f32", _reorder_nchwc, _reorder_nchwc_specialized)


def _reorder_nchwc_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """The reorder with its output and thread count bound (positional: no keyword matching)."""
    if sig.dtypes[0] != _F32:
        return None
    fn, out, threads = _native.reorder_nchwc_f32, sig.out, sig.num_threads
    return guarded(lambda x, *_: fn(x, out, threads), _reorder_nchwc, attrs, out, reads=1, recordable=True)


@register_binder("ReorderNchw", QUANTA)
def bind_reorder_nchw(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """NCHW16c -> NCHW, float32."""
    del model  # unused
    return _bind_one_input(node, "reorder_nchw_f32", _reorder_nchw, _reorder_nchw_specialized)


def _reorder_nchw_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """The reorder with its channel count, output and thread count bound."""
    if sig.dtypes[0] != _F32:
        return None
    fn, c, out, threads = _native.reorder_nchw_f32, int(attrs["channels"]), sig.out, sig.num_threads
    return guarded(lambda x, *_: fn(x, c, out, threads), _reorder_nchw, attrs, out, reads=1, recordable=True)


# -- convolution -------------------------------------------------------------------------


@_with_fallback("ConvNchwc", QUANTA)
def _conv_nchwc(
    ctx: Any,
    x: Any,
    w: Any,
    b: Any = None,
    s: Any = None,
    *,
    out: np.ndarray | None,
    packed: np.ndarray,
    wshape: tuple[int, ...],
    clamp: tuple[float, float] = (-math.inf, math.inf),
    post: tuple[int, list[float]] = (0, []),
    kernel_shape: list[int],
    strides: list[int],
    dilations: list[int],
    pads: list[int],
    group: int = 1,
    input_nchw: int = 0,
    activation: str = "",
    activation_params: list[float] | None = None,
) -> np.ndarray:
    del w, activation, activation_params  # packed at compile time; clamp / post hold the activation
    m, cg = wshape[0], wshape[1]
    c = m if group != 1 else cg
    return _native.conv_nchwc_f32(
        _f32(x),
        packed,
        None if b is None else _f32(b),
        m,
        c,
        kernel_shape[0],
        kernel_shape[1],
        strides,
        dilations,
        pads,
        group,
        clamp[0],
        clamp[1],
        _threads(ctx),
        out,
        post[0],
        post[1],
        bool(input_nchw),
        None if s is None else _f32(s),
    )  # positional: pybind11 matches keywords by name, ~0.35 µs each (3-8 % of a 10x10 layer)


def _conv_nchwc_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """ConvNchwc with everything but the input (and the sum operand) bound once: the
    packed weights, the float32 bias, the geometry, the clamp and post op, the thread
    count and the arena view. A blocked layer of a few microseconds (a 7x7 or 10x10
    plane) otherwise spends ~1-2 µs of them in the generic wrapper."""
    if sig.dtypes[0] != _F32 or (len(sig.dtypes) > 3 and sig.dtypes[3] not in (None, _F32)):
        return None
    b = sig.consts[2] if len(sig.consts) > 2 else None
    if len(sig.dtypes) > 2 and sig.dtypes[2] is not None and (b is None or b.dtype != _F32):
        return None  # a bias that is not a float32 constant: the generic kernel converts it
    wshape, group = attrs["wshape"], int(attrs.get("group", 1))
    m, cg = wshape[0], wshape[1]
    c = m if group != 1 else cg
    clamp, post = attrs.get("clamp", (-math.inf, math.inf)), attrs.get("post", (0, []))
    kernel, strides, dilations, pads = (
        attrs["kernel_shape"],
        attrs["strides"],
        attrs["dilations"],
        attrs["pads"],
    )
    packed, bias, out, threads = (
        attrs["packed"],
        None if b is None else np.ascontiguousarray(b),
        sig.out,
        sig.num_threads,
    )
    conv, nchw = _native.conv_nchwc_f32, bool(attrs.get("input_nchw", 0))
    head = (
        packed,
        bias,
        m,
        c,
        kernel[0],
        kernel[1],
        strides,
        dilations,
        pads,
        group,
        clamp[0],
        clamp[1],
        threads,
        out,
    )
    tail = (post[0], post[1], nchw)
    if len(sig.dtypes) > 3 and sig.dtypes[3] is not None:
        return guarded(lambda x, w, b, s: conv(x, *head, *tail, s), _conv_nchwc, attrs, out, recordable=True)
    return guarded(lambda x, *_: conv(x, *head, *tail), _conv_nchwc, attrs, out, reads=1, recordable=True)


@register_binder("ConvNchwc", QUANTA)
def bind_conv_nchwc(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta::ConvNchwc: the direct blocked convolution, weights packed once; a fused
    residual (the sum operand) is added in the store before a fused Relu / Clip clamps
    there, a gated activation runs per finished block."""
    del model  # unused
    reason = _missing("conv_nchwc_f32") or _not_f32(
        "ConvNchwc", ("x", node.input(0)), ("w", node.input(1)), ("B", node.input(2)), ("sum", node.input(3))
    )
    if reason:
        return None, reason
    w = _constant(node.input(1))
    if w is None or w.ndim != 4:
        return None, "weights w are not the constant of a 2-D convolution"
    b = node.input(2)
    if b is not None and _constant(b) is None:
        return None, "bias computed at run time"
    activation = str(node.attrs.get("activation", ""))
    params = node.attrs.get("activation_params")
    clamp: tuple[float, float] = (-math.inf, math.inf)
    post: tuple[int, list[float]] = (0, [])
    if activation in FUSED_GATES:
        p = [float(v) for v in (params or [])]
        if len(p) != FUSED_GATES[activation]:
            return None, f"activation {activation} takes {FUSED_GATES[activation]} activation_params, got {p}"
        post = (POST_KINDS[activation], p)
    elif activation:
        try:
            lo, hi = fused_clamp_bounds(activation, params)
        except OpError as e:
            return None, str(e)
        clamp = (float(np.float32(lo)), float(np.float32(hi)))
    group = int(node.attrs.get("group", 1))
    input_nchw = bool(node.attrs.get("input_nchw", 0))
    if node.input(3) is not None and (group != 1 or post[0]):
        return None, "a sum operand with a depthwise convolution or a gated activation"
    try:
        packed = _native.conv_nchwc_pack_f32(np.ascontiguousarray(w, np.float32), group, input_nchw)
    except ValueError as e:
        return None, f"the native kernel refuses the weights: {e}"
    k = "x".join(str(v) for v in w.shape[2:])
    kind = "dw" if group != 1 else ("nchw_in" if input_nchw else "direct")
    act = ("_sum" if node.input(3) is not None else "") + (f"_{activation.lower()}" if activation else "")
    return _specialized(
        _conv_nchwc,
        f"conv_nchwc_{kind}_{k}{act}",
        _conv_nchwc_specialized,
        packed=packed,
        wshape=tuple(w.shape),
        clamp=clamp,
        post=post,
    )


# -- pools -------------------------------------------------------------------------------


@_with_fallback("MaxPoolNchwc", QUANTA)
def _max_pool_nchwc(
    ctx: Any,
    x: Any,
    *,
    out: np.ndarray | None,
    kernel_shape: list[int],
    strides: list[int],
    dilations: list[int],
    pads: list[int],
    ceil_mode: int = 0,
) -> np.ndarray:
    del ctx  # one thread: the pool is a memory pass
    return _native.max_pool_nchwc_f32(
        _f32(x), kernel_shape, strides, pads, dilations, bool(ceil_mode), out=out
    )


@register_binder("MaxPoolNchwc", QUANTA)
def bind_max_pool_nchwc(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta::MaxPoolNchwc, float32."""
    del model  # unused
    return _bind_one_input(node, "max_pool_nchwc_f32", _max_pool_nchwc, _max_pool_nchwc_specialized)


def _max_pool_nchwc_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """The pool with its window, output bound (one thread, as the generic kernel)."""
    if sig.dtypes[0] != _F32:
        return None
    fn, out = _native.max_pool_nchwc_f32, sig.out
    window = (
        list(attrs["kernel_shape"]),
        list(attrs["strides"]),
        list(attrs["pads"]),
        list(attrs["dilations"]),
        bool(attrs.get("ceil_mode", 0)),
        1,
    )
    return guarded(lambda x, *_: fn(x, *window, out), _max_pool_nchwc, attrs, out, reads=1, recordable=True)


@_with_fallback("GlobalAveragePoolNchwc", QUANTA)
def _gap_nchwc(ctx: Any, x: Any, *, out: np.ndarray | None) -> np.ndarray:
    del ctx  # one thread: the pool is a memory pass
    return _native.global_avg_pool_nchwc_f32(_f32(x), out=out)


@register_binder("GlobalAveragePoolNchwc", QUANTA)
def bind_global_average_pool_nchwc(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta::GlobalAveragePoolNchwc, float32."""
    del model  # unused
    return _bind_one_input(node, "global_avg_pool_nchwc_f32", _gap_nchwc, _gap_nchwc_specialized)


def _gap_nchwc_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """The pool with its output bound (one thread, as the generic kernel)."""
    if sig.dtypes[0] != _F32:
        return None
    fn, out = _native.global_avg_pool_nchwc_f32, sig.out
    return guarded(lambda x, *_: fn(x, 1, out), _gap_nchwc, attrs, out, reads=1, recordable=True)
