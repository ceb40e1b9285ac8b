"""Native float32 Conv, ConvTranspose, MatMul and Gemm: the float GEMM family
(quanta/kernels/cpp/sgemm, sgemm.h).

=============  ============================================  ==================================
operator       native call                                   twin (within eq. (FG1))
=============  ============================================  ==================================
Conv           ``conv_f32``: 1x1 stride-1 unpadded as one     nn_conv.conv (im2col + matmul)
               GEMM per image and group (y = W·x, NCHW),
               depthwise direct, the rest im2col per column
               block; weights packed at compile time
quanta::Conv   ``conv_f32`` with the fused Relu / Clip as    nn_conv.fused_conv
               the epilogue's clamp (lo, hi)
ConvTranspose  the GEMM of ``conv_f32`` (a 1x1 convolution    nn_conv.conv_transpose
               with the transposed weights) for the columns,
               then ``col2im_f32`` (the twin's scatter order,
               crop and bias in one gather)
MatMul         ``matmul_f32``: a constant 2-D B packed at     nn.matmul (np.matmul)
               compile time, every row of A one GEMM; else
               numpy.matmul batching, no copies
quanta::       ``matmul_f32`` of the packed W with the bias   reference/matmul_bias.py (MatMul,
MatMulBias     in the epilogue (exact: the native MatMul,     then Add)
               then the native Add)
Gemm           ``matmul_f32`` with α and C folded into the    nn.gemm
               epilogue (β·C as a column bias, precomputed
               when C is a constant); a full (M, N) C added
               after
=============  ============================================  ==================================

Numerics: docs/float-ops.md "The float GEMM family": fused multiply-adds, an error bound
against float64 instead of bit-identity with the NumPy twin (whose BLAS sums in an order
of its own); results identical for any thread count.

A 3-D Conv runs ``conv_f32`` over its depth windows (conv3d.py, eq. (C3) of
docs/kernels.md). What runs on the twin: at compile time (the plan records the reason)
weights that are not float32 constants, inputs known to be of another type; at run time (the
call is counted in :data:`RUNTIME_FALLBACKS`) an input that is not float32 or a shape the
binding refuses, which the twin computes or rejects with the operator's error.
"""

from __future__ import annotations

import collections
import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node, Value
from quanta.kernels.reference.conv_geometry import conv_attrs, is_depthwise
from quanta.kernels.reference.nn_conv import FUSED_GATES, conv_transpose_geometry, fused_clamp_bounds
from quanta.kernels.reference.registry import OpContext, OpError, get_op
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.native._specialize import SMALL_MACS, guarded, step_threads
from quanta.targets.native._values import threads as _threads
from quanta.targets.native._values import value_dtype
from quanta.targets.native.conv3d import DepthFold

try:
    from quanta.kernels import _native
except ImportError:  # the binders only run when the extension is built
    _native = None

__all__ = [
    "RUNTIME_FALLBACKS",
    "bind_conv",
    "bind_conv_transpose",
    "bind_fused_conv",
    "bind_gemm",
    "bind_matmul",
    "bind_matmul_bias",
]

F32 = np.dtype(np.float32)
QUANTA_DOMAIN = "quanta"

#: op_type -> how many calls a native kernel handed to the reference twin at run time.
RUNTIME_FALLBACKS: collections.Counter[str] = collections.Counter()


class _Unsupported(Exception):
    """A run-time input outside the native path: the call goes to the reference twin."""


def _f32(a: Any) -> np.ndarray:
    if not isinstance(a, np.ndarray) or a.dtype != F32:
        raise _Unsupported
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


#: The keyword arguments a binder adds to the node's attributes (Kernel.params).
_PARAMS = frozenset(
    {"packed", "wshape", "geometry", "b_packed", "n", "const_bias", "bias_col", "clamp", "post", "fold"}
)


def _with_fallback(op_type: str, domain: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrap ``fast(ctx, *inputs, out=..., **attrs, **params)``: when it raises
    _Unsupported (or the binding refuses the arguments with ValueError) the reference
    twin runs the call with the node's attributes."""

    def deco(fast: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fast)
        def kernel(ctx: Any, *inputs: Any, out: np.ndarray | None = None, **kw: Any):
            try:
                return fast(ctx, *inputs, out=out, **kw)
            except (_Unsupported, ValueError):
                pass
            RUNTIME_FALLBACKS[f"{domain}::{op_type}" if domain else op_type] += 1
            y = get_op(op_type, domain)(ctx, *inputs, **{k: v for k, v in kw.items() if k not in _PARAMS})
            if out is None:
                return y
            np.copyto(out, y)
            return out

        return kernel

    return deco


def _dtype(v: Value | None) -> np.dtype | None:
    c = _constant(v)
    return c.dtype if c is not None else value_dtype(v)


def _constant(v: Value | None) -> np.ndarray | None:
    """A value's constant: an initializer, or the tensor of the Constant node producing it
    (a float graph runs as loaded, so Paddle's Constant-node weights are still nodes)."""
    if v is None:
        return None
    if v.const is not None:
        return np.asarray(v.const)
    p = v.producer
    if (
        p is not None
        and p.op_type == "Constant"
        and p.domain == ""
        and isinstance(p.attrs.get("value"), np.ndarray)
    ):
        return p.attrs["value"]
    return None


def _not_f32(op: str, *named: tuple[str, Value | None]) -> str:
    """Why a named value is known not to be float32, or "" (unknown types pass: the
    kernel checks at run time)."""
    for name, v in named:
        dt = _dtype(v)
        if dt is not None and dt != F32:
            return f"native float {op} takes float32 {name}, got {dt}"
    return ""


def _kernel(fn: Callable[..., Any], name: str, **params: Any) -> tuple[Kernel, str]:
    return Kernel(fn, "native", f"native:{name}", params=params, out=True), ""


# --------------------------------------------------------------------------------------
# Conv
# --------------------------------------------------------------------------------------


def _conv_path(w: np.ndarray, group: int, attrs: dict[str, Any]) -> str:
    """The path conv_f32 takes for these weights (sgemm.h conv_path), for the kernel name."""
    spatial = w.ndim - 2
    if is_depthwise(group, w.shape):
        return "dw"
    ones = [1] * spatial
    if (
        list(w.shape[2:]) == ones
        and not any(attrs.get("pads") or [0])
        and attrs.get("auto_pad", "NOTSET") in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")
    ):
        # strided: the pointwise product on the subsampled plane (sgemm.cc conv)
        return "pointwise" if list(attrs.get("strides") or ones) == ones else "pointwise_strided"
    return "im2col"


def _conv_native(
    ctx: OpContext,
    x: Any,
    w: Any,
    b: Any = None,
    *,
    out: np.ndarray | None,
    packed: np.ndarray,
    wshape: tuple[int, ...],
    geometry: dict[tuple[int, ...], Any],
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    clamp: tuple[float, float] = (-math.inf, math.inf),
    post: tuple[int, list[float]] = (0, []),
    activation: str = "",
    activation_params: list[float] | None = None,
) -> np.ndarray:
    del w, activation, activation_params  # packed at compile time; clamp / post hold the activation
    x = _f32(x)
    call = geometry.get(x.shape)
    if call is None:
        if x.ndim != len(wshape) or x.shape[1] != wshape[1] * group:
            raise _Unsupported
        g = conv_attrs(
            x.shape,
            wshape[2:],
            kernel_shape=kernel_shape,
            strides=strides,
            dilations=dilations,
            pads=pads,
            auto_pad=auto_pad,
        )
        if x.ndim == 3:  # 1-D: run as H = 1
            x4_shape = (x.shape[0], x.shape[1], 1, x.shape[2])
            args = (1, wshape[2], [1, g.strides[0]], [1, g.dilations[0]], [0, g.pads[0], 0, g.pads[1]])
        else:
            x4_shape = x.shape
            args = (wshape[2], wshape[3], list(g.strides), list(g.dilations), list(g.pads))
        y4_shape = (x.shape[0], wshape[0], g.out_shape[0] if x.ndim == 4 else 1, g.out_shape[-1])
        call = geometry[x.shape] = (x4_shape, args, (x.shape[0], wshape[0], *g.out_shape), y4_shape)
    x4_shape, args, y_shape, y4_shape = call
    bias = None if b is None else _f32(b)
    if out is None:
        out = np.empty(y_shape, F32)
    _native.conv_f32(
        x.reshape(x4_shape),
        packed,
        bias,
        wshape[0],
        *args,
        group,
        lo=clamp[0],
        hi=clamp[1],
        num_threads=_threads(ctx),
        out=out.reshape(y4_shape),
        post=post[0],
        post_params=post[1],
    )
    return out


_conv_plain = _with_fallback("Conv")(_conv_native)
_conv_fused = _with_fallback("Conv", QUANTA_DOMAIN)(_conv_native)


def _conv3d_native(
    ctx: OpContext,
    x: Any,
    w: Any,
    b: Any = None,
    *,
    out: np.ndarray | None,
    packed: np.ndarray,
    fold: DepthFold,
    clamp: tuple[float, float] = (-math.inf, math.inf),
    post: tuple[int, list[float]] = (0, []),
    **attrs: Any,
) -> np.ndarray:
    """A 3-D Conv as one 2-D ``conv_f32`` over its depth windows (conv3d.py, eq. (C3));
    the fused clamp and gate act per output element, so they carry over."""
    del w, attrs  # packed at compile time; the geometry is the fold's
    x = _f32(x)
    g = fold.geometry(x.shape)
    y4 = _native.conv_f32(
        fold.windows(x, g, 0.0),
        packed,
        None if b is None else _f32(b),
        fold.wshape[0],
        fold.wshape[3],
        fold.wshape[4],
        list(g.strides[1:]),
        list(g.dilations[1:]),
        [g.pads[1], g.pads[2], g.pads[4], g.pads[5]],
        fold.group,
        lo=clamp[0],
        hi=clamp[1],
        num_threads=_threads(ctx),
        post=post[0],
        post_params=post[1],
    )
    return DepthFold.unfold(y4, fold.out_shape(x.shape, g), out)


_conv3d_plain = _with_fallback("Conv")(_conv3d_native)
_conv3d_fused = _with_fallback("Conv", QUANTA_DOMAIN)(_conv3d_native)


@register_binder("Conv")
def bind_conv(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """Float Conv (1-D, 2-D or 3-D) with constant float32 weights."""
    del model  # unused: the choice depends on the node alone
    return _bind_conv(node, _conv_plain, None)


@register_binder("Conv", QUANTA_DOMAIN)
def bind_fused_conv(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta::Conv (a float Conv with the activation after it fused): a Relu / Clip
    clamps in the GEMM / depthwise store (sgemm.h epilogue), a gated activation (SiLU,
    HardSwish, HardSigmoid, Paddle's hardswish, LeakyRelu [+ Max]) runs on each finished task block (sgemm.h
    PostOp): no second pass over the output."""
    del model  # unused
    activation = str(node.attrs.get("activation", "Relu"))
    params = node.attrs.get("activation_params")
    if activation in FUSED_GATES:
        p = [float(v) for v in (params or [])]
        if len(p) != FUSED_GATES[activation]:
            return None, f"activation {activation} takes {FUSED_GATES[activation]} activation_params, got {p}"
        return _bind_conv(node, _conv_fused, (-math.inf, math.inf), (POST_KINDS[activation], p))
    try:
        clamp = fused_clamp_bounds(activation, params)
    except OpError as e:
        return None, str(e)
    return _bind_conv(node, _conv_fused, (float(np.float32(clamp[0])), float(np.float32(clamp[1]))))


#: sgemm.h PostKind of each gated activation of quanta::Conv
POST_KINDS = {"SiLU": 1, "HardSwish": 2, "HardSigmoid": 3, "ClipMulDiv": 4, "LeakyRelu": 5}


def _bind_conv(
    node: Node,
    fn: Callable[..., Any],
    clamp: tuple[float, float] | None,
    post: tuple[int, list[float]] = (0, []),
) -> tuple[Kernel | None, str]:
    if _native is None:
        return None, "the native extension is not built"
    x, w, b = node.input(0), node.input(1), node.input(2)
    reason = _not_f32("Conv", ("x", x), ("w", w), ("B", b))
    if reason:
        return None, reason
    wc = _constant(w)
    if wc is None:
        return None, "weights w are not a constant (the native kernel packs them at compile time)"
    if wc.ndim not in (3, 4, 5):
        return None, f"native float Conv takes 1-D, 2-D or 3-D weights (rank 3, 4 or 5), got rank {wc.ndim}"
    group = int(node.attrs.get("group", 1))
    if group < 1 or wc.shape[0] % group:
        return None, f"group {group} does not divide the {wc.shape[0]} output channels"
    if wc.ndim == 5:
        return _bind_conv3d(node, wc, group, fn is _conv_fused, clamp, post)
    w4 = wc.reshape(wc.shape[0], wc.shape[1], 1, wc.shape[2]) if wc.ndim == 3 else wc
    try:
        packed = _native.conv_pack_f32(np.ascontiguousarray(w4, dtype=F32), group)
    except ValueError as e:
        return None, f"the native kernel refuses the weights: {e}"
    path = _conv_path(wc, group, node.attrs)
    k = "x".join(str(v) for v in wc.shape[2:])
    if post[0]:
        act = str(node.attrs.get("activation")).lower()
        kernel, reason = _kernel(
            fn,
            f"conv_f32_{path}_{k}_{act}",
            packed=packed,
            wshape=tuple(wc.shape),
            geometry={},
            clamp=clamp,
            post=post,
        )
    elif clamp is None:
        kernel, reason = _kernel(
            fn, f"conv_f32_{path}_{k}", packed=packed, wshape=tuple(wc.shape), geometry={}
        )
    else:
        kernel, reason = _kernel(
            fn, f"conv_f32_{path}_{k}_clamp", packed=packed, wshape=tuple(wc.shape), geometry={}, clamp=clamp
        )
    # a call the specialised path refuses goes to this binder's kernel (with its fallback)
    kernel.specialize = functools.partial(_conv_specialized, generic=fn)
    return kernel, reason


def _bind_conv3d(
    node: Node,
    wc: np.ndarray,
    group: int,
    fused: bool,
    clamp: tuple[float, float] | None,
    post: tuple[int, list[float]],
) -> tuple[Kernel | None, str]:
    """A 3-D float Conv: its weights folded and packed as the 2-D Conv of conv3d.py."""
    try:
        fold = DepthFold.of(tuple(wc.shape), node.attrs)
        packed = _native.conv_pack_f32(fold.weights_2d(wc.astype(F32, copy=False)), group)
    except ValueError as e:
        return None, f"the native kernel refuses the weights: {e}"
    k = "x".join(str(v) for v in wc.shape[2:])
    suffix = f"_{str(node.attrs.get('activation')).lower()}" if post[0] else "_clamp" if clamp else ""
    params: dict[str, Any] = {"packed": packed, "fold": fold}
    if clamp is not None:
        params.update(clamp=clamp, post=post)
    return _kernel(_conv3d_fused if fused else _conv3d_plain, f"conv3d_f32_depthfold_{k}{suffix}", **params)


def _conv_specialized(
    sig: Specialization,
    *,
    packed: np.ndarray,
    wshape: tuple[int, ...],
    geometry: dict,
    group: int = 1,
    clamp: tuple[float, float] = (-math.inf, math.inf),
    post: tuple[int, list[float]] = (0, []),
    generic: Callable[..., Any] = _conv_plain,
    **attrs: Any,
) -> Callable[..., Any] | None:
    """The float Conv of one x shape, with a constant bias: the geometry the measuring
    run found, the reshapes and the thread count decided once (a layer under
    SMALL_MACS multiply-adds on one thread); a fused clamp stays in the store."""
    shape = sig.shapes[0]
    call = geometry.get(shape) if shape is not None else None
    if call is None or sig.dtypes[0] != F32:
        return None
    if len(sig.shapes) > 2 and sig.shapes[2] is not None and sig.consts[2] is None:
        return None  # a bias computed at run time
    bias_c = sig.consts[2] if len(sig.consts) > 2 else None
    bias = None if bias_c is None else _f32(bias_c)
    x4_shape, args, y_shape, _ = call
    threads = step_threads(sig, math.prod(y_shape) * math.prod(wshape[1:]), SMALL_MACS)
    m, out = wshape[0], sig.out
    lo, hi = clamp
    pk, pp = post
    # A convolution on a small plane runs with its pixels as the GEMM's rows when that
    # fills more lanes (sgemm.h kPointwiseRows, kIm2colRows; the same bytes): its weights
    # packed once more, for this shape.
    w_const = sig.consts[1] if len(sig.consts) > 1 else None
    rows = (
        w_const is not None
        and group == 1
        and _native.conv_path_f32(np.empty(x4_shape, F32), m, *args, group, rows=True)
        in ("pointwise_rows", "im2col_rows")
    )
    w_run = (
        _native.conv_pack_f32(_f32(w_const).reshape(wshape[0], -1, 1, 1), 1, rows=True) if rows else packed
    )

    # conv_f32 with everything but x bound once (sgemm's ConvF32Call: conv_f32's own
    # call, its bytes), which the fast loop calls directly: no Python frame, no reshapes,
    # no argument parsing (conv_f32's seventeen arguments cost ~1 us, as long as a
    # 12K-MAC convolution)
    conv = _native.ConvF32Call(
        shape, x4_shape, y_shape, w_run, bias, m, *args, group, lo, hi, threads, out, pk, pp, rows
    )
    generic_attrs = {
        "packed": packed,
        "wshape": wshape,
        "geometry": geometry,
        "group": group,
        "clamp": clamp,
        "post": post,
        **attrs,
    }
    run = guarded(lambda x, *rest: conv(x), generic, generic_attrs, out, reads=1, recordable=True)
    run.direct = conv  # type: ignore[attr-defined]  # reads x alone (reads=1)
    return run


# --------------------------------------------------------------------------------------
# ConvTranspose
# --------------------------------------------------------------------------------------


@_with_fallback("ConvTranspose")
def _conv_transpose_native(
    ctx: OpContext,
    x: Any,
    w: Any,
    b: Any = None,
    *,
    out: np.ndarray | None,
    packed: np.ndarray,
    wshape: tuple[int, ...],
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    output_padding: list[int] | None = None,
    output_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    del w  # packed at compile time
    x = _f32(x)
    if x.ndim != 4 or x.shape[1] != wshape[0]:
        raise _Unsupported
    bias = None if b is None else _f32(b)
    m, strides_, dilations_, full, begin, out_sp = conv_transpose_geometry(
        x.shape,
        wshape,
        auto_pad=auto_pad,
        dilations=dilations,
        group=group,
        kernel_shape=kernel_shape,
        output_padding=output_padding,
        output_shape=output_shape,
        pads=pads,
        strides=strides,
    )
    kernel = list(wshape[2:])
    rows = m * math.prod(kernel)
    # cols[n, (m, ky, kx), i] = Σ_c w[g·C/G + c, m, ky, kx] · x[n, g·C/G + c, i]: a 1x1 conv
    cols = _native.conv_f32(
        x, packed, None, rows, 1, 1, [1, 1], [1, 1], [0, 0, 0, 0], group, num_threads=_threads(ctx)
    )
    del full  # the gather reads zero past the canvas
    if bias is not None and bias.size != m:
        raise _Unsupported
    return _native.col2im_f32(
        cols,
        m,
        kernel[0],
        kernel[1],
        list(strides_),
        list(dilations_),
        list(begin),
        list(out_sp),
        bias,
        num_threads=_threads(ctx),
        out=out,
    )


@_with_fallback("ConvTranspose")
def _conv_transpose3d_native(
    ctx: OpContext,
    x: Any,
    w: Any,
    b: Any = None,
    *,
    out: np.ndarray | None,
    packed: np.ndarray,
    wshape: tuple[int, ...],
    group: int = 1,
    **attrs: Any,
) -> np.ndarray:
    """A 3-D ConvTranspose: the 1x1 product of every input position (its planes laid end
    to end: a pointwise product ignores the layout), then per kernel depth k_d the 2-D
    col2im of those columns with the input depths as the batch, added into the output
    depths o_d = i_d·s_d + k_d·d_d − begin_d it reaches; the bias once at the end. Within
    (FG1) with K = C/G + KD·KH·KW + 1."""
    del w  # packed at compile time
    x = _f32(x)
    if x.ndim != 5 or x.shape[1] != wshape[0]:
        raise _Unsupported
    bias = None if b is None else _f32(b)
    m, strides_, dilations_, _, begin, out_sp = conv_transpose_geometry(x.shape, wshape, group=group, **attrs)
    if bias is not None and bias.size != m:
        raise _Unsupported
    n, _, d, h, wd = x.shape
    kd, kh, kw = wshape[2:]
    threads = _threads(ctx)
    cols = _native.conv_f32(
        x.reshape(n, x.shape[1], d * h, wd),
        packed,
        None,
        m * kd * kh * kw,
        1,
        1,
        [1, 1],
        [1, 1],
        [0, 0, 0, 0],
        group,
        num_threads=threads,
    ).reshape(n, m, kd, kh * kw, d, h, wd)
    y = np.zeros((n, m, *out_sp), F32) if out is None else out
    if out is not None:
        y.fill(0)
    for k in range(kd):
        planes = np.ascontiguousarray(cols[:, :, k].transpose(0, 3, 1, 2, 4, 5)).reshape(
            n * d, m * kh * kw, h, wd
        )
        y2 = _native.col2im_f32(
            planes,
            m,
            kh,
            kw,
            list(strides_[1:]),
            list(dilations_[1:]),
            list(begin[1:]),
            list(out_sp[1:]),
            None,
            num_threads=threads,
        ).reshape(n, d, m, *out_sp[1:])
        od = np.arange(d) * strides_[0] + k * dilations_[0] - begin[0]
        keep = (od >= 0) & (od < out_sp[0])
        y[:, :, od[keep]] += y2[:, keep].transpose(0, 2, 1, 3, 4)
    if bias is not None:
        y += bias.reshape(1, m, 1, 1, 1)
    return y


def _conv_transpose_specialized(
    sig: Specialization, *, packed: np.ndarray, wshape: tuple[int, ...], **attrs: Any
) -> Callable[..., Any] | None:
    """The float ConvTranspose of one x shape, with a constant bias or none: the geometry
    found once, the 1x1 product a bound ConvF32Call, col2im called by position (gtcrn's
    two [1, 16, 1, 33] -> [1, 16, 1, 65] upsamplings of 10-20K multiply-adds spent ~10 us
    each in the generic kernel's geometry and argument parsing)."""
    shape = sig.shapes[0]
    if shape is None or len(shape) != 4 or sig.dtypes[0] != F32 or shape[1] != wshape[0]:
        return None
    if len(sig.shapes) > 2 and sig.shapes[2] is not None and sig.consts[2] is None:
        return None  # a bias computed at run time
    bias_c = sig.consts[2] if len(sig.consts) > 2 else None
    geometry_attrs = {k: v for k, v in attrs.items() if k != "group"}
    group = int(attrs.get("group", 1))
    m, strides_, dilations_, _, begin, out_sp = conv_transpose_geometry(
        shape, wshape, group=group, **geometry_attrs
    )
    bias = None if bias_c is None else _f32(bias_c)
    if bias is not None and bias.size != m:
        return None
    kh, kw = wshape[2], wshape[3]
    rows = m * kh * kw
    cols_shape = (shape[0], rows, shape[2], shape[3])
    threads = step_threads(sig, math.prod(shape) * rows // group, SMALL_MACS)
    inf, out = math.inf, sig.out
    cols_of = _native.ConvF32Call(
        shape,
        shape,
        cols_shape,
        packed,
        None,
        rows,
        1,
        1,
        [1, 1],
        [1, 1],
        [0, 0, 0, 0],
        group,
        -inf,
        inf,
        threads,
    )
    col2im = _native.col2im_f32
    strides_l, dilations_l, begin_l, out_l = list(strides_), list(dilations_), list(begin), list(out_sp)

    def run(x: np.ndarray, *rest: Any) -> np.ndarray:
        return col2im(
            cols_of(x), m, kh, kw, strides_l, dilations_l, begin_l, out_l, bias, -inf, inf, threads, out
        )

    generic_attrs = {"packed": packed, "wshape": wshape, **attrs}
    return guarded(run, _conv_transpose_native, generic_attrs, out, reads=1)


@register_binder("ConvTranspose")
def bind_conv_transpose(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """Float 2-D or 3-D ConvTranspose with constant float32 weights."""
    del model  # unused
    if _native is None:
        return None, "the native extension is not built"
    x, w, b = node.input(0), node.input(1), node.input(2)
    reason = _not_f32("ConvTranspose", ("x", x), ("w", w), ("B", b))
    if reason:
        return None, reason
    wc = _constant(w)
    if wc is None:
        return None, "weights w are not a constant (the native kernel packs them at compile time)"
    if wc.ndim not in (4, 5):
        return None, f"native float ConvTranspose takes 2-D or 3-D weights (rank 4 or 5), got rank {wc.ndim}"
    group = int(node.attrs.get("group", 1))
    c, mg = wc.shape[0], wc.shape[1]
    if group < 1 or c % group:
        return None, f"group {group} does not divide the {c} input channels"
    kk = math.prod(wc.shape[2:])
    # Per group the transposed weights (Mg·kh·kw) × (C/G), as a 1x1 conv's [rows, C/G, 1, 1].
    wt = wc.reshape(group, c // group, mg * kk).transpose(0, 2, 1).reshape(group * mg * kk, c // group, 1, 1)
    try:
        packed = _native.conv_pack_f32(np.ascontiguousarray(wt, dtype=F32), group)
    except ValueError as e:
        return None, f"the native kernel refuses the weights: {e}"
    k = "x".join(str(v) for v in wc.shape[2:])
    if wc.ndim == 5:
        return _kernel(
            _conv_transpose3d_native, f"conv_transpose3d_f32_{k}", packed=packed, wshape=tuple(wc.shape)
        )
    kernel, reason = _kernel(
        _conv_transpose_native, f"conv_transpose_f32_{k}", packed=packed, wshape=tuple(wc.shape)
    )
    kernel.specialize = _conv_transpose_specialized
    return kernel, reason


# --------------------------------------------------------------------------------------
# MatMul, Gemm
# --------------------------------------------------------------------------------------


@_with_fallback("MatMul")
def _matmul_native(
    ctx: OpContext, a: Any, b: Any, *, out: np.ndarray | None, b_packed: np.ndarray | None = None, n: int = 0
) -> np.ndarray:
    a = _f32(a)
    if b_packed is not None:
        if a.ndim == 0:
            raise _Unsupported
        if a.ndim == 1:  # (K,) @ (K, N) -> (N,)
            y = _native.matmul_f32(a.reshape(1, -1), None, b_packed, n, num_threads=_threads(ctx))
            y = y.reshape(n)
            if out is None:
                return y
            np.copyto(out, y)
            return out
        a2 = a if a.ndim >= 2 else a.reshape(1, -1)
        o = None if out is None else out.reshape(*a2.shape[:-1], n)
        y = _native.matmul_f32(a2, None, b_packed, n, num_threads=_threads(ctx), out=o)
        return y if out is None else out
    b = _f32(b)
    if a.ndim < 2 or b.ndim < 2:
        raise _Unsupported
    y = _native.matmul_f32(a, b, num_threads=_threads(ctx), out=out)
    return y if out is None else out


@register_binder("MatMul")
def bind_matmul(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """Float MatMul: a constant 2-D B is packed once; otherwise both operands at run time."""
    del model  # unused
    if _native is None:
        return None, "the native extension is not built"
    a, b = node.input(0), node.input(1)
    reason = _not_f32("MatMul", ("A", a), ("B", b))
    if reason:
        return None, reason
    bconst = _constant(b)
    if bconst is not None and bconst.ndim == 2 and bconst.dtype == F32:
        bc = np.ascontiguousarray(bconst)
        packed = _native.sgemm_pack_b(bc)
        kernel, reason = _kernel(_matmul_native, "matmul_f32_packed", b_packed=packed, n=int(bc.shape[1]))
        kernel.specialize = _matmul_specialized
        return kernel, reason
    kernel, reason = _kernel(_matmul_native, "matmul_f32")
    kernel.specialize = _matmul_runtime_specialized
    return kernel, reason


def _matmul_runtime_specialized(sig: Specialization) -> Callable[..., Any] | None:
    """The MatMul of two run-time operands (attention's Q·Kᵀ and P·V) of one pair of
    shapes, both of rank >= 2: ``matmul_f32`` called by position into the planned output
    (a 4-head encoder's [1, 4, 6, 32] x [1, 4, 32, 6] product cost ~2.5 us a step, about
    half of it the generic call's checks). A non-contiguous operand: the binding's
    ValueError hands the call to the generic kernel, which copies it."""
    (sa, sb), (da, db) = sig.shapes, sig.dtypes
    if sa is None or sb is None or len(sa) < 2 or len(sb) < 2 or da != F32 or db != F32:
        return None
    threads = step_threads(sig, math.prod(sa) * sb[-1], SMALL_MACS)
    matmul, out = _native.matmul_f32, sig.out
    inf = math.inf

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return matmul(a, b, None, 0, None, 1.0, -inf, inf, threads, out)

    return guarded(run, _matmul_native, {}, out, recordable=True)


def _matmul_specialized(sig: Specialization, *, b_packed: np.ndarray, n: int) -> Callable[..., Any] | None:
    """The MatMul of one A shape (rank >= 2) by a packed B: _matmul_native's one
    ``matmul_f32`` call with its output view and thread count decided once, passed by
    position (gtcrn's twelve [1, 1, 16] x [16, 8] and [1, 33, 16] x [16, 16] products
    paid ~3 us each of Python around a call of a few hundred ns). A non-contiguous A: the
    binding's ValueError hands the call to the generic kernel, which copies it."""
    return _packed_call(sig, b_packed, n, None, _matmul_native, {"b_packed": b_packed, "n": n})


def _packed_call(
    sig: Specialization,
    b_packed: np.ndarray,
    n: int,
    bias_col: np.ndarray | None,
    generic: Callable[..., Any],
    generic_attrs: dict[str, Any],
) -> Callable[..., Any] | None:
    """One ``matmul_f32`` call of a packed B (and a bias column added in its store) by
    position into the planned output, for MatMul and quanta::MatMulBias."""
    shape = sig.shapes[0]
    if shape is None or len(shape) < 2 or sig.dtypes[0] != F32:
        return None
    threads = step_threads(sig, math.prod(shape) * n, SMALL_MACS)
    matmul, out = _native.matmul_f32, sig.out
    inf = math.inf
    target = None if out is None else out.reshape(*shape[:-1], n)

    def run(a: np.ndarray, *rest: Any) -> np.ndarray:
        y = matmul(a, None, b_packed, n, bias_col, 1.0, -inf, inf, threads, target)
        return y if out is None else out

    return guarded(run, generic, generic_attrs, out, reads=1, recordable=True)


@_with_fallback("MatMulBias", QUANTA_DOMAIN)
def _matmul_bias_native(
    ctx: OpContext,
    a: Any,
    w: Any,
    bias: Any,
    *,
    out: np.ndarray | None,
    b_packed: np.ndarray,
    n: int,
    bias_col: np.ndarray,
) -> np.ndarray:
    a = _f32(a)
    if a.ndim < 2:
        raise _Unsupported
    y = _native.matmul_f32(a, None, b_packed, n, bias=bias_col, num_threads=_threads(ctx), out=out)
    return y if out is None else out


@register_binder("MatMulBias", QUANTA_DOMAIN)
def bind_matmul_bias(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta::MatMulBias (passes/rules/fuse_matmul_bias.py): the packed weight's GEMM
    with the bias added in its store."""
    del model  # unused
    if _native is None:
        return None, "the native extension is not built"
    a, w, bias = node.input(0), node.input(1), node.input(2)
    reason = _not_f32("MatMulBias", ("A", a), ("W", w), ("bias", bias))
    if reason:
        return None, reason
    wc, bc = _constant(w), _constant(bias)
    if wc is None or wc.ndim != 2 or wc.dtype != F32 or bc is None or bc.shape != (wc.shape[1],):
        return None, "native MatMulBias takes a constant float32 W [K, N] and bias [N]"
    n = int(wc.shape[1])
    packed = _native.sgemm_pack_b(np.ascontiguousarray(wc))
    bias_col = np.ascontiguousarray(bc, dtype=F32)
    kernel, reason = _kernel(_matmul_bias_native, "matmul_bias_f32", b_packed=packed, n=n, bias_col=bias_col)
    kernel.specialize = _matmul_bias_specialized
    return kernel, reason


def _matmul_bias_specialized(
    sig: Specialization, *, b_packed: np.ndarray, n: int, bias_col: np.ndarray
) -> Callable[..., Any] | None:
    """The MatMulBias of one A shape (rank >= 2): :func:`_matmul_specialized`'s call with
    the bias column."""
    generic = {"b_packed": b_packed, "n": n, "bias_col": bias_col}
    return _packed_call(sig, b_packed, n, bias_col, _matmul_bias_native, generic)


def _gemm_bias(
    c: np.ndarray | None, beta: float, m: int, n: int
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(column bias [N], full addend [M, N]) for β·C: one of them, or neither (no C, or
    β = 0). The column bias is f32(β·C) broadcast to N."""
    if c is None or beta == 0.0:
        return None, None
    cc = np.asarray(c, dtype=F32)
    scaled = cc if beta == 1.0 else (np.float32(beta) * cc).astype(F32)
    if cc.size == 1 or (cc.ndim >= 1 and cc.shape[-1] == n and math.prod(cc.shape[:-1]) == 1):
        return np.ascontiguousarray(np.broadcast_to(scaled.reshape(-1), (n,)), dtype=F32), None
    return None, scaled


@_with_fallback("Gemm")
def _gemm_native(
    ctx: OpContext,
    a: Any,
    b: Any,
    c: Any = None,
    *,
    out: np.ndarray | None,
    b_packed: np.ndarray | None = None,
    n: int = 0,
    const_bias: tuple[np.ndarray | None, np.ndarray | None] | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    transA: int = 0,
    transB: int = 0,
) -> np.ndarray:
    a = _f32(a)
    if a.ndim != 2:
        raise _Unsupported
    a2 = np.ascontiguousarray(a.T) if transA else a
    m = a2.shape[0]
    if b_packed is None:
        b = _f32(b)
        if b.ndim != 2:
            raise _Unsupported
        b2 = np.ascontiguousarray(b.T) if transB else b
        n = b2.shape[1]
    if const_bias is not None:
        col, full = const_bias
    else:
        if c is not None:
            c = _f32(c)
            try:
                np.broadcast_shapes(c.shape, (m, n))
            except ValueError:
                raise _Unsupported from None
        col, full = _gemm_bias(c, float(beta), m, n)
    if full is not None and full.shape != (m, n):
        try:
            full = np.broadcast_to(full, (m, n))
        except ValueError:
            raise _Unsupported from None
    alpha32 = float(np.float32(alpha))
    if b_packed is not None:
        y = _native.matmul_f32(
            a2, None, b_packed, n, bias=col, alpha=alpha32, num_threads=_threads(ctx), out=out
        )
    else:
        y = _native.matmul_f32(a2, b2, bias=col, alpha=alpha32, num_threads=_threads(ctx), out=out)
    if full is not None:
        np.add(y, full, out=y)
    return y


@register_binder("Gemm")
def bind_gemm(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """Float Gemm: transA / transB, α, β and C (constant C folded at compile time)."""
    del model  # unused
    if _native is None:
        return None, "the native extension is not built"
    a, b, c = node.input(0), node.input(1), node.input(2)
    reason = _not_f32("Gemm", ("A", a), ("B", b), ("C", c))
    if reason:
        return None, reason
    params: dict[str, Any] = {}
    name = "gemm_f32"
    bconst = _constant(b)
    if bconst is not None and bconst.ndim == 2:
        bc = np.ascontiguousarray(bconst, dtype=F32)
        trans_b = bool(node.attrs.get("transB", 0))
        params["b_packed"] = _native.sgemm_pack_b(bc, trans=trans_b)
        params["n"] = int(bc.shape[0] if trans_b else bc.shape[1])
        name = "gemm_f32_packed"
        a_shape = None if a is None or a.type is None else getattr(a.type, "shape", None)
        cc = _constant(c)
        if cc is not None and a_shape is not None and len(a_shape) == 2:
            m = a_shape[1] if node.attrs.get("transA", 0) else a_shape[0]
            if isinstance(m, int) and cc.ndim <= 2:
                try:
                    np.broadcast_shapes(cc.shape, (m, params["n"]))
                    params["const_bias"] = _gemm_bias(cc, float(node.attrs.get("beta", 1.0)), m, params["n"])
                except ValueError:
                    pass
    kernel, reason = _kernel(_gemm_native, name, **params)
    if "b_packed" in params:
        kernel.specialize = _gemm_specialized
    return kernel, reason


def _gemm_specialized(
    sig: Specialization,
    *,
    b_packed: np.ndarray,
    n: int,
    const_bias: tuple[np.ndarray | None, np.ndarray | None] | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    transA: int = 0,
    transB: int = 0,
) -> Callable[..., Any] | None:
    """The Gemm of one A shape with a packed B and a constant C (or none) that is a
    column bias: _gemm_native's one ``matmul_f32`` call with its arguments decided once,
    passed by position (a recurrent cell's two [1, 128] x [128, 512] products paid ~3.5
    us each of Python around a ~2.5 us call). A full (M, N) C or a transposed A keep the
    generic call."""
    shape = sig.shapes[0]
    if shape is None or len(shape) != 2 or sig.dtypes[0] != F32 or transA:
        return None
    m, k = shape
    if const_bias is not None:
        col, full = const_bias
    elif len(sig.shapes) > 2 and sig.shapes[2] is not None:
        c = sig.consts[2]
        if c is None or c.dtype != F32:
            return None  # a C computed at run time
        np.broadcast_shapes(c.shape, (m, n))  # a ValueError: no specialization
        col, full = _gemm_bias(c, float(beta), m, n)
    else:
        col, full = None, None
    if full is not None:
        return None
    alpha32 = float(np.float32(alpha))
    threads = step_threads(sig, m * n * k, SMALL_MACS)
    matmul, out = _native.matmul_f32, sig.out
    inf = math.inf

    def run(a: np.ndarray, *rest: Any) -> np.ndarray:
        return matmul(a, None, b_packed, n, col, alpha32, -inf, inf, threads, out)

    generic_attrs = {
        "b_packed": b_packed,
        "n": n,
        "const_bias": const_bias,
        "alpha": alpha,
        "beta": beta,
        "transA": transA,
        "transB": transB,
    }
    return guarded(run, _gemm_native, generic_attrs, out, reads=1, recordable=True)
