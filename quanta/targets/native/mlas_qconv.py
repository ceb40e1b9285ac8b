"""Native quanta::MlasQLinearConv: ONNX Runtime's QLinearConv as its u8·s8 kernels without
VNNI compute it (pairs of products saturate to int16).

=================  ==============================================  ======================
operator           native call                                      twin (bit for bit)
=================  ==============================================  ======================
quanta             ``mlas_qconv``: per image the (kh, kw, c)        reference/mlas_qconv.py
MlasQLinearConv    im2col (zx outside x; a 1x1 Conv of stride 1     ``mlas_qlinear_conv``,
                   reads x itself), one qgemm per group on          eqs. (QC1)-(QC4)
                   weights packed for its saturating vpmaddubsw
                   family (portable: the same pairs in scalar
                   C++), ORT's requantization in its epilogue
=================  ==============================================  ======================

The weights are packed once, at bind time, with the per-channel multipliers m[f] =
f32(f32(sx·sw[f]) / sy) of (QC4), the zero points and the bias codes: the rule that
writes the node (QdqConvToMlasQLinearConv) makes all of them constants. A 1-D Conv (x
[N, C, L], w [F, C, k]) is the 2-D one of x [N, C, 1, L] and w [F, C, 1, k]: the same
(QC1) rows (kh = 0, kw, c), so the same pairs, and ORT's 1-D QLinearConv is that
convolution (tests/kernels/test_mlas_qconv.py compares it with onnxruntime). A node whose
parameters are not constants, or whose x is neither 3-D nor 4-D, runs on the twin.

``channels_last=1`` (the channels-last pass, between convolutions that exchange NHWC
tensors): x [N, H, W, C] (or [N, L, C]) and y [N, oh, ow, F] go to the kernel's
channels-last mode, which skips its two transposes; a 1-D one is [N, 1, L, C].
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels.reference.mlas_qconv import QUANTA_DOMAIN, mlas_qlinear_conv_op
from quanta.targets.base import Kernel
from quanta.targets.native import register_binder
from quanta.targets.native._values import const_of
from quanta.targets.native._values import threads as _threads
from quanta.targets.native.a16w8 import _blas

try:
    from quanta.kernels import _native
except ImportError:  # the binders only run when the extension is built
    _native = None


def _twin(ctx: Any, *inputs: Any, out: Any = None, **attrs: Any) -> np.ndarray:
    # one BLAS thread: the products are small, and a BLAS pool spinning against the
    # session's own threads took 17 ms for a 144 x 88 x 88 product (0.07 ms on one)
    with _blas().limit(limits=1, user_api="blas"):
        y = mlas_qlinear_conv_op(ctx, *inputs, **attrs)
    if out is None:
        return y
    np.copyto(out, y)
    return out


def multipliers(sx: np.ndarray, sw: np.ndarray, sy: np.ndarray, f: int) -> np.ndarray:
    """(QC4)'s m[f] = f32(f32(sx·sw[f]) / sy), float32 [F] (the twin's arithmetic)."""
    m = (np.float32(np.asarray(sx).reshape(-1)[0]) * np.asarray(sw, np.float32).reshape(-1)) / np.float32(
        np.asarray(sy).reshape(-1)[0]
    )
    return np.ascontiguousarray(np.broadcast_to(m.astype(np.float32), (f,)))


def _mlas_qconv(
    ctx: Any,
    x: np.ndarray,
    *inputs: Any,
    out: np.ndarray | None = None,
    call: dict[str, Any],
    **attrs: Any,
) -> np.ndarray:
    """One ``mlas_qconv`` call with the bound constants (x 4-D, or 3-D for a 1-D Conv seen
    as a 2-D one of height 1), else the twin."""
    x = np.asarray(x)
    if x.ndim != call["rank"] + 2 or x.dtype not in (np.uint8, np.int8):
        return _twin(ctx, x, *inputs, out=out, **attrs)
    one_d = call["rank"] == 1  # [N, C, L] -> [N, C, 1, L] ([N, L, C] -> [N, 1, L, C]): views
    nhwc = call["channels_last"]
    x = np.ascontiguousarray(x)
    unit = (slice(None), None) if nhwc else (slice(None), slice(None), None)  # where H = 1 goes
    y = _native.mlas_qconv(
        x[unit] if one_d else x,
        call["packed"],
        call["zx"],
        call["multiplier"],
        call["zy"],
        call["y_signed"],
        call["bias"],
        call["strides"],
        call["dilations"],
        call["pads"],
        _threads(ctx),
        None if out is None else out[unit] if one_d else out,
        nhwc,
    )
    if not one_d:
        return y
    return y.reshape(y.shape[0], *(y.shape[2:] if nhwc else (y.shape[1], y.shape[3]))) if out is None else out


def _call(node: Node) -> tuple[dict[str, Any] | None, str]:
    """The node's packed weights and constants, or None and the reason (twin)."""
    names = ("x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "b")
    consts = {k: const_of(v) for k, v in zip(names[1:], node.inputs[1:], strict=False)}
    if any(consts.get(k) is None for k in names[1:8]):
        return None, "scales, zero points or weights are not constants"
    w = np.ascontiguousarray(consts["w"])
    if w.dtype != np.int8 or w.ndim not in (3, 4):
        return None, f"w {w.dtype} of rank {w.ndim} (int8, 1-D and 2-D Convs only)"
    rank = w.ndim - 2
    if rank == 1:  # the 2-D Conv of height 1 (module docstring)
        w = np.ascontiguousarray(w[:, :, None, :])
    f, group = w.shape[0], int(node.attrs.get("group", 1))
    if group < 1 or f % group:
        return None, f"group {group} does not divide the {f} filters"
    zw = np.ascontiguousarray(np.broadcast_to(np.asarray(consts["zw"]).astype(np.int32).reshape(-1), (f,)))
    zy = np.asarray(consts["zy"])
    b = consts.get("b")
    pads = [int(v) for v in node.attrs.get("pads", [0] * 2 * rank)]
    strides = [int(v) for v in node.attrs.get("strides", [1] * rank)]
    dilations = [int(v) for v in node.attrs.get("dilations", [1] * rank)]
    if rank == 1:  # height 1: no stride, dilation or padding along it
        pads, strides, dilations = [0, pads[0], 0, pads[1]], [1, *strides], [1, *dilations]
    return {
        "packed": _native.mlas_qconv_pack(w, zw, group),
        "zx": int(np.asarray(consts["zx"]).reshape(-1)[0]),
        "multiplier": multipliers(consts["sx"], consts["sw"], consts["sy"], f),
        "zy": int(zy.reshape(-1)[0]),
        "y_signed": zy.dtype == np.int8,
        "bias": None if b is None else np.ascontiguousarray(np.asarray(b).astype(np.int32).reshape(-1)),
        "strides": strides,
        "dilations": dilations,
        "pads": [pads[0], pads[1], pads[2], pads[3]],
        "rank": rank,
        "channels_last": bool(node.attrs.get("channels_last", 0)),
    }, ""


@register_binder("MlasQLinearConv", QUANTA_DOMAIN)
def bind_mlas_qlinear_conv(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta MlasQLinearConv: ``mlas_qconv`` on weights packed here, once (module
    docstring); the twin where the parameters are not constants."""
    del model  # unused
    if _native is None or not hasattr(_native, "mlas_qconv"):
        return Kernel(_twin, "native", "numpy:mlas_qlinear_conv", out=True), ""
    call, why = _call(node)
    if call is None:
        return Kernel(_twin, "native", "numpy:mlas_qlinear_conv", fallback=why, out=True), ""
    return Kernel(_mlas_qconv, "native", "native:mlas_qconv", params={"call": call}, out=True), ""
