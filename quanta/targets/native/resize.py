"""Native Resize (kernels/cpp/tensor_ops): nearest by gathers, linear / cubic by the
float64 tap sums of the twin.

The twin (reference/nn_resize.py) resizes one axis after the other in float64 and casts
once at the end. Per input shape and scales / sizes the kernel asks the twin's own
:func:`resize_plan` and :func:`resize_axis_tables` for the steps, the source indices and
the weights (cached), so coordinates and weights are the twin's by construction; then

- nearest: ``take_axis`` per resized axis on x itself (a gather moves the values, which
  float64 would hold exactly: float32, (u)int8 and int32 inputs); when only the last two
  axes grow (or the two before a last axis of 16-64 bytes, an NCHW16c tensor's), by
  integer factors with source index q // s, one ``repeat_2d`` instead;
- linear / cubic: x to float64 (``cast``), ``resize_axis_f64`` per axis (the tap sum of
  ``weighted_taps``, in its order), and the result to x's dtype: float32 by ``cast``
  (one rounding, as astype), integers by the twin's ``resize_output`` (rint, clip). A
  float32 image resized along its last two axes runs the same two steps plane by plane
  (``resize_2d_f32``), its float64 buffers a plane's size instead of the tensor's; so does
  one resized along the two axes before its last (an NCHW16c tensor's H and W: the
  blocked lowering's linear Resize), each of the last axis' values a plane of its own.

tf_crop_and_resize (extrapolation outside the roi) and int64 / float64 / float16 inputs
run on the twin.

GridSample (float32, 2-D images, linear or nearest, zeros or border padding) runs
``grid_sample_f32`` (tensor_ops/grid_sample.h): eqs. (GS1)-(GS4) of docs/float-ops.md,
the twin's (reference/grid_sample.py) float32 steps in its order. RoiAlign (float32,
avg or max) runs ``roi_align_f32`` (tensor_ops/roi_align.h): eqs. (RA1)-(RA4), the
twin's (reference/roi_align.py) steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels.reference.grid_sample import native_grid_sample_supports
from quanta.kernels.reference.nn_resize import resize_axis_tables, resize_output, resize_plan
from quanta.kernels.reference.roi_align import roi_align_mode
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.native._cache import BoundedCache
from quanta.targets.native._specialize import guarded, step_threads
from quanta.targets.native.float_ops import _dtype, _native, _threads, _Unsupported, _with_fallback

__all__ = ["RESIZE_DTYPES"]

#: input types whose values float64 holds exactly (so a gather equals the twin's round trip)
RESIZE_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.uint8, np.int8, np.int32))
F64 = np.dtype(np.float64)


def _key(v: Any) -> Any:
    return None if v is None else (np.asarray(v).dtype.str, np.asarray(v).tobytes())


def _tables(ctx: Any, shape: tuple[int, ...], roi: Any, scales: Any, sizes: Any, attributes: dict) -> Any:
    attrs, steps = resize_plan(ctx, shape, roi, scales, sizes, **attributes)
    if attrs["coordinate_transformation_mode"] == "tf_crop_and_resize":
        return None
    tables = []
    cur = list(shape)
    for step in steps:
        axis, o = step[0], step[1]
        idx, w = resize_axis_tables(cur[axis], step, attrs)
        tables.append(
            (axis, np.ascontiguousarray(idx, np.int64), None if w is None else np.ascontiguousarray(w, F64))
        )
        cur[axis] = o
    return attrs["mode"], tables, tuple(cur)


def _nearest_order(tables: list, shape: tuple[int, ...]) -> list:
    """The nearest gathers in the order that moves the fewest bytes: each axis's gather is
    exact and independent of the others, so any order gives the same values. The axis
    that grows least goes first; on a tie (a 2x upsample) the inner one, whose gather
    moves elements one by one, while an outer axis copies whole (already widened) rows."""
    return sorted(tables, key=lambda t: (len(t[1]) / max(shape[t[0]], 1), -t[0]))


def _repeat_factors(tables: list, shape: tuple[int, ...], itemsize: int = 4) -> tuple[int, int, bool] | None:
    """(sh, sw, lanes) when the nearest gathers resize only the last two axes, each by an
    integer factor s with source index q // s (every element repeated s times in place: a
    YOLO neck's 2x upsample under every coordinate mode but align_corners); then one
    ``repeat_2d`` moves the bytes the two gathers would, in one pass, without the widened
    intermediate. ``lanes``: the two axes before the last, whose elements (an NCHW16c
    pixel's 16 floats: 64 bytes) move together. None otherwise."""
    rank = len(shape)
    if rank < 2:
        return None
    resized = {axis for axis, _, _ in tables}
    lanes = rank >= 3 and rank - 1 not in resized and itemsize * shape[-1] in (16, 32, 64)
    h_axis = rank - 3 if lanes else rank - 2
    factors = {h_axis: 1, h_axis + 1: 1}
    for axis, idx, _ in tables:
        n, m = shape[axis], len(idx)
        if axis not in factors or n == 0 or m % n:
            return None
        if not np.array_equal(idx, np.arange(m) // (m // n)):
            return None
        factors[axis] = m // n
    return factors[h_axis], factors[h_axis + 1], lanes


def _attr_key(attributes: dict) -> tuple:
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(attributes.items()))


@_with_fallback("Resize")
def _resize_native(
    ctx: Any,
    x: Any,
    roi: Any = None,
    scales: Any = None,
    sizes: Any = None,
    *,
    out: Any,
    plans: BoundedCache,
    **attributes: Any,
) -> np.ndarray:
    """Resize (nn_resize.resize) from the twin's cached tables (module docstring)."""
    if not isinstance(x, np.ndarray) or x.dtype not in RESIZE_DTYPES or x.ndim == 0:
        raise _Unsupported
    key = (x.shape, ctx.opset, _key(roi), _key(scales), _key(sizes), _attr_key(attributes))
    plan = plans.get(key, lambda: _tables(ctx, x.shape, roi, scales, sizes, attributes))
    if plan is None:
        raise _Unsupported
    mode, tables, _out_shape = plan
    n, t = _native(), _threads(ctx)
    if not tables:
        data = np.asarray(x, order="C")
        if out is None:
            return data.copy()
        np.copyto(out, data)
        return out
    if mode == "nearest":
        data = np.asarray(x, order="C")
        factors = _repeat_factors(tables, x.shape, x.dtype.itemsize)
        if factors is not None:
            sh, sw, lanes = factors
            return n.repeat_2d(data, sh, sw, t, out, lanes)
        for i, (axis, idx, _) in enumerate(_nearest_order(tables, x.shape)):
            last = i == len(tables) - 1
            data = n.take_axis(data, axis, idx, t, out if last else None)
        return data
    if (
        x.dtype == np.float32
        and len(tables) == 2
        and {tables[0][0], tables[1][0]} == {x.ndim - 2, x.ndim - 1}
    ):
        # an image's two axes: plane by plane in double buffers (no tensor-sized float64
        # intermediates), the same steps and the same bytes
        (first, taps_a, w_a), (_, taps_b, w_b) = tables
        return n.resize_2d_f32(
            np.asarray(x, order="C"), first == x.ndim - 2, taps_a, w_a, taps_b, w_b, t, out
        )
    if (
        x.dtype == np.float32
        and x.ndim >= 3
        and len(tables) == 2
        and {tables[0][0], tables[1][0]} == {x.ndim - 3, x.ndim - 2}
    ):
        # the two axes before a last axis left as it is (an NCHW16c tensor's H, W: the
        # blocked lowering's Resize): each of the last axis' lanes runs a plane's steps
        (first, taps_a, w_a), (_, taps_b, w_b) = tables
        return n.resize_2d_f32(
            np.asarray(x, order="C"), first == x.ndim - 3, taps_a, w_a, taps_b, w_b, t, out, x.shape[-1]
        )
    data = n.cast(np.asarray(x, order="C"), F64, t)
    for axis, taps, w in tables:
        shape = data.shape
        outer = int(np.prod(shape[:axis], dtype=np.int64))
        inner = int(np.prod(shape[axis + 1 :], dtype=np.int64))
        y = n.resize_axis_f64(data.reshape(outer, shape[axis], inner), taps, w, t)
        data = y.reshape((*shape[:axis], taps.shape[0], *shape[axis + 1 :]))
    if x.dtype == np.float32:
        return n.cast(data, x.dtype, t, out)
    y = resize_output(data, x.dtype)
    if out is None:
        return y
    np.copyto(out, y)
    return out


def _resize_specialized(sig: Specialization, *, plans: BoundedCache, **attributes: Any) -> Any:
    """Nearest Resize of one x shape with constant roi / scales / sizes: the gathers found
    once (the twin's tables, in :func:`_nearest_order`), a run is the take_axis calls alone
    (the generic call hashes its arguments for the table cache on every run)."""
    shape = sig.shapes[0]
    if shape is None or sig.dtypes[0] not in RESIZE_DTYPES or not shape:
        return None
    if any(sig.shapes[k] is not None and sig.consts[k] is None for k in range(1, len(sig.shapes))):
        return None  # a scale or size computed at run time
    consts = [*sig.consts[1:], None, None, None][:3]
    plan = _tables(sig.ctx, shape, *consts, attributes)
    if plan is None or plan[0] != "nearest" or not plan[1]:
        return None
    threads, out = step_threads(sig), sig.out
    generic = {"plans": plans, **attributes}
    factors = _repeat_factors(plan[1], shape, sig.dtypes[0].itemsize)
    if factors is not None:
        repeat, (sh, sw, lanes) = _native().repeat_2d, factors

        def run_repeat(x: np.ndarray, *rest: Any) -> np.ndarray:
            return repeat(x, sh, sw, threads, out, lanes)

        return guarded(run_repeat, _resize_native, generic, out, reads=1)
    order = [(axis, idx) for axis, idx, _ in _nearest_order(plan[1], shape)]
    take = _native().take_axis
    *first, (last_axis, last_idx) = order

    def run(x: np.ndarray, *rest: Any) -> np.ndarray:
        for axis, idx in first:
            x = take(x, axis, idx, threads)
        return take(x, last_axis, last_idx, threads, out)

    return guarded(run, _resize_native, generic, out, reads=1)


@register_binder("Resize")
def bind_resize(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """Resize, nearest / linear / cubic, every coordinate mode but tf_crop_and_resize."""
    del model  # unused
    if node.attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        return None, "native Resize does not extrapolate (tf_crop_and_resize runs on the twin)"
    dt = _dtype(node.input(0))
    if dt is not None and dt not in RESIZE_DTYPES:
        return None, f"native Resize takes float32 or an integer type of up to 32 bits, got {dt}"
    return (
        Kernel(
            _resize_native,
            "native",
            "native:resize",
            params={"plans": BoundedCache()},
            out=True,
            specialize=_resize_specialized,
        ),
        "",
    )


@_with_fallback("GridSample")
def _grid_sample_native(
    ctx: Any,
    x: Any,
    grid: Any,
    *,
    out: Any,
    align_corners: int = 0,
    mode: str = "linear",
    padding_mode: str = "zeros",
) -> np.ndarray:
    """GridSample of float32 images (``grid_sample_f32``: eqs. (GS1)-(GS4), the twin's
    bytes); what (GS1)-(GS4) do not cover goes to the twin, which delegates it."""
    if not native_grid_sample_supports(x, grid, _text(mode), _text(padding_mode)):
        raise _Unsupported
    return _native().grid_sample_f32(
        np.ascontiguousarray(x),
        np.ascontiguousarray(grid),
        bool(align_corners),
        _text(mode) == "nearest",
        _text(padding_mode) == "border",
        _threads(ctx),
        out,
    )


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@register_binder("GridSample")
def bind_grid_sample(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 GridSample over 2-D images, linear or nearest, zeros or border padding."""
    del model  # unused
    mode, padding = _text(node.attrs.get("mode", "linear")), _text(node.attrs.get("padding_mode", "zeros"))
    if mode not in ("linear", "bilinear", "nearest"):
        return None, f"native GridSample interpolates linear or nearest, got {mode!r} (the twin delegates it)"
    if padding not in ("zeros", "border"):
        return (
            None,
            f"native GridSample pads with zeros or the border, got {padding!r} (the twin delegates it)",
        )
    dt = _dtype(node.input(0))
    if dt is not None and dt != np.float32:
        return None, f"native GridSample takes float32 X, got {dt}"
    return Kernel(_grid_sample_native, "native", "native:grid_sample_f32", out=True), ""


@_with_fallback("RoiAlign")
def _roi_align_native(
    ctx: Any,
    x: Any,
    rois: Any,
    batch_indices: Any,
    *,
    out: Any,
    coordinate_transformation_mode: Any = None,
    mode: str = "avg",
    output_height: int = 1,
    output_width: int = 1,
    sampling_ratio: int = 0,
    spatial_scale: float = 1.0,
) -> np.ndarray:
    """RoiAlign of float32 X and rois (``roi_align_f32``: eqs. (RA1)-(RA4), the twin's
    bytes); other dtypes and modes go to the twin."""
    m = _text(mode)
    if (
        not isinstance(x, np.ndarray)
        or not isinstance(rois, np.ndarray)
        or x.dtype != np.float32
        or rois.dtype != np.float32
        or m not in ("avg", "max")
    ):
        raise _Unsupported
    return _native().roi_align_f32(
        np.ascontiguousarray(x),
        np.ascontiguousarray(rois),
        np.ascontiguousarray(np.asarray(batch_indices).astype(np.int64)),
        int(output_height),
        int(output_width),
        int(sampling_ratio),
        float(np.float32(spatial_scale)),
        roi_align_mode(ctx, coordinate_transformation_mode),
        m == "max",
        _threads(ctx),
        out,
    )


@register_binder("RoiAlign")
def bind_roi_align(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 RoiAlign, avg or max, either coordinate mode."""
    del model  # unused
    dt = _dtype(node.input(0))
    if dt is not None and dt != np.float32:
        return None, f"native RoiAlign takes float32 X, got {dt}"
    return Kernel(_roi_align_native, "native", "native:roi_align_f32", out=True), ""
