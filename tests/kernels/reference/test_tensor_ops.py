"""Focused tests for semantics of math_ops / tensor_ops / reduce_ops that are easy to get
wrong and that the ONNX node tests pin only partly: Slice clamping with negative steps,
integer Div/Mod signs, Round ties, TopK tie order, empty reductions, Cast saturation.

Every expected value here is exact (integers, or floats that are exactly representable),
so every comparison is ``assert_array_equal``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from quanta.kernels.reference.registry import OpContext, OpError, get_op
from quanta.kernels.reference.tensor_ops import slice_bounds

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def run(op_type: str, *inputs, opset: int = 21, n_outputs: int = 1, **attributes):
    fn = get_op(op_type)
    assert fn is not None, op_type
    ctx = OpContext(opset=opset, n_outputs=n_outputs, op_type=op_type)
    return fn(ctx, *inputs, **attributes)


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


# ---------------------------------------------------------------------------------
# Slice


def _spec_slice_indices(start: int, end: int, step: int, dim: int) -> list[int]:
    """The ONNX Slice definition written as a loop (operator doc, opset 13)."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    out, i = [], start
    while (i < end) if step > 0 else (i > end):
        out.append(i)
        i += step
    return out


bounds = st.one_of(st.integers(-12, 12), st.sampled_from([INT64_MIN, INT64_MAX]))


@given(
    start=bounds,
    end=bounds,
    step=st.integers(-4, 4).filter(bool),
    dim=st.integers(0, 9),
)
def test_slice_bounds_match_spec_loop_negative_steps_and_clamping(start, end, step, dim) -> None:
    # Failure signature: Python reads a clamped end of -1 as "last element", so a
    # reversing slice (step < 0, end -> -1) comes back empty instead of reaching index 0.
    got = list(range(dim))[slice_bounds(start, end, step, dim)]
    assert got == _spec_slice_indices(start, end, step, dim)


def test_slice_negative_steps_reverse_odd_shape() -> None:
    data = np.arange(3 * 7).reshape(3, 7).astype(np.float32)
    # axis 1 reversed from the last element through index 0 (ends = INT64_MIN), and
    # axis 0 from 20 (clamped to 2) down to -20 (clamped to -1, i.e. through 0), step -2.
    got = run("Slice", data, i64(-1, 20), i64(INT64_MIN, -20), i64(1, 0), i64(-1, -2))
    np.testing.assert_array_equal(got, data[::-2, ::-1])
    got = run("Slice", data, i64(5), i64(1), i64(-1), i64(-3))
    np.testing.assert_array_equal(got, data[:, [5, 2]])


def test_slice_zero_step_is_an_error() -> None:
    with pytest.raises(OpError, match=r"^Slice: expected non-zero steps, got 0$"):
        run("Slice", np.zeros(4, np.float32), i64(0), i64(4), i64(0), i64(0))


# ---------------------------------------------------------------------------------
# integer Div / Mod, Pow, Round


def test_div_int_truncates_toward_zero() -> None:
    # numpy's // floors: -7 // 2 = -4; ONNX (C) gives -3.
    a = np.array([-7, 7, -7, 7, -8, 0, -1], np.int32)
    b = np.array([2, 2, -2, -2, 3, 5, 7], np.int32)
    got = run("Div", a, b)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [-3, 3, 3, -3, -2, 0, 0])


@given(
    a=st.integers(-(2**31), 2**31 - 1),
    b=st.integers(-(2**31), 2**31 - 1).filter(bool),
)
def test_div_mod_int32_signs_match_c_and_floor(a, b) -> None:
    x, y = np.array([a], np.int32), np.array([b], np.int32)
    if a == -(2**31) and b == -1:
        return  # the one overflowing quotient: undefined in C and ONNX
    trunc = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
    assert int(run("Div", x, y)[0]) == trunc
    assert int(run("Mod", x, y)[0]) == a % b  # Python's % takes the divisor's sign
    assert int(run("Mod", x, y, fmod=1)[0]) == a - b * trunc  # C fmod: dividend's sign


def test_mod_sign_follows_divisor_or_dividend() -> None:
    a = np.array([-7, 7, -7, 7], np.int64)
    b = np.array([2, 2, -2, -2], np.int64)
    np.testing.assert_array_equal(run("Mod", a, b), [1, 1, -1, -1])
    np.testing.assert_array_equal(run("Mod", a, b, fmod=1), [-1, 1, -1, 1])
    x = np.array([-7.5, 7.5], np.float32)
    np.testing.assert_array_equal(
        run("Mod", x, np.float32(2.0) * np.ones(2, np.float32), fmod=1), [-1.5, 1.5]
    )


def test_round_ties_half_to_even() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4999998, 3.5000002], np.float32)
    got = run("Round", x)
    np.testing.assert_array_equal(got, [0, 2, 2, -0.0, -2, -2, 2, 4])
    assert np.signbit(got[3])  # -0.5 rounds to -0, not +0


def test_pow_keeps_base_type_int_base_negative_exponent() -> None:
    # numpy raises on int ** negative int; ONNX truncates the real result.
    got = run("Pow", np.array([2, 1, -1, 3], np.int32), np.array([-1, -2, -3, 2], np.int32))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [0, 1, -1, 9])
    got = run("Pow", np.array([2, 3], np.int64), np.array([0.5, 2.0], np.float32))
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, [1, 9])


def test_bitshift_amounts_outside_width() -> None:
    x = np.array([-8, 8, 1, -1], np.int8)
    y = np.array([1, 9, -1, 3], np.int8)
    np.testing.assert_array_equal(run("BitShift", x, y, direction="RIGHT"), [-4, 0, 0, -1])
    np.testing.assert_array_equal(run("BitShift", x, y, direction="LEFT"), [-16, 0, 0, -8])


# ---------------------------------------------------------------------------------
# TopK, ArgMax


@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.float32])
def test_topk_ties_keep_ascending_index(dtype) -> None:
    # Failure signature: sorting -x for largest=1 wraps uint8 (0 -> 0, 255 -> 1) and a
    # non-stable sort returns tied indices in any order.
    x = np.array([[3, 0, 3, 200, 3, 0, 200]], dtype)
    values, indices = run("TopK", x, i64(5), n_outputs=2, axis=1, largest=1)
    np.testing.assert_array_equal(indices, [[3, 6, 0, 2, 4]])
    np.testing.assert_array_equal(values, np.array([[200, 200, 3, 3, 3]], dtype))
    values, indices = run("TopK", x, i64(3), n_outputs=2, axis=-1, largest=0)
    np.testing.assert_array_equal(indices, [[1, 5, 0]])


def test_argmax_select_last_index() -> None:
    x = np.array([[1, 5, 5], [7, 7, 2]], np.int32)
    np.testing.assert_array_equal(run("ArgMax", x, axis=1, keepdims=0), [1, 0])
    np.testing.assert_array_equal(run("ArgMax", x, axis=1, keepdims=0, select_last_index=1), [2, 1])
    np.testing.assert_array_equal(run("ArgMin", x, axis=0, select_last_index=1), [[0, 0, 1]])


# ---------------------------------------------------------------------------------
# reductions


@pytest.mark.parametrize(
    ("op", "dtype", "identity"),
    [
        ("ReduceSum", np.float32, 0.0),
        ("ReduceProd", np.float32, 1.0),
        ("ReduceL2", np.float32, 0.0),
        ("ReduceLogSum", np.float32, -np.inf),
        ("ReduceLogSumExp", np.float32, -np.inf),
        ("ReduceMax", np.float32, -np.inf),
        ("ReduceMin", np.float32, np.inf),
        ("ReduceMax", np.int32, np.iinfo(np.int32).min),
        ("ReduceMin", np.uint8, 255),
    ],
)
def test_reduce_empty_gives_identity(op, dtype, identity) -> None:
    x = np.zeros((3, 0, 7), dtype)
    got = run(op, x, i64(1), opset=18, keepdims=1)
    assert got.shape == (3, 1, 7) and got.dtype == dtype
    np.testing.assert_array_equal(got, np.full((3, 1, 7), identity, dtype))


def test_reduce_axes_attribute_before_18_equals_input_from_18() -> None:
    x = np.arange(3 * 7 * 17, dtype=np.float32).reshape(3, 7, 17) % 11
    old = run("ReduceMax", x, opset=13, axes=[0, -1], keepdims=0)
    new = run("ReduceMax", x, i64(0, -1), opset=18, keepdims=0)
    np.testing.assert_array_equal(old, new)
    np.testing.assert_array_equal(new, x.max(axis=(0, 2)))


def test_reduce_noop_with_empty_axes() -> None:
    x = np.array([[-1.0, 2.0]], np.float32)
    np.testing.assert_array_equal(run("ReduceSum", x, i64(), noop_with_empty_axes=1), x)
    np.testing.assert_array_equal(run("ReduceSum", x, i64(), keepdims=0), np.float32(1.0))
    np.testing.assert_array_equal(run("ReduceL1", x, noop_with_empty_axes=1), np.abs(x))


# ---------------------------------------------------------------------------------
# Split, Squeeze/Unsqueeze across opsets, Gather errors


def test_split_num_outputs_uneven_last_part_smaller() -> None:
    x = np.arange(7, dtype=np.float32)
    parts = run("Split", x, opset=18, n_outputs=3, num_outputs=3)
    assert [p.tolist() for p in parts] == [[0, 1, 2], [3, 4, 5], [6]]
    parts = run("Split", x, i64(2, 5), opset=13, n_outputs=2)
    assert [len(p) for p in parts] == [2, 5]
    parts = run("Split", x, opset=11, n_outputs=2, split=[4, 3])
    assert [len(p) for p in parts] == [4, 3]


def test_unsqueeze_axes_attribute_and_input() -> None:
    x = np.zeros((3, 7), np.float32)
    assert run("Unsqueeze", x, opset=11, axes=[0, -1]).shape == (1, 3, 7, 1)
    assert run("Unsqueeze", x, i64(-1, 0), opset=13).shape == (1, 3, 7, 1)
    assert run("Squeeze", np.zeros((1, 3, 1)), i64(-1), opset=13).shape == (1, 3)
    assert run("Squeeze", np.zeros((1, 3, 1)), opset=11, axes=[0]).shape == (3, 1)


def test_gather_index_out_of_range_message() -> None:
    data = np.zeros((3, 7), np.float32)
    np.testing.assert_array_equal(run("Gather", np.arange(7.0), i64(-1, 0)), [6.0, 0.0])
    with pytest.raises(OpError, match=r"^Gather: expected indices in \[-7, 6\], got 7$"):
        run("Gather", data, i64(7), axis=1)


def test_scatter_elements_duplicate_indices_reduce() -> None:
    data = np.ones((2, 3), np.float32)
    idx = np.array([[0, 0, 2]], np.int64)
    upd = np.array([[2.0, 3.0, 4.0]], np.float32)
    np.testing.assert_array_equal(
        run("ScatterElements", data, idx, upd, axis=1, reduction="add"), [[6, 1, 5], [1, 1, 1]]
    )
    np.testing.assert_array_equal(
        run("ScatterElements", data, idx, upd, axis=1, reduction="mul"), [[6, 1, 4], [1, 1, 1]]
    )


# ---------------------------------------------------------------------------------
# Cast


def test_cast_float8_saturates_by_default_nan_stays() -> None:
    x = np.array([1000.0, -np.inf, np.nan, 464.0, 0.1], np.float32)
    got = run("Cast", x, to=17)  # FLOAT8E4M3FN, FLT_MAX = 448
    np.testing.assert_array_equal(got.astype(np.float32)[[0, 1, 3]], [448, -448, 448])
    assert np.isnan(got.astype(np.float32)[2])
    got = run("Cast", x, to=17, saturate=0)
    assert np.isnan(got.astype(np.float32)[[0, 1, 2]]).all()
    got = run("Cast", x * 100, to=19, saturate=0)  # FLOAT8E5M2 has Inf (FLT_MAX = 57344)
    np.testing.assert_array_equal(got.astype(np.float32)[:2], [np.inf, -np.inf])


def test_cast_e8m0_round_modes() -> None:
    x = np.array([3.0, 2.9, 1.0, np.inf], np.float32)  # 3.0 is the tie 1.5 * 2^1
    up = run("Cast", x, to=24).astype(np.float32)
    np.testing.assert_array_equal(up, [4, 4, 1, 2.0**127])  # Inf saturates to E8M0_MAX
    down = run("Cast", x, to=24, round_mode="down").astype(np.float32)
    np.testing.assert_array_equal(down, [2, 2, 1, 2.0**127])
    nearest = run("Cast", x, to=24, round_mode="nearest", saturate=0).astype(np.float32)
    np.testing.assert_array_equal(nearest[:3], [4, 2, 1])
    assert np.isnan(nearest[3])
    assert run("Cast", x, to=24).dtype == ml_dtypes.float8_e8m0fnu


def test_cast_integer_narrowing_wraps_and_float_truncates() -> None:
    np.testing.assert_array_equal(run("Cast", np.array([200, -129], np.int16), to=3), [-56, 127])
    np.testing.assert_array_equal(run("Cast", np.array([-2.7, 2.7], np.float32), to=6), [-2, 2])


def test_cast_string_number_roundtrip() -> None:
    s = np.array(["1.5", "-INF", "NaN", "1e-5", "+inf", " 7 "], dtype=object)
    got = run("Cast", s, to=1)
    np.testing.assert_array_equal(got, np.array([1.5, -np.inf, np.nan, 1e-5, np.inf, 7], np.float32))
    big = run("Cast", np.array(["9007199254740993"], dtype=object), to=7)
    assert int(big[0]) == 2**53 + 1  # parsed as an integer, not through float64
    back = run("Cast", np.array([1.5, np.nan, -np.inf], np.float32), to=8)
    assert back.tolist() == ["1.5", "NaN", "-INF"]


def test_range_reads_one_element_tensors_as_scalars() -> None:
    # AffineGrid's function body passes a [1] limit; onnx.reference and ONNX Runtime accept it
    got = run("Range", np.array(3, np.int64), np.array([17], np.int64), np.array([4], np.int64))
    np.testing.assert_array_equal(got, np.array([3, 7, 11, 15], np.int64))
    with pytest.raises(OpError, match="scalar limit, got shape \\[2\\]"):
        run("Range", np.array(0, np.int64), np.array([5, 6], np.int64), np.array(1, np.int64))
