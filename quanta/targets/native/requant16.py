"""Native quanta::QLinearAffine16 / QLinearAdd16 / QLinearMul16 on the requant16 kernels
(quanta/kernels/cpp/a16w8/requant16.h; docs/quantization-math.md eqs. (E1)-(E3)).

Compile time: the float64 multipliers and offsets come from the twin's own parameter
functions (``reference.requant16.affine16_params`` / ``binary16_params``), so kernel and
twin compute with the same numbers and agree bit for bit. Run time: one kernel call;
inputs outside the compiled types run on the twin, which raises the op's own errors. Per
input signature (``Kernel.specialize``) the call is bound once and recordable: a run of
these steps becomes one native program call (docs/runtime.md "Native programs").
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels.reference.requant16 import QUANTA_DOMAIN, SIXTEEN_BIT, affine16_params, binary16_params
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.native._specialize import guarded
from quanta.targets.native._values import const_of as _const
from quanta.targets.native._values import run_twin
from quanta.targets.native._values import value_dtype as _dtype

try:
    from quanta.kernels import _native
except ImportError:  # the binders only run when the extension is built
    _native = None

__all__ = ["bind_qlinear_affine16", "bind_qlinear_binary16"]

_SHORT = {np.dtype(np.uint16): "u16", np.dtype(np.int16): "i16"}


def _affine16_native(
    ctx: Any,
    x: np.ndarray,
    *rest: np.ndarray,
    out: np.ndarray | None = None,
    axis: int | None = None,
    y_min: float | None = None,
    y_max: float | None = None,
    function: str = "",
    **p: Any,
) -> np.ndarray:
    channels = p["m"].size
    fits = channels == 1 or (axis is not None and -x.ndim <= axis < x.ndim and x.shape[axis] == channels)
    if x.dtype == p["x_dtype"] and x.flags.c_contiguous and fits:
        return _native.a16w8_affine16(
            x, p["zx"], p["m"], p["b"], p["lo"], p["hi"], 0 if axis is None else axis, p["out_dtype"], out=out
        )
    attrs = {"axis": axis, "y_min": y_min, "y_max": y_max, "function": function}
    return run_twin("QLinearAffine16", QUANTA_DOMAIN, ctx, (x, *rest), attrs, out)


def _affine16_specialized(sig: Specialization, **attrs: Any) -> Any:
    """x of the compiled type and known shape (its channels along ``axis`` when per
    channel): the kernel call with its arguments bound."""
    shape, axis = sig.shapes[0], attrs.get("axis")
    channels = attrs["m"].size
    if sig.dtypes[0] != attrs["x_dtype"] or shape is None:
        return None
    if channels != 1 and not (
        axis is not None and -len(shape) <= axis < len(shape) and shape[axis] == channels
    ):
        return None
    fn, out = _native.a16w8_affine16, sig.out
    zx, m, b, lo, hi, od = attrs["zx"], attrs["m"], attrs["b"], attrs["lo"], attrs["hi"], attrs["out_dtype"]
    ax = 0 if axis is None else axis
    return guarded(
        lambda x, *rest: fn(x, zx, m, b, lo, hi, ax, od, out=out),
        _affine16_native,
        attrs,
        out,
        reads=1,
        recordable=True,
    )


@register_binder("QLinearAffine16", QUANTA_DOMAIN)
def bind_qlinear_affine16(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """16-bit x and y, constant per-tensor scales and zero points, constant a and b."""
    del model  # unused: the choice depends on the node only
    x, sx, zx, sy, zy, a, b = (node.input(i) for i in range(7))
    x_dtype = _dtype(x)
    if x_dtype not in SIXTEEN_BIT:
        return None, f"native QLinearAffine16: x is {x_dtype}, expected uint16 or int16"
    csx, czx, csy, czy, ca, cb = (_const(v) for v in (sx, zx, sy, zy, a, b))
    if csx is None or csy is None or ca is None or cb is None or (zx is not None and czx is None):
        return None, "native QLinearAffine16 takes constant scales, zero points, a and b"
    if czy is None or np.dtype(czy.dtype) not in SIXTEEN_BIT:
        return None, "native QLinearAffine16: y_zero_point is not a constant uint16 / int16"
    if csx.size != 1 or csy.size != 1 or czy.size != 1 or (czx is not None and czx.size != 1):
        return None, "native QLinearAffine16 takes per-tensor scales and zero points"
    y_min, y_max = node.attrs.get("y_min"), node.attrs.get("y_max")
    m, bias, zxv, lo, hi = affine16_params(csx, czx, csy, czy, ca, cb, np.dtype(czy.dtype), y_min, y_max)
    axis = node.attrs.get("axis")
    if m.size > 1 and axis is None:
        return None, "native QLinearAffine16: per-channel a / b without an axis"
    params = {
        "x_dtype": x_dtype,
        "zx": zxv,
        "m": m,
        "b": bias,
        "lo": lo,
        "hi": hi,
        "out_dtype": _SHORT[np.dtype(czy.dtype)],
    }
    name = f"native:qlinear_affine16{'_channels' if m.size > 1 else ''}_{_SHORT[x_dtype]}"
    return Kernel(
        _affine16_native, "native", name, params=params, out=True, specialize=_affine16_specialized
    ), ""


def _binary16_native(ctx: Any, *inputs: Any, out: np.ndarray | None = None, **p: Any) -> np.ndarray:
    a, b = inputs[0], inputs[3]
    if a.dtype == p["dtype"] and b.dtype == p["dtype"] and a.flags.c_contiguous and b.flags.c_contiguous:
        return _native.a16w8_binary16(
            p["kind"], a, p["zero_a"], b, p["zero_b"], p["sa"], p["sb"], p["sy"], p["zero_y"], out=out
        )
    return run_twin(f"QLinear{p['kind']}16", QUANTA_DOMAIN, ctx, inputs, {}, out)


def _binary16_specialized(sig: Specialization, **attrs: Any) -> Any:
    """a and b of the compiled type and known shapes: the kernel call with its arguments
    bound (the broadcast plan is the binding's, per call)."""
    if sig.dtypes[0] != attrs["dtype"] or sig.dtypes[3] != attrs["dtype"]:
        return None
    fn, out = _native.a16w8_binary16, sig.out
    kind, za, zb, sa, sb, sy, zy = (
        attrs[k] for k in ("kind", "zero_a", "zero_b", "sa", "sb", "sy", "zero_y")
    )
    return guarded(
        lambda a, b: fn(kind, a, za, b, zb, sa, sb, sy, zy, out=out),
        _binary16_native,
        attrs,
        out,
        reads=(0, 3),
        recordable=True,
    )


def _bind_binary16(kind: str, node: Node) -> tuple[Kernel | None, str]:
    dt = _dtype(node.input(0))
    if dt not in SIXTEEN_BIT or _dtype(node.input(3)) != dt:
        return None, f"native QLinear{kind}16: a and b are not one of uint16 / int16"
    names = ("a_scale", "a_zero_point", "b_scale", "b_zero_point", "y_scale", "y_zero_point")
    consts = {}
    for name, i in zip(names, (1, 2, 4, 5, 6, 7), strict=True):
        v = node.input(i)
        c = _const(v)
        if v is not None and (c is None or c.size != 1):
            return None, f"native QLinear{kind}16: {name} is not a constant scalar"
        consts[name] = c
    zy = consts["y_zero_point"]
    if zy is None or np.dtype(zy.dtype) != dt:
        return None, f"native QLinear{kind}16: y_zero_point is not a constant of a's type"
    sa, sb, sy = binary16_params(kind, consts["a_scale"], consts["b_scale"], consts["y_scale"])

    def zp(c: np.ndarray | None) -> int:
        return 0 if c is None else int(c.reshape(()))

    params = {
        "kind": kind,
        "dtype": dt,
        "zero_a": zp(consts["a_zero_point"]),
        "zero_b": zp(consts["b_zero_point"]),
        "zero_y": zp(zy),
        "sa": sa,
        "sb": sb,
        "sy": sy,
    }
    name = f"native:qlinear_{kind.lower()}16_{_SHORT[dt]}"
    return Kernel(
        _binary16_native, "native", name, params=params, out=True, specialize=_binary16_specialized
    ), ""


@register_binder("QLinearAdd16", QUANTA_DOMAIN)
def bind_qlinear_binary16(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """a, b and y of one 16-bit type, constant per-tensor scales and zero points."""
    del model  # unused: the choice depends on the node only
    return _bind_binary16("Add", node)


@register_binder("QLinearMul16", QUANTA_DOMAIN)
def bind_qlinear_mul16(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """As QLinearAdd16 (eq. (E2))."""
    del model  # unused: the choice depends on the node only
    return _bind_binary16("Mul", node)
