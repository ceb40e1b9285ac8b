"""A ConvTranspose whose stride equals its kernel (the 2x2 / stride-2 upsampling of
YOLOv8-seg's mask prototypes and of PaddleOCR's DB heads) is a 1x1 Conv followed by
DepthToSpace; rewritten so before quantization, it quantizes and runs as an integer
convolution (ConvTranspose has no integer kernel) with a view after it.

ConvTransposeAsConv (kernel ``k_h x k_w`` = strides, weight ``w[C_i, C_o, k_h, k_w]``,
bias ``b[C_o]``)::

    %y = ConvTranspose(%x, %w, %b?) {strides=[k, k], pads=0, group=1, dilations=1}
      -> %y = DepthToSpace(Conv(%x, %w', %b') {kernel 1x1}) {blocksize=k, mode=DCR}

    w'[(i·k + j)·C_o + o, c, 0, 0] = w[c, o, i, j],     b'[(i·k + j)·C_o + o] = b[o]

Why it is the same function: with stride = kernel and no padding, each output pixel
``(h·k + i, v·k + j)`` receives exactly one input pixel ``(h, v)``, through the kernel tap
``(i, j)``: ``y[o, h·k + i, v·k + j] = b[o] + Σ_c x[c, h, v] · w[c, o, i, j]``, which is
the 1x1 Conv's channel ``(i·k + j)·C_o + o`` at ``(h, v)``, and DepthToSpace in DCR mode
(its default in every opset) moves channel ``(i·k + j)·C' + o`` of pixel ``(h, v)`` to
``(o, h·k + i, v·k + j)``. Equal up to float rounding: the same ``C_i`` products, summed
in the order each kernel chooses (tolerance γ_{C_i+1}·Σ|x·w| per side).

Refused: another stride, a non-square or non-matching kernel, pads, output_padding,
output_shape, dilations, groups, auto_pad other than NOTSET / VALID, a non-constant
weight or bias, a spatial rank other than 2.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule

__all__ = ["ConvTransposeAsConv", "ConvTransposeAsConvs"]


def _ints(v, n: int, default: int) -> list[int]:
    return [int(a) for a in v] if v is not None and len(v) else [default] * n


class ConvTransposeAsConv(Rule):
    """%y = ConvTranspose(x, w, b?) {strides = kernel, no pads} -> DepthToSpace(Conv1x1(x, w', b'))"""

    pattern = "y = ConvTranspose(x, w, b?)"

    def check(self, m: Match) -> Match | NoMatch:
        w_v, b_v = m["w"], m["b"]
        if not w_v.is_const or (b_v is not None and not b_v.is_const):
            return NoMatch("the weight or the bias is not a constant")
        w = np.asarray(w_v.const)
        if w.ndim != 4 or w.dtype != np.float32:
            return NoMatch(f"the weight is {w.dtype} of rank {w.ndim}; expected a float32 2-D kernel")
        a = m.root.attrs
        kh, kw = w.shape[2], w.shape[3]
        if _ints(a.get("kernel_shape"), 2, 0) not in ([kh, kw], [0, 0]):
            return NoMatch("kernel_shape disagrees with the weight")
        if kh != kw or _ints(a.get("strides"), 2, 1) != [kh, kw] or kh < 2:
            return NoMatch(f"strides {_ints(a.get('strides'), 2, 1)} are not the square kernel {[kh, kw]}")
        if any(_ints(a.get("pads"), 4, 0)) or any(_ints(a.get("output_padding"), 2, 0)):
            return NoMatch("pads or output_padding")
        if a.get("output_shape") is not None and len(a.get("output_shape")):
            return NoMatch("output_shape given")
        if _ints(a.get("dilations"), 2, 1) != [1, 1] or int(a.get("group", 1)) != 1:
            return NoMatch("dilations or groups")
        auto_pad = a.get("auto_pad", "NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
        if auto_pad not in ("NOTSET", "VALID"):
            return NoMatch(f"auto_pad={auto_pad}")
        if m["x"].shape is not None and len(m["x"].shape) != 4:
            return NoMatch("the input is not 4-D")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        w = np.asarray(m.const("w"))
        ci, co, k, _ = w.shape
        # w'[(i*k + j)*co + o, c] = w[c, o, i, j]
        w2 = np.ascontiguousarray(w.transpose(2, 3, 1, 0).reshape(k * k * co, ci, 1, 1))
        inputs = [m["x"], b.const(f"{m['w'].name}_as_conv", w2)]
        if m["b"] is not None:
            bias = np.asarray(m.const("b"), np.float32).reshape(co)
            inputs.append(b.const(f"{m['b'].name}_as_conv", np.tile(bias, k * k)))
        y = m["y"]
        shape = None
        if m["x"].shape is not None:
            n, _, h, v = m["x"].shape
            shape = (n, k * k * co, h, v)
        conv = b.op(
            "Conv",
            inputs,
            {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0]},
            types=result_type(shape_from=shape, elem_from=y),
            name=f"{m.root.name}/conv1x1",
        )
        return b.op(
            "DepthToSpace",
            [conv],
            {"blocksize": k},
            types=result_type(shape_from=y, elem_from=y),
            name=m.root.name,
        )


class ConvTransposeAsConvs(RewritePass):
    name = "conv_transpose_as_conv"

    def __init__(self) -> None:
        super().__init__([ConvTransposeAsConv()])
