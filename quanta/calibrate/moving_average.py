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

Distributed calibration (quanta.scale) cannot use (10): its float64 rounding depends on
where the shard boundaries fall. A shard records instead :class:`MovingAverageSteps`, the
per-sample extrema in order (2·C float64 and one count per sample: this one state grows
with the number of samples); merging concatenates the logs in data order (associative,
not commutative: shard i's samples precede shard i+1's), and replaying the log through
(9) gives the single stream's averages bit for bit, whatever the shards.

Samples whose extrema are not finite (a -inf mask) do not move the average; the exact
extrema still record them, so ``range()`` reports the tensor as degenerate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.calibrate.observer import ObserverBase, _dec, _enc

__all__ = ["MovingAverageMinMaxObserver", "MovingAverageSteps"]


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
    batch_invariant = False  # eq. (9) averages each observation's extrema

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


class MovingAverageSteps(ObserverBase):
    """The log of per-sample extrema that eq. (9) consumes, for sharded calibration.

    ``range()`` replays the log through a :class:`MovingAverageMinMaxObserver`, so it is
    the single stream's range bit for bit; ``a.merge(b)`` means "a's samples, then b's"
    (associative; the order is the data order). Memory: 16·C bytes + 8 per sample.

    >>> import numpy as np
    >>> xs = [np.array(v, np.float32) for v in ([-2.0, 4.0], [0.0, 2.0], [1.0, 5.0])]
    >>> one, a, b = MovingAverageSteps(momentum=0.5), MovingAverageSteps(momentum=0.5), MovingAverageSteps(momentum=0.5)
    >>> for x in xs:
    ...     one.observe(x)
    >>> a.observe(xs[0]); b.observe(xs[1]); b.observe(xs[2])
    >>> a.merge(b).range() == one.range() == one.replay().range()
    True
    """

    kind = "moving_average_steps"
    batch_invariant = False  # a log of each observation's extrema

    def __init__(self, *, momentum: float = 0.01, axis: int | None = None) -> None:
        if not 0.0 < momentum <= 1.0:
            raise ValueError(f"MovingAverageSteps: momentum must be in (0, 1], got {momentum}")
        super().__init__(axis=axis)
        self.momentum = float(momentum)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "momentum": self.momentum}

    def _init_state(self, channels: int) -> None:
        # one (lo, hi, counted) triple of (C,) arrays per sample, in data order
        self._log: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def _update(
        self, xc: np.ndarray, lo: np.ndarray, hi: np.ndarray, counted: np.ndarray, clean: bool
    ) -> None:
        del xc, clean  # unused: the log keeps what eq. (9) reads
        self._log.append((lo.copy(), hi.copy(), np.asarray(counted, np.int64).copy()))

    def _merge_from(self, other: ObserverBase) -> None:
        assert isinstance(other, MovingAverageSteps)
        self._log = self._log + other._log

    @property
    def nbytes(self) -> int:
        return super().nbytes + sum(a.nbytes for step in getattr(self, "_log", []) for a in step)

    def replay(self) -> MovingAverageMinMaxObserver:
        """The moving-average observer that saw these samples one by one, in order."""
        out = MovingAverageMinMaxObserver(momentum=self.momentum, axis=self.axis)
        out._rank = self._rank
        if self._min is None:
            return out
        assert self._max is not None and self._count is not None and self._nan is not None
        out._expressed = self._expressed
        out._init_state(self._min.size)
        for lo, hi, counted in self._log:
            out._update(None, lo, hi, counted, False)  # type: ignore[arg-type]
        out._min, out._max = self._min.copy(), self._max.copy()
        out._count, out._nan = self._count.copy(), self._nan.copy()
        return out

    def _estimate(self) -> tuple[np.ndarray, np.ndarray]:
        return self.replay()._estimate()

    def _state(self) -> dict[str, Any]:
        return {"log": [[_enc(lo), _enc(hi), counted.tolist()] for lo, hi, counted in self._log]}

    def _load_state(self, state: dict[str, Any]) -> None:
        self._log = [
            (_dec(lo).reshape(-1), _dec(hi).reshape(-1), np.asarray(counted, dtype=np.int64))
            for lo, hi, counted in state["log"]
        ]
