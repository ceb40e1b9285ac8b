"""Reduction reference ops (ai.onnx): ReduceSum ... ReduceLogSumExp, ArgMax, ArgMin.

``axes`` is an attribute before opset 18 (before 13 for ReduceSum) and an optional input
from then on; the functions accept either. With no axes (absent or empty) a reduction
covers every axis, unless ``noop_with_empty_axes=1``, which returns the input unchanged
(for the ops whose definition composes a pre-step, that step still applies:
ReduceL1 -> |x|, ReduceL2 -> sqrt(x^2) = |x|, ReduceSumSquare -> x^2, ReduceLogSum ->
log(x), ReduceLogSumExp -> log(exp(x)); this matches the ONNX reference).

A reduction over zero elements gives the identity of its operation:

    Sum, L1, L2, SumSquare -> 0    Prod -> 1    LogSum, LogSumExp -> -inf
    Max -> -inf (the type's minimum for integers)    Min -> +inf (the type's maximum)
    Mean -> NaN (0 / 0; undefined in ONNX, 0 for integers; ONNX Runtime gives 0)

Results keep the input's element type: an integer mean truncates toward zero after
the float division, and integer sums and products wrap on overflow (two's complement;
ONNX leaves overflow unspecified, ONNX Runtime's int32 ReduceProd saturates instead).

float32 ReduceSum, ReduceMean, ReduceSumSquare, ReduceL1, ReduceL2, ReduceMax and
ReduceMin fix their order of operations (docs/float-ops.md "Reductions"), so that the
native kernels give the same bits: the reduced axes are moved to the end (rows [R, D],
D the product of the reduced dimensions, in the input's axis order) and each row is
summed by (R1)-(R3) (``float_ops.sum16``) or maximised / minimised by (M1)-(M3)
(:func:`extreme16`); then

    Sum: s                Mean: f32(s / f32(D))           SumSquare: sum16(f32(x · x))
    L1: sum16(|x|)        L2: f32(sqrt(sum16(f32(x · x))))
    LogSum: log_f32(s)    (LN1)-(LN6)
    Prod: prod16(x)       (P16): (R1)-(R3) with products, the lanes starting at +1
    LogSumExp (LSE1)-(LSE4): m = max (M1)-(M3); c = m if finite else +0;
                          y = f32(log_f32(sum16(exp_f32(f32(x − c)))) + c)

int32 / int64 Sum, SumSquare, L1, Prod, Max and Min are NumPy's reductions in the
element type: sums and products wrap (two's complement), so every order gives the same
bits, which the native kernels rely on.

(NumPy's pairwise ``np.sum`` / ``np.mean`` has an order that depends on the memory
layout and the build; it is not reproducible in C++.)
"""

from __future__ import annotations

import numpy as np

from quanta.kernels.reference.float_ops import LANES, exp_f32, lanes16, log_f32, sum16
from quanta.kernels.reference.registry import OpError, register

F32 = np.dtype(np.float32)


def extreme16(v: np.ndarray, kind: str) -> np.ndarray:
    """Maximum (``kind`` "max") or minimum of every row of ``v`` [R, D] (float32) by
    eqs. (M1)-(M3); shape [R]::

        (M1) lane j (0 <= j < 16) starts at -inf (max) / +inf (min) and takes
             acc_j = np.maximum(acc_j, v_i) for i = j (mod 16) in increasing i
        (M2) for h = 8, 4, 2, 1:  acc_j = np.maximum(acc_j, acc_{j+h}) for j < h
        (M3) acc_0

    np.maximum returns NaN when either operand is NaN and its second operand on a tie
    (+0 against -0), so the sign of a zero result is pinned by this order too."""
    ufunc = np.maximum if kind == "max" else np.minimum
    fill = -np.inf if kind == "max" else np.inf
    v = np.asarray(v, F32)
    rows, d = v.shape
    blocks = -(-d // LANES)
    padded = np.full((rows, blocks * LANES), fill, F32)  # ±inf lanes change no result
    padded[:, :d] = v
    lanes = padded.reshape(rows, blocks, LANES)
    acc = np.full((rows, LANES), fill, F32)
    for b in range(blocks):  # (M1)
        ufunc(acc, lanes[:, b, :], out=acc)
    h = LANES // 2
    while h >= 1:  # (M2)
        acc = ufunc(acc[:, :h], acc[:, h : 2 * h])
        h //= 2
    return acc[:, 0]  # (M3)


def prod16(v: np.ndarray) -> np.ndarray:
    """Product of every row of ``v`` [R, D] (float32) by eq. (P16): the 16 lanes of (R1)
    start at +1 and take acc_j = f32(acc_j · v_i) for i = j (mod 16) in increasing i, then
    the tree of (R2) with products (a missing element multiplies by 1, which is exact)."""
    return lanes16(v, np.multiply, 1.0)


def log_sum_exp_rows(v: np.ndarray) -> np.ndarray:
    """log Σ e^x of every row of ``v`` [R, D] (float32) by eqs. (LSE1)-(LSE4)::

        (LSE1) m = extreme16(x, "max")               (M1)-(M3); NaN if the row has one
        (LSE2) c = m if m is finite, else +0          (a row of −inf, +inf or NaN)
        (LSE3) s = sum16(exp_f32(f32(x_i − c)))       (E1)-(E6), (R1)-(R3)
        (LSE4) y = f32(log_f32(s) + c)                (LN1)-(LN6)

    An empty row gives −inf (s = 0), a row with +inf gives +inf, one with NaN NaN."""
    v = np.asarray(v, F32)
    m = extreme16(v, "max")  # (LSE1)
    c = np.where(np.isfinite(m), m, F32.type(0)).astype(F32)  # (LSE2)
    with np.errstate(invalid="ignore", over="ignore"):
        s = sum16(exp_f32(v - c[:, None]))  # (LSE3)
    return np.asarray(log_f32(s) + c, F32)  # (LSE4)


def rows_of(x: np.ndarray, axes: tuple[int, ...]) -> tuple[np.ndarray, tuple[int, ...]]:
    """``x`` with the reduced ``axes`` moved to the end as rows [R, D] (a contiguous
    copy unless they already are the last axes), and the shape of the kept axes."""
    kept = [a for a in range(x.ndim) if a not in axes]
    moved = x if list(axes) == list(range(len(kept), x.ndim)) else np.transpose(x, kept + list(axes))
    d = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    kept_shape = tuple(x.shape[a] for a in kept)
    return np.ascontiguousarray(moved, F32).reshape(int(np.prod(kept_shape, dtype=np.int64)), d), kept_shape


def _f32_rows(kind: str):
    """The float32 reduction ``kind`` over rows (module docstring)."""

    def red(x, y, axes, keep):
        del y  # the pre-step is part of the row computation below
        rows, kept_shape = rows_of(x, axes)
        d = rows.shape[1]
        if kind == "sum":
            r = sum16(rows)
        elif kind == "mean":
            r = sum16(rows) / F32.type(d)
        elif kind == "sum_square":
            r = sum16(rows * rows)
        elif kind == "l1":
            r = sum16(np.abs(rows))
        elif kind == "l2":
            r = np.sqrt(sum16(rows * rows))
        elif kind == "prod":
            r = prod16(rows)
        elif kind == "log_sum":
            r = log_f32(sum16(rows))
        elif kind == "log_sum_exp":
            r = log_sum_exp_rows(rows)
        else:
            r = extreme16(rows, kind)
        r = np.asarray(r, F32).reshape(kept_shape)
        if keep:
            r = r.reshape(tuple(1 if a in axes else n for a, n in enumerate(x.shape)))
        return r

    return red


#: float32 reductions with the fixed order, by op (module docstring)
_F32_KIND = {
    "ReduceSum": "sum",
    "ReduceMean": "mean",
    "ReduceSumSquare": "sum_square",
    "ReduceL1": "l1",
    "ReduceL2": "l2",
    "ReduceMax": "max",
    "ReduceMin": "min",
    "ReduceProd": "prod",
    "ReduceLogSum": "log_sum",
    "ReduceLogSumExp": "log_sum_exp",
}


def _reduce_axes(
    op: str, ctx, x: np.ndarray, axes_input: np.ndarray | None, axes: list | None, noop: int
) -> tuple[int, ...] | None:
    """Normalised axes to reduce, or None when the op is a no-op."""
    chosen = axes_input if axes_input is not None else axes
    values = [] if chosen is None else [int(a) for a in np.asarray(chosen).ravel()]
    if not values:
        return None if noop else tuple(range(x.ndim))
    out = []
    for a in values:
        if not -x.ndim <= a < max(x.ndim, 1):
            raise OpError(f"{op}: expected axes in [{-x.ndim}, {x.ndim - 1}], got {a}")
        out.append(a % max(x.ndim, 1))
    del ctx  # unused: the attribute/input split is read from which one the node has
    return tuple(sorted(set(out)))


def _empty_fill(x: np.ndarray, kind: str):
    if kind == "max":
        return -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min if x.dtype.kind in "iu" else False
    if kind == "min":
        return np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).max if x.dtype.kind in "iu" else True
    raise AssertionError(kind)


def _make(op: str, pre, reduce, post) -> None:
    """Register ``op`` as post(reduce(pre(x), axes)), cast back to x's element type."""

    def fn(
        ctx,
        x: np.ndarray,
        axes_input: np.ndarray | None = None,
        axes: list | None = None,
        keepdims: int = 1,
        noop_with_empty_axes: int = 0,
    ) -> np.ndarray:
        red = _reduce_axes(op, ctx, x, axes_input, axes, noop_with_empty_axes)
        with np.errstate(all="ignore"):
            if red is not None and x.dtype == F32 and op in _F32_KIND and (op != "ReduceMean" or x.size):
                return _f32_rows(_F32_KIND[op])(x, None, red, bool(keepdims))
            y = pre(x)
            if red is not None:
                y = reduce(x, y, red, bool(keepdims))
            return np.asarray(post(y)).astype(x.dtype, copy=False)

    fn.__name__ = fn.__qualname__ = op.lower()
    register(op)(fn)


def _identity(x):
    return x


def _sum(x, y, axes, keep):
    return np.sum(y, axis=axes, keepdims=keep, dtype=y.dtype)


def _prod(x, y, axes, keep):
    return np.prod(y, axis=axes, keepdims=keep, dtype=y.dtype)


def _extreme(kind: str):
    ufunc = np.maximum if kind == "max" else np.minimum

    def red(x, y, axes, keep):
        if y.size == 0 or any(y.shape[a] == 0 for a in axes):
            return ufunc.reduce(y, axis=axes, keepdims=keep, initial=_empty_fill(x, kind))
        return ufunc.reduce(y, axis=axes, keepdims=keep)

    return red


def _mean(x, y, axes, keep):
    count = int(np.prod([y.shape[a] for a in axes], dtype=np.int64))
    if count == 0:  # undefined in ONNX: 0 / 0 = NaN for floats, 0 for integers (ORT: 0)
        fill = np.nan if x.dtype.kind == "f" else 0
        return np.full(np.sum(y, axis=axes, keepdims=keep).shape, fill, dtype=x.dtype)
    return np.mean(y, axis=axes, keepdims=keep, dtype=np.float64 if x.dtype.kind in "iub" else None)


def _logsumexp(x, y, axes, keep):
    # max-shifted for stability: m + log(sum(exp(x - m))); a non-finite m is shifted by 0
    m = np.max(y, axis=axes, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0).astype(y.dtype)
    s = np.log(np.sum(np.exp(y - m), axis=axes, keepdims=True))
    out = s + m
    return out if keep else np.squeeze(out, axis=axes)


_make("ReduceSum", _identity, _sum, _identity)
_make("ReduceMean", _identity, _mean, _identity)
_make("ReduceMax", _identity, _extreme("max"), _identity)
_make("ReduceMin", _identity, _extreme("min"), _identity)
_make("ReduceProd", _identity, _prod, _identity)
_make("ReduceL1", np.abs, _sum, _identity)
_make("ReduceL2", np.square, _sum, np.sqrt)
_make("ReduceSumSquare", np.square, _sum, _identity)
_make("ReduceLogSum", _identity, _sum, np.log)
_make("ReduceLogSumExp", _identity, _logsumexp, _identity)


def _arg(op: str, fn, ctx, x: np.ndarray, axis: int, keepdims: int, select_last_index: int) -> np.ndarray:
    del ctx  # unused
    if not -x.ndim <= axis < max(x.ndim, 1):
        raise OpError(f"{op}: expected axis in [{-x.ndim}, {x.ndim - 1}], got {axis}")
    axis = axis % max(x.ndim, 1)
    n = x.shape[axis]
    if n == 0:
        raise OpError(f"{op}: expected a non-empty axis {axis}, got shape {x.shape}")
    if select_last_index:
        idx = n - 1 - fn(np.flip(x, axis), axis=axis, keepdims=bool(keepdims))
    else:
        idx = fn(x, axis=axis, keepdims=bool(keepdims))
    return np.asarray(idx, dtype=np.int64)


@register("ArgMax")
def argmax(ctx, x: np.ndarray, axis: int = 0, keepdims: int = 1, select_last_index: int = 0) -> np.ndarray:
    return _arg("ArgMax", np.argmax, ctx, x, axis, keepdims, select_last_index)


@register("ArgMin")
def argmin(ctx, x: np.ndarray, axis: int = 0, keepdims: int = 1, select_last_index: int = 0) -> np.ndarray:
    return _arg("ArgMin", np.argmin, ctx, x, axis, keepdims, select_last_index)
