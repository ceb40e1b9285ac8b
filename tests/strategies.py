"""The shared hypothesis kit: the spaces that deny a test the shelter of coincidence.

- quantization parameters: non-zero zero points anywhere in the storage range, scales
  drawn per tensor (so two tensors' scales differ);
- dimensions at the kernels' tile edges (one below, at and one above 4, 8, 16, 32, 64)
  and reductions longer than 258 (where float32 stops accumulating int8 products
  exactly);
- convolution geometry (kernel, strides, dilations, asymmetric pads, groups) that is
  valid by construction.

Property tests take these primitives from here (the qgemm, conv-reference and
ms_qlinear tests do; the other hypothesis files still define their own and move here as
they are touched); a file keeps its own composite only for what is specific to its
operator, built from these.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

F32 = np.float32

#: GEMM rows (M) at the edges of the micro-kernel's row blocks (1-4, 8, 12, 16, 24, 64)
M_EDGES = (1, 2, 3, 4, 5, 7, 8, 9, 11, 12, 13, 15, 16, 17, 20, 23, 24, 25, 63, 64, 65)
#: GEMM columns (N) at the edges of the 16- and 64-wide column panels
N_EDGES = (1, 3, 7, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65)
#: reductions (K) at the KR 2 / 4 edges, K = 1, and past 258 (float32-exact limit)
K_EDGES = (1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 63, 64, 65, 259, 1000)


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
