"""Requantization, float (eq. (6)) and fixed-point (eq. (7)): golden vectors and hazards.

See docs/quantization-math.md. The docstring examples of the reference modules run in
tests/test_doctests.py, so the formulas written in comments are evaluated.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from quanta.kernels.reference.requant import (
    quantize_multiplier,
    requant_multiplier,
    requantize,
    requantize_fixed_point,
    rounding_divide_by_pot,
    saturating_rounding_doubling_high_mul,
)

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# ----------------------------------------------------------------------------- eq. (6)


def test_requant_multiplier_rounds_each_step_to_float32():
    """m = f32(f32(sx*sw)/sy): computing sx*sw/sy in float64 and rounding once gives a
    different float32 for these values; ONNX Runtime does the two float32 steps."""
    sx, sw, sy = np.float32(0.1), np.float32(0.3), np.float32(0.7)
    m = requant_multiplier(sx, sw, sy)
    assert m.dtype == np.float32
    assert m == np.float32(np.float32(sx * sw) / sy)
    one_rounding = np.float32(float(sx) * float(sw) / float(sy))
    assert m != one_rounding  # the two-step value is the contract, not the exactly-rounded one


def test_requant_multiplier_per_channel_keeps_shape():
    sw = np.array([0.02, 0.03, 0.05], np.float32)
    m = requant_multiplier(np.float32(0.5), sw, np.float32(0.25))
    assert m.shape == (3,)
    np.testing.assert_array_equal(m, [np.float32(np.float32(0.5 * s) / np.float32(0.25)) for s in sw])


def test_requantize_ties_round_half_even_both_signs():
    """Golden: acc·m = ±0.5, ±1.5, ±2.5, ±3.5 -> 0, ±2, ±2, ±4 (half to even, not away from 0)."""
    acc = np.array([1, -1, 3, -3, 5, -5, 7, -7], np.int32)
    got = requantize(acc, np.float32(0.5), 0, np.int8)
    np.testing.assert_array_equal(got, [0, 0, 2, -2, 2, -2, 4, -4])


def test_requantize_odd_zero_point_added_after_rounding():
    """Failure signature: rint(v + zy) instead of rint(v) + zy — differs whenever zy is odd
    and v is a tie (2.5 + 3 = 5.5 -> 6, but rint(2.5) + 3 = 5)."""
    acc = np.array([5, -5, 7, -7], np.int32)
    np.testing.assert_array_equal(requantize(acc, np.float32(0.5), 3, np.uint8), [5, 1, 7, 0])
    np.testing.assert_array_equal(requantize(acc, np.float32(0.5), -3, np.int8), [-1, -5, 1, -7])


def test_requantize_float32_product_on_near_tie():
    """Failure signature: acc * m in float64 (NumPy 2 promotes int32 * float32 to float64).
    acc·m = 99.49999975 exactly; float32(31827) * m rounds to 99.5 -> 100 (ONNX Runtime);
    float64 keeps 99.4999... -> 99."""
    m = np.float32(0.0031262764)
    acc = np.array([31827, -31827], np.int32)
    assert float(acc[0]) * float(m) < 99.5
    np.testing.assert_array_equal(requantize(acc, m, 0, np.int8), [100, -100])


@pytest.mark.parametrize(
    ("dtype", "zero_point", "expected"),
    [
        (np.int8, 5, [-128, -128, 127, 127]),
        (np.uint8, 200, [0, 0, 255, 255]),
        (np.int16, -7, [-32768, -32768, 32767, 32767]),
    ],
)
def test_requantize_saturates_to_storage_range(dtype, zero_point, expected):
    acc = np.array([INT32_MIN, -(10**6), 10**6, INT32_MAX], np.int32)
    np.testing.assert_array_equal(requantize(acc, np.float32(0.75), zero_point, dtype), expected)


def test_requantize_per_channel_multiplier_and_zero_point():
    acc = np.array([[10, 10, 10], [-10, -10, -10]], np.int32)
    m = np.array([0.25, 0.15, 0.05], np.float32)  # 2.5 -> 2, 1.5 -> 2, 0.5 -> 0
    zp = np.array([1, -2, 3])
    np.testing.assert_array_equal(requantize(acc, m, zp, np.int8), [[3, 0, 3], [-1, -4, 3]])


def test_requantize_nan_multiplier_saturates_low():
    got = requantize(np.array([3, -3], np.int32), np.float32(np.nan), 10, np.uint8)
    np.testing.assert_array_equal(got, [0, 0])


def test_requantize_rejects_float_accumulator():
    with pytest.raises(TypeError, match="expected an integer accumulator, got float32"):
        requantize(np.zeros(2, np.float32), np.float32(1), 0, np.int8)


# ----------------------------------------------------------------------------- eq. (7)


@pytest.mark.parametrize(
    ("m", "expected"),
    [
        (0.5, (1 << 30, 0)),
        (0.75, (3 << 29, 0)),
        (0.1, (1717986918, -3)),
        (1.0, (1 << 30, 1)),
        (1.0 - 2.0**-33, (1 << 30, 1)),  # q·2^31 rounds up to 2^31: halved, shift + 1
        (2.0**-40, (0, 0)),  # shift < -31 flushes to zero
        (0.0, (0, 0)),
    ],
)
def test_quantize_multiplier_golden(m, expected):
    assert quantize_multiplier(m) == expected


@given(st.floats(min_value=2.0**-30, max_value=1000.0, allow_nan=False))
def test_quantize_multiplier_relative_error_below_2_pow_31(m):
    """multiplier ∈ [2^30, 2^31) carries 31 bits, so |m - mult·2^(shift-31)| ≤ 2^-31·2^shift."""
    mult, shift = quantize_multiplier(m)
    assert (1 << 30) <= mult < (1 << 31)
    approx = Fraction(mult) * Fraction(2) ** (shift - 31)
    assert abs(approx - Fraction(m)) <= Fraction(2) ** (shift - 32)


def test_srdhm_ties_round_half_up_both_signs():
    """Golden: a·2^30/2^31 = a/2: 2.5 -> 3, -2.5 -> -2, 3.5 -> 4, -3.5 -> -3 (VQRDMULH)."""
    a = np.array([5, -5, 7, -7, 1, -1], np.int32)
    got = saturating_rounding_doubling_high_mul(a, 1 << 30)
    np.testing.assert_array_equal(got, [3, -2, 4, -3, 1, 0])


def test_srdhm_saturates_the_single_overflow_case():
    got = saturating_rounding_doubling_high_mul(np.array([INT32_MIN], np.int32), INT32_MIN)
    np.testing.assert_array_equal(got, [INT32_MAX])


@given(st.integers(INT32_MIN, INT32_MAX), st.integers(INT32_MIN, INT32_MAX))
def test_srdhm_matches_exact_rational(a, b):
    """SRDHM(a, b) = floor(a·b / 2^31 + 1/2), except a = b = INT32_MIN."""
    got = int(saturating_rounding_doubling_high_mul(np.array([a], np.int32), b)[0])
    if a == b == INT32_MIN:
        assert got == INT32_MAX
    else:
        exact = Fraction(a * b, 1 << 31) + Fraction(1, 2)
        assert got == exact.numerator // exact.denominator


def test_rounding_divide_by_pot_ties_away_from_zero():
    x = np.array([5, -5, 6, -6, 7, -7, 1, -1], np.int32)
    np.testing.assert_array_equal(rounding_divide_by_pot(x, 1), [3, -3, 3, -3, 4, -4, 1, -1])
    np.testing.assert_array_equal(rounding_divide_by_pot(x, 2), [1, -1, 2, -2, 2, -2, 0, 0])
    np.testing.assert_array_equal(rounding_divide_by_pot(x, 0), x)


def test_requantize_fixed_point_ties_golden():
    """Golden, m = 0.25 = 2^30·2^(-1-31): SRDHM halves (half up), RDBPOT halves again
    (half away). acc = ±6 -> ±1.5: SRDHM gives 3 / -3, RDBPOT 2 / -2 (float form: ±2 too).
    acc = ±10 -> ±2.5: SRDHM 5 / -5, RDBPOT 3 / -3 (float form: ±2, half to even)."""
    mult, shift = quantize_multiplier(0.25)
    assert (mult, shift) == (1 << 30, -1)
    acc = np.array([6, -6, 10, -10], np.int32)
    np.testing.assert_array_equal(requantize_fixed_point(acc, mult, shift, 0, np.int8), [2, -2, 3, -3])
    np.testing.assert_array_equal(requantize(acc, np.float32(0.25), 0, np.int8), [2, -2, 2, -2])


def test_requantize_fixed_point_left_shift_for_multiplier_above_one():
    mult, shift = quantize_multiplier(3.0)  # 0.75 · 2^2
    assert shift == 2
    acc = np.array([5, -5, 40, -50], np.int32)
    np.testing.assert_array_equal(requantize_fixed_point(acc, mult, shift, 1, np.int8), [16, -14, 121, -128])


@given(
    st.lists(st.integers(-(2**24), 2**24), min_size=1, max_size=64),
    st.floats(min_value=1e-6, max_value=0.99),
    st.integers(-128, 127),
)
def test_requantize_fixed_point_within_one_of_float(acc, m, zp):
    """|fixed − float| ≤ 1: both approximate acc·m to within ≪ 1 (31-bit multiplier vs
    24-bit float32 multiplier and product) and differ only in which neighbour a near-tie
    rounds to; saturation is the same monotone clamp."""
    acc = np.array(acc, np.int32)
    mult, shift = quantize_multiplier(float(np.float32(m)))
    fixed = requantize_fixed_point(acc, mult, shift, zp, np.int8).astype(int)
    flt = requantize(acc, np.float32(m), zp, np.int8).astype(int)
    assert np.max(np.abs(fixed - flt)) <= 1


def test_requantize_fixed_point_per_channel():
    ms = [0.5, 0.25, 0.125]
    mults, shifts = zip(*(quantize_multiplier(m) for m in ms))
    acc = np.array([[8, 8, 8], [-9, -9, -9]], np.int32)
    got = requantize_fixed_point(acc, np.array(mults), np.array(shifts), np.array([0, 1, 2]), np.int8)
    np.testing.assert_array_equal(got, [[4, 3, 3], [-4, -1, 1]])
