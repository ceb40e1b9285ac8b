"""The float GEMM family's native kernels (quanta/kernels/cpp/sgemm) against float64.

Not bit-exact with the NumPy twin (BLAS sums in an order of its own): every output is
checked against the float64 result within docs/float-ops.md eq. (FG1)::

    |y − y64| ≤ (K + 3) · u · (|α| · Σ_k |a_ik| |b_kj| + |bias terms|),   u = 2^-24

where K is the length of the element's reduction (Cg·kh·kw for a convolution). The
bound is that of a recursive sum of K products plus the epilogue's roundings; a kernel
that dropped a term, summed a wrong window or mis-indexed a bias misses it by orders of
magnitude (the data are random normals, so Σ|a||b| is of the size of y itself).

Every ISA the CPU supports runs (``_native.set_isa``); 1 and 2 threads give identical
bytes (the reduction is never split). Shapes: odd M/N/K around the micro-kernel's tile
edges (8 rows, 32 and 16 columns), K past one K-block (256) and past 258, channel counts
3, 7, 17, groups, strides, pads and dilations, drawn by hypothesis.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from quanta.kernels import _native
from quanta.kernels.reference.nn_conv import conv as conv_twin
from tests.isa import every_isa

F32 = np.float32
U = 2.0**-24


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


def normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(F32)


# --------------------------------------------------------------------------------------
# GEMM
# --------------------------------------------------------------------------------------


def check_matmul(m: int, k: int, n: int, seed: int, alpha: float = 1.0, with_bias: bool = True) -> None:
    rng = np.random.default_rng(seed)
    a, b = normal(rng, m, k), normal(rng, k, n)
    bias = normal(rng, n) if with_bias else None
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    y64 = float(np.float32(alpha)) * (a64 @ b64)
    mag = abs(alpha) * (np.abs(a64) @ np.abs(b64))
    if bias is not None:
        y64 = y64 + bias
        mag = mag + np.abs(bias)
    packed = _native.sgemm_pack_b(b)
    packed_t = _native.sgemm_pack_b(np.ascontiguousarray(b.T), trans=True)
    np.testing.assert_array_equal(packed, packed_t)  # the transposed pack reads the same matrix

    def run(isa: str) -> None:
        ys = {}
        for threads in (1, 2):
            ys["rowmajor", threads] = _native.matmul_f32(a, b, bias=bias, alpha=alpha, num_threads=threads)
            ys["packed", threads] = _native.matmul_f32(
                a, None, packed, n, bias=bias, alpha=alpha, num_threads=threads
            )
        for (form, threads), y in ys.items():
            assert_within_bound(y, y64, mag, k, f"{isa} {form} {threads}t m={m} k={k} n={n}")
        for form in ("rowmajor", "packed"):
            assert ys[form, 1].tobytes() == ys[form, 2].tobytes(), f"{isa} {form}: 1 vs 2 threads"

    every_isa(run)


@pytest.mark.parametrize(
    "m,k,n",
    [
        (1, 1, 1),
        (7, 3, 17),
        (8, 16, 32),
        (9, 17, 33),
        (17, 257, 31),
        (3, 300, 65),
        (33, 520, 47),
        (64, 384, 96),
    ],
)
def test_matmul_tile_edges(m: int, k: int, n: int) -> None:
    check_matmul(m, k, n, seed=m * 1000 + k + n, alpha=1.0 if m % 2 else 0.75)


@given(m=st.integers(1, 40), k=st.integers(1, 600), n=st.integers(1, 80), seed=st.integers(0, 2**16))
def test_matmul_shapes(m: int, k: int, n: int, seed: int) -> None:
    check_matmul(m, k, n, seed, with_bias=bool(seed % 2))


def test_matmul_large_tiles_threads() -> None:
    """Enough work for several thread tasks (rows and columns split)."""
    check_matmul(129, 300, 700, seed=5)


@pytest.mark.parametrize("rows", [1, 3, 8, 17, 21, 35])
@pytest.mark.parametrize("k", [301, 1031])
def test_packed_streaming_rows_give_the_k_block_bytes(rows: int, k: int) -> None:
    """A packed B and few rows of A run panel after panel (sgemm.cc run_block_stream, one
    row tile over all of K at once, the first row tile prefetching B); many rows run by K
    blocks (run_block). Each element is the same fma chain either way, so the few rows'
    bytes are those rows of the larger product, on every ISA and thread count, and within
    (FG1). K = 1031: five K blocks for the rows past one tile."""
    rng = np.random.default_rng(rows + k)
    m, n = 300, 707  # m·k past the streaming limit (2^16 floats); K past 258; odd N
    a, b, bias = normal(rng, m, k), normal(rng, k, n), normal(rng, n)
    packed = _native.sgemm_pack_b(b)
    a64, b64 = a[:rows].astype(np.float64), b.astype(np.float64)
    y64, mag = a64 @ b64 + bias, np.abs(a64) @ np.abs(b64) + np.abs(bias)

    def run(isa: str) -> None:
        big = _native.matmul_f32(a, None, packed, n, bias=bias, num_threads=1)
        for threads in (1, 2):
            few = _native.matmul_f32(a[:rows], None, packed, n, bias=bias, num_threads=threads)
            assert_within_bound(few, y64, mag, k, f"{isa} {rows} rows {threads}t")
            assert few.tobytes() == big[:rows].tobytes(), f"{isa} {rows} rows {threads}t"

    every_isa(run)


@pytest.mark.parametrize("k", [26, 156, 259, 520])
@pytest.mark.parametrize("n", [16, 26, 71])
def test_row_tiles_of_every_height_give_each_rows_bytes(k: int, n: int) -> None:
    """A row-major A runs in tiles of up to 6 rows on AVX2 (4 on a packed A, 8 on
    AVX-512), full 16-column tiles with plain loads and stores, edge tiles masked: each
    element is still one fma chain in increasing k, so a row's bytes do not depend on the
    tile that computed it. M = 13 is two 6-row tiles and a 1-row tile, 17 ends in 5; K
    past 258 splits into K blocks; N = 26 is attention's head width (one full and one
    10-lane tile). Within (FG1) and equal to every row computed alone (a 1-row product)."""
    rng = np.random.default_rng(k * 100 + n)
    for m in (5, 6, 7, 12, 13, 17):
        a, b, bias = normal(rng, m, k), normal(rng, k, n), normal(rng, n)
        packed = _native.sgemm_pack_b(b)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        y64, mag = a64 @ b64 + bias, np.abs(a64) @ np.abs(b64) + np.abs(bias)

        def run(isa: str, a=a, b=b, bias=bias, packed=packed, y64=y64, mag=mag, m=m) -> None:
            for form, bb, nn in (("rowmajor", b, 0), ("packed", None, n)):
                y = _native.matmul_f32(a, bb, packed if bb is None else None, nn, bias=bias)
                assert_within_bound(y, y64, mag, k, f"{isa} {form} m={m} k={k} n={n}")
                for i in range(m):
                    one = _native.matmul_f32(a[i : i + 1], bb, packed if bb is None else None, nn, bias=bias)
                    assert one.tobytes() == y[i : i + 1].tobytes(), f"{isa} {form} m={m} k={k} n={n} row {i}"

        every_isa(run)


def test_matmul_empty_reduction_is_the_epilogue_of_zero() -> None:
    a, b, bias = np.zeros((3, 0), F32), np.zeros((0, 5), F32), np.arange(5, dtype=F32)
    np.testing.assert_array_equal(_native.matmul_f32(a, b, bias=bias), np.broadcast_to(bias, (3, 5)))


@given(
    batch_a=st.sampled_from([(), (1,), (3,), (2, 3), (2, 1)]),
    batch_b=st.sampled_from([(), (1,), (3,), (2, 3), (1, 3)]),
    m=st.integers(1, 20),
    k=st.integers(1, 300),
    n=st.integers(1, 40),
)
def test_batched_matmul_broadcasts_as_numpy(batch_a, batch_b, m, k, n) -> None:
    rng = np.random.default_rng(m * k + n)
    a, b = normal(rng, *batch_a, m, k), normal(rng, *batch_b, k, n)
    y64 = np.matmul(a.astype(np.float64), b.astype(np.float64))
    mag = np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64))

    def run(isa: str) -> None:
        y1 = _native.matmul_f32(a, b, num_threads=1)
        y2 = _native.matmul_f32(a, b, num_threads=2)
        assert_within_bound(y1, y64, mag, k, f"{isa} batch {batch_a} x {batch_b}")
        assert y1.tobytes() == y2.tobytes()

    every_isa(run)


def test_matmul_refuses_bad_arguments() -> None:
    a = np.ones((2, 3), F32)
    with pytest.raises(ValueError, match="inner dimensions differ"):
        _native.matmul_f32(a, np.ones((4, 5), F32))
    with pytest.raises(ValueError, match="batch dimensions do not broadcast"):
        _native.matmul_f32(np.ones((2, 2, 3), F32), np.ones((3, 3, 5), F32))
    with pytest.raises(ValueError, match="b_packed: expected"):
        _native.matmul_f32(a, None, np.ones(7, F32), 5)
    with pytest.raises(ValueError, match="expected dtype float32"):
        _native.matmul_f32(a.astype(np.float64), np.ones((3, 5), F32))
    with pytest.raises(ValueError, match="out: expected shape"):
        _native.matmul_f32(a, np.ones((3, 5), F32), out=np.empty((2, 4), F32))


# --------------------------------------------------------------------------------------
# Conv
# --------------------------------------------------------------------------------------


def check_conv(
    n, c, h, w, m, group, kh, kw, strides, dilations, pads, seed, with_bias=True, path=None
) -> None:
    rng = np.random.default_rng(seed)
    x, wt = normal(rng, n, c, h, w), normal(rng, m, c // group, kh, kw)
    bias = normal(rng, m) if with_bias else None
    attrs = dict(group=group, strides=list(strides), dilations=list(dilations), pads=list(pads))
    b64 = None if bias is None else bias.astype(np.float64)
    y64 = conv_twin(None, x.astype(np.float64), wt.astype(np.float64), b64, **attrs)
    mag = conv_twin(
        None,
        np.abs(x).astype(np.float64),
        np.abs(wt).astype(np.float64),
        None if b64 is None else np.abs(b64),
        **attrs,
    )
    packed = _native.conv_pack_f32(wt, group)
    geometry = (m, kh, kw, list(strides), list(dilations), list(pads), group)
    if path is not None:
        assert _native.conv_path_f32(x, *geometry) == path
    k = (c // group) * kh * kw

    def run(isa: str) -> None:
        y1 = _native.conv_f32(x, packed, bias, *geometry, num_threads=1)
        y2 = _native.conv_f32(x, packed, bias, *geometry, num_threads=2)
        out = np.full(y64.shape, np.nan, F32)
        y3 = _native.conv_f32(x, packed, bias, *geometry, num_threads=2, out=out)
        assert y3 is out or np.shares_memory(y3, out)
        label = f"{isa} x{x.shape} w{wt.shape} g{group} s{strides} d{dilations} p{pads}"
        assert_within_bound(y1, y64, mag, k, label)
        assert y1.tobytes() == y2.tobytes() == out.tobytes(), f"{label}: 1 vs 2 threads"

    every_isa(run)


@pytest.mark.parametrize(
    "n,c,h,w,m,group,kh,kw,strides,dilations,pads,path",
    [
        (1, 16, 20, 23, 24, 1, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0), "pointwise"),
        (2, 7, 5, 9, 17, 1, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0), "pointwise"),
        (1, 6, 7, 9, 9, 3, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0), "pointwise"),  # grouped 1x1
        (1, 300, 3, 5, 9, 1, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0), "pointwise"),  # K > 258
        (1, 300, 1, 1, 37, 1, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0), "pointwise"),  # one column: the GEMV
        (2, 17, 1, 1, 300, 1, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0), "pointwise"),  # GEMV, 38 panels
        (1, 12, 1, 1, 20, 2, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0), "pointwise"),  # grouped GEMV
        (1, 17, 9, 11, 17, 17, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1), "depthwise"),
        (2, 17, 9, 11, 17, 17, 3, 3, (2, 2), (1, 1), (1, 1, 1, 1), "depthwise"),
        (1, 7, 9, 70, 7, 7, 5, 5, (1, 1), (1, 1), (2, 2, 2, 2), "depthwise"),  # 70: 4 zmm + a tail
        (1, 7, 13, 131, 7, 7, 5, 5, (2, 1), (1, 1), (2, 2, 2, 2), "depthwise"),
        (1, 3, 11, 12, 3, 3, 3, 3, (3, 3), (2, 2), (0, 1, 2, 0), "depthwise"),  # gathered stride
        # stride 2 on split rows: odd and even left pads, an odd row count, 5x5 past 64 columns
        (1, 17, 9, 75, 17, 17, 3, 3, (2, 2), (1, 1), (1, 1, 1, 1), "depthwise"),
        (1, 7, 10, 80, 7, 7, 3, 3, (2, 2), (1, 1), (0, 0, 1, 1), "depthwise"),
        (2, 3, 7, 161, 3, 3, 5, 5, (2, 2), (1, 1), (2, 2, 2, 2), "depthwise"),
        (1, 3, 6, 150, 3, 3, 5, 5, (2, 2), (1, 1), (1, 1, 2, 2), "depthwise"),
        (1, 17, 9, 80, 17, 17, 5, 5, (2, 2), (1, 1), (2, 2, 2, 2), "depthwise"),  # 5x5, 40 columns
        (1, 3, 33, 35, 16, 1, 3, 3, (2, 2), (1, 1), (1, 1, 1, 1), "im2col"),  # the stem
        (1, 6, 13, 11, 9, 3, 3, 3, (2, 2), (2, 2), (1, 2, 0, 1), "im2col"),  # grouped, dilated
        (1, 40, 6, 7, 20, 1, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1), "im2col"),  # K = 360
        (1, 8, 5, 40, 12, 1, 1, 3, (1, 1), (1, 1), (0, 1, 0, 1), "im2col"),  # 1x3 (ppocr_rec)
        (1, 7, 6, 6, 5, 1, 1, 1, (2, 2), (1, 1), (0, 0, 0, 0), "im2col"),  # strided 1x1
        # strided 1x1: the pointwise product on the subsampled plane (K > 258, two images,
        # groups, unequal strides, a bottom / right pad no window reads)
        (2, 300, 9, 7, 17, 1, 1, 1, (2, 2), (1, 1), (0, 0, 0, 0), "im2col"),
        (1, 6, 11, 13, 9, 3, 1, 1, (3, 2), (1, 1), (0, 0, 0, 0), "im2col"),
        (1, 7, 7, 9, 5, 1, 1, 1, (2, 2), (1, 1), (0, 0, 1, 1), "im2col"),
    ],
)
def test_conv_paths(n, c, h, w, m, group, kh, kw, strides, dilations, pads, path) -> None:
    check_conv(n, c, h, w, m, group, kh, kw, strides, dilations, pads, seed=c * m + h, path=path)


@st.composite
def conv_cases(draw):
    group = draw(st.sampled_from([1, 1, 2, 3]))
    depthwise = draw(st.booleans())
    cg = 1 if depthwise else draw(st.sampled_from([1, 3, 7, 17]))
    c = cg * (group if not depthwise else draw(st.sampled_from([2, 3, 7, 17])))
    group = c if depthwise else group
    m = c if depthwise else group * draw(st.integers(1, 12))
    kh, kw = draw(st.sampled_from([(1, 1), (3, 3), (5, 5), (1, 3), (3, 1), (2, 2)]))
    strides = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilations = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pads = tuple(draw(st.integers(0, 2)) for _ in range(4))
    h = draw(st.integers(max(1, dilations[0] * (kh - 1) + 1 - pads[0] - pads[2]), 14))
    w = draw(st.integers(max(1, dilations[1] * (kw - 1) + 1 - pads[1] - pads[3]), 40))
    return draw(st.integers(1, 2)), c, h, w, m, group, kh, kw, strides, dilations, pads


@given(case=conv_cases(), seed=st.integers(0, 2**16), with_bias=st.booleans())
def test_conv_geometry_space(case, seed, with_bias) -> None:
    check_conv(*case, seed=seed, with_bias=with_bias)


def test_conv_large_enough_for_threads() -> None:
    check_conv(1, 24, 40, 41, 40, 1, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0), seed=1)
    check_conv(1, 48, 40, 41, 48, 48, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1), seed=2)
    check_conv(1, 16, 30, 33, 24, 1, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1), seed=3)


def im2col(x: np.ndarray, kh, kw, strides, dilations, pads) -> np.ndarray:
    """[C·kh·kw, OH·OW] columns of one image, rows in (c, ky, kx) order, padding as 0."""
    c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (h + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (w + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    rows = [
        xp[ci, ky * dilations[0] :: strides[0], kx * dilations[1] :: strides[1]][:oh, :ow].reshape(-1)
        for ci in range(c)
        for ky in range(kh)
        for kx in range(kw)
    ]
    return np.stack(rows)


@pytest.mark.parametrize(
    "c,h,w,m,kh,kw,strides,dilations,pads",
    [
        (3, 33, 35, 16, 3, 3, (2, 2), (1, 1), (1, 1, 1, 1)),  # the stem
        (7, 13, 11, 9, 3, 3, (1, 1), (2, 2), (1, 2, 0, 1)),  # dilated, uneven pads
        (17, 9, 40, 20, 5, 3, (3, 2), (1, 2), (2, 0, 1, 2)),  # strides 3 x 2: six phase planes
        (40, 6, 7, 20, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1)),  # K = 360: two K blocks
        (7, 6, 6, 5, 1, 1, (2, 2), (1, 1), (0, 0, 0, 0)),  # strided 1x1
    ],
)
def test_conv_implicit_gemm_is_the_im2col_gemm_bit_for_bit(
    c, h, w, m, kh, kw, strides, dilations, pads
) -> None:
    """The implicit GEMM (phase-split input, sgemm.cc conv_phased) computes each element
    as the GEMM of the weights with the im2col columns: the same chain over the same
    values in the same k order, so the bytes of matmul_f32(W, im2col(x)) on every ISA."""
    rng = np.random.default_rng(c * 100 + m)
    x, wt = normal(rng, 1, c, h, w), normal(rng, m, c, kh, kw)
    cols = im2col(x[0], kh, kw, strides, dilations, pads)
    geometry = (m, kh, kw, list(strides), list(dilations), list(pads), 1)
    packed = _native.conv_pack_f32(wt, 1)

    def run(isa: str) -> None:
        y = _native.conv_f32(x, packed, None, *geometry, num_threads=2)
        ref = _native.matmul_f32(np.ascontiguousarray(wt.reshape(m, -1)), np.ascontiguousarray(cols))
        assert y.reshape(m, -1).tobytes() == ref.tobytes(), isa

    every_isa(run)


@pytest.mark.parametrize(
    "n,c,h,w,m,kh,kw,pads",
    [
        (1, 96, 9, 56, 24, 3, 3, (1, 1, 1, 1)),  # ppocrv3_det's neck: K = 864, 2 tiles of 24 + 8
        (2, 17, 7, 25, 7, 3, 3, (1, 1, 1, 1)),  # two images, 7 channels: a group of 3 rows
        (1, 3, 5, 9, 3, 3, 3, (0, 1, 2, 0)),  # uneven pads, a 9-pixel row: one edge tile
        (1, 24, 11, 32, 24, 1, 3, (0, 1, 0, 1)),  # 1x3 (oww_embedding's first layers)
        (1, 24, 13, 30, 17, 3, 1, (1, 0, 1, 0)),  # 3x1, 17 channels
        (1, 31, 6, 47, 32, 5, 5, (2, 2, 2, 2)),  # 5x5, K = 775, 32 channels
        (1, 7, 4, 5, 1, 3, 3, (1, 1, 1, 1)),  # one channel, a row narrower than a vector
        (1, 5, 3, 1, 5, 3, 3, (2, 3, 2, 4)),  # one input column, pads wider than the window
        (1, 29, 6, 70, 12, 2, 2, (0, 0, 1, 1)),  # even kernel, a bottom / right pad only
        (1, 9, 5, 49, 4, 7, 7, (3, 3, 3, 3)),  # 7x7
        (1, 7, 6, 23, 17, 3, 3, (1, 1, 1, 1)),  # 3x3 on one 3-vector tile cut at 23: 5 groups, the last of 1
        (2, 33, 5, 22, 3, 3, 3, (1, 2, 1, 0)),  # K = 297 > 258, a 3-vector tile cut at 22, 3 channels
        (1, 7, 5, 41, 17, 3, 1, (1, 0, 1, 0)),  # 3x1 on 3-vector tiles, the second cut at 41
        (1, 17, 4, 47, 7, 1, 3, (0, 1, 0, 1)),  # 1x3 on 3-vector tiles, the second cut at 47
        (1, 100, 5, 24, 3, 3, 1, (1, 0, 1, 0)),  # 3x1, K = 300 > 258 on one whole 3-vector tile
    ],
)
def test_conv_direct_rows_are_the_im2col_gemm_bit_for_bit(n, c, h, w, m, kh, kw, pads) -> None:
    """Few output channels at stride 1 (sgemm.cc conv_direct, the ISA's direct_row where it
    has one) read the input rows in place, padding taps as fmas with 0: each element is the
    chain of matmul_f32(W, im2col(x)), then + bias and the clamp as float32 steps, the
    post-op after; the same bytes at 1 and 2 threads on every ISA."""
    rng = np.random.default_rng(c * 100 + m * 7 + w)
    x, wt, bias = normal(rng, n, c, h, w), normal(rng, m, c, kh, kw), normal(rng, m)
    geometry = (m, kh, kw, [1, 1], [1, 1], list(pads), 1)
    packed = _native.conv_pack_f32(wt, 1)
    assert _native.conv_path_f32(x, *geometry) == "im2col"
    lo, hi = F32(-0.75), F32(1.25)

    def run(isa: str) -> None:
        for img in range(n):
            cols = im2col(x[img], kh, kw, (1, 1), (1, 1), pads)
            ref = _native.matmul_f32(np.ascontiguousarray(wt.reshape(m, -1)), np.ascontiguousarray(cols))
            plain = _native.conv_f32(x, packed, None, *geometry, num_threads=2)[img]
            assert plain.reshape(m, -1).tobytes() == ref.tobytes(), isa
            want = np.minimum(np.maximum(ref + bias[:, None], lo), hi)
            for threads in (1, 2):
                y = _native.conv_f32(x, packed, bias, *geometry, lo, hi, threads)[img]
                assert y.reshape(m, -1).tobytes() == want.tobytes(), (isa, threads)
                # LeakyRelu (0.1) and Max(., -0.05) after the clamp, on the finished rows
                post = (5, [0.1, -0.05])
                y = _native.conv_f32(x, packed, bias, *geometry, lo, hi, threads, None, *post)[img]
                gate = np.maximum(np.where(want < 0, want * F32(0.1), want), F32(-0.05))
                assert y.reshape(m, -1).tobytes() == gate.tobytes(), (isa, threads, "post")

    every_isa(run)


@pytest.mark.parametrize(
    "n,c,h,w,m,group",
    [
        (1, 16, 16, 16, 24, 1),  # 256 pixels: the row-major copy, 4 tiles of 6 rows
        (1, 16, 15, 17, 24, 1),  # 255 pixels: the packed panels
        (2, 7, 20, 23, 17, 1),  # two images, 6 + 6 + 5 rows
        (1, 300, 16, 17, 7, 1),  # K > 258: two K blocks, 6 + 1 rows
        (1, 3, 24, 11, 40, 1),  # K = 3, 6 × 6 + 4 rows
        (1, 34, 16, 20, 34, 2),  # grouped: 17 -> 17 per group
    ],
)
def test_conv_pointwise_row_major_weights_are_the_packed_bytes(n, c, h, w, m, group) -> None:
    """A 1x1 convolution on a plane of at least 256 pixels reads its weights as a
    row-major copy where the ISA's row-major tile has more rows (sgemm.cc conv,
    kPointwiseRowMajorPixels): each element is still matmul_f32's chain of W · x, then
    + bias and the clamp as float32 steps; on every ISA, 1 and 2 threads."""
    rng = np.random.default_rng(c * 31 + m * 7 + h * w)
    x, wt, bias = normal(rng, n, c, h, w), normal(rng, m, c // group, 1, 1), normal(rng, m)
    geometry = (m, 1, 1, [1, 1], [1, 1], [0, 0, 0, 0], group)
    assert _native.conv_path_f32(x, *geometry) == "pointwise"
    packed = _native.conv_pack_f32(wt, group)
    lo, hi = F32(-0.75), F32(1.25)
    mg, cg = m // group, c // group
    want = np.empty((n, m, h * w), F32)
    for img in range(n):
        for grp in range(group):
            a = np.ascontiguousarray(wt[grp * mg : (grp + 1) * mg].reshape(mg, cg))
            b = np.ascontiguousarray(x[img, grp * cg : (grp + 1) * cg].reshape(cg, h * w))
            ref = _native.matmul_f32(a, b)
            rows = slice(grp * mg, (grp + 1) * mg)
            want[img, rows] = np.minimum(np.maximum(ref + bias[rows, None], lo), hi)

    def run(isa: str) -> None:
        for threads in (1, 2):
            y = _native.conv_f32(x, packed, bias, *geometry, lo, hi, threads)
            assert y.reshape(n, m, -1).tobytes() == want.tobytes(), (isa, threads)

    every_isa(run)


@pytest.mark.parametrize(
    "n,c,h,w,m,strides,post",
    [
        (1, 300, 7, 7, 48, (1, 1), (0, [])),  # K > 258: two K blocks, 49 pixels: 6 panels + 1 row
        (2, 7, 3, 11, 64, (1, 1), (2, [])),  # two images, K = 7, HardSwish
        (1, 17, 13, 13, 80, (2, 2), (1, [])),  # stride 2 sampled while packing, SiLU
        (1, 3, 5, 13, 112, (1, 2), (3, [0.2, 0.5])),  # unequal strides, HardSigmoid
        (1, 33, 6, 6, 48, (1, 1), (4, [3.0, 0.0, 6.0, 6.0])),  # Paddle's hardswish
    ],
)
def test_conv_pixel_rows_give_the_nchw_bytes(n, c, h, w, m, strides, post) -> None:
    """The pixels-as-rows 1x1 path (sgemm.h kPointwiseRows: Cᵀ = Xᵀ · Wᵀ, transposed) is
    the NCHW path's bytes: the same products in the same k order, the bias as a column
    bias, the same clamp and fused activation; on every ISA, 1 and 2 threads."""
    rng = np.random.default_rng(c * m + h)
    x, wt, bias = normal(rng, n, c, h, w), normal(rng, m, c, 1, 1), normal(rng, m)
    check_rows_path(x, wt, bias, strides, [1, 1], [0, 0, 0, 0], post, "pointwise_rows")


def check_rows_path(x, wt, bias, strides, dilations, pads, post, rows_path: str) -> None:
    """The rows path (``rows_path``) this geometry takes gives the bytes of the NCHW path
    it takes without the rows packing, with a clamp and the fused activation ``post``, on
    every ISA, 1 and 2 threads."""
    m, kh, kw = wt.shape[0], wt.shape[2], wt.shape[3]
    geometry = (m, kh, kw, list(strides), list(dilations), list(pads), 1)
    assert _native.conv_path_f32(x, *geometry, rows=True) == rows_path
    assert _native.conv_path_f32(x, *geometry) in ("pointwise", "im2col")
    packed = _native.conv_pack_f32(wt, 1)
    rows = _native.conv_pack_f32(wt, 1, rows=True)
    extra = dict(lo=-2.5, hi=3.0, post=post[0], post_params=post[1])

    def run(isa: str) -> None:
        ref = _native.conv_f32(x, packed, bias, *geometry, num_threads=1, **extra)
        for threads in (1, 2):
            y = _native.conv_f32(x, rows, bias, *geometry, num_threads=threads, rows=True, **extra)
            label = f"{isa} {threads}t x{x.shape} w{wt.shape} s{strides} d{dilations} p{pads} post{post}"
            assert y.tobytes() == ref.tobytes(), label

    every_isa(run)


def test_conv_pixel_rows_only_where_it_pays_and_refused_elsewhere() -> None:
    """Wide planes keep the NCHW GEMM (their pixels fill the columns); rows-packed weights
    on a geometry that does not take the rows path, or a grouped / non-1x1 rows pack, are
    errors naming the argument."""
    wt = np.ones((48, 16, 1, 1), F32)
    geometry = (48, 1, 1, [1, 1], [1, 1], [0, 0, 0, 0], 1)
    wide = np.ones((1, 16, 28, 28), F32)
    assert _native.conv_path_f32(wide, *geometry, rows=True) == "pointwise"
    assert _native.conv_path_f32(np.ones((1, 16, 7, 7), F32), *geometry) == "pointwise"
    with pytest.raises(ValueError, match="rows: weights packed for the pixels-as-rows path"):
        _native.conv_f32(wide, _native.conv_pack_f32(wt, 1, rows=True), None, *geometry, rows=True)
    with pytest.raises(ValueError, match="rows: expected weights of group 1"):
        _native.conv_pack_f32(np.ones((48, 8, 1, 1), F32), 2, rows=True)
    # a 3x3 on a wide plane: the implicit GEMM's columns are full, no rows path; on a
    # small one with few output channels the gather costs more than the lanes it fills
    g3 = (48, 3, 3, [1, 1], [1, 1], [1, 1, 1, 1], 1)
    assert _native.conv_path_f32(np.ones((1, 16, 40, 40), F32), *g3, rows=True) == "im2col"
    assert _native.conv_path_f32(np.ones((1, 16, 7, 7), F32), *g3, rows=True) == "im2col"
    with pytest.raises(ValueError, match="rows: weights packed for the pixels-as-rows path"):
        _native.conv_f32(
            np.ones((1, 16, 40, 40), F32),
            _native.conv_pack_f32(np.ones((48, 16, 3, 3), F32), 1, rows=True),
            None,
            *g3,
            rows=True,
        )


# 49 pixels (6 panels + 1 element by element); stride 2 with two images; K = 425 > 258;
# dilated with uneven pads; 1x3 (ppocr_rec); a bottom / right pad no window reads
IM2COL_ROWS_CASES = [
    (1, 17, 7, 7, 256, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1), (0, [])),
    (2, 7, 13, 13, 256, 3, 3, (2, 2), (1, 1), (1, 1, 1, 1), (1, [])),
    (1, 17, 9, 11, 160, 5, 5, (1, 1), (1, 1), (2, 2, 2, 2), (2, [])),
    (1, 3, 10, 12, 160, 3, 3, (1, 1), (2, 2), (1, 2, 0, 1), (0, [])),
    (1, 8, 5, 21, 160, 1, 3, (1, 1), (1, 1), (0, 1, 0, 1), (3, [0.2, 0.5])),
    (1, 5, 14, 14, 256, 2, 2, (2, 2), (1, 1), (0, 0, 1, 1), (0, [])),
    # one output pixel, one row: Silero VAD's last k3 layers on one frame (stride 1 and 2),
    # a padded 3x3 on 1x1 planes of two images, a valid 3x3 with K = 2700 past its K blocks
    (1, 64, 1, 1, 128, 1, 3, (1, 1), (1, 1), (0, 1, 0, 1), (0, [])),
    (1, 64, 1, 2, 64, 1, 3, (1, 2), (1, 1), (0, 1, 0, 1), (0, [])),
    (2, 9, 1, 1, 40, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1), (1, [])),
    (1, 300, 3, 3, 33, 3, 3, (1, 1), (1, 1), (0, 0, 0, 0), (2, [])),
]


@pytest.mark.parametrize("n,c,h,w,m,kh,kw,strides,dilations,pads,post", IM2COL_ROWS_CASES)
def test_conv_im2col_pixel_rows_give_the_implicit_gemm_bytes(
    n, c, h, w, m, kh, kw, strides, dilations, pads, post
):
    """The pixels-as-rows im2col path (sgemm.h kIm2colRows: the im2col rows gathered from
    a zero-padded copy into A panels, Cᵀ = im2col(x)ᵀ · Wᵀ, transposed) gives the implicit
    GEMM's bytes (the same values in the same k order)."""
    rng = np.random.default_rng(c * m + h * w)
    x, wt, bias = normal(rng, n, c, h, w), normal(rng, m, c, kh, kw), normal(rng, m)
    check_rows_path(x, wt, bias, strides, dilations, pads, post, "im2col_rows")


# (x shape as given, x4 shape, M, group, kh, kw, strides, pads, rows, post): a 1-D layer on
# 4 frames and on 1 frame (Silero VAD), a strided 1-D STFT, pointwise, pointwise as pixel
# rows, a depthwise 3x3, a grouped 3x3 with SiLU, im2col as pixel rows with HardSigmoid
CONV_CALL_CASES = [
    ((1, 129, 4), (1, 129, 1, 4), 128, 1, 1, 3, (1, 1), (0, 1, 0, 1), True, (0, [])),
    ((1, 64, 1), (1, 64, 1, 1), 128, 1, 1, 3, (1, 1), (0, 1, 0, 1), True, (0, [])),
    ((1, 1, 640), (1, 1, 1, 640), 34, 1, 1, 256, (1, 128), (0, 0, 0, 0), False, (0, [])),
    ((2, 7, 5, 9), (2, 7, 5, 9), 24, 1, 1, 1, (1, 1), (0, 0, 0, 0), False, (0, [])),
    ((1, 17, 7, 7), (1, 17, 7, 7), 48, 1, 1, 1, (1, 1), (0, 0, 0, 0), True, (2, [])),
    ((1, 16, 9, 11), (1, 16, 9, 11), 16, 16, 3, 3, (2, 2), (1, 1, 1, 1), False, (0, [])),
    ((1, 12, 6, 13), (1, 12, 6, 13), 20, 4, 3, 3, (1, 1), (1, 0, 2, 1), False, (1, [])),
    ((1, 9, 5, 5), (1, 9, 5, 5), 64, 1, 3, 3, (1, 1), (1, 1, 1, 1), True, (3, [0.2, 0.5])),
]


@pytest.mark.parametrize("x_shape,x4_shape,m,group,kh,kw,strides,pads,rows,post", CONV_CALL_CASES)
def test_conv_call_is_conv_f32(x_shape, x4_shape, m, group, kh, kw, strides, pads, rows, post) -> None:
    """ConvF32Call (conv_f32 with every argument but x bound once, the executor's
    specialized Conv step) gives conv_f32's bytes on every path, ISA and thread count: into
    a new array of y_shape each call, or into the bound out, which it returns."""
    rng = np.random.default_rng(m * kw + group)
    x = normal(rng, *x_shape)
    w = normal(rng, m, x4_shape[1] // group, kh, kw)
    bias = normal(rng, m)
    wp = _native.conv_pack_f32(w, group, rows=rows)
    geometry = (m, kh, kw, list(strides), [1, 1], list(pads), group)
    assert _native.conv_path_f32(x.reshape(x4_shape), *geometry, rows=rows).endswith("rows") == rows

    def run(isa: str) -> None:
        for threads in (1, 2):
            extra = (-1.5, 2.75, threads)
            want = _native.conv_f32(x.reshape(x4_shape), wp, bias, *geometry, *extra, None, *post, rows)
            y_shape = (*x_shape[:1], m, *want.shape[2:]) if len(x_shape) == 4 else (1, m, want.shape[-1])
            fresh = _native.ConvF32Call(
                x_shape, x4_shape, y_shape, wp, bias, *geometry, *extra, None, *post, rows
            )
            y1, y2 = fresh(x), fresh(x)
            assert y1.shape == y_shape and y1 is not y2
            assert y1.tobytes() == want.tobytes() and y2.tobytes() == want.tobytes(), (isa, threads)
            out = np.full(y_shape, np.nan, F32)
            into = _native.ConvF32Call(
                x_shape, x4_shape, y_shape, wp, bias, *geometry, *extra, out, *post, rows
            )
            assert into(x) is out and out.tobytes() == want.tobytes(), (isa, threads)

    every_isa(run)


def test_conv_call_refuses_what_conv_f32_refuses() -> None:
    """Bound arguments are checked once, as conv_f32 checks them; a call checks x (the
    executor hands a ValueError to the generic kernel)."""
    w = _native.conv_pack_f32(np.ones((6, 4, 1, 3), F32), 1)
    args = (w, None, 6, 1, 3, [1, 1], [1, 1], [0, 1, 0, 1], 1)
    call = _native.ConvF32Call((1, 4, 5), (1, 4, 1, 5), (1, 6, 5), *args)
    want = _native.conv_f32(np.ones((1, 4, 1, 5), F32), *args)
    assert call(np.ones((1, 4, 5), F32)).tobytes() == want.tobytes()
    with pytest.raises(ValueError, match=r"x: expected shape \(1, 4, 5\)"):
        call(np.ones((1, 4, 1, 5), F32))
    with pytest.raises(ValueError, match="x: expected dtype float32"):
        call(np.ones((1, 4, 5), np.float64))
    with pytest.raises(ValueError, match="x: expected a C-contiguous array"):
        call(np.ones((1, 5, 4), F32).transpose(0, 2, 1))
    with pytest.raises(ValueError, match="w_packed: expected"):
        _native.ConvF32Call(
            (1, 4, 5), (1, 4, 1, 5), (1, 12, 5), w, None, 12, 1, 3, [1, 1], [1, 1], [0, 1, 0, 1], 1
        )
    with pytest.raises(ValueError, match="y_shape: expected 30 elements"):
        _native.ConvF32Call((1, 4, 5), (1, 4, 1, 5), (1, 6, 4), *args)
    with pytest.raises(ValueError, match="differ in size"):
        _native.ConvF32Call((1, 4, 6), (1, 4, 1, 5), (1, 6, 5), *args)
    with pytest.raises(ValueError, match="out: expected shape"):
        _native.ConvF32Call((1, 4, 5), (1, 4, 1, 5), (1, 6, 5), *args, out=np.empty((1, 6, 1, 5), F32))


def test_conv_refuses_bad_arguments() -> None:
    x = np.ones((1, 4, 5, 5), F32)
    w = _native.conv_pack_f32(np.ones((6, 4, 3, 3), F32), 1)
    geometry = ([1, 1], [1, 1], [0, 0, 0, 0])
    with pytest.raises(ValueError, match="w_packed: expected"):
        _native.conv_f32(x, w, None, 12, 3, 3, *geometry, 1)
    with pytest.raises(ValueError, match="larger than the padded input"):
        _native.conv_f32(x, w, None, 6, 3, 3, [1, 1], [3, 3], [0, 0, 0, 0], 1)
    with pytest.raises(ValueError, match="must divide"):
        _native.conv_f32(x, w, None, 6, 3, 3, *geometry, 3)
    with pytest.raises(ValueError, match="bias: expected 6"):
        _native.conv_f32(x, w, np.ones(5, F32), 6, 3, 3, *geometry, 1)


# --------------------------------------------------------------------------------------
# col2im (ConvTranspose): the twin's scatter order, bit for bit
# --------------------------------------------------------------------------------------


@given(
    st.integers(1, 2),
    st.sampled_from([1, 3, 7]),
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(1, 6),
    st.integers(1, 7),
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(1, 2),
    st.integers(1, 2),
    st.integers(-2, 3),
    st.integers(-2, 3),
    st.integers(-1, 3),
    st.integers(-1, 3),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_col2im_is_the_twin_scatter_bit_for_bit(
    n, m, kh, kw, h, w, sh, sw, dh, dw, bt, bl, eh, ew, with_bias, seed
) -> None:
    """Same columns in, same bytes out as nn_conv's scatter + crop + bias: a crop that
    starts before the canvas (negative begin) or runs past it (output_padding), strides
    below, at and above the kernel extent (overlapping and gapped windows)."""
    from quanta.kernels.reference.nn_conv import _crop_spatial, _scatter_windows

    rng = np.random.default_rng(seed)
    cols = normal(rng, n, m * kh * kw, h, w)
    bias = normal(rng, m) if with_bias else None
    full = ((h - 1) * sh + (kh - 1) * dh + 1, (w - 1) * sw + (kw - 1) * dw + 1)
    out_hw = (max(0, full[0] - bt + eh), max(0, full[1] - bl + ew))
    want = _crop_spatial(
        _scatter_windows(cols.reshape(n, m, kh, kw, h, w), full, (sh, sw), (dh, dw)), (bt, bl), out_hw
    )
    if bias is not None:
        want = want + bias.reshape(m, 1, 1)
    for threads in (1, 2):
        got = _native.col2im_f32(
            cols, m, kh, kw, [sh, sw], [dh, dw], [bt, bl], list(out_hw), bias, num_threads=threads
        )
        assert got.shape == want.shape and got.tobytes() == np.ascontiguousarray(want, F32).tobytes()


def test_col2im_large_enough_for_threads_and_clamps() -> None:
    rng = np.random.default_rng(3)
    cols = normal(rng, 1, 17 * 4, 40, 52)
    bias = normal(rng, 17)
    y1 = _native.col2im_f32(cols, 17, 2, 2, [2, 2], [1, 1], [0, 0], [80, 104], bias, lo=-0.5, hi=1.0)
    y2 = _native.col2im_f32(
        cols, 17, 2, 2, [2, 2], [1, 1], [0, 0], [80, 104], bias, lo=-0.5, hi=1.0, num_threads=2
    )
    assert y1.tobytes() == y2.tobytes()
    want = cols.reshape(17, 2, 2, 40, 52).transpose(0, 3, 1, 4, 2).reshape(17, 80, 104) + bias.reshape(
        17, 1, 1
    )
    np.testing.assert_array_equal(y1[0], np.minimum(np.maximum(want, F32(-0.5)), F32(1.0)))


@pytest.mark.parametrize(
    "m,k,h,w,bt,bl,eh,ew",
    [
        (3, 2, 5, 9, 0, 0, 0, 0),  # 2x2 stride 2: one vector pair and a tail of 1
        (7, 2, 4, 17, 0, 0, 1, 1),  # output_padding: a last row and column of bias only
        (17, 2, 3, 16, 1, 1, 0, 0),  # crop begins odd: the first column is a kx = 1 value
        (24, 2, 6, 8, -1, -3, 2, 3),  # crop begins before the canvas (output_shape)
        (5, 3, 4, 7, 1, 2, 0, 0),  # 3x3 stride 3: the scalar rows
        (3, 4, 2, 5, 0, 0, 0, 0),  # 4x4 stride 4
        (2, 1, 3, 11, 0, 0, 0, 0),  # 1x1 stride 1
    ],
)
def test_col2im_tiles_are_the_twin_scatter_bit_for_bit_every_isa(m, k, h, w, bt, bl, eh, ew) -> None:
    """Non-overlapping windows (kernel = stride, dilation 1) take col2im_tiles.h's
    interleave: the twin's bytes (scatter into +0, crop, + bias) on every ISA, 1 and 2
    threads, with −0, NaN and ±inf columns, and a clamp's max / min on the scalar lanes'
    terms (NaN kept)."""
    from quanta.kernels.reference.nn_conv import _crop_spatial, _scatter_windows

    rng = np.random.default_rng(m * 1000 + k * 100 + w)
    n = 2
    cols = normal(rng, n, m * k * k, h, w)
    flat = cols.reshape(-1)
    flat[rng.integers(0, flat.size, 40)] = rng.choice(np.array([-0.0, np.nan, np.inf, -np.inf, 0.0], F32), 40)
    bias = normal(rng, m)
    full = (h * k, w * k)
    out_hw = (full[0] - bt + eh, full[1] - bl + ew)
    canvas = _scatter_windows(cols.reshape(n, m, k, k, h, w), full, (k, k), (1, 1))
    want = _crop_spatial(canvas, (bt, bl), out_hw) + bias.reshape(m, 1, 1)
    lo, hi = F32(-0.75), F32(1.5)
    clamped = np.where(want < lo, lo, want)
    clamped = np.where(clamped > hi, hi, clamped)

    def check(isa: str) -> None:
        for threads in (1, 2):
            got = _native.col2im_f32(
                cols, m, k, k, [k, k], [1, 1], [bt, bl], list(out_hw), bias, num_threads=threads
            )
            assert got.tobytes() == np.ascontiguousarray(want, F32).tobytes(), (isa, threads)
            got = _native.col2im_f32(
                cols, m, k, k, [k, k], [1, 1], [bt, bl], list(out_hw), bias, lo=lo, hi=hi, num_threads=threads
            )
            assert got.tobytes() == np.ascontiguousarray(clamped, F32).tobytes(), (isa, threads, "clamp")

    every_isa(check)


@pytest.mark.parametrize(
    "m,kh,kw,h,w,sh,sw,dw,bt,bl,eh,ew",
    [
        (64, 1, 3, 7, 8, 1, 2, 1, 0, 1, 0, 1),  # dfn3_erb_dec's depthwise 1x3 stride-2 upsampling
        (3, 1, 3, 2, 259, 1, 2, 1, 0, 1, 0, 1),  # rows of 259 columns: vector bodies and tails
        (7, 2, 3, 5, 17, 2, 3, 2, 1, 2, 1, 2),  # gapped phases: stride 3, dilation 2
        (17, 3, 5, 4, 11, 2, 2, 1, -1, -2, 1, 0),  # 3 contributions a column; crop before the canvas
    ],
)
def test_col2im_strided_columns_are_the_twin_scatter_bit_for_bit_every_isa(
    m, kh, kw, h, w, sh, sw, dw, bt, bl, eh, ew
) -> None:
    """Overlapping windows with column strides above 1 (sgemm::col2im's strided adds,
    not col2im_tiles): the twin's bytes (scatter into +0 in (ky, kx) order, crop, + bias,
    clamp) on every ISA, 1 and 2 threads, with −0, NaN and ±inf columns; the geometries
    of a depthwise 1x3 stride-2 upsampling (dfn3_erb_dec) pinned for a faster kernel."""
    from quanta.kernels.reference.nn_conv import _crop_spatial, _scatter_windows

    rng = np.random.default_rng(m * 1000 + kw * 100 + w)
    n = 2
    cols = normal(rng, n, m * kh * kw, h, w)
    flat = cols.reshape(-1)
    flat[rng.integers(0, flat.size, 60)] = rng.choice(np.array([-0.0, np.nan, np.inf, -np.inf, 0.0], F32), 60)
    bias = normal(rng, m)
    full = ((h - 1) * sh + kh, (w - 1) * sw + (kw - 1) * dw + 1)
    out_hw = (full[0] - bt + eh, full[1] - bl + ew)
    canvas = _scatter_windows(cols.reshape(n, m, kh, kw, h, w), full, (sh, sw), (1, dw))
    want = _crop_spatial(canvas, (bt, bl), out_hw) + bias.reshape(m, 1, 1)
    lo, hi = F32(-0.75), F32(1.5)
    clamped = np.where(want < lo, lo, want)
    clamped = np.where(clamped > hi, hi, clamped)

    def check(isa: str) -> None:
        for threads in (1, 2):
            args = (cols, m, kh, kw, [sh, sw], [1, dw], [bt, bl], list(out_hw), bias)
            got = _native.col2im_f32(*args, num_threads=threads)
            assert got.tobytes() == np.ascontiguousarray(want, F32).tobytes(), (isa, threads)
            got = _native.col2im_f32(*args, lo=lo, hi=hi, num_threads=threads)
            assert got.tobytes() == np.ascontiguousarray(clamped, F32).tobytes(), (isa, threads, "clamp")

    every_isa(check)


def test_col2im_refuses_bad_arguments() -> None:
    cols = np.zeros((1, 12, 3, 3), F32)
    with pytest.raises(ValueError, match="M\\*kh\\*kw"):
        _native.col2im_f32(cols, 5, 2, 2, [2, 2], [1, 1], [0, 0], [6, 6])
    with pytest.raises(ValueError, match="bias"):
        _native.col2im_f32(cols, 3, 2, 2, [2, 2], [1, 1], [0, 0], [6, 6], np.zeros(4, F32))
    with pytest.raises(ValueError, match="strides"):
        _native.col2im_f32(cols, 3, 2, 2, [0, 2], [1, 1], [0, 0], [6, 6])


@pytest.mark.parametrize(
    "c,h,w,k,stride,dil,pads",
    [
        (17, 7, 7, 5, 1, 1, [2, 2, 2, 2]),  # a MobileNet tail: 16 lanes + a 1-channel block
        (40, 2, 16, 5, 1, 1, [2, 2, 2, 2]),  # 2-row planes, 16 columns: the widest blocked row
        (16, 14, 14, 3, 2, 1, [1, 0, 2, 1]),
        (7, 9, 11, 3, 1, 2, [2, 2, 2, 2]),
        (33, 5, 3, 3, 3, 1, [0, 0, 0, 0]),
        (23, 6, 31, 3, 2, 1, [1, 1, 1, 1]),  # rows of 31 inputs: two 16 x 16 transposes per row
        (19, 4, 50, 3, 3, 1, [0, 0, 0, 0]),  # the last 2 input columns are never read: not copied
        (9, 6, 30, 5, 1, 1, [2, 2, 2, 2]),  # 5x5 on rows of 30: blocked too
        (18, 5, 99, 5, 2, 1, [2, 1, 2, 2]),  # 5x5 at stride 2 on rows of 50: split rows
        (17, 6, 60, 5, 2, 1, [2, 2, 2, 2]),  # 5x5 at stride 2 on rows of 30: blocked
    ],
)
def test_depthwise_small_planes_give_the_row_kernels_bytes(c, h, w, k, stride, dil, pads) -> None:
    """Output rows of at most 16 pixels take the 16-channels-per-vector kernel where the ISA
    has one (AVX-512): each channel's chain is the row kernel's, so every ISA gives the
    same bytes, for 1 and 2 threads, with a clamp, and within (FG1)."""
    check_depthwise_same_bytes_every_isa(c, h, w, k, stride, dil, pads)


@pytest.mark.parametrize(
    "c,h,w,k,stride,dil,pads",
    [
        (3, 9, 57, 3, 1, 1, [1, 1, 1, 1]),  # odd row count: a pair of rows, then one
        (7, 12, 40, 3, 2, 1, [1, 1, 0, 0]),  # stride 2: split rows (odd left pad)
        (5, 15, 64, 3, 2, 1, [0, 0, 1, 1]),  # split rows, even left pad, odd row count
        (5, 11, 35, 5, 1, 1, [2, 2, 2, 2]),  # 5x5: 25 weight vectors held in registers
        (3, 14, 70, 5, 2, 1, [2, 1, 2, 1]),  # 5x5 stride 2 (split), asymmetric pads
        (4, 8, 33, 3, 1, 2, [2, 2, 2, 2]),  # dilated taps through the paired-row kernel
        (3, 10, 26, 7, 1, 1, [3, 3, 3, 3]),  # 7x7: no paired-row kernel, the row kernel
        (2, 6, 18, 3, 3, 1, [1, 1, 1, 1]),  # stride 3: the gathered row kernel
    ],
)
def test_depthwise_paired_rows_give_the_row_kernels_bytes(c, h, w, k, stride, dil, pads) -> None:
    """Rows wider than 16 pixels go two output rows at a time through the paired-row kernel
    for 3x3 and 5x5 taps at strides 1 and 2 (AVX-512, AVX2): each output keeps the row
    kernel's chain, so every ISA (the portable one has no paired kernel) gives the same
    bytes, for 1 and 2 threads, with a clamp, and within (FG1)."""
    check_depthwise_same_bytes_every_isa(c, h, w, k, stride, dil, pads)


def check_depthwise_same_bytes_every_isa(c, h, w, k, stride, dil, pads) -> None:
    rng = np.random.default_rng(c * h + w)
    x, wt, b = normal(rng, 2, c, h, w), normal(rng, c, 1, k, k), normal(rng, c)
    packed = _native.conv_pack_f32(wt, c)
    outs = {}

    def run(isa: str) -> None:
        for threads in (1, 2):
            y = _native.conv_f32(
                x,
                packed,
                b,
                c,
                k,
                k,
                [stride, stride],
                [dil, dil],
                pads,
                c,
                lo=-0.5,
                hi=1.5,
                num_threads=threads,
            )
            outs.setdefault(isa, y)
            assert y.tobytes() == outs[isa].tobytes(), (isa, "1 vs 2 threads")

    every_isa(run)
    first = next(iter(outs.values()))
    for isa, y in outs.items():
        assert y.tobytes() == first.tobytes(), isa
    attrs = {"group": c, "pads": pads, "strides": [stride, stride], "dilations": [dil, dil]}
    y64 = np.clip(
        conv_twin(None, x.astype(np.float64), wt.astype(np.float64), b.astype(np.float64), **attrs), -0.5, 1.5
    )
    mag = conv_twin(
        None,
        np.abs(x).astype(np.float64),
        np.abs(wt).astype(np.float64),
        np.abs(b).astype(np.float64),
        **attrs,
    )
    assert_within_bound(first, y64, mag, k * k, "depthwise small planes")
