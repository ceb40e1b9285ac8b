"""ONNX Runtime's saturating u8·s8 pairs (docs/float-ops.md (QM1)) on the native GEMM.

``pack_weights_s8(..., saturating=True)`` packs int8 weights of any range for the avx2
``vpmaddubsw`` family (``qgemm_u8s8p_s32_5x16c4__avx2``): the pair sums of raw uint8 x and
int8 w saturate to int16 as MLAS's ``MlasGemmU8S8KernelAvx2`` (and its GEMV) computes them on
x86 without VNNI. Twin: reference/integer_ops.py ``matmul_integer(saturating_pairs=True)``
(the exact sum plus mlas_qconv.saturation_correction). Bit-exact at 1 and 2 threads, odd K
past 258, N of 3 / 7 / 17, M at the 5-row tile's edges and at 1, zero points that are not 0;
every case has both saturating and non-saturating pairs. The DynamicQuantizeLSTM kernel
(``_native.dq_lstm``) on such weights equals its twin (reference/ms_lstm.py) with
``saturating_pairs``, odd hidden sizes, bidirectional.
"""

from __future__ import annotations

import numpy as np
import pytest

from quanta.kernels import _native
from quanta.kernels.reference.integer_ops import matmul_integer, saturating_pairs_correction
from quanta.kernels.reference.ms_lstm import dynamic_quantize_lstm
from quanta.targets.native.recurrent import _pack_direction

pytestmark = pytest.mark.skipif(
    "avx2" not in _native.supported_isas(), reason="the saturating pairs are the avx2 family's"
)

NARROW = "qgemm_u8s8p_s32_5x16c4__avx2"


def pair_kinds(x: np.ndarray, w: np.ndarray) -> tuple[int, int]:
    """(pairs that leave int16, pairs that stay inside) of x [M, K] times w [K, N]."""
    k = x.shape[1]
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, k % 2)))
    wp = np.pad(w.astype(np.int64), ((0, k % 2), (0, 0)))
    pairs = xp[:, 0::2, None] * wp[None, 0::2] + xp[:, 1::2, None] * wp[None, 1::2]  # [M, J, N]
    out = int(np.count_nonzero(np.abs(pairs + 0.5) > 32767.5))
    return out, pairs.size - out


def extreme_operands(rng: np.random.Generator, m: int, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """x near 255 and w near ±128 on most entries (pairs leave int16 both ways), random
    elsewhere, and a few rows of small codes (pairs that stay inside)."""
    x = rng.integers(0, 256, (m, k))
    x = np.where(rng.random((m, k)) < 0.7, rng.integers(200, 256, (m, k)), x)
    if m > 1:
        x[m // 2] = rng.integers(0, 60, k)  # a row whose pairs never saturate
    w = rng.integers(-128, 128, (k, n))
    big = rng.random((k, n)) < 0.6
    w = np.where(big, np.where(rng.random((k, n)) < 0.5, -128, 127), w)
    return x.astype(np.uint8), w.astype(np.int8)


@pytest.mark.parametrize("m", [1, 5, 6, 11])
@pytest.mark.parametrize("k", [7, 259, 517])
@pytest.mark.parametrize("n", [3, 7, 17])
@pytest.mark.parametrize("zx, zw", [(0, 0), (131, 0), (3, -5)])
def test_saturating_pack_equals_the_twin(m, k, n, zx, zw):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    x, w = extreme_operands(rng, m, k, n)
    expected = matmul_integer(x, w, np.uint8(zx), np.int8(zw), saturating_pairs=True)
    assert min(pair_kinds(x, w)) > 0  # both kinds of pairs
    assert (saturating_pairs_correction(x, w) != 0).any()
    assert not np.array_equal(expected, matmul_integer(x, w, np.uint8(zx), np.int8(zw)))
    packed = _native.pack_weights_s8(w, zw, saturating=True)
    assert packed.isa == "avx2" and packed.kernel == NARROW
    for threads in (1, 2):
        got = _native.qgemm(x, packed, zx, "int32", num_threads=threads)
        np.testing.assert_array_equal(got, expected)


def test_per_column_zero_points_and_float_output():
    rng = np.random.default_rng(7)
    m, k, n = 9, 301, 17
    x, w = extreme_operands(rng, m, k, n)
    zw = rng.integers(-9, 9, n).astype(np.int32)
    packed = _native.pack_weights_s8(w, zw, saturating=True)
    mult = rng.uniform(1e-4, 2e-4, n).astype(np.float32)
    expected = matmul_integer(x, w, np.uint8(17), zw.astype(np.int8), saturating_pairs=True)
    got = _native.qgemm(x, packed, 17, "float32", multiplier=mult)
    np.testing.assert_array_equal(got, (expected.astype(np.float32) * mult).astype(np.float32))


def test_saturating_is_refused_where_it_is_not_the_avx2_family():
    w = np.ones((4, 3), np.int8)
    with pytest.raises(ValueError, match="avx2"):
        _native.pack_weights_s8(w, 0, isa="portable", saturating=True)
    # without the flag, full-range weights stay on the exact int16 family
    full = np.full((4, 3), -128, np.int8)
    assert _native.pack_weights_s8(full, 0, isa="avx2").kernel != NARROW


@pytest.mark.parametrize("hidden, n_in, direction", [(7, 301, "bidirectional"), (17, 259, "forward")])
def test_dq_lstm_native_equals_the_saturating_twin(hidden, n_in, direction):
    rng = np.random.default_rng(hidden + n_in)
    d = 2 if direction == "bidirectional" else 1
    t, b = 5, 3
    x = rng.normal(0, 2, (t, b, n_in)).astype(np.float32)
    x[:, :, ::2] = np.abs(x[:, :, ::2]) + 3  # large codes next to each other
    w = np.where(rng.random((d, n_in, 4 * hidden)) < 0.6, 127, rng.integers(-128, 128, (d, n_in, 4 * hidden)))
    r = np.where(
        rng.random((d, hidden, 4 * hidden)) < 0.6, -128, rng.integers(-128, 128, (d, hidden, 4 * hidden))
    )
    w, r = w.astype(np.int8), r.astype(np.int8)
    # scales that keep the gates' pre-activations of order 1 (not all saturated by the
    # activations, where a different sum would not show)
    ws = rng.uniform(1e-6, 3e-6, (d, 4 * hidden)).astype(np.float32)
    rs = np.full(d, 3e-4, np.float32)
    zp = np.zeros(d, np.int8)
    bias = rng.normal(0, 0.1, (d, 8 * hidden)).astype(np.float32)
    lens = np.array([t, t - 2, 1], np.int32)
    args = (x, w, r, bias, lens, None, None, None, ws, zp, rs, zp)
    expected = dynamic_quantize_lstm(*args, hidden_size=hidden, direction=direction, saturating_pairs=1)
    exact = dynamic_quantize_lstm(*args, hidden_size=hidden, direction=direction)
    assert not np.array_equal(expected[0], exact[0])  # the pairs saturate on this data
    packed_w = [_pack_direction(w[i], 0, True) for i in range(d)]
    packed_r = [_pack_direction(r[i], 0, True) for i in range(d)]
    r_mult = np.repeat(rs[:, None], 4 * hidden, axis=1).astype(np.float32)
    fused = np.ascontiguousarray(bias[:, : 4 * hidden] + bias[:, 4 * hidden :])
    for threads in (1, 2):
        got = _native.dq_lstm(
            x,
            packed_w,
            packed_r,
            ws,
            r_mult,
            fused,
            None,
            None,
            None,
            lens,
            direction=direction,
            clip=float(np.finfo(np.float32).max),
            input_forget=False,
            want_y=True,
            num_threads=threads,
        )
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_array_equal(g, e)
