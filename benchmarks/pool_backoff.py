"""Two threads against one, with the kernel pool's contention back-off on and off.

    python benchmarks/pool_backoff.py --run ~/.cache/quanta-zoo/runs/<run> ppocr_det:quanta ddddocr:quanta

Per ``model:config`` (the file ``<run>/<model>.<config>.onnx``; config ``fp32`` is the
source file), five sessions on one evaluation feed: quanta 1 thread, quanta 2 threads
with the back-off (docs/kernels.md "Threads"), the same session with it off (the pool
without it), ONNX Runtime 1 and 2 threads; ``--rounds`` rounds of 5 runs each,
alternating, 20 ms pause between blocks; medians in ms, their ratios, and the pool's
counters over the rounds. Results: benchmarks/results/2026-12-02-speed.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "zoo"))
sys.path.insert(0, str(HERE))

import zoo  # noqa: E402  (benchmarks is not a package)
import zoodata  # noqa: E402


def measure(path: Path, feed: dict, rounds: int) -> tuple[dict[str, float], dict[str, int]]:
    from quanta.kernels import _native

    sessions = {
        "q1": zoo.quanta_session(path, 1),
        "q2": zoo.quanta_session(path, 2),
        "o1": zoo.ort_session(path, 1),
        "o2": zoo.ort_session(path, 2),
    }
    order = ["q1", "q2", "q2off", "o1", "o2"]
    times: dict[str, list[float]] = {k: [] for k in order}
    for s in sessions.values():
        for _ in range(3):
            s.run(None, feed)
    before = _native.pool_stats()
    try:
        for _ in range(rounds):
            for k in order:
                s = sessions["q2" if k == "q2off" else k]
                _native.pool_set_backoff(k != "q2off")
                time.sleep(0.02)
                for _ in range(5):
                    t = time.perf_counter()
                    s.run(None, feed)
                    times[k].append(time.perf_counter() - t)
    finally:
        _native.pool_set_backoff(True)
    after = _native.pool_stats()
    return {k: float(np.median(v)) * 1e3 for k, v in times.items()}, {k: after[k] - before[k] for k in after}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="model:config, e.g. ppocr_det:quanta")
    ap.add_argument("--run", required=True, help="a zoo.py output folder with the quantized files")
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args(argv)
    cache = zoodata.cache_dir(None)
    manifest = {e["name"]: e for e in json.loads((cache / "manifest.json").read_text())["models"]}
    for spec in args.files:
        name, config = spec.split(":")
        path = (
            cache / manifest[name]["path"] if config == "fp32" else Path(args.run) / f"{name}.{config}.onnx"
        )
        feed = zoo.Model(manifest[name], cache).eval[0]
        ms, stats = measure(path, feed, args.rounds)
        print(
            f"{spec:28s} " + " ".join(f"{k} {v:.3f}" for k, v in ms.items()) + " ms | "
            f"q2/q1 {ms['q2'] / ms['q1']:.2f} q2off/q1 {ms['q2off'] / ms['q1']:.2f} "
            f"q2/o2 {ms['q2'] / ms['o2']:.2f} o2/o1 {ms['o2'] / ms['o1']:.2f} | {stats}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
