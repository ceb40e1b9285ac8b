"""Calibration: observers turn a stream of activations into ranges (CalibratedType).

Observers (docs/calibration.md): MinMax, MovingAverageMinMax, Histogram and the
histogram readers Entropy (KL), Percentile and MSE, and the consumer-weighted MSE. ``is_degenerate`` says why a range
should stay float; ``save_table``/``load_table`` keep observer states as JSON.
"""

from __future__ import annotations

from quanta.calibrate.entropy import EntropyObserver
from quanta.calibrate.histogram import HistogramObserver, HistogramView
from quanta.calibrate.minmax import MinMaxObserver
from quanta.calibrate.moving_average import MovingAverageMinMaxObserver, MovingAverageSteps
from quanta.calibrate.mse import MSEObserver
from quanta.calibrate.observer import (
    EXTREME,
    Observer,
    ObserverBase,
    dumps_table,
    is_degenerate,
    load_table,
    loads_table,
    observer_from_dict,
    save_table,
)
from quanta.calibrate.percentile import PercentileObserver
from quanta.calibrate.spread import SPREAD, SpreadObserver
from quanta.calibrate.weighted_mse import WeightedMSEObserver

__all__ = [
    "EXTREME",
    "SPREAD",
    "EntropyObserver",
    "HistogramObserver",
    "HistogramView",
    "MSEObserver",
    "MinMaxObserver",
    "MovingAverageMinMaxObserver",
    "MovingAverageSteps",
    "Observer",
    "ObserverBase",
    "PercentileObserver",
    "SpreadObserver",
    "WeightedMSEObserver",
    "dumps_table",
    "is_degenerate",
    "load_table",
    "loads_table",
    "observer_from_dict",
    "save_table",
]
