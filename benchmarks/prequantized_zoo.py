"""``quantize_static`` on the zoo's already-quantized files (shipped int8 and other-tool
files): does it write a file, does the file pass ``onnx.checker`` and run in ONNX Runtime
and quanta, and how far are the new file and the input file from the input's float view
(quanta/quantize/float_view.py; the float original is not needed).

    python benchmarks/prequantized_zoo.py [--models ppocr_cls.ort_qop,t5_enc_int8] [--calib 8]

One line per model: seconds, max |ORT - quanta| on the new file, median output SQNR
against the float view of the new file and of the input file (on ``--eval`` feeds of
the zoo's evaluation split), the integer MAC share, then the summary's notes. The new
file keeps the input's activation grids (``keep_file_parameters=True``, the default).
Nothing here is a test; the machine is shared and the seconds are noisy.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "zoo"))

QUANTIZED = (
    "ppocr_cls.ort_qdq",
    "ppocr_cls.ort_qop",
    "ppocr_cls.ort_qdq_u16",
    "ddddocr.ort_dynamic",
    "ppocr_rec.ort_dynamic",
    "beats_blstm.ort_qdq",
    "tashkeel_int8",
    "voicefilter_embedder_int8",
    "frspell_lemma_int8",
    "frspell_derive_int8",
    "t5_enc_int8",
    "smart_turn_int8",
)


def sqnr(ref: np.ndarray, x: np.ndarray) -> float:
    r, d = np.asarray(ref, np.float64), np.asarray(x, np.float64) - np.asarray(ref, np.float64)
    return float(10 * np.log10((r * r).sum() / max((d * d).sum(), 1e-30)))


def main(argv: list[str] | None = None) -> int:
    import onnx
    import onnxruntime as ort
    import zoodata

    import quanta
    from quanta.quantize.float_view import derive_float_view

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help="comma-separated zoo names (default: every quantized file)")
    ap.add_argument("--calib", type=int, default=8, help="calibration feeds (default 8)")
    ap.add_argument("--eval", type=int, default=3, help="evaluation feeds (default 3)")
    args = ap.parse_args(argv)
    cache = zoodata.cache_dir()
    manifest = {m["name"]: m for m in json.loads((cache / "manifest.json").read_text())["models"]}
    so = ort.SessionOptions()
    so.log_severity_level = 3
    failures = 0
    for name in args.models.split(",") if args.models else QUANTIZED:
        entry = manifest[name]
        src = cache / entry["path"]
        data = entry.get("source") or name
        try:
            calib = zoodata.feeds(data, "calib", args.calib, cache)
            evals = zoodata.feeds(data, "eval", args.eval, cache)
            with tempfile.TemporaryDirectory() as tmp:
                out = str(Path(tmp) / "out.onnx")
                t0 = time.perf_counter()
                summary = quanta.quantize_static(str(src), out, calib, verbose=False, progress=False)
                seconds = time.perf_counter() - t0
                onnx.checker.check_model(out)
                new = ort.InferenceSession(out, so, providers=["CPUExecutionProvider"])
                mine = quanta.InferenceSession(out)
                view = derive_float_view(str(src)).model.SerializeToString()
                ref = ort.InferenceSession(view, so, providers=["CPUExecutionProvider"])
                given = ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
                diff, s_new, s_in = [], [], []
                for feed in evals:
                    a, b = new.run(None, feed)[0], mine.run(None, feed)[0]
                    r, f = ref.run(None, feed)[0], given.run(None, feed)[0]
                    diff.append(float(np.abs(np.asarray(a, np.float64) - b).max()))
                    s_new.append(sqnr(r, a))
                    s_in.append(sqnr(r, f))
            share = summary.integer_share
            print(
                f"{name}: ok {seconds:.0f} s; max|ORT-quanta| {max(diff):.3g}; SQNR vs float view: "
                f"new {np.median(s_new):.1f} dB, input {np.median(s_in):.1f} dB; integer MACs "
                + ("-" if share is None else f"{share * 100:.1f} %"),
                flush=True,
            )
            for note in summary.notes:
                print(f"  note: {note}")
        except Exception as e:  # one model's failure is one line
            failures += 1
            print(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
