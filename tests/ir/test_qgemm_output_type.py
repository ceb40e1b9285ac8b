"""com.microsoft QGemm's output type comes from its y_scale / y_zero_point.

ONNX Runtime's QOperator file of Linear -> ReLU -> Linear is two QGemm in a row with no
value_info between them; without a type for the first one's output, the native binder
of the second saw an A of unknown type and ran the NumPy twin."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.ir.types import QuantType

K, N1, N2, M = 301, 17, 7, 3


def _model(y2: bool = True):
    rng = np.random.default_rng(31)
    # weights on the 7-bit grid: ONNX Runtime's u8 x s8 kernel on a CPU without VNNI sums
    # product pairs in saturating int16 (docs/kernels.md "AVX2") and would not be the
    # reference this test compares with there
    inits = [
        numpy_helper.from_array(np.float32(0.013), "xs"),
        numpy_helper.from_array(np.uint8(121), "xz"),
        numpy_helper.from_array(rng.integers(-64, 65, (N1, K)).astype(np.int8), "w1"),
        numpy_helper.from_array((rng.random(N1) * 0.004 + 0.001).astype(np.float32), "w1s"),
        numpy_helper.from_array(np.zeros(N1, np.int8), "w1z"),
        numpy_helper.from_array(rng.integers(-3000, 3000, N1).astype(np.int32), "b1"),
        numpy_helper.from_array(np.float32(0.051), "h_s"),
        numpy_helper.from_array(np.uint8(3), "h_z"),
        numpy_helper.from_array(rng.integers(-64, 65, (N2, N1)).astype(np.int8), "w2"),
        numpy_helper.from_array((rng.random(N2) * 0.01 + 0.002).astype(np.float32), "w2s"),
        numpy_helper.from_array(np.zeros(N2, np.int8), "w2z"),
        numpy_helper.from_array(np.float32(0.037), "y_s"),
        numpy_helper.from_array(np.uint8(131), "y_z"),
    ]
    y_in = ["y_s", "y_z"] if y2 else []
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node(
            "QGemm",
            ["xq", "xs", "xz", "w1", "w1s", "w1z", "b1", "h_s", "h_z"],
            ["h"],
            domain="com.microsoft",
            transB=1,
        ),
        helper.make_node(
            "QGemm",
            ["h", "h_s", "h_z", "w2", "w2s", "w2z", "", *y_in],
            ["yq"],
            domain="com.microsoft",
            transB=1,
        ),
    ]
    out = "yq"
    if y2:
        nodes.append(helper.make_node("DequantizeLinear", ["yq", "y_s", "y_z"], ["y"]))
        out = "y"
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [M, N2])],
        inits,
    )
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )


def test_qgemm_output_gets_the_quantized_type_of_its_y_parameters():
    m = load(_model())
    h = m.graph.nodes[1].outputs[0]
    assert isinstance(h.type.elem, QuantType) and str(h.type.elem.storage) == "u8"
    assert h.type.elem.scale == (np.float32(0.051),) and h.type.elem.zero_point == (3,)


def test_two_qgemm_in_a_row_run_natively_like_ort():
    for y2 in (True, False):  # the second QGemm with a uint8 output, then a float one
        proto = _model(y2)
        x = np.random.default_rng(3).uniform(-1.5, 1.7, (M, K)).astype(np.float32)
        sess = quanta.InferenceSession(proto)
        assert sess.fallbacks == []
        got = sess.run(None, {"x": x})[0]
        want = quanta.InferenceSession(proto, backend="reference").run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, want)
        so = ort.SessionOptions()
        so.log_severity_level = 3
        theirs = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
        step = 0.037 if y2 else 1e-5 * float(np.abs(want).max())
        assert np.abs(got - theirs.run(None, {"x": x})[0]).max() <= step * 1.0001
