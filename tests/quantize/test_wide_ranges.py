"""Eq. (25): non-negative data of wide dynamic range (a power spectrum reaching 1e12) is
not a mask: it gets 16-bit activations, with the output of the layer reading it, and
the layer runs in integer (A16W8); a negative -1e9 fill is still a mask."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.calibrate.observer import WIDE, is_degenerate
from quanta.ir.onnx_io import load
from quanta.ir.types import F32, CalibratedType

ort = pytest.importorskip("onnxruntime")

K, BINS = 17, 7


def spectrum_model() -> onnx.ModelProto:
    """A mel front end: x[1, 1, 300] -> Conv (K filters, 16 taps) -> c; p = c * c (power,
    up to ~1e11) -> Transpose -> MatMul with a non-negative filterbank -> Clip -> Log."""
    rng = np.random.default_rng(0)
    g = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "cw"], ["c"], name="stft"),
            helper.make_node("Mul", ["c", "c"], ["p"], name="power"),
            helper.make_node("Transpose", ["p"], ["pt"], perm=[0, 2, 1], name="frames"),
            helper.make_node("MatMul", ["pt", "fb"], ["mel"], name="mel"),
            helper.make_node("Clip", ["mel", "floor"], ["mc"], name="clip"),
            helper.make_node("Log", ["mc"], ["y"], name="log"),
        ],
        "spectrum",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 300])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(rng.standard_normal((K, 1, 16)).astype(np.float32), "cw"),
            numpy_helper.from_array(np.abs(rng.standard_normal((K, BINS))).astype(np.float32), "fb"),
            numpy_helper.from_array(np.array(1e-10, np.float32), "floor"),
        ],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    r = np.random.default_rng(seed)
    return [
        {"x": (r.standard_normal((1, 1, 300)) * np.exp(r.uniform(3, 6)) * 100).astype(np.float32)}
        for _ in range(n)
    ]


def q_dtype(path, tensor: str) -> int:
    proto = onnx.load(str(path))
    node = next(n for n in proto.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
    zp = next(i for i in proto.graph.initializer if i.name == node.input[2])
    return zp.data_type


def test_a_power_spectrum_is_widened_to_16_bits_and_runs_in_integer(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(spectrum_model(), src)
    calib = feeds(8, 1)
    s = quanta.quantize_static(src, tmp_path / "q.onnx", calib, verbose=False)
    assert s.integer_share == pytest.approx(1.0)  # the filterbank MatMul too
    assert not s.float_tensors
    assert q_dtype(tmp_path / "q.onnx", "p") == TensorProto.INT16
    assert q_dtype(tmp_path / "q.onnx", "mel") == TensorProto.INT16  # through the Transpose
    assert q_dtype(tmp_path / "q.onnx", "c") == TensorProto.UINT8  # the rest stays 8-bit
    overrides = json.loads(load(tmp_path / "q.onnx").metadata["quanta.recipe"])["overrides"]
    assert overrides == {"p": {"dtype": "int16"}, "mel": {"dtype": "int16"}}
    onnx.checker.check_model(str(tmp_path / "q.onnx"), full_check=True)
    held = feeds(3, 2)
    ref = [ort.InferenceSession(str(src)).run(None, f)[0].astype(np.float64) for f in held]
    for runner in (
        quanta.InferenceSession(str(tmp_path / "q.onnx")),
        ort.InferenceSession(str(tmp_path / "q.onnx")),
    ):
        got = [runner.run(None, f)[0] for f in held]
        noise = sum(float(np.sum((r - g) ** 2)) for r, g in zip(ref, got))
        assert 10 * np.log10(sum(float(np.sum(r**2)) for r in ref) / noise) > 40.0


def test_data_that_cannot_be_read_again_stays_float_with_the_right_reason(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(spectrum_model(), src)
    s = quanta.quantize_static(src, tmp_path / "q.onnx", (f for f in feeds(4, 1)), verbose=False)
    reasons = dict(s.float_tensors)
    assert reasons["p"].startswith(WIDE) and "16-bit activations" in reasons["p"]
    assert "mask" not in reasons["p"]


def test_masks_and_wide_data_get_different_reasons():
    mask = is_degenerate(CalibratedType(F32, -1e9, 3.0))
    assert mask is not None and "mask" in mask
    assert is_degenerate(CalibratedType(F32, -1e9, 3.0), bits=16) == mask  # 16 bits do not help a mask
    wide = is_degenerate(CalibratedType(F32, 0.0, 2.5e11))
    assert wide is not None and wide.startswith(WIDE) and "step would be 9.8e+08" in wide
    assert is_degenerate(CalibratedType(F32, 0.0, 2.5e11), bits=16) is None
    assert is_degenerate(CalibratedType(F32, 0.0, float("inf")), bits=16) is not None  # not finite
