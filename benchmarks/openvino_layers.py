"""Where quanta's time goes next to OpenVINO's, per layer class, on one model at one thread.

Run::

    python benchmarks/openvino_layers.py [--models efficientnet_lite0,all_minilm_l6_v2]
                                         [--runs 60] [--top 25] [--cache DIR]

Files as ``benchmarks/openvino_gap.py`` (its ``files_for``): quanta on quanta's own file,
OpenVINO on NNCF's (for MiniLM NNCF's transformer-preset file).

- quanta: the session profiler (``enable_profiling``) with its step clock read from
  ``time.thread_time_ns`` (the calling thread's CPU time: one thread, so every kernel runs
  on it, and other processes' load does not inflate it), ``runs`` runs, the steps summed
  by (op type, kernel).
- OpenVINO: ``PERF_COUNT`` and the infer request's ``profiling_info``, real time per
  executed node (wall time: OpenVINO offers no per-node CPU time), the median over
  ``runs`` runs of each (node type, exec type) class's sum.

Under load the two clocks disagree by a factor (OpenVINO's per-node wall times inflate with
the other processes, quanta's thread times do not), so the table compares **shares** of
each engine's own total, and gives as rough milliseconds each share times the engine's
median process CPU time over plain (unprofiled) runs. quanta's profiled runs cost more than
plain ones (the profiler keeps every step separate), so its shares of small steps are high.
Nothing here is a test.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import foreign_qdq as fq  # noqa: E402
import openvino_gap  # noqa: E402


def cpu_ms(fn: Callable[[], object], runs: int) -> float:
    """Median process CPU time of one call, ms."""
    for _ in range(3):
        fn()
    ts = []
    for _ in range(runs):
        c0 = time.process_time()
        fn()
        ts.append(time.process_time() - c0)
    return statistics.median(ts) * 1e3


def quanta_classes(path: Path, feed: fq.Feed, runs: int) -> dict[str, float]:
    """µs per run of each (op type, kernel) class, thread CPU time."""
    import quanta

    so = quanta.SessionOptions(ort_float_orders=fq.ORT_FLOAT_ORDERS)  # as fq.quanta_run
    so.intra_op_num_threads = 1
    so.enable_profiling = True
    clock = time.perf_counter_ns
    time.perf_counter_ns = time.thread_time_ns  # the executor reads time.perf_counter_ns per run
    try:
        s = quanta.InferenceSession(str(path), so)
        for _ in range(runs):
            s.run(None, feed)
        summary = s.profile_summary(top=1 << 30)
    finally:
        time.perf_counter_ns = clock
    out: dict[str, float] = collections.defaultdict(float)
    for st in summary.steps:
        out[f"{st.op_type} | {st.kernel}"] += st.total_us / summary.runs
    return dict(out)


def openvino_classes(path: Path, feed: fq.Feed, runs: int) -> dict[str, float]:
    """µs per run (median over runs) of each (node type, exec type) class, wall time."""
    import openvino as ov

    core = ov.Core()
    model = core.read_model(str(path))
    model.reshape({i.get_any_name(): list(feed[i.get_any_name()].shape) for i in model.inputs})
    cfg = {"INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY", "PERF_COUNT": True}
    req = core.compile_model(model, "CPU", cfg).create_infer_request()
    for _ in range(3):
        req.infer(feed)
    samples: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(runs):
        req.infer(feed)
        per: dict[str, float] = collections.defaultdict(float)
        for p in req.profiling_info:
            if p.status == p.Status.EXECUTED:
                per[f"{p.node_type} | {p.exec_type}"] += p.real_time.total_seconds() * 1e6
        for k, v in per.items():
            samples[k].append(v)
    return {k: statistics.median(v) for k, v in samples.items()}


def show(title: str, classes: dict[str, float], total_ms: float, top: int) -> None:
    whole = sum(classes.values()) or 1.0
    print(f"## {title}: profiled sum {whole:.0f} µs a run; plain runs {total_ms:.2f} ms process CPU")
    print(f"{'share':>7} {'~ms':>7}  class")
    for k, us in sorted(classes.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{us / whole:7.1%} {us / whole * total_ms:7.3f}  {k}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(fq.REAL))
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--cache", type=Path, default=fq.BENCH_CACHE / "foreign")
    args = ap.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        _, _, feed, kind = fq.model_and_feeds(name)
        files = openvino_gap.files_for(name, kind, args.cache)
        ov_file = files.get("nncf_transformer", files["nncf"])
        q, _ = fq.quanta_run(files["quanta"], 1)
        ov = fq.openvino_run(ov_file, 1, feed)
        q_ms = cpu_ms(lambda q=q, feed=feed: q(feed), args.runs)
        ov_ms = cpu_ms(lambda ov=ov, feed=feed: ov(feed), args.runs)
        print(
            f"# {name}, 1 thread: quanta {q_ms:.2f} ms, OpenVINO ({ov_file.name}) {ov_ms:.2f} ms process CPU"
        )
        show(
            f"quanta, {files['quanta'].name}",
            quanta_classes(files["quanta"], feed, args.runs),
            q_ms,
            args.top,
        )
        show(f"OpenVINO, {ov_file.name}", openvino_classes(ov_file, feed, args.runs), ov_ms, args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
