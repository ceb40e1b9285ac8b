"""Profiling: ONNX Runtime's API (enable_profiling, end_profiling -> path), its Chrome
trace format, and the summary of the slowest steps."""

from __future__ import annotations

import itertools
import json
import re

import numpy as np
import pytest

import quanta
from tests.ir import models

X = np.random.default_rng(0).standard_normal((1, 3, 9, 5)).astype(np.float32)
EVENT_KEYS = {"cat", "pid", "tid", "dur", "ts", "ph", "name", "args"}


def test_end_profiling_writes_an_onnxruntime_style_chrome_trace(tmp_path):
    opts = quanta.SessionOptions()
    opts.profile_file_prefix = str(tmp_path / "prof")
    opts.graph_optimization_level = quanta.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep the float Conv
    sess = quanta.InferenceSession(models.qdq_conv(), sess_options=opts, enable_profiling=True)
    assert sess.get_session_options().enable_profiling
    for _ in range(2):
        sess.run(None, {"x": X})
    path = sess.end_profiling()
    assert re.fullmatch(
        re.escape(str(tmp_path / "prof")) + r"_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d{3}\.json", path
    )
    events = json.loads(open(path).read())
    assert all(set(e) == EVENT_KEYS and e["ph"] == "X" for e in events)
    session = [e["name"] for e in events if e["cat"] == "Session"]
    assert session == ["session_initialization", "model_run", "model_run"]
    nodes = [e for e in events if e["cat"] == "Node"]
    names = [s.name for s in sess.plan.steps]
    assert [e["name"] for e in nodes] == [f"{n}_kernel_time" for n in names] * 2
    conv = next(e for e in nodes if e["name"] == "conv_kernel_time")
    assert conv["args"]["op_name"] == "Conv"
    assert conv["args"]["provider"] == "quanta:reference"
    assert conv["args"]["input_type_shape"] == [{"float": [1, 3, 9, 5]}, {"float": [7, 3, 3, 3]}]
    assert conv["args"]["output_type_shape"] == [{"float": [1, 7, 9, 5]}]
    assert conv["args"]["output_size"] == str(7 * 9 * 5 * 4)
    runs = [e for e in events if e["name"] == "model_run"]
    for run, first in zip(runs, (0, len(names))):
        steps = nodes[first : first + len(names)]
        assert run["ts"] <= steps[0]["ts"] and all(a["ts"] <= b["ts"] for a, b in itertools.pairwise(steps))
        # 2: ts and dur are each rounded down to whole microseconds
        assert steps[-1]["ts"] + steps[-1]["dur"] <= run["ts"] + run["dur"] + 2
    # profiling stopped: more runs are not recorded, a second end_profiling writes nothing
    sess.run(None, {"x": X})
    assert sess.end_profiling() == ""
    assert sess.profile_summary().runs == 2


def test_session_options_turn_profiling_on(tmp_path):
    opts = quanta.SessionOptions()
    opts.enable_profiling = True
    opts.profile_file_prefix = str(tmp_path / "p")
    sess = quanta.InferenceSession(models.float_cnn(), sess_options=opts, backend="reference")
    sess.run(None, {"x": np.zeros((2, 3, 8, 6), np.float32)})
    assert sess.get_profiling_start_time_ns() > 0
    assert sess.end_profiling().startswith(str(tmp_path / "p_"))


def test_profiling_off_by_default():
    sess = quanta.InferenceSession(models.qdq_conv())
    sess.run(None, {"x": X})
    assert sess.end_profiling() == ""
    assert sess.get_profiling_start_time_ns() == 0
    with pytest.raises(RuntimeError, match="profiling is off: create the session with enable_profiling=True"):
        sess.profile_summary()


def test_profile_summary_lists_the_slowest_steps_first():
    opts = quanta.SessionOptions()
    opts.graph_optimization_level = quanta.GraphOptimizationLevel.ORT_DISABLE_ALL  # 6 steps as written
    sess = quanta.InferenceSession(models.qdq_conv(), sess_options=opts, enable_profiling=True)
    for _ in range(3):
        sess.run(None, {"x": X})
    summary = sess.profile_summary(top=4)
    assert summary.runs == 3 and summary.n_steps == 6 and len(summary.steps) == 4
    totals = [s.total_us for s in summary.steps]
    assert totals == sorted(totals, reverse=True)
    assert all(s.calls == 3 for s in summary.steps)
    assert 0 < sum(s.share for s in summary.steps) <= 1 + 1e-9
    assert summary.run_us_per_run >= summary.step_us_per_run > 0
    text = str(summary).splitlines()
    assert text[0].startswith("slowest 4 of 6 steps over 3 profiled runs: run ")
    assert text[1].split() == ["step", "node", "op", "kernel", "mean", "ms", "share"]
    assert len(text) == 2 + 4
