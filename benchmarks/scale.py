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
explicit network model: the images split into N shards as quanta splits them; each
shard calibrated here (in-process engine, one after the other) gives its task time t_i
(compile + reading its samples + calibration, as a worker runs it); the per-task fixed
cost c is composed: the CPU time of a worker reading the job (unpickling the model and
the empty observers) plus Ray's round trip of a task that does nothing (wall time, the
median of 20: on a loaded machine an overestimate); pickling each shard's state is timed
with the shard (wall T_ray1 - T_in would put the machine's other load into c); each
message costs ``--latency``, and a link carries ``--gbps``
(each speed given is composed from the same measured times).

The calibration images are written once as ``.npz`` files (one per image, as a user's
calibration folder) and every run reads that folder: a shard travels as its paths, and
each worker reads its own samples (``--data memory`` sends the feeds with the tasks
instead: |shard_i| bytes each over the driver's link).

The job (model + empty observers, pickled, |job| bytes) reaches the N workers either
from the driver one after the other over its one link (``serial``: S = N·|job|/bw, an
upper bound), or by doubling, each machine that has it serving one more per round (what
an object store that serves copies from every node allows: S = ⌈log₂(N+1)⌉·|job|/bw).
Shard i is done at d_i = S + latency + t_i + c. Two merges are composed:

- **driver fold** (the in-process and local engines' ``ShardFold``): the states cross
  the driver's link one at a time in the order they are done, state i in at a_i; fold
  step i (m_i: the state read from its pickled form and folded, timed here in shard
  order) ends at f_i = max(f_{i-1}, a_i) + m_i;
  T_N = f_N;
- **tree** (the Ray engine, docs/scale.md eq. (S2)): a merge of the states of nodes l
  and r (timed here on the real states: both read from their pickled form,
  ``merge_into``, the result pickled again, m_lr) is done at
  max(d_l, d_r) + |state_r|/bw + latency + m_lr (one state moves between two workers,
  links other than the driver's); the root's state then crosses the driver's link and
  is read there: T_N = d_root + |root|/bw + latency + load_root.

- **reduce-scatter** (the Ray engine, docs/scale.md eq. (S3)): shard i's state is cut
  into P = N parts by tensor and each part pickled (timed: the shard is done at
  d_i = t_i + split_i + c after the job, its P parts on worker i); each part is merged
  by merges of adjacent runs of shards as they appear (``AdjacentMerges``, what the
  engine submits: two runs, or three when both neighbours of a new run wait). The parts
  share the machines: a worker runs one task at a time (a shard or a merge) and a link
  carries one message at a time in each direction. A merge runs on the worker of one of
  its runs, the one where it would end first (ties: the latest run's); the other runs
  cross from their workers' links to that worker's (|part|/bw + latency each, the links
  reserved), and the merge takes m (timed here on the real parts: read them,
  ``merge_run``, write the result). The P merged parts cross the workers' links and
  the driver's one at a time and are read there (timed): T_N = job + the last of those.

The network, stated: N worker machines and the driver, each with one full-duplex link
of ``--gbps`` to a non-blocking switch (any two machines talk at that speed, a link
carries one message at a time in each direction), each message paying ``--latency``;
no compression, no overlap of a transfer with the compute of its own machine beyond the
order above. The calibration samples are read where each worker runs (a folder on
storage every worker mounts, as a user's calibration set is) and their reading is part
of t_i, not of the network; the job (the model, 18.7 MB here) is sent over the links.

The compute terms (T_in, t_i, m_i, m_lr, split_i, m_p) are CPU seconds of this thread
(``time.thread_time``: one core's time, which other jobs sharing the machine do not
inflate as they inflate wall time; the calibration is single-threaded); c is wall time
(Ray's own work is spread over several processes). CPU time still moves between minutes
on a shared VM (SMT siblings, caches): the same 25-image shard measures 15-30 % apart.
So T_in and every t_i are measured in ``--shard-reps`` rounds (the whole in-process
calibration, then every shard in an order rotated by one each round) and each is
estimated over its rounds (``--estimate``: the median by default; ``min`` the least).
All shards hold the same number of images of the same size (``split``: sizes differ by
at most one sample), so they are balanced by samples and bytes alike; what differs
between their estimates is what the rounds could not average out, and it is charged to
T_N as measured (the slowest shard's estimate), not smoothed.

efficiency(N) = T_in / (N · T_N). It assumes N identical machines (each worker a core
like this one).
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
import math  # noqa: E402
import pickle  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "real_models"))

import quanta  # noqa: E402
from quanta.calibrate.readers import sample_refs  # noqa: E402
from quanta.calibrate.runner import calibrate  # noqa: E402
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
    merge_into,
    tree_reduce,
)
from quanta.scale.calibrate import _for_shards, _Job, merge_run, run_shard, split, split_state  # noqa: E402
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


def _fixed_costs(model, tensors, make, means_for, result) -> dict[str, float]:
    """What one Ray worker adds to the in-process run, each step alone (CPU, least of 5):
    the job pickled (driver) and read (worker), the whole state pickled (worker) and read
    (driver). Ray's own dispatch is the no-op round trip, reported with the simulation."""
    job = _Job(
        model=model,
        tensors=tuple(tensors),
        prototypes={n: _for_shards(make(n)) for n in tensors},
        preprocess=None,
        channel_means=dict(means_for),
    )
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

    job_blob = pickle.dumps(job, protocol=5)
    state_blob = pickle.dumps(state, protocol=5)
    return {
        "job pickled": least(lambda: pickle.dumps(job, protocol=5)),
        "job read": least(lambda: pickle.loads(job_blob)),
        "state pickled": least(lambda: pickle.dumps(state, protocol=5)),
        "state read": least(lambda: pickle.loads(state_blob)),
    }


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
    ap.add_argument("--latency", type=float, default=1e-3, help="seconds per message")
    ap.add_argument("--write", type=Path, help="also write the report (markdown) here")
    ap.add_argument(
        "--data",
        choices=("files", "memory"),
        default="files",
        help="calibration images as a folder of .npz files (default) or feeds sent with the tasks",
    )
    args = ap.parse_args(argv)

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
        f"observer states identical to in-process: 1 worker {same}"
        + ("" if same2 is None else f", 2 workers {same2}")
        + (
            ""
            if files_same is None
            else f"; quantized files (in-process vs Ray, 2 workers) byte-identical: {files_same}"
        )
    )

    # ---- simulation
    # the per-task fixed cost c, composed: a worker reads the job (unpickles the model and
    # the empty observers; CPU time, least of 3) and Ray dispatches the task and returns
    # its result (the no-op round trip). The state's pickling is timed with each shard
    # below. (Wall times T_ray1 - T_in would put the machine's other load into c.)
    prototypes = {n: _for_shards(make(n)) for n in tensors}
    job_blob = pickle.dumps(
        _Job(
            model=model,
            tensors=tuple(tensors),
            prototypes=prototypes,
            preprocess=None,
            channel_means=dict(means_for),
        ),
        protocol=5,
    )
    job_load = math.inf
    for _ in range(3):
        t = time.thread_time()
        pickle.loads(job_blob)
        job_load = min(job_load, time.thread_time() - t)
    task_cost = job_load + ray_trip
    gbps = [float(v) for v in args.gbps.split(",")]
    say()
    say(
        f"Simulation (per-task fixed cost c = job read {job_load:.3f} s CPU + Ray task round trip "
        f"{ray_trip * 1e3:.1f} ms = {task_cost:.3f} s; latency {args.latency * 1e3:g} ms; "
        f"T_in and each shard's t_i: CPU seconds of this thread, the {args.estimate} over "
        f"{args.shard_reps} rounds of the whole in-process calibration followed by every shard, "
        f"in a rotated order):"
    )
    lat = args.latency
    estimate = statistics.median if args.estimate == "median" else min
    for n in [int(v) for v in args.sim_workers.split(",")]:
        runs = split(len(refs), n)
        job = _Job(
            model=model,
            tensors=tuple(tensors),
            prototypes=prototypes,
            preprocess=None,
            channel_means=dict(means_for),
        )
        job_bytes = len(pickle.dumps(job, protocol=5))
        items = [(i, [refs[k] for k in r]) for i, r in enumerate(runs)]
        item_bytes = [len(pickle.dumps(item, protocol=5)) for item in items]
        runs_cpu: list[list[float]] = [[] for _ in items]
        states: list = [None] * len(items)
        in_rounds: list[float] = []
        # rounds: the whole in-process calibration, then every shard, the shards in an
        # order rotated by one each round (a drift of the machine within a round then
        # falls on each shard at a different place). The CPU time of the same work moves
        # between minutes on this VM (SMT siblings, caches, other tenants), so each term
        # is estimated over the rounds (--estimate: median by default), T_in the same way
        for rnd in range(args.shard_reps):
            c = time.thread_time()
            calibrate(model, tensors, calib, make, **kw)
            in_rounds.append(time.thread_time() - c)
            for k in range(len(items)):
                i = (k + rnd) % len(items)
                t = time.thread_time()
                states[i] = run_shard(job, items[i])
                runs_cpu[i].append(time.thread_time() - t)
            say(
                f"  round {rnd}: in-process {in_rounds[-1]:.2f} s CPU, shards "
                f"{sum(r[-1] for r in runs_cpu):.2f} s CPU (this round: "
                f"{' '.join(f'{r[-1]:.2f}' for r in runs_cpu)}), load {os.getloadavg()[0]:.1f}"
            )
        times = [estimate(r) for r in runs_cpu]
        c_best = estimate(in_rounds)
        spread = [(max(r) - min(r)) / statistics.median(r) for r in runs_cpu]
        say(
            f"  per shard over the rounds: {args.estimate} {min(times):.2f}-{max(times):.2f} s "
            f"(least {min(min(r) for r in runs_cpu):.2f}-{max(min(r) for r in runs_cpu):.2f} s); "
            f"one shard's spread (max - min) / median across rounds {min(spread) * 100:.0f}-"
            f"{max(spread) * 100:.0f} %; T_in {args.estimate} {c_best:.2f} s "
            f"(rounds {min(in_rounds):.2f}-{max(in_rounds):.2f} s), sum of shards {sum(times):.2f} s"
        )
        blobs, pack_cost = [], []
        for st in states:
            t = time.thread_time()
            blobs.append(pickle.dumps(st, protocol=5))
            pack_cost.append(time.thread_time() - t)
        say()
        say(
            "| workers | link | max shard t_i + pickling + c (s) | job to workers, serial / doubling (s) | driver fold: "
            "states back, T_N (s), efficiency | tree: merge levels (s), T_N (s), efficiency serial job / doubling job |"
        )
        say("|---:|---|---:|---:|---:|---:|")
        state_bytes = [len(b) for b in blobs]
        shard_bytes = sum(item_bytes)
        slowest = max(t + p for t, p in zip(times, pack_cost)) + task_cost

        # driver fold: each state read (unpickled) and folded in shard order (ShardFold),
        # each step timed here
        fold, steps = ShardFold(), []
        for i, blob in enumerate(blobs):
            t = time.thread_time()
            fold(i, pickle.loads(blob))
            steps.append(time.thread_time() - t)

        # reduce-scatter (S3), the Ray engine's merge: each shard's state cut into P = N
        # parts and each part pickled (what the shard task returns: its cost is added to
        # the shard's time); each part merged by adjacent runs as the shards finish
        # (AdjacentMerges), every merge timed on the real parts below
        parts = n
        part_blobs, split_cost = [], []
        for st in states:
            t = time.thread_time()
            part_blobs.append([pickle.dumps(x, protocol=5) for x in split_state(st, parts)])
            split_cost.append(time.thread_time() - t)
        part_bytes = [[len(b) for b in row] for row in part_blobs]

        # tree (S2): a merge task, as on a Ray worker, reads both inputs from the object
        # store (unpickles them), merges with merge_into (the Ray engine's merge) and
        # stores its result (pickles it): timed here on the real states, serialisation
        # included; the tree is walked once to time the merges and then composed with
        # each link speed
        merges: list[tuple[float, int]] = []  # (seconds, result bytes), in tree order

        def measure(a, b, merges=merges):
            t = time.thread_time()
            out = pickle.dumps(merge_into(pickle.loads(a), pickle.loads(b)), protocol=5)
            merges.append((time.thread_time() - t, len(out)))
            return out

        root_blob = tree_reduce(blobs, measure)
        t = time.thread_time()
        assert pickle.loads(root_blob).samples == len(refs)
        load_root = time.thread_time() - t

        scatter_rows: list[str] = []
        scatter_notes: list[str] = []
        for g in gbps:
            bw = g * 1e9 / 8
            send_serial = (n * job_bytes + shard_bytes) / bw + lat
            send_double = (math.ceil(math.log2(n + 1)) * job_bytes + shard_bytes) / bw + lat
            link = merged = 0.0
            arrive = [0.0] * n
            for i in sorted(range(n), key=lambda j: times[j]):
                link = (
                    max(link, send_serial + times[i] + pack_cost[i] + task_cost) + state_bytes[i] / bw + lat
                )
                arrive[i] = link
            for i in range(n):
                merged = max(merged, arrive[i]) + steps[i]
            t_fold = merged
            replay = iter(merges)

            def compose(a, b, replay=replay, bw=bw):
                m, size = next(replay)  # nodes: (done time after the job arrived, bytes)
                return (max(a[0], b[0]) + b[1] / bw + lat + m, size)

            root = tree_reduce(
                [(times[i] + pack_cost[i] + task_cost, state_bytes[i]) for i in range(n)], compose
            )
            tree_rest = root[0] + root[1] / bw + lat + load_root
            t_tree_serial, t_tree_double = send_serial + tree_rest, send_double + tree_rest

            # reduce-scatter: shard i (on worker i) is done at done[i] (after the job), its
            # P parts there. Every part is merged by adjacent runs as they appear
            # (AdjacentMerges: two or three runs a merge); the parts share the machines:
            # each worker runs one task at a time and each link carries one message at a
            # time in each direction. A merge runs on the worker of one of its runs, the
            # one where it ends first (ties: the latest run's), the other runs crossing
            # from their workers' links to that worker's (|part|/bw + latency); it reads
            # its inputs, merges and writes its result (timed here, CPU). The P merged parts then cross to the driver one at
            # a time, each read there (timed).
            done = [times[i] + split_cost[i] + task_cost for i in range(n)]
            cpu_free = list(done)
            links: dict[tuple[str, int], float] = {}  # ("out" | "in", worker; -1: the driver) -> free at

            def transfer(
                src: int, dst: int, ready: float, size: int, reserve: bool, bw=bw, links=links
            ) -> float:
                """Arrival at ``dst`` (-1: the driver) of ``size`` bytes ready on ``src`` at
                ``ready``, after the messages already on both links (reserved for this one
                with ``reserve``); none when the bytes are already there."""
                if src == dst:
                    return ready
                start = max(ready, links.get(("out", src), 0.0), links.get(("in", dst), 0.0))
                if reserve:
                    links["out", src] = links["in", dst] = start + size / bw
                return start + size / bw + lat

            finals, pair_cpu = [], []
            runs = [AdjacentMerges() for _ in range(parts)]
            heap = [(done[i], q, i, i, i, part_blobs[i][q]) for i in range(n) for q in range(parts)]
            heapq.heapify(heap)
            while heap:  # runs in the order they appear, over all parts
                at, q, lo, hi, w, blob = heapq.heappop(heap)
                if (lo, hi) == (0, n - 1):
                    finals.append((at, w, blob))
                    continue
                joined = runs[q].add(lo, hi, (at, w, blob))
                if joined is None:
                    continue
                first, last = joined[0][0], joined[-1][1]
                t = time.thread_time()
                out = pickle.dumps(merge_run(*(pickle.loads(b) for _, _, (_, _, b) in joined)), protocol=5)
                pair_cpu.append(time.thread_time() - t)
                inputs = sorted(
                    (r[2] for r in joined), key=lambda r: -r[0]
                )  # (at, worker, blob), latest first
                options = []
                for _, here, _ in inputs:  # on the worker of one of its runs, the others moved there
                    ready = [
                        a if v == here else transfer(v, here, a, len(b), reserve=False) for a, v, b in inputs
                    ]
                    options.append((max(*ready, cpu_free[here]) + pair_cpu[-1], here))
                _, here = min(options, key=lambda o: o[0])
                start = cpu_free[here]
                for a, v, b in sorted(inputs):  # one at a time over its inbound link, earliest first
                    start = max(start, a if v == here else transfer(v, here, a, len(b), reserve=True))
                end = start + pair_cpu[-1]
                cpu_free[here] = end
                heapq.heappush(heap, (end, q, first, last, here, out))
            drv, read_cpu = 0.0, 0.0
            for at, w, blob in sorted(finals, key=lambda f: f[0]):
                t = time.thread_time()
                pickle.loads(blob)
                read = time.thread_time() - t
                read_cpu += read
                drv = max(drv, transfer(w, -1, at, len(blob), reserve=True)) + read
            finals = [(at, blob) for at, _, blob in finals]
            after_last = max(at for at, _ in finals) - max(done)
            t_sc_serial, t_sc_double = send_serial + drv, send_double + drv
            merged_total = sum(len(blob) for _, blob in finals)
            scatter_rows.append(
                f"| {n} | {g:g} Gb/s | {send_serial:.3f} / {send_double:.3f} | {max(done):.2f} "
                f"| {after_last:.3f} | {drv - max(at for at, _ in finals):.3f} "
                f"| {t_sc_serial:.2f} / {t_sc_double:.2f} "
                f"| **{c_best / (n * t_sc_serial):.3f}** / **{c_best / (n * t_sc_double):.3f}** |"
            )
            say(
                f"| {n} | {g:g} Gb/s | {slowest:.2f} | {send_serial:.3f} / {send_double:.3f} "
                f"| {sum(state_bytes) / 1e6:.1f} MB, {t_fold:.2f}, {c_best / (n * t_fold):.3f} "
                f"| {sum(m for m, _ in merges):.3f} ({len(merges)} merges), {t_tree_serial:.2f} / "
                f"{t_tree_double:.2f}, **{c_best / (n * t_tree_serial):.3f}** / **{c_best / (n * t_tree_double):.3f}** |"
            )
            scatter_notes.append(
                f"{g:g} Gb/s: {len(pair_cpu)} merges {min(pair_cpu):.3f}-{max(pair_cpu):.3f} s CPU, "
                f"merged parts {merged_total / 1e6:.1f} MB read by the driver in {read_cpu:.3f} s"
            )
        say(
            f"  {args.data} ({shard_bytes / 1e6:.2f} MB of shard lists); shard times t_i: min {min(times):.2f} s, "
            f"max {max(times):.2f} s, T_in / N = {c_best / n:.2f} s (CPU); |job| {job_bytes / 1e6:.1f} MB, "
            f"|state| {statistics.median(state_bytes) / 1e6:.1f} MB (median), root state {len(root_blob) / 1e6:.1f} MB; "
            f"merge tasks (read 2, merge, write 1) {min(m for m, _ in merges):.3f}-{max(m for m, _ in merges):.3f} s, "
            f"driver fold steps {min(steps[1:] or steps):.3f}-{max(steps):.3f} s"
        )
        say()
        say(
            "Reduce-scatter (S3, the Ray engine): job to workers serial / doubling; last shard done "
            "(t_i + cutting and pickling its P parts + c, after the job); merging left after the last "
            "shard (the latest part's last merges, transfers included); driver link + reading the P "
            "merged parts after the last of them is merged; T_N serial / doubling job; efficiency."
        )
        say()
        say(
            "| workers | link | job (s) | last shard done (s) | merging after the last shard (s) "
            "| to the driver (s) | T_N (s) | efficiency |"
        )
        say("|---:|---|---:|---:|---:|---:|---:|---:|")
        for row in scatter_rows:
            say(row)
        say(
            f"  parts per shard {parts}: {statistics.median([b for r in part_bytes for b in r]) / 1e6:.2f} MB "
            f"(median), largest {max(b for r in part_bytes for b in r) / 1e6:.2f} MB; cutting + pickling a "
            f"shard's parts {min(split_cost):.3f}-{max(split_cost):.3f} s; per link speed: "
            + "; ".join(scatter_notes)
        )
    say(f"load average at the end (1, 5, 15 min): {', '.join(f'{v:.1f}' for v in os.getloadavg())}")
    if args.write:
        args.write.write_text("\n".join(lines) + "\n")
    folder.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
