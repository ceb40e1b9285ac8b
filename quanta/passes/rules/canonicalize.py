"""Rewrite operators into the equivalent form the quantizer and the lowering know.

Rules (each exact, bit for bit)::

    %y = Sum(%a)          -> %a                                           SumOfOne
    %y = Sum(%a, %b)      -> %y = Add(%a, %b)                             SumOfTwoToAdd
    %y = CastLike(%x, %t) -> %y = Cast(%x) {to: %t's element type}        CastLikeToCast

Why: ResNet-style models exported by older tools (Caffe2, opset <= 9) write residual
connections as ``Sum``; the quantizer's Add handling (scales aligned, QLinearAdd after
lowering) would not see them, and the int8 graph would fall back to float at every
residual. ``Sum`` of two inputs is one IEEE float addition with numpy broadcasting,
exactly ``Add``; ``Sum`` of three or more is left alone (its summation order is the
evaluator's). ``CastLike`` (in ONNX's function bodies: Attention's, written out on load
by quanta.ir.onnx_functions) is ``Cast`` to its second input's element type, which the
IR knows: the runtime runs ``Cast`` natively and folds it where its input is constant.
"""

from __future__ import annotations

from quanta.ir.graph import Value, result_type
from quanta.ir.types import FloatType, IntType
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule

__all__ = ["Canonicalize", "CastLikeToCast", "SumOfOne", "SumOfTwoToAdd"]


class SumOfOne(Rule):
    """%y = Sum(%a) -> %a"""

    pattern = "y = Sum(a)"

    def rewrite(self, m: Match, b: Builder) -> Value:
        return m.value("a")


class SumOfTwoToAdd(Rule):
    """%y = Sum(%a, %b) -> %y = Add(%a, %b)"""

    pattern = "y = Sum(a, c, ...)"

    def check(self, m: Match) -> Match | NoMatch:
        if len(m.root.inputs) != 2:
            return NoMatch(f"Sum of {len(m.root.inputs)} inputs (only two are an Add)")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        return b.op(
            "Add",
            [m.value("a"), m.value("c")],
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            name=m.root.name or None,
        )


class CastLikeToCast(Rule):
    """%y = CastLike(%x, %t) -> %y = Cast(%x) {to: elem(%t)}"""

    pattern = "y = CastLike(x, t)"

    def check(self, m: Match) -> Match | NoMatch:
        t = m["t"].type
        if t is None or not isinstance(t.elem, FloatType | IntType):
            return NoMatch("the element type of CastLike's target is unknown or not a plain type")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        attrs = {"to": m["t"].type.elem.onnx}
        if "saturate" in m.root.attrs:
            attrs["saturate"] = m.root.attrs["saturate"]
        return b.op(
            "Cast",
            [m.value("x")],
            attrs,
            types=result_type(shape_from=m["x"], elem_from=m["t"]),
            name=m.root.name or None,
        )


class Canonicalize(RewritePass):
    name = "canonicalize"
    rules = (SumOfOne(), SumOfTwoToAdd(), CastLikeToCast())
