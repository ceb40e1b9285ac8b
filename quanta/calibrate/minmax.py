"""MinMaxObserver: the exact extrema of everything observed.

::

    (8)  min = min_i x_i,   max = max_i x_i        over every non-NaN value (per channel)

This is ONNX Runtime's ``MinMaxCalibrater`` (``ReduceMin``/``ReduceMax`` per sample,
``np.nanmin``/``np.nanmax`` across samples) and PyTorch's ``MinMaxObserver`` /
``PerChannelMinMaxObserver``. Symmetry is not the observer's business:
``params_from_range(symmetric=True)`` makes the range symmetric (eq. (2)), which gives
the same range as ORT's ``symmetric=True`` calibrator. Merging takes the min of the
minima and the max of the maxima, so it is exact and order-independent.
"""

from __future__ import annotations

from quanta.calibrate.observer import ObserverBase

__all__ = ["MinMaxObserver"]


class MinMaxObserver(ObserverBase):
    """Range = exact [min, max] of the observed values (eq. (8)); per channel with ``axis``.

    >>> import numpy as np
    >>> obs = MinMaxObserver()
    >>> obs.observe(np.array([0.5, -1.25, np.nan], np.float32))
    >>> obs.observe(np.array([[3.0]], np.float32))   # shapes may differ between samples
    >>> print(obs.range())
    Cal(f32, -1.25, 3)
    """

    kind = "minmax"
