"""Differential tests: the native elementwise and pooling kernels
(quanta/kernels/cpp/elementwise, quanta/kernels/cpp/pool) against their NumPy twins.

Every ISA variant the CPU runs (portable always) is compared with the twin, so the
variants are also equal pairwise. Tolerance 0 everywhere: the kernels perform the twins'
float32 operations in the twins' order (no FMA, true divisions, round half to even), and
integer sums are exact.

Defaults are not coincidental: zero points are drawn non-zero per operand, scales differ
between operands (several binades; powers of two half the time so that x.5 ties are
exact and round half to even is exercised), shapes are odd (channels 3, 7, 17; lengths
that are not multiples of 8 or 16), and the data covers both saturation ends.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from quanta.kernels import _native
from quanta.kernels.reference import ms_qlinear, ms_qops
from quanta.kernels.reference.conv_geometry import conv_attrs
from quanta.kernels.reference.nn_pool import max_pool
from quanta.kernels.reference.quantize import dequantize_linear, dynamic_quantize_linear
from quanta.kernels.reference.registry import OpContext
from tests.isa import ISAS, every_isa

DTYPES = (np.uint8, np.int8)
F32 = np.float32
ODD = [1, 2, 3, 7, 16, 17, 33]


def assert_same(expected: np.ndarray, actual: np.ndarray, label: str, **context) -> None:
    """Bytes, dtype and shape equal; otherwise say where and with which parameters."""
    expected, actual = np.asarray(expected), np.asarray(actual)
    if (
        expected.dtype == actual.dtype
        and expected.shape == actual.shape
        and expected.tobytes() == actual.tobytes()
    ):
        return
    detail = ", ".join(f"{k}={v}" for k, v in context.items())
    if expected.shape != actual.shape or expected.dtype != actual.dtype:
        raise AssertionError(
            f"{label}: expected {expected.dtype}{expected.shape}, got {actual.dtype}{actual.shape}; {detail}"
        )
    bad = np.argwhere(
        ~((expected == actual) | (np.isnan(expected) & np.isnan(actual)))
        if expected.dtype.kind == "f"
        else expected != actual
    )
    i = tuple(int(v) for v in bad[0])
    raise AssertionError(
        f"{label}: {len(bad)} of {expected.size} differ; shape {expected.shape}; first bad index {i}: "
        f"expected {expected[i]!r}, actual {actual[i]!r}; {detail}"
    )


def draw_scale(draw, rng: np.random.Generator) -> np.float32:
    if draw(st.booleans()):
        return F32(2.0 ** int(rng.integers(-9, 1)))
    return F32(2.0 ** rng.uniform(-9, 0))


def draw_zero_point(rng: np.random.Generator, dtype) -> int:
    info = np.iinfo(dtype)
    z = int(rng.integers(int(info.min), int(info.max) + 1))
    return z if z != 0 else 1


def codes(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    x = rng.integers(int(info.min), int(info.max) + 1, shape)
    # both ends of the range appear in every draw that has room for them
    flat = x.reshape(-1)
    if flat.size >= 2:
        flat[0], flat[-1] = info.min, info.max
    return x.astype(dtype)


# --------------------------------------------------------------------------------------
# DequantizeLinear
# --------------------------------------------------------------------------------------


@st.composite
def dequantize_cases(draw):
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.sampled_from(ODD), min_size=rank, max_size=rank)))
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    axis = draw(st.integers(0, rank - 1))
    per_axis = draw(st.booleans()) and shape[axis] > 1
    channels = shape[axis] if per_axis else 1
    scale = np.array([draw_scale(draw, rng) for _ in range(channels)], F32)
    zp = np.array([draw_zero_point(rng, dtype) for _ in range(channels)])
    return codes(rng, shape, dtype), scale, zp, axis, per_axis


@given(case=dequantize_cases())
def test_dequantize_native_matches_reference_every_isa(case) -> None:
    x, scale, zp, axis, per_axis = case
    if per_axis:
        expected = dequantize_linear(x, scale, zp.astype(x.dtype), axis=axis)
    else:
        expected = dequantize_linear(x, scale.reshape(()), x.dtype.type(zp[0]))
    every_isa(
        lambda isa: assert_same(
            expected, _native.dequantize_linear(x, scale, zp.astype(np.int32), axis), isa, scale=scale, zp=zp
        )
    )


def test_dequantize_native_per_axis_distinct_channels() -> None:
    """Per-axis on axis 1 of [2, 3, 5]: scales {2.0, 3.0, 4.0}, zero points {10, 20, 30}
    (MLIR's per-axis example): a per-tensor or wrong-axis implementation differs."""
    x = codes(np.random.default_rng(3), (2, 3, 5), np.uint8)
    scale, zp = np.array([2.0, 3.0, 4.0], F32), np.array([10, 20, 30])
    expected = dequantize_linear(x, scale, zp.astype(np.uint8), axis=1)
    every_isa(
        lambda isa: assert_same(expected, _native.dequantize_linear(x, scale, zp.astype(np.int32), 1), isa)
    )


def test_dequantize_native_threads_identical() -> None:
    """Several thread chunks (2^15 elements each) and a ragged tail: 1 and 2 threads give
    the bytes of the twin."""
    x = codes(np.random.default_rng(4), (3, 7, 4099), np.int8)
    scale, zp = np.array([0.5, 0.25, 0.125, 3.0, 0.01, 7.0, 0.3], F32), np.arange(7) * 17 - 60
    expected = dequantize_linear(x, scale, zp.astype(np.int8), axis=1)
    for threads in (1, 2):
        assert_same(
            expected, _native.dequantize_linear(x, scale, zp.astype(np.int32), 1, threads), f"t{threads}"
        )


# --------------------------------------------------------------------------------------
# DynamicQuantizeLinear
# --------------------------------------------------------------------------------------


def assert_dynamic_same(x: np.ndarray, label: str) -> None:
    expected = dynamic_quantize_linear(x)
    actual = _native.dynamic_quantize_linear(x)
    for name, e, a in zip(("y", "y_scale", "y_zero_point"), expected, actual, strict=True):
        assert_same(e, a, f"{label}: {name}", shape=x.shape)


@st.composite
def dynamic_cases(draw):
    rank = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.sampled_from([1, 3, 7, 17, 33, 65]), min_size=rank, max_size=rank)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["mixed", "positive", "negative", "ties", "wide"]))
    x = rng.standard_normal(shape) * 3
    if kind == "positive":
        x = np.abs(x) + 0.5
    elif kind == "negative":
        x = -np.abs(x) - 0.5
    elif kind == "ties":
        x = np.floor(x * 4) / 4 + 0.125  # quarter grid: many exact x.5 quotients
    elif kind == "wide":
        x = x * 1e30
    return np.asarray(x, F32)


@given(x=dynamic_cases())
def test_dynamic_quantize_native_matches_reference_every_isa(x) -> None:
    every_isa(lambda isa: assert_dynamic_same(x, isa))


def test_dynamic_quantize_native_all_zero_input_rule() -> None:
    """The reference's documented rule for an all-zero input (ONNX reference: scale
    1/255, zero point 0; ONNX Runtime returns scale 1): the native kernel follows the
    reference. 19 elements: a full vector block plus a tail."""
    x = np.zeros(19, F32)
    y, scale, zp = dynamic_quantize_linear(x)
    assert float(scale) == float(F32(1) / F32(255)) and int(zp) == 0 and not y.any()
    every_isa(lambda isa: assert_dynamic_same(x, isa))
    every_isa(lambda isa: assert_dynamic_same(np.zeros(0, F32), f"{isa} empty"))


def test_dynamic_quantize_native_nan_and_infinities_follow_reference() -> None:
    """NaN anywhere: NumPy's max/min are NaN and Python's max(0, NaN) is 0, so the range
    collapses to [0, 0]; an infinity gives an infinite scale. The failure signature of a
    SIMD min/max that drops NaN: a finite scale instead of 1/255."""
    base = np.linspace(-3, 5, 37).astype(F32)
    with np.errstate(invalid="ignore"):
        check_nan_and_infinities(base)


def check_nan_and_infinities(base: np.ndarray) -> None:
    for bad in (np.nan, np.inf, -np.inf):
        for pos in (0, 17, 36):
            x = base.copy()
            x[pos] = bad
            every_isa(lambda isa, x=x, bad=bad, pos=pos: assert_dynamic_same(x, f"{isa} {bad}@{pos}"))
    both = base.copy()
    both[3], both[30] = np.inf, -np.inf
    every_isa(lambda isa: assert_dynamic_same(both, f"{isa} +-inf"))


def test_dynamic_quantize_native_ties_round_half_to_even() -> None:
    """Golden vector: range [-1, 254] gives scale 1, zero point 1; x = k + 0.5 hits ties
    that round half to even (0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> -0 -> zp)."""
    x = np.array([-1.0, 254.0, 0.5, 1.5, 2.5, 3.5, -0.5, 100.5, 101.5, 252.5, 253.5], F32)
    y, scale, zp = dynamic_quantize_linear(x)
    assert float(scale) == 1.0 and int(zp) == 1
    assert y.tolist() == [0, 255, 1, 3, 3, 5, 1, 101, 103, 253, 255]
    every_isa(lambda isa: assert_dynamic_same(x, isa))


def test_dynamic_quantize_native_threads_identical() -> None:
    """Min/max combined over chunks and the quantization split over threads."""
    x = (np.random.default_rng(5).standard_normal(3 * 2**15 + 11) * 7).astype(F32)
    expected = dynamic_quantize_linear(x)
    for threads in (1, 2):
        for name, e, a in zip("yzs", expected, _native.dynamic_quantize_linear(x, threads), strict=True):
            assert_same(e, a, f"t{threads} {name}")


# --------------------------------------------------------------------------------------
# QLinearAdd / QLinearMul
# --------------------------------------------------------------------------------------


@st.composite
def broadcast_shapes(draw):
    """(a_shape, b_shape): same shape, scalar, per-channel (C,1,1) vs NCHW, trailing
    (D,) vs (..., D), and general random broadcasts of an odd output shape."""
    kind = draw(st.sampled_from(["same", "scalar", "channel", "trailing", "random", "swap"]))
    rank = draw(st.integers(1, 4))
    out = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 7, 17, 33]), min_size=rank, max_size=rank)))
    if kind == "same":
        return out, out
    if kind == "scalar":
        return out, draw(st.sampled_from([(), (1,), (1,) * rank]))
    if kind == "channel":
        n, c, h, w = draw(st.sampled_from([(2, 3, 5, 7), (1, 7, 3, 3), (1, 17, 1, 33), (3, 3, 9, 1)]))
        return (n, c, h, w), (c, 1, 1)
    if kind == "trailing":
        return out, out[-draw(st.integers(1, rank)) :]
    a = tuple(d if draw(st.booleans()) else 1 for d in out)
    b = tuple(d if draw(st.booleans()) else 1 for d in out)
    b = b[draw(st.integers(0, rank)) :]
    return (b, a) if kind == "swap" else (a, b)


@st.composite
def binary_cases(draw):
    a_shape, b_shape = draw(broadcast_shapes())
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    sa, sb = draw_scale(draw, rng), draw_scale(draw, rng)
    # output scale from the data's real range half the time, a small one (saturation) else
    sc = F32((sa + sb) * 2.0 ** rng.uniform(-2, 1)) if draw(st.booleans()) else F32(sa * 0.1)
    zps = [draw_zero_point(rng, dtype) for _ in range(3)]
    return codes(rng, a_shape, dtype), codes(rng, b_shape, dtype), (sa, sb, sc), zps


def reference_add(a, b, scales, zps):
    dt = a.dtype.type
    sa, sb, sc = scales
    # the C++ kernel's contract is ORT's x86 FMA form (ms_qlinear note (a))
    return ms_qlinear.qlinear_add(a, sa, dt(zps[0]), b, sb, dt(zps[1]), sc, dt(zps[2]))


def reference_mul(a, b, scales, zps):
    dt = a.dtype.type
    sa, sb, sc = scales
    return ms_qlinear.qlinear_mul(a, sa, dt(zps[0]), b, sb, dt(zps[1]), sc, dt(zps[2]))


def native_add(a, b, scales, zps, threads=1):
    sa, sb, sc = (float(s) for s in scales)
    return _native.qlinear_add(a, b, sa, zps[0], sb, zps[1], sc, zps[2], threads)


def native_mul(a, b, scales, zps, threads=1):
    sa, sb, sc = scales
    ratio = F32(F32(sa * sb) / sc)
    return _native.qlinear_mul(a, b, float(ratio), zps[0], zps[1], zps[2], threads)


@given(case=binary_cases())
def test_qlinear_add_native_matches_reference_broadcasts(case) -> None:
    a, b, scales, zps = case
    expected = reference_add(a, b, scales, zps)
    every_isa(
        lambda isa: assert_same(
            expected, native_add(a, b, scales, zps), isa, a=a.shape, b=b.shape, scales=scales, zps=zps
        )
    )


@given(case=binary_cases())
def test_qlinear_mul_native_matches_reference_broadcasts(case) -> None:
    a, b, scales, zps = case
    expected = reference_mul(a, b, scales, zps)
    every_isa(
        lambda isa: assert_same(
            expected, native_mul(a, b, scales, zps), isa, a=a.shape, b=b.shape, scales=scales, zps=zps
        )
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_qlinear_add_native_ties_round_half_to_even(dtype) -> None:
    """Golden ties: sa = sb = 1, sc = 2, za = 4, zb = 0, zc = 10: (a − 4 + b) / 2 + 10 is
    x.5 for odd a − 4 + b and rounds half to even (11.5 -> 12, 12.5 -> 12, 9.5 -> 10,
    8.5 -> 8); half away from zero would give 12, 13, 10, 9. 19 elements: a vector block
    plus a tail."""
    a = (np.array([3, 5, -1, -3, 1, 7, 9, 0, 2] + [5] * 10) + 4).astype(dtype)
    b = np.zeros_like(a)
    scales, zps = (F32(1), F32(1), F32(2)), [4, 0, 10]
    got = reference_add(a, b, scales, zps)
    assert got[:4].tolist() == [12, 12, 10, 8]
    every_isa(lambda isa: assert_same(got, native_add(a, b, scales, zps), isa))


@pytest.mark.parametrize("dtype", DTYPES)
def test_qlinear_binary_native_saturates_both_ends(dtype) -> None:
    """Failure signature: wrapped outputs (e.g. 300 -> 44) when the result leaves the
    storage range. A tiny output scale sends every value to qmin or qmax."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(7)
    a, b = codes(rng, (5, 37), dtype), codes(rng, (37,), dtype)
    scales, zps = (F32(0.5), F32(0.75), F32(1e-3)), [draw_zero_point(rng, dtype) for _ in range(3)]
    for ref, nat in ((reference_add, native_add), (reference_mul, native_mul)):
        expected = ref(a, b, scales, zps)
        assert expected.min() == info.min and expected.max() == info.max
        every_isa(
            lambda isa, ref=ref, nat=nat, expected=expected: assert_same(
                expected, nat(a, b, scales, zps), isa
            )
        )


def test_qlinear_binary_native_threads_identical() -> None:
    """Chunks split inside inner runs and across outer rows give the same bytes."""
    rng = np.random.default_rng(8)
    a, b = codes(rng, (3, 17, 41, 43), np.uint8), codes(rng, (17, 1, 43), np.uint8)
    scales, zps = (F32(0.03), F32(0.02), F32(0.04)), [5, 200, 100]
    for ref, nat in ((reference_add, native_add), (reference_mul, native_mul)):
        expected = ref(a, b, scales, zps)
        for threads in (1, 2):
            assert_same(expected, nat(a, b, scales, zps, threads), f"{nat.__name__} t{threads}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "scales",
    [
        (F32(0.031), F32(0.047), F32(0.058)),  # a typical residual Add
        (F32(1), F32(1), F32(2)),  # half the sums are x.5 ties
        (F32(0.5), F32(0.75), F32(1e-3)),  # every output saturated
        (F32(3e38), F32(3e38), F32(0.5)),  # sa/sc overflows: ±inf and NaN (0·inf) sums
        (F32("nan"), F32(0.02), F32(0.04)),  # NaN scale: every output qmin
    ],
    ids=["typical", "ties", "saturated", "overflow", "nan"],
)
def test_qlinear_binary_native_every_code_pair(dtype, scales) -> None:
    """All 256 x 256 code pairs (a = i // 256, b = i % 256) plus a 37-element tail: every
    pair passes through the 64-element vector step (vmaxps(v, qmin) as the NaN rule, clamp
    before the round-half-even conversion, packs + vpermd) and the masked 16-lane tail.
    Failure signature: bytes out of element order within 64 (a wrong vpermd), NaN -> 0 or
    qmax instead of qmin, or a tie rounded away from zero."""
    info = np.iinfo(dtype)
    codes_all = np.arange(info.min, info.max + 1)
    a = np.concatenate([np.repeat(codes_all, 256), codes_all[:37]]).astype(dtype)
    b = np.concatenate([np.tile(codes_all, 256), codes_all[-37:]]).astype(dtype)
    zps = [int(info.min) + 77, int(info.max) - 40, int(info.min) + 130]
    for ref, nat in ((reference_add, native_add), (reference_mul, native_mul)):
        with np.errstate(all="ignore"):
            expected = ref(a, b, scales, zps)
            every_isa(
                lambda isa, nat=nat, expected=expected: assert_same(
                    expected, nat(a, b, scales, zps), f"{nat.__name__} {isa}", scales=scales
                )
            )


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize(
    ("shape", "const_shape"),
    [((37, 150, 12), (1, 150, 1)), ((3, 21, 17), (17,)), ((2, 3, 7, 17), (1, 1, 7, 1)), ((5, 7, 3), (7, 1))],
)
def test_qlinear_binary_native_expanded_constant_is_the_broadcast(dtype, shape, const_shape) -> None:
    """docs/kernels.md (V9.1): a constant operand expanded over the trailing dimensions
    (``expanded_constant_shape``) gives the bytes of the short-run broadcast on every ISA,
    as either operand, QLinearAdd and QLinearMul, every code, with saturation at both
    ends (a small output scale) and the twin's values."""
    from quanta.targets.native.elementwise import expanded_constant_shape

    rng = np.random.default_rng(len(shape) * 31 + const_shape[-1])
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, shape).astype(dtype)
    k = rng.integers(info.min, info.max + 1, const_shape).astype(dtype)
    full_shape = expanded_constant_shape(const_shape, shape, shape)
    assert full_shape is not None
    full = np.ascontiguousarray(
        np.broadcast_to(k.reshape((1,) * (len(shape) - k.ndim) + k.shape), full_shape)
    )
    zps = [
        int(dtype(-5) if dtype == np.int8 else dtype(131)),
        9,
        int(dtype(3) if dtype == np.int8 else dtype(200)),
    ]
    for scales in ((F32(0.037), F32(0.021), F32(0.043)), (F32(0.037), F32(0.021), F32(0.0031))):
        for pair in ((x, k, x, full), (k, x, full, x)):
            want_add = reference_add(pair[0], pair[1], scales, zps)
            want_mul = reference_mul(pair[0], pair[1], scales, zps)

            def check(isa: str, pair=pair, scales=scales, want_add=want_add, want_mul=want_mul) -> None:
                for threads in (1, 2):
                    assert_same(want_add, native_add(pair[0], pair[1], scales, zps, threads), isa)
                    assert_same(
                        want_add, native_add(pair[2], pair[3], scales, zps, threads), isa, expanded=True
                    )
                    assert_same(want_mul, native_mul(pair[0], pair[1], scales, zps, threads), isa)
                    assert_same(
                        want_mul, native_mul(pair[2], pair[3], scales, zps, threads), isa, expanded=True
                    )

            every_isa(check)


def test_qlinear_binary_native_refuses_unbroadcastable_shapes() -> None:
    a, b = np.zeros((2, 3), np.uint8), np.zeros((4,), np.uint8)
    with pytest.raises(
        ValueError, match=r"qlinear_add: expected broadcastable shapes, got \(2, 3\) and \(4,\)"
    ):
        _native.qlinear_add(a, b, 1.0, 0, 1.0, 0, 1.0, 0)


# --------------------------------------------------------------------------------------
# Lookup tables, QLinearSoftmax, QLinearConcat
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_lut8_native_indexes_by_code_bits(dtype) -> None:
    """int8 code v reads entry uint8(v): the table of QLinearSigmoid built on all codes
    reproduces the twin elementwise."""
    rng = np.random.default_rng(9)
    x = codes(rng, (3, 7, 33), dtype)
    sx, zx, sy, zy = F32(0.07), dtype(draw_zero_point(rng, dtype)), F32(1 / 256), dtype(3)
    table = ms_qlinear.qlinear_sigmoid(np.arange(256, dtype=np.uint8).view(dtype), sx, zx, sy, zy)
    expected = ms_qlinear.qlinear_sigmoid(x, sx, zx, sy, zy)
    for threads in (1, 2):
        assert_same(expected, _native.lut8(x, table, threads), f"t{threads}")


def lut_variants() -> list[tuple[str, bool]]:
    """(ISA, VBMI on) pairs this CPU runs: every ISA with its gather or loop, and the
    avx512vnni path once more with its VBMI byte permutes when the CPU has them."""
    out = [(isa, False) for isa in ISAS]
    if _native.avx512vbmi_supported():
        out.append(("avx512vnni", True))
    return out


@pytest.mark.parametrize("isa,vbmi", lut_variants())
@pytest.mark.parametrize("dtype", DTYPES)
def test_lut8_native_every_variant_every_length(isa, vbmi, dtype) -> None:
    """Failure signature: a wrong quarter of the table (the VBMI blend on the index's top
    bit, int8 codes -128..-1 at entries 128..255) or a tail element read or written past
    n. Every entry distinct (a permutation), so any wrong index shows; lengths 0..130
    cover the 64-byte VBMI step, the 16-lane gathers and their tails, 64·1000 + 37 the
    split across threads."""
    rng = np.random.default_rng(17)
    table = rng.permutation(256).astype(np.uint8).view(dtype)
    try:
        _native.set_isa(isa)
        _native.set_avx512vbmi(vbmi)
        assert _native.avx512vbmi_active() == vbmi
        for n in [*range(0, 131), 64 * 1000 + 37]:
            x = rng.integers(0, 256, n).astype(np.uint8).view(dtype)
            expected = table[x.view(np.uint8)]
            for threads in (1, 2):
                got = _native.lut8(x, table, threads)
                assert_same(expected, got, f"lut8 {isa} vbmi={vbmi} t{threads}", n=n)
        # every code once, in order: entry i answers code with bits i
        codes_all = np.arange(256, dtype=np.uint8).view(dtype)
        assert_same(table, _native.lut8(codes_all, table, 1), f"lut8 {isa} vbmi={vbmi} all codes")
    finally:
        _native.clear_isa()
        _native.clear_avx512vbmi()


@pytest.mark.parametrize("isa,vbmi", lut_variants())
@pytest.mark.parametrize("dtype", DTYPES)
def test_lut8_channels_every_variant(isa, vbmi, dtype) -> None:
    """Failure signature: a run read through the table of the wrong channel (the channel
    index taken from the wrong axis or stride, or the gather's offset pattern out of step
    after a wrap or at a thread's first row) or a run's tail lost; each channel's table is
    its own permutation, runs of length 1, 7, 63, 65 and 1000+ on the last axis and on
    middle ones, a chunk boundary inside the outer axis (two threads), few rows of many
    channels (the plain loop) and one row more (the gather)."""
    from quanta.kernels.reference.lookup import qlinear_lookup

    rng = np.random.default_rng(23)
    try:
        _native.set_isa(isa)
        _native.set_avx512vbmi(vbmi)
        for shape, axis in [
            ((3, 7, 65), 1),
            ((1, 17, 1), 1),
            # channels innermost (channels last, the gather path): 17 channels against 16
            # lanes, a row split between threads; 7-element runs; one channel
            ((2, 40, 17), 2),
            ((1100, 24), 1),
            ((3, 5, 7), 1),
            ((9, 1), 1),
            ((5, 3), 1),
            ((2, 9, 31, 37), 1),
            ((4, 6, 63), 0),
            # few rows of many channels innermost: at most 8 rows look each element up
            # (no gather setup), 9 take the gather; DTLN's [1, 1, 257] and [1, 512]
            ((1, 1, 257), 2),
            ((1, 512), 1),
            ((8, 130), 1),
            ((9, 130), 1),
            # channels last after a convolution (a BatchNormalization between Q/DQ): 16,
            # 3, 7 and 10 channels, totals that leave 0, 15, 2 and 12 elements after the
            # 16-element gather steps (the tail looks up through the same offsets)
            ((1, 21, 33, 16), 3),
            ((37, 3), 1),
            ((2, 11, 13, 7), 3),
            ((1, 6, 5, 9, 10), 4),
        ]:
            x = rng.integers(0, 256, shape).astype(np.uint8).view(dtype)
            tables = np.stack([rng.permutation(256) for _ in range(shape[axis])]).astype(np.uint8).view(dtype)
            expected = qlinear_lookup(x, tables, axis)
            for threads in (1, 2):
                got = _native.lut8_channels(x, tables, axis, threads)
                assert_same(
                    expected, got, f"lut8_channels {isa} vbmi={vbmi} t{threads}", shape=shape, axis=axis
                )
        with pytest.raises(ValueError, match=r"lut8_channels: tables: expected shape \(7, 256\)"):
            _native.lut8_channels(np.zeros((2, 7, 3), dtype), np.zeros((6, 256), dtype), 1)
    finally:
        _native.clear_isa()
        _native.clear_avx512vbmi()


def test_lut8_native_vbmi_needs_avx512vnni_path() -> None:
    """VBMI is an extension of the avx512vnni path: forcing another ISA turns it off."""
    try:
        _native.set_isa("portable")
        assert not _native.avx512vbmi_active()
    finally:
        _native.clear_isa()
    if not _native.avx512vbmi_supported():
        with pytest.raises(ValueError, match="VBMI is not supported"):
            _native.set_avx512vbmi(True)


@st.composite
def softmax_cases(draw):
    rows = draw(st.sampled_from([1, 3, 7]))
    d = draw(st.sampled_from([1, 2, 3, 17, 128, 259]))
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    sx = F32(2.0 ** rng.uniform(-6, 0))
    sy = F32(1 / 256) if draw(st.booleans()) else F32(2.0 ** rng.uniform(-9, -6))
    zy = -128 if dtype == np.int8 and draw(st.booleans()) else draw_zero_point(rng, dtype)
    return codes(rng, (rows, d), dtype), sx, sy, zy


@given(case=softmax_cases())
def test_qlinear_softmax_rows_native_matches_reference(case) -> None:
    x, sx, sy, zy = case
    expected = ms_qops.qlinear_softmax(x, sx, sy, x.dtype.type(zy), axis=-1)
    table = ms_qops.softmax_exp_table(sx, x.shape[1])
    ys = F32(np.floor(np.divide(F32(1.0), sy, dtype=F32)))
    for threads in (1, 2):
        assert_same(expected, _native.qlinear_softmax_rows(x, table, float(ys), zy, threads), f"t{threads}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_qlinear_concat_native_copies_or_requantizes(dtype) -> None:
    """Three inputs along axis 1: one with the output's parameters (copied), two with
    distinct scales and zero points (requantized through their tables)."""
    rng = np.random.default_rng(10)
    sy, zy = F32(0.05), dtype(draw_zero_point(rng, dtype))
    parts = [
        (codes(rng, (2, 3, 5), dtype), sy, zy),
        (codes(rng, (2, 7, 5), dtype), F32(0.11), dtype(draw_zero_point(rng, dtype))),
        (codes(rng, (2, 1, 5), dtype), F32(0.013), dtype(draw_zero_point(rng, dtype))),
    ]
    expected = ms_qlinear.qlinear_concat(sy, zy, parts, 1)
    all_codes = np.arange(256, dtype=np.uint8).view(dtype)
    tables = [
        None if (sx == sy and zx == zy) else ms_qlinear.qlinear_concat(sy, zy, [(all_codes, sx, zx)], 0)
        for _, sx, zx in parts
    ]
    assert tables[0] is None and tables[1] is not None
    assert_same(expected, _native.qlinear_concat([p[0] for p in parts], tables, 1), "concat")
    assert_same(expected, _native.qlinear_concat([p[0] for p in parts], tables, -2), "concat axis -2")


# --------------------------------------------------------------------------------------
# Pooling
# --------------------------------------------------------------------------------------


@st.composite
def global_pool_cases(draw):
    n = draw(st.sampled_from([1, 2]))
    c = draw(st.sampled_from([1, 3, 7, 17, 600]))
    spatial = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 7, 17]), min_size=1, max_size=3)))
    if c == 600:
        spatial = (3, 5)
    dtype = draw(st.sampled_from(DTYPES))
    channels_last = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = (n, *spatial, c) if channels_last else (n, c, *spatial)
    sx = draw_scale(draw, rng)
    sy = F32(sx * 2.0 ** rng.uniform(-3, 1))
    return (
        codes(rng, shape, dtype),
        sx,
        sy,
        draw_zero_point(rng, dtype),
        draw_zero_point(rng, dtype),
        channels_last,
    )


def native_global_pool(x, sx, sy, zx, zy, channels_last, threads=1):
    spatial = x.shape[1:-1] if channels_last else x.shape[2:]
    m = F32(sx / F32(sy * F32(math.prod(spatial))))
    return _native.qlinear_global_average_pool(x, float(m), zx, zy, channels_last, threads)


@given(case=global_pool_cases())
def test_qlinear_global_average_pool_native_matches_reference(case) -> None:
    x, sx, sy, zx, zy, channels_last = case
    dt = x.dtype.type
    expected = ms_qlinear.qlinear_global_average_pool(x, sx, dt(zx), sy, dt(zy), channels_last)
    every_isa(
        lambda isa: assert_same(
            expected,
            native_global_pool(x, sx, sy, zx, zy, channels_last),
            isa,
            shape=x.shape,
            channels_last=channels_last,
        )
    )


def test_qlinear_global_average_pool_native_long_sum_threads() -> None:
    """HW = 4099 (an integer sum far past any SIMD width and past int16) over 17 channels,
    both layouts, 1 and 2 threads."""
    rng = np.random.default_rng(11)
    for channels_last in (False, True):
        shape = (2, 4099, 17) if channels_last else (2, 17, 4099)
        x = codes(rng, shape, np.int8)
        expected = ms_qlinear.qlinear_global_average_pool(
            x, F32(0.02), np.int8(-7), F32(0.01), np.int8(5), channels_last
        )
        for threads in (1, 2):
            every_isa(
                lambda isa, x=x, cl=channels_last, t=threads, e=expected: assert_same(
                    e, native_global_pool(x, F32(0.02), F32(0.01), -7, 5, cl, t), f"{isa} t{t} cl={cl}"
                )
            )


@st.composite
def pool_geometry(draw, *, dilations: bool):
    """A 1-D or 2-D window over an odd input: kernel 1..4, strides 1..3, pads < kernel,
    optional dilations, ceil_mode, auto_pad."""
    n_sp = draw(st.integers(1, 2))
    spatial = [draw(st.integers(1, 12)) for _ in range(n_sp)]
    kernel = [draw(st.integers(1, 4)) for _ in range(n_sp)]
    strides = [draw(st.integers(1, 3)) for _ in range(n_sp)]
    dil = [draw(st.integers(1, 2)) if dilations else 1 for _ in range(n_sp)]
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"]))
    pads = [draw(st.integers(0, k - 1)) for k in kernel] + [draw(st.integers(0, k - 1)) for k in kernel]
    spatial = [max(s, d * (k - 1) + 1) for s, k, d in zip(spatial, kernel, dil, strict=True)]
    return {
        "spatial": spatial,
        "kernel_shape": kernel,
        "strides": strides,
        "dilations": dil,
        "pads": pads,
        "auto_pad": auto_pad,
        "ceil_mode": draw(st.booleans()),
    }


def pair(values, fill):
    return (fill, int(values[0])) if len(values) == 1 else (int(values[0]), int(values[1]))


def as_4d(x):
    return x.reshape(x.shape[0], x.shape[1], 1, x.shape[2]) if x.ndim == 3 else x


@given(geom=pool_geometry(dilations=True), data=st.data())
def test_max_pool_native_matches_reference(geom, data) -> None:
    dtype = data.draw(st.sampled_from(DTYPES))
    c = data.draw(st.sampled_from([1, 3, 7, 17]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = codes(rng, (2, c, *geom["spatial"]), dtype)
    attrs = {k: geom[k] for k in ("kernel_shape", "strides", "dilations", "auto_pad")}
    if geom["auto_pad"] == "NOTSET":
        attrs["pads"] = geom["pads"]
    attrs["ceil_mode"] = int(geom["ceil_mode"])
    expected = max_pool(OpContext(n_outputs=1), x, **attrs)
    g = conv_attrs(
        x.shape,
        None,
        kernel_shape=attrs["kernel_shape"],
        strides=attrs["strides"],
        dilations=attrs["dilations"],
        pads=attrs.get("pads"),
        auto_pad=attrs["auto_pad"],
        ceil_mode=geom["ceil_mode"],
    )
    n_sp = x.ndim - 2

    def check(isa):
        y = _native.max_pool_2d(
            as_4d(x),
            pair(g.kernel_shape, 1),
            pair(g.strides, 1),
            pair(g.dilations, 1),
            pair(g.pads[:n_sp], 0),
            pair(g.out_shape, 1),
        )
        assert_same(expected, y.reshape(expected.shape), isa, shape=x.shape, **attrs)

    every_isa(check)


@given(geom=pool_geometry(dilations=False), data=st.data())
def test_qlinear_average_pool_native_matches_reference(geom, data) -> None:
    dtype = data.draw(st.sampled_from(DTYPES))
    c = data.draw(st.sampled_from([1, 3, 7, 17]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = codes(rng, (2, c, *geom["spatial"]), dtype)
    sx = draw_scale(data.draw, rng)
    sy = F32(sx * 2.0 ** rng.uniform(-2, 1)) if data.draw(st.booleans()) else F32(sx / 64)  # else saturates
    zx, zy = draw_zero_point(rng, dtype), draw_zero_point(rng, dtype)
    include_pad = data.draw(st.booleans())
    pads = geom["pads"] if geom["auto_pad"] == "NOTSET" else None
    expected = ms_qlinear.qlinear_average_pool(
        x,
        sx,
        dtype(zx),
        sy,
        dtype(zy),
        kernel_shape=geom["kernel_shape"],
        strides=geom["strides"],
        pads=pads,
        auto_pad=geom["auto_pad"],
        ceil_mode=geom["ceil_mode"],
        count_include_pad=include_pad,
    )
    n_sp = x.ndim - 2
    pd, out_shape = ms_qlinear._ort_pool_geometry(
        tuple(x.shape[2:]),
        geom["kernel_shape"],
        geom["strides"],
        pads or [0] * (2 * n_sp),
        geom["auto_pad"],
        geom["ceil_mode"],
    )
    if list(x.shape[2:]) == geom["kernel_shape"] and not any(pd):
        return  # the twin's global case: covered by the global-average tests
    if any(p < 0 for p in pd):
        return  # ORT's SAME geometry with k < s can give a negative pad; the twin raises then

    def check(isa):
        y = _native.qlinear_average_pool_2d(
            as_4d(x),
            pair(geom["kernel_shape"], 1),
            pair(geom["strides"], 1),
            pair(pd[:n_sp], 0),
            pair(out_shape, 1),
            float(sx),
            zx,
            float(sy),
            zy,
            include_pad,
        )
        assert_same(
            expected, y.reshape(expected.shape), isa, shape=x.shape, geom=geom, include_pad=include_pad
        )

    every_isa(check)


def test_qlinear_average_pool_native_ceil_mode_count_excludes_overhang() -> None:
    """7x7 input, 3x3 window, stride 2, pads 1, ceil_mode: the last window runs past the
    end pad. count_include_pad=1 divides by 9 everywhere (ORT), =0 by the in-input count:
    a kernel that counts the overhang, or forgets the pad, differs on the borders."""
    x = codes(np.random.default_rng(12), (1, 3, 7, 7), np.uint8)
    for include_pad in (False, True):
        expected = ms_qlinear.qlinear_average_pool(
            x,
            F32(0.1),
            np.uint8(9),
            F32(0.05),
            np.uint8(100),
            kernel_shape=[3, 3],
            strides=[2, 2],
            pads=[1, 1, 1, 1],
            ceil_mode=True,
            count_include_pad=include_pad,
        )
        assert expected.shape == (1, 3, 4, 4)
        every_isa(
            lambda isa, e=expected, ip=include_pad: assert_same(
                e,
                _native.qlinear_average_pool_2d(x, (3, 3), (2, 2), (1, 1), (4, 4), 0.1, 9, 0.05, 100, ip),
                isa,
            )
        )


@pytest.mark.parametrize("stride", [1, 2, 3])
def test_pool_native_wide_windows_take_the_row_path(stride) -> None:
    """A window 17 wide (more taps than the AVX-512 register-blocked planes take) and a row
    of 2100 outputs: the row-operation planes, with their vector bodies and tails."""
    rng = np.random.default_rng(14)
    for shape, kernel in (((1, 3, 5, 40), (2, 17)), ((1, 2, 3, 2100 * stride), (2, 3))):
        x = codes(rng, shape, np.int8)
        pads = [1, 8, 0, 8] if kernel[1] == 17 else [0, 1, 0, 1]
        attrs = {"kernel_shape": list(kernel), "strides": [1, stride], "pads": pads}
        expected_max = max_pool(OpContext(n_outputs=1), x, **attrs)
        expected_avg = ms_qlinear.qlinear_average_pool(
            x, F32(0.02), np.int8(-3), F32(0.01), np.int8(4), **attrs, count_include_pad=False
        )
        out_hw = expected_max.shape[2:]
        pb = (pads[0], pads[1])

        def check(isa, x=x, kernel=kernel, out_hw=out_hw, pb=pb, em=expected_max, ea=expected_avg):
            y = _native.max_pool_2d(x, kernel, (1, stride), (1, 1), pb, out_hw)
            assert_same(em, y, f"{isa} max", shape=x.shape, kernel=kernel, stride=stride)
            y = _native.qlinear_average_pool_2d(x, kernel, (1, stride), pb, out_hw, 0.02, -3, 0.01, 4, False)
            assert_same(ea, y, f"{isa} average", shape=x.shape, kernel=kernel, stride=stride)

        every_isa(check)


def test_pool_native_threads_identical() -> None:
    """Planes split over threads: max and average pools give identical bytes for 1 and 2."""
    x = codes(np.random.default_rng(13), (4, 17, 33, 31), np.int8)
    mx = [_native.max_pool_2d(x, (3, 3), (2, 2), (1, 1), (1, 1), (17, 16), t) for t in (1, 2)]
    av = [
        _native.qlinear_average_pool_2d(x, (3, 2), (1, 2), (1, 0), (33, 15), 0.03, -3, 0.02, 4, False, t)
        for t in (1, 2)
    ]
    assert_same(mx[0], mx[1], "max t1 vs t2")
    assert_same(av[0], av[1], "average t1 vs t2")
