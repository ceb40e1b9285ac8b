"""Native QuantizeLinear (float32 -> u8/s8, per-tensor or per-axis): kernels/cpp/quantize."""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels.reference.registry import OpContext, OpError
from quanta.targets.base import Kernel
from quanta.targets.native import register_binder

__all__ = ["bind_quantize_linear"]


def _quantize_linear_native(ctx: OpContext, x, y_scale, y_zero_point=None, *, axis: int = 1, **attrs: Any):
    """QuantizeLinear float32 -> u8/s8, per-tensor or per-axis, through the native kernel."""
    from quanta.kernels import _native

    del ctx  # unused: the binder only selects this kernel for supported opsets/attrs
    # saturate only matters for float8 storage, excluded by the binder; without a zero
    # point, output_dtype (2 uint8, 3 int8; default uint8) gives the storage.
    if y_zero_point is None:
        zp = np.zeros((), np.int8 if attrs.get("output_dtype") == 3 else np.uint8)
    else:
        zp = y_zero_point
    scale = np.ascontiguousarray(np.asarray(y_scale, np.float32).reshape(-1))
    zero_point = np.ascontiguousarray(np.asarray(zp).astype(np.int32).reshape(-1))
    x = np.ascontiguousarray(x)
    fn = _native.quantize_linear_u8 if zp.dtype == np.uint8 else _native.quantize_linear_s8
    try:
        return fn(x, scale, zero_point, int(axis))
    except ValueError as e:
        raise OpError(str(e)) from None


@register_binder("QuantizeLinear")
def bind_quantize_linear(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 -> u8/s8, per-tensor or per-axis; blocked and other storages fall back."""
    del model  # unused: the choice depends on the node's types only
    x, scale = node.input(0), node.input(1)
    zp = node.input(2)
    if node.attrs.get("block_size"):
        return None, "blocked QuantizeLinear has no native kernel yet"
    if x is None or x.type is None or str(x.type.elem) != "f32":
        return None, "native QuantizeLinear takes float32 input"
    if scale is None or scale.type is None or str(scale.type.elem) != "f32":
        return None, "native QuantizeLinear takes a float32 scale"
    out_dtype = node.attrs.get("output_dtype")
    if zp is None and out_dtype not in (None, 2, 3):
        return None, "native QuantizeLinear covers uint8/int8 storage only"
    if zp is not None and (zp.type is None or str(zp.type.elem) not in ("u8", "i8")):
        return None, "native QuantizeLinear covers uint8/int8 storage only"
    signed = (zp is not None and str(zp.type.elem) == "i8") or out_dtype == 3
    return Kernel(_quantize_linear_native, "native", f"native:quantize_linear_{'s8' if signed else 'u8'}"), ""
