"""Whole models: backend="native" is bit-exact with backend="reference" (the same
lowered graph; every native kernel against its NumPy twin), and the integer compute
runs natively.

Models (issue 5's list): a QDQ CNN with depthwise convolutions, residual Adds with
different scales, pooling and a fully connected head (the demo model); a CNN with a
Concat of branches with their own scales; a QDQ transformer encoder block; the
dynamic-quantized CNN and encoder.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import quanta
from tests.ir import models

INTEGER_OPS = {
    "QLinearConv",
    "QLinearMatMul",
    "QGemm",
    "QLinearAdd",
    "QLinearMul",
    "QLinearConcat",
    "MatMulInteger",
    "ConvInteger",
    "MatMulIntegerToFloat",
    "QLinearGlobalAveragePool",
}


def both(path, feeds, threads=1):
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    nat = quanta.InferenceSession(str(path), sess_options=opts, backend="native")
    ref = quanta.InferenceSession(str(path), backend="reference")
    return nat, nat.run(None, feeds), ref.run(None, feeds)


def assert_bit_exact_and_native(path, feeds):
    for threads in (1, 2):
        nat, a, b = both(path, feeds, threads)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)  # 0: same integer arithmetic, twins bit-exact
    fell_back = {op for _, op, _ in nat.fallbacks}
    assert not fell_back & INTEGER_OPS, f"integer ops on reference kernels: {nat.fallbacks}"
    return nat


def test_demo_cnn_depthwise_residual_pool_fc(tmp_path):
    from quanta.cli.demo import MODEL, load_demo_data

    data = load_demo_data()
    out = tmp_path / "d.onnx"
    quanta.quantize_static(MODEL, out, [{"input": data["calib_x"][:100]}], verbose=False)
    nat = assert_bit_exact_and_native(out, {"input": data["test_x"][:37]})
    ops = {s.op_type for s in nat.plan.steps}
    assert {"QLinearConv", "QLinearAdd", "QLinearGlobalAveragePool", "QGemm"} <= ops


def test_concat_of_branches_with_their_own_scales(tmp_path):
    rng = np.random.default_rng(4)
    src, out = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(models.concat_branches(), src)
    feeds = [{"x": rng.standard_normal((1, 3, 11, 9)).astype(np.float32)} for _ in range(4)]
    quanta.quantize_static(src, out, feeds, quantize_outputs=True, verbose=False)
    nat = assert_bit_exact_and_native(out, feeds[0])
    assert "QLinearConcat" in {s.op_type for s in nat.plan.steps} or "Concat" in {
        s.op_type for s in nat.plan.steps
    }


def test_encoder_block(tmp_path):
    src, out = tmp_path / "enc.onnx", tmp_path / "q.onnx"
    onnx.save(models.encoder_block(d=48, heads=3), src)
    rng = np.random.default_rng(0)
    feeds = [
        {"x": rng.standard_normal((2, 9, 48)).astype(np.float32), "mask": np.ones((2, 9), np.int64)}
        for _ in range(3)
    ]
    quanta.quantize_static(src, out, feeds, verbose=False)
    assert_bit_exact_and_native(out, feeds[0])


@pytest.mark.parametrize("build", [models.float_cnn, models.encoder_block], ids=["cnn", "encoder"])
def test_dynamic_quantized_models(tmp_path, build):
    src, out = tmp_path / "f.onnx", tmp_path / "dyn.onnx"
    onnx.save(build(), src)
    quanta.quantize_dynamic(src, out, verbose=False)
    rng = np.random.default_rng(1)
    if build is models.float_cnn:
        feeds = {"x": rng.standard_normal((2, 3, 8, 6)).astype(np.float32)}
    else:
        feeds = models.encoder_feeds(1, seed=5)[0]
    assert_bit_exact_and_native(out, feeds)
