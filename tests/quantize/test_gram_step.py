"""Eq. (12o) (docs/debugger.md): a layer whose Gram matrix would cost more than
``rounding.GRAM_MACS`` products in one call sums every step-th position, weighted by the
step, exactly; the statistics stay mergeable across shards."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.kernels.reference.quantize import quantize_linear
from quanta.quantize import rounding
from quanta.quantize.rounding import RoundedLayer, position_step

STORAGE = {(0, 255): np.uint8, (-128, 127): np.int8, (-32768, 32767): np.int16}


def _layer(node: helper.NodeProto, w: np.ndarray, x_shape: list) -> RoundedLayer:
    from quanta.ir.onnx_io import from_proto

    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")],
    )
    n = from_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])).graph.nodes[0]
    assert RoundedLayer.eligible(n, w) is None
    return RoundedLayer(n, "x", "w", w)


def _ints(x: np.ndarray, scale: float, zp: int, qrange: tuple[int, int]) -> np.ndarray:
    """x as the model's integers with the zero point removed (eq. (12d)), by the reference Q."""
    return quantize_linear(x, np.float32(scale), STORAGE[qrange](zp)).astype(np.int64) - zp


def test_the_step_keeps_a_calls_gram_within_the_budget():
    """The step is 1 while G·K²·P fits GRAM_MACS, else the smallest that fits: a VGG-16
    3x3x512 layer at 40x40 positions keeps every one; RivaGAN's 11x11 convolution over 32
    channels at 267x280 positions (1.1e12 products a sample) does not."""
    budget = rounding.GRAM_MACS
    for g, k, p in [(1, 4608, 1600), (1, 3872, 267 * 280), (32, 9, 10**6), (3, 17, 259), (1, 3, 7)]:
        step = position_step(g, k, p)
        cost = g * k * k * p
        assert step >= 1
        assert g * k * k * -(-p // step) <= budget + g * k * k  # ceil(P/step) positions
        if step > 1:
            assert cost > budget and cost <= budget * step and cost > budget * (step - 1)
        else:
            assert cost <= budget
    assert position_step(1, 4608, 1600) == 1
    assert position_step(1, 3872, 267 * 280) > 1


@pytest.mark.parametrize(
    "c, qrange, zp",
    [
        (3, (0, 255), 121),  # K = 27: float64 products (not the native narrow-Gram path)
        (7, (0, 255), 121),  # K = 63: the native integer GEMM
        (7, (-128, 127), -9),  # int8 input: codes shifted by qmin
        (7, (-32768, 32767), 300),  # int16 input: float64 products
    ],
)
def test_a_conv_past_the_budget_sums_every_step_th_position_weighted_by_the_step(monkeypatch, c, qrange, zp):
    """Eq. (12o) on a strided, padded Conv: per sample (each of its own size), the Gram of
    every step-th output position in raster order, times the step, exactly; the step of
    each sample from its own positions; shards merged give the one stream's sums."""
    k = c * 3 * 3
    # a budget that subsamples: steps 2..7 over the samples' 15..63 positions
    monkeypatch.setattr(rounding, "GRAM_MACS", k * k * 9)
    w = np.random.default_rng(1).standard_normal((5, c, 3, 3)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 0, 1, 2], strides=[2, 1])
    scale = 0.0173 if qrange[1] < 256 else 0.0173 / 200
    xs = [
        np.random.default_rng(50 + i).standard_normal((1 + i % 2, c, 7 + 2 * i, 5 + i)).astype(np.float32)
        * (1.0 + 0.3 * i)
        for i in range(5)
    ]

    def stream(idx):
        layer = _layer(node, w, ["N", c, "H", "W"])
        layer.set_input(scale, zp, *qrange)
        layer.calls = idx[0]
        for i in idx:
            layer.observe(xs[i])
        return layer

    want = [np.zeros((k, k), np.int64), np.zeros((k, k), np.int64)]
    steps = set()
    rows = 0
    for i, x in enumerate(xs):
        xi = _ints(x, scale, zp, qrange)
        xp = np.pad(xi, ((0, 0), (0, 0), (1, 1), (0, 2)))  # zero padding is x_int 0
        win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))[:, :, ::2, ::1]
        ho, wo = win.shape[2], win.shape[3]
        step = position_step(1, k, ho * wo)
        steps.add(step)
        for sample in win:  # [C, ho, wo, 3, 3] -> rows [ho·wo, C·3·3] in raster order
            r = sample.transpose(1, 2, 0, 3, 4).reshape(ho * wo, k)[::step]
            want[i % 2] += step * (r.T @ r)
            rows += ho * wo
    assert len(steps) > 1 and min(steps) > 1  # every sample subsampled, by different steps
    one = stream(range(5))
    full, odd = one.hessians()
    np.testing.assert_array_equal(full[0], want[0] + want[1])
    np.testing.assert_array_equal(odd[0], want[1])
    assert one.rows == rows
    merged = stream(range(3, 5)).merge(stream(range(0, 3))).hessians()
    np.testing.assert_array_equal(merged[0], full)
    np.testing.assert_array_equal(merged[1], odd)


@pytest.mark.parametrize("qrange, zp", [((0, 255), 133), ((-128, 127), 11)])
def test_a_matmul_past_the_budget_sums_every_step_th_row_weighted_by_the_step(monkeypatch, qrange, zp):
    """Eq. (12o) on a MatMul over [N, T, K] rows (K = 37: the native GEMM for uint8)."""
    k = 37
    monkeypatch.setattr(rounding, "GRAM_MACS", k * k * 7)
    w = np.random.default_rng(3).standard_normal((k, 17)).astype(np.float32)
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    scale = 0.021
    xs = [
        np.random.default_rng(60 + i).standard_normal((2, 13 + 4 * i, k)).astype(np.float32) for i in range(3)
    ]
    layer = _layer(node, w, ["N", "T", k])
    layer.set_input(scale, zp, *qrange)
    want = [np.zeros((k, k), np.int64), np.zeros((k, k), np.int64)]
    for i, x in enumerate(xs):
        layer.observe(x)
        r = _ints(x, scale, zp, qrange).reshape(-1, k)
        step = position_step(1, k, r.shape[0])
        assert step > 1
        r = r[::step]
        want[i % 2] += step * (r.T @ r)
    full, odd = layer.hessians()
    np.testing.assert_array_equal(full[0], want[0] + want[1])
    np.testing.assert_array_equal(odd[0], want[1])
    assert layer.rows == sum(x.shape[0] * x.shape[1] for x in xs)
