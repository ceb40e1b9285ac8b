"""InferenceSession: ONNX Runtime's API, feed validation with errors that list what the
model expects, and the same results on both backends."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import quanta
from quanta.session import InvalidArgument
from tests.ir import models
from tests.ort_int8 import ort_session_options

ort = pytest.importorskip("onnxruntime")


@pytest.fixture(params=["reference", "native"])
def backend(request):
    return request.param


def test_session_accepts_path_bytes_and_proto(tmp_path, backend):
    proto = models.float_cnn()
    p = tmp_path / "m.onnx"
    onnx.save(proto, p)
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 6)).astype(np.float32)
    outs = [
        quanta.InferenceSession(src, backend=backend).run(None, {"x": x})[0]
        for src in (str(p), p, proto.SerializeToString(), proto)
    ]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


def test_session_describes_inputs_and_outputs_like_onnxruntime():
    proto = models.float_cnn()
    q = quanta.InferenceSession(proto, backend="reference")
    o = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for ours, theirs in [(q.get_inputs(), o.get_inputs()), (q.get_outputs(), o.get_outputs())]:
        assert [(a.name, a.shape, a.type) for a in ours] == [(b.name, b.shape, b.type) for b in theirs]


def test_session_matches_onnxruntime_on_a_float_cnn():
    proto = models.float_cnn()
    x = np.random.default_rng(1).standard_normal((3, 3, 8, 6)).astype(np.float32)
    ours = quanta.InferenceSession(proto, backend="reference").run(None, {"x": x})[0]
    theirs = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    # float32 conv/gemm summed in different orders: |err| <= K * eps * sum|terms| ~ 1e-5 here
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


def test_session_output_names_select_and_order():
    proto = models.float_cnn()
    sess = quanta.InferenceSession(proto, backend="reference")
    x = np.zeros((1, 3, 8, 6), np.float32)
    (y,) = sess.run(["y"], {"x": x})
    assert y.shape == (1, 5)
    with pytest.raises(InvalidArgument, match=r"unknown output 'nope'; the model's outputs are: \['y'\]"):
        sess.run(["nope"], {"x": x})


def test_session_wrong_input_name_lists_what_the_model_expects():
    sess = quanta.InferenceSession(models.float_cnn(), backend="reference")
    with pytest.raises(InvalidArgument) as e:
        sess.run(None, {"input": np.zeros((1, 3, 8, 6), np.float32)})
    assert str(e.value) == "unknown input 'input'; the model expects 'x' tensor(float) shape ['N', 3, 8, 6]"


def test_session_wrong_dtype():
    sess = quanta.InferenceSession(models.float_cnn(), backend="reference")
    with pytest.raises(InvalidArgument) as e:
        sess.run(None, {"x": np.zeros((1, 3, 8, 6), np.float64)})
    assert str(e.value).startswith("input 'x': dtype float64, expected tensor(float) (float32)")


def test_session_wrong_shape():
    sess = quanta.InferenceSession(models.float_cnn(), backend="reference")
    with pytest.raises(InvalidArgument) as e:
        sess.run(None, {"x": np.zeros((1, 3, 8, 7), np.float32)})
    assert (
        str(e.value)
        == "input 'x': dimension 3 is 7, expected 6 (shape [1, 3, 8, 7] vs expected ['N', 3, 8, 6])"
    )
    with pytest.raises(InvalidArgument, match=r"input 'x': rank 3 \(shape \[3, 8, 6\]\), expected rank 4"):
        sess.run(None, {"x": np.zeros((3, 8, 6), np.float32)})


def test_session_missing_input():
    sess = quanta.InferenceSession(models.qoperator(), backend="reference")
    with pytest.raises(InvalidArgument, match=r"missing input\(s\) \['r'\]"):
        sess.run(None, {"x": np.zeros((1, 3, 7, 5), np.float32)})


def test_session_unknown_backend():
    with pytest.raises(
        ValueError, match="unknown backend 'gpu': expected one of 'reference', 'native', 'npu-sim'"
    ):
        quanta.InferenceSession(models.float_cnn(), backend="gpu")


@pytest.mark.parametrize("build", [models.qdq_conv, models.qoperator], ids=lambda f: f.__name__)
def test_session_quantized_models_match_onnxruntime(build):
    proto = build()
    rng = np.random.default_rng(3)
    feeds = {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in proto.graph.input
    }
    ours = quanta.InferenceSession(proto, backend="reference").run(None, feeds)[0]
    # ORT's fused QLinearConv saturates full-range int8 weights on cores without VNNI:
    # there it runs the QDQ file as written (tests/ort_int8.py).
    so = ort_session_options()
    theirs = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )[0]
    # Outputs are dequantized int8 values: quanta and ORT may differ by at most one
    # quantization step of the output (documented requantization rounding differences).
    step = 0.07 if build is models.qdq_conv else 0.05
    assert np.max(np.abs(ours - theirs)) <= step * 1.0001


def test_native_and_reference_are_bit_exact_on_quantize(backend):
    del backend  # both are exercised below
    proto = models.qdq_conv()
    x = np.random.default_rng(4).standard_normal((1, 3, 9, 5)).astype(np.float32) * 3
    ref = quanta.InferenceSession(proto, backend="reference").run(None, {"x": x})[0]
    nat_sess = quanta.InferenceSession(proto, backend="native")
    nat = nat_sess.run(None, {"x": x})[0]
    np.testing.assert_array_equal(nat, ref)
    assert all(name != "q_x" for name, _, _ in nat_sess.fallbacks)  # QuantizeLinear ran natively
    # both backends ran the lowered graph: Q -> QLinearConv -> DQ (one convolution alone
    # is no channels-last region)
    assert [s.op_type for s in nat_sess.plan.steps] == ["QuantizeLinear", "QLinearConv", "DequantizeLinear"]
    # two chained convolutions run channels-last, Transposes at the region's edges only
    chained = quanta.InferenceSession(models.qdq_conv(chained=True), backend="native")
    assert [s.op_type for s in chained.plan.steps] == [
        "QuantizeLinear",
        "Transpose",
        "QLinearConv",
        "QLinearConv",
        "Transpose",
        "DequantizeLinear",
    ]
    ref2 = quanta.InferenceSession(models.qdq_conv(chained=True), backend="reference").run(None, {"x": x})[0]
    np.testing.assert_array_equal(chained.run(None, {"x": x})[0], ref2)


def _weights_as_inputs() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """An IR 6 export that lists its weights as graph inputs (overridable initializers, as
    OpenCV zoo's SFace does): y = PRelu(Conv(x, w) * g + b, slope)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(17)
    weights = {
        "w": rng.standard_normal((7, 3, 3, 3)).astype(np.float32) / 5,
        "g": rng.uniform(0.5, 2, (1, 7, 1, 1)).astype(np.float32),
        "b": rng.standard_normal((1, 7, 1, 1)).astype(np.float32),
        "slope": rng.uniform(0.05, 0.3, (7, 1, 1)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 0, 1, 2]),
        helper.make_node("Mul", ["c", "g"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("PRelu", ["a", "slope"], ["y"]),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 11])] + [
        helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape)) for k, v in weights.items()
    ]
    g = helper.make_graph(
        nodes,
        "weights_as_inputs",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
    proto.ir_version = 6
    return proto, weights


def test_a_fed_overridable_initializer_is_what_the_run_computes_with(backend):
    """The session folds weights listed as graph inputs into the convolution (ORT does
    not, and is slower for it), yet a feed that overrides one is what the run uses, as in
    ONNX Runtime; runs that feed none keep the folded plan."""
    proto, weights = _weights_as_inputs()
    sess = quanta.InferenceSession(proto, backend=backend)
    o = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    assert [a.name for a in sess.get_inputs()] == ["x"]
    x = np.random.default_rng(5).standard_normal((1, 3, 9, 11)).astype(np.float32)
    folded = [s.op_type for s in sess.plan.steps]
    assert "Mul" not in folded and "Add" not in folded, folded  # g and b went into the Conv
    # the folded-away defaults are not held twice: the runs that override read the source
    held = {v.name for v in sess.plan.model.graph.inputs if v.const is not None}
    assert {"g", "b"}.isdisjoint(held), held
    overrides = [
        {},
        {"w": weights["w"][::-1].copy()},
        {"g": weights["g"] * -1.5},
        {"b": weights["b"] + 2.0, "slope": weights["slope"] * 3},
        {},
    ]
    for extra in overrides:
        feed = {"x": x, **extra}
        want = o.run(None, feed)[0]
        got = sess.run(None, feed)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=str(sorted(extra)))
    assert [s.op_type for s in sess.plan.steps] == folded
