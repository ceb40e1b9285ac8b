"""Native QuantizeLinear (float32 -> u8/s8/u16/s16, per-tensor or per-axis; ai.onnx and
com.microsoft, whose QuantizeLinear is ONNX's with 16-bit types before opset 21):
kernels/cpp/quantize.

The binder prepares what does not change between calls: a constant scale and zero point
(initializers, the usual case) become the float32 / int32 arrays the binding takes, once
(``params``: ``prepared``), so a call is one binding call (which also takes ``out=``);
a run-time scale or zero point is converted on each call. The kernel's
quotient is the true float32 division's (ONNX semantics, bit-identical to
kernels/reference/quantize.py, see kernels/cpp/quantize/quantize.h).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.ir.op_facts import MS as MS_DOMAIN
from quanta.kernels.reference.registry import OpContext, OpError
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.native._specialize import guarded, step_threads
from quanta.targets.native._values import const_of as _const

__all__ = ["bind_ms_quantize_linear", "bind_quantize_linear"]


#: ONNX TensorProto.FLOAT: the only ``precision`` the kernel divides in (0: the scale's type)
_PRECISIONS = (0, 1)


#: storage dtype -> the binding's suffix
_STORAGE = {
    np.dtype(np.uint8): "u8",
    np.dtype(np.int8): "s8",
    np.dtype(np.uint16): "u16",
    np.dtype(np.int16): "s16",
}
_STORAGE_ELEMS = {"u8": "u8", "i8": "s8", "u16": "u16", "i16": "s16"}


def _prepare(y_scale: Any, zp: Any) -> tuple[np.ndarray, np.ndarray, str]:
    """(scale f32[C], zero_point i32[C], storage suffix) as the binding takes them."""
    scale = np.ascontiguousarray(np.asarray(y_scale, np.float32).reshape(-1))
    zero_point = np.ascontiguousarray(np.asarray(zp).astype(np.int32).reshape(-1))
    storage = _STORAGE.get(np.asarray(zp).dtype)
    if storage is None:
        raise OpError(
            f"QuantizeLinear: y_zero_point: expected uint8, int8, uint16 or int16, got {np.asarray(zp).dtype}"
        )
    return scale, zero_point, storage


def _zero_point(y_zero_point: Any, output_dtype: Any) -> np.ndarray:
    # saturate only matters for float8 storage, excluded by the binder; without a zero
    # point, output_dtype (2 uint8, 3 int8; default uint8) gives the storage.
    if y_zero_point is None:
        return np.zeros((), np.int8 if output_dtype == 3 else np.uint8)
    return y_zero_point


def _quantize_linear_native(
    ctx: OpContext,
    x,
    y_scale,
    y_zero_point=None,
    *,
    axis: int = 1,
    prepared: tuple[np.ndarray, np.ndarray, str] | None = None,
    out: np.ndarray | None = None,
    **attrs: Any,
):
    """QuantizeLinear float32 -> u8/s8/u16/s16, per-tensor or per-axis, through the native
    kernel (``prepared``: the binder's (scale, zero_point, storage) for constant parameters)."""
    from quanta.kernels import _native

    if prepared is None:
        prepared = _prepare(y_scale, _zero_point(y_zero_point, attrs.get("output_dtype")))
    scale, zero_point, storage = prepared
    if not (isinstance(x, np.ndarray) and x.flags.c_contiguous):
        x = np.ascontiguousarray(x)
    fn = getattr(_native, f"quantize_linear_{storage}")
    threads = max(1, int(getattr(ctx, "num_threads", 1)))
    try:
        return fn(x, scale, zero_point, int(axis), threads, out)
    except ValueError as e:
        raise OpError(str(e)) from None


def _bind(node: Node, *, onnx_domain: bool) -> tuple[Kernel | None, str]:
    x, scale = node.input(0), node.input(1)
    zp = node.input(2)
    if onnx_domain and node.attrs.get("block_size"):
        return None, "blocked QuantizeLinear has no native kernel yet"
    if onnx_domain and node.attrs.get("precision", 0) not in _PRECISIONS:
        return None, "native QuantizeLinear divides in float32 only (precision 0 or FLOAT)"
    if x is None or x.type is None or str(x.type.elem) != "f32":
        return None, "native QuantizeLinear takes float32 input"
    if scale is None or scale.type is None or str(scale.type.elem) != "f32":
        return None, "native QuantizeLinear takes a float32 scale"
    out_dtype = node.attrs.get("output_dtype") if onnx_domain else None
    if zp is None and out_dtype not in (None, 2, 3):
        return None, "native QuantizeLinear covers uint8/int8/uint16/int16 storage only"
    if zp is not None and (zp.type is None or str(zp.type.elem) not in _STORAGE_ELEMS):
        return None, "native QuantizeLinear covers uint8/int8/uint16/int16 storage only"
    storage = _STORAGE_ELEMS[str(zp.type.elem)] if zp is not None else ("s8" if out_dtype == 3 else "u8")
    params: dict[str, Any] = {}
    scale_const, zp_const = _const(scale), _const(zp)
    if scale_const is not None and (zp is None or zp_const is not None):
        params["prepared"] = _prepare(scale_const, _zero_point(zp_const, out_dtype))
    name = f"native:quantize_linear_{storage}"
    return Kernel(
        _quantize_linear_native,
        "native",
        name,
        params=params,
        out=True,
        specialize=_quantize_linear_specialized,
    ), ""


def _quantize_linear_specialized(
    sig: Specialization,
    *,
    axis: int = 1,
    prepared: tuple[np.ndarray, np.ndarray, str] | None = None,
    **attrs: Any,
) -> Callable[..., Any] | None:
    """QuantizeLinear with constant parameters: the kernel and thread count chosen once."""
    from quanta.kernels import _native

    if prepared is None or sig.dtypes[0] != np.float32:
        return None
    scale, zero_point, storage = prepared
    fn = getattr(_native, f"quantize_linear_{storage}")
    threads, out, ax = step_threads(sig), sig.out, int(axis)
    generic_attrs = {"axis": axis, "prepared": prepared, **attrs}
    return guarded(
        lambda x, *p: fn(x, scale, zero_point, ax, threads, out),
        _quantize_linear_native,
        generic_attrs,
        out,
        reads=1,
        recordable=True,
    )


@register_binder("QuantizeLinear")
def bind_quantize_linear(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 -> u8/s8/u16/s16, per-tensor or per-axis; blocked and other storages fall back."""
    del model  # unused: the choice depends on the node's types only
    return _bind(node, onnx_domain=True)


@register_binder("QuantizeLinear", MS_DOMAIN)
def bind_ms_quantize_linear(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """com.microsoft QuantizeLinear (ORT's ``UseQDQContribOps``): the same kernel."""
    del model  # unused: the choice depends on the node's types only
    return _bind(node, onnx_domain=False)
