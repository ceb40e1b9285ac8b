"""Eq. (27): when the 8-bit file's outputs are far from FP32 on the held-out calibration
feeds (eq. (24)'s best candidate under WIDE_TRY_SQNR_DB), quantize_static measures a file
with 16-bit activations and keeps it when it gains WIDE_MARGIN_DB; an ordinary graph is
never re-quantized."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.quantize.range_choice import (
    FAR_SQNR_DB,
    WIDE_MARGIN_DB,
    WIDE_TRY_SQNR_DB,
    RangeChoice,
    best_8bit_sqnr,
    wide_candidate,
    wide_decision,
)
from quanta.quantize.recipe import Recipe

ort = pytest.importorskip("onnxruntime")

OUT = 17


def cancelling_model() -> onnx.ModelProto:
    """u = z + x with z ~1e8 and x ~1e5 (signed, distinct scales), v = u + (-z) (x again,
    read through u's grid), y = Conv(v) (3 -> 17 channels, 3x3), out = y * y: an 8-bit step of u (~1e6) is
    larger than x itself, a 16-bit one is 1e2 times smaller."""
    rng = np.random.default_rng(0)
    g = helper.make_graph(
        [
            helper.make_node("Add", ["z", "x"], ["u"], name="join"),
            helper.make_node("Mul", ["z", "minus"], ["n"], name="negate"),
            helper.make_node("Add", ["u", "n"], ["v"], name="cancel"),
            helper.make_node("Conv", ["v", "w", "b"], ["y"], pads=[1, 1, 1, 1], name="conv"),
            helper.make_node("Mul", ["y", "y"], ["out"], name="square"),
        ],
        "cancelling",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 7, 7]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 3, 7, 7]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array((rng.standard_normal((OUT, 3, 3, 3)) * 0.3).astype(np.float32), "w"),
            numpy_helper.from_array(rng.standard_normal(OUT).astype(np.float32), "b"),
            numpy_helper.from_array(np.array(-1.0, np.float32), "minus"),
        ],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    r = np.random.default_rng(seed)
    return [
        {
            "x": (r.standard_normal((1, 3, 7, 7)) * 1e5).astype(np.float32),
            "z": (r.standard_normal((1, 3, 7, 7)) * 1e8).astype(np.float32),
        }
        for _ in range(n)
    ]


def sqnr(src, out, data) -> float:
    ref = ort.InferenceSession(str(src))
    got = quanta.InferenceSession(str(out))
    num = den = 0.0
    for f in data:
        r = ref.run(None, f)[0].astype(np.float64)
        q = got.run(None, f)[0].astype(np.float64)
        num += float((r**2).sum())
        den += float(((r - q) ** 2).sum())
    return 10 * np.log10(num / den)


def q_types(path) -> dict[str, int]:
    proto = onnx.load(str(path))
    zps = {i.name: i.data_type for i in proto.graph.initializer}
    return {n.input[0]: zps[n.input[2]] for n in proto.graph.node if n.op_type == "QuantizeLinear"}


def test_a_cancelling_add_gets_16_bit_activations_with_the_reason(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(cancelling_model(), src)
    s = quanta.quantize_static(src, tmp_path / "q.onnx", feeds(8, 1), verbose=False)
    note = next(n for n in s.notes if n.startswith("eq. (27)"))
    assert "so this file has 16-bit activations" in note
    types = q_types(tmp_path / "q.onnx")
    assert types["u"] == TensorProto.INT16
    assert types["v"] == TensorProto.INT16
    assert types["y"] == TensorProto.INT16  # the Conv's output: an A16W8 group, in integer
    assert s.integer_share == pytest.approx(1.0)
    assert s.output == str(tmp_path / "q.onnx")
    recipe = json.loads(load(tmp_path / "q.onnx").metadata["quanta.recipe"])
    assert recipe["activation_type"] == "int16"
    onnx.checker.check_model(str(tmp_path / "q.onnx"), full_check=True)
    # what the 8-bit file would give, on held-out feeds
    eight = quanta.quantize_static(
        src, tmp_path / "q8.onnx", feeds(8, 1), other_ranges="minmax", verbose=False
    )
    assert not any(n.startswith("eq. (27)") for n in eight.notes)  # nothing measured: no eq. (27)
    held = feeds(4, 2)
    assert sqnr(src, tmp_path / "q8.onnx", held) < FAR_SQNR_DB
    assert sqnr(src, tmp_path / "q.onnx", held) > sqnr(src, tmp_path / "q8.onnx", held) + 20
    # the recorded recipe reproduces the file without measuring again, and so does a second run
    again = quanta.quantize_static(src, tmp_path / "r.onnx", feeds(8, 1), verbose=False)
    assert (tmp_path / "r.onnx").read_bytes() == (tmp_path / "q.onnx").read_bytes()
    assert again.notes == s.notes
    quanta.quantize_static(src, tmp_path / "p.onnx", feeds(8, 1), Recipe.from_dict(recipe), verbose=False)
    assert (tmp_path / "p.onnx").read_bytes() == (tmp_path / "q.onnx").read_bytes()


def test_an_ordinary_graph_is_not_measured_again(tmp_path):
    """Same graph with z at the scale of x: the 8-bit file is close to FP32, no eq. (27)."""
    src = tmp_path / "m.onnx"
    onnx.save(cancelling_model(), src)
    data = [{"x": f["x"], "z": f["z"] * 1e-3} for f in feeds(8, 1)]
    s = quanta.quantize_static(src, tmp_path / "q.onnx", data, verbose=False)
    assert not any(n.startswith("eq. (27)") for n in s.notes)
    assert set(q_types(tmp_path / "q.onnx").values()) <= {TensorProto.UINT8, TensorProto.INT8}


def test_a_final_8_bit_file_over_the_bar_is_kept_without_a_16_bit_try(tmp_path, monkeypatch):
    """The candidates that start eq. (27) round weights to nearest and take half the feeds'
    ranges; when the file written with its final weights and ranges is over the bar, it is
    kept and no 16-bit file is built."""
    import quanta.quantize.static as static

    src = tmp_path / "m.onnx"
    onnx.save(cancelling_model(), src)
    data = [{"x": f["x"], "z": f["z"] * 1e-3} for f in feeds(8, 1)]
    calls = []
    real = static.quantize_static
    monkeypatch.setattr(static, "wide_candidate", lambda *a: True)
    monkeypatch.setattr(static, "quantize_static", lambda *a, **k: calls.append(a) or real(*a, **k))
    s = real(src, tmp_path / "q.onnx", data, verbose=False)
    note = next(n for n in s.notes if n.startswith("eq. (27)"))
    assert "the final 8-bit file measures" in note and "so it is kept" in note
    assert calls == []  # no 16-bit quantization
    assert set(q_types(tmp_path / "q.onnx").values()) <= {TensorProto.UINT8, TensorProto.INT8}


def test_the_decision():
    keep, note = wide_decision(0.6, 4, 0.7, 29.0)
    assert keep and "0.6 dB" in note and "29.0 dB" in note and "4 held-out" in note
    keep, note = wide_decision(0.6, 4, 0.7, 0.7 + WIDE_MARGIN_DB - 0.1)
    assert not keep and "8-bit file is kept" in note
    keep, note = wide_decision(0.6, 4, 0.7, None)
    assert not keep and "could not be measured" in note
    keep, note = wide_decision(6.2, 8, WIDE_TRY_SQNR_DB + 16.0, None)
    assert not keep and "so it is kept" in note
    r8 = RangeChoice("mse", {"minmax": 0.3, "mse": 0.6}, 4)
    assert wide_candidate(Recipe(), r8)
    assert not wide_candidate(Recipe(), RangeChoice("minmax", {"minmax": WIDE_TRY_SQNR_DB}, 4))
    # the try's bar is the warning's: a file over it (the anomaly U-Net's 8-bit file with its
    # BatchNorm scales folded, 12.1 dB) is neither measured nor warned about
    gray = RangeChoice("mse", {"minmax": 11.4, "mse": 12.1}, 8)
    assert WIDE_TRY_SQNR_DB == FAR_SQNR_DB < 12.1
    assert not wide_candidate(Recipe(), gray)
    assert "warning" not in gray.format()
    assert wide_candidate(Recipe(), RangeChoice("mse", {"minmax": 8.0, "mse": 9.9}, 8))
    assert not wide_candidate(Recipe(), RangeChoice("minmax", {}, 1, "too few"))
    assert not wide_candidate(Recipe(), None)
    assert not wide_candidate(Recipe(activation_type="int16"), r8)
    assert not wide_candidate(Recipe(weight_type="int4"), r8)
    # eq. (29b) measures after eq. (24), on its winner: a per-tensor depthwise grid that
    # reaches the bar makes the 8-bit file's estimate (EfficientNet-Lite0 on 16 crops:
    # per channel 6.2 dB, per tensor 20.2 dB)
    per_channel = RangeChoice("mse", {"minmax": 5.9, "mse": 6.2}, 8)
    depthwise = RangeChoice("per_tensor", {"per_tensor": 20.2, "per_channel": 6.2}, 8)
    assert wide_candidate(Recipe(), per_channel)
    assert not wide_candidate(Recipe(), per_channel, depthwise)
    assert wide_candidate(Recipe(), per_channel, None)
    assert best_8bit_sqnr(per_channel, depthwise) == 20.2
    assert best_8bit_sqnr(None, RangeChoice("minmax", {}, 1, "too few")) is None
