"""Eq. (29): a tensor that only depthwise Convs read takes one grid per channel (axis 1)
where that beats its per-tensor range, and the file still lowers to integer kernels
(passes/lower/per_channel_activation.py)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.quantize.recipe import Recipe, RecipeError
from quanta.runtime.coverage import lowered_coverage

ort = pytest.importorskip("onnxruntime")

C = 7


def spread_block(also_conv: bool = False, clip: bool = True, seed: int = 0) -> onnx.ModelProto:
    """x -> 1x1 Conv -> Clip(0, 6) -> y -> depthwise 3x3 Conv -> Relu -> 1x1 Conv, y's channels 100x
    apart in range (channel c scaled by 100^(-c/6)) and the depthwise weights the inverse,
    so every channel matters alike downstream. ``also_conv``: y is also read by a 1x1
    Conv (not depthwise), whose output is added to z. ``clip=False``: y is the Conv's
    output itself."""
    rng = np.random.default_rng(seed)
    gain = 100.0 ** (-np.arange(C) / (C - 1))
    w1 = (rng.standard_normal((C, 3, 1, 1)) * gain[:, None, None, None]).astype(np.float32)
    b1 = (0.5 * gain).astype(np.float32)
    w2 = (rng.standard_normal((C, 1, 3, 3)) / gain[:, None, None, None]).astype(np.float32)
    b2 = rng.standard_normal(C).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["p"], name="pw"),
        helper.make_node("Clip", ["p", "lo", "hi"], ["y"], name="relu6")
        if clip
        else helper.make_node("Identity", ["p"], ["y"], name="same"),
        helper.make_node("Conv", ["y", "w2", "b2"], ["z"], name="dw", group=C, pads=[1, 1, 1, 1]),
    ]
    inits = [
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(b1, "b1"),
        numpy_helper.from_array(np.float32(0.0), "lo"),
        numpy_helper.from_array(np.float32(6.0), "hi"),
        numpy_helper.from_array(w2, "w2"),
        numpy_helper.from_array(b2, "b2"),
    ]
    # a Relu after the depthwise Conv (MobileNet, EfficientNet): its output is quantized
    # after the Relu, which the codes imply
    nodes.append(helper.make_node("Relu", ["z"], ["zr"], name="relu"))
    nodes.append(helper.make_node("Conv", ["zr", "w4"], ["o"], name="head"))
    inits.append(numpy_helper.from_array(rng.standard_normal((3, C, 1, 1)).astype(np.float32), "w4"))
    out = "o"
    if also_conv:
        w3 = (rng.standard_normal((3, C, 1, 1)) / gain[None, :, None, None] * 0.3).astype(np.float32)
        nodes += [
            helper.make_node("Conv", ["y", "w3"], ["u"], name="pw2"),
            helper.make_node("Add", ["o", "u"], ["s"], name="add"),
        ]
        inits.append(numpy_helper.from_array(w3, "w3"))
        out = "s"
    g = helper.make_graph(
        nodes,
        "spread",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 10, 13])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 3, 10, 13)).astype(np.float32)} for _ in range(n)]


def q_of(path, tensor: str):
    node = next(
        n for n in load(path).graph.nodes if n.op_type == "QuantizeLinear" and n.inputs[0].name == tensor
    )
    return node.outputs[0].type.elem


def sqnr(src, out, feed_list) -> float:
    num = den = 0.0
    ref_s = ort.InferenceSession(str(src))
    got_s = quanta.InferenceSession(str(out))
    for feed in feed_list:
        ref = ref_s.run(None, feed)[0].astype(np.float64)
        got = np.asarray(got_s.run(None, feed)[0], np.float64)
        num, den = num + np.sum(ref**2), den + np.sum((ref - got) ** 2)
    return float(10 * np.log10(num / den))


def recipe_of(path) -> dict:
    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    return json.loads(meta["quanta.recipe"])


def test_channels_100x_apart_take_per_channel_grids_and_lower_to_integers(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(spread_block(), src)
    calib, test = feeds(8, 1), feeds(4, 2)
    quanta.quantize_static(src, tmp_path / "pt.onnx", calib, depthwise_input_per_channel="off", verbose=False)
    summary = quanta.quantize_static(src, tmp_path / "pc.onnx", calib, verbose=False)
    # the user deploying with ONNX Runtime is told what the per-channel grid costs there
    note = next(n for n in summary.notes if n.startswith("depthwise inputs"))
    assert "per channel" in note and "ONNX Runtime runs these depthwise convolutions in float" in note
    q = q_of(tmp_path / "pc.onnx", "y")
    assert q.axis == 1 and len(q.scale) == C and len(set(q.zero_point)) == 1
    assert max(q.scale) / min(q.scale) > 20.0
    assert q_of(tmp_path / "pt.onnx", "y").axis is None
    assert recipe_of(tmp_path / "pc.onnx")["depthwise_input_per_channel"] == ["y"]
    assert recipe_of(tmp_path / "pt.onnx")["depthwise_input_per_channel"] == "off"
    assert sqnr(src, tmp_path / "pc.onnx", test) > sqnr(src, tmp_path / "pt.onnx", test) + 6.0
    report = lowered_coverage(load(tmp_path / "pc.onnx"))
    integer = {c.name: c.integer_op for c in report.nodes}
    assert integer["pw"] and integer["dw"]  # the head's output is a float graph output
    onnx.checker.check_model(str(tmp_path / "pc.onnx"), full_check=True)
    ort_out = ort.InferenceSession(str(tmp_path / "pc.onnx")).run(None, test[0])[0]
    ref = ort.InferenceSession(str(src)).run(None, test[0])[0]
    assert np.abs(ort_out - ref).max() < 0.1 * np.abs(ref).max()


def test_a_tensor_also_read_by_a_pointwise_conv_stays_per_tensor(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(spread_block(also_conv=True), src)
    quanta.quantize_static(src, tmp_path / "q.onnx", feeds(6, 1), verbose=False)
    assert all(
        n.outputs[0].type.elem.axis is None
        for n in load(tmp_path / "q.onnx").graph.nodes
        if n.op_type == "QuantizeLinear" and not n.inputs[0].is_const
    )
    assert recipe_of(tmp_path / "q.onnx")["depthwise_input_per_channel"] == []


def test_a_conv_read_directly_stays_per_tensor(tmp_path):
    """ONNX Runtime fuses DQ -> Conv -> Q(per-channel) into a QLinearConv that then fails
    on the vector zero point: without a Relu / Clip between, the grid stays per tensor."""
    src = tmp_path / "m.onnx"
    onnx.save(spread_block(clip=False), src)
    quanta.quantize_static(src, tmp_path / "q.onnx", feeds(6, 1), verbose=False)
    assert recipe_of(tmp_path / "q.onnx")["depthwise_input_per_channel"] == []
    ort.InferenceSession(str(tmp_path / "q.onnx")).run(None, feeds(1, 2)[0])


def test_even_channels_keep_the_per_tensor_grid(tmp_path):
    """Channels of one range: eq. (29) gains nothing, the per-tensor grid stays."""
    src = tmp_path / "m.onnx"
    model = spread_block()
    for init in model.graph.initializer:  # undo the spread
        if init.name in ("w1", "b1", "w2"):
            a = numpy_helper.to_array(init)
            gain = 100.0 ** (-np.arange(C) / (C - 1))
            shape = (C,) + (1,) * (a.ndim - 1)
            a = a / gain.reshape(shape) if init.name != "w2" else a * gain.reshape(shape)
            init.CopyFrom(numpy_helper.from_array(a.astype(np.float32), init.name))
    onnx.save(model, src)
    quanta.quantize_static(src, tmp_path / "q.onnx", feeds(6, 1), verbose=False)
    assert q_of(tmp_path / "q.onnx", "y").axis is None
    assert recipe_of(tmp_path / "q.onnx")["depthwise_input_per_channel"] == []


def test_byte_identical_and_the_recorded_recipe_reproduces_the_file(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(spread_block(), src)
    for name in ("a", "b"):
        quanta.quantize_static(src, tmp_path / f"{name}.onnx", feeds(4, 3), verbose=False)
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    recipe = Recipe.from_dict(recipe_of(tmp_path / "a.onnx"))
    assert recipe.depthwise_input_per_channel == ("y",)
    quanta.quantize_static(src, tmp_path / "c.onnx", feeds(4, 3), recipe, verbose=False)
    assert (tmp_path / "c.onnx").read_bytes() == (tmp_path / "a.onnx").read_bytes()


def test_the_option_is_checked():
    with pytest.raises(RecipeError, match="depthwise_input_per_channel"):
        Recipe(depthwise_input_per_channel="always")
    assert Recipe(depthwise_input_per_channel=["a", "b"]).depthwise_input_per_channel == ("a", "b")


def test_sharded_calibration_gives_the_same_file(tmp_path):
    """The per-tensor range eq. (29b) measures against travels in the workers' results."""
    src = tmp_path / "m.onnx"
    onnx.save(spread_block(), src)
    data = feeds(8, 1)
    quanta.quantize_static(src, tmp_path / "one.onnx", data, verbose=False)
    quanta.quantize_static(src, tmp_path / "three.onnx", data, verbose=False, engine="inprocess", workers=3)
    assert recipe_of(tmp_path / "three.onnx")["depthwise_input_per_channel"] == ["y"]
    assert (tmp_path / "three.onnx").read_bytes() == (tmp_path / "one.onnx").read_bytes()
