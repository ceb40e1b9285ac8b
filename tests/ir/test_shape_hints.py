"""Shape inference on a copy without the weights' data (quanta/ir/shape_hints.py): the
same types as onnx's own inference on the whole model, and the returned model keeps
every byte of the original's tensors."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.shape_hints import infer_shapes, without_weight_data

RNG = np.random.default_rng(2)


def _model() -> onnx.ModelProto:
    """A Conv (float weights of 3 * 7 * 3 * 3 * 17 ... elements), a Reshape to an int64
    target, a Constant node holding a large float tensor, a small float scale that a
    Resize reads, and an If whose branch holds a weight of its own."""
    w = RNG.standard_normal((17, 7, 3, 3)).astype(np.float32)
    big = RNG.standard_normal((17 * 5 * 3, 9)).astype(np.float32)
    branch_w = RNG.standard_normal((9, 129)).astype(np.float32)
    then = helper.make_graph(
        [helper.make_node("MatMul", ["m", "bw"], ["t_out"])],
        "then",
        [],
        [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(branch_w, "bw")],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["m"], ["e_out"])],
        "else",
        [],
        [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, None)],
    )
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], strides=[2, 2]),
        helper.make_node("Resize", ["c", "", "scales"], ["r"], mode="nearest"),
        helper.make_node("Reshape", ["r", "target"], ["f"]),
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(big, "k")),
        helper.make_node("MatMul", ["f", "k"], ["m"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 7, 11, 13]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.array([1, 1, 1, 0.5], np.float32), "scales"),
            numpy_helper.from_array(np.array([2, -1], np.int64), "target"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_same_types_as_inference_on_the_whole_model():
    m = _model()
    want = onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    got = infer_shapes(m, strict_mode=False, data_prop=True)
    assert got.SerializeToString() == want.SerializeToString()
    f = {vi.name: vi for vi in got.graph.value_info}["f"]
    assert [d.dim_value for d in f.type.tensor_type.shape.dim] == [2, 255]


def test_the_copy_drops_only_large_weights():
    m = _model()
    bare = without_weight_data(m)
    inits = {t.name: t for t in bare.graph.initializer}
    assert not inits["w"].raw_data and list(inits["w"].dims) == [17, 7, 3, 3]
    assert numpy_helper.to_array(inits["target"]).tolist() == [2, -1]  # int64: a shape
    assert numpy_helper.to_array(inits["scales"]).tolist() == [1, 1, 1, 0.5]  # small float
    const = next(n for n in bare.graph.node if n.op_type == "Constant").attribute[0].t
    assert not const.raw_data and not const.float_data and list(const.dims) == [255, 9]
    branch = next(n for n in bare.graph.node if n.op_type == "If").attribute
    then = next(a.g for a in branch if a.name == "then_branch")
    assert not then.initializer[0].raw_data and list(then.initializer[0].dims) == [9, 129]
    # the original is untouched
    assert len(m.graph.initializer[0].raw_data) == 17 * 7 * 3 * 3 * 4
