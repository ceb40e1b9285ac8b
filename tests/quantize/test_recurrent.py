"""LSTMs in quantize_static and quantize_dynamic (quanta.quantize.recurrent): both write
ONNX Runtime's com.microsoft DynamicQuantizeLSTM, the recipe's ``recurrent: float`` keeps
them float, and both summaries report the integer MAC share (min_integer_share works for
each)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.quantize.recipe import Recipe, RecipeError, RecurrentMode
from quanta.quantize.static import IntegerShareError
from tests.ort_int8 import REDUCE_RANGE

WIDTH, ROWS, CHANNELS, HIDDEN, CLASSES = 11, 7, 5, 13, 7


def cnn_lstm(seed: int = 0) -> onnx.ModelProto:
    """Conv -> Relu -> [W, 1, C·H] sequence -> bidirectional LSTM -> [W, 2H] -> MatMul + Add:
    a CTC captcha reader at toy size, every size odd (C·H = 35, H = 13, 2H = 26, 7 classes)."""
    rng = np.random.default_rng(seed)
    feat = CHANNELS * ROWS
    inits = [
        numpy_helper.from_array(
            (rng.standard_normal((CHANNELS, 1, 3, 3)) * 0.5).astype(np.float32), "conv_w"
        ),
        numpy_helper.from_array((rng.standard_normal(CHANNELS) * 0.1).astype(np.float32), "conv_b"),
        numpy_helper.from_array(np.array([1, feat, WIDTH], np.int64), "seq_shape"),
        numpy_helper.from_array((rng.standard_normal((2, 4 * HIDDEN, feat)) * 0.3).astype(np.float32), "W"),
        numpy_helper.from_array((rng.standard_normal((2, 4 * HIDDEN, HIDDEN)) * 0.3).astype(np.float32), "R"),
        numpy_helper.from_array((rng.standard_normal((2, 8 * HIDDEN)) * 0.2).astype(np.float32), "B"),
        numpy_helper.from_array(np.array([WIDTH, 2 * HIDDEN], np.int64), "flat"),
        numpy_helper.from_array(
            (rng.standard_normal((2 * HIDDEN, CLASSES)) * 0.3).astype(np.float32), "fc_w"
        ),
        numpy_helper.from_array((rng.standard_normal(CLASSES) * 0.1).astype(np.float32), "fc_b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "seq_shape"], ["s"], name="to_seq"),
        helper.make_node("Transpose", ["s"], ["t"], name="time_major", perm=[2, 0, 1]),
        helper.make_node(
            "LSTM",
            ["t", "W", "R", "B"],
            ["y", "y_h"],
            name="lstm",
            hidden_size=HIDDEN,
            direction="bidirectional",
        ),
        helper.make_node("Reshape", ["y", "flat"], ["yf"], name="flatten"),
        helper.make_node("MatMul", ["yf", "fc_w"], ["m"], name="fc"),
        helper.make_node("Add", ["m", "fc_b"], ["logits"], name="fc_bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn_lstm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, ROWS, WIDTH])],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, [WIDTH, CLASSES]),
            helper.make_tensor_value_info("y_h", TensorProto.FLOAT, [2, 1, HIDDEN]),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 1, ROWS, WIDTH)).astype(np.float32)} for _ in range(n)]


def _ort_session(path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1  # the registered op quantizes all rows of H in one block (ms_lstm.py)
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def static_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("static_lstm")
    src, out = folder / "cnn_lstm.onnx", folder / "cnn_lstm.int8.onnx"
    onnx.save(cnn_lstm(), src)
    # 7-bit weights where ORT's DynamicQuantizeLSTM saturates full-range ones (tests/ort_int8.py).
    summary = quanta.quantize_static(
        src, out, _feeds(12, seed=1), verbose=False, progress=False, reduce_range=REDUCE_RANGE
    )
    return src, out, summary


def test_quantize_static_writes_lstm_as_dynamic_quantize_lstm(static_file):
    """The LSTM becomes DynamicQuantizeLSTM with int8 weights in ORT's layout and no float
    copy of W or R; its input stays float (no QuantizeLinear in front of it); the Conv before
    and the MatMul after are quantized as without an LSTM; every MAC is now integer."""
    _, out, summary = static_file
    proto = onnx.load(str(out))
    onnx.checker.check_model(proto, full_check=True)
    (lstm,) = [n for n in proto.graph.node if n.op_type == "DynamicQuantizeLSTM"]
    assert lstm.domain == "com.microsoft" and not [n for n in proto.graph.node if n.op_type == "LSTM"]
    assert {o.domain: o.version for o in proto.opset_import}["com.microsoft"] == 1
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    wq, rq = inits[lstm.input[1]], inits[lstm.input[2]]
    assert wq.dtype == rq.dtype == np.int8
    assert wq.shape == (2, CHANNELS * ROWS, 4 * HIDDEN) and rq.shape == (2, HIDDEN, 4 * HIDDEN)
    assert inits[lstm.input[8]].shape == (2, 4 * HIDDEN)  # per gate column, the recipe's per_channel
    assert not {"W", "R"} & set(inits)
    producers = {o: n for n in proto.graph.node for o in n.output}
    assert producers[lstm.input[0]].op_type != "DequantizeLinear"
    assert list(lstm.output) == ["y", "y_h"]
    ops = {n.op_type for n in proto.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv", "MatMul"} <= ops
    assert sorted(op for _, op in summary.quantized if op in ("Conv", "LSTM", "MatMul")) == [
        "Conv",
        "LSTM",
        "MatMul",
    ]
    assert summary.integer_share == 1.0
    assert not [r for _, op, r in summary.float_nodes if op == "LSTM"]


def test_quantize_static_lstm_file_runs_in_ort_and_quanta_backends_agree(static_file):
    """native == reference bit for bit (the LSTM falls back to the reference kernel; the
    rest is the integer pipeline both backends share), and the file runs in ORT within
    float32 rounding of quanta:

    - logits: quanta's MatMul + Add is MatMulIntegerToFloat (the exact integer sum, scaled
      and biased), ORT's a float MatMul on dequantized values then Add, so each side is a
      K = 26 float32 dot product of magnitude Σ_k|ŷ_k·w_kn| + |b_n| with |ŷ| <= 1 + s_y
      (y = o·tanh(c) on y's grid): ``dot_tolerance(26, ...)``. A quantized LSTM output one
      step apart would show as s_y·|w_kn|, far above it: Q(y) is the same integers.
    - y_h: quanta's Conv before the LSTM is the exact integer sum rounded once
      (LowerConvFloatOutput), ORT's a float Conv on dequantized values, so an extreme of X
      can be an ulp apart and move that step's dynamic scale (ms_lstm.py eq. (1)) by an
      ulp, and the gates by ulps; |h| < 1 and the observed difference is <= 2 ulps of 1,
      so atol 2^-20 (8 ulps of 1).
    """
    from tests.passes.helpers import dot_tolerance

    src, out, _ = static_file
    sess = _ort_session(out)
    native = quanta.InferenceSession(str(out), backend="native")
    reference = quanta.InferenceSession(str(out), backend="reference")
    proto = onnx.load(str(out))
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    (q_y,) = [n for n in proto.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "y"]
    s_y = float(inits[q_y.input[1]])
    floats = {t.name: numpy_helper.to_array(t) for t in cnn_lstm().graph.initializer}
    magnitude = (1 + s_y) * np.abs(floats["fc_w"]).sum(axis=0) + np.abs(floats["fc_b"])
    logits_tol = dot_tolerance(2 * HIDDEN, magnitude)
    fp32 = _ort_session(src)
    argmax_agree = 0
    for feeds in _feeds(8, seed=2):
        expected = sess.run(None, feeds)
        got = native.run(None, feeds)
        for a, b in zip(got, reference.run(None, feeds)):
            np.testing.assert_array_equal(a, b)
        assert np.all(np.abs(got[0].astype(np.float64) - expected[0]) <= logits_tol)
        np.testing.assert_allclose(got[1], expected[1], rtol=0, atol=2.0**-20)
        argmax_agree += int(np.sum(got[0].argmax(-1) == fp32.run(None, feeds)[0].argmax(-1)))
    assert argmax_agree >= 0.8 * 8 * WIDTH  # fidelity to FP32: the int8 file still reads the same classes


def test_recipe_recurrent_float_keeps_lstm_float_with_reason(tmp_path):
    src, out = tmp_path / "cnn_lstm.onnx", tmp_path / "float_lstm.onnx"
    onnx.save(cnn_lstm(), src)
    summary = quanta.quantize_static(
        src, out, _feeds(4, seed=1), verbose=False, progress=False, recurrent="float"
    )
    proto = onnx.load(str(out))
    assert [n.op_type for n in proto.graph.node].count("LSTM") == 1
    assert "DynamicQuantizeLSTM" not in {n.op_type for n in proto.graph.node}
    assert ("lstm", "LSTM", "the recipe keeps recurrent ops float (recurrent: float)") in summary.float_nodes
    assert summary.integer_share < 0.5  # the LSTM has most of this toy's MACs
    assert "recurrent ops float (recurrent: float)" in summary.format()


def test_recipe_recurrent_option_parses_and_round_trips():
    assert Recipe().recurrent is RecurrentMode.AUTO  # eq. (30) measures, the file records its choice
    r = Recipe.from_dict({"recurrent": "FLOAT"})
    assert r.recurrent is RecurrentMode.FLOAT
    assert Recipe.from_dict(r.to_dict()).recurrent is RecurrentMode.FLOAT
    with pytest.raises(
        RecipeError, match=r"recurrent: unknown mode 'int8'; expected one of dynamic, float, auto"
    ):
        Recipe(recurrent="int8")


def test_quantize_dynamic_summary_reports_integer_share(tmp_path):
    """quantize_dynamic fills summary.coverage as quantize_static does: all MACs integer
    with the LSTM as DynamicQuantizeLSTM, the LSTM's share float with recurrent: float."""
    src = tmp_path / "cnn_lstm.onnx"
    onnx.save(cnn_lstm(), src)
    full = quanta.quantize_dynamic(src, tmp_path / "dyn.onnx", verbose=False)
    assert full.coverage is not None and full.integer_share == 1.0
    assert "integer MACs: 100.0 %" in full.format()
    kept = quanta.quantize_dynamic(src, tmp_path / "dyn_float_lstm.onnx", verbose=False, recurrent="float")
    (lstm,) = [c for c in kept.coverage.nodes if c.op == "LSTM"]
    assert lstm.integer_op is None
    assert kept.integer_share == pytest.approx(1 - lstm.macs / kept.coverage.total_macs)
    assert ("lstm", "LSTM", "the recipe keeps recurrent ops float (recurrent: float)") in kept.float_nodes


def test_quantize_dynamic_min_integer_share_writes_nothing_below_it(tmp_path):
    src, out = tmp_path / "cnn_lstm.onnx", tmp_path / "dyn.onnx"
    onnx.save(cnn_lstm(), src)
    with pytest.raises(IntegerShareError, match=r"not written: .* below min_integer_share 90.0 %") as e:
        quanta.quantize_dynamic(src, out, verbose=False, exclude=["lstm"], min_integer_share=0.9)
    assert "lstm (LSTM" in str(e.value)
    assert not out.exists()
    quanta.quantize_dynamic(src, out, verbose=False, min_integer_share=0.9)
    assert out.exists()


def test_cli_recurrent_option_reaches_the_recipe(tmp_path):
    from quanta.cli.main import main
    from quanta.quantize.static import recipe_of

    src, out = tmp_path / "cnn_lstm.onnx", tmp_path / "dyn.onnx"
    onnx.save(cnn_lstm(), src)
    assert main(["quantize", str(src), "-o", str(out), "--dynamic", "--recurrent", "float"]) == 0
    assert recipe_of(out).recurrent is RecurrentMode.FLOAT
    assert "LSTM" in {n.op_type for n in onnx.load(str(out)).graph.node}
