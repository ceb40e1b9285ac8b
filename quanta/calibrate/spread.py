"""SpreadObserver: MinMax plus how the magnitudes spread over powers of two.

::

    (26) E(x) = e  where |x| = m * 2^e, m in [0.5, 1)  (frexp), for every finite x != 0
         small(b) = #{x : 2^E(x) <= 2^-(b+1) * max|x|} / #{x != 0}

``small(b)`` is the share of the non-zero values that lie below half a step of a b-bit
grid spanning [0, max|x|] (a lower bound: a value counts only when its whole power-of-two
bin lies below the threshold). A grid of that range rounds them to 0: per-step dynamic
quantization of an LSTM's input x (DynamicQuantizeLSTM, quantize/recurrent.py) zeroes the
quiet bins of a power spectrum whose peak is 1e5 times its median. The state is one count
per exponent (281 int64), so it merges exactly and does not grow with the samples.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.calibrate.minmax import MinMaxObserver

__all__ = ["SPREAD", "SpreadObserver"]

#: how the reason of a tensor whose values spread over too many powers of two starts
SPREAD = "values spread over many powers of two"

_E_LO, _E_HI = -150, 130  # frexp exponents of float32 / float64 values that matter


class SpreadObserver(MinMaxObserver):
    """MinMax (eq. (8)) and a histogram of frexp exponents (eq. (26)); per tensor only.

    >>> import numpy as np
    >>> obs = SpreadObserver()
    >>> obs.observe(np.array([0.0, 1e-6, 2e-6, 3e-6, 1.0], np.float32))
    >>> round(obs.spread(8), 2)          # 3 of the 4 non-zero values are below 1 / 512
    0.75
    """

    kind = "spread"

    def __init__(self, *, axis: int | None = None) -> None:
        if axis is not None:
            raise ValueError("SpreadObserver is per tensor (axis=None)")
        super().__init__(axis=axis)
        self._exp: np.ndarray | None = None

    def _init_state(self, channels: int) -> None:
        self._exp = np.zeros(_E_HI - _E_LO + 1, np.int64)

    def _update(
        self, xc: np.ndarray, lo: np.ndarray, hi: np.ndarray, counted: np.ndarray, clean: bool
    ) -> None:
        assert self._exp is not None
        a = np.abs(xc.reshape(-1))
        a = a[np.isfinite(a) & (a > 0)]
        e = np.clip(np.frexp(a)[1], _E_LO, _E_HI) - _E_LO
        self._exp += np.bincount(e, minlength=self._exp.size)

    def _merge_from(self, other: Any) -> None:
        if self._exp is None:
            self._exp = np.zeros(_E_HI - _E_LO + 1, np.int64)
        if other._exp is not None:
            self._exp = self._exp + other._exp

    def _state(self) -> dict[str, Any]:
        return {} if self._exp is None else {"exponents": self._exp.tolist()}

    def _load_state(self, state: dict[str, Any]) -> None:
        if "exponents" in state:
            self._exp = np.asarray(state["exponents"], np.int64)

    def spread(self, bits: int = 8) -> float | None:
        """Eq. (26): the share of the non-zero values below half a ``bits``-bit step of
        [0, max|x|]; None before any non-zero finite value."""
        if self._exp is None or self._min is None or self._max is None:
            return None
        total = int(self._exp.sum())
        finite = np.concatenate([self._min, self._max])
        finite = finite[np.isfinite(finite)]
        if total == 0 or finite.size == 0:
            return None
        top = float(np.abs(finite).max())
        # bin k holds values below 2^(k + _E_LO); it counts when that bound is <= the threshold
        bound = np.ldexp(1.0, np.arange(_E_LO, _E_HI + 1))
        below = int(self._exp[bound <= top * 2.0 ** -(bits + 1)].sum())
        return below / total
