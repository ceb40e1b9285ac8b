"""Histogram readers: Entropy (KL), Percentile, MSE.

Each vectorised formula is checked against a plain loop form of its equation
(docs/calibration.md), then each observer is checked for the behaviour it exists for:
clip far outliers (entropy, percentile), lower quantization error than MinMax (MSE).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnxruntime.quantization.calibrate import HistogramCollector

from quanta.calibrate import (
    EntropyObserver,
    HistogramObserver,
    MinMaxObserver,
    MSEObserver,
    PercentileObserver,
)
from quanta.calibrate.entropy import kl_divergences
from quanta.calibrate.histogram import HistogramView
from quanta.calibrate.mse import QuantizationErrorModel
from quanta.calibrate.percentile import quantile
from quanta.ir.types import I4, I8, U8, CalibratedType
from quanta.quantize.params import params_from_range, quant_range


def gaussian_with_outliers(n: int = 100_000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n)
    x[rng.choice(n, 20, replace=False)] = rng.uniform(25, 40, 20) * rng.choice([-1, 1], 20)
    return x.astype(np.float32)


def fake_quant_mse(x: np.ndarray, cal: CalibratedType, storage=U8, symmetric=False) -> float:
    """Mean squared error of quantize -> dequantize (eq. (2), round half to even) at the
    parameters params_from_range gives for ``cal``."""
    q = params_from_range(cal, storage, symmetric=symmetric)
    s, z = float(np.float32(q.scale[0])), q.zero_point[0]
    xq = np.clip(np.round(x.astype(np.float64) / s) + z, q.qmin, q.qmax)
    return float(np.mean(((xq - z) * s - x) ** 2))


# ----------------------------------------------------------------------- entropy


def kl_loop(a: np.ndarray, levels: int, eps: float) -> np.ndarray:
    """Eqs. (16)-(18) as written, one candidate at a time, smoothing only where exactly
    one of p, q is empty (the vectorised form's documented approximation)."""
    out = []
    for i in range(levels, a.size + 1):
        p = a[:i].astype(np.float64).copy()
        p[i - 1] += a[i:].sum()
        chunk = (np.arange(i) * levels) // i
        q = np.zeros(i)
        for c in range(levels):
            members = chunk == c
            nonempty = members & (a[:i] > 0)
            if nonempty.any():
                q[nonempty] = a[:i][members].sum() / nonempty.sum()
        q = np.where((q == 0) & (p > 0), eps, q)
        if a[:i].sum() == 0:  # every value beyond the threshold: not a candidate
            out.append(np.inf)
            continue
        pn, qn = p / p.sum(), q / a[:i].sum()  # sum(q) = sum(A[:i]), eps aside (documented)
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(pn > 0, pn * np.log(pn / qn), 0.0)
        out.append(terms.sum())
    return np.asarray(out)


@pytest.mark.parametrize("seed", range(5))
def test_entropy_kl_vectorised_equals_loop_form(seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 6, size=61).astype(np.float64)
    a[rng.random(61) < 0.2] = 0
    a[-1] = 2
    got, want = kl_divergences(a, 8, eps=0.0), kl_loop(a, 8, eps=0.0)
    assert np.array_equal(np.isinf(got), np.isinf(want))
    fin = np.isfinite(want)
    # float64 prefix sums of A log A (< 61·6·log 6 ~ 700) against direct sums: 1e-12
    np.testing.assert_allclose(got[fin], want[fin], rtol=0, atol=1e-12)


def test_entropy_kl_smoothing_keeps_thresholds_inside_a_gap():
    # Bulk in bins 0..19, empty gap, outliers in bin 59. A threshold inside the gap has an
    # empty last bin holding the clipped outliers: KL = inf without smoothing (TensorRT),
    # finite with it (ORT/MXNet), so the outliers can be clipped.
    a = np.zeros(60)
    a[:20] = 50
    a[59] = 1
    strict, smooth = kl_divergences(a, 8, eps=0.0), kl_divergences(a, 8, eps=1e-4)
    gap = slice(20 - 8 + 1, 59 - 8)  # candidates i = 21..58: last bin i-1 in the gap
    assert np.isinf(strict[gap]).all() and np.isfinite(smooth[gap]).all()
    # the smoothed value is the loop form where q = eps replaces the empty last bin;
    # q is normalised by sum(A[:i]) there (eps is not added to the total): 1e-12 as above
    np.testing.assert_allclose(smooth[gap], kl_loop(a, 8, eps=1e-4)[gap], rtol=0, atol=1e-12)


def test_entropy_clips_far_outliers():
    x = gaussian_with_outliers()
    obs = EntropyObserver()
    obs.observe(x)
    cal = obs.range()
    assert 2.5 < cal.max < 8.0 and -8.0 < cal.min < -2.5  # outliers at |x| >= 25 are cut
    # (KL is not MSE: clipping 20 values by ~30 costs 20·30^2 / 1e5 = 0.18 in MSE, more
    # than it saves in rounding; entropy bets that such outliers do not matter downstream.)


def test_entropy_keeps_uniform_range():
    # Clipping a uniform distribution only adds a spike at the threshold: KL prefers ~max.
    x = np.random.default_rng(1).uniform(-1, 1, 50_000).astype(np.float32)
    obs = EntropyObserver()
    obs.observe(x)
    assert obs.range().max > 0.95 and obs.range().min < -0.95


def test_entropy_levels_one_sided_data():
    relu = EntropyObserver()
    relu.observe(np.abs(np.random.default_rng(2).standard_normal(1000)).astype(np.float32))
    both = EntropyObserver()
    both.observe(np.random.default_rng(2).standard_normal(1000).astype(np.float32))
    assert relu.levels(relu.view()) == 256 and both.levels(both.view()) == 128
    assert EntropyObserver(num_quantized_bins=64).levels(both.view()) == 64


# -------------------------------------------------------------------- percentile


def test_percentile_quantile_golden():
    # counts 2, 0, 2 over [0,1), [1,2), [2,3): 3 values below 2.5 (uniform within a bin)
    edges = np.array([0.0, 1.0, 2.0, 3.0])
    counts = np.array([2.0, 0.0, 2.0])
    assert quantile(counts, edges, 0.0) == 0.0
    assert quantile(counts, edges, 1.0) == 0.5
    assert quantile(counts, edges, 2.0) == 1.0  # the empty bin: the left end of the gap
    assert quantile(counts, edges, 3.0) == 2.5
    assert quantile(counts, edges, 4.0) == 3.0


def test_percentile_100_is_minmax():
    x = gaussian_with_outliers(5000)
    p = PercentileObserver(percentile=100.0)
    p.observe(x)
    assert p.range() == p.extrema()


def test_percentile_clips_far_outliers():
    x = gaussian_with_outliers()
    obs = PercentileObserver(percentile=99.9)
    obs.observe(x)
    cal = obs.range()
    # 0.05 % of N(0, 1) on each side is beyond 3.29 sigma; 20 outliers are 0.02 %
    assert 3.0 < cal.max < 3.8 and -3.8 < cal.min < -3.0


@pytest.mark.parametrize("symmetric", [False, True])
def test_percentile_agrees_with_onnxruntime_histogram_collector(symmetric):
    # ORT reads the lower edge of the bin holding the quantile (its bins: 2·max|x| / 2048
    # wide, or max|x| / 2048 on |x|); quanta interpolates inside its own bin (at most
    # (max - min) / 2048 wide for B = 4096): they differ by at most one bin of each.
    x = gaussian_with_outliers(50_000, seed=3)
    ort = HistogramCollector(
        method="percentile",
        symmetric=symmetric,
        num_bins=2048,
        num_quantized_bins=128,
        percentile=99.9,
        scenario="same",
    )
    ort.collect({"x": [x]})
    lo_ort, hi_ort = (float(v) for v in ort.compute_collection_result()["x"][:2])
    obs = PercentileObserver(percentile=99.9, symmetric=symmetric)
    obs.observe(x)
    cal = obs.range()
    amax = float(np.abs(x).max())
    tol = 2 * amax / 2048 + (float(x.max()) - float(x.min())) / 2048
    assert abs(cal.max - hi_ort) <= tol and abs(cal.min - lo_ort) <= tol


# ------------------------------------------------------------------------- MSE


def error_loop(view: HistogramView, a: float, b: float, s: float) -> float:
    """Eq. (21) bin by bin: exact integrals of the clipped parts of each uniform bin."""
    edges = view.edges()
    total = 0.0
    inside = 0.0
    for j, n in enumerate(view.counts):
        if n == 0:
            continue
        lo, hi = max(edges[j], view.lo), min(edges[j + 1], view.hi)
        if hi == lo:  # a point mass
            x0 = lo
            total += n * ((a - x0) ** 2 if x0 < a else (x0 - b) ** 2 if x0 >= b else 0.0)
            inside += n if a <= x0 < b else 0.0
            continue
        dens = n / (hi - lo)
        u = min(hi, a)
        if lo < a:
            total += dens * ((a - lo) ** 3 - (a - u) ** 3) / 3
        v = max(lo, b)
        if hi > b:
            total += dens * ((hi - b) ** 3 - (v - b) ** 3) / 3
        inside += dens * max(0.0, min(hi, b) - max(lo, a))
    return total + max(inside - view.zeros, 0.0) * s * s / 12


def test_mse_error_model_prefix_sums_equal_loop_form():
    x = gaussian_with_outliers(20_000, seed=4)
    x[:500] = 0.0  # exact zeros do not err
    obs = HistogramObserver(bins=512)
    obs.observe(x)
    view = obs.view()
    model = QuantizationErrorModel(view)
    rng = np.random.default_rng(5)
    a = np.concatenate([[view.lo, -1.0, 0.0], -rng.uniform(0, 40, 20)])
    b = np.concatenate([[view.hi, 1.0, 1e-3], rng.uniform(0, 40, 20)])
    s = (b - a) / 255
    got = model.error(a, b, s)
    want = np.array([error_loop(view, *t) for t in zip(a, b, s)])
    # prefix sums subtract terms up to sum n·x^2 ~ 20_000 · 40^2 = 3.2e7: float64 leaves
    # ~1e-16 · 3.2e7 · (a few) absolute; 1e-6 is far above it and far below any error here
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-6)


def test_mse_range_has_lower_error_than_minmax_gaussian_with_outliers():
    x = gaussian_with_outliers()
    mse, mm = MSEObserver(), MinMaxObserver()
    mse.observe(x)
    mm.observe(x)
    e_mse, e_mm = fake_quant_mse(x, mse.range()), fake_quant_mse(x, mm.range())
    # 20 outliers in 1e5 values: clipping them hard costs more than the finer step saves
    # (see test_entropy_clips_far_outliers), so the optimum trims only the extremes:
    # about 11 % below MinMax here; 5 % leaves room for the model's approximations.
    assert e_mse < 0.95 * e_mm
    assert mse.range().max < mm.range().max and mse.range().min > mm.range().min


@pytest.mark.parametrize(("qmin", "qmax", "symmetric"), [(0, 255, False), (-127, 127, True), (-7, 7, True)])
def test_mse_beats_minmax_and_nearby_ranges_on_laplace(qmin, qmax, symmetric):
    # Laplace tails: the classic case where clipping pays (ACIQ). The chosen range must
    # beat MinMax and also the ranges 10 % narrower and wider (a local-optimum check).
    x = np.random.default_rng(6).laplace(size=100_000).astype(np.float32)
    storage = {255: U8, 127: I8, 7: I4}[qmax]
    assert quant_range(storage, symmetric=symmetric) == (qmin, qmax)
    obs = MSEObserver(qmin=qmin, qmax=qmax, symmetric=symmetric)
    obs.observe(x)
    cal = obs.range()
    err = fake_quant_mse(x, cal, storage, symmetric)
    assert err < fake_quant_mse(x, obs.extrema(), storage, symmetric)
    for f in (0.9, 1.1):
        other = CalibratedType(
            cal.expressed, max(cal.min * f, float(x.min())), min(cal.max * f, float(x.max()))
        )
        assert err <= fake_quant_mse(x, other, storage, symmetric) * 1.01  # 1 %: sampling noise of 1e5 values


def test_mse_relu_output_keeps_zero_at_bottom():
    x = np.maximum(np.random.default_rng(7).standard_normal(50_000), 0).astype(np.float32)
    obs = MSEObserver()
    obs.observe(x)
    assert obs.range().min == 0.0 and 2.0 < obs.range().max <= float(x.max())


# ---------------------------------------------------------------- per channel


@pytest.mark.parametrize(
    "make",
    [
        lambda axis: EntropyObserver(axis=axis),
        lambda axis: PercentileObserver(percentile=99.5, axis=axis),
        lambda axis: MSEObserver(axis=axis),
    ],
    ids=["entropy", "percentile", "mse"],
)
def test_per_channel_estimate_equals_per_tensor_on_that_channel(make):
    # Per-axis vs per-tensor twin consistency: channel c of a per-channel observer is
    # exactly a per-tensor observer fed only channel c (scales 1, 10 and 0.1).
    rng = np.random.default_rng(8)
    xs = [
        (rng.standard_normal((2, 3, n)) * np.array([1.0, 10.0, 0.1])[None, :, None]).astype(np.float32)
        for n in (400, 97)
    ]
    per_channel = make(1)
    for x in xs:
        per_channel.observe(x)
    cal = per_channel.range()
    for c in range(3):
        one = make(None)
        for x in xs:
            one.observe(x[:, c])
        r = one.range()
        assert (cal.min[c], cal.max[c]) == (r.min, r.max)


def test_convert_histogram_to_percentile_without_recalibrating():
    x = gaussian_with_outliers(20_000)
    hist, direct = HistogramObserver(), PercentileObserver(percentile=99.9)
    hist.observe(x)
    direct.observe(x)
    converted = hist.convert(PercentileObserver, percentile=99.9)
    assert converted.range() == direct.range()
    assert converted.to_dict() == direct.to_dict()
