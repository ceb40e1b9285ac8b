"""LowerConvFloatOutput: a convolution with dequantized inputs and a float output runs
as ConvInteger + int32 bias + one float32 scaling (the four parts of docs/passes.md)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.ir.verify import Stage, verify
from quanta.passes.lower.conv_float_output import LowerConvFloatOutput
from quanta.session import InferenceSession
from tests.passes.helpers import dot_tolerance, run_ref
from tests.passes.lower.test_qdq_to_qlinear import lower


def float_out_conv(*, bias="int32", group=1, cin=3, cout=7, x_zp=131, w_axis=0, quantized_out=False):
    """x -Q-DQ-> Conv(w: DQ per channel, distinct scales) -> y (float), odd 9x5 plane."""
    rng = np.random.default_rng(4)
    sw = np.linspace(0.004, 0.013, cout).astype(np.float32)
    sx = np.float32(0.021)
    inits = [
        numpy_helper.from_array(sx, "sx"),
        numpy_helper.from_array(np.array(x_zp, np.uint8), "zx"),
        numpy_helper.from_array(rng.integers(-127, 128, (cout, cin // group, 3, 3)).astype(np.int8), "w"),
        numpy_helper.from_array(sw, "sw"),
        numpy_helper.from_array(np.zeros(cout, np.int8), "zw"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="qx"),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xf"], name="dqx"),
        helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"], name="dqw", axis=w_axis),
    ]
    conv_in = ["xf", "wf"]
    if bias == "int32":
        inits += [
            numpy_helper.from_array((np.arange(cout, dtype=np.int32) - cout // 2) * 97, "bq"),
            numpy_helper.from_array((sx * sw).astype(np.float32), "sb"),
        ]
        nodes.append(helper.make_node("DequantizeLinear", ["bq", "sb"], ["bf"], name="dqb", axis=0))
        conv_in.append("bf")
    elif bias == "float":
        inits.append(numpy_helper.from_array(np.linspace(-0.1, 0.1, cout).astype(np.float32), "bf"))
        conv_in.append("bf")
    elif bias == "wrong_shape":  # broadcast by onnx.reference, not a valid Conv bias for the rule
        inits.append(numpy_helper.from_array(np.array([0.25], np.float32), "bf"))
        conv_in.append("bf")
    nodes.append(helper.make_node("Conv", conv_in, ["y"], name="head", pads=[1, 1, 1, 1], group=group))
    out = "y"
    if quantized_out:
        inits += [
            numpy_helper.from_array(np.float32(0.05), "sy"),
            numpy_helper.from_array(np.uint8(128), "zy"),
        ]
        nodes += [
            helper.make_node("QuantizeLinear", ["y", "sy", "zy"], ["yq"], name="qy"),
            helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["yo"], name="dqy"),
        ]
        out = "yo"
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, cin, 9, 5])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [2, cout, 9, 5])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize(
    ("bias", "group", "cin", "cout"),
    [("int32", 1, 3, 7), (None, 1, 17, 5), ("int32", 17, 17, 17), ("float", 1, 7, 3)],
)
def test_float_output_conv_becomes_conv_integer(bias, group, cin, cout):
    proto = float_out_conv(bias=bias, group=group, cin=cin, cout=cout)
    model = load(proto)
    assert lower(model, [LowerConvFloatOutput()]).fired("LowerConvFloatOutput") == 1
    # the output stage is one quanta::AccumulatorToFloat: the int32 bias as its second
    # input, a float one as its fourth
    assert model.graph.op_counts() == {"QuantizeLinear": 1, "ConvInteger": 1, "quanta::AccumulatorToFloat": 1}
    stage = model.graph.find_nodes("AccumulatorToFloat")[0]
    assert stage.domain == "quanta"
    assert [v is not None for v in stage.inputs] == {
        "int32": [True, True, True],
        None: [True, False, True],
        "float": [True, False, True, True],
    }[bias]
    verify(model.graph, Stage.LOWERED)
    assert model.graph.find_nodes("ConvInteger")[0].name == "head"  # coverage finds it by name
    x = np.random.default_rng(5).normal(0.3, 1.2, (2, cin, 9, 5)).astype(np.float32)
    expected, got = run_ref(proto, {"x": x})[0], run_ref(model, {"x": x})[0]
    # the float group sums k = cin/group·9 dequantized products in float32; the integer
    # form sums them exactly and rounds twice (Cast, Mul): both within γ of the exact sum
    # (a float bias adds one more rounding, inside the +1.0 of the bound's magnitude)
    k = cin // group * 9
    bound = dot_tolerance(k, np.abs(expected) + 1.0) + 2 * np.abs(expected) * 2.0**-24
    assert np.all(np.abs(got - expected) <= bound)
    native = InferenceSession(onnx.load_from_string(_proto_bytes(model))).run(None, {"x": x})[0]
    assert np.array_equal(native, got)


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("with_float_bias", [True, False])
def test_accumulator_to_float_is_the_four_node_chain_bit_for_bit(with_bias, with_float_bias):
    # the twin of quanta::AccumulatorToFloat against the ai.onnx twins it replaces
    # (Add int32, Cast, Mul, Add float), on sums that wrap and round (|acc| > 2^24), and
    # the native kernel against both, every ISA, 1 and 2 threads
    from quanta.kernels import _native
    from quanta.kernels.reference.registry import get_op
    from quanta.targets.base import KernelContext
    from quanta.targets.native import BINDERS, _load_families

    rng = np.random.default_rng(9)
    acc = rng.integers(-(2**31), 2**31 - 1, (2, 7, 5, 3), dtype=np.int64).astype(np.int32)
    bias = rng.integers(-(2**30), 2**30, (1, 7, 1, 1)).astype(np.int32) if with_bias else None
    scale = np.linspace(1e-4, 3e-3, 7, dtype=np.float32).reshape(1, 7, 1, 1)
    fb = np.linspace(-0.5, 0.5, 7, dtype=np.float32).reshape(1, 7, 1, 1) if with_float_bias else None
    ctx = KernelContext()
    chain = acc if bias is None else get_op("Add")(ctx, acc, bias)
    chain = get_op("Mul")(ctx, get_op("Cast")(ctx, chain, to=TensorProto.FLOAT), scale)
    if fb is not None:
        chain = get_op("Add")(ctx, chain, fb)
    twin = get_op("AccumulatorToFloat", "quanta")(ctx, acc, bias, scale, fb)
    assert twin.dtype == np.float32 and twin.tobytes() == chain.tobytes()
    _load_families()
    from quanta.ir.graph import Node, Value

    node = Node(
        "AccumulatorToFloat",
        [Value("a"), Value("b"), Value("s"), Value("f")],
        [Value("y")],
        {},
        domain="quanta",
    )
    kernel, reason = BINDERS[("quanta", "AccumulatorToFloat")](None, node)
    assert kernel is not None, reason
    try:
        for isa in _native.supported_isas():
            _native.set_isa(isa)
            for threads in (1, 2):
                got = kernel.fn(KernelContext(num_threads=threads), acc, bias, scale, fb)
                assert got.tobytes() == chain.tobytes(), (isa, threads)
    finally:
        _native.clear_isa()


def _proto_bytes(model) -> bytes:
    from quanta.ir.onnx_io import to_proto

    return to_proto(model).SerializeToString()


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        (dict(quantized_out=True), "the output is quantized (LowerConv handles it)"),
        (
            dict(bias="wrong_shape"),
            "float bias 'bf' (a constant) of shape (1,) is not one per output channel",
        ),
        (dict(w_axis=1, cout=3), "weight w is quantized along axis 1; ConvInteger takes axis 0"),
    ],
)
def test_no_match_reasons_leave_the_graph_unchanged(kwargs, reason):
    model = load(float_out_conv(**kwargs))
    before = model.graph.op_counts()
    result = lower(model, [LowerConvFloatOutput()])
    assert result.fired("LowerConvFloatOutput") == 0
    assert [r.reason for r in result.why_not("LowerConvFloatOutput")] == [reason]
    assert "Conv" in model.graph.op_counts() and model.graph.op_counts().keys() <= before.keys()
