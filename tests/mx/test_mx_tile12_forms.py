"""The avx512vnni MXINT8 12-row tile in each of its rescale forms (mx.h Tile12:
two 6-row halves with vscalefps, the halves with an fma, one 12-row pass with the float
sums in L1), forced in turn with ``_native.mx_set_tile12``: each bit-exact with the twin
(quanta/kernels/reference/mx.py mx_gemm, eqs. (MX5a)-(MX6)) on the cases that reach the
fast tile (full 12-row tiles, block 32, codes in the offset range) and on both sides of
its code-range tests. Skipped where the CPU has no AVX-512 VNNI."""

from __future__ import annotations

import numpy as np
import pytest

from quanta.kernels import _native
from quanta.kernels.reference import mx
from tests.mx import test_mx_native as base

FORMS = ["halves_scalef", "halves_fma", "wide"]

pytestmark = pytest.mark.skipif(
    "avx512vnni" not in _native.supported_isas(), reason="the 12-row tile runs on avx512vnni only"
)


@pytest.fixture(params=FORMS)
def form(request):
    _native.mx_set_tile12(request.param)
    assert _native.mx_tile12() == request.param
    yield request.param
    _native.mx_set_tile12("")


@pytest.mark.parametrize(
    "ca,cb",
    [(70, 69), (70, 70), (181, 181), (181, 182), (140, 6), (140, 7), (120, 237), (120, 238), (3, 250)],
)
def test_code_range_edges(form, ca, cb):
    base.test_gemm_i8_scale_products_at_the_normal_range_edges("avx512vnni", ca, cb)


def test_extreme_block_dots(form):
    base.test_gemm_i8_extreme_block_dots("avx512vnni")


def test_zero_blocks_and_negative_zero(form):
    base.test_gemm_i8_zero_blocks_and_negative_zero("avx512vnni")


@pytest.mark.parametrize("M", [101, 24])
def test_row_blocks(form, M):
    base.test_gemm_i8_row_blocks_and_k_chunks("avx512vnni", M)


def test_distinct_codes_per_row_and_column(form):
    # every row and every column its own codes (107..147), K = 1056 (33 blocks), 36 rows
    # (three full tiles), 71 columns (a 7-column last panel), a bias: the fast tile's per
    # row scale (A's power, broadcast per row) and per column offsets must meet the right
    # blocks
    rng = np.random.default_rng(41)
    M, K, N = 36, 1056, 71
    nb = K // 32
    a = rng.integers(-127, 128, (M, K)).astype(np.int8)
    b = rng.integers(-128, 128, (K, N)).astype(np.int8)
    a_c = (107 + (np.arange(M)[:, None] * 3 + np.arange(nb)[None, :] * 5) % 41).astype(np.uint8)
    b_c = (107 + (np.arange(nb)[:, None] * 7 + np.arange(N)[None, :] * 2) % 41).astype(np.uint8)
    bias = rng.standard_normal(N).astype(np.float32)
    want = mx.mx_gemm(*base._with_codes(a, a_c, b, b_c), 32, bias=bias)
    packed = _native.mx_pack_weights(base._bits(b), b_c, "i8", 32, isa="avx512vnni")
    for threads in (1, 2):
        got = _native.mx_gemm(base._bits(a), a_c, "i8", packed, bias, num_threads=threads)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (form, threads)


def test_form_names():
    _native.mx_set_tile12("wide")
    assert _native.mx_tile12() == "wide"
    _native.mx_set_tile12("")
    assert _native.mx_tile12() == "auto"
    with pytest.raises(ValueError, match="halves_scalef"):
        _native.mx_set_tile12("narrow")
