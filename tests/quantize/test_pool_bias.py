"""Eq. (28): a Conv / Gemm that reads a global average pool absorbs the mean error of its
pooled input, measured on the calibration feeds (quanta.quantize.pool_bias)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.quantize.pool_bias import PoolBias, _apply, _shrunk, pooled_layers
from quanta.quantize.qdq import plan_qdq
from quanta.quantize.recipe import Recipe
from quanta.quantize.static import recipe_of

ort = pytest.importorskip("onnxruntime")

C_IN, C_MID, C_OUT, H, W = 7, 17, 3, 11, 13


def pooled(head: str = "conv", pool: str = "gap") -> onnx.ModelProto:
    """x -> 3x3 Conv (7 -> 17) -> HardSwish -> a global pool -> a head with 3 outputs.
    ``head``: "conv" a 1x1 Conv without a bias, "gemm" Flatten -> Gemm with one, "conv3"
    a 3x3 Conv (padded; not corrected). ``pool``: "gap" GlobalAveragePool, "mean" ReduceMean
    over H and W, "mean_c" ReduceMean over the channels (not a global pool)."""
    rng = np.random.default_rng(11)
    w1 = (rng.standard_normal((C_MID, C_IN, 3, 3)) * 0.3).astype(np.float32)
    b1 = rng.uniform(-1.5, 2.5, C_MID).astype(np.float32)
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1")]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["a"], name="c1", pads=[1, 1, 1, 1]),
        helper.make_node("HardSwish", ["a"], ["h"], name="hs"),
    ]
    if pool == "gap":
        nodes.append(helper.make_node("GlobalAveragePool", ["h"], ["p"], name="gap"))
    else:
        axes = [2, 3] if pool == "mean" else [1]
        nodes.append(helper.make_node("ReduceMean", ["h"], ["p"], name="mean", axes=axes, keepdims=1))
    if head == "gemm":
        w2 = (rng.standard_normal((C_OUT, C_MID)) * 0.5).astype(np.float32)
        inits += [
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(np.full(C_OUT, 0.25, np.float32), "b2"),
        ]
        nodes += [
            helper.make_node("Flatten", ["p"], ["f"], name="flat"),
            helper.make_node("Gemm", ["f", "w2", "b2"], ["y"], name="head", transB=1),
        ]
    else:
        k = 3 if head == "conv3" else 1
        w2 = (rng.standard_normal((C_OUT, C_MID, k, k)) * 0.5).astype(np.float32)
        inits.append(numpy_helper.from_array(w2, "w2"))
        pads = [1, 1, 1, 1] if k == 3 else [0, 0, 0, 0]
        nodes.append(helper.make_node("Conv", ["p", "w2"], ["y"], name="head", pads=pads))
    g = helper.make_graph(
        nodes,
        "pooled",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", C_IN, H, W])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    # channels that sit near one value each (a small spread around a per-channel level):
    # each one's rounding error has a mean that the pool keeps
    rng = np.random.default_rng(seed)
    level = np.linspace(-1.0, 1.6, C_IN, dtype=np.float32)[None, :, None, None]
    return [{"x": (level + 0.01 * rng.standard_normal((2, C_IN, H, W))).astype(np.float32)} for _ in range(n)]


def _plan_targets(model: onnx.ModelProto) -> dict[str, str]:
    from quanta.quantize.static import prepare_float_graph

    m = load(model)
    prepare_float_graph(m)
    return pooled_layers(m.graph, plan_qdq(m.graph, Recipe()))


@pytest.mark.parametrize(
    ("head", "pool", "expected"),
    [
        ("conv", "gap", {"y": "p"}),
        ("gemm", "gap", {"y": "f"}),
        ("conv", "mean", {"y": "p"}),
        ("conv", "mean_c", {}),  # a mean over the channels is not a global pool
        ("conv3", "gap", {}),  # a 3x3 kernel: Σ_c W e_c is not its shift
    ],
)
def test_the_layers_that_read_a_global_average_pool(head, pool, expected):
    assert _plan_targets(pooled(head, pool)) == expected


def _mean_error(path, test) -> np.ndarray:
    ref = ort.InferenceSession(onnx.load(test["src"]).SerializeToString()).run(None, test["feed"])[0]
    got = quanta.InferenceSession(str(path)).run(None, test["feed"])[0]
    return np.abs((got.astype(np.float64) - ref).reshape(ref.shape[0], -1).mean(axis=0))


@pytest.mark.parametrize("head", ["conv", "gemm"])
def test_the_correction_removes_the_mean_output_error(tmp_path, head):
    src = tmp_path / "f.onnx"
    onnx.save(pooled(head), src)
    test = {"src": str(src), "feed": {"x": np.concatenate([f["x"] for f in feeds(8, 99)])}}
    errors, summaries = {}, {}
    for on in (False, True):
        out = tmp_path / f"q{on}.onnx"
        summaries[on] = quanta.quantize_static(
            src, out, feeds(8, 1), per_channel=False, pool_bias_correction=on, verbose=False
        )
        errors[on] = _mean_error(out, test)
    assert errors[True].mean() < 0.75 * errors[False].mean()
    assert summaries[True].pool_bias.layers.keys() == {"head"}
    assert summaries[True].pool_bias.feeds == 8
    assert summaries[False].pool_bias is None
    text = summaries[True].format()
    assert "eq. (28)" in text and "1 layer(s) corrected" in text and "head" in text
    assert summaries[True].to_dict()["pool_bias"]["layers"].keys() == {"head"}
    # the recorded recipe says so
    meta = {p.key: p.value for p in onnx.load(tmp_path / "qTrue.onnx").metadata_props}
    assert json.loads(meta["quanta.recipe"])["pool_bias_correction"] is True


def test_the_corrected_file_is_deterministic(tmp_path):
    src = tmp_path / "f.onnx"
    onnx.save(pooled("conv"), src)
    for name in ("a", "b"):
        quanta.quantize_static(src, tmp_path / f"{name}.onnx", feeds(6, 3), verbose=False)
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    # the recorded recipe reproduces it
    again = quanta.quantize_static(
        src, tmp_path / "c.onnx", feeds(6, 3), recipe_of(tmp_path / "a.onnx"), verbose=False
    )
    assert (tmp_path / "c.onnx").read_bytes() == (tmp_path / "a.onnx").read_bytes()
    assert again.pool_bias is not None and again.pool_bias.layers


def test_a_model_without_a_pooled_layer_has_no_eq_28_line(tmp_path):
    src = tmp_path / "f.onnx"
    onnx.save(pooled("conv3"), src)
    s = quanta.quantize_static(src, tmp_path / "q.onnx", feeds(4, 3), verbose=False)
    assert s.pool_bias is None  # nothing to measure: no line, no cost


def test_a_one_shot_iterator_is_not_measured(tmp_path):
    src = tmp_path / "f.onnx"
    onnx.save(pooled("conv"), src)
    s = quanta.quantize_static(
        src,
        tmp_path / "q.onnx",
        iter(feeds(6, 3)),
        other_ranges="minmax",
        weight_rounding="nearest",
        verbose=False,
    )
    assert s.pool_bias is not None and not s.pool_bias.layers
    assert "not corrected" in s.pool_bias.format()


def test_apply_moves_int32_codes_on_their_scale_and_adds_a_missing_bias():
    scale = np.array([0.5, 0.25, 0.125], np.float32)
    codes = np.array([10, -7, 3], np.int32)
    g = helper.make_graph(
        [
            helper.make_node("DequantizeLinear", ["bq", "bs"], ["b"], axis=0, name="dqb"),
            helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["x2"], name="dqx"),
            helper.make_node("DequantizeLinear", ["wq", "ws"], ["w2"], axis=0, name="dqw"),
            helper.make_node("Conv", ["x2", "w2", "b"], ["y"], name="c"),
            helper.make_node("Conv", ["x2", "w2"], ["y2"], name="c2"),
        ],
        "g",
        [],
        [helper.make_tensor_value_info("y2", TensorProto.FLOAT, [1, 3, 1, 1])],
        [
            numpy_helper.from_array(np.full((1, 17, 1, 1), 140, np.uint8), "xq"),
            numpy_helper.from_array(codes, "bq"),
            numpy_helper.from_array(scale, "bs"),
            numpy_helper.from_array(np.array(0.02, np.float32), "xs"),
            numpy_helper.from_array(np.array(131, np.uint8), "xz"),
            numpy_helper.from_array(np.ones((3, 17, 1, 1), np.int8), "wq"),
            numpy_helper.from_array(scale, "ws"),
        ],
    )
    m = helper.make_model(g)
    shift = np.array([1.0, -0.5, 0.07], np.float64)
    assert _apply(m, m.graph.node[3], shift)
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    np.testing.assert_array_equal(inits["bq"], codes - np.round(shift / scale).astype(np.int32))
    assert _apply(m, m.graph.node[4], shift)
    conv2 = next(n for n in m.graph.node if n.name == "c2")
    assert len(conv2.input) == 3
    added = next(n for n in m.graph.node if n.output[0] == conv2.input[2])
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    s = inits[added.input[1]]
    np.testing.assert_allclose(s, (np.float32(0.02) * scale).astype(np.float32))
    np.testing.assert_array_equal(
        inits[added.input[0]], np.round(-shift / s.astype(np.float64)).astype(np.int32)
    )
    names = [n.name for n in m.graph.node]
    assert names.index(added.name) < names.index("c2")  # still in topological order
    onnx.checker.check_model(m)


def test_pool_bias_formats_its_reason():
    assert "not corrected (why)" in PoolBias(reason="why").format()


def test_the_shift_is_kept_as_far_as_the_feeds_agree_on_it():
    rng = np.random.default_rng(2)
    steady = np.tile([0.5, -0.25, 0.0], (7, 1)) + 1e-4 * rng.standard_normal((7, 3))
    np.testing.assert_allclose(_shrunk(steady), steady.mean(axis=0), atol=1e-4)
    noisy = rng.standard_normal((7, 17))  # zero mean: most of an estimate of noise is dropped
    assert np.abs(_shrunk(noisy)).mean() < 0.5 * np.abs(noisy.mean(axis=0)).mean()
    assert _shrunk(noisy[:1]) is None  # one feed: no spread to judge it by
