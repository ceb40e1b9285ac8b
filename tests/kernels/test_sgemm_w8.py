"""The weight-only 8-bit float GEMM (quanta/kernels/cpp/sgemm/w8.h, ``_native.matmul_w8_f32``)
against the float GEMM it must equal byte for byte: ``matmul_f32`` with B the eq. (W8)
dequantization (reference/w8.py ``dequantize_w8``) packed by ``sgemm_pack_b``. The weight
is dequantized per micro-panel inside the kernel, so a wrong zero point, scale, column or
K-block shows up as different bytes; the float result itself is the float GEMM family's
(FG1), checked by tests/kernels/test_sgemm.py.

Every ISA the CPU supports; 1 and 2 threads; odd M/N/K around the tile edges (8 rows,
16 and 32 columns), K past one K-block (256) and past 258, channel counts 3, 7, 17,
distinct per-column scales, non-zero zero points (int8 and uint8), hypothesis shapes.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quanta.kernels import _native
from quanta.kernels.reference.w8 import dequantize_w8, matmul_w8
from quanta.targets.native.w8 import pack_w8

ISAS: list[str] = list(_native.supported_isas())
F32 = np.float32


def weights(rng: np.random.Generator, k: int, n: int, dtype, zero_points: bool):
    lo, hi = (-128, 128) if dtype == np.int8 else (0, 256)
    q = rng.integers(lo, hi, (k, n)).astype(dtype)
    s = rng.uniform(1e-3, 5e-2, n).astype(F32)  # one distinct scale per column
    zp = rng.integers(lo, hi, n).astype(dtype) if zero_points else None
    return q, s, zp


def check(m: int, k: int, n: int, seed: int, dtype=np.int8, zero_points: bool = True, lead=()) -> None:
    rng = np.random.default_rng(seed)
    q, s, zp = weights(rng, k, n, dtype, zero_points)
    a = rng.standard_normal((*lead, m, k)).astype(F32)
    w = dequantize_w8(q, s, zp)
    packed_f = _native.sgemm_pack_b(np.ascontiguousarray(w))
    packed_q = pack_w8(q, s, zp)
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            want = _native.matmul_f32(a, None, packed_f, n)
            for threads in (1, 2):
                got = _native.matmul_w8_f32(a, *packed_q, n, num_threads=threads)
                assert got.dtype == F32 and got.shape == (*lead, m, n)
                np.testing.assert_array_equal(got, want, err_msg=f"{isa}, {threads} threads, {(m, k, n)}")
    finally:
        _native.clear_isa()


@pytest.mark.parametrize(
    ("m", "k", "n"),
    [
        (1, 1, 1),
        (1, 384, 384),
        (10, 384, 1536),
        (3, 7, 17),
        (7, 17, 3),
        (17, 3, 7),
        (9, 259, 33),
        (8, 256, 32),
        (2, 513, 47),
        (33, 130, 16),
        (1, 1536, 65),
    ],
)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_bytes_are_the_float_gemm_of_the_dequantized_weight(m, k, n, dtype):
    check(m, k, n, seed=m * 1000 + k + n, dtype=dtype)


def test_without_zero_point_and_with_leading_dimensions():
    check(5, 300, 40, seed=1, zero_points=False, lead=(2, 3))


def test_one_dimensional_activation():
    rng = np.random.default_rng(4)
    q, s, zp = weights(rng, 37, 19, np.int8, True)
    a = rng.standard_normal(37).astype(F32)
    got = _native.matmul_w8_f32(a, *pack_w8(q, s, zp), 19)
    want = _native.matmul_f32(
        a.reshape(1, -1), None, _native.sgemm_pack_b(dequantize_w8(q, s, zp)), 19
    ).reshape(19)
    np.testing.assert_array_equal(got, want)


def test_empty_reduction_and_empty_rows():
    q = np.zeros((0, 5), np.int8)
    packed = pack_w8(q, np.ones(5, F32), None)
    np.testing.assert_array_equal(
        _native.matmul_w8_f32(np.zeros((3, 0), F32), *packed, 5), np.zeros((3, 5), F32)
    )
    assert _native.matmul_w8_f32(np.zeros((0, 0), F32), *packed, 5).shape == (0, 5)


def test_the_twin_is_within_the_float_gemm_bound_of_float64():
    """The reference's (W8M) is np.matmul of eq. (W8): within (FG1) of float64."""
    rng = np.random.default_rng(9)
    q, s, zp = weights(rng, 300, 17, np.uint8, True)
    a = rng.standard_normal((7, 300)).astype(F32)
    w64 = dequantize_w8(q, s, zp).astype(np.float64)
    y64 = a.astype(np.float64) @ w64
    mag = np.abs(a.astype(np.float64)) @ np.abs(w64)
    for y in (matmul_w8(a, q, s, zp), _native.matmul_w8_f32(a, *pack_w8(q, s, zp), 17)):
        assert np.all(np.abs(y - y64) <= 303 * 2.0**-24 * mag)


def test_dequantization_rounds_once():
    """(W8) is f32((q − zp) · s): the product of the exact integer and the scale, rounded
    once (float64 then float32 gives the same value: the product of a 9-bit integer and a
    float32 is exact in float64)."""
    rng = np.random.default_rng(2)
    q, s, zp = weights(rng, 64, 33, np.int8, True)
    exact = (q.astype(np.float64) - zp.astype(np.float64)) * s.astype(np.float64)
    np.testing.assert_array_equal(dequantize_w8(q, s, zp), exact.astype(F32))


@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(1, 20),
    k=st.integers(1, 300),
    n=st.integers(1, 70),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from([np.int8, np.uint8]),
)
def test_hypothesis_shapes(m, k, n, seed, dtype):
    check(m, k, n, seed, dtype=dtype)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda p: _native.matmul_w8_f32(np.zeros((2, 9), F32), *p, 7), "q_packed: expected"),
        (lambda p: _native.matmul_w8_f32(np.zeros((2, 8), np.float64), *p, 7), "a: expected dtype"),
        (
            lambda p: _native.matmul_w8_f32(np.zeros((2, 8), F32), p[0], p[1][:3], p[2], 7),
            "zero_point and scale",
        ),
        (
            lambda p: _native.matmul_w8_f32(np.zeros((2, 8), F32), *p, 7, bias=np.zeros(3, F32)),
            "bias: expected 7",
        ),
        (
            lambda p: _native.sgemm_pack_w8(np.zeros((8, 7), np.int8), np.zeros(6, F32), np.ones(7, F32)),
            "one per",
        ),
        (
            lambda p: _native.sgemm_pack_w8(np.zeros((8, 7), np.uint8), np.zeros(7, F32), np.ones(7, F32)),
            "int8",
        ),
    ],
)
def test_bad_arguments_raise_value_errors_naming_them(call, match):
    packed = pack_w8(np.zeros((8, 7), np.int8), np.ones(7, F32), None)
    with pytest.raises(ValueError, match=match):
        call(packed)
