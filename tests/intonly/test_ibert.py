"""I-BERT's integer polynomials for inputs wider than a table (eqs. (IO12), (IO13)) and
the Newton integer square root: the golden against float math over the input range and
the compile-time shifts, and the npu-sim C++ kernels against the golden (bit-exact)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quanta.kernels.reference import intonly as g
from quanta.passes.lower.integer_only import IEXP_A, IEXP_B, IEXP_C, exp_poly_params, gelu_poly_params
from tests.intonly.test_kernels import HAS_NATIVE, both, native, node, rand

MODES = st.sampled_from(g.ROUNDING_MODES)
#: scales of a 16-bit input from coarse (pre_shift 0, exp_shift 22) to fine (exp_shift < 0)
SCALES = [0.05, 3e-3, 1e-3, 1.7e-4, 2.1e-5, 4e-6]


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


@pytest.mark.parametrize("sx", SCALES)
def test_int_exp_follows_exp_within_the_polynomial_error(sx):
    p = exp_poly_params(sx)
    s = float(np.float32(sx))
    d = np.unique(np.concatenate([np.arange(0, 3000), np.linspace(0, 65535, 2000).astype(np.int64)]))
    e = g.int_exp(d, p["exp_x0"], p["exp_b"], p["exp_c"], p["exp_shift"])
    assert e.max() <= 1 << 30 and e.min() >= 0 and e[0] >= 1 << 29
    # e ≈ exp(-d·sx) / (A·sx²·2^-exp_shift); ln2 is -x0 steps of sx (rounded)
    real = e.astype(np.float64) * IEXP_A * s * s * 2.0 ** -p["exp_shift"]
    want = np.exp(-d * s)
    z = d // -p["exp_x0"]
    # the polynomial is within 0.00213 of exp on [-ln2, 0]; the integer constants move it
    # by 2A(B + 0)·Δb + Δc (floors of b and c) and ln2 by |(-x0)·sx - ln2| per halving;
    # each 2^-z halves the absolute error; the final floor costs one unit
    db = IEXP_B - p["exp_b"] * s
    dc = IEXP_C - p["exp_c"] * IEXP_A * s * s
    ln2_err = abs(-p["exp_x0"] * s - math.log(2.0))
    unit = IEXP_A * s * s * 2.0 ** -p["exp_shift"]
    tol = (0.00213 + 2 * IEXP_A * IEXP_B * db + dc) * 2.0**-z + want * z * ln2_err * 1.01 + unit
    assert np.all(np.abs(real - want) <= tol)
    assert np.all(np.diff(e) <= 0)  # monotone: a larger distance never weighs more


@settings(max_examples=12, deadline=None)
@given(
    rows=st.integers(1, 5),
    n=st.sampled_from([1, 2, 7, 300]),
    sx=st.sampled_from(SCALES),
    spread=st.sampled_from([0.3, 3.0, 30.0]),
    seed=st.integers(0, 2**16),
)
def test_wide_softmax_is_within_a_step_of_float_softmax(rows, n, sx, spread, seed):
    rng = np.random.default_rng(seed)
    s = float(np.float32(sx))
    lim = min(32767, int(spread / s))
    x = rng.integers(-lim, lim + 1, (rows, 2, n)).astype(np.int16)
    p = exp_poly_params(sx)
    y = both(node("IntSoftmax", [x], axis=-1, y_shift=8, y_zero_point=-128, **p), [x])
    xf = x.astype(np.float64) * s
    want = np.exp(xf - xf.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    assert np.all(np.abs((y.astype(np.float64) + 128) - np.clip(want * 256, 0, 255)) <= 0.5 + 0.004 * 256)
    # a 16-bit output: scale 2^-15, zero point 0
    y16 = both(node("IntSoftmax", [x], "int16", axis=-1, y_shift=15, y_zero_point=0, **p), [x])
    assert np.all(np.abs(y16.astype(np.float64) - np.clip(want * 32768, 0, 32767)) <= 0.5 + 0.004 * 32768)
    y1 = both(node("IntSoftmax", [x], axis=1, y_shift=8, y_zero_point=-128, **p), [x])
    np.testing.assert_array_equal(np.moveaxis(y1, 1, -1), g.int_softmax(np.moveaxis(x, 1, -1), **p))


@pytest.mark.parametrize("sx", [2e-4, 1e-3, 3e-3, 0.05])
@pytest.mark.parametrize("rounding", g.ROUNDING_MODES)
def test_gelu_follows_float_gelu_over_the_whole_int16_range(sx, rounding):
    s = float(np.float32(sx))
    x = np.arange(-32768, 32768, 7, dtype=np.int64).astype(np.int16)
    xf = x.astype(np.float64) * s
    ref = _gelu(xf)
    sy = float(np.float32(max(np.abs(ref).max(), 1e-3) / 32767))
    p = gelu_poly_params(sx, 0, sy, 3, rounding)
    y = both(node("IntGelu", [x], out_type="int16", **p), [x])
    got = (y.astype(np.float64) - 3) * sy
    # i-GELU's erf polynomial is within 0.0963 of erf (at 0, where GELU's x/2 factor
    # vanishes); the floor of c scales the result by up to 2/c; one output step rounds
    err = np.abs(got - ref)
    assert np.all(err <= np.abs(xf) / 2 * (0.0963 + 4.0 / p["erf_c"]) + 1.01 * sy)
    if sx <= 3e-3:  # I-BERT's L∞ error of i-GELU: 0.018
        assert err.max() <= 0.0195 + 1.01 * sy


@settings(max_examples=15, deadline=None)
@given(
    sx=st.floats(1e-5, 0.05),
    zx=st.integers(-300, 300),
    zy=st.integers(-100, 100),
    sy=st.floats(1e-4, 0.1),
    out=st.sampled_from(["int8", "int16"]),
    mode=MODES,
    seed=st.integers(0, 2**16),
)
def test_gelu_native_equals_golden_over_shifts_and_zero_points(sx, zx, zy, sy, out, mode, seed):
    rng = np.random.default_rng(seed)
    x = rand(rng, (3, 2, 37), np.int16)
    x[0, 0, :4] = [-32768, 32767, zx, zx + 1]
    p = gelu_poly_params(sx, zx, sy, zy, mode)
    assert p["pre_shift"] >= 0 and p["erf_c"] >= p["erf_b"] ** 2
    both(node("IntGelu", [x], out_type=out, **p), [x])


def test_compile_time_shifts_cover_both_signs():
    shifts = [exp_poly_params(s)["exp_shift"] for s in SCALES]
    assert max(shifts) > 0 > min(shifts)
    pre = [gelu_poly_params(s, 0, 0.01, 0, "double")["pre_shift"] for s in (0.05, 1e-3, 2e-5)]
    assert pre[0] == 0 and pre[-1] > pre[1] > 0


def test_isqrt_is_newton_and_exact_at_squares():
    k = np.array([1, 2, 3, 255, 256, 46340, 46341, 2**31 - 1, 3037000499], np.int64)
    v = np.concatenate([k * k, k * k - 1, k * k + 1, [0, 2**63 - 1]]).astype(np.int64)
    want = np.array([math.isqrt(int(a)) for a in v], np.int64)
    np.testing.assert_array_equal(g.isqrt(v), want)
    if HAS_NATIVE:
        np.testing.assert_array_equal(native.intonly_isqrt(v), want)
    assert g.bit_length(v).tolist() == [int(a).bit_length() for a in v]


def test_bad_polynomial_constants_are_refused_by_both():
    x = np.zeros((1, 4), np.int16)
    bad = dict(exp_x0=-2000, exp_b=1353, exp_c=959542, exp_shift=8)  # -x0 > b
    with pytest.raises(g.OpError, match="exp_x0"):
        g.int_softmax(x, **bad)
    if HAS_NATIVE:
        with pytest.raises(ValueError, match="exp_x0"):
            native.intonly_softmax_poly(x.astype(np.int32), -2000, 1353, 959542, 8, 8, -128, -128, 127)
    p = gelu_poly_params(1e-3, 0, 0.01, 0, "double")
    with pytest.raises(g.OpError, match="outside int32"):
        g.int_gelu(np.array([32767], np.int16), **{**p, "pre_shift": 0})
    if HAS_NATIVE:
        with pytest.raises(ValueError, match="outside int32"):
            native.intonly_gelu(
                np.array([32767], np.int32), 0, p["erf_b"], p["erf_c"], 0, p["multiplier"], p["shift"], 0,
                -32768, 32767, 0,
            )  # fmt: skip
