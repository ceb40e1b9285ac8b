"""quanta vs OpenVINO (and ONNX Runtime) at batch 1 on EfficientNet-Lite0 and
all-MiniLM-L6-v2: the ratios of issue 12's OpenVINO target, measured for a loaded machine.

Run::

    python benchmarks/openvino_gap.py [--models efficientnet_lite0,all_minilm_l6_v2]
                                      [--threads 1 2] [--rounds 9] [--runs 10] [--cache DIR]

Files (``benchmarks/foreign_qdq.py`` writes them once into ``<cache>/<model>.<layout>.onnx``,
from ``benchmarks/real_models/export.py``'s ``.prep.onnx``): quanta's own
(``quanta.quantize_static``), NNCF's default (``nncf.quantize``) and, for MiniLM, NNCF's
transformer preset. Engines, one session each in one process: quanta on quanta's file
(``q``), OpenVINO on quanta's file (``ov_q``), on NNCF's (``ov_n``), on NNCF's transformer
file (``ov_t``), ONNX Runtime on quanta's file (``ort``). OpenVINO and ORT are set up as
``foreign_qdq.openvino_run`` / ``ort_run`` (static shapes, latency hint, one stream).

Method: ``rounds`` rounds; in each, every engine runs a block of ``runs`` calls in turn
after a 300 ms pause (thread pools that spin after a call go idle). Each call is timed
twice: the process's CPU time (``time.process_time``, every thread of the process; what
the call costs, and nearly blind to other processes' load, which on this shared 2-vCPU
machine inflates wall times 2-3x) and the wall time. Per round and engine the block's
median; per round the ratio quanta / engine; the table gives the median over rounds of
those ratios. At 1 thread the CPU-time ratio is the measure. At 2 threads CPU time
counts both workers (and any spinning) so it is a cost, not a latency: the wall-time
ratio is the latency one, and it is noisy when the machine is loaded. Nothing here is a
test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import foreign_qdq as fq  # noqa: E402


def files_for(name: str, kind: str, cache: Path) -> dict[str, Path]:
    src, calib, _, _ = fq.model_and_feeds(name)
    layouts = ("quanta", "nncf", "nncf_transformer") if kind == "text" else ("quanta", "nncf")
    out = {}
    for layout in layouts:
        dst = cache / f"{name}.{layout}.onnx"
        if not dst.exists():
            fq.quantize(layout, src, dst, calib)
        out[layout] = dst
    return out


def time_rounds(
    fns: dict[str, Callable[[], object]], rounds: int, runs: int
) -> dict[str, list[tuple[float, float]]]:
    """Per engine, per round: (median CPU ms, median wall ms) of a block of ``runs`` calls."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    out: dict[str, list[tuple[float, float]]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            time.sleep(0.3)
            cpu, wall = [], []
            for _ in range(runs):
                c0, w0 = time.process_time(), time.perf_counter()
                fn()
                w1, c1 = time.perf_counter(), time.process_time()
                cpu.append(c1 - c0)
                wall.append(w1 - w0)
            out[k].append((statistics.median(cpu) * 1e3, statistics.median(wall) * 1e3))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(fq.REAL))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--cache", type=Path, default=fq.BENCH_CACHE / "foreign")
    ap.add_argument("--no-ort", action="store_true", help="leave ONNX Runtime out")
    args = ap.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    print("# per engine: median over rounds of the block medians, CPU ms / wall ms;")
    print("# q/x: median over rounds of the per-round ratio quanta / x, CPU-time ratio (wall-time ratio)")
    for name in args.models.split(","):
        _, _, feed, kind = fq.model_and_feeds(name)
        files = files_for(name, kind, args.cache)
        for threads in args.threads:
            q, _ = fq.quanta_run(files["quanta"], threads)
            fns: dict[str, Callable[[], object]] = {"q": lambda q=q, feed=feed: q(feed)}
            for layout, key in (("quanta", "ov_q"), ("nncf", "ov_n"), ("nncf_transformer", "ov_t")):
                if layout in files:
                    ov = fq.openvino_run(files[layout], threads, feed)
                    fns[key] = lambda ov=ov, feed=feed: ov(feed)
            if not args.no_ort:
                ort = fq.ort_run(files["quanta"], threads)
                fns["ort"] = lambda ort=ort, feed=feed: ort(feed)
            res = time_rounds(fns, args.rounds, args.runs)
            cells = []
            for k, v in res.items():
                cpu = statistics.median(c for c, _ in v)
                wall = statistics.median(w for _, w in v)
                cells.append(f"{k} {cpu:.2f}/{wall:.2f}")
            ratios = []
            for k in res:
                if k == "q":
                    continue
                rc = statistics.median(a[0] / b[0] for a, b in zip(res["q"], res[k]))
                rw = statistics.median(a[1] / b[1] for a, b in zip(res["q"], res[k]))
                ratios.append(f"q/{k} {rc:.2f} ({rw:.2f})")
            print(f"{name} {threads} thr: " + ", ".join(cells), flush=True)
            print(f"{name} {threads} thr: " + ", ".join(ratios), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
