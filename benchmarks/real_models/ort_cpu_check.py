"""quanta's files in ONNX Runtime on the CPU at hand: fused (as users run it), unfused
(every DQ / op / Q as written: the file's own arithmetic) and in quanta, against FP32.

On x86 CPUs without VNNI ONNX Runtime's uint8 x int8 GEMM saturates pair sums of
full-range int8 weights (quanta/quantize/ort_saturation.py); this measures what that costs
on the accuracy benchmark's models and what ``weight_bits=7`` gives back. Data and
metrics are accuracy.py's (evaluation split never used for calibration).

    python benchmarks/real_models/ort_cpu_check.py --model efficientnet_lite0 \\
        --config default='{}' --config w7='{"weight_bits": 7}'
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import accuracy as A  # noqa: E402
from export import DEFAULT_CACHE, EFFICIENTNET, model_paths  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    import quanta
    from quanta.quantize.ort_saturation import onnxruntime_int8_saturates

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=EFFICIENTNET)
    ap.add_argument("--config", action="append", default=[], help="name=JSON options of quantize_static")
    ap.add_argument("--out", type=Path, default=Path("/tmp/quanta-ort-cpu-check"))
    ap.add_argument(
        "--calib",
        type=int,
        default=100,
        help="EfficientNet calibration images (an accuracy target holds part out)",
    )
    args = ap.parse_args(argv)
    print(
        f"{platform.processor() or platform.machine()}: ONNX Runtime's int8 GEMM saturates here: "
        f"{onnxruntime_int8_saturates()}",
        flush=True,
    )
    _, fp32 = model_paths(DEFAULT_CACHE, args.model)
    calib, evals = (
        A.image_data(args.calib, 200, 10) if args.model == EFFICIENTNET else A.sentence_data(100, 8)
    )
    ref = A.run_ort(fp32, evals)
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in args.config or ["default={}"]:
        name, _, opts = spec.partition("=")
        dst = args.out / f"{args.model}.{name}.onnx"
        t0 = time.perf_counter()
        kw = json.loads(opts or "{}")
        if "__target__" in kw:  # {"__target__": {AccuracyTarget's fields}}, as levers.py
            kw["accuracy"] = quanta.AccuracyTarget(**kw.pop("__target__"))
        summary = quanta.quantize_static(str(fp32), str(dst), calib, verbose=False, progress=False, **kw)
        share = summary.integer_share
        seconds = time.perf_counter() - t0
        sessions = {
            "ONNX Runtime fused": A.ort_session(dst),
            "ONNX Runtime unfused": A.ort_session(dst, optimize=False),
            "quanta": quanta.InferenceSession(str(dst)),
        }
        for what, sess in sessions.items():
            got = np.concatenate([sess.run(None, f)[0] for f in evals])
            m = A.metrics_for(args.model, ref, got)
            print(
                f"{args.model} {name} [{what}]: "
                + ", ".join(f"{k} {v:.4f}" for k, v in m.items())
                + f", integer MACs {share if share is None else round(100 * share, 2)} %"
                + f" (quantized in {seconds:.0f} s)",
                flush=True,
            )
        if summary.accuracy is not None:
            print(summary.accuracy.format(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
