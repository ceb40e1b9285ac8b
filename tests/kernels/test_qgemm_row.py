"""One-row products on the avx2 7-bit family (``qgemm_row_avx2_narrow``, kernel.h).

A call with M = 1 on weights packed for ``qgemm_u8s8p_s32_5x16c4__avx2`` (7-bit weights,
or any int8 weights packed ``saturating=True`` for ONNX Runtime's pairs, docs/float-ops.md
(QM1)) sums each panel pair's whole K in registers and runs the tiles' output stage
inline. The sums are int32 and wrap, so their order changes no bit, and the output stage
is the tiles' per-lane operations. Failure signature guarded here: a last odd panel, a
partial panel (N % 16), K past one chunk or not a multiple of 4 (x' zero-padded), int8 x
(the +128 shift folded into the column terms), per-column zero points, float bias, or a
thread split that drops or repeats panels gives codes that differ from the tiles'.

Each case is checked two ways: against the twin (reference/integer_ops.py
``matmul_integer``, exact or with ``saturating_pairs``) for the int32 and float32 outputs,
and against the tiles themselves for every output type, by running the same row as row 0
of a 6-row product (one 5-row tile and a 1-row tile, both on the tile driver).
"""

from __future__ import annotations

import numpy as np
import pytest

from quanta.kernels import _native
from quanta.kernels.reference.integer_ops import matmul_integer

pytestmark = pytest.mark.skipif("avx2" not in _native.supported_isas(), reason="the 7-bit family is avx2's")

NARROW = "qgemm_u8s8p_s32_5x16c4__avx2"


@pytest.fixture(autouse=True)
def _avx2_kernels():
    """The 7-bit family is what avx2 packs; an AVX-512 VNNI CPU would pack for its own
    tile, so each test runs with the avx2 kernels selected and the CPU's choice restored."""
    _native.set_isa("avx2")
    try:
        yield
    finally:
        _native.clear_isa()


def _operands(rng: np.random.Generator, k: int, n: int, saturating: bool, x_signed: bool):
    """x [1, K] with large codes next to each other (pairs that leave int16 with full-range
    w), w [K, N]: full-range int8 for the saturating pack, [-64, 64] (zw included) else."""
    if x_signed:
        x = rng.integers(-128, 128, (1, k)).astype(np.int8)
    else:
        x = np.where(rng.random((1, k)) < 0.6, rng.integers(200, 256, (1, k)), rng.integers(0, 256, (1, k)))
        x = x.astype(np.uint8)
    if saturating:
        w = np.where(rng.random((k, n)) < 0.6, np.where(rng.random((k, n)) < 0.5, -128, 127), 0)
        w = (w + rng.integers(-20, 20, (k, n)) * (w == 0)).astype(np.int8)
    else:
        w = rng.integers(-60, 61, (k, n)).astype(np.int8)
    return x, w


@pytest.mark.parametrize("k", [7, 256, 259, 1030])
@pytest.mark.parametrize("n", [3, 16, 17, 33, 48, 1029])
@pytest.mark.parametrize("saturating", [True, False])
def test_qgemm_row_equals_twin_and_tiles_odd_panels_nonzero_zero_points(k, n, saturating):
    rng = np.random.default_rng(k * 7 + n * 3 + saturating)
    x, w = _operands(rng, k, n, saturating, x_signed=False)
    zx = 131
    zw = rng.integers(-4, 5, n).astype(np.int32)
    zw[0] = 3  # never all zero
    packed = _native.pack_weights_s8(w, zw, saturating=saturating)
    assert packed.kernel == NARROW
    expected = matmul_integer(x, w, np.uint8(zx), zw.astype(np.int8), saturating_pairs=saturating)
    if saturating and k >= 256:
        exact = matmul_integer(x, w, np.uint8(zx), zw.astype(np.int8))
        assert not np.array_equal(expected, exact)  # the pairs saturate on this data
    six = np.repeat(x, 6, axis=0)
    mult = rng.uniform(1e-4, 3e-4, n).astype(np.float32)
    fbias = rng.normal(0, 0.5, n).astype(np.float32)
    for threads in (1, 2):
        got = _native.qgemm(x, packed, zx, "int32", num_threads=threads)
        np.testing.assert_array_equal(got, expected)
        tiles = _native.qgemm(six, packed, zx, "int32", num_threads=threads)
        np.testing.assert_array_equal(got[0], tiles[0])

        f = _native.qgemm(x, packed, zx, "float32", multiplier=mult, num_threads=threads)
        np.testing.assert_array_equal(f, (expected.astype(np.float32) * mult).astype(np.float32))
        fb = _native.qgemm(x, packed, zx, "float32", multiplier=mult, float_bias=fbias, num_threads=threads)
        fb_tiles = _native.qgemm(
            six, packed, zx, "float32", multiplier=mult, float_bias=fbias, num_threads=threads
        )
        np.testing.assert_array_equal(fb[0], fb_tiles[0])
        assert not np.array_equal(fb, f)

        # uint8 output: sy from the accumulators' range, so the codes cover [0, 255]
        acc = expected.astype(np.float64)
        m_q = np.float32(250.0 / max(1.0, float(acc.max() - acc.min())))
        zy = int(np.clip(round(-float(acc.min()) * float(m_q)) + 2, 0, 255))
        q = _native.qgemm(
            x, packed, zx, "uint8", multiplier=np.full(n, m_q, np.float32), zy=zy, num_threads=threads
        )
        q_tiles = _native.qgemm(
            six, packed, zx, "uint8", multiplier=np.full(n, m_q, np.float32), zy=zy, num_threads=threads
        )
        np.testing.assert_array_equal(q[0], q_tiles[0])


@pytest.mark.parametrize("k, n", [(17, 33), (259, 49)])
def test_qgemm_row_int8_x_folds_the_shift(k, n):
    rng = np.random.default_rng(k + n)
    x, w = _operands(rng, k, n, saturating=False, x_signed=True)
    packed = _native.pack_weights_s8(w, -5)
    assert packed.kernel == NARROW
    expected = matmul_integer(x, w, np.int8(-7), np.int8(-5))
    for threads in (1, 2):
        got = _native.qgemm(x, packed, -7, "int32", num_threads=threads)
        np.testing.assert_array_equal(got, expected)
        tiles = _native.qgemm(np.repeat(x, 6, axis=0), packed, -7, "int32", num_threads=threads)
        np.testing.assert_array_equal(got[0], tiles[0])
