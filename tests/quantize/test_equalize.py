"""Cross-layer equalization (quanta.quantize.equalize, docs/debugger.md eq. (14)): the
float function is unchanged on the data the factors come from, the channels of the
activations between two convolutions even out, and a network whose channels span very
different ranges loses less to 8-bit activations; the file is deterministic and its
recipe reproduces it."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import quanta
from tests.quantize.test_smooth import _sqnr

# the expansion's output channels span 50x: channels 1 and 3 get a few levels of the
# per-tensor grid that channel 0 sets; the depthwise layer weighs the small channels up
# (as a folded batch norm does), so their rounding noise reaches the output
ROW_SCALE = np.array([1.0, 0.02, 0.3, 0.05, 0.8, 0.1, 0.45], np.float32)


def block(seed: int = 0) -> onnx.ModelProto:
    """x[N,3,11,13] -> Conv 3x3 (3->7) -> Clip(0, 6) -> depthwise Conv 3x3 (7) -> Relu ->
    Conv 1x1 (7->5) -> y: an inverted-residual block without its residual."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((7, 3, 3, 3)) * 0.5).astype(np.float32) * ROW_SCALE[:, None, None, None]
    b1 = (rng.standard_normal(7) * 0.3).astype(np.float32) * ROW_SCALE
    up = 1.0 / np.sqrt(ROW_SCALE)
    w2 = (rng.standard_normal((7, 1, 3, 3)) * 0.6).astype(np.float32) * up[:, None, None, None]
    b2 = (rng.standard_normal(7) * 0.1).astype(np.float32)
    w3 = (rng.standard_normal((5, 7, 1, 1)) * 0.5).astype(np.float32)
    b3 = (rng.standard_normal(5) * 0.1).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["z1"], name="expand", pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["z1", "lo", "hi"], ["a1"], name="relu6"),
        helper.make_node("Conv", ["a1", "w2", "b2"], ["z2"], name="depthwise", pads=[1, 1, 1, 1], group=7),
        helper.make_node("Relu", ["z2"], ["a2"], name="relu"),
        helper.make_node("Conv", ["a2", "w3", "b3"], ["y"], name="project"),
    ]
    inits = [
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(b1, "b1"),
        numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
        numpy_helper.from_array(np.array(6.0, np.float32), "hi"),
        numpy_helper.from_array(w2, "w2"),
        numpy_helper.from_array(b2, "b2"),
        numpy_helper.from_array(w3, "w3"),
        numpy_helper.from_array(b3, "b3"),
    ]
    g = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 11, 13])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5, 11, 13])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(n: int, seed: int):
    rng = np.random.default_rng(seed)
    return [{"x": (rng.standard_normal((4, 3, 11, 13)) * 1.5).astype(np.float32)} for _ in range(n)]


def _with_outputs(model: onnx.ModelProto, names: list[str]) -> bytes:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for n in names:
        m.graph.output.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, None))
    return m.SerializeToString()


def _planned():
    from quanta.ir.onnx_io import load
    from quanta.quantize.equalize import plan_equalization

    model = load(block())
    return model, plan_equalization(model.graph, quanta.Recipe().op_types)


def test_the_sites_are_the_activations_between_two_convolutions():
    _, sites = _planned()
    assert [(s.a.name, s.y.name, [u.name for u in s.consumers]) for s in sites] == [
        ("expand", "a1", ["depthwise"]),
        ("depthwise", "a2", ["project"]),
    ]
    # the depthwise reader costs nothing (alpha 1), the 1x1 projection mixes channels
    assert [s.depthwise() for s in sites] == [True, False]


def test_an_activation_another_node_reads_is_left_alone():
    from quanta.ir.onnx_io import load
    from quanta.quantize.equalize import plan_equalization

    m = block()
    m.graph.node.append(helper.make_node("Sigmoid", ["a1"], ["side"], name="side"))
    m.graph.output.append(helper.make_tensor_value_info("side", TensorProto.FLOAT, None))
    sites = plan_equalization(load(m).graph, quanta.Recipe().op_types)
    assert [s.y.name for s in sites] == ["a2"]
    # a Clip with a negative lower bound is not positively homogeneous
    m = block()
    m.graph.initializer[2].CopyFrom(numpy_helper.from_array(np.array(-1.0, np.float32), "lo"))
    assert [s.y.name for s in plan_equalization(load(m).graph, quanta.Recipe().op_types)] == ["a2"]


def test_equalization_keeps_the_function_and_evens_out_the_channels():
    from quanta.ir.onnx_io import to_proto
    from quanta.quantize.equalize import apply_equalization

    model, sites = _planned()
    feeds = _feeds(4, 1)
    probe = quanta.InferenceSession(_with_outputs(block(), ["a1", "a2"]), backend="reference")
    ref = []
    for f in feeds:
        y, a1, a2 = probe.run(None, f)
        ref.append(y)
        sites[0].observe(a1)
        sites[1].observe(a2)
    before = [s.absmax.copy() for s in sites]
    # a2's channels are even (the depthwise layer weighs a1's small ones up): under
    # MIN_GAIN_DB, left alone
    assert apply_equalization(model.graph, sites) == ["a1"]
    # the scaled tensors are not the float model's: new names for the debugger
    names = {v.name for n in model.graph.nodes for v in n.outputs}
    assert not names & {"z1", "a1"} and {"z2", "a2"} <= names
    eq = to_proto(model)
    sess = quanta.InferenceSession(eq.SerializeToString(), backend="reference")
    for f, r in zip(feeds, ref):
        np.testing.assert_allclose(sess.run(None, f)[0], r, rtol=1e-4, atol=1e-4)
    # the channel maxima of the activation the depthwise layer reads spread less (eq. (14))
    probe = quanta.InferenceSession(
        _with_outputs(eq, [model.graph.nodes[1].outputs[0].name]), backend="reference"
    )
    after = np.max([np.abs(probe.run(None, f)[1]).max(axis=(0, 2, 3)) for f in feeds], axis=0)
    spread = lambda m: m.max() / m.min()  # noqa: E731
    assert spread(after) < 0.25 * spread(before[0])


def test_equalization_wins_back_the_small_channels(tmp_path):
    src = tmp_path / "block.onnx"
    onnx.save(block(), src)
    plain, eq = tmp_path / "plain.onnx", tmp_path / "eq.onnx"
    calib = _feeds(6, 2)
    # the image in 16 bits on both sides: its rounding would hide the activations'
    wide = {"x": {"dtype": "int16"}}
    # per-tensor grids on both sides: one grid per channel of the depthwise input (eq. (29),
    # tests/quantize/test_depthwise_per_channel.py) wins the small channels back too
    pt = "off"
    quanta.quantize_static(src, plain, calib, overrides=wide, depthwise_input_per_channel=pt, verbose=False)
    quanta.quantize_static(
        src, eq, calib, overrides=wide, equalize=True, depthwise_input_per_channel=pt, verbose=False
    )
    held = _feeds(4, 9)
    assert _sqnr(src, eq, held) > _sqnr(src, plain, held) + 1.0  # measured: +1.8 dB


def test_the_equalized_file_is_deterministic_and_its_recipe_reproduces_it(tmp_path):
    src = tmp_path / "block.onnx"
    onnx.save(block(), src)
    calib = _feeds(5, 3)
    a, b, c = (tmp_path / f"{k}.onnx" for k in "abc")
    quanta.quantize_static(src, a, calib, equalize=True, verbose=False)
    quanta.quantize_static(src, b, calib, equalize=True, verbose=False)
    assert a.read_bytes() == b.read_bytes()
    meta = {p.key: p.value for p in onnx.load(str(a)).metadata_props}
    recipe = json.loads(meta["quanta.recipe"])
    assert recipe["equalize"] is True
    quanta.quantize_static(src, c, calib, recipe=quanta.Recipe.from_dict(recipe), verbose=False)
    assert c.read_bytes() == a.read_bytes()


def test_the_cli_flag_records_equalize_in_the_recipe(tmp_path):
    from quanta.cli.main import main

    src = tmp_path / "block.onnx"
    onnx.save(block(), src)
    calib = tmp_path / "calib"
    calib.mkdir()
    for k, f in enumerate(_feeds(3, 4)):
        np.savez(calib / f"{k}.npz", **f)
    outs = [tmp_path / "plain.onnx", tmp_path / "eq.onnx"]
    assert main(["quantize", str(src), "-o", str(outs[0]), "--calib", str(calib)]) == 0
    assert main(["quantize", str(src), "-o", str(outs[1]), "--calib", str(calib), "--equalize"]) == 0
    recipes = [json.loads(onnx.load(str(p)).metadata_props[0].value)["equalize"] for p in outs]
    assert recipes == [False, True]


def test_factors_follow_eq_14_and_skip_channels_whose_maxima_do_not_reproduce():
    from quanta.quantize.equalize import K_MAX, MARGIN, factors

    _, sites = _planned()
    site = sites[0]  # depthwise reader: alpha 1
    even = np.array([6.0, 0.01, 3.0, 0.5, 5.5, 0.25, 1.0])
    odd = np.array([5.8, 0.011, 2.9, 1.5, 6.0, 0.24, 1.1])  # channel 3: 3x apart
    for m in (even, odd):
        site.observe(np.broadcast_to(m[None, :, None, None], (2, 7, 3, 5)).copy())
    k = factors(site)
    top = 6.0
    want = np.clip(top / (MARGIN * np.maximum(even, odd)), 1.0, K_MAX)
    want[3] = 1.0
    np.testing.assert_allclose(k, want)
    assert k[1] == K_MAX and k[0] == 1.0
