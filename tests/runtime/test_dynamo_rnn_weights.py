"""A float GRU / LSTM whose W and R are computed in the graph from the parameters.

torch's dynamo exporter writes ``W = Unsqueeze(Concat(Slice(w, gate)...))``: the gate
blocks of torch's parameter reordered into ONNX's order. Constant folding must turn that
into constants, or the native RNN (which packs W and R once) cannot bind and the RNN
runs on the NumPy twin. The Concat's result is over FoldEvaluated's 2^16-element limit
while each of its pieces is under it; it is no larger than its pieces together, so it
folds.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.cli.bench import reference_steps

H, IN, T, B = 151, 173, 4, 3  # 3H·IN = 78,369 and 3H·H = 68,403 elements: over 2^16


def _computed_weight(
    nodes: list, inits: list, rng: np.random.Generator, tag: str, gates: int, cols: int
) -> str:
    """torch's [gates·H, cols] parameter -> one Slice per gate block -> Concat in the
    order ``order`` (the dynamo exporter's reordering) -> Unsqueeze the direction axis."""
    inits.append(
        numpy_helper.from_array(
            (rng.standard_normal((gates * H, cols)) * 0.08).astype(np.float32), f"{tag}_p"
        )
    )
    inits.append(numpy_helper.from_array(np.array([0], np.int64), f"{tag}_axis"))
    order = [1, 0, 2] if gates == 3 else [0, 3, 1, 2]
    parts = []
    for k in order:
        inits += [
            numpy_helper.from_array(np.array([k * H], np.int64), f"{tag}_lo{k}"),
            numpy_helper.from_array(np.array([(k + 1) * H], np.int64), f"{tag}_hi{k}"),
        ]
        nodes.append(
            helper.make_node(
                "Slice",
                [f"{tag}_p", f"{tag}_lo{k}", f"{tag}_hi{k}", f"{tag}_axis"],
                [f"{tag}_s{k}"],
                name=f"sl_{tag}{k}",
            )
        )
        parts.append(f"{tag}_s{k}")
    nodes.append(helper.make_node("Concat", parts, [f"{tag}_c"], axis=0, name=f"cat_{tag}"))
    nodes.append(helper.make_node("Unsqueeze", [f"{tag}_c", f"{tag}_axis"], [tag], name=f"unsq_{tag}"))
    return tag


def _model(op: str) -> onnx.ModelProto:
    rng = np.random.default_rng(19 if op == "GRU" else 23)
    gates = 3 if op == "GRU" else 4
    nodes: list = []
    inits: list = []
    w = _computed_weight(nodes, inits, rng, "W", gates, IN)
    r = _computed_weight(nodes, inits, rng, "R", gates, H)
    inits.append(
        numpy_helper.from_array((rng.standard_normal((1, 2 * gates * H)) * 0.1).astype(np.float32), "Bias")
    )
    attrs = {"hidden_size": H, **({"linear_before_reset": 1} if op == "GRU" else {})}
    nodes.append(helper.make_node(op, ["x", w, r, "Bias"], ["y", "y_h"], name="rnn", **attrs))
    graph = helper.make_graph(
        nodes,
        "computed_rnn_weights",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", "B", IN])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", 1, "B", H]),
            helper.make_tensor_value_info("y_h", TensorProto.FLOAT, [1, "B", H]),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
def test_rnn_with_computed_weights_runs_natively(op, tmp_path):
    proto = _model(op)
    onnx.checker.check_model(proto, full_check=True)
    path = tmp_path / f"{op}.onnx"
    onnx.save(proto, str(path))
    x = np.random.default_rng(5).standard_normal((T, B, IN)).astype(np.float32)
    sess = quanta.InferenceSession(str(path))
    assert reference_steps(sess.plan) == []  # the RNN binds its native kernel
    # float_functions "auto" runs the node in ORT's order (quanta::OrtLSTM / OrtGRU,
    # docs/float-ops.md (RO1))
    rnn = [s for s in sess.plan.steps if s.node.op_type == f"Ort{op}"]
    assert len(rnn) == 1 and rnn[0].kernel.name.startswith("native:")
    assert all(s.node.op_type == f"Ort{op}" for s in sess.plan.steps)  # Slice / Concat / Unsqueeze folded
    got = sess.run(None, {"x": x})
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-5)
