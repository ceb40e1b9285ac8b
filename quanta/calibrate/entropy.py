"""EntropyObserver: the threshold that minimises the KL divergence (TensorRT calibration).

TensorRT's entropy calibrator (Migacz, "8-bit inference with TensorRT", GTC 2017; the
``pytorch-quantization`` ``_compute_amax_entropy``), on the histogram A of |x| (bins
m = 0 .. N-1 of width w, from histogram.py), for each candidate i = L .. N (threshold
T_i = i·w) with L = ``num_quantized_bins`` levels::

    (16) P = A[0:i],  P[i-1] += sum(A[i:])                   reference: outliers clipped to T_i
    (17) chunk c(j) = floor(j·L / i)                           the i bins fall into L levels
         Q[j] = (sum of A[j'] over chunk c(j)) / (non-empty bins in chunk c(j))   if A[j] > 0
         Q[j] = 0                                                                 if A[j] = 0
    (18) KL_i = sum_j p_j log(p_j / q_j),   p = P / sum(P),  q = Q / sum(Q)
    (19) i* = the largest i with minimal KL_i,   T = i*·w,   range = [max(min, -T), min(max, T)]

Exact zeros are removed from A[0] before the search (0 is represented exactly whatever T
is; a ReLU's spike at 0 otherwise drives every KL_i up in proportion to log(i/L) and the
search always picks the smallest threshold).

Smoothing (ORT / MXNet ``smooth_distribution``, eps = 1e-4 counts): an empty bin of p or
q holds eps instead of 0, taken proportionally from the non-empty bins. Where both are
empty the terms cancel; the shift of the non-empty bins (<= eps·i counts, against counts
>= 1) is neglected. What smoothing changes is a last bin that holds only clipped outliers
(A[i-1] = 0 < R): q = eps there, so thresholds inside an empty gap below far outliers
stay candidates (``eps=0``, as ``pytorch-quantization``, gives KL = inf and never clips
into a gap). quanta evaluates all candidates at once from prefix sums (O(N·L), no Python
loop), tested against the loop form of (16)-(18).

``num_quantized_bins=None`` picks L = 128 (the magnitudes of int8: 0..127) for data of
both signs and L = 256 for one-sided data (min >= 0 or max <= 0; uint8 spends all 256
levels on [0, T]) — ``pytorch-quantization``'s ``unsigned`` switch, decided from the data.

Differences from ORT's ``EntropyCalibrater``: ORT histograms the signed values over a
symmetric window and, with its defaults (``num_bins=128``, ``num_quantized_bins=128``),
has exactly one candidate unless later samples grew the histogram past the first one's
range, so its "entropy" range is then the symmetric min/max clipped to the extrema; it also keeps every sample in memory until the end. quanta follows TensorRT on
|x| on a grid of ``bins`` = 4096 signed bins (at least 1024 of them on |x|, as many as
TensorRT's 2048-bin |x| histogram uses at worst), in constant memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.calibrate.histogram import DEFAULT_BINS, HistogramObserver, HistogramView

__all__ = ["EntropyObserver", "kl_divergences"]


def _xlogx(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    return np.where(v > 0, v * np.log(np.where(v > 0, v, 1.0)), 0.0)


SMOOTHING_EPS = 1e-4


def kl_divergences(a: np.ndarray, levels: int, eps: float = SMOOTHING_EPS) -> np.ndarray:
    """KL_i of eq. (18) for every candidate i = levels .. len(a) (index i - levels).

    Vectorised with prefix sums: for a candidate i with chunks S_c (sum of A) and n_c
    (non-empty bins), R = sum(A[i:]), P = sum(A), Q = sum(A[:i]), writing
    a_l = A[i-1] (last bin)::

        sum p log p  = sum_{j < i-1} A_j log A_j + (a_l + R) log(a_l + R)
        sum p log q  = sum_c S_c log(S_c / n_c) + R log(q_{i-1}),  q_{i-1} = S_last / n_last (eps if a_l = 0)
        KL_i = (sum p log p - sum p log q) / P + log(Q / P)
    """
    a = np.asarray(a, dtype=np.float64)
    n = a.size
    if n < levels:
        return np.zeros(0)
    cand = np.arange(levels, n + 1, dtype=np.int64)  # i
    cs = np.concatenate([[0.0], np.cumsum(a)])
    cn = np.concatenate([[0], np.cumsum(a > 0)])
    cg = np.concatenate([[0.0], np.cumsum(_xlogx(a))])
    c = np.arange(levels + 1, dtype=np.int64)
    bounds = (c[None, :] * cand[:, None] + levels - 1) // levels  # ceil(c·i/L): first bin of chunk c
    s = cs[bounds[:, 1:]] - cs[bounds[:, :-1]]  # S_c
    nnz = cn[bounds[:, 1:]] - cn[bounds[:, :-1]]  # n_c
    total = cs[-1]
    rest = total - cs[cand]  # R
    last = a[cand - 1]
    p_log_p = cg[cand - 1] + _xlogx(last + rest)
    q_chunks = np.where(s > 0, s * np.log(np.where(s > 0, s, 1.0) / np.maximum(nnz, 1)), 0.0).sum(axis=1)
    q_last = np.where(last > 0, s[:, -1] / np.maximum(nnz[:, -1], 1), eps)
    kept = cs[cand]  # Q; 0 when every value is beyond the threshold: not a candidate
    with np.errstate(divide="ignore", invalid="ignore"):
        q_rest = np.where(rest > 0, rest * np.log(q_last), 0.0)  # eps = 0: -inf, so KL = inf
        kl = (p_log_p - (q_chunks + q_rest)) / total + np.log(kept / total)
    return np.where((kept > 0) & ~np.isnan(kl), kl, np.inf)


class EntropyObserver(HistogramObserver):
    """Range from the KL-optimal threshold (eqs. (16)-(19)).

    >>> import numpy as np
    >>> x = np.random.default_rng(0).standard_normal(100_000).astype(np.float32)
    >>> obs = EntropyObserver()
    >>> obs.observe(np.concatenate([x, [40.0, -35.0]]).astype(np.float32))  # two far outliers
    >>> cal = obs.range()
    >>> 2.0 < cal.max < 10.0 and -10.0 < cal.min < -2.0       # clipped well inside [-35, 40]
    True
    """

    kind = "entropy"

    def __init__(
        self, *, num_quantized_bins: int | None = None, bins: int = DEFAULT_BINS, axis: int | None = None
    ) -> None:
        if num_quantized_bins is not None and not 2 <= num_quantized_bins <= bins:
            raise ValueError(
                f"EntropyObserver: num_quantized_bins must be in [2, bins={bins}], got {num_quantized_bins}"
            )
        super().__init__(bins=bins, axis=axis)
        self.num_quantized_bins = num_quantized_bins

    def config(self) -> dict[str, Any]:
        return {**super().config(), "num_quantized_bins": self.num_quantized_bins}

    def levels(self, view: HistogramView) -> int:
        """L of eq. (17) for this channel."""
        if self.num_quantized_bins is not None:
            return self.num_quantized_bins
        return 256 if view.lo >= 0.0 or view.hi <= 0.0 else 128

    def _estimate_channel(self, view: HistogramView) -> tuple[float, float]:
        a = view.abs_counts().astype(np.float64)
        # Exact zeros (ReLU / ReLU6 outputs, masked softmax) quantize exactly to the zero
        # point whatever the threshold, so they take no part in the KL search: left in
        # bin 0, eq. (17) spreads that spike over a whole chunk and the minimum is always
        # the smallest candidate (EfficientNet-Lite0's ReLU6 outputs clipped to 0.5,
        # docs/accuracy.md). TensorRT's histograms have the same spike; it is removed here.
        a[0] = max(a[0] - view.zeros, 0.0)
        if not a.any():
            return view.lo, view.hi
        levels = self.levels(view)
        kl = kl_divergences(a, levels)
        if kl.size == 0 or not np.isfinite(kl).any():
            return view.lo, view.hi  # fewer bins than levels: nothing to clip
        best = int(np.flatnonzero(kl == kl.min())[-1])  # (19): largest i among the minima
        t = (best + levels) * view.width
        return max(view.lo, -t), min(view.hi, t)
