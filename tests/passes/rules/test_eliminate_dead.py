"""eliminate_dead: nodes no output of which is used, and unused initializers."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.graph import Graph, Node, Value
from quanta.ir.onnx_io import load
from quanta.ir.types import F32, TensorType
from quanta.ir.verify import Stage, verify
from quanta.passes.manager import PassError, PassManager, PostconditionError
from quanta.passes.rules.eliminate_dead import EliminateDead
from tests.passes.helpers import out_info, rng_data, run_passes, run_ref


def test_eliminate_dead_chain_and_initializers():
    nodes = [
        helper.make_node("Neg", ["x"], ["a"], name="dead1"),
        helper.make_node("Mul", ["a", "w"], ["b"], name="dead2"),  # reads the only use of w
        helper.make_node("Split", ["x"], ["s0", "s1"], name="split", axis=1, num_outputs=2),
        helper.make_node("Relu", ["s0"], ["y"], name="relu"),  # s1 unused: Split stays
    ]
    g = helper.make_graph(
        nodes,
        "dce",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6])],
        [out_info("y", 2)],
        [
            numpy_helper.from_array(np.ones((3, 6), np.float32), "w"),
            numpy_helper.from_array(np.ones(2, np.float32), "unused"),
        ],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model = load(proto)
    result = run_passes(model, [EliminateDead()])
    assert result.records[0].stats == {"nodes": 2, "initializers": 2}
    assert model.graph.op_counts() == {"Relu": 1, "Split": 1}
    assert model.graph.initializers == {}
    x = rng_data((3, 6), seed=0)
    np.testing.assert_array_equal(run_ref(proto, {"x": x})[0], run_ref(model, {"x": x})[0])
    verify(model.graph, Stage.FLOAT)


def test_eliminate_dead_keeps_graph_outputs_and_is_idempotent():
    g = Graph()
    x = g.add_input("x", TensorType(F32, (3,)))
    a, y = Value("a", TensorType(F32, (3,))), Value("y", TensorType(F32, (3,)))
    g.add_node(Node("Neg", [x], [a], name="neg"))  # a is an output, read by nobody
    g.add_node(Node("Relu", [x], [y], name="relu"))
    g.set_outputs([a, y])
    assert not run_passes(g, [EliminateDead()]).modified
    assert len(g.nodes) == 2


def test_eliminate_dead_postcondition_names_the_dead_node():
    class Broken(EliminateDead):
        name = "broken_dce"

        def call(self, graph):  # removes nothing
            from quanta.passes.manager import PassResult

            return PassResult(graph, False)

    g = Graph()
    x = g.add_input("x", TensorType(F32, (3,)))
    a, y = Value("a", TensorType(F32, (3,))), Value("y", TensorType(F32, (3,)))
    g.add_node(Node("Neg", [x], [a], name="neg"))
    g.add_node(Node("Relu", [x], [y], name="relu"))
    g.set_outputs([y])
    with pytest.raises(PassError) as e:
        PassManager([Broken()], verify=True).run(g)
    assert str(e.value) == (
        "step 1/1 'broken_dce': PostconditionError: 'neg' (Neg) is still dead after dead-code elimination"
    )
    assert isinstance(e.value.__cause__, PostconditionError)
