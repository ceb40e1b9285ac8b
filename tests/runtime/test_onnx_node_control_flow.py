"""ONNX backend node tests of the control-flow operators (If, Loop, Scan, SequenceMap),
through quanta's compiled bodies (quanta.runtime.control_flow), and of the values that
are not tensors (sequences, optionals), on both targets.

Every node-test case whose top-level graph holds one of these nodes, or has an input or
output of a sequence or optional type, runs (``run_case``: integer outputs exact, float
outputs at the tolerance the case declares): Scan-8's batch axis and sequence lengths,
Loops that carry sequences and optionals, SequenceMap over sequences and tensors, an
Identity of a sequence, an empty optional fed as None.
"""

from __future__ import annotations

import pytest

from tests import onnx_node
from tests.onnx_node import run_case

CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def _not_tensor(case) -> bool:
    g = case.model.graph
    return any(v.type.WhichOneof("value") != "tensor_type" for v in (*g.input, *g.output))


CASES = [
    pytest.param(case, id=case.name)
    for case in onnx_node._all_cases()
    if any(n.op_type in CONTROL_FLOW for n in case.model.graph.node) or _not_tensor(case)
]


def test_cases_cover_every_control_flow_op() -> None:
    ops = {n.op_type for p in CASES for n in p.values[0].model.graph.node}
    assert CONTROL_FLOW <= ops
    ids = {p.id for p in CASES}
    assert {
        "test_scan_sum",
        "test_identity_sequence",
        "test_optional_has_element_empty_optional_input",
    } <= ids


@pytest.mark.parametrize("backend", ["reference", "native"])
@pytest.mark.parametrize("case", CASES)
def test_onnx_node_control_flow(case, backend, monkeypatch) -> None:
    import quanta

    def run(model, feeds):
        return quanta.InferenceSession(model.SerializeToString(), backend=backend).run(None, feeds)

    monkeypatch.setattr(onnx_node, "_run", run)
    run_case(case)
