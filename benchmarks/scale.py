"""Distributed calibration (quanta.scale) on EfficientNet-Lite0, 200 images: the overhead
of one Ray worker against calibrating in this process, what two Ray workers give on this
machine, and the scaling efficiency at N workers by simulation. Not a test.

Run (Ray and the model's export dependencies installed, see benchmarks/real_models)::

    python benchmarks/real_models/export.py --models efficientnet_lite0
    python benchmarks/scale.py [--images 200] [--reps 2] [--sim-workers 8] [--write benchmarks/results/...md]

Measured, on a local Ray cluster started here with as many CPUs as the largest Ray run
(1; 2 with ``--two-workers`` or ``--files``: an idle worker process costs CPU too) and
``ray.init`` before timing (the cluster's start-up is reported apart, it is paid once per
session, not per job):

Both sides run with one BLAS/OpenMP thread (a Ray task of ``num_cpus=1`` gets
``OMP_NUM_THREADS=1``; this script sets the same for itself before importing NumPy).

- ``T_in``: ``quanta.calibrate.runner.calibrate`` in this process, the exact work
  ``quantize_static`` does (the model prepared and planned as it prepares it);
- ``T_ray1``: ``calibrate_sharded`` with ``RayEngine(workers=1)``: one task calibrates
  all 200 images in a Ray worker (the job sent through the object store, the state sent
  back, merged here). Runs come in pairs, in the order AB BA AB ... (in-process, Ray),
  and the medians are compared: overhead = T_ray1 / T_in - 1 in wall time; in CPU time,
  the median over the pairs of (driver process CPU + Ray worker processes' CPU, read
  with psutil) / (the in-process calibrating thread's CPU), Ray's other processes
  (raylet, GCS, agents) reported apart for both windows; the worker's shard alone (its
  thread's CPU, ``ShardState.cpu_seconds``) against the in-process thread, and the
  engine's own steps (job and state pickled and read) timed alone;
- ``T_ray2``: two workers on this 2-core machine (shared with other jobs: indicative);
- the two files (in-process and Ray) are compared byte for byte.

Simulated N workers (``--sim-workers``), composed only of measured times plus an
explicit network model. For each k of ``--shards-per-worker`` the images are split into
S = k·N shards as quanta splits them; each shard calibrated here (in-process, the job
already prepared, as a worker's later shards run) gives its task time t_i (reading its
samples + calibration). Fixed costs: a worker prepares the job once (p: the job read,
the model built, the plan compiled, with an empty cache; CPU, least of 3); every task
(shard or merge) pays Ray's round trip r (a task that does nothing: wall time, the
median of 20, an overestimate on a loaded machine). Each message costs ``--latency``
and a link carries ``--gbps`` (each speed composed from the same measured times).

The calibration images are written once as ``.npz`` files (one per image, as a user's
calibration folder) and every run reads that folder: a shard travels as its paths, and
each worker reads its own samples (``--data memory`` sends the feeds with the tasks
instead).

The driver first builds the job (b: the model's tail cut, the model serialised without
its weights' data, the job pickled as Ray's serialiser pickles it, protocol 5 with the
weights' arrays as out-of-band buffers; CPU, timed on a fresh job; the object store's
copy of the job is not charged, one copy of its bytes either way), which then reaches the
N workers by doubling, each
machine that has it serving one more per round (what an object store that serves copies
from every node allows: J = b + ⌈log₂(N+1)⌉·|job|/bw + latency); nothing starts before J.
With more than one shard the job leaves out the model's tail (the nodes no observed value
depends on: ``cut_tail``), and the driver records the value shapes of the data's first
sample with the whole model (``first_value_shapes``: its CPU, least of 3) in a thread
while the shards run: charged as driver work from b on, T_N no earlier than its end.
The same shards are also composed with the job carrying its weights inside the model's
bytes (built, sized and prepared here too) and with the whole model's job:
an A/B inside one run, only the job's terms differ.

Scheduling (docs/scale.md eq. (S4)): the shard tasks are submitted in shard order and
every worker runs one task at a time; a worker that frees takes the ready task submitted
first (list scheduling: what Ray does with tasks of ``num_cpus=1`` on one-CPU workers,
taken here as first-in first-out, so merge tasks, submitted as their inputs appear, wait
behind the shards not yet started). A shard task takes p (its worker's first task only)
+ t_i + its state's cost (cut and pickled, timed here) + r. Three merges are composed:

- **reduce-scatter** (the Ray engine, docs/scale.md eq. (S3)): shard i's state cut into
  P = N parts (each pickled: timed), the parts staying on its worker; each part merged
  by adjacent runs as they appear (``AdjacentMerges``: two runs, or three when both
  neighbours of a new run wait); a merge is a task on the worker that takes it, its
  inputs on other workers crossing the links first (|part|/bw + latency each, a link
  carrying one message at a time each way); it takes m (timed here on the real parts:
  read them, ``merge_run``, write the result, each distinct merge run once) + r. The
  merge that completes a part also computes its results (``finish_state``: ranges,
  extrema, degeneracy, means; docs/scale.md eq. (S7), timed with the merge) and writes
  them instead of the state; the P results cross to the driver one at a time and are
  read there (timed): T_N is the last of those. Composed also as before (S7) ("states to
  the driver"): the P merged parts cross and are read, then the driver computes the
  results of their join (timed).
- **tree** (docs/scale.md eq. (S2)): the tree of adjacent pairs over the S whole states
  (each pickled with its shard: timed), each merge a task as above (read 2, merge, write
  1: timed); the root crosses to the driver and is read there, then its results are
  computed (timed on the whole merged state).
- **driver fold** (the in-process and local engines' ``ShardFold``): the states cross the
  driver's link one at a time in the order their shards end, and fold step i (the state
  read and folded in shard order, timed here) ends at f_i = max(f_{i-1}, a_i) + m_i;
  T_N = f_S + the results of the folded state (timed).

Each k is also composed with every t_i = T_in / S (no spread), and as a what-if that the
engine does not implement: each worker calibrating all the shards it is handed into one
state (the shards list-scheduled at t_i + r, then one state a worker, cut and merged as
the k = 1 shards' states are).

The network, stated: N worker machines and the driver, each with one full-duplex link
of ``--gbps`` to a non-blocking switch (any two machines talk at that speed, a link
carries one message at a time in each direction), each message paying ``--latency``;
no compression, no overlap of a transfer with the compute of its own machine beyond the
order above. The calibration samples are read where each worker runs (a folder on
storage every worker mounts, as a user's calibration set is) and their reading is part
of t_i, not of the network; the job (the model, 18.7 MB here) is sent over the links.

The compute terms (T_in, t_i, p, the states' costs, the merges, the driver's reads) are
CPU seconds of this thread (``time.thread_time``: one core's time, which other jobs
sharing the machine do not inflate as they inflate wall time; the calibration is
single-threaded); r is wall time
(Ray's own work is spread over several processes). CPU time still moves between minutes
on a shared VM (SMT siblings, caches): the same 25-image shard measures 15-30 % apart.
So T_in and every t_i are measured in ``--shard-reps`` rounds (the whole in-process
calibration, then every shard of every k, in an order rotated by one each round) and each is
estimated over its rounds (``--estimate``: the median by default; ``min`` the least).
All shards hold the same number of images of the same size (``split``: sizes differ by
at most one sample), so they are balanced by samples and bytes alike; what differs
between their estimates is what the rounds could not average out, and it is charged to
T_N as measured (each shard's estimate, in the schedule), not smoothed.

A fresh process pays once what a warm one does not: the pages of its observers' state
(~77 MB of int32 counts on EfficientNet-Lite0, faulted in as the first samples land in
them) and first-run warm-ups. t_i and T_in are measured in this warm process; the cold
start c (``--cold-probes`` fresh processes run shard 0 three times: the first run less
the least of the two after it, CPU, median) is charged in the column "cold processes":
once to the in-process run (T_in + c) and once to each worker's first shard (p + c), as
a quantization run in a new process and a job's first shard on each worker pay it.

efficiency(N) = T_in / (N · T_N) (docs/scale.md eq. (S8)), with T_in the in-process run to
what quantization reads: ``calibrate`` then every observer's result and mean (T_cal + T_R,
both timed in the same rounds), and T_N until the driver holds the results. The table also
gives T_cal / (N · T_N') with T_N' the states-to-the-driver composition without the
driver's results: the earlier notes' definition, for comparison. It assumes N identical
machines (each worker a core like this one).
"""

from __future__ import annotations

import os

# One BLAS / OpenMP thread in this process too: Ray gives a task of num_cpus=1 one thread
# (OMP_NUM_THREADS=1), so "one worker" and "in-process" then do the same work on one core.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
# Ray starts its workers at niceness 15: on a machine with any other load they yield to
# every process of niceness 0 (this driver included), and "one Ray worker" then measures
# the scheduler, not the engine. The workers get the driver's priority here.
os.environ.setdefault("RAY_worker_niceness", "0")

import argparse  # noqa: E402
import heapq  # noqa: E402
import itertools  # noqa: E402
import math  # noqa: E402
import pickle  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Callable, Iterable  # noqa: E402
from dataclasses import fields  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "real_models"))

import quanta  # noqa: E402
from quanta.calibrate.readers import sample_refs  # noqa: E402
from quanta.calibrate.runner import calibrate  # noqa: E402
from quanta.ir.onnx_io import to_proto  # noqa: E402
from quanta.quantize.qdq import bias_correction_inputs, consumer_channel_weights, plan_qdq  # noqa: E402
from quanta.quantize.recipe import CalibrationMethod, Recipe  # noqa: E402
from quanta.quantize.static import (  # noqa: E402
    load_for_quantization,
    make_observer_factory,
    prepare_float_graph,
)
from quanta.scale import (  # noqa: E402
    RayEngine,
    ShardFold,
    ShardState,
    calibrate_sharded,
    tree_reduce,
)
from quanta.scale.calibrate import (  # noqa: E402
    _PREPARED,
    SHARDS_PER_WORKER,
    _for_shards,
    _Job,
    _JobWire,
    cut_tail,
    finish_state,
    first_value_shapes,
    join_states,
    merge_run,
    run_shard,
    split,
    split_state,
)
from quanta.scale.calibrate import prepared as prepared_job  # noqa: E402
from quanta.scale.engines import AdjacentMerges  # noqa: E402


def prepared(path: Path):
    """The model, tensors, observer factory and channel means quantize_static calibrates with."""
    recipe = Recipe()
    model = load_for_quantization(str(path))
    prepare_float_graph(model)
    plan = plan_qdq(model.graph, recipe)
    weights = (
        consumer_channel_weights(model.graph, plan) if recipe.method is CalibrationMethod.WEIGHTED_MSE else {}
    )
    return (
        model,
        plan.activations_to_calibrate(),
        make_observer_factory(recipe, weights),
        bias_correction_inputs(plan),
    )


def _noop() -> None:
    return None


def _ray_cpu() -> dict[int, tuple[str, float]]:
    """pid -> (process title, user + system CPU seconds) of every process below this one
    (the local Ray cluster: GCS, raylet, agents, workers); {} without psutil."""
    try:
        import psutil
    except ImportError:
        return {}
    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            with p.oneshot():
                title = (p.cmdline() or [""])[0]
                t = p.cpu_times()
            out[p.pid] = (title, t.user + t.system)
        except psutil.Error:
            continue
    return out


def _cpu_delta(before: dict, after: dict) -> tuple[float, float]:
    """CPU seconds spent between two :func:`_ray_cpu` readings by the Ray worker processes
    (titled ``ray::<task>`` or ``ray::IDLE``) and by Ray's other processes."""
    workers = system = 0.0
    for pid, (title, cpu) in after.items():
        d = cpu - before.get(pid, (title, 0.0))[1]
        if title.startswith("ray::") and "Agent" not in title:
            workers += d
        else:
            system += d
    return workers, system


def _oob_dumps(obj: object) -> tuple[bytes, list[memoryview]]:
    """``obj`` pickled as Ray's serialiser pickles it: protocol 5, its arrays' buffers out
    of band (copied only into the object store, which the driver pays for the whole job
    alike, weights inline or apart: not charged)."""
    bufs: list[pickle.PickleBuffer] = []
    blob = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    return blob, [b.raw() for b in bufs]


def _oob_size(blob: bytes, bufs: list[memoryview]) -> int:
    """What crosses a link: the pickle and its out-of-band buffers."""
    return len(blob) + sum(b.nbytes for b in bufs)


def _inline_wire(job: _Job) -> _JobWire:
    """The job with its weights inside the model's ONNX bytes (the A/B reference of the
    simulation): the weights copied into the proto, its serialisation and the pickle of
    those bytes; pruned as the engine prunes it."""
    rest = {f.name: getattr(job, f.name) for f in fields(job) if f.name != "model"}
    proto = to_proto(job.model)
    if job.prune:
        cut_tail(proto, [*job.tensors, *job.channel_means, *(st.x_name for st in job.stats)])
    return _JobWire(uuid.uuid4().hex, proto.SerializeToString(), rest)


def _cold(job_blob: bytes, bufs: list[memoryview] | None = None) -> Callable[[], object]:
    """A worker's first shard of a job: the job read and prepared with an empty cache."""

    def run() -> object:
        _PREPARED.clear()
        return prepared_job(pickle.loads(job_blob, buffers=bufs))

    return run


def _fixed_costs(model, tensors, make, means_for, result) -> dict[str, float]:
    """What one Ray worker adds to the in-process run, each step alone (CPU, least of 5):
    the job built and pickled as Ray pickles it (driver: a fresh job each time, its wire
    is cached on the job) and read (worker), the whole state pickled (worker) and read
    (driver). Ray's own dispatch is the no-op round trip, reported with the simulation."""
    prototypes = {n: _for_shards(make(n)) for n in tensors}

    def fresh() -> _Job:
        return _Job(
            model=model,
            tensors=tuple(tensors),
            prototypes=prototypes,
            preprocess=None,
            channel_means=dict(means_for),
        )

    job = fresh()
    state = ShardState(
        index=0, observers=dict(result), means=result.mean_states, samples=result.samples, stats=[]
    )

    def least(fn) -> float:
        best = math.inf
        for _ in range(5):
            t = time.thread_time()
            fn()
            best = min(best, time.thread_time() - t)
        return best

    job_blob, job_bufs = _oob_dumps(job)
    state_blob = pickle.dumps(state, protocol=5)
    return {
        "job built and pickled": least(lambda: _oob_dumps(fresh())),
        "job read and prepared (model built, plan compiled)": least(_cold(job_blob, job_bufs)),
        "state pickled": least(lambda: pickle.dumps(state, protocol=5)),
        "state read": least(lambda: pickle.loads(state_blob)),
    }


def _cold_probe(path: str) -> int:
    """(A subprocess of this script.) A fresh process's shard, cold then warm: the job
    prepared first (p, charged apart), then the same shard three times; prints the CPU
    seconds of each (ShardState.cpu_seconds: the calibration alone). The first pays
    what a process pays once per job: the pages of its observers' state (~77 MB of
    int32 counts, np.zeros: each page faulted in where a sample's bins land first) and
    first-run warm-ups; a warm process (this benchmark's, where t_i is measured) mostly
    reuses memory its allocator kept."""
    with open(path, "rb") as f:
        job_blob, item = pickle.load(f)
    job = pickle.loads(job_blob)
    prepared_job(job)
    print(" ".join(f"{run_shard(job, item).cpu_seconds:.6f}" for _ in range(3)))
    return 0


def _cold_start(job: _Job, item, probes: int) -> tuple[float, list[tuple[float, ...]]]:
    """What a fresh process's first shard costs more than the same shard in a warm one
    (CPU seconds, median over ``probes`` fresh processes, each: the first run less the
    mean of the two after it; less their least would be biased up by the noise of a
    run, 15-30 % on this VM). Both sides pay it once a process: the in-process run
    once, each worker once, its first shard (docs/scale.md eq. (S5))."""
    import subprocess

    extra = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.pkl"
        path.write_bytes(pickle.dumps((pickle.dumps(job, protocol=5), item), protocol=5))
        for _ in range(probes):
            out = subprocess.run(
                [sys.executable, __file__, "--cold-probe", str(path)],
                check=True,
                capture_output=True,
                text=True,
                env=os.environ,
            ).stdout.split()
            runs = tuple(float(v) for v in out[-3:])
            extra.append(runs)
    return max(0.0, statistics.median(r[0] - statistics.fmean(r[1:]) for r in extra)), extra


def _results_of(result) -> None:
    """What quantization reads from an in-process calibration: each observer's results
    (range, extrema, degeneracy) and the channel means divided (finish_state's work)."""
    for obs in result.values():
        obs.result()
    for m in result.mean_states.values():
        m.result()


def list_schedule(
    workers: int,
    start: float,
    tasks: list,
    execute: Callable[[Any, int, float], float],
    complete: Callable[[Any, int, float], list],
) -> None:
    """Greedy list scheduling, what Ray does with tasks of ``num_cpus=1`` on one-CPU
    workers: a worker that frees takes the ready task submitted first (``tasks`` at
    ``start``, in order; then what ``complete`` returns, submitted when the task that
    made it ready ends). ``execute(task, worker, now)`` -> its end;
    ``complete(task, worker, end)`` -> the tasks it makes ready. Completions are handled
    before dispatches at the same moment."""
    seq = itertools.count()
    ready = [(start, next(seq), t) for t in tasks]
    heapq.heapify(ready)
    free = [(start, w) for w in range(workers)]
    heapq.heapify(free)
    running: list = []
    while ready or running:
        dispatch_at = max(free[0][0], ready[0][0]) if free and ready else math.inf
        if running and running[0][0] <= dispatch_at:
            end, _, task, w = heapq.heappop(running)
            heapq.heappush(free, (end, w))
            for t in complete(task, w, end):
                heapq.heappush(ready, (end, next(seq), t))
            continue
        _, w = heapq.heappop(free)
        _, _, task = heapq.heappop(ready)
        heapq.heappush(running, (execute(task, w, dispatch_at), next(seq), task, w))


class _Composition:
    """The makespan of S shards on N simulated workers, composed from measured times
    (see the module docstring): the shards' states are cut and pickled here (timed), and
    every merge a schedule asks for is run here once on the real states (timed, cached:
    a merge of the same runs is the same work at every link speed)."""

    def __init__(
        self,
        n: int,
        states: Iterable,
        job_bytes: int,
        trip: float,
        job_prep: float,
        lat: float,
        build: float,
        shapes: float = 0.0,
    ):
        self.n, self.trip, self.job_prep, self.lat, self.build = n, trip, job_prep, lat, build
        self.job_bytes = job_bytes
        # a pruned job: the driver records the first sample's value shapes from b on
        self.shapes_end = build + shapes if shapes else 0.0
        self.parts, self.cut, self.whole, self.pack = [], [], [], []
        for st in states:
            t = time.thread_time()
            self.parts.append([pickle.dumps(x, protocol=5) for x in split_state(st, n)])
            self.cut.append(time.thread_time() - t)
            t = time.thread_time()
            self.whole.append(pickle.dumps(st, protocol=5))
            self.pack.append(time.thread_time() - t)
        self.s = len(self.whole)  # the states themselves are not kept (77 MB each in memory)
        fold = ShardFold()  # the driver's fold steps: read a state, fold it in shard order
        self.steps = []
        for i, blob in enumerate(self.whole):
            t = time.thread_time()
            fold(i, pickle.loads(blob))
            self.steps.append(time.thread_time() - t)
        # the results (ranges, extrema, means) of the whole merged state, computed in one
        # place: what the driver does after a fold, a tree's root or joined states (CPU)
        t = time.thread_time()
        finish_state(fold.result())
        self.finish_whole = time.thread_time() - t
        self.merge_cache: dict = {}

    def release(self) -> None:
        self.parts = self.whole = []
        self.merge_cache = {}

    def _merge(self, key, blobs: list[bytes], finish: bool = False) -> tuple[float, bytes]:
        """A merge task as on a Ray worker: read the inputs, merge_run, (the merge that
        completes a part, with ``finish``: its results, finish_state) write the result."""
        key = (key, finish)
        hit = self.merge_cache.get(key)
        if hit is None:
            t = time.thread_time()
            merged = merge_run(*(pickle.loads(b) for b in blobs))
            out = pickle.dumps(finish_state(merged) if finish else merged, protocol=5)
            hit = self.merge_cache[key] = (time.thread_time() - t, out)
        return hit

    def _network(self, bw: float):
        links: dict = {}

        def transfer(src: int, dst: int, ready: float, size: int) -> float:
            """Arrival at ``dst`` (-1: the driver) of ``size`` bytes ready on ``src``,
            after the messages already on both links (reserved for this one)."""
            if src == dst:
                return ready
            begin = max(ready, links.get(("out", src), 0.0), links.get(("in", dst), 0.0))
            links["out", src] = links["in", dst] = begin + size / bw
            return begin + size / bw + self.lat

        return transfer

    def _job(self, bw: float) -> float:
        """The job built on the driver (serialised, its digest: timed), then sent to the N
        workers by doubling."""
        return self.build + math.ceil(math.log2(self.n + 1)) * self.job_bytes / bw + self.lat

    def _shard_end(self, prepared_on: set, w: int, now: float, t_i: float, state_cost: float) -> float:
        first = self.job_prep if w not in prepared_on else 0.0
        prepared_on.add(w)
        return now + first + t_i + state_cost + self.trip

    def reduce_scatter(self, times: list[float], bw: float, results: bool = True) -> dict:
        """Eq. (S3) with S shards: a shard's P = N parts stay on its worker; each part is
        merged by adjacent runs as they appear (AdjacentMerges), every merge a task on the
        worker that frees first, its inputs from other workers crossing the links; the P
        roots cross to the driver, which reads them (timed). ``results`` (eq. (S7)): the
        merge that completes a part also computes its results (finish_state, timed with
        the merge) and the roots are results; else the roots are merged states and the
        driver computes the results of their join (timed) after reading them."""
        n, s = self.n, self.s
        transfer, job = self._network(bw), self._job(bw)
        prepared_on: set = set()
        merges = [AdjacentMerges() for _ in range(n)]
        finals: list = []
        acc = {"merge_cpu": 0.0, "merges": 0, "busy": 0.0, "last_shard": 0.0, "path": {}}

        def execute(task, w, now):
            if task[0] == "shard":
                i = task[1]
                first = self.job_prep if w not in prepared_on else 0.0
                end = self._shard_end(prepared_on, w, now, times[i], self.cut[i])
                if end > acc["last_shard"]:  # the last shard's terms (the critical path's head)
                    acc["path"] = {"start": now, "prep": first, "t_i": times[i], "cut": self.cut[i]}
                acc["last_shard"] = max(acc["last_shard"], end)
                acc["busy"] += end - now
                return end
            _, p, runs = task
            start = now
            for _, _, (at, v, blob) in sorted(runs, key=lambda r: r[2][0]):
                start = max(start, transfer(v, w, at, len(blob)))
            final = results and (runs[0][0], runs[-1][1]) == (0, s - 1)
            m, _ = self._merge((p, tuple((lo, hi) for lo, hi, _ in runs)), [r[2][2] for r in runs], final)
            acc["merge_cpu"] += m
            acc["merges"] += 1
            acc["busy"] += m + self.trip
            return start + m + self.trip

        def complete(task, w, end):
            if task[0] == "shard":
                i = task[1]
                outs = [(p, i, i, self.parts[i][p]) for p in range(n)]
            else:
                _, p, runs = task
                final = results and (runs[0][0], runs[-1][1]) == (0, s - 1)
                key = ((p, tuple((lo, hi) for lo, hi, _ in runs)), final)
                outs = [(p, runs[0][0], runs[-1][1], self.merge_cache[key][1])]
            new = []
            for p, lo, hi, blob in outs:
                if (lo, hi) == (0, s - 1):
                    finals.append((end, w, blob))
                    continue
                joined = merges[p].add(lo, hi, (end, w, blob))
                if joined is not None:
                    new.append(("merge", p, joined))
            return new

        list_schedule(n, job, [("shard", i) for i in range(s)], execute, complete)
        drv, read, got = 0.0, 0.0, []
        for at, w, blob in sorted(finals, key=lambda f: f[0]):
            t = time.thread_time()
            got.append(pickle.loads(blob))
            dt = time.thread_time() - t
            drv = max(drv, transfer(w, -1, at, len(blob))) + dt
            read += dt
        fin = 0.0
        if not results:  # the driver computes the results of the joined state
            t = time.thread_time()
            finish_state(join_states(got))
            fin = time.thread_time() - t
            drv += fin
        roots = max(f[0] for f in finals)
        drv = max(drv, self.shapes_end)
        acc.update(
            T=drv,
            job=job,
            tail=drv - acc["last_shard"],
            merging_after=roots - acc["last_shard"],
            driver_read=read,
            driver_finish=fin,
            driver_bytes=sum(len(f[2]) for f in finals),
            driver_after=drv - roots,
        )
        return acc

    def tree(self, times: list[float], bw: float) -> dict:
        """Eq. (S2) with S leaves: the tree of adjacent pairs (tree_reduce), each merge a
        task (read 2 whole states, merge, write 1) submitted when both inputs exist, on
        the worker that frees first; the root crosses to the driver and is read there."""
        n, s = self.n, self.s
        transfer, job = self._network(bw), self._job(bw)
        prepared_on: set = set()
        parent: dict = {}
        order = itertools.count(s)

        def pair(a, b):
            node = next(order)
            parent[a], parent[b] = (node, 0), (node, 1)
            return node

        root = tree_reduce(list(range(s)), pair) if s > 1 else 0
        have: dict = {}
        acc = {"merge_cpu": 0.0, "merges": 0}
        out: dict = {}

        def execute(task, w, now):
            if task[0] == "shard":
                i = task[1]
                return self._shard_end(prepared_on, w, now, times[i], self.pack[i])
            _, node, (a, b) = task
            start = now
            for at, v, blob in sorted((a, b), key=lambda r: r[0]):
                start = max(start, transfer(v, w, at, len(blob)))
            m, _ = self._merge(("tree", node), [a[2], b[2]])
            acc["merge_cpu"] += m
            acc["merges"] += 1
            return start + m + self.trip

        def complete(task, w, end):
            node = task[1]
            blob = self.whole[node] if task[0] == "shard" else self.merge_cache[("tree", node), False][1]
            if node == root:
                out["root"] = (end, w, blob)
                return []
            up, side = parent[node]
            have.setdefault(up, [None, None])[side] = (end, w, blob)
            if None in have[up]:
                return []
            return [("merge", up, tuple(have.pop(up)))]

        list_schedule(n, job, [("shard", i) for i in range(s)], execute, complete)
        at, w, blob = out["root"]
        t = time.thread_time()
        pickle.loads(blob)
        # the root's results (finish_state of the whole state), charged after its read
        acc["T"] = max(
            self.shapes_end, transfer(w, -1, at, len(blob)) + time.thread_time() - t + self.finish_whole
        )
        return acc

    def worker_loads(self, times: list[float]) -> list[float]:
        """When each worker finishes the shards list scheduling hands it, after the job,
        if a shard cost only its samples and Ray's round trip (no state of its own)."""
        prepared_on: set = set()
        last = [0.0] * self.n

        def execute(task, w, now):
            return self._shard_end(prepared_on, w, now, times[task[1]], 0.0)

        def complete(task, w, end):
            last[w] = max(last[w], end)
            return []

        list_schedule(self.n, 0.0, [("shard", i) for i in range(self.s)], execute, complete)
        return last

    def driver_fold(self, times: list[float], bw: float) -> dict:
        """The in-process and local engines' ShardFold: the shards list-scheduled on the
        workers (each state pickled there), the states crossing the driver's link one at
        a time as they are done, each folded in shard order (steps timed)."""
        transfer, job = self._network(bw), self._job(bw)
        prepared_on: set = set()
        done: dict = {}

        def execute(task, w, now):
            return self._shard_end(prepared_on, w, now, times[task[1]], self.pack[task[1]])

        def complete(task, w, end):
            done[task[1]] = (end, w)
            return []

        list_schedule(self.n, job, [("shard", i) for i in range(self.s)], execute, complete)
        arrive = {}
        for i in sorted(done, key=lambda i: done[i][0]):
            arrive[i] = transfer(done[i][1], -1, done[i][0], len(self.whole[i]))
        merged = 0.0
        for i in range(self.s):
            merged = max(merged, arrive[i]) + self.steps[i]
        return {"T": max(self.shapes_end, merged + self.finish_whole)}  # then the fold's results, here


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--reps", type=int, default=2, help="alternating in-process / Ray runs of each")
    ap.add_argument(
        "--sim-workers", default="8", help="comma-separated N (each costs one pass over the images)"
    )
    ap.add_argument("--two-workers", action="store_true", help="also time 2 Ray workers on this machine")
    ap.add_argument("--files", action="store_true", help="also compare the quantized files (two more passes)")
    ap.add_argument(
        "--gbps", default="1,10,25", help="link speeds to compose the simulation with (Gb/s, comma-separated)"
    )
    ap.add_argument(
        "--shard-reps", type=int, default=5, help="rounds of the in-process run and every simulated shard"
    )
    ap.add_argument(
        "--estimate",
        choices=("median", "min"),
        default="median",
        help="how T_in and each t_i are estimated from the rounds' CPU times",
    )
    ap.add_argument(
        "--shards-per-worker",
        default=str(SHARDS_PER_WORKER),
        help="k, comma-separated: simulate S = k x N shards handed out as workers free up "
        f"(default: the engine's, {SHARDS_PER_WORKER})",
    )
    ap.add_argument("--latency", type=float, default=1e-3, help="seconds per message")
    ap.add_argument("--write", type=Path, help="also write the report (markdown) here")
    ap.add_argument(
        "--data",
        choices=("files", "memory"),
        default="files",
        help="calibration images as a folder of .npz files (default) or feeds sent with the tasks",
    )
    ap.add_argument(
        "--cold-probes",
        type=int,
        default=3,
        help="fresh processes that time a cold first shard (0: charge no cold start)",
    )
    ap.add_argument("--cold-probe", help=argparse.SUPPRESS)  # internal: the subprocess of _cold_start
    args = ap.parse_args(argv)
    if args.cold_probe:
        return _cold_probe(args.cold_probe)

    import ray
    from accuracy import image_data
    from export import DEFAULT_CACHE, EFFICIENTNET, model_paths

    _, prep = model_paths(DEFAULT_CACHE, EFFICIENTNET)
    if not prep.exists():
        print(f"{prep} missing: run benchmarks/real_models/export.py --models {EFFICIENTNET}")
        return 1
    feeds, _ = image_data(args.images, 0, 1)
    model, tensors, make, means_for = prepared(prep)
    folder = tempfile.TemporaryDirectory()
    if args.data == "files":
        for i, f in enumerate(feeds):
            np.savez(Path(folder.name) / f"img{i:06d}.npz", **f)
        calib: object = folder.name
        refs = sample_refs(folder.name, model.graph.inputs)
    else:
        calib = feeds
        refs = [("feed", f) for f in feeds]
    lines: list[str] = []

    def say(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    say(
        f"EfficientNet-Lite0 ({prep.name}), {len(feeds)} images 1x3x224x224 ({args.data}), "
        f"{len(tensors)} tensors observed, {len(means_for)} channel means; default recipe (weighted_mse)"
    )
    say(
        f"{platform.processor() or platform.machine()}, {platform.system()}, Python {platform.python_version()}, "
        f"ray {ray.__version__}, numpy {np.__version__}"
    )
    say(
        f"load average at the start (1, 5, 15 min): {', '.join(f'{v:.1f}' for v in os.getloadavg())} on {os.cpu_count()} CPUs"
    )
    t0 = time.perf_counter()
    # as many CPUs as the largest Ray run here: Ray keeps a worker process per CPU, and an
    # idle one burns ~10 ms/s of CPU (measured), which a 1-worker job on a 2-CPU cluster
    # would be charged with among its worker processes
    cpus = 2 if args.two_workers or args.files else 1
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    say(
        f"ray.init (local cluster, {cpus} CPU{'s' if cpus > 1 else ''}): {time.perf_counter() - t0:.2f} s "
        "(once per session, not counted below)"
    )

    kw = dict(progress=False, channel_means=means_for)
    # a worker process is started and imports quanta once per cluster, not once per job:
    # one small job first, so the timed runs see a warm worker (as jobs after the first do)
    t = time.perf_counter()
    calibrate_sharded(model, tensors, feeds[:1], make, engine=RayEngine(1), **kw)
    say(
        f"warm-up job (1 image; starts a worker, imports quanta): {time.perf_counter() - t:.2f} s, not counted"
    )
    # Pairs of runs, in-process and Ray, in the order AB BA AB ... (a drift of the machine
    # over the minutes then falls on both sides alike). Wall seconds, and CPU seconds:
    # in-process, the calibrating thread's; Ray, the driver process's (its Ray threads
    # included) plus the worker processes' (psutil, every thread), Ray's other processes
    # (raylet, GCS, agents) reported apart, and measured in the in-process window too.
    t_in, t_ray1, cpu_in, cpu_ray1, shard_cpu = [], [], [], [], []
    results = {}
    for rep in range(args.reps):
        order = ("in", "ray") if rep % 2 == 0 else ("ray", "in")
        row = {}
        for side in order:
            before, t, c = _ray_cpu(), time.perf_counter(), time.thread_time()
            d = time.process_time()  # the driver's Ray threads included
            if side == "in":
                results["in"] = calibrate(model, tensors, calib, make, **kw)
                row["in"] = (time.perf_counter() - t, time.thread_time() - c, *_cpu_delta(before, _ray_cpu()))
            else:
                results["ray1"] = calibrate_sharded(model, tensors, calib, make, engine=RayEngine(1), **kw)
                wall, driver = time.perf_counter() - t, time.process_time() - d
                row["ray"] = (wall, driver, *_cpu_delta(before, _ray_cpu()))
        wall_in, c_in, _, sys_in = row["in"]
        wall_ray, driver, workers, sys_ray = row["ray"]
        t_in.append(wall_in)
        cpu_in.append(c_in)
        t_ray1.append(wall_ray)
        cpu_ray1.append(driver + workers)
        shard_cpu.append(results["ray1"].shard_cpu_seconds)
        say(
            f"  pair {rep} ({' then '.join(order)}): in-process {wall_in:.2f} s wall, {c_in:.2f} s CPU "
            f"(Ray's other processes {sys_in:.2f} s) | Ray 1 worker {wall_ray:.2f} s wall, CPU driver "
            f"{driver:.2f} s + worker {workers:.2f} s (its shard {shard_cpu[-1]:.2f} s) = {cpu_ray1[-1]:.2f} s "
            f"(Ray's other processes {sys_ray:.2f} s) | CPU ratio {cpu_ray1[-1] / c_in:.3f}, load "
            f"{os.getloadavg()[0]:.1f}"
        )
    same = bool(results) and all(results["in"][n].to_dict() == results["ray1"][n].to_dict() for n in tensors)
    m_in, m_ray1 = (statistics.median(t_in), statistics.median(t_ray1)) if t_in else (math.nan, math.nan)
    overhead = m_ray1 / m_in - 1
    cpu_ratio = statistics.median(r / c for r, c in zip(cpu_ray1, cpu_in)) if cpu_in else math.nan
    shard_ratio = statistics.median(s / c for s, c in zip(shard_cpu, cpu_in)) if cpu_in else math.nan
    fixed = _fixed_costs(model, tensors, make, means_for, results["in"]) if "in" in results else {}
    t_ray2, same2, files_same = None, None, None
    if args.two_workers:
        t = time.perf_counter()
        ray2 = calibrate_sharded(model, tensors, calib, make, engine=RayEngine(2), **kw)
        t_ray2 = time.perf_counter() - t
        same2 = all(results["in"][n].to_dict() == ray2[n].to_dict() for n in tensors)
    if args.files:
        with tempfile.TemporaryDirectory() as tmp:
            a, b = Path(tmp) / "in.onnx", Path(tmp) / "ray.onnx"
            quanta.quantize_static(str(prep), str(a), calib, verbose=False)
            quanta.quantize_static(str(prep), str(b), calib, verbose=False, engine="ray", workers=2)
            files_same = a.read_bytes() == b.read_bytes()
    # Ray's own cost per task, as a round trip of a task that does nothing (wall time, the
    # median of 20 after a warm one: on a loaded machine an overestimate)
    noop = ray.remote(num_cpus=1)(_noop)
    ray.get(noop.remote())
    trips = []
    for _ in range(20):
        t = time.perf_counter()
        ray.get(noop.remote())
        trips.append(time.perf_counter() - t)
    ray_trip = statistics.median(trips)
    ray.shutdown()

    say()
    say("| run | seconds (median) | vs in-process |")
    say("|---|---:|---:|")
    say(f"| in-process `calibrate` | {m_in:.2f} | 1.000 |")
    say(f"| Ray, 1 worker | {m_ray1:.2f} | {m_ray1 / m_in:.3f} (overhead {overhead * 100:+.1f} %) |")
    say(
        f"| Ray, 1 worker, CPU (driver + worker processes) / in-process thread CPU, median of the pairs "
        f"| | {cpu_ratio:.3f} (overhead {(cpu_ratio - 1) * 100:+.1f} %) |"
    )
    say(f"| the worker's shard alone (its thread's CPU) / in-process thread CPU | | {shard_ratio:.3f} |")
    if t_ray2 is not None:
        say(f"| Ray, 2 workers (2 shared cores) | {t_ray2:.2f} | speed-up {m_in / t_ray2:.2f}x |")
    say()
    say()
    if fixed:  # --reps 0: the simulation alone
        say(
            "Engine costs of one worker that the in-process run does not pay, each timed alone (CPU, least of 5): "
            + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in fixed.items())
            + f"; together {sum(fixed.values()):.3f} s = {sum(fixed.values()) / statistics.median(cpu_in) * 100:.1f} % "
            "of the in-process CPU time (median)"
        )
    say(
        f"observer states identical to in-process: 1 worker {same if results else 'not compared (--reps 0)'}"
        + ("" if same2 is None else f", 2 workers {same2}")
        + (
            ""
            if files_same is None
            else f"; quantized files (in-process vs Ray, 2 workers) byte-identical: {files_same}"
        )
    )

    # ---- simulation
    # fixed costs: a worker prepares the job once (reads the job as it travels, builds the
    # model, compiles its plan: quanta.scale.calibrate.prepared with a cold cache; CPU,
    # least of 3); every task pays Ray's round trip (the no-op's, above)
    prototypes = {n: _for_shards(make(n)) for n in tensors}

    def make_job(starts: tuple[int, ...], prune: bool | None = None) -> _Job:
        # pruned as calibrate_sharded prunes: when there is more than one shard
        return _Job(
            model=model,
            tensors=tuple(tensors),
            prototypes=prototypes,
            preprocess=None,
            channel_means=dict(means_for),
            starts=starts,
            prune=len(starts) > 1 if prune is None else prune,
        )

    def job_costs(prune: bool, inline: bool = False) -> dict[str, Any]:
        """The driver builds the job before anything is sent: the model serialised (pruned:
        its tail cut first), the pickle as Ray pickles it (out-of-band buffers; a fresh job
        each time: the wire is cached on the job; CPU, least of 3); a worker prepares it
        once (cold cache, CPU, least of 3); a pruned job's driver records the first
        sample's value shapes (CPU, least of 3). ``inline``: the job with its weights inside
        the model's bytes (the A/B reference)."""
        build = math.inf
        for _ in range(3):
            fresh = make_job((), prune)
            t = time.thread_time()
            blob, bufs = _oob_dumps(_inline_wire(fresh) if inline else fresh)
            build = min(build, time.thread_time() - t)
        prep = math.inf
        for _ in range(3):
            _PREPARED.clear()
            t = time.thread_time()
            prepared_job(pickle.loads(blob, buffers=bufs))
            prep = min(prep, time.thread_time() - t)
        shapes = math.inf if fresh.wire().pruned else 0.0
        for _ in range(3 if shapes else 0):
            t = time.thread_time()
            first_value_shapes(model, refs[0], None)
            shapes = min(shapes, time.thread_time() - t)
        return {
            "build": build,
            "blob": (blob, bufs),
            "bytes": _oob_size(blob, bufs),
            "prep": prep,
            "shapes": shapes,
            "buffers": len(bufs),
        }

    costs = {prune: job_costs(prune) for prune in (True, False)}
    inline_costs = job_costs(True, inline=True)
    job_blob, job_bufs = costs[True]["blob"]
    job_build, job_bytes, job_prep = costs[True]["build"], costs[True]["bytes"], costs[True]["prep"]
    warm = math.inf
    for _ in range(5):
        t = time.thread_time()
        prepared_job(pickle.loads(job_blob, buffers=job_bufs))
        warm = min(warm, time.thread_time() - t)
    gbps = [float(v) for v in args.gbps.split(",")]
    ks = [int(v) for v in str(args.shards_per_worker).split(",")]
    lat = args.latency
    estimate = statistics.median if args.estimate == "median" else min
    say()
    say(
        f"Simulation: the driver builds the job ({job_build * 1e3:.1f} ms CPU: the model's tail cut, the model "
        f"serialised without its weights' data, the job pickled, {costs[True]['buffers']} arrays out of band; "
        f"{job_bytes / 1e6:.2f} MB; whole: {costs[False]['bytes'] / 1e6:.2f} MB, "
        f"{costs[False]['build'] * 1e3:.1f} ms, prepared in {costs[False]['prep'] * 1e3:.1f} ms; the weights inside "
        f"the model's bytes: {inline_costs['bytes'] / 1e6:.2f} MB, built in "
        f"{inline_costs['build'] * 1e3:.1f} ms, prepared in {inline_costs['prep'] * 1e3:.1f} ms) before sending it, "
        f"then records the first sample's value shapes ({costs[True]['shapes'] * 1e3:.1f} ms CPU, in a thread "
        "while the shards run); "
        f"a worker prepares the job once ({job_prep * 1e3:.1f} ms CPU: read + model built + plan "
        f"compiled; {warm * 1e3:.2f} ms for each later shard of the job, the per-process cache), every task "
        f"pays Ray's round trip {ray_trip * 1e3:.1f} ms; latency {args.latency * 1e3:g} ms; T_in and each "
        f"shard's t_i: CPU seconds of this thread, the {args.estimate} over {args.shard_reps} rounds of the "
        f"whole in-process calibration followed by every shard of every k, in a rotated order. S = k·N shards "
        f"handed out in shard order to the worker that frees first (list scheduling)."
    )
    for n in [int(v) for v in args.sim_workers.split(",")]:
        layouts = {k: split(len(refs), k * n) for k in ks}
        jobs = {k: make_job(tuple(r.start for r in layouts[k])) for k in ks}
        items = {k: [(i, [refs[j] for j in r]) for i, r in enumerate(layouts[k])] for k in ks}
        for k in ks:
            prepared_job(jobs[k])  # warm: t_i is what a worker that has the job prepared spends
        cold, cold_runs = (
            _cold_start(jobs[min(ks)], items[min(ks)][0], args.cold_probes) if args.cold_probes else (0.0, [])
        )
        if args.cold_probes:
            say(
                f"  cold start: a fresh process's first shard (shard 0 of k={min(ks)}) costs {cold:.3f} s CPU more "
                f"than in a warm one (median of {len(cold_runs)} fresh processes, each its first run less the "
                f"mean of the next two; runs {'; '.join('/'.join(f'{v:.3f}' for v in r) for r in cold_runs)} s); "
                "charged once to the in-process run and once "
                "to each worker's first shard in the column 'cold processes'"
            )
        runs_cpu = {k: [[] for _ in items[k]] for k in ks}
        in_rounds: list[float] = []
        res_rounds: list[float] = []  # the results (ranges, extrema, means) after it
        for rnd in range(args.shard_reps):
            c = time.thread_time()
            whole = calibrate(model, tensors, calib, make, **kw)
            c1 = time.thread_time()
            _results_of(whole)
            in_rounds.append(c1 - c)
            res_rounds.append(time.thread_time() - c1)
            del whole
            sums = []
            for k in ks:
                for j in range(len(items[k])):
                    i = (j + rnd) % len(items[k])
                    t = time.thread_time()
                    run_shard(jobs[k], items[k][i])
                    runs_cpu[k][i].append(time.thread_time() - t)
                sums.append(f"k={k} {sum(r[-1] for r in runs_cpu[k]):.2f}")
            say(
                f"  round {rnd}: in-process {in_rounds[-1]:.2f} s CPU (+ results {res_rounds[-1]:.3f} s); sums of the shards "
                f"{', '.join(sums)} s CPU; load {os.getloadavg()[0]:.1f}"
            )
        t_cal = estimate(in_rounds)  # the calibration alone (the earlier notes' T_in)
        for k in ks:
            # is the shards' spread theirs or the rounds'? Each round's times over its mean
            # (the machine's drift between rounds out), then the spread of the shards'
            # means against what the rounds' scatter alone gives a mean of that many rounds
            if args.shard_reps > 1 and len(items[k]) > 1:
                rel = np.array(runs_cpu[k]).T
                rel = rel / rel.mean(axis=1, keepdims=True)
                between = float(rel.mean(axis=0).std(ddof=1))
                noise = float(rel.std(axis=0, ddof=1).mean() / math.sqrt(args.shard_reps))
                say(
                    f"  k={k}: the shards' own spread (sd of their round-normalised means) {between:.3f}, "
                    f"the rounds' noise alone would give {noise:.3f}"
                )
        t_res = estimate(res_rounds)
        t_in = estimate([a + b for a, b in zip(in_rounds, res_rounds)])  # to the results (eq. (S7))
        say(
            f"  T_in {args.estimate} {t_in:.2f} s: calibration {t_cal:.2f} s (rounds {min(in_rounds):.2f}-"
            f"{max(in_rounds):.2f} s) + results {t_res:.3f} s (rounds {min(res_rounds):.3f}-{max(res_rounds):.3f} s), "
            f"T_in / N = {t_in / n:.3f} s"
        )
        say()
        say(
            "| k (shards per worker) | S | link | shard t_i (s) | sum t_i / T_cal | state cut + pickled, per shard (s) "
            "| merge CPU, all merge tasks (s) (tasks) | last shard done (s) | after it (s) | T_N (s) | efficiency "
            "| states to the driver: T_N (s), efficiency | calibration only (earlier notes) "
            "| efficiency, every t_i = T_cal / S | what-if: one state per worker, T_N (s), efficiency "
            "| cold processes: T_N (s), efficiency |"
        )
        say("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        detail: list[str] = []
        whole_job: list[str] = []  # the same shards composed with the job sent whole
        breakdown: list[str] = []
        one = None  # the k = 1 composition: the what-if's merges of N states
        for k in sorted(ks):
            times = [estimate(r) for r in runs_cpu[k]]
            # the shards' states, once more (the rounds above keep none), each cut and pickled
            # as it is made: only their pickled forms are kept
            states = (run_shard(jobs[k], item) for item in items[k])
            c = costs[jobs[k].prune]
            sim = _Composition(n, states, c["bytes"], ray_trip, c["prep"], lat, c["build"], c["shapes"])
            for g in gbps:
                for label, ts in (("measured", times), ("flat", [t_cal / len(times)] * len(times))):
                    out = sim.reduce_scatter(ts, g * 1e9 / 8)
                    if jobs[k].prune:
                        # A/B within this run: the same t_i, states and merges, only the
                        # job's terms those of the job with its weights inside the model's
                        # bytes, then of the whole model's job
                        kept = sim.job_bytes, sim.job_prep, sim.build, sim.shapes_end
                        alts = []
                        for w, shapes_end in ((inline_costs, kept[3]), (costs[False], 0.0)):
                            sim.job_bytes, sim.job_prep, sim.build, sim.shapes_end = (
                                w["bytes"],
                                w["prep"],
                                w["build"],
                                w["build"] + w["shapes"] if shapes_end else 0.0,
                            )
                            alts.append(sim.reduce_scatter(ts, g * 1e9 / 8))
                        sim.job_bytes, sim.job_prep, sim.build, sim.shapes_end = kept
                        inl, alt = alts
                        whole_job.append(
                            f"k={k}, {g:g} Gb/s, t_i {label}: T_N {out['T']:.3f} s as sent (efficiency "
                            f"{t_in / (n * out['T']):.3f}), {inl['T']:.3f} s weights inside the model's "
                            f"bytes ({t_in / (n * inl['T']):.3f}): {(inl['T'] - out['T']) * 1e3:+.1f} ms; "
                            f"{alt['T']:.3f} s whole model, weights apart ({t_in / (n * alt['T']):.3f}): "
                            f"{(alt['T'] - out['T']) * 1e3:+.1f} ms"
                        )
                    if label == "flat":
                        flat = out
                        continue
                    meas = out
                    m_fold, m_tree = sim.driver_fold(ts, g * 1e9 / 8), sim.tree(ts, g * 1e9 / 8)
                    states = sim.reduce_scatter(ts, g * 1e9 / 8, results=False)
                    sim.job_prep += cold  # a worker's first shard in a fresh process
                    cold_out = sim.reduce_scatter(ts, g * 1e9 / 8)
                    sim.job_prep -= cold
                if k == 1:
                    one = sim
                what_if = "-"
                if one is not None:
                    # each worker calibrating all its shards into one state (a combiner): the
                    # shards list-scheduled without their states, then one state a worker
                    # (cut as a k = 1 shard's) merged as with k = 1
                    done = sim.worker_loads(times)
                    w_out = one.reduce_scatter([d - job_prep - ray_trip for d in done], g * 1e9 / 8)
                    what_if = f"{w_out['T']:.2f}, {t_in / (n * w_out['T']):.3f}"
                t_old = states["T"] - states["driver_finish"]
                say(
                    f"| {k} | {len(times)} | {g:g} Gb/s | {min(times):.2f}-{max(times):.2f} "
                    f"| {sum(times) / t_cal:.3f} | {statistics.median(sim.cut):.3f} "
                    f"| {meas['merge_cpu']:.2f} ({meas['merges']}) | {meas['last_shard']:.3f} "
                    f"| {meas['tail']:.3f} | {meas['T']:.3f} | **{t_in / (n * meas['T']):.3f}** "
                    f"| {states['T']:.3f}, {t_in / (n * states['T']):.3f} "
                    f"| {t_old:.3f}, {t_cal / (n * t_old):.3f} "
                    f"| {t_in / (n * flat['T']):.3f} | {what_if} "
                    f"| {cold_out['T']:.3f}, {(t_in + cold) / (n * cold_out['T']):.3f} |"
                )
                if k == min(ks):
                    for label, r in (("results on the workers", meas), ("states to the driver", states)):
                        path = r["path"]
                        breakdown.append(
                            f"k={k}, {g:g} Gb/s, {label}: job built and sent {r['job']:.3f} s (built "
                            f"{job_build:.3f} s); the last shard to end "
                            f"starts at {path['start']:.3f} s, prepares the job {path['prep']:.3f} s, calibrates "
                            f"{path['t_i']:.3f} s, cuts and pickles its state {path['cut']:.3f} s, Ray's round trip "
                            f"{ray_trip:.4f} s: done at {r['last_shard']:.3f} s; merging (and results) after it "
                            f"{r['merging_after']:.3f} s; driver after the last root {r['driver_after']:.3f} s "
                            f"(reads {r['driver_read']:.3f} s of {r['driver_bytes'] / 1e6:.2f} MB, results "
                            f"{r['driver_finish']:.3f} s); T_N {r['T']:.3f} s against T_in / N "
                            f"{t_in / n:.3f} s"
                        )
                detail.append(
                    f"k={k}, {g:g} Gb/s: reduce-scatter T_N {meas['T']:.2f} s (job {meas['job']:.3f} s), "
                    f"efficiency {t_in / (n * meas['T']):.3f}; driver fold T_N {m_fold['T']:.2f} s, "
                    f"{t_in / (n * m_fold['T']):.3f}; tree T_N {m_tree['T']:.2f} s ({m_tree['merges']} merges, "
                    f"{m_tree['merge_cpu']:.2f} s CPU), {t_in / (n * m_tree['T']):.3f}; worker busy "
                    f"{meas['busy']:.1f} s of {n} x {meas['T'] - meas['job']:.2f} s"
                )
            if sim is not one:
                sim.release()
        say()
        say(
            "T_N: the reduce-scatter (S3, the Ray engine), the job sent by doubling; the last column "
            "composes the same schedule with every shard at T_in / S (no spread). The three merges "
            "at every speed (worker busy: CPU seconds of all tasks against N x the makespan after the job). "
            "The what-if is not what the engine does: each worker would calibrate all the shards it is "
            "handed into one state (the per-shard state costs paid once a worker), the N states merged "
            "as the k = 1 shards' are (their measured merges):"
        )
        for line in detail:
            say(f"  {line}")
        if whole_job:
            say()
            say(
                "The job as the engine sends it (pruned, weights apart) against the job with its weights inside "
                "the model's bytes and against the whole model's job, in the same compositions:"
            )
            for line in whole_job:
                say(f"  {line}")
        say()
        say("Critical path (reduce-scatter, measured t_i):")
        for line in breakdown:
            say(f"  {line}")
    say(f"load average at the end (1, 5, 15 min): {', '.join(f'{v:.1f}' for v in os.getloadavg())}")
    if args.write:
        args.write.write_text("\n".join(lines) + "\n")
    folder.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
