"""Observer states merge bit for bit over any sharding and any merge tree: what makes
sharded calibration (quanta.scale) give the single process's file.

Commutative states (extrema, integer histogram counts, exact channel-mean sums) are
merged over random trees on a random permutation of the shards; the moving average's
log is merged over random trees that keep the shards in data order (its merge is "a's
samples, then b's"). Everything is compared through the JSON form, byte for byte, and
the ranges with ==.
"""

from __future__ import annotations

import itertools
import json
import pickle

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from quanta.calibrate import (
    EntropyObserver,
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAverageSteps,
    MSEObserver,
    PercentileObserver,
    WeightedMSEObserver,
)
from quanta.calibrate.runner import ChannelMean

BINS = 128


def observers() -> list:
    return [
        MinMaxObserver(axis=1),
        MinMaxObserver(),
        HistogramObserver(bins=BINS, axis=1),
        EntropyObserver(bins=BINS, num_quantized_bins=16),
        PercentileObserver(percentile=99.0, bins=BINS, axis=1),
        MSEObserver(qmin=-128, qmax=127, bins=BINS, symmetric=True),
        WeightedMSEObserver(axis=1, weights=[0.5, 2.0, 0.0], bins=BINS),
    ]


def sample(seed: int, n: int, log_scale: int, kind: str) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 3, n)) * 2.0**log_scale
    if kind == "relu":
        x = np.maximum(x, 0)
    elif kind == "signed_zeros":  # min/max of +-0 depend on the order unless canonicalised
        x[rng.random(x.shape) < 0.7] = 0.0
        x = np.where(rng.random(x.shape) < 0.5, -np.abs(x) * 0.0, x)
    elif kind == "nan":
        x[0, 0, 0] = np.nan
    elif kind == "spiky":
        x.flat[-1] *= 1e4
    return x.astype(np.float32)


samples = st.lists(
    st.tuples(
        st.integers(0, 2**32 - 1),
        st.integers(1, 30),
        st.integers(-20, 20),
        st.sampled_from(["normal", "relu", "signed_zeros", "nan", "spiky"]),
    ),
    min_size=1,
    max_size=9,
)


def shards_of(n: int, data: st.DataObject) -> list[range]:
    """A random split of 0..n-1 into contiguous non-empty runs."""
    cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), max_size=n - 1)) if n > 1 else [])
    bounds = [0, *cuts, n]
    return [range(a, b) for a, b in itertools.pairwise(bounds)]


def merge_tree(items: list, data: st.DataObject):
    """Merge a list (kept in its order) by a random binary tree, each merge a copying
    ``merge`` or an in-place ``merge_in_place`` (what the driver folds with)."""
    while len(items) > 1:
        i = data.draw(st.integers(0, len(items) - 2))
        a, b = items[i], items[i + 1]
        in_place = hasattr(a, "merge_in_place") and data.draw(st.booleans())
        ab = a.merge_in_place(b) if in_place else a.merge(b)
        items = [*items[:i], ab, *items[i + 2 :]]
    return items[0]


def state(obs) -> str:
    return json.dumps(obs.to_dict(), sort_keys=True)


@given(spec=samples, data=st.data())
def test_commutative_states_merge_bitwise_over_any_sharding_and_tree(spec, data):
    xs = [sample(*s) for s in spec]
    parts = shards_of(len(xs), data)
    order = data.draw(st.permutations(range(len(parts))))
    for k, single in enumerate(observers()):
        for x in xs:
            single.observe(x)
        shard_obs = []
        for r in parts:
            o = observers()[k]
            for i in r:
                o.observe(xs[i])
            shard_obs.append(pickle.loads(pickle.dumps(o)))  # as a worker sends it back
        merged = merge_tree([shard_obs[j] for j in order], data)
        assert state(merged) == state(single), type(single).__name__
        assert merged.range() == single.range()


@given(spec=samples, data=st.data())
def test_moving_average_log_replays_the_single_stream_bitwise(spec, data):
    xs = [sample(*s) for s in spec]
    single = MovingAverageMinMaxObserver(momentum=0.1, axis=1)
    for x in xs:
        single.observe(x)
    shard_obs = []
    for r in shards_of(len(xs), data):
        o = MovingAverageSteps(momentum=0.1, axis=1)
        for i in r:
            o.observe(xs[i])
        shard_obs.append(MovingAverageSteps.from_dict(json.loads(state(o))))  # through JSON, as a worker
    merged = merge_tree(shard_obs, data)
    assert state(merged.replay()) == state(single)
    assert merged.range() == single.range()


@given(spec=samples, data=st.data())
def test_channel_means_merge_bitwise(spec, data):
    xs = [sample(*s) for s in spec]
    xs = [np.nan_to_num(x) for x in xs]
    single = ChannelMean(axis=1)
    for x in xs:
        single.observe(x)
    parts = []
    for r in shards_of(len(xs), data):
        m = ChannelMean(axis=1)
        for i in r:
            m.observe(xs[i])
        parts.append(ChannelMean.from_dict(json.loads(json.dumps(m.to_dict()))))
    order = data.draw(st.permutations(range(len(parts))))
    merged = merge_tree([parts[j] for j in order], data)
    assert merged.to_dict() == single.to_dict()
    assert merged.mean().tobytes() == single.mean().tobytes()


def test_channel_mean_is_the_correctly_rounded_mean_of_the_sample_sums():
    # sums that cancel: a float64 running sum loses the small term, the exact one keeps it
    xs = [np.array([[1e20]]), np.array([[1.0]]), np.array([[-1e20]])]
    m = ChannelMean(axis=1)
    for x in xs:
        m.observe(x)
    assert m.mean().tolist() == [1.0 / 3.0]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(allow_nan=False, allow_infinity=False, width=64), min_size=1, max_size=40),
    st.integers(1, 7),
)
def test_channel_mean_rounds_the_exact_sum_once(values, width):
    """mean() divides the exact integer sum by count·2^1074 once, correctly rounded: the
    same float64 as the rational mean of the float64 values (Fraction, no int division)."""
    from fractions import Fraction

    m = ChannelMean(axis=1)
    for v in values:
        m.observe(np.full((1, width), v))
    want = float(sum(Fraction(v) for v in values) / len(values))
    assert m.mean().tolist() == [want] * width


def test_signed_zero_extrema_are_positive_zero():
    a, b = MinMaxObserver(), MinMaxObserver()
    a.observe(np.array([-0.0, 0.0], np.float32))
    b.observe(np.array([0.0, -0.0], np.float32))
    assert state(a) == state(b) and a.to_dict()["state"]["min"] == [0.0]
    assert np.signbit(a.extrema().min) == np.signbit(b.extrema().min) == False  # noqa: E712


def test_pickled_histogram_counts_are_exact_in_the_narrowest_type():
    """A worker sends each channel's occupied bin range in the narrowest unsigned type that
    holds its largest count; unpickled, the counts are the same int64 array."""
    from quanta.calibrate.histogram import _pack_ranges, _unpack_ranges

    rng = np.random.default_rng(7)
    for top, dtype in [(200, np.uint8), (70_000, np.uint32), (2**40, np.int64)]:
        counts = np.zeros((5, 17), np.int64)
        counts[0, 3:9] = rng.integers(0, 3, 6)
        counts[0, 3] = counts[0, 8] = 1  # range 3..8 with inner zeros
        counts[2, 16] = top  # the last bin, alone
        counts[4, 0] = 1  # the first bin; rows 1 and 3 empty
        first, last, values = _pack_ranges(counts)
        assert values.dtype == dtype and values.size == 6 + 1 + 1
        assert first.tolist() == [3, 0, 16, 0, 0] and last.tolist() == [8, -1, 16, -1, 0]
        back = _unpack_ranges(counts.shape, first, last, values)
        assert back.dtype == np.int64 and np.array_equal(back, counts)
    obs = WeightedMSEObserver(axis=1, weights=[0.5, 2.0, 0.0], bins=BINS)
    obs.observe(sample(3, 30, 4, "spiky"))
    assert state(pickle.loads(pickle.dumps(obs))) == state(obs)


def test_occupied_ranges_found_by_words_equal_a_row_by_row_search():
    """_pack_ranges finds each row's last occupied bin 8 bins (one 64-bit word) at a time
    where B is a multiple of 8: the same first / last / values as a search of every row,
    for a last bin in every byte of a word, empty and full rows, B of 16, 64 and 1024 and
    B not a multiple of 8 (searched by rows)."""
    from quanta.calibrate.histogram import _last_true, _pack_ranges

    rng = np.random.default_rng(11)
    for bins in (16, 24, 64, 1024, 37):
        rows = []
        for last in range(min(bins, 40)):  # every position of the first words
            r = np.zeros(bins, np.int64)
            r[last] = 3 + last
            r[: last // 2] = rng.integers(0, 2, last // 2)
            rows.append(r)
        rows.append(np.zeros(bins, np.int64))  # empty
        rows.append(np.full(bins, 70_001, np.int64))  # full, uint32
        r = np.zeros(bins, np.int64)
        r[bins - 1] = 1
        rows.append(r)  # the last bin alone
        rows.append(np.where(rng.random(bins) < 0.1, rng.integers(1, 500, bins), 0))
        counts = np.stack(rows)
        want_first, want_last, want_values = [], [], []
        for row in counts:
            nz = np.flatnonzero(row)
            want_first.append(int(nz[0]) if nz.size else 0)
            want_last.append(int(nz[-1]) if nz.size else -1)
            want_values.append(row[nz[0] : nz[-1] + 1] if nz.size else row[:0])
        first, last, values = _pack_ranges(counts)
        assert first.tolist() == want_first and last.tolist() == want_last, bins
        assert values.dtype == np.uint32 and np.array_equal(values, np.concatenate(want_values))
        occupied = counts != 0
        assert _last_true(occupied[:, ::-1]).tolist() == [
            bins - 1 - int(np.flatnonzero(row)[0]) if row.any() else -1 for row in counts
        ]  # a strided view: searched by rows


def test_deepcopy_of_a_histogram_copies_its_arrays():
    """A copy in memory (what merge makes of its left side) has the same state and owns
    its arrays: merging into the copy leaves the original as it was."""
    import copy

    obs = WeightedMSEObserver(axis=1, weights=[0.5, 2.0, 0.0], bins=BINS)
    obs.observe(sample(5, 30, 3, "normal"))
    before = state(obs)
    dup = copy.deepcopy(obs)
    assert state(dup) == before and dup._counts is not obs._counts
    other = WeightedMSEObserver(axis=1, weights=[0.5, 2.0, 0.0], bins=BINS)
    other.observe(sample(6, 30, 6, "spiky"))
    dup.merge_in_place(other)
    assert state(obs) == before and state(dup) != before


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from([16, 37, 128]),
    st.integers(0, 70),
    st.integers(-300, 300),
)
def test_uniform_regrid_sums_the_same_bins_as_the_scatter(seed, bins, d, start):
    """Rows that share one move (a shared grid) are re-gridded by whole-array slicing and
    sums (histogram._regrid_uniform); row by row the general scatter gives the same counts,
    for shifts at one exponent (d = 0), small and huge exponent steps and negative starts."""
    from quanta.calibrate.histogram import _regrid_rows

    rng = np.random.default_rng(seed)
    rows = 7
    # a window of occupied bins that lands inside the new one: choose the new start so
    # that the coarse bins of the data start at its local 0..bins/4
    counts = np.zeros((rows, bins), np.int64)
    lo, hi = sorted(rng.integers(0, bins, 2).tolist())
    counts[:, lo : hi + 1] = rng.integers(0, 1000, (rows, hi - lo + 1))
    counts[rng.integers(0, rows)] = 0  # an empty row
    first = (start + lo) >> min(d, 62)
    start_new = first - int(rng.integers(0, bins // 4 + 1))
    last = (start + hi) >> min(d, 62)
    if last - start_new >= bins:  # the data must fit the new window (the grid invariant)
        start_new = last - bins + 1
    k = np.zeros(rows, np.int64)
    s0 = np.full(rows, start, np.int64)
    k1, s1 = k + d, np.full(rows, start_new, np.int64)
    fast = _regrid_rows(counts, k, s0, k1, s1, np.arange(rows))
    slow = np.concatenate([_regrid_rows(counts, k, s0, k1, s1, np.array([r])) for r in range(rows)])
    assert fast.dtype == np.int64 and np.array_equal(fast, slow)
    assert np.array_equal(fast.sum(axis=1), counts.sum(axis=1))


def test_weighted_mse_keeps_its_channels_on_the_tensor_grid():
    """The weighted MSE observer reads its channels only summed on the tensor's grid, so
    it keeps them there (one exponent and window start for all): a narrow channel's
    counts sit in a few bins, and its range is the one computed from per-channel grids."""
    from quanta.calibrate.histogram import regrid

    obs = WeightedMSEObserver(axis=1, weights=[0.5, 2.0, 0.0], bins=BINS)
    ref = MSEObserver(axis=1, bins=BINS)  # per-channel grids, the same counts
    for seed in range(4):
        x = sample(seed, 50, seed, "spiky")
        x[:, 1] *= 1e-3  # a narrow channel
        obs.observe(x)
        ref.observe(x)
    assert len(set(obs._k.tolist())) == 1 and len(set(obs._start.tolist())) == 1
    assert np.count_nonzero(obs._counts[1]) < np.count_nonzero(ref._counts[1])
    assert np.array_equal(regrid(ref._counts, ref._k, ref._start, obs._k, obs._start), obs._counts)
