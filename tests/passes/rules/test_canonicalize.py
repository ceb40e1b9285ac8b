"""Canonicalize (passes/rules/canonicalize.py): Sum of one input is removed, Sum of two
becomes Add, Sum / Max / Min / Mean of more become binary steps, Upsample becomes Resize.
Fired; structure; bit-exact numerics on the reference target (the same IEEE operations
in the same order); Upsample against onnx's own reference.
Plus the quantization pipeline on an old-style ResNet block (weights computed by
ConstantOfShape, residual written as Sum): everything folds and quantizes."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
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
    assert result.fired("SumToAdds") == 1
    assert [(n.op_type, n.name) for n in model.graph.nodes] == [("Add", "sum"), ("Relu", "relu")]
    f = feeds(proto)
    np.testing.assert_array_equal(run_ref(proto, f)[0], run_ref(model, f)[0])


@pytest.mark.parametrize("op", ["Sum", "Max", "Min", "Mean"])
def test_variadic_op_of_one_input_is_removed(op):
    proto = sum_proto(1)
    proto.graph.node[0].op_type = op
    model = load(proto)
    result = run_passes(model, [Canonicalize()])
    assert result.fired("SumOfOne") == 1
    assert [n.op_type for n in model.graph.nodes] == ["Relu"]


def variadic_proto(op: str, n_inputs: int, dtype=np.float32):
    """op over n inputs of shapes that broadcast differently at each step."""
    names = [f"x{i}" for i in range(n_inputs)]
    shapes = [[2, 7, 3], [7, 1], [1, 3], [2, 1, 1], [3]][:n_inputs]
    tt = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    g = helper.make_graph(
        [helper.make_node(op, names, ["y"], name="v")],
        "g",
        [helper.make_tensor_value_info(n, tt, s) for n, s in zip(names, shapes)],
        [helper.make_tensor_value_info("y", tt, [2, 7, 3])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize(
    "op,n,rule,steps",
    [
        ("Sum", 3, "SumToAdds", ["Add", "Add"]),
        ("Sum", 5, "SumToAdds", ["Add"] * 4),
        ("Max", 3, "VariadicToPairs", ["Max", "Max"]),
        ("Min", 4, "VariadicToPairs", ["Min"] * 3),
        ("Mean", 3, "MeanToAddsDiv", ["Add", "Add", "Div"]),
        ("Mean", 2, "MeanToAddsDiv", ["Add", "Div"]),
    ],
)
def test_variadic_operators_become_binary_steps_bit_exact(op, n, rule, steps):
    """The left fold the reference computes (functools.reduce), step by step: the same
    bytes, NaN and infinities included (Max / Min select, Sum / Mean add in order)."""
    proto = variadic_proto(op, n)
    model = load(proto)
    result = run_passes(model, [Canonicalize()])
    assert result.fired(rule) == 1
    assert [nd.op_type for nd in model.graph.nodes] == steps
    f = feeds(proto)
    f["x1"].flat[[0, 3]] = [np.nan, np.inf]
    got, want = run_ref(model, f)[0], run_ref(proto, f)[0]
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


def upsample_proto(opset: int, mode: str):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 7])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    scales = [1.0, 1.0, 2.0, 3.0]
    if opset < 9:
        node = helper.make_node("Upsample", ["x"], ["y"], mode=mode, scales=scales)
        inits = []
    else:
        node = helper.make_node("Upsample", ["x", "s"], ["y"], mode=mode)
        inits = [numpy_helper.from_array(np.array(scales, np.float32), "s")]
    model = helper.make_model(
        helper.make_graph([node], "g", [x], [y], inits), opset_imports=[helper.make_opsetid("", opset)]
    )
    model.ir_version = 4
    return model


def upsample_definition(x: np.ndarray, scales: list[int], mode: str) -> np.ndarray:
    """Upsample's definition, axis by axis in float64: output index i reads input
    coordinate i / scale; nearest takes its floor, linear interpolates between the floor
    and the next index (clamped at the end)."""
    y = x.astype(np.float64)
    for axis, s in enumerate(scales):
        n = y.shape[axis]
        c = np.arange(n * s) / s
        lo = np.floor(c).astype(int)
        if mode == "nearest":
            y = np.take(y, lo, axis=axis)
            continue
        hi = np.minimum(lo + 1, n - 1)
        w = (c - lo).reshape([-1 if a == axis else 1 for a in range(y.ndim)])
        y = np.take(y, lo, axis=axis) * (1 - w) + np.take(y, hi, axis=axis) * w
    return y.astype(np.float32)


@pytest.mark.parametrize("opset", [7, 9])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_is_resize_with_its_coordinates(opset, mode):
    """Upsample-7 (scales attribute) and -9 (scales input) become a Resize of the model's
    opset: Upsample's definition's values (onnx's own reference runs neither the
    attribute form nor linear), on the reference and native targets; a float session
    runs no fallback."""
    import quanta

    proto = upsample_proto(opset, mode)
    model = load(proto)
    assert run_passes(model, [Canonicalize(opset)]).fired("UpsampleToResize") == 1
    assert [nd.op_type for nd in model.graph.nodes] == ["Resize"]
    x = np.random.default_rng(opset).standard_normal((1, 3, 5, 7)).astype(np.float32)
    want = upsample_definition(x, [1, 1, 2, 3], mode)
    for backend in ("reference", "native"):  # a Resize of opset 7 or 9: run, not written
        sess = quanta.InferenceSession(proto.SerializeToString(), backend=backend)
        assert [s.node.op_type for s in sess.plan.steps] == ["Resize"]
        assert sess.fallbacks == []
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-6, atol=1e-6)


def test_upsample_from_opset_11_names_its_coordinate_modes():
    proto = upsample_proto(9, "nearest")
    model = load(proto)
    run_passes(model, [Canonicalize(11)])
    (node,) = model.graph.nodes
    assert node.op_type == "Resize" and node.inputs[1] is None
    assert (
        node.attrs["coordinate_transformation_mode"] == "asymmetric" and node.attrs["nearest_mode"] == "floor"
    )


def test_upsample_without_a_known_opset_is_left_with_its_reason():
    model = load(upsample_proto(9, "nearest"))
    p = Canonicalize()
    assert not run_passes(model, [p]).records[0].modified
    assert [r.reason for r in p.why_not("UpsampleToResize")] == ["the model's opset is not known"]


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


def test_cast_like_in_a_quantized_files_float_part_runs_natively():
    """A quantized graph compiles through lower_qdq, not optimize_float: its CastLikes
    (ONNX Runtime's QDQ file of an opset-23 Attention keeps the function body's) become
    Casts there too, so none is left to the reference fallback, and the result is ORT's."""
    g = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="dq"),
            helper.make_node("CastLike", ["d", "t"], ["y"], name="cl"),
            helper.make_node("CastLike", ["d", "h"], ["y16"], name="cl16"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 7])],
        [
            helper.make_tensor_value_info("y", TensorProto.INT32, [5, 7]),
            helper.make_tensor_value_info("y16", TensorProto.FLOAT16, [5, 7]),
        ],
        [
            numpy_helper.from_array(np.array(0.37, np.float32), "s"),
            numpy_helper.from_array(np.array(3, np.uint8), "z"),
            numpy_helper.from_array(np.zeros(1, np.int32), "t"),
            numpy_helper.from_array(np.zeros(1, np.float16), "h"),
        ],
    )
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString()
    sess = quanta.InferenceSession(data)
    assert sess.fallbacks == []
    f = {"x": (np.random.default_rng(5).standard_normal((5, 7)) * 30).astype(np.float32)}
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, f)
    for got, ref in zip(sess.run(None, f), want, strict=True):
        assert got.dtype == ref.dtype
        np.testing.assert_array_equal(got, ref)
