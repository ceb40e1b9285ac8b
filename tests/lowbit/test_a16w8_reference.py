"""The A16W8 twins (quanta/kernels/reference/a16w8.py) against loops over Python integers.

Exact: eq. (A1) is a sum of integer products (Python ints: no overflow), eq. (A4) the
float32 requantization every quantized op shares. The accumulators here exceed int32 on
purpose (uint16 activations far from their zero point, reductions of 300+): an int32
accumulator would wrap and these tests would fail.
"""

from __future__ import annotations

import numpy as np
import pytest

from quanta.kernels.reference.a16w8 import qlinear_conv16, qlinear_matmul16
from quanta.kernels.reference.registry import OpError, get_op
from quanta.kernels.reference.requant import requant_multiplier, requantize


def _loops_matmul(a, za, b, zb):
    m, k = a.shape
    n = b.shape[1]
    zb = np.broadcast_to(np.asarray(zb).reshape(-1), (n,))
    acc = np.zeros((m, n), object)
    for i in range(m):
        for j in range(n):
            acc[i, j] = sum((int(a[i, t]) - int(za)) * (int(b[t, j]) - int(zb[j])) for t in range(k))
    return acc


@pytest.mark.parametrize(
    ("a_dt", "b_dt", "y_dt"),
    [
        (np.uint16, np.int8, np.uint16),
        (np.int16, np.int8, np.int16),
        (np.uint16, np.uint16, np.uint8),
        (np.int16, np.int16, np.int8),
        (np.uint8, np.int16, np.int16),
    ],
)
def test_matmul16_is_exact_beyond_int32(a_dt, b_dt, y_dt):
    rng = np.random.default_rng(3)
    m, k, n = 3, 301, 7
    ia, ib = np.iinfo(a_dt), np.iinfo(b_dt)
    a = rng.integers(ia.min, ia.max + 1, (m, k)).astype(a_dt)
    a[0] = ia.max  # one row far from its zero point: |acc| > 2^31
    b = rng.integers(ib.min, ib.max + 1, (k, n)).astype(b_dt)
    b[:, 0] = ib.max
    za = a_dt(ia.min + (ia.max - ia.min) // 3)
    zb = rng.integers(ib.min, ib.max + 1, n).astype(b_dt)
    zb[0] = ib.min  # column 0: every w - zw at its largest
    acc = _loops_matmul(a, za, b, zb)
    assert max(abs(int(v)) for v in acc.ravel()) > 2**31  # the case int32 gets wrong
    sb = rng.uniform(1e-3, 2e-3, n).astype(np.float32)
    y_zp = np.iinfo(y_dt).min + 5
    iy = np.iinfo(y_dt)
    sy = np.float32(float(np.max(np.abs(acc.astype(np.float64)))) * 0.02 * 1e-3 * 2 / (iy.max - iy.min))
    got = qlinear_matmul16(a, np.float32(0.02), za, b, sb, zb, sy, y_dt(y_zp))
    m_ = requant_multiplier(np.float32(0.02), sb, sy)
    want = requantize(acc.astype(np.int64), m_, y_zp, y_dt)
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) > 10  # the output range is used, not saturated


def test_matmul16_bias_and_per_column_requant():
    a = np.array([[65535, 0, 40000]], np.uint16)
    b = np.array([[1, -2], [3, 4], [-5, 6]], np.int8)
    bias = np.array([100, -7], np.int32)
    got = qlinear_matmul16(
        a, 1.0, 32768, b, np.array([1.0, 0.5], np.float32), np.array([0, 1], np.int8), 8.0, np.int16(3), bias
    )
    acc0 = (65535 - 32768) * 1 + (0 - 32768) * 3 + (40000 - 32768) * -5 + 100
    acc1 = (65535 - 32768) * -3 + (0 - 32768) * 3 + (40000 - 32768) * 5 - 7
    want = [
        int(np.rint(np.float32(acc0) * np.float32(0.125))) + 3,
        int(np.rint(np.float32(acc1) * np.float32(0.0625))) + 3,
    ]
    assert got.tolist() == [want]


def test_conv16_matches_loops_with_padding_groups_and_per_channel_weights():
    rng = np.random.default_rng(7)
    x = rng.integers(0, 65536, (2, 6, 5, 7)).astype(np.uint16)
    w = rng.integers(-128, 128, (9, 2, 3, 3)).astype(np.int8)  # group 3: 2 input channels each
    zx, zw = np.uint16(31000), rng.integers(-9, 10, 9).astype(np.int8)
    attrs = dict(pads=[1, 0, 2, 1], strides=[2, 1], dilations=[1, 2])
    sw = rng.uniform(0.5, 1.5, 9).astype(np.float32)
    got = qlinear_conv16(x, np.float32(0.01), zx, w, sw, zw, np.float32(40.0), np.int16(-2), group=3, **attrs)
    from quanta.kernels.reference.conv_geometry import conv_attrs

    g = conv_attrs(x.shape, w.shape[2:], **attrs)
    acc = np.zeros((2, 9, *g.out_shape), np.int64)
    for n_ in range(2):
        for mo in range(9):
            grp = mo // 3
            for oy in range(g.out_shape[0]):
                for ox in range(g.out_shape[1]):
                    t = 0
                    for c in range(2):
                        for ky in range(3):
                            for kx in range(3):
                                iy, ix = oy * 2 - 1 + ky, ox - 0 + 2 * kx
                                xv = (
                                    int(x[n_, grp * 2 + c, iy, ix]) - 31000
                                    if 0 <= iy < 5 and 0 <= ix < 7
                                    else 0
                                )
                                t += xv * (int(w[mo, c, ky, kx]) - int(zw[mo]))
                    acc[n_, mo, oy, ox] = t
    m_ = requant_multiplier(np.float32(0.01), sw.reshape(9, 1, 1), np.float32(40.0))
    np.testing.assert_array_equal(got, requantize(acc, m_, -2, np.int16))


def test_ops_refuse_bad_types_naming_the_input():
    op = get_op("QLinearMatMul16", "quanta")
    a = np.zeros((2, 3), np.uint16)
    with pytest.raises(OpError, match="b_zero_point: expected the type of b"):
        op(
            None,
            a,
            np.float32(1),
            np.uint16(0),
            np.zeros((3, 2), np.int8),
            np.float32(1),
            np.uint8(0),
            np.float32(1),
            np.uint16(0),
        )
    with pytest.raises(OpError, match="a: expected uint8, int8, uint16 or int16, got int32"):
        op(
            None,
            a.astype(np.int32),
            np.float32(1),
            np.int32(0),
            np.zeros((3, 2), np.int8),
            np.float32(1),
            np.int8(0),
            np.float32(1),
            np.uint16(0),
        )
