"""Native QLinearConv and ConvInteger, 1-D, 2-D and 3-D: quanta/kernels/cpp/conv (conv.h)::

    acc[n, m, o] = Σ_{c, k} (x_pad[n, g·C/G + c, o·s + k·d] − zx) · (w[m, c, k] − zw[m]) + B[m]   eq. (4)
    QLinearConv  y = saturate(round_half_even(f32(acc) · m[m]) + zy),  m = f32(f32(sx·sw[m]) / sy)   eq. (6)
                 (m: node.requant, derived by the lowering; the binding takes it as given)
                 y = min(max(y, lo), hi) with the node's output_clamp [lo, hi]         eq. (6c)
                 (passes/lower/fold_code_clamp.py; the kernel's epilogue clamps, conv.h clamp_lo)
    ConvInteger  y = acc (int32, no bias)

bit-exact with reference/qlinear_conv.py and reference/integer_ops.py (tests/targets/
test_native_conv.py, tests/kernels/test_conv_native.py).

Compile time (the binders): the constant weights and their zero points are packed once
into a ``_native.QConv`` (per group, for qgemm; or for the depthwise kernel when
group == C == M), kept in the kernel's params, with the geometry attributes. The kernel
name says which path runs (``native:qconv_dw_...``, ``native:qconv_implicit+qgemm_...``,
``native:qconv_im2col+qgemm_...``).

Run time: x alone when the scales, zero points and bias are constants (converted once by
``conv.prepare`` with the multiplier the lowering carries on the node, ``node.requant``:
quanta/passes/lower/requant_params.py); else x, its zero point, y's zero point, the bias
and the multiplier ``float_multiplier`` derives from the run-time scales per call.
Layout: ai.onnx QLinearConv / ConvInteger are NCHW at this boundary (the gemm
paths transpose to NHWC and back inside the call; the depthwise path runs on NCHW).
com.microsoft QLinearConv with ``channels_last=1`` (what an NHWC graph pass produces,
as ONNX Runtime's NhwcTransformer) runs the kernel's channels_last mode: x
``[N, *spatial, C]`` and y ``[N, *out, M]`` read and written in place, no transposes
(``native:qconv_dwc_...`` for depthwise); with ``channels_last=0`` it is the ai.onnx op.

3-D convolutions run the 2-D kernels over their depth windows (conv3d.py, eq. (C3):
``native:qconv3d_depthfold+...``), bit-exact: the same int32 products.

What runs on the reference twin instead (same numbers, slower):
- at compile time, with the reason recorded as a fallback: weights or
  weight zero points that are not constants, dtypes other than uint8/int8, attributes
  the kernel object refuses;
- at run time, a call the binding refuses (a multiplier that is not finite, shapes that
  do not match): the twin computes it or raises the operator's own error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node, Value
from quanta.kernels.reference.registry import MS_DOMAIN, OpContext, get_op
from quanta.passes.lower.requant_params import float_multiplier, requant_params
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.native._specialize import SMALL_MACS, guarded, step_threads
from quanta.targets.native._values import threads as _threads
from quanta.targets.native.conv3d import DepthFold

try:
    from quanta.kernels import _native
except ImportError:  # the binders only run when the extension is built
    _native = None

__all__ = ["bind_conv_integer", "bind_ms_qlinear_conv", "bind_qlinear_conv"]

_EIGHT_BIT = ("u8", "i8")
_GEOMETRY = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def _contiguous(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _reference(
    op_type: str,
    ctx: OpContext,
    inputs: tuple,
    attrs: dict[str, Any],
    domain: str = "",
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The NumPy twin, for a call the native binding refuses (written into ``out`` when
    the executor handed one)."""
    y = get_op(op_type, domain)(ctx, *inputs, **attrs)
    if out is None:
        return y
    out[...] = y
    return out


def _qlinear_conv_native(
    ctx: OpContext,
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray,
    w: np.ndarray,
    w_scale: np.ndarray,
    w_zero_point: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
    B: np.ndarray | None = None,
    *,
    conv: Any,
    nhwc: bool = False,
    domain: str = "",
    out: np.ndarray | None = None,
    output_clamp: list[int] | None = None,
    **attrs: Any,
) -> np.ndarray:
    """QLinearConv through the prepacked ``conv`` (w and w_zero_point are in it); ``nhwc``:
    x and y channels_last (com.microsoft QLinearConv, ``domain`` for the twin);
    ``output_clamp``: the node's code clamp (eq. (6c))."""
    try:
        # run-time scales (a node with constant ones takes _qlinear_conv_prepared): the
        # lowering's derivation, per call
        m = float_multiplier(x_scale, w_scale, y_scale)
        return conv.qlinear(
            _contiguous(x),
            x_zero_point,
            m,
            y_zero_point,
            B,
            num_threads=_threads(ctx),
            out=out,
            channels_last=nhwc,
            clamp=output_clamp,
        )
    except ValueError:
        inputs = (x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B)
        clamp = {} if output_clamp is None else {"output_clamp": output_clamp}
        return _reference("QLinearConv", ctx, inputs, {**attrs, **clamp}, domain, out)


def _qlinear_conv_prepared(
    ctx: OpContext,
    x: np.ndarray,
    *params: np.ndarray | None,
    conv: Any,
    nhwc: bool = False,
    domain: str = "",
    out: np.ndarray | None = None,
    **attrs: Any,
) -> np.ndarray:
    """QLinearConv whose scales, zero points and bias are constants, converted once at
    compile time (``conv.prepare``): the call parses x alone (a 1x1 conv of 8 channels on
    a 2x2 image took 6.3 us through ``conv.qlinear``, most of it converting parameters)."""
    try:
        return conv.qlinear_prepared(_contiguous(x), num_threads=_threads(ctx), out=out, channels_last=nhwc)
    except ValueError:
        return _reference("QLinearConv", ctx, (x, *params), attrs, domain, out)


def _qlinear_conv_specialized(
    sig: Specialization, *, conv: Any, nhwc: bool = False, domain: str = "", **attrs: Any
) -> Callable[..., Any] | None:
    """QLinearConv with prepared constants, for one x shape: the call with x alone, on
    one thread when the layer is too small to share (SMALL_MACS)."""
    w_shape = sig.shapes[3] if len(sig.shapes) > 3 else None
    if sig.out_shape is None or w_shape is None:
        return None
    threads = step_threads(sig, math.prod(sig.out_shape) * math.prod(w_shape[1:]), SMALL_MACS)
    out, run = sig.out, conv.qlinear_prepared
    generic_attrs = {"conv": conv, "nhwc": nhwc, "domain": domain, **attrs}
    return guarded(
        lambda x, *p: run(x, num_threads=threads, out=out, channels_last=nhwc),
        _qlinear_conv_prepared,
        generic_attrs,
        out,
        reads=1,
        # a 3-D convolution's depth fold gathers windows and unfolds its result in NumPy
        recordable=not isinstance(conv, _Conv3d),
    )


def _prepare_constants(conv: Any, node: Node) -> bool:
    """``conv.prepare`` with the node's constant parameters and the requantization
    multiplier the lowering carries on it (``node.requant``); False when one is not a
    constant or the binding refuses them (the per-call path then reports it)."""
    inputs = [node.input(i) for i in (2, 7, 8)]
    rq = requant_params(node)
    if (
        rq is None
        or any(v is not None and not v.is_const for v in inputs)
        or any(v is None for v in inputs[:2])
    ):
        return False
    zx, zy, b = (None if v is None else np.asarray(v.const) for v in inputs)
    try:
        conv.prepare(zx, rq.multiplier, zy, b, clamp=node.attrs.get("output_clamp"))
    except (ValueError, TypeError):
        return False
    return True


def _conv_integer_native(
    ctx: OpContext,
    x: np.ndarray,
    w: np.ndarray,
    x_zero_point: np.ndarray | None = None,
    w_zero_point: np.ndarray | None = None,
    *,
    conv: Any,
    out: np.ndarray | None = None,
    **attrs: Any,
) -> np.ndarray:
    """ConvInteger through the prepacked ``conv`` (w and w_zero_point are in it)."""
    try:
        return conv.integer(_contiguous(x), x_zero_point, num_threads=_threads(ctx), out=out)
    except ValueError:
        return _reference("ConvInteger", ctx, (x, w, x_zero_point, w_zero_point), attrs, out=out)


def _elem(v: Value | None) -> str | None:
    """The storage type of a value ("u8", "i8", "f32", ...; a quantized type's storage),
    or None when unknown."""
    if v is None or v.type is None:
        return None
    try:
        return str(v.type.elem.storage)
    except AttributeError:
        return None


def _prepack(node: Node, w: Value | None, zw: Value | None) -> tuple[Any | None, str]:
    """The ``_native.QConv`` for the node's constant weights, or None and why not."""
    if _native is None:
        return None, "the native extension is not built"
    if w is None or not w.is_const:
        return None, "weights w are not a constant (the native kernel packs them at compile time)"
    wc = np.asarray(w.const)
    if wc.dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
        return None, f"native convolution takes uint8/int8 weights, got {wc.dtype}"
    if wc.ndim not in (3, 4, 5):
        return None, f"native convolution takes 1-D, 2-D or 3-D weights (rank 3, 4 or 5), got rank {wc.ndim}"
    if zw is not None and not zw.is_const:
        return None, "w_zero_point is not a constant (the native kernel folds it at compile time)"
    zwc = np.zeros((), wc.dtype) if zw is None else np.asarray(zw.const)
    if zwc.dtype != wc.dtype:
        return None, f"w_zero_point: expected the type of w ({wc.dtype}), got {zwc.dtype}"
    if zwc.size == 1:
        zwc = zwc.reshape(())
    geometry = {k: v for k, v in node.attrs.items() if k in _GEOMETRY}
    try:
        if wc.ndim == 5:  # the 2-D kernel of its depth fold (conv3d.py, eq. (C3))
            fold = DepthFold.of(tuple(wc.shape), node.attrs)
            return _Conv3d(_native.QConv(fold.weights_2d(wc), zwc, **fold.attrs_2d()), fold), ""
        return _native.QConv(np.ascontiguousarray(wc), zwc, **geometry), ""
    except (ValueError, TypeError) as e:
        return None, f"the native kernel refuses the node: {e}"


class _Conv3d:
    """A 3-D QLinearConv / ConvInteger as the prepacked 2-D ``QConv`` of its depth fold
    (conv3d.py, eq. (C3)): the methods the wrappers above call, with x's depth windows
    padded by x's zero point (bit-exact: the same int32 products and requantization)."""

    def __init__(self, conv: Any, fold: DepthFold) -> None:
        self.conv, self.fold = conv, fold
        self.kernel = f"qconv3d_depthfold+{conv.kernel}"
        self.zx: int | None = None  # x's constant zero point, once prepare() has it

    def prepare(self, zx: np.ndarray | None, *rest: Any, clamp: list[int] | None = None) -> None:
        self.conv.prepare(zx, *rest, clamp=clamp)
        self.zx = _scalar_zero_point(zx)

    def _run(
        self, x: np.ndarray, zx: int, call: Any, out: np.ndarray | None, channels_last: bool
    ) -> np.ndarray:
        if channels_last:
            raise ValueError("a channels_last 3-D convolution has no native kernel")
        g = self.fold.geometry(x.shape)
        y4 = call(self.fold.windows(x, g, zx))
        return self.fold.unfold(y4, self.fold.out_shape(x.shape, g), out)

    def qlinear(
        self,
        x: np.ndarray,
        x_zero_point: Any,
        m: Any,
        y_zero_point: Any,
        b: Any,
        *,
        num_threads: int,
        out: np.ndarray | None = None,
        channels_last: bool = False,
        clamp: list[int] | None = None,
    ) -> np.ndarray:
        def call(x4: np.ndarray) -> np.ndarray:
            return self.conv.qlinear(
                x4, x_zero_point, m, y_zero_point, b, num_threads=num_threads, clamp=clamp
            )

        return self._run(x, _scalar_zero_point(x_zero_point), call, out, channels_last)

    def qlinear_prepared(
        self, x: np.ndarray, *, num_threads: int, out: np.ndarray | None = None, channels_last: bool = False
    ) -> np.ndarray:
        if self.zx is None:
            raise ValueError("prepare() has not run")
        return self._run(
            x, self.zx, lambda x4: self.conv.qlinear_prepared(x4, num_threads=num_threads), out, channels_last
        )

    def integer(
        self, x: np.ndarray, x_zero_point: Any = None, *, num_threads: int, out: np.ndarray | None = None
    ) -> np.ndarray:
        def call(x4: np.ndarray) -> np.ndarray:
            return self.conv.integer(x4, x_zero_point, num_threads=num_threads)

        return self._run(x, _scalar_zero_point(x_zero_point), call, out, False)


def _scalar_zero_point(z: Any) -> int:
    """x's zero point as the depth pads' value; ValueError (the twin runs) for one that is
    not a single value."""
    if z is None:
        return 0
    z = np.asarray(z)
    if z.size != 1:
        raise ValueError(f"x_zero_point: expected one value, got shape {list(z.shape)}")
    return int(z.reshape(()))


@register_binder("QLinearConv")
def bind_qlinear_conv(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """QLinearConv with constant weights (uint8/int8, per-tensor or per-channel)."""
    del model  # unused: the choice depends on the node alone
    x, y_zero_point = node.input(0), node.input(7)
    for what, v in (("x", x), ("y_zero_point", y_zero_point)):
        if _elem(v) is not None and _elem(v) not in _EIGHT_BIT:
            return None, f"native QLinearConv takes uint8/int8 {what}, got {_elem(v)}"
    conv, reason = _prepack(node, node.input(3), node.input(5))
    if conv is None:
        return None, reason
    if _prepare_constants(conv, node):
        return Kernel(
            _qlinear_conv_prepared,
            "native",
            f"native:{conv.kernel}",
            params={"conv": conv},
            out=True,
            specialize=_qlinear_conv_specialized,
        ), ""
    return Kernel(
        _qlinear_conv_native, "native", f"native:{conv.kernel}", params={"conv": conv}, out=True
    ), ""


@register_binder("QLinearConv", MS_DOMAIN)
def bind_ms_qlinear_conv(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """com.microsoft QLinearConv: the ai.onnx op's kernel, run channels_last when the node
    says so (x [N, *spatial, C], y [N, *out, M]; w [M, C/group, *kernel] as ai.onnx)."""
    del model  # unused: the choice depends on the node alone
    channels_last = node.attrs.get("channels_last", 0)
    if channels_last not in (0, 1):
        return None, f"channels_last: expected 0 or 1, got {channels_last!r}"
    x, y_zero_point = node.input(0), node.input(7)
    for what, v in (("x", x), ("y_zero_point", y_zero_point)):
        if _elem(v) is not None and _elem(v) not in _EIGHT_BIT:
            return None, f"native QLinearConv takes uint8/int8 {what}, got {_elem(v)}"
    conv, reason = _prepack(node, node.input(3), node.input(5))
    if conv is None:
        return None, reason
    if channels_last and isinstance(conv, _Conv3d):
        return None, "a channels_last 3-D convolution has no native kernel"
    name = conv.kernel_channels_last if channels_last else conv.kernel
    params = {"conv": conv, "nhwc": bool(channels_last), "domain": MS_DOMAIN}
    if _prepare_constants(conv, node):
        return Kernel(
            _qlinear_conv_prepared,
            "native",
            f"native:{name}",
            params=params,
            out=True,
            specialize=_qlinear_conv_specialized,
        ), ""
    return Kernel(_qlinear_conv_native, "native", f"native:{name}", params=params, out=True), ""


@register_binder("ConvInteger")
def bind_conv_integer(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """ConvInteger with constant weights (uint8/int8, per-tensor or per-channel zero point)."""
    del model  # unused: the choice depends on the node alone
    x = node.input(0)
    if _elem(x) is not None and _elem(x) not in _EIGHT_BIT:
        return None, f"native ConvInteger takes uint8/int8 x, got {_elem(x)}"
    conv, reason = _prepack(node, node.input(1), node.input(3))
    if conv is None:
        return None, reason
    return Kernel(
        _conv_integer_native, "native", f"native:{conv.kernel}", params={"conv": conv}, out=True
    ), ""
