"""A group of integer elementwise ops that is a function of one tensor's 8-bit codes
becomes one 256-entry table.

::

    y = g(x), g a group of com.microsoft QLinearAdd / QLinearMul (per tensor, the other
        operand a one-element constant or computed from x), QLinearSigmoid,
        QLinearLeakyRelu and quanta QLinearLookup (per tensor) whose only run-time input
        is x
      -> y = quanta::QLinearLookup(x, sx, zx, sy, zy, table)
         table[bits(c)] = g(c) for each of the 256 codes c                        (T7)

Every member maps the code at an element to the code at that element: a one-element
operand broadcasts to every element, and a product or sum of two group values reads
two functions of the same code. So ``g`` on the 256 codes, run with the reference kernels
the unlowered steps run (the injected evaluator, as LowerLookup's tables), is what the
steps compute for each element: (T7) is exact by construction, whatever the members
round. The native table kernel (``lut8``: vpshufb rows on AVX2, vpermi2b with VBMI) is
one pass that costs less than one QLinearAdd / QLinearMul pass, so a single binary member
with a one-element operand is turned into a table too (PP-OCR's recognizer scales and
shifts each HardSwish output by two learnt scalars, ``w0 · x + w1``: two passes over
[1, 64-480, H, W] each, 38 of them a run, one gather each when composed). A single table
op stays as it is (ComposeLookups joins tables in a row).

A value read outside the group (or a graph output) stays materialized: the group ends
there, and the ops before it form a group of their own. Refused (each with its reason): no
evaluator; a member with a per-axis scale or zero point, or a constant operand of more
than one element (a per-channel ``w`` would need a table per channel, whose gather costs
more than the arithmetic it replaces); a group reading two tensors (an LSTM cell's
``f · c``); a member whose result is not of x's shape (a one-element constant of higher
rank broadcasts x to more dimensions; where shape inference left the shapes unknown, as
for the com.microsoft ops of ONNX Runtime's QOperator files, a member whose constant
operands are of rank 0, or of at most x's known rank, has x's shape by induction, unless
it is the group's only op); more than ``MAX_GROUP`` members; a single table op.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Node, Value
from quanta.ir.op_facts import MS as MS_DOMAIN
from quanta.passes.lower.code_group import QUANTA_DOMAIN, CodeGroupRule, CodeSpec
from quanta.passes.pattern import RewritePass
from quanta.passes.rules._util import describe
from quanta.passes.rules.fold_constants import Evaluator

__all__ = ["CODE_MAPS8", "ComposeCodeMaps8", "ComposeCodeMaps8Pass"]

_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))

#: (domain, op) of the members -> (the activation inputs, {activation input: its (scale,
#: zero point) inputs, "y": the output's})
CODE_MAPS8: dict[tuple[str, str], CodeSpec] = {
    (MS_DOMAIN, "QLinearAdd"): ((0, 3), {0: (1, 2), 3: (4, 5), "y": (6, 7)}),
    (MS_DOMAIN, "QLinearMul"): ((0, 3), {0: (1, 2), 3: (4, 5), "y": (6, 7)}),
    (MS_DOMAIN, "QLinearSigmoid"): ((0,), {0: (1, 2), "y": (3, 4)}),
    (MS_DOMAIN, "QLinearLeakyRelu"): ((0,), {0: (1, 2), "y": (3, 4)}),
    (QUANTA_DOMAIN, "QLinearLookup"): ((0,), {0: (1, 2), "y": (3, 4)}),
}
#: members that already are one table each: alone, nothing to gain
_TABLES = frozenset({"QLinearSigmoid", "QLinearLeakyRelu", "QLinearLookup"})


def _codes(v: Value | None) -> np.dtype | None:
    t = v.type if v is not None else None
    if t is None or t.elem is None:
        return None
    try:
        dt = np.dtype(t.elem.numpy)  # an element type without a NumPy storage: not 8-bit codes
    except (AttributeError, TypeError):
        return None
    return dt if dt in _EIGHT_BIT else None


def _refusal(n: Node) -> str:
    """Why ``n`` cannot be a member ("" if it can): an 8-bit elementwise op whose result
    at an element is a function of the codes at that element alone."""
    spec = CODE_MAPS8.get((n.domain, n.op_type))
    if spec is None or len(n.outputs) != 1:
        return f"{n.label} is not an 8-bit elementwise op of the table's members"
    acts, params = spec
    if _codes(n.outputs[0]) is None:
        return f"{n.label}: output {describe(n.outputs[0])} is not of 8-bit codes"
    for i in acts:
        v = n.input(i)
        if v is None or _codes(v) is None:
            return f"{n.label}: input {describe(v)} is not of 8-bit codes"
        if v.is_const and np.asarray(v.const).size != 1:
            return (
                f"{n.label}: constant operand {describe(v)} has more than one element (a table per channel)"
            )
    for k in params.values():
        for i in k:
            v = n.input(i)
            if v is None:
                continue  # an omitted zero point: 0
            if not v.is_const:
                return f"{n.label}: parameter {describe(v)} is not a constant"
            if np.asarray(v.const).size != 1:
                return f"{n.label}: parameter {describe(v)} is not per tensor"
    if n.op_type == "QLinearLookup":
        t = n.input(5)
        if "axis" in n.attrs or t is None or not t.is_const or np.asarray(t.const).shape != (256,):
            return f"{n.label}: not one 256-entry table per tensor"
    return ""


class ComposeCodeMaps8(CodeGroupRule):
    """A group of 8-bit elementwise ops that is a function of one tensor's codes ->
    ``quanta::QLinearLookup`` (module docstring, (T7); the walk and the table:
    passes/lower/code_group.py)."""

    # (a domain names one alternative: each is written with its own)
    pattern = (
        "y = com.microsoft::QLinearAdd|com.microsoft::QLinearMul|com.microsoft::QLinearSigmoid"
        "|com.microsoft::QLinearLeakyRelu(...)"
    )
    entries = 256

    def spec(self, n: Node) -> CodeSpec:
        return CODE_MAPS8[(n.domain, n.op_type)]

    def refusal(self, n: Node) -> str:
        return _refusal(n)

    def single_refusal(self, n: Node) -> str:
        return "one table op: nothing to compose" if n.op_type in _TABLES else ""


class ComposeCodeMaps8Pass(RewritePass):
    """ComposeCodeMaps8 to a fixed point."""

    name = "compose_code_maps8"

    def __init__(self, evaluator: Evaluator | None = None) -> None:
        super().__init__([ComposeCodeMaps8(evaluator)])
