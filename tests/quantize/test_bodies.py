"""Quantization inside If / Loop / Scan bodies (quanta.quantize.bodies).

Failure signatures guarded against: calibration never sees a body's tensors (so every
body stays float, "0 MACs"), ranges of two branches that reuse a name get mixed, a Q/DQ
name created in a body clashes with the main graph's (onnx.checker: "SSA form"), the
branch the calibration data never took gets quantized with no range, coverage counts
neither branch, and an LSTM inside a branch stays float instead of becoming
DynamicQuantizeLSTM as in the main graph.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.calibrate.minmax import MinMaxObserver
from quanta.calibrate.runner import calibrate
from quanta.ir.onnx_io import load
from quanta.quantize.static import SUBGRAPH_STATIC_REASON
from tests.ort_int8 import REDUCE_RANGE, ort_session_options

F = TensorProto.FLOAT
ort = pytest.importorskip("onnxruntime")


def _conv_branch(name: str, second_weight: bool, act: str) -> onnx.GraphProto:
    """x (outer) -> Conv(w1, outer weight) -> act [-> Conv(w2, the branch's own weight)]."""
    rng = np.random.default_rng(len(name))
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], [f"{name}_c1"], name="conv1", pads=[1, 1, 1, 1])]
    nodes.append(helper.make_node(act, [f"{name}_c1"], [f"{name}_a"], name="act"))
    inits = []
    out = f"{name}_a"
    if second_weight:
        inits.append(
            numpy_helper.from_array((rng.standard_normal((3, 7, 1, 1)) * 0.4).astype(np.float32), "w2")
        )
        nodes.append(helper.make_node("Conv", [out, "w2"], [f"{name}_c2"], name="conv2"))
        out = f"{name}_c2"
    channels = 3 if second_weight else 7
    return helper.make_graph(
        nodes, name, [], [helper.make_tensor_value_info(out, F, [1, channels, 5, 9])], inits
    )


def if_conv_model() -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    inits = [
        numpy_helper.from_array((rng.standard_normal((7, 3, 3, 3)) * 0.3).astype(np.float32), "w1"),
        numpy_helper.from_array((rng.standard_normal(7) * 0.1).astype(np.float32), "b1"),
    ]
    node = helper.make_node(
        "If",
        ["flag"],
        ["y"],
        name="branch",
        then_branch=_conv_branch("then", True, "Relu"),
        else_branch=_conv_branch("else", False, "Sigmoid"),
    )
    g = helper.make_graph(
        [node],
        "if_conv",
        [
            helper.make_tensor_value_info("x", F, [1, 3, 5, 9]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", F, [1, "c", 5, 9])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(n: int, flag: bool, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {"x": rng.standard_normal((1, 3, 5, 9)).astype(np.float32), "flag": np.array(flag)} for _ in range(n)
    ]


def test_calibration_observes_body_tensors_under_scoped_names():
    model = load(if_conv_model())
    feeds = _feeds(3, True)
    observers = calibrate(
        model,
        ["branch/then_branch/then_c1", "branch/else_branch/else_c1"],
        feeds,
        lambda _: MinMaxObserver(),
        progress=False,
    )
    w1, b1 = (numpy_helper.to_array(t) for t in if_conv_model().graph.initializer)
    ort_sess = ort.InferenceSession(
        _conv_only(w1, b1).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    c1 = np.stack([ort_sess.run(None, {"x": f["x"]})[0] for f in feeds])
    ext = observers["branch/then_branch/then_c1"].extrema()
    lo, hi = ext.min, ext.max
    # float32 convolutions of 27 terms, two implementations: 1e-5 relative covers the
    # summation-order ulps at magnitudes below 10
    np.testing.assert_allclose([lo, hi], [c1.min(), c1.max()], rtol=1e-5, atol=1e-6)
    assert observers["branch/else_branch/else_c1"].degenerate() == "no values observed"


def _conv_only(w1, b1) -> onnx.ModelProto:
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1])],
        "conv",
        [helper.make_tensor_value_info("x", F, [1, 3, 5, 9])],
        [helper.make_tensor_value_info("c", F, [1, 7, 5, 9])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_quantize_inside_the_branch_the_data_took(tmp_path):
    src, out = tmp_path / "if.onnx", tmp_path / "if.int8.onnx"
    onnx.save(if_conv_model(), src)
    summary = quanta.quantize_static(src, out, _feeds(8, True), verbose=False, subgraphs="quantize")
    assert {("branch/then_branch/conv1", "Conv"), ("branch/then_branch/conv2", "Conv")} <= set(
        summary.quantized
    )
    (else_conv,) = [r for name, _, r in summary.float_nodes if name == "branch/else_branch/conv1"]
    assert "never ran branch/else_branch" in else_conv
    written = onnx.load(str(out))
    onnx.checker.check_model(written, full_check=True)
    (if_node,) = [n for n in written.graph.node if n.op_type == "If"]
    then_g = next(a.g for a in if_node.attribute if a.name == "then_branch")
    ops = [n.op_type for n in then_g.node]
    assert ops.count("QuantizeLinear") >= 2 and ops.count("DequantizeLinear") >= 4
    # names the quantizer made in a body carry its scope: no clash with the main graph's
    created = [t.name for t in then_g.initializer if t.name != "w2"]
    assert created and all(name.startswith("branch/then_branch/") for name in created)
    # the coverage counts the branch the calibration data ran, and it runs in integer
    assert summary.coverage.integer_share == 1.0
    assert summary.coverage.total_macs == 7 * 27 * 45 + 3 * 7 * 45
    assert summary.coverage.notes == ["branch (If): MACs of then_branch, the branch the calibration data ran"]
    feed = _feeds(1, True, seed=5)[0]
    so = ort_session_options()  # tests/ort_int8.py
    (y_ort,) = ort.InferenceSession(str(out), so, providers=["CPUExecutionProvider"]).run(None, feed)
    (y_float,) = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feed)
    # two 8-bit activations and 8-bit weights on K=27 and K=7: within 5 % of the range
    assert np.abs(y_ort - y_float).max() <= 0.05 * np.abs(y_float).max()
    ys = {}
    for backend in ("native", "reference"):
        sess = quanta.InferenceSession(str(out), backend=backend)
        (y,) = ys[backend] = sess.run(None, feed)
        # the lowered integer graph and ORT's QLinearConv agree to one output step
        step = float(np.abs(y_float).max()) / 100
        assert np.abs(y - y_ort).max() <= step
        (body,) = [s for s in sess.plan.steps if s.op_type == "If"]
        then_ops = [s.op_type for s in body.kernel.bodies["then_branch"].plan.steps]
        # lowered inside the body as in the main graph: the second Conv's output is the
        # branch's float output (LowerConvFloatOutput: ConvInteger and a float scaling)
        assert (
            "Conv" not in then_ops
            and then_ops.count("QLinearConv") == 1
            and then_ops.count("ConvInteger") == 1
        )
    np.testing.assert_array_equal(
        ys["native"][0], ys["reference"][0]
    )  # 0: native kernels are bit-exact twins


def lstm_if_model() -> onnx.ModelProto:
    """An If whose then branch holds a Conv and an LSTM (the silero-vad shape)."""
    rng = np.random.default_rng(11)
    hidden, feat = 5, 7
    then_nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Reshape", ["c", "seq_shape"], ["seq"], name="reshape"),
        helper.make_node("LSTM", ["seq", "W", "R", "B"], ["", "h"], name="lstm", hidden_size=hidden),
    ]
    then_g = helper.make_graph(
        then_nodes,
        "then",
        [],
        [helper.make_tensor_value_info("h", F, [1, 1, hidden])],
        [
            numpy_helper.from_array(np.array([6, 1, feat], np.int64), "seq_shape"),
            numpy_helper.from_array(
                (rng.standard_normal((1, 4 * hidden, feat)) * 0.3).astype(np.float32), "W"
            ),
            numpy_helper.from_array(
                (rng.standard_normal((1, 4 * hidden, hidden)) * 0.3).astype(np.float32), "R"
            ),
            numpy_helper.from_array((rng.standard_normal((1, 8 * hidden)) * 0.1).astype(np.float32), "B"),
        ],
    )
    else_g = helper.make_graph(
        [helper.make_node("Identity", ["h0"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", F, [1, 1, hidden])],
    )
    g = helper.make_graph(
        [helper.make_node("If", ["flag"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)],
        "lstm_if",
        [
            helper.make_tensor_value_info("x", F, [6, 3, 1, 1]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", F, [1, 1, hidden])],
        [
            numpy_helper.from_array((rng.standard_normal((feat, 3, 1, 1)) * 0.5).astype(np.float32), "w"),
            numpy_helper.from_array(np.zeros((1, 1, hidden), np.float32), "h0"),
        ],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_default_quantizes_an_lstm_inside_a_branch_dynamically(tmp_path):
    src, out = tmp_path / "lstm.onnx", tmp_path / "lstm.int8.onnx"
    onnx.save(lstm_if_model(), src)
    rng = np.random.default_rng(2)
    feeds = [
        {"x": rng.standard_normal((6, 3, 1, 1)).astype(np.float32), "flag": np.array(True)} for _ in range(4)
    ]
    # 7-bit weights where ORT's DynamicQuantizeLSTM saturates full-range ones (tests/ort_int8.py);
    # recurrent "dynamic": the rewrite inside a body is the subject, not eq. (30)'s choice (the
    # toy's only other layer stays float in the body, so the float-LSTM file is exact)
    summary = quanta.quantize_static(
        src, out, feeds, verbose=False, reduce_range=REDUCE_RANGE, recurrent="dynamic"
    )
    assert ("branch/then_branch/lstm", "LSTM") in summary.quantized
    (conv_reason,) = [r for name, _, r in summary.float_nodes if name == "branch/then_branch/conv"]
    assert conv_reason == SUBGRAPH_STATIC_REASON
    written = onnx.load(str(out))
    onnx.checker.check_model(written)
    then_g = next(a.g for a in written.graph.node[0].attribute if a.name == "then_branch")
    assert [n.op_type for n in then_g.node if n.domain == "com.microsoft"] == ["DynamicQuantizeLSTM"]
    assert any(o.domain == "com.microsoft" for o in written.opset_import)
    lstm_macs = [
        c.macs for c in summary.coverage.nodes if c.name == "branch/then_branch/lstm_quant" and c.integer_op
    ]
    assert lstm_macs == [6 * 4 * 5 * (7 + 5)]
    feed = feeds[0]
    (y_ort,) = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feed)
    (y,) = quanta.InferenceSession(str(out)).run(None, feed)
    (y_float,) = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feed)
    # X and H quantized per step to 8 bits, 8-bit weights: hidden values in (-1, 1) move
    # by a few hundredths at most over 6 steps
    assert np.abs(y_ort - y_float).max() <= 0.05
    assert np.abs(y - y_ort).max() <= 0.01  # quanta's DynamicQuantizeLSTM vs ORT's: sigmoid/tanh ulps


def test_subgraphs_float_leaves_bodies_as_they_are(tmp_path):
    src, out = tmp_path / "if.onnx", tmp_path / "if.int8.onnx"
    model = if_conv_model()
    onnx.save(model, src)
    summary = quanta.quantize_static(src, out, _feeds(4, True), verbose=False, subgraphs="float")
    assert not [name for name, _ in summary.quantized if "/" in name]
    (reason,) = [r for name, _, r in summary.float_nodes if name == "branch"]
    assert "recipe subgraphs: float" in reason
    written = onnx.load(str(out))
    got = {a.name: a.g for a in written.graph.node[0].attribute}
    want = {a.name: a.g for a in model.graph.node[0].attribute}
    assert [n.op_type for n in got["then_branch"].node] == [n.op_type for n in want["then_branch"].node]
    assert summary.coverage.integer_share == 0.0 and summary.coverage.total_macs > 0


def test_coverage_infers_body_shapes_from_the_outer_values_seen():
    """Shapes observed for main-graph values (benchmarks, ``quanta inspect`` with
    feeds) reach the bodies: a symbolic image size inside a branch is counted at the
    size seen, not as 1."""
    from quanta.runtime.coverage import lowered_coverage

    proto = if_conv_model()
    x = proto.graph.input[0].type.tensor_type.shape
    x.dim[2].dim_param, x.dim[3].dim_param = "H", "W"
    model = load(proto)
    blind = lowered_coverage(model)
    seen = lowered_coverage(model, {"x": (1, 3, 5, 9)})
    assert seen.total_macs == 7 * 27 * 45 + 3 * 7 * 45  # the then branch, the larger one
    assert {c.name: c.macs for c in blind.nodes}["branch/then_branch/conv1"] == 7 * 27  # H = W = 1
    assert seen.notes == [
        "branch (If): MACs of then_branch, the branch with more MACs (calibration ran neither or both)"
    ]


def test_a_loop_trip_count_from_a_constant_node_counts_like_an_initializer():
    """ORT's quantizer keeps a Paddle2ONNX Loop's trip count in a Constant node, quanta's
    writer makes it an initializer: both files must count the body as often, or the
    integer shares of two files of one model do not compare."""
    from quanta.runtime.coverage import lowered_coverage
    from tests.quantize.test_wild_models import loop_reading_an_outer_value

    as_init = loop_reading_an_outer_value()
    as_node = loop_reading_an_outer_value()
    trips = next(t for t in as_node.graph.initializer if t.name == "trips")
    as_node.graph.initializer.remove(trips)
    as_node.graph.node.insert(0, helper.make_node("Constant", [], ["trips"], name="trips_const", value=trips))
    reports = [lowered_coverage(load(m)) for m in (as_init, as_node)]
    for r in reports:
        assert "loop (Loop): body MACs x 3 (constant trip count)" in r.notes
    # the body's [2, 8] x [8, 8] MatMul, three times, and the head's [2, 8] x [8, 4] (its
    # input, the Loop's output, has no inferred shape: K from the weight, the output's [2, 4])
    assert reports[0].total_macs == reports[1].total_macs == 3 * 2 * 8 * 8 + 2 * 4 * 8


@pytest.mark.parametrize("bound", [np.iinfo(np.int64).max, np.iinfo(np.int32).max])
def test_a_while_loop_counts_its_body_once_not_int64_max_times(bound):
    """torch.onnx writes a scripted ``while`` (a greedy decoder running to its end token)
    as ``Loop(M = INT64_MAX, cond)`` with the body computing the condition: that M is no
    bound, and counting the body 2^63 times made g2p-en's decoder report 1.8e24 MACs and
    every integer share the body's alone. It counts once, as a Loop without M."""
    from quanta.runtime.coverage import lowered_coverage
    from tests.quantize.test_wild_models import loop_reading_an_outer_value

    proto = loop_reading_an_outer_value()
    body = proto.graph.node[0].attribute[0].g
    # the body's condition: i + 1 < 3 (runs 3 times), read from the iteration number
    body.node[0].CopyFrom(helper.make_node("Less", ["i_next", "stop"], ["cond_out"], name="cond"))
    body.node.insert(0, helper.make_node("Add", ["i", "one"], ["i_next"], name="count"))
    body.initializer.extend(
        [
            numpy_helper.from_array(np.array(1, np.int64), "one"),
            numpy_helper.from_array(np.array(3, np.int64), "stop"),
        ]
    )
    trips = next(t for t in proto.graph.initializer if t.name == "trips")
    trips.CopyFrom(numpy_helper.from_array(np.array(bound, np.int64), "trips"))
    report = lowered_coverage(load(proto))
    assert (
        f"loop (Loop): body MACs x 1 (trip count {bound}, no bound (the condition ends the loop): one iteration counted)"
        in report.notes
    )
    assert report.total_macs == 2 * 8 * 8 + 2 * 4 * 8  # the body once and the head
    # the file is the same loop: both runtimes stop it after three iterations
    x = np.random.default_rng(3).standard_normal((2, 8)).astype(np.float32)
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    w = numpy_helper.to_array(next(t for t in proto.graph.initializer if t.name == "w"))
    wf = numpy_helper.to_array(next(t for t in proto.graph.initializer if t.name == "wf"))
    np.testing.assert_allclose(want, x @ w @ w @ w @ wf, rtol=1e-4, atol=1e-5)
