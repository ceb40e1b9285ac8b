"""The shared hypothesis kit: the spaces that deny a test the shelter of coincidence.

- quantization parameters: non-zero zero points anywhere in the storage range, scales
  that differ from each other (per tensor and per channel);
- dimensions at the kernels' tile edges (one below, at and one above 4, 8, 16, 32, 64)
  and reductions longer than 258 (where float32 stops accumulating int8 products
  exactly);
- channel counts like 3, 7, 17 (no power of two to hide behind);
- convolution geometry (kernel, strides, dilations, asymmetric pads, groups) that is
  valid by construction;
- arrays over the whole value space of a dtype, its extremes included.

Every property test draws from here; a file keeps its own composite only for what is
specific to its operator, built from these.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

F32 = np.float32
EIGHT_BIT = (np.uint8, np.int8)

#: GEMM rows (M) at the edges of the micro-kernel's row blocks (1-4, 8, 12, 16, 24, 64)
M_EDGES = (1, 2, 3, 4, 5, 7, 8, 9, 11, 12, 13, 15, 16, 17, 20, 23, 24, 25, 63, 64, 65)
#: GEMM columns (N) at the edges of the 16- and 64-wide column panels
N_EDGES = (1, 3, 7, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65)
#: reductions (K) at the KR 2 / 4 edges, K = 1, and past 258 (float32-exact limit)
K_EDGES = (1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 63, 64, 65, 259, 1000)
#: channel counts that are not powers of two
CHANNELS = (1, 3, 7, 17, 33)


def dtype_range(dtype: type) -> tuple[int, int]:
    """The storage range of an integer dtype."""
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


@st.composite
def zero_points(draw, dtype: type, *, nonzero: bool = True) -> int:
    """A zero point anywhere in ``dtype``'s range; non-zero unless asked for."""
    lo, hi = dtype_range(dtype)
    z = draw(st.integers(lo, hi))
    return (z if z != 0 else 1) if nonzero else z


def scales(lo: float = 0.005, hi: float = 0.2) -> st.SearchStrategy[np.float32]:
    """A float32 scale in [lo, hi] (rounded to float32)."""
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False).map(F32)


@st.composite
def qparams(draw, dtype: type, lo: float = 0.005, hi: float = 0.2) -> tuple[np.float32, np.ndarray]:
    """(scale, zero_point) of one tensor: scale in [lo, hi], a non-zero zero point as a
    0-d array of ``dtype`` (what a QuantizeLinear input holds)."""
    return draw(scales(lo, hi)), np.asarray(draw(zero_points(dtype)), dtype)


@st.composite
def per_axis_qparams(
    draw, dtype: type, channels: int, *, symmetric: bool = False, lo: float = 0.005, hi: float = 0.2
) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (scales, zero_points) of ``channels`` entries whose scales all differ
    (a test that passes with one scale broadcast by mistake fails here)."""
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    s = np.sort(rng.uniform(lo, hi, channels)).astype(F32)
    s = s * (1 + np.arange(channels, dtype=F32) * F32(1e-3))  # strictly increasing: distinct
    rng.shuffle(s)
    if symmetric:
        z = np.zeros(channels, dtype)
    else:
        lo_z, hi_z = dtype_range(dtype)
        z = rng.integers(lo_z, hi_z + 1, channels).astype(dtype)
        z[z == 0] = 1
    return s.astype(F32), z


def int_array(rng: np.random.Generator, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    """Values over the whole range of ``dtype`` with both extremes present (when the
    array has room for them)."""
    lo, hi = dtype_range(dtype)
    a = rng.integers(lo, hi + 1, size=shape, dtype=np.int64)
    flat = a.reshape(-1)
    if flat.size >= 2:
        flat[0], flat[-1] = lo, hi
    return a.astype(dtype)


@st.composite
def int_arrays(draw, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    return int_array(np.random.default_rng(draw(st.integers(0, 2**31 - 1))), dtype, shape)


@st.composite
def gemm_shapes(draw, m=M_EDGES, n=N_EDGES, k=K_EDGES) -> tuple[int, int, int]:
    """(M, N, K) at tile edges."""
    return draw(st.sampled_from(m)), draw(st.sampled_from(n)), draw(st.sampled_from(k))


@dataclass(frozen=True)
class ConvGeometry:
    """A valid 2-D convolution: input (N, C, H, W), weight (M, C/group, kH, kW)."""

    batch: int
    channels: int
    height: int
    width: int
    out_channels: int
    group: int
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads: tuple[int, int, int, int]  # top, left, bottom, right (ONNX order)

    @property
    def x_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.channels, self.height, self.width)

    @property
    def w_shape(self) -> tuple[int, int, int, int]:
        return (self.out_channels, self.channels // self.group, *self.kernel)


@st.composite
def conv_geometry(draw, *, max_hw: int = 7, groups=(1, 1, 2, 3), max_per_group: int = 3) -> ConvGeometry:
    """Kernel, strides, dilations, asymmetric pads and groups, valid by construction
    (the dilated kernel fits the padded input)."""
    group = draw(st.sampled_from(groups))
    cg, mg = draw(st.integers(1, max_per_group)), draw(st.integers(1, max_per_group))
    kernel = draw(st.tuples(st.integers(1, 3), st.integers(1, 3)))
    strides = draw(st.tuples(st.integers(1, 3), st.integers(1, 2)))
    dilations = draw(st.tuples(st.integers(1, 2), st.integers(1, 3)))
    pads = draw(st.tuples(*[st.integers(0, 2)] * 4))
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    h = draw(st.integers(max(1, extent[0] - pads[0] - pads[2]), max_hw))
    w = draw(st.integers(max(1, extent[1] - pads[1] - pads[3]), max_hw))
    return ConvGeometry(
        batch=draw(st.integers(1, 2)),
        channels=cg * group,
        height=h,
        width=w,
        out_channels=mg * group,
        group=group,
        kernel=kernel,
        strides=strides,
        dilations=dilations,
        pads=pads,
    )
