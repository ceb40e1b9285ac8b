"""The timing loop shared by the kernel benchmarks (kernels.py, conv.py): one ratio table
per run, libraries timed in alternating blocks, best batch of each kept; and the reader
of ONNX Runtime's profile that the model benchmarks share (fp32_latency.py, node_gap.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

#: Seconds one library's timed block waits after the other's: ONNX Runtime's intra-op
#: pool (allow_spinning, its default) keeps spinning for 30-60 ms after a run on this
#: 2-vCPU machine, and a 2-thread run of the next library started inside that window
#: gets one core (measured on ppocrv3_det's FP32 path, 2 threads: after a 30 ms pause
#: quanta read 47 ms / ORT 27 ms, after 100-300 ms 26-27 / 27-29 ms). 1-thread runs have
#: no pool thread and are not affected.
SPIN_SETTLE_S = 0.3


def ort_kernel_medians(profile_file: str) -> tuple[dict[str, float], dict[str, str], list[float]]:
    """From an ONNX Runtime profile (``InferenceSession.end_profiling()``'s file): each
    node's median kernel time over the profiled runs (us, by node name without the
    ``_kernel_time`` suffix: one slow run on a shared machine does not move it), each
    node's operator type, and every ``model_run``'s time (us)."""
    per: dict[str, list[float]] = {}
    ops: dict[str, str] = {}
    runs: list[float] = []
    for ev in json.loads(Path(profile_file).read_text()):
        if ev.get("cat") == "Node" and ev.get("name", "").endswith("_kernel_time"):
            name = ev["name"][: -len("_kernel_time")]
            per.setdefault(name, []).append(ev["dur"])
            ops[name] = ev["args"].get("op_name", "?")
        elif ev.get("name") == "model_run":
            runs.append(ev["dur"])
    return {n: float(np.median(v)) for n, v in per.items()}, ops, runs


def time_alternating(fns: dict[str, Callable[[], object]], ops: int, budget_s: float) -> dict[str, float]:
    """Best-batch GOPS of each callable, timed in alternating blocks.

    Each library runs a block of ~50 ms batches, then sleeps ``SPIN_SETTLE_S`` before
    the next one: both thread pools spin for a while after a call (ONNX Runtime's by
    default, quanta's briefly), and a spinning pool of one library steals the second core
    from the other when their calls interleave (measured: -30 % for whoever runs
    second).
    """
    for fn in fns.values():  # warm up (first-touch, thread pools)
        fn()
        fn()
    one = {}
    for name, fn in fns.items():
        t = time.perf_counter()
        fn()
        one[name] = max(time.perf_counter() - t, 1e-7)
    reps = {name: max(1, int(0.05 / dt)) for name, dt in one.items()}  # ~50 ms per batch
    best = dict.fromkeys(fns, float("inf"))
    rounds = max(2, int(budget_s / (0.2 * len(fns))))
    for _ in range(rounds):
        for name, fn in fns.items():
            time.sleep(SPIN_SETTLE_S)
            block_end = time.perf_counter() + 0.2
            while time.perf_counter() < block_end:
                t = time.perf_counter()
                for _ in range(reps[name]):
                    fn()
                best[name] = min(best[name], (time.perf_counter() - t) / reps[name])
    return {name: ops / dt / 1e9 for name, dt in best.items()}


def cpu_time_calls(
    fns: dict[str, Callable[[], object]], ops: int, budget_s: float
) -> tuple[dict[str, float], dict[str, float]]:
    """GOPS of each one-thread callable from this thread's CPU time per call
    (``time.thread_time``), so that time the OS gives other processes is not counted. The
    callables alternate in blocks of ~20 ms of calls (at least 3 rounds, about
    ``budget_s`` seconds each in all), as in :func:`time_alternating`: a phase of the
    shared machine falls on all alike, and each block runs with its own operands in cache
    after its first call (call by call, each library would start every call from the
    other's evictions). Returns the best call's GOPS and the median call's."""
    for fn in fns.values():  # warm up (first-touch)
        fn()
        fn()
    reps = {}
    for name, fn in fns.items():
        t = time.thread_time()
        fn()
        reps[name] = max(1, int(0.02 / max(time.thread_time() - t, 1e-7)))
    times: dict[str, list[float]] = {name: [] for name in fns}
    end = time.perf_counter() + budget_s * len(fns)
    rounds = 0
    while time.perf_counter() < end or rounds < 3:
        for name, fn in fns.items():
            for _ in range(reps[name]):
                t = time.thread_time()
                fn()
                times[name].append(max(time.thread_time() - t, 1e-9))
        rounds += 1
    best = {name: ops / min(ts) / 1e9 for name, ts in times.items()}
    median = {name: ops / float(np.median(ts)) / 1e9 for name, ts in times.items()}
    return best, median


def fastest_calls(fns: dict[str, Callable[[], object]], budget_s: float, threads: int) -> dict[str, float]:
    """The fastest single call of each callable, the callables interleaved call by call
    (``--fastest``): with one thread timed in thread CPU time, so that the time the OS
    gives other processes on a shared machine is not counted (both engines run a
    one-thread call on the calling thread); with more, wall time."""
    clock = time.thread_time if threads == 1 else time.perf_counter
    for fn in fns.values():
        fn()
        fn()
    best = {k: float("inf") for k in fns}
    calls = 0
    end = time.perf_counter() + budget_s * len(fns)
    while time.perf_counter() < end or calls < 10:
        for name, fn in fns.items():
            t = clock()
            fn()
            best[name] = min(best[name], clock() - t)
        calls += 1
    return best
