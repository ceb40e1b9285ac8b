"""Quantization propagation through views: views run on quantized values.

A view (Reshape, Transpose, Flatten, Squeeze, Unsqueeze, Slice, Gather, MaxPool) only
moves or selects elements, so it commutes with any elementwise map applied to every
element the same way, such as per-tensor DequantizeLinear / QuantizeLinear::

    View(DQ(q)) == DQ(View(q))        View(Q(x)) == Q(View(x))

MaxPool selects the maximum, and commutes with a monotone non-decreasing map:
``max(DQ(a), DQ(b)) = DQ(max(a, b))`` (scale > 0) and ``max(Q(a), Q(b)) = Q(max(a, b))``.

Rules (exact, bit for bit; for MaxPool after QuantizeLinear NaN aside, see below)::

    %y = View(%f = DequantizeLinear(%q, %s, %z), ...) -> %y = DequantizeLinear(View(%q, ...), %s, %z)
                                                                        MoveDequantizeAfterView
    %y = QuantizeLinear(%v = View(%x, ...), %s, %z)   -> %y = View(QuantizeLinear(%x, %s, %z), ...)
                                                                        MoveQuantizeBeforeView

Split and Concat (MoveDequantizeAfterSplit, MoveDequantizeAfterConcat: exact, one
per-tensor type on every operand) move DequantizeLinear below them too (NNCF quantizes a
Split's input and a Concat's inputs, not their outputs); the Concat rule is part of
instruction selection (``lower_rules``), since in the qdq stage only views read
quantized values::

    Split(DQ(q)) -> DQ(Split(q)[i])          Concat(DQ(q1), DQ(q2), ...) -> DQ(Concat(q1, q2, ...))

After them, a ``DQ -> view -> Q`` chain with one set of parameters becomes
``view -> DQ -> Q``, and :mod:`.remove_noops` removes the pair. The moved view keeps
the element type of its input (docs/design.md: pure views keep their input's element type),
so it now carries a quantized type.

Limits, each a NoMatch reason: per-axis quantization (a view may move or mix the
quantization axis); MaxPool storage other than int8/uint8 (ONNX MaxPool's integer
types); MaxPool's Indices output in use. ``Q(MaxPool(x))`` vs ``MaxPool(Q(x))``
differs only when a window holds NaN (MaxPool propagates NaN, which Q maps to qmin;
the max of quantized values then ignores it).
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.ir.types import QuantType
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import node_qtype

__all__ = [
    "VIEWS",
    "MoveDequantizeAfterConcat",
    "MoveDequantizeAfterSplit",
    "MoveDequantizeAfterView",
    "MoveQuantizeBeforeView",
    "PropagateViews",
]

VIEWS = ("Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Gather", "MaxPool")
_MAXPOOL_STORAGE = (np.dtype(np.int8), np.dtype(np.uint8))


def _check_view(m: Match, view_name: str, qt: QuantType | None) -> NoMatch | None:
    view = m.node(view_name)
    if qt is None:
        return NoMatch("scale / zero point are not constants")
    if qt.axis is not None:
        return NoMatch(
            f"per-axis quantization (axis {qt.axis}): a view may move or mix the quantization axis"
        )
    if view.op_type == "MaxPool":
        if np.dtype(qt.numpy) not in _MAXPOOL_STORAGE:
            return NoMatch(f"MaxPool takes int8/uint8 storage, not {qt.storage}")
        if any(v.uses or any(v is o for o in m.graph.outputs) for v in view.outputs[1:]):
            return NoMatch("MaxPool's Indices output is used")
    return None


class MoveDequantizeAfterView(Rule):
    """%y = View(%f = DequantizeLinear(%q, %s, %z), ...) -> %y = DequantizeLinear(View(%q, ...), %s, %z)"""

    pattern = "y = " + "|".join(VIEWS) + "(f = DequantizeLinear(q, s, z?), ...)"
    shared_ok = frozenset({"f"})  # the DequantizeLinear stays for its other users

    def check(self, m: Match) -> Match | NoMatch:
        qt = node_qtype(m.node("f"), m["q"], m["s"], m["z"])
        refused = _check_view(m, "y", qt)
        return m if refused is None else refused

    def rewrite(self, m: Match, b: Builder) -> Value:
        view, dq = m.root, m.node("f")
        y, q = m.value("y"), m.value("q")
        # a view keeps its input's element type: the moved view carries q's quantized type
        moved = b.op(
            view.op_type,
            [q, *view.inputs[1:]],
            view.attrs,
            types=result_type(shape_from=y, elem_from=q),
            name=view.name or None,
            out_names=[f"{y.name}_q"],
            attr_types=view.attr_types,
        )
        return b.op(
            "DequantizeLinear",
            [moved, m["s"], m["z"]],
            dq.attrs,
            types=result_type(shape_from=y, elem_from=y),  # the replaced view output's contract
            name=dq.name or None,
            attr_types=dq.attr_types,
        )


class MoveQuantizeBeforeView(Rule):
    """%y = QuantizeLinear(%v = View(%x, ...), %s, %z) -> %y = View(QuantizeLinear(%x, %s, %z), ...)"""

    pattern = "y = QuantizeLinear(v = " + "|".join(VIEWS) + "(x, ...), s, z?)"

    def check(self, m: Match) -> Match | NoMatch:
        qt = node_qtype(m.root, m["y"], m["s"], m["z"])
        refused = _check_view(m, "v", qt)
        return m if refused is None else refused

    def rewrite(self, m: Match, b: Builder) -> Value:
        qn, view = m.root, m.node("v")
        x, y = m.value("x"), m.value("y")
        # the quantizer's result type is the replaced QuantizeLinear's (y), at x's shape
        quantized = b.op(
            "QuantizeLinear",
            [x, m["s"], m["z"]],
            qn.attrs,
            types=result_type(shape_from=x, elem_from=y),
            name=qn.name or None,
            attr_types=qn.attr_types,
        )
        # a view keeps its input's element type (here: the quantized type)
        return b.op(
            view.op_type,
            [quantized, *view.inputs[1:]],
            view.attrs,
            types=result_type(shape_from=y, elem_from=quantized),
            name=view.name or None,
            attr_types=view.attr_types,
        )


class MoveDequantizeAfterSplit(Rule):
    """%y0, %y1, ... = Split(DequantizeLinear(%q, %s, %z), ...)
    -> %yi = DequantizeLinear(Split(%q, ...)[i], %s, %z)

    Split selects elements, as a view does (per-tensor parameters: exact). NNCF
    quantizes a Split's input, not its outputs (YOLOv8's C2f blocks): the outputs then
    reach the next Conv as float values, which stays float."""

    pattern = "Split(f = DequantizeLinear(q, s, z?), ...)"
    shared_ok = frozenset({"f"})

    def check(self, m: Match) -> Match | NoMatch:
        qt = node_qtype(m.node("f"), m["q"], m["s"], m["z"])
        if qt is None:
            return NoMatch("scale / zero point are not constants")
        if qt.axis is not None:
            return NoMatch(f"per-axis quantization (axis {qt.axis}): Split may cut the quantization axis")
        return m

    def rewrite(self, m: Match, b: Builder) -> list[Value]:
        split, dq = m.root, m.node("f")
        q = m.value("q")
        outs = split.outputs
        # Split selects elements: its outputs keep q's quantized element type
        parts = b.op(
            "Split",
            [q, *split.inputs[1:]],
            split.attrs,
            types=[result_type(shape_from=o, elem_from=q) for o in outs],
            n_outputs=len(outs),
            name=split.name or None,
            out_names=[f"{o.name}_q" for o in outs],
            attr_types=split.attr_types,
        )
        parts = [parts] if len(outs) == 1 else list(parts)
        return [
            b.op(
                "DequantizeLinear",
                [p, m["s"], m["z"]],
                dq.attrs,
                types=result_type(shape_from=o, elem_from=o),
                attr_types=dq.attr_types,
            )
            for p, o in zip(parts, outs, strict=True)
        ]


class MoveDequantizeAfterConcat(Rule):
    """%y = Concat(DequantizeLinear(%q1, %s, %z), DequantizeLinear(%q2, %s, %z), ...)
    -> %y = DequantizeLinear(Concat(%q1, %q2, ...), %s, %z)

    With one per-tensor type on every input (NNCF's unified Concat scales) the
    dequantization commutes with the concatenation: exact. NNCF leaves the Concat's
    output unquantized and the Conv reading it then stays float. A Concat whose result
    is quantized again is LowerConcat's (QLinearConcat requantizes in the same pass)."""

    pattern = "y = Concat(...)"

    def check(self, m: Match) -> Match | NoMatch:
        concat = m.root
        if any(u.op_type == "QuantizeLinear" for u in m.value("y").consumers()):
            return NoMatch("the result is quantized again (LowerConcat's QLinearConcat)", "pattern")
        types = []
        for k, v in enumerate(concat.inputs):
            dq = v.producer if v is not None else None
            if dq is None or dq.op_type != "DequantizeLinear":
                return NoMatch(f"input {k} does not come from DequantizeLinear", "pattern")
            qt = node_qtype(dq, dq.input(0), dq.input(1), dq.input(2))
            if qt is None or qt.axis is not None:
                return NoMatch(f"input {k} is not quantized per tensor with constant parameters")
            types.append(qt)
        if any(t != types[0] for t in types[1:]):
            return NoMatch("the inputs are quantized with different parameters")
        m.data["qtype"] = types[0]
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        concat = m.root
        dqs = [v.producer for v in concat.inputs]
        first = dqs[0]
        joined = b.op(
            "Concat",
            [dq.input(0) for dq in dqs],
            concat.attrs,
            types=result_type(shape_from=m["y"], elem_from=m.data["qtype"]),  # a concatenation keeps the type
            name=concat.name or None,
            out_names=[f"{m['y'].name}_q"],
            attr_types=concat.attr_types,
        )
        return b.op(
            "DequantizeLinear",
            [joined, first.input(1), first.input(2)],
            first.attrs,
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            attr_types=first.attr_types,
        )


class PropagateViews(RewritePass):
    name = "propagate_views"
    # MoveDequantizeAfterConcat runs with instruction selection (lower_rules): in the
    # qdq stage only views read quantized values, and Concat is not one
    rules = (MoveDequantizeAfterView(), MoveQuantizeBeforeView(), MoveDequantizeAfterSplit())
