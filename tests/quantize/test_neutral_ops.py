"""Views and Pad are neutral in "quantize only what pays" (quantize/qdq.py): a view or a
Pad next to a convolution never leaves the convolution float. The written files run in
ONNX Runtime, and quanta's reference agrees with it within 1 LSB on every quantized
tensor (test_static's check)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from tests.quantize.test_static import assert_reference_matches_ort_on_quantized_tensors

pytest.importorskip("onnxruntime")


def _conv_weights(rng, m, c, k=3):
    return (rng.standard_normal((m, c, k, k)) * 0.3).astype(np.float32)


def transpose_input_proto():
    """x [N, H, W, C] (channels-last input) -> Transpose -> Conv -> Relu -> Conv."""
    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array(_conv_weights(rng, 6, 3), "w0"),
        numpy_helper.from_array(_conv_weights(rng, 4, 6), "w1"),
    ]
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2], name="to_nchw"),
        helper.make_node("Conv", ["t", "w0"], ["c0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="conv0"),
        helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
        helper.make_node("Conv", ["r0", "w1"], ["y"], kernel_shape=[3, 3], name="conv1"),
    ]
    g = helper.make_graph(
        nodes,
        "nhwc_input",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 9, 8, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def pad_between_proto(*, value_input: bool = False, value: float = 0.0):
    """Conv -> Clip(0, 6) -> Pad (reflect padding is no Conv padding, so FoldPad leaves
    it) -> depthwise Conv -> Clip -> Conv."""
    rng = np.random.default_rng(2)
    c = 5
    inits = [
        numpy_helper.from_array(_conv_weights(rng, c, 3, 1), "w0"),
        numpy_helper.from_array(_conv_weights(rng, c, 1), "w1"),
        numpy_helper.from_array(_conv_weights(rng, 4, c, 1), "w2"),
        numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
        numpy_helper.from_array(np.array(6.0, np.float32), "hi"),
        numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 10, 10])]
    if value_input:
        inputs.append(helper.make_tensor_value_info("v", TensorProto.FLOAT, []))
        pad = helper.make_node("Pad", ["a", "pads", "v"], ["p"], mode="constant", name="pad")
    elif value:
        inits.append(numpy_helper.from_array(np.array(value, np.float32), "v"))
        pad = helper.make_node("Pad", ["a", "pads", "v"], ["p"], mode="constant", name="pad")
    else:
        pad = helper.make_node("Pad", ["a", "pads"], ["p"], mode="reflect", name="pad")
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["e"], kernel_shape=[1, 1], name="expand"),
        helper.make_node("Clip", ["e", "lo", "hi"], ["a"], name="relu6"),
        pad,
        helper.make_node("Conv", ["p", "w1"], ["d"], kernel_shape=[3, 3], group=c, name="dw"),
        helper.make_node("Clip", ["d", "lo", "hi"], ["a2"], name="relu6_2"),
        helper.make_node("Conv", ["a2", "w2"], ["y"], kernel_shape=[1, 1], name="project"),
    ]
    g = helper.make_graph(
        nodes, "pad_between", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _quantize(tmp_path, proto, feeds):
    src, out = tmp_path / "m.onnx", tmp_path / "m.int8.onnx"
    onnx.save(proto, src)
    summary = quanta.quantize_static(src, out, feeds, verbose=False)
    return summary, out


def _lowered_ops(path, feeds=None):
    return [s.op_type for s in quanta.InferenceSession(str(path)).plan.steps]


def test_view_of_a_graph_input_quantizes_the_conv_it_feeds(tmp_path):
    """Failure signature: conv0 float with "input 't' stays float: a view of a tensor that
    stays float" (the graph input under the Transpose had no range of its own)."""
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal((2, 9, 8, 3)).astype(np.float32)} for _ in range(3)]
    summary, out = _quantize(tmp_path, transpose_input_proto(), feeds)
    quantized = {name for name, _ in summary.quantized}
    assert {"to_nchw", "conv0", "conv1"} <= quantized, summary.float_nodes
    ops = _lowered_ops(out)
    assert "Conv" not in ops and ops.count("QLinearConv") + ops.count("ConvInteger") == 2, ops
    assert_reference_matches_ort_on_quantized_tensors(out, feeds[0])


@pytest.mark.parametrize("value", [0.0, 0.7])
def test_pad_between_activation_and_conv_is_quantized(tmp_path, value):
    """Failure signature: expand and relu6 float ("its output feeds only float ops") because
    the Pad after relu6 stayed float by design."""
    rng = np.random.default_rng(4)
    feeds = [{"x": rng.standard_normal((1, 3, 10, 10)).astype(np.float32)} for _ in range(3)]
    summary, out = _quantize(tmp_path, pad_between_proto(value=value), feeds)
    quantized = {name for name, _ in summary.quantized}
    assert {"expand", "relu6", "pad", "dw", "relu6_2", "project"} <= quantized, summary.float_nodes
    written = onnx.load(out)
    producer = {o: n for n in written.graph.node for o in n.output}
    (pad,) = [n for n in written.graph.node if n.op_type == "Pad"]
    (q_after,) = [n for n in written.graph.node if n.input and n.input[0] == pad.output[0]]
    dq_before = producer[pad.input[0]]
    assert (dq_before.op_type, q_after.op_type) == ("DequantizeLinear", "QuantizeLinear")
    inits = {t.name: numpy_helper.to_array(t) for t in written.graph.initializer}
    for a, b in zip(dq_before.input[1:], q_after.input[1:]):
        np.testing.assert_array_equal(inits[a], inits[b])  # the Pad keeps its input's scale and zero point
    ops = _lowered_ops(out)
    assert "Conv" not in ops and ops.count("Pad") == 1, ops
    assert "DequantizeLinear" not in ops[: ops.index("Pad")], ops  # the Pad reads integers
    assert_reference_matches_ort_on_quantized_tensors(out, feeds[0])


def test_pad_with_a_run_time_value_stays_float_with_its_reason(tmp_path):
    rng = np.random.default_rng(5)
    feeds = [
        {"x": rng.standard_normal((1, 3, 10, 10)).astype(np.float32), "v": np.array(0.0, np.float32)}
        for _ in range(3)
    ]
    summary, _ = _quantize(tmp_path, pad_between_proto(value_input=True), feeds)
    reasons = {name: reason for name, _, reason in summary.float_nodes}
    assert (
        reasons["pad"]
        == "its pad value is computed at run time: the integer Pad needs Q(value) ahead of time"
    )
    assert "dw" in {name for name, _ in summary.quantized}  # the Pad's output gets its own range


def test_view_of_a_float_op_output_quantizes_the_matmul_it_feeds(tmp_path):
    """Failure signature: MatMul float with "activation 't' stays float: a view of a tensor
    that stays float" (LayerNormalization is not quantized, so the Transpose under it
    had nothing to inherit)."""
    rng = np.random.default_rng(7)
    inits = [
        numpy_helper.from_array(np.ones(6, np.float32), "gamma"),
        numpy_helper.from_array(np.zeros(6, np.float32), "beta"),
        numpy_helper.from_array((rng.standard_normal((5, 4)) * 0.3).astype(np.float32), "w"),
    ]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["n"], axis=-1, name="ln"),
        helper.make_node("Transpose", ["n"], ["t"], perm=[0, 2, 1], name="swap"),
        helper.make_node("MatMul", ["t", "w"], ["y"], name="mm"),
    ]
    g = helper.make_graph(
        nodes,
        "ln_view_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    feeds = [{"x": rng.standard_normal((2, 5, 6)).astype(np.float32)} for _ in range(3)]
    summary, out = _quantize(tmp_path, proto, feeds)
    assert {"swap", "mm"} <= {name for name, _ in summary.quantized}, summary.float_nodes
    ops = _lowered_ops(out)
    assert "MatMul" not in ops, ops
    assert_reference_matches_ort_on_quantized_tensors(out, feeds[0])
