"""Native reductions: float32 ReduceSum, ReduceMean, ReduceSumSquare, ReduceL1, ReduceL2,
ReduceMax, ReduceMin, ReduceProd, ReduceLogSum, ReduceLogSumExp (kernels/cpp/tensor_ops
``reduce_rows_f32``), and int32 / int64 ReduceSum, ReduceSumSquare, ReduceL1, ReduceProd,
ReduceMax, ReduceMin (``reduce_rows_int``).

The twin (reference/reduce_ops.py) fixes the order: the reduced axes moved to the end as
rows [R, D], each row summed by (R1)-(R3) or maximised / minimised by (M1)-(M3)
(docs/float-ops.md "Reductions"). The kernel does the same: the rows are the input
itself when the reduced axes are already the last ones (the global average of NCHW
over [2, 3]); adjacent reduced axes that are not the last ones make x [outer, D,
inner], whose columns ``reduce_middle_f32`` reduces in place in the same lane order
(a LayerNorm sum over the channels, a mean pooling over the tokens); other axes take
the transposed view copied by ``copy_strided``, then one ``reduce_rows_f32`` call. The per-row finishing step of Mean (f32(s / f32(D))), L2
(f32(sqrt(s))) and the |x| of L1 are single IEEE operations per element, computed
with NumPy on the R results (or the |x| pass with the native ``abs``); LogSum's is the
native ``unary_f32("log")`` (LN1)-(LN6). LogSumExp is (LSE1)-(LSE4) as native calls on
the rows: ``reduce_rows_f32("max")``, the shift c (NumPy's ``where`` on the R maxima:
it selects, no arithmetic), ``binary_f32("sub")``, ``exp_f32``, ``reduce_rows_f32("sum")``,
``unary_f32("log")`` and one NumPy add per row — the twin's operations, so its bytes.
Integer sums and products wrap in the element type, as NumPy's do, so the C++ loop's
order gives the twin's bits.

float32 AveragePool is a row reduction too (nn_pool.average_pool, (AP1)-(AP3)): 1-D and
2-D windows run on ``average_pool_2d_f32`` (pool.h: the sum16 lanes as arrays over an
output row); 3-D ones copy the window view of x (zero-padded where pads or the
ceil_mode overhang need it) into rows [N·C·out, K] by ``copy_strided``, then one
``reduce_rows_f32("sum")`` and one ``binary_f32("div")`` by the per-position count.
Geometry and count are cached per input shape.

quanta OrtReduceSum / OrtReduceMean (ONNX Runtime's order over the trailing axes, twin
reference/ort_float.py, (ER1)-(ER4)) run on ``ort_reduce_rows_f32`` over the rows
[R, N], which are the input itself.

float64, other integer types, integer ReduceMean / ReduceL2 / ReduceLogSum(Exp) (a
float division or function of an integer sum, whose float64 twin sums pairwise), empty
inputs (the identities) and ``noop_with_empty_axes`` run on the twin.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels.reference.conv_geometry import ConvGeometry, conv_attrs
from quanta.kernels.reference.nn_pool import average_pool_count
from quanta.kernels.reference.ort_float import QUANTA_DOMAIN, mlas_global_average_rows, trailing_rows
from quanta.kernels.reference.reduce_ops import _reduce_axes
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.native._cache import BoundedCache
from quanta.targets.native._specialize import guarded, step_threads
from quanta.targets.native.elementwise import _as_2d, _pair
from quanta.targets.native.float_ops import _dtype, _f32, _native, _threads, _Unsupported, _with_fallback

__all__ = ["REDUCE_OPS"]

F32 = np.dtype(np.float32)

INT_TYPES = (np.dtype(np.int32), np.dtype(np.int64))

#: float32: op -> (row kernel, pre-step, post-step); LogSumExp's row kernel names the
#: composition (:func:`_log_sum_exp`)
REDUCE_OPS = {
    "ReduceSum": ("sum", None, None),
    "ReduceMean": ("sum", None, "mean"),
    "ReduceSumSquare": ("sum_square", None, None),
    "ReduceL1": ("sum", "abs", None),
    "ReduceL2": ("sum_square", None, "sqrt"),
    "ReduceMax": ("max", None, None),
    "ReduceMin": ("min", None, None),
    "ReduceProd": ("prod", None, None),
    "ReduceLogSum": ("sum", None, "log"),
    "ReduceLogSumExp": ("log_sum_exp", None, None),
}

#: int32 / int64: op -> ``reduce_rows_int`` operation
INT_REDUCE_OPS = {
    "ReduceSum": "sum",
    "ReduceSumSquare": "sum_square",
    "ReduceL1": "sum_abs",
    "ReduceProd": "prod",
    "ReduceMax": "max",
    "ReduceMin": "min",
}


def _log_sum_exp(rows: np.ndarray, threads: int, out: np.ndarray | None) -> np.ndarray:
    """(LSE1)-(LSE4) of every row of float32 ``rows`` [R, D] with D > 0 (reduce_ops.log_sum_exp_rows)."""
    n = _native()
    m = n.reduce_rows_f32("max", rows, threads)  # (LSE1)
    c = np.where(np.isfinite(m), m, F32.type(0)).astype(F32)  # (LSE2)
    e = n.exp_f32(n.binary_f32("sub", rows, c[:, None], threads), threads)  # (LSE3)
    s = n.reduce_rows_f32("sum", e, threads)
    return np.add(n.unary_f32("log", s, threads), c, out=out)  # (LSE4)


def _reduce_rows(
    row_op: str, post: str | None, rows: np.ndarray, t: int, target: np.ndarray | None
) -> np.ndarray:
    """The float32 row reduction ``row_op`` and its per-row ``post`` step ([R] results,
    into ``target`` when given)."""
    if row_op == "log_sum_exp":
        return _log_sum_exp(rows, t, target)
    return _finish(_native().reduce_rows_f32, row_op, post, rows, rows.shape[1], t, target)


def _finish(
    reduce: Any, row_op: str, post: str | None, x: np.ndarray, d: int, t: int, target: np.ndarray | None
) -> np.ndarray:
    """``reduce`` (``reduce_rows_f32`` of rows [R, d], or ``reduce_middle_f32`` of slabs
    [outer, d, inner]: the same reductions of the same rows) and the per-result ``post``
    step, into ``target`` when given."""
    if post == "log":  # the kernels take no out= that overlaps their input
        return _native().unary_f32("log", reduce(row_op, x, t), t, target)
    y = reduce(row_op, x, t, target)
    if post == "mean":
        np.divide(y, F32.type(d), out=y)  # f32(s / f32(D)), one IEEE division per row
    elif post == "sqrt":
        np.sqrt(y, out=y)
    return y


def _squeezed(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``shape`` without its axes of size 1 and ``axes`` renumbered on what is left: an
    axis of one element moves no other, so the layout tests below read the squeezed
    shape (a mask [N, T, 1] summed over T is rows [N, T], not a transposed copy)."""
    keep = [a for a, n in enumerate(shape) if n != 1]
    return tuple(shape[a] for a in keep), tuple(i for i, a in enumerate(keep) if a in axes)


def _trailing(shape: tuple[int, ...], axes: tuple[int, ...]) -> bool:
    """Whether x [..., reduced axes] is its rows [R, D] as it lies in memory."""
    shape, axes = _squeezed(shape, axes)
    return list(axes) == list(range(len(shape) - len(axes), len(shape)))


def _middle(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(outer, D, inner) when the reduced axes are adjacent and not the trailing ones
    (x is [outer, D, inner] and each row of the twin is a column x[o, :, c]: the beats
    TCN's time mean [T, 1, 16] over axis 0, a LayerNorm sum over the channels of [N, C,
    L]); None otherwise."""
    shape, axes = _squeezed(shape, axes)
    if not axes or list(axes) != list(range(axes[0], axes[-1] + 1)):
        return None
    inner = math.prod(shape[axes[-1] + 1 :])
    if inner == 1:
        return None  # the trailing rows (x itself)
    return math.prod(shape[: axes[0]]), math.prod(shape[a] for a in axes), inner


def _rows(ctx: Any, x: np.ndarray, axes: tuple[int, ...]) -> tuple[np.ndarray, tuple[int, ...]]:
    """x as rows [R, D] with the reduced axes last (reduce_ops.rows_of), and the kept shape."""
    kept = [a for a in range(x.ndim) if a not in axes]
    kept_shape = tuple(x.shape[a] for a in kept)
    r = int(np.prod(kept_shape, dtype=np.int64))
    d = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    if _trailing(x.shape, axes):
        return x.reshape(r, d), kept_shape
    moved = _native().copy_strided(np.transpose(x, kept + list(axes)), _threads(ctx))
    return moved.reshape(r, d), kept_shape


def _reduce_kernel(op_type: str):
    row_op, pre, post = REDUCE_OPS.get(op_type, ("", None, None))
    int_op = INT_REDUCE_OPS.get(op_type)

    @_with_fallback(op_type)
    def run(
        ctx: Any,
        x: Any,
        axes_input: Any = None,
        *,
        out: Any,
        axes: list | None = None,
        keepdims: int = 1,
        noop_with_empty_axes: int = 0,
    ) -> np.ndarray:
        if not isinstance(x, np.ndarray):
            raise _Unsupported
        is_int = x.dtype in INT_TYPES
        if (is_int and int_op is None) or (not is_int and (x.dtype != F32 or not row_op)):
            raise _Unsupported  # another element type: the twin
        x = np.asarray(x, order="C")
        if x.size == 0:
            raise _Unsupported  # identities and Mean's 0 / 0: the twin's
        red = _reduce_axes(op_type, ctx, x, axes_input, axes, noop_with_empty_axes)
        if red is None:
            raise _Unsupported  # noop_with_empty_axes: the twin's pre-steps
        t = _threads(ctx)
        target = None if out is None else out.reshape(-1)
        mid = None if is_int or row_op == "log_sum_exp" else _middle(x.shape, red)
        if mid is not None:  # the columns reduced in place, no transposed copy
            if pre == "abs":
                x = _native().unary_f32_ex("abs", x, t)
            outer, d, inner = mid
            target = None if out is None else out.reshape(outer, inner)
            y = _finish(_native().reduce_middle_f32, row_op, post, x.reshape(mid), d, t, target)
            out_shape = tuple(1 if a in red else n for a, n in enumerate(x.shape))
            if not keepdims:
                out_shape = tuple(n for a, n in enumerate(x.shape) if a not in red)
            return out if out is not None else y.reshape(out_shape)
        rows, kept_shape = _rows(ctx, x, red)
        out_shape = tuple(1 if a in red else n for a, n in enumerate(x.shape)) if keepdims else kept_shape
        if is_int:
            y = _native().reduce_rows_int(int_op, rows, t, target)
        else:
            if pre == "abs":
                rows = _native().unary_f32_ex("abs", rows, t)
            y = _reduce_rows(row_op, post, rows, t, target)
        return out if out is not None else y.reshape(out_shape)

    run.__name__ = run.__qualname__ = f"_{op_type.lower()}_native"
    return run


def _trailing_rows_call(
    row_op: str,
    post: str | None,
    sig: Specialization,
    red: tuple[int, ...],
    keepdims: int,
    int_op: str | None = None,
) -> Any:
    """One x shape reduced over ``red`` when those are its trailing axes (the rows are x
    itself: the global average of NCHW) with no pre-step: rows, output shape and divisor
    found once, the rows reduced straight into the planned output, the post-step in place
    (``int_op``: an integer reduction). Adjacent float axes that are not the trailing ones
    take :func:`_middle_call`; None for the others (the rows need a transposed copy: the
    generic call)."""
    shape = sig.shapes[0]
    assert shape is not None
    kept = [a for a in range(len(shape)) if a not in red]
    if not _trailing(tuple(shape), red):
        return _middle_call(row_op, post, sig, red, keepdims) if int_op is None else None
    kept_shape = tuple(shape[a] for a in kept)
    r, d = math.prod(kept_shape), math.prod(shape[a] for a in red)
    out_shape = tuple(1 if a in red else n for a, n in enumerate(shape)) if keepdims else kept_shape
    threads, out = step_threads(sig, r * d), sig.out
    target = None if out is None else out.reshape(r)

    if int_op is not None:
        reduce_int = _native().reduce_rows_int

        def call_int(x: np.ndarray, *rest: Any) -> np.ndarray:
            y = reduce_int(int_op, x.reshape(r, d), threads, target)
            return out if out is not None else y.reshape(out_shape)

        return call_int

    if post in (None, "mean") and row_op != "log_sum_exp":
        # _reduce_rows's two calls with the kernel and f32(D) looked up once (a
        # ReduceMean over one value was 3 us)
        reduce_rows, divisor = _native().reduce_rows_f32, F32.type(d)
        divide = np.divide if post == "mean" else None

        def call_rows(x: np.ndarray, *rest: Any) -> np.ndarray:
            y = reduce_rows(row_op, x.reshape(r, d), threads, target)
            if divide is not None:
                divide(y, divisor, out=y)  # f32(s / f32(D)), one IEEE division per row
            return out if out is not None else y.reshape(out_shape)

        return call_rows

    def call(x: np.ndarray, *rest: Any) -> np.ndarray:
        y = _reduce_rows(row_op, post, x.reshape(r, d), threads, target)
        return out if out is not None else y.reshape(out_shape)

    return call


def _middle_call(
    row_op: str, post: str | None, sig: Specialization, red: tuple[int, ...], keepdims: int
) -> Any:
    """One x shape reduced over adjacent axes that are not the trailing ones: the slabs
    [outer, D, inner] reduced in place (``reduce_middle_f32``) straight into the planned
    output; None for other axes (the generic call's transposed copy)."""
    shape = sig.shapes[0]
    assert shape is not None
    mid = None if row_op == "log_sum_exp" else _middle(tuple(shape), red)
    if mid is None:
        return None
    outer, d, inner = mid
    kept_shape = tuple(n for a, n in enumerate(shape) if a not in red)
    out_shape = tuple(1 if a in red else n for a, n in enumerate(shape)) if keepdims else kept_shape
    threads, out = step_threads(sig, outer * d * inner), sig.out
    target = None if out is None else out.reshape(outer, inner)
    reduce = _native().reduce_middle_f32

    def call(x: np.ndarray, *rest: Any) -> np.ndarray:
        y = _finish(reduce, row_op, post, x.reshape(mid), d, threads, target)
        return out if out is not None else y.reshape(out_shape)

    return call


def _reduce_specializer(op_type: str, fn: Any) -> Any:
    """The reduction of one x shape whose reduced axes are the trailing ones (or adjacent
    ones, float32) and need no pre-step (:func:`_trailing_rows_call`), the axes found
    once."""
    row_op, pre, post = REDUCE_OPS.get(op_type, ("", None, None))
    int_op = INT_REDUCE_OPS.get(op_type)

    def specialize(
        sig: Specialization, *, axes: list | None = None, keepdims: int = 1, noop_with_empty_axes: int = 0
    ) -> Any:
        shape, dt = sig.shapes[0], sig.dtypes[0]
        if shape is None or math.prod(shape) == 0:
            return None
        if dt == F32:
            if pre is not None or not row_op:
                return None
        elif dt not in INT_TYPES or int_op is None:
            return None
        if len(sig.shapes) > 1 and sig.shapes[1] is not None and sig.consts[1] is None:
            return None  # axes computed at run time
        axes_input = sig.consts[1] if len(sig.consts) > 1 else None
        red = _reduce_axes(op_type, sig.ctx, np.empty(shape, dt), axes_input, axes, noop_with_empty_axes)
        if red is None:
            return None
        call = _trailing_rows_call(row_op, post, sig, tuple(red), keepdims, int_op if dt != F32 else None)
        if call is None:
            return None
        attrs = {"axes": axes, "keepdims": keepdims, "noop_with_empty_axes": noop_with_empty_axes}
        return guarded(call, fn, attrs, sig.out, reads=1)

    return specialize


def _bind_reduce(op_type: str) -> None:
    fn = _reduce_kernel(op_type)
    specialize = _reduce_specializer(op_type, fn)
    row_op = REDUCE_OPS.get(op_type, ("",))[0]
    int_op = INT_REDUCE_OPS.get(op_type)

    def binder(model: Model, node: Node) -> tuple[Kernel | None, str]:
        del model  # unused
        dt = _dtype(node.input(0))
        if dt is None:
            name = f"{op_type.lower()}_rows"  # the element type is read at run time
        elif dt == F32 and row_op:
            name = f"{row_op}_rows_f32"
        elif dt in INT_TYPES and int_op is not None:
            name = f"{int_op}_rows_int"
        else:
            takes = ["float32"] if row_op else []
            takes += ["int32", "int64"] if int_op is not None else []
            return None, f"native {op_type} takes {' or '.join(takes)}, got {dt}"
        return Kernel(fn, "native", f"native:{name}", out=True, specialize=specialize), ""

    binder.__name__ = binder.__qualname__ = f"bind_{op_type.lower()}"
    register_binder(op_type)(binder)


for _op in {**REDUCE_OPS, **INT_REDUCE_OPS}:
    _bind_reduce(_op)


def _global_pool_kernel(op_type: str, row_op: str):
    @_with_fallback(op_type)
    def run(ctx: Any, x: Any, *, out: Any) -> np.ndarray:
        x = _f32(x)
        if x.ndim < 3 or x.size == 0:
            raise _Unsupported  # the twin's NumPy path
        d = int(np.prod(x.shape[2:], dtype=np.int64))
        rows = x.reshape(-1, d)
        out_shape = x.shape[:2] + (1,) * (x.ndim - 2)
        target = None if out is None or row_op != "max" else out.reshape(-1)
        y = _native().reduce_rows_f32(row_op, rows, _threads(ctx), target)
        if row_op == "sum":
            np.divide(y, F32.type(d), out=y)  # f32(s / f32(D)), one IEEE division per row
        if out is None:
            return y.reshape(out_shape)
        if target is None:
            np.copyto(out, y.reshape(out_shape))
        return out

    run.__name__ = run.__qualname__ = f"_{op_type.lower()}_native"
    return run


def _global_pool_specializer(row_op: str, fn: Any) -> Any:
    """The global pool of one x shape: ReduceMean / ReduceMax over the spatial axes, the
    trailing ones (:func:`_trailing_rows_call`; the generic call's reshapes, product and
    copy cost twice the kernel on a squeeze-excitation block's [1, 256, 7, 7])."""

    def specialize(sig: Specialization) -> Any:
        shape = sig.shapes[0]
        if shape is None or sig.dtypes[0] != F32 or len(shape) < 3 or math.prod(shape) == 0:
            return None
        post = "mean" if row_op == "sum" else None
        call = _trailing_rows_call(row_op, post, sig, tuple(range(2, len(shape))), keepdims=1)
        return guarded(call, fn, {}, sig.out, reads=1)

    return specialize


def _bind_global_pool(op_type: str, row_op: str) -> None:
    """GlobalAveragePool / GlobalMaxPool of float32 NC...: ReduceMean / ReduceMax over
    the spatial axes (reference/nn_pool.py), the rows being the input itself."""
    fn = _global_pool_kernel(op_type, row_op)
    specialize = _global_pool_specializer(row_op, fn)

    def binder(model: Model, node: Node) -> tuple[Kernel | None, str]:
        del model  # unused
        dt = _dtype(node.input(0))
        if dt is not None and dt != F32:
            return None, f"native {op_type} takes float32, got {dt}"
        return Kernel(fn, "native", f"native:{row_op}_rows_f32", out=True, specialize=specialize), ""

    binder.__name__ = binder.__qualname__ = f"bind_{op_type.lower()}"
    register_binder(op_type)(binder)


_bind_global_pool("GlobalAveragePool", "sum")
_bind_global_pool("GlobalMaxPool", "max")


def _ort_reduce_kernel(op_type: str):
    mean = op_type == "OrtReduceMean"

    @_with_fallback(op_type, QUANTA_DOMAIN)
    def run(ctx: Any, x: Any, *, out: Any, axes: list | None = None, keepdims: int = 1) -> np.ndarray:
        if not isinstance(x, np.ndarray) or x.dtype != F32 or x.size == 0:
            raise _Unsupported  # the twin's error or its empty rows
        rows, kept, reduced = trailing_rows(op_type, np.asarray(x, order="C"), axes)
        target = None if out is None else out.reshape(-1)
        y = _native().ort_reduce_rows_f32(rows, mean, _threads(ctx), target)
        if out is not None:
            return out
        return y.reshape(kept + (1,) * reduced if keepdims else kept)

    run.__name__ = run.__qualname__ = f"_{op_type.lower()}_native"
    return run


def _bind_ort_reduce(op_type: str) -> None:
    """quanta OrtReduceSum / OrtReduceMean: ONNX Runtime's row sums (module docstring)."""
    fn = _ort_reduce_kernel(op_type)

    def binder(model: Model, node: Node) -> tuple[Kernel | None, str]:
        del model  # unused
        dt = _dtype(node.input(0))
        if dt is not None and dt != F32:
            return None, f"native {op_type} takes float32, got {dt}"
        return Kernel(fn, "native", "native:ort_reduce_rows_f32", out=True), ""

    binder.__name__ = binder.__qualname__ = f"bind_{op_type.lower()}"
    register_binder(op_type, QUANTA_DOMAIN)(binder)


_bind_ort_reduce("OrtReduceSum")
_bind_ort_reduce("OrtReduceMean")


@_with_fallback("MlasGlobalAveragePool", QUANTA_DOMAIN)
def _mlas_global_average_pool(ctx: Any, x: Any, *, out: Any) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype != F32 or x.ndim < 3 or x.size == 0:
        raise _Unsupported  # the twin's error or its empty rows
    rows = np.ascontiguousarray(x).reshape(x.shape[0] * x.shape[1], -1)
    lib = _native()
    if hasattr(lib, "mlas_global_average_rows_f32"):
        target = None if out is None else out.reshape(-1)
        y = lib.mlas_global_average_rows_f32(rows, _threads(ctx), target)
        if out is not None:
            return out
        return y.reshape(x.shape[:2] + (1,) * (x.ndim - 2))
    # an extension built before the kernel: the twin's vector code, the same bits
    y = mlas_global_average_rows(rows).reshape(x.shape[:2] + (1,) * (x.ndim - 2))
    if out is None:
        return y
    np.copyto(out, y)
    return out


def _mlas_global_average_pool_specialized(sig: Specialization, **attrs: Any) -> Any:
    """One float32 x shape [N, C, spatial...] (rank >= 3, not empty): the rows [N·C, H·W...]
    averaged straight into the planned output by one ``mlas_global_average_rows_f32`` call,
    which a native program records (a NumPy step between recorded ones splits the program,
    and the thread pool's wake-up after it cost g2pid_bert's written-out norms more than
    their sums). None: the generic call."""
    shape = sig.shapes[0]
    lib = _native()
    if shape is None or len(shape) < 3 or sig.dtypes[0] != F32 or 0 in shape:
        return None
    if not hasattr(lib, "mlas_global_average_rows_f32"):
        return None
    r, n = shape[0] * shape[1], math.prod(shape[2:])
    out_shape = tuple(shape[:2]) + (1,) * (len(shape) - 2)
    threads, out = step_threads(sig, r * n), sig.out
    target = None if out is None else out.reshape(r)
    rows_mean = lib.mlas_global_average_rows_f32

    def run(x: np.ndarray, *rest: Any) -> np.ndarray:
        if not x.flags.c_contiguous:
            # a reshape would copy, and a recorded call would read the copy: the generic call
            raise ValueError("MlasGlobalAveragePool: x is not C-contiguous")
        y = rows_mean(x.reshape(r, n), threads, target)
        return out if out is not None else y.reshape(out_shape)

    return guarded(run, _mlas_global_average_pool, attrs, out, reads=1, recordable=True)


@register_binder("MlasGlobalAveragePool", QUANTA_DOMAIN)
def bind_mlas_global_average_pool(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta MlasGlobalAveragePool: MLAS's global pooling order (GP1)-(GP3), the C++ row
    kernel ``mlas_global_average_rows_f32`` (tensor_ops/ort_reduce.h), bit for bit the
    twin's ``mlas_global_average_rows``."""
    del model  # unused
    dt = _dtype(node.input(0))
    if dt is not None and dt != F32:
        return None, f"native MlasGlobalAveragePool takes float32, got {dt}"
    kernel = Kernel(_mlas_global_average_pool, "native", "native:mlas_global_average_rows_f32", out=True)
    kernel.specialize = _mlas_global_average_pool_specialized
    return kernel, ""


class _AveragePlan:
    """One AveragePool input shape: the geometry (the twin's conv_attrs), the padding the
    windows need (nn_pool's im2col pads the same way) and the count of (AP3) as float32."""

    def __init__(self, shape: tuple[int, ...], geom: ConvGeometry, count_include_pad: int) -> None:
        n = len(geom.kernel_shape)
        self.pad_width: list[tuple[int, int]] = [(0, 0), (0, 0)]
        for i in range(n):
            need = (
                (geom.out_shape[i] - 1) * geom.strides[i] + geom.dilations[i] * (geom.kernel_shape[i] - 1) + 1
            )
            have = shape[2 + i] + geom.pads[i] + geom.pads[i + n]
            self.pad_width.append((geom.pads[i], geom.pads[i + n] + max(0, need - have)))
        self.padded = tuple(d + a + b for d, (a, b) in zip(shape, self.pad_width))
        self.inner = tuple(slice(a, a + d) for d, (a, _) in zip(shape, self.pad_width))
        self.geom = geom
        self.k = math.prod(geom.kernel_shape)
        self.out_shape = tuple(shape[:2]) + tuple(geom.out_shape)
        self.count = np.ascontiguousarray(average_pool_count(shape, geom, count_include_pad), F32)
        self.count_include_pad = bool(count_include_pad)
        # 1-D and 2-D windows: average_pool_2d_f32's (h, w) pairs, a 1-D pool being one row
        self.pairs: tuple[tuple[int, int], ...] | None = None
        if n <= 2:
            g = geom
            self.pairs = tuple(
                _pair(v, fill)
                for v, fill in (
                    (g.kernel_shape, 1),
                    (g.strides, 1),
                    (g.dilations, 1),
                    (g.pads[:n], 0),
                    (g.pads[n:], 0),
                    (g.out_shape, 1),
                )
            )

    def run_2d(self, x: np.ndarray, threads: int, out: np.ndarray | None) -> np.ndarray:
        """1-D and 2-D windows: one average_pool_2d_f32 call (a 1-D pool over one row)."""
        assert self.pairs is not None
        kernel, strides, dilations, begin, end, out_hw = self.pairs
        y = _native().average_pool_2d_f32(
            _as_2d(x),
            kernel,
            strides,
            dilations,
            begin,
            end,
            out_hw,
            self.count_include_pad,
            threads,
            None if out is None else out.reshape(x.shape[:2] + out_hw),
        )
        return out if out is not None else y.reshape(self.out_shape)

    def windows(self, x: np.ndarray) -> np.ndarray:
        """(N, C, *out, *kernel): a strided view of x, or of its zero-padded copy."""
        if any(w != (0, 0) for w in self.pad_width):
            xp = np.zeros(self.padded, F32)
            np.copyto(xp[self.inner], x)
            x = xp
        g, st = self.geom, x.strides[2:]
        shape = self.out_shape + tuple(g.kernel_shape)
        strides = (
            x.strides[:2]
            + tuple(s * t for s, t in zip(st, g.strides))
            + tuple(s * d for s, d in zip(st, g.dilations))
        )
        return np.lib.stride_tricks.as_strided(x, shape, strides, writeable=False)


@_with_fallback("AveragePool")
def _average_pool_native(
    ctx: Any,
    x: Any,
    *,
    out: Any,
    plans: BoundedCache,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    count_include_pad: int = 0,
    dilations: list[int] | None = None,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """AveragePool, float32 (nn_pool.average_pool, (AP1)-(AP3)): the windows as rows, their
    sum16, one division by the count."""
    x = _f32(x)
    if x.ndim < 3 or x.size == 0 or kernel_shape is None:
        raise _Unsupported  # the twin's NumPy path or error

    def build() -> _AveragePlan:
        geom = conv_attrs(
            x.shape,
            None,
            kernel_shape=kernel_shape,
            strides=strides,
            dilations=dilations,
            pads=pads,
            auto_pad=auto_pad,
            ceil_mode=bool(ceil_mode),
        )
        return _AveragePlan(x.shape, geom, count_include_pad)

    plan = plans.get(x.shape, build)
    n, t = _native(), _threads(ctx)
    if plan.pairs is not None:
        return plan.run_2d(np.ascontiguousarray(x), t, out)
    rows = n.copy_strided(plan.windows(x), t).reshape(-1, plan.k)
    s = n.reduce_rows_f32("sum", rows, t).reshape(plan.out_shape)  # (AP1), (AP2)
    return n.binary_f32("div", s, plan.count, t, out)  # (AP3)


@register_binder("AveragePool")
def bind_average_pool(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 AveragePool, any number of spatial axes (the PP-OCR recognizers' [3, 2] pool)."""
    del model  # unused
    dt = _dtype(node.input(0))
    if dt is not None and dt != F32:
        return None, f"native AveragePool takes float32, got {dt}"
    if node.attrs.get("kernel_shape") is None:
        return None, "AveragePool without kernel_shape (the twin raises)"
    return Kernel(
        _average_pool_native,
        "native",
        "native:average_pool_f32",
        params={"plans": BoundedCache()},
        out=True,
        specialize=_average_pool_specialized,
    ), ""


def _average_pool_specialized(sig: Specialization, **attrs: Any) -> Any:
    """One x shape of 1-D or 2-D windows: the plan (geometry, pads, counts) made once and
    average_pool_2d_f32 called positionally into the planned output (a selector's [2, 1]
    pool over [1, 64, 2, 8] spent most of its 5 µs finding the plan in its cache)."""
    shape = sig.shapes[0]
    kernel_shape = attrs.get("kernel_shape")
    if shape is None or sig.dtypes[0] != F32 or len(shape) < 3 or 0 in shape or kernel_shape is None:
        return None
    geom = conv_attrs(
        shape,
        None,
        kernel_shape=kernel_shape,
        strides=attrs.get("strides"),
        dilations=attrs.get("dilations"),
        pads=attrs.get("pads"),
        auto_pad=attrs.get("auto_pad", "NOTSET"),
        ceil_mode=bool(attrs.get("ceil_mode", 0)),
    )
    plan = _AveragePlan(tuple(shape), geom, attrs.get("count_include_pad", 0))
    if plan.pairs is None:
        return None
    kernel, strides, dilations, begin, end, out_hw = plan.pairs
    include, threads, out = plan.count_include_pad, step_threads(sig), sig.out
    pool = _native().average_pool_2d_f32
    target = None if out is None else out.reshape(tuple(shape[:2]) + out_hw)
    out_shape = plan.out_shape

    def call(x: np.ndarray) -> np.ndarray:
        y = pool(_as_2d(x), kernel, strides, dilations, begin, end, out_hw, include, threads, target)
        return out if out is not None else y.reshape(out_shape)

    return guarded(call, _average_pool_native, {"plans": BoundedCache(), **attrs}, out, recordable=True)
