"""``quanta demo``: the built-in digits CNN, end to end.

For now (foundation): load the FP32 model shipped in ``quanta/cli/assets``, print its
inspect summary, run the held-out test split through an InferenceSession and report
accuracy and time. The calibration work grows this into FP32-vs-int8.
"""

from __future__ import annotations

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


def run_demo(backend: str = "reference") -> int:
    import quanta
    from quanta.debug.report import summarize

    print(f"quanta demo: digits CNN ({MODEL.name}), backend={backend}\n")
    t0 = time.perf_counter()
    sess = quanta.InferenceSession(MODEL, backend=backend)
    print(summarize(sess.model).format())
    data = load_demo_data()
    x, y = data["test_x"], data["test_y"]
    input_name = sess.get_inputs()[0].name
    t1 = time.perf_counter()
    logits = sess.run(None, {input_name: x})[0]
    t2 = time.perf_counter()
    acc = float(np.mean(np.argmax(logits, axis=1) == y))
    print(f"\nFP32 test accuracy: {acc * 100:.2f} % on {len(y)} held-out digits")
    print(f"inference: {(t2 - t1) * 1e3:.1f} ms for the batch; total {(t2 - t0):.2f} s")
    return 0
