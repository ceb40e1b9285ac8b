"""3-D convolutions on the native 2-D kernels: the depth taps folded into the channels.

A 3-D Conv (weights ``w[M, Cg, KD, KH, KW]``, ``group`` G, ``Cg = C / G``) computes

    y[n, m, o_d, o_h, o_w] = Σ_{c, k_d, k_h, k_w} x_pad[n, g(m)·Cg + c, o_d·s_d + k_d·d_d,
                                   o_h·s_h + k_h·d_h, o_w·s_w + k_w·d_w] · w[m, c, k_d, k_h, k_w]   (C3)

For one output depth ``o_d`` the KD planes it reads, stacked as channels in (group, k_d, c)
order, are a 2-D input of ``G·KD·Cg`` channels, and the weights reordered to
``w'[m, k_d·Cg + c, k_h, k_w] = w[m, c, k_d, k_h, k_w]`` make (C3) a 2-D Conv with G groups
over it: the same products, every one of them once. All output depths go as the batch of
one 2-D call::

    x' [N·OD, G·KD·Cg, H, W]   (one copy of x: KD / s_d times its size)
    y' = Conv2d(x', w')        [N·OD, M, OH, OW]
    y  = y'.reshape(N, OD, M, OH, OW).transpose(0, 2, 1, 3, 4)

The spatial axes keep the node's own geometry (pads, strides, dilations, auto_pad act per
axis); the depth axis's pads are planes of ``pad_value`` in x': 0 for a float Conv, x's zero
point for QLinearConv / ConvInteger, where ``x − zx`` is then 0 as eq. (4) pads.

Numerics: the integer kernels sum the same int32 products (exact in any order) and
requantize as the 2-D kernels do, so QLinearConv and ConvInteger are bit-exact with the
reference's 3-D loops; the float Conv is within eq. (FG1) of docs/float-ops.md with
``K = Cg·KD·KH·KW`` (tests/targets/test_native_conv3d.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from quanta.kernels.reference.conv_geometry import ConvGeometry, conv_attrs

__all__ = ["DepthFold", "depth_windows"]


def depth_windows(x: np.ndarray, geom: ConvGeometry, group: int, pad_value: float | int) -> np.ndarray:
    """``[N·OD, G·KD·Cg, H, W]`` from x ``[N, C, D, H, W]``: for each output depth of
    ``geom`` the KD planes its windows read, channels in (group, k_d, c) order; depths
    outside x (its pads, and a ceil-mode window's end) are planes of ``pad_value``."""
    n, c, d, h, w = x.shape
    kd, sd_, dd = geom.kernel_shape[0], geom.strides[0], geom.dilations[0]
    od, p0 = geom.out_shape[0], geom.pads[0]
    need = (od - 1) * sd_ + (kd - 1) * dd + 1  # padded depths the last window ends at
    if p0 or need > p0 + d:
        xp = np.full((n, c, max(need, p0 + d), h, w), pad_value, x.dtype)
        xp[:, :, p0 : p0 + d] = x
    else:
        xp = np.ascontiguousarray(x)
    cg = c // group
    sn, sc, sd, sh, sw = xp.strides
    view = as_strided(
        xp,
        shape=(n, od, group, kd, cg, h, w),
        strides=(sn, sd_ * sd, cg * sc, dd * sd, sc, sh, sw),
        writeable=False,
    )
    return np.ascontiguousarray(view).reshape(n * od, group * kd * cg, h, w)


def _ints(v: Any, n: int, default: int) -> list[int]:
    return [int(a) for a in v] if v is not None and len(v) else [default] * n


@dataclass(frozen=True)
class DepthFold:
    """One 3-D convolution's weights ``[M, Cg, KD, KH, KW]`` and attributes as a 2-D one
    over depth windows (module docstring)."""

    wshape: tuple[int, ...]
    group: int
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...] | None
    auto_pad: str
    #: x shape -> its resolved geometry (the node's attributes are fixed)
    _geometries: dict[tuple[int, ...], ConvGeometry] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, wshape: tuple[int, ...], attrs: dict[str, Any]) -> DepthFold:
        auto_pad = attrs.get("auto_pad", "NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
        kernel = attrs.get("kernel_shape")
        if kernel is not None and len(kernel) and [int(k) for k in kernel] != list(wshape[2:]):
            raise ValueError(f"kernel_shape {list(kernel)} disagrees with the weight's {list(wshape[2:])}")
        pads = attrs.get("pads")
        return cls(
            tuple(int(d) for d in wshape),
            int(attrs.get("group", 1)),
            tuple(_ints(attrs.get("strides"), 3, 1)),
            tuple(_ints(attrs.get("dilations"), 3, 1)),
            None if pads is None or not len(pads) else tuple(int(p) for p in pads),
            auto_pad,
        )

    def weights_2d(self, w: np.ndarray) -> np.ndarray:
        """``w'[m, k_d·Cg + c, k_h, k_w] = w[m, c, k_d, k_h, k_w]`` (contiguous)."""
        m, cg, kd, kh, kw = w.shape
        return np.ascontiguousarray(w.transpose(0, 2, 1, 3, 4).reshape(m, kd * cg, kh, kw))

    def attrs_2d(self) -> dict[str, Any]:
        """The node's attributes over the two spatial axes (a 2-D kernel object's geometry)."""
        attrs: dict[str, Any] = {
            "group": self.group,
            "kernel_shape": list(self.wshape[3:]),
            "strides": list(self.strides[1:]),
            "dilations": list(self.dilations[1:]),
        }
        if self.auto_pad not in ("NOTSET", ""):
            attrs["auto_pad"] = self.auto_pad
        elif self.pads is not None:
            attrs["pads"] = [self.pads[1], self.pads[2], self.pads[4], self.pads[5]]
        return attrs

    def geometry(self, x_shape: tuple[int, ...]) -> ConvGeometry:
        """The resolved 3-D geometry for x of ``x_shape`` (the twin's conv_attrs, once per
        shape); raises ValueError for an x the weights do not fit."""
        known = self._geometries.get(x_shape)
        if known is not None:
            return known
        if len(x_shape) != 5 or x_shape[1] != self.wshape[1] * self.group:
            raise ValueError(
                f"x: expected [N, {self.wshape[1] * self.group}, D, H, W] for weights "
                f"{list(self.wshape)} and group {self.group}, got {list(x_shape)}"
            )
        g = self._geometries[x_shape] = conv_attrs(
            x_shape,
            self.wshape[2:],
            strides=self.strides,
            dilations=self.dilations,
            pads=self.pads,
            auto_pad=self.auto_pad,
        )
        return g

    def windows(self, x: np.ndarray, geom: ConvGeometry, pad_value: float | int) -> np.ndarray:
        """x' ``[N·OD, G·KD·Cg, H, W]``: for each output depth the KD planes it reads (the
        depth pads as planes of ``pad_value``), channels in (group, k_d, c) order."""
        return depth_windows(x, geom, self.group, pad_value)

    def out_shape(self, x_shape: tuple[int, ...], geom: ConvGeometry) -> tuple[int, ...]:
        return (x_shape[0], self.wshape[0], *geom.out_shape)

    @staticmethod
    def unfold(y4: np.ndarray, y_shape: tuple[int, ...], out: np.ndarray | None) -> np.ndarray:
        """y ``[N, M, OD, OH, OW]`` from the 2-D call's ``[N·OD, M, OH, OW]`` (into ``out``)."""
        n, m, od, oh, ow = y_shape
        y = y4.reshape(n, od, m, oh, ow).transpose(0, 2, 1, 3, 4)
        if out is None:
            return np.ascontiguousarray(y)
        np.copyto(out, y)
        return out
