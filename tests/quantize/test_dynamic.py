"""quantize_dynamic: DynamicQuantizeLinear + MatMulInteger / ConvInteger, run by ORT,
agreeing with the reference backend."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import quanta
from quanta.ir.onnx_io import load
from tests.ir import models

ort = pytest.importorskip("onnxruntime")


def run_both(path, feeds):
    ours = quanta.InferenceSession(str(path), backend="reference").run(None, feeds)[0]
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return ours, theirs


def test_quantize_dynamic_encoder_matmuls(tmp_path):
    src = tmp_path / "enc.onnx"
    onnx.save(models.encoder_block(), src)
    out = tmp_path / "enc.dyn.onnx"
    summary = quanta.quantize_dynamic(src, out, verbose=False)
    quantized = {name for name, _ in summary.quantized}
    assert {"q_proj", "k_proj", "v_proj", "o_proj", "ffn1", "ffn2"} <= quantized
    assert "scores" not in quantized  # both operands are activations: no constant weight
    g = load(out).graph
    counts = g.op_counts()
    assert counts["MatMulInteger"] == 6
    assert counts["DynamicQuantizeLinear"] == 4  # x shared by q/k/v, c2, h1, f2
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    feeds = models.encoder_feeds(1, seed=3)[0]
    ours, theirs = run_both(out, feeds)
    # Only float ops differ (LayerNorm/Softmax summation order); the integer parts are
    # exact in both: 1e-4 relative covers float32 reassociation over d=24 terms.
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
    ref = ort.InferenceSession(str(src)).run(None, feeds)[0]
    cos = np.sum(ref * theirs, -1) / (np.linalg.norm(ref, axis=-1) * np.linalg.norm(theirs, axis=-1))
    assert cos.min() > 0.99


def test_quantize_dynamic_conv_and_gemm_with_bias(tmp_path):
    src = tmp_path / "cnn.onnx"
    onnx.save(models.float_cnn(), src)
    out = tmp_path / "cnn.dyn.onnx"
    summary = quanta.quantize_dynamic(src, out, verbose=False)
    assert sorted(op for _, op in summary.quantized) == ["Conv", "Gemm"]
    counts = load(out).graph.op_counts()
    assert counts["ConvInteger"] == 1 and counts["MatMulInteger"] == 1
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 6)).astype(np.float32)
    ours, theirs = run_both(out, {"x": x})
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    ref = ort.InferenceSession(str(src)).run(None, {"x": x})[0]
    assert 10 * np.log10(np.sum(ref**2) / np.sum((ref - theirs) ** 2)) > 25.0


def test_quantize_dynamic_is_deterministic_and_per_channel_by_default(tmp_path):
    src = tmp_path / "cnn.onnx"
    onnx.save(models.float_cnn(), src)
    quanta.quantize_dynamic(src, tmp_path / "a.onnx", verbose=False)
    quanta.quantize_dynamic(src, tmp_path / "b.onnx", verbose=False)
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    g = load(tmp_path / "a.onnx").graph
    # ConvInteger carries no scale; the per-channel weight scales sit in the float Mul
    sw = g.initializers["w_scale"].const
    assert sw.shape == (1, 7, 1, 1) and len(set(sw.reshape(-1).tolist())) == 7
