"""The kernel pool's contention back-off (qgemm/thread_pool.cc, docs/kernels.md "Threads"):
jobs that run on the caller alone give the same bytes as the shared runs and as the
twin, the counters count them, and switching the back-off off ends a solo period."""

from __future__ import annotations

import os
import subprocess
import sys
import time

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
    # the caller ran chunks of its own (a worker counts its chunks and their time after
    # the job is done, which may be after qgemm returned: not asserted)
    assert after["caller_work_ns"] > before["caller_work_ns"]


def test_pool_stats_keys() -> None:
    stats = _native.pool_stats()
    assert set(stats) == {
        "jobs",
        "solo_jobs",
        "backoffs",
        "preemptions",
        "caller_chunks",
        "worker_chunks",
        "publish_ns",
        "wait_ns",
        "colocated",
        "caller_work_ns",
        "worker_work_ns",
        "worker_spin_ns",
    }
    assert all(isinstance(v, int) and v >= 0 for v in stats.values())


def test_shared_jobs_count_the_callers_chunks(backoff_reset: None) -> None:
    _native.pool_set_backoff(False)
    rng = np.random.default_rng(23)
    x, w, bias = _case(rng)
    packed = _native.pack_weights_s8(w, 9)
    before = _native.pool_stats()
    got = _native.qgemm(x, packed, 4, "int32", bias=bias, num_threads=2)
    after = _native.pool_stats()
    np.testing.assert_array_equal(got, ref.qgemm(x, w, 4, 9, bias=bias))
    jobs = after["jobs"] - before["jobs"]
    assert jobs > 0

    def chunks_ran() -> int:
        now = _native.pool_stats()
        return sum(now[k] - before[k] for k in ("caller_chunks", "worker_chunks"))

    # a shared job has at least two chunks; a worker adds its count after its last
    # chunk, possibly after the caller returned, so wait for it a little
    deadline = time.monotonic() + 5.0
    while chunks_ran() < 2 * jobs and time.monotonic() < deadline:
        time.sleep(0.01)
    assert chunks_ran() >= 2 * jobs
    assert 0 <= after["colocated"] - before["colocated"] <= jobs


@pytest.mark.parametrize("nudge", ["0", "1"])
def test_worker_placement_never_changes_bytes(nudge: str) -> None:
    # QUANTA_POOL_NUDGE is read when the pool starts: a fresh process per setting
    code = (
        "import numpy as np; from quanta.kernels import _native; "
        "from quanta.kernels.reference import qgemm as ref; "
        "rng = np.random.default_rng(3); "
        "x = rng.integers(0, 256, (131, 277), dtype=np.uint8); "
        "w = rng.integers(-128, 128, (277, 71), dtype=np.int8); "
        "p = _native.pack_weights_s8(w, -3); "
        "want = ref.qgemm(x, w, 17, -3); "
        "assert all(np.array_equal(_native.qgemm(x, p, 17, 'int32', num_threads=2), want) for _ in range(50)); "
        "print(_native.pool_stats()['jobs'])"
    )
    env = {**os.environ, "QUANTA_POOL_NUDGE": nudge}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout.strip()) > 0
