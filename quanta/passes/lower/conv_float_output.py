"""``Conv(DQ(x), DQ(w), DQ(bq)?)`` whose output is not quantized -> an integer
convolution with a float32 result (LowerConvFloatOutput)::

    %c = Conv(DequantizeLinear(%x, sx, zx), DequantizeLinear(%w, sw, zw), DequantizeLinear(%bq, sx·sw, 0)?)
      -> %acc = ConvInteger(%x, %w, zx, zw)                                  int32, exact
         %c   = quanta::AccumulatorToFloat(%acc, %bq[1, M, 1, ...]?, (sx·sw)[1, M, 1, ...])
              = Mul(Cast<float>(Add(%acc, %bq)), sx·sw)                      the int32 bias, exact

    a float constant bias %b (PaddlePaddle's exports) is added after the scaling instead,
    as the float group adds it: %c = AccumulatorToFloat(%acc, , sx·sw, %b[1, M, 1, ...])
      = Add(Mul(Cast<float>(%acc), sx·sw), %b)

A convolution whose float bias is an offset folded from a BatchNormalization after it
(``_util.FOLDED_OFFSET``: NNCF and QAT exports keep the BatchNormalization, and ONNX
Runtime runs such a group in float) takes this form even when its output is quantized:
``AccumulatorToFloat`` adds the offset after the scaling as the float group does, and
the QuantizeLinear after it rounds once, where a QLinearConv would round the offset to
the accumulator grid first (``0.5·sx·sw/sy`` of an output step per channel).

The last convolution before a float consumer (a detector's head, a convolution whose
output is a graph output or feeds a float LSTM) keeps its multiply-accumulates in
integer this way instead of running in float on dequantized weights: the result is
``(acc + bq)·sx·sw[m]`` (docs/quantization-math.md eq. (5) before its rounding), one
float32 rounding of the exact integer sum where the float group rounds at every
accumulation step, as MatMulIntegerToFloat does for MatMul (LowerMatMulFloatOutput).
The output stage is one node (reference/accumulator.py: the Add, Cast, Mul and Add
twins in that order), so the native target runs it as one pass over the accumulators.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.ir.types import I32, TensorType
from quanta.passes.pattern import Builder, Match, NoMatch, Rule

QUANTA_DOMAIN = "quanta"  # quanta.kernels.reference.accumulator (kernels sit below passes)

__all__ = ["LowerConvFloatOutput"]


class LowerConvFloatOutput(Rule):
    """``Conv(DQ(x), DQ(w), b?)``, float output -> ``AccumulatorToFloat(ConvInteger(x, w, zx, zw), bq, sx·sw)``.

    A depthwise convolution (group = C = M) takes x quantized per channel (axis 1, one
    zero point): each output channel reads one input channel, so its scale is
    ``f32(sx[c]·sw[c])``, the same product the float group forms per element."""

    pattern = "c = Conv(xf = DequantizeLinear(x, sx, zx?), wf = DequantizeLinear(w, sw, zw?), b?)"
    shared_ok = frozenset({"xf", "wf"})

    def check(self, m: Match) -> Match | NoMatch:
        # qdq_to_qlinear lists this rule, so its helpers are imported where they are used
        from quanta.passes.lower.qdq_to_qlinear import (
            _check_8bit,
            _check_consts,
            _int32_bias,
            _params,
            float_elem_name,
        )
        from quanta.passes.rules._util import FOLDED_OFFSET, describe

        folded = m["b"] is not None and m["b"].is_const and m["b"].doc == FOLDED_OFFSET
        if not folded and any(u.op_type == "QuantizeLinear" for u in m.value("c").consumers()):
            return NoMatch("the output is quantized (LowerConv handles it)")
        bad = _check_consts(m, "sx", "zx", "sw", "zw")
        if bad is not None:
            return bad
        if not m.is_const("w"):
            return NoMatch(f"weight {describe(m['w'])} is not a constant")
        if float_elem_name(m["c"]) != "f32":
            return NoMatch("the convolution's output is not float32")
        qx = _params(m, "xf", "x", "sx", "zx")
        qw = _params(m, "wf", "w", "sw", "zw")
        w = np.asarray(m.value("w").const)
        # a depthwise convolution reads each channel of x alone: x may be quantized per
        # channel (NNCF's placement), its scale one more factor of the channel's sx·sw
        depthwise = int(m.node("c").attrs.get("group", 1)) == w.shape[0] and w.shape[1] == 1
        x_shape = m.value("x").shape
        x_per_channel = (
            qx is not None
            and qx.axis is not None
            and depthwise
            and x_shape is not None
            and qx.axis % len(x_shape) == 1
            and len(qx.scale) == w.shape[0]
        )
        for q, what, per_tensor in ((qx, "input x", not x_per_channel), (qw, "weight w", False)):
            bad = _check_8bit(q, what, per_tensor=per_tensor)
            if bad is not None:
                return bad
        assert qx is not None and qw is not None
        if x_per_channel and len(set(qx.zero_point)) != 1:
            return NoMatch("input x is quantized per channel with zero points that differ")
        if qw.axis is not None and qw.axis % w.ndim != 0:
            return NoMatch(f"weight w is quantized along axis {qw.axis}; ConvInteger takes axis 0")
        bias = m["b"]
        float_bias = None
        if bias is not None and bias.is_const and np.asarray(bias.const).dtype == np.float32:
            float_bias = np.asarray(bias.const, np.float32)
            if float_bias.shape != (w.shape[0],):
                return NoMatch(
                    f"float bias {describe(bias)} of shape {float_bias.shape} is not one per output channel"
                )
            bq = None
        elif bias is not None and x_per_channel:
            return NoMatch("an int32 bias with a per-channel x (its scale is not one sx·sw)")
        else:
            bq = _int32_bias(m, "b", qx, qw)
            if isinstance(bq, NoMatch):
                return bq
        m.data.update(qx=qx, qw=qw, bq=bq, float_bias=float_bias, rank=w.ndim, x_per_channel=x_per_channel)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        from quanta.passes.lower.qdq_to_qlinear import CONV_ATTRS, _zero_point_or_default

        conv = m.node("c")
        qx, qw, rank = m.data["qx"], m.data["qw"], m.data["rank"]
        name = conv.name or "conv"
        attrs = {k: v for k, v in conv.attrs.items() if k in CONV_ATTRS}
        if m.data["x_per_channel"]:  # one zero point for all channels (checked)
            zx = b.const("x_zero_point", np.asarray(qx.zero_point[0], dtype=qx.storage.numpy))
        else:
            zx = _zero_point_or_default(b, m, "zx", qx, "x_zero_point")
        zw = _zero_point_or_default(b, m, "zw", qw, "w_zero_point")
        out = m["c"]
        shape = out.shape if out is not None else None
        acc = b.op(
            "ConvInteger",
            [m["x"], m["w"], zx, zw],
            attrs,
            types=TensorType(I32, shape),
            attr_types=conv.attr_types,
            name=name,
        )
        per_channel = (1, -1) + (1,) * (rank - 2)  # [1, M, 1, ...] broadcasts over N and space
        bias = None
        if m.data["bq"] is not None:
            bq = m.data["bq"]
            codes = bq if isinstance(bq, np.ndarray) else bq.const  # ndarray: requantized to sx·sw
            bias = b.const(f"{name}_bias_i32", np.asarray(codes, np.int32).reshape(per_channel))
        sx = np.asarray(qx.scale, np.float32) if m.data["x_per_channel"] else np.float32(qx.scale[0])
        scale = np.multiply(sx, np.asarray(qw.scale, np.float32), dtype=np.float32)  # eq. (6): sx·sw, float32
        s = b.const(f"{name}_scale", scale.reshape(per_channel if scale.size > 1 else ()).astype(np.float32))
        inputs = [acc, bias, s]
        if m.data["float_bias"] is not None:
            inputs.append(b.const(f"{name}_bias", m.data["float_bias"].reshape(per_channel)))
        return b.op(
            "AccumulatorToFloat",
            inputs,
            domain=QUANTA_DOMAIN,
            types=result_type(shape_from=out, elem_from=out),
            name=f"{name}/to_float",
        )
