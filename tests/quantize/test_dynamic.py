"""quantize_dynamic: DynamicQuantizeLinear + MatMulInteger / ConvInteger, run by ORT,
agreeing with the reference backend."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import quanta
from quanta.ir.onnx_io import load
from tests.ir import models
from tests.ort_int8 import REDUCE_RANGE  # 7-bit weights where ORT saturates full-range ones
from tests.quantize.test_recurrent import CHANNELS, HIDDEN, ROWS, WIDTH, cnn_lstm

ort = pytest.importorskip("onnxruntime")


def run_both(path, feeds):
    ours = quanta.InferenceSession(str(path), backend="reference").run(None, feeds)[0]
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return ours, theirs


def test_quantize_dynamic_encoder_matmuls(tmp_path):
    src = tmp_path / "enc.onnx"
    onnx.save(models.encoder_block(), src)
    out = tmp_path / "enc.dyn.onnx"
    summary = quanta.quantize_dynamic(src, out, verbose=False, reduce_range=REDUCE_RANGE)
    quantized = {name for name, _ in summary.quantized}
    assert {"q_proj", "k_proj", "v_proj", "o_proj", "ffn1", "ffn2"} <= quantized
    assert "scores" not in quantized  # both operands are activations: no constant weight
    g = load(out).graph
    counts = g.op_counts()
    assert counts["MatMulInteger"] == 6
    assert counts["DynamicQuantizeLinear"] == 4  # x shared by q/k/v, c2, h1, f2
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    feeds = models.encoder_feeds(1, seed=3)[0]
    ours, theirs = run_both(out, feeds)
    # Only float ops differ (LayerNorm/Softmax summation order); the integer parts are
    # exact in both: 1e-4 relative covers float32 reassociation over d=24 terms.
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
    ref = ort.InferenceSession(str(src)).run(None, feeds)[0]
    cos = np.sum(ref * theirs, -1) / (np.linalg.norm(ref, axis=-1) * np.linalg.norm(theirs, axis=-1))
    assert cos.min() > 0.99


def test_quantize_dynamic_conv_and_gemm_with_bias(tmp_path):
    src = tmp_path / "cnn.onnx"
    onnx.save(models.float_cnn(), src)
    out = tmp_path / "cnn.dyn.onnx"
    summary = quanta.quantize_dynamic(src, out, verbose=False, reduce_range=REDUCE_RANGE)
    assert sorted(op for _, op in summary.quantized) == ["Conv", "Gemm"]
    counts = load(out).graph.op_counts()
    assert counts["ConvInteger"] == 1 and counts["MatMulInteger"] == 1
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 6)).astype(np.float32)
    ours, theirs = run_both(out, {"x": x})
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    ref = ort.InferenceSession(str(src)).run(None, {"x": x})[0]
    assert 10 * np.log10(np.sum(ref**2) / np.sum((ref - theirs) ** 2)) > 25.0


def test_quantize_dynamic_is_deterministic_and_per_channel_by_default(tmp_path):
    src = tmp_path / "cnn.onnx"
    onnx.save(models.float_cnn(), src)
    quanta.quantize_dynamic(src, tmp_path / "a.onnx", verbose=False, reduce_range=REDUCE_RANGE)
    quanta.quantize_dynamic(src, tmp_path / "b.onnx", verbose=False, reduce_range=REDUCE_RANGE)
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    g = load(tmp_path / "a.onnx").graph
    # ConvInteger carries no scale; the per-channel weight scales sit in the float Mul
    sw = g.initializers["w_scale"].const
    assert sw.shape == (1, 7, 1, 1) and len(set(sw.reshape(-1).tolist())) == 7


def test_quantize_dynamic_lstm_becomes_ort_dynamic_quantize_lstm(tmp_path):
    """The LSTM's weights become int8 in ORT's DynamicQuantizeLSTM layout (the same bytes
    ORT's own quantize_dynamic writes, per channel), the file runs in ORT, and quanta's two
    backends give ORT's output bit for bit (ConvInteger, the float scale Mul, the LSTM's
    per-step quantization and MatMulInteger are all exact or single float32 operations)."""
    import logging

    from onnx import numpy_helper
    from onnxruntime.quantization import quantize_dynamic as ort_quantize_dynamic

    src, out, theirs_path = (
        tmp_path / "cnn_lstm.onnx",
        tmp_path / "cnn_lstm.dyn.onnx",
        tmp_path / "ort.dyn.onnx",
    )
    onnx.save(cnn_lstm(), src)
    summary = quanta.quantize_dynamic(src, out, verbose=False, reduce_range=REDUCE_RANGE)
    assert sorted(op for _, op in summary.quantized) == ["Conv", "LSTM", "MatMul"]
    proto = onnx.load(str(out))
    onnx.checker.check_model(proto, full_check=True)
    (lstm,) = [n for n in proto.graph.node if n.op_type == "DynamicQuantizeLSTM"]
    assert lstm.domain == "com.microsoft"
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    wq, rq = inits[lstm.input[1]], inits[lstm.input[2]]
    gates = 4 * HIDDEN
    assert (
        wq.dtype == rq.dtype == np.int8
        and wq.shape == (2, CHANNELS * ROWS, gates)
        and rq.shape == (2, HIDDEN, gates)
    )
    assert inits[lstm.input[8]].shape == (2, gates) and not {"W", "R"} & set(inits)  # no float copies
    logging.disable(logging.WARNING)
    try:
        ort_quantize_dynamic(str(src), str(theirs_path), per_channel=True, reduce_range=REDUCE_RANGE)
    finally:
        logging.disable(logging.NOTSET)
    theirs = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(theirs_path)).graph.initializer}
    np.testing.assert_array_equal(wq, theirs["W_quantized"])
    np.testing.assert_array_equal(rq, theirs["R_quantized"])
    np.testing.assert_array_equal(inits[lstm.input[10]], theirs["R_scale"])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(out), so, providers=["CPUExecutionProvider"])
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((1, 1, ROWS, WIDTH)).astype(np.float32)
        expected = sess.run(None, {"x": x})[0]
        for backend in ("native", "reference"):
            got = quanta.InferenceSession(str(out), backend=backend).run(None, {"x": x})[0]
            np.testing.assert_array_equal(got, expected)
        ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        assert np.mean(ref.argmax(-1) == expected.argmax(-1)) >= 0.8


def _matmul_stack(weights, uses, d=128):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((rng.standard_normal((d, d)) * 0.05).astype(np.float32), f"w{k}")
        for k in range(weights)
    ]
    nodes, h = [], "x"
    for k, w in enumerate(uses):
        nodes.append(helper.make_node("MatMul", [h, f"w{w}"], [f"m{k}"], name=f"mm{k}"))
        nodes.append(helper.make_node("Relu", [f"m{k}"], [f"h{k}"]))
        h = f"h{k}"
    graph = helper.make_graph(
        nodes,
        "stack",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, d])],
        [helper.make_tensor_value_info(h, TensorProto.FLOAT, [2, d])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_quantize_dynamic_file_is_a_quarter_of_fp32_with_shared_weights(tmp_path):
    """Four weights read by twelve MatMuls (ALBERT-style sharing): one int8 copy per weight,
    no float weight left, so the file is ~0.25x the FP32 file (ORT's quantize_dynamic: the
    same); one copy per use would make it 0.75x."""
    src, out = tmp_path / "stack.onnx", tmp_path / "stack.dyn.onnx"
    onnx.save(_matmul_stack(4, [0, 1, 2, 3] * 3), src)
    quanta.quantize_dynamic(src, out, verbose=False, reduce_range=REDUCE_RANGE)
    ratio = out.stat().st_size / src.stat().st_size
    assert 0.24 <= ratio <= 0.30, ratio
    proto = onnx.load(str(out))
    int8 = [t for t in proto.graph.initializer if t.data_type == onnx.TensorProto.INT8 and len(t.dims) == 2]
    assert len(int8) == 4
    assert not [
        t for t in proto.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2
    ]
    x = np.random.default_rng(1).standard_normal((2, 128)).astype(np.float32)
    ours, theirs = run_both(out, {"x": x})
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("fill", "reason"),
    [(np.nan, "NaN value(s)"), (np.inf, "infinite value(s)"), (0.0, "zero range"), (3e9, ">= 1e+09")],
    ids=["nan", "inf", "all_zero", "mask_like"],
)
def test_quantize_dynamic_degenerate_weight_stays_float_with_reason(tmp_path, fill, reason):
    model = _matmul_stack(2, [0, 1], d=16)
    bad = onnx.numpy_helper.to_array(model.graph.initializer[1]).copy()
    if fill == 0.0:
        bad[:] = 0.0
    else:
        bad[3, 5] = fill
    model.graph.initializer[1].CopyFrom(onnx.numpy_helper.from_array(bad, "w1"))
    src, out = tmp_path / "bad.onnx", tmp_path / "bad.dyn.onnx"
    onnx.save(model, src)
    summary = quanta.quantize_dynamic(src, out, verbose=False, reduce_range=REDUCE_RANGE)
    assert [name for name, _ in summary.quantized] == ["mm0"]
    (why,) = [r for name, _, r in summary.float_nodes if name == "mm1"]
    assert "w1" in why and reason in why, why
    x = np.random.default_rng(2).standard_normal((2, 16)).astype(np.float32)
    with np.errstate(invalid="ignore"):  # the float MatMul with an infinite weight gives NaN
        quanta.InferenceSession(str(out), backend="reference").run(None, {"x": x})


def test_quantize_dynamic_keeps_a_computed_mask_as_its_subgraph(tmp_path):
    """A causal mask computed by ConstantOfShape -> Trilu -> Mul is folded before
    quantization; it is no weight, stays float, and folded it is 1 MiB where the input
    stored 3 nodes. The dynamic file keeps the subgraph instead (the runtime folds it at
    load): 0.3x the FP32 file, not 21x, with outputs unchanged."""
    from onnx import TensorProto, helper, numpy_helper

    d, s = 64, 512
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((rng.standard_normal((d, d)) * 0.05).astype(np.float32), f"w{k}")
        for k in range(3)
    ]
    inits += [
        numpy_helper.from_array(np.array([1, 1, s, s], np.int64), "mshape"),
        numpy_helper.from_array(np.array([-1e4], np.float32), "neg"),
    ]
    ones = numpy_helper.from_array(np.array([1.0], np.float32))
    nodes = [
        helper.make_node("ConstantOfShape", ["mshape"], ["ones"], value=ones),
        helper.make_node("Trilu", ["ones"], ["tri"], upper=1),
        helper.make_node("Mul", ["tri", "neg"], ["mask"]),
        helper.make_node("MatMul", ["x", "w0"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["x", "w1"], ["k"], name="k_proj"),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Add", ["scores", "mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
        helper.make_node("MatMul", ["x", "w2"], ["v"], name="v_proj"),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 1, s, d]) for n in ("x", "y")]
    src, out = tmp_path / "attn.onnx", tmp_path / "attn.dyn.onnx"
    onnx.save(
        helper.make_model(
            helper.make_graph(nodes, "attn", io[:1], io[1:], inits),
            opset_imports=[helper.make_opsetid("", 17)],
        ),
        src,
    )
    summary = quanta.quantize_dynamic(src, out, verbose=False, reduce_range=REDUCE_RANGE)
    assert [name for name, _ in summary.float_tensors if name == "mask"] == ["mask"]
    assert out.stat().st_size / src.stat().st_size < 0.35
    proto = onnx.load(str(out))
    assert "mask" not in {t.name for t in proto.graph.initializer}
    ops = [(n.op_type, list(n.output)) for n in proto.graph.node]
    k = ops.index(("ConstantOfShape", ["ones"]))
    assert ops[k + 1 : k + 3] == [("Trilu", ["tri"]), ("Mul", ["mask"])]  # before the reader
    assert k < next(i for i, n in enumerate(proto.graph.node) if "mask" in n.input)
    x = np.random.default_rng(1).standard_normal((1, 1, s, d)).astype(np.float32)
    ours, theirs = run_both(out, {"x": x})
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
