"""GPTQ's statistics from the calibration pass's own values, when they fit in memory.

GPTQ's statistics (docs/debugger.md eq. (12d)) are taken over each rounded layer's input
quantized with its final activation parameters, which only the whole calibration pass
fixes: so they need a second pass over the data. That second pass computed the float
model again, feed by feed, to hand the same float values to the layers' observers: on
rivagan_dec a tenth of the quantization's CPU time (two 11x11 convolutions over 32
channels at 267x280, 6 frames).

:class:`InputReplay` keeps, during the calibration pass, a copy of every value a rounded
layer reads, per feed, as long as all of them together stay within :data:`REPLAY_BYTES`;
the statistics pass then hands the kept values to the layers in the order the second
pass would (feed by feed), instead of running the model. The float values are the
executor's bytes either way (the native float kernels are deterministic), each layer
observes the same arrays in the same order, and its sums are exact integers, so the
statistics, and the file, are the same (``tests/quantize/test_replay.py``). Past the
budget the copies are dropped at once and the second pass runs as before: calibration
memory stays bounded whatever the number of samples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["REPLAY_BYTES", "InputReplay"]

#: bytes of layer inputs kept for the statistics pass at most (the bound the quantizer's
#: other caches keep: quanta.quantize.file_outputs.MAX_BYTES, rounding.PENDING_TOTAL_BYTES)
REPLAY_BYTES = 256 << 20


class InputReplay:
    """The values named ``names`` of every calibration feed, kept while they fit."""

    def __init__(self, names: Sequence[str], budget: int | None = None) -> None:
        self.names = list(dict.fromkeys(names))
        self.budget = REPLAY_BYTES if budget is None else budget
        self.values: dict[str, list[np.ndarray]] = {name: [] for name in self.names}
        self.nbytes = 0
        self.complete = True  # False once a value did not fit

    def taps(self) -> dict[str, list[Callable[[np.ndarray], None]]]:
        """Consumers for ``calibrate(taps=...)``: one per name, called with each value."""
        return {name: [self._tap(name)] for name in self.names}

    def _tap(self, name: str) -> Callable[[np.ndarray], None]:
        def keep(arr: np.ndarray) -> None:
            if not self.complete:
                return
            if self.nbytes + arr.nbytes > self.budget:
                self.complete = False
                self.values = {}
                self.nbytes = 0
                return
            # a copy: the value may live in the run's arena, which later steps reuse
            self.values[name].append(np.array(arr, copy=True))
            self.nbytes += arr.nbytes

        return keep

    def replay(self, layers: Sequence[Any], samples: int) -> bool:
        """Feed ``layers`` (objects with ``x_name`` and ``observe``) the kept values, feed by
        feed, as the statistics pass's taps would; False, having fed nothing, unless every
        layer's input was kept exactly once per feed for ``samples`` feeds (a value inside
        a Loop body comes many times a feed: the pass runs)."""
        if (
            samples < 1
            or not self.complete
            or any(len(self.values.get(layer.x_name, ())) != samples for layer in layers)
        ):
            self.values = {}  # the pass runs: the copies would only hold memory until it ends
            return False
        for i in range(samples):
            for layer in layers:
                layer.observe(self.values[layer.x_name][i])
        self.values = {}  # the copies are read once
        return True
