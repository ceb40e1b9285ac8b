"""Sharded calibration (quanta.scale) writes the single process's file, byte for byte,
for every calibration method, any worker count and any completion order of the shards.

The in-process engine runs the shards here (what Ray and the local processes run is the
same ``run_shard``); tests/scale/test_ray.py repeats the file comparison on a Ray cluster.
"""

from __future__ import annotations

import itertools
import json
import pickle
import random

import numpy as np
import onnx
import pytest

import quanta
from quanta.quantize.recipe import CalibrationMethod
from quanta.scale import InProcessEngine, LocalEngine, split, tree_reduce
from quanta.scale.engines import AdjacentMerges
from tests.ir import models

METHODS = [m.value for m in CalibrationMethod]


def feeds(n: int = 11, seed: int = 3) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        x = rng.standard_normal((1, 3, 8, 6)).astype(np.float32) * (1 + i % 4)
        x[0, 1, i % 8] = 0.0
        out.append({"x": x})
    return out


class ShuffledEngine(InProcessEngine):
    """Runs the shards in a random order (as workers finish), returns them in order."""

    def __init__(self, workers: int, seed: int) -> None:
        super().__init__(workers)
        self.seed = seed

    def map(self, fn, shared, items, progress=None, on_result=None):
        order = list(range(len(items)))
        random.Random(self.seed).shuffle(order)
        out = [None] * len(items)
        for i in order:
            out[i] = fn(shared, items[i]) if on_result is None else on_result(i, fn(shared, items[i]))
        return out


class TreeEngine(ShuffledEngine):
    """Merges the shard states in the Ray engine's tree (quanta.scale.tree_reduce), here:
    the shape of the merge the workers do, without Ray."""

    def reduce(self, fn, shared, items, merge, progress=None, *, finish=None, **_):
        # each merge gets its own deserialized copies of its inputs, as a Ray task does
        def task(a, b):
            return merge(pickle.loads(pickle.dumps(a)), pickle.loads(pickle.dumps(b)))

        root = tree_reduce(self.map(fn, shared, items), task)
        return root if finish is None else pickle.loads(pickle.dumps(finish(root)))


class ScatterEngine(ShuffledEngine):
    """The Ray engine's reduce-scatter (docs/scale.md eq. (S3)) without Ray: every shard
    state cut into ``parts`` parts, the shards arriving in a random order, each part
    merged by adjacent runs as they arrive (AdjacentMerges; a merge's result arrives
    after the results already queued), each merge on its own deserialized copies."""

    def __init__(self, workers: int, seed: int, parts: int) -> None:
        super().__init__(workers, seed)
        self.parts = parts

    def reduce(self, fn, shared, items, merge, progress=None, *, split, join, finish=None):
        """``finish`` (results instead of states) runs where the Ray engine runs it: in the
        merge that completes a part, on that part alone (in the shard's task for one
        shard); the driver joins what comes back."""

        def copy(x):
            return pickle.loads(pickle.dumps(x))

        def last(x):
            return x if finish is None else finish(x)

        n = len(items)
        order = list(range(n))
        random.Random(self.seed).shuffle(order)
        if n == 1:
            return join([copy(last(fn(shared, items[0])))])
        queue = [
            (p, i, i, split(fn(shared, items[i]), self.parts)[p]) for i in order for p in range(self.parts)
        ]
        merges = [AdjacentMerges() for _ in range(self.parts)]
        roots = [None] * self.parts
        while queue:
            p, lo, hi, value = queue.pop(0)
            if (lo, hi) == (0, n - 1):
                roots[p] = value
                continue
            runs = merges[p].add(lo, hi, value)
            if runs is not None:
                merged = merge(*(copy(v) for _, _, v in runs))
                if (runs[0][0], runs[-1][1]) == (0, n - 1):
                    merged = last(merged)
                queue.append((p, runs[0][0], runs[-1][1], merged))
        return join([copy(r) for r in roots])


def test_adjacent_merges_give_the_in_order_fold_for_any_arrival_order():
    """Merging only adjacent runs, as they arrive, is the in-order fold of an associative,
    non-commutative merge (string concatenation) whatever the order: n - 1 joins, in
    merges of two or three runs."""
    for n in (1, 2, 3, 8, 13):
        for seed in range(20):
            order = list(range(n))
            random.Random(seed).shuffle(order)
            queue = [(i, i, chr(97 + i)) for i in order]
            m, merged, root = AdjacentMerges(), 0, None
            pick = random.Random(seed)  # odd seeds: merges and arrivals interleave at random
            while queue:
                lo, hi, v = queue.pop(pick.randrange(len(queue)) if seed % 2 else 0)
                if (lo, hi) == (0, n - 1):
                    root = v
                    continue
                runs = m.add(lo, hi, v)
                if runs is not None:
                    assert len(runs) in (2, 3) and all(r[1] + 1 == s[0] for r, s in itertools.pairwise(runs))
                    assert (lo, hi, v) in runs
                    merged += len(runs) - 1
                    queue.append((runs[0][0], runs[-1][1], "".join(r[2] for r in runs)))
            assert root == "".join(chr(97 + i) for i in range(n)) and merged == n - 1


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("scale") / "cnn.onnx"
    onnx.save(models.float_cnn(), p)
    return p


def quantize(model_path, out, data, **kw) -> bytes:
    quanta.quantize_static(str(model_path), str(out), data, verbose=False, **kw)
    return out.read_bytes()


@pytest.mark.parametrize("method", METHODS)
def test_sharded_file_is_byte_identical(model_path, tmp_path, method):
    data = feeds()
    want = quantize(model_path, tmp_path / "one.onnx", data, method=method)
    # shards = workers (the default for few samples), more shards than workers, and fewer
    for workers, shards, seed in (
        (2, 2, 0),
        (3, 3, 1),
        (5, 5, 2),
        (2, None, 3),
        (16, None, 4),
        (3, 7, 5),
        (4, 2, 6),
    ):
        got = quantize(
            model_path,
            tmp_path / f"w{workers}-{shards}.onnx",
            data,
            method=method,
            engine=ShuffledEngine(workers, seed),
            shards=shards,
        )
        assert got == want, (method, workers, shards)


@pytest.mark.parametrize("method", METHODS)
def test_states_merged_in_a_tree_give_the_same_file(model_path, tmp_path, method):
    data = feeds()
    want = quantize(model_path, tmp_path / "one.onnx", data, method=method)
    for workers in (2, 3, 5, 8, 11):
        got = quantize(
            model_path,
            tmp_path / f"t{workers}.onnx",
            data,
            method=method,
            engine=TreeEngine(workers, workers),
        )
        assert got == want, (method, workers)


@pytest.mark.parametrize("method", METHODS)
def test_states_merged_by_reduce_scatter_give_the_same_file(model_path, tmp_path, method):
    data = feeds()
    want = quantize(model_path, tmp_path / "one.onnx", data, method=method)
    # more parts than tensors leaves some parts empty; one part is a flat fold
    for workers, parts in ((2, 2), (3, 1), (5, 3), (8, 8), (11, 40)):
        got = quantize(
            model_path,
            tmp_path / f"s{workers}.onnx",
            data,
            method=method,
            engine=ScatterEngine(workers, workers, parts),
        )
        assert got == want, (method, workers, parts)


def test_split_state_cuts_every_shard_alike_and_join_restores_it(model_path):
    """Part p of every shard holds the same tensors (the cut depends on names, channels
    and bins, not on the samples a shard saw), parts are disjoint and balanced, and the
    joined parts are the state."""
    from quanta.ir.onnx_io import load
    from quanta.quantize.recipe import CalibrationMethod, Recipe
    from quanta.quantize.static import make_observer_factory
    from quanta.scale.calibrate import _cost, _for_shards, _Job, join_states, run_shard, split_state

    model = load(str(model_path))
    tensors = ("x", "c", "r", "y")
    make = make_observer_factory(Recipe(method=CalibrationMethod.ENTROPY), {})
    job = _Job(model, tensors, {n: _for_shards(make(n)) for n in tensors}, None, {"c": 1})
    data = feeds(7)
    a = run_shard(job, (0, [("feed", f) for f in data[:2]]))
    b = run_shard(job, (1, [("feed", f) for f in data[2:]]))  # another sample count
    for parts in (1, 2, 3, 6):
        pa, pb = split_state(a, parts), split_state(b, parts)
        assert len(pa) == parts
        assert [set(p.observers) for p in pa] == [set(p.observers) for p in pb]
        assert [set(p.means) for p in pa] == [set(p.means) for p in pb]
        names = [n for p in pa for n in p.observers]
        assert sorted(names) == sorted(tensors)  # disjoint, complete
        back = join_states(pa)
        assert back.samples == a.samples and back.value_shapes == a.value_shapes
        assert {n: o.to_dict() for n, o in back.observers.items()} == {
            n: o.to_dict() for n, o in a.observers.items()
        }
        assert set(back.means) == set(a.means) == {"c"}
    # balanced: with as many parts as tensors, one tensor each; the largest part is never
    # more than the largest tensor above the mean
    loads = [sum(_cost(o) for o in p.observers.values()) for p in split_state(a, 2)]
    assert max(loads) - min(loads) <= max(_cost(o) for o in a.observers.values())
    with pytest.raises(ValueError, match="different samples"):
        join_states([split_state(a, 2)[0], split_state(b, 2)[1]])


def test_tree_reduce_keeps_the_order_and_takes_log2_levels():
    calls = []

    def cat(a: str, b: str) -> str:
        calls.append((a, b))
        return a + b

    assert tree_reduce(list("abcdefgh"), cat) == "abcdefgh"
    assert calls[:4] == [("a", "b"), ("c", "d"), ("e", "f"), ("g", "h")]  # the first level
    assert len(calls) == 7
    assert tree_reduce(list("abcde"), cat) == "abcde"
    assert tree_reduce(["z"], cat) == "z"
    with pytest.raises(ValueError, match="no values"):
        tree_reduce([], cat)


def test_sharded_calibration_of_a_folder_and_a_sample_limit(model_path, tmp_path):
    folder = tmp_path / "calib"
    folder.mkdir()
    data = feeds(9)
    for i, f in enumerate(data):
        np.savez(folder / f"s{i:02d}.npz", **f)
    np.savez(folder / "s99.npz", *[feeds(3, seed=9)[k]["x"] for k in range(3)])  # one file, three samples
    want = quantize(model_path, tmp_path / "one.onnx", str(folder), calibration_samples=11)
    got = quantize(
        model_path,
        tmp_path / "three.onnx",
        str(folder),
        calibration_samples=11,
        engine="inprocess",
        workers=3,
    )
    assert got == want


def test_local_processes_give_the_same_file(model_path, tmp_path):
    data = feeds(6)
    want = quantize(model_path, tmp_path / "one.onnx", data, method="entropy")
    got = quantize(model_path, tmp_path / "local.onnx", data, method="entropy", engine=LocalEngine(2))
    assert got == want


def test_default_shards_over_decompose_only_large_shards():
    from quanta.scale import MIN_SHARD_SAMPLES, SHARDS_PER_WORKER, default_shards

    assert SHARDS_PER_WORKER >= 1 and MIN_SHARD_SAMPLES >= 1
    assert default_shards(1, 10**6) == 1  # one worker: one shard, the job's costs paid once
    for workers in (2, 3, 8):
        big = SHARDS_PER_WORKER * workers * MIN_SHARD_SAMPLES
        assert default_shards(workers, 10 * big) == SHARDS_PER_WORKER * workers
        assert default_shards(workers, big) == SHARDS_PER_WORKER * workers
        assert default_shards(workers, big - 1) < SHARDS_PER_WORKER * workers  # a shard would be too small
        for samples in (workers, 25 * workers, workers * MIN_SHARD_SAMPLES):
            assert default_shards(workers, samples) == workers  # small shards: one per worker
            assert samples // default_shards(workers, samples) >= 1
        assert default_shards(workers, 1) == 1  # never an empty shard
        n = 3 * workers * MIN_SHARD_SAMPLES
        assert n // default_shards(workers, n) >= MIN_SHARD_SAMPLES


def test_the_job_is_prepared_once_per_process_and_keyed_by_its_digest(model_path):
    """A worker that runs several shards of a job builds the model and compiles its plan
    once: the job as it travels (pickled) finds the prepared job by its digest; another
    job (other tensors) gets its own; the cache keeps the last two; a shard's state is
    the same with a cold and a warm cache."""
    from quanta.calibrate import MinMaxObserver
    from quanta.ir.onnx_io import load
    from quanta.scale.calibrate import _PREPARED, _PREPARED_MAX, _Job, _JobWire, prepared, run_shard

    model = load(str(model_path))
    proto = {n: MinMaxObserver() for n in ("x", "c", "r", "y")}
    job = _Job(model, ("x", "c", "r", "y"), proto, None, {"c": 1})
    other = _Job(model, ("x", "c"), {n: proto[n] for n in ("x", "c")}, None, {})
    item = (0, [("feed", f) for f in feeds(3)])
    _PREPARED.clear()
    cold = run_shard(job, item)
    sent = pickle.loads(pickle.dumps(job))  # what a worker receives
    assert isinstance(sent, _JobWire) and sent.digest == job.digest
    first = prepared(sent)
    assert prepared(pickle.loads(pickle.dumps(job))) is first  # reused, not rebuilt
    assert prepared(job) is first and len(_PREPARED) == 1
    assert first.job.model is not model  # built from the bytes: the caller may change its model
    assert other.digest != job.digest
    assert prepared(pickle.loads(pickle.dumps(other))) is not first
    assert len(_PREPARED) == 2
    warm = run_shard(sent, item)
    assert {n: o.to_dict() for n, o in warm.observers.items()} == {
        n: o.to_dict() for n, o in cold.observers.items()
    }
    assert warm.means["c"].to_dict() == cold.means["c"].to_dict() and warm.samples == cold.samples == 3
    # bounded: a third job evicts the least recently used (``other``: ``job`` ran a shard since)
    third = _Job(model, ("y",), {"y": proto["y"]}, None, {})
    prepared(third)
    assert len(_PREPARED) == _PREPARED_MAX and other.digest not in _PREPARED and job.digest in _PREPARED
    _PREPARED.clear()


def test_split_is_contiguous_balanced_and_never_empty():
    assert split(7, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    assert split(2, 5) == [range(0, 1), range(1, 2)]
    assert split(5, 1) == [range(0, 5)]


def test_bad_engine_and_worker_count_are_named():
    from quanta.scale import make_engine

    with pytest.raises(ValueError, match="engine must be one of inprocess, local, ray, got 'spark'"):
        make_engine("spark")
    with pytest.raises(ValueError, match="workers must be an integer >= 1, got 0"):
        make_engine("local", 0)


def test_cli_workers_give_the_same_file_and_bad_options_are_named(model_path, tmp_path, capsys):
    from quanta.cli.main import main

    calib = tmp_path / "calib.npz"
    np.savez(calib, *[f["x"] for f in feeds(7)])
    one, three = tmp_path / "one.onnx", tmp_path / "three.onnx"
    assert main(["quantize", str(model_path), "-o", str(one), "--calib", str(calib)]) == 0
    assert main(["quantize", str(model_path), "-o", str(three), "--calib", str(calib), "--workers", "3"]) == 0
    assert one.read_bytes() == three.read_bytes()
    five = tmp_path / "five.onnx"
    args = ["--calib", str(calib), "--engine", "local", "--workers", "2", "--shards", "5"]
    assert main(["quantize", str(model_path), "-o", str(five), *args]) == 0
    assert one.read_bytes() == five.read_bytes()
    capsys.readouterr()
    bad = tmp_path / "bad.onnx"
    assert (
        main(["quantize", str(model_path), "-o", str(bad), "--calib", str(calib), "--address", "auto"]) == 2
    )
    assert "--address names a Ray cluster: use it with --engine ray" in capsys.readouterr().err
    assert main(["quantize", str(model_path), "-o", str(bad), "--calib", str(calib), "--workers", "0"]) == 2
    assert "--workers 0: expected an integer >= 1" in capsys.readouterr().err
    assert main(["quantize", str(model_path), "-o", str(bad), "--calib", str(calib), "--shards", "0"]) == 2
    assert "--shards 0: expected an integer >= 1" in capsys.readouterr().err
    assert not bad.exists()


def test_fold_waits_for_earlier_shards_and_names_a_missing_one():
    from quanta.calibrate import MovingAverageSteps
    from quanta.scale import ShardFold, ShardState

    def state(i: int) -> ShardState:
        obs = MovingAverageSteps(momentum=0.5)
        obs.observe(np.full(3, float(i + 1), np.float32))
        return ShardState(index=i, observers={"t": obs}, means={}, samples=1)

    fold = ShardFold()
    fold(2, state(2))
    fold(0, state(0))  # shard 1 missing: shard 2 waits
    with pytest.raises(ValueError, match="shard 1 missing"):
        fold.result()
    fold(1, state(1))
    merged = fold.result()
    single = MovingAverageSteps(momentum=0.5)
    for i in range(3):
        single.observe(np.full(3, float(i + 1), np.float32))
    assert merged.samples == 3
    assert merged.observers["t"].to_dict() == single.to_dict()


def test_merge_into_equals_merge_pair_and_copies_read_only_counts(model_path):
    """merge_into (the Ray merge task's merge) gives merge_pair's states bit for bit,
    reusing the left state's writable counts and copying read-only ones (object-store
    views), and never changes the right state."""
    from quanta.quantize.qdq import plan_qdq
    from quanta.quantize.recipe import CalibrationMethod, Recipe
    from quanta.quantize.static import load_for_quantization, make_observer_factory, prepare_float_graph
    from quanta.scale.calibrate import _for_shards, _Job, merge_into, merge_pair, run_shard

    model = load_for_quantization(str(model_path))
    prepare_float_graph(model)
    plan = plan_qdq(model.graph, Recipe())
    tensors = tuple(plan.activations_to_calibrate())
    make = make_observer_factory(Recipe(method=CalibrationMethod.ENTROPY), {})
    job = _Job(model, tensors, {n: _for_shards(make(n)) for n in tensors}, None, {})
    data = feeds()
    a, b = (run_shard(job, (i, [("feed", f) for f in data[i * 3 : i * 3 + 3]])) for i in range(2))
    want = merge_pair(a, b)
    b_before = {n: json.dumps(o.to_dict(), sort_keys=True) for n, o in b.observers.items()}
    for read_only in (False, True):
        left = pickle.loads(pickle.dumps(a))
        counts = {n: o._counts for n, o in left.observers.items() if hasattr(o, "_counts")}
        assert counts, "the entropy observers keep histogram counts"
        if read_only:
            for c in counts.values():
                c.flags.writeable = False
        got = merge_into(left, b)
        assert got is left and got.samples == want.samples
        for n in tensors:
            assert json.dumps(got.observers[n].to_dict(), sort_keys=True) == json.dumps(
                want.observers[n].to_dict(), sort_keys=True
            )
        reused = [got.observers[n]._counts is c for n, c in counts.items()]
        assert any(reused) != read_only
    assert {n: json.dumps(o.to_dict(), sort_keys=True) for n, o in b.observers.items()} == b_before


@pytest.mark.parametrize("method", ["weighted_mse", "moving_average", "entropy"])
def test_results_computed_where_parts_merge_equal_the_single_process(model_path, method):
    """calibrate_sharded(results=True): every observer's result (range, extrema,
    degeneracy) and every channel mean, computed on the part that completes each merge
    (reduce-scatter, several part counts), after a tree's root, or on the driver after its
    fold, equal what the single process's observers and means give, bit for bit."""
    from quanta.calibrate.observer import ObserverResult
    from quanta.calibrate.runner import MeanResult, calibrate
    from quanta.quantize.qdq import bias_correction_inputs, consumer_channel_weights, plan_qdq
    from quanta.quantize.recipe import Recipe
    from quanta.quantize.static import load_for_quantization, make_observer_factory, prepare_float_graph
    from quanta.scale import calibrate_sharded

    model = load_for_quantization(str(model_path))
    prepare_float_graph(model)
    recipe = Recipe(method=CalibrationMethod(method))
    plan = plan_qdq(model.graph, recipe)
    tensors = plan.activations_to_calibrate()
    weights = consumer_channel_weights(model.graph, plan) if method == "weighted_mse" else {}
    make = make_observer_factory(recipe, weights)
    means_for = bias_correction_inputs(plan)
    assert means_for, "the model has a bias to correct: channel means are asked for"
    data = feeds(13)
    single = calibrate(model, tensors, data, make, progress=False, channel_means=means_for)
    want = {n: single[n].result() for n in tensors}
    want_means = {n: m.mean() for n, m in single.mean_states.items()}
    engines = [
        ShuffledEngine(3, 0),
        TreeEngine(4, 1),
        ScatterEngine(5, 2, 3),
        ScatterEngine(4, 3, 11),
        ScatterEngine(1, 4, 1),
    ]
    for engine in engines:
        got = calibrate_sharded(
            model, tensors, data, make, engine=engine, progress=False, channel_means=means_for, results=True
        )
        assert got.samples == single.samples == 13
        for n in tensors:
            assert isinstance(got[n], ObserverResult)
            assert got[n] == want[n], (type(engine).__name__, n)
            assert got[n].degenerate(16) == single[n].degenerate(16)
        assert all(isinstance(m, MeanResult) for m in got.mean_states.values())
        assert set(got.means) == set(want_means)
        for n, mu in want_means.items():
            assert got.means[n].tobytes() == mu.tobytes(), n


def test_split_state_spreads_channel_means_by_their_cost():
    """A channel mean's integer sums cost ~_MEAN_COST bins a channel (pickled and added as
    Python integers): the cut spreads them over the parts instead of stacking every mean
    on the part with the fewest bins."""
    from quanta.calibrate import MinMaxObserver
    from quanta.calibrate.runner import ChannelMean
    from quanta.scale.calibrate import _MEAN_COST, ShardState, _cost, _mean_cost, split_state

    rng = np.random.default_rng(5)
    observers = {}
    for i, c in enumerate((3, 5, 7, 11)):
        obs = MinMaxObserver(axis=0)
        obs.observe(rng.standard_normal((c, 4)).astype(np.float32) * (i + 1))
        observers[f"o{i}"] = obs
    means = {}
    for i in range(6):
        m = ChannelMean(axis=1)
        m.observe(rng.standard_normal((1, 5, 3)) + i)
        means[f"m{i}"] = m
    state = ShardState(index=0, observers=observers, means=means, samples=1)
    assert _mean_cost(means["m0"]) == 5 * _MEAN_COST
    parts = split_state(state, 3)
    assert [len(p.means) for p in parts] == [2, 2, 2]
    loads = [
        sum(_cost(o) for o in p.observers.values()) + sum(_mean_cost(m) for m in p.means.values())
        for p in parts
    ]
    assert max(loads) - min(loads) <= 5 * _MEAN_COST


def test_split_state_spreads_range_searches():
    """A histogram observer's result runs a range search (one a tensor for the weighted
    MSE, one a channel for the others) whose cost barely depends on its bins: the cut
    counts it (_SEARCH_COST), so two small per-tensor MSE histograms go to two parts
    instead of both to the part that a large extrema-only tensor leaves lighter, where
    their searches would end after every other part's."""
    from quanta.calibrate import MinMaxObserver
    from quanta.calibrate.mse import MSEObserver
    from quanta.scale.calibrate import _SEARCH_COST, ShardState, _cost, _searches, split_state

    rng = np.random.default_rng(7)
    big = MinMaxObserver(axis=0)
    big.observe(rng.standard_normal((300_017, 3)).astype(np.float32))
    observers = {"big": big}
    for name in ("s0", "s1"):
        obs = MSEObserver()
        obs.observe(rng.standard_normal((7, 17)).astype(np.float32) + 0.5)
        observers[name] = obs
    assert _searches(big) == 0 and _searches(observers["s0"]) == 1
    assert _cost(observers["s0"]) == observers["s0"].bins + _SEARCH_COST
    assert _cost(big) == 300_017
    parts = split_state(ShardState(index=0, observers=observers, means={}, samples=1), 2)
    assert sorted(sorted(p.observers) for p in parts) == [["big", "s0"], ["s1"]]


def _cnn_proto() -> onnx.ModelProto:
    from quanta.ir.onnx_io import load, to_proto

    # through quanta's loader and writer: the proto a job serialises
    return to_proto(load(models.float_cnn().SerializeToString()))


def test_cut_tail_keeps_what_the_observed_values_need_and_nothing_else():
    """The Gemm computes the graph output only: with it unobserved it is the tail, and so
    is its weight; the kept part's sink becomes the output; the inputs stay. Observing
    the output, a name not in the main graph, or a node with a subgraph keeps the model
    whole, byte for byte."""
    from quanta.scale.calibrate import cut_tail

    proto = _cnn_proto()
    whole = proto.SerializeToString()
    assert cut_tail(proto, ["x", "c", "r", "p", "f"]) is True
    g = proto.graph
    assert [n.op_type for n in g.node] == ["Conv", "Relu", "MaxPool", "Flatten"]
    assert sorted(t.name for t in g.initializer) == ["b", "w"]
    assert [o.name for o in g.output] == ["f"] and [i.name for i in g.input] == ["x"]
    assert len(proto.SerializeToString()) < len(whole) - 5 * 84 * 4  # the 5 x 84 float weight left
    # only the Conv's output observed: everything after the Conv is tail
    proto = _cnn_proto()
    assert cut_tail(proto, ["c"]) is True
    assert [n.op_type for n in proto.graph.node] == ["Conv"] and [o.name for o in proto.graph.output] == ["c"]
    for needed in (["c", "y"], ["c", "loop/body/v"]):
        proto = _cnn_proto()
        assert cut_tail(proto, needed) is False and proto.SerializeToString() == whole
    proto = _cnn_proto()
    body = onnx.helper.make_graph([], "body", [], [])
    proto.graph.node.append(onnx.helper.make_node("If", ["c"], [], then_branch=body, else_branch=body))
    before = proto.SerializeToString()
    assert cut_tail(proto, ["c"]) is False and proto.SerializeToString() == before


def test_a_pruned_job_gives_the_in_process_states_and_value_shapes():
    """Shards of a pruned job (the Gemm and its weights not sent) observe the same
    states, means and samples as one process, and the value shapes (the driver's, of the
    whole model on the first sample) hold the tail's values too; the job that travels
    is smaller than the whole model's and one shard is not pruned (nothing to spare)."""
    from quanta.calibrate import HistogramObserver, MinMaxObserver
    from quanta.calibrate.runner import calibrate
    from quanta.ir.onnx_io import load
    from quanta.scale import calibrate_sharded
    from quanta.scale.calibrate import _Job, first_value_shapes

    model = load(models.float_cnn().SerializeToString())
    tensors = ("x", "c", "r", "f")

    def make(name):
        return HistogramObserver(bins=300, axis=1) if name == "c" else MinMaxObserver()

    data = feeds(13, seed=11)
    means = {"f": 1, "r": 1}
    want = calibrate(model, tensors, data, make, progress=False, channel_means=means)
    assert "y" in want.value_shapes
    for shards, seed in ((3, 0), (7, 1), (13, 2), (1, 3)):
        got = calibrate_sharded(
            model,
            tensors,
            data,
            make,
            engine=ShuffledEngine(4, seed),
            shards=shards,
            progress=False,
            channel_means=means,
        )
        assert {n: o.to_dict() for n, o in got.items()} == {n: o.to_dict() for n, o in want.items()}, shards
        assert {n: m.to_dict() for n, m in got.mean_states.items()} == {
            n: m.to_dict() for n, m in want.mean_states.items()
        }
        assert got.value_shapes == want.value_shapes and list(got.value_shapes) == list(want.value_shapes)
        assert got.samples == want.samples == 13
    proto = {n: make(n) for n in tensors}
    pruned = _Job(model, tensors, proto, None, means, prune=True)
    whole = _Job(model, tensors, proto, None, means)
    assert pruned.wire().pruned and not whole.wire().pruned
    assert len(pickle.dumps(pruned)) < len(pickle.dumps(whole)) - 5 * 84 * 4
    assert first_value_shapes(model, ("feed", data[0]), None) == want.value_shapes


def _wide_cnn() -> onnx.ModelProto:
    """Conv(7->17, 3x3, pad 1) -> Relu -> MaxPool 3x3 -> Flatten -> Gemm(153->7): the Conv's
    and the Gemm's weights pass 4 KB (sent as arrays beside the model's bytes), the
    biases stay in the bytes."""
    rng = np.random.default_rng(17)
    h = onnx.helper
    inits = [
        onnx.numpy_helper.from_array((rng.standard_normal((17, 7, 3, 3)) * 0.2).astype(np.float32), "w"),
        onnx.numpy_helper.from_array((rng.standard_normal(17) * 0.1).astype(np.float32), "b"),
        onnx.numpy_helper.from_array((rng.standard_normal((7, 153)) * 0.1).astype(np.float32), "fc"),
        onnx.numpy_helper.from_array(rng.standard_normal(7).astype(np.float32), "fcb"),
    ]
    nodes = [
        h.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        h.make_node("Relu", ["c"], ["r"], name="relu"),
        h.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[3, 3], strides=[3, 3]),
        h.make_node("Flatten", ["p"], ["f"], name="flat"),
        h.make_node("Gemm", ["f", "fc", "fcb"], ["y"], name="fc", transB=1),
    ]
    g = h.make_graph(
        nodes,
        "wide_cnn",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 7, 9, 11])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 7])],
        inits,
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def test_the_job_sends_its_weights_out_of_band_and_observes_as_one_process():
    """The job's large weights travel as arrays beside the model's bytes: pickled as Ray
    pickles (protocol 5, out-of-band buffers) the in-band pickle holds none of their
    data; the worker's model is the caller's (pruned: without the tail and its weight),
    byte for byte, built on the buffers as sent (read-only, not copied); shards of that
    job observe what one process observes, states and channel means alike."""
    from quanta.calibrate import HistogramObserver, MinMaxObserver
    from quanta.calibrate.runner import calibrate
    from quanta.ir.onnx_io import from_proto, load, to_proto
    from quanta.scale.calibrate import _PREPARED, _Job, cut_tail, merge_states, prepared, run_shard

    model = load(_wide_cnn().SerializeToString())
    tensors = ("x", "c", "r", "f")

    def make(name):
        return HistogramObserver(bins=300, axis=1) if name == "c" else MinMaxObserver()

    rng = np.random.default_rng(5)
    data = [
        {"x": (rng.standard_normal((1, 7, 9, 11)) * (1 + i % 3) - 0.25).astype(np.float32)} for i in range(11)
    ]
    means = {"f": 1, "r": 1}
    want = calibrate(model, tensors, data, make, progress=False, channel_means=means)
    runs = split(len(data), 3)
    for prune in (False, True):
        job = _Job(
            model,
            tensors,
            {n: make(n) for n in tensors},
            None,
            means,
            (),
            tuple(r.start for r in runs),
            prune,
        )
        bufs: list[pickle.PickleBuffer] = []
        blob = pickle.dumps(job, protocol=5, buffer_callback=bufs.append)
        sent = pickle.loads(blob, buffers=bufs)
        assert sorted(sent.arrays) == (["w"] if prune else ["fc", "w"])
        assert len(blob) < 7 * 153 * 4 and sum(memoryview(b).nbytes for b in bufs) >= 17 * 7 * 9 * 4
        inside = to_proto(model)  # the model's bytes as a job with its weights inside carried them
        if prune:
            assert cut_tail(inside, [*tensors, *means])
        _PREPARED.clear()
        built = prepared(sent).job.model
        assert to_proto(built).SerializeToString() == to_proto(from_proto(inside)).SerializeToString()
        w = built.graph.initializers["w"].const
        assert np.shares_memory(w, sent.arrays["w"]) and not w.flags.writeable
        states = [run_shard(sent, (i, [("feed", data[k]) for k in r])) for i, r in enumerate(runs)]
        got = merge_states(reversed(states))
        assert {n: o.to_dict() for n, o in got.observers.items()} == {n: o.to_dict() for n, o in want.items()}
        assert {n: m.to_dict() for n, m in got.means.items()} == {
            n: m.to_dict() for n, m in want.mean_states.items()
        }
        assert got.samples == want.samples == 11
    _PREPARED.clear()
