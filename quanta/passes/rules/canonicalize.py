"""Rewrite operators into the equivalent form the quantizer and the lowering know.

Rules (each exact, bit for bit)::

    %y = Sum / Max / Min / Mean(%a) -> %a                                 SumOfOne
    %y = Sum(%a, %b, ...) -> Add(Add(Add(%a, %b), %c), ...) (two: one Add)  SumToAdds
    %y = Max / Min(%a, %b, %c, ...) -> Max / Min(Max / Min(%a, %b), %c)... VariadicToPairs
    %y = Mean(%a, ..., %z)  -> Div(Add(...(Add(%a, %b), ...), %z), n)      MeanToAddsDiv
    %y = CastLike(%x, %t) -> %y = Cast(%x) {to: %t's element type}        CastLikeToCast
    %y = Upsample(%x, %scales) {mode} -> Resize(%x, [roi], %scales)        UpsampleToResize

Why: ResNet-style models exported by older tools (Caffe2, opset <= 9) write residual
connections as ``Sum``; the quantizer's Add handling (scales aligned, QLinearAdd after
lowering) would not see them, and the int8 graph would fall back to float at every
residual. ``Sum`` of two inputs is one IEEE float addition with numpy broadcasting,
exactly ``Add``; of three or more, the left fold the operator's reference computes
(kernels/reference/math_ops.py ``_variadic``: ``functools.reduce``), one Add after the
other, so the quantizer sees each addition (an integer QLinearAdd each) and the float
path runs them natively. Max and Min of three or more fold the same way (max and min only
select); Mean is that Sum divided by the input count in x's type, as its reference.
Upsample (opsets 7-9; deprecated in 10) is Resize with its coordinates: at opsets below
11 the Resize-10 form takes the same (X, scales) and computes asymmetric coordinates
with nearest rounding down, which is Upsample's definition; from 11 on the rule writes
those two modes as attributes and an empty roi. ``CastLike`` (in ONNX's function bodies: Attention's, written out on load
by quanta.ir.onnx_functions) is ``Cast`` to its second input's element type, which the
IR knows: the runtime runs ``Cast`` natively and folds it where its input is constant.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.ir.types import FloatType, IntType
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule

__all__ = [
    "Canonicalize",
    "CastLikeToCast",
    "MeanToAddsDiv",
    "SumOfOne",
    "SumToAdds",
    "UpsampleToResize",
    "VariadicToPairs",
]


class SumOfOne(Rule):
    """%y = Sum(%a) -> %a (and Max, Min, Mean of one input: the input itself)"""

    pattern = "y = Sum|Max|Min|Mean(a)"

    def rewrite(self, m: Match, b: Builder) -> Value:
        return m.value("a")


def _left_fold(m: Match, b: Builder, op: str, inputs: list[Value], last: bool) -> Value:
    """op(op(op(inputs[0], inputs[1]), inputs[2]), ...): the intermediate results typed by
    y's element type (their shapes are the broadcasts so far, left to shape inference);
    ``last``: the final node produces y itself (it keeps the node's name)."""
    y = m["y"]
    acc = inputs[0]
    for i, v in enumerate(inputs[1:], start=2):
        final = last and i == len(inputs)
        acc = b.op(
            op,
            [acc, v],
            types=result_type(shape_from=y if final else None, elem_from=y),
            name=(m.root.name or None) if final else f"{m.root.name or op.lower()}/{op.lower()}{i - 1}",
        )
    return acc


class _LeftFold(Rule):
    """A variadic op of ``fewest`` or more inputs -> its left fold of ``step`` nodes."""

    fewest = 3  # Max / Min of two are already their binary step

    def step(self, m: Match) -> str:
        return m.root.op_type

    def check(self, m: Match) -> Match | NoMatch:
        if len(m.root.inputs) < self.fewest or any(v is None for v in m.root.inputs):
            return NoMatch(f"{m.root.op_type} of {len(m.root.inputs)} inputs")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        return _left_fold(m, b, self.step(m), list(m.root.inputs), True)


class SumToAdds(_LeftFold):
    """%y = Sum(%a, %b, ...) -> Add(Add(Add(%a, %b), %c), ...) (of two: one Add)"""

    pattern = "y = Sum(a, c, ...)"
    fewest = 2

    def step(self, m: Match) -> str:
        return "Add"


class VariadicToPairs(_LeftFold):
    """%y = Max(%a, %b, %c, ...) -> Max(Max(%a, %b), %c)... (and Min)"""

    pattern = "y = Max|Min(a, c, ...)"


class MeanToAddsDiv(Rule):
    """%y = Mean(%a, %b, ...) -> Div(Add(Add(%a, %b), ...), n)"""

    pattern = "y = Mean(a, c, ...)"

    def check(self, m: Match) -> Match | NoMatch:
        y = m["y"]
        if any(v is None for v in m.root.inputs):
            return NoMatch("an omitted input")
        if y.type is None or not isinstance(y.type.elem, FloatType) or y.type.elem.numpy is None:
            return NoMatch("Mean of a type that is not a known float type")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        inputs = list(m.root.inputs)
        total = _left_fold(m, b, "Add", inputs, False)
        n = b.const("mean_count", np.array(len(inputs), np.dtype(m["y"].type.elem.numpy)))
        return b.op(
            "Div",
            [total, n],
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            name=m.root.name or None,
        )


class UpsampleToResize(Rule):
    """%y = Upsample(%x, %scales?) {mode, scales?} -> Resize(%x, [roi], %scales) {mode}"""

    pattern = "y = Upsample(x, s?)"

    def __init__(self, opset: int | None) -> None:
        self.opset = opset

    def check(self, m: Match) -> Match | NoMatch:
        if self.opset is None:
            return NoMatch("the model's opset is not known")
        mode = m.root.attrs.get("mode", "nearest")
        mode = mode.decode() if isinstance(mode, bytes) else str(mode)
        if mode not in ("nearest", "linear", "bilinear"):
            return NoMatch(f"Upsample mode {mode!r}")
        if m["s"] is None and not m.root.attrs.get("scales"):
            return NoMatch("Upsample without scales")
        m.data["mode"] = "linear" if mode == "bilinear" else mode
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        scales = m["s"]
        if scales is None:  # Upsample-7: an attribute
            scales = b.const("upsample_scales", np.asarray(m.root.attrs["scales"], np.float32))
        attrs: dict = {"mode": m.data["mode"]}
        if self.opset < 11:
            inputs = [m.value("x"), scales]
        else:
            attrs.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
            inputs = [m.value("x"), None, scales]
        return b.op(
            "Resize",
            inputs,
            attrs,
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

    def __init__(self, opset: int | None = None) -> None:
        super().__init__(
            [
                SumOfOne(),
                SumToAdds(),
                VariadicToPairs(),
                MeanToAddsDiv(),
                CastLikeToCast(),
                UpsampleToResize(opset),
            ]
        )
