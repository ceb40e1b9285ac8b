"""The calibration runner's batching of a Loop body's per-iteration values
(quanta.calibrate.runner: one observer update per feed instead of one per iteration)."""

from __future__ import annotations

import json

import pytest

import quanta.calibrate.runner as runner
from quanta.calibrate import HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver, MSEObserver
from quanta.ir.onnx_io import load
from quanta.quantize.range_choice import split_observers, unsplit
from tests.quantize.test_wild_models import _mlp_feeds, loop_reading_an_outer_value

BODY = ["loop/body/acc_in", "loop/body/acc_out"]


def _observe(make, monkeypatch, batch_bytes: int) -> dict:
    monkeypatch.setattr(runner, "BATCH_BYTES", batch_bytes)
    model = load(loop_reading_an_outer_value())
    return runner.calibrate(model, [*BODY, "acc"], _mlp_feeds(5), make, progress=False)


@pytest.mark.parametrize(
    "make",
    [
        lambda _: MinMaxObserver(),
        lambda _: HistogramObserver(bins=64),
        lambda _: MSEObserver(qmin=-128, qmax=127, bins=64),
    ],
    ids=["minmax", "histogram", "mse"],
)
def test_batched_body_values_give_the_state_of_one_update_per_iteration(make, monkeypatch):
    # BATCH_BYTES = 0 flushes after every held value: one observer update per iteration
    batched = _observe(make, monkeypatch, runner.BATCH_BYTES)
    each = _observe(make, monkeypatch, 0)
    for name in BODY:
        assert json.dumps(batched[name].to_dict(), sort_keys=True) == json.dumps(
            each[name].to_dict(), sort_keys=True
        ), name
        # 5 feeds, 3 iterations of a [2, 8] value
        assert int(batched[name]._count.sum()) == 5 * 3 * 16


def test_a_per_observation_statistic_still_sees_every_iteration(monkeypatch):
    obs = _observe(lambda _: MovingAverageMinMaxObserver(momentum=0.5), monkeypatch, runner.BATCH_BYTES)
    assert int(obs["loop/body/acc_out"]._steps.sum()) == 5 * 3
    assert int(obs["acc"]._steps.sum()) == 5


def test_split_observer_halves_are_the_even_feeds_of_body_values():
    """eq. (24)'s half observers see every other feed, all of its iterations (what the
    sharded engine calibrates: the even feeds), not every other report."""
    model = load(loop_reading_an_outer_value())
    feeds = _mlp_feeds(5)
    split = runner.calibrate(model, BODY, feeds, split_observers(lambda _: MinMaxObserver()), progress=False)
    halves = unsplit(split)
    even = runner.calibrate(model, BODY, feeds[0::2], lambda _: MinMaxObserver(), progress=False)
    for name in BODY:
        assert halves[name].to_dict() == even[name].to_dict(), name
        assert halves[name].range() != split[name].range(), name  # the odd feeds widen it
