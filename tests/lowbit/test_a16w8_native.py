"""Native A16W8 kernels (quanta/kernels/cpp/a16w8) against their twins, bit-exact.

Every ISA the CPU supports (``_native.set_isa``), 1 and 2 threads (identical bytes),
through the binders of quanta/targets/native/a16w8.py (packing, eq. (A3) terms). Shapes:
reductions across the int32 flush boundary (256 values of k, a16w8.h) and past it (258,
300, 777), column counts around the 32-column tile (1, 17, 31, 33), rows around the
4-row tile; zero points far from 0, per-channel weights with distinct scales.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from quanta.kernels import _native
from quanta.kernels.reference.a16w8 import qlinear_conv16, qlinear_matmul16
from quanta.kernels.reference.requant import requant_multiplier
from quanta.targets.native.a16w8 import _SHORT, _offset, pack_weight, weight_terms
from tests.isa import every_isa

F32 = np.float32
ACT = [np.uint16, np.int16, np.uint8, np.int8]
WGT = [np.int8, np.uint8, np.int16, np.uint16]
OUT = [np.uint16, np.int16, np.uint8, np.int8]


def _rand(rng, dt, shape):
    i = np.iinfo(dt)
    return rng.integers(i.min, i.max + 1, shape).astype(dt)


def _case(rng, m, k, n, a_dt, w_dt, y_dt, per_channel=True, bias=True):
    a = _rand(rng, a_dt, (m, k))
    w = _rand(rng, w_dt, (k, n))
    za = _rand(rng, a_dt, ())
    zw = _rand(rng, w_dt, (n,)) if per_channel else np.full(n, _rand(rng, w_dt, ()), w_dt)
    sw = rng.uniform(0.5, 2.0, n).astype(F32) if per_channel else np.full(n, F32(0.9), F32)
    b = rng.integers(-(2**20), 2**20, n).astype(np.int32) if bias else None
    # an output scale that spreads the accumulators over the output range
    acc_span = (
        np.sqrt(k) * (np.iinfo(a_dt).max - np.iinfo(a_dt).min) * (np.iinfo(w_dt).max - np.iinfo(w_dt).min) / 4
    )
    iy = np.iinfo(y_dt)
    sa = F32(0.003)
    sy = F32(float(sa) * acc_span / (iy.max - iy.min))
    zy = y_dt((int(iy.min) + int(iy.max)) // 2 + 3)
    return a, sa, za, w, sw, zw, sy, zy, b


def _native_matmul(a, sa, za, w, sw, zw, sy, zy, b, threads):
    k, n = w.shape
    wk = w.astype(np.int64) - _offset(w.dtype)
    dw, cw = weight_terms(wk, w.dtype, zw, n)
    mult = np.ascontiguousarray(requant_multiplier(sa, sw, sy), F32)
    return _native.a16w8_matmul(
        a,
        pack_weight(wk),
        k,
        n,
        dw,
        cw,
        None if b is None else b.astype(np.int64),
        mult,
        int(za),
        int(zy),
        _SHORT[np.dtype(zy.dtype)],
        num_threads=threads,
    )


@pytest.mark.parametrize("k", [1, 2, 255, 256, 257, 258, 300, 777])
@pytest.mark.parametrize(("a_dt", "w_dt", "y_dt"), list(zip(ACT, WGT, OUT)))
def test_matmul_matches_twin_every_isa(k, a_dt, w_dt, y_dt):
    rng = np.random.default_rng(k)
    case = _case(rng, 9, k, 33, a_dt, w_dt, y_dt)
    want = qlinear_matmul16(*case)

    def check(isa):
        for threads in (1, 2):
            got = _native_matmul(*case, threads)
            np.testing.assert_array_equal(got, want, err_msg=f"{isa} threads={threads} k={k}")

    every_isa(check)
    assert len(np.unique(want)) > 5


@given(
    m=st.integers(1, 13),
    k=st.integers(1, 600),
    n=st.integers(1, 70),
    types=st.sampled_from([(a, w, y) for a in ACT for w in WGT for y in OUT]),
    per_channel=st.booleans(),
    bias=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_matmul_hypothesis(m, k, n, types, per_channel, bias, seed):
    rng = np.random.default_rng(seed)
    case = _case(rng, m, k, n, *types, per_channel=per_channel, bias=bias)
    want = qlinear_matmul16(*case)
    every_isa(lambda isa: np.testing.assert_array_equal(_native_matmul(*case, 1), want, err_msg=isa))


def test_extreme_operands_stay_exact():
    """Every a at −32768 (after the uint16 offset: a = 0) against weights 255 and −128: the
    largest products (eq. (A2) bound), K = 4099 (sixteen int32 flushes and a tail)."""
    k, n = 4099, 32
    a = np.zeros((5, k), np.uint16)
    w = np.full((k, n), 255, np.uint8)
    w[:, 1::2] = 0
    case = (
        a,
        F32(1.0),
        np.uint16(65535),
        w,
        np.full(n, F32(1.0)),
        np.zeros(n, np.uint8),
        F32(2.0**28),
        np.int16(0),
        None,
    )
    want = qlinear_matmul16(*case)
    every_isa(lambda isa: np.testing.assert_array_equal(_native_matmul(*case, 2), want, err_msg=isa))
    assert want[0, 0] == round(-65535 * 255 * k / 2**28)


def _native_conv(x, sx, zx, w, sw, zw, sy, zy, b, threads, group=1, **attrs):
    from quanta.kernels.reference.conv_geometry import conv_attrs
    from quanta.targets.native import a16w8 as binder

    m_out = w.shape[0]
    cg, mg = w.shape[1], m_out // group
    kk = int(np.prod(w.shape[2:]))
    g = conv_attrs(x.shape, w.shape[2:], **attrs)
    mult = np.ascontiguousarray(requant_multiplier(sx, sw, sy), F32)
    b64 = None if b is None else b.astype(np.int64)
    common = dict(num_threads=threads)
    if group > 1 and cg == 1 and mg == 1:
        wd = (w.reshape(m_out, kk).astype(np.int64) - zw.astype(np.int64)[:, None]).astype(np.int32)
        return _native.a16w8_conv2d_depthwise(
            x,
            int(zx),
            wd,
            g.kernel_shape,
            g.strides,
            g.dilations,
            (g.pads[0], g.pads[1]),
            g.out_shape,
            b64,
            mult,
            int(zy),
            _SHORT[np.dtype(zy.dtype)],
            **common,
        )
    wk = (w.astype(np.int64) - _offset(w.dtype)).reshape(group, mg, cg * kk).transpose(0, 2, 1)
    split = any(len(binder._planes(wk[i])) == 2 for i in range(group))
    packed = np.stack([binder.pack_rows(wk[i], split) for i in range(group)])
    dw, cw = weight_terms(wk.transpose(1, 0, 2).reshape(cg * kk, m_out), w.dtype, zw, m_out)
    return _native.a16w8_conv2d(
        x,
        int(zx),
        packed,
        m_out,
        g.kernel_shape,
        g.strides,
        g.dilations,
        (g.pads[0], g.pads[1]),
        g.out_shape,
        group,
        dw,
        cw,
        b64,
        mult,
        int(zy),
        _SHORT[np.dtype(zy.dtype)],
        **common,
    )


@given(
    n=st.integers(1, 2),
    cg=st.sampled_from([1, 3, 7, 17]),
    mg=st.sampled_from([1, 5, 33]),
    group=st.sampled_from([1, 2, 3]),
    hw=st.tuples(st.integers(1, 9), st.integers(1, 9)),
    kernel=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    stride=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    dil=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    pads=st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)),
    types=st.sampled_from([(a, w, y) for a in ACT[:2] for w in WGT for y in OUT[:2]]),
    seed=st.integers(0, 2**31),
)
def test_conv_hypothesis(n, cg, mg, group, hw, kernel, stride, dil, pads, types, seed):
    a_dt, w_dt, y_dt = types
    ext = [(kernel[i] - 1) * dil[i] + 1 for i in range(2)]
    if hw[0] + pads[0] + pads[2] < ext[0] or hw[1] + pads[1] + pads[3] < ext[1]:
        return  # no output
    rng = np.random.default_rng(seed)
    c, m_out = cg * group, mg * group
    x = _rand(rng, a_dt, (n, c, *hw))
    w = _rand(rng, w_dt, (m_out, cg, *kernel))
    zx, zw = _rand(rng, a_dt, ()), _rand(rng, w_dt, (m_out,))
    sw = rng.uniform(0.5, 2.0, m_out).astype(F32)
    b = rng.integers(-(2**20), 2**20, m_out).astype(np.int32)
    k = cg * kernel[0] * kernel[1]
    span = np.sqrt(k) * 65536.0 * (np.iinfo(w_dt).max - np.iinfo(w_dt).min) / 4
    sy = F32(0.003 * span / 65535)
    zy = y_dt(7)
    attrs = dict(strides=list(stride), dilations=list(dil), pads=list(pads))
    args = (x, F32(0.003), zx, w, sw, zw, sy, zy, b)
    want = qlinear_conv16(*args, group=group, **attrs)
    every_isa(
        lambda isa: np.testing.assert_array_equal(
            _native_conv(*args, 1, group=group, **attrs), want, err_msg=isa
        )
    )
    np.testing.assert_array_equal(_native_conv(*args, 2, group=group, **attrs), want)


def test_conv_long_reduction_and_threads():
    """K = 64·3·3 = 576 > 258 (two int32 flushes), 17 output channels, uint16 in, uint8 out."""
    rng = np.random.default_rng(11)
    x = _rand(rng, np.uint16, (1, 64, 10, 9))
    w = _rand(rng, np.int8, (17, 64, 3, 3))
    sw = rng.uniform(0.5, 2.0, 17).astype(F32)
    args = (
        x,
        F32(0.001),
        np.uint16(33000),
        w,
        sw,
        _rand(rng, np.int8, (17,)),
        F32(60.0),
        np.uint8(128),
        None,
    )
    want = qlinear_conv16(*args, pads=[1, 1, 1, 1])
    assert len(np.unique(want)) > 20
    every_isa(
        lambda isa: [
            np.testing.assert_array_equal(
                _native_conv(*args, t, pads=[1, 1, 1, 1]), want, err_msg=f"{isa} {t}"
            )
            for t in (1, 2)
        ]
    )


def test_binding_errors_name_the_argument():
    wk = np.zeros((5, 3), np.int64)
    packed = pack_weight(wk)
    z = np.zeros(3, np.int64)
    m = np.ones(3, F32)
    with pytest.raises(ValueError, match=r"a16w8_matmul: a: expected shape \[\.\.\., 5\]"):
        _native.a16w8_matmul(np.zeros((2, 4), np.uint16), packed, 5, 3, z, z, None, m, 0, 0, "u16")
    with pytest.raises(ValueError, match="a16w8_matmul: a: expected uint8, int8, uint16 or int16, got int32"):
        _native.a16w8_matmul(np.zeros((2, 5), np.int32), packed, 5, 3, z, z, None, m, 0, 0, "u16")
    with pytest.raises(ValueError, match="mult: expected 3 values"):
        _native.a16w8_matmul(np.zeros((2, 5), np.uint16), packed, 5, 3, z, z, None, m[:2], 0, 0, "u16")
    with pytest.raises(ValueError, match="out_dtype: expected u8, i8, u16 or i16"):
        _native.a16w8_matmul(np.zeros((2, 5), np.uint16), packed, 5, 3, z, z, None, m, 0, 0, "f32")
    with pytest.raises(ValueError, match="packed: expected shape"):
        _native.a16w8_matmul(
            np.zeros((2, 5), np.uint16),
            np.ascontiguousarray(packed[:, :, :1]),
            5,
            3,
            z,
            z,
            None,
            m,
            0,
            0,
            "u16",
        )


@pytest.mark.parametrize(
    ("x_dt", "w_dt", "y_dt"), [(np.uint16, np.uint16, np.uint16), (np.int16, np.int8, np.int8)]
)
def test_depthwise_wide_rows_strides_and_extremes(x_dt, w_dt, y_dt):
    """17 channels, 5×5 kernel, stride 2 × 1, dilation 1 × 2, asymmetric pads, rows of 37
    outputs (whole 8-lane vectors and a tail): the column-phase layout of the strided row
    and the int64 lanes; x and w at the ends of their ranges with zero points at the other
    end (products near 2^32); distinct per-channel multipliers and biases."""
    rng = np.random.default_rng(5)
    ix, iw = np.iinfo(x_dt), np.iinfo(w_dt)
    x = _rand(rng, x_dt, (2, 17, 11, 41))
    x[0, :, ::2] = ix.max
    w = _rand(rng, w_dt, (17, 1, 5, 5))
    w[::2] = iw.min
    zx, zw = x_dt(ix.min + 7), np.full(17, iw.max, w_dt)
    zw[3] = iw.min + 1
    sw = rng.uniform(0.5, 2.0, 17).astype(F32)
    b = rng.integers(-(2**30), 2**30, 17).astype(np.int32)
    span = 25 * float(ix.max - ix.min) * float(iw.max - iw.min)
    iy = np.iinfo(y_dt)
    sy = F32(0.003 * span / (iy.max - iy.min) / 4)
    args = (x, F32(0.003), zx, w, sw, zw, sy, y_dt(3), b)
    attrs = dict(strides=[2, 1], dilations=[1, 2], pads=[2, 3, 1, 1])
    want = qlinear_conv16(*args, group=17, **attrs)
    assert want.shape[-1] == 37 and len(np.unique(want)) > 50
    every_isa(
        lambda isa: [
            np.testing.assert_array_equal(
                _native_conv(*args, t, group=17, **attrs), want, err_msg=f"{isa} {t}"
            )
            for t in (1, 2)
        ]
    )


def test_conv_pixel_panels_dense_and_strided():
    """The im2col panel of 32 output pixels: 1×1 stride-1 convolutions (the dense fill)
    over 7×11 = 77 pixels (two whole panels and a tail of 13), a 3×3 stride-2 padded one
    over the same input, 16-bit weights (two byte planes) and 8-bit ones; 7 input and 17
    output channels, per-channel zero points, every ISA."""
    rng = np.random.default_rng(9)
    x = _rand(rng, np.uint16, (1, 7, 7, 11))
    for w_dt, attrs, kernel in (
        (np.uint16, {}, (1, 1)),
        (np.int8, {}, (1, 1)),
        (np.int16, dict(strides=[2, 2], pads=[1, 0, 1, 2]), (3, 3)),
    ):
        w = _rand(rng, w_dt, (17, 7, *kernel))
        span = 7 * kernel[0] * kernel[1] * 65536.0 * (np.iinfo(w_dt).max - np.iinfo(w_dt).min) / 8
        args = (
            x,
            F32(0.002),
            np.uint16(40000),
            w,
            rng.uniform(0.5, 2.0, 17).astype(F32),
            _rand(rng, w_dt, (17,)),
            F32(0.002 * span / 65535),
            np.uint16(30000),
            rng.integers(-(2**20), 2**20, 17).astype(np.int32),
        )
        want = qlinear_conv16(*args, **attrs)
        assert len(np.unique(want)) > 50
        every_isa(
            lambda isa, args=args, attrs=attrs, want=want, w_dt=w_dt: [
                np.testing.assert_array_equal(
                    _native_conv(*args, t, **attrs), want, err_msg=f"{isa} {w_dt} {t}"
                )
                for t in (1, 2)
            ]
        )


@pytest.mark.parametrize("channels", [3, 7, 17])
@pytest.mark.parametrize(
    ("x_dt", "w_dt", "y_dt"),
    [
        (np.uint16, np.int8, np.uint16),  # int32 sums (8-bit weights)
        (np.int16, np.uint8, np.int16),
        (np.uint8, np.int8, np.uint8),
        (np.uint16, np.int16, np.uint16),  # float64 sums: 16-bit weights break the int32 bound
    ],
)
@pytest.mark.parametrize(
    ("hw", "kernel", "attrs"),
    [
        ((9, 13), (3, 3), dict(strides=[1, 1], dilations=[1, 1], pads=[1, 1, 1, 1])),
        ((5, 67), (5, 5), dict(strides=[2, 1], dilations=[1, 1], pads=[2, 2, 2, 2])),
        ((11, 70), (3, 5), dict(strides=[1, 3], dilations=[2, 1], pads=[0, 2, 3, 1])),
        ((7, 131), (3, 3), dict(strides=[1, 1], dilations=[1, 2], pads=[1, 0, 1, 2])),
        ((8, 33), (3, 3), dict(strides=[2, 2], dilations=[1, 1], pads=[0, 1, 1, 0])),
    ],
)
def test_depthwise_row_sums_match_the_twin(channels, x_dt, w_dt, y_dt, hw, kernel, attrs):
    """The depthwise kernel's two sums (int16 tap pairs under the per-call bound, else
    float64) against the twin: 3 / 7 / 17 channels, odd planes whose rows run past the
    64-output chains and end in a masked tail (67, 131 columns), strides and dilations
    that pair taps within a column phase (stride 3 and 2: taps kx and kx + s) or leave
    them single (dilation 2), asymmetric pads, per-channel weight zero points and scales, a
    zero point of x far from 0, 1 and 2 threads, every ISA."""
    rng = np.random.default_rng(channels * 1000 + hw[1])
    x = _rand(rng, x_dt, (2, channels, *hw))
    w = _rand(rng, w_dt, (channels, 1, *kernel))
    ix = np.iinfo(x_dt)
    zx = x_dt(ix.min + (int(ix.max) - int(ix.min)) // 3)
    zw = _rand(rng, w_dt, (channels,))
    sw = rng.uniform(0.5, 2.0, channels).astype(F32)
    taps = kernel[0] * kernel[1]
    span = np.sqrt(taps) * float(ix.max - ix.min) * float(np.iinfo(w_dt).max - np.iinfo(w_dt).min) / 4
    b = rng.integers(-int(span) // 4, int(span) // 4, channels).astype(np.int32)
    iy = np.iinfo(y_dt)
    sy = F32(0.003 * span / (iy.max - iy.min))
    args = (x, F32(0.003), zx, w, sw, zw, sy, y_dt(int(iy.min) + 5), b)
    want = qlinear_conv16(*args, group=channels, **attrs)
    assert len(np.unique(want)) > 20
    every_isa(
        lambda isa: [
            np.testing.assert_array_equal(
                _native_conv(*args, t, group=channels, **attrs), want, err_msg=f"{isa} {t}"
            )
            for t in (1, 2)
        ]
    )


@pytest.mark.parametrize("excess", [0, 1])
def test_depthwise_int16_pair_bound_at_its_edge(excess):
    """Σ_t |w − zw| · 32768 at 2^31 − 2^15 (int16 pairs: x − 32768 = −32768 at x = 0, so
    every partial int32 sum reaches −(2^31 − 2^15) on the inner outputs) and one weight
    unit above it (the float64 sums): 3 × 3 weights of 7282 and one of 7279 (+ excess),
    negated on one channel; x − zx = −65535 in the image, 0 in the padding; both exact."""
    x = np.zeros((1, 3, 5, 7), np.uint16)
    x[:, 1, ::2] = 40000
    w = np.full((3, 1, 3, 3), 7282, np.int16)
    w[:, 0, 2, 2] = 7279 + excess
    w[2] = -w[2]
    zw = np.zeros(3, np.int16)
    sw = np.array([1.0, 0.75, 1.25], F32)
    span = 65535.0 * 65535
    args = (x, F32(1.0), np.uint16(65535), w, sw, zw, F32(span / 65535 * 2), np.uint16(30000), None)
    want = qlinear_conv16(*args, group=3, pads=[1, 1, 1, 1])
    assert len(np.unique(want)) > 3
    every_isa(
        lambda isa: [
            np.testing.assert_array_equal(
                _native_conv(*args, t, group=3, pads=[1, 1, 1, 1]), want, err_msg=f"{isa} {t}"
            )
            for t in (1, 2)
        ]
    )


def test_conv_pixel_sums_beyond_int32():
    """rx = Σ_k X' past 2^31: 1×1, K = 70001 uint16 channels near 65535 (X' ≈ 32767, so rx ≈ 2.3e9),
    int8 weights, int16 out. The AVX2 requantization multiplies c1·rx in int32 lanes and must
    take its scalar step for these pixels (a16w8_avx2.cc); 11 pixels: one 8-output step and a tail."""
    rng = np.random.default_rng(5)
    k = 70001
    x = rng.integers(65500, 65536, (1, k, 1, 11)).astype(np.uint16)
    x[0, :, 0, 3] = rng.integers(0, 65536, k)  # one pixel with an ordinary sum in the vector step
    w = _rand(rng, np.int8, (3, k, 1, 1))
    sw = np.array([0.5, 1.25, 2.0], F32)
    args = (
        x,
        F32(0.001),
        np.uint16(30000),
        w,
        sw,
        np.array([-7, 0, 90], np.int8),
        F32(400.0),
        np.int16(-3),
        None,
    )
    want = qlinear_conv16(*args)
    assert len(np.unique(want)) > 6
    every_isa(lambda isa: np.testing.assert_array_equal(_native_conv(*args, 1), want, err_msg=isa))


@pytest.mark.parametrize("y_dt", OUT)
def test_conv_accumulators_beyond_float64_fast_conversion(y_dt):
    """|v| ≥ 2^51 after the int64 bias: the AVX2 requantization converts int64 -> float32 through
    float64 only below 2^51 (a16w8_avx2.cc) and takes the scalar step otherwise. An int64 bias
    (the binding's type) of ±2^51 ± small on some channels, small on the others; every ISA gives
    the portable bytes, which the twin fixes elsewhere (test_conv_hypothesis)."""
    rng = np.random.default_rng(8)
    x = _rand(rng, np.int16, (1, 7, 5, 6))
    w = _rand(rng, np.int8, (17, 7, 3, 3))
    span = float(np.iinfo(y_dt).max) - float(np.iinfo(y_dt).min)
    mult = (rng.uniform(0.05, 0.45, 17) * span / 2.0**51).astype(F32)  # ±2^51 lands inside the output range
    bias = rng.integers(-(2**20), 2**20, 17).astype(np.int64)
    bias[::3] += np.int64(2**51)
    bias[1::5] -= np.int64(2**51) + 3
    bias[2] = 2**51 - 40  # crosses 2^51 within one 8-output step
    from quanta.kernels.reference.conv_geometry import conv_attrs
    from quanta.targets.native import a16w8 as binder

    wk = (w.astype(np.int64)).reshape(1, 17, 63).transpose(0, 2, 1)
    packed = np.stack([binder.pack_rows(wk[0], False)])
    zw = _rand(rng, np.int8, (17,))
    dw, cw = weight_terms(wk[0], w.dtype, zw, 17)
    g = conv_attrs(x.shape, [3, 3], pads=[1, 1, 1, 1])

    def run():
        return _native.a16w8_conv2d(
            x,
            11,
            packed,
            17,
            g.kernel_shape,
            g.strides,
            g.dilations,
            (g.pads[0], g.pads[1]),
            g.out_shape,
            1,
            dw,
            cw,
            bias,
            mult,
            int(y_dt(5)),
            _SHORT[np.dtype(y_dt)],
            num_threads=1,
        )

    try:
        _native.set_isa("portable")
        want = run()
    finally:
        _native.clear_isa()
    assert len(np.unique(want)) > 6
    every_isa(lambda isa: np.testing.assert_array_equal(run(), want, err_msg=isa))


def _spread_case(rng, x_dt, w_dt, y_dt, n, c, m_out, hw, kernel, group=1, near_limits=False):
    """A convolution whose outputs spread over y's range: per-channel weights and scales,
    zero points far from 0, int32 bias; with ``near_limits`` a third of x at ±32767 (its
    type's ends)."""
    x = _rand(rng, x_dt, (n, c, *hw))
    if near_limits:
        i = np.iinfo(x_dt)
        x.reshape(-1)[::3] = i.max
        x.reshape(-1)[1::7] = i.min + 1
    w = _rand(rng, w_dt, (m_out, c // group, *kernel))
    zw = _rand(rng, w_dt, (m_out,))
    sw = rng.uniform(0.5, 2.0, m_out).astype(F32)
    b = rng.integers(-(2**20), 2**20, m_out).astype(np.int32)
    k = c // group * kernel[0] * kernel[1]
    # the zero points' offsets add up over K (x − zx and w − zw need not average 0)
    span = k * 65536.0 * (np.iinfo(w_dt).max - np.iinfo(w_dt).min) / 4
    iy = np.iinfo(y_dt)
    sy = F32(0.003 * span / (int(iy.max) - int(iy.min)))
    zy = y_dt((int(iy.min) + int(iy.max)) // 2 + 5)
    zx = _rand(rng, x_dt, ())
    return (x, F32(0.003), zx, w, sw, zw, sy, zy, b)


@pytest.mark.parametrize("y_dt", OUT)
@pytest.mark.parametrize(("x_dt", "w_dt"), [(np.int16, np.int8), (np.uint16, np.uint8), (np.int16, np.uint8)])
@pytest.mark.parametrize(
    ("c", "m_out", "hw"),
    [(3, 7, (7, 11)), (7, 17, (5, 16)), (17, 3, (1, 5)), (300, 13, (3, 7)), (8, 8, (16, 19))],
)
def test_direct_pointwise_matches_the_twin(y_dt, x_dt, w_dt, c, m_out, hw):
    """The direct 1×1 kernel (a16w8.h DirectStrip, AVX2): flat strips of 16 pixels and a tail
    (77, 80, 5, 21, 304 pixels), channel blocks of up to 6 (3, 7, 17, 13, 8 output channels),
    odd and even K, K = 300 > 258 (the scanned bound: full-range 8-bit weights fail it for
    some channels, so those calls take the GEMM), per-channel zero points (the dw term moved
    into the weight), inputs at their type's ends, every output type, 1 and 2 threads."""
    rng = np.random.default_rng(c * 1000 + m_out)
    args = _spread_case(rng, x_dt, w_dt, y_dt, 1, c, m_out, hw, (1, 1), near_limits=True)
    want = qlinear_conv16(*args)
    assert len(np.unique(want)) > min(10, want.size // 8)
    every_isa(
        lambda isa: [
            np.testing.assert_array_equal(_native_conv(*args, t), want, err_msg=f"{isa} {t}") for t in (1, 2)
        ]
    )


def test_direct_pointwise_long_reduction_within_the_scanned_bound():
    """K = 777 with small weights (|w − zw| ≤ 12): beyond the unscanned bound
    (32768·K·(255 + |dw|)), within the scanned one, so the whole K stays in int32 lanes."""
    rng = np.random.default_rng(21)
    x = _rand(rng, np.int16, (2, 777, 5, 7))
    x.reshape(-1)[::2] = 32767
    w = rng.integers(-5, 8, (17, 777, 1, 1)).astype(np.int8)
    zw = rng.integers(-4, 5, 17).astype(np.int8)
    args = (
        x,
        F32(0.001),
        np.int16(-3),
        w,
        rng.uniform(0.5, 2, 17).astype(F32),
        zw,
        F32(2.0),
        np.int16(9),
        None,
    )
    want = qlinear_conv16(*args)
    assert len(np.unique(want)) > 50
    every_isa(
        lambda isa: [
            np.testing.assert_array_equal(_native_conv(*args, t), want, err_msg=f"{isa} {t}") for t in (1, 2)
        ]
    )


@pytest.mark.parametrize(
    ("kernel", "attrs", "hw", "group"),
    [
        ((3, 3), dict(pads=[1, 1, 1, 1]), (19, 21), 1),
        ((3, 3), dict(pads=[0, 2, 1, 0], dilations=[2, 1]), (9, 35), 1),
        ((2, 2), {}, (2, 2), 1),
        ((3, 5), dict(pads=[2, 1, 0, 3]), (6, 17), 2),
        ((1, 1), dict(pads=[1, 0, 0, 2]), (4, 5), 1),
        ((3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1]), (33, 40), 1),
        ((3, 2), dict(strides=[1, 3], dilations=[1, 2], pads=[0, 1, 2, 0]), (8, 50), 1),
        ((1, 1), dict(strides=[2, 2]), (7, 9), 1),
    ],
)
@pytest.mark.parametrize(("x_dt", "y_dt"), [(np.int16, np.int16), (np.uint16, np.uint8)])
def test_direct_rows_match_the_twin(kernel, attrs, hw, group, x_dt, y_dt):
    """The direct kernel's row strips (kh·kw > 1, pads or strides: the zx-padded copy in
    column phases): 3 and 7 input channels per group, 1, 7 and 17 output channels, output
    rows of 1 to 35 pixels, strides 2 and 3 (the stem's 3×3 stride 2), dilations, asymmetric
    pads, a grouped convolution, 1 and 2 threads."""
    rng = np.random.default_rng(hw[0] * 100 + hw[1])
    for c, m_out in ((3 * group, 17 if group == 1 else 14), (7 * group, 1 * group), (7 * group, 7 * group)):
        args = _spread_case(rng, x_dt, np.int8, y_dt, 2, c, m_out, hw, kernel, group=group, near_limits=True)
        want = qlinear_conv16(*args, group=group, **attrs)
        assert len(np.unique(want)) > min(10, want.size // 8)
        every_isa(
            lambda isa, args=args, want=want: [
                np.testing.assert_array_equal(
                    _native_conv(*args, t, group=group, **attrs), want, err_msg=f"{isa} {t}"
                )
                for t in (1, 2)
            ]
        )


@pytest.mark.parametrize("excess", [0, 1, 2])
def test_direct_int32_bound_at_its_edge(excess):
    """|Σ W''·X' + c0| at 2^31 − 1 (excess 0) and beyond (excess 1: −2^31, 2: the driver
    must send the call to the GEMM, as int32 lanes would wrap): K = 256 weights w − zw = 255 (int8 127 with
    zw = −128: the loose bound fails on |dw| = 128, the scan gives 255·256) against
    X' = −32768, zx = 0 (c0 = bias), bias −(2^31 − 1 − 255·256·32768) − excess."""
    k = 256
    x = np.full((1, k, 3, 18), -32768, np.int16)
    x[0, :, 1, :] = 1000  # other pixels with ordinary sums
    w = np.full((2, k, 1, 1), 127, np.int8)
    zw = np.array([-128, -128], np.int8)
    edge = 2**31 - 1 - 255 * 256 * 32768
    b = np.array([-(edge + excess), 5], np.int32)
    args = (x, F32(1.0), np.int16(0), w, np.ones(2, F32), zw, F32(2.0**20), np.int16(0), b)
    want = qlinear_conv16(*args)
    assert want[0, 0, 0, 0] == round(-(2**31 - 1 + excess) / 2**20)
    every_isa(
        lambda isa: [
            np.testing.assert_array_equal(_native_conv(*args, t), want, err_msg=f"{isa} {t}") for t in (1, 2)
        ]
    )


@pytest.mark.parametrize(("x_dt", "w_dt"), [(np.int16, np.int8), (np.uint16, np.int8), (np.int16, np.uint8)])
def test_direct_symmetric_weights(x_dt, w_dt):
    """Blocks whose zero points are all 0 (symmetric int8 weights, mp_pose's file: the tile
    without the int16 dw add) next to a block with one nonzero zero point: 17 output channels
    in blocks of 6, 6, 5, 1×1 and 3×3."""
    rng = np.random.default_rng(17)
    for kernel, attrs in (((1, 1), {}), ((3, 3), dict(pads=[1, 1, 1, 1]))):
        args = list(_spread_case(rng, x_dt, w_dt, np.int16, 1, 9, 17, (6, 21), kernel, near_limits=True))
        # uint8 weights: zw = 128 (dw = −128, the int16 add in every block)
        zw = np.zeros(17, w_dt) if w_dt == np.int8 else np.full(17, 128, w_dt)
        zw[14] = 3
        args[5] = zw
        want = qlinear_conv16(*args, **attrs)
        assert len(np.unique(want)) > 50
        every_isa(
            lambda isa, args=args, want=want, attrs=attrs: [
                np.testing.assert_array_equal(_native_conv(*args, t, **attrs), want, err_msg=f"{isa} {t}")
                for t in (1, 2)
            ]
        )
