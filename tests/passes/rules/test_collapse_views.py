"""collapse_views: unit-axis Transposes become Reshapes, chains of views one Reshape, a
Concat of one input and a Split into one output go. Each rule: how often it fired, the
structure after, the rewritten graph's bytes equal to the original's on the reference
target (every rule only moves values), and its refusals."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.passes.rules.collapse_views import CollapseViews
from tests.passes.helpers import run_passes, run_ref

RNG = np.random.default_rng(7)


def graph_model(nodes, inputs, outputs, inits=(), opset=21) -> onnx.ModelProto:
    """A shape-inferred model of ``nodes``; ``inputs`` / ``outputs`` map names to
    (element type, dims)."""
    g = helper.make_graph(
        nodes,
        "views",
        [helper.make_tensor_value_info(n, t, list(d)) for n, (t, d) in inputs.items()],
        [helper.make_tensor_value_info(n, t, list(d)) for n, (t, d) in outputs.items()],
        list(inits),
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(m)


def model_of(nodes, x_dims, y_dims, inits=(), opset=21) -> onnx.ModelProto:
    f = TensorProto.FLOAT
    return graph_model(nodes, {"x": (f, x_dims)}, {"y": (f, y_dims)}, inits, opset)


def same_bytes(proto: onnx.ModelProto, model, x_dims) -> None:
    feeds = {"x": RNG.standard_normal(x_dims).astype(np.float32)}
    for want, got in zip(run_ref(proto, feeds), run_ref(model, feeds), strict=True):
        assert want.shape == got.shape and want.tobytes() == got.tobytes()


def gru_to_matmul_model() -> onnx.ModelProto:
    """GTCRN's GRU output to its attention MatMul: Squeeze, a Transpose of unit axes,
    then the product; a Transpose that moves a unit axis after an Unsqueeze; and a
    Transpose that really moves data (stays)."""
    nodes = [
        helper.make_node("Neg", ["x"], ["a"], name="gru"),  # [1, 1, 1, 17]
        helper.make_node("Squeeze", ["a", "ax1"], ["b"], name="sq"),  # [1, 1, 17]
        helper.make_node("Transpose", ["b"], ["c"], name="tr_unit", perm=[1, 0, 2]),
        helper.make_node("MatMul", ["c", "w"], ["d"], name="mm"),  # [1, 1, 7]
        helper.make_node("Unsqueeze", ["d", "ax3"], ["e"], name="unsq"),  # [1, 1, 7, 1]
        helper.make_node("Transpose", ["e"], ["f"], name="tr_unit2", perm=[0, 2, 1, 3]),  # [1, 7, 1, 1]
        helper.make_node("Reshape", ["f", "shape"], ["g"], name="rs"),  # [7, 1]
        helper.make_node("Transpose", ["g"], ["y"], name="tr_real", perm=[1, 0]),  # [1, 7]: a view too
    ]
    inits = [
        numpy_helper.from_array(np.array([1], np.int64), "ax1"),
        numpy_helper.from_array(np.array([3], np.int64), "ax3"),
        numpy_helper.from_array(np.array([7, 1], np.int64), "shape"),
        numpy_helper.from_array(RNG.standard_normal((17, 7)).astype(np.float32), "w"),
    ]
    return model_of(nodes, (1, 1, 1, 17), (1, 7), inits)


def test_views_of_views_and_unit_transposes_become_one_reshape_each():
    proto = gru_to_matmul_model()
    model = load(proto)
    result = run_passes(model, [CollapseViews()])
    assert result.fired("TransposeOfUnitAxes") == 3
    assert result.fired("CollapseViewChain") >= 2
    from quanta.passes.rules.eliminate_dead import EliminateDead

    run_passes(model, [EliminateDead()])
    # Neg, the Squeeze (the unit Transpose after it gave its own shape back), the
    # MatMul, one Reshape to the output
    assert model.graph.op_counts() == {"Neg": 1, "Squeeze": 1, "MatMul": 1, "Reshape": 1}
    same_bytes(proto, model, (1, 1, 1, 17))


def test_a_transpose_of_axes_larger_than_one_stays():
    nodes = [helper.make_node("Transpose", ["x"], ["y"], name="tr", perm=[0, 2, 1, 3])]
    proto = model_of(nodes, (1, 3, 7, 1), (1, 7, 3, 1))
    model = load(proto)
    result = run_passes(model, [CollapseViews()])
    assert result.fired("TransposeOfUnitAxes") == 0
    assert model.graph.op_counts() == {"Transpose": 1}
    assert any("reorders axes of size > 1" in r.reason for r in result.why_not("TransposeOfUnitAxes"))


def test_symbolic_shapes_are_refused():
    nodes = [helper.make_node("Transpose", ["x"], ["y"], name="tr", perm=[1, 0, 2])]
    g = helper.make_graph(
        nodes,
        "views",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1, 17])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n", 17])],
    )
    model = load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]))
    result = run_passes(model, [CollapseViews()])
    assert result.fired("TransposeOfUnitAxes") == 0


@pytest.mark.parametrize("shared", [False, True])
def test_a_shared_inner_view_stays_for_its_other_reader(shared):
    nodes = [
        helper.make_node("Unsqueeze", ["x", "ax0"], ["a"], name="u0"),  # [1, 3, 7]
        helper.make_node("Reshape", ["a", "shape"], ["b"], name="rs"),  # [21]
        helper.make_node("Neg", ["b"], ["y"], name="neg"),
    ]
    if shared:
        nodes.append(helper.make_node("Neg", ["a"], ["y2"], name="neg2"))
    inits = [
        numpy_helper.from_array(np.array([0], np.int64), "ax0"),
        numpy_helper.from_array(np.array([21], np.int64), "shape"),
    ]
    proto = model_of(nodes, (3, 7), (21,), inits)
    if shared:
        proto.graph.output.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, [1, 3, 7]))
    model = load(proto)
    result = run_passes(model, [CollapseViews()])
    assert result.fired("CollapseViewChain") == 1
    from quanta.passes.rules.eliminate_dead import EliminateDead

    run_passes(model, [EliminateDead()])
    assert model.graph.op_counts().get("Unsqueeze", 0) == (1 if shared else 0)
    same_bytes(proto, model, (3, 7))


def test_keras_stack_of_one_and_unstack_of_one_go():
    """DTLN's unrolled LSTM: Split of its one time step into one output, Concat of one."""
    nodes = [
        helper.make_node("Split", ["x"], ["a"], name="unstack", axis=0),
        helper.make_node("Neg", ["a"], ["b"], name="cell"),
        helper.make_node("Concat", ["b"], ["y"], name="stack", axis=0),
    ]
    proto = model_of(nodes, (1, 3, 17), (1, 3, 17))
    model = load(proto)
    result = run_passes(model, [CollapseViews()])
    assert result.fired("SplitOfOne") == 1 and result.fired("ConcatOfOne") == 1
    assert model.graph.op_counts() == {"Neg": 1}
    assert model.graph.outputs[0].name == "y"
    same_bytes(proto, model, (1, 3, 17))


def test_a_split_into_several_outputs_stays():
    nodes = [
        helper.make_node("Split", ["x"], ["a", "b"], name="split", axis=1),
        helper.make_node("Add", ["a", "b"], ["y"], name="add"),
    ]
    proto = model_of(nodes, (1, 6, 7), (1, 3, 7))
    model = load(proto)
    result = run_passes(model, [CollapseViews()])
    assert result.fired("SplitOfOne") == 0
    assert model.graph.op_counts() == {"Split": 1, "Add": 1}


def test_a_view_back_to_its_input_shape_is_the_input():
    """A Transpose [1, 0, 2] of [1, 1, 17] (ORT's quantized DTLN around each LSTM) and a
    Squeeze / Unsqueeze round trip: no node is left."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["a"], name="tr", perm=[1, 0, 2]),
        helper.make_node("Unsqueeze", ["a", "ax"], ["b"], name="unsq"),
        helper.make_node("Squeeze", ["b", "ax"], ["c"], name="sq"),
        helper.make_node("Neg", ["c"], ["y"], name="neg"),
    ]
    inits = [numpy_helper.from_array(np.array([2], np.int64), "ax")]
    proto = model_of(nodes, (1, 1, 17), (1, 1, 17), inits)
    model = load(proto)
    run_passes(model, [CollapseViews()])
    from quanta.passes.rules.eliminate_dead import EliminateDead

    run_passes(model, [EliminateDead()])
    assert model.graph.op_counts() == {"Neg": 1}
    same_bytes(proto, model, (1, 1, 17))


def test_gather_of_index_zero_from_a_unit_axis_is_a_reshape():
    """GTCRN's unfold starts with ``x[:, :, [[0]]]`` on an axis of size 1; index 1 of an
    axis of size 3 stays a Gather."""
    nodes = [
        helper.make_node("Gather", ["x", "i0"], ["a"], name="g0", axis=2),  # [1, 7, 1, 1, 35]
        helper.make_node("Gather", ["a", "i1"], ["y"], name="g1", axis=1),  # [1, 1, 1, 1, 35]
    ]
    inits = [
        numpy_helper.from_array(np.array([[0]], np.int64), "i0"),
        numpy_helper.from_array(np.array([1], np.int64), "i1"),
    ]
    proto = model_of(nodes, (1, 7, 1, 35), (1, 1, 1, 1, 35), inits)
    model = load(proto)
    result = run_passes(model, [CollapseViews()])
    assert result.fired("GatherOfUnitAxis") == 1
    assert model.graph.op_counts() == {"Reshape": 1, "Gather": 1}
    assert any("is not of size 1" in r.reason for r in result.why_not("GatherOfUnitAxis"))
    same_bytes(proto, model, (1, 7, 1, 35))


@pytest.mark.parametrize("axis", [1, 0, -4])
def test_a_stack_along_a_new_axis_before_the_last_is_one_concat_and_a_reshape(axis):
    """GTCRN's channel interleave (Unsqueeze at 1 of [1, 7, 1, 33], three of them, Concat
    at 1), the same at axis 0 and negative; the bytes of the stack."""
    ins = ["x", "xn", "xa"]
    nodes = [
        helper.make_node("Neg", ["x"], ["xn"], name="neg"),
        helper.make_node("Abs", ["x"], ["xa"], name="abs"),
    ]
    nodes += [helper.make_node("Unsqueeze", [v, "ax"], [f"u_{v}"], name=f"u_{v}") for v in ins]
    nodes.append(helper.make_node("Concat", [f"u_{v}" for v in ins], ["y"], name="stack", axis=axis))
    inits = [numpy_helper.from_array(np.array([axis], np.int64), "ax")]
    out = [1, 7, 1, 33]
    out.insert(axis % 5, 3)
    proto = model_of(nodes, (1, 7, 1, 33), out, inits)
    model = load(proto)
    result = run_passes(model, [CollapseViews()])
    assert result.fired("ConcatOfUnsqueezed") == 1
    from quanta.passes.rules.eliminate_dead import EliminateDead

    run_passes(model, [EliminateDead()])
    assert model.graph.op_counts() == {"Neg": 1, "Abs": 1, "Concat": 1, "Reshape": 1}
    same_bytes(proto, model, (1, 7, 1, 33))


def test_a_stack_along_a_new_last_axis_stays():
    """DTLN's state stack at axis -1 interleaves the elements: no Concat of the inputs
    gives those bytes."""
    nodes = [
        helper.make_node("Neg", ["x"], ["xn"], name="neg"),
        helper.make_node("Unsqueeze", ["x", "ax"], ["u0"], name="u0"),
        helper.make_node("Unsqueeze", ["xn", "ax"], ["u1"], name="u1"),
        helper.make_node("Concat", ["u0", "u1"], ["y"], name="stack", axis=-1),
    ]
    inits = [numpy_helper.from_array(np.array([-1], np.int64), "ax")]
    proto = model_of(nodes, (1, 3, 17), (1, 3, 17, 2), inits)
    model = load(proto)
    result = run_passes(model, [CollapseViews()])
    assert result.fired("ConcatOfUnsqueezed") == 0
    assert model.graph.op_counts()["Concat"] == 1
    same_bytes(proto, model, (1, 3, 17))


def test_a_quantized_stack_is_one_qlinear_concat_and_a_reshape():
    """GTCRN's int8 channel interleave: QLinearConcat of two Unsqueezed uint8 tensors at
    different scales; the rewritten graph's codes are the original's on the reference."""
    u8 = TensorProto.UINT8
    inits = [
        numpy_helper.from_array(np.array([1], np.int64), "ax"),
        numpy_helper.from_array(np.float32(0.05), "sy"),
        numpy_helper.from_array(np.uint8(128), "zy"),
        numpy_helper.from_array(np.float32(0.031), "sa"),
        numpy_helper.from_array(np.uint8(3), "za"),
        numpy_helper.from_array(np.float32(0.17), "sb"),
        numpy_helper.from_array(np.uint8(250), "zb"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["fa", "sa", "za"], ["a"], name="qa"),
        helper.make_node("QuantizeLinear", ["fb", "sb", "zb"], ["b"], name="qb"),
        helper.make_node("Unsqueeze", ["a", "ax"], ["ua"], name="ua"),
        helper.make_node("Unsqueeze", ["b", "ax"], ["ub"], name="ub"),
        helper.make_node(
            "QLinearConcat",
            ["sy", "zy", "ua", "sa", "za", "ub", "sb", "zb"],
            ["y"],
            name="stack",
            domain="com.microsoft",
            axis=1,
        ),
    ]
    g = helper.make_graph(
        nodes,
        "qstack",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 7, 1, 33]) for n in ("fa", "fb")],
        [helper.make_tensor_value_info("y", u8, [1, 2, 7, 1, 33])],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    proto = helper.make_model(g, opset_imports=opsets)
    model = load(proto)
    result = run_passes(model, [CollapseViews()])
    assert result.fired("ConcatOfUnsqueezed") == 1
    from quanta.passes.rules.eliminate_dead import EliminateDead

    run_passes(model, [EliminateDead()])
    assert model.graph.op_counts() == {"QuantizeLinear": 2, "com.microsoft::QLinearConcat": 1, "Reshape": 1}
    rng = np.random.default_rng(3)
    feeds = {n: rng.normal(0, 4, (1, 7, 1, 33)).astype(np.float32) for n in ("fa", "fb")}
    for want, got in zip(run_ref(proto, feeds), run_ref(model, feeds), strict=True):
        assert want.shape == got.shape and want.tobytes() == got.tobytes()


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_an_integer_add_of_zero_goes_and_a_float_one_stays(dtype):
    """Paddle's assignment in a Loop body: Unsqueeze, Add of a zero, Squeeze. On integers
    nothing is left; on floats (x + 0 turns -0 into +0) the Add stays."""
    it = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [
        helper.make_node("Neg", ["x"], ["xn"], name="neg"),  # not a graph input: y may take its place
        helper.make_node("Unsqueeze", ["xn", "ax"], ["u"], name="u"),
        helper.make_node("Add", ["u", "zero"], ["a"], name="add"),
        helper.make_node("Squeeze", ["a", "ax"], ["y"], name="sq"),
        helper.make_node("Unsqueeze", ["f", "ax"], ["fu"], name="fu"),
        helper.make_node("Add", ["fzero", "fu"], ["fa"], name="fadd"),
        helper.make_node("Squeeze", ["fa", "ax"], ["fy"], name="fsq"),
    ]
    inits = [
        numpy_helper.from_array(np.array([0], np.int64), "ax"),
        numpy_helper.from_array(np.array([0], dtype), "zero"),
        numpy_helper.from_array(np.array([0.0], np.float32), "fzero"),
    ]
    proto = graph_model(
        nodes,
        {"x": (it, [3, 7]), "f": (TensorProto.FLOAT, [3, 7])},
        {"y": (it, [3, 7]), "fy": (TensorProto.FLOAT, [3, 7])},
        inits,
        opset=17,
    )
    model = load(proto)
    result = run_passes(model, [CollapseViews()])
    assert result.fired("IntegerAddOfZero") == 1
    from quanta.passes.rules.eliminate_dead import EliminateDead

    run_passes(model, [EliminateDead()])
    assert model.graph.op_counts() == {"Neg": 1, "Unsqueeze": 1, "Add": 1, "Squeeze": 1}  # the float chain
    feeds = {
        "x": RNG.integers(-1000, 1000, (3, 7)).astype(dtype),
        "f": np.array([[-0.0] * 7] * 3, np.float32),
    }
    for want, got in zip(run_ref(proto, feeds), run_ref(model, feeds), strict=True):
        assert want.dtype == got.dtype and want.tobytes() == got.tobytes()


@pytest.mark.parametrize(
    ("p", "q", "left"),
    [
        ((0, 3, 1, 2), (0, 2, 3, 1), {"Neg": 1}),  # NHWC -> NCHW -> NHWC: the input itself
        ((0, 3, 1, 2), (1, 0, 3, 2), {"Neg": 1, "Transpose": 1}),  # one Transpose of the composition
        (None, (2, 0, 1, 3), {"Neg": 1, "Transpose": 1}),  # the default perm (reversed axes)
    ],
)
def test_a_transpose_of_a_transpose_is_one_transpose_or_none(p, q, left):
    x_dims = (2, 5, 7, 3)
    inner = {} if p is None else {"perm": list(p)}
    v_dims = [x_dims[i] for i in (p or (3, 2, 1, 0))]
    y_dims = [v_dims[i] for i in q]
    nodes = [
        helper.make_node("Neg", ["x"], ["a"], name="neg"),
        helper.make_node("Transpose", ["a"], ["v"], name="t1", **inner),
        helper.make_node("Transpose", ["v"], ["y"], name="t2", perm=list(q)),
    ]
    proto = model_of(nodes, x_dims, y_dims)
    model = load(proto)
    result = run_passes(model, [CollapseViews()])
    assert result.fired("TransposeOfTranspose") == 1
    from quanta.passes.rules.eliminate_dead import EliminateDead

    run_passes(model, [EliminateDead()])
    assert model.graph.op_counts() == left
    same_bytes(proto, model, x_dims)


def test_a_transpose_read_by_another_node_stays_for_it():
    nodes = [
        helper.make_node("Transpose", ["x"], ["v"], name="t1", perm=[0, 2, 1]),
        helper.make_node("Transpose", ["v"], ["w"], name="t2", perm=[0, 2, 1]),
        helper.make_node("Neg", ["v"], ["n"], name="neg"),
        helper.make_node("Add", ["w", "x"], ["s"], name="add"),
        helper.make_node("Concat", ["s", "s"], ["y"], name="cat", axis=1),
    ]
    f = TensorProto.FLOAT
    proto = graph_model(nodes, {"x": (f, [3, 7, 17])}, {"y": (f, [3, 14, 17]), "n": (f, [3, 17, 7])})
    model = load(proto)
    result = run_passes(model, [CollapseViews()])
    assert result.fired("TransposeOfTranspose") == 1
    from quanta.passes.rules.eliminate_dead import EliminateDead

    run_passes(model, [EliminateDead()])
    assert model.graph.op_counts()["Transpose"] == 1  # t1, for the Neg
    feeds = {"x": RNG.standard_normal((3, 7, 17)).astype(np.float32)}
    for want, got in zip(run_ref(proto, feeds), run_ref(model, feeds), strict=True):
        assert want.tobytes() == got.tobytes()
