"""Ops without a NumPy twin fall back to onnx.reference (listed in
DELEGATED_AT_RUNTIME); control flow, whose subgraphs read the enclosing scope, runs
through its own kernel (kernels/reference/control_flow.py), which is given those values."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import quanta
from quanta.kernels.reference.registry import DELEGATED_AT_RUNTIME, OPS, get_op
from tests.onnx_node import cases_for, run_case

DELEGATED = {"RNN", "NonMaxSuppression", "RoiAlign", "GridSample", "Det", "Unique"}


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


def test_control_flow_is_not_delegated_and_its_branches_see_the_outer_scope():
    assert get_op("If") is OPS[("", "If")]
    then = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])],
    )
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=other)],
        "g",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = quanta.InferenceSession(m, backend="reference")
    x = np.array([1.5, -2.0], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"c": np.array(True), "x": x})[0], x)
    np.testing.assert_array_equal(sess.run(None, {"c": np.array(False), "x": x})[0], -x)
    assert ("", "If") not in DELEGATED_AT_RUNTIME
