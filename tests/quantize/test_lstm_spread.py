"""An LSTM whose input x spreads over many powers of two (a power spectrum: most bins far
below the peak) stays float in ``quantize_static``: DynamicQuantizeLSTM quantizes x per
step to int8 and rounds the quiet bins to 0 (eq. (26), calibrate/spread.py). An LSTM over
ordinary data is still rewritten, and the SpreadObserver's count merges, serializes and
travels in its result exactly."""

from __future__ import annotations

import pickle

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.calibrate import SPREAD, SpreadObserver, observer_from_dict
from tests.ort_int8 import WEIGHT_BITS

STEPS, BATCH, BINS, HIDDEN = 19, 3, 17, 7


def spectrum_lstm(seed: int = 0) -> onnx.ModelProto:
    """x [T, B, 17] -> LSTM (hidden 7) -> its last state -> Gemm [B, 5]: a speaker encoder
    at toy size, fed a mel power spectrum as resemblyzer's is (not a log)."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array((rng.standard_normal((1, 4 * HIDDEN, BINS)) * 0.8).astype(np.float32), "W"),
        numpy_helper.from_array((rng.standard_normal((1, 4 * HIDDEN, HIDDEN)) * 0.4).astype(np.float32), "R"),
        numpy_helper.from_array((rng.standard_normal((1, 8 * HIDDEN)) * 0.2).astype(np.float32), "B"),
        numpy_helper.from_array((rng.standard_normal((HIDDEN, 5)) * 0.5).astype(np.float32), "fc_w"),
        numpy_helper.from_array((rng.standard_normal(5) * 0.1).astype(np.float32), "fc_b"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
    ]
    nodes = [
        helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "y_h"], name="lstm", hidden_size=HIDDEN),
        helper.make_node("Squeeze", ["y_h", "axis0"], ["h"], name="last"),
        helper.make_node("Gemm", ["h", "fc_w", "fc_b"], ["out"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "spectrum_lstm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [STEPS, BATCH, BINS])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [BATCH, 5])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def power_spectra(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Power in [1e-7, ~3]: a log-normal spread of 5 decades, a few loud bins per frame,
    scaled by 1e5 so the quiet bins still move the LSTM (as the trained one's do)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        p = np.exp(rng.normal(np.log(3e-5), 2.3, (STEPS, BATCH, BINS)))
        p[:, :, 2] *= 300.0  # a loud band
        out.append({"x": np.minimum(p, 3.0).astype(np.float32)})
    return out


def _scaled(model: onnx.ModelProto) -> onnx.ModelProto:
    # the quiet bins matter: W scaled so that a 1e-4 input moves a gate by ~0.1
    for init in model.graph.initializer:
        if init.name == "W":
            w = numpy_helper.to_array(init) * 1e3
            init.CopyFrom(numpy_helper.from_array(w.astype(np.float32), "W"))
    return model


def _run(path, feeds):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.concatenate([s.run(None, f)[0] for f in feeds])


def _sqnr(ref, got):
    return 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / max(np.sum((ref - got) ** 2.0), 1e-30))


def test_lstm_over_a_power_spectrum_stays_float_with_the_spread_reason(tmp_path):
    model = _scaled(spectrum_lstm())
    src = tmp_path / "spec.onnx"
    onnx.save(model, src)
    dst = tmp_path / "spec.q.onnx"
    # 7-bit weights where ORT's u8 x s8 kernels saturate full-range ones (tests/ort_int8.py):
    # there ORT's QGemm of the 8-bit fc weights gives 9 dB where the file's arithmetic gives 46
    bits = {"weight_bits": WEIGHT_BITS}
    summary = quanta.quantize_static(src, dst, power_spectra(6, 1), verbose=False, progress=False, **bits)
    reasons = [r for name, op, r in summary.float_nodes if op == "LSTM"]
    assert len(reasons) == 1 and reasons[0].startswith(SPREAD), summary.float_nodes
    ops = [n.op_type for n in onnx.load(dst).graph.node]
    assert "LSTM" in ops and "DynamicQuantizeLSTM" not in ops
    # what it avoids: the rewritten file (recurrent: dynamic forced on the same data) loses
    # the quiet bins; the kept float LSTM does not
    ev = power_spectra(4, 2)
    ref = _run(src, ev)
    forced = tmp_path / "forced.onnx"
    quanta.quantize_dynamic(src, forced, verbose=False, **bits)
    assert "DynamicQuantizeLSTM" in [n.op_type for n in onnx.load(forced).graph.node]
    assert _sqnr(ref, _run(dst, ev)) > _sqnr(ref, _run(forced, ev)) + 10


def test_lstm_over_ordinary_data_is_still_rewritten(tmp_path):
    src = tmp_path / "plain.onnx"
    onnx.save(spectrum_lstm(), src)
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.uniform(-1.5, 2.5, (STEPS, BATCH, BINS)).astype(np.float32)} for _ in range(5)]
    # recurrent "dynamic": eq. (26) is the subject, not eq. (30)'s measurement of the file
    summary = quanta.quantize_static(
        src, tmp_path / "plain.q.onnx", feeds, verbose=False, progress=False, recurrent="dynamic"
    )
    assert not [r for _, op, r in summary.float_nodes if op == "LSTM"]
    assert "DynamicQuantizeLSTM" in [n.op_type for n in onnx.load(tmp_path / "plain.q.onnx").graph.node]


def test_spread_observer_counts_merges_and_travels_exactly():
    rng = np.random.default_rng(7)
    a = np.exp(rng.normal(-9.0, 3.0, 301)).astype(np.float32)
    b = np.concatenate([np.zeros(13, np.float32), -np.exp(rng.normal(-2.0, 1.0, 259)).astype(np.float32)])
    whole, left, right = SpreadObserver(), SpreadObserver(), SpreadObserver()
    whole.observe(np.concatenate([a, b]))
    left.observe(a)
    right.observe(b)
    merged = left.merge(right)
    # eq. (26) by hand: the whole power-of-two bin of a value must lie below max|x| / 512
    values = np.abs(np.concatenate([a, b]).astype(np.float64))
    values = values[values > 0]
    top = values.max()
    expected = np.mean(np.ldexp(1.0, np.frexp(values)[1]) <= top / 512)
    assert 0.1 < expected < 0.9
    for obs in (whole, merged, observer_from_dict(whole.to_dict())):
        assert obs.spread(8) == expected
    assert whole.spread(16) < whole.spread(8)
    res = pickle.loads(pickle.dumps(whole.result()))
    assert res.spread(8) == expected and res.range() == whole.range()
