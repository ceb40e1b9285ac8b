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
  shard order (each as soon as its predecessors are in: :class:`ShardFold`), so even an
  order-dependent state sees the data in its order.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import onnx

from quanta.calibrate.histogram import HistogramObserver
from quanta.calibrate.moving_average import MovingAverageMinMaxObserver, MovingAverageSteps
from quanta.calibrate.observer import ObserverBase, ObserverResult
from quanta.calibrate.readers import ImagePreprocess, SampleRef, iter_feeds, load_sample, sample_refs
from quanta.calibrate.runner import (
    CalibrationResult,
    ChannelMean,
    MeanResult,
    calibrate,
    compile_executor,
    with_defaults,
)
from quanta.calibrate.weighted_mse import WeightedMSEObserver
from quanta.ir.graph import Model
from quanta.ir.onnx_io import from_proto, to_proto
from quanta.runtime.execute import Executor
from quanta.scale.engines import Engine, InProcessEngine, ShardProgress

__all__ = [
    "MIN_SHARD_SAMPLES",
    "SHARDS_PER_WORKER",
    "ShardFold",
    "ShardState",
    "calibrate_sharded",
    "cut_tail",
    "default_shards",
    "finish_state",
    "first_value_shapes",
    "join_states",
    "merge_into",
    "merge_pair",
    "merge_run",
    "merge_states",
    "prepared",
    "split",
    "split_state",
]


@dataclass
class ShardState:
    """What one shard sends back: observer and channel-mean states (mergeable), the
    number of samples, the value shapes of its first sample, the time it took (wall
    seconds, and CPU seconds of the thread that ran it: what a benchmark compares with
    the in-process run on a machine whose other load inflates wall time)."""

    index: int
    observers: dict[str, ObserverBase | ObserverResult]  # results once finished (finish_state)
    means: dict[str, ChannelMean | MeanResult]
    samples: int
    value_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    seconds: float = 0.0
    stats: list = field(default_factory=list)  # calibrate's ``stats`` (exactly mergeable)
    cpu_seconds: float = 0.0


@dataclass(frozen=True)
class _Job:
    """What every shard shares (sent once per worker). It travels as a :class:`_JobWire`:
    the model as ONNX bytes (the IR's linked Values and Nodes pickle recursively, too
    deep for a real network) and an id (``digest``), so that a worker process that runs several
    shards of the job builds the model and compiles its plan once (:func:`prepared`)."""

    model: Model
    tensors: tuple[str, ...]
    prototypes: dict[str, ObserverBase]
    preprocess: ImagePreprocess | None
    channel_means: dict[str, int]
    stats: tuple = ()  # prototypes of calibrate's ``stats``
    starts: tuple[int, ...] = ()  # the data index of each shard's first sample
    prune: bool = False  # send the model without its tail (:func:`cut_tail`)

    def wire(self) -> _JobWire:
        """The job as it travels (computed once per job: the model's serialisation is the
        driver's cost, paid once however many times the job is sent). With ``prune``, the
        model's bytes leave out its tail (the nodes no observed value depends on,
        :func:`cut_tail`); ``pruned`` says whether there was one."""
        cached = self.__dict__.get("_wire")
        if cached is None:
            rest = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "model"}
            # The weights travel as arrays beside the proto (docs/scale.md step 3): pickle
            # protocol 5 (Ray's serialiser) sends them out of band, never copied into the
            # proto, its bytes or the pickle; the worker builds its model on them as sent.
            arrays: dict[str, np.ndarray] = {}
            proto = to_proto(self.model, arrays=arrays)
            pruned = False
            if self.prune:
                needed = [*self.tensors, *self.channel_means, *(st.x_name for st in self.stats)]
                pruned = cut_tail(proto, needed)
                if pruned:  # the tail's weights leave with it
                    kept = {t.name for t in proto.graph.initializer}
                    arrays = {name: a for name, a in arrays.items() if name in kept}
            model_bytes = proto.SerializeToString()
            # The worker's cache key: drawn per job, not hashed from its content. A content
            # digest would also let a job equal to an earlier one find it prepared, but it
            # reads the model's bytes (~10 ms for 18.7 MB) and pickles the rest once more,
            # serial work of the driver before anything is sent, against a preparation that
            # the workers pay in parallel (12 ms) and only for a job sent again.
            cached = _JobWire(uuid.uuid4().hex, model_bytes, rest, arrays)
            cached.pruned = pruned
            object.__setattr__(self, "_wire", cached)
        return cached

    @property
    def digest(self) -> str:
        return self.wire().digest

    def __reduce__(self) -> tuple[Any, ...]:
        return self.wire().__reduce__()


class _JobWire:
    """A :class:`_Job` as a worker receives it: the digest, the model's ONNX bytes (its
    large weights without their data), those weights' arrays (``arrays``, by initializer
    name: out-of-band buffers of pickle protocol 5, which Ray's object store hands to a
    worker without a copy) and the other fields as they are. The model is parsed, built
    on the arrays and compiled only where the digest is not prepared yet
    (:func:`prepared`). ``pruned`` (the driver's side only, never pickled with the job):
    whether the bytes leave out the model's tail (:func:`cut_tail`)."""

    __slots__ = ("arrays", "digest", "model_bytes", "pruned", "rest")

    def __init__(
        self,
        digest: str,
        model_bytes: bytes,
        rest: dict[str, Any],
        arrays: dict[str, np.ndarray] | None = None,
    ) -> None:
        self.digest = digest
        self.model_bytes = model_bytes
        self.rest = rest
        self.arrays = {} if arrays is None else arrays
        self.pruned = False

    def __reduce__(self) -> tuple[Any, ...]:
        return (_JobWire, (self.digest, self.model_bytes, self.rest, self.arrays))

    def job(self) -> _Job:
        proto = onnx.ModelProto()
        proto.ParseFromString(self.model_bytes)
        out = _Job(model=from_proto(proto, "calibration job", arrays=self.arrays), **self.rest)
        object.__setattr__(out, "_wire", self)
        return out


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def cut_tail(proto: onnx.ModelProto, needed: Iterable[str]) -> bool:
    """Take out of ``proto`` (in place) its tail: the nodes that no value of ``needed``
    (observed tensors, channel means, statistics' inputs) depends on, and the
    initializers only they read; the graph's outputs become the old outputs still
    computed and the values the kept nodes compute that no kept node reads. Every
    ``needed`` value is computed from the same inputs by the same nodes, so it is the
    same array; what the tail's values would add to a shard is their shapes
    (``ShardState.value_shapes``), which the driver records itself from the data's first
    sample (:func:`first_value_shapes`). The graph inputs stay (the feeds are the same).
    False, ``proto`` unchanged, where there is no tail, where a needed name is not a
    value of the main graph or where a node has a subgraph (a name observed inside a
    body: the model is kept whole). On EfficientNet-Lite0 the tail is the classifier
    Gemm: 5.1 MB of the model's 18.6 MB."""
    g = proto.graph
    if any(_has_subgraph(n) for n in g.node):
        return False
    sources = {i.name for i in g.input} | {i.name for i in g.initializer}
    known = sources | {o for n in g.node for o in n.output}
    wanted = set(needed)
    if not wanted <= known:
        return False
    live = set(wanted)
    keep = [False] * len(g.node)
    for k in range(len(g.node) - 1, -1, -1):
        node = g.node[k]
        if any(o in live for o in node.output):
            keep[k] = True
            live.update(i for i in node.input if i)
    if all(keep):
        return False
    kept_nodes = [n for n, k in zip(g.node, keep) if k]
    read = {i for n in kept_nodes for i in n.input}
    produced = [o for n in kept_nodes for o in n.output if o]
    available = set(produced) | sources
    outputs = [o.name for o in g.output if o.name in available]
    outputs += [o for o in produced if o not in read and o not in outputs]
    if not outputs:
        return False
    tail_reads = {i for n, k in zip(g.node, keep) if not k for i in n.input}
    dropped = [k for k, t in enumerate(g.initializer) if t.name in tail_reads and t.name not in read | wanted]
    types = {vi.name: vi for vi in [*g.value_info, *g.output]}
    new_outputs = []
    for name in outputs:
        vi = onnx.ValueInfoProto()
        if name in types:
            vi.CopyFrom(types[name])
        else:
            vi.name = name
        new_outputs.append(vi)
    for k in reversed(range(len(g.node))):
        if not keep[k]:
            del g.node[k]
    for k in reversed(dropped):
        del g.initializer[k]
    del g.output[:]
    g.output.extend(new_outputs)
    return True


def first_value_shapes(
    model: Model, ref: SampleRef, preprocess: ImagePreprocess | None
) -> dict[str, tuple[int, ...]]:
    """The shape of every value of ``model`` on the sample ``ref``, as
    :func:`~quanta.calibrate.runner.calibrate` records them from its first sample (the
    feed's inputs, then every value the executor reports): the value shapes of a
    calibration whose shards run a pruned model (:func:`cut_tail`), recorded by the
    driver from the data's first sample with the whole model. No observer, no BLAS
    thread limit (a shape does not depend on how a sum is split, and the limit is
    process-wide: this runs beside the engine's wait)."""
    graph = model.graph
    input_names = {v.name for v in graph.inputs}
    shapes: dict[str, tuple[int, ...]] = {}

    def record(name: str, arr: Any) -> None:
        if isinstance(arr, np.ndarray):
            shapes[name] = arr.shape

    exe = compile_executor(model)
    for feed in iter_feeds([load_sample(ref, [v.name for v in graph.inputs], preprocess)], graph.inputs):
        for name, arr in feed.items():
            if name in input_names:
                record(name, arr)
        exe.run(with_defaults(feed, graph), [v.name for v in graph.outputs], on_value=record)
    return shapes


class _FirstShapes:
    """:func:`first_value_shapes` of the data's first sample, in a thread of the driver
    started by :meth:`start` (once the engine has submitted the shards: the thread would
    hold the GIL against the submission) and run while they run, off the critical path
    (~50 ms CPU on EfficientNet-Lite0 against a 1.3 s shard); in the caller's thread by
    :meth:`result` if never started (the in-process engine, whose shards run in this
    process: the BLAS thread limit they set is process-wide)."""

    def __init__(self, model: Model, ref: SampleRef, preprocess: ImagePreprocess | None) -> None:
        self._args = (model, ref, preprocess)
        self._out: dict[str, tuple[int, ...]] | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="quanta-first-shapes", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            self._out = first_value_shapes(*self._args)
        except BaseException as e:  # re-raised in the caller's thread by result()
            self._error = e

    def result(self) -> dict[str, tuple[int, ...]]:
        if self._thread is None:
            self._run()
        else:
            self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._out is not None
        return self._out


@dataclass(frozen=True)
class _Prepared:
    """A job ready to run shards: the model built and its calibration plan compiled."""

    job: _Job
    executor: Executor


# digest -> prepared job, most recently used last. A worker process (Ray reuses them for
# the tasks of a job; a local engine's pool too) runs one task at a time and pays the
# job's fixed cost (parse the model, build the IR, compile the plan: docs/scale.md eq.
# (S5)) for its first shard only. Two entries: a job and the one before it (the
# accuracy search's trials calibrate one job after another), so memory stays bounded.
_PREPARED: OrderedDict[str, _Prepared] = OrderedDict()
_PREPARED_MAX = 2


def prepared(job: _Job | _JobWire) -> _Prepared:
    """``job`` ready to run, from this process's cache when a job of the same digest was
    prepared here before (the prepared job is never changed by a shard: every shard
    observes into copies of the prototypes and statistics)."""
    digest = job.digest
    hit = _PREPARED.get(digest)
    if hit is not None:
        _PREPARED.move_to_end(digest)
        return hit
    # built from the bytes even in the driver's process: the caller's model may change
    # after the job (quantize_static inserts QDQ into it), the prepared one must not
    full = (job if isinstance(job, _JobWire) else job.wire()).job()
    out = _Prepared(full, compile_executor(full.model))
    _PREPARED[digest] = out
    while len(_PREPARED) > _PREPARED_MAX:
        _PREPARED.popitem(last=False)
    return out


# Over-decomposition when the caller does not say (docs/scale.md eqs. (S4)-(S6)): each
# shard costs its state (cut, pickled, merged: ~0.17 s CPU on EfficientNet-Lite0, the
# compute of ~2.4 samples) on top of its samples, and buys a finer balance of the
# workers. Measured on EfficientNet-Lite0 at 8 simulated workers and 25 samples per
# worker (benchmarks/results/2026-12-04b-scale.md), one shard per worker is the fastest;
# more shards pay only where those costs are small against a shard: from
# MIN_SHARD_SAMPLES samples a shard (~2 % there), up to SHARDS_PER_WORKER per worker.
SHARDS_PER_WORKER = 4
MIN_SHARD_SAMPLES = 128


def default_shards(workers: int, samples: int) -> int:
    """The shard count ``calibrate_sharded`` uses when none is given: one for one worker
    (nothing to balance, a shard's fixed costs paid once); else one per worker, and more
    (handed out as workers free up, docs/scale.md eq. (S4)) while every shard keeps at
    least ``MIN_SHARD_SAMPLES`` samples, up to ``SHARDS_PER_WORKER`` per worker; never
    more than the samples."""
    if workers <= 1:
        return 1
    more = min(SHARDS_PER_WORKER * workers, samples // MIN_SHARD_SAMPLES)
    return max(1, min(samples, max(workers, more)))


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


def run_shard(job: _Job | _JobWire, shard: tuple[int, Sequence[SampleRef]]) -> ShardState:
    """Calibrate one shard with the single-process runner (what a worker runs), with the
    job this process prepared (:func:`prepared`)."""
    index, refs = shard
    ready = prepared(job)
    job = ready.job
    names = [v.name for v in job.model.graph.inputs]

    def feeds() -> Iterator[Any]:
        for ref in refs:
            yield load_sample(ref, names, job.preprocess)

    stats = copy.deepcopy(list(job.stats))
    for st in stats:  # statistics that tell samples apart by their index in the data
        st.calls = job.starts[index] if job.starts else 0
    t0, c0 = time.perf_counter(), time.thread_time()
    result = calibrate(
        job.model,
        job.tensors,
        feeds(),
        lambda name: copy.deepcopy(job.prototypes[name]),
        progress=False,
        channel_means=job.channel_means,
        stats=stats,
        executor=ready.executor,
    )
    return ShardState(
        index=index,
        observers=dict(result),
        means=result.mean_states,
        samples=result.samples,
        value_shapes=result.value_shapes,
        seconds=time.perf_counter() - t0,
        stats=result.stats,
        cpu_seconds=time.thread_time() - c0,
    )


class ShardFold:
    """Merges shard states as they arrive, in shard-index order: a state is folded into
    the accumulator as soon as every shard before it has been (the others wait here), so
    the driver merges while slower shards still run, and the result is the in-order
    fold whatever the arrival order (which the moving average's log needs; the other
    states would allow any order). Use as ``engine.map(..., on_result=fold)``."""

    def __init__(self) -> None:
        self._acc: ShardState | None = None
        self._next = 0
        self._waiting: dict[int, ShardState] = {}
        self._owned: set[str] = set()  # accumulator entries copied once, then merged into in place
        self.merge_seconds = 0.0  # driver time spent merging

    def __call__(self, index: int, state: ShardState) -> None:
        self._waiting[index] = state
        t0 = time.perf_counter()
        while self._next in self._waiting:
            self._absorb(self._waiting.pop(self._next))
            self._next += 1
        self.merge_seconds += time.perf_counter() - t0

    def _absorb(self, s: ShardState) -> None:
        if self._acc is None:
            self._acc = ShardState(
                index=s.index,
                observers=dict(s.observers),
                means=dict(s.means),
                samples=s.samples,
                value_shapes=s.value_shapes,  # shard 0 starts with the data's first sample
                seconds=s.seconds,
                stats=copy.deepcopy(s.stats),  # merged into in place below
                cpu_seconds=s.cpu_seconds,
            )
            return
        acc = self._acc
        for name, obs in s.observers.items():
            if name not in acc.observers:
                acc.observers[name] = obs
            elif name in self._owned:
                acc.observers[name] = acc.observers[name].merge_in_place(obs)
            else:  # the first shard's observer may be shared with the caller: copy it once
                acc.observers[name] = acc.observers[name].merge(obs)
                self._owned.add(name)
        for name, m in s.means.items():
            acc.means[name] = acc.means[name].merge(m) if name in acc.means else m
        for mine, theirs in zip(acc.stats, s.stats):
            if mine is not None:  # None: a part of split_state that holds another part's statistics
                mine.merge(theirs)
        acc.samples += s.samples
        acc.seconds += s.seconds
        acc.cpu_seconds += s.cpu_seconds

    def result(self) -> ShardState:
        if self._acc is None:
            raise ValueError("merge_states: no shard states")
        if self._waiting:
            raise ValueError(f"merge_states: shard {self._next} missing (have {sorted(self._waiting)})")
        return self._acc


def merge_pair(a: ShardState, b: ShardState) -> ShardState:
    """``a`` then ``b`` (``a``'s shards come first) as one new state; neither is changed
    (on a Ray worker both may be read-only views of the object store). A step of the
    tree merge (docs/scale.md eq. (S2)); associative, like every observer's merge."""
    observers = dict(a.observers)
    for name, obs in b.observers.items():
        observers[name] = observers[name].merge(obs) if name in observers else obs
    means = dict(a.means)
    for name, m in b.means.items():
        means[name] = means[name].merge(m) if name in means else m
    stats = copy.deepcopy(a.stats)
    for mine, theirs in zip(stats, b.stats):
        if mine is not None:
            mine.merge(theirs)
    return ShardState(
        index=min(a.index, b.index),
        observers=observers,
        means=means,
        samples=a.samples + b.samples,
        value_shapes=a.value_shapes,
        seconds=a.seconds + b.seconds,
        stats=stats,
        cpu_seconds=a.cpu_seconds + b.cpu_seconds,
    )


def merge_into(a: ShardState, b: ShardState) -> ShardState:
    """``merge_pair(a, b)`` that reuses ``a``'s arrays where it may: ``a`` is changed and
    returned. For a merge task whose inputs are its own deserialized copies (a Ray
    worker's): the histogram counts that unpickling rebuilt are writable and take ``b``'s
    counts in place; an observer whose counts are a read-only view (of an object store)
    is merged by copy. The same states as :func:`merge_pair`, bit for bit."""
    for name, obs in b.observers.items():
        mine = a.observers.get(name)
        if mine is None:
            a.observers[name] = obs
        elif mine.can_merge_in_place():
            a.observers[name] = mine.merge_in_place(obs)
        else:
            a.observers[name] = mine.merge(obs)
    for name, m in b.means.items():
        a.means[name] = a.means[name].merge(m) if name in a.means else m
    a.stats = [
        None if mine is None else copy.deepcopy(mine).merge(theirs) for mine, theirs in zip(a.stats, b.stats)
    ]
    a.index = min(a.index, b.index)
    a.samples += b.samples
    a.seconds += b.seconds
    a.cpu_seconds += b.cpu_seconds
    return a


# What balances the parts of split_state is the work on a part after the last shard of
# a job, the critical path's tail (docs/scale.md eq. (S7)): its last merge (read,
# add, write: proportional to the numbers held) and its results (finish_state), which
# add a range search per searched histogram whose cost barely depends on its size.
# Measured on EfficientNet-Lite0 (default recipe): a 3-way merge ~6.4 ns and a result
# ~2.3 ns a bin, plus ~0.8 ms a tensor to merge and ~2.7-3.5 ms a search (the weighted
# MSE's one per tensor, the MSE's of its 4096 bins alike): a search costs what ~350 k
# bins cost. Counted in bins alone, the 20 one-channel MSE tensors weigh nothing and
# land by threes on some parts: the slowest part's tail (3-way merge, results, write;
# CPU, least of 9) was 12 ms above the mean, 6 ms with the searches counted.
_SEARCH_COST = 350_000
# A channel mean's integer sum (~1100 bits, a Python int in an object array: pickled,
# read and added one by one) costs what ~96 histogram bins cost (pickled as a range of
# narrow integers, read into int32, added as arrays): measured on EfficientNet-Lite0's
# 21 k mean channels against its 19 M bins, ~10 ms against ~100 ms a shard.
_MEAN_COST = 96


def _searches(obs: ObserverBase) -> int:
    """How many range searches ``obs``'s result runs: one for the weighted MSE (a range
    per tensor, from the weighted sum of its channels), one a channel for the other
    histogram observers, none for the extrema-based ones."""
    if isinstance(obs, WeightedMSEObserver):
        return 1
    if isinstance(obs, HistogramObserver):
        return obs.channels or 1
    return 0


def _cost(obs: ObserverBase) -> int:
    """A state's weight in the tail of the merge (its last merge and its results), the
    same in every shard of a job: channels (fixed by the model) times bins (fixed by the
    recipe), plus its range searches; never the sample count."""
    return (obs.channels or 1) * int(getattr(obs, "bins", 1)) + _SEARCH_COST * _searches(obs)


def _mean_cost(m: ChannelMean | MeanResult) -> int:
    total = getattr(m, "total", None)
    return _MEAN_COST * (1 if total is None else max(1, int(total.size)))


def split_state(state: ShardState, parts: int) -> list[ShardState]:
    """``state`` cut into ``parts`` states over disjoint sets of tensors (observers and
    channel means), balanced by :func:`_cost` (largest first, each to the least loaded
    part, ties by name): a function of the names, channel counts and bins alone, so every
    shard of a job cuts alike and part p of every shard holds the same tensors. Each part
    keeps the shard's index and sample count; the first also the value shapes and time.
    Statistics (``stats``, GPTQ's) keep their positions: statistic i is held by part
    i mod ``parts``, the others hold None there.
    The reduce-scatter merge (docs/scale.md eq. (S3)) merges part p of all shards in one
    task; :func:`join_states` puts the merged parts together again."""
    parts = max(1, int(parts))
    keys = [(-_cost(obs), name, "o") for name, obs in state.observers.items()]  # type: ignore[arg-type]
    keys += [(-_mean_cost(m), name, "m") for name, m in state.means.items()]
    load, where = [0] * parts, {}
    for neg_cost, name, kind in sorted(keys):
        p = min(range(parts), key=lambda i: (load[i], i))
        load[p] -= neg_cost
        where[kind, name] = p
    return [
        ShardState(
            index=state.index,
            observers={n: o for n, o in state.observers.items() if where["o", n] == p},
            means={n: m for n, m in state.means.items() if where["m", n] == p},
            samples=state.samples,
            value_shapes=state.value_shapes if p == 0 else {},
            seconds=state.seconds if p == 0 else 0.0,
            cpu_seconds=state.cpu_seconds if p == 0 else 0.0,
            stats=[st if i % parts == p else None for i, st in enumerate(state.stats)],
        )
        for p in range(parts)
    ]


def join_states(parts: Sequence[ShardState]) -> ShardState:
    """The merged parts of :func:`split_state` as one state (they hold disjoint tensors
    and the same samples)."""
    if not parts:
        raise ValueError("join_states: no parts")
    head = parts[0]
    if any(p.samples != head.samples for p in parts):
        raise ValueError(f"join_states: parts of different samples {[p.samples for p in parts]}")
    out = ShardState(
        index=head.index,
        observers={},
        means={},
        samples=head.samples,
        value_shapes=head.value_shapes,
        seconds=head.seconds,
        cpu_seconds=head.cpu_seconds,
    )
    for p in parts:
        out.observers.update(p.observers)
        out.means.update(p.means)
    out.stats = [
        next((p.stats[i] for p in parts if p.stats[i] is not None), None) for i in range(len(head.stats))
    ]
    return out


def finish_state(state: ShardState) -> ShardState:
    """``state`` with every observer replaced by its result (range, extrema, degeneracy:
    :meth:`ObserverBase.result`, the moving average's log replayed first) and every
    channel mean by its mean (:meth:`ChannelMean.result`): what quantization reads, a
    few numbers a tensor. The Ray engine runs it on the worker that merges a part's last
    shard in (docs/scale.md eq. (S7)), so the range searches run there, one part on each
    worker, and the driver receives results instead of histograms. Statistics
    (``stats``) stay as they are."""
    return ShardState(
        index=state.index,
        observers={
            name: obs if isinstance(obs, ObserverResult) else _from_shards(obs).result()  # type: ignore[union-attr]
            for name, obs in state.observers.items()
        },
        means={name: m if isinstance(m, MeanResult) else m.result() for name, m in state.means.items()},
        samples=state.samples,
        value_shapes=state.value_shapes,
        seconds=state.seconds,
        stats=state.stats,
        cpu_seconds=state.cpu_seconds,
    )


def merge_run(*states: ShardState) -> ShardState:
    """``states`` (adjacent shards, in shard order) folded left with :func:`merge_into`
    into the first: what one reduce-scatter merge task runs on its own deserialized
    copies. One task per part instead of a tree of pairs: each input is read once."""
    if not states:
        raise ValueError("merge_run: no states")
    acc = states[0]
    for s in states[1:]:
        acc = merge_into(acc, s)
    return acc


def merge_states(states: Iterable[ShardState]) -> ShardState:
    """Fold shard states in shard-index order (whatever order they are given in)."""
    fold = ShardFold()
    for position, s in enumerate(sorted(states, key=lambda s: s.index)):
        fold(position, s)
    return fold.result()


def _for_shards(obs: ObserverBase) -> ObserverBase:
    """The state a shard keeps for ``obs``: the observer itself, except the moving
    average, whose shards keep the log of per-sample extrema (moving_average.py)."""
    if type(obs) is MovingAverageMinMaxObserver:
        return MovingAverageSteps(momentum=obs.momentum, axis=obs.axis)
    return obs


def _from_shards(obs: ObserverBase | ObserverResult) -> ObserverBase | ObserverResult:
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
    stats: Sequence[Any] = (),
    results: bool = False,
) -> CalibrationResult:
    """:func:`quanta.calibrate.runner.calibrate`, sharded over ``engine``: the same
    result, bit for bit, for any ``shards``. ``shards`` defaults to
    :func:`default_shards` (one per worker; up to ``SHARDS_PER_WORKER`` per worker for
    large sample counts; one for one worker).
    ``stats``: as calibrate's, with a ``merge`` that adds another shard's (exact) and a
    ``calls`` counter each shard starts at its first sample's index.
    ``results``: the observers' results instead of the observers
    (:class:`~quanta.calibrate.observer.ObserverResult`: ``range()``, ``extrema()``,
    ``degenerate(bits)``, each the observer's own) and the channel means divided
    (:func:`finish_state`), computed where the engine merges (Ray: on the workers, one
    part of the tensors each); what quantization needs, without the states."""
    from quanta.calibrate.readers import CalibrationDataError

    wanted = tuple(dict.fromkeys(tensors))
    refs = sample_refs(data, model.graph.inputs, preprocess=preprocess, limit=limit)
    if not refs:
        raise CalibrationDataError("calibration data is empty: no sample was read")
    if shards is not None and (not isinstance(shards, int) or shards < 1):
        raise ValueError(f"shards must be an integer >= 1, got {shards!r}")
    runs = split(len(refs), shards or default_shards(engine.workers, len(refs)))
    job = _Job(
        model=model,
        tensors=wanted,
        prototypes={name: _for_shards(make_observer(name)) for name in wanted},
        preprocess=preprocess,
        channel_means=dict(channel_means or {}),
        stats=tuple(stats),
        starts=tuple(r.start for r in runs),
        # one shard runs the whole model anyway: nothing to spare it
        prune=len(runs) > 1,
    )
    items = [(i, [refs[k] for k in r]) for i, r in enumerate(runs)]
    # the shards' value shapes lack a pruned job's tail: the driver records them instead
    shapes = _FirstShapes(model, refs[0], preprocess) if job.wire().pruned else None
    t0 = time.perf_counter()
    report = ShardProgress("calibrating", progress)

    def shown(done: int, total: int) -> None:
        # every shard submitted (progress(0, n)) or one done: the driver is free
        if shapes is not None and not isinstance(engine, InProcessEngine):
            shapes.start()
        report(done, total)

    reduce = getattr(engine, "reduce", None)
    finish = finish_state if results else None
    if reduce is not None:  # merged where the engine runs (Ray: reduce-scatter on the workers)
        merged = reduce(
            run_shard, job, items, merge_run, shown, split=split_state, join=join_states, finish=finish
        )
    else:  # folded here as the states arrive
        fold = ShardFold()
        engine.map(run_shard, job, items, shown, on_result=fold)
        merged = fold.result() if finish is None else finish(fold.result())
    out = CalibrationResult({name: _from_shards(merged.observers[name]) for name in wanted})
    out.value_shapes = merged.value_shapes if shapes is None else shapes.result()
    out.samples = merged.samples
    out.seconds = time.perf_counter() - t0
    out.shard_cpu_seconds = merged.cpu_seconds
    out.mean_states = merged.means
    out.stats = merged.stats
    return out
