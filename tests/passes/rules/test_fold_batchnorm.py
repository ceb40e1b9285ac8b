"""fold_batchnorm: BatchNormalization folded into Conv / ConvTranspose / Gemm.

Each positive test has the four parts (fired N times, structure, numerics on the
reference target with a derived tolerance, the verifier); each NoMatch reason has a
negative test asserting its text.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.graph import Graph, Node, Value
from quanta.ir.onnx_io import load
from quanta.ir.printer import format_graph
from quanta.ir.types import F32, I32, TensorType
from quanta.ir.verify import Stage, verify
from quanta.passes.rules._util import FOLDED_OFFSET
from quanta.passes.rules.fold_batchnorm import FoldBatchNorm
from tests.passes.helpers import assert_close, dot_tolerance, out_info, rng_data, run_passes, run_ref


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def bn_params(c: int, seed: int) -> dict[str, np.ndarray]:
    """Per-channel parameters that differ from each other (var in [0.2, 3])."""
    rng = np.random.default_rng(seed)
    return {
        "g": rng.uniform(0.5, 2.0, c).astype(np.float32) * rng.choice([-1, 1], c).astype(np.float32),
        "beta": rng.uniform(-1, 1, c).astype(np.float32),
        "mean": rng.uniform(-0.5, 0.5, c).astype(np.float32),
        "var": rng.uniform(0.2, 3.0, c).astype(np.float32),
    }


def bn_node(inp: str = "c", out: str = "y", **attrs) -> onnx.NodeProto:
    return helper.make_node(
        "BatchNormalization", [inp, "g", "beta", "mean", "var"], [out], name="bn", epsilon=1e-3, **attrs
    )


def make_model(nodes, inputs, outputs, inits, opset=21) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "bn_model", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def conv_bn_model(c_in: int, c_out: int, group: int, bias: bool, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((c_out, c_in // group, 3, 3)).astype(np.float32) * 0.4
    inits = [_init("w", w)] + [_init(k, v) for k, v in bn_params(c_out, seed + 1).items()]
    conv_inputs = ["x", "w"]
    if bias:
        inits.append(_init("b", rng.standard_normal(c_out).astype(np.float32)))
        conv_inputs.append("b")
    nodes = [
        helper.make_node("Conv", conv_inputs, ["c"], name="conv", pads=[1, 0, 1, 2], group=group),
        bn_node(),
    ]
    return make_model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, c_in, 9, 5])],
        [out_info("y", 4)],
        inits,
    )


def conv_tolerance(model, x: np.ndarray, k: int) -> float:
    """dot_tolerance over the folded weights: |x|·Σ|W'| per output channel plus the
    bias-side terms |B·a|, |mean·a|, |beta| (the magnitudes BN's own roundings see)."""
    g = model.graph
    conv = g.find_nodes("Conv")[0] if g.find_nodes("Conv") else g.find_nodes("ConvTranspose")[0]
    w2, b2 = conv.inputs[1].const, conv.inputs[2].const
    if conv.op_type == "Conv":
        per_channel = np.abs(w2).reshape(w2.shape[0], -1).sum(axis=1).max()
    else:
        per_channel = np.abs(w2).sum(axis=0).reshape(-1).max() * np.prod(w2.shape[2:])
    magnitude = np.abs(x).max() * per_channel + 2 * np.abs(b2).max() + 4.0
    return float(dot_tolerance(k, magnitude))


@pytest.mark.parametrize(
    ("c_in", "c_out", "group", "bias"),
    [
        (3, 7, 1, True),  # plain conv with bias
        (3, 7, 1, False),  # B omitted: B' = t
        (6, 9, 3, True),  # grouped: 3 groups of 2 -> 3
        (7, 7, 7, False),  # depthwise
    ],
)
def test_fold_batchnorm_into_conv(c_in, c_out, group, bias):
    proto = conv_bn_model(c_in, c_out, group, bias)
    model = load(proto)
    result = run_passes(model, [FoldBatchNorm()])
    assert result.fired("FoldBatchNormIntoConv") == 1
    assert model.graph.op_counts() == {"Conv": 1}
    conv = model.graph.nodes[0]
    assert conv.name == "conv" and conv.attrs["group"] == group and conv.outputs[0].name == "y"
    assert conv.inputs[1].const.dtype == np.float32 and conv.inputs[2].const.shape == (c_out,)
    x = rng_data((2, c_in, 9, 5), seed=3)
    tol = conv_tolerance(model, x, k=(c_in // group) * 9)
    assert_close(run_ref(proto, {"x": x}), run_ref(model, {"x": x}), tol)
    verify(model.graph, Stage.FLOAT)


def test_fold_batchnorm_keeps_the_original_weight_constant_untouched():
    # Failure signature: folding scaled W in place, corrupting a weight another graph
    # (or another node after a later CSE) shares.
    proto = conv_bn_model(3, 7, 1, True)
    model = load(proto)
    w_before = model.graph.initializers["w"].const.copy()
    run_passes(model, [FoldBatchNorm()])
    np.testing.assert_array_equal(w_before, numpy_helper.to_array(proto.graph.initializer[0]))


@pytest.mark.parametrize(
    ("c_in", "m_per_group", "group", "bias"), [(3, 7, 1, True), (6, 3, 3, False), (6, 2, 3, True)]
)
def test_fold_batchnorm_into_conv_transpose_axis1_and_groups(c_in, m_per_group, group, bias):
    rng = np.random.default_rng(5)
    c_out = m_per_group * group
    w = rng.standard_normal((c_in, m_per_group, 3, 2)).astype(np.float32) * 0.4
    inits = [_init("w", w)] + [_init(k, v) for k, v in bn_params(c_out, 6).items()]
    ins = ["x", "w"]
    if bias:
        inits.append(_init("b", rng.standard_normal(c_out).astype(np.float32)))
        ins.append("b")
    nodes = [
        helper.make_node(
            "ConvTranspose", ins, ["c"], name="deconv", strides=[2, 1], group=group, pads=[1, 0, 0, 1]
        ),
        bn_node(),
    ]
    proto = make_model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, 5, 4])],
        [out_info("y", 4)],
        inits,
    )
    model = load(proto)
    result = run_passes(model, [FoldBatchNorm()])
    assert result.fired("FoldBatchNormIntoConvTranspose") == 1
    assert model.graph.op_counts() == {"ConvTranspose": 1}
    x = rng_data((1, c_in, 5, 4), seed=7)
    # each output sums at most (C/group)·kh·kw products
    tol = conv_tolerance(model, x, k=(c_in // group) * 6)
    assert_close(run_ref(proto, {"x": x}), run_ref(model, {"x": x}), tol)
    verify(model.graph, Stage.FLOAT)


@pytest.mark.parametrize(
    ("trans_b", "with_c", "beta_g"), [(0, True, 0.75), (1, True, 1.0), (1, False, 1.0), (0, False, 2.0)]
)
def test_fold_batchnorm_into_gemm(trans_b, with_c, beta_g):
    rng = np.random.default_rng(8)
    k, n = 17, 7
    w = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32) * 0.3
    inits = [_init("w", w)] + [_init(kk, v) for kk, v in bn_params(n, 9).items()]
    ins = ["a", "w"]
    if with_c:
        inits.append(_init("cb", rng.standard_normal((1, n)).astype(np.float32)))
        ins.append("cb")
    nodes = [
        helper.make_node("Gemm", ins, ["c"], name="fc", transB=trans_b, alpha=1.25, beta=beta_g),
        bn_node(),
    ]
    proto = make_model(
        nodes,
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3, k])],
        [out_info("y", 2)],
        inits,
    )
    model = load(proto)
    result = run_passes(model, [FoldBatchNorm()])
    assert result.fired("FoldBatchNormIntoGemm") == 1
    assert model.graph.op_counts() == {"Gemm": 1}
    gemm = model.graph.nodes[0]
    assert (
        gemm.attrs["beta"] == 1.0 and gemm.attrs["alpha"] == 1.25 and gemm.attrs.get("transB", 0) == trans_b
    )
    a = rng_data((3, k), seed=10)
    w2, c2 = gemm.inputs[1].const, gemm.inputs[2].const
    col = np.abs(w2).sum(axis=1 if trans_b else 0).max()
    tol = dot_tolerance(k, 1.25 * np.abs(a).max() * col + 2 * np.abs(c2).max() + 4.0)
    assert_close(run_ref(proto, {"a": a}), run_ref(model, {"a": a}), tol)
    verify(model.graph, Stage.FLOAT)


def test_fold_batchnorm_folds_each_of_two_convs():
    # fired N times with N = 2, and the second BN reads the first's folded output
    proto = conv_bn_model(3, 7, 1, True)
    rng = np.random.default_rng(11)
    p2 = bn_params(7, 12)
    proto.graph.initializer.extend(
        [_init("w2", rng.standard_normal((7, 7, 1, 1)).astype(np.float32))]
        + [_init(k + "2", v) for k, v in p2.items()]
    )
    proto.graph.output[0].name = "z"
    proto.graph.node.extend(
        [
            helper.make_node("Conv", ["y", "w2"], ["c2"], name="conv2"),
            helper.make_node("BatchNormalization", ["c2", "g2", "beta2", "mean2", "var2"], ["z"], name="bn2"),
        ]
    )
    model = load(proto)
    result = run_passes(model, [FoldBatchNorm()])
    assert result.fired("FoldBatchNormIntoConv") == 2
    assert model.graph.op_counts() == {"Conv": 2}
    x = rng_data((2, 3, 9, 5), seed=13)
    w1 = model.graph.nodes[0].inputs[1].const
    w2 = model.graph.nodes[1].inputs[1].const
    first = np.abs(x).max() * np.abs(w1).reshape(7, -1).sum(1).max() + 10.0
    # the first conv's error (bounded by its tolerance) is amplified by Σ|W2'| in the second
    tol = dot_tolerance(27, first) * np.abs(w2).reshape(7, -1).sum(1).max() + dot_tolerance(
        7, first * np.abs(w2).reshape(7, -1).sum(1).max() + 10.0
    )
    assert_close(run_ref(proto, {"x": x}), run_ref(model, {"x": x}), tol)


# -- NoMatch reasons ------------------------------------------------------------------------


def why_not(target, rule: str = "FoldBatchNormIntoConv", include_pattern: bool = False) -> list[str]:
    """The reasons ``rule`` gave; asserts that the refusal left the graph untouched."""
    graph = target if isinstance(target, Graph) else target.graph
    text_before = format_graph(graph)
    result = run_passes(target, [FoldBatchNorm()])
    assert not result.modified
    assert format_graph(graph) == text_before
    return [r.reason for r in result.why_not(rule, include_pattern=include_pattern)]


def test_fold_batchnorm_refuses_training_mode():
    proto = conv_bn_model(3, 7, 1, True)
    proto.graph.node[1].attribute.append(helper.make_attribute("training_mode", 1))
    assert why_not(load(proto)) == [
        "BatchNormalization is in training mode (training_mode=1): it uses batch statistics"
    ]


def test_fold_batchnorm_refuses_when_running_statistics_are_used():
    # opset 13: the extra outputs are what makes it training mode
    proto = conv_bn_model(3, 7, 1, True)
    del proto.graph.node[1].output[:]
    proto.graph.node[1].output.extend(["y", "rm", "rv", "sm", "sv"])
    proto.graph.output.append(out_info("rm", 1))
    proto.opset_import[0].version = 13
    assert why_not(load(proto)) == ["BatchNormalization output 'rm' (running statistics) is used"]


def test_fold_batchnorm_refuses_spatial_0():
    proto = conv_bn_model(3, 7, 1, True)
    proto.graph.node[1].attribute.append(helper.make_attribute("spatial", 0))
    proto.opset_import[0].version = 8
    assert why_not(load(proto)) == ["BatchNormalization has spatial=0 (per-element statistics)"]


def test_fold_batchnorm_refuses_non_constant_bn_parameter():
    proto = conv_bn_model(3, 7, 1, True)
    mean = next(i for i in proto.graph.initializer if i.name == "mean")
    proto.graph.initializer.remove(mean)
    proto.graph.input.append(helper.make_tensor_value_info("mean", TensorProto.FLOAT, [7]))
    assert why_not(load(proto)) == [
        "BatchNormalization parameter mean 'mean' (a graph input) is not a constant"
    ]


def test_fold_batchnorm_dequantized_weight_is_the_quantized_rules():
    # In a QDQ graph W comes from DequantizeLinear: FoldBatchNormIntoConv refuses it and
    # FoldBatchNormIntoQuantizedConv folds it into the scales (a per-tensor zero point 3,
    # negated with the codes of the channels whose gamma is negative)
    proto = conv_bn_model(3, 7, 1, True)
    w = next(i for i in proto.graph.initializer if i.name == "w")
    proto.graph.initializer.remove(w)
    wq = np.clip(np.round(numpy_helper.to_array(w) / 0.01), -127, 127).astype(np.int8)
    proto.graph.initializer.extend([_init("wq", wq), _init("ws", np.float32(0.01)), _init("wz", np.int8(3))])
    proto.graph.node.insert(0, helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], name="dq_w"))
    model = load(proto)
    p = FoldBatchNorm()
    result = run_passes(model, [p])
    assert [r.reason for r in p.why_not("FoldBatchNormIntoConv")] == [
        "W 'w' (output of 'dq_w' (DequantizeLinear)) is not a constant"
    ]
    assert result.fired("FoldBatchNormIntoQuantizedConv") == 1
    x = rng_data((2, 3, 9, 5), 1)
    want, got = run_ref(proto, {"x": x})[0], run_ref(model, {"x": x})[0]
    assert np.max(np.abs(got - want)) <= 1e-4 * max(1.0, float(np.max(np.abs(want))))


def test_fold_batchnorm_refuses_non_constant_bias():
    proto = conv_bn_model(3, 7, 1, True)
    b = next(i for i in proto.graph.initializer if i.name == "b")
    proto.graph.initializer.remove(b)
    proto.graph.input.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [7]))
    assert why_not(load(proto)) == ["B 'b' (a graph input) is not a constant"]


def test_fold_batchnorm_refuses_shared_weight():
    # Hazard (onnxscript): a weight shared by two convs must not be folded for one of them.
    proto = conv_bn_model(3, 7, 1, True)
    proto.graph.node.append(helper.make_node("Conv", ["x", "w"], ["c2"], name="conv2", pads=[1, 0, 1, 2]))
    proto.graph.output.append(out_info("c2", 4))
    assert why_not(load(proto)) == ["W 'w' (a constant) is shared with another node ('conv2' (Conv))"]


def test_fold_batchnorm_refuses_conv_output_used_elsewhere():
    proto = conv_bn_model(3, 7, 1, True)
    proto.graph.node.append(helper.make_node("Relu", ["c"], ["r"], name="relu"))
    proto.graph.output.append(out_info("r", 4))
    assert why_not(load(proto)) == [
        "'c' (output of 'conv' (Conv)) is also used by 'relu' (Relu) outside the pattern"
    ]


def test_fold_batchnorm_refuses_conv_output_that_is_a_graph_output():
    proto = conv_bn_model(3, 7, 1, True)
    proto.graph.output.append(out_info("c", 4))
    assert why_not(load(proto)) == ["'c' (output of 'conv' (Conv)) is a graph output"]


def test_fold_batchnorm_reports_a_producer_that_is_not_conv():
    proto = conv_bn_model(3, 7, 1, True)
    proto.graph.node[0].output[0] = "c0"
    proto.graph.node.insert(1, helper.make_node("Relu", ["c0"], ["c"], name="relu"))
    assert why_not(load(proto)) == []  # not a candidate: left out by default
    assert why_not(load(proto), include_pattern=True) == [
        "input 0 of 'bn' (BatchNormalization) 'c' is produced by Relu, expected Conv"
    ]


# Reasons that only an ill-formed graph reaches: built directly in the IR (no checker).


def ir_gemm_bn(w: np.ndarray, c: int) -> Graph:
    g = Graph()
    a = g.add_input("a", TensorType(F32, (3, w.shape[0])))
    wv = g.add_initializer("w", w)
    y0 = Value("c", TensorType(F32, (3, c)))
    g.add_node(Node("Gemm", [a, wv], [y0], name="fc"))
    params = [g.add_initializer(k, v) for k, v in bn_params(c, 1).items()]
    y = Value("y", TensorType(F32, (3, c)))
    g.add_node(Node("BatchNormalization", [y0, *params], [y], name="bn"))
    g.set_outputs([y])
    return g


def test_fold_batchnorm_refuses_integer_weight():
    g = ir_gemm_bn(np.ones((5, 7), np.int32), 7)
    g.inputs[0].type = TensorType(I32, (3, 5))
    assert why_not(g, "FoldBatchNormIntoGemm") == ["W has element type int32, expected a float tensor"]


def test_fold_batchnorm_refuses_channel_count_mismatch():
    g = ir_gemm_bn(np.ones((5, 6), np.float32), 7)
    assert why_not(g, "FoldBatchNormIntoGemm") == [
        "BatchNormalization parameters have {'g': 7, 'beta': 7, 'mean': 7, 'var': 7} elements, "
        "the producer has 6 output channels"
    ]


def test_fold_batchnorm_refuses_gemm_weight_of_rank_3():
    g = ir_gemm_bn(np.ones((5, 7, 1), np.float32), 7)
    assert why_not(g, "FoldBatchNormIntoGemm") == ["Gemm W has rank 3, expected 2"]


def test_fold_batchnorm_refuses_conv_transpose_group_mismatch():
    g = Graph()
    x = g.add_input("x", TensorType(F32, (1, 5, 4, 4)))
    w = g.add_initializer("w", np.ones((5, 2, 3, 3), np.float32))
    c = Value("c", TensorType(F32, None))
    g.add_node(Node("ConvTranspose", [x, w], [c], {"group": 2}, name="deconv"))
    params = [g.add_initializer(k, v) for k, v in bn_params(4, 1).items()]
    y = Value("y", TensorType(F32, None))
    g.add_node(Node("BatchNormalization", [c, *params], [y], name="bn"))
    g.set_outputs([y])
    assert why_not(g, "FoldBatchNormIntoConvTranspose") == [
        "ConvTranspose W has 5 input channels, not a multiple of group 2"
    ]


# -- FoldBatchNormIntoQuantizedConv ----------------------------------------------------


def qconv_bn_model(
    bias: str, *, min_code_in_negative_channel: bool = False, seed: int = 3
) -> onnx.ModelProto:
    """x -Q-DQ-> Conv(DQ(w int8 per channel, zero points 0), bias) -> BN (some gammas
    negative) -> y: what NNCF writes for an export that kept its BatchNormalization.
    3 -> 7 channels, 3x3, distinct scales."""
    rng = np.random.default_rng(seed)
    p = bn_params(7, seed)
    wq = rng.integers(-127, 128, (7, 3, 3, 3)).astype(np.int8)
    if min_code_in_negative_channel:
        wq[int(np.flatnonzero(p["g"] < 0)[0]), 0, 0, 0] = -128
    sw = np.linspace(0.004, 0.013, 7).astype(np.float32)
    inits = [_init(k, v) for k, v in p.items()] + [
        _init("sx", np.float32(0.021)),
        _init("zx", np.uint8(131)),
        _init("wq", wq),
        _init("sw", sw),
        _init("zw", np.zeros(7, np.int8)),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xf"]),
        helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wf"], axis=0),
    ]
    conv_in = ["xf", "wf"]
    if bias == "float":
        inits.append(_init("B", np.linspace(-0.4, 0.3, 7).astype(np.float32)))
        conv_in.append("B")
    elif bias == "int32":
        inits += [
            _init("bq", np.arange(-3, 4, dtype=np.int32) * 37),
            _init("sb", np.multiply(np.float32(0.021), sw, dtype=np.float32)),
        ]
        nodes.append(helper.make_node("DequantizeLinear", ["bq", "sb"], ["B"], axis=0))
        conv_in.append("B")
    nodes += [helper.make_node("Conv", conv_in, ["c"], name="conv", pads=[1, 1, 1, 1]), bn_node()]
    return make_model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 9, 5])],
        [out_info("y", 4)],
        inits,
    )


@pytest.mark.parametrize("bias", ["none", "float", "int32"])
def test_fold_batchnorm_into_quantized_conv(bias):
    proto = qconv_bn_model(bias)
    assert np.any(numpy_helper.to_array(proto.graph.initializer[0]) < 0)  # some gamma < 0: codes negated
    model = load(proto)
    result = run_passes(model, [FoldBatchNorm()])
    assert result.fired("FoldBatchNormIntoQuantizedConv") == 1
    ops = model.graph.op_counts()
    assert "BatchNormalization" not in ops and ops["Conv"] == 1
    verify(model.graph, Stage.QDQ)
    x = rng_data((2, 3, 9, 5), 5)
    want, got = run_ref(proto, {"x": x})[0], run_ref(model, {"x": x})[0]
    # the folded weights (wq'·sw'[m]) equal W·a to 2^-24 relative: FoldBatchNormIntoConv's bound,
    # with |W·a| summed over the 27 taps of each output and the BN's own rounding
    p = {k: numpy_helper.to_array(t) for k, t in ((t.name, t) for t in proto.graph.initializer)}
    a = p["g"].astype(np.float64) / np.sqrt(p["var"].astype(np.float64) + np.float32(1e-3))
    w = p["wq"].astype(np.float64) * p["sw"].astype(np.float64).reshape(-1, 1, 1, 1)
    xq = (np.clip(np.rint(x / np.float32(0.021)) + 131, 0, 255) - 131) * 0.021
    mag = np.max(np.abs(xq)) * np.abs(w).sum(axis=(1, 2, 3)) * np.abs(a) + np.abs(p["beta"]) + 2
    assert np.all(np.abs(got - want) <= dot_tolerance(27, mag).reshape(1, -1, 1, 1) * 4)


@pytest.mark.parametrize("bias", ["none", "float", "int32"])
def test_fold_batchnorm_into_quantized_conv_marks_its_bias_as_a_float_offset(bias):
    # the file adds the offset in float after a float Conv: the lowering keeps it float
    # (FOLDED_OFFSET), a bias the file gives the Conv itself is not marked
    model = load(qconv_bn_model(bias))
    run_passes(model, [FoldBatchNorm()])
    conv = model.graph.find_nodes("Conv")[0]
    assert conv.input(2) is not None and conv.input(2).doc == FOLDED_OFFSET
    plain = load(qconv_bn_model(bias))
    plain_conv = plain.graph.find_nodes("Conv")[0]
    assert plain_conv.input(2) is None or plain_conv.input(2).doc != FOLDED_OFFSET


def test_fold_batchnorm_into_quantized_conv_refuses_min_code_in_a_negated_channel():
    model = load(qconv_bn_model("none", min_code_in_negative_channel=True))
    p = FoldBatchNorm()
    result = run_passes(model, [p])
    assert result.fired("FoldBatchNormIntoQuantizedConv") == 0
    assert [r.reason for r in p.why_not("FoldBatchNormIntoQuantizedConv")] == [
        "a channel with a negative BatchNormalization factor holds the code -128"
    ]
    assert model.graph.op_counts()["BatchNormalization"] == 1


def _in_half_precision(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every float32 tensor float16: what NVIDIA ModelOpt's int8 mode
    writes (``high_precision_dtype="fp16"``): Q/DQ scales, BatchNormalization and the
    graph's inputs and outputs in half precision."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for i, t in enumerate(out.graph.initializer):
        if t.data_type == TensorProto.FLOAT:
            out.graph.initializer[i].CopyFrom(
                numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name)
            )
    for vi in list(out.graph.input) + list(out.graph.output):
        vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    return out


def test_fold_batchnorm_into_quantized_conv_leaves_a_half_precision_conv():
    # folding would write float32 scales and offsets into a float16 Conv (a type the
    # lowering then refused); the group stays as written, and the model runs as ORT does
    proto = _in_half_precision(qconv_bn_model("float"))
    model = load(proto)
    p = FoldBatchNorm()
    assert run_passes(model, [p]).fired("FoldBatchNormIntoQuantizedConv") == 0
    assert [r.reason for r in p.why_not("FoldBatchNormIntoQuantizedConv")] == [
        "the convolution is not float32"
    ]
    import onnxruntime as ort

    import quanta

    x = rng_data((2, 3, 9, 5), 5).astype(np.float16)
    got = quanta.InferenceSession(proto.SerializeToString()).run(None, {"x": x})[0]
    ref = quanta.InferenceSession(proto.SerializeToString(), backend="reference").run(None, {"x": x})[0]
    assert got.dtype == np.float16 and got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)
    # ONNX Runtime computes the float16 Conv -> BatchNormalization chain in float32 (its
    # cast insertion for kernels it has no float16 form of), without the Conv output's
    # rounding to float16 that the file states: the BN's factors amplify that rounding
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    span = float(np.max(np.abs(want.astype(np.float32))))
    assert np.max(np.abs(got.astype(np.float32) - want.astype(np.float32))) <= 0.02 * span
