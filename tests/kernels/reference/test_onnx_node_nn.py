"""ONNX backend node tests for the float neural-network reference ops (nn*.py).

Every node-test case whose graph uses only the ops in ``OPS`` runs through
``quanta.InferenceSession(..., backend="reference")`` (``run_case``: integer outputs
exact, float outputs at the tolerance the case declares). Cases the reference does not
support are listed in ``XFAIL`` with the unsupported feature named; they are strict, so a
case that starts passing must be removed from the list.
"""

from __future__ import annotations

import pytest

from tests.onnx_node import cases_for, run_case

OPS = frozenset(
    """
    Conv ConvTranspose Col2Im Gemm MatMul Einsum
    MaxPool AveragePool GlobalAveragePool GlobalMaxPool LpPool
    BatchNormalization LayerNormalization GroupNormalization InstanceNormalization LRN
    Softmax LogSoftmax Hardmax Resize Pad DepthToSpace SpaceToDepth Dropout
    Relu LeakyRelu PRelu Elu Selu Celu Sigmoid HardSigmoid HardSwish Softplus Softsign
    Tanh Gelu Erf Mish ThresholdedRelu Clip Swish
    """.split()
)

# case name -> the unsupported feature
XFAIL: dict[str, str] = {}

CASES = [
    pytest.param(
        case,
        id=case.name,
        marks=[pytest.mark.xfail(reason=XFAIL[case.name], strict=True)] if case.name in XFAIL else [],
    )
    for case in cases_for(OPS)
]


def test_xfail_names_are_node_tests() -> None:
    # A renamed or removed ONNX case must not leave a stale entry behind.
    assert set(XFAIL) <= {p.id for p in CASES}


@pytest.mark.parametrize("case", CASES)
def test_onnx_node_nn(case) -> None:
    run_case(case)
