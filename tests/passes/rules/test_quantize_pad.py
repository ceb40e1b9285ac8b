"""QuantizePad (passes/rules/quantize_pad.py): DQ -> Pad -> Q with one type becomes a
Pad on the integers whose pad value is Q(v). Four parts (fired; structure: no float
Pad left, the pad value's integer; bit-exact numerics on the reference target, since
Q(DQ(q)) = q inside and Q(v) in the padded cells; the verifier for the lowered stage)
for constant mode (v = 0, v off the grid, v omitted) and the copying modes; one
negative test per NoMatch reason with the graph unchanged; the lowering pipeline on a
ReLU6 -> Pad -> depthwise Conv block quantized without FoldPad."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.ir.printer import format_graph
from quanta.ir.verify import Stage
from quanta.passes.qmath import quantize_value
from quanta.passes.rules.quantize_pad import QuantizePad
from tests.passes.helpers import rng_data, run_passes, run_ref

S_IN, Z_IN = 0.037, 131  # non-coincidental: zero point far from 0 and 128


def qdq_pad_proto(
    *,
    mode: str = "constant",
    value: float | None = 0.0,
    out_params: tuple[float, int] = (S_IN, Z_IN),
    value_as_input: bool = False,
    scale_as_input: bool = False,
    in_scale: float = S_IN,
    per_axis: bool = False,
):
    c = 3
    shape = [2, c, 5, 4]
    if per_axis:
        s_in = np.array([in_scale, 0.05, 0.021], np.float32)
        z_in = np.array([Z_IN, 120, 140], np.uint8)
        s_out, z_out = s_in, z_in
    else:
        s_in, z_in = np.array(in_scale, np.float32), np.array(Z_IN, np.uint8)
        s_out, z_out = np.array(out_params[0], np.float32), np.array(out_params[1], np.uint8)
    inits = [
        numpy_helper.from_array(z_in, "z"),
        numpy_helper.from_array(s_out, "s2"),
        numpy_helper.from_array(z_out, "z2"),
        numpy_helper.from_array(np.array([0, 0, 1, 0, 0, 0, 2, 1], np.int64), "pads"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)]
    if scale_as_input:
        inputs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, []))
    else:
        inits.append(numpy_helper.from_array(s_in, "s"))
    pad_inputs = ["f", "pads"]
    if value_as_input:
        inputs.append(helper.make_tensor_value_info("v", TensorProto.FLOAT, []))
        pad_inputs.append("v")
    elif value is not None:
        inits.append(numpy_helper.from_array(np.array(value, np.float32), "v"))
        pad_inputs.append("v")
    axis = {"axis": 1} if per_axis else {}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q_x", **axis),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["f"], name="dq_x", **axis),
        helper.make_node("Pad", pad_inputs, ["p"], mode=mode, name="pad"),
        helper.make_node("QuantizeLinear", ["p", "s2", "z2"], ["qp"], name="q_p", **axis),
        helper.make_node("DequantizeLinear", ["qp", "s2", "z2"], ["y"], name="dq_p", **axis),
    ]
    g = helper.make_graph(
        nodes, "qdq_pad", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits
    )
    return onnx.shape_inference.infer_shapes(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    )


def feeds(proto):
    f = {"x": rng_data((2, 3, 5, 4), seed=4, low=-4.0, high=4.0)}
    names = {i.name for i in proto.graph.input}
    if "v" in names:
        f["v"] = np.array(0.5, np.float32)
    if "s" in names:
        f["s"] = np.array(S_IN, np.float32)
    return f


@pytest.mark.parametrize(
    ("mode", "value"),
    [
        ("constant", 0.0),  # the usual "same" padding: Q(0) = z
        ("constant", 1.37),  # off the grid: rounded once, by the Q the graph already has
        ("constant", -50.0),  # below the range: saturates to qmin
        ("constant", None),  # omitted: 0
        ("reflect", None),
        ("edge", None),
    ],
)
def test_quantize_pad_is_bit_exact(mode, value):
    proto = qdq_pad_proto(mode=mode, value=value)
    model = load(proto)
    result = run_passes(model, [QuantizePad()], stage=Stage.LOWERED)
    assert result.fired("PadOnQuantizedValues") == 1
    assert [n.op_type for n in model.graph.nodes] == ["QuantizeLinear", "Pad", "DequantizeLinear"]
    (pad,) = [n for n in model.graph.nodes if n.op_type == "Pad"]
    assert pad.input(0).name == "q"
    q = pad.input(0).type.elem
    assert int(np.asarray(pad.input(2).const)) == quantize_value(0.0 if value is None else value, q)
    if value == 0.0 or value is None:
        assert int(np.asarray(pad.input(2).const)) == Z_IN
    if value == -50.0:
        assert int(np.asarray(pad.input(2).const)) == 0
    f = feeds(proto)
    # 0: Q(DQ(q)) = q in the interior, and the padded cells are Q(v) on both sides
    np.testing.assert_array_equal(run_ref(proto, f)[0], run_ref(model, f)[0])


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        (
            {"out_params": (0.05, 120)},
            "the Pad is dequantized as Q(u8:f32, 0.037, 131) and quantized as Q(u8:f32, 0.05, 120): "
            "a requantization",
        ),
        ({"value_as_input": True}, "the pad value 'v' (a graph input) is not a constant scalar"),
        ({"scale_as_input": True}, "scale / zero point are not constants"),
        (
            {"per_axis": True},
            "per-axis quantization (axis 1): one pad value cannot serve every channel",
        ),
    ],
)
def test_quantize_pad_refuses_with_its_reason(kw, reason):
    proto = qdq_pad_proto(**kw)
    model = load(proto)
    before = format_graph(model.graph)
    p = QuantizePad()
    result = run_passes(model, [p], stage=Stage.LOWERED)
    assert not result.records[0].modified
    assert [r.reason for r in p.why_not("PadOnQuantizedValues")] == [reason]
    assert format_graph(model.graph) == before


def test_quantize_pad_refuses_a_subnormal_scale():
    proto = qdq_pad_proto(in_scale=1e-40, out_params=(1e-40, Z_IN))
    model = load(proto)
    before = format_graph(model.graph)
    p = QuantizePad()
    run_passes(model, [p], stage=Stage.LOWERED)
    (r,) = p.why_not("PadOnQuantizedValues")
    assert r.reason.startswith("Q(DQ(q)) = q is not guaranteed: ")
    assert format_graph(model.graph) == before


def test_quantized_same_padding_block_pads_on_the_integers(tmp_path, monkeypatch):
    """Failure signature: DequantizeLinear -> float Pad -> QuantizeLinear between every
    ReLU6 and depthwise Conv of EfficientNet-Lite quantized with its Pads kept.
    FoldPad is taken out so that the Pad survives quantization."""
    import quanta
    import quanta.passes.pipelines as pipelines
    from tests.passes.rules.test_fold_pad import same_padding_block_proto

    full = pipelines.prepare_for_quantization
    monkeypatch.setattr(
        pipelines,
        "prepare_for_quantization",
        lambda **kw: [p for p in full(**kw) if p.name != "fold_pad"],
    )
    src, out = tmp_path / "same.onnx", tmp_path / "same.int8.onnx"
    onnx.save(same_padding_block_proto(), src)
    rng = np.random.default_rng(6)
    calib = [{"x": rng.standard_normal((2, 3, 12, 12)).astype(np.float32)} for _ in range(3)]
    summary = quanta.quantize_static(src, out, calib, verbose=False)
    assert ("same_pad", "Pad") in summary.quantized
    native = quanta.InferenceSession(str(out))
    ops = [s.op_type for s in native.plan.steps]
    assert ops.count("Pad") == 1 and ops.count("QLinearConv") == 2 and "Conv" not in ops, ops
    x = rng.standard_normal((2, 3, 12, 12)).astype(np.float32)
    reference = quanta.InferenceSession(str(out), backend="reference")
    # 0: both backends run the same integer graph, and the integer Pad moves bytes
    np.testing.assert_array_equal(native.run(None, {"x": x})[0], reference.run(None, {"x": x})[0])
