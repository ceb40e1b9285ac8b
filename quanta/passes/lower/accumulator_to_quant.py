"""The float output stage of an integer convolution, then QuantizeLinear, as one node
(FuseAccumulatorToQuant)::

    %f = quanta::AccumulatorToFloat(%acc, %bias?, %scale, %float_bias?)
    %g = act(%f)                                 optional: one of the float gates below
    %y = QuantizeLinear(%g, sy, zy)              per tensor, 8-bit, constant sy and zy
      -> %y = quanta::AccumulatorToQuant(%acc, %bias?, %scale, %float_bias?, sy, zy)
                {activation = "" | SiLU | HardSwish | HardSigmoid | ClipMulDiv, activation_params}

    act:  Mul(%f, Sigmoid(%f))                    SiLU (either operand order)
          HardSwish(%f)                           HardSwish
          HardSigmoid(%f) {alpha, beta}           HardSigmoid, [alpha, beta]
          Div(Mul(%f, Clip(Add(%f, b), lo, hi)), d)   ClipMulDiv, [b, lo, hi, d]
                                                  (Paddle's written-out hardswish; either
                                                  order of the Mul's and the Add's operands)

Why: a convolution whose offset is added in float (a BatchNormalization folded from an
NNCF or QAT export, LowerConvFloatOutput), or whose activation stays a float island
(Paddle's hardswish, kept float by quantization for accuracy), runs as ConvInteger and
then two to six float passes over its output, each a runtime step that writes and reads
the whole tensor. As one node, the native target runs the stage on pieces of a row that
stay in L1 (tensor_ops.h ``acc_to_quant``), one step instead of several.

Numerics: exact. ``AccumulatorToQuant`` is defined as the nodes it replaces, in order
(reference/accumulator.py): AccumulatorToFloat's twin, then the activation nodes' own
reference functions (``nn_conv.fused_gate``, as the float ``quanta::Conv`` fuses them),
then QuantizeLinear's twin; the native kernel composes the native kernels of those same
steps, each bit-exact with its twin.
"""

from __future__ import annotations

import math

import numpy as np

from quanta.ir.graph import Node, Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import describe
from quanta.passes.rules.fuse_float_gate import clip_mul_div_params

QUANTA_DOMAIN = "quanta"  # quanta.kernels.reference.accumulator (kernels sit below passes)

__all__ = ["FuseAccumulatorToQuant"]

_A2F = "quanta::AccumulatorToFloat"
_EIGHT_BIT = (np.uint8, np.int8)


class _ToQuant(Rule):
    """Shared check and rewrite: ``f`` is an AccumulatorToFloat's float32 output read by
    the activation's nodes only; ``y`` a per-tensor 8-bit QuantizeLinear with constant
    scale and zero point."""

    def activation(self, m: Match) -> tuple[str, list[float]] | NoMatch:
        return "", []

    def check(self, m: Match) -> Match | NoMatch:
        q = m.root
        for attr in (
            "output_dtype",
            "precision",
        ):  # the kernel's type and division: the zero point's, float32
            if q.attrs.get(attr) not in (None, 0):
                return NoMatch(f"{q.label} sets {attr}")
        if not m.is_const("ys") or (m["yz"] is not None and not m.is_const("yz")):
            return NoMatch("the QuantizeLinear's scale or zero point is not a constant")
        ys = np.asarray(m.const("ys"))
        if ys.size != 1 or ys.dtype != np.float32:
            return NoMatch(f"y_scale {describe(m['ys'])} is not one float32 value")
        s = float(ys.reshape(()))
        if not (math.isfinite(s) and s > 0.0):
            return NoMatch(f"y_scale {s} is not positive and finite")
        if m["yz"] is None:
            return NoMatch("the QuantizeLinear has no zero point (its type would be uint8 by default)")
        yz = np.asarray(m.const("yz"))
        if yz.size != 1 or yz.dtype.type not in _EIGHT_BIT:
            return NoMatch(f"y_zero_point {describe(m['yz'])} is not one uint8 / int8 value")
        f = m.value("f")
        if f.type is None or str(f.type.elem) != "f32":
            return NoMatch("the accumulator stage's output is not float32")
        acc_node = m.node("f")
        if any(not v.is_const for v in acc_node.inputs[1:] if v is not None):
            return NoMatch(f"{acc_node.label}'s bias, scale or float bias is not a constant")
        act = self.activation(m)
        if isinstance(act, NoMatch):
            return act
        m.data["act"] = act
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        acc_node: Node = m.node("f")
        y = m.value("y")
        act, params = m.data["act"]
        inputs = list(acc_node.inputs) + [None] * (4 - len(acc_node.inputs))
        attrs: dict = {}
        if act:
            attrs["activation"] = act
            if params:
                attrs["activation_params"] = [float(p) for p in params]
        return b.op(
            "AccumulatorToQuant",
            [*inputs[:4], m["ys"], m["yz"]],
            attrs,
            domain=QUANTA_DOMAIN,
            types=result_type(shape_from=y, elem_from=y),
            name=f"{acc_node.name or 'acc'}/to_quant",
        )


class AccumulatorToQuantPlain(_ToQuant):
    """%y = QuantizeLinear(%f = quanta::AccumulatorToFloat(...), sy, zy)"""

    pattern = f"y = QuantizeLinear(f = {_A2F}(...), ys, yz?)"


class AccumulatorToQuantSilu(_ToQuant):
    """%y = QuantizeLinear(Mul(%f, Sigmoid(%f)), sy, zy)"""

    pattern = f"y = QuantizeLinear(g = Mul(f = {_A2F}(...), s = Sigmoid(f)), ys, yz?)"

    def activation(self, m: Match) -> tuple[str, list[float]] | NoMatch:
        return "SiLU", []


class AccumulatorToQuantSiluSwapped(AccumulatorToQuantSilu):
    """%y = QuantizeLinear(Mul(Sigmoid(%f), %f), sy, zy)"""

    pattern = f"y = QuantizeLinear(g = Mul(s = Sigmoid(f = {_A2F}(...)), f), ys, yz?)"


class AccumulatorToQuantHardSwish(_ToQuant):
    """%y = QuantizeLinear(HardSwish(%f), sy, zy)"""

    pattern = f"y = QuantizeLinear(g = HardSwish(f = {_A2F}(...)), ys, yz?)"

    def activation(self, m: Match) -> tuple[str, list[float]] | NoMatch:
        return "HardSwish", []


class AccumulatorToQuantHardSigmoid(_ToQuant):
    """%y = QuantizeLinear(HardSigmoid(%f) {alpha, beta}, sy, zy)"""

    pattern = f"y = QuantizeLinear(g = HardSigmoid(f = {_A2F}(...)), ys, yz?)"

    def activation(self, m: Match) -> tuple[str, list[float]] | NoMatch:
        a = m.node("g").attrs
        # float32 parameters, as the HardSigmoid kernels compute with them
        return "HardSigmoid", [float(np.float32(a.get("alpha", 0.2))), float(np.float32(a.get("beta", 0.5)))]


class AccumulatorToQuantClipMulDiv(_ToQuant):
    """%y = QuantizeLinear(Div(Mul(%f, Clip(Add(%f, b), lo, hi)), d), sy, zy)"""

    pattern = (
        f"y = QuantizeLinear(g = Div(mm = Mul(f = {_A2F}(...), c = Clip(a = Add(...), ...)), d), ys, yz?)"
    )

    def activation(self, m: Match) -> tuple[str, list[float]] | NoMatch:
        params = clip_mul_div_params(m.value("f"), m.node("a"), m.node("c"), m["d"])
        if isinstance(params, NoMatch):
            return params
        return "ClipMulDiv", params


class AccumulatorToQuantClipMulDivSwapped(AccumulatorToQuantClipMulDiv):
    """The same with the Mul's operands swapped: Div(Mul(Clip(Add(%f, b)), %f), d)."""

    pattern = (
        f"y = QuantizeLinear(g = Div(mm = Mul(c = Clip(a = Add(...), ...), f = {_A2F}(...)), d), ys, yz?)"
    )


class FuseAccumulatorToQuant(RewritePass):
    """The rules above as one pass (the module docstring)."""

    name = "fuse_accumulator_to_quant"
    rules = (
        AccumulatorToQuantPlain(),
        AccumulatorToQuantSilu(),
        AccumulatorToQuantSiluSwapped(),
        AccumulatorToQuantHardSwish(),
        AccumulatorToQuantHardSigmoid(),
        AccumulatorToQuantClipMulDiv(),
        AccumulatorToQuantClipMulDivSwapped(),
    )
