"""RefineShapes (passes/rules/refine_shapes.py): shapes inferred anew once FoldConstants
made a Pad's computed amounts constants, so the Shape subgraphs after it fold; nothing
happens when every Shape reads static dimensions."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.ir.verify import Stage, verify
from quanta.passes.rules.eliminate_dead import EliminateDead
from quanta.passes.rules.fold_constants import FoldConstants
from quanta.passes.rules.refine_shapes import RefineShapes
from tests.passes.helpers import reference_evaluator, rng_data, run_passes, run_ref


def computed_pad_model(x_dims: list) -> onnx.ModelProto:
    """x -> Pad(amounts = ConstantOfShape([8]) + [0,0,1,2,0,0,1,0]) -> Relu -> r, and
    Shape(r) -> Gather([2, 3]) -> hw: onnx infers no dimension of r at load."""
    nodes = [
        helper.make_node(
            "ConstantOfShape", ["eight"], ["zeros"], value=numpy_helper.from_array(np.array([0], np.int64))
        ),
        helper.make_node("Add", ["zeros", "amounts"], ["pads"]),
        helper.make_node("Pad", ["x", "pads", "fill"], ["p"]),
        helper.make_node("Relu", ["p"], ["r"]),
        helper.make_node("Shape", ["r"], ["s"]),
        helper.make_node("Gather", ["s", "hw_idx"], ["hw"], axis=0),
    ]
    inits = [
        numpy_helper.from_array(np.array([8], np.int64), "eight"),
        numpy_helper.from_array(np.array([0, 0, 1, 2, 0, 0, 1, 0], np.int64), "amounts"),
        numpy_helper.from_array(np.array(0.5, np.float32), "fill"),
        numpy_helper.from_array(np.array([2, 3], np.int64), "hw_idx"),
    ]
    g = helper.make_graph(
        nodes,
        "computed_pad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)],
        [
            helper.make_tensor_value_info("r", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("hw", TensorProto.INT64, None),
        ],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_computed_pad_exposes_the_shapes_after_it_and_their_reads_fold():
    proto = computed_pad_model(["N", 3, 5, 7])
    model = load(proto)
    assert not isinstance(model.graph.find_nodes("Relu")[0].outputs[0].shape[2], int)
    ev = reference_evaluator(model.opset_imports)
    result = run_passes(
        model, [FoldConstants(ev), RefineShapes(model.opset_imports), FoldConstants(ev), EliminateDead()]
    )
    assert result.fired("FoldShapeElements") == 1
    r = model.graph.find_nodes("Relu")[0].outputs[0]
    assert r.shape[1:] == (3, 7, 9) and r.elem is not None
    hw = next(v for v in model.graph.outputs if v.name == "hw")
    assert hw.is_const and hw.const.tolist() == [7, 9]
    assert model.graph.op_counts() == {"Pad": 1, "Relu": 1}
    x = rng_data((2, 3, 5, 7), seed=5)
    for want, got in zip(run_ref(proto, {"x": x}), run_ref(model, {"x": x})):
        np.testing.assert_array_equal(want, got)
    verify(model.graph, Stage.FLOAT)


def test_known_shapes_stay_as_they_are():
    """A Shape of a value whose shape load already knows (a symbolic batch only): the
    re-inferred shapes are no more specific, nothing changes; without a Shape of unknown
    dimensions the pass does not infer at all."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Shape", ["r"], ["s"])]
    g = helper.make_graph(
        nodes,
        "known",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 5, 7])],
        [helper.make_tensor_value_info("s", TensorProto.INT64, [4])],
    )
    model = load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    before = {v.name: v.type for v in model.graph.values()}
    result = RefineShapes(model.opset_imports)(model.graph)
    assert not result.modified and result.stats == {"refined": 0}
    assert {v.name: v.type for v in model.graph.values()} == before
    static = load(computed_pad_model([2, 3, 5, 7]))
    ev = reference_evaluator(static.opset_imports)
    run_passes(
        static, [FoldConstants(ev), RefineShapes(static.opset_imports), FoldConstants(ev), EliminateDead()]
    )
    assert not static.graph.find_nodes("Shape")
    result = RefineShapes(static.opset_imports)(static.graph)
    assert not result.modified and result.stats == {}
