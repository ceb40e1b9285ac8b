"""Native quanta::MlasConv: ONNX Runtime's float32 Conv in MLAS's order.

=============  ==========================================  =============================
operator       native call                                  twin (bit for bit)
=============  ==========================================  =============================
quanta         ``mlas_conv_f32``: im2col per part and K     reference/mlas_conv.py
MlasConv       block, FMA chains (AVX2: 6 rows x 16         ``mlas_conv``, eqs.
               columns a tile), MLAS's M = 1 and N = 1      (MC1)-(MC6)
               kernels' orders, then the bias
=============  ==========================================  =============================

The weights (a constant DequantizeLinear's output, folded before binding) are made
float32 C-contiguous [M, C/G, kh, kw] once, at bind time; the driver reads them in that
layout (rows of K = C/G·kh·kw), as MLAS's SGEMM reads an unpacked A. Per input signature
(``Kernel.specialize``) the geometry (reference ``conv_shape``, its one place) and the
parts (eq. (MC2)) for the node's ``threads`` attribute (ONNX Runtime's thread count) are
computed once, and a run is one ``mlas_conv_f32`` call into the planned output, which a
native program records. The kernel itself runs on the session's threads, which change no
result. A shape the schedule does not model raises the twin's OpError (the rewrite never
writes such a node).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels.reference.mlas_conv import QUANTA_DOMAIN, ConvShape, conv_geometry, conv_shape
from quanta.kernels.reference.registry import OpError
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.native._specialize import SMALL_MACS, guarded, step_threads
from quanta.targets.native._values import const_of
from quanta.targets.native._values import threads as _threads

try:
    from quanta.kernels import _native
except ImportError:  # the binders only run when the extension is built
    _native = None

F32 = np.dtype(np.float32)

#: one signature's call: (the 2-D geometry, parts int64 [P, 6])
Call = tuple[ConvShape, np.ndarray]


def _call(x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any]) -> Call:
    """The geometry and parts of one x shape, or OpError where the schedule is not modelled."""
    strides, dilations, pads, group = conv_geometry(attrs, w_shape)
    s = conv_shape(x_shape, w_shape, strides, dilations, pads, group)
    parts = s.plan(int(attrs.get("threads", 1)))
    if parts is None:
        raise OpError("MlasConv: a shape whose MLAS schedule is not modelled (the rewrite refuses these)")
    return s, np.asarray(parts, np.int64).reshape(-1, 6)


def _packed(w: np.ndarray) -> np.ndarray:
    """w as the driver reads it: float32, C-contiguous, [M, C/G, kh, kw] (1-D: kh = 1)."""
    w = np.ascontiguousarray(w, dtype=F32)
    return w.reshape(w.shape[0], w.shape[1], 1, w.shape[2]) if w.ndim == 3 else w


def _mlas_conv(
    ctx: Any,
    x: Any,
    w: Any,
    b: Any = None,
    *,
    out: np.ndarray | None = None,
    packed: np.ndarray | None = None,
    calls: dict[tuple[int, ...], Call] | None = None,
    **attrs: Any,
) -> np.ndarray:
    """The generic call (a signature the specialization does not take: a non-contiguous x,
    a run-time bias or weight); ``calls`` keeps each x shape's geometry and parts."""
    x = np.ascontiguousarray(x, dtype=F32)
    w4 = packed if packed is not None else _packed(np.asarray(w))
    w_shape = np.shape(w) if packed is None else tuple(attrs.get("w_shape", w4.shape))
    call = None if calls is None else calls.get(x.shape)
    if call is None:
        call = _call(x.shape, w_shape, attrs)
        if calls is not None and len(calls) < 64:  # dynamic shapes: keep it bounded
            calls[x.shape] = call
    s, parts = call
    y_shape = (s.batch, s.m, s.oh, s.ow)
    y = _native.mlas_conv_f32(
        x.reshape(s.batch, -1, s.h, s.w),
        w4,
        None if b is None else np.ascontiguousarray(b, dtype=F32),
        list(s.strides),
        list(s.dilations),
        list(s.pads),
        s.group,
        parts,
        _threads(ctx),
        None if out is None else out.reshape(y_shape),
    )
    if out is not None:
        return out
    return y.reshape(y.shape[0], y.shape[1], y.shape[3]) if x.ndim == 3 else y


def _mlas_conv_specialized(
    sig: Specialization,
    *,
    packed: np.ndarray | None = None,
    calls: dict[tuple[int, ...], Call] | None = None,
    **attrs: Any,
) -> Any:
    """The MlasConv of one x shape with constant weights and bias: geometry, parts, thread
    count and output view decided once; a run is one ``mlas_conv_f32`` call by position
    into the planned output (recordable)."""
    x_shape = sig.shapes[0]
    if x_shape is None or len(x_shape) not in (3, 4) or sig.dtypes[0] != F32:
        return None
    w4 = packed
    if w4 is None:
        if sig.consts[1] is None:
            return None  # weights computed at run time
        w4 = _packed(sig.consts[1])
    has_bias = len(sig.shapes) > 2 and sig.shapes[2] is not None
    if has_bias and sig.consts[2] is None:
        return None  # a bias computed at run time
    bias = np.ascontiguousarray(sig.consts[2], dtype=F32) if has_bias else None
    w_shape = tuple(attrs.get("w_shape", w4.shape)) if packed is not None else tuple(np.shape(sig.consts[1]))
    try:
        s, parts = _call(tuple(x_shape), w_shape, attrs)
    except OpError:
        return None
    threads = step_threads(sig, s.batch * s.m * s.n * s.k, SMALL_MACS)
    x4 = (s.batch, x_shape[1], s.h, s.w)
    y4 = (s.batch, s.m, s.oh, s.ow)
    out = sig.out
    target = None if out is None else out.reshape(y4)
    conv = _native.mlas_conv_f32
    st, dl, pd, group = list(s.strides), list(s.dilations), list(s.pads), s.group
    one_d = len(x_shape) == 3

    def run(x: np.ndarray, *rest: Any) -> np.ndarray:
        y = conv(x.reshape(x4) if one_d else x, w4, bias, st, dl, pd, group, parts, threads, target)
        if out is not None:
            return out
        return y.reshape(y4[0], y4[1], y4[3]) if one_d else y

    generic_attrs = {"packed": packed, "calls": calls, **attrs}
    return guarded(run, _mlas_conv, generic_attrs, out, reads=1, recordable=True)


@register_binder("MlasConv", QUANTA_DOMAIN)
def bind_mlas_conv(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta::MlasConv on float32 x, w (and bias) of rank 3 or 4; constant weights are
    made the driver's layout here, once."""
    del model  # unused
    if _native is None or not hasattr(_native, "mlas_conv_f32"):
        return None, "the native extension is not built (or predates mlas_conv_f32)"
    w = node.input(1)
    if w is not None and w.type is not None and w.type.shape is not None and len(w.type.shape) not in (3, 4):
        return None, f"a {len(w.type.shape) - 2}-D Conv (1-D and 2-D only)"
    params: dict[str, Any] = {"calls": {}}
    wc = const_of(w)
    if wc is not None and wc.ndim in (3, 4):
        params.update(packed=_packed(wc), w_shape=tuple(wc.shape))
    kernel = Kernel(fn=_mlas_conv, impl="native", name="native:mlas_conv_f32", params=params, out=True)
    kernel.specialize = _mlas_conv_specialized
    return kernel, ""
