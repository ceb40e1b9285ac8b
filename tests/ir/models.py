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


def qdq_conv(opset: int = 21, *, chained: bool = False) -> onnx.ModelProto:
    """x -Q(u8, 0.02, 131)- DQ -> Conv(w: DQ(i8 per-channel)) -> Q(u8, 0.07, 119) -> DQ;
    ``chained``: then a second Conv (1x1, 7 -> 7) -> Q(u8, 0.05, 124) -> DQ (a channels-last
    region of two convolutions; one alone stays NCHW)."""
    rng = np.random.default_rng(1)
    wq = rng.integers(-127, 128, (7, 3, 3, 3)).astype(np.int8)
    ws = np.array([0.011, 0.007, 0.013, 0.005, 0.009, 0.012, 0.004], np.float32)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="q_x"),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xf"], name="dq_x"),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wf"], name="dq_w", axis=0),
        helper.make_node("Conv", ["xf", "wf"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"], name="q_c"),
        helper.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["c1" if chained else "y"], name="dq_c"),
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
    if chained:
        nodes += [
            helper.make_node("DequantizeLinear", ["w2q", "ws", "wz"], ["w2f"], name="dq_w2", axis=0),
            helper.make_node("Conv", ["c1", "w2f"], ["c2"], name="conv2"),
            helper.make_node("QuantizeLinear", ["c2", "y2s", "y2z"], ["c2q"], name="q_c2"),
            helper.make_node("DequantizeLinear", ["c2q", "y2s", "y2z"], ["y"], name="dq_c2"),
        ]
        inits += [
            _init("w2q", rng.integers(-127, 128, (7, 7, 1, 1)).astype(np.int8)),
            _init("y2s", np.float32(0.05)),
            _init("y2z", np.uint8(124)),
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
            "QLinearConv",
            ["xq", "xs", "xz", "w", "ws", "wz", "cs", "cz"],
            ["c"],
            name="qconv",
            pads=[1, 1, 1, 1],
        ),
        helper.make_node("QuantizeLinear", ["r", "rs", "rz"], ["rq"], name="q_r"),
        helper.make_node(
            "QLinearAdd", ["c", "cs", "cz", "rq", "rs", "rz", "as", "az"], ["a"], name="qadd", domain=MS
        ),
        helper.make_node(
            "QLinearGlobalAveragePool", ["a", "as", "az", "gs", "gz"], ["gp"], name="gap", domain=MS
        ),
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


def encoder_block(opset: int = 17, seed: int = 5, d: int = 24, heads: int = 3) -> onnx.ModelProto:
    """A BERT-style self-attention block with an additive attention mask.

    x[N, S, d], mask[N, S] (1 keep / 0 pad) -> (1 - mask) * -3.4e38 added to the scores
    (as HF exports do), Q/K/V projections, scores = QK^T / sqrt(dh) (both MatMul operands
    are activations), Softmax, context, output projection, residual Add, LayerNorm, a
    Gelu MLP, residual, LayerNorm. The sequence length S is symbolic.
    """
    rng = np.random.default_rng(seed)
    dh = d // heads

    def w(*shape, s=0.2):
        return (rng.standard_normal(shape) * s).astype(np.float32)

    inits = [
        _init("wq", w(d, d)),
        _init("wk", w(d, d)),
        _init("wv", w(d, d)),
        _init("wo", w(d, d)),
        _init("bq", w(d, s=0.05)),
        _init("bo", w(d, s=0.05)),
        _init("w1", w(d, 2 * d)),
        _init("b1", w(2 * d, s=0.05)),
        _init("w2", w(2 * d, d)),
        _init("ln1_g", 1 + w(d, s=0.1)),
        _init("ln1_b", w(d, s=0.1)),
        _init("ln2_g", 1 + w(d, s=0.1)),
        _init("ln2_b", w(d, s=0.1)),
        _init("heads_shape", np.array([0, -1, heads, dh], np.int64)),
        _init("merge_shape", np.array([0, -1, d], np.int64)),
        _init("one", np.float32(1.0)),
        _init("neg", np.float32(-3.4e38)),
        _init("inv_sqrt_dh", np.float32(1.0 / np.sqrt(dh))),
        _init("mask_axes", np.array([1, 2], np.int64)),
    ]
    n = helper.make_node
    nodes = [
        n("Cast", ["mask"], ["maskf"], to=TensorProto.FLOAT, name="mask_cast"),
        n("Sub", ["one", "maskf"], ["inv_mask"], name="mask_sub"),
        n("Mul", ["inv_mask", "neg"], ["mask_add"], name="mask_mul"),
        n("Unsqueeze", ["mask_add", "mask_axes"], ["mask4"], name="mask_unsqueeze"),
        n("MatMul", ["x", "wq"], ["q0"], name="q_proj"),
        n("Add", ["q0", "bq"], ["q1"], name="q_bias"),
        n("MatMul", ["x", "wk"], ["k0"], name="k_proj"),
        n("MatMul", ["x", "wv"], ["v0"], name="v_proj"),
        n("Reshape", ["q1", "heads_shape"], ["q2"], name="q_reshape"),
        n("Transpose", ["q2"], ["q3"], perm=[0, 2, 1, 3], name="q_transpose"),
        n("Reshape", ["k0", "heads_shape"], ["k2"], name="k_reshape"),
        n("Transpose", ["k2"], ["k3"], perm=[0, 2, 3, 1], name="k_transpose"),
        n("Reshape", ["v0", "heads_shape"], ["v2"], name="v_reshape"),
        n("Transpose", ["v2"], ["v3"], perm=[0, 2, 1, 3], name="v_transpose"),
        n("MatMul", ["q3", "k3"], ["s0"], name="scores"),
        n("Mul", ["s0", "inv_sqrt_dh"], ["s1"], name="scale"),
        n("Add", ["s1", "mask4"], ["s2"], name="add_mask"),
        n("Softmax", ["s2"], ["p"], axis=-1, name="softmax"),
        n("MatMul", ["p", "v3"], ["c0"], name="context"),
        n("Transpose", ["c0"], ["c1"], perm=[0, 2, 1, 3], name="c_transpose"),
        n("Reshape", ["c1", "merge_shape"], ["c2"], name="c_reshape"),
        n("MatMul", ["c2", "wo"], ["o0"], name="o_proj"),
        n("Add", ["o0", "bo"], ["o1"], name="o_bias"),
        n("Add", ["o1", "x"], ["r1"], name="residual1"),
        n("LayerNormalization", ["r1", "ln1_g", "ln1_b"], ["h1"], axis=-1, epsilon=1e-5, name="ln1"),
        n("MatMul", ["h1", "w1"], ["f0"], name="ffn1"),
        n("Add", ["f0", "b1"], ["f1"], name="ffn1_bias"),
        n("Relu", ["f1"], ["f2"], name="ffn_act"),
        n("MatMul", ["f2", "w2"], ["f3"], name="ffn2"),
        n("Add", ["f3", "h1"], ["r2"], name="residual2"),
        n("LayerNormalization", ["r2", "ln2_g", "ln2_b"], ["y"], axis=-1, epsilon=1e-5, name="ln2"),
    ]
    g = helper.make_graph(
        nodes,
        "encoder_block",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "S", d]),
            helper.make_tensor_value_info("mask", TensorProto.INT64, ["N", "S"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "S", d])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def encoder_feeds(n_samples: int = 6, seed: int = 7, d: int = 24) -> list[dict[str, np.ndarray]]:
    """Calibration feeds with a different sequence length per sample and padded masks."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n_samples):
        s = 5 + 3 * k
        mask = np.ones((2, s), np.int64)
        mask[1, s - 2 :] = 0
        out.append({"x": rng.standard_normal((2, s, d)).astype(np.float32), "mask": mask})
    return out


def concat_branches() -> onnx.ModelProto:
    """Two convolution branches (1x1 and padded 3x3, 5 and 4 channels) concatenated into
    a strided 3x3 convolution over 9 channels and a global average pool: a Concat whose
    inputs carry their own scales. Batch dimension symbolic."""
    rng = np.random.default_rng(4)
    w1 = numpy_helper.from_array(rng.standard_normal((5, 3, 1, 1)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w2")
    w3 = numpy_helper.from_array((rng.standard_normal((7, 9, 3, 3)) * 0.2).astype(np.float32), "w3")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="c1"),
        helper.make_node("Conv", ["x", "w2"], ["b"], name="c2", pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["a", "b"], ["cat"], axis=1, name="cat"),
        helper.make_node("Conv", ["cat", "w3"], ["c"], name="c3", strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["c"], ["y"], name="gap"),
    ]
    g = helper.make_graph(
        nodes,
        "branches",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 11, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 7, 1, 1])],
        [w1, w2, w3],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
