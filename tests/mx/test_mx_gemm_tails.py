"""The MXINT8 GEMM's tile edges against the twin (quanta/kernels/reference/mx.py mx_gemm),
on every ISA: row tails of the avx2 tile (6 rows: M = 1, 3, 7, 13), half-panel tails (16
columns: N = 1, 17, 33, 100), short last blocks (K = 31, 33, 259, 1000), extreme
elements and exponent codes, NaN (code 255) and all-zero blocks, 1 and 2 threads
(eqs. (MX5a)-(MX6), (MA1) of docs/quantization-math.md)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quanta.kernels import _native
from quanta.kernels.reference import mx
from tests.isa import assert_same, every_isa

E8 = ml_dtypes.float8_e8m0fnu


def _check(
    a: np.ndarray, a_c: np.ndarray, b: np.ndarray, b_c: np.ndarray, block: int, bias, **context
) -> None:
    """Native mx_gemm on every ISA, 1 and 2 threads, equal to the twin bit for bit (NaN
    where the twin has NaN)."""
    want = mx.mx_gemm(a, a_c.view(E8), b, b_c.view(E8), block, a_format="i8", b_format="i8", bias=bias)

    def run(isa: str) -> None:
        packed = _native.mx_pack_weights(b.view(np.uint8), b_c, "i8", block, isa=isa)
        for threads in (1, 2):
            got = _native.mx_gemm(a.view(np.uint8), a_c, "i8", packed, bias, num_threads=threads)
            assert_same(want, got, "mx_gemm i8", isa=isa, threads=threads, **context)

    every_isa(run)


def _case(rng: np.random.Generator, M: int, K: int, N: int, block: int = 32):
    nb = -(-K // block)
    a = rng.integers(-127, 128, (M, K)).astype(np.int8)
    b = rng.integers(-127, 128, (K, N)).astype(np.int8)
    # distinct codes per block, around 127 (scale 2^-6 per operand): sums stay normal
    a_c = rng.integers(100, 150, (M, nb)).astype(np.uint8)
    b_c = rng.integers(100, 150, (nb, N)).astype(np.uint8)
    bias = rng.standard_normal(N).astype(np.float32)
    return a, a_c, b, b_c, bias


@pytest.mark.parametrize("M", [1, 3, 7, 13])
@pytest.mark.parametrize("N", [1, 17, 33, 100])
@pytest.mark.parametrize("K", [31, 32, 33, 259, 1000])
def test_gemm_i8_row_column_and_block_tails(M, N, K):
    rng = np.random.default_rng(M * 10007 + N * 101 + K)
    a, a_c, b, b_c, bias = _case(rng, M, K, N)
    _check(a, a_c, b, b_c, 32, bias, M=M, N=N, K=K)
    _check(a, a_c, b, b_c, 32, None, M=M, N=N, K=K)


def test_gemm_i8_full_scale_elements():
    # every element ±127 (and −128 as bits allow): the largest block dots, |D_k| up to
    # 32·127² per block, in every row of a 6-row tile and its 1-row tail
    rng = np.random.default_rng(3)
    M, K, N = 7, 259, 33
    a = rng.choice(np.array([-127, 127], np.int8), size=(M, K))
    b = rng.choice(np.array([-127, 127], np.int8), size=(K, N))
    a[0] = 127
    b[:, 0] = 127
    b[:, 1] = -128
    nb = -(-K // 32)
    a_c = rng.integers(110, 140, (M, nb)).astype(np.uint8)
    b_c = rng.integers(110, 140, (nb, N)).astype(np.uint8)
    _check(a, a_c, b, b_c, 32, rng.standard_normal(N).astype(np.float32))


@pytest.mark.parametrize("lo,hi", [(0, 3), (251, 254), (0, 254)])
def test_gemm_i8_exponent_codes_near_the_ends(lo, hi):
    # codes near 0 (scales 2^-133: products and sums subnormal or zero) and near 254
    # (2^121: products overflow to ±Inf, Inf − Inf sums give NaN), and both mixed
    rng = np.random.default_rng(lo * 256 + hi)
    M, K, N = 13, 100, 17
    a, _, b, _, bias = _case(rng, M, K, N)
    nb = -(-K // 32)
    a_c = rng.integers(lo, hi + 1, (M, nb)).astype(np.uint8)
    b_c = rng.integers(lo, hi + 1, (nb, N)).astype(np.uint8)
    _check(a, a_c, b, b_c, 32, bias, lo=lo, hi=hi)


def test_gemm_i8_nan_and_all_zero_blocks():
    # code 255 in A (row 2, block 1) and in B (column 5, block 0; column 16, the second
    # half panel's first, block 3): NaN from that block on, as the twin; all-zero blocks
    # (code 0, zero elements) and a −0 bias
    rng = np.random.default_rng(7)
    M, K, N = 7, 130, 33
    a, a_c, b, b_c, bias = _case(rng, M, K, N)
    a_c[2, 1] = 255
    a[2, 32:64] = 0
    b_c[0, 5] = 255
    b[:32, 5] = 0
    b_c[3, 16] = 255
    a[4, :] = 0
    a_c[4, :] = 0
    b[32:64, 9] = 0
    b_c[1, 9] = 0
    bias[4] = -0.0
    _check(a, a_c, b, b_c, 32, bias)
    _check(a, a_c, b, b_c, 32, None)


def test_gemm_i8_negative_zero_sums():
    # a row of all-zero elements under negative-signed products: −0 sums stay −0 only if
    # the first block's product is the sum (eq. (MX6)), not 0 + p
    M, K, N = 3, 64, 17
    a = np.zeros((M, K), np.int8)
    b = np.full((K, N), -5, np.int8)
    a_c = np.full((M, 2), 127, np.uint8)
    b_c = np.full((2, N), 127, np.uint8)
    _check(a, a_c, b, b_c, 32, None)


@settings(max_examples=25, deadline=None)
@given(
    M=st.integers(1, 20),
    K=st.integers(1, 300),
    N=st.integers(1, 70),
    block=st.sampled_from([4, 20, 32, 64]),
    seed=st.integers(0, 2**31 - 1),
)
def test_gemm_i8_hypothesis_shapes(M, K, N, block, seed):
    rng = np.random.default_rng(seed)
    a, a_c, b, b_c, bias = _case(rng, M, K, N, block)
    _check(a, a_c, b, b_c, block, bias, M=M, K=K, N=N, blk=block)
