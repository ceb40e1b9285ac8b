"""One accuracy lever at a time on EfficientNet-Lite0 / all-MiniLM-L6-v2: quantize with
quanta's options, run the file with ONNX Runtime on the evaluation split (never used for
calibration), print the metrics against FP32, the integer MAC share and the
quantization time. The data and FP32 outputs are accuracy.py's (same seeds).

    python benchmarks/real_models/levers.py --model efficientnet_lite0 \
        --config default='{}' --config gptq='{"weight_rounding": "gptq"}'
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import accuracy as A  # noqa: E402
from export import DEFAULT_CACHE, EFFICIENTNET, model_paths  # noqa: E402


def data(model: str):
    if model == EFFICIENTNET:
        return A.image_data(100, 200, 10)
    return A.sentence_data(100, 8)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=EFFICIENTNET)
    ap.add_argument("--config", action="append", default=[], help="name=JSON options of quantize_static")
    ap.add_argument("--out", type=Path, default=Path("/tmp/quanta-levers"))
    args = ap.parse_args(argv)
    import quanta

    _, fp32 = model_paths(DEFAULT_CACHE, args.model)
    calib, evals = data(args.model)
    ref = A.run_ort(fp32, evals)
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in args.config or ["default={}"]:
        name, _, opts = spec.partition("=")
        kw = json.loads(opts or "{}")
        if "__target__" in kw:
            t = kw.pop("__target__")
            kw["accuracy"] = quanta.AccuracyTarget(**t)
        dst = args.out / f"{args.model}.{name}.onnx"
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            summary = quanta.quantize_static(str(fp32), str(dst), calib, verbose=False, progress=False, **kw)
        seconds = time.perf_counter() - t0
        got = A.run_ort(dst, evals)
        m = A.metrics_for(args.model, ref, got)
        share = summary.integer_share
        digest = hashlib.sha1(dst.read_bytes()).hexdigest()[:12]
        print(
            f"{args.model} {name}: "
            + ", ".join(f"{k} {v:.4f}" for k, v in m.items())
            + f", integer MACs {share if share is None else round(100 * share, 2)} %, {seconds:.1f} s, sha1 {digest}",
            flush=True,
        )
        if getattr(summary, "accuracy", None) is not None:
            print(summary.accuracy.format() if hasattr(summary.accuracy, "format") else summary.accuracy)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
