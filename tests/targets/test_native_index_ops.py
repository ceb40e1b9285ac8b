"""The native index and running-sum binders (quanta/targets/native/index_ops.py;
kernels/cpp/tensor_ops/index_ops.h) and the float64 lanes of the binary ops and Neg,
against their reference twins, byte for byte (signs of zeros included), on every ISA,
1 and 2 threads, with and without ``out=`` (``run_both``); a run-time hand-over to the
twin fails the test. Shapes are odd and include empty ones; indices are negative as
well as positive; dtypes are every one the kernels take.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quanta.kernels import _native
from quanta.kernels.reference.registry import get_op
from quanta.targets.base import KernelContext
from quanta.targets.native.float_ops import RUNTIME_FALLBACKS
from tests.targets.test_native_tensor_ops import assert_bit_exact, bind, floats, run_both

DTYPES = [np.float32, np.float64, np.int32, np.int64]


def values(rng: np.random.Generator, shape: tuple, dtype) -> np.ndarray:
    """float: normal values with IEEE specials; int: the type's range edges included,
    so the integer sums wrap."""
    if np.dtype(dtype).kind == "f":
        return floats(rng, shape).astype(dtype)
    info = np.iinfo(dtype)
    x = rng.integers(-50, 50, shape).astype(dtype)
    flat = x.reshape(-1)
    if flat.size:
        k = rng.integers(0, flat.size, size=max(1, flat.size // 4))
        flat[k] = rng.choice(np.array([info.min, info.max, 0, -1], dtype), size=k.size)
    return x


# --------------------------------------------------------------------------------------
# CumSum
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape,axis", [((17,), 0), ((3, 7), -1), ((3, 7), 0), ((2, 17, 3), 1), ((2, 3, 7), -3)]
)
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum_matches_twin_every_axis_exclusive_reverse(dtype, shape, axis, exclusive, reverse):
    x = values(np.random.default_rng(len(shape) * 7 + exclusive), shape, dtype)
    run_both("CumSum", [x, np.array(axis, np.int64)], {"exclusive": exclusive, "reverse": reverse})


def test_cumsum_keeps_a_negative_zero_first_element_and_starts_exclusive_at_plus_zero():
    x = np.array([-0.0, -0.0, 1.0], np.float32)
    y = run_both("CumSum", [x, np.array(0, np.int32)])
    assert np.signbit(y[0])  # the first element itself, not 0 + x0
    y = run_both("CumSum", [x, np.array(0, np.int32)], {"exclusive": 1})
    assert not np.signbit(y[0]) and np.signbit(y[1])


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 5)])
def test_cumsum_of_an_empty_tensor(shape):
    run_both("CumSum", [np.zeros(shape, np.float32), np.array(-1, np.int64)], {"exclusive": 1})


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.sampled_from([1, 2, 3, 7, 17]), min_size=1, max_size=4),
    data=st.data(),
    dtype=st.sampled_from(DTYPES),
)
def test_cumsum_hypothesis_over_shapes_and_axes(shape, data, dtype):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    flags = {"exclusive": data.draw(st.sampled_from([0, 1])), "reverse": data.draw(st.sampled_from([0, 1]))}
    x = values(np.random.default_rng(sum(shape)), tuple(shape), dtype)
    run_both("CumSum", [x, np.array([axis], np.int64)], flags)


def test_cumsum_axis_out_of_range_raises_the_twins_error():
    kernel, _ = bind("CumSum", [np.zeros(3, np.float32), np.array(0, np.int64)])
    with pytest.raises(Exception, match="CumSum"):
        kernel.fn(KernelContext(opset=14), np.zeros(3, np.float32), np.array(1, np.int64))


# --------------------------------------------------------------------------------------
# NonZero
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.uint8, np.int32, np.int64, np.bool_])
@pytest.mark.parametrize("shape", [(17,), (3, 7), (2, 3, 17), (0,), (3, 0, 2)])
def test_nonzero_matches_twin(dtype, shape):
    rng = np.random.default_rng(len(shape))
    x = (rng.integers(0, 3, shape) * rng.integers(-2, 3, shape)).astype(dtype)
    run_both("NonZero", [x])


@pytest.mark.parametrize("fill", [0, 1])
def test_nonzero_on_all_zero_and_all_non_zero_inputs(fill):
    x = np.full((3, 7), fill, np.float32)
    y = run_both("NonZero", [x])
    assert y.shape == (2, 21 * fill)


def test_nonzero_takes_negative_zero_as_zero_and_nan_as_non_zero():
    x = np.array([-0.0, np.nan, 0.0, 1e-45], np.float32)
    y = run_both("NonZero", [x])
    assert y.tolist() == [[1, 3]]


# --------------------------------------------------------------------------------------
# OneHot
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("idx_dtype", [np.int64, np.int32, np.float32])
@pytest.mark.parametrize("val_dtype", [np.float32, np.int64, np.int32, np.float64, np.uint8])
@pytest.mark.parametrize("axis", [-1, 0, 1, -2])
def test_one_hot_matches_twin_negative_and_out_of_range_indices(idx_dtype, val_dtype, axis):
    depth = 7
    idx = np.array([[0, 3, -1, -7], [6, 7, -8, 2], [1, 1, 5, -3]], idx_dtype)  # 7 and -8: rows of off
    vals = np.array([3, 5], val_dtype)  # off 3, on 5: neither is 0 or 1
    run_both("OneHot", [idx, np.array(depth, np.int64), vals], {"axis": axis})


@pytest.mark.parametrize(
    "depth", [np.array([3.0], np.float32), np.array(17, np.int32), np.array([1], np.int64)]
)
def test_one_hot_depth_as_a_tensor_of_any_type(depth):
    idx = np.arange(-4, 13, dtype=np.int64).reshape(17)
    run_both("OneHot", [idx, depth, np.array([-1.0, 2.5], np.float32)])


def test_one_hot_of_empty_indices():
    run_both("OneHot", [np.zeros((0, 3), np.int64), np.array(4, np.int64), np.array([0, 1], np.float32)])


# --------------------------------------------------------------------------------------
# ScatterND
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize(
    "data_shape,idx",
    [
        ((17,), [[3], [-1], [0], [3], [-14]]),  # 3 and -14 meet: reductions combine in order
        ((3, 7), [[0], [-1]]),  # whole rows
        ((3, 7), [[2, 6], [0, 0], [-3, -7], [2, -1]]),  # elements, negative and repeated
        ((2, 3, 7), [[[1, 2]], [[0, -3]]]),  # [2, 1, 2] indices, slices of 7
    ],
)
def test_scatter_nd_matches_twin_every_reduction(dtype, reduction, data_shape, idx):
    rng = np.random.default_rng(len(data_shape))
    data = values(rng, data_shape, dtype)
    indices = np.array(idx, np.int64)
    m = indices.shape[-1]
    updates = values(rng, indices.shape[:-1] + data_shape[m:], dtype)
    if reduction == "none":  # duplicate indices are undefined for none: keep them distinct
        flat = indices.reshape(-1, m)
        _, first = np.unique(
            np.ravel_multi_index(tuple((flat % np.array(data_shape[:m])).T), data_shape[:m]),
            return_index=True,
        )
        indices = flat[np.sort(first)]
        updates = values(rng, (indices.shape[0], *data_shape[m:]), dtype)
    run_both("ScatterND", [data, indices, updates], {"reduction": reduction})


def _box_indices(data_shape: tuple, box: list[tuple[int, int]], negative: bool = False) -> np.ndarray:
    """Every position of ``box`` ([start, stop) per leading axis) in row-major order, as
    exported for ``cache[..., a:b] = x``; ``negative``: counted from the end."""
    idx = np.indices(tuple(b - a for a, b in box)).reshape(len(box), -1).T + np.array([a for a, _ in box])
    if negative:
        idx = idx - np.array(data_shape[: len(box)])
    return idx.reshape(*(b - a for a, b in box), len(box)).astype(np.int64)


def _bind_const_indices(data: np.ndarray, indices: np.ndarray, updates: np.ndarray):
    """The ScatterND binder with the indices a constant and data's shape known, as a
    compiled graph hands them."""
    from quanta.ir.graph import Node, Value
    from quanta.ir.types import TensorType, elem_from_numpy
    from quanta.targets.native import BINDERS

    values = [
        Value("data", TensorType(elem_from_numpy(data.dtype), data.shape)),
        Value("indices", TensorType(elem_from_numpy(indices.dtype), indices.shape), const=indices),
        Value("updates", TensorType(elem_from_numpy(updates.dtype), updates.shape)),
    ]
    return BINDERS[("", "ScatterND")](None, Node("ScatterND", values, [Value("y")], {}))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "data_shape,box,negative",
    [
        ((1, 17, 16, 33), [(0, 1), (0, 17), (3, 13), (0, 33)], False),  # GTCRN's cache window
        ((2, 1, 7, 3), [(1, 2)], False),  # one slot of a stacked state, slices of 7 x 3
        ((3, 7, 17), [(1, 3), (2, 7)], True),  # counted from the end
        ((7, 3), [(6, 7), (0, 3)], False),  # the last row, element by element
    ],
)
def test_scatter_nd_of_a_constant_box_is_a_slice_assignment_bit_for_bit(dtype, data_shape, box, negative):
    rng = np.random.default_rng(len(data_shape) + len(box))
    data = values(rng, data_shape, dtype)
    indices = _box_indices(data_shape, box, negative)
    updates = values(rng, indices.shape[:-1] + data_shape[len(box) :], dtype)
    kernel, reason = _bind_const_indices(data, indices, updates)
    assert kernel is not None and kernel.name == "native:scatter_nd_box", reason
    expected = get_op("ScatterND")(KernelContext(opset=18), data, indices, updates)
    before = RUNTIME_FALLBACKS["ScatterND"]
    for out in (None, np.empty(data_shape, dtype)):
        got = kernel.fn(KernelContext(opset=18), data, indices, updates, out=out, **kernel.params)
        assert_bit_exact(expected, got, f"box {box} out={out is not None}")
    assert RUNTIME_FALLBACKS["ScatterND"] == before


@pytest.mark.parametrize(
    "case",
    ["permuted", "gap", "duplicate", "out_of_range", "reduction"],
)
def test_scatter_nd_of_indices_that_are_not_one_box_stays_general(case):
    rng = np.random.default_rng(3)
    data = values(rng, (3, 7, 5), np.float32)
    indices = _box_indices(data.shape, [(0, 3), (2, 5)]).reshape(-1, 2)
    attrs: dict = {}
    if case == "permuted":  # the same positions in another order
        indices = indices[::-1].copy()
    elif case == "gap":  # (2, 4) missing: the rows are no box
        indices = indices[:-1]
    elif case == "duplicate":  # 9 rows over 8 positions: rows count != box size
        indices = np.concatenate([indices[:-1], indices[:1]])
    elif case == "out_of_range":
        indices = indices.copy()
        indices[0, 1] = 7
    else:
        attrs = {"reduction": "add"}
    updates = values(rng, (indices.shape[0], 5), np.float32)
    from quanta.ir.graph import Node, Value
    from quanta.ir.types import TensorType, elem_from_numpy
    from quanta.targets.native import BINDERS

    vals = [
        Value("data", TensorType(elem_from_numpy(data.dtype), data.shape)),
        Value("indices", TensorType(elem_from_numpy(indices.dtype), indices.shape), const=indices),
        Value("updates", TensorType(elem_from_numpy(updates.dtype), updates.shape)),
    ]
    kernel, _ = BINDERS[("", "ScatterND")](None, Node("ScatterND", vals, [Value("y")], attrs))
    assert kernel.name == "native:scatter_nd"
    if case not in ("out_of_range", "duplicate"):
        run_both("ScatterND", [data, indices, updates], attrs)


def test_scatter_nd_box_with_another_data_shape_at_run_time_takes_the_general_path():
    # the box was found for data [3, 7, 5]; a feed of [4, 7, 5] still scatters correctly
    rng = np.random.default_rng(4)
    data = values(rng, (3, 7, 5), np.float32)
    indices = _box_indices(data.shape, [(1, 3)])
    updates = values(rng, (2, 7, 5), np.float32)
    kernel, _ = _bind_const_indices(data, indices, updates)
    assert kernel.name == "native:scatter_nd_box"
    other = values(rng, (4, 7, 5), np.float32)
    expected = get_op("ScatterND")(KernelContext(opset=18), other, indices, updates)
    got = kernel.fn(KernelContext(opset=18), other, indices, updates, out=None, **kernel.params)
    assert_bit_exact(expected, got)


def test_scatter_nd_float_sums_combine_in_index_order():
    # 1e8 + 1 + (-1e8) in float32 is 0 in this order; np.add.at would be free to give 1
    data = np.zeros(2, np.float32)
    y = run_both(
        "ScatterND",
        [data, np.array([[1], [1], [1]], np.int64), np.array([1e8, 1.0, -1e8], np.float32)],
        {"reduction": "add"},
    )
    assert y.tolist() == [0.0, 0.0]


def test_scatter_nd_with_no_updates():
    run_both(
        "ScatterND",
        [np.ones((3, 7), np.float64), np.zeros((0, 2), np.int64), np.zeros(0, np.float64)],
        {"reduction": "add"},
    )


def test_scatter_nd_index_out_of_range_names_the_operator():
    data = np.zeros((3, 7), np.float32)
    kernel, _ = bind("ScatterND", [data, np.zeros((1, 1), np.int64), np.zeros((1, 7), np.float32)])
    with pytest.raises(Exception, match=r"ScatterND: expected indices in \[-3, 2\], got 3"):
        kernel.fn(KernelContext(opset=18), data, np.array([[3]], np.int64), np.zeros((1, 7), np.float32))


def test_scatter_nd_index_out_of_range_in_a_session_names_the_node():
    from onnx import TensorProto, helper

    import quanta

    g = helper.make_graph(
        [helper.make_node("ScatterND", ["d", "i", "u"], ["y"], name="place_phonemes")],
        "g",
        [
            helper.make_tensor_value_info("d", TensorProto.FLOAT, [3, 7]),
            helper.make_tensor_value_info("i", TensorProto.INT64, [1, 1]),
            helper.make_tensor_value_info("u", TensorProto.FLOAT, [1, 7]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 7])],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    sess = quanta.InferenceSession(model.SerializeToString())
    feed = {"d": np.zeros((3, 7), np.float32), "u": np.ones((1, 7), np.float32)}
    np.testing.assert_array_equal(sess.run(None, {**feed, "i": np.array([[-1]], np.int64)})[0][2], 1.0)
    with pytest.raises(Exception, match=r"place_phonemes.*expected indices in"):
        sess.run(None, {**feed, "i": np.array([[5]], np.int64)})


# --------------------------------------------------------------------------------------
# ArgMax, ArgMin
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.uint8, np.int32, np.int64])
@pytest.mark.parametrize(
    "shape,axis", [((17,), 0), ((3, 7), -1), ((3, 7), 0), ((2, 17, 3), 1), ((2, 3, 7), -3)]
)
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_extreme_matches_twin_ties_nan_and_select_last(op, dtype, shape, axis, keepdims, last):
    rng = np.random.default_rng(len(shape) + keepdims)
    x = rng.integers(-3, 4, shape).astype(dtype)  # few distinct values: many ties
    if np.dtype(dtype).kind == "f":
        flat = x.reshape(-1)
        flat[rng.integers(0, flat.size, 3)] = np.nan
        flat[rng.integers(0, flat.size, 3)] = -0.0
    run_both(op, [x], {"axis": axis, "keepdims": keepdims, "select_last_index": last})


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.sampled_from([1, 2, 3, 7, 17]), min_size=1, max_size=4), data=st.data())
def test_arg_extreme_hypothesis_over_shapes_and_axes(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = floats(np.random.default_rng(sum(shape)), tuple(shape))
    attrs = {
        "axis": axis,
        "keepdims": data.draw(st.sampled_from([0, 1])),
        "select_last_index": data.draw(st.sampled_from([0, 1])),
    }
    run_both(data.draw(st.sampled_from(["ArgMax", "ArgMin"])), [x], attrs)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("n", [16, 17, 35, 259, 1031])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_extreme_long_float_rows_match_twin(op, n, last):
    # float32 rows of 16 and more take the two vector passes: ties of the extreme (few
    # distinct values), ±0 as the extreme, a NaN in the first element, at the end, in a
    # vector's middle and in the scalar tail, rows all -inf, a lone extreme in the tail
    rng = np.random.default_rng(n + last)
    x = rng.integers(-3, 4, (12, n)).astype(np.float32)
    x[1] = rng.standard_normal(n).astype(np.float32)
    x[2, 0] = np.nan
    x[3, -1] = np.nan
    x[4, [5, n // 2]] = np.nan
    x[5] = np.where(rng.random(n) < 0.5, -0.0, 0.0)
    x[5, ::3] = -1.0 if op == "ArgMax" else 1.0
    x[6] = -np.inf
    x[7] = np.inf
    x[8, -1] = 9.0 if op == "ArgMax" else -9.0
    x[9] = np.nan
    x[10, -2:] = np.nan
    x[11] = rng.standard_normal(n).astype(np.float32) * 1e-40  # subnormal
    run_both(op, [x], {"axis": -1, "keepdims": 0, "select_last_index": last})
    run_both(op, [x.reshape(3, 4, n)], {"axis": 2, "keepdims": 1, "select_last_index": last})


def test_arg_extreme_empty_axis_raises_the_twins_error():
    x = np.zeros((3, 0), np.float32)
    kernel, _ = bind("ArgMax", [x])
    with pytest.raises(Exception, match="ArgMax: expected a non-empty axis"):
        kernel.fn(KernelContext(opset=13), x, axis=1)


# --------------------------------------------------------------------------------------
# Softsign, float64 Neg and binary arithmetic
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(), (17,), (3, 65), (0, 3)])
def test_softsign_matches_twin(dtype, shape):
    run_both("Softsign", [floats(np.random.default_rng(3), shape).astype(dtype)])


@pytest.mark.parametrize("shape", [(), (17,), (3, 7)])
def test_float64_neg_flips_the_sign_bit(shape):
    x = floats(np.random.default_rng(5), shape).astype(np.float64)
    y = run_both("Neg", [x])
    assert np.signbit(run_both("Neg", [np.array([0.0])]))[0]
    del y


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
@pytest.mark.parametrize("shapes", [((3, 7), (3, 7)), ((3, 1), (1, 17)), ((), (2, 3, 7)), ((17,), ())])
def test_float64_binary_ops_match_twin_with_broadcasting(op, shapes):
    rng = np.random.default_rng(len(shapes[0]) + len(shapes[1]))
    a = floats(rng, shapes[0]).astype(np.float64)
    b = floats(rng, shapes[1]).astype(np.float64)
    run_both(op, [a, b])


def test_float64_division_by_zeros_and_max_of_nan():
    a = np.array([1.0, -1.0, 0.0, np.nan, 0.0, -0.0], np.float64)
    b = np.array([0.0, 0.0, 0.0, 1.0, -0.0, 0.0], np.float64)
    for op in ("Div", "Max", "Min", "Sub"):
        run_both(op, [a, b])
        run_both(op, [b, a])


def test_kernels_refuse_bad_arguments_with_errors_naming_them():
    with pytest.raises(ValueError, match="cumsum: axis: expected an axis in"):
        _native.cumsum(np.zeros((2, 3), np.float32), 2)
    with pytest.raises(ValueError, match="cumsum: x: expected float32/64 or int32/64"):
        _native.cumsum(np.zeros(3, np.uint16), 0)
    with pytest.raises(ValueError, match="one_hot: values: expected"):
        _native.one_hot(np.zeros(3, np.int64), 3, np.zeros(3, np.float32), -1)
    with pytest.raises(ValueError, match="scatter_nd: updates: expected shape"):
        _native.scatter_nd(
            np.zeros((3, 7), np.float32), np.zeros((2, 1), np.int64), np.zeros((2, 6), np.float32), "add"
        )
    with pytest.raises(ValueError, match="scatter_nd: reduction"):
        _native.scatter_nd(
            np.zeros(3, np.float32), np.zeros((1, 1), np.int64), np.zeros(1, np.float32), "sum"
        )
    with pytest.raises(ValueError, match="nonzero: x: expected rank 1"):
        _native.nonzero(np.zeros((), np.float32))
    with pytest.raises(ValueError, match="softsign: out: expected shape"):
        _native.softsign(np.zeros(3, np.float32), out=np.zeros(4, np.float32))


def test_no_fallback_in_a_run_of_the_twin_cases():
    before = sum(RUNTIME_FALLBACKS.values())
    x = np.arange(12, dtype=np.float64).reshape(3, 4)
    expected = get_op("CumSum")(KernelContext(opset=14), x, np.array(1))
    kernel, _ = bind("CumSum", [x, np.array(1)])
    assert_bit_exact(expected, kernel.fn(KernelContext(opset=14), x, np.array(1)))
    assert sum(RUNTIME_FALLBACKS.values()) == before


# --------------------------------------------------------------------------------------
# TopK
# --------------------------------------------------------------------------------------


def _topk_both(x: np.ndarray, k: int, attrs: dict) -> None:
    """The bound TopK kernel (1 and 2 threads) vs the twin's stable argsort: both outputs
    byte for byte; no hand-over."""
    kernel, reason = bind("TopK", [x, np.array([k], np.int64)], attrs, n_outputs=2)
    assert kernel is not None, reason
    before = RUNTIME_FALLBACKS["TopK"]
    want = get_op("TopK")(KernelContext(opset=17, n_outputs=2), x, np.array([k], np.int64), **attrs)
    for threads in (1, 2):
        got = kernel.fn(KernelContext(opset=17, n_outputs=2, num_threads=threads), x, np.array([k]), **attrs)
        for g, w, what in zip(got, want, ("values", "indices"), strict=True):
            assert_bit_exact(w, g, f"TopK {what} {threads}t")
    assert RUNTIME_FALLBACKS["TopK"] == before, "the kernel handed a supported call to the twin"


@settings(max_examples=60, deadline=None)
@given(
    shape=st.sampled_from([(17,), (3, 65), (2, 7, 33), (80, 300), (1, 8400), (5, 1)]),
    axis_pick=st.integers(0, 5),
    k_pick=st.floats(0, 1),
    largest=st.sampled_from([0, 1]),
    ties=st.booleans(),
    seed=st.integers(0, 999),
)
def test_topk_matches_the_twins_order_nan_zeros_and_ties(shape, axis_pick, k_pick, largest, ties, seed):
    """Every axis, k from 0 to n, largest and smallest; NaN, ±inf, ±0 and subnormals
    (floats), and with ``ties`` values from a handful so most rows tie at the k-th."""
    rng = np.random.default_rng(seed)
    x = floats(rng, shape)
    if ties:
        x = rng.choice(np.array([-1.0, -0.0, 0.0, 2.5, np.nan], np.float32), size=shape)
    axis = axis_pick % len(shape) - (len(shape) if axis_pick % 2 else 0)
    k = round(k_pick * shape[axis])
    _topk_both(x, k, {"axis": axis, "largest": largest, "sorted": 1})


def test_topk_of_a_detection_head_and_the_binders_refusals():
    """RT-DETR-style: the 300 best of 8400 anchors' class scores; then what stays on the
    twin: another dtype, TopK-1's attribute k."""
    x = np.random.default_rng(3).random((1, 8400), dtype=np.float32)
    _topk_both(x, 300, {"axis": -1, "largest": 1, "sorted": 1})
    assert bind("TopK", [np.zeros(3, np.int64), np.array([1])], {}, n_outputs=2)[1] == (
        "native TopK takes float32 x, got int64"
    )
    assert bind("TopK", [np.zeros(3, np.float32), None], {"k": 1}, n_outputs=2)[1] == (
        "TopK-1 (k an attribute) runs on the twin"
    )


# --------------------------------------------------------------------------------------
# NonMaxSuppression
# --------------------------------------------------------------------------------------


def _nms_case(rng, batches, classes, n, center, ties, degenerate):
    xy = rng.uniform(0, 60, (batches, n, 2))
    wh = rng.uniform(1, 25, (batches, n, 2))
    if center:
        boxes = np.concatenate([xy + wh / 2, wh], -1)
    else:
        boxes = np.concatenate([xy, xy + wh], -1)[..., [1, 0, 3, 2]]  # [y1, x1, y2, x2]
        flip = rng.random((batches, n)) < 0.3  # corners in the other order
        boxes[flip] = boxes[flip][:, [2, 3, 0, 1]]
    if degenerate:
        boxes[:, ::7, 2] = boxes[:, ::7, 0]  # zero-area boxes
    scores = rng.random((batches, classes, n))
    if ties:
        scores = np.round(scores * 4) / 4  # many equal scores: ties by box index
    return np.ascontiguousarray(boxes, np.float32), np.ascontiguousarray(scores, np.float32)


@settings(max_examples=40, deadline=None)
@given(
    batches=st.integers(1, 2),
    classes=st.sampled_from([1, 3, 7]),
    n=st.sampled_from([1, 17, 65, 300]),
    center=st.sampled_from([0, 1]),
    cap=st.sampled_from([0, 1, 5, 1000]),
    iou=st.sampled_from([0.0, 0.3, 0.5, 0.9]),
    score=st.sampled_from([None, 0.0, 0.5]),
    ties=st.booleans(),
    degenerate=st.booleans(),
    seed=st.integers(0, 999),
)
def test_nms_selects_what_the_onnx_reference_selects(
    batches, classes, n, center, cap, iou, score, ties, degenerate, seed
):
    """Triples in the reference's order: batches, classes, both box encodings (corners in
    either order), zero-area boxes, tied scores, every cap and threshold."""
    from quanta.kernels.reference.delegate import delegate_to_onnx_reference

    boxes, scores = _nms_case(np.random.default_rng(seed), batches, classes, n, center, ties, degenerate)
    inputs = [boxes, scores, np.array([cap], np.int64), np.array([iou], np.float32)]
    if score is not None:
        inputs.append(np.array([score], np.float32))
    attrs = {"center_point_box": center}
    kernel, reason = bind("NonMaxSuppression", inputs, attrs)
    assert kernel is not None, reason
    before = RUNTIME_FALLBACKS["NonMaxSuppression"]
    want = delegate_to_onnx_reference(KernelContext(opset=17, op_type="NonMaxSuppression"), inputs, attrs)[0]
    got = kernel.fn(KernelContext(opset=17), *inputs, **attrs)
    assert got.dtype == np.int64 and got.shape == (len(want), 3)
    np.testing.assert_array_equal(got, want.reshape(-1, 3))
    assert RUNTIME_FALLBACKS["NonMaxSuppression"] == before


def test_nms_of_nan_scores_without_a_threshold_goes_to_the_twin():
    boxes, scores = _nms_case(np.random.default_rng(0), 1, 1, 5, 0, False, False)
    scores[0, 0, 2] = np.nan
    with pytest.raises(ValueError, match="NaN without a score threshold"):
        _native.nms_f32(boxes, scores, 3, 0.5, None, False)
    scores_ok = _native.nms_f32(boxes, scores, 3, 0.5, 0.1, False)  # NaN > 0.1 is false: not a candidate
    assert 2 not in scores_ok[:, 2]


# --------------------------------------------------------------------------------------
# GatherElements
# --------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    shape=st.sampled_from([(17,), (3, 7), (2, 7, 33), (1, 300, 5), (2, 3, 4, 5)]),
    axis_pick=st.integers(0, 7),
    m=st.integers(0, 9),
    smaller=st.booleans(),
    dtype=st.sampled_from(
        [np.float32, np.float64, np.int8, np.uint8, np.int32, np.int64, np.bool_, np.float16]
    ),
    idx_dtype=st.sampled_from([np.int64, np.int32]),
    seed=st.integers(0, 999),
)
def test_gather_elements_matches_twin_any_axis_and_dtype(
    shape, axis_pick, m, smaller, dtype, idx_dtype, seed
):
    """Negative indices, indices shorter than data off the axis (``smaller``), every
    element size; 1 and 2 threads, with out= (run_both)."""
    rng = np.random.default_rng(seed)
    axis = axis_pick % len(shape) - (len(shape) if axis_pick % 2 else 0)
    a = axis % len(shape)
    x = (rng.standard_normal(shape) * 50).astype(dtype)
    idx_shape = [
        (m if k == a else (max(1, d - int(rng.integers(0, d))) if smaller else d))
        for k, d in enumerate(shape)
    ]
    idx = rng.integers(-shape[a], shape[a], idx_shape).astype(idx_dtype)
    run_both("GatherElements", [x, idx], {"axis": axis})


def test_gather_elements_out_of_range_index_raises_the_twins_error():
    kernel, _ = bind(
        "GatherElements", [np.zeros((2, 3), np.float32), np.zeros((2, 3), np.int64)], {"axis": 1}
    )
    with pytest.raises(ValueError, match="GatherElements"):
        kernel.fn(KernelContext(opset=17), np.zeros((2, 3), np.float32), np.full((2, 3), 3, np.int64), axis=1)
