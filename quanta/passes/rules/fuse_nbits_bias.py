"""A constant bias Add after a MatMulNBits becomes the node's own bias input.

Rules (``optimize_float``: float graphs, where ONNX Runtime's ``MatMulNBitsQuantizer``
leaves a Linear layer's bias as an Add after each MatMulNBits)::

    %y = Add(%mm = com.microsoft::MatMulNBits(A, B, scales, zp?, g_idx?), %bias)   (either order)
      -> %y = com.microsoft::MatMulNBits(A, B, scales, zp?, g_idx?, bias)

``bias`` is a float32 constant of N values (shape ``[N]``, or ``[1, …, 1, N]`` of a rank no
higher than A's), the product has no bias yet and is read by the Add alone.

Why: an LLM's decode step (one row of A) is a few microseconds per MatMulNBits; the Add is
one more step and one more pass over the output, while the kernel adds the bias in its
store (w4/nbits_a8.h, the float GEMM's epilogue).

Numerics: exact. MatMulNBits adds its bias last, ``y = f32(t + bias_n)``
(docs/quantization-math.md eqs. (W2), (W9)): the Add's own single rounding of the same
operands, on every target.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.ir.op_facts import MS
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import describe

__all__ = ["FuseNBitsBias"]


class _BiasIntoNBits(Rule):
    """%y = Add(MatMulNBits(A, B, scales, ...), bias: const [N]) -> MatMulNBits(..., bias)"""

    pattern = "y = Add(mm = com.microsoft::MatMulNBits(...), bias)"

    def check(self, m: Match) -> Match | NoMatch:
        mm = m.node("mm")
        if len(mm.inputs) > 5 and mm.inputs[5] is not None:
            return NoMatch(f"the MatMulNBits '{mm.name}' has a bias already")
        n = int(mm.attrs.get("N", -1))
        bias_v = m["bias"]
        if bias_v is None or not bias_v.is_const:
            return NoMatch(f"{describe(bias_v)} is not a constant")
        bias = np.asarray(bias_v.const)
        if bias.dtype != np.float32 or bias.size != n or (bias.ndim and bias.shape[-1] != n):
            return NoMatch(f"the bias {bias.dtype}{list(bias.shape)} is not one float32 per column ({n})")
        # the product is A's shape with N last (ONNX infers no shape for a contrib op's
        # output): the Add broadcasts no further when the bias's rank is at most A's
        a = mm.inputs[0]
        if a is None or a.shape is None:
            return NoMatch(f"the rank of {describe(a)} is unknown")
        if bias.ndim > len(a.shape) or any(d != 1 for d in bias.shape[:-1]):
            return NoMatch(f"the bias {list(bias.shape)} broadcasts beyond the product's shape")
        y = m["y"]
        if y.elem is None or str(y.elem) != "f32":
            return NoMatch(f"the product is {y.elem}, expected f32")
        m.data["bias"] = bias.reshape(n)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        mm = m.node("mm")
        bias = b.const(f"{mm.name or 'matmul_nbits'}_bias", np.asarray(m.data["bias"], np.float32))
        inputs = [*mm.inputs[:5]] + [None] * (5 - len(mm.inputs))
        return b.op(
            "MatMulNBits",
            [*inputs, bias],
            mm.attrs,
            domain=MS,
            name=mm.name or None,
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            attr_types=mm.attr_types,
        )


class _BiasIntoNBitsFirst(_BiasIntoNBits):
    pattern = "y = Add(bias, mm = com.microsoft::MatMulNBits(...))"


class FuseNBitsBias(RewritePass):
    name = "fuse_nbits_bias"
    rules = (_BiasIntoNBits(), _BiasIntoNBitsFirst())
