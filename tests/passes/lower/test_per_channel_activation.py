"""LowerConvPerChannelDepthwise (passes/lower/per_channel_activation.py): a convolution
feeding a depthwise convolution through a per-channel quantized activation (NNCF's
placement) becomes two QLinearConv with the per-channel scales folded into the weight
scales.

Numerics: the lowered pair computes eq. (6) with each channel's own scales, exactly: the
test models that integer pipeline in NumPy (exact int64 accumulation, multipliers
``f32(f32(sx·sw1[m]) / sv[m])`` and ``f32(f32(sv[c]·sw[c]) / sy)``, round half to
even, saturation) and asserts equality of every output code; against the float QDQ
graph the intermediate codes move by at most one step, so the output moves by at most
one step of y plus what one step of v moves through the depthwise kernel.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.passes.lower.per_channel_activation import LowerConvPerChannelDepthwise, product_operand
from quanta.passes.lower.qdq_to_qlinear import LowerConv
from tests.passes.helpers import run_ref
from tests.passes.lower.test_qdq_to_qlinear import lower

C_IN, C, H, W = 3, 7, 9, 5
SX, ZX = np.float32(0.021), 131
SV = np.linspace(0.011, 0.047, C).astype(np.float32)
SY, ZY = np.float32(0.063), 119


def proto(*, zv=(5,) * C, storage=TensorProto.UINT8, group=C, bias="float", extra_use=False):
    """x -Q-DQ-> Conv 3x3 (3 -> 7, per-channel w, int32 bias) -Q/DQ per channel (axis 1)->
    depthwise 3x3 (7 groups, per-channel w, bias) -Q-DQ-> y; distinct scales everywhere."""
    rng = np.random.default_rng(7)
    npt = helper.tensor_dtype_to_np_dtype(storage)
    sw1 = np.linspace(0.003, 0.009, C).astype(np.float32)
    sw = np.linspace(0.02, 0.05, C).astype(np.float32)
    w_dw = rng.integers(-127, 128, (C, C // group, 3, 3)).astype(np.int8)
    inits = [
        numpy_helper.from_array(SX, "sx"),
        numpy_helper.from_array(np.array(ZX, np.uint8), "zx"),
        numpy_helper.from_array(rng.integers(-127, 128, (C, C_IN, 3, 3)).astype(np.int8), "w1"),
        numpy_helper.from_array(sw1, "sw1"),
        numpy_helper.from_array(np.zeros(C, np.int8), "zw1"),
        numpy_helper.from_array(np.arange(-3, 4, dtype=np.int32) * 40, "b1q"),
        numpy_helper.from_array(np.multiply(SX, sw1, dtype=np.float32), "sb1"),
        numpy_helper.from_array(SV, "sv"),
        numpy_helper.from_array(np.array(zv, dtype=npt), "zv"),
        numpy_helper.from_array(w_dw, "w"),
        numpy_helper.from_array(sw, "sw"),
        numpy_helper.from_array(np.zeros(C, np.int8), "zw"),
        numpy_helper.from_array(SY, "sy"),
        numpy_helper.from_array(np.array(ZY, np.uint8), "zy"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="qx"),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xf"], name="dqx"),
        helper.make_node("DequantizeLinear", ["w1", "sw1", "zw1"], ["w1f"], name="dqw1", axis=0),
        helper.make_node("DequantizeLinear", ["b1q", "sb1"], ["b1f"], name="dqb1", axis=0),
        helper.make_node("Conv", ["xf", "w1f", "b1f"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c1", "sv", "zv"], ["v"], name="qv", axis=1),
        helper.make_node("DequantizeLinear", ["v", "sv", "zv"], ["vf"], name="dqv", axis=1),
        helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"], name="dqw", axis=0),
    ]
    conv_in = ["vf", "wf"]
    if bias == "float":
        inits.append(numpy_helper.from_array(np.linspace(-0.3, 0.4, C).astype(np.float32), "b"))
        conv_in.append("b")
    nodes += [
        helper.make_node("Conv", conv_in, ["c"], name="dw", pads=[1, 1, 1, 1], group=group),
        helper.make_node("QuantizeLinear", ["c", "sy", "zy"], ["yq"], name="qy"),
        helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"], name="dqy"),
    ]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, H, W])]
    if extra_use:
        outs.append(helper.make_tensor_value_info("v", storage, [1, C, H, W]))
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C_IN, H, W])], outs, inits
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def _conv_acc(x: np.ndarray, w: np.ndarray, zx: int, group: int) -> np.ndarray:
    """Exact int64 Σ (x - zx)·w over 3x3 windows with pads 1 (padding reads zx)."""
    n, cin, h, wd = x.shape
    xp = np.full((n, cin, h + 2, wd + 2), zx, np.int64)
    xp[:, :, 1:-1, 1:-1] = x
    xp -= zx
    m = w.shape[0]
    per = cin // group
    out = np.zeros((n, m, h, wd), np.int64)
    for o in range(m):
        g = o // (m // group)
        for c in range(per):
            for i in range(3):
                for j in range(3):
                    out[:, o] += xp[:, g * per + c, i : i + h, j : j + wd] * int(w[o, c, i, j])
    return out


def _requant(acc: np.ndarray, mult: np.ndarray, zy: int, lo: int, hi: int) -> np.ndarray:
    scaled = np.multiply(acc.astype(np.float32), mult.reshape(1, -1, 1, 1), dtype=np.float32)
    return np.clip(np.rint(scaled.astype(np.float64)) + zy, lo, hi).astype(np.int64)


def test_product_operand_hits_the_target_product():
    rng = np.random.default_rng(0)
    sx = np.float32(0.0188574)
    target = (rng.uniform(0.5, 2.0, 1000) * 10.0 ** rng.uniform(-4, 0, 1000)).astype(np.float32)
    t = product_operand(sx, target)
    prods = np.multiply(sx, t, dtype=np.float32)
    # every target is reached exactly or, where no float32 t gives it, to within one ulp
    assert np.all(np.abs(prods.astype(np.float64) - target) <= np.spacing(target).astype(np.float64))
    assert np.mean(prods == target) > 0.5


def test_lowers_the_pair_to_two_integer_convs_bit_exact_with_per_channel_requantization():
    p = proto(zv=(5,) * C)
    model = load(p)
    result = lower(model, [LowerConv(), LowerConvPerChannelDepthwise()])
    assert result.fired("LowerConvPerChannelDepthwise") == 1
    assert result.fired("LowerConv") == 0
    assert model.graph.op_counts() == {"QuantizeLinear": 1, "QLinearConv": 2, "DequantizeLinear": 1}

    x = (np.random.default_rng(3).standard_normal((1, C_IN, H, W)) * 2.5).astype(np.float32)
    got = run_ref(model, {"x": x})[0]

    # the integer pipeline with each channel's own scales, in NumPy
    ini = {t.name: numpy_helper.to_array(t) for t in p.graph.initializer}
    xq = np.clip(np.rint(x / SX) + ZX, 0, 255).astype(np.int64)
    acc1 = _conv_acc(xq, ini["w1"], ZX, 1) + ini["b1q"].reshape(1, -1, 1, 1)
    m1 = np.divide(np.multiply(SX, ini["sw1"], dtype=np.float32), SV, dtype=np.float32)
    v = _requant(acc1, m1, 5, 0, 255)
    sdw = np.multiply(SV, ini["sw"], dtype=np.float32)
    bq = np.rint(np.divide(ini["b"], sdw, dtype=np.float32).astype(np.float64)).astype(np.int64)
    acc = _conv_acc(v, ini["w"], 5, C) + bq.reshape(1, -1, 1, 1)
    m2 = np.divide(sdw, SY, dtype=np.float32)
    y = _requant(acc, m2, ZY, 0, 255)
    np.testing.assert_array_equal(got, ((y - ZY) * np.float32(SY)).astype(np.float32))

    # against the float QDQ graph: one step of y plus one step of v through the depthwise weights
    want = run_ref(p, {"x": x})[0]
    bound = SY + np.max(np.abs(ini["w"].astype(np.float64)).sum(axis=(1, 2, 3)) * SV * ini["sw"])
    assert np.max(np.abs(got - want)) <= bound * 1.0001


def test_native_target_agrees_with_the_reference_on_the_lowered_pair():
    import quanta

    p = proto(zv=(250,) * C, storage=TensorProto.UINT8)
    x = (np.random.default_rng(5).standard_normal((1, C_IN, H, W)) * 3).astype(np.float32)
    ref = quanta.InferenceSession(p.SerializeToString(), backend="reference")
    nat = quanta.InferenceSession(p.SerializeToString())
    assert not any("QLinearConv" not in r for r in [s.op_type for s in nat.plan.steps if "Conv" in s.op_type])
    np.testing.assert_array_equal(ref.run(None, {"x": x})[0], nat.run(None, {"x": x})[0])


def test_int8_activation_between():
    model = load(proto(zv=(-3,) * C, storage=TensorProto.INT8))
    assert lower(model, [LowerConvPerChannelDepthwise()]).fired("LowerConvPerChannelDepthwise") == 1


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        (
            dict(zv=(5, 5, 5, 6, 5, 5, 5)),
            "the per-channel activation has zero points that differ between channels",
        ),
        (dict(group=1), "the consumer is not a depthwise convolution over the 7 channels"),
    ],
)
def test_no_match_reasons(kwargs, reason):
    model = load(proto(**kwargs))
    result = lower(model, [LowerConvPerChannelDepthwise()])
    assert result.fired("LowerConvPerChannelDepthwise") == 0
    assert [r.reason for r in result.why_not("LowerConvPerChannelDepthwise")] == [reason]
    assert model.graph.op_counts()["Conv"] == 2


def test_refused_when_the_activation_has_other_users():
    model = load(proto(extra_use=True))
    result = lower(model, [LowerConvPerChannelDepthwise()])
    assert result.fired("LowerConvPerChannelDepthwise") == 0
    assert model.graph.op_counts()["Conv"] == 2


def dw_float_output_proto(zx=(4,) * C):
    """x -Q/DQ per channel (axis 1)-> depthwise 3x3 (float bias) -> y float (NNCF: a
    HardSwish after the convolution, quantized after it)."""
    rng = np.random.default_rng(9)
    inits = [
        numpy_helper.from_array(SV, "sx"),
        numpy_helper.from_array(np.array(zx, np.uint8), "zx"),
        numpy_helper.from_array(rng.integers(-127, 128, (C, 1, 3, 3)).astype(np.int8), "w"),
        numpy_helper.from_array(np.linspace(0.02, 0.05, C).astype(np.float32), "sw"),
        numpy_helper.from_array(np.zeros(C, np.int8), "zw"),
        numpy_helper.from_array(np.linspace(-0.3, 0.4, C).astype(np.float32), "b"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], axis=1),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xf"], axis=1),
        helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"], axis=0),
        helper.make_node("Conv", ["xf", "wf", "b"], ["y"], name="dw", pads=[1, 1, 1, 1], group=C),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, H, W])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, H, W])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def test_depthwise_conv_with_a_per_channel_x_and_a_float_output():
    from quanta.passes.lower.conv_float_output import LowerConvFloatOutput
    from tests.passes.helpers import dot_tolerance

    p = dw_float_output_proto()
    model = load(p)
    assert lower(model, [LowerConvFloatOutput()]).fired("LowerConvFloatOutput") == 1
    assert model.graph.op_counts() == {"QuantizeLinear": 1, "ConvInteger": 1, "quanta::AccumulatorToFloat": 1}
    x = (np.random.default_rng(2).standard_normal((1, C, H, W)) * 2).astype(np.float32)
    want, got = run_ref(p, {"x": x})[0], run_ref(model, {"x": x})[0]
    # the exact integer sum scaled once by f32(sx[c]·sw[c]): float32 rounding of a 9-term sum
    ini = {t.name: numpy_helper.to_array(t) for t in p.graph.initializer}
    xq = np.clip(np.rint(x / SV.reshape(1, -1, 1, 1)) + 4, 0, 255) - 4
    mag = (np.abs(xq).max(axis=(2, 3)) * SV * np.abs(ini["w"]).sum(axis=(1, 2, 3)) * ini["sw"]).reshape(
        1, -1, 1, 1
    )
    assert np.all(np.abs(got - want) <= dot_tolerance(9, mag + 0.4) * 2)
    import quanta

    nat = quanta.InferenceSession(p.SerializeToString())
    ref = quanta.InferenceSession(p.SerializeToString(), backend="reference")
    np.testing.assert_array_equal(nat.run(None, {"x": x})[0], ref.run(None, {"x": x})[0])


def test_depthwise_float_output_refuses_per_channel_zero_points_that_differ():
    from quanta.passes.lower.conv_float_output import LowerConvFloatOutput

    model = load(dw_float_output_proto(zx=(4, 4, 4, 5, 4, 4, 4)))
    result = lower(model, [LowerConvFloatOutput()])
    assert result.fired("LowerConvFloatOutput") == 0
    assert [r.reason for r in result.why_not("LowerConvFloatOutput")] == [
        "input x is quantized per channel with zero points that differ"
    ]
