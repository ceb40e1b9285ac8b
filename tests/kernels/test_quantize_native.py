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
from tests.isa import ISAS, every_isa

DTYPES = (np.uint8, np.int8, np.uint16, np.int16)  # 16 bits: ORT's QUInt16 / QInt16 activations
SUFFIX = {np.uint8: "u8", np.int8: "s8", np.uint16: "u16", np.int16: "s16"}


def native_quantize(x: np.ndarray, scale: np.ndarray, zp: np.ndarray, axis: int, dtype: type) -> np.ndarray:
    fn = getattr(_native, f"quantize_linear_{SUFFIX[dtype]}")
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
def test_quantize_native_ties_round_half_to_even(dtype: type) -> None:
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
    every_isa(lambda isa: assert_same(expected, native_quantize(x, scale, zp, 1, dtype), isa, x, scale, zp))


@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_native_saturates_and_handles_infinities(dtype: type) -> None:
    """Failure signature: wrapped values (e.g. 300 -> 44) or INT_MIN garbage from a float ->
    int conversion of |x/scale| >= 2^31 before the clamp."""
    info = np.iinfo(dtype)
    x = np.array([1e30, -1e30, np.inf, -np.inf, 3e9, -3e9, 1e3, -1e3] * 3, np.float32)
    scale = np.array([0.5], np.float32)
    zp = np.array([3])
    expected = reference_quantize(x, scale, zp, 1, dtype)
    assert expected.min() == info.min and expected.max() == info.max
    every_isa(lambda isa: assert_same(expected, native_quantize(x, scale, zp, 1, dtype), isa, x, scale, zp))


@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_native_nan_matches_reference(dtype: type) -> None:
    """NaN -> qmin in every ISA variant, as the reference and ONNX Runtime (the spec
    leaves it undefined). 19 values: a full AVX2 / AVX-512 block plus a tail."""
    x = np.array([np.nan, 1.0, np.nan] + [2.0] * 15 + [np.nan], np.float32)
    scale, zp = np.array([0.5], np.float32), np.array([7])
    expected = reference_quantize(x, scale, zp, 1, dtype)
    assert expected[0] == np.iinfo(dtype).min
    every_isa(lambda isa: assert_same(expected, native_quantize(x, scale, zp, 1, dtype), isa, x, scale, zp))


def test_quantize_native_per_axis_distinct_channels() -> None:
    """Per-axis on axis 1 of [2, 3, 5]: scales {2.0, 3.0, 4.0}, zero points {10, 20, 30}
    (MLIR's per-axis example): a per-tensor or wrong-axis implementation differs."""
    rng = np.random.default_rng(1)
    x = rng.uniform(-300, 300, (2, 3, 5)).astype(np.float32)
    scale = np.array([2.0, 3.0, 4.0], np.float32)
    zp = np.array([10, 20, 30])
    expected = reference_quantize(x, scale, zp, 1, np.int8)
    every_isa(lambda isa: assert_same(expected, native_quantize(x, scale, zp, 1, np.int8), isa, x, scale, zp))


#: row lengths with reasons: 1 (a lone element), 15/16/17 (one 16-lane block ± 1), 63/65
#: (AVX2 8-lane tails), 128 (attention rows), 300 (odd tail of 12), 1000 (a long run)
ROW_LENGTHS = [1, 15, 16, 17, 63, 65, 128, 300, 1000]
#: non-power-of-two scales (the product x · (1 / scale) then differs from x / scale in the
#: last bit for many x), plus the edges of the multiply path (1 / scale normal) and past them
NEAR_TIE_SCALES = [0.0123, 0.1, 1 / 3, 0.007071, 7.77, 2.0**-126, 3e-39, 2.0**126, 1e38]


def near_ties(scale: float, dtype: type) -> np.ndarray:
    """x = f32(t · scale) for every half-integer t of the clamp range and a bit past it,
    and the 3 float32 neighbours on either side: values whose quotient x / scale rounds to
    the tie, or misses it by an ulp or two, where f32(x · f32(1 / scale)) can land on the
    other side of the tie."""
    info = np.iinfo(dtype)
    t = np.arange(float(info.min) - 260.5, float(info.max) + 261.0, 1.0)
    with np.errstate(over="ignore", under="ignore"):
        x = (t * np.float64(np.float32(scale))).astype(np.float32)
        xs = [x]
        up, down = x.copy(), x.copy()
        for _ in range(3):
            up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
            xs += [up, down]
    return np.concatenate(xs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_native_near_ties_match_the_true_division(dtype: type) -> None:
    """Hazard: the SIMD runs multiply by f32(1 / scale) and must divide exactly where that
    could round to the other integer (x / scale within 2^-11 of a half-integer). Every
    half-integer of the range and its ±3-ulp neighbours, scales that are not powers of two,
    and scales at and past the normal range of 1 / scale (there every vector divides);
    every ISA, threads 1 and 2, bit-exact against the reference's true division."""
    zp = np.array([3 if dtype == np.int8 else 131])
    fn = getattr(_native, f"quantize_linear_{SUFFIX[dtype]}")
    try:
        for scale_value in NEAR_TIE_SCALES:
            scale = np.array([scale_value], np.float32)
            x = near_ties(scale_value, dtype)
            expected = reference_quantize(x, scale, zp, 1, dtype)
            for isa in ISAS:
                _native.set_isa(isa)
                for threads in (1, 2):
                    got = fn(x, scale, zp.astype(np.int32), 1, threads)
                    assert_same(expected, got, f"{isa} threads={threads}", x, scale, zp)
    finally:
        _native.clear_isa()


@given(
    d=st.sampled_from(ROW_LENGTHS),
    rows=st.integers(1, 4),
    scale=st.floats(1e-4, 30.0),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from(DTYPES),
)
def test_quantize_native_row_lengths_every_isa_and_threads(d, rows, scale, seed, dtype) -> None:
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    q = rng.uniform(float(info.min) - 20.0, float(info.max) + 20.0, (rows, d))
    q = np.where(rng.random(q.shape) < 0.3, np.round(q) + 0.5, q)  # near ties
    scale_a = np.array([scale], np.float32)
    x = (q * np.float64(scale_a[0])).astype(np.float32)
    zp = np.array([int(info.min) + 77])
    expected = reference_quantize(x, scale_a, zp, 1, dtype)
    fn = getattr(_native, f"quantize_linear_{SUFFIX[dtype]}")
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            for threads in (1, 2):
                assert_same(expected, fn(x, scale_a, zp.astype(np.int32), 1, threads), isa, x, scale_a, zp)
    finally:
        _native.clear_isa()


def test_quantize_native_threads_and_out_buffer() -> None:
    """Large enough for several thread chunks (2^15 elements each, per-axis runs crossing
    chunk edges): threads 1 and 2 give the same bytes; out= is written and returned;
    a bad out= is refused with a message naming it."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 7, 5001)) * 4).astype(np.float32)
    scale = np.array([0.011, 0.02, 0.033, 0.05, 0.07, 0.09, 0.13], np.float32)
    zp = np.array([-3, 5, 0, 17, -100, 1, 64])
    expected = reference_quantize(x, scale, zp, 1, np.int8)

    def check(isa: str) -> None:
        for threads in (1, 2):
            out = np.zeros(x.shape, np.int8)
            got = _native.quantize_linear_s8(x, scale, zp.astype(np.int32), 1, threads, out)
            assert got is out
            assert_same(expected, out, f"{isa} threads={threads}", x, scale, zp)

    every_isa(check)
    for bad, message in [
        (np.zeros(x.shape, np.uint8), "quantize_linear: out: expected dtype int8"),
        (np.zeros((3, 7), np.int8), "quantize_linear: out: expected the shape of x"),
    ]:
        with pytest.raises(ValueError, match=message):
            _native.quantize_linear_s8(x, scale, zp.astype(np.int32), 1, 1, bad)
    with pytest.raises(ValueError, match="num_threads: expected >= 1"):
        _native.quantize_linear_s8(x, scale, zp.astype(np.int32), 1, 0)


def test_quantize_binder_prepares_constant_parameters_and_matches_the_reference_op() -> None:
    """The binder converts a constant scale / zero point once (params["prepared"]); with
    or without it, and with threads 1 and 2, the kernel gives the registered reference
    op's bytes. A precision other than float32 stays on the reference (with a reason)."""
    from quanta.ir.graph import Node, Value
    from quanta.ir.types import TensorType, elem_from_numpy
    from quanta.kernels.reference.registry import get_op
    from quanta.targets.base import KernelContext
    from quanta.targets.native import BINDERS, _load_families

    _load_families()
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((2, 3, 17)) * 3).astype(np.float32)
    scale = np.array([0.013, 0.02, 0.031], np.float32)
    zp = np.array([-5, 0, 9], np.int8)

    def value(name: str, a: np.ndarray, const: bool) -> Value:
        return Value(name, type=TensorType(elem_from_numpy(a.dtype)), const=a if const else None)

    expected = get_op("QuantizeLinear")(KernelContext(opset=21), x, scale, zp, axis=1)
    for const in (True, False):
        node = Node(
            "QuantizeLinear",
            [value("x", x, False), value("s", scale, const), value("z", zp, const)],
            [Value("y")],
            {"axis": 1},
        )
        kernel, reason = BINDERS[("", "QuantizeLinear")](None, node)
        assert kernel is not None, reason
        assert ("prepared" in kernel.params) == const
        for threads in (1, 2):
            got = kernel.fn(
                KernelContext(opset=21, num_threads=threads), x, scale, zp, axis=1, **kernel.params
            )
            assert got.dtype == np.int8 and got.tobytes() == expected.tobytes()
    node = Node(
        "QuantizeLinear", [value("x", x, False), value("s", scale, True)], [Value("y")], {"precision": 16}
    )
    kernel, reason = BINDERS[("", "QuantizeLinear")](None, node)
    assert kernel is None and reason == "native QuantizeLinear divides in float32 only (precision 0 or FLOAT)"


@pytest.mark.parametrize("dtype", [np.uint16, np.int16])
def test_ms_quantize_linear_16_bit_binder_matches_the_reference_op(dtype) -> None:
    """com.microsoft QuantizeLinear (ORT's UseQDQContribOps files) with 16-bit storage, per
    tensor and per axis, runs the native kernel and gives the registered twin's bytes."""
    from quanta.ir.graph import Node, Value
    from quanta.ir.types import TensorType, elem_from_numpy
    from quanta.kernels.reference.registry import get_op
    from quanta.targets.base import KernelContext
    from quanta.targets.native import BINDERS, _load_families

    _load_families()
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((2, 3, 17)) * 300).astype(np.float32)
    info = np.iinfo(dtype)
    for scale, zp in (
        (np.array(0.0173, np.float32), np.array(info.min + 1234, dtype)),
        (np.array([0.013, 0.002, 0.031], np.float32), np.array([info.min + 7, info.max - 9, 3], dtype)),
    ):
        node = Node(
            "QuantizeLinear",
            [
                Value(n, type=TensorType(elem_from_numpy(a.dtype)), const=c)
                for n, a, c in (("x", x, None), ("s", scale, scale), ("z", zp, zp))
            ],
            [Value("y")],
            {"axis": 1},
        )
        kernel, reason = BINDERS[("com.microsoft", "QuantizeLinear")](None, node)
        assert kernel is not None and kernel.name == f"native:quantize_linear_{SUFFIX[dtype]}", reason
        expected = get_op("QuantizeLinear", "com.microsoft")(KernelContext(), x, scale, zp, axis=1)
        for threads in (1, 2):
            got = kernel.fn(KernelContext(num_threads=threads), x, scale, zp, axis=1, **kernel.params)
            assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes()
