"""WeightedMSEObserver (eq. (22)): the range that minimises the error the consumer sees."""

from __future__ import annotations

import numpy as np
import pytest

from quanta.calibrate import MSEObserver, WeightedMSEObserver, observer_from_dict
from quanta.calibrate.weighted_mse import consumer_weights


def _two_channels(seed: int = 0, n: int = 20_000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    narrow = rng.laplace(0.0, 0.3, n)
    wide = rng.uniform(-3.0, 90.0, n)
    return np.stack([narrow, wide])[None].astype(np.float32)  # [1, 2, N]


def _weighted_error(x: np.ndarray, g: np.ndarray, a: float, b: float) -> float:
    """Eq. (22) by brute force: quantize every value to u8 on [a, b] (0 included)."""
    a, b = min(a, 0.0), max(b, 0.0)
    s = (b - a) / 255.0
    z = np.round(-a / s)
    x64 = x[0].astype(np.float64)
    q = (np.clip(np.round(x64 / s) + z, 0, 255) - z) * s
    return float((g * ((x64 - q) ** 2).sum(axis=1)).sum())


def test_an_unimportant_wide_channel_is_clipped():
    x = _two_channels()
    obs = WeightedMSEObserver(axis=1, weights=[1.0, 1e-7])
    obs.observe(x)
    cal = obs.range()
    assert cal.max < 10.0 < float(x.max())  # MinMax would spend the grid on the wide channel
    plain = MSEObserver()
    plain.observe(x)
    assert plain.range().max > 50.0  # plain MSE weighs both channels alike and keeps it


def test_the_range_is_close_to_the_brute_force_optimum():
    x = _two_channels(seed=3)
    g = np.array([1.0, 1e-7])
    obs = WeightedMSEObserver(axis=1, weights=g)
    obs.observe(x)
    cal = obs.range()
    chosen = _weighted_error(x, g, cal.min, cal.max)
    lo = float(x.min())
    best = min(_weighted_error(x, g, a, b) for a in np.linspace(lo, 0, 17) for b in np.linspace(0.5, 90, 300))
    assert chosen <= 1.05 * best
    assert chosen < 0.7 * _weighted_error(x, g, lo, float(x.max()))  # far better than MinMax


def test_equal_weights_read_like_plain_mse_and_a_small_gain_keeps_minmax():
    x = _two_channels(seed=1)
    w = WeightedMSEObserver(axis=1, weights=[2.0, 2.0], bins=4096)
    w.observe(x)
    p = MSEObserver()
    p.observe(x.reshape(-1))
    a, b = w._estimate_channel(w.weighted_view())  # the search on the weighted histogram
    step = (float(x.max()) - float(x.min())) / 255
    assert abs(b - p.range().max) < step and abs(a - p.range().min) < step
    # plain MSE clips a little here, for less than the 2x of eq. (23): MinMax it is
    assert p.range().min > float(x.min())
    assert (w.range().min, w.range().max) == (float(x.min()), float(x.max()))


def test_a_zero_weight_channel_does_not_count_and_the_range_stays_inside_the_data():
    x = _two_channels(seed=2)
    a = WeightedMSEObserver(axis=1, weights=[1.0, 0.0])
    a.observe(x)
    only = WeightedMSEObserver(axis=1, weights=[1.0])
    only.observe(x[:, :1])
    # the wide channel's values all lie outside the narrow one's chosen range or inside
    # its bins: with weight 0 they change nothing but the grid
    assert a.range().max < 5.0 and only.range().max < 5.0
    lo, hi = float(x.min()), float(x.max())
    for w in ([1.0, 1.0], [0.0, 1.0], [1.0, 0.0]):
        o = WeightedMSEObserver(axis=1, weights=w)
        o.observe(x)
        assert lo <= o.range().min <= o.range().max <= hi


def test_split_streams_merge_to_the_same_range_and_the_state_round_trips():
    x = _two_channels(seed=4)
    one = WeightedMSEObserver(axis=1, weights=[1.0, 3e-6])
    one.observe(x)
    a = WeightedMSEObserver(axis=1, weights=[1.0, 3e-6])
    b = WeightedMSEObserver(axis=1, weights=[1.0, 3e-6])
    a.observe(x[..., :7_000])
    b.observe(x[..., 7_000:] * 1.5)  # a wider second half re-grids the first
    both = WeightedMSEObserver(axis=1, weights=[1.0, 3e-6])
    both.observe(x[..., :7_000])
    both.observe(x[..., 7_000:] * 1.5)
    assert a.merge(b).range() == both.range()
    again = observer_from_dict(one.to_dict())
    assert isinstance(again, WeightedMSEObserver) and again.range() == one.range()


def test_nchw_channels_and_a_mismatch_is_refused():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    x[:, 2] *= 40.0
    obs = WeightedMSEObserver(axis=1, weights=[1.0, 1.0, 1e-8])
    obs.observe(x)
    assert obs.range().max < float(np.abs(x[:, :2]).max()) + 0.2  # a bin of the tensor grid above
    with pytest.raises(ValueError, match="3 channels along axis 1, the weights 4"):
        WeightedMSEObserver(axis=1, weights=[1, 1, 1, 1]).observe(x)
    with pytest.raises(ValueError, match="weights must be finite"):
        WeightedMSEObserver(axis=1, weights=[1.0, -1.0])


def test_a_non_finite_tensor_reports_its_extrema():
    x = np.array([[[0.5, -np.inf], [1.0, 2.0]]], np.float32)  # [1, 2, 2]
    obs = WeightedMSEObserver(axis=1, weights=[1.0, 1.0])
    obs.observe(x)
    assert obs.range().min == -np.inf
    assert obs.degenerate() is not None


def test_consumer_weights_per_input_channel():
    rng = np.random.default_rng(6)
    w = rng.standard_normal((6, 3, 3, 3))  # Conv, group 3: 9 input channels, 2 outputs per group
    g = consumer_weights("Conv", w, group=3)
    expect = [float((w[2 * (c // 3) : 2 * (c // 3) + 2, c % 3] ** 2).sum()) for c in range(9)]
    np.testing.assert_allclose(g, expect)
    full = rng.standard_normal((5, 7, 1, 1))
    np.testing.assert_allclose(consumer_weights("Conv", full), (full**2).sum(axis=(0, 2, 3)))
    m = rng.standard_normal((7, 4))  # MatMul [K, N]; Gemm with transB stores [N, K]
    np.testing.assert_allclose(consumer_weights("MatMul", m), (m**2).sum(axis=1))
    np.testing.assert_allclose(consumer_weights("Gemm", m.T, trans_b=True), (m**2).sum(axis=1))
    with pytest.raises(ValueError, match="do not split into 4 groups"):
        consumer_weights("Conv", w, group=4)
