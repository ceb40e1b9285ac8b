"""Memory planner: invariants over random liveness patterns (no two live buffers
overlap, offsets aligned, peak >= lower bound), aliases of view outputs, and the
peak / lower-bound report on the demo and test models."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import quanta
from quanta.cli.main import random_feeds
from quanta.runtime.memory import (
    ALIGNMENT,
    Interval,
    align,
    check_plan,
    liveness,
    lower_bound,
    plan_arena,
)
from tests.ir import models


@st.composite
def liveness_patterns(draw) -> list[Interval]:
    """Up to 40 buffers over up to 30 steps; sizes from 0 to 5000 bytes (zero-sized and
    unaligned sizes included), intervals of any length."""
    n_steps = draw(st.integers(1, 30))
    n = draw(st.integers(0, 40))
    out = []
    for k in range(n):
        first = draw(st.integers(0, n_steps - 1))
        last = draw(st.integers(first, n_steps - 1))
        size = draw(st.one_of(st.integers(0, 5000), st.sampled_from([1, 63, 64, 65, 4096])))
        out.append(Interval(k, size, first, last))
    return out


@given(liveness_patterns())
def test_plan_no_two_live_buffers_overlap_and_peak_at_least_lower_bound(intervals):
    plan = plan_arena(intervals)
    check_plan(plan)  # overlap, alignment, inside the arena, peak >= lower bound
    assert plan.lower_bound == _brute_force_lower_bound(intervals)


def _brute_force_lower_bound(intervals: list[Interval]) -> int:
    steps = max((b.last for b in intervals), default=-1) + 1
    return max(
        (sum(align(b.nbytes) for b in intervals if b.first <= t <= b.last) for t in range(steps)),
        default=0,
    )


def test_check_plan_catches_overlapping_live_buffers():
    # Failure signature: two buffers live at step 1 placed on the same bytes; the
    # invariant checker must see it, or the hypothesis test above proves nothing.
    plan = plan_arena([Interval("a", 100, 0, 1), Interval("b", 100, 1, 2)])
    plan.offsets["b"] = plan.offsets["a"]
    with pytest.raises(AssertionError, match="are live together and overlap"):
        check_plan(plan)


def test_plan_chain_reuses_memory_and_reaches_the_lower_bound():
    # a -> b -> c -> d: each step reads one buffer and writes the next; two live at a time
    intervals = [Interval(k, 1000, k, k + 1) for k in range(4)]
    plan = plan_arena(intervals)
    assert plan.lower_bound == 2 * align(1000)
    assert plan.peak_bytes == plan.lower_bound
    assert plan.offsets[0] == plan.offsets[2] and plan.offsets[1] == plan.offsets[3]


def test_plan_best_fit_takes_the_smallest_gap_that_holds_the_buffer():
    # d512 and d256 die at step 1 and leave holes of 512 B (at 1024) and 256 B (at
    # 1792) between buffers live at step 5. A 128 B buffer born at step 5 must go into
    # the 256 B hole (best fit), not into the first hole that holds it.
    intervals = [
        Interval("a", 1024, 0, 9),
        Interval("d512", 512, 0, 1),
        Interval("b", 256, 0, 9),
        Interval("d256", 256, 0, 1),
        Interval("c", 192, 0, 9),
        Interval("small", 128, 5, 6),
    ]
    plan = plan_arena(intervals)
    check_plan(plan)
    assert plan.offsets == {"a": 0, "d512": 1024, "b": 1536, "d256": 1792, "c": 2048, "small": 1792}


def test_offsets_are_multiples_of_64_and_sizes_round_up():
    plan = plan_arena([Interval("x", 1, 0, 0), Interval("y", 65, 0, 0)])
    assert ALIGNMENT == 64
    assert plan.sizes == {"x": 64, "y": 128}
    assert all(off % 64 == 0 for off in plan.offsets.values())
    assert plan.peak_bytes == 192


def test_lower_bound_frees_before_allocating_at_the_same_step():
    # b is read for the last time at step 1; c is written at step 2: never live together
    assert lower_bound([Interval("b", 64, 0, 1), Interval("c", 64, 2, 3)]) == 64


def test_interval_rejects_negative_sizes_and_reversed_intervals():
    with pytest.raises(ValueError, match=r"buffer 'x': interval \[3, 2\]: expected first <= last"):
        Interval("x", 10, 3, 2)
    with pytest.raises(ValueError, match="buffer 'x': nbytes: expected >= 0, got -1"):
        Interval("x", -1, 0, 0)


def test_liveness_view_output_shares_its_input_buffer_and_extends_it():
    # Failure signature: a Reshape output placed on its own while its input's bytes are
    # reused by a later step; the view then reads overwritten memory.
    steps = [
        ("Relu", ["x"], ["a"]),  # 0
        ("Reshape", ["a", "shape"], ["v"]),  # 1: v aliases a
        ("Relu", ["v"], ["b"]),  # 2
        ("Add", ["b", "v"], ["c"]),  # 3: a must live until here through v
        ("Relu", ["c"], ["y"]),  # 4
    ]
    intervals, aliases = liveness(steps, {"a": 400, "v": 400, "b": 400, "c": 400})
    assert aliases == {"v": "a"}
    by_key = {b.key: (b.first, b.last) for b in intervals}
    assert by_key == {"a": (0, 3), "b": (2, 3), "c": (3, 4)}


def test_liveness_view_of_an_unplanned_value_needs_no_buffer():
    intervals, aliases = liveness([("Reshape", ["x", "s"], ["v"]), ("Relu", ["v"], ["y"])], {"v": 64})
    assert intervals == [] and aliases == {}


def test_liveness_buffer_viewed_by_a_graph_output_lives_to_the_end():
    steps = [
        ("Relu", ["x"], ["a"]),
        ("Flatten", ["a"], ["out"]),
        ("Relu", ["x"], ["b"]),
        ("Relu", ["b"], ["c"]),
    ]
    intervals, _ = liveness(steps, {"a": 64, "b": 64, "c": 64}, outputs=["out", "c"])
    assert {b.key: (b.first, b.last) for b in intervals}["a"] == (0, 3)


def _models():
    return {
        "digits_cnn (demo)": "quanta/cli/assets/digits_cnn.onnx",
        "float_cnn": models.float_cnn(),
        "qdq_conv": models.qdq_conv(),
        "qoperator": models.qoperator(),
        "encoder_block": models.encoder_block(),
    }


@pytest.mark.parametrize("name", list(_models()))
def test_memory_report_on_demo_and_test_models(name, capsys):
    """The planner on real graphs: invariants hold, and the peak / lower-bound ratio is
    printed (benchmarks/runtime.py reports it; the issue's target is 1.1x)."""
    import os

    src = _models()[name]
    if isinstance(src, str):
        src = os.path.join(os.path.dirname(quanta.__file__), "..", src)
    sess = quanta.InferenceSession(src, backend="reference")
    feeds = models.encoder_feeds(1)[0] if name == "encoder_block" else random_feeds(sess, batch=2)
    sess.run(None, feeds)
    plan = sess.executor.memory_plan(feeds)
    check_plan(plan)
    with capsys.disabled():
        print(f"\n  {name}: {plan.summary()}")
    assert plan.peak_bytes >= plan.lower_bound > 0
    assert plan.ratio <= 1.1  # greedy by size on these graphs; benchmarks/runtime.py prints the ratios


def test_static_plan_matches_the_first_run_plan_when_shapes_are_static():
    sess = quanta.InferenceSession(models.qdq_conv(), backend="reference")
    x = np.zeros((1, 3, 9, 5), np.float32)
    sess.run(None, {"x": x})
    static, measured = sess.plan.memory, sess.executor.memory_plan({"x": x})
    assert static is not None
    assert (static.offsets, static.peak_bytes, static.lower_bound) == (
        measured.offsets,
        measured.peak_bytes,
        measured.lower_bound,
    )


def test_liveness_split_parts_share_the_input_buffer_until_the_last_part_is_read():
    # Failure signature: a Split part (a view of its input) read after the input's
    # buffer went to another value.
    steps = [
        ("Relu", ["x"], ["a"]),  # 0
        ("Split", ["a", "sizes"], ["p0", "p1"]),  # 1: both parts alias a
        ("Relu", ["p0"], ["b"]),  # 2
        ("Relu", ["b"], ["c"]),  # 3
        ("Add", ["c", "p1"], ["y"]),  # 4: a lives until here through p1
    ]
    intervals, aliases = liveness(steps, {"a": 400, "p0": 200, "p1": 200, "b": 200, "c": 200})
    assert aliases == {"p0": "a", "p1": "a"}
    assert {b.key: (b.first, b.last) for b in intervals} == {"a": (0, 4), "b": (2, 3), "c": (3, 4)}
