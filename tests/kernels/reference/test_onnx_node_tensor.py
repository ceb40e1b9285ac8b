"""ONNX backend node tests for the elementwise-math, tensor and reduction reference ops
(math_ops.py, tensor_ops.py, reduce_ops.py).

Every node-test case whose graph uses only the ops in ``OPS`` (expanded function bodies
included) runs through ``quanta.InferenceSession(..., backend="reference")``
(``run_case``: integer outputs exact, float outputs at the tolerance the case declares).
Cases the reference does not support are listed in ``XFAIL`` with the unsupported feature
named; they are strict, so a case that starts passing must be removed from the list.
"""

from __future__ import annotations

import pytest

from tests.onnx_node import cases_for, run_case

OPS = frozenset(
    """
    Add Sub Mul Div Pow Mod Neg Abs Sqrt Reciprocal Exp Log Floor Ceil Round Sign
    Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh Max Min Sum Mean
    Equal Less LessOrEqual Greater GreaterOrEqual And Or Xor Not BitShift
    BitwiseAnd BitwiseOr BitwiseXor BitwiseNot IsNaN IsInf Where Cast CastLike Identity
    Reshape Flatten Squeeze Unsqueeze Transpose Concat Split Slice Gather GatherElements
    GatherND Scatter ScatterElements ScatterND Expand Tile Shape Size ConstantOfShape Constant
    Range TopK ArgMax ArgMin NonZero OneHot Trilu CumSum CumProd EyeLike Compress ReverseSequence
    ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSum
    ReduceLogSumExp ReduceSumSquare
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


def test_ops_are_registered() -> None:
    # OPS is the claim this file tests; every op in it must have a reference kernel.
    from quanta.kernels.reference.registry import get_op

    assert sorted(op for op in OPS if get_op(op) is None) == []


@pytest.mark.parametrize("case", CASES)
def test_onnx_node_tensor(case) -> None:
    run_case(case)
