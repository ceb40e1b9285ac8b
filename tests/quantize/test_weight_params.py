"""Weight parameters from the weight's own type (quanta.quantize.qdq._weight_type and
_non_finite_reason): the extrema and the finiteness test are taken without a float64
copy of the weight, and must give what the float64 copy gives, bit for bit."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from quanta.ir.types import F32, I8, I16, U8
from quanta.quantize.qdq import TensorPlan, _non_finite_reason, _weight_type
from quanta.quantize.recipe import Recipe


def _weights(rng: np.random.Generator, shape: tuple[int, ...], dtype) -> np.ndarray:
    # channels of distinct spreads and offsets, one all-positive row, one row of zeros
    # of both signs (the extrema's sign of zero), one constant row
    w = rng.standard_normal(shape) * np.geomspace(0.01, 7.0, shape[0]).reshape(-1, *[1] * (len(shape) - 1))
    w = w + np.linspace(-0.3, 0.5, shape[0]).reshape(-1, *[1] * (len(shape) - 1))
    w[1] = np.abs(w[1]) + 0.25
    w[2] = 0.0
    w[2].reshape(-1)[::2] = -0.0
    w[-1] = -1.5
    return w.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, ml_dtypes.bfloat16])
@pytest.mark.parametrize(
    ("shape", "axis"),
    [((17, 7, 3, 3), 0), ((17, 7, 3, 3), None), ((3, 263), 0), ((263, 7), 1), ((7, 259), None)],
)
@pytest.mark.parametrize(("storage", "symmetric"), [(I8, True), (U8, False), (I16, True)])
def test_weight_params_equal_those_of_the_float64_copy(dtype, shape, axis, storage, symmetric):
    """The parameters of a float32 / float16 / bfloat16 weight equal those of its float64
    copy (the computation before, which the float64 weight still takes): per channel on
    axis 0 or 1 and per tensor, 3 to 263 channels, symmetric and asymmetric grids."""
    rng = np.random.default_rng(abs(hash((str(np.dtype(dtype)), shape, axis))) % 2**32)
    w = _weights(rng, shape, dtype)
    if axis == 1:
        w = np.ascontiguousarray(np.moveaxis(_weights(rng, (shape[1], shape[0]), dtype), 0, 1))
    for recipe in (Recipe(), Recipe(reduce_range=True)):
        t = TensorPlan("w", "weight", storage, symmetric, axis=axis)
        got = _weight_type(w, t, F32, recipe)
        want = _weight_type(np.asarray(w, np.float64), t, F32, recipe)
        assert got == want
        assert np.asarray(got.scale_array()).tobytes() == np.asarray(want.scale_array()).tobytes()
        assert np.asarray(got.zero_point_array()).tobytes() == np.asarray(want.zero_point_array()).tobytes()
    assert len(got.scale) == (1 if axis is None else shape[axis])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, ml_dtypes.bfloat16])
def test_non_finite_reason_equals_that_of_the_float64_copy(dtype):
    rng = np.random.default_rng(7)
    w = rng.standard_normal((17, 259)).astype(dtype)
    assert _non_finite_reason(w) is None
    for bad in ([np.nan], [np.inf], [np.nan, -np.inf, np.inf]):
        v = w.copy()
        v.reshape(-1)[rng.choice(v.size, len(bad), replace=False)] = np.asarray(bad).astype(dtype)
        reason = _non_finite_reason(v)
        assert reason is not None and reason == _non_finite_reason(np.asarray(v, np.float64))
        assert f"among its {v.size}" in reason
    assert reason.startswith("1 NaN and 2 infinite")


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16])
@pytest.mark.parametrize(
    ("shape", "axis"), [((17, 7, 3, 3), 0), ((263, 7), 1), ((3, 259), 0), ((7, 33), None), ((), None)]
)
def test_quantize_weight_equals_the_reference_quantize_linear(dtype, shape, axis):
    """qdq.quantize_weight, the float32 clamp of insert_qdq's weights, against the
    reference quantize_linear, bit for bit: distinct scales and zero points per channel
    (none 0 on the unsigned grids), exact ties (k + 0.5)·s of both signs, values far past
    either bound, ±inf, NaN (-> qmin, as the reference), signed zeros."""
    from quanta.kernels.reference.quantize import quantize_linear
    from quanta.kernels.reference.requant import storage_range
    from quanta.quantize.qdq import quantize_weight

    rng = np.random.default_rng(sum(shape) + np.dtype(dtype).itemsize * 7 + (axis or 0))
    qmin, qmax = storage_range(dtype)
    n = 1 if axis is None else shape[axis]
    scale = (rng.uniform(0.5, 2.0, n) * (0.01 if np.dtype(dtype).itemsize == 1 else 1e-4)).astype(np.float32)
    span = qmax - qmin
    zp = rng.integers(qmin + span // 8, qmax - span // 8, n, endpoint=True).astype(dtype)
    if axis is None:
        scale, zp = scale.reshape(()), zp.reshape(())
    bshape = [1] * len(shape)
    if axis is not None:
        bshape[axis] = n
    s_b = scale.reshape(bshape).astype(np.float64)
    x = rng.standard_normal(shape) * s_b * span * 0.4
    flat = x.reshape(-1)
    if flat.size > 40:
        k = rng.integers(-span // 2, span // 2, 16)
        flat[:16] = (k + 0.5) * np.broadcast_to(s_b, shape).reshape(-1)[:16]  # exact ties
        flat[16:20] = [np.inf, -np.inf, np.nan, -0.0]
        flat[20:24] = [1e30, -1e30, 3e4, -3e4]
    w = x.astype(np.float32)
    got = quantize_weight(w, scale, zp, axis, dtype)
    want = quantize_linear(w, scale, zp, axis=axis, dtype=dtype)
    assert np.asarray(got).dtype == np.asarray(want).dtype == np.dtype(dtype)
    assert np.asarray(got).shape == np.asarray(want).shape
    np.testing.assert_array_equal(got, want)
    if flat.size > 40:
        codes = np.asarray(got).reshape(-1)
        assert codes[18] == qmin  # NaN
        assert (codes == qmin).any() and (codes == qmax).any()
