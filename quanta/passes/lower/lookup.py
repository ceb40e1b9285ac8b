"""An elementwise function between two 8-bit tensors becomes a 256-entry table.

::

    %y = QuantizeLinear(f(DequantizeLinear(%x, sx, zx)), sy, zy)
      -> %y = quanta::QLinearLookup(%x, sx, zx, sy, zy, %table)                  (LowerLookup)

    table[bits(c)] = QuantizeLinear(f(DequantizeLinear(c, sx, zx)), sy, zy)   for each of the
                                                                              256 codes c

``f`` is any group of float elementwise nodes (``TABLE_OPS``) whose only non-constant
leaf is the one dequantized ``x`` and whose constants are scalars: one activation
(HardSwish, HardSigmoid, Tanh, Exp, Gelu, a Clip or Relu the output quantization does not
imply), a gated pair (SiLU ``Mul(x, Sigmoid(x))``, Mish ``Mul(x, Tanh(Softplus(x)))``,
hardswish before opset 14 ``Mul(x, HardSigmoid(x))``), or arithmetic written out
(``x · Clip(x + 3, 0, 6) / 6``). ``bits(c)`` is the code's byte (int8 -128..-1 sit at
128..255), which is what the table kernel indexes with.

Numerics: the table is computed at compile time by running the group's own nodes on the
256 codes with the reference kernels the unlowered graph runs (the evaluator the runtime
injects, as constant folding's): the DequantizeLinear, each float op in graph order, the
QuantizeLinear. An elementwise float32 function of an element depends only on that
element, so ``table[bits(x)]`` is what the unlowered group computes for ``x``: the
lowering is bit-exact by construction, whatever ``f`` is (TFLite builds its int8
activation tables the same way).

Where ONNX Runtime has an operator for the group (QLinearSigmoid, QLinearLeakyRelu:
LowerUnary), that rule runs first; this rule takes the rest. Refused (each with its
reason): no evaluator; an 8-bit type missing or per-axis on either side; input and output
of different storage (the table kernel maps u8 -> u8 and s8 -> s8); a non-scalar constant
(it would broadcast, and an element would no longer depend on itself alone); a group
value used outside the group; more than ``MAX_GROUP`` nodes.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Node, Value, result_type
from quanta.ir.types import QuantType
from quanta.passes.pattern import Builder, Match, NoMatch, Rule
from quanta.passes.rules._util import describe, node_qtype
from quanta.passes.rules.fold_constants import Evaluator

__all__ = ["MAX_GROUP", "QUANTA_DOMAIN", "QUANTA_TABLE_OPS", "TABLE_OPS", "LowerLookup", "lookup_codes"]

QUANTA_DOMAIN = "quanta"

#: ai.onnx ops that are elementwise functions of their inputs (with numpy broadcasting),
#: so a group of them fed by one tensor and scalar constants is a function of each element
TABLE_OPS = frozenset(
    {
        # unary activations and math
        "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Ceil", "Celu", "Clip", "Cos",
        "Cosh", "Elu", "Erf", "Exp", "Floor", "Gelu", "HardSigmoid", "HardSwish", "Identity",
        "LeakyRelu", "Log", "Mish", "Neg", "Reciprocal", "Relu", "Round", "Selu", "Shrink",
        "Sigmoid", "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh",
        "ThresholdedRelu",
        # binary arithmetic (with scalar constants or group values)
        "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min",
    }
)  # fmt: skip

#: quanta-domain elementwise float32 functions: ONNX Runtime's Sigmoid and Tanh
#: (passes/rules/ort_float_functions.py puts them in place of Sigmoid and Tanh)
QUANTA_TABLE_OPS = frozenset({"MlasLogistic", "MlasTanh"})

#: the storage types the table kernel maps (float8 and 4-bit codes are not its business)
EIGHT_BIT = ("u8", "i8")

#: the largest group turned into one table (GELU written out is five nodes)
MAX_GROUP = 16


def lookup_codes(storage: np.dtype) -> np.ndarray:
    """The 256 codes of an 8-bit storage type in table order: entry ``i`` is the code whose
    byte is ``i`` (uint8: 0..255; int8: 0..127, then -128..-1)."""
    return np.arange(256, dtype=np.uint8).view(np.dtype(storage))


def _elem_dtype(q: QuantType) -> np.dtype:
    return np.dtype(np.uint8 if str(q.storage) == "u8" else np.int8)


class LowerLookup(Rule):
    """``Q(f(DQ(x))) -> quanta::QLinearLookup(x, sx, zx, sy, zy, table)`` (module docstring)."""

    pattern = "y = QuantizeLinear(f, sy, zy?)"

    def __init__(self, evaluator: Evaluator | None = None) -> None:
        self.evaluator = evaluator

    def check(self, m: Match) -> Match | NoMatch:
        if self.evaluator is None:
            return NoMatch("no evaluator to compute the table with (the runtime injects one)")
        q = m.root
        for name in ("sy", "zy"):
            if m[name] is not None and not m[name].is_const:
                return NoMatch(f"{name} {describe(m[name])} is not a constant")
        qy = node_qtype(q, m["y"], m["sy"], m["zy"])
        if qy is None or qy.axis is not None or str(qy.storage) not in EIGHT_BIT:
            return NoMatch(f"output y is not a per-tensor u8/i8 quantized value ({qy})")
        group = self._group(m, m.value("f"))
        if isinstance(group, NoMatch):
            return group
        nodes, dq = group
        x = dq.inputs[0]
        if any(v is not None and not v.is_const for v in dq.inputs[1:]):
            return NoMatch(f"{dq.label}: its scale or zero point is not a constant")
        qx = node_qtype(dq, x, dq.input(1), dq.input(2))
        if qx is None or qx.axis is not None or str(qx.storage) not in EIGHT_BIT:
            return NoMatch(f"input {describe(x)} is not a per-tensor u8/i8 quantized value ({qx})")
        if qx.storage != qy.storage:
            return NoMatch(
                f"input is {qx.storage} and output {qy.storage}; the table maps one 8-bit type to itself"
            )
        rank = len(x.type.shape) if x.type is not None and x.type.shape is not None else 0
        for n in nodes:
            for v in n.inputs:
                if (
                    v is not None
                    and v.is_const
                    and (np.asarray(v.const).size != 1 or np.ndim(v.const) > rank)
                ):
                    return NoMatch(f"{n.label}: constant {describe(v)} is not a scalar of rank <= {rank}")
        m.data.update(nodes=nodes, dq=dq, qx=qx, qy=qy)
        # the group's nodes go with the rewrite (last first: each then has no user left),
        # so the table op can take the name of the group's last op
        m.matched.extend(reversed(nodes))
        return m

    def _group(self, m: Match, f: Value) -> tuple[list[Node], Node] | NoMatch:
        """The float nodes between the one DequantizeLinear and the root, in graph order."""
        graph = m.graph
        members: dict[int, Node] = {}
        dq: Node | None = None
        stack = [f]
        seen: set[int] = set()
        while stack:
            v = stack.pop()
            if id(v) in seen or v.is_const:
                continue
            seen.add(id(v))
            p = v.producer
            if p is None:
                return NoMatch(f"{describe(v)} is not computed from a DequantizeLinear")
            if p.op_type == "DequantizeLinear" and not p.domain:
                if dq is not None and dq is not p:
                    return NoMatch(f"the group reads two dequantized tensors ({dq.label}, {p.label})")
                dq = p
                continue
            if p.op_type not in {"": TABLE_OPS, QUANTA_DOMAIN: QUANTA_TABLE_OPS}.get(p.domain, ()):
                return NoMatch(f"{p.label} is not an elementwise op a table can hold")
            if len(p.outputs) != 1:
                return NoMatch(f"{p.label} has {len(p.outputs)} outputs")
            members[id(p)] = p
            if len(members) > MAX_GROUP:
                return NoMatch(
                    f"more than {MAX_GROUP} nodes between the DequantizeLinear and the QuantizeLinear"
                )
            stack.extend(i for i in p.inputs if i is not None)
        if dq is None or not members:
            return NoMatch("no float op between a DequantizeLinear and the QuantizeLinear")
        for n in members.values():
            out = n.outputs[0]
            if any(o is out for o in graph.outputs):
                return NoMatch(f"'{out.name}' (output of {n.label}) is a graph output")
            for c in out.consumers():
                if id(c) not in members and c is not m.root:
                    return NoMatch(
                        f"'{out.name}' (output of {n.label}) is also used by {c.label} outside the group"
                    )
        order = {id(n): i for i, n in enumerate(graph.nodes)}
        return sorted(members.values(), key=lambda n: order[id(n)]), dq

    def _table(self, m: Match) -> np.ndarray:
        """Run DQ, the group's nodes in graph order and Q on the 256 codes (reference kernels)."""
        assert self.evaluator is not None
        dq: Node = m.data["dq"]
        values: dict[int, np.ndarray] = {}

        def arg(v: Value | None) -> np.ndarray | None:
            if v is None:
                return None
            return values[id(v)] if id(v) in values else np.asarray(v.const)

        codes = lookup_codes(_elem_dtype(m.data["qx"]))
        values[id(dq.inputs[0])] = codes
        for node in [dq, *m.data["nodes"], m.root]:
            outs = self.evaluator(node, [arg(v) for v in node.inputs])
            values[id(node.outputs[0])] = np.asarray(outs[0])
        table = values[id(m.root.outputs[0])].reshape(256)
        if table.dtype != _elem_dtype(m.data["qy"]):
            raise AssertionError(f"table of {m.root.label}: {table.dtype}")
        return table

    def rewrite(self, m: Match, b: Builder) -> Value:
        try:
            table = self._table(m)
        except Exception as e:  # a reference kernel refusing the 256 codes (a bad attribute)
            b.refuse(f"the table could not be computed: {type(e).__name__}: {e}")
            raise
        dq: Node = m.data["dq"]
        ops = [n.op_type for n in m.data["nodes"]]
        sx, zx = dq.inputs[1], dq.input(2)
        zy = m["zy"]
        if zx is None:
            zx = b.const("x_zero_point", np.zeros((), _elem_dtype(m.data["qx"])))
        if zy is None:
            zy = b.const("y_zero_point", np.zeros((), _elem_dtype(m.data["qy"])))
        t = b.const(f"{m.root.name or 'lookup'}_table", table)
        return b.op(
            "QLinearLookup",
            [dq.inputs[0], sx, zx, m["sy"], zy, t],
            {"function": "/".join(ops)},
            domain=QUANTA_DOMAIN,
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            # the group's last op names the table (coverage pairs a node with what it became)
            name=m.value("f").producer.name or m.root.name or None,
        )
