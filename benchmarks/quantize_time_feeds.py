"""Models for ``quantize_time.py --feeds`` that are not in the zoo's manifest.

    python benchmarks/quantize_time.py --feeds benchmarks/quantize_time_feeds.py \\
        --models efficientnet_lite0 --stages --ort

``efficientnet_lite0``: the real-model benchmark's file (``~/.cache/quanta-bench``,
fetched by benchmarks/real_models) with its calibration images, 10 feeds of 10 images
(``accuracy.image_data(100, 1, 10)``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCH = Path.home() / ".cache" / "quanta-bench"


def _efficientnet_calib() -> list[Any]:
    sys.path.insert(0, str(HERE / "real_models"))
    import accuracy

    return accuracy.image_data(100, 1, 10)[0]


MODELS = {
    "efficientnet_lite0": {"path": BENCH / "efficientnet_lite0.onnx", "calib": _efficientnet_calib},
}
