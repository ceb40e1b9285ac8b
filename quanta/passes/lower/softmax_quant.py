"""An attention score's float stage and its quantization as one node (FuseSoftmaxQuant)::

    %v = Mul(%x, c)                            optional: c one float32 constant (a plain
                                               Softmax -> QuantizeLinear fuses too)
    %w = Add(%v, %mask)                        optional: a float32 mask (either operand
                                               order; numpy broadcasting)
    %s = Softmax(%w) {axis = last}
    %y = QuantizeLinear(%s, sy, zy)            per tensor, 8-bit, constant sy and zy
      -> %y = quanta::SoftmaxQuant(%x, c?, %mask?, sy, zy)

Why: a quantized transformer's attention computes Q·Kᵀ in integers and then, per head,
four float passes over a [heads, tokens, tokens] tensor (the 1/√d scale, the padding
mask, Softmax, QuantizeLinear), each a runtime step that writes and reads the whole
tensor. As one node, the native target runs them on one row at a time in L1
(tensor_ops.h ``softmax_quant``).

A Softmax that reads a DequantizeLinear directly is left alone: ``Q(Softmax(DQ(x)))`` is
the pattern of the integer lowerings (QLinearSoftmax, the integer-only IntSoftmax).

Numerics: exact. ``SoftmaxQuant`` is defined as the nodes it replaces, in order
(reference/accumulator.py: the Mul's and Add's float32 roundings, Softmax's twin,
QuantizeLinear's twin); the native kernel composes the native kernels of those same
steps, each bit-exact with its twin. Mul and Add are commutative in IEEE arithmetic, so
either operand order is the same node.
"""

from __future__ import annotations

import math

import numpy as np

from quanta.ir.graph import Node, Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import describe

__all__ = ["FuseSoftmaxQuant", "FuseSoftmaxQuantPass"]

QUANTA_DOMAIN = "quanta"
_EIGHT_BIT = (np.uint8, np.int8)


def quant_output_refusal(m: Match) -> NoMatch | None:
    """Why the match's root QuantizeLinear (``ys``, ``yz``) cannot end a fused 8-bit
    step, or None: no ``output_dtype`` / ``precision``, constant per-tensor parameters, a
    positive finite float32 scale, a uint8 / int8 zero point."""
    q = m.root
    for attr in ("output_dtype", "precision"):
        if q.attrs.get(attr) not in (None, 0):
            return NoMatch(f"{q.label} sets {attr}")
    if not m.is_const("ys") or m["yz"] is None or not m.is_const("yz"):
        return NoMatch("the QuantizeLinear's scale or zero point is not a constant")
    ys, yz = np.asarray(m.const("ys")), np.asarray(m.const("yz"))
    if ys.size != 1 or ys.dtype != np.float32:
        return NoMatch(f"y_scale {describe(m['ys'])} is not one float32 value")
    if not (math.isfinite(float(ys.reshape(()))) and float(ys.reshape(())) > 0.0):
        return NoMatch("y_scale is not positive and finite")
    if yz.size != 1 or yz.dtype.type not in _EIGHT_BIT:
        return NoMatch(f"y_zero_point {describe(m['yz'])} is not one uint8 / int8 value")
    return None


def _f32(v: Value | None) -> bool:
    return v is not None and v.type is not None and str(v.type.elem) == "f32"


def _only_use(v: Value, node: Node, graph) -> bool:
    return all(u is node for u, _ in v.uses) and not any(o is v for o in graph.outputs)


def _single_producer(v: Value, op: str, graph) -> Node | None:
    """v's producer when it is an ai.onnx ``op`` whose output only the next node reads."""
    p = v.producer
    if p is None or p.domain or p.op_type != op or len(v.uses) != 1 or any(o is v for o in graph.outputs):
        return None
    return p


class FuseSoftmaxQuant(Rule):
    """QuantizeLinear(Softmax(Add?(Mul?(x, c), mask))) -> quanta::SoftmaxQuant(x, c?, mask?)"""

    pattern = "y = QuantizeLinear(s = Softmax(w), ys, yz?)"

    def __init__(self, opset: int = 17):
        self.opset = opset

    def check(self, m: Match) -> Match | NoMatch:
        q, sm = m.root, m.node("s")
        refused = quant_output_refusal(m)
        if refused is not None:
            return refused
        w, s = m.value("w"), m.value("s")
        if not _f32(w) or w.shape is None or not _only_use(s, q, m.graph):
            return NoMatch("the Softmax is not float32 of a known rank read by the QuantizeLinear only")
        if w.producer is not None and w.producer.op_type == "DequantizeLinear" and not w.producer.domain:
            # Q(Softmax(DQ(x))): the integer lowerings' pattern (IntSoftmax of a 16-bit x)
            return NoMatch("the Softmax reads a DequantizeLinear: left to the integer lowerings")
        rank = len(w.shape)
        axis = sm.attrs.get("axis", -1 if self.opset >= 13 else 1)
        if rank < 1 or axis not in (-1, rank - 1):
            return NoMatch(f"the Softmax's axis {axis} is not the last of rank {rank}")
        x, scale, mask = w, None, None
        add = _single_producer(w, "Add", m.graph)
        if add is not None and all(_f32(v) for v in add.inputs):
            # the operand a Mul by a constant scales (or that has the Add's shape) is x:
            # Add commutes, so the choice decides the native kernel's speed, never the value
            a, b = add.inputs
            scaled_a = self._scaled(a, m) is not None
            x, mask = (
                (b, a)
                if not scaled_a and (self._scaled(b, m) is not None or b.shape == w.shape != a.shape)
                else (a, b)
            )
        found = self._scaled(x, m)
        if found is not None:
            x, scale = found
        m.data.update(x=x, scale=scale, mask=mask)
        return m

    @staticmethod
    def _scaled(v: Value, m: Match) -> tuple[Value, Value] | None:
        """(x, c) when ``v = Mul(x, c)`` (either order), c one float32 constant, read by
        the next node only."""
        mul = _single_producer(v, "Mul", m.graph)
        if mul is None:
            return None
        for chain, c in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
            if (
                c is not None
                and c.is_const
                and np.asarray(c.const).dtype == np.float32
                and np.asarray(c.const).size == 1
                and _f32(chain)
            ):
                return chain, c
        return None

    def rewrite(self, m: Match, b: Builder) -> Value:
        y = m.value("y")
        scale = m.data["scale"]
        return b.op(
            "SoftmaxQuant",
            [m.data["x"], scale, m.data["mask"], m["ys"], m["yz"]],
            domain=QUANTA_DOMAIN,
            types=result_type(shape_from=y, elem_from=y),
            name=f"{m.node('s').name or 'softmax'}/quant",
        )


class FuseSoftmaxQuantPass(RewritePass):
    """FuseSoftmaxQuant (the module docstring)."""

    name = "fuse_softmax_quant"

    def __init__(self, opset: int = 17):
        super().__init__([FuseSoftmaxQuant(opset)])
