"""The pass manager: order, requires/ensures, the verifier after every pass with errors
naming the pass and step, timing, dump_after, stage inference."""

from __future__ import annotations

import io

import numpy as np
import pytest

from quanta.ir.graph import Graph, Node, Value, result_type
from quanta.ir.op_rules import Stage
from quanta.ir.types import F32, I8, U8, QuantType, TensorType
from quanta.passes.manager import (
    Pass,
    PassError,
    PassManager,
    PassResult,
    PreconditionError,
    infer_stage,
    set_verify_default,
    verify_default,
)

Q02 = QuantType(I8, F32, 0.02, 3)
Q08 = QuantType(I8, F32, 0.08, -5)


def lowered_graph() -> Graph:
    """x: Q(0.02) -> Sigmoid -> y: Q(0.08) (a lowered-stage graph)."""
    g = Graph()
    x = g.add_input("x", TensorType(Q02, (3, 7)))
    y = Value("y", TensorType(Q08, (3, 7)))
    g.add_node(Node("Sigmoid", [x], [y], name="sig"))
    g.set_outputs([y])
    return g


class Record(Pass):
    """Appends its name to a shared list."""

    def __init__(self, log: list[str], tag: str):
        self.log, self.tag = log, tag

    def call(self, graph: Graph) -> PassResult:
        self.log.append(self.tag)
        return PassResult(graph, False)


class RetypeWithInputType(Pass):
    """The provenance bug: rebuilds the output typed from the input."""

    name = "retype_with_input_type"

    def call(self, graph: Graph) -> PassResult:
        node = graph.nodes[0]
        node.outputs[0].type = result_type(shape_from=node.inputs[0], elem_from=node.inputs[0])
        return PassResult(graph, True)


def test_manager_runs_the_list_in_order_and_records_timings():
    log: list[str] = []
    passes = [Record(log, "a"), Record(log, "b"), Record(log, "c")]
    result = PassManager(passes, verify=True).run(lowered_graph())
    assert log == ["a", "b", "c"]
    assert [(r.step, r.name, r.modified) for r in result.records] == [
        (1, "record", False),
        (2, "record", False),
        (3, "record", False),
    ]
    assert all(r.seconds >= 0 and r.verify_seconds >= 0 for r in result.records)
    lines = result.format_timings().splitlines()
    assert lines[0].split() == ["step", "pass", "ms", "verify", "ms", "changed"] and len(lines) == 4


def test_pass_name_defaults_to_snake_case():
    assert RetypeWithInputType.name == "retype_with_input_type"

    class FoldSomethingBig(Pass):
        def call(self, graph):
            return PassResult(graph, False)

    assert FoldSomethingBig.name == "fold_something_big"


def test_verifier_failure_names_the_pass_and_step():
    log: list[str] = []
    with pytest.raises(PassError) as e:
        PassManager(
            [Record(log, "a"), RetypeWithInputType(), Record(log, "c")], verify=True, stage=Stage.LOWERED
        ).run(lowered_graph())
    assert str(e.value) == (
        "step 2/3 'retype_with_input_type': the graph does not verify in the lowered stage after this pass: "
        "graph output 'y' has type Q(i8:f32, 0.02, 3) but the graph's signature promises Q(i8:f32, 0.08, -5)"
    )
    assert e.value.pass_name == "retype_with_input_type" and e.value.step == 2
    assert log == ["a"]  # nothing after the failing step ran


def test_without_verification_the_broken_graph_passes_silently():
    # the reason the verifier is on in tests: the same bug goes unnoticed otherwise
    g = lowered_graph()
    PassManager([RetypeWithInputType()], verify=False).run(g)
    assert g.outputs[0].type.elem == Q02


def test_exceptions_in_call_are_wrapped_with_the_pass_name():
    class Boom(Pass):
        def call(self, graph):
            raise KeyError("missing thing")

    with pytest.raises(PassError) as e:
        PassManager([Boom()], verify=False).run(lowered_graph())
    assert str(e.value) == "step 1/1 'boom': KeyError: 'missing thing'"
    assert isinstance(e.value.__cause__, KeyError)


def test_requires_failure_is_wrapped():
    class NeedsFloat(Pass):
        def requires(self, graph):
            if infer_stage(graph) is not Stage.FLOAT:
                raise PreconditionError("expects a float graph")

        def call(self, graph):
            return PassResult(graph, False)

    with pytest.raises(PassError) as e:
        PassManager([NeedsFloat()]).run(lowered_graph())
    assert str(e.value) == "step 1/1 'needs_float': PreconditionError: expects a float graph"


def test_a_broken_input_graph_is_not_blamed_on_the_first_pass():
    g = lowered_graph()
    g.outputs[0].type = TensorType(Q02, (3, 7))  # breaks the signature before any pass
    with pytest.raises(PassError) as e:
        PassManager([Record([], "a")], verify=True).run(g)
    assert str(e.value).startswith(
        "input graph (before step 1/1) does not verify in the lowered stage: graph output 'y'"
    )


def test_dump_after_prints_the_ir_after_the_named_pass():
    out = io.StringIO()
    PassManager(
        [Record([], "a"), RetypeWithInputType()], verify=False, dump_after={"record"}, dump_to=out
    ).run(lowered_graph())
    assert out.getvalue() == (
        "// IR after step 1/2 'record'\n"
        "graph main(%x: tensor<3x7, Q(i8:f32, 0.02, 3)>) {\n"
        "  %y: tensor<3x7, Q(i8:f32, 0.08, -5)> = Sigmoid(%x)  # sig\n"
        "  return %y\n"
        "}\n"
    )
    out = io.StringIO()
    PassManager([Record([], "a"), RetypeWithInputType()], verify=False, dump_after={"*"}, dump_to=out).run(
        lowered_graph()
    )
    assert out.getvalue().count("// IR after") == 2


def test_dump_after_an_unknown_pass_lists_the_pipeline():
    with pytest.raises(ValueError) as e:
        PassManager([Record([], "a")], dump_after={"fold_bn"})
    assert str(e.value) == "dump_after names unknown passes ['fold_bn']; the pipeline runs: ['record']"


def test_pipeline_entries_must_be_pass_instances():
    with pytest.raises(TypeError):
        PassManager([Record])  # the class, not an instance


def test_verify_default_flag_is_on_in_tests_and_used_when_verify_is_none():
    assert verify_default()  # tests/conftest.py turns it on
    with pytest.raises(PassError):
        PassManager([RetypeWithInputType()], stage=Stage.LOWERED).run(lowered_graph())
    set_verify_default(False)
    try:
        PassManager([RetypeWithInputType()], stage=Stage.LOWERED).run(lowered_graph())
    finally:
        set_verify_default(True)


def test_produces_stage_switches_the_verifier_stage():
    class Quantizes(Pass):
        produces_stage = Stage.LOWERED

        def call(self, graph):
            graph.nodes[0].outputs[0].type = TensorType(QuantType(U8, F32, 0.1, 7), (3,))
            graph.output_signature = [v.type for v in graph.outputs]
            return PassResult(graph, True)

    g = Graph()
    x = g.add_input("x", TensorType(F32, (3,)))
    y = Value("y", TensorType(F32, (3,)))
    g.add_node(Node("Sigmoid", [x], [y], name="sig"))
    g.set_outputs([y])
    assert infer_stage(g) is Stage.FLOAT
    PassManager([Quantizes()], verify=True).run(g)  # verified as LOWERED, not FLOAT


def test_infer_stage():
    from quanta.ir.onnx_io import load
    from tests.ir.models import qdq_conv, qoperator

    assert infer_stage(load(qdq_conv()).graph) is Stage.QDQ
    assert infer_stage(load(qoperator()).graph) is Stage.LOWERED
    assert infer_stage(lowered_graph()) is Stage.LOWERED
    g = Graph()
    g.add_input("x", TensorType(F32, (3,)))
    assert infer_stage(g) is Stage.FLOAT
    g.add_initializer("w", np.zeros(3, np.int8), TensorType(Q02, (3,)))
    assert infer_stage(g) is Stage.QDQ
