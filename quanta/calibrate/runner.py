"""The calibration runner: one pass of the float model over the data, observing every
tensor that will be quantized.

Activations are handed to their observer the moment a node produces them (the
executor's ``on_value`` hook, on the native target: the float convolutions and GEMMs on
their NumPy twins made calibration three times as long; values inside If / Loop / Scan
bodies under their scoped names ``{node}/{attribute}/{value}``) and are freed after
their last use as usual,
so memory is one sample's live activations plus the observers' fixed-size state —
never the whole dataset (ORT's Entropy/Percentile calibrators keep every activation of
every sample). Samples may differ in shape (variable sequence length).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from quanta.calibrate.observer import ObserverBase
from quanta.calibrate.readers import CalibrationDataError, ImagePreprocess, iter_feeds
from quanta.ir.graph import Model
from quanta.runtime.compile import compile as compile_model
from quanta.runtime.execute import Executor

__all__ = ["CalibrationResult", "calibrate", "compile_executor", "with_defaults"]


class CalibrationResult(dict):
    """tensor name -> observer, plus how many samples were seen and how long it took,
    and the per-channel means asked for with ``channel_means`` (name -> array), and the
    shape of every value in the first sample (what coverage counts the MACs of symbolic
    or uninferable shapes with)."""

    value_shapes: dict[str, tuple[int, ...]]
    samples: int = 0
    seconds: float = 0.0
    mean_states: dict  # name -> ChannelMean (mergeable)
    stats: list  # the ``stats`` objects after the pass (mergeable: their ``merge``)
    shard_cpu_seconds: float = 0.0  # quanta.scale: the shards' CPU seconds (each its thread's), summed

    @property
    def means(self) -> dict[str, np.ndarray]:
        """name -> per-channel mean (float64) of the channel means asked for, divided on
        first use: a shard of quanta.scale never divides its partial sums, the driver
        divides the merged ones once."""
        cached = self.__dict__.get("_means")
        if cached is None:
            states = getattr(self, "mean_states", None) or {}
            cached = {name: mu for name, m in states.items() if (mu := m.mean()) is not None}
            self.__dict__["_means"] = cached
        return cached


#: bytes of a feed's repeated reports (Loop / Scan bodies) held for one observer update
BATCH_BYTES = 1 << 25

# Every finite float64 is an integer multiple of 2^-1074; sums are kept as such integers.
_FIXED = 1074


class ChannelMean:
    """Streaming per-channel mean along ``axis`` (constant memory; samples may differ in
    every other dimension), exactly mergeable.

    Each sample's per-channel sum is taken in float64 (NumPy's pairwise sum: a function of
    that sample alone); the sums *across* samples are exact, kept as Python integers in
    units of 2^-1074, so the state after any split of the samples into shards, merged in
    any order, is the same integers, and :meth:`mean` (one correct rounding of
    total / count) the same float64.
    """

    def __init__(self, axis: int):
        self.axis = axis
        self.total: np.ndarray | None = None  # object array of Python ints (units 2^-1074)
        self.count = 0

    def observe(self, x: np.ndarray) -> None:
        a = np.moveaxis(np.asarray(x, dtype=np.float64), self.axis, 0)
        s = a.reshape(a.shape[0], -1).sum(axis=1)
        fixed = _to_fixed(s)
        if self.total is None:
            self.total = fixed
        elif self.total.shape != fixed.shape:
            raise ValueError(
                f"channel mean: {s.size} channels along axis {self.axis}, earlier {self.total.size}"
            )
        else:
            self.total = self.total + fixed
        self.count += a.size // max(a.shape[0], 1)

    def merge(self, other: ChannelMean) -> ChannelMean:
        """The mean of both streams (exact: integer sums)."""
        if other.axis != self.axis:
            raise ValueError(f"channel mean: cannot merge axis {other.axis} into axis {self.axis}")
        out = ChannelMean(self.axis)
        if self.total is not None and other.total is not None and self.total.shape != other.total.shape:
            raise ValueError(f"channel mean: {self.total.size} channels vs {other.total.size}")
        parts = [t for t in (self.total, other.total) if t is not None]
        out.total = None if not parts else parts[0] + parts[1] if len(parts) == 2 else parts[0].copy()
        out.count = self.count + other.count
        return out

    def mean(self) -> np.ndarray | None:
        if self.total is None or self.count == 0:
            return None
        den = self.count << _FIXED
        # int / int is correctly rounded in Python (as float(Fraction(t, den)), without
        # the gcd a Fraction computes first)
        return np.array(
            [t / den if isinstance(t, int) else t / self.count for t in self.total],
            dtype=np.float64,
        )

    def to_dict(self) -> dict:
        """JSON-able state (integers as decimal strings: they exceed 64 bits)."""
        total = (
            None if self.total is None else [str(t) if isinstance(t, int) else repr(t) for t in self.total]
        )
        return {"axis": self.axis, "count": self.count, "total": total}

    def result(self) -> MeanResult:
        """The mean, divided now (:class:`MeanResult`): what a worker of quanta.scale sends
        instead of the integer sums once every shard is merged in."""
        return MeanResult(self.axis, self.count, self.mean())

    @classmethod
    def from_dict(cls, d: Mapping) -> ChannelMean:
        out = cls(int(d["axis"]))
        out.count = int(d["count"])
        if d["total"] is not None:
            total = np.empty(len(d["total"]), dtype=object)
            total[:] = [int(t) if t.lstrip("-").isdigit() else float(t) for t in d["total"]]
            out.total = total
        return out


class MeanResult:
    """A :class:`ChannelMean` once no more samples come: its ``mean()`` (the same float64
    array), without the integer sums (which only a merge needs)."""

    __slots__ = ("_mean", "axis", "count")

    def __init__(self, axis: int, count: int, mean: np.ndarray | None) -> None:
        self.axis = axis
        self.count = count
        self._mean = mean

    def __reduce__(self) -> tuple[Any, ...]:
        return (MeanResult, (self.axis, self.count, self._mean))

    def mean(self) -> np.ndarray | None:
        return None if self._mean is None else self._mean.copy()


def _to_fixed(s: np.ndarray) -> np.ndarray:
    """float64 -> object array of the exact integers s·2^1074. A non-finite sum (an inf or
    NaN activation) stays a float, and so does every total it is added to."""
    m, e = np.frexp(s)  # s = m·2^e, |m| in [0.5, 1)
    mant = np.ldexp(m, 53)  # an integer below 2^53 in magnitude: exact in int64
    finite = np.isfinite(s)
    shift = np.where(finite, e.astype(np.int64) - 53 + _FIXED, 0)
    out = np.where(finite, mant, 0.0).astype(np.int64).astype(object)
    for u in np.unique(shift).tolist():  # a few distinct exponents per sample
        sel = shift == u
        # u < 0 only for subnormals, whose low mantissa bits are then zero: exact
        out[sel] = np.left_shift(out[sel], u) if u >= 0 else np.right_shift(out[sel], -u)
    if not finite.all():
        out[~finite] = s[~finite].astype(object)
    return out


class _Progress:
    """A one-line progress report on stderr (only when it is a terminal, or forced)."""

    def __init__(self, enabled: bool, total: int | None):
        self.enabled = enabled and sys.stderr.isatty()
        self.total = total
        self.t0 = time.perf_counter()

    def update(self, n: int) -> None:
        if not self.enabled:
            return
        dt = time.perf_counter() - self.t0
        total = f"/{self.total}" if self.total else ""
        sys.stderr.write(f"\rcalibrating: {n}{total} samples, {dt:.1f} s")
        sys.stderr.flush()

    def close(self, n: int) -> None:
        if self.enabled:
            sys.stderr.write(f"\rcalibrating: {n} samples, {time.perf_counter() - self.t0:.1f} s\n")


def calibrate(
    model: Model,
    tensors: Iterable[str],
    data: object,
    make_observer: Callable[[str], ObserverBase],
    *,
    preprocess: ImagePreprocess | None = None,
    limit: int | None = None,
    progress: bool = True,
    channel_means: dict[str, int] | None = None,
    taps: Mapping[str, list[Callable[[np.ndarray], None]]] | None = None,
    stats: Sequence[Any] = (),
    executor: Executor | None = None,
) -> CalibrationResult:
    """Observe ``tensors`` (value names of ``model``) over ``data``; return their observers.

    ``data`` is anything :func:`quanta.calibrate.readers.iter_feeds` accepts.
    ``make_observer(name)`` builds the observer of one tensor. ``taps``: more consumers
    of named float values, called with each value as it is produced (the statistics that
    ``stats``: objects with an ``x_name`` and ``observe(value)`` fed like observers
    (rounding-aware weight quantization's statistics, which count the samples they see),
    returned as ``result.stats``. ``executor``: a compiled :class:`Executor` of ``model``
    on the native target with no passes (what this function would compile) to run
    instead of compiling one: quanta.scale's workers keep one per job for all the shards
    they run.
    """
    wanted = list(dict.fromkeys(tensors))
    observers = CalibrationResult({name: make_observer(name) for name in wanted})
    means = {name: ChannelMean(axis) for name, axis in (channel_means or {}).items()}
    taps = {name: list(fns) for name, fns in (taps or {}).items()}
    for st in stats:
        taps.setdefault(st.x_name, []).append(st.observe)
    # the model as given, on the native target (one thread: the float kernels' bytes do
    # not depend on the thread count anyway): If / Loop / Scan bodies run as
    # compiled plans too and report their values under scoped names
    # (quanta.runtime.control_flow.scoped_name), so tensors inside bodies are observed
    exe = executor if executor is not None else compile_executor(model)
    graph = model.graph
    input_names = {v.name for v in graph.inputs}
    outputs = [v.name for v in graph.outputs]
    total = None
    if isinstance(data, (list, tuple)):
        total = len(data) if limit is None else min(limit, len(data))
    bar = _Progress(progress, total)

    # A value inside a Loop or Scan body is reported once per iteration (a table
    # decoder's 501 steps): its observer sees the feed's first report at once and the
    # others as one array at the end of the feed (or when they grow past BATCH_BYTES),
    # which leaves the same state where the observer is batch-invariant (per tensor,
    # ObserverBase.batch_invariant) and makes one update instead of hundreds
    batchable = {
        name for name, obs in observers.items() if getattr(obs, "batch_invariant", False) and obs.axis is None
    }
    seen: set[str] = set()  # names reported in this feed
    pending: dict[str, list[np.ndarray]] = {}
    pending_bytes = 0

    def flush() -> None:
        nonlocal pending_bytes
        for name, parts in pending.items():
            observers[name].observe(parts[0] if len(parts) == 1 else np.concatenate(parts))
        pending.clear()
        pending_bytes = 0

    def on_value(name: str, arr: np.ndarray) -> None:
        nonlocal pending_bytes
        if n == 0 and isinstance(arr, np.ndarray):
            observers.value_shapes[name] = arr.shape
        if not (isinstance(arr, np.ndarray) and arr.dtype.kind == "f"):
            return
        obs = observers.get(name)
        if obs is not None:
            if name not in batchable:
                obs.observe(arr)
            elif name not in seen:
                seen.add(name)
                obs.observe(arr)
            else:  # a copy: the value may live in the run's arena, which later steps reuse
                pending.setdefault(name, []).append(np.array(arr, copy=True).reshape(-1))
                pending_bytes += arr.nbytes
                if pending_bytes > BATCH_BYTES:
                    flush()
        mean = means.get(name)
        if mean is not None:
            mean.observe(arr)
        for tap in taps.get(name, ()):
            tap(arr)

    t0 = time.perf_counter()
    n = 0
    observers.value_shapes = {}
    # One BLAS thread: the reference twins' float products (operators without a native
    # kernel) go through NumPy's BLAS,
    # whose sums depend on how many threads split them, so the ranges (and the file)
    # would depend on the core count of the machine, or differ between this process and
    # a Ray worker (which runs with one thread)
    with threadpool_limits(limits=1, user_api="blas"):
        for feed in iter_feeds(data, graph.inputs, preprocess=preprocess, limit=limit):
            for name, arr in feed.items():
                if name in input_names:
                    on_value(name, arr)
            exe.run(with_defaults(feed, graph), outputs, on_value=on_value)
            flush()
            seen.clear()
            for obs in observers.values():
                next_feed = getattr(obs, "next_feed", None)
                if next_feed is not None:
                    next_feed()
            n += 1
            bar.update(n)
    bar.close(n)
    if n == 0:
        raise CalibrationDataError("calibration data is empty: no sample was read")
    observers.samples = n
    observers.seconds = time.perf_counter() - t0
    observers.mean_states = means
    observers.stats = list(stats)
    return observers


def compile_executor(model: Model) -> Executor:
    """The executor :func:`calibrate` runs ``model`` with: the model as given, on the
    native target, no passes."""
    return Executor(compile_model(model, "native", passes=[]))


def with_defaults(feed: Mapping[str, np.ndarray], graph) -> dict[str, np.ndarray]:
    """``feed`` with every graph input it leaves out that has a default (an initializer
    listed as an input) filled in: what a run of the float model is fed (calibration
    here, the sharded jobs of quanta.scale, the quantizer's own passes over the data)."""
    out = dict(feed)
    for v in graph.inputs:
        if v.name not in out and v.const is not None:
            out[v.name] = v.const
    return out
