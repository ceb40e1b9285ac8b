"""The histogram counts' in-memory type (quanta/calibrate/histogram.py, ``_counts_dtype``):
int32 while every channel has seen at most 2^31 - 1 values, int64 from the sample or
merge that could pass it. The counts are the same integers in either type, the type is
a function of the value counts alone (the same over any sharding, merge tree and merge
order), and a count that passes 2^31 - 1 is exact.

The threshold is lowered (``_NARROW_MAX``) to widen at random points of small streams
and merge trees; the real threshold is met by states built through the JSON form, whose
bins hold 2^31 - 1 values.
"""

from __future__ import annotations

import copy
import json
import pickle
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quanta.calibrate import histogram
from quanta.calibrate.histogram import HistogramObserver
from quanta.calibrate.observer import observer_from_dict
from quanta.calibrate.weighted_mse import WeightedMSEObserver
from tests.calibrate.test_merge_shards import merge_tree, observers, sample, samples, shards_of, state

INT32_MAX = 2**31 - 1
narrow_native = histogram._native_narrow()


def hists() -> list[HistogramObserver]:
    return [o for o in observers() if isinstance(o, HistogramObserver)]


def canonical(obs: HistogramObserver) -> type:
    """The type the counts must have after the values ``obs`` has seen."""
    if int(obs._count.max()) > histogram._NARROW_MAX or not narrow_native:
        return np.int64
    return np.int32


def wide(obs: HistogramObserver) -> str:
    """``obs``'s JSON state computed again with int64 counts throughout (the reference)."""
    return json.dumps(obs.to_dict(), sort_keys=True)


@settings(max_examples=60, deadline=None)
@given(spec=samples, data=st.data(), threshold=st.integers(0, 400))
def test_counts_widen_where_the_value_counts_say_and_merge_exactly(spec, data, threshold):
    """Streams and random merge trees (copying and in place, pickled shards, any order)
    with the int32 limit at ``threshold``: the JSON state equals the single stream's with
    int64 counts throughout, and every observer's counts have the type its value counts
    give, whatever the order of the merges."""
    xs = [sample(*s) for s in spec]
    parts = shards_of(len(xs), data)
    order = data.draw(st.permutations(range(len(parts))))
    for k, ref in enumerate(hists()):
        with mock.patch.object(histogram, "_NATIVE_NARROW", [False]):  # int64 throughout
            for x in xs:
                ref.observe(x)
        assert ref._counts.dtype == np.int64
        with mock.patch.object(histogram, "_NARROW_MAX", threshold):
            single = hists()[k]
            for x in xs:
                single.observe(x)
                assert single._counts.dtype == canonical(single)
            shard_obs = []
            for r in parts:
                o = hists()[k]
                for i in r:
                    o.observe(xs[i])
                back = pickle.loads(pickle.dumps(o))  # as a worker sends it back
                assert back._counts.dtype == o._counts.dtype == canonical(o)
                shard_obs.append(back)
            merged = merge_tree([shard_obs[j] for j in order], data)
            assert merged._counts.dtype == canonical(merged)
        assert state(single) == state(merged) == wide(ref), type(ref).__name__
        assert merged.range() == single.range() == ref.range()


def _at(count: int, value: float, *, bins: int = 64) -> HistogramObserver:
    """A per-tensor histogram that has seen ``count`` copies of ``value`` (one bin holds
    them all), built through its JSON form (no 2^31-value stream needed)."""
    obs = HistogramObserver(bins=bins)
    obs.observe(np.array([value], np.float32))  # the grid of [0, value]
    d = obs.to_dict()
    first = d["state"]["counts"][0][0]
    d["state"]["counts"] = [[first, [count]]]
    d["state"]["count"] = [count]
    return observer_from_dict(d)


@pytest.mark.parametrize("count", [INT32_MAX - 1, INT32_MAX])
def test_a_bin_at_the_int32_limit_stays_int32_and_one_more_value_widens_it(count):
    """A bin holding 2^31 - 2 or 2^31 - 1 values: int32 (its channel's value count fits),
    pickled and read back as the same integer; one more value in the same bin (a sample,
    or a merge with an observer that saw it, either side first) makes 2^31 - 1 or 2^31,
    in int64 where it passes the limit, never a wrapped int32."""
    obs = _at(count, 1.5)
    assert obs._counts.dtype == canonical(obs)
    assert int(obs._counts.max()) == count
    back = pickle.loads(pickle.dumps(obs))
    assert back._counts.dtype == obs._counts.dtype and int(back._counts.max()) == count
    one = HistogramObserver(bins=64)
    one.observe(np.array([1.5], np.float32))
    seen = copy.deepcopy(obs)
    seen.observe(np.array([1.5], np.float32))
    for got in (obs.merge(one), one.merge(obs), copy.deepcopy(obs).merge_in_place(one), seen):
        assert int(got._counts.max()) == count + 1 == int(got._count[0])
        assert got._counts.dtype == (np.int64 if count + 1 > INT32_MAX or not narrow_native else np.int32)
        assert got.to_dict()["state"]["counts"] == obs.merge(one).to_dict()["state"]["counts"]
        assert int(pickle.loads(pickle.dumps(got))._counts.max()) == count + 1


def test_two_halves_of_the_limit_merge_into_int64():
    """Each side within int32 (2^30 values in one bin each), their sum 2^31 is not: the
    accumulator widens before the addition, in a copying merge, in place and after a
    re-grid (the other side's grid is coarser)."""
    half = 2**30
    a, b = _at(half, 1.5), _at(half, 1.5)
    coarse = _at(half, 100.0)  # a wider range: a's counts move to a coarser grid first
    for got, total in ((a.merge(b), 2 * half), (copy.deepcopy(a).merge_in_place(b), 2 * half)):
        assert got._counts.dtype == np.int64 and int(got._counts.max()) == total
    mixed = a.merge(coarse)
    assert mixed._counts.dtype == np.int64
    assert int(mixed._counts.sum()) == 2 * half and int(mixed._counts.max()) == half
    assert state(mixed) == state(coarse.merge(a))


def test_a_table_reads_back_into_the_type_of_its_value_counts():
    """``from_dict`` (a calibration table) gives the counts the type a stream would have."""
    obs = HistogramObserver(bins=32, axis=0)
    obs.observe(np.arange(12, dtype=np.float32).reshape(3, 4))
    back = observer_from_dict(obs.to_dict())
    assert back._counts.dtype == obs._counts.dtype == canonical(obs)
    assert np.array_equal(back._counts, obs._counts) and state(back) == state(obs)


@pytest.mark.skipif(histogram._native_update() is None, reason="no native histogram_update")
def test_native_update_counts_int32_rows_as_int64_rows():
    """The native update takes int32 and int64 counts: the same integers in both."""
    if not narrow_native:
        pytest.skip("the native extension takes int64 counts only")
    native = histogram._native_update()
    rng = np.random.default_rng(3)
    obs = HistogramObserver(bins=128, axis=0)
    x = (rng.standard_normal((7, 301)) * np.array([1e-3, 1, 30, 0, 5, 1e4, 2])[:, None]).astype(np.float32)
    obs.observe(x)
    counts32 = np.zeros_like(obs._counts, np.int32)
    counts64 = np.zeros_like(obs._counts, np.int64)
    zeros32, zeros64 = np.zeros(7, np.int64), np.zeros(7, np.int64)
    native(x, obs._k, obs._start, counts32, zeros32)
    native(x, obs._k, obs._start, counts64, zeros64)
    assert np.array_equal(counts32, counts64) and np.array_equal(zeros32, zeros64)
    assert np.array_equal(counts32, obs._counts) and counts64.sum() == x.size
    with pytest.raises(ValueError, match="counts: expected dtype int64"):
        native(x, obs._k, obs._start, counts64.astype(np.int16), zeros64)


def test_pack_views_int32_counts_as_uint32():
    """Non-negative int32 counts that need 32 bits travel as their uint32 view (no copy);
    unpacked into int32 or int64, the same integers."""
    from quanta.calibrate.histogram import _pack_ranges, _unpack_ranges

    counts = np.zeros((4, 24), np.int32)
    counts[0, 5:9] = [1, 0, INT32_MAX, 2]
    counts[2, 23] = 70_000
    first, last, values = _pack_ranges(counts)
    assert values.dtype == np.uint32 and values.tolist() == [1, 0, INT32_MAX, 2, 70_000]
    for dtype in (np.int32, np.int64):
        back = _unpack_ranges(counts.shape, first, last, values, dtype)
        assert back.dtype == dtype and np.array_equal(back, counts)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_box_packing_is_exact_for_counts_of_every_size(dtype):
    """Rows on one grid travel as one block of columns: low bytes plus the upper bits of
    the counts above 255 (256, 65536, 2^31 - 1 and, in int64, 2^40), at the block's
    first and last column, with empty rows, empty and full windows."""
    from quanta.calibrate.histogram import _pack_box, _unpack_box

    rng = np.random.default_rng(11)
    tops = [255, 256, 65_536, INT32_MAX] + ([2**40] if dtype == np.int64 else [])
    for first, last in [(0, 16), (3, 9), (7, 7), (5, 16)]:
        counts = np.zeros((7, 17), dtype)
        counts[[0, 2, 3, 6], first : last + 1] = rng.integers(0, 300, (4, last - first + 1))
        counts[2, first] = tops[first % len(tops)]
        counts[6, last] = tops[-1]
        counts[3, (first + last) // 2] = 256
        lo, hi, low, big, high = packed = _pack_box(counts)
        assert (lo, hi) == (first, last) and low.dtype == np.uint8 and low.shape == (7, last - first + 1)
        assert high.dtype == dtype and big.size == high.size == int((counts > 255).sum())
        back = _unpack_box(counts.shape, packed, dtype)
        assert back.dtype == dtype and np.array_equal(back, counts)
    empty = np.zeros((3, 16), dtype)
    assert np.array_equal(_unpack_box(empty.shape, _pack_box(empty), dtype), empty)


def test_a_shared_grid_travels_as_a_box_and_per_channel_grids_as_row_ranges():
    """The weighted MSE observer (channels on the tensor's grid) and a per-tensor
    histogram pickle their counts as a block, a per-channel histogram (own grids) as
    per-row runs; both read back into the same state."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((2, 3, 400)) * np.array([1.0, 300.0, 0.01])[None, :, None]).astype(np.float32)
    for obs, form in [
        (WeightedMSEObserver(axis=1, weights=[0.5, 2.0, 0.0], bins=128), "box"),
        (HistogramObserver(bins=128), "box"),
        (HistogramObserver(bins=128, axis=1), "ranges"),
    ]:
        obs.observe(x)
        obs.observe(x * 3)
        assert obs.__getstate__()["_counts"][0] == form
        back = pickle.loads(pickle.dumps(obs))
        assert back._counts.dtype == obs._counts.dtype and np.array_equal(back._counts, obs._counts)
        assert state(back) == state(obs)
