"""Float MaxPool's native kernel (pool.h max_pool_2d_f32) against the twin (nn_pool.max_pool)
on every ISA: the whole-plane paths of max_pool_f32_simd.h (the −inf-bordered copy; at
stride 1 row maxima over the flattened copy, then column maxima per output row; at other
strides column maxima per output row, then the row maxima over its s_w phases; windows
inside the plane that do not overlap read x directly, picking each tap by permutes or a
strided load) and the generic loops the other geometries keep. Max only selects, so the values are the twin's bit for bit
(the sign of a zero maximum aside, which the contract does not pin); NaN wins wherever it
is in the window."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from quanta.kernels import _native
from quanta.kernels.reference.registry import get_op
from quanta.targets.base import KernelContext

ISAS: list[str] = list(_native.supported_isas())
F32 = np.float32
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], F32)


def check_every_isa(x: np.ndarray, kernel: tuple[int, int], pads: tuple[int, int, int, int], **attrs) -> None:
    expected = get_op("MaxPool", "")(KernelContext(), x, kernel_shape=list(kernel), pads=list(pads), **attrs)
    strides = tuple(attrs.get("strides", (1, 1)))
    dilations = tuple(attrs.get("dilations", (1, 1)))
    out_hw = expected.shape[2:]
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            for threads in (1, 2):
                got = _native.max_pool_2d_f32(x, kernel, strides, dilations, pads[:2], out_hw, threads)
                np.testing.assert_array_equal(
                    got,
                    expected,
                    err_msg=f"isa={isa} threads={threads} x={x.shape} k={kernel} pads={pads} {attrs}",
                )
    finally:
        _native.clear_isa()


@st.composite
def pool_cases(draw, strides):
    """Planes narrower and wider than a vector (1 .. 37: 8 and 16 lanes ± 1 inside), windows
    from 1 to larger than the plane, pads from none to k − 1 and unequal ends (ceil-mode
    like), channel counts 3, 7, 17; NaN, ±inf and signed zeros sprinkled."""
    h = draw(st.integers(1, 37))
    w = draw(st.sampled_from([1, 2, 7, 8, 9, 10, 15, 16, 17, 20, 33, 37]))
    kh, kw = draw(st.integers(1, 13)), draw(st.integers(1, 13))
    pt, pb = draw(st.integers(0, kh - 1)), draw(st.integers(0, kh - 1))
    pl, pr = draw(st.integers(0, kw - 1)), draw(st.integers(0, kw - 1))
    if h + pt + pb < kh or w + pl + pr < kw:
        pb, pr = kh - 1, kw - 1  # every output row / column needs a window start
    c = draw(st.sampled_from([3, 7, 17]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((1, c, h, w)).astype(F32)
    if draw(st.booleans()):
        flat = x.reshape(-1)
        idx = rng.choice(flat.size, size=min(4, flat.size), replace=False)
        flat[idx] = rng.choice(SPECIALS, size=idx.size)
    return x, (kh, kw), (pt, pl, pb, pr), draw(st.sampled_from(strides))


@settings(max_examples=150, deadline=None)
@given(case=pool_cases([(1, 1)]))
def test_stride1_max_pool_is_the_twin_every_isa(case) -> None:
    x, kernel, pads, _ = case
    check_every_isa(x, kernel, pads)


@settings(max_examples=150, deadline=None)
@given(case=pool_cases([(2, 2), (2, 1), (1, 3), (3, 2), (4, 4)]))
def test_strided_max_pool_is_the_twin_every_isa(case) -> None:
    """Strides 2-4: overlapping windows take the phase-split path (each tap a contiguous
    load of one of s_w phases), the others the generic loops; the twin's values both."""
    x, kernel, pads, strides = case
    check_every_isa(x, kernel, pads, strides=list(strides))


def test_sppf_planes_with_nan_and_inf_every_isa() -> None:
    """YOLO's SPPF geometry (5 x 5, stride 1, pad 2) on 10 x 10 and 20 x 20 planes and
    YOLOv5's SPP 9 and 13; a NaN at a corner (read by the fewest windows) and one in the
    middle, +inf and −inf, a plane of −0."""
    rng = np.random.default_rng(3)
    for hw, k in ((10, 5), (20, 5), (10, 9), (20, 13), (13, 13)):
        x = rng.standard_normal((2, 17, hw, hw)).astype(F32)
        x[0, 0, 0, 0] = np.nan
        x[0, 1, hw // 2, hw // 2 + 1] = np.nan
        x[1, 2, hw - 1, 0] = np.inf
        x[1, 3] = -np.inf
        x[1, 4] = -0.0
        check_every_isa(x, (k, k), (k // 2,) * 4)


def test_resnet_stem_dilated_and_vgg_pools_every_isa() -> None:
    """3x3 stride 2 (ResNet's stem: the phase-split path), a dilated window and 2x2 stride 2
    (the generic loops): the twin's values, a NaN included."""
    x = np.random.default_rng(4).standard_normal((1, 7, 23, 19)).astype(F32)
    x[0, 2, 5, 5] = np.nan
    check_every_isa(x, (3, 3), (1, 1, 1, 1), strides=[2, 2])
    check_every_isa(x, (3, 5), (2, 4, 1, 3), dilations=[2, 2])
    check_every_isa(x, (2, 2), (0, 0, 0, 0), strides=[2, 2])


@settings(max_examples=120, deadline=None)
@given(
    kernel=st.sampled_from([(1, 3), (2, 2), (1, 1), (2, 3), (1, 2), (3, 1), (1, 5), (2, 6), (1, 7)]),
    extra=st.sampled_from([(0, 0), (0, 1), (1, 2)]),
    h=st.integers(1, 9),
    w=st.sampled_from([3, 7, 17, 24, 47, 48, 49, 79, 100]),
    seed=st.integers(0, 2**32 - 1),
    specials=st.booleans(),
)
def test_non_overlapping_windows_inside_the_plane_every_isa(kernel, extra, h, w, seed, specials) -> None:
    """Windows no wider than their stride with no pads (the beats TCN's [1, 3] stride
    [1, 3], VGG's 2x2 stride 2, gaps between windows): the direct form (AVX-512 permutes
    at strides 2-8, else contiguous window maxima, then one strided load per vector of
    outputs; strides 1-9 here); widths on both sides of the 8-
    and 16-lane vectors, inputs the last window leaves unread, ceil_mode's overhanging
    window (which keeps the generic loops), channel counts 3, 7, 17."""
    kh, kw = kernel
    strides = [kh + extra[0], kw + extra[1]]
    if h < kh or w < kw:
        return
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, int(rng.choice([3, 7, 17])), h, w)).astype(F32)
    if specials:
        flat = x.reshape(-1)
        idx = rng.choice(flat.size, size=min(9, flat.size), replace=False)
        flat[idx] = rng.choice(SPECIALS, size=idx.size)
    check_every_isa(x, kernel, (0, 0, 0, 0), strides=strides)
    check_every_isa(x, kernel, (0, 0, 0, 0), strides=strides, ceil_mode=1)


def test_beats_tcn_time_pools_every_isa() -> None:
    """The beats TCN's max_pool_15 geometry ([1, 16, 602, 79], [1, 3] stride [1, 3]:
    26 of 79 columns, the last one unread) and max_pool_32's ([1, 16, 600, 24]: every
    column read, so each plane is pooled as one row of 600·24), NaN and ±inf in places."""
    for w in (79, 24):
        x = np.random.default_rng(5).standard_normal((1, 16, 602, w)).astype(F32)
        x[0, 3, 7, 5] = np.nan
        x[0, 4, 9, w - 2] = np.nan  # in the last window
        x[0, 5, 0, w - 1] = np.nan  # unread when w = 79
        x[0, 6, 1, :] = -np.inf
        x[0, 7, 2, 20] = np.inf
        x[0, 8, 601, 0] = np.nan  # the plane's last row
        check_every_isa(x, (1, 3), (0, 0, 0, 0), strides=[1, 3])


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([3, 7, 17, 24]),
    st.integers(2, 19),
    st.sampled_from([2, 3, 15, 16, 17, 31, 32, 33, 64, 65]),
    st.booleans(),
    st.integers(0, 2**32 - 1),
)
def test_2x2_stride2_is_the_twin_and_every_isas_bytes(c, h, w, pads_end, seed) -> None:
    """2x2 stride 2 inside the plane (AVX2: max_pool_2x2_avx2.h, 8 outputs from 16 columns of
    two rows, a scalar tail): the twin's values, and the same bytes as the other ISAs'
    forms, ±0 and NaN included (taps in (ky, kx) order, of equal values the earlier).
    An odd height or width leaves the last input row / column unread; an end pad (ceil
    mode like) takes the other forms."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, c, h, w)).astype(F32)
    flat = x.reshape(-1)
    idx = rng.choice(flat.size, size=min(12, flat.size), replace=False)
    flat[idx] = rng.choice(SPECIALS, size=idx.size)
    x[0, 0, 0, :2] = [0.0, -0.0]  # equal maxima of both signs in one window
    pads = (0, 0, h % 2, w % 2) if pads_end else (0, 0, 0, 0)
    check_every_isa(x, (2, 2), pads, strides=[2, 2])
    expected = get_op("MaxPool", "")(KernelContext(), x, kernel_shape=[2, 2], pads=list(pads), strides=[2, 2])
    out_hw = expected.shape[2:]
    try:
        got = set()
        for isa in ISAS:
            _native.set_isa(isa)
            got.add(_native.max_pool_2d_f32(x, (2, 2), (2, 2), (1, 1), pads[:2], out_hw, 1).tobytes())
        assert len(got) == 1
    finally:
        _native.clear_isa()
