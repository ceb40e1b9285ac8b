"""fold_constants: Constant nodes, shape subgraphs (native), anything with an evaluator,
quantized constants; DequantizeLinear of a constant is kept."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.ir.printer import format_graph
from quanta.ir.types import F8E4M3FN, F32, I8, I32, I64, QuantType, TensorType
from quanta.ir.verify import Stage, verify
from quanta.passes.manager import PassManager
from quanta.passes.rules.eliminate_dead import EliminateDead
from quanta.passes.rules.fold_constants import FoldConstants
from tests.passes.helpers import out_info, reference_evaluator, rng_data, run_passes, run_ref


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def model_of(nodes, inputs, outputs, inits, opset=21) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "fold", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def shape_subgraph_model(batch=2, opset=21) -> onnx.ModelProto:
    """y = Relu(Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), Mul(Slice(Shape(x), 2, 4), [1, 1]) -> -1)))."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"], name="shape"),
        helper.make_node("Gather", ["shp", "zero"], ["n"], name="gather", axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"], name="unsq"),
        helper.make_node("Slice", ["shp", "starts", "ends"], ["hw"], name="slice"),
        helper.make_node("Mul", ["hw", "ones"], ["hw1"], name="mul"),
        helper.make_node("Cast", ["minus1"], ["m1"], name="cast", to=TensorProto.INT64),
        helper.make_node("Concat", ["n1", "m1"], ["target"], name="concat", axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"], name="reshape"),
        helper.make_node("Relu", ["r"], ["y"], name="relu"),
        helper.make_node("Identity", ["hw1"], ["hw_out"], name="hw_id"),
    ]
    inits = [
        _init("zero", np.int64(0)),
        _init("axes0", np.array([0], np.int64)),
        _init("starts", np.array([2], np.int64)),
        _init("ends", np.array([4], np.int64)),
        _init("ones", np.array([1, 1], np.int64)),
        _init("minus1", np.array([-1], np.int32)),
    ]
    return model_of(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 7, 5])],
        [out_info("y", 2), out_info("hw_out", 1, TensorProto.INT64)],
        inits,
        opset,
    )


X = rng_data((2, 3, 7, 5), seed=0)


@pytest.mark.parametrize("with_evaluator", [False, True])
def test_fold_constants_shape_subgraph(with_evaluator):
    proto = shape_subgraph_model()
    model = load(proto)
    evaluator = reference_evaluator(model.opset_imports) if with_evaluator else None
    result = run_passes(model, [FoldConstants(evaluator), EliminateDead()])
    assert result.fired("FoldShape") == 1
    arithmetic = "FoldEvaluated" if with_evaluator else "FoldShapeArithmetic"
    # Gather, Unsqueeze, Slice, Mul, Cast, Concat; Identity too with the evaluator
    assert result.fired(arithmetic) == (7 if with_evaluator else 6)
    expected_ops = {"Relu": 1, "Reshape": 1} if with_evaluator else {"Identity": 1, "Relu": 1, "Reshape": 1}
    assert model.graph.op_counts() == expected_ops
    target = model.graph.find_nodes("Reshape")[0].inputs[1]
    assert target.is_const and target.const.tolist() == [2, -1] and target.const.dtype == np.int64
    # tolerance 0: the same reference ops run on the same data; only constants moved
    for e, a in zip(run_ref(proto, {"x": X}), run_ref(model, {"x": X})):
        np.testing.assert_array_equal(e, a)
    verify(model.graph, Stage.FLOAT)


def test_fold_constants_native_shape_ops_agree_with_the_reference_kernels():
    # Each native evaluation against the reference kernel on the same constants,
    # including negative indices, negative slice steps and Reshape's 0 / -1.
    cases = [
        ("Gather", [np.array([4, 3, 7], np.int64), np.array([-1, 0], np.int64)], {"axis": 0}),
        ("Unsqueeze", [np.array([4, 3], np.int64), np.array([-1, 0], np.int64)], {}),
        ("Squeeze", [np.array([[5]], np.int64), np.array([1], np.int64)], {}),
        ("Squeeze", [np.array([[5]], np.int64)], {}),
        ("Concat", [np.array([1], np.int64), np.array([-1, 7], np.int64)], {"axis": 0}),
        ("Reshape", [np.arange(6, dtype=np.int64).reshape(2, 3), np.array([0, -1, 1], np.int64)], {}),
        ("Reshape", [np.zeros((0, 3), np.int64), np.array([0, 3], np.int64)], {"allowzero": 1}),
        ("Cast", [np.array([-1, 3], np.int32)], {"to": TensorProto.INT64}),
        (
            "Slice",
            [
                np.arange(7, dtype=np.int64),
                np.array([-2], np.int64),
                np.array([-9], np.int64),
                None,
                np.array([-2], np.int64),
            ],
            {},
        ),
        (
            "Slice",
            [
                np.arange(7, dtype=np.int64),
                np.array([1], np.int64),
                np.array([100], np.int64),
                np.array([0], np.int64),
                np.array([3], np.int64),
            ],
            {},
        ),
        ("Sub", [np.array([7, 5], np.int64), np.array(2, np.int64)], {}),
    ]
    from quanta.ir.graph import Node, Value
    from quanta.passes.rules.fold_constants import _evaluate_shape_op

    evaluate = reference_evaluator({"": 21})
    for op, inputs, attrs in cases:
        node = Node(op, [Value(f"i{k}") for k in range(len(inputs))], [Value("o")], attrs)
        native = _evaluate_shape_op(node, inputs)
        (ref,) = evaluate(node, inputs)
        assert native.dtype == ref.dtype and native.shape == ref.shape, (op, native, ref)
        np.testing.assert_array_equal(native, ref, err_msg=op)


def test_fold_constants_opset_9_unsqueeze_and_slice_attributes():
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"], name="shape"),
        helper.make_node("Slice", ["shp"], ["hw"], name="slice", starts=[-2], ends=[100], axes=[0]),
        helper.make_node("Unsqueeze", ["hw"], ["hw2"], name="unsq", axes=[0]),
        helper.make_node("Squeeze", ["hw2"], ["y"], name="sq", axes=[0]),
    ]
    proto = model_of(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 7, 5])],
        [out_info("y", 1, TensorProto.INT64)],
        [],
        opset=9,
    )
    model = load(proto)
    result = run_passes(model, [FoldConstants(), EliminateDead()])
    assert result.fired("FoldShapeArithmetic") == 3 and model.graph.op_counts() == {}
    assert model.graph.outputs[0].name == "y" and model.graph.outputs[0].const.tolist() == [7, 5]


def test_fold_constants_constant_nodes_and_float_subgraph_with_evaluator():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((5, 7)).astype(np.float32)
    nodes = [
        helper.make_node("Constant", [], ["w"], name="cst", value=numpy_helper.from_array(w)),
        helper.make_node("Constant", [], ["two"], name="cst2", value_float=2.0),
        helper.make_node("Transpose", ["w"], ["wt"], name="tr"),
        helper.make_node("Mul", ["wt", "two"], ["w2"], name="scale"),
        helper.make_node("MatMul", ["x", "w2"], ["y"], name="mm"),
    ]
    proto = model_of(
        nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7])], [out_info("y", 2)], []
    )
    model = load(proto)
    result = run_passes(model, [FoldConstants(reference_evaluator(model.opset_imports)), EliminateDead()])
    assert result.fired("FoldConstantNode") == 2 and result.fired("FoldEvaluated") == 2
    assert model.graph.op_counts() == {"MatMul": 1}
    assert list(model.graph.initializers) == ["w2"]
    x = rng_data((3, 7), seed=2)
    # tolerance 0: Transpose and Mul by 2 are exact, MatMul sees identical operands
    np.testing.assert_array_equal(run_ref(proto, {"x": x})[0], run_ref(model, {"x": x})[0])
    verify(model.graph, Stage.FLOAT)


def qdq_weight_model() -> onnx.ModelProto:
    """A float weight quantized in the graph (PyTorch-export style): Q(w) -> DQ -> MatMul."""
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="q_x"),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xf"], name="dq_x"),
        helper.make_node("QuantizeLinear", ["w", "ws", "wz"], ["wq"], name="q_w", axis=1),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wf"], name="dq_w", axis=1),
        helper.make_node("MatMul", ["xf", "wf"], ["y"], name="mm"),
    ]
    inits = [
        _init("xs", np.float32(0.02)),
        _init("xz", np.uint8(121)),
        _init("w", rng.standard_normal((17, 7)).astype(np.float32)),
        _init("ws", np.array([0.011, 0.017, 0.013, 0.02, 0.009, 0.012, 0.015], np.float32)),
        _init("wz", np.array([1, -2, 0, 3, -1, 2, 0], np.int8)),
    ]
    return model_of(
        nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 17])], [out_info("y", 2)], inits
    )


def test_fold_constants_quantize_of_constant_into_quantized_constant():
    proto = qdq_weight_model()
    model = load(proto)
    result = run_passes(model, [FoldConstants(reference_evaluator(model.opset_imports)), EliminateDead()])
    assert result.fired("FoldEvaluated") == 1  # Q(w) only: DequantizeLinear(const) is kept
    assert model.graph.op_counts() == {"DequantizeLinear": 2, "MatMul": 1, "QuantizeLinear": 1}
    wq = model.graph.initializers["wq"]
    assert wq.const.dtype == np.int8 and isinstance(wq.type.elem, QuantType)
    assert wq.type.elem.axis == 1 and wq.type.elem.zero_point == (1, -2, 0, 3, -1, 2, 0)
    x = rng_data((3, 17), seed=4)
    # tolerance 0: the constant holds exactly what QuantizeLinear computed at run time
    np.testing.assert_array_equal(run_ref(proto, {"x": x})[0], run_ref(model, {"x": x})[0])
    verify(model.graph, Stage.QDQ)
    reasons = [r.reason for r in result.why_not("FoldEvaluated")]
    assert reasons == [
        "DequantizeLinear is kept: a dequantized constant is a quantized weight: the integer lowering consumes "
        "its integers (a folded float copy is 4x larger and loses the quantization)"
    ]


def test_fold_constants_types_a_shared_integer_constant_per_dequantize():
    # One i8 tensor read by two DequantizeLinear with different scales: the importer
    # cannot give it one QuantType; each reader gets a typed private constant.
    wq = np.random.default_rng(5).integers(-127, 128, (7, 5)).astype(np.int8)
    nodes = [
        helper.make_node("DequantizeLinear", ["wq", "s1", "z1"], ["w1"], name="dq1"),
        helper.make_node("DequantizeLinear", ["wq", "s2", "z2"], ["w2"], name="dq2"),
        helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
        helper.make_node("MatMul", ["x", "w2"], ["b"], name="mm2"),
        helper.make_node("Add", ["a", "b"], ["y"], name="add"),
    ]
    inits = [
        _init("wq", wq),
        _init("s1", np.float32(0.03)),
        _init("z1", np.int8(3)),
        _init("s2", np.float32(0.05)),
        _init("z2", np.int8(-4)),
    ]
    proto = model_of(
        nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7])], [out_info("y", 2)], inits
    )
    model = load(proto)
    assert not isinstance(model.graph.initializers["wq"].type.elem, QuantType)
    # the verifier rejects this input (one i8 value, two quantized types), so it runs
    # only after the passes here
    result = PassManager([FoldConstants(), EliminateDead()], verify=False).run(model)
    assert result.fired("TypeQuantizedConstant") == 2
    typed = [n.inputs[0].type.elem for n in model.graph.find_nodes("DequantizeLinear")]
    assert [(t.scale, t.zero_point) for t in typed] == [
        ((float(np.float32(0.03)),), (3,)),
        ((float(np.float32(0.05)),), (-4,)),
    ]
    assert sorted(model.graph.initializers) == [
        "s1",
        "s2",
        "wq_1",
        "wq_2",
        "z1",
        "z2",
    ]  # the untyped original is gone
    x = rng_data((3, 7), seed=6)
    np.testing.assert_array_equal(run_ref(proto, {"x": x})[0], run_ref(model, {"x": x})[0])
    verify(model.graph, Stage.QDQ)


# -- NoMatch reasons ------------------------------------------------------------------------------


def reasons(proto_or_model, rule, evaluator=False, include_pattern=False, verify_input=True) -> list[str]:
    model = load(proto_or_model) if isinstance(proto_or_model, onnx.ModelProto) else proto_or_model
    before = format_graph(model.graph)
    ev = reference_evaluator(model.opset_imports) if evaluator else None
    result = PassManager([FoldConstants(ev)], verify=verify_input).run(model)
    assert not result.modified and format_graph(model.graph) == before
    return [r.reason for r in result.why_not(rule, include_pattern=include_pattern)]


def single(
    op: str, inputs, inits, attrs=None, x_shape=(2, 3), out_rank=1, out_elem=TensorProto.INT64, x_dims=None
):
    node = helper.make_node(op, inputs, ["y"], name="n", **(attrs or {}))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims or list(x_shape))
    return model_of([node], [x], [out_info("y", out_rank, out_elem)], inits)


def test_fold_shape_refuses_dynamic_dimensions():
    proto = single("Shape", ["x"], [], x_dims=["N", 3])
    assert reasons(proto, "FoldShape") == [
        "'x' (a graph input) has shape ['N', 3]: the dimensions read are not all static"
    ]


def test_fold_shape_reads_only_the_static_part():
    # Shape(start=1) of [N, 3] reads only the static 3: folds
    proto = single("Shape", ["x"], [], {"start": 1}, x_dims=["N", 3])
    model = load(proto)
    assert run_passes(model, [FoldConstants()]).fired("FoldShape") == 1
    assert model.graph.outputs[0].const.tolist() == [3]


def test_fold_shape_refuses_unknown_rank():
    model = load(single("Shape", ["x"], []))
    model.graph.inputs[0].type = TensorType(F32, None)  # ONNX requires a shape on inputs; the IR may lose it
    assert reasons(model, "FoldShape") == ["'x' (a graph input) has an unknown rank"]


def test_fold_shape_arithmetic_refuses_float_inputs():
    proto = single(
        "Add",
        ["a", "b"],
        [_init("a", np.ones(2, np.float32)), _init("b", np.ones(2, np.float32))],
        out_elem=TensorProto.FLOAT,
    )
    assert reasons(proto, "FoldShapeArithmetic") == [
        "input 'a' (a constant) has element type float32: native folding covers integer shape tensors "
        "(give FoldConstants an evaluator for the rest)"
    ]


def test_fold_shape_arithmetic_refuses_large_tensors():
    proto = single("Add", ["a", "b"], [_init("a", np.ones(65, np.int64)), _init("b", np.ones(65, np.int64))])
    assert reasons(proto, "FoldShapeArithmetic") == [
        "input 'a' (a constant) has 65 elements: native folding covers shape tensors of at most 64 "
        "(give FoldConstants an evaluator for the rest)"
    ]


def test_fold_shape_arithmetic_refuses_a_float_cast():
    proto = single(
        "Cast",
        ["a"],
        [_init("a", np.ones(2, np.int64))],
        {"to": TensorProto.FLOAT},
        out_elem=TensorProto.FLOAT,
    )
    assert reasons(proto, "FoldShapeArithmetic") == ["Cast to element type 1 is not an integer shape cast"]


def test_fold_shape_arithmetic_refuses_what_numpy_cannot_evaluate():
    proto = single(
        "Reshape",
        ["a", "s"],
        [_init("a", np.arange(6, dtype=np.int64)), _init("s", np.array([4, -1], np.int64))],
        out_rank=2,
    )
    (reason,) = reasons(proto, "FoldShapeArithmetic")
    assert reason.startswith("Reshape cannot be evaluated on these constants: cannot reshape array of size 6")


def test_fold_shape_arithmetic_ignores_non_constant_inputs():
    proto = single("Add", ["s", "x2"], [_init("s", np.ones(2, np.int64))])
    proto.graph.input.append(helper.make_tensor_value_info("x2", TensorProto.INT64, [2]))
    assert reasons(proto, "FoldShapeArithmetic") == []  # not a candidate
    assert reasons(proto, "FoldShapeArithmetic", include_pattern=True) == [
        "input 'x2' (a graph input) is not a constant"
    ]


def test_fold_constant_node_refuses_sparse_values():
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.0], np.float32), "v"),
        numpy_helper.from_array(np.array([1], np.int64), "i"),
        [3],
    )
    proto = model_of(
        [helper.make_node("Constant", [], ["y"], name="c", sparse_value=sparse)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [out_info("y", 1, TensorProto.FLOAT)],
        [],
    )
    assert reasons(proto, "FoldConstantNode") == [
        "Constant with attribute(s) ['sparse_value'] is not folded (sparse or string values)"
    ]


def test_fold_evaluated_refuses_random_ops():
    proto = model_of(
        [helper.make_node("RandomNormal", [], ["y"], name="rnd", shape=[3])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [out_info("y", 1, TensorProto.FLOAT)],
        [],
    )
    assert reasons(proto, "FoldEvaluated", evaluator=True) == ["RandomNormal is kept: non-deterministic"]


def test_fold_evaluated_refuses_growing_the_model():
    proto = single(
        "ConstantOfShape",
        ["s"],
        [_init("s", np.array([300, 300], np.int64))],
        out_rank=2,
        out_elem=TensorProto.FLOAT,
    )
    assert reasons(proto, "FoldEvaluated", evaluator=True) == [
        "output 'y' would have 90000 elements (> 65536 and more than its inputs' 2 together): folding would grow the model"
    ]


def test_fold_evaluated_reports_evaluator_failures():
    proto = single(
        "Add",
        ["a", "b"],
        [_init("a", np.ones(2, np.float32)), _init("b", np.ones(2, np.float32))],
        out_elem=TensorProto.FLOAT,
    )
    model = load(proto)

    def broken(node, inputs):
        raise ValueError("no kernel today")

    before = format_graph(model.graph)
    result = run_passes(model, [FoldConstants(broken)])
    assert format_graph(model.graph) == before
    assert [r.reason for r in result.why_not("FoldEvaluated")] == [
        "the evaluator failed on Add: ValueError: no kernel today"
    ]


def test_fold_evaluated_refuses_a_result_of_the_wrong_dtype():
    proto = single(
        "Add",
        ["a", "b"],
        [_init("a", np.ones(2, np.float32)), _init("b", np.ones(2, np.float32))],
        out_elem=TensorProto.FLOAT,
    )
    model = load(proto)
    result = run_passes(model, [FoldConstants(lambda node, inputs: [np.ones(2, np.float64)])])
    assert [r.reason for r in result.why_not("FoldEvaluated")] == [
        "folded 'y' has dtype float64 but its type f32 stores float32"
    ]


def test_fold_evaluated_refuses_subgraph_attributes():
    then_g = helper.make_graph(
        [helper.make_node("Constant", [], ["t"], value_float=1.0)],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Constant", [], ["e"], value_float=2.0)],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [])],
    )
    proto = model_of(
        [helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [out_info("y", 0, TensorProto.FLOAT)],
        [_init("c", np.array(True))],
    )
    assert reasons(proto, "FoldEvaluated", evaluator=True) == ["If has a subgraph attribute"]


def test_type_quantized_constant_refuses_non_constant_scale():
    nodes = [helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["y"], name="dq")]
    proto = model_of(
        nodes,
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
        [out_info("y", 1, TensorProto.FLOAT)],
        [_init("wq", np.array([1, 2], np.int8)), _init("z", np.int8(1))],
    )
    assert reasons(proto, "TypeQuantizedConstant") == ["scale 's' (a graph input) is not a constant"]


def test_type_quantized_constant_refuses_a_zero_point_of_another_dtype():
    # ill-formed (the checker rejects it): built past the checker by editing the IR
    nodes = [helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["y"], name="dq")]
    proto = model_of(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [out_info("y", 1, TensorProto.FLOAT)],
        [_init("wq", np.array([1, 2], np.int8)), _init("s", np.float32(0.1)), _init("z", np.int8(1))],
    )
    model = load(proto)
    model.graph.initializers["wq"].type = TensorType(I8, (2,))  # untyped
    model.graph.initializers["z"].const = np.uint8(1)
    assert reasons(model, "TypeQuantizedConstant", verify_input=False) == [
        "constant dtype int8 differs from the zero point's uint8"
    ]


def test_fold_constant_node_refuses_a_value_that_contradicts_its_type():
    proto = model_of(
        [
            helper.make_node(
                "Constant", [], ["y"], name="c", value=numpy_helper.from_array(np.array([1, 2], np.int32))
            )
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [out_info("y", 1, TensorProto.INT32)],
        [],
    )
    model = load(proto)
    model.graph.outputs[0].type = TensorType(I64, (2,))  # a stale type left by an earlier edit
    model.graph.output_signature = [model.graph.outputs[0].type]
    assert reasons(model, "FoldConstantNode") == ["folded 'y' has dtype int32 but its type i64 stores int64"]


def test_fold_shape_arithmetic_refuses_a_result_that_contradicts_its_type():
    model = load(
        single(
            "Add",
            ["a", "b"],
            [_init("a", np.ones(2, np.int32)), _init("b", np.ones(2, np.int32))],
            out_elem=TensorProto.INT32,
        )
    )
    model.graph.outputs[0].type = TensorType(I64, (2,))
    model.graph.output_signature = [model.graph.outputs[0].type]
    assert reasons(model, "FoldShapeArithmetic") == [
        "folded 'y' has dtype int32 but its type i64 stores int64"
    ]


def test_fold_evaluated_refuses_too_few_outputs():
    proto = single(
        "Add",
        ["a", "b"],
        [_init("a", np.ones(2, np.float32)), _init("b", np.ones(2, np.float32))],
        out_elem=TensorProto.FLOAT,
    )
    model = load(proto)
    result = run_passes(model, [FoldConstants(lambda node, inputs: [])])
    assert [r.reason for r in result.why_not("FoldEvaluated")] == ["the evaluator returned 0 outputs for 1"]


def test_type_quantized_constant_refuses_float8_storage():
    f8 = helper.make_tensor("c", TensorProto.FLOAT8E4M3FN, [2], [1.0, 2.0])
    z8 = helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0.0])
    nodes = [helper.make_node("DequantizeLinear", ["c", "s", "z"], ["y"], name="dq")]
    proto = model_of(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [out_info("y", 1, TensorProto.FLOAT)],
        [f8, _init("s", np.float32(0.5)), z8],
    )
    model = load(proto)
    c = model.graph.initializers["c"]
    c.type = TensorType(F8E4M3FN, (2,))  # untyped float8 storage
    assert reasons(model, "TypeQuantizedConstant", verify_input=False) == [
        "the scale / zero point do not describe an integer quantized type"
    ]


def test_fold_shape_elements_reads_static_dimensions_of_a_symbolic_batch():
    """Gather and Slice of Shape(x: [N, 3, 7, 5]) fold where they read only 3, 7, 5 (a
    negative index included); the read of N stays, with its reason."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"], name="shape"),
        helper.make_node("Gather", ["shp", "hw_idx"], ["hw"], name="gather_hw", axis=0),
        helper.make_node("Slice", ["shp", "s1", "e3"], ["cs"], name="slice_ch"),
        helper.make_node("Gather", ["shp", "zero"], ["n"], name="gather_n", axis=0),
        helper.make_node("Shape", ["x"], ["tail"], name="shape_tail", start=2),
        helper.make_node("Gather", ["tail", "one"], ["w"], name="gather_w", axis=0),
    ]
    inits = [
        _init("hw_idx", np.array([2, -1], np.int64)),
        _init("s1", np.array([1], np.int64)),
        _init("e3", np.array([3], np.int64)),
        _init("zero", np.int64(0)),
        _init("one", np.int64(1)),
    ]
    proto = model_of(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 7, 5])],
        [out_info(n, 1 if n != "n" and n != "w" else 0, TensorProto.INT64) for n in ("hw", "cs", "n", "w")],
        inits,
    )
    model = load(proto)
    result = run_passes(model, [FoldConstants(), EliminateDead()])
    # Shape(start=2) reads only static dimensions: FoldShape, then the Gather of a constant
    assert result.fired("FoldShapeElements") == 2 and result.fired("FoldShape") == 1
    got = {v.name: v.const.tolist() for v in model.graph.outputs if v.is_const}
    assert got == {"hw": [7, 5], "cs": [3, 7], "w": 5}
    assert model.graph.op_counts() == {"Shape": 1, "Gather": 1}
    assert any("['N', 3, 7, 5]" in r.reason for r in result.why_not("FoldShapeElements"))
    x = rng_data((4, 3, 7, 5), seed=3)
    for e, a in zip(run_ref(proto, {"x": x}), run_ref(model, {"x": x})):
        np.testing.assert_array_equal(e, a)


def test_fold_evaluated_folds_a_concat_no_larger_than_its_pieces():
    # three [97, 301] pieces (29,197 elements each) -> [291, 301] (87,591 > 65536): not growth
    rng = np.random.default_rng(3)
    pieces = [rng.standard_normal((97, 301)).astype(np.float32) for _ in range(3)]
    proto = model_of(
        [helper.make_node("Concat", ["a", "b", "c"], ["y"], name="cat", axis=0)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [out_info("y", 2, TensorProto.FLOAT)],
        [_init(n, p) for n, p in zip("abc", pieces, strict=True)],
    )
    model = load(proto)
    result = run_passes(model, [FoldConstants(reference_evaluator(model.opset_imports))])
    assert result.fired("FoldEvaluated") == 1
    np.testing.assert_array_equal(model.graph.outputs[0].const, np.concatenate(pieces))
    # an Expand of one of them to 4x its size still grows the model and is refused
    grow = model_of(
        [helper.make_node("Expand", ["a", "s"], ["y"], name="n")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [out_info("y", 3, TensorProto.FLOAT)],
        [_init("a", pieces[0]), _init("s", np.array([4, 97, 301], np.int64))],
    )
    assert reasons(grow, "FoldEvaluated", evaluator=True) == [
        "output 'y' would have 116788 elements (> 65536 and more than its inputs' 29200 together): "
        "folding would grow the model"
    ]


def test_fold_constants_types_an_accumulator_its_folded_scale_describes():
    # DequantizeLinear(MatMulInteger(...), Mul(c1, c2)): once the Mul folds, the int32
    # accumulator gets the QuantType the loader gives it when the scale is a constant
    c1, c2 = np.float32(0.013), np.float32(0.021)
    g = helper.make_graph(
        [
            helper.make_node("MatMulInteger", ["a", "b", "za"], ["acc"]),
            helper.make_node("Mul", ["c1", "c2"], ["s"]),
            helper.make_node("DequantizeLinear", ["acc", "s"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [3, 17])],
        [out_info("y", 2)],
        [
            numpy_helper.from_array(
                np.random.default_rng(3).integers(-128, 128, (17, 7)).astype(np.int8), "b"
            ),
            numpy_helper.from_array(np.array(131, np.uint8), "za"),
            numpy_helper.from_array(np.array(c1), "c1"),
            numpy_helper.from_array(np.array(c2), "c2"),
        ],
    )
    model = load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]))
    acc = next(n for n in model.graph.nodes if n.op_type == "MatMulInteger").outputs[0]
    assert acc.type.elem == I32
    result = run_passes(model, [FoldConstants(reference_evaluator(model.opset_imports))])
    assert result.records[0].stats.get("TypeOperandOfFoldedParams") == 1
    assert acc.type.elem == QuantType(I32, F32, np.array([c1 * c2], np.float32), np.array([0]))
