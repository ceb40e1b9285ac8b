"""Fusion coverage: lowered nodes, float nodes with the rule's reason, integer MAC share."""

from __future__ import annotations

from quanta.debug.coverage import coverage, macs
from quanta.ir.onnx_io import load
from quanta.passes.lower.qdq_to_qlinear import LowerQdqToQLinear
from quanta.passes.manager import PassManager
from quanta.passes.rules.eliminate_dead import EliminateDead
from quanta.passes.rules.fuse_activation import DropImpliedActivation
from tests.passes.lower.test_qdq_to_qlinear import qdq_conv_proto


def lowered_report(proto):
    before, after = load(proto), load(proto)
    result = PassManager([DropImpliedActivation(), LowerQdqToQLinear(), EliminateDead()]).run(after)
    return coverage(before.graph, after.graph, result.no_matches)


def test_coverage_reports_lowered_conv_and_its_macs():
    report = lowered_report(qdq_conv_proto())
    (node,) = report.nodes
    assert node.integer_op == "QLinearConv"
    assert node.macs == 1 * 7 * 9 * 5 * 3 * 3 * 3  # N*Cout*H*W * Cin*kh*kw
    assert report.integer_share == 1.0
    assert "1 of 1 compute nodes run as integer kernels; 100.0 %" in report.format()


def test_coverage_names_the_reason_a_conv_stayed_float():
    report = lowered_report(qdq_conv_proto(w_const=False))
    (node,) = report.nodes
    assert node.integer_op is None and report.integer_share == 0.0
    assert node.reasons == ["LowerConv: weight 'w_in' (a graph input) is not a constant"]
    text = report.format()
    assert (
        "stayed float:\n  conv (Conv, 8,505 MACs)\n      LowerConv: weight 'w_in' (a graph input) is not a constant"
        in text
    )


def test_coverage_structural_reason_when_nothing_is_quantized():
    from tests.ir.models import float_cnn

    report = lowered_report(float_cnn())
    conv = next(n for n in report.nodes if n.op == "Conv")
    assert conv.reasons == [
        "its output is not quantized (no QuantizeLinear after it)",
        "input 0 'x' is not dequantized (float input)",
        "input 1 'w' is not dequantized (float input)",
    ]
    gemm = next(n for n in report.nodes if n.op == "Gemm")
    assert macs(load(float_cnn()).graph.find_nodes("Gemm")[0]) == gemm.macs == 5 * 84  # N=1 (symbolic), K=84


def test_coverage_float_softmax_names_lower_softmax_reason():
    # Failure signature: a Softmax that LowerSoftmax refused was reported as "no integer
    # kernel for Softmax yet" (coverage's own copy of the lowering rules lacked it)
    from tests.passes.lower.test_lower_softmax import softmax_qdq

    report = lowered_report(softmax_qdq((2, 3, 5), axis=1))  # non-last axis, opset not given
    (node,) = report.nodes
    assert node.integer_op is None
    assert node.reasons == [
        "LowerSoftmax: Softmax over a non-last axis and the opset unknown (opset < 13 reads it as 2-D)"
    ]
