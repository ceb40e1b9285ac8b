"""method="weighted_mse": activations read only by Conv/Gemm/MatMul get the range that
minimises the error those layers see (eq. (22)); every other tensor MinMax or MSE
(eq. (24), tests/quantize/test_range_choice.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.quantize.qdq import consumer_channel_weights, plan_qdq
from quanta.quantize.recipe import Recipe
from quanta.quantize.static import load_for_quantization
from tests.ort_int8 import ort_session_options

ort = pytest.importorskip("onnxruntime")

C = 7


def wide_channel_then_depthwise(also_add: bool = False, seed: int = 0) -> onnx.ModelProto:
    """x -> 1x1 Conv (channel 0 forty times wider than the rest) -> y -> depthwise 3x3
    Conv that multiplies channel 0 by ~0.01 and the others by ~3 -> z. ``also_add``: y
    is also read by an Add (its error then reaches the output directly)."""
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
    got = ort.InferenceSession(str(out), ort_session_options()).run(None, feed)[0]  # tests/ort_int8.py
    return float(10 * np.log10(np.sum(ref**2) / np.sum((ref - got) ** 2)))


def test_the_depthwise_input_is_clipped_and_the_output_is_closer(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(wide_channel_then_depthwise(), src)
    calib, test = feeds(6, 1), feeds(1, 2)[0]
    quanta.quantize_static(src, tmp_path / "minmax.onnx", calib, method="minmax", verbose=False)
    # per tensor: eq. (29)'s per-channel grid is tests/quantize/test_depthwise_per_channel.py
    quanta.quantize_static(
        src,
        tmp_path / "w.onnx",
        calib,
        method="weighted_mse",
        depthwise_input_per_channel="off",
        verbose=False,
    )
    mm, w = q_range(tmp_path / "minmax.onnx", "y"), q_range(tmp_path / "w.onnx", "y")
    assert w[1] - w[0] < 0.5 * (mm[1] - mm[0])  # channel 0 is clipped: its weights are tiny
    assert q_range(tmp_path / "w.onnx", "x") != mm  # the graph input feeds a Conv too
    assert sqnr(src, tmp_path / "w.onnx", test) > sqnr(src, tmp_path / "minmax.onnx", test) + 6.0


def test_a_tensor_that_an_add_also_reads_keeps_minmax(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(wide_channel_then_depthwise(also_add=True), src)
    model = load_for_quantization(str(src))
    recipe = Recipe(method="weighted_mse")
    weights = consumer_channel_weights(model.graph, plan_qdq(model.graph, recipe))
    assert "y" not in weights and "x" in weights
    axis, g = weights["x"]
    assert axis == 1 and g.shape == (3,)
    calib = feeds(6, 1)
    quanta.quantize_static(src, tmp_path / "mm.onnx", calib, method="minmax", verbose=False)
    # y is outside eq. (22): MinMax when other_ranges says so (eq. (24) chooses otherwise)
    quanta.quantize_static(
        src, tmp_path / "w.onnx", calib, method="weighted_mse", other_ranges="minmax", verbose=False
    )
    assert q_range(tmp_path / "w.onnx", "y") == q_range(tmp_path / "mm.onnx", "y")


def test_weighted_mse_files_are_byte_identical(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(wide_channel_then_depthwise(), src)
    for name in ("a", "b"):
        quanta.quantize_static(
            src, tmp_path / f"{name}.onnx", feeds(4, 3), method="weighted_mse", verbose=False
        )
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
