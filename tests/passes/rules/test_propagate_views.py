"""propagate_views: views move onto quantized values and keep their input's element type."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.ir.printer import format_graph
from quanta.ir.types import QuantType
from quanta.ir.verify import Stage, verify
from quanta.passes.manager import PassManager
from quanta.passes.rules.eliminate_dead import EliminateDead
from quanta.passes.rules.propagate_views import PropagateViews
from quanta.passes.rules.remove_noops import RemoveNoops
from tests.passes.helpers import out_info, rng_data, run_passes, run_ref


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def views_model(pool_storage=np.uint8, per_axis: bool = False) -> onnx.ModelProto:
    """x -Q/DQ(0.02, 131)-> MaxPool -Q/DQ(0.02, 131)-> Flatten -Q/DQ(0.03, 120)->
    Unsqueeze -> Transpose -> Squeeze -> Gather -> Slice -> Reshape -Q/DQ(0.03, 120)-> y."""
    q_attrs = {"axis": 1} if per_axis else {}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s1", "z1"], ["q1"], name="q1", **q_attrs),
        helper.make_node("DequantizeLinear", ["q1", "s1", "z1"], ["f1"], name="dq1", **q_attrs),
        helper.make_node("MaxPool", ["f1"], ["p"], name="pool", kernel_shape=[2, 2], pads=[1, 0, 0, 1]),
        helper.make_node("QuantizeLinear", ["p", "s1", "z1"], ["q2"], name="q2", **q_attrs),
        helper.make_node("DequantizeLinear", ["q2", "s1", "z1"], ["f2"], name="dq2", **q_attrs),
        helper.make_node("Flatten", ["f2"], ["fl"], name="flat"),
        helper.make_node("QuantizeLinear", ["fl", "s3", "z3"], ["q3"], name="q3"),
        helper.make_node("DequantizeLinear", ["q3", "s3", "z3"], ["f3"], name="dq3"),
        helper.make_node("Unsqueeze", ["f3", "ax0"], ["u"], name="unsq"),
        helper.make_node("Transpose", ["u"], ["t"], name="tr", perm=[1, 0, 2]),
        helper.make_node("Squeeze", ["t", "ax1"], ["sq"], name="sq"),
        helper.make_node("Gather", ["sq", "idx"], ["g"], name="gather", axis=1),
        helper.make_node("Slice", ["g", "st", "en", "axs"], ["sl"], name="slice"),
        helper.make_node("Reshape", ["sl", "shape"], ["r"], name="reshape"),
        helper.make_node("QuantizeLinear", ["r", "s3", "z3"], ["q4"], name="q4"),
        helper.make_node("DequantizeLinear", ["q4", "s3", "z3"], ["y"], name="dq4"),
    ]
    s1 = np.array([0.02, 0.025, 0.015], np.float32) if per_axis else np.float32(0.02)
    z1 = np.array([131, 125, 129], pool_storage) if per_axis else np.asarray(131, pool_storage)
    inits = [
        _init("s1", s1),
        _init("z1", z1),
        _init("s3", np.float32(0.03)),
        _init("z3", np.uint8(120)),
        _init("ax0", np.array([0], np.int64)),
        _init("ax1", np.array([1], np.int64)),
        _init("idx", np.array([4, 0, -1, 7, 7], np.int64)),
        _init("st", np.array([1], np.int64)),
        _init("en", np.array([-1], np.int64)),
        _init("axs", np.array([1], np.int64)),
        _init("shape", np.array([9, 1], np.int64)),
    ]
    g = helper.make_graph(
        nodes,
        "views",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3, 7, 5])],
        [out_info("y", 2)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


X = rng_data((3, 3, 7, 5), seed=0, low=-3, high=3)


def test_propagate_views_then_remove_pairs():
    proto = views_model()
    model = load(proto)
    result = run_passes(model, [PropagateViews(), RemoveNoops(), EliminateDead()])
    assert result.fired("MoveDequantizeAfterView") == 8  # every view moved below its DequantizeLinear
    assert result.fired("MoveQuantizeBeforeView") == 0  # the views moved first, nothing left above a Q
    assert result.fired("RemoveDequantizeQuantize") == 2  # after the pool and at the end; q3 requantizes
    text = format_graph(model.graph, show_consts=False)
    assert text == (
        "graph views(%x: tensor<3x3x7x5, f32>) {\n"
        "  %q1: tensor<3x3x7x5, Q(u8:f32, 0.02, 131)> = QuantizeLinear(%x, %s1, %z1)  # q1\n"
        "  %p_q: tensor<3x3x7x5, Q(u8:f32, 0.02, 131)> = MaxPool(%q1) {kernel_shape=[2, 2], pads=[1, 0, 0, 1]}  # pool\n"
        "  %fl_q: tensor<3x105, Q(u8:f32, 0.02, 131)> = Flatten(%p_q)  # flat\n"
        "  %fl: tensor<3x105, f32> = DequantizeLinear(%fl_q, %s1, %z1)  # dq2\n"
        "  %q3: tensor<3x105, Q(u8:f32, 0.03, 120)> = QuantizeLinear(%fl, %s3, %z3)  # q3\n"
        "  %u_q: tensor<1x3x105, Q(u8:f32, 0.03, 120)> = Unsqueeze(%q3, %ax0)  # unsq\n"
        "  %t_q: tensor<3x1x105, Q(u8:f32, 0.03, 120)> = Transpose(%u_q) {perm=[1, 0, 2]}  # tr\n"
        "  %sq_q: tensor<3x105, Q(u8:f32, 0.03, 120)> = Squeeze(%t_q, %ax1)  # sq\n"
        "  %g_q: tensor<3x5, Q(u8:f32, 0.03, 120)> = Gather(%sq_q, %idx) {axis=1}  # gather\n"
        "  %sl_q: tensor<3x3, Q(u8:f32, 0.03, 120)> = Slice(%g_q, %st, %en, %axs)  # slice\n"
        "  %r_q: tensor<9x1, Q(u8:f32, 0.03, 120)> = Reshape(%sl_q, %shape)  # reshape\n"
        "  %y: tensor<9x1, f32> = DequantizeLinear(%r_q, %s3, %z3)  # dq4\n"
        "  return %y\n"
        "}"
    )
    # tolerance 0: DequantizeLinear / QuantizeLinear are elementwise and monotone, the
    # views only select (module docstring); the removed DQ -> Q pairs are identities
    np.testing.assert_array_equal(run_ref(proto, {"x": X})[0], run_ref(model, {"x": X})[0])
    verify(model.graph, Stage.QDQ)


def test_move_quantize_before_view_on_float_producers():
    # Conv output reshaped then quantized: the Q moves above the Reshape and MaxPool
    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("MaxPool", ["c"], ["p"], name="pool", kernel_shape=[3, 1], strides=[2, 1]),
        helper.make_node("Reshape", ["p", "shape"], ["r"], name="reshape"),
        helper.make_node("QuantizeLinear", ["r", "s", "z"], ["q"], name="q"),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq"),
    ]
    inits = [
        _init("w", rng.standard_normal((7, 3, 1, 1)).astype(np.float32)),
        _init("shape", np.array([0, -1], np.int64)),
        _init("s", np.float32(0.05)),
        _init("z", np.int8(-9)),
    ]
    g = helper.make_graph(
        nodes,
        "qv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3, 7, 5])],
        [out_info("y", 2)],
        inits,
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    model = load(proto)
    result = run_passes(model, [PropagateViews()])
    assert result.fired("MoveQuantizeBeforeView") == 2
    ops = [n.op_type for n in model.graph.nodes]
    assert ops == ["Conv", "QuantizeLinear", "MaxPool", "Reshape", "DequantizeLinear"]
    for n in model.graph.nodes[2:4]:  # the views keep the quantized element type
        assert isinstance(n.outputs[0].elem, QuantType) and n.outputs[0].elem == n.inputs[0].elem
    np.testing.assert_array_equal(run_ref(proto, {"x": X})[0], run_ref(model, {"x": X})[0])
    verify(model.graph, Stage.QDQ)


# -- NoMatch reasons ------------------------------------------------------------------


def reasons(proto, rule: str) -> list[str]:
    model = load(proto)
    before = format_graph(model.graph)
    result = PassManager([PropagateViews()], verify=True).run(model)
    assert format_graph(model.graph) == before
    return sorted({r.reason for r in result.why_not(rule)})


def test_propagate_views_refuses_per_axis_quantization():
    proto = views_model(per_axis=True)
    # the first two views read per-axis DequantizeLinear outputs; the later ones are
    # per-tensor and move, so compare only the refusals
    model = load(proto)
    result = PassManager([PropagateViews()], verify=True).run(model)
    assert sorted({r.reason for r in result.why_not("MoveDequantizeAfterView")}) == [
        "per-axis quantization (axis 1): a view may move or mix the quantization axis"
    ]


def test_propagate_views_refuses_maxpool_on_int16():
    proto = views_model(pool_storage=np.uint16)
    model = load(proto)
    result = PassManager([PropagateViews()], verify=True).run(model)
    assert {r.reason for r in result.why_not("MoveDequantizeAfterView")} == {
        "MaxPool takes int8/uint8 storage, not u16"
    }


def test_propagate_views_refuses_maxpool_with_indices_in_use():
    proto = views_model()
    proto.graph.node[2].output.append("ind")
    proto.graph.output.append(out_info("ind", 4, TensorProto.INT64))
    model = load(proto)
    result = PassManager([PropagateViews()], verify=True).run(model)
    assert {r.reason for r in result.why_not("MoveDequantizeAfterView")} == {
        "MaxPool's Indices output is used"
    }
    assert {r.reason for r in result.why_not("MoveQuantizeBeforeView")} == {
        "MaxPool's Indices output is used"
    }


def test_propagate_views_refuses_non_constant_parameters():
    proto = views_model()
    s3 = next(i for i in proto.graph.initializer if i.name == "s3")
    proto.graph.initializer.remove(s3)
    proto.graph.input.append(helper.make_tensor_value_info("s3", TensorProto.FLOAT, []))
    model = load(proto)
    result = PassManager([PropagateViews()], verify=True).run(model)
    assert "scale / zero point are not constants" in {
        r.reason for r in result.why_not("MoveDequantizeAfterView")
    }


def split_concat_model(*, concat_scales=(0.031, 0.031), quantize_concat: bool = False) -> onnx.ModelProto:
    """NNCF's C2f / SPPF placement: Split(DQ(q)) -> Relu on one part -> Concat of
    DQ(Q(part)) inputs (one unified type, or not) -> Conv reading the float Concat."""
    rng = np.random.default_rng(4)
    inits = [
        _init("s", np.float32(0.047)),
        _init("z", np.uint8(121)),
        _init("sc0", np.float32(concat_scales[0])),
        _init("sc1", np.float32(concat_scales[1])),
        _init("zc", np.uint8(7)),
        _init("split", np.array([3, 4], np.int64)),
        _init("w", rng.standard_normal((5, 7, 1, 1)).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["f"]),
        helper.make_node("Split", ["f", "split"], ["a", "b"], axis=1, name="split"),
        helper.make_node("Relu", ["a"], ["ar"]),
        helper.make_node("QuantizeLinear", ["ar", "sc0", "zc"], ["aq"]),
        helper.make_node("DequantizeLinear", ["aq", "sc0", "zc"], ["af"]),
        helper.make_node("QuantizeLinear", ["b", "sc1", "zc"], ["bq"]),
        helper.make_node("DequantizeLinear", ["bq", "sc1", "zc"], ["bf"]),
        helper.make_node("Concat", ["af", "bf"], ["cat"], axis=1, name="concat"),
    ]
    if quantize_concat:
        inits.append(_init("sy", np.float32(0.05)))
        nodes += [
            helper.make_node("QuantizeLinear", ["cat", "sy", "zc"], ["catq"]),
            helper.make_node("DequantizeLinear", ["catq", "sy", "zc"], ["catf"]),
            helper.make_node("Conv", ["catf", "w"], ["y"]),
        ]
    else:
        nodes.append(helper.make_node("Conv", ["cat", "w"], ["y"]))
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 7, 3, 5])],
        [out_info("y", 4)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def test_dequantize_moves_below_split_and_concat_bit_exact():
    from quanta.passes.pattern import RewritePass
    from quanta.passes.rules.propagate_views import MoveDequantizeAfterConcat

    proto = split_concat_model()
    model = load(proto)
    concat = RewritePass([MoveDequantizeAfterConcat()])
    concat.produces_stage = Stage.LOWERED  # instruction selection's stage: Concat may read integers
    result = run_passes(model, [PropagateViews(), concat, EliminateDead()])
    assert result.fired("MoveDequantizeAfterSplit") == 1
    assert result.fired("MoveDequantizeAfterConcat") == 1
    text = format_graph(model.graph)
    # the Split and the Concat now run on the integers; the Conv reads one DequantizeLinear
    assert "Q(u8:f32, 0.047, 121)> = Split(%q" in text.replace("\n", " ") or "= Split(%q" in text
    conv = next(n for n in model.graph.nodes if n.op_type == "Conv")
    assert conv.input(0).producer.op_type == "DequantizeLinear"
    assert conv.input(0).producer.input(0).producer.op_type == "Concat"
    verify(model.graph, Stage.LOWERED)
    x = rng_data((2, 7, 3, 5), 8, -4, 4)
    want, got = run_ref(proto, {"x": x})[0], run_ref(model, {"x": x})[0]
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_concat_of_different_types_and_requantized_concat_stay():
    from quanta.passes.pattern import RewritePass
    from quanta.passes.rules.propagate_views import MoveDequantizeAfterConcat

    for proto, reason in (
        (
            split_concat_model(concat_scales=(0.031, 0.029)),
            ["the inputs are quantized with different parameters"],
        ),
        (split_concat_model(quantize_concat=True), []),  # LowerConcat's: refused as a pattern
    ):
        model = load(proto)
        concat = RewritePass([MoveDequantizeAfterConcat()])
        concat.produces_stage = Stage.LOWERED
        result = run_passes(model, [PropagateViews(), concat])
        assert result.fired("MoveDequantizeAfterSplit") == 1
        assert result.fired("MoveDequantizeAfterConcat") == 0
        assert [r.reason for r in concat.why_not("MoveDequantizeAfterConcat")] == reason
        assert model.graph.op_counts()["Concat"] == 1
