"""FoldReshapeDims (passes/rules/fold_reshape_dims.py): Reshape(x, Concat(copies of x's
own dimensions, constants)) takes 0 for the copies. Four parts (fired; structure: a
constant target with 0 at the copies, the Shape subgraph dead; bit-exact numerics on
the reference target at two batch sizes, since the data is unchanged; the verifier, run
by run_passes) and one negative test per NoMatch reason, the graph unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.ir.printer import format_graph
from quanta.passes.rules.eliminate_dead import EliminateDead
from quanta.passes.rules.fold_reshape_dims import FoldReshapeDims
from tests.passes.helpers import rng_data, run_passes, run_ref


def flatten_proto(
    *, index=0, tail=(-1,), allowzero=None, other_tensor=False, shape_start=None, index_input=False
):
    """x [batch, 4, 3, 5] -> Relu -> Reshape(r, Concat(Unsqueeze(Gather(Shape(src), index)), tail))."""
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 3, 5])]
    inits = [
        numpy_helper.from_array(np.asarray(tail, np.int64), "tail"),
        numpy_helper.from_array(np.array([0], np.int64), "axes0"),
    ]
    if index_input:
        inputs.append(helper.make_tensor_value_info("i", TensorProto.INT64, []))
    else:
        inits.append(numpy_helper.from_array(np.array(index, np.int64), "i"))
    shape_attrs = {} if shape_start is None else {"start": shape_start}
    reshape_attrs = {} if allowzero is None else {"allowzero": allowzero}
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Shape", ["x" if other_tensor else "r"], ["s"], name="shape", **shape_attrs),
        helper.make_node("Gather", ["s", "i"], ["g"], axis=0, name="gather"),
        helper.make_node("Unsqueeze", ["g", "axes0"], ["u"], name="unsqueeze"),
        helper.make_node("Concat", ["u", "tail"], ["c"], axis=0, name="concat"),
        helper.make_node("Reshape", ["r", "c"], ["y"], name="flatten", **reshape_attrs),
    ]
    g = helper.make_graph(
        nodes, "flatten", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    ("kw", "target"),
    [
        ({}, [0, -1]),  # x.view(x.size(0), -1)
        ({"tail": (4, 15)}, [0, 4, 15]),
        ({"index": -4}, [0, -1]),  # negative index: from the back of the 4 dimensions
    ],
)
def test_fold_copied_dims_into_reshape(kw, target):
    proto = flatten_proto(**kw)
    model = load(proto)
    result = run_passes(model, [FoldReshapeDims(), EliminateDead()])
    assert result.fired("FoldCopiedDimsIntoReshape") == 1
    assert model.graph.op_counts() == {"Relu": 1, "Reshape": 1}
    (reshape,) = [n for n in model.graph.nodes if n.op_type == "Reshape"]
    assert np.asarray(reshape.input(1).const).tolist() == target
    for batch in (1, 3):
        f = {"x": rng_data((batch, 4, 3, 5), seed=batch)}
        np.testing.assert_array_equal(run_ref(proto, f)[0], run_ref(model, f)[0])  # 0: the same data


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"allowzero": 1}, "allowzero=1: a 0 in the shape means an empty dimension, not a copy"),
        (
            {"other_tensor": True},
            "'u' (output of 'unsqueeze' (Unsqueeze)) reads the shape of another tensor than the Reshape's input",
        ),
        (
            {"index": 1, "tail": (-1,)},
            "'u' (output of 'unsqueeze' (Unsqueeze)) copies dimension 1 of the input to position 0",
        ),
        (
            {"shape_start": 1},
            "'u' (output of 'unsqueeze' (Unsqueeze)) copies dimension 1 of the input to position 0",
        ),
        (
            {"index_input": True},
            "'u' (output of 'unsqueeze' (Unsqueeze)) gathers a non-constant or non-scalar index",
        ),
    ],
)
def test_fold_copied_dims_into_reshape_refuses_with_its_reason(kw, reason):
    proto = flatten_proto(**kw)
    model = load(proto)
    before = format_graph(model.graph)
    p = FoldReshapeDims()
    run_passes(model, [p])
    assert [r.reason for r in p.why_not("FoldCopiedDimsIntoReshape")] == [reason]
    assert format_graph(model.graph) == before


def test_fold_copied_dims_into_reshape_refuses_a_piece_of_another_kind():
    proto = flatten_proto()
    # the first piece becomes the Shape itself (not an Unsqueeze(Gather(...)))
    for n in proto.graph.node:
        if n.op_type == "Concat":
            n.input[0] = "g_1d"
    proto.graph.node.insert(3, helper.make_node("Reshape", ["g", "one"], ["g_1d"], name="to_1d"))
    proto.graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), "one"))
    model = load(proto)
    p = FoldReshapeDims()
    run_passes(model, [p])
    assert [r.reason for r in p.why_not("FoldCopiedDimsIntoReshape")] == [
        "'g_1d' (output of 'to_1d' (Reshape)) is neither a constant nor Unsqueeze(Gather(Shape(...)))"
    ]


def flatten_tail_proto(*, starts=(0,), ends=(2,), steps=None, tail=(-1,)):
    """x [batch, T, 4, 5] -> Relu -> Reshape(r, Concat(Slice(Shape(r), starts, ends), tail))
    (torch's x.flatten(2))."""
    consts = {"starts": starts, "ends": ends, "tail": tail}
    if steps is not None:
        consts |= {"axes": [0], "steps": steps}
    inits = [numpy_helper.from_array(np.asarray(a, np.int64), n) for n, a in consts.items()]
    slice_inputs = ["s", "starts", "ends"] + (["axes", "steps"] if steps is not None else [])
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Shape", ["r"], ["s"], name="shape"),
        helper.make_node("Slice", slice_inputs, ["lead"], name="slice"),
        helper.make_node("Concat", ["lead", "tail"], ["c"], axis=0, name="concat"),
        helper.make_node("Reshape", ["r", "c"], ["y"], name="flatten"),
    ]
    g = helper.make_graph(
        nodes,
        "flatten_tail",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "T", 4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)])


@pytest.mark.parametrize(
    ("kw", "target", "shape"),
    [
        ({}, [0, 0, -1], ("batch", "T", 20)),  # x.flatten(2): -1 is what the copies leave
        ({"ends": (1,), "tail": (-1, 5)}, [0, -1, 5], ("batch", None, 5)),  # -1 over a symbolic T
        ({"ends": (99,), "tail": ()}, [0, 0, 0, 0], ("batch", "T", 4, 5)),  # ends clamped to the rank
        ({"steps": (1,)}, [0, 0, -1], ("batch", "T", 20)),
    ],
)
def test_sliced_shape_pieces_fold_and_the_result_shape_is_known(kw, target, shape):
    """A Slice(Shape(x), s, e) piece copies dimensions s..e-1 at their own positions; the
    Reshape's result then has the shape the target gives, where onnx's inference at load
    saw none (what a following Einsum needs to become a MatMul)."""
    proto = flatten_tail_proto(**kw)
    model = load(proto)
    (before,) = [n for n in model.graph.nodes if n.op_type == "Reshape"]
    assert before.outputs[0].shape is None or None in before.outputs[0].shape
    result = run_passes(model, [FoldReshapeDims(), EliminateDead()])
    assert result.fired("FoldCopiedDimsIntoReshape") == 1
    assert model.graph.op_counts() == {"Relu": 1, "Reshape": 1}
    (reshape,) = [n for n in model.graph.nodes if n.op_type == "Reshape"]
    assert np.asarray(reshape.input(1).const).tolist() == target
    assert reshape.outputs[0].shape == shape
    for batch, t in ((1, 3), (2, 7)):
        f = {"x": rng_data((batch, t, 4, 5), seed=batch)}
        np.testing.assert_array_equal(run_ref(proto, f)[0], run_ref(model, f)[0])


def test_gathered_copies_give_the_result_shape_too():
    model = load(flatten_proto(tail=(4, 15)))
    run_passes(model, [FoldReshapeDims(), EliminateDead()])
    (reshape,) = [n for n in model.graph.nodes if n.op_type == "Reshape"]
    assert reshape.outputs[0].shape == ("batch", 4, 15)


def test_a_strided_shape_slice_is_refused_with_its_reason():
    model = load(flatten_tail_proto(steps=(2,)))
    before = format_graph(model.graph)
    p = FoldReshapeDims()
    run_passes(model, [p])
    assert [r.reason for r in p.why_not("FoldCopiedDimsIntoReshape")] == [
        "'lead' (output of 'slice' (Slice)) is not one step-1 slice of a shape"
    ]
    assert format_graph(model.graph) == before


def codes_reshape_proto(*, producer: str = "Relu"):
    """ONNX Runtime's QOperator form: Reshape(q, Concat(Unsqueeze(Gather(Shape(DQ(q)), 0)),
    [-1])) on the uint8 codes q of a tensor, with the shape read from their dequantized
    values. ``producer`` "QLinearAdd": q comes from com.microsoft's QLinearAdd, whose
    output onnx cannot infer (q of unknown rank)."""
    inits = [
        numpy_helper.from_array(np.array(0.05, np.float32), "s"),
        numpy_helper.from_array(np.array(7, np.uint8), "z"),
        numpy_helper.from_array(np.array(0, np.int64), "i"),
        numpy_helper.from_array(np.array([0], np.int64), "axes0"),
        numpy_helper.from_array(np.array([-1], np.int64), "tail"),
    ]
    if producer == "Relu":
        head = [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("QuantizeLinear", ["r", "s", "z"], ["q"], name="quant"),
        ]
    else:
        head = [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="quant"),
            helper.make_node(
                "QLinearAdd",
                ["xq", "s", "z", "xq", "s", "z", "s", "z"],
                ["q"],
                name="qadd",
                domain="com.microsoft",
            ),
        ]
    nodes = [
        *head,
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"], name="dequant"),
        helper.make_node("Shape", ["dq"], ["sh"], name="shape"),
        helper.make_node("Gather", ["sh", "i"], ["g"], axis=0, name="gather"),
        helper.make_node("Unsqueeze", ["g", "axes0"], ["u"], name="unsqueeze"),
        helper.make_node("Concat", ["u", "tail"], ["c"], axis=0, name="concat"),
        helper.make_node("Reshape", ["q", "c"], ["qr"], name="flatten"),
        helper.make_node("DequantizeLinear", ["qr", "s", "z"], ["y"], name="dequant_y"),
    ]
    g = helper.make_graph(
        nodes,
        "codes_reshape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 3, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(g, opset_imports=opsets)


def test_a_shape_read_through_dequantize_linear_is_a_copy():
    """The shape of DQ(q) is q's: the target becomes [0, -1], the Shape subgraph dead."""
    proto = codes_reshape_proto()
    model = load(proto)
    result = run_passes(model, [FoldReshapeDims(), EliminateDead()])
    assert result.fired("FoldCopiedDimsIntoReshape") == 1
    assert "Shape" not in model.graph.op_counts()
    (reshape,) = [n for n in model.graph.nodes if n.op_type == "Reshape"]
    assert np.asarray(reshape.input(1).const).tolist() == [0, -1]
    assert reshape.outputs[0].shape == ("batch", 60)
    for batch in (1, 3):
        f = {"x": rng_data((batch, 4, 3, 5), seed=batch)}
        np.testing.assert_array_equal(run_ref(proto, f)[0], run_ref(model, f)[0])


def test_codes_of_unknown_rank_take_a_non_negative_gather_copy():
    """q made by an operator onnx cannot infer has no rank; a Gather of index 0 of its whole
    shape still copies dimension 0 (no rank needed), and the result has rank 2."""
    model = load(codes_reshape_proto(producer="QLinearAdd"))
    (q,) = [n.outputs[0] for n in model.graph.nodes if n.op_type == "QLinearAdd"]
    assert q.shape is None
    result = run_passes(model, [FoldReshapeDims(), EliminateDead()])
    assert result.fired("FoldCopiedDimsIntoReshape") == 1
    (reshape,) = [n for n in model.graph.nodes if n.op_type == "Reshape"]
    assert np.asarray(reshape.input(1).const).tolist() == [0, -1]
    assert reshape.outputs[0].shape is not None and len(reshape.outputs[0].shape) == 2
