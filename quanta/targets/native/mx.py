"""Native MX kernels (kernels/cpp/mx): run-time QuantizeMX, MX GEMM and MX convolution.

- the binder of ``quanta::QuantizeMX`` runs the native quantizer (the INT8 one is
  vectorized) on the block axis moved last, bit-exact with
  :func:`quanta.kernels.reference.mx.quantize_mx_op`;
- :func:`mx_matmul` / :func:`mx_conv`: float32 activations quantized at run time times
  packed MX weights, bit-exact with ``reference.mx.mx_gemm`` / ``mx_conv`` (the
  convolution is im2col, ``reference.mx.im2col_mx``, onto the native GEMM: eq. (MX7)).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels.reference import mx as mxref
from quanta.kernels.reference.registry import OpError
from quanta.targets.base import Kernel
from quanta.targets.native import register_binder

__all__ = [
    "bind_matmul_mx",
    "bind_quantize_mx",
    "mx_conv",
    "mx_matmul",
    "pack_mx_weights",
    "quantize_mx_native",
]

QUANTA_DOMAIN = "quanta"


def quantize_mx_native(
    x: np.ndarray, fmt: str, axis: int = -1, block: int = 32, num_threads: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """``reference.mx.quantize_mx`` (OCP mode) through the native kernel: (elements in the
    format's dtype, OCP E8M0 codes as ml_dtypes float8_e8m0fnu)."""
    from quanta.kernels import _native

    f = mxref.mx_format(fmt)
    x = np.asarray(x, np.float32)
    ax = axis % x.ndim
    xm = np.moveaxis(x, ax, -1)
    shape = xm.shape
    x2 = np.ascontiguousarray(xm.reshape(-1, shape[-1]))
    bits, codes = _native.mx_quantize(x2, f.name, block, num_threads=num_threads)
    el = bits.reshape(shape).view(np.int8 if f.is_int else f.dtype)
    sc = codes.reshape((*shape[:-1], codes.shape[-1])).view(mxref.E8M0)
    return np.ascontiguousarray(np.moveaxis(el, -1, ax)), np.ascontiguousarray(np.moveaxis(sc, -1, ax))


def pack_mx_weights(elements: np.ndarray, codes: np.ndarray, fmt: str, block: int = 32) -> Any:
    """Pack B [K, N] (blocked along K, OCP codes [nb, N]) for :func:`mx_matmul`."""
    from quanta.kernels import _native

    f = mxref.mx_format(fmt)
    return _native.mx_pack_weights(
        np.ascontiguousarray(elements).view(np.uint8),
        np.ascontiguousarray(codes).view(np.uint8),
        f.name,
        block,
    )


def mx_matmul(
    x: np.ndarray, x_fmt: str, packed: Any, bias: np.ndarray | None = None, num_threads: int = 1
) -> np.ndarray:
    """x [M, K] float32, MX-quantized along K at run time, times packed MX weights."""
    from quanta.kernels import _native

    f = mxref.mx_format(x_fmt)
    bits, codes = _native.mx_quantize(
        np.ascontiguousarray(x, np.float32), f.name, packed.block, num_threads=num_threads
    )
    b = None if bias is None else np.ascontiguousarray(bias, np.float32)
    return _native.mx_gemm(bits, codes, f.name, packed, b, num_threads=num_threads)


def mx_conv(
    x: np.ndarray,
    x_fmt: str,
    w_elements: np.ndarray,
    w_codes: np.ndarray,
    block: int = 32,
    bias: np.ndarray | None = None,
    pads: tuple[int, int, int, int] = (0, 0, 0, 0),
    strides: tuple[int, int] = (1, 1),
    dilations: tuple[int, int] = (1, 1),
    num_threads: int = 1,
) -> np.ndarray:
    """2-D convolution (group 1): x [N, C, H, W] float32 MX-quantized along C at run time,
    w MX elements [O, C, kh, kw] blocked along C with OCP codes; eq. (MX7)."""
    from quanta.kernels import _native

    w_fmt = _fmt_of(w_elements)
    xe, xs = quantize_mx_native(x, x_fmt, axis=1, block=block, num_threads=num_threads)
    a, a_s, (OH, OW) = mxref.im2col_mx(xe, xs, w_elements.shape[2:], pads, strides, dilations, block)
    bm, b_s = mxref.weights_to_gemm_mx(w_elements, w_codes, block)
    # im2col pads C to whole blocks per tap: the GEMM's blocks are those blocks
    packed = _native.mx_pack_weights(
        np.ascontiguousarray(bm).view(np.uint8), np.ascontiguousarray(b_s).view(np.uint8), w_fmt.name, block
    )
    b = None if bias is None else np.ascontiguousarray(bias, np.float32)
    y = _native.mx_gemm(
        np.ascontiguousarray(a).view(np.uint8),
        np.ascontiguousarray(a_s).view(np.uint8),
        mxref.mx_format(x_fmt).name,
        packed,
        b,
        num_threads=num_threads,
    )
    N = x.shape[0]
    return np.ascontiguousarray(y.reshape(N, OH, OW, -1).transpose(0, 3, 1, 2))


def _fmt_of(el: np.ndarray) -> mxref.MXFormat:
    for f in mxref.MX_FORMATS.values():
        if f.dtype == np.asarray(el).dtype:
            return f
    raise ValueError(f"MX elements of dtype {np.asarray(el).dtype} are no MX element type")


def _quantize_mx_kernel(
    ctx: Any, x: Any, *, axis: int = -1, block_size: int = 32, output_dtype: int = 3, mode: str = "ocp"
) -> tuple[np.ndarray, np.ndarray]:
    fmt = mxref._ONNX_FORMATS.get(output_dtype)
    x = np.asarray(x)
    if fmt is None or mode != "ocp" or x.dtype != np.float32 or x.ndim == 0 or not -x.ndim <= axis < x.ndim:
        return mxref.quantize_mx_op(
            ctx, x, axis=axis, block_size=block_size, output_dtype=output_dtype, mode=mode
        )
    if block_size <= 0:
        raise OpError(f"block_size: expected a positive block size, got {block_size}")
    el, codes = quantize_mx_native(x, fmt, axis, block_size, getattr(ctx, "num_threads", 1))
    return el, mxref.dq_scale_codes(codes, fmt)


@register_binder("QuantizeMX", QUANTA_DOMAIN)
def bind_quantize_mx(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 input, OCP rounding (the ceil and microxcaling modes run on the reference twin)."""
    del model
    if node.attrs.get("mode", "ocp") != "ocp":
        return None, (
            f"native QuantizeMX computes the OCP scale (MX3) only (mode={node.attrs.get('mode')!r} is the twin's)"
        )
    if int(node.attrs.get("output_dtype", 3)) not in mxref._ONNX_FORMATS:
        return None, f"native QuantizeMX: output_dtype {node.attrs.get('output_dtype')} is no MX element type"
    return Kernel(_quantize_mx_kernel, "native", "native:mx_quantize"), ""


# --------------------------------------------------------------------------------------
# quanta::MatMulMX (passes/lower/mx.py) on the MX GEMM kernel
# --------------------------------------------------------------------------------------


def _matmul_mx_native(
    ctx: Any,
    x: Any,
    *rest: Any,
    packed: Any,
    x_fmt: str,
    k: int,
    n: int,
    k_block: int = 32,
    x_dtype: int = 3,
    mode: str = "ocp",
) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.float32 or x.ndim < 1 or x.shape[-1] != k:
        return mxref.matmul_mx_op(ctx, x, *rest, k_block=k_block, x_dtype=x_dtype, mode=mode)
    from quanta.targets.native._values import threads

    y = mx_matmul(x.reshape(-1, k), x_fmt, packed, None, num_threads=threads(ctx))
    return y.reshape((*x.shape[:-1], n))


def _native_pair(node: Node, w: np.ndarray) -> tuple[mxref.MXFormat, mxref.MXFormat, int] | str:
    """(x format, w format, block) when the native kernels compute this MX node exactly,
    else why not."""
    mode = node.attrs.get("mode", "ocp")
    if mode != "ocp":
        return f"x is quantized as the OCP rule (MX3) only (mode={mode!r} is the twin's)"
    x_fmt = mxref._ONNX_FORMATS.get(int(node.attrs.get("x_dtype", 3)))
    if x_fmt is None:
        return f"x_dtype {node.attrs.get('x_dtype')} is no MX element type"
    try:
        fw = _fmt_of(w)
    except ValueError as e:
        return str(e)
    fx = mxref.mx_format(x_fmt)
    block = int(node.attrs.get("k_block", 32))
    if fw.is_int and not fx.is_int:
        # the kernel packs MXINT8 weights for its int8 path only; its float path would
        # read float weights that were never packed
        return f"MXINT8 weights with {fx.name} activations have no native kernel"
    if mxref._bound(fx) * mxref._bound(fw) * block >= 2**53:
        return f"{fx.name} x {fw.name} block dots exceed the kernel's exact range"
    return fx, fw, block


@register_binder("MatMulMX", QUANTA_DOMAIN)
def bind_matmul_mx(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """Constant MX weights and scales, OCP mode, a format pair whose block dots stay exact
    in the kernel (float64 below 2^53); packs the weights once."""
    del model
    from quanta.targets.native._values import const_of

    w, s = const_of(node.input(1)), const_of(node.input(2))
    if w is None or s is None or (len(node.inputs) > 3 and node.input(3) is not None):
        return None, "native MatMulMX takes constant weights and scales and no bias"
    why = _native_pair(node, w)
    if isinstance(why, str):
        return None, f"native MatMulMX: {why}"
    fx, fw, block = why
    if w.ndim != 2:
        return None, "native MatMulMX takes a rank-2 weight"
    k, n = w.shape
    if s.shape != (-(-k // block), n):
        return (
            None,
            f"native MatMulMX: w_scale {list(s.shape)} does not fit w {list(w.shape)} / block {block}",
        )
    packed = pack_mx_weights(w, mxref.ocp_codes(s, fw), fw.name, block)
    params = {"packed": packed, "x_fmt": fx.name, "k": k, "n": n}
    return Kernel(_matmul_mx_native, "native", f"native:mx_matmul_{fx.name}x{fw.name}", params=params), ""


# quanta::ConvMX (passes/lower/mx.py): the native quantizer, im2col (eq. (MX7)), the MX
# GEMM on weights packed once


def _conv_mx_native(
    ctx: Any,
    x: Any,
    *rest: Any,
    packed: Any,
    x_fmt: str,
    kernel: tuple[int, int],
    n_out: int,
    bias: np.ndarray | None,
    k_block: int = 32,
    x_dtype: int = 3,
    mode: str = "ocp",
    pads: tuple[int, ...] = (0, 0, 0, 0),
    strides: tuple[int, ...] = (1, 1),
    dilations: tuple[int, ...] = (1, 1),
) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.float32 or x.ndim != 4:
        return mxref.conv_mx_op(
            ctx,
            x,
            *rest,
            k_block=k_block,
            x_dtype=x_dtype,
            mode=mode,
            pads=pads,
            strides=strides,
            dilations=dilations,
        )
    from quanta.kernels import _native
    from quanta.targets.native._values import threads

    nt = threads(ctx)
    xe, xs = quantize_mx_native(x, x_fmt, axis=1, block=k_block, num_threads=nt)
    a, a_s, (OH, OW) = mxref.im2col_mx(xe, xs, kernel, tuple(pads), tuple(strides), tuple(dilations), k_block)  # type: ignore[arg-type]
    y = _native.mx_gemm(
        np.ascontiguousarray(a).view(np.uint8),
        np.ascontiguousarray(a_s).view(np.uint8),
        x_fmt,
        packed,
        bias,
        num_threads=nt,
    )
    return np.ascontiguousarray(y.reshape(x.shape[0], OH, OW, n_out).transpose(0, 3, 1, 2))


@register_binder("ConvMX", QUANTA_DOMAIN)
def bind_conv_mx(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """As :func:`bind_matmul_mx`, plus a constant float32 bias (or none); the weights are
    laid out as the GEMM's B (``reference.mx.weights_to_gemm_mx``) and packed once."""
    del model
    from quanta.targets.native._values import const_of

    w, s = const_of(node.input(1)), const_of(node.input(2))
    has_bias = len(node.inputs) > 3 and node.input(3) is not None
    bias = const_of(node.input(3)) if has_bias else None
    if w is None or s is None or (has_bias and (bias is None or bias.dtype != np.float32)):
        return None, "native ConvMX takes constant weights, scales and a constant float32 bias"
    why = _native_pair(node, w)
    if isinstance(why, str):
        return None, f"native ConvMX: {why}"
    fx, fw, block = why
    if w.ndim != 4 or s.shape != (w.shape[0], -(-w.shape[1] // block), *w.shape[2:]):
        return None, f"native ConvMX: w_scale {list(s.shape)} does not fit w {list(w.shape)} / block {block}"
    bm, b_s = mxref.weights_to_gemm_mx(w, mxref.ocp_codes(s, fw), block)
    packed = pack_mx_weights(bm, b_s, fw.name, block)
    params = {
        "packed": packed,
        "x_fmt": fx.name,
        "kernel": (int(w.shape[2]), int(w.shape[3])),
        "n_out": int(w.shape[0]),
        "bias": None if bias is None else np.ascontiguousarray(bias, np.float32),
    }
    return Kernel(_conv_mx_native, "native", f"native:mx_conv_{fx.name}x{fw.name}", params=params), ""
