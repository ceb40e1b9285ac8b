"""The timing loop shared by the kernel benchmarks (kernels.py, conv.py): one ratio table
per run, libraries timed in alternating blocks, best batch of each kept."""

from __future__ import annotations

import time
from collections.abc import Callable


def time_alternating(fns: dict[str, Callable[[], object]], ops: int, budget_s: float) -> dict[str, float]:
    """Best-batch GOPS of each callable, timed in alternating blocks.

    Each library runs a block of ~50 ms batches, then sleeps 30 ms before the next one:
    both thread pools spin for a while after a call (ONNX Runtime's by default, quanta's
    for 100 us), and a spinning pool of one library steals the second core from the
    other when their calls interleave batch by batch (measured: -30 % for whoever runs
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
            time.sleep(0.03)
            block_end = time.perf_counter() + 0.2
            while time.perf_counter() < block_end:
                t = time.perf_counter()
                for _ in range(reps[name]):
                    fn()
                best[name] = min(best[name], (time.perf_counter() - t) / reps[name])
    return {name: ops / dt / 1e9 for name, dt in best.items()}
