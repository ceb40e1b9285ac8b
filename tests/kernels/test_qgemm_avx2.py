"""The AVX2 int8 GEMM families on the data that breaks ``vpmaddubsw``.

ONNX Runtime's AVX2 kernel (MLAS ``MlasGemmU8S8KernelAvx2``) adds two u8·s8 products
into a saturating int16: ``255·(−128) + 255·(−128) = −65280`` becomes ``−32768``. quanta's
avx2 ISA has two families (docs/kernels.md "AVX2"):

- ``qgemm_u8s8_s32_6x16c2__avx2`` for any int8 weights: int16 operands and ``vpmaddwd``,
  exact by construction;
- ``qgemm_u8s8p_s32_5x16c4__avx2``, chosen at packing time when every pair of ``w'``
  (k = 2j, 2j + 1) holds at most 128 in its positive codes and in its negative codes'
  magnitudes (``reference/qgemm.py pairs_fit_int16``, docs/kernels.md eq. (K1)-(K2);
  ``Recipe.weight_bits = 7`` always does): ``vpmaddubsw``, exact because a pair is then
  within ``±255·128 = ±32640``.

Every case is compared bit-exactly with the NumPy twin on every ISA and thread count
(``test_qgemm.check_all_variants``), with the saturating pairs adjacent in k (the two
bytes one ``vpmaddubsw`` lane adds), K past 258, N of 3 / 7 / 17, zero points that are
not 0 and per-column multipliers that differ.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from quanta.kernels import _native
from quanta.kernels.reference import qgemm as ref

from .test_qgemm import ISAS, Case, check_all_variants, gemm_cases, pack

pytestmark = pytest.mark.skipif("avx2" not in ISAS, reason="this CPU does not run avx2")

WIDE = "qgemm_u8s8_s32_6x16c2__avx2"
NARROW = "qgemm_u8s8p_s32_5x16c4__avx2"


def _stage(case: Case, rng: np.random.Generator) -> Case:
    """uint8 output with per-column multipliers from the accumulator's range."""
    N = case.w.shape[1]
    acc = ref.accumulate(case.x, case.w, case.zx, case.zw, case.bias).astype(np.float64)
    span = max(1.0, float(acc.max() - acc.min()))
    case.stage["multiplier"] = (np.float32(255 / span) * rng.uniform(0.5, 2.0, N)).astype(np.float32)
    case.stage["zy"] = int(np.clip(round(127.5 - float(np.median(acc)) * 255 / span), 0, 255))
    return case


@pytest.mark.parametrize("K", [2, 259, 1000])
@pytest.mark.parametrize("N", [3, 7, 17])
@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
def test_saturating_pairs_are_exact(K, N, x_dtype):
    """x' = 255 next to x' = 255 times w = −128 next to w = −128: the pair vpmaddubsw
    saturates. Rows alternate the extreme pattern with random data so tiles mix both."""
    rng = np.random.default_rng(K * 100 + N)
    M = 13
    hi = 255 if x_dtype == np.uint8 else 127  # x' = x + 128 for int8 x
    x = rng.integers(np.iinfo(x_dtype).min, hi + 1, (M, K)).astype(x_dtype)
    x[::2] = hi
    w = rng.integers(-128, 128, (K, N)).astype(np.int8)
    w[:, ::2] = -128
    w[: K // 2, 1::2] = 127  # same-sign large pairs of the other sign too (255·127·2)
    zw = rng.integers(-128, 128, N).astype(np.int32)
    zw[zw == 0] = 3
    zx = 7 if x_dtype == np.uint8 else -5
    case = _stage(Case(x, w, zx, zw, np.dtype(np.uint8), rng.integers(-5000, 5000, N).astype(np.int32)), rng)
    assert pack(case, "avx2").kernel == WIDE
    check_all_variants(case)
    acc = Case(x, w, zx, zw, np.dtype(np.int32))
    check_all_variants(acc)  # the raw sums too (MatMulInteger)


@pytest.mark.parametrize("K", [4, 259, 1000])
@pytest.mark.parametrize("N", [3, 7, 17])
def test_seven_bit_weights_use_vpmaddubsw_exactly(K, N):
    """w' in [−64, 64] packs for the vpmaddubsw family; the largest pairs
    (255·64·2 = 32640 and 255·(−64)·2) sit next to each other and stay exact."""
    rng = np.random.default_rng(K + N)
    M = 11
    x = rng.integers(0, 256, (M, K)).astype(np.uint8)
    x[1::2] = 255
    w = rng.integers(-64, 65, (K, N)).astype(np.int8)
    w[:, 0] = 64
    w[:, -1] = -64
    zw = rng.integers(-64, 65, N).astype(np.int32)
    case = _stage(Case(x, w, 200, zw, np.dtype(np.uint8)), rng)
    assert pack(case, "avx2").kernel == NARROW
    check_all_variants(case)
    check_all_variants(Case(x, w, 200, zw, np.dtype(np.int32)))


def pair_safe_codes(rng: np.random.Generator, K: int, N: int, tail: np.ndarray | int = 0) -> np.ndarray:
    """w' [K, N] (int64, in [−128, 127]) whose every pair k = 2j, 2j + 1 is safe
    (positive codes summing to <= 128, negative magnitudes to <= 128), a third of the pairs
    exactly on that bound, and the extremes 127 / −128 in every column. For an odd K the
    last k pairs with ``tail`` (the packing's partner there: 0 for qgemm, zw' for a
    convolution's padded rows, per column)."""
    tail = np.broadcast_to(np.asarray(tail, np.int64), (N,))
    Kp = K + K % 2
    w = np.zeros((Kp, N), np.int64)
    a = rng.integers(-128, 128, (Kp // 2, N))
    # b's safe range given a: a > 0 caps a positive b at 128 − a, a < 0 a negative b at −128 − a
    lo = np.where(a < 0, -128 - a, -128)
    hi = np.where(a > 0, np.minimum(127, 128 - a), 127)
    b = rng.integers(lo, hi + 1)
    on_bound = rng.random(a.shape) < 1 / 3
    b = np.where(on_bound & (a > 0), 128 - a, np.where(on_bound & (a < 0), -128 - a, b))
    w[0::2], w[1::2] = a, b
    w[0, :], w[1, :] = 127, 1  # 255·(127 + 1) = 32640, the largest pair
    if Kp >= 4:
        w[2, :], w[3, :] = -128, 0  # −32640, the smallest
    if K % 2:
        w[K] = tail  # the partner the kernel adds to the lone k = K − 1
        lone_lo = np.where(tail < 0, -128 - tail, -128)
        lone_hi = np.where(tail > 0, np.minimum(127, 128 - tail), 127)
        w[K - 1] = rng.integers(lone_lo, lone_hi + 1)
    assert ref.pairs_fit_int16(np.clip(w, -128, 127).astype(np.int8))
    return w[:K]


def adversarial_rows(wp: np.ndarray, rng: np.random.Generator, M: int) -> np.ndarray:
    """x' [M, K] in [0, 255] that drives the pairs to their bounds: per column n in turn,
    255 where w'[k, n] > 0 (every pair at 255·P) or where w'[k, n] < 0 (at −255·Q), rows of
    all 255, and random rows."""
    K, N = wp.shape
    x = rng.integers(0, 256, (M, K))
    for m in range(M):
        n, kind = (m // 4) % N, m % 4
        if kind == 0:
            x[m] = np.where(wp[:, n] > 0, 255, 0)
        elif kind == 1:
            x[m] = np.where(wp[:, n] < 0, 255, 0)
        elif kind == 2:
            x[m] = 255
    return x


def _pair_safe_case(rng, M, K, N, x_dtype, w_dtype, out_dtype) -> tuple[Case, np.ndarray]:
    wp = pair_safe_codes(rng, K, N)
    xp = adversarial_rows(wp, rng, M)
    x = (xp - (128 if x_dtype == np.int8 else 0)).astype(x_dtype)
    w = (wp + (128 if w_dtype == np.uint8 else 0)).astype(w_dtype)
    wlo, whi = np.iinfo(w_dtype).min, np.iinfo(w_dtype).max
    zw = rng.integers(wlo, whi + 1, N).astype(np.int32)
    zw[zw == (128 if w_dtype == np.uint8 else 0)] = 3 if w_dtype == np.int8 else 131  # zw' != 0
    zx = -5 if x_dtype == np.int8 else 200
    case = Case(x, w, zx, zw, np.dtype(out_dtype), rng.integers(-5000, 5000, N).astype(np.int32))
    return (_stage(case, rng) if out_dtype == np.uint8 else case), wp


@pytest.mark.parametrize("K", [2, 7, 259, 1001])
@pytest.mark.parametrize("N", [3, 7, 17])
@pytest.mark.parametrize(
    ("x_dtype", "w_dtype"), [(np.uint8, np.int8), (np.int8, np.uint8), (np.uint8, np.uint8)]
)
def test_pair_safe_full_range_weights_take_vpmaddubsw_exactly(K, N, x_dtype, w_dtype):
    """w' up to ±127 / −128 whose pairs are all safe packs for the vpmaddubsw family and
    gives the twin's bytes on x' rows that put every pair at 255·128 or −255·128, all-255
    rows and random ones; M = 1 (the one-row kernel) and 13 (5-row tiles and a tail),
    int32 and uint8 outputs, every ISA and thread count."""
    rng = np.random.default_rng(K * 31 + N * 7 + (x_dtype == np.int8) + 2 * (w_dtype == np.uint8))
    for M in (1, 13):
        for out in (np.int32, np.uint8):
            case, wp = _pair_safe_case(rng, M, K, N, x_dtype, w_dtype, out)
            if K >= 4:
                assert np.abs(wp).max() >= 127  # beyond the 7-bit grid
            assert pack(case, "avx2").kernel == NARROW
            check_all_variants(case)


@pytest.mark.parametrize("K", [4, 259, 1001])
@pytest.mark.parametrize("N", [3, 7, 17])
@pytest.mark.parametrize("pair", [(127, 2), (2, 127), (65, 64), (-128, -1), (-1, -128), (-65, -64)])
@pytest.mark.parametrize("w_dtype", [np.int8, np.uint8])
def test_one_unsafe_pair_falls_back_to_the_int16_family(K, N, pair, w_dtype):
    """The same tensors with exactly one pair one code past the bound (P or Q = 129) in
    the last full pair of the last column: the whole tensor packs for vpmaddwd, and its
    bytes are the twin's on the x' that saturates that pair in vpmaddubsw."""
    rng = np.random.default_rng(K * 1000 + N * 10 + abs(pair[0] * 3 + pair[1]))
    case, wp = _pair_safe_case(rng, 11, K, N, np.uint8, w_dtype, np.int32)
    j = (K // 2 - 1) * 2
    wp[j : j + 2, -1] = pair
    assert not ref.pairs_fit_int16(wp.astype(np.int8))
    case.w = (wp + (128 if w_dtype == np.uint8 else 0)).astype(w_dtype)
    case.x = adversarial_rows(wp, rng, 11).astype(np.uint8)
    case.x[0] = np.where(wp[:, -1] * np.sign(pair[0]) > 0, 255, 0)  # the unsafe pair at 255·129
    assert pack(case, "avx2").kernel == WIDE
    check_all_variants(case)


def test_pairs_start_at_k_zero():
    """Pairs are (0, 1), (2, 3), ..: a column 0, 127, 127, 0 is safe (its pairs are
    (0, 127) and (127, 0)) and all-255 rows stay exact; shifted by one k (so that 127 meets
    127 in a pair) it is not. A lone last k (odd K) pairs with the packing's 0, so any code
    is safe there; the same code with a partner past the bound is not."""
    col = np.array([0, 127, 127, 0], np.int8)
    w = np.repeat(col[:, None], 7, axis=1)
    assert _native.pack_weights_s8(w, 0, isa="avx2").kernel == NARROW
    case = Case(np.full((6, 4), 255, np.uint8), w, 9, 4, np.dtype(np.int32))
    check_all_variants(case)
    assert _native.pack_weights_s8(np.roll(w, 1, axis=0), 0, isa="avx2").kernel == WIDE
    for v in (127, -128):
        lone = np.zeros((259, 3), np.int8)
        lone[258, 1] = v
        lone[256:258, 1] = [-128, 0] if v < 0 else [127, 1]
        assert _native.pack_weights_s8(lone, 0, isa="avx2").kernel == NARROW, v
        check_all_variants(Case(np.full((5, 259), 255, np.uint8), lone, 0, -7, np.dtype(np.int32)))
        lone[256:258, 1] = [v, 2 if v > 0 else -1]  # P = 127 + 2 or Q = 128 + 1
        assert _native.pack_weights_s8(lone, 0, isa="avx2").kernel == WIDE, v
    # the other ISAs have one family each
    assert _native.pack_weights_s8(np.zeros((4, 4), np.int8), 0, isa="portable").kernel.endswith("__portable")


@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 3, 4, 5, 258, 259]), st.sampled_from([1, 3, 17]))
def test_the_family_choice_equals_the_twin(seed, K, N):
    """pack.cc::weights_pairs_fit_int16 against reference/qgemm.py pairs_fit_int16 on
    pair-safe tensors with a few codes moved (often across the bound), int8 and uint8."""
    rng = np.random.default_rng(seed)
    wp = pair_safe_codes(rng, K, N)
    for _ in range(rng.integers(0, 3)):
        k, n = rng.integers(0, K), rng.integers(0, N)
        wp[k, n] = np.clip(wp[k, n] + rng.integers(-3, 4), -128, 127)
    s8 = wp.astype(np.int8)
    u8 = (wp + 128).astype(np.uint8)
    want = NARROW if ref.pairs_fit_int16(s8) else WIDE
    assert ref.pairs_fit_int16(u8) == ref.pairs_fit_int16(s8)
    assert _native.pack_weights_s8(s8, 0, isa="avx2").kernel == want
    assert _native.pack_weights_u8(u8, 128, isa="avx2").kernel == want


@given(gemm_cases(), st.booleans())
def test_seven_bit_weights_every_shape_and_output_stage(case, unsigned_weights):
    """The hypothesis space of test_qgemm (tile edges, zero points per row / column,
    every output stage), with the weights mapped into the 7-bit range."""
    w = case.w.astype(np.int32)
    if case.w.dtype == np.uint8:
        w -= 128
    w7 = np.clip(w // 2, -64, 64)
    if unsigned_weights:
        case.w = (w7 + 128).astype(np.uint8)
        case.zw = np.clip(np.asarray(case.zw, np.int32) // 2 + 128, 0, 255) if np.ndim(case.zw) else 128 + 9
    else:
        case.w = w7.astype(np.int8)
        case.zw = np.clip(np.asarray(case.zw, np.int32), -128, 127) if np.ndim(case.zw) else -9
    assert pack(case, "avx2").kernel == NARROW
    check_all_variants(case)


@pytest.mark.parametrize("M", [37, 203])
def test_seven_bit_weights_between_the_l2_budgets(M):
    """B of ~610 KiB: over 3/4 of a 512 KiB L2 (Zen 3: 100-row blocks, B chunks in L1)
    and under the 1.5 MiB budget of the row-tiles-outer order (2 MiB L2 cores), so the
    blocking depends on the core; the bytes must not. K = 777 (not a multiple of 4:
    x' packed); 37 rows = 7 tiles of 5 + 2, 203 rows = 40 tiles of 5 + 3."""
    rng = np.random.default_rng(M)
    K, N = 777, 781
    x = rng.integers(0, 256, (M, K)).astype(np.uint8)
    w = rng.integers(-64, 65, (K, N)).astype(np.int8)
    zw = rng.integers(-64, 65, N).astype(np.int32)
    case = _stage(Case(x, w, 131, zw, np.dtype(np.uint8)), rng)
    assert pack(case, "avx2").kernel == NARROW
    check_all_variants(case)
