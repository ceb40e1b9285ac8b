"""PercentileObserver: clip the tails of the distribution at a percentile.

From the streaming histogram (histogram.py), with n values, percentile p and the
cumulative count C(x) read off the histogram, linear within a bin (values assumed
uniform inside their bin)::

    (14) asymmetric:  lo = C^-1(n · (100 - p) / 200),   hi = C^-1(n · (100 + p) / 200)
    (15) symmetric:   T = C_|x|^-1(n · p / 100),        [lo, hi] = [-T, T]

then clipped to the exact extrema, so ``p = 100`` gives MinMax. These are ORT's
``PercentileCalibrater`` rules ((100 - p)/2 percent cut from each tail; symmetric: the
p-th percentile of |x|), except that ORT reads the bin *edge* below the quantile where
quanta interpolates inside the bin, and that ORT keeps every sample in memory until the
end of the pass (quanta's state is B counts per channel, B = ``bins``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.calibrate.histogram import DEFAULT_BINS, HistogramObserver, HistogramView

__all__ = ["PercentileObserver", "quantile"]


def quantile(counts: np.ndarray, edges: np.ndarray, mass: float) -> float:
    """The value x with ``mass`` counts below it, counts uniform within each bin.

    >>> quantile(np.array([2.0, 0.0, 2.0]), np.array([0.0, 1.0, 2.0, 3.0]), 3.0)
    2.5
    """
    cum = np.cumsum(counts)
    total = float(cum[-1])
    mass = min(max(mass, 0.0), total)
    j = int(np.searchsorted(cum, mass, side="left"))
    j = min(j, counts.size - 1)  # counts[j] > 0: the first bin whose cumulative count reaches mass
    below = float(cum[j] - counts[j])
    frac = (mass - below) / counts[j] if counts[j] else 0.0
    return float(edges[j] + min(max(frac, 0.0), 1.0) * (edges[j + 1] - edges[j]))


class PercentileObserver(HistogramObserver):
    """Range from the ``percentile`` (eqs. (14), (15)); default 99.999 as ORT.

    >>> import numpy as np
    >>> obs = PercentileObserver(percentile=99.0, bins=256)
    >>> obs.observe(np.concatenate([np.linspace(-1, 1, 999), [100.0]]).astype(np.float32))
    >>> lo, hi = obs.range().min, obs.range().max
    >>> -1.0 <= lo < -0.95 and 0.95 < hi < 1.5     # the outlier at 100 is clipped
    True
    """

    kind = "percentile"

    def __init__(
        self,
        *,
        percentile: float = 99.999,
        symmetric: bool = False,
        bins: int = DEFAULT_BINS,
        axis: int | None = None,
    ) -> None:
        if not 0.0 < percentile <= 100.0:
            raise ValueError(f"PercentileObserver: percentile must be in (0, 100], got {percentile}")
        super().__init__(bins=bins, axis=axis)
        self.percentile = float(percentile)
        self.symmetric = bool(symmetric)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "percentile": self.percentile, "symmetric": self.symmetric}

    def _estimate_channel(self, view: HistogramView) -> tuple[float, float]:
        n = view.total
        if self.symmetric:
            a = view.abs_counts()
            edges = np.arange(a.size + 1, dtype=np.float64) * view.width
            t = quantile(a, edges, n * self.percentile / 100.0)  # (15)
            return -t, t
        edges = view.edges()
        cut = n * (100.0 - self.percentile) / 200.0  # (14)
        return quantile(view.counts, edges, cut), quantile(view.counts, edges, n - cut)
