"""A float MatMul whose weight is stored as 8-bit integers times a scale (a file that
another tool compressed "weight only": int8 constants, ``Cast`` then ``Mul`` by a
per-column scale, float activations) runs as ONNX Runtime's dynamic quantization::

    %y = MatMul(%a: float32, Mul(Cast(%q: const int8|uint8 [K, N], to=FLOAT), %s: const))
      -> %y = com.microsoft::DynamicQuantizeMatMul(%a, %q, %s', %z0)   DynamicWeightMatMul
    %y = Add(DynamicQuantizeMatMul(%a, %q, %s', %z0), %bias: const float32 [N])
      -> %y = com.microsoft::DynamicQuantizeMatMul(%a, %q, %s', %z0, %bias)     FuseDynamicBias

(either operand order of the ``Mul`` and of the ``Add``), with ``%s'`` the scale as one
float32 per column ``[N]`` (``%s`` scalar, ``[N]`` or ``[1, N]``) and ``%z0`` zeros of
``%q``'s type. The weight's integers are exactly the ones the file stores (``Cast(q)·s``
is ``DequantizeLinear(q, s, 0)`` bit for bit), so only the activation is quantized: per
tensor, asymmetric uint8, on every run (``DynamicQuantizeLinear``, eq. (10) of
docs/quantization-math.md), which is what ONNX Runtime's ``quantize_dynamic`` writes for a
MatMul. Not exact: the result differs from the float MatMul by the activation's
rounding; the multiply-accumulates run in integers (the reason to rewrite). Fusing the
bias is exact: DynamicQuantizeMatMul adds it as the float Add after it does
(reference/ms_qgemm.py, eq. (3)).

Opt-in: ``SessionOptions.dynamic_weight_only`` runs this rewrite before the session's
pipeline; without it a session keeps the file's float semantics (the weight folds into a
float constant), as ONNX Runtime and OpenVINO run weight-only files.

Refused: a weight that is not a 2-D 8-bit constant, a scale that is not per column or
scalar, a non-float32 activation, and a ``Mul`` or ``Cast`` read by other nodes too (the
float weight is then needed anyway).
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.ir.op_facts import MS
from quanta.ir.types import F32
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule

__all__ = [
    "DynamicWeightMatMul",
    "DynamicWeightMatMuls",
    "FuseDynamicBias",
    "FuseDynamicBiasFirst",
    "WeightOnlyMatMul",
    "WeightOnlyMatMuls",
]


class DynamicWeightMatMul(Rule):
    """%y = MatMul(a, Mul(Cast(q: const 8-bit), s: const)) -> DynamicQuantizeMatMul"""

    pattern = "y = MatMul(a, w = Mul(x1, x2))"

    def check(self, m: Match) -> Match | NoMatch:
        a = m["a"]
        if a.elem != F32:
            return NoMatch("the activation is not float32", "pattern")
        w = m.node("w")
        for cast_v, s_v in ((m["x1"], m["x2"]), (m["x2"], m["x1"])):
            cast = cast_v.producer
            if cast is None or cast.op_type != "Cast" or cast.domain or not s_v.is_const:
                continue
            q_v = cast.inputs[0]
            if q_v is None or not q_v.is_const or int(cast.attrs.get("to", 0)) != 1:
                continue
            if len(cast_v.consumers()) != 1 or any(o is cast_v for o in m.graph.outputs):
                return NoMatch(f"the Cast '{cast.name}' is read by other nodes too")
            q = np.asarray(q_v.const)
            s = np.asarray(s_v.const)
            if q.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)) or q.ndim != 2:
                return NoMatch(f"the weight is {q.dtype} of rank {q.ndim}; expected an 8-bit matrix")
            n = q.shape[1]
            if s.dtype != np.float32 or s.size not in (1, n) or (s.size == n and s.shape[-1] != n):
                return NoMatch(f"the scale {s.dtype}{list(s.shape)} is not per column of [K, {n}] or scalar")
            if s.ndim > 2 or not np.all(np.isfinite(s)):
                return NoMatch("the scale is not a finite vector")
            m.data.update(q=q_v, s=s.reshape(-1) if s.size == n else s.reshape(()), w=w)
            return m
        return NoMatch("the weight is not Mul(Cast(8-bit constant), constant scale)", "pattern")

    def rewrite(self, m: Match, b: Builder) -> Value:
        q_v: Value = m.data["q"]
        q = np.asarray(q_v.const)
        scale = b.const(f"{q_v.name}_scale", np.asarray(m.data["s"], np.float32))
        zero = b.const(f"{q_v.name}_zero_point", np.zeros((), q.dtype))
        return b.op(
            "DynamicQuantizeMatMul",
            [m["a"], q_v, scale, zero],
            domain=MS,
            name=m.root.name,
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
        )


class FuseDynamicBias(Rule):
    """%y = Add(DynamicQuantizeMatMul(a, b, s, z), bias: const [N]) -> one node with bias"""

    pattern = "y = Add(mm = com.microsoft::DynamicQuantizeMatMul(a, b, s, z?), bias)"

    def check(self, m: Match) -> Match | NoMatch:
        mm = m.node("mm")
        if len(mm.inputs) > 4 and mm.inputs[4] is not None:
            return NoMatch("the DynamicQuantizeMatMul has a bias already")
        bias_v, b_v = m["bias"], m["b"]
        if not bias_v.is_const or not b_v.is_const:
            return NoMatch("the bias or the weight is not a constant")
        bias = np.asarray(bias_v.const)
        n = np.asarray(b_v.const).shape[-1]
        if bias.dtype != np.float32 or bias.size != n or bias.shape[-1] != n:
            return NoMatch(f"the bias {bias.dtype}{list(bias.shape)} is not one float32 per column")
        if m["y"].shape is None or m["y"].shape != m["mm"].shape:
            return NoMatch("the Add broadcasts beyond the product's shape (or shapes are unknown)")
        m.data["bias"] = bias.reshape(-1)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        mm = m.node("mm")
        bias = b.const(f"{mm.name}_bias", np.asarray(m.data["bias"], np.float32))
        return b.op(
            "DynamicQuantizeMatMul",
            [*mm.inputs[:4], bias],
            domain=MS,
            name=mm.name,  # coverage pairs the source MatMul with its integer form by name
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
        )


class FuseDynamicBiasFirst(FuseDynamicBias):
    """%y = Add(bias: const [N], DynamicQuantizeMatMul(a, b, s, z)) -> one node with bias"""

    pattern = "y = Add(bias, mm = com.microsoft::DynamicQuantizeMatMul(a, b, s, z?))"


class DynamicWeightMatMuls(RewritePass):
    name = "dynamic_weight_matmul"

    def __init__(self) -> None:
        super().__init__([DynamicWeightMatMul(), FuseDynamicBias(), FuseDynamicBiasFirst()])


class WeightOnlyMatMul(DynamicWeightMatMul):
    """%y = MatMul(a, Mul(Cast(q: const 8-bit), s: const)) -> quanta::MatMulW8(a, q, s')

    The file's float semantics kept: MatMulW8's weight is eq. (W8) of reference/w8.py,
    ``f32(f32(q − 0) · s)``, the bytes of ``Mul(Cast(q), s)`` (a product of float32 values is
    commutative, and ``q − 0`` is ``q``); its product is the float GEMM's. What changes is
    what the native kernel streams per run: the 8-bit weight instead of its float32 copy
    (docs/float-ops.md "Weight-only 8-bit MatMul"). Runs before the constants fold (they
    would turn the Cast and Mul into that float32 copy)."""

    def rewrite(self, m: Match, b: Builder) -> Value:
        q_v: Value = m.data["q"]
        n = np.asarray(q_v.const).shape[1]
        s = np.ascontiguousarray(np.broadcast_to(np.asarray(m.data["s"], np.float32).reshape(-1), (n,)))
        scale = b.const(f"{q_v.name}_scale", s)
        return b.op(
            "MatMulW8",
            [m["a"], q_v, scale],
            domain="quanta",
            name=m.root.name,
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
        )


class WeightOnlyMatMuls(RewritePass):
    name = "weight_only_matmul"

    def __init__(self) -> None:
        super().__init__([WeightOnlyMatMul()])
