"""Real-model speed: quanta (native) vs ONNX Runtime on the SAME quantized files.

Run after ``export.py`` and ``accuracy.py`` (which write the quantized files into the
cache's ``quantized/`` folder), or after ``speed.py --make`` (which writes the three
files this benchmark needs itself: ORT's static QDQ per-channel EfficientNet-Lite0 and
MiniLM, and ORT's ``quantize_dynamic`` MiniLM)::

    python benchmarks/real_models/speed.py [--make] [--threads 1 2] [--blocks 5] [--runs 10]

Per file and thread count: both engines get the same inputs (EfficientNet: one
normal 1x3x224x224 image; MiniLM: 128 tokens of ones, batch 1); each engine runs
blocks of ``runs`` calls in turn (quanta, ORT, quanta, ...), with a 30 ms pause between
blocks (both thread pools spin after a call); the median over all calls is reported,
and the ratio quanta / ORT (< 1: quanta is faster). ORT: ``intra_op_num_threads`` =
threads, one inter-op thread, sequential execution, ``ORT_ENABLE_ALL``. The machine is
shared and noisy: only ratios from one run mean something. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import quanta  # noqa: E402

CACHE = Path(os.environ.get("QUANTA_BENCH_CACHE", Path.home() / ".cache" / "quanta-bench"))

#: (label, file in CACHE/quantized, model kind)
FILES = [
    ("EfficientNet-Lite0, ORT static QDQ per-channel", "efficientnet_lite0.ort_per_channel.onnx", "image"),
    ("EfficientNet-Lite0, quanta static QDQ", "efficientnet_lite0.quanta_default.onnx", "image"),
    ("all-MiniLM-L6-v2, ORT static QDQ per-channel", "all_minilm_l6_v2.ort_per_channel.onnx", "text"),
    ("all-MiniLM-L6-v2, quanta static QDQ", "all_minilm_l6_v2.quanta_default.onnx", "text"),
    ("all-MiniLM-L6-v2, ORT quantize_dynamic", "all_minilm_l6_v2.ort_dynamic.onnx", "text"),
]


def feeds_for(kind: str) -> dict[str, np.ndarray]:
    if kind == "image":
        return {"input": np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)}
    ones = np.ones((1, 128), np.int64)
    return {"input_ids": ones, "attention_mask": ones, "token_type_ids": np.zeros_like(ones)}


def make_files() -> None:
    """The ORT-quantized files this benchmark needs, from the exported float models."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    out = CACHE / "quantized"
    out.mkdir(parents=True, exist_ok=True)
    dyn = out / "all_minilm_l6_v2.ort_dynamic.onnx"
    if not dyn.exists():
        quantize_dynamic(CACHE / "all_minilm_l6_v2.prep.onnx", dyn, weight_type=QuantType.QInt8)

    class Reader(CalibrationDataReader):
        def __init__(self, kind: str):
            rng = np.random.default_rng(1)
            if kind == "image":
                self.data = [
                    {"input": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)} for _ in range(8)
                ]
            else:
                self.data = [
                    {
                        "input_ids": rng.integers(1000, 5000, (1, 128)).astype(np.int64),
                        "attention_mask": np.ones((1, 128), np.int64),
                        "token_type_ids": np.zeros((1, 128), np.int64),
                    }
                    for _ in range(8)
                ]
            self.it = iter(self.data)

        def get_next(self):
            return next(self.it, None)

    for name, kind in (("efficientnet_lite0", "image"), ("all_minilm_l6_v2", "text")):
        dst = out / f"{name}.ort_per_channel.onnx"
        if not dst.exists():
            quantize_static(
                CACHE / f"{name}.prep.onnx",
                dst,
                Reader(kind),
                quant_format=QuantFormat.QDQ,
                per_channel=True,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
            )


def ort_session(path: str, threads: int):
    import onnxruntime

    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    return onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def time_alternating(fns: dict, blocks: int, runs: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():  # warm-up
        for _ in range(2):
            fn()
    for _ in range(blocks):
        for k, fn in fns.items():
            time.sleep(0.03)
            for _ in range(runs):
                t0 = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--make", action="store_true", help="write the ORT-quantized files first (needs export.py's)"
    )
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args(argv)
    if args.make:
        make_files()
    import onnxruntime

    print(f"# quanta (native) vs onnxruntime {onnxruntime.__version__}, same file, same inputs; median ms")
    print(
        f"{'model':<48} {'thr':>3} {'quanta':>9} {'ORT':>9} {'q/ORT':>6} {'max|diff|':>10} {'fallbacks':>10}"
    )
    for label, name, kind in FILES:
        path = CACHE / "quantized" / name
        if not path.exists():
            print(f"{label:<48} (missing: {path}; run export.py and accuracy.py, or --make)")
            continue
        feeds = feeds_for(kind)
        for threads in args.threads:
            opts = quanta.SessionOptions()
            opts.intra_op_num_threads = threads
            q = quanta.InferenceSession(str(path), sess_options=opts)
            o = ort_session(str(path), threads)
            diff = max(
                float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
                for a, b in zip(q.run(None, feeds), o.run(None, feeds))
            )
            med = time_alternating(
                {"q": lambda q=q, f=feeds: q.run(None, f), "o": lambda o=o, f=feeds: o.run(None, f)},
                args.blocks,
                args.runs,
            )
            fb = f"{len(q.fallbacks)}/{len(q.plan.steps)}"
            print(
                f"{label:<48} {threads:>3} {med['q']:>9.2f} {med['o']:>9.2f} {med['q'] / med['o']:>6.2f} "
                f"{diff:>10.2e} {fb:>10}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
