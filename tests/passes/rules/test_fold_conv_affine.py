"""FoldConvAffine (passes/rules/fold_conv_affine.py): a constant scale / shift per output
channel (or one value) after a float Conv folds into its weights and bias; anything that
is not one value per output channel, or a Conv output with another reader, stays."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta

F32 = np.float32


def model_with(nodes, consts, out_channels=7):
    rng = np.random.default_rng(5)
    inits = [
        numpy_helper.from_array(rng.uniform(-0.5, 0.5, (out_channels, 3, 3, 3)).astype(F32), "w"),
        numpy_helper.from_array(rng.uniform(-0.5, 0.5, out_channels).astype(F32), "b"),
    ] + [numpy_helper.from_array(np.asarray(v, F32), k) for k, v in consts.items()]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), *nodes],
        "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def ops_and_check(model) -> list[str]:
    """The plan's op types; the folded graph within float32 noise of the graph as written."""
    x = np.random.default_rng(2).standard_normal((1, 3, 9, 7)).astype(F32)
    off = quanta.SessionOptions()
    off.graph_optimization_level = quanta.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = quanta.InferenceSession(model, backend="reference")
    want = quanta.InferenceSession(model, sess_options=off, backend="reference").run(None, {"x": x})[0]
    got = sess.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    return [s.op_type for s in sess.plan.steps]


def test_scalar_scale_then_shift_fold_in_either_operand_order() -> None:
    nodes = [helper.make_node("Mul", ["s", "c"], ["m"]), helper.make_node("Add", ["m", "t"], ["y"])]
    assert ops_and_check(model_with(nodes, {"s": [1.7], "t": [-0.3]})) == ["Conv"]
    nodes = [helper.make_node("Mul", ["c", "s"], ["m"]), helper.make_node("Add", ["t", "m"], ["y"])]
    assert ops_and_check(model_with(nodes, {"s": -2.5, "t": 0.25})) == ["Conv"]


def test_per_channel_constants_fold() -> None:
    rng = np.random.default_rng(3)
    for shape in ((7, 1, 1), (1, 7, 1, 1)):
        consts = {"s": rng.uniform(0.5, 2, shape), "t": rng.uniform(-1, 1, shape)}
        nodes = [helper.make_node("Mul", ["c", "s"], ["m"]), helper.make_node("Add", ["m", "t"], ["y"])]
        assert ops_and_check(model_with(nodes, consts)) == ["Conv"], shape


def test_what_is_not_per_channel_or_is_shared_stays() -> None:
    # [7] broadcasts along the last (width) axis, [1, 7, 9, 7] per element
    nodes = [helper.make_node("Mul", ["c", "s"], ["y"])]
    assert ops_and_check(model_with(nodes, {"s": np.linspace(0.5, 2, 7)})) == ["Conv", "Mul"]
    full = np.random.default_rng(4).uniform(0.5, 2, (1, 7, 9, 7))
    assert ops_and_check(model_with(nodes, {"s": full})) == ["Conv", "Mul"]
    # the Conv's output read twice (a residual): the scale cannot go into the weights
    nodes = [helper.make_node("Mul", ["c", "s"], ["m"]), helper.make_node("Add", ["m", "c"], ["y"])]
    assert ops_and_check(model_with(nodes, {"s": [1.5]})) == ["Conv", "Mul", "Add"]


def test_batchnorm_written_as_sub_mul_add_folds() -> None:
    # TF exports write an inference BatchNormalization as (x - mean) * g + beta
    rng = np.random.default_rng(6)
    consts = {k: rng.uniform(0.5, 1.5, (1, 7, 1, 1)) for k in ("mean", "g", "beta")}
    nodes = [
        helper.make_node("Sub", ["c", "mean"], ["d"]),
        helper.make_node("Mul", ["d", "g"], ["m"]),
        helper.make_node("Add", ["m", "beta"], ["y"]),
    ]
    assert ops_and_check(model_with(nodes, consts)) == ["Conv"]
    # the Conv on the right of the Sub is a negated product: not this rule's, it stays
    nodes = [helper.make_node("Sub", ["mean", "c"], ["y"])]
    assert ops_and_check(model_with(nodes, consts)) == ["Conv", "Sub"]


def scale_through(model) -> list[str]:
    """ScaleThroughRelu run alone (with the verifier); the op types after it, and the
    rewritten graph within float32 noise of the graph as written."""
    from quanta.ir.onnx_io import load, to_proto
    from quanta.passes.manager import PassManager
    from quanta.passes.rules.fold_conv_affine import ScaleThroughRelu

    x = np.random.default_rng(2).standard_normal((1, 3, 9, 7)).astype(F32)
    want = quanta.InferenceSession(model, backend="reference").run(None, {"x": x})[0]
    m = load(model)
    PassManager([ScaleThroughRelu()], verify=True).run(m)
    got = quanta.InferenceSession(to_proto(m), backend="reference").run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6 * float(np.abs(want).max()))
    return [n.op_type for n in m.graph.nodes]


@pytest.mark.parametrize("channels", [3, 7, 17])
@pytest.mark.parametrize("act", ["Relu", "LeakyRelu"])
def test_positive_scale_after_a_relu_folds_through_it(channels, act) -> None:
    # a Keras BatchNormalization after the activation, as tf2onnx writes it: the factors
    # (two decades apart) go into the weights, the shift stays after the activation
    rng = np.random.default_rng(channels)
    consts = {
        "s": 10.0 ** rng.uniform(-0.7, 1.5, (1, channels, 1, 1)),
        "t": rng.uniform(-1, 1, (channels, 1, 1)),
    }
    kw = {"alpha": 0.1} if act == "LeakyRelu" else {}
    for order in (["r", "s"], ["s", "r"]):
        nodes = [
            helper.make_node(act, ["c"], ["r"], **kw),
            helper.make_node("Mul", order, ["m"]),
            helper.make_node("Add", ["m", "t"], ["y"]),
        ]
        assert scale_through(model_with(nodes, consts, channels)) == ["Conv", act, "Add"], order


def test_scale_through_a_relu_stays_where_it_is_not_positive_or_the_relu_is_shared() -> None:
    s = np.linspace(0.5, 2.0, 7).reshape(7, 1, 1)
    relu_mul = [helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Mul", ["r", "s"], ["y"])]
    assert scale_through(model_with(relu_mul, {"s": s})) == ["Conv", "Relu"]
    # one negative (or zero) channel: s·max(z, 0) is not max(s·z, 0) there
    for bad in (-0.5, 0.0):
        s2 = s.copy()
        s2[3] = bad
        assert scale_through(model_with(relu_mul, {"s": s2})) == ["Conv", "Relu", "Mul"], bad
    # the Relu's output read again (a skip connection): it must keep its unscaled values
    shared = [
        *relu_mul[:1],
        helper.make_node("Mul", ["r", "s"], ["m"]),
        helper.make_node("Add", ["m", "r"], ["y"]),
    ]
    assert scale_through(model_with(shared, {"s": s})) == ["Conv", "Relu", "Mul", "Add"]
    # a Clip's bounds would have to scale per channel: not this rule's
    clip = [helper.make_node("Clip", ["c", "lo", "hi"], ["r"]), helper.make_node("Mul", ["r", "s"], ["y"])]
    assert scale_through(model_with(clip, {"s": s, "lo": 0.0, "hi": 6.0})) == ["Conv", "Clip", "Mul"]


def conv_transpose_model(nodes, consts, group=1, with_bias=False):
    """x [1, 6, 5, 7] -> ConvTranspose 2x2 stride 2 (6 -> 9 channels in `group` groups) -> nodes."""
    rng = np.random.default_rng(11)
    inits = [numpy_helper.from_array(rng.uniform(-0.5, 0.5, (6, 9 // group, 2, 2)).astype(F32), "w")]
    inputs = ["x", "w"]
    if with_bias:
        inits.append(numpy_helper.from_array(rng.uniform(-0.5, 0.5, 9).astype(F32), "b"))
        inputs.append("b")
    inits += [numpy_helper.from_array(np.asarray(v, F32), k) for k, v in consts.items()]
    graph = helper.make_graph(
        [helper.make_node("ConvTranspose", inputs, ["c"], strides=[2, 2], group=group), *nodes],
        "affine_t",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 5, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run_both(model) -> tuple[list[str], np.ndarray, np.ndarray]:
    x = np.random.default_rng(2).standard_normal((1, 6, 5, 7)).astype(F32)
    off = quanta.SessionOptions()
    off.graph_optimization_level = quanta.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = quanta.InferenceSession(model, backend="reference")
    want = quanta.InferenceSession(model, sess_options=off, backend="reference").run(None, {"x": x})[0]
    return [s.op_type for s in sess.plan.steps], sess.run(None, {"x": x})[0], want


def test_conv_transpose_bias_add_becomes_its_bias_exactly() -> None:
    """PaddleOCR's DB head: ConvTranspose without a bias, then Add of a [1, M, 1, 1]
    constant. The twin adds its bias once after the scatter: the same bytes."""
    t = np.random.default_rng(3).uniform(-1, 1, (1, 9, 1, 1))
    for nodes in ([helper.make_node("Add", ["c", "t"], ["y"])], [helper.make_node("Add", ["t", "c"], ["y"])]):
        ops, got, want = run_both(conv_transpose_model(nodes, {"t": t}))
        assert ops == ["ConvTranspose"]
        assert got.tobytes() == want.tobytes()
    ops, got, want = run_both(
        conv_transpose_model([helper.make_node("Sub", ["c", "t"], ["y"])], {"t": t}, group=3)
    )
    assert ops == ["ConvTranspose"]
    assert got.tobytes() == want.tobytes()


def test_conv_transpose_bias_add_then_batchnorm_fold() -> None:
    """Once the Add is the bias, the BatchNormalization after it folds (fold_batchnorm.py):
    within float32 noise of the graph as written; a bias already there adds to the shift."""
    rng = np.random.default_rng(4)
    consts = {
        "t": rng.uniform(-1, 1, (1, 9, 1, 1)),
        "g": rng.uniform(0.5, 1.5, 9),
        "beta": rng.uniform(-1, 1, 9),
        "mean": rng.uniform(-1, 1, 9),
        "var": rng.uniform(0.5, 1.5, 9),
    }
    nodes = [
        helper.make_node("Add", ["c", "t"], ["a"]),
        helper.make_node("BatchNormalization", ["a", "g", "beta", "mean", "var"], ["y"]),
    ]
    for group, with_bias in ((1, False), (3, True)):
        ops, got, want = run_both(conv_transpose_model(nodes, consts, group=group, with_bias=with_bias))
        assert ops == ["ConvTranspose"], (group, with_bias)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


def test_conv_transpose_shift_that_is_not_per_channel_stays() -> None:
    full = np.random.default_rng(5).uniform(-1, 1, (1, 9, 10, 14))
    ops, got, want = run_both(conv_transpose_model([helper.make_node("Add", ["c", "t"], ["y"])], {"t": full}))
    assert ops == ["ConvTranspose", "Add"]
    assert got.tobytes() == want.tobytes()
