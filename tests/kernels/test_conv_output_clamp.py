"""Differential tests of the native convolution's output code clamp (conv.h
``ConvArgs::clamp_lo`` / ``clamp_hi``, docs/quantization-math.md eq. (6c)).

Failure signature guarded against: a path whose epilogue keeps clamping to the type's
range (or to a bound off by the zero point) writes codes outside [lo, hi] where a folded
Relu6 / Clip table would have clamped them: Quark's EfficientNet then differs from the
unfolded graph in the codes above Q(6).

Every ISA the CPU runs (portable always), threads 1 and 2, per-call parameters and the
prepared ones, NCHW and channels_last, against the twin ``reference/qlinear_conv.py``
with ``output_clamp``: bytes equal (tolerance 0: the clamp is an integer min / max of the
codes the unclamped epilogue already matches bit for bit, eq. (6c)). Every path of
conv.h is hit on purpose (depthwise planes and transposed, implicit, im2col, pointwise
NCHW GEMM, direct small-C, channels_last depthwise), with odd channel counts (3, 7, 17),
a reduction of 300 (> 258), per-channel scales that differ, non-zero zero points, and
output parameters derived from the accumulator so that every clamp bites: bounds inside
the code range on one or both sides, at its ends, and a single code.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from quanta.kernels.reference.ms_qlinear_conv import ms_qlinear_conv_op
from quanta.kernels.reference.qlinear_conv import qlinear_conv
from quanta.kernels.reference.registry import OpContext, OpError

from .test_conv_native import (
    ISAS,
    THREADS,
    ConvCase,
    _native,
    assert_bitexact,
    conv_cases,
    make_conv,
    random_case,
    to_nhwc,
)


def clamps(unclamped: np.ndarray, zy: int) -> list[tuple[int, int]]:
    """Bounds inside and at the code range, from the unclamped codes so that the inner
    ones bite: both sides inside (the 25th and 75th percentiles), the upper side only,
    the lower side only, a Relu6 at zy (Quark: [128, 224]), both ends of the range, and
    one code (the median)."""
    info = np.iinfo(unclamped.dtype)
    p25, p40, p50, p60, p75 = (int(np.percentile(unclamped, q, method="lower")) for q in (25, 40, 50, 60, 75))
    return [
        (p25, p75),
        (int(info.min), p60),
        (p40, int(info.max)),
        (zy, min(int(info.max), zy + (int(info.max) - int(info.min)) // 3)),
        (int(info.min), int(info.max)),
        (p50, p50),
    ]


def twin(case: ConvCase, clamp: tuple[int, int]) -> np.ndarray:
    return qlinear_conv(
        case.x,
        case.sx,
        case.zx,
        case.w,
        case.sw,
        case.zw,
        case.sy,
        case.zy,
        case.bias,
        output_clamp=list(clamp),
        **case.attrs,
    )


def check_clamped(case: ConvCase, channels_last: bool = True) -> list[str]:
    """Twin vs every ISA x thread count x clamp, per call and prepared, NCHW (and NHWC
    with ``channels_last``); returns the NCHW kernel names that ran."""
    kernels = []
    y_dtype = np.asarray(case.zy).dtype
    unclamped = twin(case, (int(np.iinfo(y_dtype).min), int(np.iinfo(y_dtype).max)))
    bounds = clamps(unclamped, int(case.zy))
    expected = {c: twin(case, c) for c in bounds}
    # the cases are strong enough to tell a clamp from none: the percentile bounds bite
    lo, hi = bounds[0]
    assert (unclamped < lo).any() and (unclamped > hi).any(), ("a clamp that never bites", lo, hi)
    x_nhwc = to_nhwc(case.x)
    for isa in ISAS:
        conv = make_conv(case, isa)
        kernels.append(conv.kernel)
        for threads in THREADS:
            for clamp, want in expected.items():
                label = f"{conv.kernel} threads={threads} clamp={clamp}"
                got = conv.qlinear(
                    case.x, case.zx, case.m, case.zy, case.bias, num_threads=threads, clamp=clamp
                )
                assert_bitexact(want, got, case, label)
                conv.prepare(case.zx, case.m, case.zy, case.bias, clamp=clamp)
                assert_bitexact(
                    want, conv.qlinear_prepared(case.x, num_threads=threads), case, label + " prepared"
                )
                if channels_last:
                    got = conv.qlinear(
                        x_nhwc,
                        case.zx,
                        case.m,
                        case.zy,
                        case.bias,
                        num_threads=threads,
                        clamp=clamp,
                        channels_last=True,
                    )
                    assert_bitexact(to_nhwc(want), got, case, label + " channels_last")
    return kernels


# (x shape, w shape, attrs, why); the prefix of why names the path (NCHW, portable)
CASES = [
    ((1, 7, 9, 11), (7, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 7}, "dw: 7 channels"),
    (
        (2, 17, 7, 9),
        (17, 1, 5, 5),
        {"pads": [2, 1, 0, 2], "strides": [2, 2], "group": 17},
        "dw: 17 ch 5x5 s2",
    ),
    ((1, 3, 5, 5), (3, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 3}, "dw: 3 channels, small plane"),
    ((1, 70, 5, 9), (70, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 70}, "dw: 70 channels, block + tail"),
    ((1, 8, 9, 11), (17, 8, 3, 3), {"pads": [1, 1, 1, 1]}, "implicit: 17 outputs"),
    ((1, 200, 5, 6), (19, 200, 3, 3), {"pads": [1, 1, 1, 1]}, "implicit: K = 1800, split taps"),
    ((1, 3, 11, 9), (7, 3, 3, 3), {"pads": [1, 1, 1, 1]}, "im2col: 3 channels -> 7"),
    ((2, 17, 7, 9), (31, 17, 1, 1), {}, "im2col: 1x1, 17 channels"),
    ((1, 300, 5, 13), (17, 300, 1, 1), {}, "pointwise: K = 300 > 258"),
    ((2, 6, 29), (9, 6, 3), {"pads": [1, 2], "strides": [2]}, "im2col: 1-D"),
]


# each case on each path its geometry can take: the environment pins the depthwise
# (planes / through the channels_last kernel) and the pointwise (GEMM / transposes) choice
PATH_PINS = {
    "dw": [("QUANTA_CONV_DW_PATH", "planes"), ("QUANTA_CONV_DW_PATH", "transposed")],
    "pointwise": [("QUANTA_CONV_PW_PATH", "gemm"), ("QUANTA_CONV_PW_PATH", "transposed")],
}
PINNED = [
    pytest.param(*case, pin, id=f"{case[3]} {pin[1] if pin else ''}".strip())
    for case in CASES
    for pin in PATH_PINS.get(case[3].split(":")[0], [None])
]


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs", "why", "pin"), PINNED)
@pytest.mark.parametrize(
    ("x_dtype", "w_dtype", "y_dtype", "per_channel"),
    [
        (np.uint8, np.int8, np.uint8, True),
        (np.int8, np.int8, np.int8, False),
        (np.uint8, np.uint8, np.int8, True),
    ],
)
def test_conv_output_clamp_every_path_isa_and_layout(
    x_shape, w_shape, attrs, why, pin, x_dtype, w_dtype, y_dtype, per_channel, monkeypatch
):
    if pin is not None:
        monkeypatch.setenv(*pin)
    rng = np.random.default_rng(x_shape[1] * 29 + w_shape[0])
    case = random_case(
        rng,
        x_shape,
        w_shape,
        x_dtype=x_dtype,
        w_dtype=w_dtype,
        y_dtype=y_dtype,
        per_channel=per_channel,
        **attrs,
    )
    kernels = check_clamped(case)
    portable = kernels[ISAS.index("portable")]
    prefix = {"dw": "qconv_dw_", "implicit": "qconv_implicit+", "im2col": "qconv_im2col+"}.get(
        why.split(":")[0]
    )
    if prefix is not None:
        assert portable.startswith(prefix), kernels


# the direct small-C kernel (avx512vnni / avx2 where w − zw fits int8: a CNN's stem)
DIRECT = [
    ((1, 3, 23, 21), (16, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, "stem: 3 -> 16, 3x3 s2"),
    ((1, 7, 9, 10), (33, 7, 3, 3), {"pads": [0, 1, 2, 1], "dilations": [2, 1]}, "7 channels, M = 33"),
]


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs", "why"), DIRECT, ids=[d[3] for d in DIRECT])
def test_conv_output_clamp_direct_small_channel_path(x_shape, w_shape, attrs, why):
    del why  # the test id
    rng = np.random.default_rng(w_shape[0] * 13 + x_shape[1])
    case = random_case(rng, x_shape, w_shape, **attrs)
    case.w = rng.integers(-100, 101, w_shape).astype(np.int8)
    case.zw = rng.integers(-20, 21, w_shape[0]).astype(np.int8)
    from .test_conv_native import derive_output

    check_clamped(derive_output(case, np.uint8))


@given(conv_cases(), st.integers(0, 2**32 - 1))
def test_conv_output_clamp_matches_twin_over_the_geometry_space(case, seed):
    """The geometry space of test_conv_native with a drawn clamp [lo, hi] in y's codes."""
    info = np.iinfo(np.asarray(case.zy).dtype)
    rng = np.random.default_rng(seed)
    lo, hi = sorted(int(v) for v in rng.integers(info.min, info.max + 1, 2))
    want = twin(case, (lo, hi))
    for isa in ISAS:
        conv = make_conv(case, isa)
        got = conv.qlinear(case.x, case.zx, case.m, case.zy, case.bias, num_threads=2, clamp=(lo, hi))
        assert_bitexact(want, got, case, f"{conv.kernel} clamp=({lo}, {hi})")


def test_twin_output_clamp_is_the_clamp_of_the_unclamped_codes():
    """Eq. (6c) on the twin: clamping inside the float epilogue (the kernels) equals
    clamping the codes after requantization, including ties (x.5 products)."""
    x = np.array([[[1, 2, 3, 4, 5, 6, 7, 9]]], np.uint8)
    w = np.array([[[1]]], np.int8)
    # acc = x − zx = -2..6; m = 0.5: products -1, -0.5, 0, 0.5, ... 3 round half to even
    y = qlinear_conv(x, 0.5, 3, w, 1.0, 0, 1.0, np.uint8(130))
    assert y.tolist() == [[[129, 130, 130, 130, 131, 132, 132, 133]]]
    clamped = qlinear_conv(x, 0.5, 3, w, 1.0, 0, 1.0, np.uint8(130), output_clamp=[130, 132])
    assert clamped.tolist() == np.clip(y, 130, 132).tolist() == [[[130, 130, 130, 130, 131, 132, 132, 132]]]


@pytest.mark.parametrize(
    ("clamp", "message"),
    [
        ((-1, 200), "expected 0 <= lo <= hi <= 255"),
        ((10, 256), "expected 0 <= lo <= hi <= 255"),
        ((9, 3), "expected 0 <= lo <= hi <= 255"),
        ((1, 2, 3), "expected None or a pair"),
    ],
)
def test_conv_output_clamp_refuses_bounds_outside_the_codes(clamp, message):
    x = np.zeros((1, 1, 3, 3), np.uint8)
    conv = _native.QConv(np.ones((2, 1, 1, 1), np.int8), np.int8(0))
    with pytest.raises(ValueError, match=message):
        conv.qlinear(x, np.uint8(0), np.float32(1), np.uint8(0), clamp=clamp)
    with pytest.raises(ValueError, match=message):
        conv.prepare(np.uint8(0), np.float32(1), np.uint8(0), clamp=clamp)
    if len(clamp) == 2:
        with pytest.raises(OpError, match=r"output_clamp: expected \[lo, hi\] with 0 <= lo <= hi <= 255"):
            ms_qlinear_conv_op(
                OpContext(),
                x,
                *(np.float32(1), np.uint8(0), np.ones((2, 1, 1, 1), np.int8), np.float32(1), np.int8(0)),
                *(np.float32(1), np.uint8(0)),
                output_clamp=list(clamp),
            )
