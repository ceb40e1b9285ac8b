"""QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear: golden ties, granularity,
storage types, and the documented differences with ONNX Runtime (docs/quantization-math.md,
"Where ONNX Runtime and the ONNX reference differ")."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from quanta.kernels.reference import registry
from quanta.kernels.reference.quantize import (
    dequantize_linear,
    dynamic_quantize_linear,
    expand_param,
    quantize_linear,
)

F32 = np.float32


def _onnx_model(op_type, inputs, outputs, attrs=None, opset=21):
    node = helper.make_node(op_type, [n for n, _ in inputs], [n for n, _ in outputs], **(attrs or {}))
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, t, None) for n, t in inputs],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _ort(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )


def _op(name):
    return registry.get_op(name)


# ----------------------------------------------------------------------------- quantize


def test_quantize_ties_round_half_even_both_signs():
    """Golden: x/s = ±0.5, ±1.5, ±2.5, ±3.5 -> 0, ±2, ±2, ±4, then + zp (odd, 3)."""
    x = np.array([0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.5, -3.5], F32)
    got = quantize_linear(x, F32(1.0), np.int8(3))
    np.testing.assert_array_equal(got, [3, 3, 5, 1, 5, 1, 7, -1])
    assert got.dtype == np.int8


def test_quantize_ties_with_non_unit_scale():
    """0.75 / 0.5 = 1.5 -> 2 and 1.25 / 0.5 = 2.5 -> 2 (both exact in float32)."""
    got = quantize_linear(np.array([0.75, 1.25, -0.75, -1.25], F32), F32(0.5), np.uint8(128))
    np.testing.assert_array_equal(got, [130, 130, 126, 126])


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        (np.uint8, [0, 255, 0, 0, 255]),
        (np.int8, [-128, 127, -128, -128, 127]),
        (np.uint16, [0, 65535, 0, 0, 65535]),
        (np.int16, [-32768, 32767, -32768, -32768, 32767]),
        (ml_dtypes.uint4, [0, 15, 0, 0, 15]),
        (ml_dtypes.int4, [-8, 7, -8, -8, 7]),
        (ml_dtypes.uint2, [0, 3, 0, 0, 3]),
        (ml_dtypes.int2, [-2, 1, -2, -2, 1]),
    ],
)
def test_quantize_saturates_every_integer_storage(dtype, expected):
    """-1e9, 1e9, -inf, NaN (-> qmin, quanta's documented choice, as MLAS), +inf."""
    x = np.array([-1e9, 1e9, -np.inf, np.nan, np.inf], F32)
    got = quantize_linear(x, F32(0.5), np.zeros((), dtype))
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got.astype(np.int64), expected)


def test_quantize_per_axis_distinct_scales_and_zero_points():
    x = np.arange(2 * 3 * 7, dtype=F32).reshape(2, 3, 7) - 20
    scale = np.array([2.0, 3.0, 4.0], F32)
    zp = np.array([10, 20, 30], np.uint8)
    got = quantize_linear(x, scale, zp, axis=1)
    expected = np.clip(np.rint(x / scale[None, :, None]) + zp[None, :, None], 0, 255)
    np.testing.assert_array_equal(got, expected)


def test_quantize_per_axis_negative_axis_equals_positive():
    x = np.linspace(-3, 3, 5 * 7, dtype=F32).reshape(5, 7)
    s = np.linspace(0.01, 0.07, 7).astype(F32)
    z = np.arange(7).astype(np.int8) - 3
    np.testing.assert_array_equal(quantize_linear(x, s, z, axis=-1), quantize_linear(x, s, z, axis=1))


def test_quantize_blocked_with_short_last_block():
    """D = 7, block 3 -> blocks [0:3], [3:6], [6:7]; scale shape (2, 3)."""
    x = np.arange(14, dtype=F32).reshape(2, 7)
    scale = np.array([[1, 2, 4], [0.5, 0.25, 8]], F32)
    zp = np.array([[0, 1, 2], [3, 4, 5]], np.uint8)
    got = quantize_linear(x, scale, zp, axis=1, block=3)
    full_s = np.repeat(scale, 3, axis=1)[:, :7]
    full_z = np.repeat(zp, 3, axis=1)[:, :7].astype(int)
    np.testing.assert_array_equal(got, np.clip(np.rint(x / full_s) + full_z, 0, 255))


def test_expand_param_error_messages():
    """Negative tests with the exact message (MLIR parse-uniform-invalid style)."""
    from quanta.kernels.reference.registry import OpError

    with pytest.raises(
        OpError,
        match=r"^scale: expected a scalar or a 1-D tensor of length 4 \(axis 1 of input shape \(2, 4\)\), got shape \(3,\)$",
    ):
        expand_param(np.ones(3), (2, 4), axis=1, block=None)
    with pytest.raises(
        OpError,
        match=r"^scale: expected shape \(2, 2\) for blocked quantization \(input shape \(2, 4\), axis 1, block_size 3\), got shape \(2, 3\)$",
    ):
        expand_param(np.ones((2, 3)), (2, 4), axis=1, block=3)
    with pytest.raises(OpError, match=r"^axis: expected a value in \[-2, 1\] for an input of rank 2, got 2$"):
        expand_param(np.ones(4), (2, 4), axis=2, block=None)
    with pytest.raises(
        OpError,
        match=r"^scale: expected a scalar for per-tensor quantization \(axis=None\), got shape \(4,\)$",
    ):
        expand_param(np.ones(4), (2, 4), axis=None, block=None)


def test_quantize_float8_saturate_and_not():
    """ONNX saturate table: e4m3fn has no Inf, overflow is NaN without saturation; e5m2 has
    Inf; with saturate=True both clamp to ±max (448, 57344); NaN stays NaN."""
    x = np.array([1e6, -1e6, np.nan, 1.0], F32)
    e4 = ml_dtypes.float8_e4m3fn
    e5 = ml_dtypes.float8_e5m2
    sat4 = quantize_linear(x, F32(1.0), np.zeros((), e4)).astype(F32)
    np.testing.assert_array_equal(sat4, [448, -448, np.nan, 1.0])
    raw4 = quantize_linear(x, F32(1.0), np.zeros((), e4), saturate=False).astype(F32)
    assert np.isnan(raw4[:3]).all()
    sat5 = quantize_linear(x, F32(1.0), np.zeros((), e5)).astype(F32)
    np.testing.assert_array_equal(sat5, [57344, -57344, np.nan, 1.0])
    raw5 = quantize_linear(x, F32(1.0), np.zeros((), e5), saturate=False).astype(F32)
    np.testing.assert_array_equal(raw5[:2], [np.inf, -np.inf])


def test_quantize_float8_rounds_half_even():
    """e4m3fn near 1: spacing 1/8. 1 + 1/16 is a tie -> 1 (even mantissa); 1 + 3/16 -> 1.25."""
    x = np.array([1.0625, 1.1875, -1.0625], F32)
    got = quantize_linear(x, F32(1.0), np.zeros((), ml_dtypes.float8_e4m3fn)).astype(F32)
    np.testing.assert_array_equal(got, [1.0, 1.25, -1.0])


def test_quantize_float16_divides_in_scale_precision_unlike_onnxruntime():
    """Where ORT and the spec differ: the spec divides in the type of y_scale (float16):
    float16(-11.766 / 0.4614) = -25.5 exactly -> -26 (half even) -> 102 with zp 128.
    ONNX Runtime divides in float32: -25.4984 -> -25 -> 103."""
    x = np.array([51682], np.uint16).view(np.float16)  # -11.766
    s = np.array(14178, np.uint16).view(np.float16)  # 0.4614
    zp = np.uint8(128)
    np.testing.assert_array_equal(quantize_linear(x, s, zp), [102])
    model = _onnx_model(
        "QuantizeLinear",
        [("x", TensorProto.FLOAT16), ("s", TensorProto.FLOAT16), ("z", TensorProto.UINT8)],
        [("y", TensorProto.UINT8)],
    )
    feeds = {"x": x, "s": s, "z": np.array(zp)}
    np.testing.assert_array_equal(ReferenceEvaluator(model).run(None, feeds)[0], [102])
    np.testing.assert_array_equal(_ort(model, feeds)[0], [103])


def test_quantize_precision_attribute_overrides_scale_type():
    """With precision=float32 the same case divides in float32 -> 103 (ORT's value)."""
    x = np.array([51682], np.uint16).view(np.float16)
    s = np.array(14178, np.uint16).view(np.float16)
    got = _op("QuantizeLinear")(
        registry.OpContext(opset=23), x, s, np.array(128, np.uint8), precision=TensorProto.FLOAT
    )
    np.testing.assert_array_equal(got, [103])


@given(
    st.lists(st.floats(-50, 50, width=32), min_size=1, max_size=40),
    st.floats(0.015625, 2.0, width=32),
    st.integers(-128, 127),
)
def test_quantize_dequantize_roundtrip_error_within_half_scale(values, scale, zp):
    """|dq(q(x)) − x| ≤ s/2 + 1 ulp(x) inside the representable range: rounding to the
    nearest code moves at most half a step; the float32 divide/multiply add ≤ 1 ulp each."""
    x = np.array(values, F32)
    s = F32(scale)
    lo, hi = (-128 - zp) * s, (127 - zp) * s
    x = x[(x > lo) & (x < hi)]
    y = dequantize_linear(quantize_linear(x, s, np.int8(zp)), s, np.int8(zp))
    tol = s / 2 + 2 * np.spacing(np.maximum(np.abs(x), np.abs(y)))
    assert np.all(np.abs(y - x) <= tol)


# ----------------------------------------------------------------------------- dequantize


def test_dequantize_per_axis_and_blocked():
    q = np.array([[0, 10, 20, 30, 40], [5, 15, 25, 35, 45]], np.uint8)
    s = np.array([0.5, 0.25], F32)
    z = np.array([10, 20], np.uint8)
    np.testing.assert_array_equal(
        dequantize_linear(q, s, z, axis=0), [[-5, 0, 5, 10, 15], [-3.75, -1.25, 1.25, 3.75, 6.25]]
    )
    sb = np.array([[1, 2, 4], [8, 16, 32]], F32)
    zb = np.array([[0, 1, 2], [3, 4, 5]], np.uint8)
    got = dequantize_linear(q, sb, zb, axis=1, block=2)
    np.testing.assert_array_equal(got, [[0, 10, 38, 58, 152], [16, 96, 336, 496, 1280]])


def test_dequantize_int32_input_rounds_like_float32():
    """int32 values above 2^24 convert to float32 with rounding (as ORT: float(x) * scale)."""
    q = np.array([2**24 + 1, -(2**31)], np.int32)
    np.testing.assert_array_equal(dequantize_linear(q, F32(1.0)), [2.0**24, -(2.0**31)])


def test_dequantize_output_dtype_float16_and_bfloat16():
    q = np.array([0, 7, 255], np.uint8)
    f16 = dequantize_linear(q, F32(0.1), np.uint8(7), dtype=np.float16)
    assert f16.dtype == np.float16
    np.testing.assert_array_equal(f16, (np.array([-7, 0, 248], F32) * F32(0.1)).astype(np.float16))
    bf = dequantize_linear(q, np.array(0.5, ml_dtypes.bfloat16), np.uint8(7))
    assert bf.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(bf.astype(F32), [-3.5, 0.0, 124.0])


def test_dequantize_e8m0_scale_is_a_power_of_two():
    q = np.array([1.5, -2.0], F32).astype(ml_dtypes.float8_e4m3fn)
    s = np.array(8.0, F32).astype(ml_dtypes.float8_e8m0fnu)
    got = dequantize_linear(q, s)
    assert got.dtype == F32
    np.testing.assert_array_equal(got, [12.0, -16.0])


def test_dequantize_op_int32_rejects_nonzero_zero_point():
    with pytest.raises(registry.OpError, match=r"x_zero_point: expected 0 \(or none\) for an int32 input"):
        _op("DequantizeLinear")(
            registry.OpContext(opset=21), np.zeros(3, np.int32), np.array(1.0, F32), np.array(2, np.int32)
        )


def test_quantize_op_output_dtype_must_match_zero_point():
    with pytest.raises(
        registry.OpError, match=r"output_dtype: expected the type of y_zero_point \(uint8\), got int8"
    ):
        _op("QuantizeLinear")(
            registry.OpContext(opset=21),
            np.zeros(3, F32),
            np.array(1.0, F32),
            np.array(0, np.uint8),
            output_dtype=TensorProto.INT8,
        )


def test_quantize_op_opset10_rejects_per_axis():
    with pytest.raises(registry.OpError, match=r"QuantizeLinear-10: expected a scalar scale"):
        _op("QuantizeLinear")(
            registry.OpContext(opset=10), np.zeros((2, 3), F32), np.ones(3, F32), np.zeros(3, np.uint8)
        )


def test_quantize_op_default_output_is_uint8_without_zero_point():
    got = _op("QuantizeLinear")(registry.OpContext(opset=21), np.array([1.0, -1.0], F32), np.array(0.5, F32))
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, [2, 0])


def test_quantize_op_matches_onnx_reference_per_axis_int16():
    rng = np.random.default_rng(7)
    x = rng.normal(0, 100, (3, 17, 5)).astype(F32)
    s = rng.uniform(0.01, 0.1, 17).astype(F32)
    z = rng.integers(-1000, 1000, 17).astype(np.int16)
    model = _onnx_model(
        "QuantizeLinear",
        [("x", TensorProto.FLOAT), ("s", TensorProto.FLOAT), ("z", TensorProto.INT16)],
        [("y", TensorProto.INT16)],
        {"axis": 1},
    )
    expected = ReferenceEvaluator(model).run(None, {"x": x, "s": s, "z": z})[0]
    got = _op("QuantizeLinear")(registry.OpContext(opset=21), x, s, z, axis=1)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got, _ort(model, {"x": x, "s": s, "z": z})[0])


# ----------------------------------------------------------------------------- dynamic


def test_dynamic_quantize_ties_both_signs():
    """Range [-2.55, 2.55] -> scale 0.02 (float32), zp = rint(127.5) = 128 (even).
    x/scale = ±0.5, ±1.5 -> 0, ±2 (half even) + 128."""
    s = F32(F32(F32(2.55) - F32(-2.55)) / F32(255))
    x = np.array([-2.55, 2.55, 0.5 * s, -0.5 * s, 1.5 * s, -1.5 * s], F32)
    y, scale, zp = dynamic_quantize_linear(x)
    assert scale == s
    assert zp == 128
    assert np.all(x[2:] / scale == np.array([0.5, -0.5, 1.5, -1.5], F32))
    np.testing.assert_array_equal(y[2:], [128, 128, 130, 126])


@pytest.mark.parametrize(("x", "zp"), [([-0.5, 254.5], 0), ([-1.5, 253.5], 2), ([-2.5, 252.5], 2)])
def test_dynamic_quantize_zero_point_rounds_half_even(x, zp):
    """scale = 255/255 = 1; zp = rint(-min) = rint(0.5), rint(1.5), rint(2.5) = 0, 2, 2."""
    _, scale, z = dynamic_quantize_linear(np.array(x, F32))
    assert scale == 1.0
    assert z == zp


def test_dynamic_quantize_range_widened_to_include_zero():
    _, scale, zp = dynamic_quantize_linear(np.array([2.0, 3.0, 5.1], F32))
    assert scale == F32(F32(5.1) / F32(255))
    assert zp == 0
    _, scale, zp = dynamic_quantize_linear(np.array([-2.0, -3.0, -5.1], F32))
    assert zp == 255


def test_dynamic_quantize_all_zero_input_follows_onnx_reference_not_onnxruntime():
    """Where ORT and the ONNX reference differ: an all-zero input. The ONNX reference (and
    quanta) uses a range of 1 -> scale 1/255; ONNX Runtime returns scale 1. y and zp are 0
    either way. Failure signature: scale 1.0 here means quanta followed ORT."""
    x = np.zeros((2, 3), F32)
    y, scale, zp = dynamic_quantize_linear(x)
    assert scale == F32(1) / F32(255)
    assert zp == 0
    np.testing.assert_array_equal(y, np.zeros((2, 3), np.uint8))
    model = _onnx_model(
        "DynamicQuantizeLinear",
        [("x", TensorProto.FLOAT)],
        [("y", TensorProto.UINT8), ("s", TensorProto.FLOAT), ("z", TensorProto.UINT8)],
        opset=11,
    )
    _, ref_s, ref_z = ReferenceEvaluator(model).run(None, {"x": x})
    assert ref_s == scale
    ort_y, ort_s, ort_z = _ort(model, {"x": x})
    assert ort_s == 1.0
    np.testing.assert_array_equal(ort_y, y)
    assert ort_z == zp == ref_z


@given(st.lists(st.floats(-1e4, 1e4, width=32), min_size=1, max_size=50))
def test_dynamic_quantize_matches_onnx_reference_and_onnxruntime(values):
    """Exact: every step is the same float32 operation in all three (except the all-zero
    scale, tested above)."""
    x = np.array(values, F32)
    y, scale, zp = dynamic_quantize_linear(x)
    model = _onnx_model(
        "DynamicQuantizeLinear",
        [("x", TensorProto.FLOAT)],
        [("y", TensorProto.UINT8), ("s", TensorProto.FLOAT), ("z", TensorProto.UINT8)],
        opset=11,
    )
    ref = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_array_equal(y, ref[0])
    assert scale == ref[1] and zp == ref[2]
    if np.any(x != 0):
        got = _ort(model, {"x": x})
        np.testing.assert_array_equal(y, got[0])
        assert scale == got[1] and zp == got[2]


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_quantize_nan_gives_qmin_as_onnxruntime(dtype):
    """The spec leaves NaN undefined; quanta maps it to qmin, which is what ONNX Runtime's
    MLAS kernel produces (MAXPS returns the second operand, the lower bound, for NaN)."""
    x = np.array([np.nan, 1.0, np.nan, np.nan, 2.0, 3.0, np.nan, 4.0, np.nan], F32)
    zp = np.array(10, dtype)
    got = quantize_linear(x, F32(0.5), zp)
    tensor_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = _onnx_model(
        "QuantizeLinear",
        [("x", TensorProto.FLOAT), ("s", TensorProto.FLOAT), ("z", tensor_type)],
        [("y", tensor_type)],
    )
    expected = _ort(model, {"x": x, "s": np.array(0.5, F32), "z": zp})[0]
    np.testing.assert_array_equal(got, expected)
    assert got[0] == np.iinfo(dtype).min
