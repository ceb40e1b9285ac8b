"""quantize_dynamic and a MatMul inside a Loop body: the body stays float, as in ONNX
Runtime's quantize_dynamic with its defaults (EnableSubgraph off), and the summary says
why at the Loop and at the body's MatMul instead of blaming its operands; the file runs
alike in ONNX Runtime and quanta; ORT's file made with EnableSubgraph (MatMulInteger in
the body) runs in quanta as in ORT."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.quantize.dynamic import DYNAMIC_SUBGRAPH_REASON
from tests.passes.helpers import dot_tolerance

F = TensorProto.FLOAT
ROWS, D = 3, 37
RNG = np.random.default_rng(17)
W = (RNG.normal(size=(D, D)) / 5).astype(np.float32)


def loop_model() -> onnx.ModelProto:
    """x [3, 37] -> 4 times x = Tanh(x·W) inside a Loop (W a body initializer)."""
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["x_in", "W"], ["m"], name="body_matmul"),
            helper.make_node("Tanh", ["m"], ["x_out"]),
            helper.make_node("Identity", ["c"], ["c_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_in", F, [ROWS, D]),
        ],
        [
            helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_out", F, [ROWS, D]),
        ],
        [numpy_helper.from_array(W, "W")],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "X"], ["Y"], name="loop", body=body)],
        "g",
        [helper.make_tensor_value_info("X", F, [ROWS, D])],
        [helper.make_tensor_value_info("Y", F, [ROWS, D])],
        [numpy_helper.from_array(np.array(4, np.int64), "M")],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def loop_tolerance(x: np.ndarray) -> float:
    """|ORT - quanta| for the float Loop: each iteration's length-37 products within
    (dot_tolerance) of exact on either side, magnitude Σ|x_i·W_ij| <= max|x|·c with
    c = max_j Σ_i |W_ij| (|x| <= 1 after the first Tanh); an earlier difference grows by at
    most c an iteration (Tanh's slope is at most 1): 4 iterations."""
    c = float(np.abs(W).sum(axis=0).max())
    step = float(dot_tolerance(D, max(float(np.abs(x).max()), 1.0) * c))
    return step * sum(c**k for k in range(4))


def body_ops(path) -> list[str]:
    loop = onnx.load(str(path)).graph.node[-1]
    return [n.op_type for n in loop.attribute[0].g.node]


def test_quantize_dynamic_keeps_a_loop_body_float_as_ort_does_and_says_why(tmp_path) -> None:
    from onnxruntime.quantization import quantize_dynamic as ort_quantize_dynamic

    src, ours, theirs, theirs_sub = (tmp_path / f for f in ("src.onnx", "q.onnx", "ort.onnx", "ort_sub.onnx"))
    onnx.save(loop_model(), str(src))
    feed = {"X": RNG.normal(size=(ROWS, D)).astype(np.float32)}

    summary = quanta.quantize_dynamic(str(src), str(ours), verbose=False)
    ort_quantize_dynamic(str(src), str(theirs))
    assert body_ops(ours) == body_ops(theirs) == ["MatMul", "Tanh", "Identity"]
    assert ("loop", "Loop", DYNAMIC_SUBGRAPH_REASON) in summary.float_nodes
    assert summary.coverage is not None
    matmul = next(c for c in summary.coverage.nodes if c.op == "MatMul")
    assert matmul.name.startswith("loop/body/") and matmul.integer_op is None
    assert matmul.reasons == [DYNAMIC_SUBGRAPH_REASON]
    assert DYNAMIC_SUBGRAPH_REASON in summary.format()

    by_ort = ort.InferenceSession(str(ours), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    by_quanta = quanta.InferenceSession(str(ours)).run(None, feed)[0]
    # float products of length 37 in either engine's order, through Tanh (slope <= 1), 4 times
    np.testing.assert_allclose(by_ort, by_quanta, rtol=0, atol=loop_tolerance(feed["X"]))

    # ORT's opt-in file quantizes the body; quanta runs it as ORT does
    ort_quantize_dynamic(str(src), str(theirs_sub), extra_options={"EnableSubgraph": True})
    assert "MatMulInteger" in body_ops(theirs_sub)
    by_ort = ort.InferenceSession(str(theirs_sub), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    by_quanta = quanta.InferenceSession(str(theirs_sub)).run(None, feed)[0]
    np.testing.assert_allclose(by_ort, by_quanta, rtol=0, atol=loop_tolerance(feed["X"]))
