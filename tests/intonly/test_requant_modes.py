"""Fixed-point requantization: the derivation (IO2), the three rounding modes (IO3) on
every shift and on ties, and the C++ kernel against the golden."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from quanta.kernels.reference.intonly import ROUNDING_MODES, apply_scale, isqrt
from quanta.kernels.reference.requant import quantize_multiplier, requantize_fixed_point
from quanta.passes.lower.integer_only import fixed_point

native = pytest.importorskip("quanta.kernels._native")
if not hasattr(native, "intonly_apply_scale"):
    pytest.skip("the native module has no intonly kernels", allow_module_level=True)

SHIFTS = list(range(-31, 31))
MULTS = [1 << 30, (1 << 30) + 1, 1518500250, (1 << 31) - 1]


def exact(acc: int, mult: int, shift: int) -> Fraction:
    return Fraction(acc * mult) * Fraction(2) ** (shift - 31)


def test_fixed_point_matches_the_tflite_derivation_and_bounds_the_error():
    rng = np.random.default_rng(0)
    for m in [*np.exp(rng.uniform(-40, 20, 500)).tolist(), 0.5, 1.0, 2.0**-31, 0.999999999]:
        if m >= 2.0**30:
            continue
        mult, shift = fixed_point(m)
        assert (mult, shift) == quantize_multiplier(m)  # the one derivation agrees with requant.py's
        if mult == 0:
            assert m < 2.0**-31
            continue
        assert 1 << 30 <= mult < 1 << 31
        assert abs(mult * 2.0 ** (shift - 31) - m) <= m * 2.0**-31  # (IO2): half an ulp of 31 bits


@pytest.mark.parametrize("rounding", ROUNDING_MODES)
def test_every_shift_rounds_to_within_half_a_step(rounding):
    rng = np.random.default_rng(1)
    for shift in SHIFTS:
        for mult in MULTS:
            # keep acc·m inside int32 for left shifts (the callers' contract, eq. (IO3))
            lim = (1 << 31) - 1 if shift <= 0 else max(1, ((1 << 31) - 1) >> shift)
            acc = rng.integers(-lim, lim, 200, dtype=np.int64)
            got = apply_scale(acc, mult, shift, rounding)
            for a, g in zip(acc.tolist(), got.tolist()):
                err = abs(Fraction(g) - exact(a, mult, shift))
                # single: one rounding, <= 1/2; double: SRDHM's 1/2 scaled by 2^-right,
                # plus 1/2; tosa: the ±2^30 of a total shift t > 31 moves the rounding
                # point by 2^(30 - t) = 2^(shift - 1)
                if rounding == "single":
                    bound = Fraction(1, 2)
                elif rounding == "double":
                    bound = Fraction(1, 2) + Fraction(1, 2) ** max(0, -shift) / 2
                else:
                    bound = Fraction(1, 2) + (Fraction(2) ** (shift - 1) if shift < 0 else 0)
                assert err <= bound, (rounding, shift, mult, a, g)


@pytest.mark.parametrize("shift", [0, -1, -2, -5, -13, -27])
def test_ties_of_each_mode(shift):
    """acc · 2^30 · 2^(shift-31) = ±(k + 1/2): single rounds half up, tosa and double half
    away from zero (double: RoundingDivideByPOT's rule, SRDHM exact here)."""
    mult = 1 << 30
    right = 1 - shift  # acc / 2^right
    k = 5
    for sign in (1, -1):
        acc = sign * (2 * k + 1) * (1 << (right - 1))
        assert exact(acc, mult, shift) == Fraction(sign * (2 * k + 1), 2)
        single = int(apply_scale(np.array([acc]), mult, shift, "single")[0])
        tosa = int(apply_scale(np.array([acc]), mult, shift, "tosa")[0])
        double = int(apply_scale(np.array([acc]), mult, shift, "double")[0])
        assert single == (k + 1 if sign > 0 else -k)  # half up
        # shift < 0: SRDHM is exact here and RoundingDivideByPOT rounds half away from
        # zero; shift 0: SRDHM alone rounds, half up
        assert double == (sign * (k + 1) if shift < 0 else single)
        # TOSA's ±2^30 moves the constant only when the total shift exceeds 31
        assert tosa == (sign * (k + 1) if 31 - shift > 31 else single)


def test_double_is_tflite_multiply_by_quantized_multiplier():
    rng = np.random.default_rng(2)
    acc = rng.integers(-(2**31), 2**31 - 1, 5000, dtype=np.int64).astype(np.int32)
    for m in (0.3, 0.0007, 0.9999, 1.7e-6):
        mult, shift = fixed_point(m)
        want = requantize_fixed_point(acc, mult, shift, 0, np.int32)
        got = np.clip(apply_scale(acc, mult, shift, "double"), -(2**31), 2**31 - 1)
        np.testing.assert_array_equal(got, want)


def test_tosa_double_round_is_tflite_double_rounding_in_one_step():
    """TOSA adds both rounding constants before one shift; for shifts <= 0 that is
    TFLite's SRDHM then RoundingDivideByPOT exactly (nested floor divisions compose),
    while single rounding differs from both near ties."""
    rng = np.random.default_rng(3)
    acc = rng.integers(-(2**31), 2**31 - 1, 20000, dtype=np.int64)
    for mult, shift in ((1518500250, -7), (1073741825, 0), (2147483647, -20), (1 << 30, -1)):
        d = apply_scale(acc, mult, shift, "double")
        t = apply_scale(acc, mult, shift, "tosa")
        np.testing.assert_array_equal(t, d)
    s = apply_scale(acc, 1518500250, -7, "single")
    d = apply_scale(acc, 1518500250, -7, "double")
    assert np.any(s != d) and np.abs(s - d).max() == 1


@pytest.mark.parametrize("rounding", ROUNDING_MODES)
def test_native_apply_scale_is_bit_exact_on_every_shift(rounding):
    rng = np.random.default_rng(4)
    n = 64
    for shift in SHIFTS:
        lim = (1 << 31) - 1 if shift <= 0 else max(1, ((1 << 31) - 1) >> shift)
        acc = np.concatenate([rng.integers(-lim, lim, n - 4, dtype=np.int64), [0, 1, -1, -lim]])
        mult = rng.integers(1 << 30, (1 << 31) - 1, n, dtype=np.int64)
        mult[:4] = MULTS
        want = apply_scale(acc, mult, np.full(n, shift), rounding)
        got = native.intonly_apply_scale(
            acc, mult.astype(np.int32), np.full(n, shift, np.int32), ROUNDING_MODES.index(rounding)
        )
        np.testing.assert_array_equal(got, want)
    # ties of every shift
    for shift in SHIFTS[: 31 + 1]:
        right = 1 - shift
        accs = np.array([(2 * k + 1) * (1 << (right - 1)) * s for k in range(3) for s in (1, -1)], np.int64)
        accs = accs[np.abs(accs) < 2**31]
        m = np.full(accs.size, 1 << 30, np.int32)
        sh = np.full(accs.size, shift, np.int32)
        np.testing.assert_array_equal(
            native.intonly_apply_scale(accs, m, sh, ROUNDING_MODES.index(rounding)),
            apply_scale(accs, m, sh, rounding),
        )


def test_isqrt_is_floor_sqrt_in_numpy_and_cpp():
    rng = np.random.default_rng(5)
    v = np.concatenate(
        [np.arange(0, 300), rng.integers(0, 2**62, 3000), [2**62, 2**63 - 1, (2**31) ** 2 - 1]]
    ).astype(np.int64)
    want = np.array([math.isqrt(int(x)) for x in v], np.int64)
    np.testing.assert_array_equal(isqrt(v), want)
    np.testing.assert_array_equal(native.intonly_isqrt(v), want)


def test_native_refuses_bad_parameters_with_a_named_error():
    acc = np.zeros(2, np.int64)
    with pytest.raises(ValueError, match="shift: expected values in \\[-31, 30\\]"):
        native.intonly_apply_scale(acc, np.full(2, 1 << 30, np.int32), np.full(2, 31, np.int32), 0)
    with pytest.raises(ValueError, match="rounding"):
        native.intonly_apply_scale(acc, np.full(2, 1 << 30, np.int32), np.zeros(2, np.int32), 7)
    with pytest.raises(ValueError, match="acc: expected dtype int64"):
        native.intonly_apply_scale(
            acc.astype(np.int32), np.full(2, 1 << 30, np.int32), np.zeros(2, np.int32), 0
        )
