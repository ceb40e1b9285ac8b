"""quanta.passes.qmath restates eq. (1) and (2); checked bit for bit against the
reference kernels (a formula in two places needs a test that they agree)."""

from __future__ import annotations

import numpy as np
import pytest

from quanta.ir.types import F16, F32, I4, I8, I16, I32, U8, U16, QuantType
from quanta.kernels.reference.quantize import dequantize_linear, quantize_linear
from quanta.passes.qmath import dq_q_is_identity, quantize_value, quantize_values, real_range

TYPES = [
    QuantType(U8, F32, 0.05, 0),
    QuantType(U8, F32, 0.0235, 131),
    QuantType(I8, F32, 0.37, -7),
    QuantType(I16, F32, 0.0013, 301),
    QuantType(U16, F32, 3.5e-5, 40000),
]


@pytest.mark.parametrize("qt", TYPES, ids=str)
def test_quantize_value_matches_the_reference_kernel(qt):
    s = np.float32(qt.scale[0])
    zp = qt.zero_point_array()
    # ties on both signs (x.5 steps), saturation on both ends, zeros, NaN
    k = np.arange(-300, 301, dtype=np.float32)
    values = np.concatenate([k * s, (k + 0.5) * s, np.array([0.0, -0.0, 1e30, -1e30, np.nan], np.float32)])
    expected = quantize_linear(values, s, zp, dtype=qt.numpy)
    actual = np.array([quantize_value(float(v), qt) for v in values], dtype=qt.numpy)
    np.testing.assert_array_equal(actual, expected)


def test_quantize_value_golden_ties():
    qt = QuantType(U8, F32, 0.05, 0)
    assert quantize_value(0.025, qt) == 0  # 0.5 -> 0 (half to even)
    assert quantize_value(0.075, qt) == 2  # 1.5 -> 2
    qt = QuantType(I8, F32, 1.0, 10)
    assert [quantize_value(v, qt) for v in (2.5, 3.5, -2.5, -3.5)] == [12, 14, 8, 6]


def test_quantize_value_per_axis_channel():
    qt = QuantType(U8, F32, (0.5, 0.25), (3, 7), axis=0)
    assert quantize_value(1.0, qt, 0) == 5 and quantize_value(1.0, qt, 1) == 11


@pytest.mark.parametrize("storage", [U8, I8, I16, U16, I4])
@pytest.mark.parametrize("channels", [1, 3, 7, 17])
def test_quantize_values_is_quantize_value_on_every_channel(storage, channels):
    rng = np.random.default_rng(channels)
    lo, hi = storage.qmin, storage.qmax
    scales = tuple(float(np.float32(v)) for v in rng.uniform(1e-4, 0.5, channels))
    zps = tuple(int(v) for v in rng.integers(lo, hi + 1, channels))
    qt = QuantType(storage, F32, scales, zps, axis=1 if channels > 1 else None)
    if channels == 1:
        qt = QuantType(storage, F32, scales[0], zps[0])
    values = [0.0, -0.0, 1e30, -1e30, float("nan"), 6.0, -6.0, 1.0]
    values += [float((k + 0.5) * scales[0]) for k in range(-5, 5)]  # ties on channel 0
    values += [float(v) for v in rng.normal(0, 10, 20)]
    for x in values:
        want = [quantize_value(x, qt, ch) for ch in range(channels)]
        assert quantize_values(x, qt).tolist() == want, x


@pytest.mark.parametrize("qt", TYPES, ids=str)
def test_real_range_matches_dequantize_of_qmin_qmax(qt):
    ends = np.array([qt.qmin, qt.qmax]).astype(qt.numpy)
    lo, hi = dequantize_linear(ends, np.float32(qt.scale[0]), qt.zero_point_array())
    assert real_range(qt) == (float(lo), float(hi))


def test_dq_q_is_identity_reasons():
    assert dq_q_is_identity(QuantType(U8, F32, 0.02, 131)) is None
    assert dq_q_is_identity(QuantType(I4, F32, 0.5, 1)) is None
    assert dq_q_is_identity(QuantType(I32, F32, 0.5, 0)) == (
        "storage i32 is wider than 16 bits (float32 cannot hold every value exactly)"
    )
    assert dq_q_is_identity(QuantType(I8, F16, 0.5, 0)) == "expressed type f16 is not f32"
    assert dq_q_is_identity(QuantType(I8, F32, 1e-40, 0)) == (
        "scale 9.99994610111476e-41 is subnormal or too large for exact round trips"
    )
    assert dq_q_is_identity(QuantType(I8, F32, 3e38, 0)).startswith(
        "scale 3.0000000054977558e+38 is subnormal or too large"
    )


@pytest.mark.parametrize(
    "qt",
    [QuantType(U8, F32, 0.02, 131), QuantType(I16, F32, 1234.5, -17), QuantType(U16, F32, 1.1754944e-38, 1)],
    ids=str,
)
def test_dq_q_is_identity_claim_holds_on_every_integer(qt):
    assert dq_q_is_identity(qt) is None
    info = np.iinfo(qt.numpy)
    q = np.arange(info.min, info.max + 1).astype(qt.numpy)
    s, z = np.float32(qt.scale[0]), qt.zero_point_array()
    np.testing.assert_array_equal(quantize_linear(dequantize_linear(q, s, z), s, z, dtype=qt.numpy), q)
