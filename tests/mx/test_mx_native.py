"""Native MX kernels (kernels/cpp/mx) against their twin quanta/kernels/reference/mx.py:
bit-exact on every ISA the CPU has, any thread count (docs eqs. (MX3)-(MX6))."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from quanta.kernels import _native
from quanta.kernels.reference import mx
from quanta.targets.native import mx as native_mx

ISAS: list[str] = list(_native.supported_isas())
FORMATS = list(mx.MX_FORMATS)


def _bits(el: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(el).view(np.uint8)


def _data(rng, shape, spread=6.0):
    return (rng.standard_normal(shape) * np.exp(rng.uniform(-spread, spread, (*shape[:-1], 1)))).astype(
        np.float32
    )


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FORMATS)
def test_quantize_matches_twin(isa, name):
    rng = np.random.default_rng(11)
    x = _data(rng, (13, 301))
    x[0, :40] = 0.0  # an all-zero block
    x[1, 5] = np.nan
    x[2, 70] = -np.inf
    x[3, :32] = np.float32(2.0**-140)  # subnormal block
    x[4, 33] = np.finfo(np.float32).max
    # every element pattern: a block of each decoded value under a fixed scale
    f = mx.MX_FORMATS[name]
    vals = np.unique(mx.dequantize_mx(*mx.quantize_mx(x, f, axis=1), axis=1))
    del vals
    el, codes = mx.quantize_mx(x, f, axis=1, block=32)
    for threads in (1, 2):
        bits, c = _native.mx_quantize(x, name, 32, num_threads=threads, isa=isa)
        assert np.array_equal(c, codes.view(np.uint8)), isa
        assert np.array_equal(bits, _bits(el)), isa


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FORMATS)
def test_quantize_every_element_pattern_and_tie(isa, name):
    f = mx.MX_FORMATS[name]
    n = {"f6e3m2fn": 64, "f6e2m3fn": 64, "f4e2m1fn": 16}.get(name, 256)
    pats = np.arange(n, dtype=np.uint8)
    v = pats.view(np.int8).astype(np.float64) / 64 if f.is_int else pats.view(f.dtype).astype(np.float64)
    v = np.unique(np.abs(v[np.isfinite(v)]))
    mids = (v[:-1] + v[1:]) / 2
    cand = np.concatenate([v, -v, mids, -mids, np.nextafter(mids, 0), np.nextafter(mids, 9e9)])
    # blocks of 4: [2^emax, c1, c2, c3] pin the scale to 2^0
    pad = (-len(cand)) % 3
    cand = np.concatenate([cand, np.zeros(pad)]).reshape(-1, 3)
    x = np.concatenate([np.full((len(cand), 1), 2.0**f.emax), cand], axis=1).astype(np.float32)
    x = x * np.float32(2.0**-5)
    el, codes = mx.quantize_mx(x, f, axis=1, block=4)
    bits, c = _native.mx_quantize(x, name, 4, isa=isa)
    assert np.array_equal(c, codes.view(np.uint8))
    assert np.array_equal(bits, _bits(el))


def _gemm_case(rng, M, K, N, fa, fb, block):
    a_el, a_c = mx.quantize_mx(_data(rng, (M, K)), fa, axis=1, block=block)
    b_el, b_c = mx.quantize_mx(_data(rng, (N, K)).T.copy(), fb, axis=0, block=block)
    return a_el, a_c, b_el, b_c


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    "fa,fb",
    [
        ("i8", "i8"),
        ("f8e4m3fn", "f8e4m3fn"),
        ("f8e4m3fn", "f4e2m1fn"),
        ("i8", "f4e2m1fn"),
        ("f6e2m3fn", "f6e3m2fn"),
    ],
)
def test_gemm_matches_twin(isa, fa, fb):
    rng = np.random.default_rng(5)
    for M, K, N, block in ((7, 301, 45, 32), (1, 64, 33, 32), (13, 100, 17, 20), (6, 259, 64, 32)):
        a_el, a_c, b_el, b_c = _gemm_case(rng, M, K, N, fa, fb, block)
        bias = rng.standard_normal(N).astype(np.float32)
        want = mx.mx_gemm(a_el, a_c, b_el, b_c, block, bias=bias)
        packed = _native.mx_pack_weights(_bits(b_el), b_c.view(np.uint8), fb, block, isa=isa)
        for threads in (1, 2):
            got = _native.mx_gemm(_bits(a_el), a_c.view(np.uint8), fa, packed, bias, num_threads=threads)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (isa, M, K, N, block)
        got = _native.mx_gemm(_bits(a_el), a_c.view(np.uint8), fa, packed)
        assert np.array_equal(got, mx.mx_gemm(a_el, a_c, b_el, b_c, block))


@pytest.mark.parametrize("isa", ISAS)
def test_gemm_edge_scales_and_nan_blocks(isa):
    rng = np.random.default_rng(9)
    M, K, N = 5, 96, 40
    a_el, a_c, b_el, b_c = _gemm_case(rng, M, K, N, "i8", "i8", 32)
    a_c = a_c.view(np.uint8).copy()
    b_c = b_c.view(np.uint8).copy()
    a_c[0, 1] = 255  # NaN scale
    a_c[1, :] = 0  # 2^-127: products underflow
    b_c[:, 3] = 254  # 2^127: overflow to inf
    a_c[2, 0] = 200
    want = mx.mx_gemm(a_el, a_c.view(ml_dtypes.float8_e8m0fnu), b_el, b_c.view(ml_dtypes.float8_e8m0fnu), 32)
    packed = _native.mx_pack_weights(_bits(b_el), b_c, "i8", 32, isa=isa)
    got = _native.mx_gemm(_bits(a_el), a_c, "i8", packed)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.all(np.isnan(got[0]))


@given(
    M=st.integers(1, 14),
    K=st.integers(1, 300),
    N=st.integers(1, 70),
    block=st.sampled_from([32, 16, 8, 7, 33]),
    isa=st.sampled_from(ISAS),
)
def test_gemm_i8_any_shape(M, K, N, block, isa):
    rng = np.random.default_rng(M * 1000 + K * 7 + N)
    a_el, a_c, b_el, b_c = _gemm_case(rng, M, K, N, "i8", "i8", block)
    packed = _native.mx_pack_weights(_bits(b_el), b_c.view(np.uint8), "i8", block, isa=isa)
    got = _native.mx_gemm(_bits(a_el), a_c.view(np.uint8), "i8", packed)
    assert np.array_equal(got.view(np.uint32), mx.mx_gemm(a_el, a_c, b_el, b_c, block).view(np.uint32))


def test_conv_matches_twin():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 35, 7, 6)).astype(np.float32)
    w = rng.standard_normal((17, 35, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(17).astype(np.float32)
    for fx, fw in (("i8", "i8"), ("f8e4m3fn", "f8e4m3fn"), ("f8e4m3fn", "f4e2m1fn")):
        xe, xs = mx.quantize_mx(x, fx, axis=1)
        we, ws = mx.quantize_mx(w, fw, axis=1)
        want = mx.mx_conv(xe, xs, we, ws, 32, bias=bias, pads=(1, 1, 1, 0), strides=(2, 1))
        for isa in ISAS:
            _native.set_isa(isa)
            try:
                got = native_mx.mx_conv(x, fx, we, ws, 32, bias=bias, pads=(1, 1, 1, 0), strides=(2, 1))
            finally:
                _native.clear_isa()
            assert np.array_equal(got, want), (isa, fx, fw)


def test_boundary_errors_name_the_argument():
    packed = _native.mx_pack_weights(np.zeros((64, 3), np.uint8), np.zeros((2, 3), np.uint8), "i8", 32)
    with pytest.raises(ValueError, match=r"mx_gemm: a_bits: expected \[M, 64\], got \(2, 63\)"):
        _native.mx_gemm(np.zeros((2, 63), np.uint8), np.zeros((2, 2), np.uint8), "i8", packed)
    with pytest.raises(ValueError, match=r"mx_gemm: a_codes: expected shape \(2, 2\)"):
        _native.mx_gemm(np.zeros((2, 64), np.uint8), np.zeros((2, 3), np.uint8), "i8", packed)
    with pytest.raises(ValueError, match="unknown MX element format 'fp7'"):
        _native.mx_quantize(np.zeros((2, 64), np.float32), "fp7")
    with pytest.raises(ValueError, match=r"mx_pack_weights: codes: expected shape \(2, 3\)"):
        _native.mx_pack_weights(np.zeros((64, 3), np.uint8), np.zeros((3, 3), np.uint8), "i8", 32)
    p5 = _native.mx_pack_weights(np.zeros((64, 3), np.uint8), np.zeros((2, 3), np.uint8), "f8e5m2", 32)
    a_el, a_c, b_el, b_c = _gemm_case(np.random.default_rng(2), 2, 64, 3, "f8e4m3fn", "i8", 32)
    packed_i8 = _native.mx_pack_weights(_bits(b_el), b_c.view(np.uint8), "i8", 32)
    with pytest.raises(ValueError, match="activations with MXINT8 packed weights"):
        _native.mx_gemm(_bits(a_el), a_c.view(np.uint8), "f8e4m3fn", packed_i8)
    with pytest.raises(ValueError, match="exceed float64's exact range"):
        _native.mx_gemm(np.zeros((2, 64), np.uint8), np.zeros((2, 2), np.uint8), "f8e5m2", p5)


def _with_codes(a_el, a_c, b_el, b_c):
    e8 = ml_dtypes.float8_e8m0fnu
    return a_el, np.ascontiguousarray(a_c).view(e8), b_el, np.ascontiguousarray(b_c).view(e8)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    "ca,cb",
    [
        (70, 70),
        (69, 70),
        (181, 181),
        (181, 182),
        (3, 250),
        (254, 120),
        (140, 6),
        (140, 7),
        (120, 237),
        (120, 238),
    ],
)
def test_gemm_i8_scale_products_at_the_normal_range_edges(isa, ca, cb):
    # the avx512vnni tile forms fl32(s_a · s_b) from the codes where every product of the
    # tile is normal and |fl32(D) · s| < 2^128 (code sums 140..362): sums 139 / 140 and
    # 362 / 363 sit on both sides of that test, and must all match the twin; the 12-row asm
    # tile also needs B codes in 7..237 (its offsets 1.5·2^(c − 110) normal): 6 / 7 and
    # 237 / 238 sit on both sides of that
    rng = np.random.default_rng(ca * 256 + cb)
    M, K, N = 13, 96, 37
    a_el, a_c, b_el, b_c = _gemm_case(rng, M, K, N, "i8", "i8", 32)
    a_c = np.full(a_c.shape, ca, np.uint8)
    b_c = np.full(b_c.shape, cb, np.uint8)
    a_c[1, 1] = ca + 1  # one block off the tile's minimum
    want = mx.mx_gemm(*_with_codes(a_el, a_c, b_el, b_c), 32)
    packed = _native.mx_pack_weights(_bits(b_el), b_c, "i8", 32, isa=isa)
    got = _native.mx_gemm(_bits(a_el), a_c, "i8", packed)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("isa", ISAS)
def test_gemm_i8_extreme_block_dots(isa):
    # elements at −128 and ±127 give the largest block dots, |D_k| up to 32·128·128 = 2^19,
    # which the 12-row asm tile adds to a float's mantissa bits; 25 rows (two full tiles and
    # one row), K = 333 (a short last block), 41 columns, codes spread over 100..150
    rng = np.random.default_rng(31)
    M, K, N = 25, 333, 41
    a = rng.choice(np.array([-128, -127, 127, 0, 5], np.int8), size=(M, K), p=[0.4, 0.2, 0.3, 0.05, 0.05])
    b = rng.choice(np.array([-128, 127, -127, 3], np.int8), size=(K, N), p=[0.45, 0.25, 0.25, 0.05])
    a[0] = -128
    b[:, 0] = -128  # D = 2^19 in every block of row 0, column 0
    b[:, 1] = 127  # D = −128·127·32 with row 0
    nb = -(-K // 32)
    a_c = rng.integers(100, 151, (M, nb)).astype(np.uint8)
    b_c = rng.integers(100, 151, (nb, N)).astype(np.uint8)
    bias = rng.standard_normal(N).astype(np.float32)
    want = mx.mx_gemm(*_with_codes(a, a_c, b, b_c), 32, bias=bias)
    packed = _native.mx_pack_weights(_bits(b), b_c, "i8", 32, isa=isa)
    got = _native.mx_gemm(_bits(a), a_c, "i8", packed, bias)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("isa", ISAS)
def test_gemm_i8_zero_blocks_and_negative_zero(isa):
    # all-zero blocks carry code 0 (2^-133 scale): their products are +0 whatever the
    # scale, so they must not push a tile off the fast path, nor change a -0 sum
    rng = np.random.default_rng(17)
    M, K, N = 14, 160, 45
    x = _data(rng, (M, K), spread=2.0)
    x[3, 32:64] = 0.0
    x[5] = 0.0
    x[7, :32] = -0.0
    w = _data(rng, (N, K), spread=2.0).T.copy()
    w[64:96, 4] = 0.0
    w[:, 9] = 0.0
    a_el, a_c = mx.quantize_mx(x, "i8", axis=1, block=32)
    b_el, b_c = mx.quantize_mx(w, "i8", axis=0, block=32)
    bias = rng.standard_normal(N).astype(np.float32)
    bias[9] = -0.0
    want = mx.mx_gemm(a_el, a_c, b_el, b_c, 32, bias=bias)
    packed = _native.mx_pack_weights(_bits(b_el), b_c.view(np.uint8), "i8", 32, isa=isa)
    got = _native.mx_gemm(_bits(a_el), a_c.view(np.uint8), "i8", packed, bias)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("M", [101, 98])
def test_gemm_i8_row_blocks_and_k_chunks(isa, M):
    # more than one row block (avx512vnni: 2 tiles of 12 rows; portable / avx2: 96 rows)
    # and, on portable / avx2, B wider than one K chunk keeps in L2: the float accumulators
    # wait in y between chunks, same values in the same order; a last tile of 5 rows keeps
    # them in memory, one of 2 rows in registers
    rng = np.random.default_rng(23)
    K, N = 700, 1030
    a_el, a_c, b_el, b_c = _gemm_case(rng, M, K, N, "i8", "i8", 32)
    bias = rng.standard_normal(N).astype(np.float32)
    want = mx.mx_gemm(a_el, a_c, b_el, b_c, 32, bias=bias)
    packed = _native.mx_pack_weights(_bits(b_el), b_c.view(np.uint8), "i8", 32, isa=isa)
    for threads in (1, 2):
        got = _native.mx_gemm(_bits(a_el), a_c.view(np.uint8), "i8", packed, bias, num_threads=threads)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), threads


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("block", [32, 12, 8, 9])
def test_quantize_i8_every_element_pattern_in_whole_and_masked_lanes(isa, block):
    # the vectorized INT8 quantizers run whole vectors (8 lanes on avx2, 16 on avx512vnni)
    # and masked last vectors: every INT8 value, every midpoint between neighbours (ties
    # to even) and its two float neighbours, in blocks whose first element pins the scale
    # to 2^0, so that each candidate lands in whole and in masked lanes across the blocks
    v = np.arange(128, dtype=np.float64) / 64
    mids = (v[:-1] + v[1:]) / 2
    cand = np.concatenate([v, -v, mids, -mids, np.nextafter(mids, 0), np.nextafter(mids, 9e9), [2.0, -2.0]])
    per = block - 1
    pad = (-len(cand)) % per
    cand = np.concatenate([cand, np.full(pad, -0.0)]).reshape(-1, per)
    x = np.concatenate([np.full((len(cand), 1), 1.0), cand], axis=1).astype(np.float32)
    x = (x * np.float32(2.0**-9)).reshape(1, -1)[:, : x.size - 3]  # a short last block
    el, codes = mx.quantize_mx(x, "i8", axis=1, block=block)
    bits, c = _native.mx_quantize(x, "i8", block, isa=isa)
    assert np.array_equal(c, codes.view(np.uint8))
    assert np.array_equal(bits, _bits(el))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("block", [1, 3, 7, 17, 20, 33, 40, 258])
def test_quantize_i8_special_values_in_every_lane(isa, block):
    # NaN / ±Inf alone in the last lane of a whole vector, of a masked vector and of the
    # short last block; amax at float32's largest and at a subnormal; signed zeros
    rng = np.random.default_rng(block)
    K = 3 * block + 5
    x = _data(rng, (9, K), spread=3.0)
    x[1, K - 1] = np.nan
    x[2, block - 1] = np.inf
    x[3, min(7, block - 1)] = -np.inf
    x[4] = 0.0
    x[4, block // 2] = np.float32(-(2.0**-147))
    x[5, :block] = -0.0
    x[6, K - 2] = np.finfo(np.float32).max
    x[7, : 2 * block] = np.float32(3.0 * 2.0**-149)
    x[8, ::5] = np.float32(-(2.0**127))
    el, codes = mx.quantize_mx(x, "i8", axis=1, block=block)
    for threads in (1, 2):
        bits, c = _native.mx_quantize(x, "i8", block, num_threads=threads, isa=isa)
        assert np.array_equal(c, codes.view(np.uint8)), (isa, threads)
        assert np.array_equal(bits, _bits(el)), (isa, threads)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("block", [255, 256, 300])
def test_gemm_i8_long_blocks_extreme_column_sums(isa, block):
    # blocks of 256 and more: a column of −128 sums to 128·block, past int16; the
    # avx512vnni tile starts each block sum at −128·Σ_block w and must hold it whole
    rng = np.random.default_rng(block)
    M, K, N = 13, 2 * block + 37, 40
    a = rng.choice(np.array([-128, 127, -127, 0], np.int8), size=(M, K))
    b = np.full((K, N), -128, np.int8)
    b[:, 1] = 127
    b[:, 2:] = rng.integers(-128, 128, (K, N - 2))
    a[1] = 127
    nb = -(-K // block)
    a_c = rng.integers(110, 140, (M, nb)).astype(np.uint8)
    b_c = rng.integers(110, 140, (nb, N)).astype(np.uint8)
    want = mx.mx_gemm(*_with_codes(a, a_c, b, b_c), block)
    packed = _native.mx_pack_weights(_bits(b), b_c, "i8", block, isa=isa)
    got = _native.mx_gemm(_bits(a), a_c, "i8", packed)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("K", [512, 1024 + 3 * 32 + 7, 1536 + 32])
def test_quantize_i8_sixteen_block_runs(isa, K):
    # block 32: the avx512vnni quantizer takes runs of 16 whole blocks at a time (block
    # maxima reduced across 16 vectors, codes and factors 16 at once). Each row puts a
    # special block at a different position in the run: NaN / ±Inf in a first, middle or
    # last lane, an all-zero block, a subnormal and a ±0 block, float32's largest value,
    # a power of two as the maximum, and scales spread over the whole code range
    rng = np.random.default_rng(K)
    rows = 23
    x = _data(rng, (rows, K), spread=3.0)
    x[:, K // 2 :] *= np.float32(2.0**-100)  # codes near 0 in the second half
    x[0, 5 * 32 + 31] = np.nan
    x[1, 0] = np.inf
    x[2, 15 * 32 + 16] = -np.inf
    x[3, 7 * 32 : 8 * 32] = 0.0
    x[4, 3 * 32 : 4 * 32] = np.float32(3.0 * 2.0**-149)
    x[5, 9 * 32 : 10 * 32] = -0.0
    x[6, 11 * 32 + 3] = np.finfo(np.float32).max
    x[7, 12 * 32 : 13 * 32] = np.float32(2.0**-126)  # amax the smallest normal: code 1
    x[8, 2 * 32 + 9] = np.float32(-(2.0**127))
    for r in range(9, 15):  # one block of each row: a NaN or an Inf in a random lane
        k = int(rng.integers(0, K // 32))
        x[r, k * 32 + int(rng.integers(0, 32))] = [np.nan, -np.inf, np.inf][r % 3]
    # the last rows: every block under its own power of two, 2^-149 .. 2^124
    nbk = K // 32
    for r in range(15, rows):
        e = rng.integers(-149, 125, nbk).astype(np.float64)
        x[r, : nbk * 32] = (rng.standard_normal((nbk, 32)) * 2.0 ** e[:, None]).reshape(-1)
    el, codes = mx.quantize_mx(x, "i8", axis=1, block=32)
    assert len(np.unique(codes.view(np.uint8))) > 100  # the scales span the code range
    for threads in (1, 2):
        bits, c = _native.mx_quantize(x, "i8", 32, num_threads=threads, isa=isa)
        assert np.array_equal(c, codes.view(np.uint8)), (isa, threads)
        assert np.array_equal(bits, _bits(el)), (isa, threads)
