"""A Mul by a constant per-column factor and the QuantizeLinear after it as one node
(FuseMulQuant)::

    %v = Mul(%x, c)                            c a float32 constant: one value, or one per
                                               element of x's last axis (leading 1s)
    %y = QuantizeLinear(%v, sy, zy)            per tensor, 8-bit, constant sy and zy
      -> %y = quanta::MulQuant(%x, c, sy, zy)

Why: quanta's SmoothQuant files divide an activation by its smoothing factor column by
column right before quantizing it (``<value>_smooth_mul``: after every LayerNorm that
feeds a projection, before the attention's output projection, after the GELU), and the
float product is a runtime step that writes and re-reads the whole tensor. As one node
the native target computes the product in registers on its way into QuantizeLinear
(tensor_ops.h ``mul_quant``).

The Mul's output must be read by the QuantizeLinear only; x may have other readers (a
LayerNorm's output also feeds the residual Add).

And the GELU before it (FuseGeluMulQuant)::

    %g = Gelu(%x)                              ai.onnx (approximate "none") or com.microsoft
                                               (FuseGelu's node below opset 20), float32
    %y = quanta::MulQuant(%g, c, sy, zy)       the Gelu's output read by it alone
      -> %y = quanta::MulQuant(%x, c, sy, zy; activation="gelu")

Why: in quanta's SmoothQuant files of BERT-style encoders the FFN's GELU output, a float
tensor four times the hidden width, is written by the Gelu step and read back by the
MulQuant step; fused, the native kernel runs the Gelu on L1-sized pieces of a row and
quantizes each piece while it is still in cache (docs/float-ops.md (OV1)).

Numerics: exact. ``MulQuant`` is defined as the nodes it replaces, in order
(reference/accumulator.py: the Mul's float32 rounding, then QuantizeLinear's twin); the
native kernel composes the same operations (with activation "gelu", float_ops' Gelu run
first, the twin of the Gelu step). Mul is commutative in IEEE arithmetic (a NaN
product, whatever its payload, quantizes to the same code), so either operand order is the
same node.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.passes.lower.softmax_quant import quant_output_refusal
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule

__all__ = ["FuseGeluMulQuant", "FuseMulQuant", "FuseMulQuantPass"]

QUANTA_DOMAIN = "quanta"


def _f32(v: Value | None) -> bool:
    return v is not None and v.type is not None and str(v.type.elem) == "f32"


class FuseMulQuant(Rule):
    """QuantizeLinear(Mul(x, c), sy, zy) -> quanta::MulQuant(x, c, sy, zy)"""

    pattern = "y = QuantizeLinear(v = Mul(a, b), ys, yz?)"

    def check(self, m: Match) -> Match | NoMatch:
        mul = m.node("v")
        refused = quant_output_refusal(m)
        if refused is not None:
            return refused
        if mul.domain:
            return NoMatch(f"{mul.label} is not ai.onnx Mul")
        v = m.value("v")
        if len(v.uses) != 1 or any(o is v for o in m.graph.outputs):
            return NoMatch("the Mul's output has readers besides the QuantizeLinear")
        for x, c in ((m["a"], m["b"]), (m["b"], m["a"])):
            if x is None or c is None or not c.is_const or x.is_const:
                continue
            cc = np.asarray(c.const)
            if not _f32(x) or cc.dtype != np.float32 or x.shape is None or len(x.shape) < 1:
                continue
            last = x.shape[-1]
            if cc.ndim > len(x.shape) or any(d != 1 for d in cc.shape[:-1]):
                continue  # c broadcasts along other axes (or widens x): not per column
            if cc.size != 1 and not (isinstance(last, int) and cc.shape[-1] == last):
                continue
            m.data.update(x=x, c=c)
            return m
        return NoMatch("the Mul is not a float32 activation times a per-column float32 constant")

    def rewrite(self, m: Match, b: Builder) -> Value:
        y = m.value("y")
        c = m.data["c"]
        cc = np.ascontiguousarray(np.asarray(c.const).reshape(-1))
        return b.op(
            "MulQuant",
            [m.data["x"], b.const(f"{c.name}_per_column", cc), m["ys"], m["yz"]],
            domain=QUANTA_DOMAIN,
            types=result_type(shape_from=y, elem_from=y),
            name=f"{m.node('v').name or 'mul'}/quant",
        )


class FuseGeluMulQuant(Rule):
    """quanta::MulQuant(Gelu(x), c, sy, zy) -> quanta::MulQuant(x, c, sy, zy; activation="gelu")"""

    pattern = "y = quanta::MulQuant(g = Gelu|com.microsoft::Gelu(x), c, ys, yz)"

    def check(self, m: Match) -> Match | NoMatch:
        gelu, mq = m.node("g"), m.node("y")
        if gelu.domain not in ("", "com.microsoft"):
            return NoMatch(f"{gelu.label} is not ai.onnx or com.microsoft Gelu")
        if gelu.attrs.get("approximate", "none") != "none":
            return NoMatch(f"{gelu.label} is the tanh approximation, not (G1)")
        if mq.attrs.get("activation", "none") != "none":
            return NoMatch(f"{mq.label} already has an activation")
        g = m.value("g")
        if len(g.uses) != 1 or any(o is g for o in m.graph.outputs):
            return NoMatch("the Gelu's output has readers besides the MulQuant")
        if not _f32(m["x"]):
            return NoMatch("the Gelu's input is not float32")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        y = m.value("y")
        return b.op(
            "MulQuant",
            [m["x"], m["c"], m["ys"], m["yz"]],
            {"activation": "gelu"},
            domain=QUANTA_DOMAIN,
            types=result_type(shape_from=y, elem_from=y),
            name=f"{m.node('g').name or 'gelu'}/mul_quant",
        )


class FuseMulQuantPass(RewritePass):
    """FuseMulQuant and FuseGeluMulQuant (the module docstring)."""

    name = "fuse_mul_quant"

    def __init__(self) -> None:
        super().__init__([FuseMulQuant(), FuseGeluMulQuant()])
