"""A constant bias Add after a float MatMul by a constant weight becomes one
``quanta::MatMulBias`` node (ONNX Runtime's MatMulAddFusion, which makes a Gemm).

Rules (``optimize_float``: float graphs)::

    %y = Add(%mm = MatMul(A, W: const [K, N]), %bias: const)   (either order of the Add)
      -> %y = quanta::MatMulBias(A, W, bias')

``bias`` is float32 with N values (shape ``[N]``, or ``[1, …, 1, N]`` of a rank no higher
than the product's), ``bias'`` the same values as ``[N]``; the product is read by the Add
alone and A has rank ≥ 2 (the product then has A's rank and the Add broadcasts no
further).

Why: a transformer's every linear layer is a MatMul and an Add of its bias; the Add is a
second pass over the product (BERT-base at 256 tokens: 72 of them, 16-64 us each at one
thread), while the float GEMM adds the bias in its store.

Numerics: exact. The twin is the two operators in order (reference/matmul_bias.py); the
native kernel's epilogue adds the bias with one float32 rounding, f32(v + bias[j]), which
is the native Add of the native MatMul's result (docs/float-ops.md "The float GEMM family").
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import describe

__all__ = ["QUANTA_DOMAIN", "FuseMatMulBias"]

QUANTA_DOMAIN = "quanta"


class _BiasIntoMatMul(Rule):
    """%y = Add(MatMul(A, W: const [K, N]), bias: const [N]) -> quanta::MatMulBias(A, W, bias)"""

    pattern = "y = Add(mm = MatMul(a, w), bias)"

    def check(self, m: Match) -> Match | NoMatch:
        w_v, bias_v, a = m["w"], m["bias"], m["a"]
        if w_v is None or not w_v.is_const:
            return NoMatch(f"the weight {describe(w_v)} is not a constant")
        w = np.asarray(w_v.const)
        if w.dtype != np.float32 or w.ndim != 2:
            return NoMatch(f"the weight {w.dtype}{list(w.shape)} is not a float32 matrix")
        n = int(w.shape[1])
        if bias_v is None or not bias_v.is_const:
            return NoMatch(f"{describe(bias_v)} is not a constant")
        bias = np.asarray(bias_v.const)
        if bias.dtype != np.float32 or bias.size != n or (bias.ndim and bias.shape[-1] != n):
            return NoMatch(f"the bias {bias.dtype}{list(bias.shape)} is not one float32 per column ({n})")
        if a is None or a.shape is None or len(a.shape) < 2:
            return NoMatch(f"the rank of {describe(a)} is unknown or below 2")
        if bias.ndim > len(a.shape) or any(d != 1 for d in bias.shape[:-1]):
            return NoMatch(f"the bias {list(bias.shape)} broadcasts beyond the product's shape")
        y = m["y"]
        if y is None or y.elem is None or str(y.elem) != "f32":
            return NoMatch(f"the sum is {None if y is None else y.elem}, expected f32")
        m.data["bias"] = bias.reshape(n)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        mm, y = m.node("mm"), m["y"]
        assert y is not None  # check() refused a missing output
        bias = b.const(f"{mm.name or 'matmul'}_bias", np.asarray(m.data["bias"], np.float32))
        return b.op(
            "MatMulBias",
            [m["a"], m["w"], bias],
            {},
            domain=QUANTA_DOMAIN,
            name=mm.name or None,
            types=result_type(shape_from=y, elem_from=y),
        )


class _BiasIntoMatMulFirst(_BiasIntoMatMul):
    pattern = "y = Add(bias, mm = MatMul(a, w))"


class FuseMatMulBias(RewritePass):
    name = "fuse_matmul_bias"
    rules = (_BiasIntoMatMul(), _BiasIntoMatMulFirst())
