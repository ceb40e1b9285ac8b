"""The AVX2 int8 GEMM families on the data that breaks ``vpmaddubsw``.

ONNX Runtime's AVX2 kernel (MLAS ``MlasGemmU8S8KernelAvx2``) adds two u8·s8 products
into a saturating int16: ``255·(−128) + 255·(−128) = −65280`` becomes ``−32768``. quanta's
avx2 ISA has two families (docs/kernels.md "AVX2"):

- ``qgemm_u8s8_s32_6x16c2__avx2`` for any int8 weights: int16 operands and ``vpmaddwd``,
  exact by construction;
- ``qgemm_u8s7_s32_5x16c4__avx2``, chosen at packing time when every ``w'`` is in
  [−64, 64] (``Recipe.weight_bits = 7``): ``vpmaddubsw``, exact because a pair is at most
  ``2·255·64 = 32640``.

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
NARROW = "qgemm_u8s7_s32_5x16c4__avx2"


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


def test_one_weight_outside_seven_bits_keeps_the_int16_family():
    """The family follows the data: one w' of 65 (or −65, or a uint8 193) is enough to
    need vpmaddwd; 64 / −64 are the last values the vpmaddubsw family takes."""
    w = np.zeros((259, 7), np.int8)
    assert _native.pack_weights_s8(w, 0, isa="avx2").kernel == NARROW
    for v in (65, -65, 127, -128):
        w[258, 6] = v
        assert _native.pack_weights_s8(w, 0, isa="avx2").kernel == WIDE, v
    for v in (64, -64):
        w[258, 6] = v
        assert _native.pack_weights_s8(w, 0, isa="avx2").kernel == NARROW, v
    wu = np.full((5, 3), 128 + 64, np.uint8)  # w' = w − 128 = 64
    assert _native.pack_weights_u8(wu, 128, isa="avx2").kernel == NARROW
    wu[0, 0] = 128 + 65
    assert _native.pack_weights_u8(wu, 128, isa="avx2").kernel == WIDE
    # the other ISAs have one family each
    assert _native.pack_weights_s8(np.zeros((4, 4), np.int8), 0, isa="portable").kernel.endswith("__portable")


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
