"""The native histogram update (quantize/histogram.h, ``_native.histogram_update``)
against its NumPy twin (``HistogramObserver._update_numpy``): the same counts and zero
counts for every sample, bit for bit, over what the grid of eq. (12) meets in real
calibrations: channels of very different ranges (negative, positive, mixed), -0.0 and
values that underflow to it on a coarse grid, subnormals, NaN and ±inf, an all-zero
channel (k = K_FLOOR, scaled with ldexp), float32 and float64 samples, strided views,
per-tensor and per-channel observers."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quanta.calibrate import histogram
from quanta.calibrate.histogram import HistogramObserver

native = histogram._native_update()
pytestmark = pytest.mark.skipif(native is None, reason="the native extension has no histogram_update")


def _sample(rng: np.random.Generator, shape: tuple[int, ...], dtype: type, specials: bool) -> np.ndarray:
    c = shape[1]
    scale = np.ldexp(1.0, rng.integers(-30, 12, c)).reshape(1, c, *([1] * (len(shape) - 2)))
    shift = rng.choice([-1.0, 0.0, 0.5], c).reshape(scale.shape)
    x = ((rng.standard_normal(shape) + shift) * scale).astype(dtype)
    if specials:
        flat = x.reshape(-1)
        idx = rng.choice(flat.size, size=min(flat.size, 12), replace=False)
        tiny = np.finfo(dtype).smallest_subnormal
        picks = [np.nan, np.inf, -np.inf, -0.0, 0.0, tiny, -tiny, -3 * tiny, 1e-30, -1e-30, np.nan, 0.0]
        flat[idx] = np.array(picks[: idx.size], dtype)
    return x


def _observe_both(samples: list[np.ndarray], axis: int | None, bins: int, monkeypatch: pytest.MonkeyPatch):
    fast = HistogramObserver(bins=bins, axis=axis)
    slow = HistogramObserver(bins=bins, axis=axis)
    for x in samples:
        fast.observe(x)
        with monkeypatch.context() as m:
            m.setattr(histogram, "_native_update", lambda: None)
            slow.observe(x)
    return fast, slow


def _assert_same(fast: HistogramObserver, slow: HistogramObserver) -> None:
    np.testing.assert_array_equal(fast._counts, slow._counts)
    np.testing.assert_array_equal(fast._zeros, slow._zeros)
    np.testing.assert_array_equal(fast._k, slow._k)
    np.testing.assert_array_equal(fast._start, slow._start)
    assert fast.range() == slow.range()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("axis", [None, 1])
@pytest.mark.parametrize("specials", [False, True])
def test_native_update_counts_what_the_twin_counts(dtype, axis, specials, monkeypatch):
    rng = np.random.default_rng(5)
    samples = [_sample(rng, (1, 17, 9, 13), dtype, specials) for _ in range(4)]
    samples[2][:, 3] = 0  # an all-zero channel in one sample
    fast, slow = _observe_both(samples, axis, 64, monkeypatch)
    _assert_same(fast, slow)
    assert fast._counts.sum() > 0


def test_all_zero_channel_and_subnormal_ranges(monkeypatch):
    """k = K_FLOOR (an all-zero channel: ldexp, not a multiply) and channels whose range is
    a few subnormals (|k| > 120)."""
    tiny = np.finfo(np.float32).smallest_subnormal
    x = np.zeros((1, 3, 5, 7), np.float32)
    x[0, 1] = np.arange(35).reshape(5, 7) * tiny - 17 * tiny
    x[0, 2] = np.linspace(-2.5, 3.5, 35).reshape(5, 7)
    fast, slow = _observe_both([x, -x], 1, 32, monkeypatch)
    _assert_same(fast, slow)
    assert fast._k[0] == histogram.K_FLOOR and abs(int(fast._k[1])) > 120


@settings(max_examples=30, deadline=None)
@given(
    c=st.sampled_from([1, 3, 7, 17]),
    n=st.integers(1, 300),
    seed=st.integers(0, 2**31 - 1),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_native_update_on_strided_views_matches_the_twin(c, n, seed, dtype):
    """The kernel reads x in place through its strides (a transposed or sliced channel
    view): the counts of the same values, computed on one grid by both."""
    rng = np.random.default_rng(seed)
    base = _sample(rng, (1, c, n * 2), dtype, specials=seed % 2 == 0)[0]
    views = [base[:, ::2], base[:, ::-2], np.ascontiguousarray(base.T).T[:, :n]]
    obs = HistogramObserver(bins=128, axis=0)
    obs.observe(base)  # the grid: every view's values lie inside it
    for xc in views:
        fast = copy.deepcopy(obs)
        slow = copy.deepcopy(obs)
        native(xc, fast._k, fast._start, fast._counts, fast._zeros)
        slow._update_numpy(xc, np.isfinite(xc) if not np.isfinite(xc).all() else None)
        np.testing.assert_array_equal(fast._counts, slow._counts)
        np.testing.assert_array_equal(fast._zeros, slow._zeros)


def test_a_value_outside_the_window_is_an_error():
    """The observer moves its window over every sample before counting; a value outside
    it is a defect of the caller, reported (naming the channel) instead of a write past
    the row."""
    obs = HistogramObserver(bins=16, axis=0)
    obs.observe(np.array([[0.0, 1.0, 2.0]], np.float32))
    with pytest.raises(ValueError, match="outside the window of 16 bins"):
        native(np.array([[1e6]], np.float32), obs._k, obs._start, obs._counts, obs._zeros)
    with pytest.raises(ValueError, match="float32 or float64"):
        native(np.array([[1]], np.int32), obs._k, obs._start, obs._counts, obs._zeros)
