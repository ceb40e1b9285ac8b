"""quanta.scale on a real (local, 2-CPU) Ray cluster started by the tests: the quantized
file is byte-identical to the single process's for several worker counts; a worker
process killed (SIGKILL) in the middle of its shard is re-run by Ray and changes nothing;
batch inference over Ray Data returns what a loop over ``InferenceSession.run`` returns.
Skipped when Ray is not installed (``pip install quanta[ray]``)."""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time

import numpy as np
import onnx
import pytest

ray = pytest.importorskip("ray")

import quanta  # noqa: E402
from quanta.calibrate import MinMaxObserver  # noqa: E402
from quanta.calibrate.runner import calibrate  # noqa: E402
from quanta.ir.onnx_io import load  # noqa: E402
from quanta.scale import RayEngine, calibrate_sharded, run_dataset  # noqa: E402
from quanta.scale.calibrate import split  # noqa: E402
from tests.ir import models  # noqa: E402
from tests.scale.test_calibrate_sharded import feeds  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    # the observer below is defined here, not in an installed module: send it by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("ray") / "cnn.onnx"
    onnx.save(models.float_cnn(), p)
    return p


@pytest.mark.parametrize("method", ["weighted_mse", "moving_average"])
def test_ray_file_is_byte_identical_for_several_worker_counts(cluster, model_path, tmp_path, method):
    data = feeds(9)
    one = tmp_path / "one.onnx"
    quanta.quantize_static(str(model_path), str(one), data, method=method, verbose=False)
    for workers in (1, 3, 4):
        out = tmp_path / f"ray{workers}.onnx"
        quanta.quantize_static(
            str(model_path), str(out), data, method=method, verbose=False, engine="ray", workers=workers
        )
        assert out.read_bytes() == one.read_bytes(), workers


@pytest.mark.parametrize("method", ["weighted_mse", "moving_average"])
def test_ray_with_more_shards_than_workers_gives_the_same_file(cluster, model_path, tmp_path, method):
    """Shards handed out to 2 workers as they free up (each worker runs several, with the
    job it prepared once): byte for byte the in-process file, for 4 shards per worker
    (SHARDS_PER_WORKER, what the default gives large sample counts) and an uneven count."""
    data = feeds(11)
    one = tmp_path / "one.onnx"
    quanta.quantize_static(str(model_path), str(one), data, method=method, verbose=False)
    for shards in (8, 5):
        out = tmp_path / f"ray-{shards}.onnx"
        quanta.quantize_static(
            str(model_path),
            str(out),
            data,
            method=method,
            verbose=False,
            engine="ray",
            workers=2,
            shards=shards,
        )
        assert out.read_bytes() == one.read_bytes(), shards


def test_ray_results_on_the_workers_equal_the_single_process(cluster, model_path):
    """calibrate_sharded(results=True) on Ray: each part's results computed by the task
    that merges its last shard in (the only shard's task for one shard), joined on the
    driver, equal the single process's observers' results and means, bit for bit."""
    from quanta.quantize.qdq import bias_correction_inputs, consumer_channel_weights, plan_qdq
    from quanta.quantize.recipe import Recipe
    from quanta.quantize.static import load_for_quantization, make_observer_factory, prepare_float_graph

    model = load_for_quantization(str(model_path))
    prepare_float_graph(model)
    recipe = Recipe()
    plan = plan_qdq(model.graph, recipe)
    tensors = plan.activations_to_calibrate()
    make = make_observer_factory(recipe, consumer_channel_weights(model.graph, plan))
    means_for = bias_correction_inputs(plan)
    data = feeds(10)
    single = calibrate(model, tensors, data, make, progress=False, channel_means=means_for)
    for workers, shards in ((1, None), (2, 5), (3, 3)):
        got = calibrate_sharded(
            model,
            tensors,
            data,
            make,
            engine=RayEngine(workers),
            shards=shards,
            progress=False,
            channel_means=means_for,
            results=True,
        )
        for n in tensors:
            assert got[n] == single[n].result(), (workers, shards, n)
        assert {n: m.tobytes() for n, m in got.means.items()} == {
            n: m.tobytes() for n, m in single.means.items()
        }


class WaitToBeKilled(MinMaxObserver):
    """MinMax, except that the first worker to observe a value writes its pid and waits
    (for the test to SIGKILL it); a re-run finds the pid file and goes on."""

    kind = ""  # not registered: observer_from_dict keeps meaning MinMax by "minmax"

    def __init__(self, pid_file: str, **kw) -> None:
        super().__init__(**kw)
        self.pid_file = pid_file

    def observe(self, x: np.ndarray) -> None:
        try:
            fd = os.open(self.pid_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            time.sleep(120)  # killed long before
        super().observe(x)


def test_a_worker_killed_mid_shard_is_rerun_and_changes_nothing(cluster, model_path, tmp_path):
    model = load(str(model_path))
    data = feeds(8)
    tensors = ["x", "c", "r", "y"]
    pid_file = str(tmp_path / "victim.pid")
    single = calibrate(model, tensors, data, lambda n: MinMaxObserver(), progress=False)

    def kill_when_ready() -> None:
        while not os.path.exists(pid_file) or not open(pid_file).read():
            time.sleep(0.05)
        os.kill(int(open(pid_file).read()), signal.SIGKILL)

    killer = threading.Thread(target=kill_when_ready, daemon=True)
    killer.start()
    make = lambda n: WaitToBeKilled(pid_file) if n == "c" else MinMaxObserver()  # noqa: E731
    got = calibrate_sharded(model, tensors, data, make, engine=RayEngine(workers=2), progress=False)
    killer.join(timeout=5)
    assert not killer.is_alive()  # a worker was killed
    assert got.samples == single.samples == 8  # nothing counted twice
    for name in tensors:
        assert got[name].to_dict()["state"] == single[name].to_dict()["state"], name
        assert got[name].range() == single[name].range()


def test_debugger_on_ray_gives_the_single_process_report(cluster, tmp_path):
    """quanta.debug.compare(..., engine="ray"): shards on Ray workers, statistics merged
    exactly, the same report as one process."""
    from quanta.debug.compare import compare
    from tests.debug.test_compare import _quantized, chain, chain_feeds

    src, q = _quantized(tmp_path, chain())
    data = chain_feeds(7, 4, batch=3)
    want = compare(src, q, data).to_json()
    assert compare(src, q, data, engine="ray", workers=3).to_json() == want


def test_batch_inference_over_ray_data_equals_a_session_loop(cluster, model_path, tmp_path):
    int8 = tmp_path / "cnn.int8.onnx"
    quanta.quantize_static(str(model_path), str(int8), feeds(6), verbose=False)
    inputs = [f["x"] for f in feeds(13, seed=11)]
    sess = quanta.InferenceSession(str(int8))
    want = [sess.run(None, {"x": x})[0] for x in inputs]
    ds = ray.data.from_items([{"x": x} for x in inputs])
    factory = functools.partial(quanta.InferenceSession, str(int8))
    rows = run_dataset(ds, factory, concurrency=2, batch_size=4, num_cpus=0.5).take_all()
    assert len(rows) == len(inputs)
    for row, x, y in zip(rows, inputs, want):
        assert np.array_equal(row["x"], x)  # input order kept
        assert row["y"].dtype == y.dtype and row["y"].tobytes() == y.tobytes()


def test_split_covers_every_sample_once():
    runs = split(10, 4)
    assert [i for r in runs for i in r] == list(range(10))


def test_quanta_run_on_ray_writes_one_output_per_input_and_resumes(cluster, model_path, tmp_path, capsys):
    from quanta.cli.main import main

    int8 = tmp_path / "cnn.int8.onnx"
    quanta.quantize_static(str(model_path), str(int8), feeds(6), verbose=False)
    inputs, outdir = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    xs = [f["x"] for f in feeds(5, seed=4)]
    for i, x in enumerate(xs):
        np.savez(inputs / f"{i:03d}.npz", x=x)
    args = ["run", str(int8), "--inputs", str(inputs), "-o", str(outdir), "--engine", "ray", "--workers", "1"]
    assert main(args) == 0
    assert "ran 5 input(s), 0 already done" in capsys.readouterr().out
    sess = quanta.InferenceSession(str(int8))
    for i, x in enumerate(xs):
        with np.load(outdir / f"{i:03d}.npz") as d:
            assert d["y"].tobytes() == sess.run(None, {"x": x})[0].tobytes()
    (outdir / "002.npz").unlink()  # as if the run had failed before this one
    assert main(args) == 0
    assert "ran 1 input(s), 4 already done" in capsys.readouterr().out
