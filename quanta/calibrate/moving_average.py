"""MovingAverageMinMaxObserver: exponential moving average of per-sample extrema.

Each ``observe`` call is one step ``t`` with that sample's extrema ``lo_t``, ``hi_t``::

    (9)  m_1 = lo_1,   m_t = m_{t-1} + c · (lo_t - m_{t-1})     (same for the maximum)

with momentum ``c`` (default 0.01). This is PyTorch's ``MovingAverageMinMaxObserver``
(``averaging_constant``) and ORT's ``MinMaxCalibrater(moving_average=True,
averaging_constant=c)`` *between* its chunks. Within one chunk of
``max_intermediate_outputs`` samples ORT takes the plain mean of the per-sample
extrema; with the default (no chunking) ORT's "moving average" is therefore the mean of
the per-sample minima/maxima over the whole data set, where quanta's is eq. (9).

Merge (``a`` then ``b``; ``b`` saw ``n`` steps starting with ``lo_b1``) unrolls (9)::

    (10) m_ab = m_b + (1 - c)^n · (m_a - lo_b1)

so the observer keeps, per channel, the step count and its first extrema. (10) equals
the single stream up to float64 rounding (a few ulp per step), and unlike every other
observer it depends on the order: ``a.merge(b)`` is "a's samples, then b's".

Samples whose extrema are not finite (a -inf mask) do not move the average; the exact
extrema still record them, so ``range()`` reports the tensor as degenerate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.calibrate.observer import ObserverBase, _dec, _enc

__all__ = ["MovingAverageMinMaxObserver"]


class MovingAverageMinMaxObserver(ObserverBase):
    """Range = moving averages of the per-sample minimum and maximum (eq. (9)).

    >>> import numpy as np
    >>> obs = MovingAverageMinMaxObserver(momentum=0.5)
    >>> obs.observe(np.array([-2.0, 4.0], np.float32))   # m = [-2, 4]
    >>> obs.observe(np.array([0.0, 2.0], np.float32))    # m = [-2 + 0.5*2, 4 - 0.5*2]
    >>> print(obs.range())
    Cal(f32, -1, 3)
    """

    kind = "moving_average_minmax"

    def __init__(self, *, momentum: float = 0.01, axis: int | None = None) -> None:
        if not 0.0 < momentum <= 1.0:
            raise ValueError(f"MovingAverageMinMaxObserver: momentum must be in (0, 1], got {momentum}")
        super().__init__(axis=axis)
        self.momentum = float(momentum)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "momentum": self.momentum}

    def _init_state(self, channels: int) -> None:
        self._steps = np.zeros(channels, np.int64)
        self._avg_min = np.zeros(channels)
        self._avg_max = np.zeros(channels)
        self._first_min = np.zeros(channels)
        self._first_max = np.zeros(channels)

    def _update(
        self, xc: np.ndarray, lo: np.ndarray, hi: np.ndarray, counted: np.ndarray, clean: bool
    ) -> None:
        del xc, clean  # unused: the per-channel extrema are all eq. (9) needs
        step = (counted > 0) & np.isfinite(lo) & np.isfinite(hi)
        first = step & (self._steps == 0)
        c = self.momentum
        self._avg_min = np.where(
            first, lo, np.where(step, self._avg_min + c * (lo - self._avg_min), self._avg_min)
        )
        self._avg_max = np.where(
            first, hi, np.where(step, self._avg_max + c * (hi - self._avg_max), self._avg_max)
        )
        self._first_min = np.where(first, lo, self._first_min)
        self._first_max = np.where(first, hi, self._first_max)
        self._steps = self._steps + step

    def _merge_from(self, other: ObserverBase) -> None:
        assert isinstance(other, MovingAverageMinMaxObserver)
        na, nb = self._steps, other._steps
        decay = (1.0 - self.momentum) ** nb  # (10)
        both = (na > 0) & (nb > 0)
        only_b = (na == 0) & (nb > 0)
        for name in ("min", "max"):
            ma, mb = getattr(self, f"_avg_{name}"), getattr(other, f"_avg_{name}")
            first_b = getattr(other, f"_first_{name}")
            merged = np.where(both, mb + decay * (ma - first_b), np.where(only_b, mb, ma))
            setattr(self, f"_avg_{name}", merged)
            setattr(self, f"_first_{name}", np.where(only_b, first_b, getattr(self, f"_first_{name}")))
        self._steps = na + nb

    def _estimate(self) -> tuple[np.ndarray, np.ndarray]:
        assert self._min is not None and self._max is not None
        seen = self._steps > 0
        return np.where(seen, self._avg_min, self._min), np.where(seen, self._avg_max, self._max)

    def _state(self) -> dict[str, Any]:
        return {
            "steps": self._steps.tolist(),
            "avg_min": _enc(self._avg_min),
            "avg_max": _enc(self._avg_max),
            "first_min": _enc(self._first_min),
            "first_max": _enc(self._first_max),
        }

    def _load_state(self, state: dict[str, Any]) -> None:
        self._steps = np.asarray(state["steps"], dtype=np.int64)
        for key in ("avg_min", "avg_max", "first_min", "first_max"):
            setattr(self, f"_{key}", _dec(state[key]).reshape(-1))
