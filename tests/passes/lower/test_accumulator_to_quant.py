"""FuseAccumulatorToQuant: ConvInteger's float output stage, a float gate and a per-tensor
QuantizeLinear become one quanta::AccumulatorToQuant (the four parts of docs/passes.md),
bit for bit the chain it replaces; and the native kernel against the twin on every ISA.

The graphs are those of the two real cases: Paddle's written-out hardswish after a
convolution that quantization keeps as a float island (PP-OCR), the other gates the float
Conv fuses, and a BatchNormalization folded into a quantized convolution (NNCF), whose
offset is added in float before the QuantizeLinear."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load, to_proto
from quanta.ir.verify import Stage, verify
from quanta.passes.lower.accumulator_to_quant import FuseAccumulatorToQuant
from quanta.passes.lower.conv_float_output import LowerConvFloatOutput
from quanta.passes.rules.eliminate_dead import EliminateDead
from quanta.session import InferenceSession
from tests.passes.helpers import run_passes, run_ref
from tests.passes.lower.test_folded_offset_lowering import nncf_conv_bn
from tests.passes.lower.test_qdq_to_qlinear import lower

CIN, COUT, H, W = 7, 17, 9, 5
RULES = {
    "ClipMulDiv": "AccumulatorToQuantClipMulDiv",
    "ClipMulDivSwapped": "AccumulatorToQuantClipMulDivSwapped",
    "SiLU": "AccumulatorToQuantSilu",
    "SiLUSwapped": "AccumulatorToQuantSiluSwapped",
    "HardSwish": "AccumulatorToQuantHardSwish",
    "HardSigmoid": "AccumulatorToQuantHardSigmoid",
}


def gated_conv(
    gate: str, *, signed: bool = False, zy: int = 37, per_channel_y: bool = False
) -> onnx.ModelProto:
    """x -Q-DQ-> Conv(DQ(w) per channel, float bias) -> gate (float) -Q-DQ-> y; odd 9x5 plane,
    17 output channels with distinct scales, a non-zero output zero point."""
    rng = np.random.default_rng(21)
    sw = np.linspace(0.003, 0.011, COUT).astype(np.float32)
    inits = [
        numpy_helper.from_array(np.float32(0.023), "sx"),
        numpy_helper.from_array(np.array(119, np.uint8), "zx"),
        numpy_helper.from_array(rng.integers(-127, 128, (COUT, CIN, 3, 3)).astype(np.int8), "w"),
        numpy_helper.from_array(sw, "sw"),
        numpy_helper.from_array(np.zeros(COUT, np.int8), "zw"),
        numpy_helper.from_array(np.linspace(-0.4, 0.3, COUT).astype(np.float32), "b"),
        numpy_helper.from_array(
            np.linspace(0.02, 0.05, COUT).astype(np.float32) if per_channel_y else np.float32(0.031), "sy"
        ),
        numpy_helper.from_array(
            np.full(COUT, zy, np.int8 if signed else np.uint8)
            if per_channel_y
            else np.array(zy, np.int8 if signed else np.uint8),
            "zy",
        ),
        numpy_helper.from_array(np.float32(3.0), "three"),
        numpy_helper.from_array(np.float32(0.0), "lo"),
        numpy_helper.from_array(np.float32(6.0), "hi"),
        numpy_helper.from_array(np.float32(6.0), "six"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xf"]),
        helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"], axis=0),
        helper.make_node("Conv", ["xf", "wf", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
    ]
    if gate in ("ClipMulDiv", "ClipMulDivSwapped"):
        nodes += [
            helper.make_node("Add", ["c", "three"], ["a"]),
            helper.make_node("Clip", ["a", "lo", "hi"], ["k"]),
            helper.make_node("Mul", ["c", "k"] if gate == "ClipMulDiv" else ["k", "c"], ["m"]),
            helper.make_node("Div", ["m", "six"], ["g"]),
        ]
    elif gate in ("SiLU", "SiLUSwapped"):
        nodes += [
            helper.make_node("Sigmoid", ["c"], ["s"]),
            helper.make_node("Mul", ["c", "s"] if gate == "SiLU" else ["s", "c"], ["g"]),
        ]
    elif gate == "HardSwish":
        nodes.append(helper.make_node("HardSwish", ["c"], ["g"]))
    elif gate == "HardSigmoid":
        nodes.append(helper.make_node("HardSigmoid", ["c"], ["g"], alpha=0.15, beta=0.45))
    nodes += [
        helper.make_node(
            "QuantizeLinear", ["g", "sy", "zy"], ["yq"], **({"axis": 1} if per_channel_y else {})
        ),
        helper.make_node(
            "DequantizeLinear", ["yq", "sy", "zy"], ["y"], **({"axis": 1} if per_channel_y else {})
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, CIN, H, W])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, COUT, H, W])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _feeds(seed: int = 3) -> dict[str, np.ndarray]:
    # wide enough that the gates' clamps and the output's saturation are both reached
    return {"x": np.random.default_rng(seed).normal(0.2, 1.6, (2, CIN, H, W)).astype(np.float32)}


def _unfused_and_fused(proto: onnx.ModelProto):
    """The lowered graph with its float output stage as nodes, and a copy fused."""
    unfused = load(proto)
    assert lower(unfused, [LowerConvFloatOutput()]).fired("LowerConvFloatOutput") == 1
    fused = load(to_proto(unfused))
    result = run_passes(fused, [FuseAccumulatorToQuant(), EliminateDead()], stage=Stage.LOWERED)
    return unfused, fused, result


@pytest.mark.parametrize("gate", list(RULES))
@pytest.mark.parametrize("signed", [False, True])
def test_gate_and_quantize_after_conv_integer_become_one_node(gate, signed):
    unfused, fused, result = _unfused_and_fused(gated_conv(gate, signed=signed, zy=-9 if signed else 37))
    assert result.fired(RULES[gate]) == 1
    counts = fused.graph.op_counts()
    assert counts.get("quanta::AccumulatorToQuant") == 1 and "quanta::AccumulatorToFloat" not in counts
    assert counts.get("QuantizeLinear") == 1  # x's, the output's is inside the node
    for op in ("Add", "Clip", "Mul", "Div", "Sigmoid", "HardSwish", "HardSigmoid"):
        assert op not in counts
    node = fused.graph.find_nodes("AccumulatorToQuant")[0]
    assert node.attrs["activation"] == gate.removesuffix("Swapped")
    verify(fused.graph, Stage.LOWERED)
    feeds = _feeds()
    expected = run_ref(unfused, feeds)[0]
    got = run_ref(fused, feeds)[0]
    assert got.tobytes() == expected.tobytes()  # exact: the same operations in order
    native = InferenceSession(to_proto(fused).SerializeToString()).run(None, feeds)[0]
    assert native.tobytes() == expected.tobytes()


def test_folded_batchnorm_offset_group_is_one_node_and_unchanged():
    # NNCF's Conv -> BatchNormalization -> Relu -> Q: the default lowering gives
    # ConvInteger + AccumulatorToQuant, with the same bytes as the three-node stage
    from quanta.passes.lower import accumulator_to_quant as mod

    proto = nncf_conv_bn()
    x = np.random.default_rng(8).normal(0.0, 2.0, (1, 3, 17, 19)).astype(np.float32)
    fused = InferenceSession(proto.SerializeToString())
    ops = [s.node.op_type for s in fused.plan.steps]
    assert "AccumulatorToQuant" in ops and "AccumulatorToFloat" not in ops, ops
    rules = mod.FuseAccumulatorToQuant.rules
    mod.FuseAccumulatorToQuant.rules = ()
    try:
        unfused = InferenceSession(proto.SerializeToString())
    finally:
        mod.FuseAccumulatorToQuant.rules = rules
    assert "AccumulatorToFloat" in [s.node.op_type for s in unfused.plan.steps]
    assert fused.run(None, {"x": x})[0].tobytes() == unfused.run(None, {"x": x})[0].tobytes()


@pytest.mark.parametrize(
    ("kwargs", "rule", "reason"),
    [
        (
            dict(gate="ClipMulDiv", per_channel_y=True),
            "AccumulatorToQuantClipMulDiv",
            "y_scale 'sy' (a constant) is not one float32 value",
        ),
        (
            dict(gate="HardSwish", per_channel_y=True),
            "AccumulatorToQuantHardSwish",
            "y_scale 'sy' (a constant) is not one float32 value",
        ),
    ],
)
def test_no_match_reasons_leave_the_graph_unchanged(kwargs, rule, reason):
    unfused, fused, result = _unfused_and_fused(gated_conv(**kwargs))
    assert result.fired(rule) == 0
    assert reason in [r.reason for r in result.why_not(rule)]
    assert fused.graph.op_counts() == unfused.graph.op_counts()


def test_quantize_with_a_division_precision_is_not_fused():
    # QuantizeLinear's precision (opset 28) sets the type the division runs in; the
    # kernel divides in float32
    proto = gated_conv("HardSwish")
    proto.opset_import[0].version = 28
    q = next(n for n in proto.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "g")
    q.attribute.append(helper.make_attribute("precision", TensorProto.DOUBLE))
    unfused, fused, result = _unfused_and_fused(proto)
    assert result.fired("AccumulatorToQuantHardSwish") == 0
    assert any("sets precision" in r.reason for r in result.why_not("AccumulatorToQuantHardSwish"))
    assert fused.graph.op_counts() == unfused.graph.op_counts()


def test_stage_read_elsewhere_is_not_fused():
    # the float stage's output is also a graph output: it must stay
    proto = gated_conv("HardSwish")
    proto.graph.output.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, COUT, H, W]))
    unfused, fused, result = _unfused_and_fused(proto)
    assert result.fired("AccumulatorToQuantHardSwish") == 0
    assert fused.graph.op_counts() == unfused.graph.op_counts()


KINDS = {"": [], "SiLU": [], "HardSwish": [], "HardSigmoid": [0.15, 0.45], "ClipMulDiv": [3.0, 0.0, 6.0, 6.0]}


@pytest.mark.parametrize("activation", list(KINDS))
@pytest.mark.parametrize("shape", [(2, 7, 5, 3), (1, 3, 4500), (1, 17, 1, 1), (3, 1, 8209)])
@pytest.mark.parametrize("signed", [False, True])
def test_native_acc_to_quant_matches_the_twin_every_isa(activation, shape, signed):
    # sums that wrap with the int32 bias, |acc| > 2^24 (the Cast rounds), rows longer than
    # the kernel's 4096-float piece, saturation at both ends, a non-zero zero point
    from quanta.ir.graph import Node, Value
    from quanta.kernels import _native
    from quanta.kernels.reference.registry import get_op
    from quanta.targets.base import KernelContext
    from quanta.targets.native import BINDERS, _load_families

    rng = np.random.default_rng(len(shape) * 7 + shape[-1])
    m = shape[1]
    acc = rng.integers(-(2**27), 2**27, shape, dtype=np.int64).astype(np.int32)
    acc.reshape(-1)[:5] = [2**31 - 1, -(2**31), 0, 1, -1]
    bshape = (1, m) + (1,) * (len(shape) - 2)
    bias = rng.integers(-(2**30), 2**30, bshape).astype(np.int32)
    scale = np.linspace(1e-8, 6e-8, m, dtype=np.float32).reshape(bshape)  # most codes inside the range
    fb = np.linspace(-1.5, 2.5, m, dtype=np.float32).reshape(bshape)
    ys = np.float32(0.043)
    zy = np.array(-11 if signed else 201, np.int8 if signed else np.uint8)
    attrs = {"activation": activation, "activation_params": KINDS[activation]} if activation else {}
    ctx = KernelContext()
    twin = get_op("AccumulatorToQuant", "quanta")(ctx, acc, bias, scale, fb, ys, zy, **attrs)
    assert twin.dtype == zy.dtype
    _load_families()
    node = Node(
        "AccumulatorToQuant",
        [Value(n) for n in "absfqz"],
        [Value("y")],
        dict(attrs),
        domain="quanta",
    )
    kernel, reason = BINDERS[("quanta", "AccumulatorToQuant")](None, node)
    assert kernel is not None, reason
    try:
        for isa in _native.supported_isas():
            _native.set_isa(isa)
            for threads in (1, 2):
                got = kernel.fn(KernelContext(num_threads=threads), acc, bias, scale, fb, ys, zy, **attrs)
                assert got.dtype == twin.dtype and got.tobytes() == twin.tobytes(), (isa, threads)
    finally:
        _native.clear_isa()
