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
rank broadcasts x to more dimensions); more than ``MAX_GROUP`` members; a single table op.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Node, Value, result_type
from quanta.ir.op_facts import MS as MS_DOMAIN
from quanta.passes.lower.lookup import MAX_GROUP, QUANTA_DOMAIN, lookup_codes
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import describe
from quanta.passes.rules.fold_constants import Evaluator

__all__ = ["CODE_MAPS8", "ComposeCodeMaps8", "ComposeCodeMaps8Pass"]

_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))

#: (domain, op) of the members -> (the activation inputs, {activation input: its (scale,
#: zero point) inputs, "y": the output's})
CODE_MAPS8: dict[tuple[str, str], tuple[tuple[int, ...], dict[int | str, tuple[int, int]]]] = {
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


class ComposeCodeMaps8(Rule):
    """A group of 8-bit elementwise ops that is a function of one tensor's codes ->
    ``quanta::QLinearLookup`` (module docstring, (T7))."""

    # (a domain names one alternative: each is written with its own)
    pattern = (
        "y = com.microsoft::QLinearAdd|com.microsoft::QLinearMul|com.microsoft::QLinearSigmoid"
        "|com.microsoft::QLinearLeakyRelu(...)"
    )

    def __init__(self, evaluator: Evaluator | None = None) -> None:
        self.evaluator = evaluator

    def check(self, m: Match) -> Match | NoMatch:
        if self.evaluator is None:
            return NoMatch("no evaluator to compute the table with (the runtime injects one)")
        why = _refusal(m.root)
        if why:
            return NoMatch(why)
        # grown to a fixed point: a producer joins once every reader of its result is a
        # member, which may only hold after a later member joined (x · Sigmoid(x))
        members: dict[int, Node] = {id(m.root): m.root}
        outputs = {id(o) for o in m.graph.outputs}
        grown = True
        while grown:
            grown = False
            for n in list(members.values()):
                for i in CODE_MAPS8[(n.domain, n.op_type)][0]:
                    v = n.inputs[i]
                    assert v is not None  # typed 8-bit by _refusal
                    p = v.producer
                    if (
                        v.is_const
                        or p is None
                        or id(p) in members
                        or _refusal(p)
                        or id(v) in outputs
                        or not all(id(c) in members for c in v.consumers())
                    ):
                        continue
                    members[id(p)] = p
                    grown = True
                    if len(members) > MAX_GROUP:
                        return NoMatch(f"more than {MAX_GROUP} ops on the codes of one tensor")
        x: Value | None = None
        reader: tuple[Node, int] | None = None  # a member reading x, and where
        for n in members.values():
            for i in CODE_MAPS8[(n.domain, n.op_type)][0]:
                v = n.inputs[i]
                assert v is not None
                if v.is_const or (v.producer is not None and id(v.producer) in members):
                    continue  # one element (checked by _refusal): broadcast to every element
                if x is not None and v is not x:
                    return NoMatch(f"the group reads two tensors ({describe(x)}, {describe(v)})")
                x, reader = v, (n, i)
        if x is None or reader is None:
            return NoMatch("the group reads no run-time tensor (constant folding's business)")
        if len(members) == 1 and m.root.op_type in _TABLES:
            return NoMatch("one table op: nothing to compose")
        shape = x.type.shape if x.type is not None else None
        for n in members.values():
            out = n.outputs[0]
            if shape is None or out.type is None or out.type.shape != shape:
                return NoMatch(f"{n.label}: its result is not of the shape of {describe(x)}")
        order = {id(n): i for i, n in enumerate(m.graph.nodes)}
        nodes = sorted(members.values(), key=lambda n: order[id(n)])
        m.data.update(nodes=nodes, x=x, reader=reader)
        m.matched.extend(reversed([n for n in nodes if n is not m.root]))
        return m

    def _table(self, m: Match) -> np.ndarray:
        assert self.evaluator is not None
        x: Value = m.data["x"]
        dt = _codes(x)
        assert dt is not None
        values: dict[int, np.ndarray] = {id(x): lookup_codes(dt)}
        for node in m.data["nodes"]:
            args = [
                None if v is None else values[id(v)] if id(v) in values else np.asarray(v.const)
                for v in node.inputs
            ]
            values[id(node.outputs[0])] = np.asarray(self.evaluator(node, args)[0])
        table = values[id(m.root.outputs[0])]
        if table.size != 256:  # a one-element constant operand of higher rank than the codes
            raise ValueError(f"the group gave {table.size} codes for 256")
        return table.reshape(256)

    def rewrite(self, m: Match, b: Builder) -> Value:
        try:
            table = np.ascontiguousarray(self._table(m))
        except Exception as e:  # a reference kernel refusing the codes
            b.refuse(f"the table could not be computed: {type(e).__name__}: {e}")
            raise
        reader, i = m.data["reader"]
        sx_i, zx_i = CODE_MAPS8[(reader.domain, reader.op_type)][1][i]
        sy_i, zy_i = CODE_MAPS8[(m.root.domain, m.root.op_type)][1]["y"]
        x: Value = m.data["x"]
        sx, zx = reader.input(sx_i), reader.input(zx_i)
        sy, zy = m.root.input(sy_i), m.root.input(zy_i)
        if zx is None:
            zx = b.const("x_zero_point", np.zeros((), _codes(x)))
        if zy is None:
            zy = b.const("y_zero_point", np.zeros((), table.dtype))
        ops = [n.attrs.get("function") or n.op_type for n in m.data["nodes"]]
        return b.op(
            "QLinearLookup",
            [x, sx, zx, sy, zy, b.const(f"{m.root.name or 'lookup'}_table", table)],
            {"function": ", ".join(str(o) for o in ops)},
            domain=QUANTA_DOMAIN,
            types=result_type(shape_from=m.value("y"), elem_from=m.value("y")),
            name=m.root.name or None,
        )


class ComposeCodeMaps8Pass(RewritePass):
    """ComposeCodeMaps8 to a fixed point."""

    name = "compose_code_maps8"

    def __init__(self, evaluator: Evaluator | None = None) -> None:
        super().__init__([ComposeCodeMaps8(evaluator)])
