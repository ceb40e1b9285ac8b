"""Native quanta::MlasConv: ONNX Runtime's float32 Conv in MLAS's order.

=============  ==========================================  =============================
operator       native call                                  twin (bit for bit)
=============  ==========================================  =============================
quanta         ``mlas_conv_f32``: im2col per part, FMA      reference/mlas_conv.py
MlasConv       chains over K blocks (AVX2: 4 rows x 16      ``mlas_conv``, eqs.
               columns a tile), MLAS's M = 1 and N = 1      (MC1)-(MC6)
               kernels' orders, then the bias
=============  ==========================================  =============================

The parts (eq. (MC2)) follow the node's ``threads`` attribute (ONNX Runtime's thread
count), computed once per input shape; the kernel itself runs on the session's threads,
which do not change any result. A shape the schedule does not model runs the twin, which
refuses it with the op's error (the rewrite never writes such a node).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels.reference.mlas_conv import QUANTA_DOMAIN, conv_geometry, mlas_conv_plan
from quanta.kernels.reference.registry import OpError
from quanta.targets.base import Kernel
from quanta.targets.native import register_binder
from quanta.targets.native._values import threads as _threads

try:
    from quanta.kernels import _native
except ImportError:  # the binders only run when the extension is built
    _native = None


def _plan(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any]
) -> tuple[Any, ...] | None:
    """(parts int64 [P, 6], strides, dilations, pads, group) of the 2-D form, or None."""
    strides, dilations, pads, group = conv_geometry(attrs, w_shape)
    if len(w_shape) == 3:  # 1-D: MLAS promotes it to 2-D with a unit height
        strides, dilations, pads = (1, strides[0]), (1, dilations[0]), (0, pads[0], 0, pads[1])
    b, _, h, w = (x_shape[0], x_shape[1], 1, x_shape[2]) if len(x_shape) == 3 else x_shape
    kh, kw = (1, w_shape[2]) if len(w_shape) == 3 else w_shape[2:]
    oh = (h + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (w + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    pointwise = kh == kw == 1 and tuple(strides) == (1, 1) and not any(pads)
    spans = (
        not pointwise
        and w_shape[1] == 1
        and tuple(strides) == (1, 1)
        and tuple(dilations) == (1, 1)
        and not any(pads)
        and (kw == w or (kh == h and kw == 1))
    )
    parts = mlas_conv_plan(
        w_shape[0] // group,
        w_shape[1] * kh * kw,
        oh * ow,
        pointwise=pointwise,
        spans_input=spans,
        many=b > 1 or group > 1,
        threads=int(attrs.get("threads", 1)),
    )
    if parts is None:
        return None
    return np.asarray(parts, np.int64).reshape(-1, 6), strides, dilations, pads, group


_PLANS: dict[tuple[Any, ...], tuple[Any, ...] | None] = {}


def _cached_plan(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any]
) -> tuple[Any, ...] | None:
    """_plan, once per shapes and attributes (a run calls it for every MlasConv)."""
    key = (x_shape, w_shape, tuple(sorted((k, str(v)) for k, v in attrs.items())))
    if key not in _PLANS:
        if len(_PLANS) >= 1024:  # dynamic shapes: keep the cache bounded
            _PLANS.clear()
        _PLANS[key] = _plan(x_shape, w_shape, attrs)
    return _PLANS[key]


def _mlas_conv(ctx: Any, x: Any, w: Any, b: Any = None, **attrs: Any) -> np.ndarray:
    x = np.asarray(x, np.float32)
    w = np.asarray(w, np.float32)
    plan = _cached_plan(x.shape, w.shape, attrs)
    if plan is None:
        raise OpError("MlasConv: a shape whose MLAS schedule is not modelled (the rewrite refuses these)")
    parts, strides, dilations, pads, group = plan
    one_d = x.ndim == 3
    y = _native.mlas_conv_f32(
        x[:, :, None, :] if one_d else x,
        w[:, :, None, :] if one_d else w,
        None if b is None else np.asarray(b, np.float32),
        list(strides),
        list(dilations),
        list(pads),
        group,
        parts,
        num_threads=_threads(ctx),
    )
    return y[:, :, 0, :] if one_d else y


@register_binder("MlasConv", QUANTA_DOMAIN)
def bind_mlas_conv(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta::MlasConv on float32 x, w (and bias) of rank 3 or 4."""
    del model  # unused
    if _native is None or not hasattr(_native, "mlas_conv_f32"):
        return None, "the native extension is not built (or predates mlas_conv_f32)"
    w = node.input(1)
    if w is not None and w.type is not None and w.type.shape is not None and len(w.type.shape) not in (3, 4):
        return None, f"a {len(w.type.shape) - 2}-D Conv (1-D and 2-D only)"
    return Kernel(fn=_mlas_conv, impl="native", name="native:mlas_conv_f32"), ""
