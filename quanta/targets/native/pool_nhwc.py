"""Native com.microsoft NhwcMaxPool (uint8/int8, 2-D windows, channels-last):
quanta/kernels/cpp/pool (pool.h ``max_pool_2d_nhwc``), bit-exact with its reference twin
(reference/ms_nhwc_pool.py; max only selects). The geometry is the twin's own
(conv_geometry.conv_attrs on the NCHW view of the shape), cached per input shape."""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels.reference.conv_geometry import conv_attrs
from quanta.kernels.reference.registry import MS_DOMAIN, get_op
from quanta.targets.base import Kernel
from quanta.targets.native import register_binder
from quanta.targets.native._cache import BoundedCache

try:
    from quanta.kernels import _native
except ImportError:  # the binders only run when the extension is built
    _native = None

__all__ = ["bind_nhwc_max_pool"]


def _nhwc_max_pool_native(
    ctx: Any,
    x: np.ndarray,
    *,
    geometry: BoundedCache,
    out: np.ndarray | None = None,
    **attrs: Any,
) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype not in (np.uint8, np.int8) or x.ndim != 4:
        y = get_op("NhwcMaxPool", MS_DOMAIN)(ctx, x, **attrs)
        if out is None:
            return y
        out[...] = y
        return out
    geom = geometry.get(
        x.shape,
        lambda: conv_attrs(
            (x.shape[0], x.shape[3], x.shape[1], x.shape[2]),  # the NCHW view of the shape
            None,
            kernel_shape=attrs.get("kernel_shape"),
            strides=attrs.get("strides"),
            dilations=attrs.get("dilations"),
            pads=attrs.get("pads"),
            auto_pad=attrs.get("auto_pad", "NOTSET"),
            ceil_mode=bool(attrs.get("ceil_mode", 0)),
        ),
    )
    xc = x if x.flags.c_contiguous else np.ascontiguousarray(x)
    threads = max(1, int(getattr(ctx, "num_threads", 1)))
    return _native.max_pool_2d_nhwc(
        xc,
        list(geom.kernel_shape),
        list(geom.strides),
        list(geom.dilations),
        list(geom.pads[:2]),
        list(geom.out_shape),
        threads,
        out,
    )


@register_binder("NhwcMaxPool", MS_DOMAIN)
def bind_nhwc_max_pool(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """uint8/int8 x of rank 4 (2-D windows)."""
    del model  # unused: the choice depends on the node alone
    if _native is None:
        return None, "the native extension is not built"
    x = node.input(0)
    if x is not None and x.shape is not None and len(x.shape) != 4:
        return None, f"native NhwcMaxPool takes 2-D windows (rank 4), got rank {len(x.shape)}"
    ks = node.attrs.get("kernel_shape")
    if ks is None or len(ks) != 2:
        return None, "NhwcMaxPool without a 2-D kernel_shape (the twin handles or raises)"
    return Kernel(
        _nhwc_max_pool_native,
        "native",
        "native:max_pool_2d_nhwc",
        params={"geometry": BoundedCache()},
        out=True,
    ), ""
