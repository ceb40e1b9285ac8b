"""fuse_activation: Relu / Relu6 / Clip dropped where the output quantization implies
them (QDQ), else fused into the producer as an output clamp (quanta domain)."""

from __future__ import annotations

import contextlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.ir.printer import format_graph
from quanta.ir.verify import Stage, verify
from quanta.kernels.reference import registry
from quanta.passes.rules.fuse_activation import QUANTA_DOMAIN, DropImpliedActivation, FuseActivation
from tests.passes.helpers import out_info, rng_data, run_passes, run_ref


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def act_node(act: str, inp: str, out: str, lo=None, hi=None, opset: int = 21) -> tuple[onnx.NodeProto, list]:
    """Relu, or Clip with constant bounds as inputs (attributes before opset 11)."""
    if act == "Relu":
        return helper.make_node("Relu", [inp], [out], name="act"), []
    if opset < 11:
        attrs = {k: v for k, v in (("min", lo), ("max", hi)) if v is not None}
        return helper.make_node("Clip", [inp], [out], name="act", **attrs), []
    ins, inits = [inp], []
    for name, v in (("lo", lo), ("hi", hi)):
        if v is None:
            ins.append("")
        else:
            ins.append(name)
            inits.append(_init(name, np.float32(v)))
    while ins[-1] == "":
        ins.pop()
    return helper.make_node("Clip", ins, [out], name="act"), inits


def qdq_act_model(act: str, ys: float, yz, lo=None, hi=None, per_axis_y: bool = False) -> onnx.ModelProto:
    """x -Q(u8, 0.03, 131)-DQ-> Conv(DQ(w i8 per-channel), b) -> act -> Q(ys, yz) -> DQ -> y."""
    rng = np.random.default_rng(0)
    wq = rng.integers(-127, 128, (7, 3, 3, 3)).astype(np.int8)
    ws = np.array([0.011, 0.007, 0.013, 0.005, 0.009, 0.012, 0.004], np.float32) * 3
    node, act_inits = act_node(act, "c", "a", lo, hi)
    q_attrs = {"axis": 1} if per_axis_y else {}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="q_x"),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xf"], name="dq_x"),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wf"], name="dq_w", axis=0),
        helper.make_node("Conv", ["xf", "wf", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        node,
        helper.make_node("QuantizeLinear", ["a", "ys", "yz"], ["aq"], name="q_a", **q_attrs),
        helper.make_node("DequantizeLinear", ["aq", "ys", "yz"], ["y"], name="dq_a", **q_attrs),
    ]
    inits = [
        _init("xs", np.float32(0.03)),
        _init("xz", np.uint8(131)),
        _init("wq", wq),
        _init("ws", ws),
        _init("wz", np.zeros(7, np.int8)),
        _init("b", rng.uniform(-1, 1, 7).astype(np.float32)),
        _init("ys", np.asarray(ys, np.float32)),
        _init("yz", np.asarray(yz)),
        *act_inits,
    ]
    g = helper.make_graph(
        nodes,
        "qdq_act",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 5])],
        [out_info("y", 4)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


X = rng_data((1, 3, 9, 5), seed=1, low=-3.0, high=3.0)


def drop_and_compare(proto: onnx.ModelProto) -> None:
    model = load(proto)
    result = run_passes(model, [DropImpliedActivation()])
    assert result.fired("DropActivationImpliedByQuantize") == 1
    counts = model.graph.op_counts()
    assert "Relu" not in counts and "Clip" not in counts
    assert counts == {"Conv": 1, "DequantizeLinear": 3, "QuantizeLinear": 2}
    q = model.graph.find_nodes("QuantizeLinear")[1]
    assert q.inputs[0].name == "c" and q.outputs[0].name == "aq"
    # tolerance 0: exact by monotonicity of Q (module docstring); same reference arithmetic
    expected, actual = run_ref(proto, {"x": X}), run_ref(model, {"x": X})
    np.testing.assert_array_equal(expected[0], actual[0])
    verify(model.graph, Stage.QDQ)


def test_drop_relu_when_zero_point_is_qmin_u8():
    drop_and_compare(qdq_act_model("Relu", 0.05, np.uint8(0)))


def test_drop_relu_when_zero_point_is_qmin_i8():
    drop_and_compare(qdq_act_model("Relu", 0.04, np.int8(-128)))


def test_drop_relu6_when_6_saturates():
    # Q(6) = rint(6 / 0.0235) = rint(255.3) = 255 = qmax; the data reaches beyond 6 and below 0
    proto = qdq_act_model("Clip", 0.0235, np.uint8(0), lo=0.0, hi=6.0)
    y = run_ref(proto, {"x": X})[0]
    assert (y == 0).any() and (y == np.float32(255 * np.float32(0.0235))).any()  # both clamps are active
    drop_and_compare(proto)


def test_drop_clip_lower_bound_half_a_step_above_zero_rounds_to_even():
    # Golden tie: 0.025 / 0.05 = 0.5 exactly in float32 -> rint gives 0 = qmin: implied.
    drop_and_compare(qdq_act_model("Clip", 0.05, np.uint8(0), lo=0.025))


def test_drop_clip_negative_lower_bound_below_saturation():
    # int8 zp -100: Q(-0.9) = -100 + rint(-18) = -118 > -128 would not do; -5.2 saturates
    drop_and_compare(qdq_act_model("Clip", 0.05, np.int8(-100), lo=-5.2))


def test_drop_relu_per_axis_output_quantization():
    ys = np.array([0.05, 0.03, 0.07, 0.02, 0.04, 0.06, 0.08], np.float32)
    drop_and_compare(qdq_act_model("Relu", ys, np.zeros(7, np.uint8), per_axis_y=True))


# -- DropActivationImpliedByQuantize: NoMatch reasons -------------------------------------------


def drop_reasons(proto_or_model) -> list[str]:
    model = load(proto_or_model) if isinstance(proto_or_model, onnx.ModelProto) else proto_or_model
    before = format_graph(model.graph)
    result = run_passes(model, [DropImpliedActivation()])
    assert not result.modified and format_graph(model.graph) == before
    return [r.reason for r in result.why_not("DropActivationImpliedByQuantize")]


def test_drop_refuses_relu_when_zero_point_is_above_qmin():
    # x = -0.6·s would quantize to zp - 1 without the Relu: not exact.
    assert drop_reasons(qdq_act_model("Relu", 0.05, np.uint8(3))) == [
        "Relu is not implied: QuantizeLinear maps 0.0 to 3 > qmin 0 (zero point 3)"
    ]


def test_drop_refuses_clip_lower_bound_just_above_the_tie():
    assert drop_reasons(qdq_act_model("Clip", 0.05, np.uint8(0), lo=0.0251)) == [
        "Clip lower bound 0.025100000202655792 is not implied: QuantizeLinear maps 0.025100000202655792 to 1 > "
        "qmin 0 (zero point 0)"
    ]


def test_drop_refuses_relu6_when_6_is_representable():
    assert drop_reasons(qdq_act_model("Clip", 0.05, np.uint8(0), lo=0.0, hi=6.0)) == [
        "Clip upper bound 6.0 is not implied: QuantizeLinear maps it to 120 < qmax 255"
    ]


def test_drop_refuses_per_axis_when_one_channel_is_not_implied():
    ys = np.array([0.05, 0.03, 0.07, 0.02, 0.04, 0.06, 0.08], np.float32)
    yz = np.array([0, 0, 0, 0, 2, 0, 0], np.uint8)
    assert drop_reasons(qdq_act_model("Relu", ys, yz, per_axis_y=True)) == [
        "Relu is not implied (channel 4): QuantizeLinear maps 0.0 to 2 > qmin 0 (zero point 2)"
    ]


def test_drop_refuses_non_constant_clip_bound():
    proto = qdq_act_model("Clip", 0.05, np.uint8(0), lo=0.0, hi=6.0)
    hi = next(i for i in proto.graph.initializer if i.name == "hi")
    proto.graph.initializer.remove(hi)
    proto.graph.input.append(helper.make_tensor_value_info("hi", TensorProto.FLOAT, []))
    assert drop_reasons(proto) == ["Clip max 'hi' (a graph input) is not a constant"]


def test_drop_refuses_non_scalar_clip_bound():
    # ill-formed (Clip bounds are scalars): built past the checker by editing the IR
    proto = qdq_act_model("Clip", 0.05, np.uint8(0), lo=0.0, hi=6.0)
    model = load(proto)
    model.graph.initializers["hi"].const = np.array([6.0, 7.0], np.float32)
    assert drop_reasons(model) == ["Clip bound 'hi' (a constant) has shape [2], expected a scalar"]


def test_drop_refuses_non_constant_output_scale():
    proto = qdq_act_model("Relu", 0.05, np.uint8(0))
    ys = next(i for i in proto.graph.initializer if i.name == "ys")
    proto.graph.initializer.remove(ys)
    proto.graph.input.append(helper.make_tensor_value_info("ys", TensorProto.FLOAT, []))
    assert drop_reasons(proto) == ["QuantizeLinear scale/zero point are not constants"]


def test_drop_refuses_float8_storage():
    proto = qdq_act_model("Relu", 0.05, np.uint8(0))
    yz = next(i for i in proto.graph.initializer if i.name == "yz")
    proto.graph.initializer.remove(yz)
    proto.graph.initializer.append(helper.make_tensor("yz", TensorProto.FLOAT8E4M3FN, [], [0.0]))
    assert drop_reasons(proto) == ["storage f8e4m3fn is not an integer type (no saturation to rely on)"]


def test_drop_refuses_activation_output_used_elsewhere():
    proto = qdq_act_model("Relu", 0.05, np.uint8(0))
    proto.graph.node.append(helper.make_node("Neg", ["a"], ["n"], name="neg"))
    proto.graph.output.append(out_info("n", 4))
    assert drop_reasons(proto) == [
        "'a' (output of 'act' (Relu)) is also used by 'neg' (Neg) outside the pattern"
    ]


# -- FuseActivationIntoProducer ------------------------------------------------------------------


def _fused_reference(op_type: str):
    """The meaning of quanta::<op>{activation}: the op, then the clamp in its output type.
    Registered only for these tests (quanta::Conv's real one, nn_conv.fused_conv, is put
    back after them)."""
    base = registry.get_op(op_type)

    def fn(ctx, *inputs, activation: str, activation_params=None, **attrs):
        y = base(ctx, *inputs, **attrs)
        lo, hi = (0.0, np.inf) if activation == "Relu" else activation_params
        return np.minimum(np.maximum(y, y.dtype.type(lo)), y.dtype.type(hi)).astype(y.dtype)

    return fn


@contextlib.contextmanager
def fused_reference_ops():
    keys = [(QUANTA_DOMAIN, op) for op in ("Conv", "Gemm", "MatMul", "Add")]
    registry.get_op("Conv")  # load the table first
    saved = {key: registry.OPS.get(key) for key in keys}  # quanta::Conv has a real one
    for key in keys:
        registry.OPS[key] = _fused_reference(key[1])
    try:
        yield
    finally:
        for key, fn in saved.items():
            if fn is None:
                registry.OPS.pop(key, None)
            else:
                registry.OPS[key] = fn


def float_chain_model(opset: int = 21) -> onnx.ModelProto:
    """Conv -> Relu -> Flatten -> Gemm -> Clip(0, 6) -> MatMul -> Clip(-1, _) -> Add -> Relu."""
    rng = np.random.default_rng(4)
    relu, _ = act_node("Relu", "c", "r1")
    relu6, i6 = act_node("Clip", "g", "r2", lo=0.0, hi=6.0, opset=opset)
    relu6.name = "relu6"
    clip_lo, ilo = act_node("Clip", "mm", "r3", lo=-1.0, opset=opset)
    clip_lo.name = "clip_lo"
    if i6 and ilo:
        relu6.input[1], relu6.input[2] = "lo6", "hi6"
        clip_lo.input[1] = "lo3"
        i6 = [_init("lo6", np.float32(0.0)), _init("hi6", np.float32(6.0))]
        ilo = [_init("lo3", np.float32(-1.0))]
    relu_end = helper.make_node("Relu", ["s"], ["y"], name="relu_end")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        relu,
        helper.make_node("Flatten", ["r1"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["g"], name="fc", transB=1),
        relu6,
        helper.make_node("MatMul", ["r2", "m"], ["mm"], name="mm"),
        clip_lo,
        helper.make_node("Add", ["r3", "bias2"], ["s"], name="add"),
        relu_end,
    ]
    inits = [
        _init("w", rng.standard_normal((7, 3, 3, 3)).astype(np.float32) * 0.5),
        _init("b", rng.standard_normal(7).astype(np.float32)),
        _init("fc", rng.standard_normal((17, 7 * 4 * 3)).astype(np.float32) * 0.3),
        _init("fcb", rng.standard_normal(17).astype(np.float32)),
        _init("m", rng.standard_normal((17, 5)).astype(np.float32)),
        _init("bias2", rng.standard_normal(5).astype(np.float32)),
        *i6,
        *ilo,
    ]
    g = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 3])],
        [out_info("y", 2)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [21, 10])
def test_fuse_activation_into_conv_gemm_matmul_add(opset):
    proto = float_chain_model(opset)
    model = load(proto)
    result = run_passes(model, [FuseActivation()])
    assert result.fired("FuseActivationIntoProducer") == 4
    assert model.graph.op_counts() == {
        "Flatten": 1,
        "quanta::Add": 1,
        "quanta::Conv": 1,
        "quanta::Gemm": 1,
        "quanta::MatMul": 1,
    }
    by_name = {n.name: n for n in model.graph.nodes}
    assert by_name["conv"].attrs["activation"] == "Relu" and "activation_params" not in by_name["conv"].attrs
    assert by_name["fc"].attrs["activation_params"] == [0.0, 6.0] and by_name["fc"].attrs["transB"] == 1
    assert by_name["mm"].attrs["activation_params"] == [-1.0, np.inf]
    assert model.opset_imports[QUANTA_DOMAIN] == 1  # the manager imports the new domain
    x = rng_data((2, 3, 4, 3), seed=5)
    with fused_reference_ops():
        # tolerance 0: the fused op is the producer then the same clamp, same arithmetic
        np.testing.assert_array_equal(run_ref(proto, {"x": x})[0], run_ref(model, {"x": x})[0])
    verify(model.graph, Stage.FLOAT)


def test_fuse_activation_after_drop_in_a_qdq_graph():
    # Relu not implied (zp 3): dropped nothing, fused into the conv; Q now reads the fused conv
    proto = qdq_act_model("Relu", 0.05, np.uint8(3))
    model = load(proto)
    result = run_passes(model, [DropImpliedActivation(), FuseActivation()])
    assert result.fired("DropActivationImpliedByQuantize") == 0
    assert result.fired("FuseActivationIntoProducer") == 1
    q = model.graph.find_nodes("QuantizeLinear")[1]
    assert q.inputs[0].producer.domain == QUANTA_DOMAIN and q.inputs[0].producer.op_type == "Conv"
    with fused_reference_ops():
        np.testing.assert_array_equal(run_ref(proto, {"x": X})[0], run_ref(model, {"x": X})[0])
    verify(model.graph, Stage.QDQ)


def fuse_reasons(proto) -> list[str]:
    model = load(proto)
    before = format_graph(model.graph)
    result = run_passes(model, [FuseActivation()])
    assert not result.modified and format_graph(model.graph) == before
    return [r.reason for r in result.why_not("FuseActivationIntoProducer", include_pattern=True)]


def test_fuse_refuses_non_constant_clip_bound():
    proto = float_chain_model()
    for i in list(proto.graph.initializer):
        if i.name == "hi6":
            proto.graph.initializer.remove(i)
    proto.graph.input.append(helper.make_tensor_value_info("hi6", TensorProto.FLOAT, []))
    # the other three activations still fuse; keep only the refused one in the graph
    reasons = load_and_collect(proto)
    assert reasons == ["Clip max 'hi6' (a graph input) is not a constant"]


def load_and_collect(proto) -> list[str]:
    model = load(proto)
    result = run_passes(model, [FuseActivation()])
    return [r.reason for r in result.why_not("FuseActivationIntoProducer")]


def test_fuse_refuses_producer_output_used_elsewhere():
    proto = float_chain_model()
    proto.graph.node.append(helper.make_node("Neg", ["c"], ["n"], name="neg"))
    proto.graph.output.append(out_info("n", 4))
    assert load_and_collect(proto) == [
        "'c' (output of 'conv' (Conv)) is also used by 'neg' (Neg) outside the pattern"
    ]


def test_fuse_refuses_producer_that_is_not_fusable():
    proto = qdq_act_model("Relu", 0.05, np.uint8(3))
    proto.graph.node[3].op_type = "ConvTranspose"  # same inputs, a producer without a clamp
    assert fuse_reasons(proto) == [
        "input 0 of 'act' (Relu) 'c' is produced by ConvTranspose, expected Conv|Gemm|MatMul|Add"
    ]


# -- QuantizeBeforeActivation: a clamp the quantization does not imply --------------------------

SPLIT_CASES = [
    # AMD Quark: uint8 with zero point 128, power-of-two scale; Relu6 = codes [128, 224]
    pytest.param("Clip", 0.0625, np.uint8(128), 0.0, 6.0, id="quark_u8_zp128_relu6"),
    # TensorRT-style symmetric int8: Relu = codes [0, 127]
    pytest.param("Relu", 0.05, np.int8(0), None, None, id="symmetric_i8_relu"),
    # a non-zero int8 zero point and both bounds interior
    pytest.param("Clip", 0.031, np.int8(-7), -1.0, 2.5, id="i8_zp-7_clip"),
]


def split_model(act, ys, yz, lo, hi):
    from quanta.passes.rules.fuse_activation import QuantizeBeforeActivationPass

    proto = qdq_act_model(act, ys, yz, lo=lo, hi=hi)
    model = load(proto)
    result = run_passes(model, [DropImpliedActivation(), QuantizeBeforeActivationPass()])
    return proto, model, result


@pytest.mark.parametrize(("act", "ys", "yz", "lo", "hi"), SPLIT_CASES)
def test_quantize_before_activation_is_exact(act, ys, yz, lo, hi):
    """Failure signature: AMD Quark's EfficientNet-Lite0 ran its 33 Conv + Relu6 groups as
    float Convs, a float Clip and a QuantizeLinear (2.1x quanta's own file), because the
    Relu6 between the Conv and its QuantizeLinear was not implied by zero point 128."""
    proto, model, result = split_model(act, ys, yz, lo, hi)
    assert result.fired("QuantizeBeforeActivation") == 1
    counts = model.graph.op_counts()
    assert counts == {"Conv": 1, act: 1, "DequantizeLinear": 4, "QuantizeLinear": 3}
    conv_q = model.graph.find_nodes("Conv")[0].outputs[0].consumers()
    assert [n.op_type for n in conv_q] == ["QuantizeLinear"]
    # tolerance 0: Q monotone and Q(DQ(c)) = c on every code (the rule's docstring); the
    # same reference arithmetic on both sides
    x = rng_data((1, 3, 9, 5), seed=4, low=-6.0, high=6.0)
    np.testing.assert_array_equal(run_ref(proto, {"x": x})[0], run_ref(model, {"x": x})[0])
    verify(model.graph, Stage.QDQ)


@pytest.mark.parametrize(("act", "ys", "yz", "lo", "hi"), SPLIT_CASES)
def test_quantize_before_activation_lowers_to_integer_conv_and_clamp(act, ys, yz, lo, hi):
    """The session lowers the split group to QLinearConv whose epilogue clamps the codes
    (the clamp's table folded into it: passes/lower/fold_code_clamp.py; no float Conv, no
    table step), and the native kernels equal the reference twins bit for bit."""
    import onnxruntime as ort

    import quanta

    proto = qdq_act_model(act, ys, yz, lo=lo, hi=hi)
    native = quanta.InferenceSession(proto, backend="native")
    ops = sorted(s.op_type for s in native.plan.steps)
    assert "Conv" not in ops and "QLinearConv" in ops and "QLinearLookup" not in ops, ops
    (conv,) = [s.node for s in native.plan.steps if s.op_type == "QLinearConv"]
    assert "output_clamp" in conv.attrs
    x = rng_data((1, 3, 9, 5), seed=5, low=-6.0, high=6.0)
    got = native.run(None, {"x": x})[0]
    twin = quanta.InferenceSession(proto, backend="reference").run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, twin)  # 0: integer ops, the twins' arithmetic
    # ONNX Runtime runs the file's float Conv: at most one step apart (the exact int32
    # sum against float32 summation, rounded once each; docs/quantization-math.md (6))
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    assert np.max(np.abs(want - got)) <= ys * 1.0001


def split_reasons(proto) -> list[str]:
    from quanta.passes.rules.fuse_activation import QuantizeBeforeActivationPass

    model = load(proto)
    before = format_graph(model.graph)
    result = run_passes(model, [QuantizeBeforeActivationPass()])
    assert not result.modified and format_graph(model.graph) == before
    return [r.reason for r in result.why_not("QuantizeBeforeActivation")]


def test_quantize_before_activation_refuses_per_axis_output():
    proto = qdq_act_model("Relu", np.full(7, 0.05, np.float32), np.full(7, 3, np.uint8), per_axis_y=True)
    assert split_reasons(proto) == ["QuantizeLinear parameters are not constants of one tensor-wide scale"]


def test_quantize_before_activation_refuses_16_bit_output():
    assert split_reasons(qdq_act_model("Relu", 0.05, np.uint16(300))) == [
        "storage u16 is not 8-bit (the clamp would not become a 256-entry table)"
    ]


def test_quantize_before_activation_refuses_a_producer_read_elsewhere():
    proto = qdq_act_model("Relu", 0.05, np.uint8(3))
    proto.graph.output.append(out_info("c", 4))
    assert split_reasons(proto) == ["'c' (output of 'conv' (Conv)) is a graph output"]


def test_quantize_before_activation_refuses_a_float_producer_input():
    proto = qdq_act_model("Relu", 0.05, np.uint8(3))
    conv = next(n for n in proto.graph.node if n.op_type == "Conv")
    conv.input[0] = "x"  # the float input itself, not its DequantizeLinear
    assert split_reasons(proto) == ["Conv input 'x' (a graph input) is not dequantized (not a QDQ group)"]


def test_quantize_before_activation_refuses_a_scale_whose_codes_do_not_round_trip():
    # f32((c - z)·s) / s is c within 255·2^-23 for every finite product, so only an
    # overflow breaks the round trip: 252 · 3e36 is inf in float32
    assert split_reasons(qdq_act_model("Relu", 3e36, np.uint8(3))) == [
        "scale 3.000000043527274e+36: Q(DQ(c)) != c for some code, the split would not be exact"
    ]
