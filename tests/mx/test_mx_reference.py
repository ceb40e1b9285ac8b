"""The MX golden (quanta/kernels/reference/mx.py) against the OCP MX v1.0 rules,
docs/quantization-math.md eqs. (MX1)-(MX7): every element bit pattern of every format,
the ties of every adjacent pair, the edge blocks, and the dot products against a loop
written from the equations."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from quanta.kernels.reference import mx
from quanta.kernels.reference.quantize import dequantize_linear

FORMATS = list(mx.MX_FORMATS)


def _all_patterns(f: mx.MXFormat) -> np.ndarray:
    """Every bit pattern of the element dtype, as elements."""
    n = {"f6e3m2fn": 64, "f6e2m3fn": 64, "f4e2m1fn": 16}.get(f.name, 256)
    codes = np.arange(n, dtype=np.uint8)
    if f.is_int:
        return codes.view(np.int8)
    return codes.view(f.dtype)


def _finite_values(f: mx.MXFormat) -> np.ndarray:
    """Every finite value quantization produces (MXINT8's -128 = -2.0 only decodes)."""
    p = _all_patterns(f)
    v = p.astype(np.float64) * (2.0**-6 if f.is_int else 1.0)
    keep = np.isfinite(v)
    if f.is_int:
        keep &= p.view(np.uint8) != 0x80
    return v[keep]


@pytest.mark.parametrize("name", FORMATS)
def test_every_element_pattern_round_trips_under_its_own_scale(name):
    # Each finite pattern P in a block whose largest magnitude sits in the element's top
    # binade: (MX3) gives back the chosen scale exactly and (MX4) gives back P.
    f = mx.MX_FORMATS[name]
    pats = _all_patterns(f)
    vals = pats.astype(np.float64) * (2.0**-6 if f.is_int else 1.0)
    keep = np.isfinite(vals) & (pats.view(np.uint8) != 0x80 if f.is_int else np.isfinite(vals))
    for e in (-120, -7, 0, 3, 100):
        block = np.empty((len(vals[keep]), 2), np.float64)
        block[:, 0] = 2.0**f.emax
        block[:, 1] = vals[keep]
        x = (block * 2.0**e).astype(np.float32)
        el, sc = mx.quantize_mx(x, f, axis=1, block=2)
        assert np.all(sc.view(np.uint8) == e + 127)
        got = el[:, 1]
        if f.is_int:
            assert np.array_equal(got, pats[keep])
        else:
            # bitwise, signed zero included
            assert np.array_equal(got.view(np.uint8), pats[keep].view(np.uint8))
        assert np.array_equal(mx.dequantize_mx(el, sc, axis=1, block=2), x)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("mode", ["ocp", "microxcaling"])
def test_ties_between_every_adjacent_pair(name, mode):
    # The midpoint of two adjacent element values rounds to the even one (OCP) or away from
    # zero (microxcaling's "nearest"); just above / below goes to the nearer one.
    f = mx.MX_FORMATS[name]
    v = np.unique(np.abs(_finite_values(f)))
    lo, hi = v[:-1], v[1:]
    mid = (lo + hi) / 2
    n = len(mid)
    x = np.zeros((3 * n, 2), np.float64)
    x[:, 0] = 2.0**f.emax  # pins the scale to 2^0
    x[:, 1] = np.concatenate(
        [
            mid,
            np.nextafter(mid.astype(np.float32), np.float32(0)),
            np.nextafter(mid.astype(np.float32), np.float32(np.inf)),
        ]
    )
    for sign in (1.0, -1.0):
        xs = (x * np.array([1.0, sign])).astype(np.float32)
        el, sc = mx.quantize_mx(xs, f, axis=1, block=2, mode=mode)
        assert np.all(sc.view(np.uint8) == 127)
        got = np.abs(mx.dequantize_mx(el, sc, axis=1, block=2)[:, 1].astype(np.float64))
        tie = got[:n]
        if mode == "microxcaling":
            assert np.array_equal(tie, hi)
        else:
            # the even one: its integer on the element's grid is even
            grid = 64.0 if f.is_int else None
            if grid is not None:
                even_lo = (np.rint(lo * 64) % 2) == 0
            else:
                # mantissa LSB: value / quantum(value's binade) is even
                e = np.maximum(np.floor(np.log2(np.where(lo > 0, lo, 1.0))), f.emin)
                even_lo = (np.rint(lo / 2.0 ** (e - f.mbits)) % 2) == 0
            assert np.array_equal(tie, np.where(even_lo, lo, hi))
        assert np.array_equal(got[n : 2 * n], lo)
        assert np.array_equal(got[2 * n :], hi)
        assert np.all(np.sign(mx.dequantize_mx(el, sc, axis=1, block=2)[:, 1]) * sign >= 0)


@pytest.mark.parametrize("name", FORMATS)
def test_saturation_and_shared_scale(name):
    f = mx.MX_FORMATS[name]
    # amax just under 2^(k+1): the scale stays 2^(k − emax); values above max_norm·X clamp.
    k = 5
    amax = np.float32(np.nextafter(np.float32(2.0 ** (k + 1)), np.float32(0)))
    x = np.array([[amax, -amax, 2.0**k, 0.0]], np.float32)
    el, sc = mx.quantize_mx(x, f, axis=1, block=4)
    assert int(sc.view(np.uint8)[0, 0]) == 127 + k - f.emax
    d = mx.dequantize_mx(el, sc, axis=1, block=4)
    X = 2.0 ** (k - f.emax)
    assert d[0, 0] == np.float32(f.max_norm * X) and d[0, 1] == -np.float32(f.max_norm * X)
    assert d[0, 2] == 2.0**k and d[0, 3] == 0


@pytest.mark.parametrize("name", FORMATS)
def test_ceil_mode_moves_the_scale_up_only_where_the_maximum_would_saturate(name):
    # eq. (MX3c): amax just under 2^(k+1) (past max_elem · 2^(k − emax)) takes the scale
    # 2^(k + 1 − emax) and keeps its value; amax exactly max_elem · 2^(k − emax) keeps the
    # OCP scale; below that both modes agree bit for bit
    f = mx.MX_FORMATS[name]
    k = 3
    over = np.float32(np.nextafter(np.float32(2.0 ** (k + 1)), np.float32(0)))
    at = np.float32(f.max_norm * 2.0 ** (k - f.emax))
    x = np.array(
        [[over, -0.3, 2.0**k, 0.0], [at, -0.3, 0.7, 1e-3], [1.5 * 2.0**k, 0.1, -0.2, 0.0]], np.float32
    )
    el, sc = mx.quantize_mx(x, f, axis=1, block=4, mode="ceil")
    codes = sc.view(np.uint8)[:, 0].astype(int)
    assert list(codes) == [128 + k - f.emax, 127 + k - f.emax, 127 + k - f.emax]
    d = mx.dequantize_mx(el, sc, axis=1, block=4)
    assert d[0, 0] == 2.0 ** (k + 1) and d[1, 0] == at
    ocp = mx.quantize_mx(x, f, axis=1, block=4)
    assert np.array_equal(el[1:].view(np.uint8), ocp[0][1:].view(np.uint8))
    assert np.array_equal(sc[1:].view(np.uint8), ocp[1][1:].view(np.uint8))
    # the edge blocks as (MX3): zero block code 0, NaN/Inf blocks the NaN code
    e = mx.scale_exponents(np.array([[0.0, 0.0], [np.nan, 1.0], [1e-45, 0.0]], np.float32), f, 1, 2, "ceil")
    assert list(e[:, 0]) == [-127, 128, -127]


@pytest.mark.parametrize("name", FORMATS)
def test_edge_blocks(name):
    f = mx.MX_FORMATS[name]
    tiny = np.float32(2.0**-140)  # a float32 subnormal
    x = np.array(
        [
            [0.0, 0.0, -0.0, 0.0],  # all zero: code 0, zero elements
            [1.0, np.nan, 2.0, 3.0],  # NaN: NaN scale, block NaN
            [1.0, np.inf, 2.0, 3.0],
            [-np.inf, 0.0, 0.0, 0.0],
            [tiny, -tiny, 0.0, 0.0],  # the scale clamps at 2^-127
            [np.finfo(np.float32).max, 1.0, 0.0, -np.finfo(np.float32).max],
        ],
        np.float32,
    )
    el, sc = mx.quantize_mx(x, f, axis=1, block=4)
    codes = sc.view(np.uint8)[:, 0]
    assert codes[0] == 0 and np.all(mx.dequantize_mx(el, sc, axis=1, block=4)[0] == 0)
    assert codes[1] == codes[2] == codes[3] == 255
    d = mx.dequantize_mx(el, sc, axis=1, block=4)
    assert np.all(np.isnan(d[1:4]))
    assert codes[4] == 0
    assert codes[5] == 127 + 127 - f.emax
    assert (
        d[5, 0] == np.float32(f.max_norm * 2.0 ** (127 - f.emax))
        or f.max_norm * 2.0 ** (127 - f.emax) > 3.4e38
    )
    # the microxcaling mode agrees on NaN/Inf; its zero block is clamp(-126 - emax, -127)
    _el2, sc2 = mx.quantize_mx(x, f, axis=1, block=4, mode="microxcaling")
    assert sc2.view(np.uint8)[0, 0] == max(-126 - f.emax, -127) + 127
    assert np.all(sc2.view(np.uint8)[1:4, 0] == 255)


def test_microxcaling_scale_from_float32_log2():
    # amax one ulp below 2^10: the exact exponent is 9, float32 log2 rounds to 10.0
    amax = np.nextafter(np.float32(1024.0), np.float32(0))
    x = np.array([[amax, 1.0]], np.float32)
    for name in FORMATS:
        f = mx.MX_FORMATS[name]
        ocp = mx.scale_exponents(x, f, axis=1, block=2)
        ms = mx.scale_exponents(x, f, axis=1, block=2, mode="microxcaling")
        assert ocp[0, 0] == 9 - f.emax and ms[0, 0] == 10 - f.emax


def test_short_last_block_negative_axis_and_onnx_dequantize():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3, 71, 5)) * np.exp(rng.uniform(-8, 8, (3, 71, 5)))).astype(np.float32)
    for name in FORMATS:
        el, sc = mx.quantize_mx(x, name, axis=-2, block=32)
        assert el.shape == x.shape and sc.shape == (3, 3, 5)
        d = mx.dequantize_mx(el, sc, axis=1, block=32)
        if name != "i8":  # ONNX's DequantizeLinear has no implicit 2^-6 for int8
            ref = dequantize_linear(el, sc, None, axis=1, block=32)
            assert np.array_equal(d, ref)
        # error bound: half a quantum of the block's top binade, or the saturation gap
        f = mx.MX_FORMATS[name]
        X = np.repeat(sc.view(ml_dtypes.float8_e8m0fnu).astype(np.float64), 32, axis=1)[:, :71]
        top = 2.0 ** (f.emax - f.mbits - 1) if not f.is_int else 2.0**-7
        sat = 2.0 ** (f.emax + 1) - f.max_norm
        assert np.all(np.abs(d - x) <= X * max(top, sat) * (1 + 1e-6))


def _loop_gemm(a, asc, b, bsc, block, fa, fb, bias=None):
    """(MX5)-(MX6) written out per output with Python integers."""
    M, K = a.shape
    N = b.shape[1]
    na, nb_ = mx.element_integers(a, fa), mx.element_integers(b, fb)
    ea = asc.view(np.uint8).astype(int) - 127
    eb = bsc.view(np.uint8).astype(int) - 127
    y = np.zeros((M, N), np.float32)
    for m in range(M):
        for n in range(N):
            acc = None
            for k in range(-(-K // block)):
                d = sum(int(na[m, i]) * int(nb_[i, n]) for i in range(k * block, min(K, (k + 1) * block)))
                s = np.float32(
                    np.float32(2.0 ** (ea[m, k] - fa.frac_bits))
                    * np.float32(2.0 ** (eb[k, n] - fb.frac_bits))
                )
                p = np.float32(np.float32(mx._round_int_to_f32(np.array([d], dtype=object))[0]) * s)
                acc = p if acc is None else np.float32(acc + p)
            if bias is not None:
                acc = np.float32(acc + np.float32(bias[n]))
            y[m, n] = acc
    return y


@pytest.mark.parametrize(
    "pair",
    [
        ("i8", "i8"),
        ("f8e4m3fn", "f8e4m3fn"),
        ("f8e5m2", "f8e5m2"),
        ("f8e4m3fn", "f4e2m1fn"),
        ("f6e3m2fn", "f6e2m3fn"),
    ],
)
def test_gemm_matches_loop_form_and_float64(pair):
    rng = np.random.default_rng(3)
    M, K, N, B = 3, 77, 5, 32
    xa = (rng.standard_normal((M, K)) * np.exp(rng.uniform(-4, 4, (M, 1)))).astype(np.float32)
    xb = (rng.standard_normal((K, N)) * np.exp(rng.uniform(-4, 4, (1, N)))).astype(np.float32)
    fa, fb = mx.mx_format(pair[0]), mx.mx_format(pair[1])
    a, asc = mx.quantize_mx(xa, fa, axis=1, block=B)
    b, bsc = mx.quantize_mx(xb, fb, axis=0, block=B)
    bias = rng.standard_normal(N).astype(np.float32)
    y = mx.mx_gemm(a, asc, b, bsc, B, bias=bias)
    assert np.array_equal(y, _loop_gemm(a, asc, b, bsc, B, fa, fb, bias))
    # float64 of the dequantized operands: the chain rounds at most nb + 1 times
    y64 = (
        mx.dequantize_mx(a, asc, 1, B).astype(np.float64) @ mx.dequantize_mx(b, bsc, 0, B).astype(np.float64)
        + bias
    )
    mag = np.abs(mx.dequantize_mx(a, asc, 1, B)).astype(np.float64) @ np.abs(
        mx.dequantize_mx(b, bsc, 0, B)
    ) + np.abs(bias)
    assert np.all(np.abs(y - y64) <= 5 * 2.0**-24 * mag + 1e-30)


def test_gemm_nan_block_and_extreme_scales():
    a = np.ones((2, 64), np.float32)
    a[0, 3] = np.nan
    a[1] *= 2.0**-120
    b = np.ones((64, 3), np.float32) * 2.0**-100
    ae, asc = mx.quantize_mx(a, "i8", axis=1)
    be, bsc = mx.quantize_mx(b, "i8", axis=0)
    y = mx.mx_gemm(ae, asc, be, bsc)
    assert np.all(np.isnan(y[0]))
    assert np.array_equal(y[1], _loop_gemm(ae, asc, be, bsc, 32, mx.MX_FORMATS["i8"], mx.MX_FORMATS["i8"])[1])


def test_conv_equals_gemm_of_taps_and_float64():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 7, 6, 5)).astype(np.float32)
    w = rng.standard_normal((3, 7, 3, 2)).astype(np.float32)
    B = 4
    xe, xs = mx.quantize_mx(x, "f8e4m3fn", axis=1, block=B)
    we, ws = mx.quantize_mx(w, "i8", axis=1, block=B)
    y = mx.mx_conv(xe, xs, we, ws, B, pads=(1, 0, 1, 1), strides=(2, 1))
    xd = mx.dequantize_mx(xe, xs, 1, B).astype(np.float64)
    wd = mx.dequantize_mx(we, ws, 1, B).astype(np.float64)
    xp = np.pad(xd, ((0, 0), (0, 0), (1, 1), (0, 1)))
    OH, OW = y.shape[2:]
    ref = np.zeros(y.shape)
    for oy in range(OH):
        for ox in range(OW):
            patch = xp[:, :, 2 * oy : 2 * oy + 3, ox : ox + 2]
            ref[:, :, oy, ox] = np.einsum("nchw,ochw->no", patch, wd)
    assert y.shape == (2, 3, 3, 5)
    assert np.allclose(y, ref, rtol=1e-5, atol=1e-5)
    # the order of (MX7): each output is the GEMM row of its taps
    a, a_s, _ = mx.im2col_mx(xe, xs, (3, 2), (1, 0, 1, 1), (2, 1), (1, 1), B)
    bm, b_s = mx.weights_to_gemm_mx(we, ws, B)
    row = mx.mx_gemm(a[7:8], a_s[7:8], bm, b_s, B)
    n, rest = divmod(7, OH * OW)
    assert np.array_equal(row[0], y[n, :, rest // OW, rest % OW])


def test_bad_arguments_have_clear_errors():
    with pytest.raises(ValueError, match="unknown MX element format 'fp7'"):
        mx.mx_format("fp7")
    with pytest.raises(ValueError, match="mode must be 'ocp', 'ceil' or 'microxcaling'"):
        mx.quantize_mx(np.ones(4, np.float32), "i8", mode="torch")
    with pytest.raises(ValueError, match=r"expected A \[M, K\] and B \[K, N\]"):
        mx.mx_gemm(np.zeros((2, 3), np.int8), None, np.zeros((4, 2), np.int8), None)
