"""Differential test: native QuantizeLinear (quanta/kernels/cpp/quantize) vs the reference.

Every ISA variant the CPU runs (portable always) against
``quanta.kernels.reference.quantize.quantize_linear``, bit-exact. Tolerance 0: both divide
in float32 (a true division, not a multiply by 1/scale), round half to even and saturate.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from quanta.kernels import _native
from quanta.kernels.reference.quantize import quantize_linear

ISAS: list[str] = list(_native.supported_isas())
DTYPES = (np.uint8, np.int8)


@pytest.fixture
def each_isa():
    """Yields a function that runs a callable once per ISA with the override set."""

    def run(fn):
        try:
            for isa in ISAS:
                _native.set_isa(isa)
                fn(isa)
        finally:
            _native.clear_isa()

    return run


def native_quantize(x: np.ndarray, scale: np.ndarray, zp: np.ndarray, axis: int, dtype: type) -> np.ndarray:
    fn = _native.quantize_linear_u8 if dtype == np.uint8 else _native.quantize_linear_s8
    return fn(x, scale.astype(np.float32), zp.astype(np.int32), axis)


def reference_quantize(
    x: np.ndarray, scale: np.ndarray, zp: np.ndarray, axis: int, dtype: type
) -> np.ndarray:
    per_tensor = scale.size == 1
    return quantize_linear(
        x,
        scale.reshape(()) if per_tensor else scale,
        np.asarray(zp, dtype=dtype).reshape(()) if per_tensor else np.asarray(zp, dtype=dtype),
        axis=None if per_tensor else axis,
        dtype=dtype,
    )


def assert_same(expected: np.ndarray, actual: np.ndarray, label: str, x: np.ndarray, scale, zp) -> None:
    if expected.dtype == actual.dtype and expected.tobytes() == actual.tobytes():
        return
    bad = np.argwhere(expected != actual)
    i = tuple(int(v) for v in bad[0])
    raise AssertionError(
        f"{label}: {len(bad)} of {expected.size} differ; shape {x.shape}; first bad index {i}: x={x[i]!r}, "
        f"expected {expected[i]!r}, actual {actual[i]!r}; scale={np.asarray(scale).ravel()[:4].tolist()}, "
        f"zero_point={np.asarray(zp).ravel()[:4].tolist()}"
    )


@st.composite
def quantize_cases(draw):
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 7, 16, 17, 33]), min_size=rank, max_size=rank)))
    dtype = draw(st.sampled_from(DTYPES))
    info = np.iinfo(dtype)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    per_axis = draw(st.booleans())
    axis = draw(st.integers(0, rank - 1))
    channels = shape[axis] if per_axis else 1
    # Distinct scales over several binades (powers of two half the time, so that the ties
    # below stay exact through x = q·scale and x / scale); zero points non-zero.
    if draw(st.booleans()):
        scale = (2.0 ** rng.integers(-10, 3, channels)).astype(np.float32)
    else:
        scale = (2.0 ** rng.uniform(-10, 2, channels)).astype(np.float32)
    zp = rng.integers(int(info.min), int(info.max) + 1, channels)
    zp[zp == 0] = 1
    # Values around the representable range, past it (saturation), and exact ties.
    s = scale.reshape([channels if d == axis and per_axis else 1 for d in range(rank)])
    q = rng.uniform(float(info.min) - 40.0, float(info.max) + 40.0, shape)
    q = np.where(rng.random(shape) < 0.25, np.floor(q) + 0.5, q)
    x = (q * s).astype(np.float32)
    return x, scale, zp, axis, dtype


@given(case=quantize_cases())
def test_quantize_native_matches_reference_every_isa(case) -> None:
    x, scale, zp, axis, dtype = case
    expected = reference_quantize(x, scale, zp, axis, dtype)
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            assert_same(expected, native_quantize(x, scale, zp, axis, dtype), isa, x, scale, zp)
    finally:
        _native.clear_isa()


@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_native_ties_round_half_to_even(dtype: type, each_isa) -> None:
    """Golden ties (TVM habit): x/scale = ±0.5, ±1.5, ±2.5, ±3.5 -> 0, ±2, ±2, ±4 (+ zp);
    half away from zero would give ±1, ±2, ±3, ±4. 17 values: not a multiple of any vector width."""
    ties = np.array(
        [0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, -3.5, 0.0, 1.0, -1.0, 2.5, 2.5, 2.5, 2.5, 2.5, -2.5]
    )
    scale = np.array([0.25], np.float32)  # a power of two: x = tie·scale and the division are exact
    zp = np.array([10 if dtype == np.int8 else 100])
    x = (ties * 0.25).astype(np.float32)
    expected = (np.array([0, 2, 2, 4, 0, -2, -2, -4, 0, 1, -1, 2, 2, 2, 2, 2, -2]) + zp).astype(dtype)
    np.testing.assert_array_equal(reference_quantize(x, scale, zp, 1, dtype), expected)
    each_isa(lambda isa: assert_same(expected, native_quantize(x, scale, zp, 1, dtype), isa, x, scale, zp))


@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_native_saturates_and_handles_infinities(dtype: type, each_isa) -> None:
    """Failure signature: wrapped values (e.g. 300 -> 44) or INT_MIN garbage from a float ->
    int conversion of |x/scale| >= 2^31 before the clamp."""
    info = np.iinfo(dtype)
    x = np.array([1e30, -1e30, np.inf, -np.inf, 3e9, -3e9, 1e3, -1e3] * 3, np.float32)
    scale = np.array([0.5], np.float32)
    zp = np.array([3])
    expected = reference_quantize(x, scale, zp, 1, dtype)
    assert expected.min() == info.min and expected.max() == info.max
    each_isa(lambda isa: assert_same(expected, native_quantize(x, scale, zp, 1, dtype), isa, x, scale, zp))


@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_native_nan_matches_reference(dtype: type, each_isa) -> None:
    """NaN -> qmin in every ISA variant, as the reference and ONNX Runtime (the spec
    leaves it undefined). 19 values: a full AVX2 / AVX-512 block plus a tail."""
    x = np.array([np.nan, 1.0, np.nan] + [2.0] * 15 + [np.nan], np.float32)
    scale, zp = np.array([0.5], np.float32), np.array([7])
    expected = reference_quantize(x, scale, zp, 1, dtype)
    assert expected[0] == np.iinfo(dtype).min
    each_isa(lambda isa: assert_same(expected, native_quantize(x, scale, zp, 1, dtype), isa, x, scale, zp))


def test_quantize_native_per_axis_distinct_channels(each_isa) -> None:
    """Per-axis on axis 1 of [2, 3, 5]: scales {2.0, 3.0, 4.0}, zero points {10, 20, 30}
    (MLIR's per-axis example): a per-tensor or wrong-axis implementation differs."""
    rng = np.random.default_rng(1)
    x = rng.uniform(-300, 300, (2, 3, 5)).astype(np.float32)
    scale = np.array([2.0, 3.0, 4.0], np.float32)
    zp = np.array([10, 20, 30])
    expected = reference_quantize(x, scale, zp, 1, np.int8)
    each_isa(lambda isa: assert_same(expected, native_quantize(x, scale, zp, 1, np.int8), isa, x, scale, zp))
