"""MSEObserver: the clipping range that minimises the expected squared quantization error.

The error model, for a candidate range [a, b] (a <= 0 <= b) quantized to a uniform grid
of S = ``qmax - qmin`` steps, with the values of each histogram bin uniform inside it
(bins from histogram.py, the first and last cut to the exact extrema)::

    (20) s = (b - a) / S                      asymmetric
         s = 2T / S,  [a, b] = [-T, T]        symmetric
    (21) E(a, b) = sum_bins n_j · E[(a - x)^2 ; x < a]          values clipped at a
                 + sum_bins n_j · E[(x - b)^2 ; x > b]          values clipped at b
                 + (n_inside - zeros) · s^2 / 12                 rounding noise inside [a, b]

Exact zeros never err (0 is a grid point once the range includes 0, eq. (1)), which
matters for ReLU outputs. E is computed for any (a, b) in O(log B) from prefix sums of
n_j, n_j·E[x] and n_j·E[x^2] per bin (a bin cut by a or b is integrated exactly), so
the search is cheap:

- symmetric: every bin edge of |x| is a candidate T;
- asymmetric: a 2-D grid of up to 128 x 128 (a, b) candidates from the bin edges, then
  coordinate descent over *all* bin edges (a given b, b given a) until it stops moving.

The model is of the grid only: it ignores the rounding of the zero point (which shifts
the grid by less than s/2) and, for unsigned symmetric storage, the half step by which
[-128·s, 127·s] differs from [-T, T]. ``qmin``/``qmax`` should come from
``quanta.quantize.params.quant_range(storage, symmetric=..., reduce_range=...)`` — the
observer takes the numbers, not the storage type, because calibrate sits below quantize.

PyTorch's ``HistogramObserver`` minimises a similar L2 error by a greedy search over
(interpolated) bins; ORT has no MSE calibrator.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from quanta.calibrate.histogram import DEFAULT_BINS, HistogramObserver, HistogramView

__all__ = ["MSEObserver", "QuantizationErrorModel"]

_GRID = 128  # candidates per coordinate in the 2-D stage
_MAX_ROUNDS = 8  # coordinate-descent rounds (it converges in 2-3 in practice)


class QuantizationErrorModel:
    """Eq. (21) for one channel's histogram; ``error(a, b, s)`` is vectorised."""

    def __init__(self, view: HistogramView) -> None:
        edges = view.edges()
        lo_e = np.maximum(edges[:-1], view.lo)  # cut the outer bins to the exact extrema
        hi_e = np.minimum(edges[1:], view.hi)
        n = view.counts
        keep = n > 0
        self.l, self.r, self.n = lo_e[keep], hi_e[keep], n[keep]
        width = self.r - self.l
        mean = (self.l + self.r) / 2.0
        meansq = (self.l**2 + self.l * self.r + self.r**2) / 3.0  # E[x^2] of a uniform bin (l^2 if l = r)
        self.width = width
        self.c0 = np.concatenate([[0.0], np.cumsum(self.n)])
        self.c1 = np.concatenate([[0.0], np.cumsum(self.n * mean)])
        self.c2 = np.concatenate([[0.0], np.cumsum(self.n * meansq)])
        self.total = float(self.c0[-1])
        self.zeros = float(view.zeros)
        self.lo, self.hi = view.lo, view.hi

    def _part(self, j: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        jj = np.clip(j, 0, self.n.size - 1)
        return self.l[jj], self.r[jj], self.n[jj], self.width[jj]

    def error(self, a: npt.ArrayLike, b: npt.ArrayLike, s: npt.ArrayLike) -> np.ndarray:
        a, b, s = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (a, b, s)))
        m = self.n.size
        # values above b: bins entirely at or above b, plus the bin that b cuts
        jb = np.searchsorted(self.l, b, side="left")
        full_hi = (
            (self.c2[m] - self.c2[jb])
            - 2 * b * (self.c1[m] - self.c1[jb])
            + b * b * (self.c0[m] - self.c0[jb])
        )
        count_hi = self.c0[m] - self.c0[jb]
        pl, pr, pn, pw = self._part(jb - 1)
        cut = (jb > 0) & (pr > b) & (pw > 0)
        safe_w = np.where(cut, pw, 1.0)
        full_hi = full_hi + np.where(cut, pn * (pr - b) ** 3 / (3 * safe_w), 0.0)
        count_hi = count_hi + np.where(cut, pn * (pr - b) / safe_w, 0.0)
        # values below a: bins entirely at or below a, plus the bin that a cuts
        ja = np.searchsorted(self.r, a, side="right")
        full_lo = self.c2[ja] - 2 * a * self.c1[ja] + a * a * self.c0[ja]
        count_lo = self.c0[ja].copy()
        pl, pr, pn, pw = self._part(ja)
        cut = (ja < m) & (pl < a) & (pw > 0)
        safe_w = np.where(cut, pw, 1.0)
        full_lo = full_lo + np.where(cut, pn * (a - pl) ** 3 / (3 * safe_w), 0.0)
        count_lo = count_lo + np.where(cut, pn * (a - pl) / safe_w, 0.0)
        inside = np.maximum(self.total - count_hi - count_lo - self.zeros, 0.0)
        return np.maximum(full_hi, 0.0) + np.maximum(full_lo, 0.0) + inside * s * s / 12.0


def channel_errors(
    counts: np.ndarray,
    k: np.ndarray,
    start: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    zeros: np.ndarray,
    a: float,
    b: float,
    s: float,
) -> np.ndarray:
    """Eq. (21) at one (a, b, s) for every row of ``counts`` (R, B) at once: row r is the
    histogram of a channel on grid (``k[r]``, ``start[r]``) with finite extrema ``lo[r]``,
    ``hi[r]`` and ``zeros[r]`` exact zeros, and row r of the result is, bit for bit,
    ``QuantizationErrorModel(view).error(a, b, s)`` of that channel's view (eq. (29)'s
    per-tensor side reads every channel of a tensor).

    The same arithmetic as the model's, row by row: each row's occupied bins, in order,
    are packed to the left of an (R, W) array (W: the most any row has; a narrow channel
    on a tensor's shared grid holds few of its bins), padded with empty bins whose edges
    are +inf. The running sums (``cumsum`` adds in order) are read at the row's own
    number of bins m, the pads come after them; "bins with l < b" and "bins with r <= a"
    count no pad, so they are the model's ``searchsorted`` positions."""
    counts = np.asarray(counts)
    rows = counts.shape[0]
    row, col = np.nonzero(counts)  # by row, then by column: each row's bins in order
    m = np.bincount(row, minlength=rows)
    width_max = max(int(m.max(initial=0)), 1)
    first = np.concatenate([[0], np.cumsum(m)[:-1]])
    pos = np.arange(row.size) - first[row]
    g = (start.astype(np.int64)[row] + col).astype(np.float64)
    kk = k.astype(np.int64)[row]
    # the outer bins cut to the exact extrema, as the model's
    lo_e = np.maximum(np.ldexp(g, kk), lo[row])
    hi_e = np.minimum(np.ldexp(g + 1.0, kk), hi[row])
    n_e = counts[row, col].astype(np.float64)
    mean = (lo_e + hi_e) / 2.0
    meansq = (lo_e**2 + lo_e * hi_e + hi_e**2) / 3.0

    def packed(values: np.ndarray, pad: float) -> np.ndarray:
        out = np.full((rows, width_max), pad)
        out[row, pos] = values
        return out

    left, right, n, width = (
        packed(lo_e, np.inf),
        packed(hi_e, np.inf),
        packed(n_e, 0.0),
        packed(hi_e - lo_e, 0.0),
    )
    zero = np.zeros((rows, 1))
    c0 = np.concatenate([zero, np.cumsum(n, axis=1)], axis=1)
    c1 = np.concatenate([zero, np.cumsum(packed(n_e * mean, 0.0), axis=1)], axis=1)
    c2 = np.concatenate([zero, np.cumsum(packed(n_e * meansq, 0.0), axis=1)], axis=1)
    idx = np.arange(rows)
    last = np.maximum(m - 1, 0)
    a, b, s = (np.float64(v) for v in (a, b, s))
    # values above b: bins entirely at or above b, plus the bin that b cuts
    jb = np.count_nonzero(left < b, axis=1)
    full_hi = (
        (c2[idx, m] - c2[idx, jb]) - 2 * b * (c1[idx, m] - c1[idx, jb]) + b * b * (c0[idx, m] - c0[idx, jb])
    )
    count_hi = c0[idx, m] - c0[idx, jb]
    p = np.clip(jb - 1, 0, last)
    pr, pn, pw = right[idx, p], n[idx, p], width[idx, p]
    cut = (jb > 0) & (pr > b) & (pw > 0)
    safe_w = np.where(cut, pw, 1.0)
    full_hi = full_hi + np.where(cut, pn * (pr - b) ** 3 / (3 * safe_w), 0.0)
    count_hi = count_hi + np.where(cut, pn * (pr - b) / safe_w, 0.0)
    # values below a: bins entirely at or below a, plus the bin that a cuts
    ja = np.count_nonzero(right <= a, axis=1)
    full_lo = c2[idx, ja] - 2 * a * c1[idx, ja] + a * a * c0[idx, ja]
    count_lo = c0[idx, ja].copy()
    p = np.clip(ja, 0, last)
    pl, pn, pw = left[idx, p], n[idx, p], width[idx, p]
    cut = (ja < m) & (pl < a) & (pw > 0)
    safe_w = np.where(cut, pw, 1.0)
    full_lo = full_lo + np.where(cut, pn * (a - pl) ** 3 / (3 * safe_w), 0.0)
    count_lo = count_lo + np.where(cut, pn * (a - pl) / safe_w, 0.0)
    inside = np.maximum(c0[idx, m] - count_hi - count_lo - zeros.astype(np.float64), 0.0)
    return np.maximum(full_hi, 0.0) + np.maximum(full_lo, 0.0) + inside * s * s / 12.0


def _spread(values: np.ndarray, k: int) -> np.ndarray:
    """At most k of the sorted ``values``, evenly spaced by index, first and last kept."""
    if values.size <= k:
        return values
    return values[np.unique(np.linspace(0, values.size - 1, k).round().astype(np.int64))]


class MSEObserver(HistogramObserver):
    """Range minimising the modelled quantization MSE (eqs. (20), (21)).

    4-bit symmetric on Laplace(1) data: the MSE-optimal clip is about 5.03 (Banner et
    al., ACIQ, 2019), well inside the largest value (~11)::

    >>> import numpy as np
    >>> x = np.random.default_rng(0).laplace(size=200_000).astype(np.float32)
    >>> obs = MSEObserver(qmin=-7, qmax=7, symmetric=True)
    >>> obs.observe(x)
    >>> cal = obs.range()
    >>> 4.5 < cal.max < 5.5, float(np.abs(x).max()) > 10
    (True, True)
    """

    kind = "mse"

    def __init__(
        self,
        *,
        qmin: int = 0,
        qmax: int = 255,
        symmetric: bool = False,
        bins: int = DEFAULT_BINS,
        axis: int | None = None,
    ) -> None:
        if not qmin < qmax:
            raise ValueError(f"MSEObserver: need qmin < qmax, got [{qmin}, {qmax}]")
        super().__init__(bins=bins, axis=axis)
        self.qmin, self.qmax = int(qmin), int(qmax)
        self.symmetric = bool(symmetric)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "qmin": self.qmin, "qmax": self.qmax, "symmetric": self.symmetric}

    def _estimate_channel(self, view: HistogramView) -> tuple[float, float]:
        model = QuantizationErrorModel(view)
        steps = float(self.qmax - self.qmin)
        lo, hi = min(view.lo, 0.0), max(view.hi, 0.0)
        if self.symmetric:
            tmax = max(-lo, hi)
            t = np.ldexp(np.arange(1, view.abs_counts().size + 1, dtype=np.float64), view.k)
            t = np.unique(np.append(t[t < tmax], tmax))
            err = model.error(-t, t, 2.0 * t / steps)
            best = float(t[np.flatnonzero(err == err.min())[-1]])  # ties: the wider range
            return -best, best
        edges = view.edges()
        a_cand = np.unique(np.append(edges[(edges > lo) & (edges < 0.0)], [lo, 0.0] if lo < 0 else [0.0]))
        b_cand = np.unique(np.append(edges[(edges > 0.0) & (edges < hi)], [0.0, hi] if hi > 0 else [0.0]))
        if lo < 0.0:
            a_cand = a_cand[a_cand < 0.0]  # a = 0 only when the data has no negative values
        if hi > 0.0:
            b_cand = b_cand[b_cand > 0.0]

        def err(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            return model.error(a, b, (b - a) / steps)

        ga, gb = np.meshgrid(_spread(a_cand, _GRID), _spread(b_cand, _GRID), indexing="ij")
        e = err(ga, gb)
        i = int(np.argmin(e))
        a, b = float(ga.flat[i]), float(gb.flat[i])
        for _ in range(_MAX_ROUNDS):
            eb = err(np.full(b_cand.shape, a), b_cand)
            b_new = float(b_cand[np.flatnonzero(eb == eb.min())[-1]])
            ea = err(a_cand, np.full(a_cand.shape, b_new))
            a_new = float(a_cand[np.flatnonzero(ea == ea.min())[0]])
            if (a_new, b_new) == (a, b):
                break
            a, b = a_new, b_new
        return a, b
