"""quanta.quantize.params: range -> (scale, zero point), bias parameters.

Tolerances: there are none in this file. Parameters are compared bit for bit (float32
scale, integer zero point), against hand-computed values and against ONNX Runtime's
``compute_scale_zp``, because both compute the same float64 expression and round it to
float32 once.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnxruntime.quantization.qdq_quantizer import QDQQuantizer
from onnxruntime.quantization.quant_utils import compute_scale_zp, get_qmin_qmax_for_qType

from quanta.ir.types import F16, F32, I4, I8, I16, I32, U4, U8, U16, CalibratedType, QuantType
from quanta.quantize.params import (
    adjust_weight_scale_for_bias,
    bias_params,
    compute_scale_zero_point,
    params_from_range,
    quant_range,
    quantize_bias,
)


def cal(lo: float, hi: float) -> CalibratedType:
    return CalibratedType(F32, lo, hi)


# ------------------------------------------------------------------ golden values


def test_params_golden_asymmetric_u8():
    # scale = 4/255 (float32), zero point = round(0 - (-1) / (4/255)) = round(63.75) = 64
    q = params_from_range(cal(-1.0, 3.0), U8, symmetric=False)
    assert q == QuantType(U8, F32, (np.float32(4 / 255),), (64,))


def test_params_golden_symmetric_i8_restricted_range():
    # signed symmetric uses [-127, 127]: scale = max(|-1|, |3|) / 127, zero point 0
    q = params_from_range(cal(-1.0, 3.0), I8, symmetric=True)
    assert q == QuantType(I8, F32, (np.float32(3 / 127),), (0,))


def test_params_golden_symmetric_u8_midpoint():
    # unsigned symmetric: zero point round_half_even(255 / 2) = 128, scale = 2·3 / 255
    q = params_from_range(cal(-1.0, 3.0), U8, symmetric=True)
    assert q == QuantType(U8, F32, (np.float32(6 / 255),), (128,))


def test_params_range_widened_to_include_zero():
    # [2, 5] -> [0, 5]: zero point 0 in u8; [-5, -2] -> [-5, 0]: zero point 255
    assert params_from_range(cal(2.0, 5.0), U8, symmetric=False) == QuantType(
        U8, F32, (np.float32(5 / 255),), (0,)
    )
    assert params_from_range(cal(-5.0, -2.0), U8, symmetric=False) == QuantType(
        U8, F32, (np.float32(5 / 255),), (255,)
    )
    assert params_from_range(cal(-5.0, -2.0), I8, symmetric=False).zero_point == (127,)


@pytest.mark.parametrize("storage", [U8, I8, U16, I16, U4, I4])
@pytest.mark.parametrize("symmetric", [False, True])
def test_params_zero_range_gives_scale_one_zero_point_zero(storage, symmetric):
    # Failure signature: ZeroDivisionError / scale 0 / NaN zero point on an all-zero tensor.
    q = params_from_range(cal(0.0, 0.0), storage, symmetric=symmetric)
    assert q.scale == (1.0,) and q.zero_point == (0,)


def test_params_subnormal_range_gives_scale_one():
    # (rmax - rmin) / 255 below float32's smallest normal: ORT falls back to (1, 0), so do we.
    q = params_from_range(cal(0.0, 1e-37), U8, symmetric=False)
    assert q.scale == (1.0,) and q.zero_point == (0,)


def test_params_constant_positive_tensor_is_representable():
    # [3.7, 3.7] widens to [0, 3.7]: 3.7 is the top of the grid, not a zero range.
    q = params_from_range(cal(3.7, 3.7), U8, symmetric=False)
    assert q.zero_point == (0,) and q.scale[0] == np.float32(np.float32(3.7) / np.float64(255))


# ------------------------------------------------------ rounding ties (half to even)
# scale = 1/64 exactly, so -rmin/scale lands on an exact .5.


@pytest.mark.parametrize(
    ("storage", "steps_below_zero", "expected_zp"),
    [
        (U8, 2.5, 2),  # half-even 2; half-up / half-away would give 3
        (U8, 3.5, 4),
        (I8, 1.5, -126),  # -128 + 1.5 = -126.5: half-even -126; half-away -127
        (I8, 2.5, -126),  # -125.5: half-even -126; half-up -125
    ],
)
def test_params_zero_point_ties_round_half_to_even(storage, steps_below_zero, expected_zp):
    s = 1.0 / 64
    levels = storage.qmax - storage.qmin
    lo, hi = -steps_below_zero * s, (levels - steps_below_zero) * s
    q = params_from_range(cal(lo, hi), storage, symmetric=False)
    assert q.scale == (s,)
    assert q.zero_point == (expected_zp,)
    ort_zp, ort_scale = compute_scale_zp(
        np.float32(lo), np.float32(hi), *get_qmin_qmax_for_qType(storage.onnx, False, False)
    )
    assert int(ort_zp) == expected_zp and float(ort_scale) == s


@pytest.mark.parametrize(
    ("storage", "reduce_range", "expected_zp"),
    [(U8, False, 128), (U8, True, 64), (U4, False, 8), (U16, False, 32768)],
)
def test_params_symmetric_unsigned_midpoint_ties(storage, reduce_range, expected_zp):
    # (qmin + qmax) / 2 = 127.5, 63.5, 7.5, 32767.5: all ties, all to the even neighbour
    q = params_from_range(cal(-1.0, 2.0), storage, symmetric=True, reduce_range=reduce_range)
    assert q.zero_point == (expected_zp,)


# ----------------------------------------------------------------- quant ranges


def test_quant_range_table():
    assert quant_range(I8, symmetric=False) == (-128, 127)
    assert quant_range(I8, symmetric=True) == (-127, 127)
    assert quant_range(U8, symmetric=True) == (0, 255)
    assert quant_range(I8, symmetric=True, reduce_range=True) == (-64, 64)
    assert quant_range(U8, symmetric=False, reduce_range=True) == (0, 127)
    assert quant_range(I4, symmetric=True) == (-7, 7)


def test_quant_range_rejects_non_integer_storage():
    with pytest.raises(
        TypeError, match=r"quant_range: expected an integer storage type \(i8, u8, \.\.\.\), got f32"
    ):
        quant_range(F32, symmetric=False)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"reduce_range is defined for .*, got i32"):
        quant_range(I32, symmetric=False, reduce_range=True)


# ------------------------------------------------------------ ORT equivalence


def _random_ranges(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    mag = 10.0 ** rng.uniform(-6, 6, size=(2, n))
    sign = rng.choice([-1.0, 1.0], size=(2, n))
    a, b = (mag * sign).astype(np.float32)
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    # special rows: one-sided, constant, zero, ties (-rmin/scale = k + 0.5 with scale 2^-6)
    s = np.float32(1 / 64)
    extra_lo = np.array([0, 0, 3, -2, -2.5 * s, -1.5 * s, -7, -1e-30, -3e38], np.float32)
    extra_hi = np.array([0, 5, 3, -2, 252.5 * s, 253.5 * s, 7, 1e-30, 3e38], np.float32)
    return np.concatenate([lo, extra_lo]), np.concatenate([hi, extra_hi])


CONFIGS = [
    (st, sym, rr)
    for st in (U8, I8, U16, I16, U4, I4)
    for sym in (False, True)
    for rr in (False, True)
    if not (st == I4 and sym and not rr)  # documented difference, tested below
]


@pytest.mark.parametrize(("storage", "symmetric", "reduce_range"), CONFIGS)
def test_params_match_onnxruntime_compute_scale_zp(storage, symmetric, reduce_range):
    lo, hi = _random_ranges(np.random.default_rng(7), 300)
    scale, zp = compute_scale_zero_point(lo, hi, storage, symmetric=symmetric, reduce_range=reduce_range)
    qmin, qmax = get_qmin_qmax_for_qType(storage.onnx, reduce_range, symmetric)
    for i in range(lo.size):
        ort_zp, ort_scale = compute_scale_zp(lo[i], hi[i], qmin, qmax, symmetric)
        assert np.float32(ort_scale).tobytes() == scale[i].tobytes(), (i, lo[i], hi[i])
        assert int(ort_zp) == int(zp[i]), (i, lo[i], hi[i])


def test_params_i4_symmetric_differs_from_onnxruntime_by_design():
    # ORT's compute_scale_zp uses [-8, 7] for symmetric int4 (no restricted-range row), so
    # +absmax rounds to 7.5 and saturates. quanta uses [-7, 7]: scale = absmax / 7.
    q = params_from_range(cal(-1.0, 3.5), I4, symmetric=True)
    assert q.scale == (0.5,) and q.zero_point == (0,)


def test_params_float16_expressed_matches_onnxruntime():
    lo, hi = np.float16(-0.3), np.float16(1.7)
    q = params_from_range(CalibratedType(F16, float(lo), float(hi)), U8, symmetric=False)
    ort_zp, ort_scale = compute_scale_zp(lo, hi, *get_qmin_qmax_for_qType(U8.onnx, False, False))
    assert ort_scale.dtype == np.float16 and q.scale == (float(ort_scale),) and q.zero_point == (int(ort_zp),)


# ---------------------------------------------------------------- per channel


def test_params_per_channel_equals_per_tensor_per_channel():
    # Per-axis vs per-tensor twin consistency: channel c of the per-axis type is exactly
    # the per-tensor type of channel c's range.
    mins, maxs = (-1.0, 0.0, -0.25, -3.0, 2.0), (3.0, 0.0, 0.75, -1.0, 5.0)
    q = params_from_range(CalibratedType(F32, mins, maxs, axis=0), U8, symmetric=False)
    assert q.axis == 0 and len(q.scale) == 5
    for c in range(5):
        one = params_from_range(cal(mins[c], maxs[c]), U8, symmetric=False)
        assert (q.scale[c], q.zero_point[c]) == (one.scale[0], one.zero_point[0])
    assert (q.scale[1], q.zero_point[1]) == (1.0, 0)  # the all-zero channel


def test_params_per_channel_collapsed_to_per_tensor():
    c = CalibratedType(F32, (-1.0, -0.5), (2.0, 3.0), axis=1)
    assert params_from_range(c, I8, symmetric=True, axis=None) == params_from_range(
        cal(-1.0, 3.0), I8, symmetric=True
    )
    assert params_from_range(c, I8, symmetric=True).axis == 1


def test_params_axis_mismatch_message():
    c = CalibratedType(F32, (-1.0, -0.5), (2.0, 3.0), axis=1)
    with pytest.raises(
        ValueError, match=r"^params_from_range: axis 0 requested but the range is per-channel along axis 1$"
    ):
        params_from_range(c, I8, symmetric=True, axis=0)
    with pytest.raises(
        ValueError, match=r"^params_from_range: axis 0 requested but the range is per-tensor$"
    ):
        params_from_range(cal(-1.0, 1.0), I8, symmetric=True, axis=0)


@pytest.mark.parametrize("bad", [(-np.inf, 1.0), (-1.0, np.inf)])
def test_params_non_finite_range_is_refused(bad):
    # Failure signature: an attention mask calibrated to [-inf, x] giving scale inf / zp NaN.
    with pytest.raises(ValueError, match=r"is not finite; such a tensor cannot be quantized \(keep it float"):
        params_from_range(cal(*bad), U8, symmetric=False)


def test_params_extreme_finite_range_does_not_overflow():
    # [-3.4e38, 3.4e38]: max - min overflows float32 but not the float64 arithmetic.
    q = params_from_range(cal(-3.4e38, 3.4e38), I8, symmetric=False)
    assert np.isfinite(q.scale[0]) and q.scale[0] == np.float32(6.8e38 / 255)


# ------------------------------------------------------------------------ bias


def test_bias_params_scale_is_float32_product_per_channel():
    x = QuantType(U8, F32, (0.02,), (131,))
    w = QuantType(I8, F32, (0.5, 0.25, 0.125), (0, 0, 0), axis=0)
    b = bias_params(x, w)
    assert b.storage == I32 and b.axis == 0 and b.zero_point == (0, 0, 0)
    assert b.scale == tuple(float(np.float32(0.02) * np.float32(s)) for s in (0.5, 0.25, 0.125))
    assert bias_params(x, QuantType(I8, F32, (0.3,), (0,))).axis is None


def _ort_adjust(sx: float, sw: np.ndarray, b: np.ndarray, per_channel: bool) -> np.ndarray:
    tp = onnx.numpy_helper.from_array(b.astype(np.float32), "b")
    _, new = QDQQuantizer._adjust_weight_scale_for_int32_bias(
        None, np.asarray(sx, np.float32), sw.astype(np.float32).copy(), "w", tp, per_channel
    )
    return np.asarray(new)


def test_adjust_weight_scale_for_bias_matches_onnxruntime():
    # sx·sw = 1e-6·1e-6 = 1e-12: a bias of 0.1 needs 1e11 steps > 2^31, so ORT raises sw.
    sx = 1e-6
    sw = np.array([1e-6, 0.5, 1e-7], np.float32)
    b = np.array([0.1, 0.1, -3.0], np.float32)
    x = QuantType(U8, F32, (sx,), (129,))
    w = QuantType(I8, F32, tuple(sw), (0, 0, 0), axis=0)
    ours = adjust_weight_scale_for_bias(x, w, b)
    theirs = _ort_adjust(sx, sw, b, per_channel=True)
    assert np.asarray(ours.scale, np.float32).tobytes() == theirs.astype(np.float32).tobytes()
    assert ours.scale[1] == w.scale[1]  # channel 1 did not need it
    w1 = QuantType(I8, F32, (1e-6,), (0,))
    ours1 = adjust_weight_scale_for_bias(x, w1, b)
    theirs1 = _ort_adjust(sx, np.array([1e-6], np.float32), b, per_channel=False)
    assert ours1.scale == (float(theirs1.reshape(-1)[0]),)


def test_bias_saturates_without_adjustment_and_not_with_it():
    # Hazard: |b| / (sx·sw) > 2^31 - 1 silently clips the bias to int32's edge.
    x = QuantType(U8, F32, (1e-6,), (129,))
    w = QuantType(I8, F32, (1e-6, 0.5), (0, 0), axis=0)
    b = np.array([0.1, 0.1], np.float32)
    qb = quantize_bias(b, bias_params(x, w))
    assert qb[0] == np.iinfo(np.int32).max  # saturated: dequantizes to 2.1e-3, not 0.1
    w2 = adjust_weight_scale_for_bias(x, w, b)
    bt = bias_params(x, w2)
    qb2 = quantize_bias(b, bt)
    assert abs(int(qb2[0])) < np.iinfo(np.int32).max
    # dequantized within half a step (round to nearest) of the float bias
    assert np.all(np.abs(qb2 * bt.scale_array().astype(np.float64) - b) <= bt.scale_array() / 2)


def test_bias_scale_underflow_is_refused_then_fixed_by_adjustment():
    # sx·sw = 1e-30·1e-20 = 1e-50 is 0 in float32: a Q type with scale 0 cannot exist.
    x = QuantType(U8, F32, (1e-30,), (0,))
    w = QuantType(I8, F32, (1e-20,), (0,))
    with pytest.raises(
        ValueError, match=r"^bias_params: bias scale sx\*sw = 0 is below the smallest normal f32"
    ):
        bias_params(x, w)
    w2 = adjust_weight_scale_for_bias(x, w, np.zeros(1, np.float32))
    sb = bias_params(x, w2).scale[0]
    assert sb >= np.finfo(np.float32).tiny


def test_adjust_weight_scale_for_bias_keeps_nonzero_zero_point():
    # quanta also adjusts asymmetric weights (ORT skips them): the zero point is kept.
    x = QuantType(U8, F32, (1e-6,), (129,))
    w = QuantType(U8, F32, (1e-6,), (17,))
    w2 = adjust_weight_scale_for_bias(x, w, np.array([0.1], np.float32))
    assert w2.zero_point == (17,) and w2.scale[0] > w.scale[0]
    roomy = QuantType(U8, F32, (0.5,), (17,))
    assert adjust_weight_scale_for_bias(x, roomy, np.array([0.1])) is roomy  # nothing to adjust


def test_raised_half_weight_scales_are_float16_values():
    """A float16 model's scales are float16 (the file stores them so): the raise to a
    normal bias scale steps through float16 values. Failure signature (a first Conv of
    an onnxconverter-common float16 model on [0, 1] pixels): the type recorded the
    float32 value 0.015564202 while the written scale was its float16 0.015563965, and
    quantize_static refused its own model ("its scale/zero point inputs give ...")."""
    sx = float(np.float16(1 / 255))
    x = QuantType(U8, F16, (sx,), (0,))
    sw = np.array([3e-4, 2.9e-3, 5e-2], np.float16)
    w = QuantType(I8, F16, tuple(float(v) for v in sw), (0, -3, 0), axis=0)
    ours = adjust_weight_scale_for_bias(x, w, np.array([0.1, -0.2, 0.3], np.float32))
    got = np.asarray(ours.scale)
    assert np.array_equal(got.astype(np.float16).astype(np.float64), got)  # float16 values
    tiny = float(np.finfo(np.float16).tiny)
    assert np.all(np.float32(sx) * got.astype(np.float32) >= tiny)
    below = np.float32(sx) * np.nextafter(got.astype(np.float16), np.float16(0)).astype(np.float32)
    raised = got != np.asarray(w.scale)
    assert raised[:2].all() and not raised[2] and np.all(below[raised] < tiny)  # the least such value
    bias_params(x, ours)  # a valid bias type
