"""Small models built by code for tests (float, QDQ, QOperator); nothing is committed
as a binary."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"


def _init(name: str, arr) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


def float_cnn(opset: int = 17, seed: int = 0) -> onnx.ModelProto:
    """Conv(3->7, 3x3, pad 1) -> Relu -> MaxPool 2x2 -> Flatten -> Gemm(->5)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((7, 3, 3, 3)).astype(np.float32) * 0.3
    b = rng.standard_normal(7).astype(np.float32) * 0.1
    fc = rng.standard_normal((5, 7 * 4 * 3)).astype(np.float32) * 0.1
    fcb = rng.standard_normal(5).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], name="fc", transB=1),
    ]
    g = helper.make_graph(
        nodes,
        "float_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])],
        [_init("w", w), _init("b", b), _init("fc", fc), _init("fcb", fcb)],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def qdq_conv(opset: int = 21) -> onnx.ModelProto:
    """x -Q(u8, 0.02, 131)- DQ -> Conv(w: DQ(i8 per-channel)) -> Q(u8, 0.07, 119) -> DQ."""
    rng = np.random.default_rng(1)
    wq = rng.integers(-127, 128, (7, 3, 3, 3)).astype(np.int8)
    ws = np.array([0.011, 0.007, 0.013, 0.005, 0.009, 0.012, 0.004], np.float32)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="q_x"),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xf"], name="dq_x"),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wf"], name="dq_w", axis=0),
        helper.make_node("Conv", ["xf", "wf"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"], name="q_c"),
        helper.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["y"], name="dq_c"),
    ]
    inits = [
        _init("xs", np.float32(0.02)),
        _init("xz", np.uint8(131)),
        _init("wq", wq),
        _init("ws", ws),
        _init("wz", np.zeros(7, np.int8)),
        _init("ys", np.float32(0.07)),
        _init("yz", np.uint8(119)),
    ]
    g = helper.make_graph(
        nodes,
        "qdq_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7, 9, 5])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def qoperator(opset: int = 17) -> onnx.ModelProto:
    """QLinearConv -> com.microsoft QLinearAdd (residual with another scale) ->
    QLinearGlobalAveragePool -> DequantizeLinear."""
    rng = np.random.default_rng(2)
    w = rng.integers(-100, 100, (7, 3, 3, 3)).astype(np.int8)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="q_x"),
        helper.make_node(
            "QLinearConv", ["xq", "xs", "xz", "w", "ws", "wz", "cs", "cz"], ["c"], name="qconv", pads=[1, 1, 1, 1]
        ),
        helper.make_node("QuantizeLinear", ["r", "rs", "rz"], ["rq"], name="q_r"),
        helper.make_node("QLinearAdd", ["c", "cs", "cz", "rq", "rs", "rz", "as", "az"], ["a"], name="qadd", domain=MS),
        helper.make_node("QLinearGlobalAveragePool", ["a", "as", "az", "gs", "gz"], ["gp"], name="gap", domain=MS),
        helper.make_node("DequantizeLinear", ["gp", "gs", "gz"], ["y"], name="dq"),
    ]
    inits = [
        _init("xs", np.float32(0.02)),
        _init("xz", np.uint8(131)),
        _init("w", w),
        _init("ws", np.array([0.011, 0.007, 0.013, 0.005, 0.009, 0.012, 0.004], np.float32)),
        _init("wz", np.zeros(7, np.int8)),
        _init("cs", np.float32(0.09)),
        _init("cz", np.uint8(117)),
        _init("rs", np.float32(0.03)),
        _init("rz", np.uint8(125)),
        _init("as", np.float32(0.11)),
        _init("az", np.uint8(121)),
        _init("gs", np.float32(0.05)),
        _init("gz", np.uint8(126)),
    ]
    g = helper.make_graph(
        nodes,
        "qoperator",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 7, 5]),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 7, 7, 5]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7, 1, 1])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
