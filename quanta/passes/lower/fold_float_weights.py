"""After instruction selection: a DequantizeLinear of a constant that only float
operators read is a float weight computed at every run. Fold it into a float32 constant.

    %w = DequantizeLinear(%c: const, %s: const, %z: const?)   (every consumer a float op)
      -> %w = const  (the evaluator's DequantizeLinear of the constants)        FoldFloatWeight

Why after lowering: before it, DequantizeLinear(const) is a quantized weight that the
lowering consumes as integers (fold_constants.KEEP keeps it); what is left once the
integer operators have been selected feeds float islands (LayerNormalization's gamma
and beta in ONNX Runtime's QDQ files, the bias of a float Add, a Conv that stayed float)
and would be dequantized again on every run. Exact: the constant is the evaluator's
(the reference's) DequantizeLinear output, the very bits the node computed at run time.
Kept: a DequantizeLinear read by a QuantizeLinear or an integer operator (nothing to gain
there), and results over ``max_output_elements`` (a model that stays mostly float keeps
its int8 weights compact; 2^22 elements = 16 MiB by default).

An embedding table over that size quantized per row (NNCF's word embeddings: 30522 x 384
int8, one scale per row) is read by a Gather of a few rows; dequantizing the whole table
on every run cost 20 ms on MiniLM. ``GatherDequantizedRows`` gathers the integer rows and
their scales and dequantizes only those::

    %y = Gather(DequantizeLinear(%c: const, %s[V]: const, %z[V]?: const) {axis=0}, %ids) {axis=0}
      -> %y = Mul(Sub?(Cast(Gather(%c, %ids), to=FLOAT), Gather(%z', %ids)), Gather(%s', %ids))

with ``%s'``, ``%z'`` the scales and zero points reshaped to ``[V, 1, ...]`` (they
broadcast over a row) and the zero points as float32. Exact: DequantizeLinear computes
``f32(f32(q - z)·s)`` (reference/quantize.py), and ``q - z`` of 8-bit integers is an
integer below 2^9, exact in float32 whether subtracted before or after the Cast.

A constant requantized (``FoldRequantizedConstants``, run right after the lowering)::

    %y = QuantizeLinear(DequantizeLinear(%c: const, %s, %z?), %s2: const, %z2?: const)
      -> %y = const  (the evaluator's DequantizeLinear, then its QuantizeLinear)   FoldRequantizedConstant

ONNX Runtime's QDQ file of a torch dynamo export quantizes the steps that build a GRU's
W and R from its parameters (Slice the gate blocks, Concat, Unsqueeze) as activations,
each between Q / DQ with its own scale. The views move onto the integers, leaving
Q(DQ(const)) requantizations that fold_constants keeps (DequantizeLinear is in KEEP):
with them folded, the integer Concat / Unsqueeze over constants fold too, and the GRU
reads DequantizeLinear(const), a float weight by FoldFloatWeight. Exact: the constant is
the reference's Q(DQ(c)), the codes the two nodes computed at run time.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.ir.types import TensorType, elem_from_numpy
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules.fold_constants import Evaluator, const_type

__all__ = [
    "FoldFloatWeight",
    "FoldFloatWeights",
    "FoldRequantizedConstant",
    "FoldRequantizedConstants",
    "GatherDequantizedRows",
]


def _reads_integers(op_type: str) -> bool:
    return (
        op_type == "QuantizeLinear"
        or op_type.startswith("QLinear")
        or op_type
        in (
            "MatMulInteger",
            "ConvInteger",
            "MatMulIntegerToFloat",
            "QGemm",
            "DynamicQuantizeMatMul",
        )
    )


class FoldFloatWeight(Rule):
    """%w = DequantizeLinear(const, const, const?) read by float ops only -> const"""

    pattern = "w = DequantizeLinear(c, s, z?)"

    def __init__(self, evaluator: Evaluator, max_output_elements: int = 1 << 22):
        self.evaluator = evaluator
        self.max_output_elements = max_output_elements

    def check(self, m: Match) -> Match | NoMatch:
        for name in ("c", "s", "z"):
            v = m[name]
            if v is not None and not v.is_const:
                return NoMatch(f"input '{v.name}' is not a constant", "pattern")
        w = m.value("w")
        readers = [n for n in w.consumers()]
        if not readers and not any(o is w for o in m.graph.outputs):
            return NoMatch("no consumer (dead code)", "pattern")
        ints = sorted({n.op_type for n in readers if _reads_integers(n.op_type)})
        if ints:
            return NoMatch(f"read by {', '.join(ints)} (a quantized weight stays quantized)")
        c = np.asarray(m.value("c").const)
        if c.size > self.max_output_elements:
            return NoMatch(f"{c.size} elements (> {self.max_output_elements}): the int8 copy is kept")
        node = m.root
        arrays = [None if v is None else v.const for v in node.inputs]
        try:
            out = np.asarray(self.evaluator(node, arrays)[0])
        except Exception as e:  # not foldable here, with the reason
            return NoMatch(f"the evaluator failed: {type(e).__name__}: {e}")
        m.data["value"] = out
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        out = m.data["value"]
        w = m.value("w")
        return b.const(w.name, out, TensorType(elem_from_numpy(out.dtype), tuple(out.shape)))


class GatherDequantizedRows(Rule):
    """%y = Gather(DequantizeLinear(const, const[V], const[V]?) {axis=0}, ids) {axis=0}
    -> Mul(Sub?(Cast(Gather(const, ids)), Gather(z', ids)), Gather(s', ids)) (module docstring)."""

    pattern = "y = Gather(w = DequantizeLinear(c, s, z?), ids)"
    shared_ok = frozenset({"w"})

    def __init__(self, min_elements: int = (1 << 22) + 1):
        # smaller tables are FoldFloatWeight's (max_output_elements): a float constant
        self.min_elements = min_elements

    def check(self, m: Match) -> Match | NoMatch:
        for name in ("c", "s", "z"):
            v = m[name]
            if v is not None and not v.is_const:
                return NoMatch(f"input '{v.name}' is not a constant", "pattern")
        c = np.asarray(m.const("c"))
        s = np.asarray(m.const("s"))
        if c.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)) or c.ndim < 2:
            return NoMatch(f"the table is {c.dtype} of rank {c.ndim}; expected an 8-bit matrix or more")
        if s.dtype != np.float32 or s.shape != (c.shape[0],):
            return NoMatch("the table is not quantized per row (one float32 scale per row, axis 0)")
        if (
            int(m.node("w").attrs.get("axis", 1)) % c.ndim != 0
            or int(m.root.attrs.get("axis", 0)) % c.ndim != 0
        ):
            return NoMatch("the DequantizeLinear's axis or the Gather's axis is not 0")
        if m.node("w").attrs.get("block_size", 0):
            return NoMatch("block-quantized table")
        if c.size < self.min_elements:
            return NoMatch("a small table: FoldFloatWeight makes it a float constant", "pattern")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        c = np.asarray(m.const("c"))
        bcast = (c.shape[0],) + (1,) * (c.ndim - 1)
        table = b.const(m["c"].name, c)  # plain integers: the rows are gathered before any scale applies
        rows = b.op("Gather", [table, m["ids"]], {"axis": 0}, types=None, name=f"{m.root.name}_rows")
        d = b.op("Cast", [rows], {"to": 1}, types=result_type(shape_from=m["y"], elem_from=m["y"]))
        z = m["z"]
        if z is not None and np.any(np.asarray(z.const) != 0):
            zf = b.const(f"{z.name}_rows", np.asarray(z.const).astype(np.float32).reshape(bcast))
            zr = b.op("Gather", [zf, m["ids"]], {"axis": 0}, types=None)
            d = b.op("Sub", [d, zr], types=result_type(shape_from=m["y"], elem_from=m["y"]))
        sf = b.const(f"{m['s'].name}_rows", np.asarray(m.const("s")).reshape(bcast))
        sr = b.op("Gather", [sf, m["ids"]], {"axis": 0}, types=None)
        return b.op("Mul", [d, sr], types=result_type(shape_from=m["y"], elem_from=m["y"]))


class FoldFloatWeights(RewritePass):
    name = "fold_float_weights"

    def __init__(self, evaluator: Evaluator):
        super().__init__([FoldFloatWeight(evaluator), GatherDequantizedRows()])


class FoldRequantizedConstant(Rule):
    """%y = QuantizeLinear(DequantizeLinear(const, const, const?), const, const?) -> const"""

    pattern = "y = QuantizeLinear(w = DequantizeLinear(c, s, z?), s2, z2?)"
    shared_ok = frozenset({"w"})

    def __init__(self, evaluator: Evaluator):
        self.evaluator = evaluator

    def check(self, m: Match) -> Match | NoMatch:
        for name in ("c", "s", "z", "s2", "z2"):
            v = m[name]
            if v is not None and not v.is_const:
                return NoMatch(f"input '{v.name}' is not a constant", "pattern")
        dq, q = m.node("w"), m.root
        try:
            w = np.asarray(self.evaluator(dq, [None if v is None else v.const for v in dq.inputs])[0])
            arrays = [w] + [None if v is None else v.const for v in q.inputs[1:]]
            out = np.asarray(self.evaluator(q, arrays)[0])
        except Exception as e:  # not foldable here, with the reason
            return NoMatch(f"the evaluator failed: {type(e).__name__}: {e}")
        m.data["value"] = out
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        y, out = m.value("y"), m.data["value"]
        return b.const(y.name, out, const_type(out, y))


class FoldRequantizedConstants(RewritePass):
    name = "fold_requantized_constants"

    def __init__(self, evaluator: Evaluator):
        super().__init__([FoldRequantizedConstant(evaluator)])
