"""The calibration methods: one table, ``METHODS``, from which the rest is derived.

A method is a member of :class:`~quanta.quantize.recipe.CalibrationMethod` (its value is
the name a Recipe, a recipe file and ``quanta quantize --method`` take) and one row here:
what it does in one line, the Recipe fields it reads, and the factory that builds the
observer of one tensor. ``make_observer_factory`` (quantize/static.py) looks the row up,
the CLI's ``--method`` choices are the enum's values, and tests/test_docs.py checks that
docs/calibration.md's method table lists every row with its options. Adding a method is
docs/extending.md "A calibration observer".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from quanta.calibrate.observer import ObserverBase
from quanta.quantize.recipe import CalibrationMethod, Recipe

__all__ = ["METHODS", "Bins", "Method", "ObserverRequest"]


class Bins(TypedDict, total=False):
    """The histogram observers' keyword: absent, each uses its own default."""

    bins: int


@dataclass(frozen=True)
class ObserverRequest:
    """What a method's factory may read to build the observer of tensor ``name``."""

    recipe: Recipe
    name: str
    symmetric: bool  # the tensor's (its override's, else the recipe's activations')
    bins: Bins  # {"bins": recipe.num_bins}, or {} for the observer's default
    #: (qmin, qmax) of the tensor's activation storage (override dtype, symmetry, reduce_range)
    grid: Callable[[], tuple[int, int]]
    #: qdq.consumer_channel_weights: tensor -> (axis, weights) of the layers that read it
    channel_weights: Mapping[str, tuple[int, Any]]
    #: qdq.depthwise_only_inputs that the recipe lets take per-channel grids (eq. (29))
    per_channel: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Method:
    summary: str  # one line: docs/calibration.md's method table
    options: tuple[str, ...]  # the Recipe fields the method reads
    make: Callable[[ObserverRequest], ObserverBase]


def _minmax(r: ObserverRequest) -> ObserverBase:
    from quanta.calibrate.minmax import MinMaxObserver

    return MinMaxObserver()


def _moving_average(r: ObserverRequest) -> ObserverBase:
    from quanta.calibrate.moving_average import MovingAverageMinMaxObserver

    return MovingAverageMinMaxObserver(momentum=r.recipe.momentum)


def _entropy(r: ObserverRequest) -> ObserverBase:
    from quanta.calibrate.entropy import EntropyObserver

    return EntropyObserver(**r.bins)


def _percentile(r: ObserverRequest) -> ObserverBase:
    from quanta.calibrate.percentile import PercentileObserver

    return PercentileObserver(percentile=r.recipe.percentile, **r.bins)


def _mse(r: ObserverRequest) -> ObserverBase:
    from quanta.calibrate.mse import MSEObserver

    qmin, qmax = r.grid()
    return MSEObserver(qmin=qmin, qmax=qmax, symmetric=r.symmetric, **r.bins)


def _weighted_mse(r: ObserverRequest) -> ObserverBase:
    if r.name not in r.channel_weights:
        # outside eq. (22): MinMax when the recipe says so, else plain MSE, whose histogram
        # keeps the extrema too, so that eq. (24) can measure both range sets
        return _minmax(r) if r.recipe.other_ranges == "minmax" else _mse(r)
    from quanta.calibrate.weighted_mse import WeightedMSEObserver

    axis, weights = r.channel_weights[r.name]
    qmin, qmax = r.grid()
    return WeightedMSEObserver(
        axis=axis,
        weights=weights,
        qmin=qmin,
        qmax=qmax,
        symmetric=r.symmetric,
        per_channel=r.name in r.per_channel,
        **r.bins,
    )


M = CalibrationMethod
METHODS: dict[CalibrationMethod, Method] = {
    M.MINMAX: Method("the observed minimum and maximum", (), _minmax),
    M.MOVING_AVERAGE: Method(
        "per-batch min / max averaged with a momentum (ORT)", ("momentum",), _moving_average
    ),
    M.ENTROPY: Method("the threshold of least KL divergence (TensorRT, ORT)", ("num_bins",), _entropy),
    M.PERCENTILE: Method("|x| clipped at a percentile (ORT)", ("percentile", "num_bins"), _percentile),
    M.MSE: Method("the range of least quantization error on the histogram", ("num_bins",), _mse),
    M.WEIGHTED_MSE: Method(
        "inputs of Conv / Gemm / MatMul with constant weights: the least error those layers see; others MinMax",
        ("num_bins",),
        _weighted_mse,
    ),
}
del M
if set(METHODS) != set(CalibrationMethod):  # a member without a row would fail only when chosen
    raise RuntimeError(f"METHODS lacks {sorted(m.value for m in set(CalibrationMethod) - set(METHODS))}")
