"""quanta.quantize.replay: GPTQ's statistics from the calibration pass's kept values give
the file the second pass over the data gives, byte for byte. Failure signature it guards
against: a replay that hands a layer another feed's value, or another layer's, or a
value whose arena slot a later step overwrote (no copy): the Gram sums change, GPTQ
rounds the weights differently, and nothing fails but the file's bytes."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
import quanta.quantize.static as static_module
from quanta.quantize import replay as replay_module
from quanta.quantize.replay import InputReplay


def _model() -> onnx.ModelProto:
    """Conv 3 -> 7 (3x3, stride 2, padded; K = 27), Relu, Conv 7 -> 17 (3x3; K = 63, the
    native Gram), Relu, a second reader of the first Relu (1x1 Conv 7 -> 3), Add-free heads."""
    rng = np.random.default_rng(11)
    inits = [
        numpy_helper.from_array((rng.standard_normal((7, 3, 3, 3)) * 0.4).astype(np.float32), "w1"),
        numpy_helper.from_array((rng.standard_normal(7) * 0.1).astype(np.float32), "b1"),
        numpy_helper.from_array((rng.standard_normal((17, 7, 3, 3)) * 0.2).astype(np.float32), "w2"),
        numpy_helper.from_array((rng.standard_normal(17) * 0.1).astype(np.float32), "b2"),
        numpy_helper.from_array((rng.standard_normal((3, 7, 1, 1)) * 0.5).astype(np.float32), "w3"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], "conv1", strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], "relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], "conv2", pads=[1, 0, 1, 0]),
        helper.make_node("Relu", ["c2"], ["y"], "relu2"),
        helper.make_node("Conv", ["r1", "w3"], ["z"], "conv3"),
    ]
    g = helper.make_graph(
        nodes,
        "replay",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 19, 23])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, None),
        ],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(n: int = 7) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(5)
    # distinct scales and offsets per feed: ranges and Gram sums differ feed to feed
    return [
        {"x": (rng.standard_normal((1, 3, 19, 23)) * (0.5 + 0.3 * i) + 0.1 * i).astype(np.float32)}
        for i in range(n)
    ]


def _quantize(tmp_path, name: str, monkeypatch) -> tuple[str, int]:
    """(sha256 of the file, number of statistics passes over the data)."""
    passes = [0]
    calibrate = static_module.calibrate

    def counting(*args, **kwargs):
        if kwargs.get("stats"):
            passes[0] += 1
        return calibrate(*args, **kwargs)

    monkeypatch.setattr(static_module, "calibrate", counting)
    out = tmp_path / f"{name}.onnx"
    quanta.quantize_static(_model(), str(out), _feeds(), verbose=False, progress=False)
    monkeypatch.setattr(static_module, "calibrate", calibrate)
    return hashlib.sha256(out.read_bytes()).hexdigest(), passes[0]


def test_replayed_statistics_write_the_file_the_second_pass_writes(tmp_path, monkeypatch):
    replayed, passes = _quantize(tmp_path, "replayed", monkeypatch)
    assert passes == 0  # the kept values fed GPTQ: no second pass ran
    again, _ = _quantize(tmp_path, "again", monkeypatch)
    assert again == replayed  # deterministic
    monkeypatch.setattr(replay_module, "REPLAY_BYTES", 0)
    rerun, passes = _quantize(tmp_path, "rerun", monkeypatch)
    assert passes == 1  # nothing fits: the second pass runs
    assert rerun == replayed


def test_a_budget_passed_midway_falls_back_to_the_second_pass(tmp_path, monkeypatch):
    """The budget runs out after a few feeds: the kept values are dropped, the pass runs
    and the file is the same."""
    full, _ = _quantize(tmp_path, "full", monkeypatch)
    # conv1 reads x (3·19·23 floats), conv2 and conv3 read r1 (7·10·12): ~2.5 feeds
    per_feed = 4 * (3 * 19 * 23 + 7 * 10 * 12)
    monkeypatch.setattr(replay_module, "REPLAY_BYTES", int(2.5 * per_feed))
    part, passes = _quantize(tmp_path, "part", monkeypatch)
    assert passes == 1
    assert part == full


class _Layer:
    def __init__(self, x_name: str) -> None:
        self.x_name = x_name
        self.seen: list[np.ndarray] = []

    def observe(self, x: np.ndarray) -> None:
        self.seen.append(x)


def test_replay_hands_each_layer_its_own_values_in_feed_order_as_copies():
    r = InputReplay(["a", "b"], budget=1 << 20)
    taps = r.taps()
    arena = np.zeros(5, np.float32)
    for i in range(3):
        arena[:] = i  # the run's arena: the same buffer every feed
        taps["a"][0](arena)
        taps["b"][0](arena * 10 + 1)
    a, b, a2 = _Layer("a"), _Layer("b"), _Layer("a")
    assert r.replay([a, b, a2], 3)
    assert [float(v[0]) for v in a.seen] == [0.0, 1.0, 2.0]
    assert [float(v[0]) for v in b.seen] == [1.0, 11.0, 21.0]
    assert [float(v[0]) for v in a2.seen] == [0.0, 1.0, 2.0]


@pytest.mark.parametrize(
    "calls, samples, reason",
    [
        (2, 3, "a value missing from one feed"),
        (6, 3, "a value that came twice a feed (a Loop body's)"),
        (0, 0, "no calibration pass"),
    ],
)
def test_replay_refuses_values_not_kept_once_per_feed(calls, samples, reason):
    r = InputReplay(["a"], budget=1 << 20)
    for i in range(calls):
        r.taps()["a"][0](np.full(3, i, np.float32))
    layer = _Layer("a")
    assert not r.replay([layer], samples), reason
    assert layer.seen == []
    assert r.values == {}  # the copies are released once the pass has to run


def test_replay_refuses_after_the_budget_ran_out():
    r = InputReplay(["a"], budget=3 * 4 * 2)  # two values of 3 float32
    tap = r.taps()["a"][0]
    for i in range(3):
        tap(np.full(3, i, np.float32))
    assert not r.complete and r.nbytes == 0
    assert not r.replay([_Layer("a")], 3)
