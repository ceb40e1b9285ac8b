"""remove_noops: Identity, inference Dropout, Reshape to the same shape, identity
Transpose, Cast to the same type, and DequantizeLinear -> QuantizeLinear with identical
parameters (never QuantizeLinear -> DequantizeLinear)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.graph import Graph, Node, Value
from quanta.ir.onnx_io import load
from quanta.ir.printer import format_graph
from quanta.ir.types import F32, I32, QuantType, TensorType
from quanta.ir.verify import Stage, verify
from quanta.passes.manager import PassManager
from quanta.passes.rules.remove_noops import RemoveNoops, resolve_reshape
from tests.passes.helpers import out_info, rng_data, run_passes, run_ref


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def model_of(nodes, x_dims, outputs, inits, opset=21) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes, "noops", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_dims))], outputs, inits
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def float_noops_model() -> onnx.ModelProto:
    """Each no-op between two real ops; the last one feeds the graph output."""
    nodes = [
        helper.make_node("Neg", ["x"], ["a"], name="neg"),
        helper.make_node("Identity", ["a"], ["b"], name="id"),
        helper.make_node("Dropout", ["b", "ratio"], ["c"], name="drop"),
        helper.make_node("Reshape", ["c", "same"], ["d"], name="reshape"),
        helper.make_node("Transpose", ["d"], ["e"], name="tr", perm=[0, 1, 2]),
        helper.make_node("Cast", ["e"], ["f"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Relu", ["f"], ["g"], name="relu"),
        helper.make_node("Identity", ["g"], ["y"], name="id_out"),
    ]
    inits = [_init("ratio", np.float32(0.3)), _init("same", np.array([0, -1, 5], np.int64))]
    return model_of(nodes, (3, 7, 5), [out_info("y", 3)], inits)


def test_remove_noops_float():
    proto = float_noops_model()
    model = load(proto)
    result = run_passes(model, [RemoveNoops()])
    assert {k: result.fired(k) for k in result.records[0].stats} == {
        "RemoveIdentity": 2,
        "RemoveDropout": 1,
        "RemoveReshapeToSameShape": 1,
        "RemoveIdentityTranspose": 1,
        "RemoveCastToSameType": 1,
    }
    assert format_graph(model.graph, show_consts=False) == (
        "graph noops(%x: tensor<3x7x5, f32>) {\n"
        "  %a: tensor<3x7x5, f32> = Neg(%x)  # neg\n"
        "  %y: tensor<3x7x5, f32> = Relu(%a)  # relu\n"
        "  return %y\n"
        "}"
    )
    x = rng_data((3, 7, 5), seed=1)
    np.testing.assert_array_equal(run_ref(proto, {"x": x})[0], run_ref(model, {"x": x})[0])  # exact: no-ops
    verify(model.graph, Stage.FLOAT)


def dq_q_model(storage=np.uint8, s1=0.02, z1=131, s2=0.02, z2=131, also_float=False) -> onnx.ModelProto:
    """x -Q(s1,z1)-> q -DQ(s1,z1)-> f -Q(s2,z2)-> q2 -DQ(s2,z2)-> Relu -> y."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s1", "z1"], ["q"], name="q1"),
        helper.make_node("DequantizeLinear", ["q", "s1", "z1"], ["f"], name="dq1"),
        helper.make_node("QuantizeLinear", ["f", "s2", "z2"], ["q2"], name="q2"),
        helper.make_node("DequantizeLinear", ["q2", "s2", "z2"], ["f2"], name="dq2"),
        helper.make_node("Relu", ["f2"], ["y"], name="relu"),
    ]
    outputs = [out_info("y", 2)]
    if also_float:
        nodes.append(helper.make_node("Neg", ["f"], ["n"], name="neg"))
        outputs.append(out_info("n", 2))
    inits = [
        _init("s1", np.float32(s1)),
        _init("z1", np.asarray(z1, storage)),
        _init("s2", np.float32(s2)),
        _init("z2", np.asarray(z2, storage)),
    ]
    return model_of(nodes, (3, 17), outputs, inits)


@pytest.mark.parametrize(
    ("storage", "scale", "zp"),
    [(np.uint8, 0.02, 131), (np.int8, 0.37, -7), (np.int16, 0.0013, 301), (np.uint16, 3.5e-5, 40000)],
)
def test_remove_dequantize_quantize_identical_parameters(storage, scale, zp):
    # x spans the whole representable range (and beyond, to saturate); that every
    # integer round-trips is checked exhaustively in the next test.
    info = np.iinfo(storage)
    proto = dq_q_model(storage, scale, zp, scale, zp, also_float=True)
    model = load(proto)
    result = run_passes(model, [RemoveNoops()])
    assert result.fired("RemoveDequantizeQuantize") == 1
    assert model.graph.op_counts() == {"DequantizeLinear": 2, "Neg": 1, "QuantizeLinear": 1, "Relu": 1}
    # the DQ stays for its other user (Neg); dq2 now reads q directly
    assert model.graph.find_nodes("DequantizeLinear")[1].inputs[0].name == "q"
    lo, hi = (info.min - zp) * scale, (info.max - zp) * scale
    x = np.linspace(1.1 * lo, 1.1 * hi, 3 * 17, dtype=np.float32).reshape(3, 17)
    for e, a in zip(run_ref(proto, {"x": x}), run_ref(model, {"x": x})):
        np.testing.assert_array_equal(e, a)  # exact: the round trip is the identity
    verify(model.graph, Stage.QDQ)


def test_dq_q_round_trip_is_exact_for_every_u8_and_i16_value():
    # The claim behind the rule, evaluated by the reference kernels on every integer.
    from quanta.kernels.reference.quantize import dequantize_linear, quantize_linear

    for dtype, scale, zp in [
        (np.uint8, 0.02, 131),
        (np.int8, 1e-30, 5),
        (np.int16, 1234.5, -17),
        (np.uint16, 1e-3, 1),
    ]:
        info = np.iinfo(dtype)
        q = np.arange(info.min, info.max + 1).astype(dtype)
        back = quantize_linear(
            dequantize_linear(q, np.float32(scale), dtype(zp)), np.float32(scale), dtype(zp)
        )
        np.testing.assert_array_equal(back, q, err_msg=str(dtype))


def test_quantize_dequantize_pair_is_not_removed():
    # Q -> DQ rounds x to the grid: it is the quantization, not a no-op.
    proto = dq_q_model()
    model = load(proto)
    result = run_passes(model, [RemoveNoops()])
    assert result.fired("RemoveDequantizeQuantize") == 1  # only the DQ -> Q in the middle
    assert model.graph.op_counts() == {"DequantizeLinear": 1, "QuantizeLinear": 1, "Relu": 1}
    x = rng_data((3, 17), seed=3)
    y = run_ref(model, {"x": x})[0]
    assert not np.array_equal(y, np.maximum(x, 0))  # the remaining Q -> DQ still rounds


# -- NoMatch reasons ----------------------------------------------------------------------


def reasons(target, rule: str, verify_input: bool = True) -> list[str]:
    model = load(target) if isinstance(target, onnx.ModelProto) else target
    graph = model if isinstance(model, Graph) else model.graph
    before = format_graph(graph)
    result = PassManager([RemoveNoops()], verify=verify_input).run(model)
    assert format_graph(graph) == before
    return [r.reason for r in result.why_not(rule)]


def test_remove_dq_q_refuses_different_scales():
    assert reasons(dq_q_model(s2=0.03), "RemoveDequantizeQuantize") == [
        "parameters differ: DequantizeLinear reads Q(u8:f32, 0.02, 131), QuantizeLinear writes Q(u8:f32, 0.03, 131)"
    ]


def test_remove_dq_q_refuses_different_zero_points():
    assert reasons(dq_q_model(z2=130), "RemoveDequantizeQuantize") == [
        "parameters differ: DequantizeLinear reads Q(u8:f32, 0.02, 131), QuantizeLinear writes Q(u8:f32, 0.02, 130)"
    ]


def test_remove_dq_q_refuses_non_constant_parameters():
    proto = dq_q_model()
    s2 = next(i for i in proto.graph.initializer if i.name == "s2")
    proto.graph.initializer.remove(s2)
    proto.graph.input.append(helper.make_tensor_value_info("s2", TensorProto.FLOAT, []))
    assert reasons(proto, "RemoveDequantizeQuantize") == ["scale / zero point are not constants"]


def test_remove_dq_q_refuses_a_subnormal_scale():
    # Hazard: d·s underflows to a subnormal float32 and loses bits; the round trip fails
    proto = dq_q_model(np.int8, 1e-40, 0, 1e-40, 0)
    model = load(proto)
    assert reasons(model, "RemoveDequantizeQuantize") == [
        "DequantizeLinear -> QuantizeLinear may not round-trip: scale 9.99994610111476e-41 is subnormal or too large "
        "for exact round trips"
    ]


def test_remove_dq_q_refuses_32_bit_storage():
    # Hazard: int32 values beyond 2^24 are not exact in float32 (built in the IR: the
    # opset-21 QuantizeLinear has no int32 output)
    g = Graph()
    x = g.add_input("x", TensorType(F32, (3,)))
    s = g.add_initializer("s", np.float32(0.5))
    z = g.add_initializer("z", np.int32(0))
    qt = QuantType(I32, F32, 0.5, 0)
    q = Value("q", TensorType(qt, (3,)))
    f = Value("f", TensorType(F32, (3,)))
    q2 = Value("q2", TensorType(qt, (3,)))
    y = Value("y", TensorType(F32, (3,)))
    g.add_node(Node("QuantizeLinear", [x, s, z], [q], name="q1"))
    g.add_node(Node("DequantizeLinear", [q, s, z], [f], name="dq1"))
    g.add_node(Node("QuantizeLinear", [f, s, z], [q2], name="q2"))
    g.add_node(Node("DequantizeLinear", [q2, s, z], [y], name="dq2"))
    g.set_outputs([y])
    assert reasons(g, "RemoveDequantizeQuantize") == [
        "DequantizeLinear -> QuantizeLinear may not round-trip: storage i32 is wider than 16 bits "
        "(float32 cannot hold every value exactly)"
    ]


def one_op(op, ins, inits, x_dims=(3, 7, 5), out_rank=3, opset=21, **attrs) -> onnx.ModelProto:
    return model_of(
        [
            helper.make_node(op, ins, ["y0"], name="n", **attrs),
            helper.make_node("Relu", ["y0"], ["y"], name="r"),
        ],
        x_dims,
        [out_info("y", out_rank)],
        inits,
        opset,
    )


def test_remove_reshape_refuses_another_shape():
    proto = one_op("Reshape", ["x", "s"], [_init("s", np.array([7, 3, 5], np.int64))])
    assert reasons(proto, "RemoveReshapeToSameShape") == [
        "target shape [7, 3, 5] differs from the input shape [3, 7, 5]"
    ]


def test_remove_reshape_refuses_non_constant_target():
    proto = one_op("Reshape", ["x", "s"], [])
    proto.graph.input.append(helper.make_tensor_value_info("s", TensorProto.INT64, [3]))
    assert reasons(proto, "RemoveReshapeToSameShape") == [
        "target shape 's' (a graph input) is not a constant"
    ]


def test_remove_reshape_refuses_unknown_dimensions():
    proto = one_op("Reshape", ["x", "s"], [_init("s", np.array([0, 7, 5], np.int64))], x_dims=[None, 7, 5])
    assert reasons(proto, "RemoveReshapeToSameShape") == [
        "'x' (a graph input) has unknown dimensions ['?', 7, 5]"
    ]


def test_remove_reshape_keeps_a_symbolic_batch_copied_by_zero():
    proto = one_op("Reshape", ["x", "s"], [_init("s", np.array([0, 7, -1], np.int64))], x_dims=["N", 7, 5])
    model = load(proto)
    assert run_passes(model, [RemoveNoops()]).fired("RemoveReshapeToSameShape") == 1


def test_remove_reshape_refuses_unknown_rank():
    model = load(one_op("Reshape", ["x", "s"], [_init("s", np.array([3, 7, 5], np.int64))]))
    model.graph.inputs[0].type = TensorType(F32, None)
    assert reasons(model, "RemoveReshapeToSameShape") == ["'x' (a graph input) has an unknown rank"]


def test_resolve_reshape_cases():
    assert resolve_reshape([0, -1], ("N", 3, 5), False) == ["N", 15]
    assert resolve_reshape([-1, 3, 5], ("N", 3, 5), False) == ["N", 3, 5]
    assert resolve_reshape([-1, 5], ("N", 3, 5), False) is None  # N·3 unknown
    assert resolve_reshape([0, 3], (0, 3), True) == [0, 3]
    assert resolve_reshape([-1, -1], (2, 3), False) is None


def test_remove_transpose_refuses_a_permutation():
    proto = one_op("Transpose", ["x"], [], perm=[0, 2, 1])
    assert reasons(proto, "RemoveIdentityTranspose") == ["perm [0, 2, 1] moves axes"]


def test_remove_transpose_refuses_default_perm_on_rank_3():
    proto = one_op("Transpose", ["x"], [])
    assert reasons(proto, "RemoveIdentityTranspose") == ["Transpose without perm reverses the axes"]


def test_remove_cast_refuses_a_real_cast():
    proto = one_op("Cast", ["x"], [], to=TensorProto.FLOAT16)
    proto.graph.node[1].op_type = "Neg"
    proto.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    assert reasons(proto, "RemoveCastToSameType") == ["Cast changes the element type f32 to ONNX type 10"]


def test_remove_cast_refuses_untyped_input():
    model = load(one_op("Cast", ["x"], [], to=TensorProto.FLOAT))
    model.graph.inputs[0].type = None
    assert reasons(model, "RemoveCastToSameType") == ["'x' (a graph input) has no plain element type"]


def test_remove_dropout_refuses_training_mode():
    proto = one_op(
        "Dropout", ["x", "ratio", "train"], [_init("ratio", np.float32(0.5)), _init("train", np.array(True))]
    )
    assert reasons(proto, "RemoveDropout") == ["Dropout is in training mode"]


def test_remove_dropout_refuses_non_constant_training_mode():
    proto = one_op("Dropout", ["x", "ratio", "train"], [_init("ratio", np.float32(0.5))])
    proto.graph.input.append(helper.make_tensor_value_info("train", TensorProto.BOOL, []))
    assert reasons(proto, "RemoveDropout") == ["training_mode 'train' (a graph input) is not a constant"]


def test_remove_dropout_refuses_used_mask():
    proto = one_op("Dropout", ["x"], [])
    proto.graph.node[0].output.append("mask")
    proto.graph.output.append(out_info("mask", 3, TensorProto.BOOL))
    assert reasons(proto, "RemoveDropout") == ["Dropout's mask output is used"]


def test_remove_identity_refuses_to_rename_a_graph_input():
    # y = Identity(x) with x a graph input: the output would lose its name
    proto = model_of(
        [helper.make_node("Identity", ["x"], ["y"], name="id")], (3, 7, 5), [out_info("y", 3)], []
    )
    assert reasons(proto, "RemoveIdentity") == [
        "graph output 'y' would become 'x' (a graph input) and lose its name"
    ]


def test_remove_identity_refuses_to_merge_two_graph_outputs():
    nodes = [
        helper.make_node("Neg", ["x"], ["a"], name="neg"),
        helper.make_node("Identity", ["a"], ["y"], name="id"),
    ]
    proto = model_of(nodes, (3, 7, 5), [out_info("a", 3), out_info("y", 3)], [])
    assert reasons(proto, "RemoveIdentity") == [
        "graph output 'y' would become 'a', which is already a graph output"
    ]


def test_remove_identity_refuses_to_rename_a_constant():
    proto = model_of(
        [helper.make_node("Identity", ["c"], ["y"], name="id")],
        (1,),
        [out_info("y", 1)],
        [_init("c", np.ones(2, np.float32))],
    )
    assert reasons(proto, "RemoveIdentity") == [
        "graph output 'y' would become 'c' (a constant) and lose its name"
    ]
