"""The group walk and the table that ComposeCodeMaps8 ((T7), ``code_maps8.py``) and
ComposeCodeMaps16 ((T6), ``lookup.py``) share: a group of integer elementwise ops that is
a function of one tensor's codes becomes one ``quanta::QLinearLookup`` of ``2^bits``
entries.

The group grows from the matched op to a fixed point: a producer joins once every reader
of its result is a member, which may hold only after a later member joined
(``x · Sigmoid(x)``: the Sigmoid's result is read by the product alone, x by both). A
value read outside the group or a graph output stays materialized: the group ends there.
A one-element constant operand broadcasts to every element; every other activation input
is the one run-time tensor x. The table is the group's own nodes run on every code of x
with the reference kernels the unlowered steps run (the injected evaluator): exact by
construction, whatever the members round.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from quanta.ir.graph import Node, Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, Rule
from quanta.passes.rules._util import describe
from quanta.passes.rules.fold_constants import Evaluator

__all__ = ["MAX_GROUP", "QUANTA_DOMAIN", "CodeGroupRule", "CodeSpec", "lookup_codes"]

QUANTA_DOMAIN = "quanta"
#: the largest group turned into one table (GELU written out is five nodes)
MAX_GROUP = 16

#: (the activation inputs, {activation input: its (scale, zero point) inputs, "y": the
#: output's})
CodeSpec = tuple[tuple[int, ...], Mapping[int | str, tuple[int, int]]]


def lookup_codes(storage: np.dtype) -> np.ndarray:
    """The codes of an 8- or 16-bit storage type in table order: entry ``i`` is the code
    whose bits are ``i`` (uint8: 0..255; int8: 0..127, then -128..-1; 16-bit alike)."""
    dt = np.dtype(storage)
    bits = np.uint16 if dt.itemsize == 2 else np.uint8
    return np.arange(1 << (8 * dt.itemsize), dtype=bits).view(dt)


class CodeGroupRule(Rule):
    """A group of elementwise ops on one tensor's codes -> ``quanta::QLinearLookup``.

    A subclass names its members (``spec``), why a node cannot be one (``refusal``), the
    table's size (``entries``) and why a group of one op stays as it is
    (``single_refusal``)."""

    entries: int

    def __init__(self, evaluator: Evaluator | None = None) -> None:
        self.evaluator = evaluator

    def spec(self, n: Node) -> CodeSpec:
        raise NotImplementedError

    def refusal(self, n: Node) -> str:
        """Why ``n`` cannot be a member ("" if it can)."""
        raise NotImplementedError

    def single_refusal(self, n: Node) -> str:
        """Why a group of ``n`` alone stays as it is ("" if it becomes a table)."""
        raise NotImplementedError

    def check(self, m: Match) -> Match | NoMatch:
        if self.evaluator is None:
            return NoMatch("no evaluator to compute the table with (the runtime injects one)")
        why = self.refusal(m.root)
        if why:
            return NoMatch(why)
        members: dict[int, Node] = {id(m.root): m.root}
        outputs = {id(o) for o in m.graph.outputs}
        grown = True
        while grown:
            grown = False
            for n in list(members.values()):
                for i in self.spec(n)[0]:
                    v = n.inputs[i]
                    assert v is not None  # typed by refusal()
                    p = v.producer
                    if (
                        v.is_const
                        or p is None
                        or id(p) in members
                        or self.refusal(p)
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
            for i in self.spec(n)[0]:
                v = n.inputs[i]
                assert v is not None
                if v.is_const or (v.producer is not None and id(v.producer) in members):
                    continue  # one element (checked by refusal()): broadcast to every element
                if x is not None and v is not x:
                    return NoMatch(f"the group reads two tensors ({describe(x)}, {describe(v)})")
                x, reader = v, (n, i)
        if x is None or reader is None:
            return NoMatch("the group reads no run-time tensor (constant folding's business)")
        if len(members) == 1 and self.single_refusal(m.root):
            return NoMatch(self.single_refusal(m.root))
        shape = x.type.shape if x.type is not None else None
        for n in members.values():
            out = n.outputs[0]
            if shape is not None and out.type is not None and out.type.shape == shape:
                continue
            # shapes inference left unknown (com.microsoft QLinearMul / QLinearSigmoid of an
            # ORT QOperator file): an elementwise member of x and group values has x's
            # shape by induction; only a constant operand of a rank above x's (or of any
            # rank when x's is unknown) broadcasts x to more dimensions. A group of one op
            # keeps the strict test: a lone QLinearAdd of a one-element constant after a
            # QLinearMatMul is FuseQLinearMatMulAdd's (the GEMM's output stage, one step
            # where a table would be a second)
            if len(members) == 1:
                return NoMatch(f"{n.label}: its result is not of the shape of {describe(x)}")
            rank = len(shape) if shape is not None else None
            consts = [
                n.inputs[i] for i in self.spec(n)[0] if n.inputs[i] is not None and n.inputs[i].is_const
            ]
            if not all(
                np.ndim(c.const) == 0 or (rank is not None and np.ndim(c.const) <= rank) for c in consts
            ):
                return NoMatch(f"{n.label}: its result is not of the shape of {describe(x)}")
        order = {id(n): i for i, n in enumerate(m.graph.nodes)}
        nodes = sorted(members.values(), key=lambda n: order[id(n)])
        m.data.update(nodes=nodes, x=x, reader=reader)
        m.matched.extend(reversed([n for n in nodes if n is not m.root]))
        return m

    def _table(self, m: Match) -> np.ndarray:
        assert self.evaluator is not None
        x: Value = m.data["x"]
        assert x.type is not None and x.type.elem is not None
        values: dict[int, np.ndarray] = {id(x): lookup_codes(np.dtype(x.type.elem.numpy))}  # type: ignore[union-attr]
        for node in m.data["nodes"]:
            args = [
                None if v is None else values[id(v)] if id(v) in values else np.asarray(v.const)
                for v in node.inputs
            ]
            values[id(node.outputs[0])] = np.asarray(self.evaluator(node, args)[0])
        table = values[id(m.root.outputs[0])]
        if table.size != self.entries:  # a one-element constant of higher rank than the codes
            raise ValueError(f"the group gave {table.size} codes for {self.entries}")
        return table.reshape(self.entries)

    def rewrite(self, m: Match, b: Builder) -> Value:
        try:
            table = np.ascontiguousarray(self._table(m))
        except Exception as e:  # a reference kernel refusing the codes
            b.refuse(f"the table could not be computed: {type(e).__name__}: {e}")
            raise
        reader, i = m.data["reader"]
        sx_i, zx_i = self.spec(reader)[1][i]
        sy_i, zy_i = self.spec(m.root)[1]["y"]
        x: Value = m.data["x"]
        sx, zx = reader.input(sx_i), reader.input(zx_i)
        sy, zy = m.root.input(sy_i), m.root.input(zy_i)
        if zx is None:
            zx = b.const("x_zero_point", np.zeros((), np.dtype(x.type.elem.numpy)))  # type: ignore[union-attr]
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
