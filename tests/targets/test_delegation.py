"""Ops without a NumPy twin fall back to onnx.reference (listed in
DELEGATED_AT_RUNTIME); control flow cannot, and says so naming the node."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper

import quanta
from quanta.kernels.reference.registry import DELEGATED_AT_RUNTIME, OPS, get_op
from quanta.targets.base import TargetError
from tests.onnx_node import cases_for, run_case

DELEGATED = {"LSTM", "GRU", "RNN", "NonMaxSuppression", "RoiAlign", "GridSample", "Det", "Unique"}


def _two_per_op():
    seen: dict[str, int] = {}
    out = []
    for c in cases_for(DELEGATED):
        op = c.model.graph.node[0].op_type
        if seen.get(op, 0) < 2:
            seen[op] = seen.get(op, 0) + 1
            out.append(c)
    return out


@pytest.mark.parametrize("case", _two_per_op(), ids=lambda c: c.name)
def test_delegated_op_node_tests(case):
    assert ("", case.model.graph.node[0].op_type) not in OPS  # really delegated
    run_case(case)
    assert ("", case.model.graph.node[0].op_type) in DELEGATED_AT_RUNTIME


def test_control_flow_is_not_delegated_and_the_error_names_the_node():
    assert get_op("If") is None
    then = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["t"])], "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])]
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])], "else", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])]
    )
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=other)],
        "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []), helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(TargetError, match=r"node 'branch' \(If\): operator ai.onnx::If has no reference implementation"):
        quanta.InferenceSession(m, backend="reference")
