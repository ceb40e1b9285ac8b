"""Canonicalize (passes/rules/canonicalize.py): Sum of one input is removed, Sum of two
becomes Add. Four parts (fired; structure; bit-exact numerics on the reference target,
since both are the same IEEE additions; the verifier) and the refusal for three inputs.
Plus the quantization pipeline on an old-style ResNet block (weights computed by
ConstantOfShape, residual written as Sum): everything folds and quantizes."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.passes.rules.canonicalize import Canonicalize
from tests.passes.helpers import run_passes, run_ref


def sum_proto(n_inputs: int):
    names = [f"x{i}" for i in range(n_inputs)]
    shapes = [[2, 7, 3], [7, 1], [1, 3]][:n_inputs]
    g = helper.make_graph(
        [
            helper.make_node("Sum", names, ["s"], name="sum"),
            helper.make_node("Relu", ["s"], ["y"], name="relu"),
        ],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in zip(names, shapes)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 7, 3])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def feeds(proto):
    rng = np.random.default_rng(2)
    return {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in proto.graph.input
    }


def test_sum_of_two_is_add_bit_exact():
    proto = sum_proto(2)
    model = load(proto)
    result = run_passes(model, [Canonicalize()])
    assert result.fired("SumOfTwoToAdd") == 1
    assert [(n.op_type, n.name) for n in model.graph.nodes] == [("Add", "sum"), ("Relu", "relu")]
    f = feeds(proto)
    np.testing.assert_array_equal(run_ref(proto, f)[0], run_ref(model, f)[0])


def test_sum_of_one_is_removed():
    proto = sum_proto(1)
    model = load(proto)
    result = run_passes(model, [Canonicalize()])
    assert result.fired("SumOfOne") == 1
    assert [n.op_type for n in model.graph.nodes] == ["Relu"]


def test_sum_of_three_is_left_with_its_reason():
    proto = sum_proto(3)
    model = load(proto)
    p = Canonicalize()
    result = run_passes(model, [p])
    assert not result.records[0].modified
    assert [r.reason for r in p.why_not("SumOfTwoToAdd")] == ["Sum of 3 inputs (only two are an Add)"]


def test_old_style_resnet_block_quantizes_completely(tmp_path):
    """Weights from ConstantOfShape (larger than the runtime's folding cap), BN with its
    parameters as overridable initializers, residual as Sum: quantize_static folds the
    weights, folds BN into them and writes the residual as Add, so the first
    convolution lowers to an integer kernel. (Whether the last convolution and the
    residual, whose output is the graph's float output, are worth quantizing is the
    planner's call, tested in tests/quantize.)"""
    import quanta

    c, hw = 64, 9
    nodes, inits, inputs = [], [], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])]
    rng = np.random.default_rng(0)
    x = "x"
    for k in range(2):
        shape = numpy_helper.from_array(np.array([c, c, 3, 3], np.int64), f"w{k}_shape")
        inits.append(shape)
        nodes.append(
            helper.make_node(
                "ConstantOfShape",
                [f"w{k}_shape"],
                [f"w{k}"],
                value=numpy_helper.from_array(np.array([0.01 * (k + 1)], np.float32)),
            )
        )
        for p, v in (
            ("s", 1.0 + 0.1 * rng.random(c)),
            ("b", 0.1 * rng.random(c)),
            ("m", 0.1 * rng.random(c)),
            ("v", 1.0 + rng.random(c)),
        ):
            t = numpy_helper.from_array(v.astype(np.float32), f"bn{k}_{p}")
            inits.append(t)
            inputs.append(helper.make_tensor_value_info(t.name, TensorProto.FLOAT, [c]))  # IR 3 style
        nodes.append(helper.make_node("Conv", [x, f"w{k}"], [f"c{k}"], pads=[1, 1, 1, 1], name=f"conv{k}"))
        nodes.append(
            helper.make_node(
                "BatchNormalization",
                [f"c{k}", f"bn{k}_s", f"bn{k}_b", f"bn{k}_m", f"bn{k}_v"],
                [f"n{k}"],
                name=f"bn{k}",
            )
        )
        nodes.append(helper.make_node("Relu", [f"n{k}"], [f"r{k}"], name=f"relu{k}"))
        x = f"r{k}"
    nodes.append(helper.make_node("Sum", ["r1", "x"], ["y"], name="residual"))
    g = helper.make_graph(
        nodes, "old", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, hw, hw])], inits
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)], ir_version=4)
    src, out = tmp_path / "old.onnx", tmp_path / "old.int8.onnx"
    import onnx

    onnx.save(proto, src)
    calib = [{"x": rng.standard_normal((1, c, hw, hw)).astype(np.float32)} for _ in range(3)]
    quanta.quantize_static(src, out, calib, verbose=False)
    sess = quanta.InferenceSession(str(out))
    ops = [s.op_type for s in sess.plan.steps]
    assert "QLinearConv" in ops
    assert not {"ConstantOfShape", "BatchNormalization", "Sum"} & set(ops), ops
    assert "Add" in ops or "QLinearAdd" in ops


def test_cast_like_is_a_cast_to_its_targets_type_bit_exact():
    """CastLike (ONNX function bodies: Attention's) -> Cast to the second input's type,
    float to int32 (truncation toward zero) and float to float16 (rounding) alike."""
    for target, like in ((TensorProto.INT32, np.int32), (TensorProto.FLOAT16, np.float16)):
        g = helper.make_graph(
            [helper.make_node("CastLike", ["x", "t"], ["y"], name="cl")],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7])],
            [helper.make_tensor_value_info("y", target, [3, 7])],
            [numpy_helper.from_array(np.zeros(2, like), "t")],
        )
        proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
        model = load(proto)
        assert run_passes(model, [Canonicalize()]).fired("CastLikeToCast") == 1
        (node,) = model.graph.nodes
        assert (node.op_type, node.name, node.attrs["to"]) == ("Cast", "cl", target)
        f = {"x": (np.random.default_rng(3).standard_normal((3, 7)) * 100).astype(np.float32)}
        np.testing.assert_array_equal(run_ref(proto, f)[0], run_ref(model, f)[0])
