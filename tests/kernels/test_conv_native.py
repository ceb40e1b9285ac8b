"""Differential tests of the native convolution kernels (quanta/kernels/cpp/conv).

Every ISA the CPU runs (portable always) and thread counts 1 and 2 are compared
bit-exactly (bytes) against the NumPy twins ``reference/qlinear_conv.py`` (QLinearConv)
and ``reference/integer_ops.py::conv_integer`` (ConvInteger), which are tested against
their loop form elsewhere; equal to the twin means equal to each other. Tolerance
everywhere: 0 — the accumulator is exact int32 arithmetic (wrapping) on every path, and
the requantization performs the float32 operations of ``reference/requant.py`` in the
same order.

The channels_last mode (x [N, *spatial, C], y [N, *out, M]; the com.microsoft
QLinearConv of ``reference/ms_qlinear_conv.py``) is compared the same way, against the
same twin with the channel axis moved, over the same hypothesis space and its own paths.

Defaults are not coincidental (docs/style.md §6): zero points drawn per operand and per
channel, per-channel weight scales that differ, odd channel counts (3, 7, 17) and odd
spatial sizes, asymmetric pads, output parameters derived from the accumulator range so
that both saturation ends occur. The three paths of conv.h (depthwise, implicit, im2col)
are each hit on purpose (the kernel name says which ran); hypothesis covers the space of
geometries in between.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from quanta.kernels import _native
from quanta.kernels.reference import qgemm as ref_qgemm
from quanta.kernels.reference.conv_geometry import conv_attrs
from quanta.kernels.reference.integer_ops import conv_integer
from quanta.kernels.reference.ms_qlinear_conv import ms_qlinear_conv_op
from quanta.kernels.reference.qlinear_conv import qlinear_conv
from quanta.kernels.reference.registry import MS_DOMAIN, OpContext, OpError, get_op
from quanta.passes.lower.requant_params import float_multiplier

from .test_qgemm_avx2 import pair_safe_codes

ISAS: list[str] = list(_native.supported_isas())  # portable first; always present
THREADS = (1, 2)


@dataclass
class ConvCase:
    """One convolution; ``attrs`` are the ONNX geometry attributes (group included)."""

    x: np.ndarray
    w: np.ndarray
    zx: np.ndarray  # 0-d, x's dtype
    zw: np.ndarray  # 0-d or [M], w's dtype
    sw: np.ndarray  # float32, 0-d or [M]
    attrs: dict = field(default_factory=dict)
    bias: np.ndarray | None = None
    sx: float = 0.0173  # float32 when passed on (the twin and the binding both cast)
    sy: float = 1.0
    zy: np.ndarray = field(default_factory=lambda: np.array(0, np.uint8))

    @property
    def m(self) -> np.ndarray:
        """The requantization multiplier as the lowering derives it (what the binding takes)."""
        return float_multiplier(np.float32(self.sx), self.sw, np.float32(self.sy))

    def accumulator(self) -> np.ndarray:
        """acc of eq. (4) (the twin's int32, wrapped) plus the bias, in int64."""
        acc = conv_integer(self.x, self.w, self.zx, self.zw, **self.attrs).astype(np.int64)
        if self.bias is not None:
            acc += self.bias.reshape((-1,) + (1,) * (self.x.ndim - 2))
        return acc

    def describe(self) -> str:
        def short(v):
            v = np.asarray(v)
            return v.tolist() if v.size <= 4 else [*v.reshape(-1)[:4].tolist(), "..."]

        return (
            f"x {self.x.dtype}{self.x.shape} zx={int(self.zx)}, w {self.w.dtype}{self.w.shape} zw={short(self.zw)}, "
            f"attrs={self.attrs}, sx={self.sx}, sw={short(self.sw)}, sy={self.sy}, zy={self.zy!r}, "
            f"bias={'yes' if self.bias is not None else 'no'}"
        )


def derive_output(case: ConvCase, y_dtype, spread: float = 1.0) -> ConvCase:
    """sy, zy from the real range of the accumulator (XNNPACK): outputs cover y's range;
    ``spread`` < 1 pushes both ends into saturation."""
    acc = case.accumulator()
    sw = np.asarray(case.sw, np.float64).reshape((-1,) + (1,) * (case.x.ndim - 2))
    real = acc * float(case.sx) * (sw if sw.size > 1 else sw.reshape(()))
    lo, hi = min(float(real.min(initial=0.0)), 0.0), max(float(real.max(initial=0.0)), 0.0)
    info = np.iinfo(y_dtype)
    sy = (hi - lo) / (info.max - info.min) * spread if hi > lo else 1.0
    case.sy = np.float32(max(sy, 1e-6))
    case.zy = np.array(int(np.clip(round(info.min - lo / float(case.sy)), info.min, info.max)), y_dtype)
    return case


def twin_qlinear(case: ConvCase) -> np.ndarray:
    return qlinear_conv(
        case.x, case.sx, case.zx, case.w, case.sw, case.zw, case.sy, case.zy, case.bias, **case.attrs
    )


def twin_integer(case: ConvCase) -> np.ndarray:
    return conv_integer(case.x, case.w, case.zx, case.zw, **case.attrs)


def make_conv(case: ConvCase, isa: str):
    return _native.QConv(case.w, case.zw, isa=isa, **case.attrs)


def run_qlinear(conv, case: ConvCase, threads: int) -> np.ndarray:
    """Per-call parameters, and the same through prepare() + qlinear_prepared() (what the
    binder does with constant parameters): the same bytes, on every case of this file."""
    y = conv.qlinear(case.x, case.zx, case.m, case.zy, case.bias, num_threads=threads)
    conv.prepare(case.zx, case.m, case.zy, case.bias)
    assert conv.qlinear_prepared(case.x, num_threads=threads).tobytes() == y.tobytes(), "prepared"
    return y


def run_integer(conv, case: ConvCase, threads: int) -> np.ndarray:
    return conv.integer(case.x, case.zx, num_threads=threads)


def assert_bitexact(expected: np.ndarray, actual: np.ndarray, case: ConvCase, label: str) -> None:
    """Bytes equal, or a report: how many differ, the first bad (n, m, *o), expected vs
    actual, its accumulator, and every parameter."""
    if (
        expected.dtype == actual.dtype
        and expected.shape == actual.shape
        and expected.tobytes() == actual.tobytes()
    ):
        return
    if expected.dtype != actual.dtype or expected.shape != actual.shape:
        raise AssertionError(
            f"{label}: expected {expected.dtype}{expected.shape}, got {actual.dtype}{actual.shape}; {case.describe()}"
        )
    bad = np.argwhere(expected != actual)
    first = tuple(int(i) for i in bad[0])
    acc = case.accumulator()[first]
    channels = np.unique(bad[:, 1])
    raise AssertionError(
        f"{label}: {len(bad)} of {expected.size} outputs differ; first bad (n, m, *o) = {first}: "
        f"expected {expected[first]!r}, actual {actual[first]!r}, accumulator {int(acc)}; "
        f"channels with errors {channels[:8].tolist()}{'...' if len(channels) > 8 else ''}; {case.describe()}"
    )


def check(case: ConvCase, isas=tuple(ISAS), ops=("qlinear", "integer")) -> list[str]:
    """Twin vs every ISA x thread count; returns the kernel names that ran."""
    kernels = []
    expected = {}
    if "qlinear" in ops:
        expected["qlinear"] = twin_qlinear(case)
    if "integer" in ops:
        expected["integer"] = twin_integer(case)
    for isa in isas:
        conv = make_conv(case, isa)
        kernels.append(conv.kernel)
        for threads in THREADS:
            for op, want in expected.items():
                run = run_qlinear if op == "qlinear" else run_integer
                assert_bitexact(want, run(conv, case, threads), case, f"{op} {conv.kernel} threads={threads}")
    return kernels


def random_case(
    rng: np.random.Generator,
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    *,
    x_dtype=np.uint8,
    w_dtype=np.int8,
    y_dtype=np.uint8,
    per_channel: bool = True,
    symmetric_w: bool = False,
    bias: bool = True,
    **attrs,
) -> ConvCase:
    """Random data with non-zero zero points (per operand, per channel) and distinct scales."""
    xi, wi = np.iinfo(x_dtype), np.iinfo(w_dtype)
    M = w_shape[0]
    x = rng.integers(xi.min, xi.max + 1, x_shape).astype(x_dtype)
    w = rng.integers(wi.min, wi.max + 1, w_shape).astype(w_dtype)
    zx = np.array(rng.integers(xi.min, xi.max + 1), x_dtype)
    if symmetric_w:
        zw = np.array(0 if w_dtype == np.int8 else 128, w_dtype)
    elif per_channel:
        zw = rng.integers(wi.min, wi.max + 1, M).astype(w_dtype)
    else:
        zw = np.array(rng.integers(wi.min, wi.max + 1), w_dtype)
    sw = rng.uniform(0.002, 0.02, M).astype(np.float32) if per_channel else np.float32(0.0071)
    b = rng.integers(-5000, 5000, M).astype(np.int32) if bias else None
    case = ConvCase(x, w, zx, zw, np.asarray(sw, np.float32), attrs, b)
    return derive_output(case, y_dtype)


# --------------------------------------------------------------------------------------
# Hypothesis: the space of geometries
# --------------------------------------------------------------------------------------


@st.composite
def conv_cases(draw) -> ConvCase:
    """Conv geometry (PyTorch ``tensor_conv`` style): rank, groups (dense, grouped,
    depthwise), odd channel counts, kernel 1/3/5 (rectangular allowed), strides and
    dilations 1/2, asymmetric pads or an auto_pad mode, odd spatial sizes."""
    rank = draw(st.sampled_from((2, 2, 2, 1)))
    kind = draw(st.sampled_from(("dense", "grouped", "depthwise")))
    if kind == "depthwise":
        group = draw(st.sampled_from((3, 7, 17, 32)))
        cg, mg = 1, 1
    else:
        group = 1 if kind == "dense" else draw(st.sampled_from((2, 3)))
        cg = draw(st.sampled_from((1, 3, 4, 7, 8, 17)))
        mg = draw(st.sampled_from((1, 3, 7, 17, 33)))
    kernel = tuple(draw(st.sampled_from((1, 3, 5))) for _ in range(rank))
    strides = [draw(st.sampled_from((1, 2))) for _ in range(rank)]
    dilations = [draw(st.sampled_from((1, 1, 2))) for _ in range(rank)]
    auto_pad = draw(st.sampled_from(("NOTSET", "NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")))
    pads = [draw(st.integers(0, 2)) for _ in range(2 * rank)]
    spatial = []
    for i in range(rank):
        extent = dilations[i] * (kernel[i] - 1) + 1
        size = draw(st.sampled_from((1, 3, 5, 7, 9, 11, 13, 19, 23)))
        room = 0 if auto_pad in ("VALID", "SAME_UPPER", "SAME_LOWER") else pads[i] + pads[i + rank]
        spatial.append(max(size, extent - room))  # the kernel fits the padded input
    n = draw(st.sampled_from((1, 1, 2)))
    attrs = {"group": group, "strides": strides, "dilations": dilations}
    if auto_pad == "NOTSET":
        attrs["pads"] = pads
    else:
        attrs["auto_pad"] = auto_pad
    x_dtype = draw(st.sampled_from((np.uint8, np.uint8, np.int8)))
    w_dtype = draw(st.sampled_from((np.int8, np.int8, np.uint8)))
    y_dtype = draw(st.sampled_from((np.uint8, np.int8)))
    zp = draw(st.sampled_from(("per_channel", "per_tensor", "symmetric")))
    seed = draw(st.integers(0, 2**32 - 1))
    return random_case(
        np.random.default_rng(seed),
        (n, cg * group, *spatial),
        (mg * group, cg, *kernel),
        x_dtype=x_dtype,
        w_dtype=w_dtype,
        y_dtype=y_dtype,
        per_channel=zp == "per_channel",
        symmetric_w=zp == "symmetric",
        bias=draw(st.booleans()),
        **attrs,
    )


@given(conv_cases())
def test_native_conv_matches_twin_every_isa_and_thread_count(case):
    check(case)


# --------------------------------------------------------------------------------------
# Paths and shapes with reasons
# --------------------------------------------------------------------------------------

# (x shape, w shape, attrs, why)
# the avx2 pair kernel (sw = 1 or 2, dw = 1): 16-pixel blocks, even / odd pixels at sw =
# 1; the same geometries NCHW and channels_last
AVX2_PAIR_DEPTHWISE = [
    ((1, 3, 5, 33), (3, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "OW 33: two 16-pixel blocks and one pixel"),
    ((1, 7, 6, 16), (7, 1, 3, 3), {"pads": [0, 1, 1, 1]}, "OW 16: one full block"),
    ((1, 17, 7, 35), (17, 1, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, "stride 2, OW 18"),
    ((1, 3, 9, 31), (3, 1, 3, 3), {"pads": [1, 0, 1, 0], "strides": [1, 2]}, "sw 2, sh 1, OW 15"),
    ((1, 7, 11, 17), (7, 1, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 1]}, "sh 2, sw 1, OW 17"),
    ((1, 3, 8, 21), (3, 1, 2, 4), {"pads": [0, 1, 1, 2]}, "even kw: pairs without a lone tap"),
    ((1, 3, 9, 19), (3, 1, 3, 3), {"pads": [2, 1, 2, 1], "dilations": [2, 1]}, "dh 2, dw 1: pairs"),
    ((1, 3, 13, 13), (3, 1, 11, 11), {"pads": [5, 5, 5, 5]}, "11x11: 66 pairs, the gather form"),
]


DEPTHWISE = [
    ((1, 7, 9, 11), (7, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "3x3 stride 1, rows of 11: one 16-lane block"),
    ((2, 17, 7, 7), (17, 1, 3, 3), {"pads": [1, 0, 1, 2]}, "OW <= 8: two rows per vector, odd row count"),
    ((1, 3, 28, 28), (3, 1, 3, 3), {"pads": [0, 1, 1, 0], "strides": [2, 2]}, "MobileNet stride 2, OW 14"),
    ((1, 5, 40, 37), (5, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "wide rows: padded copy, 4 blocks per group"),
    ((1, 7, 14, 21), (7, 1, 5, 5), {"pads": [2, 2, 2, 2]}, "5x5: two tap groups, the second of 1 tap"),
    (
        (1, 3, 17, 19),
        (3, 1, 5, 5),
        {"pads": [2, 1, 0, 2], "strides": [2, 2], "dilations": [2, 2]},
        "5x5 s2 d2",
    ),
    (
        (1, 3, 23, 23),
        (3, 1, 3, 3),
        {"pads": [3, 3, 3, 3], "strides": [3, 3], "dilations": [3, 3]},
        "taps past one 16-byte lane: scalar gathers",
    ),
    ((1, 4, 13, 15), (4, 1, 7, 7), {"pads": [3, 3, 3, 3]}, "7x7: two groups of 4 taps"),
    ((1, 6, 5, 9), (6, 1, 1, 1), {}, "1x1 depthwise"),
    ((2, 6, 31), (6, 1, 5), {"pads": [2, 1], "strides": [2]}, "1-D"),
    ((1, 3, 1, 1), (3, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "a 1x1 image: every tap but one is padding"),
    # avx2: 16 channels, two pixels a vector where their taps are 16 bytes apart (odd and
    # even widths, pads on every side, up to 25 taps; 49 taps and stride 2 one at a time)
    ((2, 16, 5, 21), (16, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "16 channels: pixel pairs, OW 21"),
    ((1, 16, 6, 10), (16, 1, 3, 3), {"pads": [0, 2, 1, 0]}, "16 channels: pairs, OW 11, pads 0/2"),
    ((1, 16, 9, 12), (16, 1, 5, 5), {"pads": [2, 2, 2, 2], "dilations": [1, 2]}, "16 channels: 5x5 dw 2"),
    ((1, 16, 9, 9), (16, 1, 7, 7), {"pads": [3, 3, 3, 3]}, "16 channels: 49 taps, one pixel a vector"),
    ((1, 16, 7, 14), (16, 1, 3, 3), {"pads": [1, 1, 1, 1], "strides": [1, 2]}, "16 channels: sw 2"),
    # avx2: multiples of 32 channels in the 32-channel order
    ((1, 32, 5, 7), (32, 1, 3, 3), {"pads": [0, 1, 2, 1]}, "32 channels: one 32-channel block"),
    ((2, 96, 7, 6), (96, 1, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, "96 channels: 3 blocks, s2"),
    ((1, 64, 4, 5), (64, 1, 2, 2), {}, "64 channels: 4 taps, no lone tap"),
    *AVX2_PAIR_DEPTHWISE,
]


# NCHW depthwise runs on the channel planes, or (stride 1, small planes: the per-plane
# work is too short) through the channels_last kernel between two transposes; the
# environment variable pins one path, so every case runs on both.
DW_PATHS = ("planes", "transposed")


@pytest.mark.parametrize("path", DW_PATHS)
@pytest.mark.parametrize(("x_shape", "w_shape", "attrs", "why"), DEPTHWISE, ids=[d[3] for d in DEPTHWISE])
def test_depthwise_path(x_shape, w_shape, attrs, why, path, monkeypatch):
    del why  # the test id
    monkeypatch.setenv("QUANTA_CONV_DW_PATH", path)
    rng = np.random.default_rng(len(x_shape) * 1000 + x_shape[1])
    case = random_case(rng, x_shape, w_shape, group=x_shape[1], **attrs)
    kernels = check(case)
    assert all(k.startswith("qconv_dw_") for k in kernels), kernels


# (x shape, w shape, attrs, why): the transposed path's own edges
DEPTHWISE_TRANSPOSED = [
    ((2, 67, 7, 7), (67, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "67 channels: two channel blocks, 2 images"),
    (
        (1, 130, 9, 13),
        (130, 1, 3, 3),
        {"pads": [1, 0, 1, 2]},
        "117 pixels: two pixel blocks back, C % 64 = 2",
    ),
    ((1, 9, 5, 5), (9, 1, 5, 5), {"pads": [2, 2, 2, 2]}, "5x5 on a 5x5 plane: most taps are padding"),
    ((2, 17, 23), (17, 1, 3), {"pads": [1, 1]}, "1-D"),
]


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs", "why"), DEPTHWISE_TRANSPOSED, ids=[d[3] for d in DEPTHWISE_TRANSPOSED]
)
def test_depthwise_transposed_path_edges(x_shape, w_shape, attrs, why, monkeypatch):
    del why  # the test id
    monkeypatch.setenv("QUANTA_CONV_DW_PATH", "transposed")
    rng = np.random.default_rng(x_shape[1] * 7 + x_shape[-1])
    for x_dtype in (np.uint8, np.int8):
        check(random_case(rng, x_shape, w_shape, group=x_shape[1], x_dtype=x_dtype, **attrs))


GEMM = [
    (
        (1, 8, 9, 11),
        (5, 8, 3, 3),
        {"pads": [1, 1, 1, 1]},
        "implicit: stride 1, 8-row tiles cross output rows (OW = 11)",
    ),
    (
        (2, 8, 11, 13),
        (33, 8, 3, 3),
        {"pads": [0, 1, 2, 1], "strides": [2, 2]},
        "implicit: stride 2, per-row A pointers across output rows, N=33",
    ),
    (
        (1, 12, 9, 9),
        (6, 4, 3, 3),
        {"pads": [2, 1, 0, 3], "dilations": [2, 2], "group": 3},
        "implicit: groups, one chunk per tap, 9 taps in one call",
    ),
    ((1, 4, 5, 5), (32, 4, 1, 1), {"strides": [2, 2]}, "implicit: 1x1 stride 2, N = NR"),
    ((2, 8, 7, 9), (17, 8, 1, 1), {}, "implicit: 1x1 stride 1, units transpose their own rows"),
    ((1, 12, 5, 7), (9, 4, 1, 1), {"group": 3}, "implicit: 1x1 groups, own rows, per-group sums"),
    ((1, 1560, 3, 3), (17, 1560, 1, 1), {}, "implicit: a tap chunk of more than 1536 k, split"),
    (
        (1, 200, 5, 6),
        (19, 200, 3, 3),
        {"pads": [1, 1, 1, 1]},
        "implicit: 3 taps of 600 k, two calls (2 taps, then 1)",
    ),
    ((1, 520, 4, 4), (16, 520, 3, 3), {"pads": [1, 1, 1, 1]}, "implicit: merged taps of 1560 k, split"),
    ((1, 3, 11, 9), (7, 3, 3, 3), {"pads": [1, 1, 1, 1]}, "im2col: 3 channels (27 k, padded to 28)"),
    ((2, 17, 7, 9), (31, 17, 1, 1), {}, "im2col: 1x1, 17 channels"),
    (
        (1, 6, 9, 10),
        (9, 2, 3, 3),
        {"pads": [1, 2, 1, 0], "dilations": [1, 2], "group": 3},
        "im2col: groups of 2",
    ),
    ((1, 7, 3, 3), (70, 7, 3, 3), {}, "im2col: 1 pixel, qgemm splits its panels over the threads"),
    ((1, 8, 3, 3), (70, 8, 3, 3), {}, "implicit: 1 pixel"),
    ((2, 8, 29), (9, 8, 3), {"pads": [1, 2], "strides": [2]}, "implicit: 1-D"),
    ((2, 6, 29), (9, 6, 3), {"pads": [1, 2], "strides": [2]}, "im2col: 1-D, 6 channels"),
]


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs", "why"), GEMM, ids=[g[3] for g in GEMM])
def test_gemm_paths(x_shape, w_shape, attrs, why):
    rng = np.random.default_rng(x_shape[1] * 31 + w_shape[0])
    case = random_case(rng, x_shape, w_shape, **attrs)
    kernels = check(case)
    vnni_or_portable = [k for isa, k in zip(ISAS, kernels) if isa != "avx2"]
    want = "qconv_implicit+" if why.startswith("implicit") else "qconv_im2col+"
    assert all(k.startswith(want) for k in vnni_or_portable), kernels
    # avx2, 8-bit weights: the int16 family, whose tiles read int16 x' (implicit over an
    # image widened to int16, or im2col), or the direct small-C kernel
    if "avx2" in ISAS:
        assert kernels[ISAS.index("avx2")] == expected_avx2_int16_kernel(case), kernels


INT16_FAMILY = "qgemm_u8s8_s32_6x16c2__avx2"


def expected_avx2_int16_kernel(case: ConvCase) -> str:
    """The kernel conv.cc takes on avx2 for 8-bit weights that are not depthwise: the
    direct small-C kernel where its conditions hold (as expected_avx2_kernel's), else the
    int16 family on the implicit path when the kernel has more than one tap and a tap chunk
    (kw·Cg with one group and dilation 1 along W, else Cg) is whole pairs of k, else on
    im2col."""
    attrs = case.attrs
    group = attrs.get("group", 1)
    cg, kw = case.w.shape[1], case.w.shape[-1]
    dw = attrs.get("dilations", [1] * (case.x.ndim - 2))[-1]
    taps = math.prod(case.w.shape[2:])
    if group == 1 and cg % 4 != 0 and taps > 1 and kw * cg <= 64 and case.w.shape[0] <= 64 and dw == 1:
        return "qconv_direct_u8s8_s32_6x16c2__avx2"
    chunk = kw * cg if dw == 1 and group == 1 else cg
    return ("qconv_implicit+" if taps > 1 and chunk % 2 == 0 else "qconv_im2col+") + INT16_FAMILY


# avx2, 8-bit weights, the implicit path of the int16 family: the padded image widened to
# int16 once (after the u8 shift of int8 x), row pointers and tap offsets in bytes of it.
# (x shape NCHW, w shape, attrs, why): channels 3, 7, 17; K > 258; groups; strides;
# dilations; tap chunks split over the B budget; a 1-pixel output; 1-D.
INT16_IMPLICIT = [
    ((1, 3, 13, 11), (70, 3, 3, 4), {"pads": [1, 2, 1, 1]}, "3 channels, 1x4 taps: 12 k a chunk, 70 outputs"),
    ((1, 7, 13, 11), (17, 7, 3, 3), {"pads": [1, 1, 1, 1]}, "7 channels 3x3: 21 k a chunk, im2col"),
    ((2, 7, 9, 10), (67, 7, 3, 2), {"pads": [0, 1, 2, 1]}, "7 channels, 14 k a chunk, 2 images"),
    ((1, 17, 8, 9), (3, 17, 3, 2), {"pads": [1, 1, 1, 1], "strides": [1, 2]}, "17 channels, 3 outputs"),
    ((1, 36, 7, 8), (33, 36, 3, 3), {"pads": [1, 1, 1, 1]}, "K = 324 > 258, 33 outputs: 3 panels"),
    ((1, 64, 15, 13), (48, 64, 3, 3), {"pads": [1, 1, 1, 1]}, "195 rows: 6-row tiles and a 3-row one"),
    ((1, 520, 4, 4), (16, 520, 3, 3), {"pads": [1, 1, 1, 1]}, "merged taps of 1560 k, split in pieces"),
    ((1, 12, 9, 9), (6, 4, 3, 3), {"pads": [2, 1, 0, 3], "dilations": [2, 2], "group": 3}, "groups of 4"),
    ((1, 6, 9, 10), (9, 2, 3, 3), {"pads": [1, 2, 1, 0], "group": 3}, "groups of 2 channels"),
    ((1, 8, 11, 13), (9, 8, 3, 3), {"dilations": [1, 2], "strides": [2, 1]}, "dilation 2: chunk = Cg"),
    ((2, 8, 29), (7, 8, 3), {"pads": [1, 2], "strides": [2]}, "1-D"),
    ((1, 8, 3, 3), (70, 8, 3, 3), {}, "1 pixel, 5 panels"),
    ((1, 18, 9, 9), (17, 18, 1, 1), {"pads": [1, 0, 0, 1]}, "1x1 padded: one tap, im2col"),
]


@pytest.mark.skipif("avx2" not in ISAS, reason="this CPU does not run avx2")
@pytest.mark.parametrize(
    ("x_dtype", "w_dtype"), [(np.uint8, np.int8), (np.int8, np.int8), (np.uint8, np.uint8)]
)
@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs", "why"), INT16_IMPLICIT, ids=[s[3] for s in INT16_IMPLICIT]
)
def test_avx2_int16_family_implicit_path(x_shape, w_shape, attrs, why, x_dtype, w_dtype):
    """8-bit weights (the int16 family, vpmaddwd) on the implicit path where a tap chunk is
    whole k-pairs, NCHW and channels_last, 1 and 2 threads, against the twin: full-range
    weights (|w'| up to 128), per-channel zero points (the Σx' term from the uint8 image's
    pixel sums) and scales that differ, int8 x (the +128 shift before the widening)."""
    del why
    rng = np.random.default_rng(sum(x_shape) * 11 + sum(w_shape))
    for y_dtype in (np.uint8, np.int8):
        case = random_case(
            rng,
            x_shape,
            w_shape,
            x_dtype=x_dtype,
            w_dtype=w_dtype,
            y_dtype=y_dtype,
            per_channel=True,
            **attrs,
        )
        w = case.w.astype(np.int32)
        assert np.abs(w - (128 if w_dtype == np.uint8 else 0)).max() > 64, "the weights must not fit 7 bits"
        want = expected_avx2_int16_kernel(case)
        kernels = check(case)
        assert kernels[ISAS.index("avx2")] == want, kernels
        kernels = check_nhwc(case)
        assert kernels[ISAS.index("avx2")] == want, kernels


# NCHW 1x1 / stride 1 / no pads / one group runs as the transposed GEMM y[m, p] = Σ_c
# w[m, c]·x[c, p] (x packed as qgemm's B, qgemm's per-row output stage) from 256 pixels per
# image, else through the transposes; QUANTA_CONV_PW_PATH pins one, so each case runs both.
PW_PATHS = ("gemm", "transposed")
POINTWISE = [
    ((1, 7, 17, 19), (5, 7, 1, 1), "7 channels (K not a multiple of 4), 323 pixels"),
    ((2, 17, 16, 17), (33, 17, 1, 1), "2 images, 33 outputs (a partial 8-row tile), 272 pixels"),
    ((1, 64, 20, 20), (70, 64, 1, 1), "400 pixels (the default choice): 12 full panels + 16"),
    ((1, 300, 5, 13), (17, 300, 1, 1), "K = 300 > 258, 65 pixels"),
    ((2, 3, 300), (9, 3, 1), "1-D, 3 channels"),
    ((1, 8, 1, 33), (3, 8, 1, 1), "33 pixels: one panel and a column"),
]


@pytest.mark.parametrize("path", PW_PATHS)
@pytest.mark.parametrize(("x_shape", "w_shape", "why"), POINTWISE, ids=[c[2] for c in POINTWISE])
@pytest.mark.parametrize(
    ("x_dtype", "w_dtype", "per_channel"),
    [
        (np.uint8, np.int8, True),
        (np.int8, np.int8, False),
        (np.uint8, np.uint8, True),
        (np.int8, np.uint8, False),
    ],
)
def test_pointwise_nchw_path(x_shape, w_shape, why, x_dtype, w_dtype, per_channel, path, monkeypatch):
    del why  # the test id
    monkeypatch.setenv("QUANTA_CONV_PW_PATH", path)
    rng = np.random.default_rng(x_shape[1] * 13 + w_shape[0])
    for y_dtype in (np.uint8, np.int8):
        case = random_case(
            rng, x_shape, w_shape, x_dtype=x_dtype, w_dtype=w_dtype, y_dtype=y_dtype, per_channel=per_channel
        )
        check(case)


@given(conv_cases())
def test_native_conv_with_the_pointwise_gemm_pinned(case):
    """The hypothesis space again with the pointwise NCHW GEMM forced wherever it applies
    (its default threshold of 256 pixels keeps most drawn shapes on the transposes)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QUANTA_CONV_PW_PATH", "gemm")
        check(case)


@pytest.mark.parametrize("w_dtype", [np.int8, np.uint8])
def test_pointwise_operand_outlives_the_callers_weights(w_dtype, monkeypatch):
    """The pointwise NCHW GEMM reads the weights' own bytes in place (no copy): the QConv
    keeps the array alive after its caller drops it, and memory reused since changes
    nothing."""
    import gc

    monkeypatch.setenv("QUANTA_CONV_PW_PATH", "gemm")
    rng = np.random.default_rng(17)
    info = np.iinfo(w_dtype)
    w = rng.integers(info.min, info.max + 1, (7, 300, 1, 1), dtype=w_dtype)
    zw = rng.integers(info.min // 2 + 1, info.max // 2, 7).astype(w_dtype)  # distinct per channel
    x = rng.integers(0, 256, (1, 300, 17, 19), dtype=np.uint8)
    expected = conv_integer(x, w, 131, zw)
    conv = _native.QConv(w.copy(), zw)
    gc.collect()
    clobber = [np.full(w.shape, 99, w_dtype) for _ in range(16)]  # reuse what was freed
    np.testing.assert_array_equal(conv.integer(x, 131), expected)
    del clobber


@pytest.mark.parametrize("mode", ["VALID", "SAME_UPPER", "SAME_LOWER"])
def test_auto_pad_modes_with_odd_total_padding(mode):
    # W = 10, kernel 4, stride 3: total padding 3, odd -> SAME_UPPER and SAME_LOWER differ
    rng = np.random.default_rng(3)
    for group, w_shape in ((1, (5, 4, 3, 4)), (4, (4, 1, 3, 4))):
        case = random_case(rng, (1, 4, 9, 10), w_shape, group=group, strides=[2, 3], auto_pad=mode)
        check(case)


def test_batch_of_zero_images():
    rng = np.random.default_rng(5)
    for w_shape, group in (((8, 8, 3, 3), 1), ((8, 1, 3, 3), 8), ((5, 8, 3, 3), 1)):
        case = random_case(rng, (0, 8, 7, 7), w_shape, group=group, pads=[1, 1, 1, 1])
        for isa in ISAS:
            conv = make_conv(case, isa)
            assert run_qlinear(conv, case, 2).shape == (0, w_shape[0], 7, 7)
            assert run_integer(conv, case, 1).shape == (0, w_shape[0], 7, 7)


# --------------------------------------------------------------------------------------
# Hazards, one test each
# --------------------------------------------------------------------------------------


def test_int32_accumulator_wraps_like_onnx():
    # K = 66000, x' = 255, w = -128: acc = -2.15e9 < -2^31 wraps (ONNX's int32 accumulator)
    x = np.full((1, 66000, 1, 2), 255, np.uint8)
    w = np.full((3, 66000, 1, 1), -128, np.int8)
    w[1] = 127
    case = ConvCase(x, w, np.array(0, np.uint8), np.array(0, np.int8), np.float32(0.01))
    exact = 66000 * 255 * -128
    assert exact < -(2**31) and twin_integer(case)[0, 0, 0, 0] == exact + 2**32
    check(case, ops=("integer",))


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("kw", [3, 4])
def test_depthwise_weight_zero_point_outside_int8(stride, kw):
    # w − zw does not fit int8 (-228, 255): the kernel keeps w' and adds the − zw'·Σx' term
    # (the avx2 pair kernel: a lone last tap of an odd kw must not enter Σx')
    rng = np.random.default_rng(11)
    for w_dtype, zw in ((np.int8, 100), (np.uint8, 0), (np.uint8, 255)):
        case = random_case(
            rng,
            (1, 5, 9, 19),
            (5, 1, 3, kw),
            w_dtype=w_dtype,
            group=5,
            pads=[1, 1, 1, 1],
            strides=[stride, stride],
        )
        case.zw = np.full(5, zw, w_dtype)
        case.w.reshape(-1)[::2] = np.iinfo(w_dtype).min
        case.w.reshape(-1)[1::2] = np.iinfo(w_dtype).max
        check(derive_output(case, np.uint8))


def test_int8_activation_shift_at_both_ends():
    # x' = x + 128 for vpdpbusd; zx at -128 and 127 with x at both ends
    for zx in (-128, 127):
        for group, w_shape in ((1, (9, 8, 3, 3)), (8, (8, 1, 3, 3)), (1, (9, 3, 3, 3))):
            rng = np.random.default_rng(abs(zx) + group)
            c = w_shape[1] * group
            case = random_case(rng, (1, c, 7, 9), w_shape, x_dtype=np.int8, group=group, pads=[1, 1, 1, 1])
            case.x = np.where(rng.random(case.x.shape) < 0.5, -128, 127).astype(np.int8)
            case.zx = np.array(zx, np.int8)
            check(derive_output(case, np.int8))


def test_requantization_ties_round_half_even():
    # m = f32(f32(0.5 * 1) / 1) = 0.5 exactly; acc = x − zx (1x1, w = 1): odd acc are ties
    x = np.arange(-7, 9, dtype=np.int8).reshape(1, 1, 4, 4) + np.int8(0)
    x = np.concatenate([x] * 4, axis=1)  # 4 channels: the implicit path
    for group, w in ((1, np.ones((4, 4, 1, 1), np.int8)), (4, np.ones((4, 1, 1, 1), np.int8))):
        if group == 1:
            w = np.eye(4, dtype=np.int8).reshape(4, 4, 1, 1)
        case = ConvCase(
            x,
            w,
            np.array(0, np.int8),
            np.array(0, np.int8),
            np.float32(1.0),
            {"group": group},
            sx=np.float32(0.5),
            sy=np.float32(1.0),
            zy=np.array(3, np.int8),
        )
        for isa in ISAS:
            y = run_qlinear(make_conv(case, isa), case, 1)
            # 5·0.5 = 2.5 -> 2, 7·0.5 = 3.5 -> 4, -5·0.5 = -2.5 -> -2, -7·0.5 = -3.5 -> -4, then + 3
            acc = x[0, 0].astype(np.int64)
            want = (np.rint(acc * 0.5) + 3).astype(np.int8)
            assert np.array_equal(y[0, 0], want), (isa, y[0, 0], want)
        check(case)


@pytest.mark.parametrize("end", ["qmin", "qmax"])
def test_saturation(end):
    # every output saturates: real values far outside the output range
    rng = np.random.default_rng(17)
    for group, w_shape in ((1, (7, 8, 3, 3)), (8, (8, 1, 3, 3)), (1, (7, 3, 3, 3))):
        c = w_shape[1] * group
        case = random_case(
            rng, (1, c, 6, 7), w_shape, group=group, pads=[1, 1, 1, 1], symmetric_w=True, bias=False
        )
        case.x = np.full_like(case.x, 255)
        case.zx = np.array(0, np.uint8)
        case.w = np.abs(case.w.astype(np.int16)).clip(1, 127).astype(np.int8) * (1 if end == "qmax" else -1)
        case.sy, case.zy = np.float32(1e-3), np.array(100, np.uint8)
        y = twin_qlinear(case)
        assert np.all(y == (255 if end == "qmax" else 0))
        check(case, ops=("qlinear",))


# --------------------------------------------------------------------------------------
# The binding boundary
# --------------------------------------------------------------------------------------


def _simple(x_dtype=np.uint8):
    rng = np.random.default_rng(1)
    return random_case(rng, (1, 8, 5, 5), (6, 8, 3, 3), x_dtype=x_dtype, pads=[1, 1, 1, 1])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda c, s: c.qlinear(s.x[:, :7].copy(), s.zx, s.m, s.zy),
            r"QLinearConv: x: expected 8 channels \(w.shape\[1\] 8 \* group 1\), got 7",
        ),
        (
            lambda c, s: c.qlinear(s.x[0], s.zx, s.m, s.zy),
            r"QLinearConv: x: expected rank 4 \(N, C, H, W\) like w, got shape \(8, 5, 5\)",
        ),
        (
            lambda c, s: c.qlinear(s.x.astype(np.float32), s.zx, s.m, s.zy),
            "QLinearConv: x: expected int8 or uint8, got float32",
        ),
        (
            lambda c, s: c.qlinear(s.x[:, :, ::2], s.zx, s.m, s.zy),
            "QLinearConv: x: expected a C-contiguous array",
        ),
        (
            lambda c, s: c.qlinear(s.x, np.array(3, np.int8), s.m, s.zy),
            r"QLinearConv: x_zero_point: expected the type of its input \(uint8\), got int8",
        ),
        (
            lambda c, s: c.qlinear(s.x, s.zx, np.ones(5, np.float32), s.zy),
            r"QLinearConv: multiplier: expected a scalar or a 1-D tensor of 6 \(output channels\), got shape \(5,\)",
        ),
        (
            lambda c, s: c.qlinear(s.x, s.zx, s.m, np.array(3, np.int32)),
            "QLinearConv: y_zero_point: expected int8 or uint8, got int32",
        ),
        (
            lambda c, s: c.qlinear(s.x, s.zx, s.m, s.zy, np.zeros(6, np.int64)),
            r"QLinearConv: B: expected int32 of shape \(6,\), got int64 of shape \(6,\)",
        ),
        (
            lambda c, s: c.qlinear(s.x, s.zx, np.full(6, np.inf, np.float32), s.zy),
            "QLinearConv: multiplier: expected finite requantization multipliers, got inf",
        ),
        (
            lambda c, s: c.qlinear(s.x, s.zx, s.m, s.zy, num_threads=0),
            "QLinearConv: num_threads: expected >= 1, got 0",
        ),
        (
            lambda c, s: c.qlinear(s.x, s.zx, s.m, s.zy, out=np.empty((1, 6, 5, 4), np.uint8)),
            r"QLinearConv: out: expected shape \(1, 6, 5, 5\), got shape \(1, 6, 5, 4\)",
        ),
        (
            lambda c, s: c.integer(s.x, s.zx, out=np.empty((1, 6, 5, 5), np.uint8)),
            "ConvInteger: out: expected dtype int32, got uint8",
        ),
        (
            lambda c, s: c.integer(s.x, 300),
            r"ConvInteger: x_zero_point: expected a value in \[0, 255\], got 300",
        ),
    ],
)
def test_boundary_errors(call, message):
    s = _simple()
    conv = make_conv(s, ISAS[-1])
    with pytest.raises(ValueError, match=message):
        call(conv, s)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"w": np.zeros((2, 1, 3, 3, 3), np.int8)}, r"\(3-D convolutions have no native kernel\)"),
        ({"w": np.zeros((4, 2, 3, 3), np.float32)}, "w: expected int8 or uint8, got float32"),
        ({"group": 3}, "group: expected a divisor of M=4 \\(output channels\\), got 3"),
        ({"kernel_shape": [3, 2]}, r"kernel_shape: expected the spatial shape of w \(3, 3\), got \(3, 2\)"),
        ({"strides": [1, 0]}, r"strides: expected 2 values >= 1, got \[1, 0\]"),
        ({"pads": [1, 1, 1]}, r"pads: expected 4 values \(begin and end for 2 spatial axes\), got 3"),
        ({"pads": [1, -1, 1, 1]}, r"pads: expected values >= 0, got \[1, -1, 1, 1\]"),
        ({"auto_pad": "SAME"}, "auto_pad: expected one of NOTSET, VALID, SAME_UPPER, SAME_LOWER, got 'SAME'"),
        ({"w_zero_point": np.zeros(3, np.int8)}, r"w_zero_point: expected a scalar or a 1-D tensor of 4"),
        ({"w_zero_point": 200}, r"w_zero_point: expected a value in \[-128, 127\], got 200"),
    ],
)
def test_construction_errors(kwargs, message):
    args = {"w": np.zeros((4, 2, 3, 3), np.int8), **kwargs}
    with pytest.raises(ValueError, match=message):
        _native.QConv(**args)


def test_kernel_larger_than_padded_input_is_refused_like_the_twin():
    conv = _native.QConv(np.zeros((2, 3, 5, 5), np.int8), pads=[1, 0, 0, 0])
    msg = r"kernel: expected a dilated kernel extent <= padded input \(4\) on spatial axis 0, got 5"
    with pytest.raises(ValueError, match=msg):
        conv.integer(np.zeros((1, 3, 3, 9), np.uint8))
    with pytest.raises(Exception, match=msg):
        conv_attrs((1, 3, 3, 9), (5, 5), pads=[1, 0, 0, 0])


def test_out_buffer_is_written_and_must_not_overlap_x():
    s = _simple()
    conv = make_conv(s, ISAS[-1])
    out = np.empty((1, 6, 5, 5), np.uint8)
    assert run_qlinear(conv, s, 1) is not out
    y = conv.qlinear(s.x, s.zx, s.m, s.zy, s.bias, out=out)
    assert y is out and np.array_equal(out, twin_qlinear(s))
    buf = np.zeros(1 * 8 * 5 * 5 + 150, np.uint8)
    x_view = buf[: s.x.size].reshape(s.x.shape)
    x_view[...] = s.x
    with pytest.raises(ValueError, match="QLinearConv: out: expected a buffer that does not overlap x"):
        conv.qlinear(x_view, s.zx, s.m, s.zy, out=buf[50 : 50 + 150].reshape(1, 6, 5, 5))


def test_output_shape_and_properties():
    conv = _native.QConv(np.zeros((6, 1, 3, 3), np.uint8), 128, group=6, strides=[2, 2], pads=[1, 1, 1, 1])
    assert conv.output_shape((2, 6, 9, 10)) == (2, 6, 5, 5)
    assert conv.path == "depthwise" and conv.M == 6 and conv.group == 6 and conv.weights_dtype == "uint8"
    assert conv.kernel.startswith("qconv_dw_u8s8_s32_") and conv.isa == _native.active_isa()
    assert "QConv M=6 C/group=1 group=6" in repr(conv)


def test_concurrent_calls_on_one_object():
    # the object's workspace is used by one call at a time; a concurrent call gets its own
    s = random_case(np.random.default_rng(2), (1, 16, 23, 23), (24, 16, 3, 3), pads=[1, 1, 1, 1])
    conv = make_conv(s, ISAS[-1])
    want = twin_qlinear(s)
    errors = []

    def work():  # prepare() runs in every thread too: a call keeps the parameters it started with
        try:
            for _ in range(20):
                if not np.array_equal(run_qlinear(conv, s, 2), want):
                    errors.append("mismatch")
        except Exception as e:  # reported by the assert below
            errors.append(repr(e))

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# --------------------------------------------------------------------------------------
# channels_last: x [N, *spatial, C] and y [N, *out, M] (com.microsoft QLinearConv)
# --------------------------------------------------------------------------------------


def to_nhwc(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


def twin_qlinear_nhwc(case: ConvCase) -> np.ndarray:
    """The com.microsoft twin on the NHWC input (itself the ai.onnx twin, axis moved)."""
    inputs = (case.x, case.sx, case.zx, case.w, case.sw, case.zw, case.sy, case.zy, case.bias)
    inputs = (to_nhwc(case.x), *(np.asarray(v) if v is not None else None for v in inputs[1:]))
    return ms_qlinear_conv_op(OpContext(), *inputs, channels_last=1, **case.attrs)


def check_nhwc(case: ConvCase, isas=tuple(ISAS), ops=("qlinear", "integer")) -> list[str]:
    """channels_last: twin vs every ISA x thread count, and x left untouched (the kernels
    may read it in place); returns the kernel names that ran."""
    x = to_nhwc(case.x)
    x_before = x.copy()
    expected = {}
    if "qlinear" in ops:
        expected["qlinear"] = twin_qlinear_nhwc(case)
    if "integer" in ops:
        expected["integer"] = to_nhwc(twin_integer(case))
    kernels = []
    for isa in isas:
        conv = make_conv(case, isa)
        kernels.append(conv.kernel_channels_last)
        for threads in THREADS:
            for op, want in expected.items():
                if op == "qlinear":
                    got = conv.qlinear(
                        x,
                        case.zx,
                        case.m,
                        case.zy,
                        case.bias,
                        num_threads=threads,
                        channels_last=True,
                    )
                else:
                    got = conv.integer(x, case.zx, num_threads=threads, channels_last=True)
                # the report's indices are (n, m, *o): compare in the twin's layout
                assert_bitexact(
                    np.moveaxis(want, -1, 1),
                    np.moveaxis(got, -1, 1),
                    case,
                    f"{op} channels_last {conv.kernel_channels_last} threads={threads}",
                )
    assert np.array_equal(x, x_before), "channels_last: x was modified"
    return kernels


@given(conv_cases())
def test_native_conv_channels_last_matches_twin_every_isa_and_thread_count(case):
    check_nhwc(case)


def test_ms_twin_is_the_onnx_twin_with_the_channel_axis_moved():
    rng = np.random.default_rng(23)
    case = random_case(rng, (2, 6, 7, 9), (8, 3, 3, 3), group=2, pads=[1, 0, 2, 1], strides=[2, 1])
    want = twin_qlinear(case)
    assert get_op("QLinearConv", MS_DOMAIN) is ms_qlinear_conv_op
    assert np.array_equal(np.moveaxis(twin_qlinear_nhwc(case), -1, 1), want)
    inputs = (case.x, case.sx, case.zx, case.w, case.sw, case.zw, case.sy, case.zy, case.bias)
    inputs = tuple(np.asarray(v) for v in inputs)
    assert np.array_equal(ms_qlinear_conv_op(OpContext(), *inputs, **case.attrs), want)  # channels_last=0


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "channels_last", "message"),
    [
        ((8, 8), (4, 8, 3), 1, r"x: expected rank 3 \(1-D\) or more"),
        ((1, 8, 8), (4, 8, 3, 3), 1, r"x: expected rank 4 like w \[N, \*spatial, C\], got shape \(1, 8, 8\)"),
        ((1, 8, 8), (4, 8, 3), 2, "channels_last: expected 0 or 1, got 2"),
    ],
)
def test_ms_twin_refuses_a_bad_rank_or_layout(x_shape, w_shape, channels_last, message):
    x = np.zeros(x_shape, np.uint8)
    w = np.zeros(w_shape, np.int8)
    args = (np.float32(1), np.uint8(0), w, np.float32(1), np.int8(0), np.float32(1), np.uint8(0))
    with pytest.raises(OpError, match=message):
        ms_qlinear_conv_op(OpContext(), x, *args, channels_last=channels_last)


# (x shape NCHW, w shape, attrs, why)
DEPTHWISE_NHWC = [
    ((1, 3, 9, 11), (3, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "3 channels: a channel tail only"),
    ((2, 17, 7, 7), (17, 1, 3, 3), {"pads": [1, 0, 1, 2]}, "17 channels: avx2 block + tail"),
    (
        (1, 64, 6, 7),
        (64, 1, 3, 3),
        {"pads": [1, 1, 1, 1], "strides": [2, 2]},
        "64 channels: one full avx512 block",
    ),
    ((1, 70, 5, 9), (70, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "70 channels: block + tail of 6"),
    ((1, 7, 14, 21), (7, 1, 5, 5), {"pads": [2, 2, 2, 2]}, "5x5: 25 taps, a last group of 1"),
    (
        (1, 17, 17, 19),
        (17, 1, 5, 5),
        {"pads": [2, 1, 0, 2], "strides": [2, 2], "dilations": [2, 2]},
        "5x5 s2 d2",
    ),
    ((1, 33, 13, 15), (33, 1, 7, 7), {"pads": [3, 3, 3, 3]}, "7x7: 49 taps"),
    ((1, 6, 5, 9), (6, 1, 1, 1), {}, "1x1: one tap (a group of 1, a pair of 1)"),
    ((1, 5, 6, 7), (5, 1, 2, 2), {}, "2x2 no pads: every tap inside x"),
    ((2, 7, 31), (7, 1, 5), {"pads": [2, 1], "strides": [2]}, "1-D"),
    ((1, 3, 1, 1), (3, 1, 3, 3), {"pads": [1, 1, 1, 1]}, "a 1x1 image: every tap but one is padding"),
    *AVX2_PAIR_DEPTHWISE,
]


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs", "why"), DEPTHWISE_NHWC, ids=[d[3] for d in DEPTHWISE_NHWC]
)
@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
def test_depthwise_channels_last_path(x_shape, w_shape, attrs, why, x_dtype):
    del why  # the test id
    rng = np.random.default_rng(x_shape[1] * 7 + len(x_shape))
    case = random_case(rng, x_shape, w_shape, x_dtype=x_dtype, group=x_shape[1], **attrs)
    kernels = check_nhwc(case)
    assert all(k.startswith("qconv_dwc_") for k in kernels), kernels


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs", "why"), GEMM, ids=[g[3] for g in GEMM])
@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
def test_gemm_paths_channels_last(x_shape, w_shape, attrs, why, x_dtype):
    # uint8 x without pads is read in place; int8 x (flipped) and padded images are copied
    del why  # the test id
    rng = np.random.default_rng(x_shape[1] * 37 + w_shape[0])
    check_nhwc(random_case(rng, x_shape, w_shape, x_dtype=x_dtype, **attrs))


# avx2, 8-bit weights, im2col + the int16 family: full 16-column panels take the tile's
# inline output stage (16 outputs a row, one store), a partial last panel finish_vector;
# chunks are whole 6-row tiles, and units too few for the threads are one chunk (qgemm
# splits N). (x shape NCHW, w shape, attrs, why)
AVX2_GEMM = [
    ((1, 243, 10, 4), (37, 243, 3, 3), {"pads": [1, 1, 1, 1]}, "40 rows, K = 2187, 37 outputs: one chunk"),
    ((1, 32, 19, 17), (48, 32, 3, 3), {"pads": [1, 1, 1, 1]}, "323 rows: 6-row chunks, 3 full panels"),
    ((1, 64, 14, 14), (67, 64, 1, 1), {}, "1x1: 196 rows read in place (channels_last), 67 outputs"),
    ((2, 17, 9, 11), (32, 17, 1, 1), {"strides": [2, 2]}, "1x1 stride 2, 17 channels, 2 images"),
    ((1, 16, 13, 11), (16, 16, 1, 1), {}, "1x1 K = 16: x' widened as one stream, 143 rows"),
    ((1, 27, 7, 9), (20, 27, 1, 1), {}, "1x1 K = 27: rows of 28, the last vector overlapping"),
]


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs", "why"), AVX2_GEMM, ids=[g[3] for g in AVX2_GEMM])
@pytest.mark.parametrize("y_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("per_channel", [True, False])
def test_avx2_int16_gemm_output_stage(x_shape, w_shape, attrs, why, y_dtype, per_channel):
    del why  # the test id
    rng = np.random.default_rng(x_shape[1] * 41 + w_shape[0])
    # per_channel False: one zero point (nonzero: the Σx' fold) and one scale
    case = random_case(rng, x_shape, w_shape, y_dtype=y_dtype, per_channel=per_channel, **attrs)
    check(case, ops=("qlinear",))
    check_nhwc(case, ops=("qlinear",))


# channels_last, uint8 x, pads, one group, no Σx' term (symmetric weights): "border mode"
# of the implicit path (kernels.h Plan): interior pixels read x in place, the others a
# copy of their window (a strip per border output row, a patch per pixel whose window
# leaves x sideways) with x's row pitch. (x shape NCHW, w shape, attrs, why)
BORDER = [
    (
        (1, 8, 9, 11),
        (5, 8, 3, 3),
        {"pads": [1, 1, 1, 1]},
        "3x3 pads 1: strips top and bottom, patches both sides",
    ),
    (
        (2, 16, 11, 13),
        (33, 16, 3, 3),
        {"pads": [1, 1, 1, 1], "strides": [2, 2]},
        "stride 2: no bottom/right border",
    ),
    ((1, 8, 12, 10), (7, 8, 3, 3), {"pads": [0, 2, 2, 0]}, "asymmetric pads: left and bottom only"),
    (
        (1, 4, 13, 14),
        (9, 4, 3, 3),
        {"pads": [2, 2, 2, 2], "dilations": [2, 2]},
        "dilation 2: 5-wide windows, taps of C",
    ),
    ((1, 12, 7, 8), (17, 12, 5, 5), {"pads": [2, 2, 2, 2]}, "5x5 on 8 columns: one patch per band"),
    ((1, 8, 6, 3), (3, 8, 3, 3), {"pads": [1, 1, 1, 1]}, "3 columns: every pixel a patch"),
    ((1, 8, 6, 2), (3, 8, 3, 3), {"pads": [1, 1, 1, 1]}, "2 columns < the window: the padded copy"),
    ((2, 20, 29), (9, 20, 3), {"pads": [1, 2], "strides": [2]}, "1-D"),
    ((1, 300, 5, 6), (17, 300, 3, 3), {"pads": [1, 1, 1, 1]}, "K = 2700: tap chunks over the B budget"),
    (
        (1, 8, 40, 1),
        (7, 8, 5, 1),
        {"pads": [128, 0, 128, 0], "dilations": [64, 1]},
        "a TCN's dilation 64: strips of 257 rows would exceed the padded copy, which is built instead",
    ),
]


@pytest.mark.parametrize("mode", ["border", "copy"])  # QUANTA_CONV_NO_BORDER=1: the padded copy
@pytest.mark.parametrize(("x_shape", "w_shape", "attrs", "why"), BORDER, ids=[b[3] for b in BORDER])
@pytest.mark.parametrize("y_dtype", [np.uint8, np.int8])
def test_implicit_channels_last_border_mode(x_shape, w_shape, attrs, why, y_dtype, mode, monkeypatch):
    del why  # the test id
    if mode == "copy":
        monkeypatch.setenv("QUANTA_CONV_NO_BORDER", "1")
    rng = np.random.default_rng(x_shape[1] * 41 + w_shape[0])
    for bias in (True, False):
        case = random_case(rng, x_shape, w_shape, y_dtype=y_dtype, symmetric_w=True, bias=bias, **attrs)
        check_nhwc(case)


def test_depthwise_channels_last_weight_zero_point_outside_int8():
    # w − zw does not fit int8: the kernels keep w' and add the − zw'·Σx' term, whose
    # missing taps (a group of 4 / a pair) must add 0 to Σx'
    rng = np.random.default_rng(12)
    for w_dtype, zw in ((np.int8, 100), (np.uint8, 0), (np.uint8, 255)):
        for c, kernel in ((70, (3, 3)), (17, (5, 5)), (16, (3, 3)), (64, (3, 3))):
            case = random_case(
                rng, (1, c, 9, 13), (c, 1, *kernel), w_dtype=w_dtype, group=c, pads=[1, 1, 1, 1]
            )
            case.zw = np.full(c, zw, w_dtype)
            case.w.reshape(-1)[::2] = np.iinfo(w_dtype).min
            case.w.reshape(-1)[1::2] = np.iinfo(w_dtype).max
            check_nhwc(derive_output(case, np.uint8))


def test_int8_activation_shift_at_both_ends_channels_last():
    # x' = x ^ 0x80 on load (depthwise) or while copying (gemm); pad pixels hold zx
    for zx in (-128, 127):
        for group, w_shape in ((1, (9, 8, 3, 3)), (70, (70, 1, 3, 3)), (1, (9, 3, 3, 3))):
            rng = np.random.default_rng(abs(zx) + group)
            c = w_shape[1] * group
            case = random_case(rng, (1, c, 7, 9), w_shape, x_dtype=np.int8, group=group, pads=[1, 1, 1, 1])
            case.x = np.where(rng.random(case.x.shape) < 0.5, -128, 127).astype(np.int8)
            case.zx = np.array(zx, np.int8)
            check_nhwc(derive_output(case, np.int8))


@pytest.mark.parametrize("end", ["qmin", "qmax"])
def test_saturation_channels_last(end):
    rng = np.random.default_rng(18)
    for group, w_shape in ((1, (7, 8, 3, 3)), (70, (70, 1, 3, 3)), (1, (7, 3, 3, 3))):
        c = w_shape[1] * group
        case = random_case(
            rng, (1, c, 6, 7), w_shape, group=group, pads=[1, 1, 1, 1], symmetric_w=True, bias=False
        )
        case.x = np.full_like(case.x, 255)
        case.zx = np.array(0, np.uint8)
        case.w = np.abs(case.w.astype(np.int16)).clip(1, 127).astype(np.int8) * (1 if end == "qmax" else -1)
        case.sy, case.zy = np.float32(1e-3), np.array(100, np.uint8)
        assert np.all(twin_qlinear(case) == (255 if end == "qmax" else 0))
        check_nhwc(case, ops=("qlinear",))


def test_channels_last_boundary_errors():
    s = _simple()
    conv = make_conv(s, ISAS[-1])
    x = to_nhwc(s.x)
    with pytest.raises(
        ValueError, match=r"QLinearConv: x: expected rank 4 \(N, H, W, C\) like w, got shape \(5, 5, 8\)"
    ):
        conv.qlinear(x[0], s.zx, s.m, s.zy, channels_last=True)
    with pytest.raises(
        ValueError, match=r"QLinearConv: x: expected 8 channels \(w.shape\[1\] 8 \* group 1\), got 5"
    ):
        conv.qlinear(s.x, s.zx, s.m, s.zy, channels_last=True)  # NCHW passed as NHWC
    with pytest.raises(
        ValueError, match=r"ConvInteger: out: expected shape \(1, 5, 5, 6\), got shape \(1, 6, 5, 5\)"
    ):
        conv.integer(x, s.zx, out=np.empty((1, 6, 5, 5), np.int32), channels_last=True)
    with pytest.raises(ValueError, match="QLinearConv: x: expected a C-contiguous array"):
        conv.qlinear(np.moveaxis(s.x, 1, -1), s.zx, s.m, s.zy, channels_last=True)
    assert conv.output_shape((2, 9, 7, 8), channels_last=True) == (2, 9, 7, 6)
    assert conv.output_shape((2, 8, 9, 7)) == (2, 6, 9, 7)


# (x shape NCHW, w shape, attrs, why): the direct small-C kernel (avx512vnni; NCHW data goes
# through it between two transposes)
DIRECT = [
    ((1, 3, 23, 21), (16, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, "stem: 3 -> 16, 3x3 s2"),
    (
        (2, 3, 17, 19),
        (32, 3, 3, 3),
        {"pads": [1, 0, 1, 2], "strides": [2, 2]},
        "stem: 3 -> 32, asymmetric pads",
    ),
    ((1, 3, 9, 11), (7, 3, 3, 3), {"pads": [1, 1, 1, 1]}, "M = 7: a masked lane block"),
    ((1, 7, 9, 10), (33, 7, 3, 3), {"pads": [0, 1, 2, 1], "dilations": [2, 1]}, "7 channels, M = 33, dh = 2"),
    ((1, 1, 13, 12), (64, 1, 5, 5), {"pads": [2, 2, 2, 2], "strides": [1, 2]}, "1 channel 5x5, M = 64"),
    ((2, 5, 29), (17, 5, 3), {"pads": [1, 2], "strides": [2]}, "1-D"),
]


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs", "why"), DIRECT, ids=[d[3] for d in DIRECT])
@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
def test_direct_small_channel_path(x_shape, w_shape, attrs, why, x_dtype):
    # w − zw fits int8 (weights within ±100, zero points within ±20): the direct kernel runs
    del why  # the test id
    rng = np.random.default_rng(w_shape[0] * 13 + x_shape[1])
    case = random_case(rng, x_shape, w_shape, x_dtype=x_dtype, **attrs)
    case.w = rng.integers(-100, 101, w_shape).astype(np.int8)
    case.zw = rng.integers(-20, 21, w_shape[0]).astype(np.int8)
    case = derive_output(case, np.uint8)
    # channels_last, and NCHW (the same kernel between two transposes)
    for kernels in (check_nhwc(case), check(case)):
        for isa in ("avx512vnni", "avx2"):
            if isa in ISAS:
                assert kernels[ISAS.index(isa)].startswith("qconv_direct_"), kernels


def test_direct_path_when_the_weight_difference_leaves_int8():
    # w − zw = 127 − (−100) does not fit int8: no avx512vnni direct kernel (the generic path
    # runs); avx2's int16 weights hold it, its direct kernel runs (x at 255 next to the
    # extreme weights: the pair sums that saturate int16)
    rng = np.random.default_rng(31)
    case = random_case(rng, (1, 3, 9, 9), (16, 3, 3, 3), pads=[1, 1, 1, 1], strides=[2, 2])
    case.w[0, 0, 0, 0] = 127
    case.w[1::2] = -128
    case.x[..., ::2, :] = 255
    case.zw = np.full(16, -100, np.int8)
    case.zw[1::2] = 127
    for kernels in (check_nhwc(derive_output(case, np.uint8)), check(derive_output(case, np.int8))):
        if "avx512vnni" in ISAS:
            assert not kernels[ISAS.index("avx512vnni")].startswith("qconv_direct_"), kernels
        if "avx2" in ISAS:
            assert kernels[ISAS.index("avx2")].startswith("qconv_direct_"), kernels


# --------------------------------------------------------------------------------------
# Depthwise channels_last, flat rows (avx512vnni, horizontal stride 1): 64-byte vectors of
# the output row's OW·C stream, several pixels per vector when C < 64, vectors straddling
# pixels when 64 mod C != 0, masked loads at the row's ends
# --------------------------------------------------------------------------------------

FLAT_CHANNELS = (3, 7, 8, 16, 17, 24, 32, 48, 64, 65)


def flat_expected(c: int, stride_w: int) -> bool:
    """The avx512vnni kernel is the flat-row one: sw = 1, C not a multiple of 64 (the 64c4
    kernel fills its lanes) and lcm(C, 64) <= 24 vectors (conv.cc use_flat_rows)."""
    return stride_w == 1 and c % 64 != 0 and c // math.gcd(c, 64) <= 24


@st.composite
def depthwise_nhwc_cases(draw) -> ConvCase:
    """Depthwise geometries around the flat rows: the channel counts of FLAT_CHANNELS,
    kernels 1..5 (3x3 most often: two full tap groups and a group of one), strides and
    dilations 1/2, pads 0..2 (a whole tap row outside x), widths from one vector to several."""
    c = draw(st.sampled_from(FLAT_CHANNELS))
    kh, kw = draw(st.sampled_from(((3, 3), (3, 3), (1, 1), (5, 5), (2, 3), (1, 5))))
    strides = [draw(st.sampled_from((1, 1, 2))) for _ in range(2)]
    dilations = [draw(st.sampled_from((1, 1, 2))) for _ in range(2)]
    pads = [draw(st.integers(0, 2)) for _ in range(4)]
    h = max(draw(st.sampled_from((1, 2, 5, 9))), dilations[0] * (kh - 1) + 1 - pads[0] - pads[2])
    w = max(draw(st.sampled_from((1, 3, 5, 9, 17, 23))), dilations[1] * (kw - 1) + 1 - pads[1] - pads[3])
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return random_case(
        rng,
        (draw(st.sampled_from((1, 2))), c, h, w),
        (c, 1, kh, kw),
        x_dtype=draw(st.sampled_from((np.uint8, np.int8))),
        w_dtype=draw(st.sampled_from((np.int8, np.uint8))),
        y_dtype=draw(st.sampled_from((np.uint8, np.int8))),
        per_channel=draw(st.booleans()),
        bias=draw(st.booleans()),
        group=c,
        strides=strides,
        dilations=dilations,
        pads=pads,
    )


@given(depthwise_nhwc_cases())
def test_depthwise_channels_last_small_channels_every_isa_and_thread_count(case):
    kernels = check_nhwc(case)
    if "avx512vnni" in ISAS:
        flat = kernels[ISAS.index("avx512vnni")].startswith("qconv_dwc_flat_")
        assert flat == flat_expected(case.x.shape[1], case.attrs["strides"][1]), kernels


@pytest.mark.parametrize("c", FLAT_CHANNELS)
def test_depthwise_flat_rows_straddle_pixels_and_row_ends(c):
    # 3x3 pads 1 at 112 / 64 + 1 columns: the interior vectors of a row read plain loads,
    # the first and last ones masked loads merged into zx; with 64 mod C != 0 vectors start
    # inside a pixel and the weight block cycles (C = 24: 3 blocks). Failure signature:
    # a wrong channel's weights or a pad byte read as data at a vector boundary.
    rng = np.random.default_rng(c)
    case = random_case(rng, (1, c, 4, 67), (c, 1, 3, 3), group=c, pads=[1, 1, 1, 1])
    kernels = check_nhwc(case)
    if "avx512vnni" in ISAS:
        assert kernels[ISAS.index("avx512vnni")].startswith("qconv_dwc_flat_") == flat_expected(c, 1), kernels


@pytest.mark.parametrize(
    ("c", "hw", "k", "strides", "dilations", "pads"),
    [
        # 3x3 at OW·C > 2 strips of 32 vectors (the last one partial), 13 rows: bands of
        # rows at 2 threads whose last band is short, each band's first rows prepared anew
        (17, (13, 130), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
        (48, (11, 45), (3, 3), (1, 1), (1, 1), (0, 1, 2, 1)),
        # 5x5 (two horizontal tap groups, the second of one tap) and 3x7 / 2x9 (groups of
        # 4 + 3, 4 + 4 + 1) over several strips
        (24, (9, 90), (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),
        # 5x5 at sh = dh = 1 takes tap column 4 as vertical groups of 4 x rows (kernels.h
        # "vertical tail"): 3 output rows (no full step of 4), rows below x inside a group;
        # at dh = 2 the plain horizontal groups
        (17, (3, 70), (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),
        (40, (10, 33), (5, 5), (1, 1), (1, 1), (0, 2, 3, 2)),
        (17, (12, 80), (5, 5), (1, 1), (2, 1), (4, 2, 4, 2)),
        (7, (8, 301), (3, 7), (1, 1), (1, 1), (1, 3, 1, 3)),
        (3, (6, 700), (2, 9), (1, 1), (1, 1), (0, 4, 1, 4)),
        # vertical stride and dilation: the ring of (kh − 1)·dh + 1 prepared rows, rows
        # skipped by sh = 2, top / bottom rows outside x
        (17, (15, 140), (3, 3), (2, 1), (2, 2), (2, 2, 1, 2)),
        (7, (12, 100), (5, 3), (3, 1), (1, 1), (2, 1, 2, 1)),
        (16, (9, 150), (1, 1), (1, 1), (1, 1), (0, 0, 0, 0)),
    ],
)
def test_depthwise_flat_rows_strips_bands_and_wide_kernels(c, hw, k, strides, dilations, pads):
    # Failure signature: a prepared row reused for the wrong x row (ring slot / tag), a
    # strip boundary reading the neighbouring strip's taps, or a weight group of the wrong
    # kernel row or horizontal tap group.
    rng = np.random.default_rng(c * 1000 + hw[1])
    # per-channel and per-tensor zw (zw'·Σx' subtracted), and symmetric weights (not)
    for x_dtype, per_channel, symmetric in (
        (np.uint8, True, False),
        (np.int8, False, False),
        (np.uint8, True, True),
    ):
        case = random_case(
            rng,
            (2, c, *hw),
            (c, 1, *k),
            x_dtype=x_dtype,
            per_channel=per_channel,
            symmetric_w=symmetric,
            group=c,
            strides=list(strides),
            dilations=list(dilations),
            pads=list(pads),
        )
        kernels = check_nhwc(case)
        if "avx512vnni" in ISAS:
            assert kernels[ISAS.index("avx512vnni")].startswith("qconv_dwc_flat_") == flat_expected(c, 1), (
                kernels
            )


@pytest.mark.parametrize(
    ("n", "c", "hw", "k", "dilations", "pads"),
    [
        # tall images: bands of at least 8 rows per row prepared twice (conv.cc
        # kDwFlatBandRows), a multiple of the threads per image: 3x3 at 70 rows (2 threads:
        # 4 bands of 18 and a short last one; 3 threads: 3), 5x5 at 45 rows (one band a
        # thread), dilation 2 (16 rows a band), and batches of 3 images (a band or more
        # each, by the threads over the images)
        (1, 17, (70, 9), (3, 3), (1, 1), (1, 1, 1, 1)),
        (1, 24, (45, 11), (5, 5), (1, 1), (2, 2, 2, 2)),
        (1, 7, (61, 13), (3, 3), (2, 2), (2, 2, 2, 2)),
        (3, 40, (37, 5), (5, 5), (1, 1), (2, 2, 2, 2)),
    ],
)
def test_depthwise_flat_rows_band_count_any_thread_count(n, c, hw, k, dilations, pads):
    # Failure signature: a row left out or computed twice where two bands meet, or a band
    # of another image, at a thread count whose band split this geometry has not had.
    rng = np.random.default_rng(n * 100 + c)
    case = random_case(
        rng, (n, c, *hw), (c, 1, *k), group=c, strides=[1, 1], dilations=list(dilations), pads=list(pads)
    )
    want = to_nhwc(twin_integer(case))
    x = to_nhwc(case.x)
    for isa in ISAS:
        conv = make_conv(case, isa)
        if isa == "avx512vnni":
            assert conv.kernel_channels_last.startswith("qconv_dwc_flat_") == flat_expected(c, 1)
        for threads in (1, 2, 3, 4, 7):
            got = conv.integer(x, case.zx, num_threads=threads, channels_last=True)
            assert_bitexact(
                np.moveaxis(want, -1, 1),
                np.moveaxis(got, -1, 1),
                case,
                f"integer channels_last {conv.kernel_channels_last} threads={threads}",
            )


def test_depthwise_flat_rows_weight_zero_point_outside_int8():
    # w − zw does not fit int8: the flat kernel keeps w' and subtracts zw'·Σx' per element,
    # the zw table cycling with the weight blocks (C = 48: 3 blocks of 64 entries)
    rng = np.random.default_rng(41)
    for c in (16, 48):
        case = random_case(rng, (1, c, 7, 13), (c, 1, 3, 3), w_dtype=np.uint8, group=c, pads=[1, 2, 0, 1])
        case.zw = np.full(c, 255, np.uint8)
        case.w.reshape(-1)[::3] = 0
        check_nhwc(derive_output(case, np.uint8))


def test_prepared_parameters_are_checked_once_and_x_must_match_them():
    rng = np.random.default_rng(23)
    case = random_case(rng, (1, 7, 5, 6), (3, 7, 3, 3), pads=[1, 1, 1, 1])
    conv = make_conv(case, ISAS[0])
    with pytest.raises(ValueError, match="call prepare"):
        conv.qlinear_prepared(case.x)
    with pytest.raises(ValueError, match="multiplier: expected a scalar or a 1-D tensor of 3"):
        conv.prepare(case.zx, np.ones(5, np.float32), case.zy)  # 5 multipliers for M = 3
    with pytest.raises(ValueError, match="expected finite requantization"):
        conv.prepare(case.zx, np.full(3, np.nan, np.float32), case.zy)
    conv.prepare(case.zx, case.m, case.zy, case.bias)
    with pytest.raises(ValueError, match="x: expected uint8 like x_zero_point, got int8"):
        conv.qlinear_prepared(case.x.view(np.int8))


# --------------------------------------------------------------------------------------
# AVX2 on the pairs that saturate vpmaddubsw (docs/kernels.md "AVX2")
# --------------------------------------------------------------------------------------

# (x shape, w shape, attrs, why): the first layer of a CNN and depthwise layers
SATURATING = [
    ((1, 3, 33, 31), (16, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, "stem 3 -> 16, 3x3 s2"),
    ((1, 3, 20, 17), (17, 3, 3, 3), {"pads": [1, 0, 1, 2]}, "stem 3 -> 17, 3x3"),
    ((1, 7, 15, 29), (7, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 7}, "depthwise 3x3, 7 channels"),
    (
        (1, 17, 14, 14),
        (17, 1, 3, 3),
        {"pads": [1, 1, 1, 1], "strides": [2, 2], "group": 17},
        "depthwise s2, 17",
    ),
    ((1, 3, 12, 13), (3, 1, 5, 5), {"pads": [2, 2, 2, 2], "group": 3}, "depthwise 5x5, 3 channels"),
]


@pytest.mark.parametrize("path", DW_PATHS)
@pytest.mark.parametrize("weights", ["extreme", "7-bit"])
@pytest.mark.parametrize(("x_shape", "w_shape", "attrs", "why"), SATURATING, ids=[s[3] for s in SATURATING])
def test_avx2_saturating_pairs(x_shape, w_shape, attrs, why, weights, path, monkeypatch):
    """x' = 255 on every other row and w = −128 (or, with 7-bit weights, ±64) on every
    other output channel: adjacent taps whose u8·s8 pair sum leaves int16
    (2·255·(−128) = −65280), which ONNX Runtime's AVX2 kernels saturate. Every ISA and
    path must give the twin's bytes; the 7-bit weights take the vpmaddubsw GEMM family."""
    del why
    monkeypatch.setenv("QUANTA_CONV_DW_PATH", path)
    rng = np.random.default_rng(sum(x_shape) + sum(w_shape))
    case = random_case(rng, x_shape, w_shape, per_channel=True, **attrs)
    x = case.x.copy()
    x[..., ::2, :] = 255
    w = case.w.astype(np.int32)
    lo, hi = (-128, 127) if weights == "extreme" else (-64, 64)
    w = np.clip(w, lo, hi)
    w[::2] = lo
    zw = np.clip(case.zw.astype(np.int32), lo, hi)
    case = derive_output(
        ConvCase(x, w.astype(np.int8), case.zx, zw.astype(np.int8), case.sw, attrs, case.bias), np.uint8
    )
    kernels = check(case)
    if "avx2" in ISAS:
        avx2 = kernels[ISAS.index("avx2")]
        if weights == "7-bit" and not avx2.startswith(("qconv_dw", "qconv_direct")):
            assert avx2.endswith("qgemm_u8s8p_s32_5x16c4__avx2"), avx2


# --------------------------------------------------------------------------------------
# AVX2 with 7-bit weights: the implicit path on the vpmaddubsw family
# --------------------------------------------------------------------------------------

PAIR_SAFE_FAMILY = "qgemm_u8s8p_s32_5x16c4__avx2"


def seven_bit(case: ConvCase, y_dtype=np.uint8) -> ConvCase:
    """The case with every w' (w, or w − 128 for uint8 w) and zero point in [−64, 64]
    (Recipe.weight_bits = 7), the extremes ±64 on the first and last output channel, and
    sy, zy derived again from the new accumulator."""
    w = case.w.astype(np.int32)
    shift = 128 if case.w.dtype == np.uint8 else 0
    w7 = np.clip((w - shift) // 2, -64, 64)
    w7[0] = 64
    w7[-1] = -64
    zw7 = np.clip((np.asarray(case.zw, np.int32) - shift) // 2, -64, 64)
    new = ConvCase(
        case.x,
        (w7 + shift).astype(case.w.dtype),
        case.zx,
        (zw7 + shift).astype(case.w.dtype),
        case.sw,
        case.attrs,
        case.bias,
    )
    return derive_output(new, y_dtype)


def expected_avx2_kernel(case: ConvCase) -> str:
    """The kernel conv.cc takes on avx2 for 7-bit weights that are not depthwise: the
    direct small-C kernel where its conditions hold (one group, Cg not a multiple of 4,
    more than one tap, kw·Cg <= 64, at most 64 outputs, dilation 1 along W: the stem,
    exact for any weights), else implicit when a tap chunk (kw·Cg with one group and
    dilation 1, else Cg) is whole groups of 4 k, else im2col, both on the 7-bit family."""
    attrs = case.attrs
    group = attrs.get("group", 1)
    cg, kw = case.w.shape[1], case.w.shape[-1]
    dw = attrs.get("dilations", [1] * (case.x.ndim - 2))[-1]
    taps = math.prod(case.w.shape[2:])
    if group == 1 and cg % 4 != 0 and taps > 1 and kw * cg <= 64 and case.w.shape[0] <= 64 and dw == 1:
        return "qconv_direct_u8s8_s32_6x16c2__avx2"
    chunk = kw * cg if dw == 1 and group == 1 else cg
    return ("qconv_implicit+" if chunk % 4 == 0 else "qconv_im2col+") + PAIR_SAFE_FAMILY


def check_avx2_family(case: ConvCase) -> None:
    """NCHW and channels-last runs bit-exact with the twin (check, check_nhwc), on the avx2
    kernel :func:`expected_avx2_kernel` names (a 1x1 uint8 NHWC convolution runs as a plain
    GEMM, whose name differs)."""
    want = expected_avx2_kernel(case)
    kernels = check(case)
    assert kernels[ISAS.index("avx2")] == want, kernels
    kernels = check_nhwc(case)
    if not kernels[ISAS.index("avx2")].startswith("qconv_gemm+"):
        assert kernels[ISAS.index("avx2")] == want, kernels


# (x shape, w shape, attrs, why): channels 3, 7, 17; K > 258; groups; strides; dilations
SEVEN_BIT_GEMM = [
    ((1, 3, 13, 11), (7, 3, 3, 4), {"pads": [1, 2, 1, 1]}, "3 channels, 1x4 taps: 12 k a chunk, implicit"),
    ((1, 3, 13, 11), (17, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, "3 channels 3x3: 9 k, im2col"),
    ((2, 7, 9, 10), (17, 7, 3, 4), {"pads": [0, 1, 2, 1]}, "7 channels, 28 k a chunk, 2 images"),
    ((1, 17, 8, 9), (3, 17, 3, 4), {"pads": [1, 1, 1, 1], "strides": [1, 2]}, "17 channels, 3 outputs"),
    ((1, 36, 7, 8), (33, 36, 3, 3), {"pads": [1, 1, 1, 1]}, "K = 324 > 258, 33 outputs: 3 panels"),
    ((1, 300, 5, 6), (17, 300, 1, 1), {}, "1x1, K = 300, units transpose their own rows"),
    ((1, 520, 4, 4), (16, 520, 3, 3), {"pads": [1, 1, 1, 1]}, "merged taps of 1560 k, split in pieces"),
    ((1, 12, 9, 9), (6, 4, 3, 3), {"pads": [2, 1, 0, 3], "dilations": [2, 2], "group": 3}, "groups of 4"),
    ((1, 8, 11, 13), (9, 8, 3, 3), {"dilations": [1, 2], "strides": [2, 1]}, "dilation 2: chunk = Cg"),
    ((2, 8, 29), (7, 8, 3), {"pads": [1, 2], "strides": [2]}, "1-D"),
    ((1, 8, 3, 3), (70, 8, 3, 3), {}, "1 pixel, 5 panels"),
]


@pytest.mark.skipif("avx2" not in ISAS, reason="this CPU does not run avx2")
@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("w_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs", "why"), SEVEN_BIT_GEMM, ids=[s[3] for s in SEVEN_BIT_GEMM]
)
def test_avx2_seven_bit_weights_take_the_implicit_path(x_shape, w_shape, attrs, why, x_dtype, w_dtype):
    """7-bit weights pack for the vpmaddubsw family, which reads uint8 x', so avx2 runs
    them on the implicit path (per-row x' pointers, conv_gemm.cc) whenever a tap chunk is
    whole k-groups, NCHW and channels_last; per-channel zero points and scales that
    differ, both x dtypes (int8 x: the +128 shift in the padded image), both w dtypes."""
    del why
    rng = np.random.default_rng(sum(x_shape) * 7 + sum(w_shape))
    case = seven_bit(
        random_case(rng, x_shape, w_shape, x_dtype=x_dtype, w_dtype=w_dtype, per_channel=True, **attrs)
    )
    check_avx2_family(case)


@pytest.mark.skipif("avx2" not in ISAS, reason="this CPU does not run avx2")
def test_avx2_groups_with_different_families_run_im2col():
    """Each group's weights pack for the family they fit: one group with a pair of w' 100,
    100 (the int16 family) sends the whole convolution to im2col, where every group runs its own
    family; the bytes are the twin's either way."""
    rng = np.random.default_rng(5)
    case = seven_bit(random_case(rng, (1, 8, 7, 7), (6, 4, 3, 4), group=2, pads=[1, 1, 1, 1]))
    assert make_conv(case, "avx2").kernel.startswith("qconv_implicit+")
    w = case.w.copy()
    w[4, 0:2, 0, 0] = 100  # group 1: its k = 0, 1 (c = 0, 1 of tap 0) pair to 200 > 128
    case = derive_output(ConvCase(case.x, w, case.zx, case.zw, case.sw, case.attrs, case.bias), np.uint8)
    assert make_conv(case, "avx2").kernel.startswith("qconv_im2col+")
    check(case)
    check_nhwc(case)


@pytest.mark.skipif("avx2" not in ISAS, reason="this CPU does not run avx2")
@given(conv_cases())
def test_avx2_seven_bit_weights_every_geometry(case):
    """The hypothesis space of conv geometries with the weights in 7 bits: the avx2
    7-bit family on the implicit, im2col and pointwise paths, NCHW and channels_last."""
    case = seven_bit(case, case.zy.dtype)
    check(case)
    check_nhwc(case)


@pytest.mark.skipif("avx2" not in ISAS, reason="this CPU does not run avx2")
@pytest.mark.parametrize("path", [None, *PW_PATHS])
@pytest.mark.parametrize(
    ("x_shape", "w_shape", "why"),
    [
        ((1, 20, 17, 19), (70, 20, 1, 1), "70 outputs >= 64: the implicit path unless pinned"),
        ((1, 7, 17, 19), (70, 7, 1, 1), "7 channels: no implicit path, the pointwise GEMM"),
        ((2, 36, 16, 17), (24, 36, 1, 1), "24 outputs: the pointwise GEMM (x packed as B)"),
    ],
)
def test_avx2_seven_bit_pointwise_nchw_choice(x_shape, w_shape, why, path, monkeypatch):
    """NCHW 1x1 layers of >= 256 pixels with 7-bit weights: the pointwise GEMM packs x as
    B (the int16 family), the implicit path runs the weights' 7-bit family; conv_gemm.cc
    takes the latter from 64 outputs on. Both choices, and each path pinned, give the
    twin's bytes (uint8 and int8 x, per-channel zero points)."""
    del why
    if path is not None:
        monkeypatch.setenv("QUANTA_CONV_PW_PATH", path)
    for x_dtype in (np.uint8, np.int8):
        rng = np.random.default_rng(sum(x_shape) + w_shape[0])
        case = seven_bit(random_case(rng, x_shape, w_shape, x_dtype=x_dtype, per_channel=True))
        check(case, isas=("portable", "avx2"))


# --------------------------------------------------------------------------------------
# AVX2 with pair-safe weights: the vpmaddubsw family beyond 7 bits
# --------------------------------------------------------------------------------------


def conv_k_order(w: np.ndarray, group: int) -> np.ndarray:
    """A convolution's weights [M, Cg, *kernel] as the GEMM's per-group [G, K, Mg], k =
    (ky·kw + kx)·Cg + c (conv.cc: ONNX Runtime's im2col order (kh, kw, c))."""
    M, cg = w.shape[:2]
    taps = math.prod(w.shape[2:])
    return w.reshape(group, M // group, cg, taps).transpose(0, 3, 2, 1).reshape(group, taps * cg, M // group)


def from_k_order(codes: np.ndarray, w_shape: tuple[int, ...]) -> np.ndarray:
    """conv_k_order's inverse: [G, K, Mg] back to [M, Cg, *kernel]."""
    group, _, mg = codes.shape
    cg = w_shape[1]
    return np.ascontiguousarray(codes.reshape(group, -1, cg, mg).transpose(0, 3, 2, 1).reshape(w_shape))


def pair_safe(case: ConvCase, rng: np.random.Generator, y_dtype=np.uint8) -> ConvCase:
    """The case with w' (w, or w − 128 for uint8 w) up to ±127 / −128 and every pair of
    the GEMM's K order safe (test_qgemm_avx2.pair_safe_codes), per-channel zero points with
    0 < |zw'| <= 64 (a K not a multiple of 4 pads with rows of zw', which pair with the last
    k or with each other), x' = 255 on every other row."""
    group = case.attrs.get("group", 1)
    M, cg = case.w.shape[:2]
    shift = 128 if case.w.dtype == np.uint8 else 0
    zwp = rng.integers(1, 65, M) * rng.choice([-1, 1], M)
    K, mg = cg * math.prod(case.w.shape[2:]), M // group
    codes = np.stack([pair_safe_codes(rng, K, mg, tail=zwp[g * mg : (g + 1) * mg]) for g in range(group)])
    w = from_k_order(codes, case.w.shape)
    assert np.array_equal(conv_k_order(w, group), codes)
    x = case.x.copy()
    x[..., ::2, :] = np.iinfo(x.dtype).max  # x' = 255
    new = ConvCase(
        x,
        (w + shift).astype(case.w.dtype),
        case.zx,
        (zwp + shift).astype(case.w.dtype),
        case.sw,
        case.attrs,
        case.bias,
    )
    return derive_output(new, y_dtype)


@pytest.mark.skipif("avx2" not in ISAS, reason="this CPU does not run avx2")
@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("w_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs", "why"), SEVEN_BIT_GEMM, ids=[s[3] for s in SEVEN_BIT_GEMM]
)
def test_avx2_pair_safe_weights_take_the_vpmaddubsw_family(x_shape, w_shape, attrs, why, x_dtype, w_dtype):
    """Full-range codes whose pairs in the (kh, kw, c) K order are safe take the
    vpmaddubsw family on the implicit path (tap chunks of whole k-groups), im2col (9 k:
    odd K, zw' rows after it) and the 1x1 paths, NCHW and channels_last, bit-exact
    against the twin with x' = 255 rows next to each other."""
    del why
    rng = np.random.default_rng(sum(x_shape) * 5 + sum(w_shape))
    case = random_case(rng, x_shape, w_shape, x_dtype=x_dtype, w_dtype=w_dtype, per_channel=True, **attrs)
    case = pair_safe(case, rng)
    assert np.abs(case.w.astype(np.int32) - (128 if w_dtype == np.uint8 else 0)).max() >= 127
    check_avx2_family(case)


@pytest.mark.skipif("avx2" not in ISAS, reason="this CPU does not run avx2")
@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs", "why"), SEVEN_BIT_GEMM, ids=[s[3] for s in SEVEN_BIT_GEMM]
)
def test_avx2_one_unsafe_pair_falls_back(x_shape, w_shape, attrs, why):
    """The same weights with one pair (k = 0, 1 of the last group's last output channel)
    one code past the bound: that group packs for the int16 family (implicit on an int16
    image, im2col, or the direct kernel; with several groups the convolution runs im2col,
    each group on its own family) and the bytes stay the twin's."""
    del why
    rng = np.random.default_rng(sum(x_shape) * 3 + sum(w_shape))
    case = pair_safe(random_case(rng, x_shape, w_shape, per_channel=True, **attrs), rng)
    group = attrs.get("group", 1)
    codes = conv_k_order(case.w.astype(np.int64), group)
    codes[-1, 0:2, -1] = (127, 2)
    w = from_k_order(codes, w_shape).astype(np.int8)
    case = derive_output(ConvCase(case.x, w, case.zx, case.zw, case.sw, case.attrs, case.bias), np.uint8)
    kernels = check(case)
    if group == 1:
        assert PAIR_SAFE_FAMILY not in kernels[ISAS.index("avx2")], kernels
    else:  # the other groups stay pair-safe: mixed families run im2col (the name is group 0's)
        assert kernels[ISAS.index("avx2")] == "qconv_im2col+" + PAIR_SAFE_FAMILY, kernels


@pytest.mark.skipif("avx2" not in ISAS, reason="this CPU does not run avx2")
def test_avx2_conv_pairs_follow_the_kh_kw_c_order():
    """A 3x3 convolution over 4 channels whose codes are 127 at c = 1, 2 of every tap: in
    the (kh, kw, c) order the pairs (c0, c1), (c2, c3) hold one 127 each (safe); in ONNX's
    (c, kh, kw) order the same tensor pairs taps of one channel, 127 with 127 (unsafe)."""
    rng = np.random.default_rng(3)
    case = random_case(rng, (1, 4, 9, 9), (5, 4, 3, 3), pads=[1, 1, 1, 1], per_channel=True)
    w = np.zeros((5, 4, 3, 3), np.int8)
    w[:, 1:3] = 127
    assert ref_qgemm.pairs_fit_int16(conv_k_order(w, 1)[0])
    assert not ref_qgemm.pairs_fit_int16(np.ascontiguousarray(w.reshape(5, -1).T))  # (c, kh, kw)
    x = case.x.copy()
    x[..., ::2, :] = 255
    zw = np.full(5, 3, np.int8)
    case = derive_output(ConvCase(x, w, case.zx, zw, case.sw, case.attrs, case.bias), np.uint8)
    assert make_conv(case, "avx2").kernel == "qconv_implicit+" + PAIR_SAFE_FAMILY
    check(case)
    check_nhwc(case)
