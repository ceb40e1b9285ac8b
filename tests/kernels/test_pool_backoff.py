"""The kernel pool's contention back-off (qgemm/thread_pool.cc, docs/kernels.md "Threads"):
jobs that run on the caller alone give the same bytes as the shared runs and as the
twin, the counters count them, and switching the back-off off ends a solo period."""

from __future__ import annotations

import numpy as np
import pytest

from quanta.kernels import _native
from quanta.kernels.reference import qgemm as ref


@pytest.fixture
def backoff_reset():
    _native.pool_solo_for(0)
    yield
    _native.pool_solo_for(0)
    _native.pool_set_backoff(True)


def _case(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # odd shapes, K past 258, non-zero zero points: the chunking has several panels and
    # row groups to hand out, so a solo job really runs every chunk on the caller
    x = rng.integers(0, 256, (97, 301), dtype=np.uint8)
    w = rng.integers(-128, 128, (301, 67), dtype=np.int8)
    bias = rng.integers(-5000, 5000, 67, dtype=np.int32)
    return x, w, bias


def test_solo_jobs_give_the_shared_runs_bytes_and_are_counted(backoff_reset: None) -> None:
    rng = np.random.default_rng(17)
    x, w, bias = _case(rng)
    packed = _native.pack_weights_s8(w, 3)
    want = ref.qgemm(x, w, 11, 3, bias=bias)
    shared = _native.qgemm(x, packed, 11, "int32", bias=bias, num_threads=2)
    before = _native.pool_stats()
    _native.pool_solo_for(10_000_000)  # 10 s: longer than the test
    solo = _native.qgemm(x, packed, 11, "int32", bias=bias, num_threads=2)
    after = _native.pool_stats()
    np.testing.assert_array_equal(shared, want)
    np.testing.assert_array_equal(solo, want)
    assert after["jobs"] > before["jobs"]
    assert after["solo_jobs"] - before["solo_jobs"] == after["jobs"] - before["jobs"]


def test_solo_period_ends_and_backoff_switches_off(backoff_reset: None) -> None:
    rng = np.random.default_rng(5)
    x, w, bias = _case(rng)
    packed = _native.pack_weights_s8(w, -7)
    want = ref.qgemm(x, w, 200, -7, bias=bias)
    _native.pool_solo_for(10_000_000)
    _native.pool_set_backoff(False)  # also ends the solo period
    before = _native.pool_stats()
    got = _native.qgemm(x, packed, 200, "int32", bias=bias, num_threads=2)
    after = _native.pool_stats()
    np.testing.assert_array_equal(got, want)
    assert after["jobs"] > before["jobs"]
    assert after["solo_jobs"] == before["solo_jobs"]


def test_pool_stats_keys() -> None:
    stats = _native.pool_stats()
    assert set(stats) == {"jobs", "solo_jobs", "backoffs", "preemptions"}
    assert all(isinstance(v, int) and v >= 0 for v in stats.values())
