"""Eq. (12o2) (docs/debugger.md): the native 8-bit Gram product computes only the column
blocks on and above the diagonal and mirrors the rest. Failure signature it guards
against: an H whose lower blocks are stale scratch (a mirror that skips a block, or a
block edge off by one when K is not a multiple of GRAM_BLOCK), which GPTQ would factor
without complaint and round every weight of the layer against."""

from __future__ import annotations

import numpy as np
import pytest

from quanta.quantize import rounding
from quanta.quantize.rounding import GRAM_BLOCK, gram_u8_into


def _reference(x: np.ndarray, o: int) -> np.ndarray:
    """(x − o)(x − o)ᵀ by float64 products: exact, every partial sum is an integer below
    255²·_GRAM_STEP < 2^31 < 2^53, whatever the BLAS's summation order."""
    r = x.astype(np.float64) - o
    return (r @ r.T).astype(np.int64)


@pytest.mark.parametrize(
    "k, n, o",
    [
        (33, 17, 0),  # under 2·GRAM_BLOCK: one whole product
        (2 * GRAM_BLOCK - 1, 259, 255),  # the largest K of one whole product
        (2 * GRAM_BLOCK, 300, 131),  # exactly two blocks, no remainder
        (2 * GRAM_BLOCK + 1, 301, 7),  # a one-column last block
        (3 * GRAM_BLOCK + 17, 1031, 128),  # an odd remainder block
        (1031, 3, 1),  # shallow: fewer positions than one GEMM tile
    ],
)
def test_gram_u8_blocks_equal_the_whole_product(k, n, o):
    rng = np.random.default_rng(k * 7 + n)
    x = rng.integers(0, 256, (k, n), dtype=np.uint8)
    # scratch full of garbage: every entry of the result must be written
    acc = np.full((k, k), -(2**31) + 5, np.int32)
    got = gram_u8_into(acc, x, o)
    want = _reference(x, o)
    np.testing.assert_array_equal(got, want)  # 0: integer sums, exact in any order
    np.testing.assert_array_equal(got, got.T)


def test_gram_u8_at_the_int32_limit():
    """The longest chunk _gram_into hands over, every product at its extreme (255²):
    sums near 2^31 stay exact in the blocked form as in the whole product."""
    k, n = 2 * GRAM_BLOCK + 3, rounding._GRAM_STEP
    x = np.zeros((k, n), np.uint8)
    x[::2] = 255  # o = 0: the even rows' diagonal entries are 255²·n, just under 2^31
    x[1::2, : n // 2] = 255
    acc = np.empty((k, k), np.int32)
    got = gram_u8_into(acc, x, 0)
    want = _reference(x, 0)
    assert want.max() > 2**31 - 255 * 255 - 1  # the chunk really sits at the limit
    np.testing.assert_array_equal(got, want)


def test_gram_u8_strided_codes_equal_the_whole_product():
    """A strided view (every step-th position of eq. (12o)) is read as its values."""
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (3 * GRAM_BLOCK + 5, 2 * 613), dtype=np.uint8)[:, ::2]
    acc = np.empty((x.shape[0],) * 2, np.int32)
    np.testing.assert_array_equal(gram_u8_into(acc, x, 99), _reference(x, 99))
