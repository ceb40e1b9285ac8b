"""Sharded calibration: the samples split into contiguous shards, each shard calibrated
by quanta's own runner (:func:`quanta.calibrate.runner.calibrate`) wherever the engine
runs it, the states merged here in shard order.

Why the result is the single process's, bit for bit (docs/scale.md):

- every observer's state after a stream is a function of the *multiset* of samples
  (MinMax, the histogram family, weighted MSE: exact extrema, integer counts on a grid
  fixed by the extrema) or, for the moving average, of the *sequence*, which a shard
  keeps as a log (:class:`~quanta.calibrate.moving_average.MovingAverageSteps`) replayed
  in data order;
- bias correction's channel means keep exact integer sums (runner.ChannelMean);
- shards are contiguous runs of the samples in data order, and the merge folds them in
  shard order, so even an order-dependent state sees the data in its order.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from quanta.calibrate.moving_average import MovingAverageMinMaxObserver, MovingAverageSteps
from quanta.calibrate.observer import ObserverBase
from quanta.calibrate.readers import ImagePreprocess, SampleRef, load_sample, sample_refs
from quanta.calibrate.runner import CalibrationResult, ChannelMean, calibrate
from quanta.ir.graph import Model
from quanta.ir.onnx_io import from_proto, to_proto
from quanta.scale.engines import Engine, ShardProgress

__all__ = ["ShardState", "calibrate_sharded", "merge_states", "split"]


@dataclass
class ShardState:
    """What one shard sends back: observer and channel-mean states (mergeable), the
    number of samples, the value shapes of its first sample, the time it took."""

    index: int
    observers: dict[str, ObserverBase]
    means: dict[str, ChannelMean]
    samples: int
    value_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass(frozen=True)
class _Job:
    """What every shard shares (sent once per worker). The model travels as ONNX bytes:
    the IR's linked Values and Nodes pickle recursively, too deep for a real network."""

    model: Model
    tensors: tuple[str, ...]
    prototypes: dict[str, ObserverBase]
    preprocess: ImagePreprocess | None
    channel_means: dict[str, int]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["model"] = to_proto(self.model).SerializeToString()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        proto = onnx.ModelProto()
        proto.ParseFromString(state["model"])
        for key, value in {**state, "model": from_proto(proto, "calibration job")}.items():
            object.__setattr__(self, key, value)


def split(n: int, shards: int) -> list[range]:
    """``n`` sample indices in ``min(shards, n)`` contiguous, non-empty runs whose sizes
    differ by at most one (the first ones longer)."""
    shards = max(1, min(shards, n))
    q, r = divmod(n, shards)
    out, start = [], 0
    for i in range(shards):
        size = q + (i < r)
        out.append(range(start, start + size))
        start += size
    return out


def run_shard(job: _Job, shard: tuple[int, Sequence[SampleRef]]) -> ShardState:
    """Calibrate one shard with the single-process runner (what a worker runs)."""
    index, refs = shard
    names = [v.name for v in job.model.graph.inputs]

    def feeds() -> Iterator[Any]:
        for ref in refs:
            yield load_sample(ref, names, job.preprocess)

    t0 = time.perf_counter()
    result = calibrate(
        job.model,
        job.tensors,
        feeds(),
        lambda name: copy.deepcopy(job.prototypes[name]),
        progress=False,
        channel_means=job.channel_means,
    )
    return ShardState(
        index=index,
        observers=dict(result),
        means=result.mean_states,
        samples=result.samples,
        value_shapes=result.value_shapes,
        seconds=time.perf_counter() - t0,
    )


def merge_states(states: Iterable[ShardState]) -> ShardState:
    """Fold shard states in shard-index order (whatever order they are given in)."""
    ordered = sorted(states, key=lambda s: s.index)
    if not ordered:
        raise ValueError("merge_states: no shard states")
    first = ordered[0]
    observers = dict(first.observers)
    means = dict(first.means)
    owned: set[str] = set()  # accumulators copied once, then merged into in place
    for s in ordered[1:]:
        for name, obs in s.observers.items():
            if name not in observers:
                observers[name] = obs
            elif name in owned:
                observers[name] = observers[name].merge_in_place(obs)
            else:
                observers[name] = observers[name].merge(obs)
                owned.add(name)
        for name, m in s.means.items():
            means[name] = means[name].merge(m) if name in means else m
    return ShardState(
        index=first.index,
        observers=observers,
        means=means,
        samples=sum(s.samples for s in ordered),
        value_shapes=first.value_shapes,  # shard 0 starts with the data's first sample
        seconds=sum(s.seconds for s in ordered),
    )


def _for_shards(obs: ObserverBase) -> ObserverBase:
    """The state a shard keeps for ``obs``: the observer itself, except the moving
    average, whose shards keep the log of per-sample extrema (moving_average.py)."""
    if type(obs) is MovingAverageMinMaxObserver:
        return MovingAverageSteps(momentum=obs.momentum, axis=obs.axis)
    return obs


def _from_shards(obs: ObserverBase) -> ObserverBase:
    return obs.replay() if isinstance(obs, MovingAverageSteps) else obs


def calibrate_sharded(
    model: Model,
    tensors: Iterable[str],
    data: object,
    make_observer: Callable[[str], ObserverBase],
    *,
    engine: Engine,
    shards: int | None = None,
    preprocess: ImagePreprocess | None = None,
    limit: int | None = None,
    progress: bool = True,
    channel_means: dict[str, int] | None = None,
) -> CalibrationResult:
    """:func:`quanta.calibrate.runner.calibrate`, sharded over ``engine``: the same
    result, bit for bit. ``shards`` defaults to the engine's worker count."""
    from quanta.calibrate.readers import CalibrationDataError

    wanted = tuple(dict.fromkeys(tensors))
    refs = sample_refs(data, model.graph.inputs, preprocess=preprocess, limit=limit)
    if not refs:
        raise CalibrationDataError("calibration data is empty: no sample was read")
    job = _Job(
        model=model,
        tensors=wanted,
        prototypes={name: _for_shards(make_observer(name)) for name in wanted},
        preprocess=preprocess,
        channel_means=dict(channel_means or {}),
    )
    runs = split(len(refs), shards or engine.workers)
    items = [(i, [refs[k] for k in r]) for i, r in enumerate(runs)]
    t0 = time.perf_counter()
    states = engine.map(run_shard, job, items, ShardProgress("calibrating", progress))
    merged = merge_states(states)
    out = CalibrationResult({name: _from_shards(merged.observers[name]) for name in wanted})
    out.value_shapes = merged.value_shapes
    out.samples = merged.samples
    out.seconds = time.perf_counter() - t0
    out.mean_states = merged.means
    out.means = {name: m.mean() for name, m in merged.means.items() if m.mean() is not None}
    return out
