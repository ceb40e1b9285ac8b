"""Observers: golden ranges, merge = single stream, JSON round trip, constant memory,
variable shapes, degenerate inputs.

Tolerances: none except for the moving average's merge (eq. (10) regroups the float64
sums; bound derived at the test). Every other observer state is integers and exact
extrema, compared bit for bit through its JSON form.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from quanta.calibrate import (
    EntropyObserver,
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MSEObserver,
    PercentileObserver,
    dumps_table,
    is_degenerate,
    load_table,
    loads_table,
    observer_from_dict,
    save_table,
)
from quanta.calibrate.histogram import grid_exponent
from quanta.ir.types import F16, F32, CalibratedType

SMALL = 256  # histogram bins in tests: big enough to exercise re-gridding, cheap to compare


def exact_observers(axis: int | None = None) -> list:
    """Observers whose merge is exact (everything but the moving average)."""
    return [
        MinMaxObserver(axis=axis),
        HistogramObserver(bins=SMALL, axis=axis),
        EntropyObserver(bins=SMALL, num_quantized_bins=32, axis=axis),
        PercentileObserver(percentile=99.0, bins=SMALL, axis=axis),
        MSEObserver(qmin=-128, qmax=127, bins=SMALL, axis=axis),
    ]


def all_observers(axis: int | None = None) -> list:
    return [*exact_observers(axis), MovingAverageMinMaxObserver(momentum=0.1, axis=axis)]


def state_json(obs) -> str:
    return json.dumps(obs.to_dict(), sort_keys=True)


# ----------------------------------------------------------------- golden values


def test_minmax_golden_variable_shapes_and_nan():
    obs = MinMaxObserver()
    obs.observe(np.array([[0.5, -1.25], [np.nan, 2.0]], np.float32))
    obs.observe(np.array([3.0, -0.5, 1.0], np.float32))  # another shape
    assert obs.range() == CalibratedType(F32, -1.25, 3.0)
    assert obs.degenerate() == "1 NaN values observed"


def test_minmax_per_channel_axis1_variable_spatial_size():
    # NCHW with 3 channels; H, W change between samples. Channel c holds c·10 + offsets.
    obs = MinMaxObserver(axis=1)
    for h, w in ((5, 7), (2, 3), (9, 1)):
        x = np.zeros((2, 3, h, w), np.float32) + np.arange(3, dtype=np.float32)[None, :, None, None] * 10
        x[0, :, 0, 0] -= h
        obs.observe(x)
    assert obs.range() == CalibratedType(F32, (-9.0, 1.0, 11.0), (0.0, 10.0, 20.0), axis=1)


def test_per_channel_negative_axis_is_resolved_against_first_sample():
    # hidden size (last axis) is the channel; sequence length varies
    obs = MinMaxObserver(axis=-1)
    for t in (3, 17, 5):
        obs.observe(np.arange(t * 7, dtype=np.float32).reshape(1, t, 7))
    cal = obs.range()
    assert cal.axis == 2
    assert cal.min == tuple(float(v) for v in range(7))
    assert cal.max == tuple(float(16 * 7 + v) for v in range(7))


def test_moving_average_golden():
    # momentum 0.25: m1 = -4; m2 = -4 + 0.25·(0 - -4) = -3; m3 = -3 + 0.25·(-7 - -3) = -4
    obs = MovingAverageMinMaxObserver(momentum=0.25)
    for lo, hi in ((-4.0, 8.0), (0.0, 4.0), (-7.0, 8.0)):
        obs.observe(np.array([lo, hi], np.float32))
    # max: 8 -> 8 + 0.25·(4 - 8) = 7 -> 7 + 0.25·(8 - 7) = 7.25
    assert obs.range() == CalibratedType(F32, -4.0, 7.25)


def test_histogram_grid_golden():
    # B = 64: (max - min) / 62 = 3.5 / 62 = 0.056 <= 2^-4, so w = 1/16 and bin g covers
    # [g/16, (g+1)/16): -1 -> bin -16, 0 -> bin 0 (twice), 2.5 -> bin 40.
    obs = HistogramObserver(bins=64)
    obs.observe(np.array([-1.0, 0.0, 0.0, 2.5], np.float32))
    v = obs.view()
    assert (v.k, v.g0, v.zeros) == (-4, -16, 2)
    assert {int(v.g0 + i): int(c) for i, c in enumerate(v.counts) if c} == {-16: 1, 0: 2, 40: 1}
    # growing the range to 100 coarsens to w = 2 (101 / 62 = 1.63 <= 2^1): -1 -> bin -1,
    # 0 and 2.5 -> bins 0 and 1, 100 -> bin 50; the old counts are summed, not interpolated
    obs.observe(np.array([100.0], np.float32))
    v = obs.view()
    assert (v.k, v.g0) == (1, -1)
    assert {int(v.g0 + i): int(c) for i, c in enumerate(v.counts) if c} == {-1: 1, 0: 2, 1: 1, 50: 1}


@given(
    lo=st.floats(-3e38, 3e38, allow_nan=False, allow_infinity=False),
    hi=st.floats(-3e38, 3e38, allow_nan=False, allow_infinity=False),
    bins=st.sampled_from([16, 17, 256, 4096]),
)
def test_histogram_grid_exponent_fits_window_and_is_monotone(lo, hi, bins):
    lo, hi = min(lo, hi), max(lo, hi)
    k = int(grid_exponent(np.array([lo]), np.array([hi]), bins)[0])
    w = 2.0**k
    first, last = int(np.floor(lo / w)), int(np.floor(hi / w))
    assert last - first + 1 <= bins
    assert max(abs(first), abs(last)) < 2**53  # exact in float64 and int64
    # widening the range never makes the grid finer (what makes merges exact)
    k2 = int(grid_exponent(np.array([lo - abs(lo) - 1]), np.array([hi]), bins)[0])
    assert k2 >= k


# -------------------------------------------------------------- merge == stream

stream = st.lists(
    st.tuples(
        st.integers(0, 2**32 - 1),  # seed
        st.integers(1, 40),  # samples per sample (variable length)
        st.integers(-12, 12),  # log2 of the value scale
        st.sampled_from(["normal", "relu", "zeros", "spiky"]),
    ),
    min_size=1,
    max_size=4,
)


def make_sample(seed: int, n: int, log_scale: int, kind: str, channels: int | None = None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = (n,) if channels is None else (n, channels)
    x = rng.standard_normal(shape) * 2.0**log_scale
    if kind == "relu":
        x = np.maximum(x, 0)
    elif kind == "zeros":
        x[rng.random(shape) < 0.5] = 0
    elif kind == "spiky":
        x.flat[0] *= 1000
    return x.astype(np.float32)


@given(first=stream, second=stream)
def test_observer_merge_equals_single_stream(first, second):
    for axis in (None, 1):
        channels = None if axis is None else 3
        xs_a = [make_sample(*s, channels=channels) for s in first]
        xs_b = [make_sample(*s, channels=channels) for s in second]
        for single, a, b in zip(exact_observers(axis), exact_observers(axis), exact_observers(axis)):
            for x in xs_a:
                single.observe(x)
                a.observe(x)
            for x in xs_b:
                single.observe(x)
                b.observe(x)
            merged = a.merge(b)
            assert state_json(merged) == state_json(single), type(single).__name__
            assert merged.range() == single.range()


@given(first=stream, second=stream)
def test_moving_average_merge_equals_single_stream(first, second):
    c = 0.1
    single, a, b = (MovingAverageMinMaxObserver(momentum=c) for _ in range(3))
    for s in first:
        x = make_sample(*s)
        single.observe(x)
        a.observe(x)
    for s in second:
        x = make_sample(*s)
        single.observe(x)
        b.observe(x)
    got, want = a.merge(b).range(), single.range()
    # eq. (10) regroups at most 8 float64 multiply-adds of terms bounded by the largest
    # |extremum| M: error <= 8·4·eps64·M, well below 1e-12·M
    m = max(abs(want.min), abs(want.max), 1e-300)
    assert abs(got.min - want.min) <= 1e-12 * m and abs(got.max - want.max) <= 1e-12 * m


def test_histogram_state_independent_of_sample_order():
    xs = [make_sample(s, 50, s % 9 - 4, "normal") for s in range(8)]
    fwd, rev = HistogramObserver(bins=SMALL), HistogramObserver(bins=SMALL)
    for x in xs:
        fwd.observe(x)
    for x in reversed(xs):
        rev.observe(x)
    assert state_json(fwd) == state_json(rev)


def test_merge_refuses_different_configuration():
    a, b = PercentileObserver(percentile=99.0), PercentileObserver(percentile=99.9)
    with pytest.raises(ValueError, match=r"^merge: configurations differ"):
        a.merge(b)
    with pytest.raises(TypeError, match=r"^merge: cannot merge MinMaxObserver into HistogramObserver$"):
        HistogramObserver().merge(MinMaxObserver())


def test_merge_with_empty_observer():
    a = MinMaxObserver()
    a.observe(np.array([1.0, 2.0], np.float32))
    assert a.merge(MinMaxObserver()).range() == a.range() == MinMaxObserver().merge(a).range()


# ---------------------------------------------------------------- serialisation


def test_calibration_table_json_round_trip_is_byte_stable(tmp_path):
    table = {}
    rng = np.random.default_rng(3)
    for i, obs in enumerate(all_observers() + all_observers(axis=0)):
        for n in (5, 11, 3):
            x = (rng.standard_normal((4, n)) * (i + 1)).astype(np.float32)
            obs.observe(x)
        table[f"t{i}"] = obs
    masked = MinMaxObserver()
    masked.observe(np.array([-np.inf, 1.0, np.nan], np.float32))
    table["mask"] = masked
    table["never_observed"] = HistogramObserver(bins=SMALL)
    path = tmp_path / "calib.json"
    save_table(path, table)
    text = path.read_text()
    loaded = load_table(path)
    assert dumps_table(loaded) == text
    for name, obs in table.items():
        assert state_json(loaded[name]) == state_json(obs), name
        if name != "never_observed":
            assert loaded[name].range() == obs.range(), name
    assert loaded["mask"].range().min == -np.inf
    # a loaded observer keeps observing exactly like the original
    x = np.linspace(-50, 50, 37, dtype=np.float32).reshape(1, 37)
    for name in ("t1", "t3"):
        table[name].observe(x)
        loaded[name].observe(x)
        assert state_json(loaded[name]) == state_json(table[name])


def test_json_is_standard_json():
    # Non-finite values are strings, so the file is valid for any JSON reader.
    obs = MinMaxObserver()
    obs.observe(np.array([-np.inf, np.inf], np.float32))
    text = dumps_table({"x": obs})
    assert "Infinity" not in text and '"-inf"' in text
    assert observer_from_dict(json.loads(text)["tensors"]["x"]).range().max == np.inf


def test_table_rejects_foreign_json():
    with pytest.raises(ValueError, match=r"not a quanta calibration table"):
        loads_table('{"a": 1}')
    with pytest.raises(ValueError, match=r"unknown observer type 'kl'"):
        observer_from_dict({"type": "kl"})


# ---------------------------------------------------------------- memory


@pytest.mark.parametrize("axis", [None, 2])
def test_observer_memory_constant_over_500_batches(axis):
    # Failure signature: ORT's entropy/percentile calibrators keep every activation until
    # the end (memory grows with the sample count). Here the state must not grow, even as
    # the range keeps widening (the histogram re-grids instead of adding bins) and the
    # sequence length keeps changing.
    rng = np.random.default_rng(0)
    observers = [*all_observers(axis), HistogramObserver(axis=axis)]
    sizes = []
    for i in range(500):
        seq = 1 + (i * 7) % 23
        x = (rng.standard_normal((1, seq, 5)) * (1 + i)).astype(np.float32)
        for obs in observers:
            obs.observe(x)
        if i in (0, 499):
            sizes.append([obs.nbytes for obs in observers])
    assert sizes[0] == sizes[1]
    assert max(sizes[1]) <= 5 * 8 * 4096 + 1024  # channels x 8 B x bins, plus small vectors


# ---------------------------------------------------------------- degenerate inputs


@pytest.mark.parametrize("obs", all_observers(), ids=lambda o: type(o).__name__)
def test_all_zero_tensor_is_reported(obs):
    obs.observe(np.zeros((3, 5), np.float32))
    assert obs.range() == CalibratedType(F32, 0.0, 0.0)
    assert obs.degenerate() == "every observed value is 0 (zero range)"


@pytest.mark.parametrize("obs", all_observers(), ids=lambda o: type(o).__name__)
def test_constant_tensor_is_reported(obs):
    obs.observe(np.full((2, 3), 3.5, np.float32))
    obs.observe(np.full((7,), 3.5, np.float32))
    assert obs.range() == CalibratedType(F32, 3.5, 3.5)
    assert obs.degenerate() == "constant: every observed value is 3.5 (zero range)"


@pytest.mark.parametrize("obs", all_observers(), ids=lambda o: type(o).__name__)
def test_minus_inf_mask_is_reported_not_estimated(obs):
    # Failure signature (ORT on BERT): a mask tensor calibrated to a huge range makes the
    # quantized model useless. The observer must not crash and must expose the -inf.
    x = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
    x[:, 10:] = -np.inf
    obs.observe(x)
    obs.observe(x[:, :12])
    cal = obs.range()
    assert cal.min == -np.inf and np.isfinite(cal.max)
    assert obs.degenerate().startswith("range [-inf, ")


@pytest.mark.parametrize("fill", [-1e38, np.finfo(np.float32).min, -1e9])
@pytest.mark.parametrize(
    "obs_cls", [MinMaxObserver, HistogramObserver, MSEObserver], ids=lambda c: c.__name__
)
def test_huge_negative_mask_is_reported(fill, obs_cls):
    obs = obs_cls()
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    x[:, 6:] = fill
    obs.observe(x)
    reason = obs.degenerate()
    assert reason is not None and "keep float" in reason and "a mask filled with" in reason


@pytest.mark.parametrize("obs", all_observers(axis=0), ids=lambda o: type(o).__name__)
def test_empty_sample_does_not_crash(obs):
    obs.observe(np.zeros((4, 0), np.float32))
    assert obs.degenerate() == "no values observed"
    assert obs.range() == CalibratedType(F32, (0.0,) * 4, (0.0,) * 4, axis=0)
    obs.observe(np.ones((4, 2), np.float32))
    assert obs.range().max == (1.0,) * 4


def test_one_dead_channel_is_not_degenerate():
    obs = MinMaxObserver(axis=0)
    x = np.random.default_rng(0).standard_normal((3, 10)).astype(np.float32)
    x[1] = 0
    obs.observe(x)
    assert obs.degenerate() is None
    obs2 = MinMaxObserver(axis=0)
    obs2.observe(np.zeros((3, 10), np.float32))
    assert obs2.degenerate() == "every channel is constant (zero range)"


def test_is_degenerate_reasons():
    assert is_degenerate(CalibratedType(F32, -1.0, 1.0)) is None
    assert is_degenerate(CalibratedType(F32, -1e8, 1.0)) is None  # big, but below the 1e9 threshold
    assert is_degenerate(CalibratedType(F32, -1e8, 1.0), extreme=1e6).startswith(
        "range [-1e+08, 1] reaches 1e+08"
    )
    assert is_degenerate(CalibratedType(F32, float("nan"), 1.0)) == "range has a NaN bound"
    assert is_degenerate(CalibratedType(F32, 1.0, np.inf)) == (
        "range [1, inf] is not finite (-inf/+inf in the data, e.g. an attention mask): keep float"
    )


def test_float16_samples_give_f16_range():
    obs = MinMaxObserver()
    obs.observe(np.array([-1.5, 2.0], np.float16))
    assert obs.range() == CalibratedType(F16, -1.5, 2.0)


# ---------------------------------------------------------------- errors


def test_channel_count_change_message():
    obs = MinMaxObserver(axis=1)
    obs.observe(np.zeros((2, 7), np.float32))
    with pytest.raises(
        ValueError, match=r"^observer: sample has 5 channels along axis 1, earlier samples had 7$"
    ):
        obs.observe(np.zeros((2, 5), np.float32))


def test_rank_change_message_per_channel():
    obs = MinMaxObserver(axis=0)
    obs.observe(np.zeros((3, 2), np.float32))
    with pytest.raises(
        ValueError,
        match=r"^observer: per-channel samples must keep their rank: got rank 3, earlier samples had rank 2$",
    ):
        obs.observe(np.zeros((3, 2, 2), np.float32))


def test_axis_out_of_range_and_bad_dtype():
    with pytest.raises(ValueError, match=r"^observer: axis 2 is out of range for a rank-2 sample$"):
        MinMaxObserver(axis=2).observe(np.zeros((3, 2), np.float32))
    with pytest.raises(TypeError, match=r"^observer: expected a real-valued array, got dtype bool$"):
        MinMaxObserver().observe(np.zeros(3, bool))


# ------------------------------------------------------------------------ results


def _streams() -> dict[str, list[np.ndarray]]:
    """Streams of every kind the degeneracy rules tell apart (odd shapes, a scale per
    sample, an offset: no range is symmetric or anchored at 0 by accident)."""
    rng = np.random.default_rng(17)
    plain = [(rng.standard_normal((3, 7, 5)) * (0.3 + 1.7 * i) + 0.45).astype(np.float32) for i in range(5)]
    masked = [x.copy() for x in plain[:3]]
    masked[1][0, 2:, 1] = -np.inf
    nan = [x.copy() for x in plain[:2]]
    nan[0][1, 3, :2] = np.nan
    wide = [np.abs(x) * 1e11 + 1.5 for x in plain[:2]]
    return {
        "plain": plain,
        "masked": masked,
        "nan": nan,
        "all_nan": [np.full((3, 7, 5), np.nan, np.float32)],
        "wide": wide,
        "constant": [np.full((3, 7, 5), -2.25, np.float32)] * 2,
        "nothing": [np.zeros((3, 7, 0), np.float32)],
    }


@pytest.mark.parametrize("kind", list(_streams()))
@pytest.mark.parametrize("axis", [None, 1])
def test_result_answers_as_the_observer_does(kind, axis):
    """ObserverResult (what a worker sends instead of the state) gives the observer's own
    range, extrema and degeneracy for every bit width, bit for bit, also after a pickle
    round trip (the transport)."""
    import pickle

    from quanta.calibrate import WeightedMSEObserver
    from quanta.calibrate.observer import ObserverResult, observer_type

    weighted = WeightedMSEObserver(axis=1, weights=[0.7, 3.1, 1e-3, 2.0, 0.25, 1.5, 0.9], bins=SMALL)
    for obs in [*all_observers(axis), weighted]:
        for x in _streams()[kind]:
            obs.observe(x)
        res = obs.result()
        for got in (res, pickle.loads(pickle.dumps(res))):
            assert isinstance(got, ObserverResult) and observer_type(got) is type(obs)
            assert observer_type(obs) is type(obs)
            assert repr(got.range()) == repr(obs.range()), (kind, type(obs).__name__)
            assert repr(got.extrema()) == repr(obs.extrema())
            for bits in (8, 16):
                assert got.degenerate(bits) == obs.degenerate(bits), (kind, type(obs).__name__, bits)
            assert got == res
        if kind == "nothing":
            assert res.degenerate() == "no values observed"
        if kind == "all_nan":
            assert res.degenerate() == "every observed value is NaN (105 values)"


@given(parts=stream)
def test_observing_a_concatenation_equals_observing_its_parts(parts):
    """ObserverBase.batch_invariant: the calibration runner hands an observer a Loop
    body's per-iteration values as one array; the state must not tell the difference."""
    xs = [make_sample(*s) for s in parts]
    for one_by_one, at_once in zip(exact_observers(), exact_observers()):
        assert type(one_by_one).batch_invariant
        for x in xs:
            one_by_one.observe(x)
        at_once.observe(np.concatenate([x.reshape(-1) for x in xs]))
        assert state_json(at_once) == state_json(one_by_one), type(at_once).__name__


def test_moving_average_is_not_batch_invariant():
    assert not MovingAverageMinMaxObserver.batch_invariant
    a, b = MovingAverageMinMaxObserver(momentum=0.5), MovingAverageMinMaxObserver(momentum=0.5)
    xs = [np.array([-2.0, 4.0], np.float32), np.array([0.0, 2.0], np.float32)]
    for x in xs:
        a.observe(x)
    b.observe(np.concatenate(xs))
    assert a.range() != b.range()
