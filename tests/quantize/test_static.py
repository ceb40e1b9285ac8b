"""quantize_static end to end: valid QDQ output that ONNX Runtime runs, the reference
backend agreeing with ONNX Runtime within 1 LSB on every quantized tensor, determinism,
what stays float and why."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import quanta
from quanta.calibrate.readers import CalibrationDataError
from quanta.ir.onnx_io import load
from quanta.ir.types import QuantType
from quanta.quantize.recipe import CalibrationMethod
from tests.ir import models
from tests.ort_int8 import ort_session_options  # saturating fused int8 off where ORT has it

ort = pytest.importorskip("onnxruntime")


def cnn_feeds(n: int = 6, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((2, 3, 8, 6)).astype(np.float32)} for _ in range(n)]


def with_quantized_outputs(path) -> onnx.ModelProto:
    """The model with every QuantizeLinear output also exposed as a graph output."""
    m = onnx.load(str(path))
    m = onnx.shape_inference.infer_shapes(m)
    known = {v.name: v for v in m.graph.value_info}
    for node in m.graph.node:
        if node.op_type == "QuantizeLinear":
            m.graph.output.append(known[node.output[0]])
    return m


def assert_reference_matches_ort_on_quantized_tensors(path, feeds, *, fused_int8: bool | None = None):
    """``fused_int8``: ORT's fused integer kernels on (True), off (False), or on only where
    they are exact for full-range int8 weights (None, tests/ort_int8.py)."""
    m = with_quantized_outputs(path)
    names = [o.name for o in m.graph.output]
    ours = quanta.InferenceSession(m, backend="reference").run(None, feeds)
    theirs = ort.InferenceSession(
        m.SerializeToString(), ort_session_options(fused_int8=fused_int8), providers=["CPUExecutionProvider"]
    ).run(None, feeds)
    n_q = 0
    for name, a, b in zip(names, ours, theirs):
        if a.dtype.kind in "iu":
            n_q += 1
            # <= 1 LSB: float ops between DQ and Q run in different summation orders in
            # ORT and NumPy, which can move a value across a rounding boundary.
            diff = np.abs(a.astype(np.int32) - b.astype(np.int32))
            assert diff.max() <= 1, f"quantized tensor '{name}' differs by {diff.max()} LSB"
    assert n_q > 0


def test_quantize_static_cnn_is_valid_and_runs_in_ort(tmp_path):
    src = tmp_path / "cnn.onnx"
    onnx.save(models.float_cnn(), src)
    out = tmp_path / "cnn.int8.onnx"
    summary = quanta.quantize_static(src, out, cnn_feeds(), verbose=False)
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    assert {op for _, op in summary.quantized} == {"Conv", "Relu", "MaxPool", "Flatten", "Gemm"}
    g = load(out).graph
    # Relu absorbed: the Conv output is not quantized, the Relu output is (range >= 0)
    assert not any(n.op_type == "QuantizeLinear" and n.inputs[0].name == "c" for n in g.nodes)
    relu_q = next(n for n in g.nodes if n.op_type == "QuantizeLinear" and n.inputs[0].name == "r").outputs[0]
    assert relu_q.type.elem.zero_point == (0,)
    # views keep their input's type: MaxPool and Flatten outputs carry the Relu output's type
    pool_q = next(n for n in g.nodes if n.op_type == "QuantizeLinear" and n.inputs[0].name == "p").outputs[0]
    assert pool_q.type.elem == relu_q.type.elem
    # the graph output stays float (no Q/DQ on 'y')
    assert g.outputs[0].producer.op_type == "Gemm"
    assert_reference_matches_ort_on_quantized_tensors(out, cnn_feeds(1, seed=9)[0])


def test_quantize_static_output_is_close_to_fp32(tmp_path):
    src = tmp_path / "cnn.onnx"
    onnx.save(models.float_cnn(), src)
    out = tmp_path / "q.onnx"
    quanta.quantize_static(src, out, cnn_feeds(20), verbose=False)
    feed = cnn_feeds(1, seed=3)[0]
    ref = ort.InferenceSession(str(src)).run(None, feed)[0]
    q = ort.InferenceSession(str(out), ort_session_options()).run(None, feed)[0]
    sqnr = 10 * np.log10(np.sum(ref**2) / np.sum((ref - q) ** 2))
    assert sqnr > 25.0  # 8-bit activations and weights through 2 layers: ~30 dB expected


def test_quantize_static_is_deterministic(tmp_path):
    src = tmp_path / "cnn.onnx"
    onnx.save(models.float_cnn(), src)
    quanta.quantize_static(src, tmp_path / "a.onnx", cnn_feeds(), verbose=False)
    quanta.quantize_static(src, tmp_path / "b.onnx", cnn_feeds(), verbose=False)
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()


def test_quantize_static_refuses_to_overwrite_the_input(tmp_path):
    src = tmp_path / "cnn.onnx"
    onnx.save(models.float_cnn(), src)
    before = src.read_bytes()
    with pytest.raises(FileExistsError, match="refusing to overwrite the input model"):
        quanta.quantize_static(src, src, cnn_feeds(), verbose=False)
    assert src.read_bytes() == before


def test_quantize_static_encoder_keeps_the_mask_float_and_quantizes_attention(tmp_path):
    # Failure signature (ORT, all-MiniLM): the mask path (-3.4e38) gets calibrated, its
    # scale becomes ~1e36 and every attention score collapses.
    src = tmp_path / "enc.onnx"
    onnx.save(models.encoder_block(), src)
    out = tmp_path / "enc.int8.onnx"
    summary = quanta.quantize_static(src, out, models.encoder_feeds(), verbose=False)
    # the mask path feeds only the float Softmax input: never planned for quantization
    float_nodes = {name: reason for name, _, reason in summary.float_nodes}
    assert float_nodes["mask_mul"].startswith("its output feeds only float ops")
    assert float_nodes["add_mask"].startswith("its output feeds only float ops")
    g = load(out).graph
    scores = next(n for n in g.nodes if n.name == "scores")
    assert all(v.producer is not None and v.producer.op_type == "DequantizeLinear" for v in scores.inputs)
    ln = next(n for n in g.nodes if n.name == "ln1")
    assert ln.op_type == "LayerNormalization"
    feeds = models.encoder_feeds(2, seed=11)
    ref = ort.InferenceSession(str(src)).run(None, feeds[1])[0]
    q = ort.InferenceSession(str(out), ort_session_options()).run(None, feeds[1])[0]
    cos = np.sum(ref * q, -1) / (np.linalg.norm(ref, axis=-1) * np.linalg.norm(q, axis=-1))
    assert cos.min() > 0.98
    assert_reference_matches_ort_on_quantized_tensors(out, feeds[0])


def test_quantize_static_variable_sequence_lengths_are_fine(tmp_path):
    src = tmp_path / "enc.onnx"
    onnx.save(models.encoder_block(), src)
    feeds = models.encoder_feeds(4)
    assert len({f["x"].shape[1] for f in feeds}) == 4
    summary = quanta.quantize_static(src, tmp_path / "o.onnx", feeds, verbose=False)
    assert summary.samples == 4


@pytest.mark.parametrize("method", [m.value for m in CalibrationMethod])
def test_quantize_static_every_calibration_method(tmp_path, method):
    src = tmp_path / "cnn.onnx"
    onnx.save(models.float_cnn(), src)
    out = tmp_path / "q.onnx"
    summary = quanta.quantize_static(src, out, cnn_feeds(8), method=method, verbose=False)
    assert summary.method == method
    feed = cnn_feeds(1, seed=3)[0]
    ref = ort.InferenceSession(str(src)).run(None, feed)[0]
    q = ort.InferenceSession(str(out), ort_session_options()).run(None, feed)[0]
    # Clipping methods (entropy, percentile) trade outlier error for resolution; on this
    # random 2-layer net with 8 samples that costs up to ~10 dB against MinMax's ~30 dB.
    assert 10 * np.log10(np.sum(ref**2) / np.sum((ref - q) ** 2)) > 15.0


def test_quantize_static_exclude_by_regex_and_fixed_range_override(tmp_path):
    src = tmp_path / "cnn.onnx"
    onnx.save(models.float_cnn(), src)
    out = tmp_path / "q.onnx"
    summary = quanta.quantize_static(
        src,
        out,
        cnn_feeds(),
        exclude=["fl.*"],  # flat, not fc
        overrides={"f": {"range": [0.0, 4.0]}},
        verbose=False,
    )
    float_nodes = {name: reason for name, _, reason in summary.float_nodes}
    assert float_nodes["flat"] == "excluded by the recipe"
    assert "fc" not in float_nodes  # a full match, not a prefix
    # the pool and Relu before the float Flatten feed only float ops now
    assert float_nodes["pool"].startswith("its output feeds only float ops")
    g = load(out).graph
    f_q = (
        next(n for n in g.nodes if n.op_type == "QuantizeLinear" and n.inputs[0].name == "f")
        .outputs[0]
        .type.elem
    )
    assert (
        isinstance(f_q, QuantType) and f_q.scale == (float(np.float32(4.0 / 255)),) and f_q.zero_point == (0,)
    )


def test_quantize_static_int8_activations_per_tensor_weights(tmp_path):
    src = tmp_path / "cnn.onnx"
    onnx.save(models.float_cnn(), src)
    out = tmp_path / "q.onnx"
    quanta.quantize_static(src, out, cnn_feeds(), activation_type="int8", per_channel=False, verbose=False)
    g = load(out).graph
    for v in g.values():
        if v.type is not None and isinstance(v.type.elem, QuantType) and v.type.elem.storage.bits == 8:
            assert v.type.elem.storage.signed and v.type.elem.axis is None
    assert_reference_matches_ort_on_quantized_tensors(out, cnn_feeds(1, seed=2)[0])


def test_quantize_static_bad_feed_names_the_input(tmp_path):
    src = tmp_path / "cnn.onnx"
    onnx.save(models.float_cnn(), src)
    bad = [{"x": np.zeros((2, 3, 8, 6), np.float64)}]
    with pytest.raises(CalibrationDataError) as e:
        quanta.quantize_static(src, tmp_path / "q.onnx", bad, verbose=False)
    assert str(e.value) == "calibration sample 0: input 'x' has dtype float64, the model expects float32"
    assert not (tmp_path / "q.onnx").exists()


def test_quantize_static_accepts_a_calibration_data_reader(tmp_path):
    class Reader:
        def __init__(self):
            self.data = iter(cnn_feeds(3))

        def get_next(self):
            return next(self.data, None)

    src = tmp_path / "cnn.onnx"
    onnx.save(models.float_cnn(), src)
    summary = quanta.quantize_static(src, tmp_path / "q.onnx", Reader(), verbose=False)
    assert summary.samples == 3


def test_quantize_static_accepts_a_folder_of_npz(tmp_path):
    folder = tmp_path / "calib"
    folder.mkdir()
    for k, f in enumerate(cnn_feeds(3)):
        np.savez(folder / f"{k}.npz", **f)
    src = tmp_path / "cnn.onnx"
    onnx.save(models.float_cnn(), src)
    summary = quanta.quantize_static(src, tmp_path / "q.onnx", folder, verbose=False)
    assert summary.samples == 3


def test_quantize_static_int4_weights_are_blocked_along_k(tmp_path):
    src = tmp_path / "enc.onnx"
    onnx.save(models.encoder_block(d=48, heads=3), src)
    out = tmp_path / "q4.onnx"
    rng = np.random.default_rng(0)
    feeds = [
        {"x": rng.standard_normal((1, 7, 48)).astype(np.float32), "mask": np.ones((1, 7), np.int64)}
        for _ in range(3)
    ]
    quanta.quantize_static(src, out, feeds, weight_type="int4", weight_block_size=16, verbose=False)
    proto = onnx.load(str(out))
    assert proto.opset_import[0].version >= 21  # int4 / block_size need DequantizeLinear-21
    w1 = load(out).graph.initializers["w1_quantized"].type.elem  # MatMul B [48, 96]
    assert (str(w1.storage), w1.axis, w1.block, w1.scale_shape) == ("i4", 0, 16, (3, 96))
    dq = next(n for n in proto.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "w1_quantized")
    assert {a.name: a.i for a in dq.attribute} == {"axis": 0, "block_size": 16}
    feed = {"x": rng.standard_normal((1, 5, 48)).astype(np.float32), "mask": np.ones((1, 5), np.int64)}
    theirs = ort.InferenceSession(str(out), ort_session_options()).run(None, feed)[0]
    ours = quanta.InferenceSession(str(out), backend="reference").run(None, feed)[0]
    # float outputs after LayerNorm; quanta lowers the int8 parts, ORT fuses its own:
    # each side within one int8 step of the other upstream, ~1e-2 after LayerNorm here
    np.testing.assert_allclose(ours, theirs, atol=0.05)


def test_quantize_static_bias_correction_removes_the_mean_output_error(tmp_path):
    # per-tensor 8-bit weights on a conv whose input has a large mean: the weight rounding
    # error ΔW·E[x] shifts every output channel; bias correction subtracts it
    rng = np.random.default_rng(7)
    src = tmp_path / "cnn.onnx"
    onnx.save(models.float_cnn(seed=3), src)
    feeds = [{"x": (rng.standard_normal((4, 3, 8, 6)) + 3.0).astype(np.float32)} for _ in range(6)]
    test = {"x": (rng.standard_normal((16, 3, 8, 6)) + 3.0).astype(np.float32)}
    ref = ort.InferenceSession(str(src)).run(None, test)[0]
    errors = {}
    for on in (False, True):
        out = tmp_path / f"q{on}.onnx"
        quanta.quantize_static(src, out, feeds, per_channel=False, bias_correction=on, verbose=False)
        q = ort.InferenceSession(str(out), ort_session_options()).run(None, test)[0]
        errors[on] = np.abs((q - ref).mean(axis=0)).mean()  # mean error per output, then averaged
    assert errors[True] < 0.7 * errors[False]


def test_quantize_static_embedding_table_is_stored_int8(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    table = rng.standard_normal((1000, 16)).astype(np.float32)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    g = helper.make_graph(
        [
            helper.make_node("Gather", ["emb", "ids"], ["e"], name="gather"),
            helper.make_node("MatMul", ["e", "w"], ["y"], name="mm"),
        ],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5, 8])],
        [numpy_helper.from_array(table, "emb"), numpy_helper.from_array(w, "w")],
    )
    src, out = tmp_path / "emb.onnx", tmp_path / "embq.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    feeds = [{"ids": rng.integers(0, 1000, (2, 5))} for _ in range(4)]
    summary = quanta.quantize_static(src, out, feeds, verbose=False)
    assert ("gather", "Gather") in summary.quantized
    assert out.stat().st_size < 0.35 * src.stat().st_size  # the 64 KB table is now 16 KB
    plan = quanta.InferenceSession(str(out)).plan
    assert plan.steps[0].op_type == "Gather"  # gathers int8 rows, no per-run table quantize
    from quanta.runtime.plan import SlotKind

    assert not any(
        s.op_type == "QuantizeLinear" and plan.slots[s.inputs[0]].kind is SlotKind.CONSTANT
        for s in plan.steps
    )
    t = {"ids": rng.integers(0, 1000, (3, 5))}
    a = ort.InferenceSession(str(src)).run(None, t)[0]
    b = ort.InferenceSession(str(out), ort_session_options()).run(None, t)[0]
    assert 10 * np.log10((a**2).sum() / ((a - b) ** 2).sum()) > 30.0  # int8 table + int8 activations


def test_quantize_static_on_an_already_quantized_model_keeps_its_grids(tmp_path):
    """A valid quantized file is quantized through its float view (no refusal): the
    input's Q/DQ keeps the file's scale and zero point, the summary says what happened."""
    from onnx import numpy_helper

    src = tmp_path / "q.onnx"
    onnx.save(models.qdq_conv(), src)
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal((1, 3, 9, 5)).astype(np.float32)} for _ in range(4)]
    summary = quanta.quantize_static(src, tmp_path / "qq.onnx", feeds, verbose=False)
    out = onnx.load(tmp_path / "qq.onnx")
    onnx.checker.check_model(out, full_check=True)
    assert any("already quantized" in n for n in summary.notes)
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    q_x = next(n for n in out.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    assert abs(float(inits[q_x.input[1]]) - 0.02) <= 1e-7 * 0.02 and int(inits[q_x.input[2]]) == 131
    feed = feeds[0]
    a = ort.InferenceSession(str(tmp_path / "qq.onnx"), ort_session_options()).run(None, feed)[0]
    b = quanta.InferenceSession(str(tmp_path / "qq.onnx")).run(None, feed)[0]
    np.testing.assert_allclose(a, b, atol=0.07 + 1e-6)  # one output step


@pytest.mark.parametrize("options", [{}, {"target": "npu-sim"}])
def test_a_model_of_another_domain_only_quantizes(options, tmp_path):
    """An ai.onnx.ml-only model (no ai.onnx opset import): nothing to quantize, written
    as it computes, for the integer-only target too (which asked the ai.onnx opset)."""
    from onnx import TensorProto, helper

    node = helper.make_node("Binarizer", ["x"], ["y"], domain="ai.onnx.ml", threshold=0.25)
    graph = helper.make_graph(
        [node],
        "ml_only",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 7])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1)])
    src, dst = tmp_path / "ml.onnx", tmp_path / "q.onnx"
    onnx.save(model, src)
    feeds = [{"x": np.random.default_rng(k).normal(0, 1, (3, 7)).astype(np.float32)} for k in range(3)]
    quanta.quantize_static(src, dst, feeds, verbose=False, **options)
    onnx.checker.check_model(onnx.load(dst))
    got = quanta.InferenceSession(str(dst)).run(None, feeds[2])[0]
    np.testing.assert_array_equal(got, (feeds[2]["x"] > 0.25).astype(np.float32))


def test_a_dilated_average_pool_stays_float_for_onnx_runtime(tmp_path):
    """ONNX Runtime fuses a Q/DQ AveragePool into QLinearAveragePool, which has no
    dilations: a quantized dilated pool would make its session refuse the file."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node(
            "AveragePool", ["r1"], ["p"], kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 2, 2, 2]
        ),
        helper.make_node("Conv", ["p", "w2"], ["y"], pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "dilated_pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 13, 11])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7, 13, 11])],
        [
            numpy_helper.from_array(rng.normal(0, 0.4, (17, 3, 3, 3)).astype(np.float32), "w1"),
            numpy_helper.from_array(rng.normal(0, 0.2, (7, 17, 3, 3)).astype(np.float32), "w2"),
        ],
    )
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), src)
    feeds = [{"x": rng.normal(0, 1, (1, 3, 13, 11)).astype(np.float32)} for _ in range(4)]
    summary = quanta.quantize_static(src, dst, feeds[:3], verbose=False)
    assert any(op == "AveragePool" and "dilations" in why for _, op, why in summary.float_nodes)
    out = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, feeds[3])[0]
    np.testing.assert_allclose(
        quanta.InferenceSession(str(dst)).run(None, feeds[3])[0], out, atol=1e-3 * np.abs(out).max() + 1e-5
    )
