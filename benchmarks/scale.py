"""Distributed calibration (quanta.scale) on EfficientNet-Lite0, 200 images: the overhead
of one Ray worker against calibrating in this process, what two Ray workers give on this
machine, and the scaling efficiency at N workers by simulation. Not a test.

Run (Ray and the model's export dependencies installed, see benchmarks/real_models)::

    python benchmarks/real_models/export.py --models efficientnet_lite0
    python benchmarks/scale.py [--images 200] [--reps 2] [--sim-workers 8] [--write benchmarks/results/...md]

Measured, on a local Ray cluster of 2 CPUs started here (``ray.init`` before timing: the
cluster's start-up is reported apart, it is paid once per session, not per job):

Both sides run with one BLAS/OpenMP thread (a Ray task of ``num_cpus=1`` gets
``OMP_NUM_THREADS=1``; this script sets the same for itself before importing NumPy).

- ``T_in``: ``quanta.calibrate.runner.calibrate`` in this process, the exact work
  ``quantize_static`` does (the model prepared and planned as it prepares it);
- ``T_ray1``: ``calibrate_sharded`` with ``RayEngine(workers=1)``: one task calibrates
  all 200 images in a Ray worker (the job sent through the object store, the state sent
  back, merged here). Runs alternate (in-process, Ray, in-process, Ray, ...) and the
  medians are compared: overhead = T_ray1 / T_in - 1;
- ``T_ray2``: two workers on this 2-core machine (shared with other jobs: indicative);
- the two files (in-process and Ray) are compared byte for byte.

Simulated N workers (``--sim-workers``), composed only of measured times plus an
explicit network model: the images split into N shards as quanta splits them; each
shard calibrated here (in-process engine, one after the other) gives its task time t_i
(compile + reading its samples + calibration, as a worker runs it); the per-task fixed
cost c (dispatch, job deserialisation, state serialisation) is the measured
T_ray1 - T_in; each message costs ``--latency``, and a link carries ``--gbps``
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

The compute terms (T_in, t_i, m_i, m_lr) are CPU seconds of this process
(``time.process_time``: one core's quiet-machine time, which other jobs sharing the
machine do not inflate as they inflate wall time; the calibration is single-threaded);
c is wall time (Ray's own work is spread over several processes).

efficiency(N) = T_in / (N · T_N). It assumes N identical machines (each worker a core
like this one) and that the data is readable where each worker runs.
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
from quanta.scale import RayEngine, ShardFold, calibrate_sharded, merge_into, tree_reduce  # noqa: E402
from quanta.scale.calibrate import _for_shards, _Job, run_shard, split  # noqa: E402


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
        "--shard-reps", type=int, default=2, help="runs of each simulated shard (the least CPU time is used)"
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
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    say(
        f"ray.init (local cluster, 2 CPUs): {time.perf_counter() - t0:.2f} s (once per session, not counted below)"
    )

    kw = dict(progress=False, channel_means=means_for)
    # a worker process is started and imports quanta once per cluster, not once per job:
    # one small job first, so the timed runs see a warm worker (as jobs after the first do)
    t = time.perf_counter()
    calibrate_sharded(model, tensors, feeds[:1], make, engine=RayEngine(1), **kw)
    say(
        f"warm-up job (1 image; starts a worker, imports quanta): {time.perf_counter() - t:.2f} s, not counted"
    )
    t_in, t_ray1, cpu_in = [], [], []
    results = {}
    for rep in range(args.reps):
        t, c = time.perf_counter(), time.process_time()
        results["in"] = calibrate(model, tensors, calib, make, **kw)
        t_in.append(time.perf_counter() - t)
        cpu_in.append(time.process_time() - c)
        t = time.perf_counter()
        results["ray1"] = calibrate_sharded(model, tensors, calib, make, engine=RayEngine(1), **kw)
        t_ray1.append(time.perf_counter() - t)
        say(
            f"  rep {rep}: in-process {t_in[-1]:.2f} s ({cpu_in[-1]:.2f} s CPU), Ray 1 worker {t_ray1[-1]:.2f} s"
        )
    same = all(results["in"][n].to_dict() == results["ray1"][n].to_dict() for n in tensors)
    m_in, m_ray1 = statistics.median(t_in), statistics.median(t_ray1)
    overhead = m_ray1 / m_in - 1
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
    ray.shutdown()

    say()
    say("| run | seconds (median) | vs in-process |")
    say("|---|---:|---:|")
    say(f"| in-process `calibrate` | {m_in:.2f} | 1.000 |")
    say(f"| Ray, 1 worker | {m_ray1:.2f} | {m_ray1 / m_in:.3f} (overhead {overhead * 100:+.1f} %) |")
    if t_ray2 is not None:
        say(f"| Ray, 2 workers (2 shared cores) | {t_ray2:.2f} | speed-up {m_in / t_ray2:.2f}x |")
    say()
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
    task_cost = max(m_ray1 - m_in, 0.0)
    c_best = min(cpu_in)
    gbps = [float(v) for v in args.gbps.split(",")]
    say()
    say(
        f"Simulation (per-task fixed cost c = T_ray1 - T_in = {task_cost:.3f} s; latency {args.latency * 1e3:g} ms; "
        f"T_in = {c_best:.2f} s CPU, the least of {len(cpu_in)} runs; each shard's t_i the least of "
        f"{args.shard_reps} runs):"
    )
    say()
    say(
        "| workers | link | max shard t_i + c (s) | job to workers, serial / doubling (s) | driver fold: states "
        "back, T_N (s), efficiency | tree: merge levels (s), T_N (s), efficiency serial job / doubling job |"
    )
    say("|---:|---|---:|---:|---:|---:|")
    prototypes = {n: _for_shards(make(n)) for n in tensors}
    lat = args.latency
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
        states, times, blobs, item_bytes = [], [], [], []
        for i, r in enumerate(runs):
            item = (i, [refs[k] for k in r])
            item_bytes.append(len(pickle.dumps(item, protocol=5)))
            best = math.inf
            for _ in range(args.shard_reps):
                t = time.process_time()
                st = run_shard(job, item)
                best = min(best, time.process_time() - t)
            times.append(best)
            states.append(st)
            blobs.append(pickle.dumps(st, protocol=5))
        state_bytes = [len(b) for b in blobs]
        shard_bytes = sum(item_bytes)
        slowest = max(times) + task_cost

        # driver fold: each state read (unpickled) and folded in shard order (ShardFold),
        # each step timed here
        fold, steps = ShardFold(), []
        for i, blob in enumerate(blobs):
            t = time.process_time()
            fold(i, pickle.loads(blob))
            steps.append(time.process_time() - t)

        # tree (S2): a merge task, as on a Ray worker, reads both inputs from the object
        # store (unpickles them), merges with merge_into (the Ray engine's merge) and
        # stores its result (pickles it): timed here on the real states, serialisation
        # included; the tree is walked once to time the merges and then composed with
        # each link speed
        merges: list[tuple[float, int]] = []  # (seconds, result bytes), in tree order

        def measure(a, b, merges=merges):
            t = time.process_time()
            out = pickle.dumps(merge_into(pickle.loads(a), pickle.loads(b)), protocol=5)
            merges.append((time.process_time() - t, len(out)))
            return out

        root_blob = tree_reduce(blobs, measure)
        t = time.process_time()
        assert pickle.loads(root_blob).samples == len(refs)
        load_root = time.process_time() - t

        for g in gbps:
            bw = g * 1e9 / 8
            send_serial = (n * job_bytes + shard_bytes) / bw + lat
            send_double = (math.ceil(math.log2(n + 1)) * job_bytes + shard_bytes) / bw + lat
            link = merged = 0.0
            arrive = [0.0] * n
            for i in sorted(range(n), key=lambda j: times[j]):
                link = max(link, send_serial + times[i] + task_cost) + state_bytes[i] / bw + lat
                arrive[i] = link
            for i in range(n):
                merged = max(merged, arrive[i]) + steps[i]
            t_fold = merged
            replay = iter(merges)

            def compose(a, b, replay=replay, bw=bw):
                m, size = next(replay)  # nodes: (done time after the job arrived, bytes)
                return (max(a[0], b[0]) + b[1] / bw + lat + m, size)

            root = tree_reduce([(times[i] + task_cost, state_bytes[i]) for i in range(n)], compose)
            tree_rest = root[0] + root[1] / bw + lat + load_root
            t_tree_serial, t_tree_double = send_serial + tree_rest, send_double + tree_rest
            say(
                f"| {n} | {g:g} Gb/s | {slowest:.2f} | {send_serial:.3f} / {send_double:.3f} "
                f"| {sum(state_bytes) / 1e6:.1f} MB, {t_fold:.2f}, {c_best / (n * t_fold):.3f} "
                f"| {sum(m for m, _ in merges):.3f} ({len(merges)} merges), {t_tree_serial:.2f} / "
                f"{t_tree_double:.2f}, **{c_best / (n * t_tree_serial):.3f}** / **{c_best / (n * t_tree_double):.3f}** |"
            )
        say(
            f"  {args.data} ({shard_bytes / 1e6:.2f} MB of shard lists); shard times t_i: min {min(times):.2f} s, "
            f"max {max(times):.2f} s, T_in / N = {c_best / n:.2f} s (CPU); |job| {job_bytes / 1e6:.1f} MB, "
            f"|state| {statistics.median(state_bytes) / 1e6:.1f} MB (median), root state {len(root_blob) / 1e6:.1f} MB; "
            f"merge tasks (read 2, merge, write 1) {min(m for m, _ in merges):.3f}-{max(m for m, _ in merges):.3f} s, "
            f"driver fold steps {min(steps[1:] or steps):.3f}-{max(steps):.3f} s"
        )
    if args.write:
        args.write.write_text("\n".join(lines) + "\n")
    folder.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
