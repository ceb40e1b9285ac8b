"""method="weighted_mse": activations read only by Conv/Gemm/MatMul get the range that
minimises the error those layers see (eq. (22)); a tensor an averaging operator reads
gets MinMax (eq. (24)); every other tensor gets plain MSE (eq. (21))."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.quantize.qdq import averaged_activations, consumer_channel_weights, plan_qdq
from quanta.quantize.recipe import Recipe
from quanta.quantize.static import load_for_quantization

ort = pytest.importorskip("onnxruntime")

C = 7


def wide_channel_then_depthwise(
    also_add: bool = False, seed: int = 0, also_pool: bool = False
) -> onnx.ModelProto:
    """x -> 1x1 Conv (channel 0 forty times wider than the rest) -> y -> depthwise 3x3
    Conv that multiplies channel 0 by ~0.01 and the others by ~3 -> z. ``also_add``: y
    is also read by an Add (its error then reaches the output directly); ``also_pool``:
    y is also averaged by a GlobalAveragePool whose result is added to z."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((C, 3, 1, 1)).astype(np.float32)
    w1[0] *= 40.0
    w2 = (rng.standard_normal((C, 1, 3, 3)) * 3.0).astype(np.float32)
    w2[0] *= 0.003
    b2 = rng.standard_normal(C).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["y"], name="pw"),
        helper.make_node("Conv", ["y", "w2", "b2"], ["z"], name="dw", group=C, pads=[1, 1, 1, 1]),
    ]
    outputs = [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)]
    if also_add:
        nodes.append(helper.make_node("Add", ["y", "z"], ["s"], name="add"))
        outputs = [helper.make_tensor_value_info("s", TensorProto.FLOAT, None)]
    if also_pool:
        nodes.append(helper.make_node("GlobalAveragePool", ["y"], ["p"], name="pool"))
        nodes.append(helper.make_node("Add", ["z", "p"], ["s"], name="add"))
        outputs = [helper.make_tensor_value_info("s", TensorProto.FLOAT, None)]
    g = helper.make_graph(
        nodes,
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 9, 11])],
        outputs,
        [
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(b2, "b2"),
        ],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((2, 3, 9, 11)).astype(np.float32)} for _ in range(n)]


def q_range(path, tensor: str) -> tuple[float, float]:
    node = next(
        n for n in load(path).graph.nodes if n.op_type == "QuantizeLinear" and n.inputs[0].name == tensor
    )
    q = node.outputs[0].type.elem
    s, z = q.scale[0], q.zero_point[0]
    return (q.storage.qmin - z) * s, (q.storage.qmax - z) * s


def sqnr(src, out, feed) -> float:
    ref = ort.InferenceSession(str(src)).run(None, feed)[0].astype(np.float64)
    got = ort.InferenceSession(str(out)).run(None, feed)[0]
    return float(10 * np.log10(np.sum(ref**2) / np.sum((ref - got) ** 2)))


def test_the_depthwise_input_is_clipped_and_the_output_is_closer(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(wide_channel_then_depthwise(), src)
    calib, test = feeds(6, 1), feeds(1, 2)[0]
    quanta.quantize_static(src, tmp_path / "minmax.onnx", calib, method="minmax", verbose=False)
    quanta.quantize_static(src, tmp_path / "w.onnx", calib, method="weighted_mse", verbose=False)
    mm, w = q_range(tmp_path / "minmax.onnx", "y"), q_range(tmp_path / "w.onnx", "y")
    assert w[1] - w[0] < 0.5 * (mm[1] - mm[0])  # channel 0 is clipped: its weights are tiny
    assert q_range(tmp_path / "w.onnx", "x") != mm  # the graph input feeds a Conv too
    assert sqnr(src, tmp_path / "w.onnx", test) > sqnr(src, tmp_path / "minmax.onnx", test) + 6.0


def test_a_tensor_that_an_add_also_reads_gets_plain_mse(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(wide_channel_then_depthwise(also_add=True), src)
    model = load_for_quantization(str(src))
    recipe = Recipe(method="weighted_mse")
    weights = consumer_channel_weights(model.graph, plan_qdq(model.graph, recipe))
    assert "y" not in weights and "x" in weights
    axis, g = weights["x"]
    assert axis == 1 and g.shape == (3,)
    calib = feeds(6, 1)
    for method in ("minmax", "mse", "weighted_mse"):
        quanta.quantize_static(src, tmp_path / f"{method}.onnx", calib, method=method, verbose=False)
    w, mse, mm = (q_range(tmp_path / f"{m}.onnx", "y") for m in ("weighted_mse", "mse", "minmax"))
    assert w == mse  # not only weights read it: eq. (21) on the tensor itself
    assert mm[0] <= w[0] and w[1] <= mm[1] and w != mm  # the wide channel's tail is clipped


def test_a_tensor_that_an_average_reads_keeps_minmax(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(wide_channel_then_depthwise(also_pool=True), src)
    model = load_for_quantization(str(src))
    plan = plan_qdq(model.graph, Recipe(method="weighted_mse"))
    assert averaged_activations(model.graph, plan) == {"y"}
    calib = feeds(6, 1)
    for method in ("minmax", "weighted_mse"):
        quanta.quantize_static(src, tmp_path / f"{method}.onnx", calib, method=method, verbose=False)
    # a mean over 9x11 pixels divides the rounding noise by 99, not a clipped tail's bias
    assert q_range(tmp_path / "weighted_mse.onnx", "y") == q_range(tmp_path / "minmax.onnx", "y")


def test_averaged_activations_look_through_views():
    g = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["y"], name="conv"),
            helper.make_node("Reshape", ["y", "shape"], ["r"], name="view"),
            helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
            helper.make_node("Conv", ["p", "w2"], ["m"], name="head"),
            helper.make_node("Conv", ["x", "w"], ["y2"], name="conv2"),
            helper.make_node("Conv", ["y2", "w2"], ["s"], name="conv3"),
        ],
        "views",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 7])],
        [
            helper.make_tensor_value_info("m", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, None),
        ],
        [
            numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w"),
            numpy_helper.from_array(np.ones((2, 4, 1, 1), np.float32), "w2"),
            numpy_helper.from_array(np.array([1, 4, 35, 1], np.int64), "shape"),
        ],
    )
    model = load_for_quantization(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
    plan = plan_qdq(model.graph, Recipe(method="weighted_mse"))
    assert averaged_activations(model.graph, plan) == {"y"}  # through the Reshape; y2 is not averaged
