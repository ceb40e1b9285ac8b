"""channel_errors (eq. (21) for every channel of a histogram at once) against the model
read one channel at a time, bit for bit: eq. (29)'s per-tensor side sums it, and the file
depends on the comparison it feeds."""

from __future__ import annotations

import numpy as np
import pytest

from quanta.calibrate.histogram import HistogramObserver
from quanta.calibrate.mse import QuantizationErrorModel, channel_errors
from quanta.calibrate.weighted_mse import MIN_GAIN, WeightedMSEObserver


def _channels(rng: np.random.Generator, c: int, n: int) -> np.ndarray:
    """[1, c, n] float32: channels of different kinds (ReLU outputs with exact zeros,
    negative-only, symmetric, one value, all zeros, a wide outlier channel, few values)."""
    rows = []
    for i in range(c):
        kind = i % 7
        if kind == 0:
            v = np.maximum(rng.normal(0.2, 1.0, n), 0.0)
        elif kind == 1:
            v = -rng.exponential(0.5, n)
        elif kind == 2:
            v = rng.laplace(0.0, rng.uniform(0.01, 3.0), n)
        elif kind == 3:
            v = np.full(n, rng.uniform(-2, 2))
        elif kind == 4:
            v = np.zeros(n)
        elif kind == 5:
            v = rng.uniform(-3.0, 90.0, n)
        else:
            v = np.where(rng.random(n) < 0.9, 0.0, rng.normal(0, 1e-3, n))
        rows.append(v)
    return np.stack(rows)[None].astype(np.float32)


def _one_by_one(obs: HistogramObserver, rows: np.ndarray, a: float, b: float, s: float) -> list[float]:
    return [float(QuantizationErrorModel(obs.view(int(c))).error(a, b, s)) for c in rows]


@pytest.mark.parametrize("c", [3, 7, 17, 33])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_row_equals_the_model_of_its_view_bit_for_bit(c, seed):
    rng = np.random.default_rng(seed)
    obs = WeightedMSEObserver(axis=1, weights=rng.uniform(0.1, 2.0, c), bins=1024)
    for _ in range(3):  # several samples: the grid moves between them
        obs.observe(_channels(rng, c, int(rng.integers(50, 3000))))
    rows = np.flatnonzero(obs._counts.any(axis=1))
    lo, hi = float(obs._min.min()), float(obs._max.max())
    edges = obs.view(int(rows[0])).edges()
    cases = [(min(lo, 0.0), max(hi, 0.0)), (0.0, max(hi, 1e-3)), (min(lo, -1e-3), 0.0)]
    cases += [
        (float(rng.uniform(min(lo, 0.0), 0.0)), float(rng.uniform(0.0, max(hi, 1e-3)))) for _ in range(20)
    ]
    cases += [(float(min(e, 0.0)), float(max(e, 0.0))) for e in edges[:: max(1, edges.size // 10)]]
    cases += [(-1e9, 1e9), (-1e-30, 1e-30)]
    for a, b in cases:
        s = (b - a) / 255.0 if b > a else 1.0
        got = channel_errors(
            obs._counts[rows],
            obs._k[rows],
            obs._start[rows],
            obs._lo[rows],
            obs._hi[rows],
            obs._zeros[rows],
            a,
            b,
            s,
        )
        want = _one_by_one(obs, rows, a, b, s)
        assert got.tolist() == want, (a, b)


def test_per_channel_grids_of_a_plain_histogram():
    """Rows on grids of their own (a per-channel histogram), not only a tensor's grid."""
    rng = np.random.default_rng(5)
    obs = HistogramObserver(axis=1, bins=256)
    obs.observe(_channels(rng, 11, 999))
    obs.observe(_channels(rng, 11, 501) * 7.0)
    rows = np.flatnonzero(obs._counts.any(axis=1))
    assert np.unique(obs._k[rows]).size > 1
    for a, b in [(-2.0, 3.0), (-0.01, 0.02), (0.0, 50.0), (-50.0, 0.0)]:
        s = (b - a) / 255.0
        got = channel_errors(
            obs._counts[rows],
            obs._k[rows],
            obs._start[rows],
            obs._lo[rows],
            obs._hi[rows],
            obs._zeros[rows],
            a,
            b,
            s,
        )
        assert got.tolist() == _one_by_one(obs, rows, a, b, s)


def _channel_ranges_one_by_one(obs: WeightedMSEObserver):
    """Eq. (29)'s decision with the per-tensor error summed channel by channel through
    QuantizationErrorModel (the form channel_ranges had before channel_errors)."""
    tensor = obs.tensor_range()
    lo, hi = np.minimum(obs._min, 0.0), np.maximum(obs._max, 0.0)
    a0, b0 = min(float(tensor.min), 0.0), max(float(tensor.max), 0.0)
    dead = hi <= lo
    lo, hi = np.where(dead, a0, lo), np.where(dead, b0, hi)
    g, n = obs.weights, obs._count.astype(np.float64)
    nz = np.maximum(n - obs._zeros.astype(np.float64), 0.0)
    zs = np.arange(obs.qmin + 1, obs.qmax, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        down = np.where(zs[:, None] > obs.qmin, -lo[None, :] / (zs[:, None] - obs.qmin), 0.0)
        up = np.where(zs[:, None] < obs.qmax, hi[None, :] / (obs.qmax - zs[:, None]), 0.0)
    steps = np.maximum(down, up)
    s = steps[int(np.argmin((steps**2) @ (g * n)))]
    e_pc = float(g @ (nz * s * s)) / 12.0
    st = (b0 - a0) / (obs.qmax - obs.qmin)
    e_pt = 0.0
    for c in np.flatnonzero(g > 0):
        if n[c] > 0 and obs._counts[c].any():
            e_pt += float(g[c]) * float(QuantizationErrorModel(obs.view(int(c))).error(a0, b0, st))
    return e_pc, e_pt


@pytest.mark.parametrize("c", [3, 7, 17])
def test_the_per_channel_decision_sums_the_same_error(c, monkeypatch):
    import quanta.calibrate.weighted_mse as wm

    rng = np.random.default_rng(c)
    x = np.stack([rng.laplace(0.0, 0.05 * (1 + 40 * (i % 3 == 0)), (2, 300)) for i in range(c)], axis=1)
    obs = WeightedMSEObserver(axis=1, weights=rng.uniform(0.5, 1.5, c), per_channel=True)
    obs.observe(x.astype(np.float32))
    seen = []
    real = wm.channel_errors

    def spy(*args):
        out = real(*args)
        seen.append(out)
        return out

    monkeypatch.setattr(wm, "channel_errors", spy)
    got = obs.range()
    e_pc, e_pt = _channel_ranges_one_by_one(obs)
    rows = np.flatnonzero(obs._counts.any(axis=1))
    total = 0.0
    for gc, ec in zip(obs.weights[rows].tolist(), seen[0].tolist(), strict=True):
        total += gc * ec
    assert total == e_pt
    assert (got.axis is not None) == (e_pc < MIN_GAIN * e_pt)
