"""A 3-D Conv over a depth of one with a kernel of depth one is a 2-D Conv: rewritten so,
it runs on the native float and integer convolutions (which are 1-D and 2-D) instead of
the reference's NumPy loop, and quantizes as any 2-D Conv.

Video and volume networks applied to single images write such Convs: RivaGAN's watermark
encoder and decoder (invisible-watermark) read a frame as ``[N, 3, 1, H, W]`` and convolve
it with ``1 x 11 x 11`` kernels.

ConvDepthOne (weight ``w[C_o, C_i/g, 1, k_h, k_w]``; the input ``x[N, C_i, 1, H, W]``)::

    %y = Conv(%x, %w, %b?) {pads=[0, p_h, p_w, 0, q_h, q_w], strides=[s_d, s_h, s_w], ...}
      -> %y = Unsqueeze(Conv(Squeeze(%x, [2]), %w', %b?) {pads=[p_h, p_w, q_h, q_w], ...}, [2])
    w' = w[:, :, 0]

With depth 1 and no depth padding there is one output depth (``(1 − 1)/s_d + 1``) and
its one tap reads the one input depth: the same products, summed in the same order
(bit for bit on the reference target). Strides, dilations and pads of the two spatial
axes, ``group`` and ``auto_pad`` carry over (a SAME pad of a depth-1 kernel is 0).

The weight is a float constant, or ``DequantizeLinear`` of a constant (a QDQ file's
3-D Conv: the new 2-D weight is the same codes under the same scales, per tensor or per
output / input channel), so the group ``DQ -> Conv -> Q`` of a quantized file lowers to
an integer Conv once the views move onto the quantized values.

ConvIntegerDepthOne: the same for ``ConvInteger`` (what ONNX Runtime's quantize_dynamic
writes for a Conv) with a constant integer weight; the zero points carry over (a
per-output-channel weight zero point keeps its axis).

Refused: a spatial rank other than 3, an input whose depth is not known to be 1, a
kernel depth other than 1, depth pads, a weight that is neither of the two forms above
(or quantized along a spatial axis).
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import TensorType, Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule

__all__ = ["ConvDepthOne", "ConvDepthOneAs2d", "ConvIntegerDepthOne"]


def _ints(v, n: int, default: int) -> list[int]:
    return [int(a) for a in v] if v is not None and len(v) else [default] * n


def _input_of_depth_one(x: Value) -> NoMatch | None:
    if x.shape is None or len(x.shape) != 5:
        return NoMatch("not a 3-D convolution with a known input rank")
    if x.shape[2] != 1:
        return NoMatch(f"the input depth is {x.shape[2]}, not 1")
    return None


def _kernel_of_depth_one(w: np.ndarray, attrs: dict) -> NoMatch | list[int]:
    """The node's six pads when the kernel ``w`` has depth 1, agrees with kernel_shape
    and no depth is padded (one output depth), else why not."""
    if w.ndim != 5 or w.shape[2] != 1:
        return NoMatch(f"the kernel is {tuple(w.shape[2:])}, not of depth 1")
    if _ints(attrs.get("kernel_shape"), 3, 0) not in ([int(k) for k in w.shape[2:]], [0, 0, 0]):
        return NoMatch("kernel_shape disagrees with the weight")
    pads = _ints(attrs.get("pads"), 6, 0)
    if pads[0] or pads[3]:
        return NoMatch(f"depth pads {pads[0]}, {pads[3]}: more than one output depth")
    return pads


class ConvDepthOne(Rule):
    """%y = Conv(x, w, b?) over [N, C, 1, H, W] with a 1 x k_h x k_w kernel -> a 2-D Conv"""

    pattern = "y = Conv(x, w, b?)"

    def __init__(self, opset: int = 21) -> None:
        self.opset = opset

    def check(self, m: Match) -> Match | NoMatch:
        x, w_v = m["x"], m["w"]
        refused = _input_of_depth_one(x)
        if refused is not None:
            return refused
        if w_v.is_const:
            w = np.asarray(w_v.const)
            dq = None
        else:
            dq = w_v.producer
            if dq is None or dq.op_type != "DequantizeLinear" or dq.domain or not dq.inputs[0].is_const:
                return NoMatch("the weight is neither a constant nor DequantizeLinear of one")
            if any(v is not None and not v.is_const for v in dq.inputs[1:]):
                return NoMatch("the weight's scale or zero point is not a constant")
            w = np.asarray(dq.inputs[0].const)
            if w.ndim != 5:
                return NoMatch(f"the quantized weight has rank {w.ndim}")
            scale = np.asarray(dq.inputs[1].const)
            axis = int(dq.attrs.get("axis", 1))
            if scale.size > 1 and axis % 5 not in (0, 1):
                return NoMatch(f"the weight is quantized along axis {axis}")
            if dq.attrs.get("block_size"):
                return NoMatch("a blocked weight quantization")
        pads = _kernel_of_depth_one(w, m.root.attrs)
        if isinstance(pads, NoMatch):
            return pads
        m.data.update(w=w, dq=dq, pads=pads)
        return m

    def _as_2d(self, m: Match, b: Builder, op: str, inputs: list, w4: np.ndarray) -> Value:
        """Unsqueeze(op(Squeeze(x), *inputs)): the 2-D node over the squeezed input, its
        attributes the 3-D node's over the spatial axes; it keeps the node's name (coverage
        pairs by it)."""
        x, y = m["x"], m["y"]
        x4_shape = None if x.shape is None else (*x.shape[:2], *x.shape[3:])
        y4_shape = None if y.shape is None or len(y.shape) != 5 else (*y.shape[:2], *y.shape[3:])
        node = b.op(
            op,
            [self._axes(b, "Squeeze", x, x4_shape, x), *inputs],
            self._attrs_2d(m.root.attrs, m.data["pads"], w4),
            types=result_type(shape_from=y4_shape, elem_from=y),
            name=m.root.name or None,
        )
        return self._axes(b, "Unsqueeze", node, y.shape, y)

    def _axes(self, b: Builder, op: str, v: Value, shape: tuple | None, elem_from: Value) -> Value:
        """Squeeze / Unsqueeze of axis 2 in the form the opset takes (an attribute before
        13, a constant input from 13 on)."""
        types = result_type(shape_from=shape, elem_from=elem_from)
        name = f"{b.match.root.name or 'conv'}/{op.lower()}"
        if self.opset < 13:
            return b.op(op, [v], {"axes": [2]}, types=types, name=name)
        return b.op(op, [v, b.const("axis_2", np.asarray([2], np.int64))], types=types, name=name)

    @staticmethod
    def _attrs_2d(a: dict, pads: list[int], w4: np.ndarray) -> dict:
        """The 3-D node's attributes over the two spatial axes (depth dropped)."""
        attrs: dict = {
            "pads": [pads[1], pads[2], pads[4], pads[5]],
            "strides": _ints(a.get("strides"), 3, 1)[1:],
            "dilations": _ints(a.get("dilations"), 3, 1)[1:],
            "group": int(a.get("group", 1)),
            "kernel_shape": [int(k) for k in w4.shape[2:]],
        }
        auto_pad = a.get("auto_pad", "NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
        if auto_pad != "NOTSET":
            attrs["auto_pad"] = auto_pad
            del attrs["pads"]
        return attrs

    def rewrite(self, m: Match, b: Builder) -> Value:
        w, dq = m.data["w"], m.data["dq"]
        w4 = np.ascontiguousarray(w[:, :, 0])
        if dq is None:
            weight = b.const(f"{m['w'].name}_2d", w4)
        else:
            codes = dq.inputs[0]
            q_type = TensorType(codes.type.elem, tuple(w4.shape)) if codes.type is not None else None
            attrs = {k: v for k, v in dq.attrs.items() if k != "axis"}
            if np.asarray(dq.inputs[1].const).size > 1:
                attrs["axis"] = int(dq.attrs.get("axis", 1)) % 5
            weight = b.op(
                "DequantizeLinear",
                [b.const(f"{codes.name}_2d", w4, q_type), *dq.inputs[1:]],
                attrs,
                types=result_type(shape_from=tuple(w4.shape), elem_from=m["w"]),
                name=f"{dq.name}_2d",
            )
        return self._as_2d(m, b, "Conv", [weight] + ([m["b"]] if m["b"] is not None else []), w4)


class ConvIntegerDepthOne(ConvDepthOne):
    """%y = ConvInteger(x, w, x_zp?, w_zp?) over [N, C, 1, H, W] with a constant
    1 x k_h x k_w kernel -> a 2-D ConvInteger (ONNX Runtime's quantize_dynamic writes
    one per Conv)"""

    pattern = "y = ConvInteger(x, w, xz?, wz?)"

    def check(self, m: Match) -> Match | NoMatch:
        refused = _input_of_depth_one(m["x"])
        if refused is not None:
            return refused
        if not m["w"].is_const:
            return NoMatch("the weight is not a constant")
        w = np.asarray(m["w"].const)
        pads = _kernel_of_depth_one(w, m.root.attrs)
        if isinstance(pads, NoMatch):
            return pads
        m.data.update(w=w, pads=pads)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        w4 = np.ascontiguousarray(m.data["w"][:, :, 0])
        return self._as_2d(m, b, "ConvInteger", [b.const(f"{m['w'].name}_2d", w4), m["xz"], m["wz"]], w4)


class ConvDepthOneAs2d(RewritePass):
    name = "conv_depth_one"

    def __init__(self, opset: int = 21) -> None:
        super().__init__([ConvDepthOne(opset), ConvIntegerDepthOne(opset)])
