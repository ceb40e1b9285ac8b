"""Concat and Add inputs aligned to one output scale (QDQ form).

AlignConcatInputs (exact, bit for bit)::

    %y = QuantizeLinear(%c = Concat(DQ(%q1, s1, z1), DQ(%q2, s2, z2), ...), %s, %z)
      -> %y = QuantizeLinear(Concat(DQ(Q(DQ(%q1, s1, z1), s, z), s, z), ...), %s, %z)

Every Concat input that is not already of the output's quantized type is requantized
to it (the ``DQ -> Q`` pair in front of it is a requantization the lowering turns into
one integer op), so the Concat itself joins values of one scale and can run on the
integers. Exact because QuantizeLinear is elementwise (it commutes with Concat) and
``Q(DQ(Q(a))) = Q(a)`` for the output type (the round trip of
:func:`quanta.passes.qmath.dq_q_is_identity`, which the rule checks)::

    Q(Concat(a_i)) = Concat(Q(a_i)) = Concat(Q(DQ(Q(a_i)))) = Q(Concat(DQ(Q(a_i))))

AlignAddInputs (NOT exact; opt in with ``AlignScales(add=True)``)::

    %y = QuantizeLinear(%a = Add(DQ(%q1, s1, z1), DQ(%q2, s2, z2)), %s, %z)
      -> %y = QuantizeLinear(Add(DQ(Q(DQ(%q1), s, z), s, z), DQ(Q(DQ(%q2), s, z), s, z)), %s, %z)

With ``u_i = DQ(q_i) / s``, the original computes ``rint(u_1 + u_2)`` (plus rounding
far below 1/2) and the aligned form ``rint(u_1) + rint(u_2)``: each rint moves its
argument by at most 1/2, so the two integers differ by at most 1, and clamping to
[qmin, qmax] keeps that: ``|Δq| <= 1``, an error of at most one output step ``s``.
The rule refuses when an input's representable range does not fit in the output's
(requantizing it would saturate, an unbounded error).
"""

from __future__ import annotations

from typing import ClassVar

from quanta.ir.graph import Node, Value, result_type
from quanta.ir.types import IntType, QuantType
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.qmath import dq_q_is_identity, real_range
from quanta.passes.rules._util import describe, node_qtype

__all__ = ["AlignAddInputs", "AlignConcatInputs", "AlignScales"]


def _output_type(m: Match) -> QuantType | NoMatch:
    qt = node_qtype(m.root, m["y"], m["s"], m["z"])
    if qt is None:
        return NoMatch("output scale / zero point are not constants")
    if qt.axis is not None:
        return NoMatch(f"per-axis output quantization (axis {qt.axis})")
    if not isinstance(qt.storage, IntType):
        return NoMatch(f"output storage {qt.storage} is not an integer type")
    reason = dq_q_is_identity(qt)
    if reason is not None:
        return NoMatch(f"requantizing to the output type may not round-trip: {reason}")
    return qt


def _input_type(v: Value | None, k: int, op: str) -> QuantType | NoMatch:
    dq = v.producer if v is not None else None
    if dq is None or dq.op_type != "DequantizeLinear":
        return NoMatch(f"input {k} of {op} {describe(v)} is not dequantized")
    qt = node_qtype(dq, dq.input(0), dq.input(1), dq.input(2))
    if qt is None:
        return NoMatch(f"input {k} of {op}: its DequantizeLinear has non-constant parameters")
    return qt


def _requantize(b: Builder, m: Match, v: Value, qt: QuantType) -> Value:
    """``DQ(Q(v, s, z), s, z)`` with the output's parameters."""
    qn = m.root
    q = b.op(
        "QuantizeLinear",
        [v, m["s"], m["z"]],
        qn.attrs,
        types=result_type(shape_from=v, elem_from=qt),  # the output's quantized type
        name=f"{qn.name or 'q'}_align",
        out_names=[f"{v.name}_aligned_q"],
        attr_types=qn.attr_types,
    )
    return b.op(
        "DequantizeLinear",
        [q, m["s"], m["z"]],
        {"axis": qn.attrs["axis"]} if "axis" in qn.attrs else {},
        types=result_type(shape_from=v, elem_from=qt.expressed),  # DQ yields the expressed type
        name=f"{qn.name or 'dq'}_align_dq",
        out_names=[f"{v.name}_aligned"],
    )


def _rebuild(b: Builder, m: Match, op: Node, inputs: list[Value | None], mid: Value) -> Value:
    new_op = b.op(
        op.op_type,
        inputs,
        op.attrs,
        types=result_type(shape_from=mid, elem_from=mid),  # the replaced op's contract
        name=op.name or None,
        out_names=[mid.name],
        attr_types=op.attr_types,
    )
    y = m.value("y")
    return b.op(
        "QuantizeLinear",
        [new_op, m["s"], m["z"]],
        m.root.attrs,
        types=result_type(shape_from=y, elem_from=y),  # the replaced QuantizeLinear's contract
        name=m.root.name or None,
        attr_types=m.root.attr_types,
    )


class _AlignInputs(Rule):
    """The inputs of the pattern's node ``node`` (an ``op``) whose type is not the output's
    are requantized to it; ``_refuse`` names an input type the rule leaves alone."""

    node: ClassVar[str]
    op: ClassVar[str]
    aligned: ClassVar[str]  # the reason when every input already has the output type

    def _refuse(self, k: int, t: QuantType, qt: QuantType) -> NoMatch | None:
        return None

    def check(self, m: Match) -> Match | NoMatch:
        qt = _output_type(m)
        if isinstance(qt, NoMatch):
            return qt
        types = []
        for k, v in enumerate(m.node(self.node).inputs):
            t = _input_type(v, k, self.op)
            if isinstance(t, NoMatch):
                return t
            refused = self._refuse(k, t, qt)
            if refused is not None:
                return refused
            types.append(t)
        misaligned = [k for k, t in enumerate(types) if t != qt]
        if not misaligned:
            return NoMatch(self.aligned.format(qt=qt), "pattern")
        m.data.update(qt=qt, misaligned=misaligned)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        op, qt = m.node(self.node), m.data["qt"]
        inputs = [
            _requantize(b, m, v, qt) if k in m.data["misaligned"] else v for k, v in enumerate(op.inputs)
        ]
        return _rebuild(b, m, op, inputs, m.value(self.node))


class AlignConcatInputs(_AlignInputs):
    """%y = QuantizeLinear(%c = Concat(DQ(...), ...), %s, %z) -> every Concat input requantized to (s, z)"""

    pattern = "y = QuantizeLinear(c = Concat(...), s, z?)"
    node, op = "c", "Concat"
    aligned = "every Concat input already has the output type {qt}"


class AlignAddInputs(_AlignInputs):
    """%y = QuantizeLinear(%a = Add(DQ(...), DQ(...)), %s, %z) -> both inputs requantized to (s, z); |Δq| <= 1"""

    pattern = "y = QuantizeLinear(a = Add(f1, f2), s, z?)"
    node, op = "a", "Add"
    aligned = "both Add inputs already have the output type {qt}"

    def _refuse(self, k: int, t: QuantType, qt: QuantType) -> NoMatch | None:
        if t.axis is not None:
            return NoMatch(f"input {k} of Add has per-axis quantization (axis {t.axis})")
        lo, hi = real_range(qt)
        tlo, thi = real_range(t)
        if tlo < lo or thi > hi:
            return NoMatch(
                f"input {k} of Add spans [{tlo:g}, {thi:g}], outside the output's representable range "
                f"[{lo:g}, {hi:g}]: requantizing it would saturate"
            )
        return None


class AlignScales(RewritePass):
    """Concat inputs aligned to the output scale (exact); Add inputs too when ``add``
    (changes results by at most one output step, see the module docstring)."""

    name = "align_scales"

    def __init__(self, add: bool = False):
        super().__init__([AlignConcatInputs(), *([AlignAddInputs()] if add else [])])
