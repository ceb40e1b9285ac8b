"""Hazard: the spike of exact zeros in ReLU / ReLU6 / masked-softmax outputs.

Failure signature (docs/accuracy.md, EfficientNet-Lite0 with method=entropy: 0 % top-1
agreement): bin 0 of the |x| histogram holds every exact zero; the KL search then prefers
the smallest threshold, clipping a [0, 6] ReLU6 output to [0, 0.5].
"""

from __future__ import annotations

import numpy as np
import pytest

from quanta.calibrate.entropy import EntropyObserver


@pytest.mark.parametrize("zero_fraction", [0.4, 0.7, 0.9])
def test_entropy_keeps_the_range_of_relu6_outputs_with_many_zeros(zero_fraction):
    rng = np.random.default_rng(1)
    obs = EntropyObserver()
    for _ in range(5):
        x = rng.uniform(0.0, 6.0, 20000).astype(np.float32)
        x[rng.random(x.size) < zero_fraction] = 0.0
        obs.observe(x)
    lo, hi = obs.range().min, obs.range().max
    assert lo == 0.0 and hi > 5.0  # uniform data on [0, 6]: nothing worth clipping
