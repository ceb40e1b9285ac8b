"""Eq. (30) (docs/calibration.md): ``quantize_static`` with ``recurrent: auto`` (the
default) measures its file with the LSTMs / GRUs quantized per step (DynamicQuantizeLSTM /
DynamicQuantizeGRU) against the same file with them float, on held-out calibration feeds,
and keeps them float when that loses more than RECURRENT_LOSS_DB at the outputs.

The losing case is built so that eq. (26)'s spread rule does not see it: the LSTM's
input carries one channel with a large offset (60, read by tiny weights) next to 16
informative channels in [-0.4, 0.4]. Per step, DynamicQuantizeLSTM quantizes x over its
whole range, so the informative channels get a step of ~0.24 (3-4 levels), while few of
them lie below half that step (eq. (26)'s share stays under SPREAD_LIMIT). The fine case
is the same network over zero-centred data (a loss of ~3 dB)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.calibrate import SPREAD
from quanta.quantize.range_choice import (
    RECURRENT_BAR_DB,
    RECURRENT_LOSS_DB,
    RecurrentChoice,
    measure_recurrent,
    recurrent_decision,
)
from quanta.quantize.recipe import Recipe, RecurrentMode

STEPS, BATCH, INPUTS, HIDDEN = 23, 3, 17, 7
OFFSET = 60.0


def lstm_net(op: str = "LSTM", seed: int = 0) -> onnx.ModelProto:
    """x [T, B, 17] -> LSTM / GRU (hidden 7) -> its last state -> Gemm [B, 5]; input
    channel 0's weights are 100x smaller than the others' (the offset channel)."""
    rng = np.random.default_rng(seed)
    gates = 4 if op == "LSTM" else 3
    w = (rng.standard_normal((1, gates * HIDDEN, INPUTS)) * 0.8).astype(np.float32)
    w[:, :, 0] *= 0.01
    inits = [
        numpy_helper.from_array(w, "W"),
        numpy_helper.from_array(
            (rng.standard_normal((1, gates * HIDDEN, HIDDEN)) * 0.4).astype(np.float32), "R"
        ),
        numpy_helper.from_array((rng.standard_normal((1, 2 * gates * HIDDEN)) * 0.2).astype(np.float32), "B"),
        numpy_helper.from_array((rng.standard_normal((HIDDEN, 5)) * 0.5).astype(np.float32), "fc_w"),
        numpy_helper.from_array((rng.standard_normal(5) * 0.1).astype(np.float32), "fc_b"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
    ]
    nodes = [
        helper.make_node(op, ["x", "W", "R", "B"], ["y", "y_h"], name="rnn", hidden_size=HIDDEN),
        helper.make_node("Squeeze", ["y_h", "axis0"], ["h"], name="last"),
        helper.make_node("Gemm", ["h", "fc_w", "fc_b"], ["out"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "lstm_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [STEPS, BATCH, INPUTS])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [BATCH, 5])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def offset_feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.uniform(-0.4, 0.4, (STEPS, BATCH, INPUTS))
        x[:, :, 0] = OFFSET + rng.uniform(-1.0, 1.0, (STEPS, BATCH))
        out.append({"x": x.astype(np.float32)})
    return out


def ordinary_feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Zero-centred inputs: every channel uses the per-step grid (the fine case loses ~3 dB)."""
    rng = np.random.default_rng(seed)
    return [{"x": rng.uniform(-0.5, 0.5, (STEPS, BATCH, INPUTS)).astype(np.float32)} for _ in range(n)]


def _sqnr(src, path, feeds) -> float:
    ref_s, got_s = quanta.InferenceSession(str(src)), quanta.InferenceSession(str(path))
    ref = np.concatenate([ref_s.run(None, f)[0] for f in feeds]).astype(np.float64)
    got = np.concatenate([got_s.run(None, f)[0] for f in feeds]).astype(np.float64)
    return float(10 * np.log10(np.sum(ref**2) / np.sum((ref - got) ** 2)))


def _ops(path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path)).graph.node]


def _recorded(path) -> Recipe:
    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    return Recipe.from_dict(json.loads(meta["quanta.recipe"]))


def _note(summary) -> list[str]:
    return [n for n in summary.notes if "eq. (30)" in n]


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_a_recurrent_layer_that_loses_at_the_outputs_stays_float_with_the_measured_reason(tmp_path, op):
    src, dst = tmp_path / "net.onnx", tmp_path / "net.q.onnx"
    onnx.save(lstm_net(op), src)
    gru = {"gru_min_step_macs": 0}  # the toy GRU is below the default size bar
    summary = quanta.quantize_static(src, dst, offset_feeds(6, 1), verbose=False, progress=False, **gru)
    reasons = [r for _, o, r in summary.float_nodes if o == op]
    assert len(reasons) == 1 and reasons[0].startswith("eq. (30)"), summary.float_nodes
    assert not reasons[0].startswith(SPREAD)  # eq. (26) does not see this input
    (note,) = _note(summary)
    assert note.startswith(
        "recurrent layers (eq. (30)): float: worst output SQNR on 3 held-out calibration feed(s)"
    )
    assert (
        op in _ops(dst) and "DynamicQuantizeLSTM" not in _ops(dst) and "DynamicQuantizeGRU" not in _ops(dst)
    )
    assert ("fc", "Gemm") in summary.quantized  # the rest of the file is still quantized
    assert _recorded(dst).recurrent is RecurrentMode.FLOAT
    # what it avoids, on data the choice did not see: the file with the layer dynamic
    forced = tmp_path / "forced.onnx"
    quanta.quantize_static(
        src, forced, offset_feeds(6, 1), verbose=False, progress=False, recurrent="dynamic", **gru
    )
    assert "DynamicQuantize" + op in [o for o in _ops(forced)]
    ev = offset_feeds(4, 9)
    assert _sqnr(src, dst, ev) > _sqnr(src, forced, ev) + RECURRENT_LOSS_DB


def test_a_recurrent_layer_that_measures_fine_stays_dynamic_and_the_recipe_reproduces_the_file(tmp_path):
    src, dst = tmp_path / "net.onnx", tmp_path / "net.q.onnx"
    onnx.save(lstm_net(), src)
    feeds = ordinary_feeds(6, 3)
    summary = quanta.quantize_static(src, dst, feeds, verbose=False, progress=False)
    assert not [r for _, o, r in summary.float_nodes if o == "LSTM"]
    (note,) = _note(summary)
    assert note.startswith("recurrent layers (eq. (30)): dynamic: worst output SQNR on 3 held-out")
    assert "DynamicQuantizeLSTM" in _ops(dst)
    recorded = _recorded(dst)
    assert recorded.recurrent is RecurrentMode.DYNAMIC
    # the recorded choice measures nothing again and writes the same file
    again = tmp_path / "again.onnx"
    summary2 = quanta.quantize_static(src, again, feeds, recorded, verbose=False, progress=False)
    assert not _note(summary2)
    assert again.read_bytes() == dst.read_bytes()


def test_the_users_recurrent_mode_is_not_measured(tmp_path):
    src = tmp_path / "net.onnx"
    onnx.save(lstm_net(), src)
    for mode, op in (("dynamic", "DynamicQuantizeLSTM"), ("float", "LSTM")):
        dst = tmp_path / f"{mode}.onnx"
        summary = quanta.quantize_static(
            src, dst, offset_feeds(6, 1), verbose=False, progress=False, recurrent=mode
        )
        assert not _note(summary)
        assert op in _ops(dst)
    reasons = [r for _, o, r in summary.float_nodes if o == "LSTM"]
    assert reasons == ["the recipe keeps recurrent ops float (recurrent: float)"]


def test_too_few_held_out_feeds_keep_the_layers_dynamic(tmp_path):
    src, dst = tmp_path / "net.onnx", tmp_path / "net.q.onnx"
    onnx.save(lstm_net(), src)
    # 3 calibration feeds: one odd feed held out, fewer than MIN_FEEDS
    summary = quanta.quantize_static(src, dst, offset_feeds(3, 1), verbose=False, progress=False)
    (note,) = _note(summary)
    assert note.startswith(
        "recurrent layers (eq. (30)): dynamic, not measured (1 held-out calibration feed(s)"
    )
    assert "DynamicQuantizeLSTM" in _ops(dst)
    assert _recorded(dst).recurrent is RecurrentMode.DYNAMIC


def test_a_model_without_recurrent_layers_records_dynamic_and_measures_nothing(tmp_path):
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.standard_normal((INPUTS, 7)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, INPUTS])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [BATCH, 7])],
        [w],
    )
    src, dst = tmp_path / "mm.onnx", tmp_path / "mm.q.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
    feeds = [{"x": rng.uniform(-1, 3, (BATCH, INPUTS)).astype(np.float32)} for _ in range(6)]
    summary = quanta.quantize_static(src, dst, feeds, verbose=False, progress=False)
    assert not _note(summary)
    assert _recorded(dst).recurrent is RecurrentMode.DYNAMIC


def test_quantize_dynamic_reads_auto_as_dynamic(tmp_path):
    src, dst = tmp_path / "net.onnx", tmp_path / "net.dyn.onnx"
    onnx.save(lstm_net(), src)
    quanta.quantize_dynamic(src, dst, verbose=False)
    assert "DynamicQuantizeLSTM" in _ops(dst)
    assert _recorded(dst).recurrent is RecurrentMode.DYNAMIC


@pytest.mark.parametrize(
    ("dynamic", "float_", "keep_float"),
    [
        (20.0, 20.0 + RECURRENT_LOSS_DB, False),  # a loss of exactly the margin keeps them dynamic
        (20.0, 20.0 + RECURRENT_LOSS_DB + 0.01, True),
        (RECURRENT_BAR_DB - 0.01, 80.0, True),
        (RECURRENT_BAR_DB, 80.0, False),  # at the bar the quantized file is close enough
        (36.0, 45.3, True),
        (41.7, 60.0, False),
        (19.6, 39.9, True),
        (15.0, 10.0, False),  # float worse: dynamic
    ],
)
def test_recurrent_decision_is_eq_30(dynamic, float_, keep_float):
    assert recurrent_decision(dynamic, float_) is keep_float
    choice = RecurrentChoice(keep_float, dynamic, float_, 8)
    assert choice.note().startswith(
        f"recurrent layers (eq. (30)): {'float' if keep_float else 'dynamic'}: worst output SQNR on 8 "
        f"held-out calibration feed(s) {dynamic:.1f} dB with them dynamic, {float_:.1f} dB with them float"
    )
    if keep_float:
        assert choice.node_reason().startswith(
            f"eq. (30): quantized per step, the recurrent layers take the worst output to {dynamic:.1f} dB"
        )


def test_a_candidate_that_does_not_run_keeps_the_layers_dynamic(tmp_path):
    src = tmp_path / "net.onnx"
    onnx.save(lstm_net(), src)
    feeds = ordinary_feeds(4, 3)

    def outputs(path, feeds):
        if path.endswith("float.onnx"):
            raise RuntimeError("no kernel for X")
        return [quanta.InferenceSession(path).run(None, f) for f in feeds]

    choice = measure_recurrent(str(src), "m1", "m2", feeds, lambda m, p: onnx.save(lstm_net(), p), outputs)
    assert not choice.keep_float and choice.dynamic is None
    assert (
        choice.note()
        == "recurrent layers (eq. (30)): dynamic, not measured (float did not run: RuntimeError: no kernel for X)"
    )


def test_an_lstm_inside_a_branch_is_measured_with_the_file(tmp_path):
    from tests.quantize.test_bodies import lstm_if_model

    src, dst = tmp_path / "lstm.onnx", tmp_path / "lstm.q.onnx"
    onnx.save(lstm_if_model(), src)
    rng = np.random.default_rng(2)
    feeds = [
        {"x": rng.standard_normal((6, 3, 1, 1)).astype(np.float32), "flag": np.array(True)} for _ in range(6)
    ]
    summary = quanta.quantize_static(src, dst, feeds, verbose=False, progress=False)
    (note,) = _note(summary)
    # the LSTM inside the branch is found and measured (the branch's Conv stays float in a
    # body, so the float-LSTM file is exact); it measures above the bar and stays dynamic
    assert note.startswith("recurrent layers (eq. (30)): dynamic: worst output SQNR on 3 held-out")
    assert ("branch/then_branch/lstm", "LSTM") in summary.quantized
    then_g = next(a.g for a in onnx.load(str(dst)).graph.node[0].attribute if a.name == "then_branch")
    assert "DynamicQuantizeLSTM" in [n.op_type for n in then_g.node]
