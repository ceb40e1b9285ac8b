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
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value
from quanta.ir.types import TensorType, elem_from_numpy
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules.fold_constants import Evaluator

__all__ = ["FoldFloatWeight", "FoldFloatWeights"]


def _reads_integers(op_type: str) -> bool:
    return op_type == "QuantizeLinear" or op_type.startswith("QLinear") or op_type in (
        "MatMulInteger",
        "ConvInteger",
        "MatMulIntegerToFloat",
        "QGemm",
        "DynamicQuantizeMatMul",
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


class FoldFloatWeights(RewritePass):
    name = "fold_float_weights"

    def __init__(self, evaluator: Evaluator):
        super().__init__([FoldFloatWeight(evaluator)])
