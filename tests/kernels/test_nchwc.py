"""The NCHW16c native kernels (quanta/kernels/cpp/nchwc) against their twins
(quanta/kernels/reference/nchwc.py) and float64.

The reorders are moves: bit-exact with ``to_nchwc`` / ``from_nchwc``. The convolution is
in the float GEMM family: every output within docs/float-ops.md eq. (FG1) of the float64
convolution of the same float32 inputs,

    |y − y64| ≤ (K + 3) · u · (Σ |x| |w| + |b|),   u = 2^-24,  K = C·kh·kw (depthwise kh·kw),

and every thread count gives the same bytes (the reduction is never split). A kernel that
dropped a tap, read a pad lane or a wrong window, or mis-indexed a bias misses the bound
by orders of magnitude (random normals: Σ|x||w| is of the size of y). Pad lanes of the
output are those of the twin: zero filters and zero bias, then the clamp and the post op.

Every ISA the CPU supports runs (``_native.set_isa``), with 1 and 2 threads. Shapes:
channel counts 1, 3, 7, 16, 17, 33, 48 around the 16-lane block; output counts 16, 32,
48, 17 around the tiles of 1-4 output blocks; kernels 1x1, 3x3, 5x5, 1x7, 7x1; strides,
dilations, asymmetric pads; planes from 1x1 to 40x40 (interior tiles and border pixels),
drawn by hypothesis.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quanta.kernels import _native
from quanta.kernels.reference import nchwc as twin
from quanta.kernels.reference.nn_conv import conv as conv_twin
from quanta.kernels.reference.nn_conv import fused_gate
from quanta.kernels.reference.registry import OpContext
from tests.isa import ISAS, every_isa

F32 = np.float32
U = 2.0**-24
INF = float("inf")
POSTS: dict[str, tuple[int, list[float]]] = {"": (0, []), "SiLU": (1, []), "HardSwish": (2, [])}


def normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(F32)


# --------------------------------------------------------------------------------------
# Reorders
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape",
    # 7 and 25 channels: a block whose second 8-lane half is empty / partly used (the AVX2
    # moves run 8 x 8 transposes per half); 5 x 9 and 7 x 11 pixels: a tail of 5 and 5
    [(1, 1, 1, 1), (2, 3, 5, 9), (1, 16, 4, 4), (1, 17, 3, 2), (2, 48, 13, 13), (1, 7, 8, 8), (1, 25, 7, 11)],
)
def test_reorders_are_the_twins_moves(shape) -> None:
    x = normal(np.random.default_rng(sum(shape)), *shape)
    x.flat[::7] = -0.0  # signed zeros move as they are
    c = shape[1]

    def run(isa: str) -> None:
        for threads in (1, 2):
            x5 = _native.reorder_nchwc_f32(x, num_threads=threads)
            assert x5.tobytes() == twin.to_nchwc(x).tobytes(), (isa, threads)
            back = _native.reorder_nchw_f32(x5, c, num_threads=threads)
            assert back.tobytes() == x.tobytes(), (isa, threads)
            out = np.full(x5.shape, np.nan, F32)
            assert _native.reorder_nchwc_f32(x, out=out, num_threads=threads) is not None
            assert out.tobytes() == x5.tobytes()

    every_isa(run)


def test_reorder_nchw_ignores_pad_lanes() -> None:
    x5 = normal(np.random.default_rng(1), 2, 2, 3, 4, 16)
    y = _native.reorder_nchw_f32(x5, 19)
    assert y.tobytes() == twin.from_nchwc(x5, 19).tobytes()


def test_reorders_refuse_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"reorder_nchwc_f32: x: expected \[N, C, H, W\]"):
        _native.reorder_nchwc_f32(np.zeros((2, 3, 4), F32))
    with pytest.raises(ValueError, match="reorder_nchwc_f32: x: expected dtype float32"):
        _native.reorder_nchwc_f32(np.zeros((1, 3, 4, 4)))
    with pytest.raises(ValueError, match=r"reorder_nchw_f32: x: expected \[N, Cb, H, W, 16\]"):
        _native.reorder_nchw_f32(np.zeros((1, 1, 2, 2, 8), F32), 3)
    with pytest.raises(
        ValueError, match=r"reorder_nchw_f32: c: expected a channel count with ceil\(c / 16\) = 2"
    ):
        _native.reorder_nchw_f32(np.zeros((1, 2, 2, 2, 16), F32), 16)
    with pytest.raises(ValueError, match="reorder_nchwc_f32: out: expected shape"):
        _native.reorder_nchwc_f32(np.zeros((1, 3, 2, 2), F32), out=np.zeros((1, 1, 2, 2, 8), F32))


# --------------------------------------------------------------------------------------
# Convolution
# --------------------------------------------------------------------------------------


def check_conv(
    n: int,
    c: int,
    h: int,
    w: int,
    m: int,
    kh: int,
    kw: int,
    strides,
    dilations,
    pads,
    *,
    depthwise: bool = False,
    input_nchw: bool = False,
    with_bias: bool = True,
    lo: float = -INF,
    hi: float = INF,
    post: str = "",
    seed: int = 0,
) -> None:
    rng = np.random.default_rng(seed)
    group = c if depthwise else 1
    x, wt = normal(rng, n, c, h, w), normal(rng, m, 1 if depthwise else c, kh, kw)
    bias = normal(rng, m) if with_bias else None
    attrs = dict(group=group, strides=list(strides), dilations=list(dilations), pads=list(pads))
    b64 = None if bias is None else bias.astype(np.float64)
    y64 = np.clip(conv_twin(None, x.astype(np.float64), wt.astype(np.float64), b64, **attrs), lo, hi)
    mag = conv_twin(
        None,
        np.abs(x).astype(np.float64),
        np.abs(wt).astype(np.float64),
        None if b64 is None else np.abs(b64),
        **attrs,
    )
    k = (1 if depthwise else c) * kh * kw
    packed = _native.conv_nchwc_pack_f32(wt, group, input_nchw)
    xin = x if input_nchw else twin.to_nchwc(x)
    if not input_nchw:  # pad lanes hold finite values nobody reads
        cb = twin.blocks(c)
        xin[:, cb - 1, ..., c - (cb - 1) * 16 :] = 3.0
    kind, params = POSTS[post]
    args = (m, c, kh, kw, list(strides), list(dilations), list(pads), group, lo, hi)
    label = (
        f"x{x.shape} w{wt.shape} dw{depthwise} nchw{input_nchw} s{strides} d{dilations} p{pads} post{post!r}"
    )

    def run(isa: str) -> None:
        plain = _native.conv_nchwc_f32(xin, packed, bias, *args, 1, input_nchw=input_nchw)
        y1 = _native.conv_nchwc_f32(xin, packed, bias, *args, 1, None, kind, params, input_nchw)
        y2 = _native.conv_nchwc_f32(xin, packed, bias, *args, 2, None, kind, params, input_nchw)
        out = np.full(y1.shape, np.nan, F32)
        _native.conv_nchwc_f32(xin, packed, bias, *args, 2, out, kind, params, input_nchw)
        assert y1.tobytes() == y2.tobytes() == out.tobytes(), f"{isa} {label}: 1 vs 2 threads"
        assert y1.shape == (n, twin.blocks(m), y64.shape[2], y64.shape[3], 16), label
        assert_within_bound(twin.from_nchwc(plain, m), y64, mag, k, f"{isa} {label}")
        # pad lanes: zero filters and bias, clamped
        pad = twin.from_nchwc(plain)[:, m:]
        assert (pad == np.clip(np.float32(0), lo, hi)).all(), f"{isa} {label}: pad lanes"
        if post:
            assert y1.tobytes() == fused_gate(plain, post, params).tobytes(), f"{isa} {label}: post op"

    every_isa(run)


def assert_within_bound(y: np.ndarray, y64: np.ndarray, magnitude: np.ndarray, k: int, label: str) -> None:
    """eq. (FG1): |y − y64| ≤ (k + 3) · u · magnitude, element by element."""
    assert y.dtype == F32 and y.shape == y64.shape, (label, y.dtype, y.shape, y64.shape)
    err = np.abs(y.astype(np.float64) - y64)
    limit = (k + 3) * U * magnitude
    bad = err > limit
    if bad.any():
        i = tuple(int(v) for v in np.argwhere(bad)[0])
        raise AssertionError(
            f"{label}: {int(bad.sum())} elements outside (FG1); first at {i}: got {y[i]!r}, "
            f"float64 {y64[i]!r}, error {err[i]:.3g} > {limit[i]:.3g}"
        )


@pytest.mark.parametrize(
    "n,c,h,w,m,kh,kw,strides,dilations,pads,kwargs",
    [
        (1, 17, 13, 13, 33, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1), {}),
        (2, 7, 9, 5, 17, 3, 3, (2, 2), (1, 1), (0, 1, 2, 1), {}),
        (1, 33, 10, 11, 48, 5, 5, (1, 2), (2, 1), (2, 2, 2, 2), {"with_bias": False}),
        (1, 48, 40, 40, 64, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1), {"lo": 0.0}),  # 4 output blocks
        (1, 16, 40, 40, 80, 3, 3, (2, 2), (1, 1), (1, 1, 1, 1), {"post": "SiLU"}),  # 4 + 1 blocks
        (1, 16, 5, 9, 32, 1, 7, (1, 1), (1, 1), (0, 3, 0, 3), {"lo": -1.0, "hi": 1.0}),
        (1, 16, 9, 5, 16, 7, 1, (1, 1), (1, 1), (3, 0, 3, 0), {}),
        (1, 16, 1, 1, 32, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0), {}),
        # input channel blocks in several passes (partial sums through y), the post op after
        # the last; 1x1 planes run as wider rows
        (1, 130, 26, 26, 64, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0), {"post": "SiLU", "lo": -1.0}),
        (2, 48, 13, 11, 80, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1), {"post": "SiLU"}),
        (1, 200, 10, 10, 17, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0), {"with_bias": False}),
        (2, 1, 13, 13, 17, 3, 3, (2, 1), (1, 2), (0, 2, 1, 0), {}),
        (1, 3, 40, 40, 16, 3, 3, (2, 2), (1, 1), (1, 1, 1, 1), {"input_nchw": True}),  # the stem
        (1, 4, 33, 35, 32, 6, 6, (2, 2), (1, 1), (2, 2, 2, 2), {"input_nchw": True, "post": "SiLU"}),
        # pixel strides of 16 and 32 floats on a plain plane: the tiles' NCHW16c forms
        # (constant pixel strides, lane stride 1) must not take them
        (1, 3, 70, 300, 16, 3, 3, (1, 16), (1, 1), (1, 1, 1, 1), {"input_nchw": True}),
        (1, 5, 40, 330, 17, 2, 2, (2, 32), (1, 1), (0, 0, 0, 0), {"input_nchw": True}),
        (1, 23, 11, 37, 33, 1, 1, (1, 2), (1, 1), (0, 0, 0, 0), {"lo": 0.0}),  # stride 2: 32 floats
        (1, 17, 5, 9, 48, 3, 3, (1, 1), (1, 1), (4, 4, 4, 4), {}),  # windows wholly in the pads
        (1, 48, 13, 13, 48, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1), {"depthwise": True}),
        (1, 17, 9, 9, 17, 5, 5, (2, 1), (1, 2), (2, 0, 1, 3), {"depthwise": True, "post": "HardSwish"}),
        (2, 7, 40, 40, 7, 3, 3, (2, 2), (1, 1), (0, 0, 1, 1), {"depthwise": True, "with_bias": False}),
    ],
)
def test_conv_cases(n, c, h, w, m, kh, kw, strides, dilations, pads, kwargs) -> None:
    check_conv(n, c, h, w, m, kh, kw, strides, dilations, pads, seed=c * m + h, **kwargs)


@st.composite
def conv_cases(draw):
    depthwise = draw(st.booleans())
    input_nchw = not depthwise and draw(st.booleans())
    c = draw(st.sampled_from([1, 3, 7, 16, 17, 33, 48]))
    m = c if depthwise else draw(st.sampled_from([16, 32, 48, 17, 3]))
    kh, kw = draw(st.sampled_from([(1, 1), (3, 3), (5, 5), (1, 7), (7, 1)]))
    strides = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    dilations = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pads = tuple(draw(st.integers(0, 3)) for _ in range(4))
    h, w = draw(st.sampled_from([(1, 1), (5, 9), (13, 13), (40, 40)]))
    assume_h = dilations[0] * (kh - 1) + 1 <= h + pads[0] + pads[2]
    assume_w = dilations[1] * (kw - 1) + 1 <= w + pads[1] + pads[3]
    if not (assume_h and assume_w):
        pads = (pads[0], pads[1], pads[2] + dilations[0] * (kh - 1), pads[3] + dilations[1] * (kw - 1))
    clamp = draw(st.sampled_from([(-INF, INF), (0.0, INF), (-1.0, 2.0)]))
    return dict(
        n=draw(st.integers(1, 2)),
        c=c,
        h=h,
        w=w,
        m=m,
        kh=kh,
        kw=kw,
        strides=strides,
        dilations=dilations,
        pads=pads,
        depthwise=depthwise,
        input_nchw=input_nchw,
        with_bias=draw(st.booleans()),
        lo=clamp[0],
        hi=clamp[1],
        post=draw(st.sampled_from(["", "", "SiLU"])),
    )


@settings(max_examples=40)
@given(case=conv_cases(), seed=st.integers(0, 2**16))
def test_conv_geometry_space(case, seed) -> None:
    check_conv(**case, seed=seed)


@pytest.mark.parametrize(
    "n,c,h,w,m,kh,kw,strides,pads,lo,hi",
    [
        (1, 17, 13, 11, 33, 3, 3, (1, 1), (1, 1, 1, 1), 0.0, INF),  # borders paired, 3 blocks
        (2, 130, 26, 26, 64, 1, 1, (1, 1), (0, 0, 0, 0), 0.0, INF),  # input passes, 1x1 as wide rows
        (1, 48, 10, 10, 80, 3, 3, (2, 2), (1, 0, 1, 2), -1.0, 1.5),  # 4 + 1 output blocks, a Clip
        (1, 3, 9, 7, 16, 3, 3, (1, 1), (1, 1, 1, 1), -INF, INF),  # the stem, no clamp
        (1, 40, 5, 3, 32, 3, 3, (1, 1), (1, 1, 1, 1), 0.0, INF),  # rows of 3 as one tile, input passes
        (1, 17, 4, 4, 48, 3, 3, (2, 2), (1, 1, 1, 1), -1.0, 1.5),  # rows of 2 as one tile, 2 + 1 blocks
    ],
)
def test_the_sum_operand_is_the_add_after_the_conv(n, c, h, w, m, kh, kw, strides, pads, lo, hi) -> None:
    """conv_nchwc_f32(..., sum=s) with a clamp gives the bytes of the plain convolution
    (no clamp), then + s in float32, then the clamp: the Conv -> Add -> Relu / Clip nodes
    it replaces. The same on every ISA and thread count; the twin agrees within (FG1)."""
    rng = np.random.default_rng(c * m + h)
    input_nchw = c < 16
    x, wt, bias = normal(rng, n, c, h, w), normal(rng, m, c, kh, kw), normal(rng, m)
    packed = _native.conv_nchwc_pack_f32(wt, 1, input_nchw)
    xin = x if input_nchw else twin.to_nchwc(x)
    geo = (m, c, kh, kw, list(strides), [1, 1], list(pads), 1)

    def run(isa: str) -> None:
        plain = _native.conv_nchwc_f32(xin, packed, bias, *geo, -INF, INF, 1, input_nchw=input_nchw)
        s = normal(rng, *plain.shape)
        want = np.minimum(np.maximum(plain + s, F32(lo)), F32(hi)) if lo > -INF or hi < INF else plain + s
        got = [
            _native.conv_nchwc_f32(xin, packed, bias, *geo, lo, hi, t, None, 0, [], input_nchw, s)
            for t in (1, 2)
        ]
        assert got[0].tobytes() == got[1].tobytes() == want.astype(F32).tobytes(), isa
        ref = twin.conv_nchwc(
            OpContext(opset=21),
            xin,
            wt,
            bias,
            s,
            activation="" if lo == -INF and hi == INF else "Clip",
            activation_params=None if lo == -INF and hi == INF else [lo, hi],
            group=1,
            input_nchw=int(input_nchw),
            kernel_shape=[kh, kw],
            strides=list(strides),
            dilations=[1, 1],
            pads=list(pads),
        )
        # (FG1) with the sum as one more term: K + 1 roundings, |s| in the magnitude
        attrs = dict(group=1, strides=list(strides), dilations=[1, 1], pads=list(pads))
        s64 = twin.from_nchwc(s, m).astype(np.float64)
        y64 = conv_twin(None, x.astype(np.float64), wt.astype(np.float64), bias.astype(np.float64), **attrs)
        y64 = np.clip(y64 + s64, lo, hi)
        mag = conv_twin(None, np.abs(x).astype(np.float64), np.abs(wt).astype(np.float64), None, **attrs)
        mag = mag + np.abs(bias).astype(np.float64)[:, None, None] + np.abs(s64)
        for y, who in ((got[0], "kernel"), (ref, "twin")):
            assert_within_bound(twin.from_nchwc(y, m), y64, mag, c * kh * kw + 1, f"{isa} {who}")

    every_isa(run)


def test_the_sum_operand_refusals() -> None:
    rng = np.random.default_rng(3)
    x = twin.to_nchwc(normal(rng, 1, 16, 5, 5))
    packed = _native.conv_nchwc_pack_f32(normal(rng, 16, 16, 3, 3), 1, False)
    geo = (16, 16, 3, 3, [1, 1], [1, 1], [1, 1, 1, 1], 1, -INF, INF, 1)
    with pytest.raises(
        ValueError,
        match=r"conv_nchwc_f32: sum: expected the output's shape \(1, 1, 5, 5, 16\), got \(1, 1, 5, 4, 16\)",
    ):
        _native.conv_nchwc_f32(x, packed, None, *geo, None, 0, [], False, np.zeros((1, 1, 5, 4, 16), F32))
    s = np.zeros((1, 1, 5, 5, 16), F32)
    with pytest.raises(ValueError, match="conv_nchwc_f32: out: expected a buffer that does not overlap"):
        _native.conv_nchwc_f32(x, packed, None, *geo, s, 0, [], False, s)
    dw = _native.conv_nchwc_pack_f32(normal(rng, 16, 1, 3, 3), 16, False)
    with pytest.raises(
        ValueError, match="conv_nchwc_f32: sum: a sum operand is for group 1 convolutions only"
    ):
        _native.conv_nchwc_f32(
            x, dw, None, 16, 16, 3, 3, [1, 1], [1, 1], [1, 1, 1, 1], 16, -INF, INF, 1, None, 0, [], False, s
        )


def test_conv_refuses_bad_arguments() -> None:
    rng = np.random.default_rng(0)
    w = normal(rng, 16, 3, 3, 3)
    packed = _native.conv_nchwc_pack_f32(w)
    x5 = twin.to_nchwc(normal(rng, 1, 3, 8, 8))
    geo = ([1, 1], [1, 1], [1, 1, 1, 1])

    def conv(*args, **kwargs):
        return _native.conv_nchwc_f32(*args, **kwargs)

    with pytest.raises(ValueError, match=r"conv_nchwc_f32: x: expected \[N, 1, H, W, 16\] for c = 3"):
        conv(normal(rng, 1, 3, 8, 8), packed, None, 16, 3, 3, 3, *geo, 1, -INF, INF, 1)
    with pytest.raises(ValueError, match=r"conv_nchwc_f32: x: expected \[N, 3, H, W\] \(input_nchw\)"):
        conv(x5, packed, None, 16, 3, 3, 3, *geo, 1, -INF, INF, 1, input_nchw=True)
    with pytest.raises(ValueError, match="conv_nchwc_f32: w_packed: expected 2304 floats"):
        conv(x5, packed[:-1], None, 16, 3, 3, 3, *geo, 1, -INF, INF, 1)
    with pytest.raises(ValueError, match="conv_nchwc_f32: bias: expected 16 floats, got 3"):
        conv(x5, packed, np.zeros(3, F32), 16, 3, 3, 3, *geo, 1, -INF, INF, 1)
    with pytest.raises(ValueError, match="conv_nchwc_f32: group: expected 1 or depthwise"):
        conv(x5, packed, None, 16, 3, 3, 3, *geo, 3, -INF, INF, 1)
    with pytest.raises(ValueError, match="conv_nchwc_f32: expected 2 strides, 2 dilations and 4 pads"):
        conv(x5, packed, None, 16, 3, 3, 3, [1], [1, 1], [1, 1, 1, 1], 1, -INF, INF, 1)
    with pytest.raises(ValueError, match=r"conv_nchwc_f32: the dilated kernel \(3, 3\) is larger"):
        conv(
            twin.to_nchwc(normal(rng, 1, 3, 1, 1)),
            packed,
            None,
            16,
            3,
            3,
            3,
            [1, 1],
            [1, 1],
            [0] * 4,
            1,
            -INF,
            INF,
            1,
        )
    with pytest.raises(ValueError, match="conv_nchwc_f32: num_threads: expected >= 1"):
        conv(x5, packed, None, 16, 3, 3, 3, *geo, 1, -INF, INF, 0)
    with pytest.raises(ValueError, match="conv_nchwc_f32: post: expected a kind in"):
        conv(x5, packed, None, 16, 3, 3, 3, *geo, 1, -INF, INF, 1, None, 9)
    with pytest.raises(ValueError, match="conv_nchwc_f32: out: expected shape"):
        conv(x5, packed, None, 16, 3, 3, 3, *geo, 1, -INF, INF, 1, np.zeros((1, 1, 8, 8, 8), F32))
    with pytest.raises(ValueError, match="conv_nchwc_pack_f32: group: expected 1 or depthwise"):
        _native.conv_nchwc_pack_f32(normal(rng, 16, 2, 3, 3), 2)
    with pytest.raises(ValueError, match="conv_nchwc_pack_f32: input_nchw: expected group 1"):
        _native.conv_nchwc_pack_f32(normal(rng, 16, 1, 3, 3), 16, True)
    with pytest.raises(ValueError, match=r"conv_nchwc_pack_f32: w: expected \[M, C/G, kh, kw\]"):
        _native.conv_nchwc_pack_f32(normal(rng, 16, 3, 3))


# --------------------------------------------------------------------------------------
# Pools and resize (exact)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "c,h,w,kernel,strides,pads,dilations,ceil_mode",
    [
        (17, 10, 10, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1), False),  # YOLO's SPPF
        (48, 20, 20, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1), False),
        (7, 13, 13, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False),  # a stem's 3x3 stride 2
        (16, 13, 12, (3, 3), (2, 2), (0, 0, 0, 0), (1, 1), True),  # ceil_mode overhang
        (33, 9, 11, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), False),
        (3, 9, 11, (3, 2), (1, 2), (1, 0, 2, 1), (2, 1), True),  # asymmetric, dilated
        (1, 1, 1, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), False),
    ],
)
def test_max_pool_is_the_twins_bytes(c, h, w, kernel, strides, pads, dilations, ceil_mode) -> None:
    from quanta.kernels.reference.registry import OpContext

    rng = np.random.default_rng(c * h + w)
    x5 = normal(rng, 2, twin.blocks(c), h, w, 16)  # pad lanes pooled like the others
    attrs = dict(
        kernel_shape=list(kernel),
        strides=list(strides),
        pads=list(pads),
        dilations=list(dilations),
        ceil_mode=int(ceil_mode),
    )
    want = twin.max_pool_nchwc(OpContext(opset=17), x5, **attrs)

    def run(isa: str) -> None:
        for threads in (1, 2):
            y = _native.max_pool_nchwc_f32(
                x5, list(kernel), list(strides), list(pads), list(dilations), ceil_mode, threads
            )
            assert y.shape == want.shape and y.tobytes() == want.tobytes(), (isa, threads)

    every_isa(run)


def test_max_pool_propagates_nan() -> None:
    x5 = normal(np.random.default_rng(3), 1, 1, 6, 6, 16)
    x5[0, 0, 2, 3, 5] = np.nan

    def run(isa: str) -> None:
        y = _native.max_pool_nchwc_f32(x5, [3, 3], [1, 1], [1, 1, 1, 1])
        nan = np.isnan(y)
        assert nan[0, 0, 1:4, 2:5, 5].all() and nan.sum() == 9, isa

    every_isa(run)


@pytest.mark.parametrize("kernel", [(2, 2), (3, 3), (2, 3)])
def test_max_pool_inner_windows_propagate_nan_at_every_tap(kernel) -> None:
    """The windows inside the plane start their maximum at the first tap (2 × 2 and 3 × 3
    unrolled, others generic): a NaN at any tap of a window, a window of −inf and one of
    NaN only give the twin's bytes."""
    from quanta.kernels.reference.registry import OpContext

    kh, kw = kernel
    x5 = normal(np.random.default_rng(kh * 10 + kw), 1, 1, 4 * kh, 4 * kw, 16)
    for lane, (ky, kx) in enumerate((ky, kx) for ky in range(kh) for kx in range(kw)):
        x5[0, 0, kh + ky, kw + kx, lane] = np.nan  # window (1, 1): one tap per lane
    x5[0, 0, 2 * kh : 3 * kh, 2 * kw : 3 * kw, 15] = -np.inf
    x5[0, 0, 3 * kh : 4 * kh, 3 * kw : 4 * kw, 14] = np.nan
    attrs = dict(kernel_shape=list(kernel), strides=list(kernel), pads=[0, 0, 0, 0])
    want = twin.max_pool_nchwc(OpContext(opset=17), x5, **attrs)
    assert np.isnan(want[0, 0, 1, 1, : kh * kw]).all() and want[0, 0, 2, 2, 15] == -np.inf

    def run(isa: str) -> None:
        y = _native.max_pool_nchwc_f32(x5, list(kernel), list(kernel), [0, 0, 0, 0])
        np.testing.assert_array_equal(y, want, err_msg=isa)  # NaN payloads are not pinned

    every_isa(run)


@pytest.mark.parametrize("c,h,w", [(17, 10, 10), (3, 1, 1), (48, 7, 9), (16, 20, 20), (7, 1, 37)])
def test_global_avg_pool_is_the_twins_bytes(c, h, w) -> None:
    from quanta.kernels.reference.nn_pool import global_average_pool
    from quanta.kernels.reference.registry import OpContext

    x5 = normal(np.random.default_rng(c + h * w), 2, twin.blocks(c), h, w, 16) * np.float32(100)
    want = twin.to_nchwc(global_average_pool(OpContext(opset=17), twin.from_nchwc(x5)))

    def run(isa: str) -> None:
        for threads in (1, 2):
            y = _native.global_avg_pool_nchwc_f32(x5, threads)
            assert y.shape == want.shape and y.tobytes() == want.tobytes(), (isa, threads)

    every_isa(run)


@pytest.mark.parametrize("h,w,fy,fx", [(10, 10, 2, 2), (1, 3, 3, 1), (5, 7, 1, 4), (13, 13, 2, 2)])
def test_resize_nearest_repeats_each_pixel(h, w, fy, fx) -> None:
    x5 = normal(np.random.default_rng(h * w), 2, 3, h, w, 16)
    want = np.repeat(np.repeat(x5, fy, axis=2), fx, axis=3)
    for threads in (1, 2):
        y = _native.resize_nearest_nchwc_f32(x5, fy, fx, threads)
        assert y.tobytes() == want.tobytes(), threads


def test_pools_refuse_bad_arguments() -> None:
    x5 = np.zeros((1, 1, 4, 4, 16), F32)
    with pytest.raises(ValueError, match=r"max_pool_nchwc_f32: x: expected \[N, Cb, H, W, 16\]"):
        _native.max_pool_nchwc_f32(np.zeros((1, 3, 4, 4), F32), [2, 2], [2, 2], [0] * 4)
    with pytest.raises(ValueError, match="max_pool_nchwc_f32: expected 2 kernel sizes"):
        _native.max_pool_nchwc_f32(x5, [2], [2, 2], [0] * 4)
    with pytest.raises(ValueError, match="max_pool_nchwc_f32: the dilated kernel is larger"):
        _native.max_pool_nchwc_f32(x5, [5, 5], [1, 1], [0] * 4)
    with pytest.raises(ValueError, match="global_avg_pool_nchwc_f32: x: expected a non-empty plane"):
        _native.global_avg_pool_nchwc_f32(np.zeros((1, 1, 0, 4, 16), F32))
    with pytest.raises(ValueError, match="resize_nearest_nchwc_f32: fy, fx: expected integer factors >= 1"):
        _native.resize_nearest_nchwc_f32(x5, 0, 2)


@pytest.mark.parametrize("kw,stride,dil", [(3, 1, 1), (5, 1, 1), (3, 2, 2), (5, 2, 1)])
def test_depthwise_gives_the_same_bytes_on_every_isa(kw, stride, dil) -> None:
    """Every ISA runs the same per-lane chains (taps in (ky, kx) order, then the bias): the
    depthwise bytes do not depend on the ISA."""
    rng = np.random.default_rng(kw * 10 + stride)
    c, h, w = 33, 11, 29
    x5 = twin.to_nchwc(normal(rng, 1, c, h, w))
    wt, b = normal(rng, c, 1, kw, kw), normal(rng, c)
    packed = _native.conv_nchwc_pack_f32(wt, c)
    p = kw // 2 * dil
    outs = {}

    def run(isa: str) -> None:
        outs[isa] = _native.conv_nchwc_f32(
            x5, packed, b, c, c, kw, kw, [stride, stride], [dil, dil], [p, p, p, p], c, -INF, INF, 1
        ).tobytes()

    every_isa(run)
    assert len(set(outs.values())) == 1, list(outs)


@pytest.mark.parametrize(
    "c,h,m,k,stride,dil,pad,kind",
    [
        (17, 40, 48, 5, 1, 1, (0, 0), "direct"),  # magika's Conv1D written along H
        (7, 29, 17, 3, 2, 1, (1, 2), "direct"),
        (33, 13, 80, 3, 1, 2, (2, 0), "direct"),
        (3, 37, 16, 5, 1, 1, (2, 2), "nchw_in"),
        (17, 31, 17, 5, 1, 1, (2, 2), "dw"),
        (16, 6, 16, 1, 1, 1, (0, 0), "direct"),  # 1x1 of one column
    ],
)
def test_k_by_1_of_a_column_is_its_1_by_k_twins_bytes(c, h, m, k, stride, dil, pad, kind) -> None:
    """A k x 1 convolution of a plane one column wide is the 1 x k convolution of the same
    bytes as one row ([N, Cb, H, 1, 16] and [N, Cb, 1, H, 16] are one array, and so are
    the packed weights): the driver runs it along the row, the same chains, the same bytes.
    Each form is also within (FG1) of float64 (check_conv)."""
    rng = np.random.default_rng(c * h + k)
    input_nchw, group = kind == "nchw_in", c if kind == "dw" else 1
    x = normal(rng, 2, c, h, 1)
    wt = normal(rng, m, 1 if kind == "dw" else c, k, 1)
    b = normal(rng, m)
    xin = x if input_nchw else twin.to_nchwc(x)

    def run(isa: str) -> None:
        col = _native.conv_nchwc_f32(
            xin, _native.conv_nchwc_pack_f32(wt, group, input_nchw), b, m, c, k, 1,
            [stride, 1], [dil, 1], [pad[0], 0, pad[1], 0], group, -INF, INF, 2, input_nchw=input_nchw,
        )  # fmt: skip
        row = _native.conv_nchwc_f32(
            xin.reshape(*xin.shape[:2], 1, h, *xin.shape[4:]),
            _native.conv_nchwc_pack_f32(wt.reshape(*wt.shape[:2], 1, k), group, input_nchw), b, m, c, 1, k,
            [1, stride], [1, dil], [0, pad[0], 0, pad[1]], group, -INF, INF, 2, input_nchw=input_nchw,
        )  # fmt: skip
        assert col.shape[2:4] == (row.shape[3], 1) and col.tobytes() == row.tobytes(), isa

    every_isa(run)
    check_conv(
        2, c, h, 1, m, k, 1, (stride, 1), (dil, 1), (pad[0], 0, pad[1], 0),
        depthwise=kind == "dw", input_nchw=input_nchw,
    )  # fmt: skip


@pytest.mark.parametrize(
    "c,m,h,w,strides,dilations,pads,clamp,post",
    [
        (3, 24, 7, 7, (1, 1), (1, 1), (1, 1, 1, 1), (0.0, INF), ""),  # interior 5: 3 + 2
        (7, 40, 15, 15, (1, 1), (1, 1), (1, 1, 1, 1), (-INF, INF), "SiLU"),  # 2 + 1 blocks, interior 13
        (17, 64, 9, 12, (1, 1), (1, 1), (1, 0, 1, 2), (-1.0, 1.0), ""),  # interior 10 (remainder 1)
        (24, 24, 17, 31, (2, 2), (1, 1), (1, 1, 1, 1), (0.0, 6.0), ""),  # stride 2, interior 14
        (40, 48, 13, 11, (1, 2), (2, 1), (2, 1, 2, 1), (-INF, INF), "HardSwish"),
        (17, 32, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1), (0.0, INF), ""),  # interior 1: all borders
        (24, 32, 30, 30, (1, 1), (1, 1), (1, 1, 1, 1), (0.0, INF), ""),  # interior 28
        (40, 17, 8, 60, (1, 1), (1, 1), (1, 1, 1, 1), (-INF, INF), "SiLU"),  # one block, interior 58
        # either side of nchwc.h kWideRow (AVX2: 3 x 2 tiles on rows of 5, 6 x 1 on rows of 6)
        (17, 48, 7, 5, (1, 1), (1, 1), (1, 1, 1, 1), (-INF, INF), ""),  # 5 columns, 2 + 1 blocks
        (40, 33, 6, 6, (1, 1), (1, 1), (1, 1, 1, 1), (-1.0, 1.0), "SiLU"),  # 6 columns, 3 blocks, 2 passes
        (7, 64, 9, 11, (2, 2), (1, 1), (1, 1, 1, 1), (0.0, INF), ""),  # stride 2: 6 columns, 4 blocks
        (33, 48, 6, 10, (2, 2), (1, 1), (1, 0, 1, 1), (-INF, INF), "HardSwish"),  # stride 2: 5 columns
    ],
)
def test_group_1_gives_the_same_bytes_on_every_isa(c, m, h, w, strides, dilations, pads, clamp, post) -> None:
    """Every ISA runs the same per-element chains (input channel block, ky, kx, lane; then
    the bias, the clamp, the post op), whatever its tiles: on AVX2 6 pixels x 1 output
    block on rows of at least 6 pixels, 3 x 2 (and 6 x 1 for a last odd block) on narrower
    ones, border pairs and input channel passes with the next pass's weights prefetched;
    one pixel x one block on the portable kernels, which state
    the order in scalar std::fma steps. So
    the bytes do not depend on the ISA, nor on the thread count; each is also within (FG1)
    of float64 (check_conv)."""
    rng = np.random.default_rng(c * m + h * w)
    x5 = twin.to_nchwc(normal(rng, 2, c, h, w))
    wt, b = normal(rng, m, c, 3, 3), normal(rng, m)
    packed = _native.conv_nchwc_pack_f32(wt, 1)
    kind, params = POSTS[post]
    outs = {}

    def run(isa: str) -> None:
        for threads in (1, 2):
            y = _native.conv_nchwc_f32(
                x5, packed, b, m, c, 3, 3, list(strides), list(dilations), list(pads), 1, *clamp, threads,
                None, kind, params,
            )  # fmt: skip
            outs[isa, threads] = y.tobytes()

    every_isa(run)
    assert len(set(outs.values())) == 1, list(outs)
    check_conv(2, c, h, w, m, 3, 3, strides, dilations, pads, lo=clamp[0], hi=clamp[1], post=post)


@pytest.mark.parametrize(
    "c,m,h,w,k,strides,dilations,pads,input_nchw,post",
    [
        (17, 32, 3, 3, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), False, ""),  # VGG's last block: 1 | 1 + 1 | 1
        (40, 48, 5, 3, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), False, "SiLU"),  # 3 input passes, 2 + 1 blocks
        (7, 17, 4, 2, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), False, ""),  # rows of 2, both pixels borders
        (3, 24, 6, 4, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), False, "HardSwish"),  # stride 2: 4 -> 2
        (24, 7, 5, 3, (3, 3), (1, 1), (2, 2), (2, 2, 2, 2), False, ""),  # dilation 2: every pixel cut
        (33, 17, 3, 1, (3, 3), (1, 1), (1, 1), (1, 2, 1, 2), False, ""),  # one tap a pixel, none shared
        (17, 64, 4, 2, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2), False, ""),  # 5x5 on 2 columns, 4 blocks
        (16, 32, 3, 3, (1, 3), (1, 1), (1, 1), (0, 1, 0, 1), False, ""),  # 1 x 3
        (3, 32, 5, 3, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), True, ""),  # the stem: plain planes
        (290, 32, 3, 3, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), False, ""),  # K = 2610, 19 input passes
        (17, 32, 3, 3, (3, 3), (1, 1), (1, 1), (0, 0, 0, 0), False, ""),  # valid: 1 pixel, no row tile
        (17, 32, 3, 5, (3, 3), (1, 1), (1, 1), (0, 1, 0, 0), False, ""),  # 4 columns: pair + tile
        (24, 40, 7, 7, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), False, "SiLU"),  # 7 columns: pair + 3 + 2
        (17, 32, 9, 9, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), False, ""),  # stride 2, 5 columns
        (7, 48, 6, 8, (3, 3), (1, 1), (1, 1), (1, 2, 1, 0), False, ""),  # asymmetric pads, 8 columns
        (3, 32, 4, 9, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), False, ""),  # 9 columns
        (3, 32, 4, 10, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), False, ""),  # 10 columns
    ],
)
def test_narrow_rows_give_the_pair_and_tile_bytes(
    c, m, h, w, k, strides, dilations, pads, input_nchw, post
) -> None:
    """A row of 2-3 output pixels runs as one tile, each pixel over its own taps (AVX2,
    AVX-512), where the portable kernels run border pairs and one-pixel tiles: the same
    chains (input channel block, ky, kx, lane; bias, clamp, post op), so the same bytes on
    every ISA and thread count, and within (FG1) of float64. A pixel given a tap it does not
    take, or a tap dropped, moves its output far outside the bound. Rows of 4-10 pixels
    (pairs and tiles on every ISA) are the neighbours that must not take the row tile.
    Channels 3, 7, 17 and 33 leave pad lanes; x's pad lanes hold 3.0 and must not be read."""
    rng = np.random.default_rng(c * m + h * w)
    x = normal(rng, 2, c, h, w)
    x5 = x if input_nchw else twin.to_nchwc(x)
    if not input_nchw:
        x5[:, -1, ..., c - (twin.blocks(c) - 1) * 16 :] = 3.0
    wt, b = normal(rng, m, c, *k), normal(rng, m)
    packed = _native.conv_nchwc_pack_f32(wt, 1, input_nchw)
    kind, params = POSTS[post]
    outs = {}

    def run(isa: str) -> None:
        for threads in (1, 2):
            y = _native.conv_nchwc_f32(
                x5, packed, b, m, c, *k, list(strides), list(dilations), list(pads), 1, 0.0, INF, threads,
                None, kind, params, input_nchw,
            )  # fmt: skip
            outs[isa, threads] = y.tobytes()

    every_isa(run)
    assert "portable" in ISAS
    assert len(set(outs.values())) == 1, list(outs)
    check_conv(2, c, h, w, m, *k, strides, dilations, pads, input_nchw=input_nchw, lo=0.0, post=post)


@pytest.mark.parametrize(
    "n,c,m,h,w,input_nchw,post,sum_",
    [
        (1, 17, 33, 13, 13, False, "", False),  # 169 pixels: no divisor widens the rows
        (2, 7, 48, 7, 7, False, "SiLU", False),  # 49 pixels, 2 + 1 output blocks
        (1, 290, 17, 13, 13, False, "", True),  # K = 290: 2 input passes through y, the sum operand
        (1, 33, 80, 11, 5, False, "HardSwish", False),  # 4 + 1 blocks, 55 pixels
        (2, 3, 7, 26, 26, False, "", False),  # widened rows (4 of 169), items of several rows
        (1, 3, 32, 9, 9, True, "", False),  # plain input planes (a stem's lane stride)
        (1, 17, 17, 3, 2, False, "SiLU", True),  # 6 pixels, rows of 2 (no row tile)
        (1, 7, 17, 11, 1, False, "", False),  # one column: the 1 x 11 twin
        (1, 17, 48, 4, 4, False, "", False),  # rows of 4 as one line of 16: the wide rows' tiles
    ],
)
def test_pointwise_items_run_as_one_line(n, c, m, h, w, input_nchw, post, sum_) -> None:
    """A 1x1 convolution of stride 1 without pads runs an item's rows as one line of
    pixels (AVX2 and AVX-512 tiles of several pixels; the portable kernels' one-pixel tiles
    state the order): each output's chain is (input channel block, lane), then bias, sum,
    clamp and post op, wherever a tile starts, so every ISA and thread count gives the same
    bytes, within (FG1) of float64. A tile that ran past a row into the wrong pixels, or a
    line that missed the last row's tail, moves those outputs far outside the bound; x's
    pad lanes hold 3.0 and must not be read."""
    rng = np.random.default_rng(c * m + h * w)
    x = normal(rng, n, c, h, w)
    x5 = x if input_nchw else twin.to_nchwc(x)
    if not input_nchw:
        x5[:, -1, ..., c - (twin.blocks(c) - 1) * 16 :] = 3.0
    wt, b = normal(rng, m, c, 1, 1), normal(rng, m)
    packed = _native.conv_nchwc_pack_f32(wt, 1, input_nchw)
    kind, params = POSTS[post]
    s = normal(rng, n, twin.blocks(m), h, w, 16) if sum_ else None
    outs = {}

    def run(isa: str) -> None:
        for threads in (1, 2):
            y = _native.conv_nchwc_f32(
                x5, packed, b, m, c, 1, 1, [1, 1], [1, 1], [0, 0, 0, 0], 1, -1.5, INF, threads,
                None, kind, params, input_nchw, s,
            )  # fmt: skip
            outs[isa, threads] = y.tobytes()

    every_isa(run)
    assert "portable" in ISAS
    assert len(set(outs.values())) == 1, list(outs)
    check_conv(n, c, h, w, m, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0), input_nchw=input_nchw, lo=-1.5, post=post)


@pytest.mark.parametrize(
    "n,c,w,m,k,post",
    [
        (8, 37, 16, 70, 5, ""),  # 3 input blocks, 4 + 1 output blocks: 8 images an item
        (5, 290, 9, 17, 3, "SiLU"),  # K = 290: input passes through y, the post op per image
        (3, 7, 1, 33, 1, ""),  # one pixel an image
        (2, 17, 7, 48, 7, ""),  # a window wider than the row: every pixel a border pixel
    ],
)
def test_images_of_one_row_share_an_item_with_each_images_bytes(n, c, w, m, k, post) -> None:
    """[N, C, 1, W] (a Conv1d written as 1 x k): images whose rows fit in one item run
    several to an item, each input pass over all of them. Each image's output is the
    bytes of that image run alone (N = 1: one image an item), on every ISA and thread
    count, and within (FG1) of float64; an image offset taken from the wrong image, or a
    pass skipped for one, moves whole rows."""
    pads = (0, k // 2, 0, k // 2)
    rng = np.random.default_rng(n * c + w * m)
    x = normal(rng, n, c, 1, w)
    x5 = twin.to_nchwc(x)
    x5[:, -1, ..., c - (twin.blocks(c) - 1) * 16 :] = 3.0  # pad lanes nobody reads
    wt, b = normal(rng, m, c, 1, k), normal(rng, m)
    packed = _native.conv_nchwc_pack_f32(wt, 1, False)
    kind, params = POSTS[post]
    outs = {}

    def conv(xs: np.ndarray, threads: int) -> np.ndarray:
        return _native.conv_nchwc_f32(
            xs, packed, b, m, c, 1, k, [1, 1], [1, 1], list(pads), 1, 0.0, INF, threads, None, kind, params, False
        )  # fmt: skip

    def run(isa: str) -> None:
        alone = np.concatenate([conv(np.ascontiguousarray(x5[i : i + 1]), 1) for i in range(n)])
        for threads in (1, 2):
            y = conv(x5, threads)
            assert y.tobytes() == alone.tobytes(), (isa, threads)
            outs[isa, threads] = y.tobytes()

    every_isa(run)
    assert len(set(outs.values())) == 1, list(outs)
    check_conv(n, c, 1, w, m, 1, k, (1, 1), (1, 1), pads, lo=0.0, post=post)
