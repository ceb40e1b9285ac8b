"""Native float32 kernels (quanta/kernels/cpp/float_ops) against their NumPy twin
(quanta/kernels/reference/float_ops.py), and the twin against float64 math.

Bit-exact, tolerance 0 throughout the native-vs-twin tests: every step of docs/float-ops.md
is one float32 IEEE operation in a fixed order in both implementations (NaN payloads
aside: ``assert_same`` requires NaN at the same places and identical bits elsewhere).
Every ISA the CPU supports runs (``_native.set_isa``), and threads 1 vs 2 give identical
bytes. The accuracy tests state their bounds with a derivation next to each.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from quanta.kernels import _native
from quanta.kernels.reference import float_ops as twin
from quanta.kernels.reference.ms_lstm import mlas_logistic, mlas_tanh
from quanta.kernels.reference.ort_float import mlas_gelu_tanh
from tests.isa import assert_same, every_isa

F32 = np.float32
U = 2.0**-24  # unit roundoff of float32
#: row lengths with reasons: 1 (a lone element), 15/16/17 (one 16-lane block ± 1), 63/65
#: (4 blocks ± 1, AVX2 half-block tails), 300 (odd tail of 12), 384 (BERT hidden size)
ROW_LENGTHS = [1, 15, 16, 17, 63, 65, 300, 384]
#: Softmax adds 128 (attention rows: the in-register / 4-row lockstep path) and 1000 (a long
#: row, 63 blocks ending in a tail of 8)
SOFTMAX_ROW_LENGTHS = [1, 15, 16, 17, 63, 65, 128, 300, 1000]


def special_values() -> np.ndarray:
    """Edges of exp's range reduction and IEEE specials."""
    tiny = np.finfo(F32).tiny
    return np.array(
        [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, tiny, -tiny, 1e-45, -1e-45, 88.72, 88.7229, 88.73,
         89.0, 89.5, -87.33, -87.34, -103.97, -104.0, -104.5, -1e30, 1e30, 0.34657, -0.34657, 0.5, -0.5,
         3.4e38, -3.4e38],
        F32,
    )  # fmt: skip


# --------------------------------------------------------------------------------------
# exp
# --------------------------------------------------------------------------------------


@given(
    n=st.integers(1, 70),
    scale=st.sampled_from([1.0, 30.0, 100.0, 1e30]),
    seed=st.integers(0, 2**16),
)
def test_exp_native_matches_twin_every_isa(n, scale, seed) -> None:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * scale).astype(F32)
    expected = twin.exp_f32(x)
    every_isa(lambda isa: assert_same(expected, _native.exp_f32(x), "exp_f32", isa=isa, n=n))


def test_exp_native_matches_twin_on_specials_and_a_sweep() -> None:
    sweep = np.linspace(-110, 95, 1 << 18, dtype=F32)
    x = np.concatenate([special_values(), sweep, np.nextafter(special_values(), F32(0))])
    expected = twin.exp_f32(x)
    every_isa(lambda isa: assert_same(expected, _native.exp_f32(x), "exp_f32", isa=isa))
    every_isa(
        lambda isa: assert_same(expected, _native.exp_f32(x, num_threads=2), "exp_f32 2 threads", isa=isa)
    )


def ulp_error(actual: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|actual − exact| in ulps of the float32 nearest the float64 ``exact``."""
    return np.abs(actual.astype(np.float64) - exact) / np.spacing(np.abs(exact.astype(F32))).astype(
        np.float64
    )


def test_exp_twin_within_one_ulp_of_exact() -> None:
    """Bound 1 ulp for normal results: the polynomial (E4)-(E5) is accurate to ~2^-26 on
    |r| <= ln2/2 + rounding, (E3) is exact for |n| < 2^15 in its first product, and (E6)
    rounds once; measured max 0.99 ulp on 2^25 inputs (docs/float-ops.md)."""
    rng = np.random.default_rng(1)
    x = np.concatenate(
        [rng.uniform(-87.33, 88.72, 1 << 20), rng.uniform(-1, 1, 1 << 16), np.linspace(-1e-3, 1e-3, 4097)]
    ).astype(F32)
    err = ulp_error(twin.exp_f32(x), np.exp(x.astype(np.float64)))
    assert err.max() <= 1.0, (err.max(), x[np.argmax(err)])


def test_exp_twin_range_ends() -> None:
    """Below FLT_MIN the result is rne(p·2^n): within 2^-149 (one subnormal step, plus
    p's relative error on a value < 2^-126) of e^x; past ln(FLT_MAX) it is +inf; below
    −103.97 (e^x < 2^-150) it is 0; NaN stays NaN; e^±0 = 1."""
    x = np.linspace(-103.9, -87.34, 4001, dtype=F32)
    err = np.abs(twin.exp_f32(x).astype(np.float64) - np.exp(x.astype(np.float64)))
    assert err.max() <= 2.0**-149
    y = twin.exp_f32(np.array([88.72, 88.73, 1e30, np.inf, -104.0, -1e30, -np.inf, np.nan, 0.0, -0.0], F32))
    assert np.isfinite(y[0]) and np.all(np.isposinf(y[1:4]))
    assert np.all(y[4:7] == 0) and np.isnan(y[7]) and np.all(y[8:] == 1)


def test_fused_exp_within_stated_ulps_of_exact() -> None:
    """(EN1)-(EN6), the sigmoid's exp: bound 1.05 ulp for normal results (measured max
    1.0095 at x = −59.92 on these 2^22 + 2^18 + 2^16 inputs; (E1)-(E6) measures 0.98 on
    them: the fmas change which inputs round up, not the polynomial's accuracy). Below
    FLT_MIN: within 2^-149 of e^x, as (E6)."""
    rng = np.random.default_rng(1)
    x = np.concatenate(
        [rng.uniform(-87.33, 0, 1 << 22), -rng.uniform(0, 1, 1 << 18), -(2.0 ** rng.uniform(-40, 0, 1 << 16))]
    ).astype(F32)
    err = ulp_error(twin.exp_fused_nonpositive_f32(x), np.exp(x.astype(np.float64)))
    assert err.max() <= 1.05, (err.max(), x[np.argmax(err)])
    tail = np.linspace(-103.9, -87.34, 4001, dtype=F32)
    err = np.abs(twin.exp_fused_nonpositive_f32(tail).astype(np.float64) - np.exp(tail.astype(np.float64)))
    assert err.max() <= 2.0**-149
    y = twin.exp_fused_nonpositive_f32(np.array([-104.0, -1e30, -np.inf, np.nan, 0.0, -0.0, -1e-45], F32))
    assert np.all(y[:3] == 0) and np.isnan(y[3]) and np.all(y[4:] == 1)


def test_sigmoid_exp_is_the_fused_form_every_isa() -> None:
    """Deny coincidence: on inputs where (EN1)-(EN6) and (E1)-(E6) round differently,
    every ISA's sigmoid and SiLU follow (Σ2) on the fused exp, and not on (E1)-(E6)."""
    rng = np.random.default_rng(5)
    x = -rng.uniform(0, 87, 1 << 16).astype(F32)
    fused, plain = twin.exp_fused_nonpositive_f32(x), twin.exp_f32(x)
    x = x[fused != plain][:1000]
    assert x.size > 100
    e = twin.exp_fused_nonpositive_f32(x)
    expected = e / (F32(1) + e)
    e_plain = twin.exp_f32(x)
    assert np.any(expected != e_plain / (F32(1) + e_plain))
    every_isa(lambda isa: assert_same(expected, _native.unary_f32("sigmoid", x), "sigmoid", isa=isa))
    every_isa(lambda isa: assert_same(x * expected, _native.unary_f32("silu", x), "silu", isa=isa))


# --------------------------------------------------------------------------------------
# the lane reduction (R1)-(R3)
# --------------------------------------------------------------------------------------


def sum16_by_definition(row: np.ndarray) -> np.float32:
    """(R1)-(R3) one float32 scalar at a time."""
    acc = [F32(0)] * 16
    for i, v in enumerate(row):
        acc[i % 16] = F32(acc[i % 16] + v)
    h = 8
    while h >= 1:
        for j in range(h):
            acc[j] = F32(acc[j] + acc[j + h])
        h //= 2
    return acc[0]


@pytest.mark.parametrize("d", [*ROW_LENGTHS, 1000])
def test_sum16_is_the_stated_lane_order_not_pairwise(d) -> None:
    """Hazard: NumPy's np.sum is pairwise (blocks of 8 unrolled, then halves), which
    C++ would have to copy. Rows with a large first element per lane and many small
    ones make sequential and pairwise orders give different float32 sums; the twin must
    give the (R1)-(R3) result, element by element."""
    rng = np.random.default_rng(d)
    rows = rng.standard_normal((3, d)).astype(F32)
    rows[:, :16] *= F32(1e7)
    got = twin.sum16(rows)
    for r in range(3):
        assert got[r].tobytes() == sum16_by_definition(rows[r]).tobytes()


# --------------------------------------------------------------------------------------
# Softmax
# --------------------------------------------------------------------------------------


@st.composite
def softmax_rows(draw):
    d = draw(st.sampled_from(SOFTMAX_ROW_LENGTHS))
    rows = draw(st.integers(1, 9))  # groups of 4 rows in lockstep and a remainder
    seed = draw(st.integers(0, 2**16))
    scale = draw(st.sampled_from([1.0, 10.0, 1e4, 1e38]))
    shift = draw(st.sampled_from([0.0, -50.0, 1e6]))
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        x = (rng.standard_normal((rows, d)) * scale + shift).astype(F32)
    mask = draw(st.sampled_from(["none", "some", "row", "-3.4e38"]))
    if mask == "some":
        x[rng.random(x.shape) < 0.3] = -np.inf
    elif mask == "row":
        x[0] = -np.inf  # a fully masked row: NaN, as the previous reference gave
    elif mask == "-3.4e38":
        x[:, d // 2 :] = F32(-3.4e38)  # the HF-style additive mask of the encoder block
    return x


@given(x=softmax_rows())
def test_softmax_native_matches_twin_every_isa(x) -> None:
    expected = twin.softmax_rows(x)
    every_isa(
        lambda isa: assert_same(expected, _native.softmax_f32(x), "softmax_f32", isa=isa, shape=x.shape)
    )


def test_softmax_fully_masked_row_is_nan_and_nan_rows_propagate() -> None:
    x = np.zeros((4, 17), F32)
    x[0] = -np.inf
    x[1, 3] = np.nan
    x[2, 5] = np.inf
    expected = twin.softmax_rows(x)
    assert np.isnan(expected[:3]).all() and not np.isnan(expected[3]).any()
    every_isa(lambda isa: assert_same(expected, _native.softmax_f32(x), "softmax_f32", isa=isa))


@pytest.mark.parametrize("d", [7, 17, 128, 259])
@pytest.mark.parametrize("mask", ["-inf", "-FLT_MAX", "-1e4", "mixed"])
def test_softmax_masked_rows_match_twin_every_isa(d: int, mask: str) -> None:
    """Padding set by an attention mask: x − m is at most −104 in the masked lanes, e = 0
    (E1). AVX2 computes the results below FLT_MIN (n ≤ −126 in (E6)) as integer units of
    2^−149 instead of through a subnormal product (a microcode assist per vector); the
    bytes stay the twin's. "mixed" puts each mask value, and gaps of −80 … −110 (results
    that are subnormal or round to 0 at the edge), in the same vectors as live logits; the
    row lengths end in tails of 7, 1 and 3."""
    rng = np.random.default_rng(d)
    x = (rng.standard_normal((12, d)) * 3).astype(F32)
    fill = {"-inf": -np.inf, "-FLT_MAX": np.finfo(F32).min, "-1e4": F32(-1e4)}
    if mask == "mixed":
        pick = rng.integers(0, 5, x.shape)
        x[pick == 1] = -np.inf
        x[pick == 2] = np.finfo(F32).min
        x[pick == 3] = F32(-1e4)
        x[pick == 4] = rng.uniform(-110.0, -80.0, int((pick == 4).sum())).astype(F32)
        x[:, 0] = F32(0.0)
    else:
        x[:, d // 3 :] = fill[mask]  # the padded tail of every row
        x[-1, d // 5 :] = fill[mask]
    expected = twin.softmax_rows(x)
    every_isa(
        lambda isa: assert_same(expected, _native.softmax_f32(x), "softmax_f32", isa=isa, d=d, mask=mask)
    )


def test_softmax_results_below_flt_min_match_twin_every_isa() -> None:
    """Rows [0, τ] for every float32 τ in a dense sweep of [−110, −80] (step 2^−9): e = exp(τ)
    covers every n of (E6) from −150 to −116 (subnormal, rounding to 0, FLT_MIN), and the
    row sum is 1 + e, so y_1 = e · f32(1 / s) keeps e's bits to within that product."""
    tau = np.arange(-110.0, -80.0, 2.0**-9).astype(F32)
    x = np.stack([np.zeros_like(tau), tau], axis=1)
    x = np.concatenate([x, np.tile(x[:, ::-1], (1, 9))], axis=1)  # a 20-long row: a tail too
    expected = twin.softmax_rows(x)
    assert (expected[:, 1] > 0).any() and (expected[:, 1] < np.finfo(F32).tiny).any()
    every_isa(lambda isa: assert_same(expected, _native.softmax_f32(x), "softmax_f32", isa=isa))


def test_softmax_threads_1_and_2_identical() -> None:
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((1, 6, 128, 128)) * 4).astype(F32)  # 6 row chunks
    x[..., 100:] = -np.inf

    def check(isa: str) -> None:
        one = _native.softmax_f32(x, num_threads=1)
        assert_same(one, _native.softmax_f32(x, num_threads=2), "softmax_f32 threads", isa=isa)
        assert_same(twin.softmax_rows(x.reshape(-1, 128)).reshape(x.shape), one, "softmax_f32", isa=isa)

    every_isa(check)


@given(x=softmax_rows())
def test_softmax_threads_1_and_2_identical_every_isa(x) -> None:
    """Rows split across threads (and 4-row lockstep groups cut differently) give the same
    bytes; threads 2 on a small input runs one chunk, so the rows are also repeated to
    make several chunks."""
    big = np.ascontiguousarray(np.tile(x, (max(1, 20000 // x.size), 1)))

    def check(isa: str) -> None:
        for v in (x, big):
            assert_same(_native.softmax_f32(v, 1), _native.softmax_f32(v, 2), "softmax_f32 threads", isa=isa)

    every_isa(check)


def test_softmax_is_a_product_by_the_reciprocal_of_the_sum() -> None:
    """(S4)-(S5) one row at a time in float32 scalars: y_i = f32(e_i · f32(1 / s)), not
    f32(e_i / s); the row is chosen so that the two differ for some i."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 37)).astype(F32)
    e = twin.exp_f32(x - twin.row_max(x)[:, None])
    s = twin.sum16(e)[0]
    r = F32(F32(1) / s)
    by_product = np.array([[F32(v * r) for v in e[0]]], F32)
    assert (by_product != e / s).any()  # the row tells the two definitions apart
    assert_same(by_product, twin.softmax_rows(x), "twin (S5)")
    every_isa(lambda isa: assert_same(by_product, _native.softmax_f32(x), "softmax_f32 (S5)", isa=isa))


@pytest.mark.parametrize("fused", [False, True])
def test_softmax_twin_accuracy_against_float64(fused: bool) -> None:
    """Relative error of y_i vs float64 softmax of the same float32 x, first order in u:
    u·|τ_i| from rounding τ_i = x_i − m (S2), 2u from exp (1 ulp; (EN1)-(EN6), which
    quanta::SoftmaxQuant's rows use, 1.01), u·(τ̄ + 2) for the sum's terms (τ̄ = Σ ŷ_j
    |τ_j|), (B + 4)u for B = ceil(D/16) lane additions and 4 tree levels (S3), u for the
    reciprocal (S4) and u for the product (S5): |y_i − ŷ_i| <= u·(|τ_i| + τ̄ + B + 10)·ŷ_i,
    plus 2^-147 absolute for results below FLT_MIN."""
    rng = np.random.default_rng(11)
    for d in SOFTMAX_ROW_LENGTHS:
        x = (rng.standard_normal((16, d)) * 8).astype(F32)
        y = twin.softmax_rows(x, fused=fused).astype(np.float64)
        x64 = x.astype(np.float64)
        tau = x64 - x64.max(axis=1, keepdims=True)
        exact = np.exp(tau) / np.exp(tau).sum(axis=1, keepdims=True)
        tau_bar = (exact * np.abs(tau)).sum(axis=1, keepdims=True)
        bound = U * (np.abs(tau) + tau_bar + math.ceil(d / 16) + 10) * exact + 2.0**-147
        assert np.all(np.abs(y - exact) <= bound), (d, np.max(np.abs(y - exact) / bound))


# --------------------------------------------------------------------------------------
# LayerNormalization
# --------------------------------------------------------------------------------------


def layer_norm_twin(x2: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, eps: float):
    d, mean, inv_std = twin.layer_norm_rows(x2, F32(eps))
    y = (d * inv_std[:, None]) * scale
    if bias is not None:
        y = y + bias
    return y, mean, inv_std


@given(
    d=st.sampled_from(ROW_LENGTHS),
    rows=st.integers(1, 5),
    seed=st.integers(0, 2**16),
    offset=st.sampled_from([0.0, 3.0, -1e4]),
    spread=st.sampled_from([1e-3, 1.0, 1e3]),
    with_bias=st.booleans(),
    eps=st.sampled_from([1e-5, 1e-12, 0.1]),
)
def test_layer_norm_native_matches_twin_every_isa(d, rows, seed, offset, spread, with_bias, eps) -> None:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, d)) * spread + offset).astype(F32)
    scale = (1 + 0.1 * rng.standard_normal(d)).astype(F32)
    bias = (0.1 * rng.standard_normal(d)).astype(F32) if with_bias else None
    y, mean, inv_std = layer_norm_twin(x, scale, bias, eps)

    def check(isa: str) -> None:
        ctx = {"isa": isa, "shape": x.shape, "eps": eps, "bias": with_bias}
        got = _native.layer_norm_f32(x, scale, bias, 1, float(F32(eps)), stats=True)
        assert_same(y, got[0], "layer_norm_f32 y", **ctx)
        assert_same(mean.reshape(rows, 1), got[1], "layer_norm_f32 mean", **ctx)
        assert_same(inv_std.reshape(rows, 1), got[2], "layer_norm_f32 inv_std", **ctx)
        assert_same(y, _native.layer_norm_f32(x, scale, bias, -1, float(F32(eps))), "layer_norm_f32", **ctx)

    every_isa(check)


def test_layer_norm_threads_1_and_2_identical_and_constant_rows() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((256, 384)).astype(F32)  # 6 row chunks
    x[7] = F32(2.5)  # a constant row: d = 0, var = 0, y = bias
    scale, bias = rng.standard_normal(384).astype(F32), rng.standard_normal(384).astype(F32)
    y, _, _ = layer_norm_twin(x, scale, bias, 1e-5)
    assert np.array_equal(y[7], bias)

    def check(isa: str) -> None:
        one = _native.layer_norm_f32(x, scale, bias, 1, float(F32(1e-5)), num_threads=1)
        two = _native.layer_norm_f32(x, scale, bias, 1, float(F32(1e-5)), num_threads=2)
        assert_same(one, two, "layer_norm_f32 threads", isa=isa)
        assert_same(y, one, "layer_norm_f32", isa=isa)

    every_isa(check)


@pytest.mark.parametrize("d", [5, 11, 17, 219, 300])
def test_layer_norm_constant_rows_whose_sum_rounds(d: int) -> None:
    """(L1c): a row of one repeated value whose sum16 / D rounds away from it (a silent
    frame of a log-magnitude spectrum, -115.47726 dB) normalizes to exactly 0, so y = bias
    — without the clamp d_i is the mean's rounding error times 1/sqrt(eps), 0.005 and more.
    Rows around it (random, nearly constant, with NaN) still match the twin bit for bit."""
    rng = np.random.default_rng(d)
    values = [F32(-115.47726), F32(123.456), F32(7.3e-3), F32(-3.3333333)]
    rows = len(values) + 3
    x = (rng.standard_normal((rows, d)) * 5 - 40).astype(F32)
    for r, v in enumerate(values):
        x[r] = v
    x[len(values)] = values[0]
    x[len(values), 1] = np.nextafter(values[0], F32(0))  # nearly constant: one ulp apart
    x[len(values) + 1, d // 2] = np.nan
    scale = (1 + 0.3 * rng.standard_normal(d)).astype(F32)
    bias = (0.2 * rng.standard_normal(d)).astype(F32)
    y, mean, _ = layer_norm_twin(x, scale, bias, 1e-5)
    plain_means = twin.sum16(x[: len(values)]) / F32(d)
    assert any(m != v for m, v in zip(plain_means, values, strict=True)), "no row's (L1) rounds: weak test"
    for r, v in enumerate(values):
        assert mean[r] == v, (d, r, mean[r], v)
        assert np.array_equal(y[r], bias), (d, r, np.max(np.abs(y[r] - bias)))
    assert np.all(np.isnan(y[len(values) + 1]))
    assert np.all(np.isfinite(y[len(values)])) and np.all(np.isfinite(y[-1]))

    def check(isa: str) -> None:
        got = _native.layer_norm_f32(x, scale, bias, 1, float(F32(1e-5)), stats=True)
        assert_same(y, got[0], "layer_norm_f32 y", isa=isa, d=d)
        assert_same(mean.reshape(rows, 1), got[1], "layer_norm_f32 mean", isa=isa, d=d)
        assert_same(
            y, _native.layer_norm_f32(x, scale, bias, -1, float(F32(1e-5))), "layer_norm_f32", isa=isa, d=d
        )

    every_isa(check)


def test_layer_norm_twin_accuracy_against_float64() -> None:
    """z = (x − μ)/sqrt(v + eps) (scale 1, bias 0) vs float64. First order in u, with
    B = ceil(D/16), A = Σ|x|/D: the mean errs by Δμ <= u·((B + 4)·A + |μ|) (B + 4
    additions, one division); d_i by Δμ + u|δ_i|; the variance by (B + 8)u relative
    (square, B + 4 additions, division, the error of d) plus (Δμ/σ)²; inv_std by half of
    that plus 2u (add eps, sqrt, reciprocal); z by one more u:
    |ẑ − z| <= 1.01·Δμ/σ' + |z|·u·((B + 8)/2 + 5), σ' = sqrt(v + eps)."""
    rng = np.random.default_rng(12)
    for d in ROW_LENGTHS[1:]:
        for offset in (0.0, 5.0, -300.0):
            x = (rng.standard_normal((8, d)) + offset).astype(F32)
            z, _, _ = layer_norm_twin(x, np.ones(d, F32), None, 1e-5)
            x64 = x.astype(np.float64)
            mu = x64.mean(axis=1, keepdims=True)
            sigma = np.sqrt(((x64 - mu) ** 2).mean(axis=1, keepdims=True) + float(F32(1e-5)))
            exact = (x64 - mu) / sigma
            blocks = math.ceil(d / 16)
            d_mu = U * ((blocks + 4) * np.abs(x64).mean(axis=1, keepdims=True) + np.abs(mu))
            bound = 1.01 * d_mu / sigma + np.abs(exact) * U * ((blocks + 8) / 2 + 5)
            err = np.abs(z.astype(np.float64) - exact)
            assert np.all(err <= bound), (d, offset, np.max(err / bound))


# --------------------------------------------------------------------------------------
# binary Add / Sub / Mul / Div
# --------------------------------------------------------------------------------------

#: (a shape, b shape, reason)
BROADCASTS = [
    ((2, 3, 17), (2, 3, 17), "same shape, odd inner run"),
    ((1, 128, 384), (384,), "bias add: trailing block"),
    ((1, 6, 128, 128), (1, 1, 1, 128), "attention mask add"),
    ((5, 7), (), "scalar b"),
    ((), (5, 7), "scalar a"),
    ((1,), (33,), "one-element a"),
    ((9, 1), (1, 13), "outer product"),
    ((3, 1, 5), (1, 4, 1), "both broadcast in alternating dims"),
    ((4, 3, 1, 1), (3, 7, 17), "per-channel (C,1,1) against a rank-3 b"),
    ((2, 0, 3), (3,), "empty output"),
    # tile rows (binary_tile.h): a short run both step, the dimension around it repeats one
    ((1, 6, 7, 5, 16), (1, 6, 1, 1, 16), "blocked per-channel gate: rows of 16"),
    ((1, 1, 1, 16), (2, 3, 9, 16), "blocked, the repeated run on the left"),
    ((3, 17, 24), (3, 1, 24), "rows of 24 (3 vectors), a stepping outer dimension"),
    ((2, 7, 13, 7), (2, 1, 1, 7), "rows of 7 (no whole vector)"),
    ((5, 11, 259), (5, 1, 259), "rows past the tile limit (256): the generic runs"),
]
OPS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


def binary_operand(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """Normal values with IEEE specials (NaN, ±inf, ±0, subnormals, huge) sprinkled in."""
    x = np.array(rng.standard_normal(shape) * 3, F32)
    flat = x.reshape(-1)
    if flat.size:
        k = rng.integers(0, flat.size, size=max(1, flat.size // 8))
        flat[k] = rng.choice(
            np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -3e38, 3e38], F32), size=k.size
        )
    return x


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize(("a_shape", "b_shape", "reason"), BROADCASTS, ids=[r for _, _, r in BROADCASTS])
def test_binary_native_matches_numpy_every_isa(op, a_shape, b_shape, reason) -> None:
    rng = np.random.default_rng(abs(hash((op, a_shape, b_shape))) % 2**32)
    a, b = binary_operand(rng, a_shape), binary_operand(rng, b_shape)
    with np.errstate(all="ignore"):
        expected = np.asarray(OPS[op](a, b), F32)

    def check(isa: str) -> None:
        for threads in (1, 2):
            got = _native.binary_f32(op, a, b, num_threads=threads)
            assert_same(
                expected, got, f"binary_f32 {op}", isa=isa, a=a_shape, b=b_shape, threads=threads, why=reason
            )

    every_isa(check)


@pytest.mark.parametrize("op", ["max", "min", "prelu"])
def test_binary_tile_rows_of_the_other_ops_are_numpys(op) -> None:
    """Max / Min / PRelu on tile rows walk each ISA's runs row by row: NumPy's maximum /
    minimum (NaN propagates) and where(a < 0, a·b, a)."""
    rng = np.random.default_rng(17)
    a, b = binary_operand(rng, (1, 3, 9, 11, 16)), binary_operand(rng, (1, 3, 1, 1, 16))
    with np.errstate(all="ignore"):
        expected = {
            "max": np.maximum(a, b),
            "min": np.minimum(a, b),
            "prelu": np.where(a < 0, a * b, a).astype(F32),
        }[op]

    def check(isa: str) -> None:
        for threads in (1, 2):
            assert_same(
                expected, _native.binary_f32(op, a, b, num_threads=threads), op, isa=isa, threads=threads
            )

    every_isa(check)


def test_binary_tile_rows_large_threads_identical() -> None:
    """A blocked SE gate of PP-OCRv3's neck size (96 channels, 40 x 30): thread chunks split
    the rows, 1 and 2 threads give NumPy's bytes."""
    rng = np.random.default_rng(9)
    a, b = binary_operand(rng, (1, 6, 40, 30, 16)), binary_operand(rng, (1, 6, 1, 1, 16))
    for op in ("mul", "add"):
        with np.errstate(all="ignore"):
            expected = np.asarray(OPS[op](a, b), F32)

        def check(isa: str, op: str = op, expected: np.ndarray = expected) -> None:
            for t in (1, 2):
                assert_same(expected, _native.binary_f32(op, a, b, num_threads=t), op, isa=isa, threads=t)

        every_isa(check)


def test_binary_threads_1_and_2_identical_large() -> None:
    rng = np.random.default_rng(8)
    a, b = binary_operand(rng, (1, 6, 128, 128)), binary_operand(rng, (1, 1, 1, 128))
    every_isa(
        lambda isa: assert_same(
            _native.binary_f32("div", a, b, num_threads=1),
            _native.binary_f32("div", a, b, num_threads=2),
            isa,
        )
    )


# --------------------------------------------------------------------------------------
# elementwise: erf, tanh, sigmoid, relu, Gelu
# --------------------------------------------------------------------------------------

#: op name of _native.unary_f32 -> its NumPy twin
UNARY = {
    "erf": twin.erf_f32,
    "tanh": twin.tanh_f32,
    "sigmoid": twin.sigmoid_f32,
    "relu": lambda v: np.maximum(v, np.zeros((), F32)),  # nn.relu, the reference itself
    "gelu": twin.gelu_f32,
    "gelu_tanh": twin.gelu_tanh_f32,
    "mlas_logistic": mlas_logistic,  # ONNX Runtime's Sigmoid and Tanh (reference/ort_float.py)
    "mlas_tanh": mlas_tanh,
    "silu": lambda v: v * twin.sigmoid_f32(v),  # a SiLU gate's Sigmoid then Mul (nn_conv's fused gate)
    "log": twin.log_f32,
    "cos": twin.cos_f32,
    "sin": twin.sin_f32,
    "expm1": twin.expm1_f32,
    "gelu_tanh_mlas": mlas_gelu_tanh,  # (G2) with MLAS's tanh (quanta::MlasGeluTanh)
    "atan": twin.atan_f32,
}
#: lengths with reasons: 1, 15/16/17 (one zmm ± 1, AVX2 two ymm ± 1), 63/65 (tails of 15
#: and 1 after 4 blocks), 300, 1000 (odd tails, 8-lane tails of 4 and 0)
UNARY_LENGTHS = [1, 15, 16, 17, 63, 65, 300, 1000]


def unary_specials() -> np.ndarray:
    """The splits and clamps of (F1)-(F5), (T1)-(T4), (Σ1)-(Σ2), (LN2), (LN4), (X3), (AT2) and of the MLAS
    functions (9, 18), their float32 neighbours,
    and IEEE specials (NaN, ±inf, ±0, subnormals, huge)."""
    edges = np.array(
        [0.921875, 3.925, 3.919206, 3.9, 4.0, 0.75, 9.011, 44.36, 0.5, 1.0, 2.0, 87.34, 88.73, 104.0, 1e-20,
         1.2e-38, 1e-40, 1e-45, 1e30, 3.4e38, np.inf, 9.0, 18.0, 0.70710677, 1.1754944e-38, 0.34657359,
         0.41421357, 2.4142137],
        F32,
    )  # fmt: skip
    around = np.concatenate([edges, np.nextafter(edges, F32(0)), np.nextafter(edges, F32(np.inf))])
    return np.concatenate([[np.nan, -np.nan, 0.0, -0.0], around, -around]).astype(F32)


@st.composite
def unary_inputs(draw) -> np.ndarray:
    n = draw(st.sampled_from(UNARY_LENGTHS))
    seed = draw(st.integers(0, 2**16))
    center = draw(st.sampled_from([0.0, 0.5, -0.5, 3.9, -3.9, 4.0, -4.0, 1e30]))
    spread = draw(st.sampled_from([1e-3, 0.3, 3.0, 100.0]))
    rng = np.random.default_rng(seed)
    x = (center + spread * rng.standard_normal(n)).astype(F32)
    k = rng.integers(0, n, size=max(1, n // 7))  # specials sprinkled at random places
    x[k] = rng.choice(unary_specials(), size=k.size)
    return x


@pytest.mark.parametrize("op", sorted(UNARY))
@given(x=unary_inputs())
def test_unary_native_matches_twin_every_isa_and_threads(op, x) -> None:
    with np.errstate(all="ignore"):
        expected = UNARY[op](x)

    def check(isa: str) -> None:
        for threads in (1, 2):
            got = _native.unary_f32(op, x, num_threads=threads)
            assert_same(expected, got, f"unary_f32 {op}", isa=isa, n=x.size, threads=threads)

    every_isa(check)


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_native_matches_twin_on_specials_and_a_sweep(op) -> None:
    """Every float32 neighbour of the splits, plus a dense sweep and 2 threads over
    several 16 K-element chunks (chunk borders at multiples of 2^14, not of 16 * 3)."""
    x = np.concatenate([unary_specials(), np.linspace(-12, 12, 50001, dtype=F32)])
    with np.errstate(all="ignore"):
        expected = UNARY[op](x)

    def check(isa: str) -> None:
        assert_same(expected, _native.unary_f32(op, x), f"unary_f32 {op}", isa=isa)
        assert_same(expected, _native.unary_f32(op, x, num_threads=2), f"unary_f32 {op} 2 threads", isa=isa)

    every_isa(check)


def erf64(x: np.ndarray) -> np.ndarray:
    """float64 erf (math.erf: correctly rounded to within 1 ulp of double), element-wise."""
    return np.vectorize(math.erf, otypes=[np.float64])(np.asarray(x, np.float64))


def erf_ulp_sample() -> np.ndarray:
    """Every 61st float32 in [2^-30, 4) (about 16 M / 61 = 260 K values across all binades
    and both branches) plus every float32 within 2^12 ulps of the split 0.921875 and of
    0.95196897, where the exhaustive maximum sits."""
    lo, hi = int(np.float32(2.0**-30).view(np.uint32)), int(np.float32(4.0).view(np.uint32))
    split = int(twin.ERF_SPLIT.view(np.uint32))
    worst = int(np.float32(0.95196897).view(np.uint32))
    bits = np.concatenate(
        [
            np.arange(lo, hi, 61 * 64),
            np.arange(split - 4096, split + 4096),
            np.arange(worst - 4096, worst + 4096),
        ]
    )
    return bits.astype(np.uint32).view(F32)


def erf_separately_rounded(x: np.ndarray) -> np.ndarray:
    """(F1)-(F5) with each product and sum rounded on its own and exp (E1)-(E6): what the
    erf kernels would compute without the fmas, to tell the two apart."""
    t = np.minimum(np.abs(x), twin.ERF_T_MAX)
    s = t * t
    p = np.full_like(t, twin.ERF_SMALL[0])
    for c in twin.ERF_SMALL[1:]:
        p = p * s + c
    q = np.full_like(t, twin.ERF_BIG[0])
    for c in twin.ERF_BIG[1:]:
        q = q * t + c
    big = F32(1) - twin.exp_f32(-(q * t + t))
    return np.copysign(np.where(t > twin.ERF_SPLIT, big, p * t + t), x)


def test_erf_and_gelu_are_the_fma_form_every_isa() -> None:
    """Deny coincidence: on inputs (both branches of (F5), odd count, both signs) where
    the fma form of (F3)-(F4) with exp (EN1)-(EN6) and the separately rounded form give
    different erf values, every ISA's erf and Gelu (G1) give the twin's bits."""
    rng = np.random.default_rng(12)
    x = (rng.standard_normal(1 << 16) * 1.7).astype(F32)
    x = x[twin.erf_f32(x) != erf_separately_rounded(x)][:1001]
    assert x.size > 500
    small = np.abs(x) <= twin.ERF_SPLIT
    assert 100 < int(small.sum()) < x.size - 100 and np.any(x < 0) and np.any(x > 0)
    every_isa(lambda isa: assert_same(twin.erf_f32(x), _native.unary_f32("erf", x), "erf", isa=isa))
    g = x * twin.GELU_SQRT2  # erf(g / √2) of these g sits on a differing input for most
    g = g[twin.gelu_f32(g) != (F32(0.5) * g) * (F32(1) + erf_separately_rounded(g / twin.GELU_SQRT2))]
    assert g.size > 300
    every_isa(lambda isa: assert_same(twin.gelu_f32(g), _native.unary_f32("gelu", g), "gelu", isa=isa))


def test_erf_twin_within_stated_ulps_of_exact() -> None:
    """Bound 1.03 ulp (docs/float-ops.md): the maximum over EVERY float32 with |x| < 4
    is 1.0283 ulp at x = 0.95196897 (measured against float64 erf); below 2^-30, P(t²)
    rounds to A5 and erf(t)/t to 2/√π, so each binade repeats the error of [2^-30, 2^-29).
    This test checks a sample of that range against the exhaustive maximum."""
    x = erf_ulp_sample()
    err = ulp_error(twin.erf_f32(x), erf64(x.astype(np.float64)))
    assert err.max() <= 1.03, (err.max(), x[np.argmax(err)])
    y = twin.erf_f32(-x)
    assert np.array_equal(y, -twin.erf_f32(x))  # odd: copysign (F5)


def test_log_twin_within_stated_ulps_of_exact() -> None:
    """Bound 0.83 ulp (docs/float-ops.md "log": measured on every positive finite float32,
    maximum 0.8291 at x = 0.6999768): a sample of every binade, the neighbourhood of 1
    (results near 0) and of the split √½, and subnormals."""
    rng = np.random.default_rng(7)
    bits = rng.integers(1, 0x7F800000, 1 << 20, dtype=np.uint32)
    near = np.concatenate([np.linspace(0.69, 0.72, 1 << 14), np.linspace(0.999, 1.001, 1 << 14)])
    x = np.concatenate([bits.view(F32), near.astype(F32), np.array([0.6999768, 1e-45, 1e-40], F32)])
    err = ulp_error(twin.log_f32(x), np.log(x.astype(np.float64)))
    assert err.max() <= 0.83, (err.max(), x[np.argmax(err)])


def test_cos_twin_within_stated_ulps_of_exact() -> None:
    """docs/float-ops.md "cos": |ŷ − cos x| <= 1.55 ulp of the result or 1e-7 absolute
    (near the zeros of cos, where the result is tiny and the reduction's error in z
    dominates), for |x| <= 8192."""
    rng = np.random.default_rng(3)
    x = np.concatenate(
        [rng.uniform(-8192, 8192, 1 << 20), rng.uniform(-4, 4, 1 << 18), np.pi / 2 * np.arange(-100, 101)]
    ).astype(F32)
    exact = np.cos(x.astype(np.float64))
    err = np.abs(twin.cos_f32(x).astype(np.float64) - exact)
    allowed = np.maximum(1.55 * np.spacing(np.abs(exact).astype(F32)).astype(np.float64), 1e-7)
    assert (err <= allowed).all(), (err / allowed).max()


def test_atan_twin_within_stated_ulps_of_exact() -> None:
    """docs/float-ops.md "atan": |ŷ − atan x| <= 2.8 ulp of the result over the whole
    float32 range, the branch points tan(π/8) and tan(3π/8) and their neighbours included."""
    rng = np.random.default_rng(5)
    edges = np.array([0.41421357, 2.4142137, 1.0], F32)
    x = np.concatenate(
        [
            rng.uniform(-4, 4, 1 << 20),
            np.exp(rng.uniform(-85, 85, 1 << 18)) * rng.choice([-1.0, 1.0], 1 << 18),
            edges,
            np.nextafter(edges, F32(0)),
            np.nextafter(edges, F32(np.inf)),
        ]
    ).astype(F32)
    x = x[x != 0]
    exact = np.arctan(x.astype(np.float64))
    assert ulp_error(twin.atan_f32(x), exact).max() <= 2.8


def test_atan_twin_edges() -> None:
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-45, 3e38], F32)
    y = twin.atan_f32(x)
    assert y[0] == 0 and not np.signbit(y[0]) and y[1] == 0 and np.signbit(y[1])
    assert y[2] == np.float32(np.pi / 2) and y[3] == -np.float32(np.pi / 2) and np.isnan(y[4])
    assert y[5] == x[5] and y[6] == x[6] and y[7] == np.float32(np.pi / 2)  # atan x = x below 2^-12
    v = np.linspace(-50, 50, 1001, dtype=F32)
    assert np.array_equal(twin.atan_f32(v), -twin.atan_f32(-v))  # odd, bit for bit


def test_cos_twin_edges() -> None:
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, 3e38], F32)
    y = twin.cos_f32(x)
    assert y[0] == y[1] == y[5] == 1 and np.isnan(y[2:5]).all() and abs(y[6]) <= 1
    v = np.linspace(-50, 50, 1001, dtype=F32)
    assert np.array_equal(twin.cos_f32(v), twin.cos_f32(-v))  # even, bit for bit


#: docs/float-ops.md "sin", measured on every float32 in (0, 8192] (native kernel, equal
#: to the twin; sin is odd bit for bit): 1.5621 ulp at most where |sin x| > 1e-3
#: (x = 2265.6082), 7.78e-8 absolute at most (x = 1204.019), 0.805 ulp for |x| < π/4
SIN_ULPS = 1.57
SIN_ABS = 1e-7


def test_sin_twin_within_stated_ulps_of_exact() -> None:
    """docs/float-ops.md "sin": |ŷ − sin x| <= SIN_ULPS ulp of the result or SIN_ABS
    absolute (near the zeros of sin, x ≈ kπ with k ≠ 0, where the result is tiny and the
    reduction's error in z dominates), for |x| <= 8192; small |x| and subnormals are
    within the ulp bound (the reduction is exact there)."""
    rng = np.random.default_rng(4)
    x = np.concatenate(
        [
            rng.uniform(-8192, 8192, 1 << 20),
            rng.uniform(-4, 4, 1 << 18),
            np.pi * np.arange(-100, 101),
            np.pi / 2 * np.arange(-100, 101),
            np.exp(rng.uniform(np.log(1e-44), np.log(0.8), 1 << 16)),
        ]
    ).astype(F32)
    exact = np.sin(x.astype(np.float64))
    err = np.abs(twin.sin_f32(x).astype(np.float64) - exact)
    allowed = np.maximum(SIN_ULPS * np.spacing(np.abs(exact).astype(F32)).astype(np.float64), SIN_ABS)
    assert (err <= allowed).all(), (err / allowed).max()
    small = np.abs(x) < 0.78
    ulps = err[small] / np.spacing(np.abs(exact[small]).astype(F32)).astype(np.float64)
    assert ulps.max() <= 0.81


def test_sin_twin_edges() -> None:
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-45, 3e38], F32)
    y = twin.sin_f32(x)
    assert y[0] == 0 and not np.signbit(y[0]) and y[1] == 0 and np.signbit(y[1])  # sin(±0) = ±0
    assert np.isnan(y[2:5]).all() and y[5] == x[5] and y[6] == x[6] and abs(y[7]) <= 1
    v = np.linspace(-50, 50, 1001, dtype=F32)
    assert np.array_equal(twin.sin_f32(-v), -twin.sin_f32(v))  # odd, bit for bit


def test_log_twin_edges_are_exact() -> None:
    x = np.array([0.0, -0.0, np.inf, -np.inf, -1.0, -1e-45, np.nan, 1.0, 2.0, 0.5], F32)
    y = twin.log_f32(x)
    assert np.array_equal(y[:3], [-np.inf, -np.inf, np.inf]) and np.isnan(y[3:7]).all()
    assert y[7] == 0 and not np.signbit(y[7])  # log(1) = +0
    assert y[8] == np.float32(np.log(2.0)) and y[9] == -y[8]


def test_log_softmax_twin_accuracy_against_float64() -> None:
    """(LS1)-(LS5) against float64 log-softmax of the same float32 rows, first order in u:
    |ŷ − y| <= u·(3|t_i| + 3l + τ̄ + B + 6), t the float64 x − max, l = log Σ e^t,
    τ̄ = Σ_j p_j |t_j|, B = ⌈D/16⌉ (docs/float-ops.md "LogSoftmax"); and the native rows
    are the twin's on every ISA."""
    u = 2.0**-24
    rng = np.random.default_rng(11)
    for sigma in (1, 3, 8, 30):
        for d in (1, 16, 17, 128, 1000):
            v = (rng.standard_normal((64, d)) * sigma).astype(F32)
            y = twin.log_softmax_rows(v).astype(np.float64)
            v64 = v.astype(np.float64)
            t = v64 - v64.max(axis=1, keepdims=True)
            p = np.exp(t)
            logsum = np.log(p.sum(axis=1, keepdims=True))
            tau = (p / p.sum(axis=1, keepdims=True) * np.abs(t)).sum(axis=1, keepdims=True)
            bound = u * (3 * np.abs(t) + 3 * logsum + tau + -(-d // 16) + 6)
            excess = np.abs(y - (t - logsum)) / bound
            assert excess.max() <= 1.0, (sigma, d, excess.max())


def test_erf_twin_edges_are_exact() -> None:
    """±0 keeps its sign; subnormals are within 2^-149 (one subnormal step) of erf(x);
    |x| >= 3.919206 (from where float64 erf(x) rounds to 1 in float32) and ±inf give ±1
    exactly (the twin reaches 1 two float32 steps earlier, within its 1.03 ulp);
    NaN stays NaN."""
    sub = np.arange(0, 1 << 23, 997, dtype=np.uint32).view(F32)
    err = np.abs(twin.erf_f32(sub).astype(np.float64) - erf64(sub.astype(np.float64)))
    assert err.max() <= 2.0**-149
    big = np.concatenate([np.linspace(3.919206, 4.5, 3001, dtype=F32), [1e30, 3.4e38, np.inf]]).astype(F32)
    assert np.all(F32(erf64(np.float64(big[0]))) == 1)
    assert np.all(twin.erf_f32(big) == 1) and np.all(twin.erf_f32(-big) == -1)
    y = twin.erf_f32(np.array([0.0, -0.0, np.nan], F32))
    assert y[0] == 0 and not np.signbit(y[0]) and y[1] == 0 and np.signbit(y[1]) and np.isnan(y[2])


def test_tanh_and_sigmoid_twins_within_stated_ulps_of_exact() -> None:
    """tanh: bound 1.1 ulp (measured max 1.04 on every 37th float32 in [2^-12, 10]; the
    polynomial (T2) is a minimax fit to 2^-27 on [0, 0.75], (T3) has exp's 1 ulp times
    2/(e + 1) < 0.31 plus three roundings); sigmoid: bound 2.5 ulp (the fused exp's
    1.01 ulp, 1 + e 0.5, the division 0.5, plus e/(1 + e) carrying exp's error once more
    when x < 0; measured 2.4019 on every float32 with 2^-30 <= |x| <= 104)."""
    rng = np.random.default_rng(21)
    x = np.concatenate([rng.uniform(-10, 10, 1 << 18), 2.0 ** rng.uniform(-40, 3, 1 << 16)]).astype(F32)
    x = np.concatenate([x, -x])
    err = ulp_error(twin.tanh_f32(x), np.tanh(x.astype(np.float64)))
    assert err.max() <= 1.1, ("tanh", err.max(), x[np.argmax(err)])
    x64 = x.astype(np.float64)
    exact = np.where(x64 >= 0, 1 / (1 + np.exp(-x64)), np.exp(x64) / (1 + np.exp(x64)))
    err = ulp_error(twin.sigmoid_f32(x), exact)
    assert err.max() <= 2.5, ("sigmoid", err.max(), x[np.argmax(err)])
    edges = twin.tanh_f32(np.array([9.011, 1e30, np.inf, -np.inf, -0.0], F32))
    assert np.array_equal(edges[:4], [1, 1, 1, -1]) and np.signbit(edges[4])
    ends = twin.sigmoid_f32(np.array([-np.inf, -200.0, np.inf, 20.0], F32))
    assert np.array_equal(ends, [0, 0, 1, 1])


def test_expm1_twin_within_stated_ulps_of_exact() -> None:
    """(X1)-(X3) against float64 expm1, normal results. x < 0 (Elu's side): bound 1.45 ulp
    (measured with the native kernel on every float32 x < 0: 1.428 at x = −0.3467245,
    just past the split, where exp's 1 ulp of e^x ≈ 0.71 is up to 2 ulp of e^x − 1 ≈ −0.29
    and the subtraction is exact; 0.82 below the split). x > 0: bound 3.35 ulp (every
    float32 in (0, 88.72]: 3.325 at 0.3627326, where e^x − 1 ≈ 0.44 keeps a quarter of
    exp's bits). Tiny x gives x itself (x² underflows), ±0 gives +0, −inf −1, NaN NaN."""
    rng = np.random.default_rng(23)
    x = np.concatenate([rng.uniform(-20, 0, 1 << 20), -(2.0 ** rng.uniform(-40, -1, 1 << 18))]).astype(F32)
    err = ulp_error(twin.expm1_f32(x), np.expm1(x.astype(np.float64)))
    assert err.max() <= 1.45, (err.max(), x[np.argmax(err)])
    x = np.concatenate([rng.uniform(0, 88.7, 1 << 20), 2.0 ** rng.uniform(-40, -1, 1 << 18)]).astype(F32)
    err = ulp_error(twin.expm1_f32(x), np.expm1(x.astype(np.float64)))
    assert err.max() <= 3.35, (err.max(), x[np.argmax(err)])
    edges = np.array([1e-30, -1e-30, -0.0, -np.inf, np.nan, np.inf, 88.73], F32)
    y = twin.expm1_f32(edges)
    # expm1(−0) is +0 (−0 + (+0)·q): Elu never reads it (−0 is not < 0)
    assert np.array_equal(y[:3], edges[:3]) and not np.signbit(y[2]) and y[3] == -1 and np.isnan(y[4])
    assert np.all(np.isposinf(y[5:]))


def test_elu_twin_is_alpha_times_expm1_below_zero() -> None:
    """(EL): x < 0 ? f32(f32(α) · expm1(x)) : x; ±0, NaN and positive x pass through."""
    x = np.array([-3.0, -0.3, -1e-30, -0.0, 0.0, 2.5, np.nan, -np.inf, np.inf], F32)
    for alpha in (1.0, 0.5, 2.3):
        y = twin.elu_f32(x, alpha)
        expected = np.where(x < 0, F32(alpha) * twin.expm1_f32(x), x)
        assert_same(expected, y, "elu", alpha=alpha)
        assert np.signbit(y[3]) and not np.signbit(y[4]) and y[7] == -F32(alpha)


def elu_operand(rng: np.random.Generator, n: int) -> np.ndarray:
    """Values on both sides of 0 and of expm1's split (X3) with the edges Elu must pass
    through or clamp: ±0, NaN (both signs), ±inf, huge negatives (exp's clamp at −104),
    subnormals, the split's neighbours."""
    x = (rng.standard_normal(n) * 2).astype(F32)
    split = np.uint32(0x3EB17218).view(F32)
    edges = np.array(
        [0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, -1e30, -3.4e38, -104.0, -103.9, -87.4, -1e-40, 1e-40,
         -1e-45, -split, np.nextafter(-split, F32(0)), np.nextafter(-split, F32(-1)), -1e-30, 1e30],
        F32,
    )  # fmt: skip
    k = rng.integers(0, n, size=max(1, n // 5))
    x[k] = rng.choice(edges, size=k.size)
    return x


@pytest.mark.parametrize("n", [1, 7, 15, 16, 17, 31, 33, 63, 65, 300, 1000, (1 << 14) * 3 + 5])
@pytest.mark.parametrize("alpha", [1.0, 0.5, 2.3, 1e-3])
def test_elu_native_matches_twin_every_isa_and_threads(n, alpha) -> None:
    """The fused pass (EL): bit-exact with the twin on every ISA, 1 and 2 threads, tails of
    every length, alpha 1 (the product is exact) and not; -0 and NaN pass through, a
    whole vector of x >= 0 takes the copy path (the first 48 lanes are made non-negative)."""
    x = elu_operand(np.random.default_rng(n), n)
    x[:48] = np.abs(x[:48])
    with np.errstate(all="ignore"):
        expected = twin.elu_f32(x, alpha)

    def check(isa: str) -> None:
        for threads in (1, 2):
            got = _native.elu_f32(x, alpha, num_threads=threads)
            assert_same(expected, got, "elu_f32", isa=isa, n=n, alpha=alpha, threads=threads)
            assert np.array_equal(got.view(np.uint32)[x == 0], x.view(np.uint32)[x == 0])  # ±0 kept
        out = np.full_like(x, 7.0)
        assert _native.elu_f32(x, alpha, out=out) is out
        assert_same(expected, out, "elu_f32 out=", isa=isa, n=n, alpha=alpha)

    every_isa(check)


def test_elu_native_matches_twin_on_a_dense_negative_sweep() -> None:
    """Every float32 x in [−1, 0) at a stride of 7 ulps and a sweep to −120: both sides of
    the split, exp's clamp, and the 16-lane vectors all negative."""
    bits = np.arange(0xBF800000, 0x80000000, -7, dtype=np.int64)[:400000].astype(np.uint32)  # −1 toward −0
    x = np.concatenate([bits.view(F32), np.linspace(-120, 0, 100003, dtype=F32)])
    expected = twin.elu_f32(x, 1.0)
    every_isa(lambda isa: assert_same(expected, _native.elu_f32(x, 1.0), "elu_f32", isa=isa))


def test_elu_native_refuses_bad_arguments() -> None:
    x = np.zeros(5, F32)
    with pytest.raises(ValueError, match="elu_f32: x: expected dtype float32, got float64"):
        _native.elu_f32(x.astype(np.float64), 1.0)
    with pytest.raises(ValueError, match="elu_f32: out: expected shape"):
        _native.elu_f32(x, 1.0, out=np.zeros(4, F32))
    with pytest.raises(ValueError, match="overlap"):
        _native.elu_f32(x, 1.0, out=x)


# --------------------------------------------------------------------------------------
# float32 <-> float16 (cast_half): NumPy's astype, bit for bit
# --------------------------------------------------------------------------------------


def assert_same_bits(expected: np.ndarray, actual: np.ndarray, label: str, **context) -> None:
    """Same dtype and shape, identical bits (NaN payloads included)."""
    detail = ", ".join(f"{k}={v}" for k, v in context.items())
    assert expected.dtype == actual.dtype and expected.shape == actual.shape, (label, actual.dtype, detail)
    u = np.uint16 if expected.dtype.itemsize == 2 else np.uint32
    bad = np.flatnonzero(expected.view(u) != actual.view(u))
    assert bad.size == 0, (
        f"{label}: {bad.size} of {expected.size} differ; first at {bad[0]}: expected "
        f"{hex(int(expected.view(u)[bad[0]]))}, got {hex(int(actual.view(u)[bad[0]]))}; {detail}"
    )


def test_half_to_float32_every_half_every_isa() -> None:
    """All 65536 halves (NaN payloads, signalling ones included, subnormals, ±0, ±inf),
    then shifted by 0..15 so every NaN meets every lane and tail."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)

    def check(isa: str) -> None:
        for shift in (0, 1, 5, 15):
            v = h[shift:]
            for threads in (1, 2):
                assert_same_bits(
                    v.astype(F32), _native.cast_half(v, threads), "f16->f32", isa=isa, shift=shift
                )

    every_isa(check)


def float32_rounding_cases() -> np.ndarray:
    """float32 bit patterns around every rounding decision of float16: for each exponent
    every pattern of the top mantissa bits near the 13-bit cut (ties, ties ± 1, the half
    ulp's neighbours), both signs; NaNs of every top-payload pattern, signalling and
    quiet; the overflow edge 65504 .. 65520 .. 65536 and the subnormal halves."""
    exps = np.arange(256, dtype=np.uint32) << 23
    low = np.array(
        [0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x2FFF, 0x3000, 0x3001, 0x7FFFFF - 0x1FFF], np.uint32
    )
    tops = np.arange(0, 1 << 10, 37, dtype=np.uint32) << 13
    mant = (tops[:, None] + low[None, :]).reshape(-1) & np.uint32(0x7FFFFF)
    bits = (exps[:, None] | mant[None, :]).reshape(-1)
    nan = np.uint32(0x7F800000) | np.array(
        [1, 0x1FFF, 0x2000, 0x3FFFFF, 0x400000, 0x400001, 0x7FFFFF, 0x5A5A5A], np.uint32
    )
    edge = np.array([65504.0, 65519.99, 65520.0, 65535.0, 65536.0, 6.1035156e-05, 5.9604645e-08, 2.9802322e-08,
                     2.9802326e-08, 8.940697e-08, 3e-45], F32).view(np.uint32)  # fmt: skip
    everything = np.concatenate([bits, nan, edge])
    return np.concatenate([everything, everything | np.uint32(0x80000000)]).view(F32)


def test_float32_to_half_matches_numpy_every_isa() -> None:
    """Round to nearest even, overflow to ±inf, subnormal halves, -0, NaN payloads: the
    bits of astype(np.float16), on the rounding cases and 2^20 random patterns."""
    rng = np.random.default_rng(5)
    x = np.concatenate(
        [float32_rounding_cases(), rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint32).view(F32)]
    )
    with np.errstate(all="ignore"):
        expected = x.astype(np.float16)

    def check(isa: str) -> None:
        for shift in (0, 3, 9):
            v = x[shift:]
            for threads in (1, 2):
                assert_same_bits(
                    expected[shift:], _native.cast_half(v, threads), "f32->f16", isa=isa, shift=shift
                )
        out = np.empty(x.shape, np.float16)
        assert _native.cast_half(x, 1, out) is out
        assert_same_bits(expected, out, "f32->f16 out=", isa=isa)

    every_isa(check)


def test_cast_half_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="cast_half: x: expected dtype float32 or float16, got float64"):
        _native.cast_half(np.zeros(3))
    with pytest.raises(ValueError, match="cast_half: out: expected dtype float16, got float32"):
        _native.cast_half(np.zeros(3, F32), 1, np.zeros(3, F32))
    with pytest.raises(ValueError, match="cast_half: out: expected shape"):
        _native.cast_half(np.zeros(3, np.float16), 1, np.zeros(4, F32))
    with pytest.raises(ValueError, match="C-contiguous"):
        _native.cast_half(np.zeros((3, 4), F32).T)


def test_softplus_twin_within_stated_ulps_of_exact() -> None:
    """(SP1)-(SP3) against float64 log(1 + e^x), normal results: x > 0 bound 1.79 ulp
    (every float32 in (0, 104]: 1.7836 at x = 0.27342), x < 0 bound 2.82 ulp (every
    float32 in [−104, 0): 2.8110 at x = −3.46697), from `benchmarks/float_ulp_sweep.py --op softplus`.
    Edges: +inf, −inf → 0, NaN, ±0 → ln 2, large x → x, x below −16.6 (u = 1) → e^x."""
    rng = np.random.default_rng(29)
    x = np.concatenate([rng.uniform(-87, 0, 1 << 20), -(2.0 ** rng.uniform(-40, 4, 1 << 18))]).astype(F32)
    x64 = x.astype(np.float64)
    err = ulp_error(twin.softplus_f32(x), np.logaddexp(0, x64))
    assert err.max() <= 2.82, (err.max(), x[np.argmax(err)])
    x = np.concatenate([rng.uniform(0, 104, 1 << 20), 2.0 ** rng.uniform(-40, 4, 1 << 18)]).astype(F32)
    err = ulp_error(twin.softplus_f32(x), np.logaddexp(0, x.astype(np.float64)))
    assert err.max() <= 1.79, (err.max(), x[np.argmax(err)])
    edges = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e30, -20.0], F32)
    y = twin.softplus_f32(edges)
    assert np.isposinf(y[0]) and y[1] == 0 and np.isnan(y[2]) and y[5] == F32(1e30)
    assert y[3] == y[4] == F32(math.log(2))
    assert y[6] == twin.exp_f32(np.array([-20.0], F32))[0]


def test_gelu_twin_against_float64() -> None:
    """(G1) vs x/2·(1 + erf(x/√2)) in float64. 1 + erf(z) errs by at most 2.52·2^-24
    absolute: 1.03 ulp of erf (<= 1.03·2^-24 as |erf| < 1), half an ulp of the sum
    (<= 2^-24 as 1 + erf <= 2) and erf's slope times the rounding of z = x/√2
    (2/√π·e^(−z²)·|z|·2^-24 <= 0.49·2^-24); 0.5·x is exact and the last product rounds
    once: |ŷ − y| <= 0.5|x|·2.52·2^-24 + 2^-24·|y| (+ 2^-149 for subnormal results).
    For x < 0 the absolute term dominates: 1 + erf cancels (inherent to the formula)."""
    x = np.concatenate([np.linspace(-6, 6, 200001), [-20.0, -9.0, 9.0, 1e-30, -1e-30]]).astype(F32)
    x64 = x.astype(np.float64)
    exact = 0.5 * x64 * (1 + erf64(x64 / math.sqrt(2)))
    err = np.abs(twin.gelu_f32(x).astype(np.float64) - exact)
    bound = 0.5 * np.abs(x64) * 2.52 * U + U * np.abs(exact) + 2.0**-149
    assert np.all(err <= bound), (np.max(err / bound), x[np.argmax(err / bound)])


def test_relu_signed_zero_and_nan_follow_np_maximum() -> None:
    """Hazard: vmaxps returns its SECOND operand on equal zeros and on NaN; np.maximum(x,
    0) gives +0 for −0 and keeps NaN. max(0, x) would give −0, max(x, 0) would drop NaN."""
    x = np.array([-0.0, 0.0, np.nan, -np.inf, np.inf, -1e-45, 1e-45, -2.0, 3.0] * 3, F32)
    expected = np.maximum(x, np.zeros((), F32))
    assert not np.signbit(expected[0]) and np.isnan(expected[2])
    every_isa(lambda isa: assert_same(expected, _native.unary_f32("relu", x), "relu", isa=isa))


# --------------------------------------------------------------------------------------
# boundary
# --------------------------------------------------------------------------------------


def test_boundary_errors_name_the_argument() -> None:
    x = np.zeros((2, 3), F32)
    cases = [
        (
            lambda: _native.softmax_f32(x.astype(np.float64)),
            "softmax_f32: x: expected dtype float32, got float64",
        ),
        (lambda: _native.softmax_f32(np.zeros((), F32)), "softmax_f32: x: expected rank >= 1"),
        (
            lambda: _native.binary_f32("pow", x, x),
            "binary_f32: op: expected one of add, sub, mul, div, max, min, prelu, got 'pow'",
        ),
        (
            lambda: _native.binary_f32("add", x, np.zeros(4, F32)),
            "binary_f32: expected broadcastable shapes, got (2, 3) and (4,)",
        ),
        (
            lambda: _native.layer_norm_f32(x, np.ones(4, F32), None, -1, 1e-5),
            "layer_norm_f32: scale: expected 3 elements, got 4",
        ),
        (
            lambda: _native.layer_norm_f32(x, np.ones(3, F32), None, 2, 1e-5),
            "layer_norm_f32: axis: expected in",
        ),
        (
            lambda: _native.softmax_f32(x, out=np.zeros((3, 2), F32)),
            "softmax_f32: out: expected shape (2, 3), got shape (3, 2)",
        ),
        (lambda: _native.softmax_f32(x, out=x), "softmax_f32: out: expected a buffer that does not overlap"),
        (lambda: _native.exp_f32(x, num_threads=0), "exp_f32: num_threads: expected >= 1, got 0"),
        (
            lambda: _native.unary_f32("gelu_erf", x),
            "unary_f32: op: expected one of erf, tanh, sigmoid, relu, gelu, gelu_tanh, mlas_logistic, mlas_tanh, silu, log, cos, sin, expm1, gelu_tanh_mlas, atan, softplus, fast_gelu_ort, got 'gelu_erf'",
        ),
        (
            lambda: _native.unary_f32("erf", x.astype(np.float16)),
            "unary_f32: x: expected dtype float32, got float16",
        ),
        (
            lambda: _native.unary_f32("erf", x, out=x),
            "unary_f32: out: expected a buffer that does not overlap",
        ),
    ]
    for call, message in cases:
        with pytest.raises(ValueError) as info:
            call()
        assert str(info.value).startswith(message), str(info.value)


def test_out_buffer_is_written_and_returned() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 17)).astype(F32)
    out = np.empty_like(x)
    assert _native.softmax_f32(x, out=out) is out
    assert_same(twin.softmax_rows(x), out, "softmax_f32 out=")
    out2 = np.empty_like(x)
    assert _native.binary_f32("mul", x, x[0], out=out2) is out2
    assert_same(x * x[0], out2, "binary_f32 out=")
    out3 = np.empty_like(x)
    assert _native.unary_f32("erf", x, out=out3) is out3
    assert_same(twin.erf_f32(x), out3, "unary_f32 out=")
    scalar = np.array(0.5, F32)  # rank 0
    assert_same(twin.erf_f32(scalar), _native.unary_f32("erf", scalar), "unary_f32 rank 0")
    assert _native.unary_f32("erf", np.zeros((3, 0), F32)).shape == (3, 0)
