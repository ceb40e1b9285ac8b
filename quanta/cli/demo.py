"""``quanta demo``: quantize the built-in digits CNN and compare it with FP32.

The model (``assets/digits_cnn.onnx``) is a small residual CNN with depthwise
convolutions trained on scikit-learn's digits (``tools/train_digits_cnn.py``); the data
file holds a calibration split and a held-out test split that neither training nor
calibration saw. The demo calibrates on the calibration split, writes the int8 QDQ model
to a temporary folder, and reports FP32 vs int8 accuracy, top-1 agreement, logit SQNR,
model sizes and the time taken.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

__all__ = ["ASSETS", "load_demo_data", "run_demo"]

ASSETS = Path(__file__).parent / "assets"
MODEL = ASSETS / "digits_cnn.onnx"
DATA = ASSETS / "digits_data.npz"


def load_demo_data() -> dict[str, np.ndarray]:
    with np.load(DATA, allow_pickle=False) as d:
        return {k: d[k] for k in d.files}


def sqnr_db(reference: np.ndarray, test: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio, 10·log10(Σref² / Σ(ref - test)²)."""
    noise = float(np.sum((reference.astype(np.float64) - test) ** 2))
    signal = float(np.sum(reference.astype(np.float64) ** 2))
    return float("inf") if noise == 0.0 else 10.0 * np.log10(signal / noise)


def run_demo(backend: str = "native", output_dir: str | None = None) -> int:
    import quanta
    from quanta.debug.report import summarize

    t0 = time.perf_counter()
    data = load_demo_data()
    x, y = data["test_x"], data["test_y"]
    calib = [{"input": data["calib_x"][i : i + 25]} for i in range(0, len(data["calib_x"]), 25)]
    print(f"quanta demo: digits CNN, {len(data['calib_x'])} calibration / {len(y)} held-out test images\n")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(output_dir or tmp) / "digits_cnn.int8.onnx"
        quanta.quantize_static(MODEL, out, calib, progress=False)
        print()
        fp32 = quanta.InferenceSession(MODEL, backend=backend)
        int8 = quanta.InferenceSession(out, backend=backend)
        print(summarize(int8.model).format(max_tensors=8))
        t1 = time.perf_counter()
        ref = fp32.run(None, {"input": x})[0]
        t2 = time.perf_counter()
        q = int8.run(None, {"input": x})[0]
        t3 = time.perf_counter()
        acc32 = float(np.mean(np.argmax(ref, 1) == y))
        acc8 = float(np.mean(np.argmax(q, 1) == y))
        agree = float(np.mean(np.argmax(ref, 1) == np.argmax(q, 1)))
        size32, size8 = MODEL.stat().st_size, out.stat().st_size
        print()
        print(f"{'':12}{'accuracy':>10}{'size':>12}{'time':>12}")
        print(f"{'FP32':12}{acc32 * 100:>9.2f}%{size32 / 1024:>9.1f} KB{(t2 - t1) * 1e3:>9.1f} ms")
        print(f"{'int8 (QDQ)':12}{acc8 * 100:>9.2f}%{size8 / 1024:>9.1f} KB{(t3 - t2) * 1e3:>9.1f} ms")
        print(f"top-1 agreement with FP32: {agree * 100:.2f} %, logit SQNR {sqnr_db(ref, q):.1f} dB")
        print(
            f"backend {backend} (FP32 and int8 both on quanta's kernels; next to ONNX Runtime: "
            f"quanta bench --vs-ort); total {time.perf_counter() - t0:.1f} s"
        )
    return 0
