"""SmoothQuant-style balancing (quanta.quantize.smooth): the float function is unchanged,
the activation channels even out, and an FFN-like layer with outlier channels loses less
to 8-bit activations."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.quantize.recipe import RecipeError


def ffn(seed: int = 0) -> onnx.ModelProto:
    """x[N,19] -> MatMul up (19x37) -> Mul 0.5 (a GELU's last step) -> MatMul down (37x11) -> y.
    Channels 3 and 30 of the up-projection are 40x larger: the outliers of a GELU output."""
    rng = np.random.default_rng(seed)
    up = rng.standard_normal((19, 37)).astype(np.float32) * 0.2
    up[:, [3, 30]] *= 40.0
    down = rng.standard_normal((37, 11)).astype(np.float32) * 0.2
    nodes = [
        helper.make_node("MatMul", ["x", "up"], ["u"], name="up"),
        helper.make_node("Mul", ["u", "half"], ["h"], name="mul"),
        helper.make_node("MatMul", ["h", "down"], ["y"], name="down"),
    ]
    inits = [
        numpy_helper.from_array(up, "up"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        numpy_helper.from_array(down, "down"),
    ]
    g = helper.make_graph(
        nodes,
        "ffn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 19])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 11])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(n: int, seed: int):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((32, 19)).astype(np.float32)} for _ in range(n)]


def _sqnr(src, path, feeds) -> float:
    ref = quanta.InferenceSession(str(src), backend="reference")
    got = quanta.InferenceSession(str(path), backend="reference")
    sig = noise = 0.0
    for f in feeds:
        r, q = ref.run(None, f)[0].astype(np.float64), got.run(None, f)[0]
        sig += float(np.sum(r**2))
        noise += float(np.sum((r - q) ** 2))
    return 10 * np.log10(sig / noise)


def test_smoothing_keeps_the_function_and_wins_back_the_outlier_channels(tmp_path):
    from quanta.ir.onnx_io import load
    from quanta.quantize.smooth import apply_smoothing, plan_smoothing

    model = load(ffn())
    sites = plan_smoothing(model.graph, quanta.Recipe().op_types)
    assert [s.x.name for s in sites] == ["h"]
    feeds = _feeds(3, 1)
    ref = [
        quanta.InferenceSession(ffn().SerializeToString(), backend="reference").run(None, f)[0] for f in feeds
    ]
    for f in feeds:
        sites[0].observe(np.asarray(f["x"] @ onnx.numpy_helper.to_array(ffn().graph.initializer[0]) * 0.5))
    before = sites[0].absmax.copy()
    assert apply_smoothing(model.graph, sites, 0.5) == ["mul"]
    from quanta.ir.onnx_io import to_proto

    sess = quanta.InferenceSession(to_proto(model).SerializeToString(), backend="reference")
    for f, r in zip(feeds, ref):
        np.testing.assert_allclose(sess.run(None, f)[0], r, rtol=1e-4, atol=1e-5)
    # the channel maxima of the balanced activation spread less
    c = model.graph.nodes[1].inputs[1].const
    after = before * np.asarray(c) / 0.5
    assert after.max() / np.median(after) < 0.5 * before.max() / np.median(before)

    src = tmp_path / "ffn.onnx"
    onnx.save(ffn(), src)
    plain, smooth = tmp_path / "plain.onnx", tmp_path / "smooth.onnx"
    # the same float Mul, no balancing
    quanta.quantize_static(src, plain, _feeds(4, 2), exclude=["mul"], smooth_quant=None, verbose=False)
    quanta.quantize_static(src, smooth, _feeds(4, 2), smooth_quant=0.5, verbose=False)
    held = _feeds(3, 9)
    assert _sqnr(src, smooth, held) > _sqnr(src, plain, held) + 3.0


def test_an_activation_other_nodes_read_is_left_alone():
    from quanta.ir.onnx_io import load
    from quanta.quantize.smooth import plan_smoothing

    m = ffn()
    m.graph.node.append(helper.make_node("Relu", ["h"], ["r"], name="side"))
    m.graph.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, ["N", 37]))
    assert plan_smoothing(load(m).graph, quanta.Recipe().op_types) == []
    with pytest.raises(RecipeError, match="smooth_quant"):
        quanta.Recipe(smooth_quant=1.5)


def test_an_activation_other_nodes_read_gets_a_mul_of_its_own(tmp_path):
    """With insert, the MatMul reads Mul(h, 1/s); the Relu keeps h itself; the function is
    unchanged; the inserted Mul stays float and the file still runs every MatMul in integer."""
    from quanta.ir.onnx_io import load, to_proto
    from quanta.quantize.smooth import apply_smoothing, plan_smoothing

    m = ffn()
    m.graph.node.append(helper.make_node("Relu", ["h"], ["r"], name="side"))
    m.graph.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, ["N", 37]))
    model = load(m)
    sites = plan_smoothing(model.graph, quanta.Recipe().op_types, insert=True)
    # u (the up-projection's output) feeds only the Mul; x feeds the up-projection
    assert sorted(s.x.name for s in sites) == ["h", "x"]
    site = next(s for s in sites if s.x.name == "h")
    assert site.mul is None and [u.name for u in site.consumers] == ["down"]
    feeds = _feeds(3, 1)
    ref = [quanta.InferenceSession(m.SerializeToString(), backend="reference").run(None, f) for f in feeds]
    up = onnx.numpy_helper.to_array(m.graph.initializer[0])
    for f in feeds:
        site.observe(np.asarray(f["x"] @ up * 0.5))
    names = apply_smoothing(model.graph, [site], 0.5)
    assert len(names) == 1
    mul = next(n for n in model.graph.nodes if n.name == names[0])
    assert mul.op_type == "Mul" and mul.inputs[0].name == "h"
    side = next(n for n in model.graph.nodes if n.name == "side")
    assert side.inputs[0].name == "h"
    sess = quanta.InferenceSession(to_proto(model).SerializeToString(), backend="reference")
    for f, r in zip(feeds, ref):
        got = sess.run(None, f)
        for a, b in zip(got, r):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)

    src = tmp_path / "side.onnx"
    onnx.save(m, src)
    plain, smooth = tmp_path / "plain.onnx", tmp_path / "smooth.onnx"
    quanta.quantize_static(src, plain, _feeds(4, 2), smooth_quant=None, verbose=False)
    summary = quanta.quantize_static(src, smooth, _feeds(4, 2), smooth_quant=0.8, verbose=False)
    assert summary.integer_share == 1.0
    again = tmp_path / "again.onnx"
    quanta.quantize_static(src, again, _feeds(4, 2), smooth_quant=0.8, verbose=False)
    assert again.read_bytes() == smooth.read_bytes()  # deterministic
    held = _feeds(3, 9)
    assert _sqnr(src, smooth, held) > _sqnr(src, plain, held) + 3.0


def test_even_channels_are_left_alone():
    """Channel maxima within MIN_SPREAD of each other: nothing to balance, no Mul added."""
    from quanta.ir.onnx_io import load
    from quanta.quantize.smooth import apply_smoothing, plan_smoothing

    model = load(ffn())
    sites = plan_smoothing(model.graph, quanta.Recipe().op_types, insert=True)
    x_site = next(s for s in sites if s.x.name == "x")
    x_site.observe(np.random.default_rng(0).standard_normal((64, 19)))
    n_nodes = len(model.graph.nodes)
    assert apply_smoothing(model.graph, [x_site], 0.8) == []
    assert len(model.graph.nodes) == n_nodes


def _observed_site(feeds: list[np.ndarray]):
    from quanta.ir.onnx_io import load
    from quanta.quantize.smooth import plan_smoothing

    model = load(ffn())
    site = next(
        s for s in plan_smoothing(model.graph, quanta.Recipe().op_types, insert=True) if s.x.name == "x"
    )
    for f in feeds:
        site.observe(f)
    return model, site


def test_maxima_that_do_not_reproduce_are_left_alone():
    """Eq. (13c): sparse features (each feed lights a few channels, some never) spread as
    much as outlier channels do, but their even-feed and odd-feed maxima disagree: the
    factors would be fitted to samples, so the site is not balanced."""
    from quanta.quantize.smooth import MAX_UNSTABLE, apply_smoothing

    rng = np.random.default_rng(3)
    mags = np.geomspace(0.2, 20.0, 17)
    sparse = []
    for _ in range(8):
        x = np.zeros((32, 19))
        on = rng.choice(17, size=4, replace=False)  # channels 17 and 18 never light
        x[:, on] = np.abs(rng.standard_normal((32, 4))) * mags[on]
        sparse.append(x)
    model, site = _observed_site(sparse)
    assert site.absmax.max() >= 4.0 * np.median(site.absmax[site.absmax > 0])  # passes eq. (13b)
    assert site.unstable_share() > MAX_UNSTABLE
    n_nodes = len(model.graph.nodes)
    assert apply_smoothing(model.graph, [site], 0.8) == []
    assert len(model.graph.nodes) == n_nodes

    # outlier channels that every feed shows (a transformer's): reproducible, balanced
    dense = []
    for _ in range(7):
        x = rng.standard_normal((32, 19))
        x[:, [2, 11]] *= 30.0
        dense.append(x)
    model, site = _observed_site(dense)
    assert site.unstable_share() <= MAX_UNSTABLE
    assert len(apply_smoothing(model.graph, [site], 0.8)) == 1


def test_reproducibility_needs_two_feeds():
    x = np.random.default_rng(0).standard_normal((32, 19))
    x[:, 5] *= 50.0
    _, site = _observed_site([x])
    assert site.unstable_share() == 0.0  # one feed: nothing to compare, eq. (13b) decides
    _, site = _observed_site([x, np.where(np.arange(19) == 5, 0.0, x)])  # channel 5 dark in feed 2
    assert site.unstable_share() == pytest.approx(1 / 19)


def test_a_folded_site_renames_its_tensor_so_the_debugger_does_not_compare_x_with_x_over_s(tmp_path):
    """The folded factor makes the Mul's output x / s: it is renamed ``h_smooth`` (as an
    inserted Mul's output is), so quanta debug, which matches tensors by name, never
    reports x / s against the float x as quantization error (TesseraNet's GELU outputs:
    local SQNR below 0 dB at their MatMuls and a "calibrate with mse" suggestion, both
    comparisons of differently scaled tensors); it computes x / s from the FP32 tensors
    by the quantized model's Mul, so the layer that reads it keeps a local row."""
    from quanta.debug.compare import compare

    src = tmp_path / "ffn.onnx"
    onnx.save(ffn(), src)
    dst = tmp_path / "smooth.onnx"
    quanta.quantize_static(src, dst, _feeds(4, 2), smooth_quant=0.5, verbose=False)
    names = {o for n in onnx.load(dst).graph.node for o in n.output}
    assert "h_smooth" in names and "h" not in names
    res = compare(src, dst, _feeds(3, 9))
    assert "h_smooth" not in res.unmatched
    (down,) = [r for r in res.nodes if r.name == "down"]
    assert down.inputs == ["h_smooth"] and down.local is not None and down.local.count > 0
    # no local error made up from x against x / s (before the rename: far below 0 dB)
    assert down.local_db > 20 and down.inherited_db > 20
