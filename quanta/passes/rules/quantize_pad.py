"""A Pad between a DequantizeLinear and a QuantizeLinear of one type runs on the integers.

The quantizer treats Pad as neutral (quantize/qdq.py): its output keeps its input's
parameters, so a quantized graph holds ``DQ -> Pad -> Q`` with one type on both sides.
Lowering leaves that group float (no QLinear op pads); this rule moves the Pad onto the
integers, as ONNX Runtime's QDQ Pad does::

    %y = QuantizeLinear(%p = Pad(%f = DequantizeLinear(%q, %s, %z), %pads, %v?, %axes?), %s, %z)
      -> %y = Pad(%q, %pads, %qv, %axes?)           qv = Q(v) = saturate(rint(v / s) + z)

Exact, bit for bit: every cell of ``p`` is either a cell of ``f`` (constant mode's
interior; every cell for reflect / edge / wrap, which only copy), where
``Q(DQ(q)) = q`` (quanta.passes.qmath.dq_q_is_identity, checked), or the pad value v,
where Q gives ``Q(v)`` (eq. (2), :func:`quanta.passes.qmath.quantize_value`; v omitted is
0, so ``qv = z``). The new Pad's output carries the QuantizeLinear output's type (the
replaced op's contract).

It runs on the lowered graph (after instruction selection): in the QDQ stage only views
and Q/DQ may touch quantized values (the verifier), and Pad is no view there.

NoMatch reasons: scales / zero points not constants; the two types differ; per-axis
parameters; ``Q(DQ(q)) = q`` not guaranteed for the type; a pad value that is not a
constant scalar.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.ir.types import TensorType
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.qmath import dq_q_is_identity, quantize_value
from quanta.passes.rules._util import describe, node_qtype

__all__ = ["PadOnQuantizedValues", "QuantizePad"]


class PadOnQuantizedValues(Rule):
    """%y = QuantizeLinear(%p = Pad(%f = DequantizeLinear(%q, %s, %z), %pads, %v?, %axes?), %s, %z)
    -> %y = Pad(%q, %pads, Q(%v), %axes?)"""

    pattern = "y = QuantizeLinear(p = Pad(f = DequantizeLinear(q, s, z?), pads, v?, axes?), s2, z2?)"
    shared_ok: ClassVar[frozenset[str]] = frozenset(
        {"f"}
    )  # the DequantizeLinear stays for its other readers (a Shape)

    def check(self, m: Match) -> Match | NoMatch:
        qin = node_qtype(m.node("f"), m["q"], m["s"], m["z"])
        qout = node_qtype(m.root, m["y"], m["s2"], m["z2"])
        if qin is None or qout is None:
            return NoMatch("scale / zero point are not constants")
        if qin != qout:
            return NoMatch(f"the Pad is dequantized as {qin} and quantized as {qout}: a requantization")
        if qin.axis is not None:
            return NoMatch(
                f"per-axis quantization (axis {qin.axis}): one pad value cannot serve every channel"
            )
        reason = dq_q_is_identity(qin)
        if reason is not None:
            return NoMatch(f"Q(DQ(q)) = q is not guaranteed: {reason}")
        v = m["v"]
        if v is None:
            value = 0.0
        elif not v.is_const or np.asarray(v.const).size > 1:
            return NoMatch(f"the pad value {describe(v)} is not a constant scalar")
        elif np.asarray(v.const).size == 0:
            value = 0.0
        else:
            value = float(np.asarray(v.const).reshape(()))
        m.data["qtype"] = qin
        m.data["qv"] = quantize_value(value, qin)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        pad, y, qt = m.node("p"), m.value("y"), m.data["qtype"]
        qv = b.const(
            f"{pad.name or 'pad'}_value_quantized", np.asarray(m.data["qv"], qt.numpy), TensorType(qt, ())
        )
        inputs = [m.value("q"), m.value("pads"), qv]
        if m["axes"] is not None:
            inputs.append(m["axes"])
        return b.op(
            "Pad",
            inputs,
            pad.attrs,
            types=result_type(shape_from=y, elem_from=y),  # the replaced QuantizeLinear output's contract
            name=pad.name or None,
            attr_types=pad.attr_types,
        )


class QuantizePad(RewritePass):
    name = "quantize_pad"
    rules = (PadOnQuantizedValues(),)
