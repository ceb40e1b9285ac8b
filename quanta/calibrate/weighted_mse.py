"""WeightedMSEObserver: the per-tensor range that minimises the error the *consumer* sees.

An activation read by a Conv / Gemm / MatMul with constant weights W reaches the rest
of the network only through ``y = W x``. Its rounding and clipping error Δx becomes
``W Δx`` there, and with the errors of different input channels uncorrelated::

    (22) E‖W Δx‖² ≈ Σ_c g_c · E_c(a, b),   g_c = Σ_o Σ_k W[o, c, k]²
                                            (o: output channels that read c, k: kernel taps)

with E_c the squared error of channel c for the range [a, b] (eq. (21)). The observer
keeps one streaming histogram per channel (histogram.py), sums them on the tensor's own
grid with the weights g_c (re-gridding only sums bins: exact) and minimises eq. (21) on
that weighted histogram with the MSE search (mse.py). The result is one per-tensor range
(activations have one scale), inside [min, max].

Why it matters: in a MobileNet-style block a 1x1 convolution's output often has one
channel 30x wider than the median one, and the depthwise convolution after it (BN folded
in) multiplies the narrow channels by weights up to ~75. MinMax spends the 256 levels on
the wide channel; the narrow ones get 1-2 levels each, and the depthwise layer amplifies
that noise. Plain MSE weighs every channel alike and keeps the wide range; eq. (22) sees
that the wide channel's downstream weights are small and clips it
(docs/accuracy.md, layout_cdla). The clipped range is kept only when eq. (22) rates it
at least twice as good as MinMax (eq. (23), ``MIN_GAIN``): the model is approximate.

A tensor that only depthwise convolutions read (``per_channel=True``) may instead take one
grid per channel (axis 1): each depthwise output channel reads one input channel, so its
requantization multiplier absorbs that channel's scale and the integer kernels run as
before (passes/lower/per_channel_activation.py). The channels share one zero point (the
lowering needs it) and each covers its own [min, max]::

    (29) s_c(z) = max(-lo_c / (z - qmin), hi_c / (qmax - z))        lo_c <= 0 <= hi_c
         z = argmin_z  Σ_c g_c · n_c · s_c(z)^2                       (z = qmin when no lo_c < 0)
         E_pc = Σ_c g_c · (n_c - zeros_c) · s_c^2 / 12                 (no clipping: rounding only)

and replaces the per-tensor range [a, b] only where eq. (22) rates it at least twice as
good, ``E_pc < MIN_GAIN · Σ_c g_c · E_c(a, b)`` (eq. (23)'s bar). Without clipping the
per-channel side of the model is exact; the per-tensor side underrates clipping, so the
test leans to the per-tensor grid. Channels that are all zeros take the per-tensor range.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from quanta.calibrate.histogram import HistogramView, _window_start, grid_exponent, regrid
from quanta.calibrate.mse import MSEObserver, QuantizationErrorModel, channel_errors
from quanta.ir.types import CalibratedType

__all__ = ["MIN_GAIN", "WEIGHTED_BINS", "WeightedMSEObserver", "consumer_weights"]

# Eq. (23): the weighted range replaces MinMax only when its modelled error is below this
# share of MinMax's (a 3 dB gain at least).
MIN_GAIN = 0.5

# Per channel: the weighted histogram is re-gridded to the tensor's range, so B bins per
# channel still resolve the clipping point to (max - min) / B. 8 KiB per channel.
WEIGHTED_BINS = 1024


class WeightedMSEObserver(MSEObserver):
    """Per-tensor range minimising eq. (22). ``axis``: the channel axis of the samples,
    ``weights``: g_c >= 0 per channel along it (any scale; only the ratios matter).

    Two channels, the wide one unimportant downstream: the range follows the narrow one.

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> x = np.stack([rng.uniform(0, 1, 10_000), rng.uniform(0, 100, 10_000)])[None]  # [1, 2, N]
    >>> obs = WeightedMSEObserver(axis=1, weights=[1.0, 1e-9])
    >>> obs.observe(x.astype(np.float32))
    >>> 0.9 < obs.range().max < 5.0
    True
    """

    kind = "weighted_mse"

    def __init__(
        self,
        *,
        axis: int,
        weights: Sequence[float],
        qmin: int = 0,
        qmax: int = 255,
        symmetric: bool = False,
        bins: int = WEIGHTED_BINS,
        per_channel: bool = False,
    ) -> None:
        w = np.asarray(weights, dtype=np.float64).reshape(-1)
        if w.size == 0 or not np.isfinite(w).all() or (w < 0).any():
            raise ValueError("WeightedMSEObserver: weights must be finite, >= 0 and one per channel")
        if axis is None:
            raise ValueError("WeightedMSEObserver: needs the channel axis the weights refer to")
        super().__init__(qmin=qmin, qmax=qmax, symmetric=symmetric, bins=bins, axis=axis)
        total = float(w.sum())
        self.weights = w / total if total > 0 else np.ones_like(w) / w.size
        self.per_channel = bool(per_channel)

    def config(self) -> dict[str, Any]:
        cfg = {**super().config(), "weights": self.weights.tolist()}
        if self.per_channel:  # absent otherwise: per-tensor tables read as before
            cfg["per_channel"] = True
        return cfg

    def observe(self, x: np.ndarray) -> None:
        a = np.asarray(x)
        ax = self.axis % a.ndim if a.ndim and -a.ndim <= self.axis < a.ndim else None
        if ax is not None and a.shape[ax] != self.weights.size:
            raise ValueError(
                f"WeightedMSEObserver: sample has {a.shape[ax]} channels along axis {self.axis}, "
                f"the weights {self.weights.size}"
            )
        super().observe(a)

    def _grid(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every channel on the tensor's grid: eqs. (12)-(13) for the finite extrema of
        the whole tensor so far. The range is per tensor and :meth:`weighted_view` sums
        the channels on the tensor's final grid, which is this grid or a coarser one, so
        a channel's own finer grid resolves nothing that is read; on a shared grid a
        re-grid moves all rows alike (whole-array sums, histogram.py) and a narrow
        channel occupies few bins (its transport form is small)."""
        t_lo, t_hi = np.array([lo.min(initial=np.inf)]), np.array([hi.max(initial=-np.inf)])
        k = grid_exponent(t_lo, t_hi, self.bins)
        start = _window_start(t_lo, t_hi, k)
        c = lo.size
        return np.repeat(k, c), np.repeat(start, c)

    def weighted_view(self) -> HistogramView:
        """All channels on the tensor's grid (eqs. (12)-(13) for the tensor's extrema),
        each count multiplied by its channel's weight."""
        assert self._min is not None and self._max is not None
        has = self._count > 0
        lo, hi = float(self._min[has].min()), float(self._max[has].max())
        k = grid_exponent(np.array([lo]), np.array([hi]), self.bins)
        start = _window_start(np.array([lo]), np.array([hi]), k)
        c = self._counts.shape[0]
        k_c, start_c = np.repeat(k, c), np.repeat(start, c)
        # the channels already on the tensor's grid (the common case: the grid follows the
        # tensor's extrema) are read as they are; regrid would copy them first
        same = np.array_equal(k_c, self._k) and np.array_equal(start_c, self._start)
        common = self._counts if same else regrid(self._counts, self._k, self._start, k_c, start_c)
        counts = self.weights @ common.astype(np.float64)
        zeros = float(self.weights @ self._zeros.astype(np.float64))
        nz = np.flatnonzero(counts)
        first, last = (int(nz[0]), int(nz[-1])) if nz.size else (0, -1)
        return HistogramView(
            counts=counts[first : last + 1], g0=int(start[0]) + first, k=int(k[0]), lo=lo, hi=hi, zeros=zeros
        )

    def extrema(self) -> CalibratedType:
        """The exact [min, max] of the whole tensor (the range is per tensor, so is what
        decides whether it is degenerate); [0, 0] when nothing was seen."""
        if self._min is None or not (self._count > 0).any():
            return CalibratedType(self.expressed, 0.0, 0.0)
        has = self._count > 0
        return CalibratedType(self.expressed, float(self._min[has].min()), float(self._max[has].max()))

    def range(self) -> CalibratedType:
        """One range for the whole tensor, or with ``per_channel`` one per channel where
        eq. (29) pays. A tensor with a non-finite extremum reports its extrema
        (is_degenerate then keeps it float); one that saw nothing [0, 0]."""
        cal = self.tensor_range()
        if self.per_channel:
            pc = self.channel_ranges(cal)
            if pc is not None:
                return pc
        return cal

    def channel_ranges(self, tensor: CalibratedType) -> CalibratedType | None:
        """Eq. (29): per-channel ranges (axis = ``self.axis``) with one zero point, or
        None when the per-tensor range ``tensor`` is as good (eq. (23)'s bar) or the
        channels are not all finite and seen."""
        if self._min is None or tensor.axis is not None or self.weights.size < 2:
            return None
        assert self._max is not None and self._count is not None
        if not (np.isfinite(self._min).all() and np.isfinite(self._max).all()) or (self._count == 0).any():
            return None
        a0, b0 = min(float(tensor.min), 0.0), max(float(tensor.max), 0.0)
        if b0 <= a0:
            return None
        lo, hi = np.minimum(self._min, 0.0), np.maximum(self._max, 0.0)
        dead = hi <= lo  # all zeros: any grid is exact, the per-tensor one is used
        lo, hi = np.where(dead, a0, lo), np.where(dead, b0, hi)
        g = self.weights
        n = self._count.astype(np.float64)
        nz = np.maximum(n - self._zeros.astype(np.float64), 0.0)
        qmin, qmax = self.qmin, self.qmax
        if self.symmetric:
            t = np.maximum(-lo, hi)
            lo_c, hi_c = -t, t
            s = 2.0 * t / (qmax - qmin)
        else:
            if (lo < 0).any() and (hi > 0).any():
                zs = np.arange(qmin + 1, qmax, dtype=np.float64)
            elif (lo < 0).any():
                zs = np.array([float(qmax)])
            else:
                zs = np.array([float(qmin)])
            with np.errstate(divide="ignore", invalid="ignore"):
                down = np.where(zs[:, None] > qmin, -lo[None, :] / (zs[:, None] - qmin), 0.0)
                up = np.where(zs[:, None] < qmax, hi[None, :] / (qmax - zs[:, None]), 0.0)
            steps = np.maximum(down, up)  # [Z, C]
            best = int(np.argmin((steps**2) @ (g * n)))
            z, s = zs[best], steps[best]
            lo_c, hi_c = (qmin - z) * s, (qmax - z) * s
        if not (s > 0).all():
            return None
        e_pc = float(g @ (nz * s * s)) / 12.0
        st = (b0 - a0) / (qmax - qmin)
        if self.symmetric:
            tt = max(-a0, b0)
            a0, b0, st = -tt, tt, 2.0 * tt / (qmax - qmin)
        e_pt = 0.0
        # every weighted channel with data at once (channel_errors: the same numbers as
        # QuantizationErrorModel on each channel's view), summed in channel order
        rows = np.flatnonzero((g > 0) & (n > 0) & self._counts.any(axis=1))
        if rows.size:
            errors = channel_errors(
                self._counts[rows],
                self._k[rows],
                self._start[rows],
                self._lo[rows],
                self._hi[rows],
                self._zeros[rows],
                a0,
                b0,
                st,
            )
            for gc, ec in zip(g[rows].tolist(), errors.tolist(), strict=True):
                e_pt += gc * ec
        if not e_pc < MIN_GAIN * e_pt:
            return None
        assert self.axis is not None
        return CalibratedType(self.expressed, tuple(lo_c.tolist()), tuple(hi_c.tolist()), self.axis)

    def tensor_range(self) -> CalibratedType:
        """Eq. (22)'s one range for the whole tensor (with eq. (23)'s MinMax fallback)."""
        if self._min is None or not (self._count > 0).any():
            return CalibratedType(self.expressed, 0.0, 0.0)
        has = self._count > 0
        lo, hi = float(self._min[has].min()), float(self._max[has].max())
        if not (np.isfinite(lo) and np.isfinite(hi)) or not self._counts.any():
            return CalibratedType(self.expressed, lo, hi)
        view = self.weighted_view()
        if view.counts.size == 0 or not view.counts.any():  # every weight is 0 where there is data
            return CalibratedType(self.expressed, lo, hi)
        a, b = self._estimate_channel(view)
        a, b = min(max(a, lo), hi), min(max(b, lo), hi)
        if not self._pays(view, a, b, lo, hi):
            return CalibratedType(self.expressed, lo, hi)
        return CalibratedType(self.expressed, a, max(a, b))

    def _pays(self, view: HistogramView, a: float, b: float, lo: float, hi: float) -> bool:
        """Eq. (23): clip only when the modelled error falls below ``MIN_GAIN`` of MinMax's.

        Eq. (22) treats the errors of different channels and taps as uncorrelated; a
        clipping error is not (neighbouring pixels of a channel clip together, and their
        errors add up coherently in a kernel), so the model underrates clipping. A range
        that it prefers by a small margin is as likely to be worse as better (a classifier
        lost 7 dB of logit SQNR that way); a range that it prefers by several times (a
        channel 30x wider than the rest, with small weights downstream) is not."""
        model = QuantizationErrorModel(view)
        steps = float(self.qmax - self.qmin)
        if self.symmetric:
            t_mm, t = max(-min(lo, 0.0), max(hi, 0.0)), max(-a, b)
            e_mm = float(model.error(-t_mm, t_mm, 2.0 * t_mm / steps))
            e = float(model.error(-t, t, 2.0 * t / steps))
        else:
            lo0, hi0, a0, b0 = min(lo, 0.0), max(hi, 0.0), min(a, 0.0), max(b, 0.0)
            e_mm = float(model.error(lo0, hi0, (hi0 - lo0) / steps))
            e = float(model.error(a0, b0, (b0 - a0) / steps))
        return e < MIN_GAIN * e_mm


def consumer_weights(kind: str, w: np.ndarray, *, group: int = 1, trans_b: bool = False) -> np.ndarray:
    """g_c of eq. (22) for the input channels of one consumer with constant weight ``w``.

    ``kind``: "Conv" (w [Cout, Cin/group, *kernel], input channel axis 1), "Gemm"
    (w [K, N], or [N, K] with ``trans_b``) or "MatMul" (w [K, N]); the input's channel
    axis is its last for the last two.

    >>> consumer_weights("Conv", np.ones((4, 1, 3, 3)), group=4).tolist()   # depthwise
    [9.0, 9.0, 9.0, 9.0]
    >>> consumer_weights("MatMul", np.array([[1.0, 2.0], [3.0, 0.0], [0.0, 0.0]])).tolist()
    [5.0, 9.0, 0.0]
    """
    w64 = np.asarray(w, dtype=np.float64)
    if kind == "Conv":
        cout, cin_g = w64.shape[0], w64.shape[1]
        if group < 1 or cout % group:
            raise ValueError(f"consumer_weights: {cout} output channels do not split into {group} groups")
        per = (w64**2).reshape(cout, cin_g, -1).sum(axis=2)  # [Cout, Cin/g]
        return per.reshape(group, cout // group, cin_g).sum(axis=1).reshape(-1)  # [Cin]
    if kind in ("Gemm", "MatMul"):
        wk = w64.T if trans_b else w64
        if wk.ndim != 2:
            raise ValueError(f"consumer_weights: a {kind} weight must be 2-D, got shape {w64.shape}")
        return (wk**2).sum(axis=1)
    raise ValueError(f"consumer_weights: no channel weights for {kind}")
