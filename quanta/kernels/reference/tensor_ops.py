"""Tensor-manipulation reference ops (ai.onnx): shape views, indexing, scatter, generators.

Ops whose operands moved from attributes to inputs across opsets read whichever the
node has: Squeeze/Unsqueeze ``axes`` (attribute before opset 13, input from 13), Split
``split`` (attribute before 13, input from 13, ``num_outputs`` attribute from 18). An
input argument is named ``<name>_input`` where it would clash with the attribute.

Semantics pinned here (tested in ``tests/kernels/reference/test_tensor_ops.py``):

- Slice clamps per axis after adding ``dim`` to negative values: a positive step clamps
  ``start, end`` to ``[0, dim]``; a negative step clamps ``start`` to ``[0, dim-1]`` and
  ``end`` to ``[-1, dim-1]``, where ``end = -1`` means "through index 0" (so
  ``starts=[-1], ends=[INT64_MIN], steps=[-1]`` reverses the axis). ONNX Runtime
  reads ``end = INT32_MAX or INT64_MAX`` as "to the end in the step's direction", so a
  negative step with such an end reaches index 0 there and gives an empty slice here
  and in onnx.reference (the spec has no such special case);
- negative indices count from the end (Gather, GatherElements, GatherND, Scatter*,
  OneHot); an index outside ``[-dim, dim-1]`` raises OpError (OneHot instead gives an
  all-``off`` row, as ONNX specifies);
- TopK orders equal values by ascending index, for ``largest=1`` and ``largest=0``;
- views (Reshape, Transpose, Squeeze, Slice, ...) may return arrays that share memory
  with their input; the registry contract forbids writing into inputs, so this is safe.
"""

from __future__ import annotations

import numpy as np

from quanta.kernels.reference.math_ops import onnx_dtype
from quanta.kernels.reference.registry import OpError, register

_INT64 = np.int64


def _axis(axis: int, rank: int, op: str) -> int:
    """Normalise an axis in ``[-rank, rank-1]`` to ``[0, rank-1]``."""
    axis = int(axis)
    if not -rank <= axis < rank:
        raise OpError(f"{op}: expected axis in [{-rank}, {rank - 1}], got {axis}")
    return axis + rank if axis < 0 else axis


def _ints(a: np.ndarray | list | None) -> list[int]:
    return [] if a is None else [int(v) for v in np.asarray(a).ravel()]


def _indices(idx: np.ndarray, dim: int, op: str) -> np.ndarray:
    """Negative indices + dim; anything still outside [0, dim) is an error."""
    idx = np.asarray(idx).astype(_INT64)
    if idx.size and (idx.min() < -dim or idx.max() >= dim):
        bad = idx[(idx < -dim) | (idx >= dim)].ravel()[0]
        raise OpError(f"{op}: expected indices in [{-dim}, {dim - 1}], got {bad}")
    return np.where(idx < 0, idx + dim, idx)


# ---------------------------------------------------------------------------------
# shape views


@register("Reshape")
def reshape(ctx, data: np.ndarray, shape: np.ndarray, allowzero: int = 0) -> np.ndarray:
    del ctx  # unused
    new = _ints(shape)
    if not allowzero:
        # 0 copies the input dimension at the same position
        new = [data.shape[i] if s == 0 else s for i, s in enumerate(new)]
    try:
        return data.reshape(new)
    except ValueError:
        raise OpError(f"Reshape: expected a shape with {data.size} elements, got {new}") from None


@register("Flatten")
def flatten(ctx, x: np.ndarray, axis: int = 1) -> np.ndarray:
    del ctx  # unused
    rank = x.ndim
    if not -rank <= axis <= rank:
        raise OpError(f"Flatten: expected axis in [{-rank}, {rank}], got {axis}")
    axis = axis + rank if axis < 0 else axis
    rows = int(np.prod(x.shape[:axis], dtype=_INT64))
    return x.reshape(rows, int(np.prod(x.shape[axis:], dtype=_INT64)))


@register("Squeeze")
def squeeze(
    ctx, data: np.ndarray, axes_input: np.ndarray | None = None, axes: list | None = None
) -> np.ndarray:
    del ctx  # unused; axes is an attribute before opset 13, an input from 13
    chosen = axes_input if axes_input is not None else axes
    if chosen is None:
        return data.reshape([d for d in data.shape if d != 1])
    dims = sorted({_axis(a, data.ndim, "Squeeze") for a in _ints(chosen)})
    for a in dims:
        if data.shape[a] != 1:
            raise OpError(f"Squeeze: expected dimension {a} to be 1, got {data.shape[a]}")
    return np.squeeze(data, axis=tuple(dims))


@register("Unsqueeze")
def unsqueeze(
    ctx, data: np.ndarray, axes_input: np.ndarray | None = None, axes: list | None = None
) -> np.ndarray:
    del ctx  # unused; axes is an attribute before opset 13, an input from 13
    chosen = _ints(axes_input if axes_input is not None else axes)
    rank = data.ndim + len(chosen)
    dims = [_axis(a, rank, "Unsqueeze") for a in chosen]
    if len(set(dims)) != len(dims):
        raise OpError(f"Unsqueeze: expected distinct axes, got {chosen}")
    return np.expand_dims(data, tuple(dims))


@register("Transpose")
def transpose(ctx, data: np.ndarray, perm: list | None = None) -> np.ndarray:
    del ctx  # unused
    if perm is None:
        perm = list(range(data.ndim))[::-1]
    if sorted(perm) != list(range(data.ndim)):
        raise OpError(f"Transpose: expected perm to be a permutation of 0..{data.ndim - 1}, got {perm}")
    # A contiguous result, not NumPy's strided view: later float reductions (np.mean in
    # GlobalAveragePool, np.sum) sum in an order that depends on the memory layout, so a
    # view would make the golden's bits depend on how the data happens to be stored
    # (the native Transpose writes a contiguous tensor).
    return np.ascontiguousarray(np.transpose(data, perm))


@register("TransposeView", "quanta")
def transpose_view(ctx, data: np.ndarray, *, perm: list) -> np.ndarray:
    """quanta TransposeView: ``np.transpose(data, perm)`` as the strided view, no copy.
    Only integer GEMMs read it (passes/lower/transpose_view.py), whose sums are exact in
    any order, so the layout cannot change a bit (unlike Transpose's float readers)."""
    del ctx  # unused
    if sorted(perm) != list(range(data.ndim)):
        raise OpError(f"TransposeView: expected perm to be a permutation of 0..{data.ndim - 1}, got {perm}")
    return np.transpose(data, perm)


@register("RelabelCodes", "quanta")
def relabel_codes(ctx, data: np.ndarray) -> np.ndarray:
    """quanta RelabelCodes: ``data`` itself (a view, no copy). The node's output type
    gives the same codes another (scale, zero point); a table that maps every code to
    itself was the node (passes/lower/relabel_codes.py)."""
    del ctx  # unused
    return data.view()


@register("Concat")
def concat(ctx, *inputs: np.ndarray, axis: int | None = None) -> np.ndarray:
    del ctx  # unused
    if axis is None:
        raise OpError("Concat: expected attribute 'axis', got none")
    return np.concatenate(inputs, axis=_axis(axis, inputs[0].ndim, "Concat"))


@register("Split")
def split(
    ctx,
    x: np.ndarray,
    split_input: np.ndarray | None = None,
    axis: int = 0,
    split: list | None = None,
    num_outputs: int | None = None,
) -> tuple[np.ndarray, ...]:
    axis = _axis(axis, x.ndim, "Split")
    dim = x.shape[axis]
    sizes = _ints(split_input if split_input is not None else split)
    if not sizes:
        n = num_outputs if num_outputs is not None else ctx.n_outputs
        # Equal parts; from opset 18 the last part may be smaller: ceil(dim / n) each.
        chunk = -(-dim // n)
        sizes = [chunk] * (n - 1) + [dim - chunk * (n - 1)]
    if sum(sizes) != dim or min(sizes) < 0:
        raise OpError(f"Split: expected sizes summing to {dim}, got {sizes}")
    cuts = np.cumsum(sizes)[:-1]
    return tuple(np.split(x, cuts, axis=axis))


@register("Slice")
def slice_(
    ctx,
    data: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    axes: np.ndarray | None = None,
    steps: np.ndarray | None = None,
) -> np.ndarray:
    del ctx  # unused (opset >= 10: starts/ends/axes/steps are inputs)
    starts_, ends_ = _ints(starts), _ints(ends)
    axes_ = _ints(axes) if axes is not None else list(range(len(starts_)))
    steps_ = _ints(steps) if steps is not None else [1] * len(starts_)
    if not len(starts_) == len(ends_) == len(axes_) == len(steps_):
        raise OpError(
            f"Slice: expected starts, ends, axes, steps of one length, got "
            f"{len(starts_)}, {len(ends_)}, {len(axes_)}, {len(steps_)}"
        )
    index = [slice(None)] * data.ndim
    seen = set()
    for start, end, axis, step in zip(starts_, ends_, axes_, steps_):
        a = _axis(axis, data.ndim, "Slice")
        if a in seen:
            raise OpError(f"Slice: expected distinct axes, got {axes_}")
        seen.add(a)
        if step == 0:
            raise OpError("Slice: expected non-zero steps, got 0")
        index[a] = slice_bounds(start, end, step, data.shape[a])
    return data[tuple(index)]


def slice_bounds(start: int, end: int, step: int, dim: int) -> slice:
    """ONNX Slice clamping for one axis, as a Python slice (module docstring)."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
    start = min(max(start, 0), dim - 1)
    end = min(max(end, -1), dim - 1)
    # Python reads end = -1 as "the last element"; None means "through index 0".
    return slice(start, None if end < 0 else end, step)


@register("Expand")
def expand(ctx, x: np.ndarray, shape: np.ndarray) -> np.ndarray:
    del ctx  # unused
    try:
        out_shape = np.broadcast_shapes(x.shape, tuple(_ints(shape)))
    except ValueError:
        raise OpError(f"Expand: expected a shape broadcastable with {x.shape}, got {_ints(shape)}") from None
    return np.broadcast_to(x, out_shape).copy()


@register("Tile")
def tile(ctx, x: np.ndarray, repeats: np.ndarray) -> np.ndarray:
    del ctx  # unused
    reps = _ints(repeats)
    if len(reps) != x.ndim:
        raise OpError(f"Tile: expected {x.ndim} repeats, got {len(reps)}")
    return np.tile(x, reps)


@register("Shape")
def shape(ctx, data: np.ndarray, start: int = 0, end: int | None = None) -> np.ndarray:
    del ctx  # unused; start/end exist from opset 15, Python slicing clamps as ONNX does
    return np.array(data.shape[start:end], dtype=_INT64)


@register("Size")
def size(ctx, data: np.ndarray) -> np.ndarray:
    del ctx  # unused
    return np.array(data.size, dtype=_INT64)


# ---------------------------------------------------------------------------------
# indexing


@register("Gather")
def gather(ctx, data: np.ndarray, indices: np.ndarray, axis: int = 0) -> np.ndarray:
    del ctx  # unused
    axis = _axis(axis, data.ndim, "Gather")
    return np.asarray(np.take(data, _indices(indices, data.shape[axis], "Gather"), axis=axis))


@register("GatherElements")
def gather_elements(ctx, data: np.ndarray, indices: np.ndarray, axis: int = 0) -> np.ndarray:
    del ctx  # unused
    axis = _axis(axis, data.ndim, "GatherElements")
    idx = _indices(indices, data.shape[axis], "GatherElements")
    if idx.ndim != data.ndim or any(
        i > d for k, (i, d) in enumerate(zip(idx.shape, data.shape, strict=True)) if k != axis
    ):
        raise OpError(
            f"GatherElements: expected indices of data's rank, no larger than {data.shape} off axis {axis}, "
            f"got {idx.shape}"
        )
    # indices smaller than data off the axis read data at the same coordinates
    window = tuple(slice(None) if k == axis else slice(0, i) for k, i in enumerate(idx.shape))
    return np.take_along_axis(data[window], idx, axis=axis)


@register("GatherND")
def gather_nd(ctx, data: np.ndarray, indices: np.ndarray, batch_dims: int = 0) -> np.ndarray:
    del ctx  # unused
    b, m = batch_dims, indices.shape[-1]
    if data.shape[:b] != indices.shape[:b] or b + m > data.ndim:
        raise OpError(
            f"GatherND: expected indices of shape {data.shape[:b]} + (..., <= {data.ndim - b}), "
            f"got {indices.shape}"
        )
    batch = int(np.prod(data.shape[:b], dtype=_INT64))
    flat_data = data.reshape((batch, *data.shape[b:]))
    flat_idx = indices.reshape(batch, -1, m)
    coords = [_indices(flat_idx[..., k], data.shape[b + k], "GatherND") for k in range(m)]
    rows = np.arange(batch)[:, None]
    out = flat_data[(rows, *coords)]
    return out.reshape(indices.shape[:-1] + data.shape[b + m :])


_REDUCTIONS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter(out: np.ndarray, where: tuple, updates: np.ndarray, reduction: str, op: str) -> np.ndarray:
    if reduction == "none":
        out[where] = updates  # duplicate indices: undefined in ONNX; the last one wins
    elif reduction in _REDUCTIONS:
        _REDUCTIONS[reduction].at(out, where, updates)
    else:
        raise OpError(f"{op}: expected reduction in none/add/mul/max/min, got {reduction!r}")
    return out


def scatter_positions(data_shape: tuple[int, ...], indices: np.ndarray, axis: int, op: str) -> np.ndarray:
    """ScatterElements' target of every update as a flat position in data (int64, the
    indices' C order): the update's own coordinates with the one along ``axis`` replaced
    by its index (negative ones counted from the end; out of range raises)."""
    where = list(np.indices(indices.shape, sparse=True))
    where[axis] = _indices(indices, data_shape[axis], op)
    return np.ravel_multi_index(tuple(np.broadcast_arrays(*where)), data_shape).astype(_INT64).reshape(-1)


def scatter_in_order(out: np.ndarray, positions: np.ndarray, updates: np.ndarray, ufunc: np.ufunc) -> None:
    """out.flat[p_i] = ufunc(out.flat[p_i], u_i) for i = 0, 1, … in order (float32: a sum
    into one position is sequential in the updates' C order, (SC1)). Applied in rounds,
    round r taking every position's r-th update: no position twice in a round, so each
    round is one fancy-indexed ufunc call, and np.add.at's order (unstated) is not used."""
    flat = out.reshape(-1)
    if positions.size == 0:
        return
    order = np.argsort(positions, kind="stable")  # by position, then by i
    sorted_pos = positions[order]
    first = np.flatnonzero(np.r_[True, sorted_pos[1:] != sorted_pos[:-1]])  # each position's run
    count = np.diff(np.r_[first, sorted_pos.size])
    by_count = np.argsort(-count, kind="stable")  # the positions with the most updates first
    first, count = first[by_count], count[by_count]
    for r in range(int(count[0])):
        k = int(np.searchsorted(-count, -r, side="left"))  # the positions with more than r updates
        sel = order[first[:k] + r]
        flat[positions[sel]] = ufunc(flat[positions[sel]], updates[sel])


@register("ScatterElements")
@register("Scatter")  # deprecated since opset 11; the same as ScatterElements
def scatter_elements(
    ctx, data: np.ndarray, indices: np.ndarray, updates: np.ndarray, axis: int = 0, reduction: str = "none"
) -> np.ndarray:
    """float32 with reduction add / mul: the updates combine into their positions in the
    indices' C order, one float32 operation each (docs/float-ops.md (SC1))."""
    op = ctx.op_type or "ScatterElements"
    axis = _axis(axis, data.ndim, op)
    if indices.shape != updates.shape:
        raise OpError(f"{op}: expected updates of the indices' shape {indices.shape}, got {updates.shape}")
    if data.dtype == np.float32 and updates.dtype == np.float32 and reduction in ("add", "mul"):
        out = np.array(data, order="C")
        positions = scatter_positions(data.shape, indices, axis, op)
        scatter_in_order(out, positions, updates.reshape(-1), _REDUCTIONS[reduction])
        return out
    where = list(np.indices(indices.shape, sparse=True))
    where[axis] = _indices(indices, data.shape[axis], op)
    return _scatter(data.copy(), tuple(where), updates, reduction, op)


@register("ScatterND")
def scatter_nd(
    ctx, data: np.ndarray, indices: np.ndarray, updates: np.ndarray, reduction: str = "none"
) -> np.ndarray:
    """Float reductions apply the update rows in index order, each row's elements in C
    order, one operation each (docs/float-ops.md (SC2)), so updates that meet at one
    position combine in a stated order; np.ufunc.at's order is not stated."""
    del ctx  # unused
    m = indices.shape[-1]
    flat_idx = indices.reshape(-1, m)
    where = tuple(_indices(flat_idx[:, k], data.shape[k], "ScatterND") for k in range(m))
    flat_updates = updates.reshape((flat_idx.shape[0], *data.shape[m:]))
    if data.dtype.kind == "f" and reduction in _REDUCTIONS:
        out = np.array(data, order="C")
        rows = np.ravel_multi_index(where, data.shape[:m]).astype(_INT64)
        slice_size = int(np.prod(data.shape[m:], dtype=np.int64))
        positions = (rows[:, None] * slice_size + np.arange(slice_size, dtype=_INT64)).reshape(-1)
        scatter_in_order(out, positions, flat_updates.reshape(-1), _REDUCTIONS[reduction])
        return out
    return _scatter(data.copy(), where, flat_updates, reduction, "ScatterND")


@register("Compress")
def compress(ctx, x: np.ndarray, condition: np.ndarray, axis: int | None = None) -> np.ndarray:
    del ctx  # unused; a condition shorter than the axis selects only among its length
    if axis is None:
        return np.compress(condition.ravel(), x.ravel())
    return np.compress(condition.ravel(), x, axis=_axis(axis, x.ndim, "Compress"))


@register("NonZero")
def nonzero(ctx, x: np.ndarray) -> np.ndarray:
    del ctx  # unused
    if x.ndim == 0:  # numpy 2 refuses 0-d nonzero; a scalar has rank 0 -> 0 rows
        return np.zeros((0, int(bool(x))), dtype=_INT64)
    return np.array(np.nonzero(x), dtype=_INT64).reshape(x.ndim, -1)


@register("TopK")
def topk(
    ctx, x: np.ndarray, k: np.ndarray, axis: int = -1, largest: int = 1, sorted: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    del ctx, sorted  # unused; sorted=0 leaves the order unspecified, sorted is valid
    axis = _axis(axis, x.ndim, "TopK")
    kk = int(np.asarray(k).ravel()[0])
    n = x.shape[axis]
    if not 0 <= kk <= n:
        raise OpError(f"TopK: expected k in [0, {n}], got {kk}")
    moved = np.moveaxis(x, axis, -1)
    if largest:
        # Stable descending order with ties by ascending index: stable-sort the reversed
        # axis ascending, then read that order backwards and map indices back.
        order = n - 1 - np.argsort(moved[..., ::-1], axis=-1, kind="stable")[..., ::-1]
    else:
        order = np.argsort(moved, axis=-1, kind="stable")
    order = order[..., :kk]
    values = np.take_along_axis(moved, order, axis=-1)
    return np.moveaxis(values, -1, axis), np.moveaxis(order.astype(_INT64), -1, axis)


@register("ReverseSequence")
def reverse_sequence(
    ctx, x: np.ndarray, sequence_lens: np.ndarray, batch_axis: int = 1, time_axis: int = 0
) -> np.ndarray:
    del ctx  # unused
    out = x.copy()
    for b, n in enumerate(_ints(sequence_lens)):
        src = [slice(None)] * x.ndim
        src[batch_axis] = b
        src[time_axis] = slice(0, n)
        dst = list(src)
        dst[time_axis] = slice(n - 1, None, -1) if n > 0 else slice(0, 0)
        out[tuple(src)] = x[tuple(dst)]
    return out


# ---------------------------------------------------------------------------------
# generators


@register("Constant")
def constant(ctx, **attributes) -> np.ndarray:
    del ctx  # unused
    if len(attributes) != 1:
        raise OpError(f"Constant: expected exactly one value attribute, got {sorted(attributes)}")
    ((name, value),) = attributes.items()
    if name == "value":
        return np.asarray(value)
    if name == "sparse_value":
        return _dense(value)
    kinds = {
        "value_float": np.float32,
        "value_floats": np.float32,
        "value_int": _INT64,
        "value_ints": _INT64,
        "value_string": object,
        "value_strings": object,
    }
    if name not in kinds:
        raise OpError(f"Constant: expected one of value, sparse_value, {', '.join(kinds)}, got {name}")
    return np.array(value, dtype=kinds[name])


def _dense(sparse) -> np.ndarray:
    """A SparseTensorProto (or an already dense array) as a dense array."""
    if isinstance(sparse, np.ndarray):
        return sparse
    from onnx import numpy_helper  # only sparse constants need onnx here

    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices).astype(_INT64)
    dims = tuple(sparse.dims)
    out = np.zeros(int(np.prod(dims, dtype=_INT64)), dtype=values.dtype)
    if indices.ndim == 2:  # coordinates [nnz, rank] -> linear indices
        indices = np.ravel_multi_index(tuple(indices.T), dims)
    out[indices] = values
    return out.reshape(dims)


@register("ConstantOfShape")
def constant_of_shape(ctx, shape: np.ndarray, value: np.ndarray | None = None) -> np.ndarray:
    del ctx  # unused
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value)
    if fill.size != 1:
        raise OpError(f"ConstantOfShape: expected a one-element value, got {fill.size} elements")
    return np.full(_ints(shape), fill.ravel()[0], dtype=fill.dtype)


@register("Range")
def range_(ctx, start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """output[i] = start + i * delta for i < max(ceil((limit - start) / delta), 0).

    Computed as a product in the element type, not by the spec function body's running
    sum (``prev + delta``): the two agree exactly for integers and differ by the running
    sum's accumulated rounding for floats.
    """
    del ctx  # unused
    # the spec says scalars; a one-element tensor (AffineGrid's own function body makes a
    # [1] limit) is read as its element, as onnx.reference and ONNX Runtime read it
    for name, a in (("start", start), ("limit", limit), ("delta", delta)):
        if np.size(a) != 1:
            raise OpError(f"Range: expected a scalar {name}, got shape {list(np.shape(a))}")
    start, limit, delta = (np.asarray(a).reshape(()) for a in (start, limit, delta))
    dtype = start.dtype
    if np.issubdtype(dtype, np.integer):
        s, lim, d = int(start), int(limit), int(delta)
        if d == 0:
            raise OpError("Range: expected a non-zero delta, got 0")
        n = max(-((s - lim) // d), 0)  # ceil((lim - s) / d) in integers
    else:
        s, lim, d = float(start), float(limit), float(delta)
        if d == 0:
            raise OpError("Range: expected a non-zero delta, got 0")
        n = max(int(np.ceil((lim - s) / d)), 0)
    return (np.asarray(start, dtype) + np.arange(n, dtype=dtype) * np.asarray(delta, dtype)).astype(dtype)


@register("OneHot")
def one_hot(ctx, indices: np.ndarray, depth: np.ndarray, values: np.ndarray, axis: int = -1) -> np.ndarray:
    del ctx  # unused
    d = int(np.asarray(depth).ravel()[0])
    axis = _axis(axis, indices.ndim + 1, "OneHot")
    idx = np.asarray(indices).astype(_INT64)
    idx = np.where(idx < 0, idx + d, idx)  # out of range afterwards: a row of "off"
    hot = np.arange(d) == idx[..., None]
    off, on = values.ravel()[0], values.ravel()[1]
    return np.moveaxis(np.where(hot, on, off).astype(values.dtype), -1, axis)


@register("EyeLike")
def eye_like(ctx, x: np.ndarray, dtype: int | None = None, k: int = 0) -> np.ndarray:
    del ctx  # unused
    if x.ndim != 2:
        raise OpError(f"EyeLike: expected a rank-2 input, got rank {x.ndim}")
    out_dtype = x.dtype if dtype is None else onnx_dtype(dtype, "EyeLike")
    return np.eye(x.shape[0], x.shape[1], k=k, dtype=out_dtype)


@register("Trilu")
def trilu(ctx, x: np.ndarray, k: np.ndarray | None = None, upper: int = 1) -> np.ndarray:
    del ctx  # unused
    kk = 0 if k is None else int(np.asarray(k).ravel()[0])
    return np.triu(x, kk) if upper else np.tril(x, kk)


def _cumulative(
    ufunc: np.ufunc, identity: int, op: str, x: np.ndarray, axis: np.ndarray, exclusive: int, reverse: int
) -> np.ndarray:
    a = _axis(int(np.asarray(axis).ravel()[0]), x.ndim, op)
    src = np.flip(x, a) if reverse else x
    out = ufunc.accumulate(src, axis=a, dtype=x.dtype)
    if exclusive:
        # shift by one along the axis, starting from the identity (0 for sum, 1 for prod)
        head = [slice(None)] * x.ndim
        head[a] = slice(0, 1)
        body = [slice(None)] * x.ndim
        body[a] = slice(0, -1)
        first = np.full_like(out[tuple(head)], identity)
        out = np.concatenate([first, out[tuple(body)]], axis=a)
    return np.flip(out, a) if reverse else out


@register("CumSum")
def cumsum(ctx, x: np.ndarray, axis: np.ndarray, exclusive: int = 0, reverse: int = 0) -> np.ndarray:
    del ctx  # unused
    return _cumulative(np.add, 0, "CumSum", x, axis, exclusive, reverse)


@register("CumProd")
def cumprod(ctx, x: np.ndarray, axis: np.ndarray, exclusive: int = 0, reverse: int = 0) -> np.ndarray:
    del ctx  # unused (opset 26)
    return _cumulative(np.multiply, 1, "CumProd", x, axis, exclusive, reverse)
