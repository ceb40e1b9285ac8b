"""Verifier rules, Incorrect / Correct, each asserting the exact message."""

from __future__ import annotations

import numpy as np
import pytest

from quanta.ir.graph import Graph, Node, Value, result_type
from quanta.ir.types import F32, I8, U8, QuantType, TensorType
from quanta.ir.verify import Stage, VerifyError, check, verify

SHAPE = (2, 6, 5, 3)  # every dimension different


def q(scale: float, zp: int = 0, storage=I8) -> QuantType:
    return QuantType(storage, F32, scale, zp)


def const(g: Graph, name: str, arr) -> Value:
    return g.add_initializer(name, np.asarray(arr))


def groupnorm_graph(in_scale: float, out_scale: float) -> tuple[Graph, Node]:
    """x: Q(in) -> GroupNormalization -> y: Q(out), y a graph output (lowered stage)."""
    g = Graph()
    x = g.add_input("x", TensorType(q(in_scale, 3), SHAPE))
    gamma = const(g, "gamma", np.array([1.0, 0.5, 2.0], np.float32))
    beta = const(g, "beta", np.array([0.0, 0.1, -0.2], np.float32))
    y = Value("y", TensorType(q(out_scale, -5), SHAPE))
    node = g.add_node(Node("GroupNormalization", [x, gamma, beta], [y], {"num_groups": 3}, name="gn"))
    g.set_outputs([y])
    return g, node


def test_verify_rejects_rewrite_that_copies_the_input_type_onto_groupnorm():
    # Failure signature: a fold (Reshape -> InstanceNorm -> Reshape => GroupNorm) built the
    # result type from its input (scale 0.02) instead of the replaced output (0.08).
    g, node = groupnorm_graph(0.02, 0.08)
    verify(g, Stage.LOWERED)
    node.outputs[0].type = result_type(shape_from=node.inputs[0], elem_from=node.inputs[0])  # the bug
    with pytest.raises(VerifyError) as e:
        verify(g, Stage.LOWERED)
    assert str(e.value) == (
        "graph output 'y' has type Q(i8:f32, 0.02, 3) but the graph's signature promises Q(i8:f32, 0.08, -5)"
    )


def test_verify_accepts_groupnorm_typed_from_the_replaced_output_when_only_input_scale_changes():
    # Converse: the input's scale changes (0.02 -> 0.05); the output keeps 0.08 and verifies.
    g, node = groupnorm_graph(0.02, 0.08)
    replaced = node.outputs[0]
    node.inputs[0].type = TensorType(q(0.05, 3), SHAPE)
    node.outputs[0].type = result_type(shape_from=node.inputs[0], elem_from=replaced)
    assert node.outputs[0].type.elem == q(0.08, -5)
    verify(g, Stage.LOWERED)


def test_verify_rejects_a_wrong_type_on_an_inner_value_through_its_dequantize():
    # The provenance bug on a value that is not a graph output: its DequantizeLinear says 0.08.
    g = Graph()
    x = g.add_input("x", TensorType(q(0.02, 3), SHAPE))
    gamma = const(g, "gamma", np.ones(3, np.float32))
    beta = const(g, "beta", np.zeros(3, np.float32))
    y = Value("y", TensorType(q(0.02, 3), SHAPE))  # copied from x: wrong
    g.add_node(Node("GroupNormalization", [x, gamma, beta], [y], {"num_groups": 3}, name="gn"))
    s, z = const(g, "s", np.float32(0.08)), const(g, "z", np.int8(-5))
    out = Value("out", TensorType(F32, SHAPE))
    g.add_node(Node("DequantizeLinear", [y, s, z], [out], name="dq"))
    g.set_outputs([out])
    with pytest.raises(VerifyError) as e:
        verify(g, Stage.LOWERED)
    assert str(e.value) == (
        "DequantizeLinear 'dq' (DequantizeLinear): input 'y' has type Q(i8:f32, 0.02, 3) "
        "but its scale/zero point inputs give Q(i8:f32, 0.08, -5)"
    )


def qdq_chain(q_type: QuantType, view_type: QuantType) -> Graph:
    g = Graph()
    x = g.add_input("x", TensorType(F32, (3, 7)))
    s, z = const(g, "s", np.float32(0.02)), const(g, "z", np.uint8(128))
    qv = Value("q", TensorType(q_type, (3, 7)))
    g.add_node(Node("QuantizeLinear", [x, s, z], [qv], name="quant"))
    shape = const(g, "shape", np.array([7, 3], np.int64))
    r = Value("r", TensorType(view_type, (7, 3)))
    g.add_node(Node("Reshape", [qv, shape], [r], name="view"))
    out = Value("out", TensorType(F32, (7, 3)))
    g.add_node(Node("DequantizeLinear", [r, s, z], [out], name="deq"))
    g.set_outputs([out])
    return g


def test_verify_quantize_output_must_match_its_parameters():
    good = q(0.02, 128, U8)
    verify(qdq_chain(good, good), Stage.QDQ)  # Correct
    bad = q(0.08, 128, U8)
    errors = check(qdq_chain(bad, bad), Stage.QDQ)  # Incorrect
    assert errors[0] == (
        "QuantizeLinear 'quant' (QuantizeLinear): output 'q' has type Q(u8:f32, 0.08, 128) "
        "but its scale/zero point inputs give Q(u8:f32, 0.02, 128)"
    )


def test_verify_view_keeps_its_input_type():
    errors = check(qdq_chain(q(0.02, 128, U8), q(0.08, 128, U8)), Stage.QDQ)
    assert errors[0] == (
        "Reshape 'view' (Reshape): output 'r' has type Q(u8:f32, 0.08, 128) "
        "but a view keeps its input's type Q(u8:f32, 0.02, 128)"
    )


def test_verify_stage_rules_reject_quantization_ops_in_float_stage():
    g = qdq_chain(q(0.02, 128, U8), q(0.02, 128, U8))
    errors = check(g, Stage.FLOAT)
    assert errors[0] == "QuantizeLinear 'quant' (QuantizeLinear): not allowed in the float stage"


def test_verify_qdq_stage_rejects_compute_on_quantized_values():
    g = Graph()
    x = g.add_input("x", TensorType(q(0.02, 128, U8), (3, 7)))
    y = Value("y", TensorType(F32, (3, 7)))
    g.add_node(Node("Relu", [x], [y], name="act"))
    g.set_outputs([y])
    assert check(g, Stage.QDQ) == [
        "Relu 'act' (Relu): input 0 'x' is quantized (Q(u8:f32, 0.02, 128)); in the qdq stage only "
        "DequantizeLinear and views consume quantized values"
    ]
    verify(g, Stage.LOWERED)  # Correct once lowered: an integer kernel may take it


def test_verify_structure_use_before_definition():
    g = Graph()
    x = g.add_input("x", TensorType(F32, (3,)))
    a, b = Value("a", TensorType(F32, (3,))), Value("b", TensorType(F32, (3,)))
    g.add_node(Node("Relu", [a], [b], name="second"))
    g.add_node(Node("Neg", [x], [a], name="first"))
    g.set_outputs([b])
    assert check(g, Stage.FLOAT)[0] == "Relu 'second' (Relu): input 0 'a' is used before it is produced"
    g.toposort()
    verify(g, Stage.FLOAT)


def test_verify_structure_undefined_value_and_output():
    g = Graph()
    ghost = Value("ghost", TensorType(F32, (3,)))
    y = Value("y", TensorType(F32, (3,)))
    g.add_node(Node("Relu", [ghost], [y], name="r"))
    z = Value("z", TensorType(F32, (3,)))
    g.set_outputs([y, z])
    assert check(g, Stage.FLOAT) == [
        "Relu 'r' (Relu): input 0 'ghost' is not defined",
        "graph output 'z' is not produced by any node",
    ]


def test_result_type_requires_naming_both_sources():
    x = Value("x", TensorType(q(0.02), (2, 3)))
    y = Value("y", TensorType(q(0.08), (2, 3)))
    with pytest.raises(TypeError):
        result_type(x)  # type: ignore[misc]  # no positional "like" shortcut
    assert result_type(shape_from=x, elem_from=y) == TensorType(q(0.08), (2, 3))
