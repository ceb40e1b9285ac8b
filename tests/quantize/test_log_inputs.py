"""The layer that computes a Log's input stays float in ``quantize_static`` when its own
input spreads over many powers of two (docs/calibration.md eq. (HB2),
quantize/log_inputs.py): a log-mel front end at toy size (an STFT as a strided Conv, the
power as Mul / Add, a mel filter bank as MatMul, ``Log(mel + eps)``). Over
ordinary data (a narrow spread) the filter bank is still quantized, a layer with two data
inputs is no candidate, and data that cannot be read twice is not measured."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.calibrate import SPREAD
from quanta.ir.onnx_io import load
from quanta.quantize import static
from quanta.quantize.log_inputs import log_layers

SAMPLES, FFT, HOP, BINS, MELS = 1601, 64, 16, 33, 7


def log_mel(matmul_b_const: bool = True) -> onnx.ModelProto:
    """audio [N, 1, 1601] -> Conv (cos / sin rows of a 64-tap DFT, stride 16) -> re² + im²
    -> MatMul by a [7, 33] triangular filter bank -> + 1e-6 -> Log -> [N, 7, 97]. ``matmul_b_const=False``: the filter bank is a second graph input."""
    n = np.arange(FFT)
    k = np.arange(BINS)[:, None]
    win = np.hanning(FFT)
    cos = (np.cos(2 * np.pi * k * n / FFT) * win)[:, None, :].astype(np.float32)
    sin = (-np.sin(2 * np.pi * k * n / FFT) * win)[:, None, :].astype(np.float32)
    edges = np.linspace(0, BINS - 1, MELS + 2)
    fb = np.maximum(0, 1 - np.abs(np.arange(BINS)[None] - edges[1:-1, None]) / (edges[1] - edges[0]))
    inits = [
        numpy_helper.from_array(np.concatenate([cos, sin]), "dft"),
        numpy_helper.from_array(np.array([0], np.int64), "s0"),
        numpy_helper.from_array(np.array([BINS], np.int64), "s1"),
        numpy_helper.from_array(np.array([BINS], np.int64), "e0"),
        numpy_helper.from_array(np.array([2 * BINS], np.int64), "e1"),
        numpy_helper.from_array(np.array([1], np.int64), "ax"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
    ]
    if matmul_b_const:
        inits.append(numpy_helper.from_array(fb.astype(np.float32), "fb"))
    nodes = [
        helper.make_node("Conv", ["x", "dft"], ["spec"], strides=[HOP], name="stft"),
        helper.make_node("Slice", ["spec", "s0", "e0", "ax"], ["re"]),
        helper.make_node("Slice", ["spec", "s1", "e1", "ax"], ["im"]),
        helper.make_node("Mul", ["re", "re"], ["re2"]),
        helper.make_node("Mul", ["im", "im"], ["im2"]),
        helper.make_node("Add", ["re2", "im2"], ["power"], name="power"),
        helper.make_node("MatMul", ["fb", "power"], ["mel"], name="mel"),
        helper.make_node("Add", ["mel", "eps"], ["mel_eps"]),
        helper.make_node("Log", ["mel_eps"], ["y"], name="log"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, SAMPLES])]
    if not matmul_b_const:
        inputs.append(helper.make_tensor_value_info("fb", TensorProto.FLOAT, [MELS, BINS]))
    g = helper.make_graph(
        nodes, "log_mel", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def audio(n: int, seed: int, wide: bool = True) -> list[dict[str, np.ndarray]]:
    """Tones under noise whose level moves over 20 dB within a clip (``wide``), or a
    loud steady noise (a power spectrum within 2 decades)."""
    rng = np.random.default_rng(seed)
    t = np.arange(SAMPLES) / 8000.0
    out = []
    for _ in range(n):
        if wide:
            level = 10 ** rng.uniform(-1.0, 0.0, 7).repeat(SAMPLES // 7 + 1)[:SAMPLES]
            f = rng.uniform(200, 3500, 3)
            x = level * sum(np.sin(2 * np.pi * fi * t) for fi in f) + rng.normal(0, 3e-3, SAMPLES)
        else:
            x = rng.normal(0, 0.5, SAMPLES)
        out.append({"x": x.reshape(1, 1, -1).astype(np.float32)})
    return out


def _run(path, feeds):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.concatenate([s.run(None, f)[0] for f in feeds])


def _sqnr(ref, got):
    return 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / max(np.sum((ref - got) ** 2.0), 1e-30))


def test_filter_bank_before_a_log_stays_float_over_a_wide_spectrum(tmp_path, monkeypatch):
    """Failure signature: the filter bank's input (the power spectrum) on an 8-bit grid of
    its peak rounds the quiet bins to 0 and the Log reads eps there: MarbleNet's frames
    agreed with FP32 on 65.8 %. Fixed: the MatMul stays float with the spread reason, the
    STFT Conv stays integer (its output float), and the output is closer to FP32 than the
    file with the filter bank quantized (the rule turned off) by more than 10 dB."""
    src = tmp_path / "logmel.onnx"
    onnx.save(log_mel(), src)
    assert log_layers(load(str(src)).graph) == {"mel": ("power", "log")}
    calib, ev = audio(8, 1), audio(5, 2)
    dst = tmp_path / "logmel.q.onnx"
    summary = quanta.quantize_static(src, dst, calib, verbose=False, progress=False)
    reasons = {name: r for name, op, r in summary.float_nodes}
    assert reasons["mel"].startswith(SPREAD) and "eq. (HB2)" in reasons["mel"], summary.float_nodes
    q = onnx.load(dst)
    prod = {o: n for n in q.graph.node for o in n.output}
    stft = next(n for n in q.graph.node if n.name == "stft")
    assert prod[stft.input[0]].op_type == "DequantizeLinear"  # the STFT still integer
    mel = next(n for n in q.graph.node if n.name == "mel")
    assert all(i not in prod or prod[i].op_type != "DequantizeLinear" for i in mel.input)
    ref = _run(src, ev)
    monkeypatch.setattr(static, "_log_float", lambda *a, **k: {})
    before = tmp_path / "logmel.before.onnx"
    quanta.quantize_static(src, before, calib, verbose=False, progress=False)
    mel_before = next(n for n in onnx.load(before).graph.node if n.name == "mel")
    assert any(prod_b.op_type == "DequantizeLinear" for prod_b in _producers(onnx.load(before), mel_before))
    assert _sqnr(ref, _run(dst, ev)) > _sqnr(ref, _run(before, ev)) + 10


def _producers(model: onnx.ModelProto, node: onnx.NodeProto) -> list[onnx.NodeProto]:
    prod = {o: n for n in model.graph.node for o in n.output}
    return [prod[i] for i in node.input if i in prod]


def test_filter_bank_over_a_narrow_spectrum_is_still_quantized(tmp_path):
    src = tmp_path / "logmel.onnx"
    onnx.save(log_mel(), src)
    summary = quanta.quantize_static(
        src, tmp_path / "q.onnx", audio(6, 3, wide=False), verbose=False, progress=False
    )
    assert "mel" not in {name for name, _, _ in summary.float_nodes}, summary.float_nodes


def test_two_data_inputs_and_one_shot_data_are_not_measured(tmp_path):
    """A MatMul of two data inputs (attention-like) is no candidate; a one-shot iterator
    is read once by the calibration run, so eq. (HB2) measures nothing (the file is the
    plan's, without the rule)."""
    assert log_layers(load(log_mel(matmul_b_const=False)).graph) == {}
    src = tmp_path / "logmel.onnx"
    onnx.save(log_mel(), src)
    summary = quanta.quantize_static(
        src, tmp_path / "q.onnx", iter(audio(6, 1)), verbose=False, progress=False
    )
    assert "mel" not in {name for name, _, _ in summary.float_nodes}
