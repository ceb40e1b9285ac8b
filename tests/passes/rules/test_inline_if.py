"""inline_if: an If whose condition is a constant becomes the nodes of its chosen branch.

Failure signature guarded against: the inlined branch reads the wrong outer value, its
initializers or a nested If lose their binding, or the wrong branch is taken."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load, to_proto
from quanta.ir.verify import Stage, verify
from quanta.passes.rules.inline_if import InlineIf
from tests.passes.helpers import run_passes, run_ref

F = TensorProto.FLOAT


def constant_if_model(cond: bool, cond_is_input: bool = False) -> onnx.ModelProto:
    """y = If(c) {then: Mul(Relu(x), w_then) then a nested If on flag; else: Neg(x)}."""
    inner_then = helper.make_graph(
        [helper.make_node("Add", ["r", "x"], ["it_out"])],
        "inner_then",
        [],
        [helper.make_tensor_value_info("it_out", F, [3, 5])],
    )
    inner_else = helper.make_graph(
        [helper.make_node("Sub", ["r", "x"], ["ie_out"])],
        "inner_else",
        [],
        [helper.make_tensor_value_info("ie_out", F, [3, 5])],
    )
    then_g = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["t0"], name="relu"),
            helper.make_node("Mul", ["t0", "w_then"], ["r"], name="mul"),
            helper.make_node(
                "If", ["flag"], ["t_out"], name="inner", then_branch=inner_then, else_branch=inner_else
            ),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("t_out", F, [3, 5])],
        [numpy_helper.from_array(np.linspace(-1, 2, 5, dtype=np.float32), "w_then")],
        value_info=[
            helper.make_tensor_value_info("t0", F, [3, 5]),
            helper.make_tensor_value_info("r", F, [3, 5]),
        ],
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e_out"])],
        "else",
        [],
        [helper.make_tensor_value_info("e_out", F, [3, 5])],
    )
    inputs = [
        helper.make_tensor_value_info("x", F, [3, 5]),
        helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
    ]
    inits = []
    if cond_is_input:
        inputs.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
    else:
        inits.append(numpy_helper.from_array(np.array(cond), "c"))
    nodes = [
        helper.make_node("If", ["c"], ["y0"], name="outer", then_branch=then_g, else_branch=else_g),
        helper.make_node("Abs", ["y0"], ["y"], name="abs"),
    ]
    g = helper.make_graph(
        nodes, "constant_if", inputs, [helper.make_tensor_value_info("y", F, [3, 5])], inits
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(m)
    return m


def _feeds(flag: bool) -> dict[str, np.ndarray]:
    x = (np.arange(15, dtype=np.float32).reshape(3, 5) - 7) * np.float32(0.375)
    return {"x": x, "flag": np.array(flag)}


def test_inline_if_then_branch_with_initializer_and_nested_if():
    proto = constant_if_model(True)
    model = load(proto)
    result = run_passes(model, [InlineIf()])
    assert result.fired("InlineConstantIf") == 1  # 1. fired once (the nested If's flag is an input)
    assert model.graph.op_counts() == {"Relu": 1, "Mul": 1, "If": 1, "Abs": 1}  # 2. structure
    (inner,) = model.graph.find_nodes("If")
    assert inner.outer_names == ("r", "x")
    assert inner.inputs[1].producer.op_type == "Mul" and inner.inputs[2] is model.graph.inputs[0]
    for flag in (True, False):  # 3. numerics: exact (the same ops on the same values)
        np.testing.assert_array_equal(run_ref(model, _feeds(flag))[0], run_ref(proto, _feeds(flag))[0])
    verify(model.graph, Stage.FLOAT)  # 4. verifier
    onnx.checker.check_model(to_proto(model))  # the nested If reads the new names when written


def test_inline_if_else_branch():
    proto = constant_if_model(False)
    model = load(proto)
    result = run_passes(model, [InlineIf()])
    assert result.fired("InlineConstantIf") == 1
    assert model.graph.op_counts() == {"Neg": 1, "Abs": 1}
    np.testing.assert_array_equal(run_ref(model, _feeds(True))[0], run_ref(proto, _feeds(True))[0])
    verify(model.graph, Stage.FLOAT)


def test_inline_if_refuses_a_condition_that_is_not_constant():
    model = load(constant_if_model(True, cond_is_input=True))
    inline = InlineIf()
    result = run_passes(model, [inline])
    assert result.fired("InlineConstantIf") == 0
    reasons = {r.reason for r in inline.why_not("InlineConstantIf")}
    assert "condition 'c' (a graph input) is not a constant" in reasons, reasons
