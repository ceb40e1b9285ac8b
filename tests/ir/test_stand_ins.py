"""Shape inference through com.microsoft DynamicQuantizeLSTM (quanta/ir/stand_ins.py):
its outputs and what is computed from them get shapes; the node itself is kept."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load, reinferred
from quanta.ir.stand_ins import infer_through


def dq_lstm_model(t: int, b: int, i: int, h: int, direction: str) -> onnx.ModelProto:
    d = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.integers(-127, 127, (d, i, 4 * h)).astype(np.int8), "w"),
        numpy_helper.from_array(rng.integers(-127, 127, (d, h, 4 * h)).astype(np.int8), "r"),
        numpy_helper.from_array(np.full((d,), 0.01, np.float32), "ws"),
        numpy_helper.from_array(np.zeros((d,), np.int8), "wz"),
        numpy_helper.from_array(np.full((d,), 0.02, np.float32), "rs"),
        numpy_helper.from_array(np.zeros((d,), np.int8), "rz"),
    ]
    lstm = helper.make_node(
        "DynamicQuantizeLSTM",
        ["x", "w", "r", "", "", "", "", "", "ws", "wz", "rs", "rz"],
        ["y", "yh", "yc"],
        domain="com.microsoft",
        hidden_size=h,
        direction=direction,
    )
    nodes = [lstm, helper.make_node("Relu", ["yh"], ["z"]), helper.make_node("Shape", ["z"], ["s"])]
    graph = helper.make_graph(
        nodes,
        "dq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [t, b, i])],
        [
            helper.make_tensor_value_info(n, TensorProto.FLOAT if n != "s" else TensorProto.INT64, None)
            for n in ("y", "s")
        ],
        inits,
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


def _shapes(proto: onnx.ModelProto) -> dict[str, list[int]]:
    vals = [*proto.graph.value_info, *proto.graph.output]
    return {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in vals
        if v.type.tensor_type.HasField("shape")
    }


def test_outputs_of_the_lstm_and_below_get_shapes() -> None:
    for t, b, i, h, direction in ((3, 2, 5, 7, "forward"), (1, 1, 128, 128, "bidirectional")):
        d = 2 if direction == "bidirectional" else 1
        proto = dq_lstm_model(t, b, i, h, direction)
        plain = onnx.shape_inference.infer_shapes(proto, strict_mode=False)
        assert "z" not in _shapes(plain)  # what the stand-in is for
        got = infer_through(proto, strict_mode=False, data_prop=True)
        shapes = _shapes(got)
        assert shapes["y"] == [t, d, b, h] and shapes["yh"] == [d, b, h] and shapes["z"] == [d, b, h]
        assert [n.op_type for n in got.graph.node] == ["DynamicQuantizeLSTM", "Relu", "Shape"]
        assert got.graph.node[0] == proto.graph.node[0]


def test_reinferred_model_keeps_the_node_and_knows_the_shapes() -> None:
    model = reinferred(load(dq_lstm_model(4, 3, 9, 17, "reverse")))
    lstm = model.graph.nodes[0]
    assert lstm.op_type == "DynamicQuantizeLSTM" and lstm.domain == "com.microsoft"
    assert lstm.outputs[1].shape == (1, 3, 17)
