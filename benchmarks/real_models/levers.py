"""One accuracy lever at a time on EfficientNet-Lite0 / all-MiniLM-L6-v2: quantize with
quanta's options, run the file with ONNX Runtime on the evaluation split (never used for
calibration), print the metrics against FP32, the integer MAC share and the
quantization time. The data and FP32 outputs are accuracy.py's (same seeds).

    python benchmarks/real_models/levers.py --model efficientnet_lite0 \
        --config default='{}' --config gptq='{"weight_rounding": "gptq"}'

``--zoo a,b``: the public zoo models instead (benchmarks/zoo.py's feeds and task metric,
ONNX Runtime running each file).

``--runtime`` (repeatable): who runs each quantized file, one line of metrics each:
``ort`` (ONNX Runtime as users run it, QDQ fused into its integer kernels; the default),
``ort-unfused`` (graph optimisations off: every DQ / op / Q as written, the file's own
arithmetic) and ``quanta``. On x86 CPUs without VNNI ORT's fused int8 kernels saturate
full-range int8 weights (quanta/quantize/ort_saturation.py), so there ``ort`` measures
ORT's error as well as the file's; the first line printed says whether that is the case.

    python benchmarks/real_models/levers.py --model efficientnet_lite0 \
        --config default='{}' --config w7='{"weight_bits": 7}' \
        --runtime ort --runtime ort-unfused --runtime quanta
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


def data(model: str, n_calib: int = 100):
    if model == EFFICIENTNET:
        return A.image_data(n_calib, 200, 10)
    return A.sentence_data(100, 8)


RUNTIMES = ("ort", "ort-unfused", "quanta")


def options(spec: str) -> tuple[str, dict]:
    """``name=JSON`` of ``--config`` -> (name, quantize_static options); the key
    ``__target__`` holds AccuracyTarget's fields."""
    import quanta

    name, _, opts = spec.partition("=")
    kw = json.loads(opts or "{}")
    if "__target__" in kw:
        kw["accuracy"] = quanta.AccuracyTarget(**kw.pop("__target__"))
    return name, kw


def session(runtime: str, path: Path):
    import quanta

    if runtime == "quanta":
        return quanta.InferenceSession(str(path))
    return A.ort_session(path, optimize=runtime == "ort")


def zoo_main(names: list[str], configs: list[str], out: Path) -> int:
    import quanta

    sys.path.insert(0, str(HERE.parent))
    import zoo as Z

    cache = Z.zoodata.cache_dir()
    manifest = json.loads((cache / "manifest.json").read_text())
    entries = {e["name"]: e for e in (manifest["models"] if isinstance(manifest, dict) else manifest)}
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        model = Z.Model(entries[name], cache)
        ref = model.outputs(Z.ort_session(model.path))
        for spec in configs:
            cname, kw = options(spec)
            dst = out / f"{name}.{cname}.onnx"
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    summary = quanta.quantize_static(
                        str(model.path), str(dst), model.calib, verbose=False, progress=False, **kw
                    )
                seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
                got = model.outputs(Z.ort_session(dst))
                m = Z.metric(model.kind, ref, got)
            except Exception as e:  # one failure is one line
                print(f"{name} {cname}: FAILED {type(e).__name__}: {e}", flush=True)
                continue
            share = summary.integer_share
            print(
                f"{name} {cname}: {m}, integer MACs {share if share is None else round(100 * share, 2)} %, "
                f"{seconds:.1f} s ({cpu:.1f} s CPU)",
                flush=True,
            )
            if getattr(summary, "accuracy", None) is not None:
                print(summary.accuracy.format(), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=EFFICIENTNET)
    ap.add_argument("--config", action="append", default=[], help="name=JSON options of quantize_static")
    ap.add_argument("--out", type=Path, default=Path("/tmp/quanta-levers"))
    ap.add_argument(
        "--calib",
        type=int,
        default=100,
        help="EfficientNet calibration images (an accuracy target holds part out)",
    )
    ap.add_argument("--zoo", help="comma-separated zoo model names (benchmarks/zoo.py's data and metric)")
    ap.add_argument("--runtime", action="append", choices=RUNTIMES, help="who runs each file (default: ort)")
    args = ap.parse_args(argv)
    if args.zoo:
        return zoo_main(args.zoo.split(","), args.config or ["default={}"], args.out)
    import quanta
    from quanta.quantize.ort_saturation import onnxruntime_int8_saturates

    runtimes = args.runtime or ["ort"]
    if any(r.startswith("ort") for r in runtimes):
        print(
            f"ONNX Runtime's int8 GEMM saturates full-range int8 weights here: {onnxruntime_int8_saturates()}"
        )
    _, fp32 = model_paths(DEFAULT_CACHE, args.model)
    calib, evals = data(args.model, args.calib)
    ref = A.run_ort(fp32, evals)
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in args.config or ["default={}"]:
        name, kw = options(spec)
        dst = args.out / f"{args.model}.{name}.onnx"
        t0, c0 = time.perf_counter(), time.process_time()
        with contextlib.redirect_stdout(io.StringIO()):
            summary = quanta.quantize_static(str(fp32), str(dst), calib, verbose=False, progress=False, **kw)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        share = summary.integer_share
        digest = hashlib.sha1(dst.read_bytes()).hexdigest()[:12]
        for runtime in runtimes:
            sess = session(runtime, dst)
            got = np.concatenate([sess.run(None, f)[0] for f in evals])
            m = A.metrics_for(args.model, ref, got)
            print(
                f"{args.model} {name}"
                + (f" [{runtime}]" if args.runtime else "")
                + ": "
                + ", ".join(f"{k} {v:.4f}" for k, v in m.items())
                + f", integer MACs {share if share is None else round(100 * share, 2)} %, {seconds:.1f} s "
                f"({cpu:.1f} s CPU), sha1 {digest}",
                flush=True,
            )
        if getattr(summary, "accuracy", None) is not None:
            print(summary.accuracy.format() if hasattr(summary.accuracy, "format") else summary.accuracy)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
