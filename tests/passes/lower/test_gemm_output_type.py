"""A QDQ Gemm whose output type is not its input's: NNCF's file of a Linear -> ReLU
head quantizes the input to int8 and the output to uint8. com.microsoft QGemm's Y has
A's type, so the group lowers to the float-output QGemm and a QuantizeLinear; lowered to
one QGemm, both targets refused it at run time ("y_zero_point: expected a scalar of A's
type int8, got uint8")."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import quanta

M, K, N = 3, 301, 17


def _model():
    rng = np.random.default_rng(41)
    inits = [
        numpy_helper.from_array(np.float32(0.017), "xs"),
        numpy_helper.from_array(np.int8(-5), "xz"),
        # weights on the 7-bit grid: ONNX Runtime's u8 x s8 kernel on a CPU without VNNI
        # sums product pairs in saturating int16 (docs/kernels.md "AVX2") and would not be
        # the reference this test compares with there
        numpy_helper.from_array(rng.integers(-64, 65, (N, K)).astype(np.int8), "w"),
        numpy_helper.from_array((rng.random(N) * 0.003 + 0.001).astype(np.float32), "ws"),
        numpy_helper.from_array(np.zeros(N, np.int8), "wz"),
        numpy_helper.from_array(rng.standard_normal(N).astype(np.float32) * 0.2, "b"),
        numpy_helper.from_array(np.float32(0.029), "ys"),
        numpy_helper.from_array(np.uint8(0), "yz"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xf"]),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], axis=0),
        helper.make_node("Gemm", ["xf", "wf", "b"], ["g"], transB=1),
        helper.make_node("Relu", ["g"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [M, N])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def test_int8_input_uint8_output_gemm_runs_integer_and_natively():
    proto = _model()
    x = np.random.default_rng(2).uniform(-1.9, 2.1, (M, K)).astype(np.float32)
    sess = quanta.InferenceSession(proto)
    assert sess.fallbacks == []
    ops = {n.op_type for n in sess.model.graph.nodes}
    assert "QGemm" in ops and "Gemm" not in ops, ops
    got = sess.run(None, {"x": x})[0]
    want = quanta.InferenceSession(proto, backend="reference").run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) > 8
    so = ort.SessionOptions()
    so.log_severity_level = 3
    theirs = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    assert np.abs(got - theirs.run(None, {"x": x})[0]).max() <= 0.029 * 1.0001
