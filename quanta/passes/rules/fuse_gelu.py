"""GELU written out as five float ops becomes one fused Gelu.

    %d = Div(%x, √2);  %e = Erf(%d);  %a = Add(%e, 1)               (either Add order)
    (A) %y = Mul(Mul(%x, %a), 0.5)        (export of ``0.5 * x * (1 + erf(x/√2))``, BERT)
    (B) %y = Mul(Mul(%x, 0.5), %a)        (export of ``x * 0.5 * (1 + erf(x/√2))``, HF)
      -> %y = Gelu(%x)                    ai.onnx Gelu-20 (approximate "none") when the
                                          model imports opset >= 20, else com.microsoft Gelu
    (C) %y = Mul(Mul(%x, %a), %c)         %c any other float32 constant: the 0.5 with a
                                          per-channel factor folded in (quanta's own
                                          SmoothQuant files: c = 0.5 · s[n])
      -> %y = Mul(Gelu(%x), 2·%c)                                                  FuseGelu

Why: on a float island (a dynamically quantized BERT's feed-forward) the five ops are
five passes over a [tokens, 4·hidden] float tensor; the fused kernel is one.

Numerics: the fused op computes eq. (G1) of docs/float-ops.md,
``fl(fl(0.5 · x) · fl(1 + erf(fl(x / f32(√2)))))``, with the same erf as the Erf node
and the same division. Form (B) is exactly that sequence, bit for bit. Form (A)
multiplies by 0.5 last instead of first; scaling by a power of two commutes with
rounding, so the results are identical except where ``x · (1 + erf)`` or the result is
subnormal or overflows (|x| > 1.7e38): there the two orders may differ in the last
subnormal bit or give ±inf instead of a finite value. Form (C) by the same argument:
with u = fl(x · a), Gelu's fl(0.5·x · a) is 0.5·u exactly and 2·c is exact (the rule
refuses a c whose double overflows), so fl(0.5·u · 2·c) rounds the real product u·c,
as the file's fl(u · c) does, with the same subnormal / overflow exceptions. Only these exact constants match:
the divisor is f32(√2) (0x3FB504F3), the addend 1 and the factor 0.5; a multiplication by
1/√2 (a different rounding) is left alone.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Node, Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules.fuse_gelu_tanh import FuseGeluTanh

__all__ = ["FuseGelu", "FuseGeluPass"]

_SQRT2 = np.float32(np.sqrt(2.0))


def _const_scalar(v: Value | None, value: float) -> bool:
    if v is None or not v.is_const:
        return False
    a = np.asarray(v.const)
    return a.dtype == np.float32 and a.size == 1 and a.reshape(()) == np.float32(value)


def _producer(v: Value | None, op: str) -> Node | None:
    if v is None or v.producer is None or v.producer.domain or v.producer.op_type != op:
        return None
    return v.producer


def _single_use(v: Value, graph) -> bool:
    return len(v.uses) == 1 and not any(o is v for o in graph.outputs)


def _erf_branch(a: Value | None) -> tuple[Value, list[Node]] | None:
    """For ``a = Add(Erf(Div(x, √2)), 1)`` (either Add order): (x, [add, erf, div])."""
    add = _producer(a, "Add")
    if add is None:
        return None
    e = add.inputs[1] if _const_scalar(add.inputs[0], 1.0) else add.inputs[0]
    if not _const_scalar(add.inputs[1] if e is add.inputs[0] else add.inputs[0], 1.0):
        return None
    erf = _producer(e, "Erf")
    div = _producer(erf.inputs[0], "Div") if erf is not None else None
    if div is None or not _const_scalar(div.inputs[1], float(_SQRT2)):
        return None
    return div.inputs[0], [add, erf, div]


class FuseGelu(Rule):
    """Mul(Mul(x, Add(Erf(Div(x, √2)), 1)), 0.5) and Mul(Mul(x, 0.5), Add(...)) -> Gelu(x);
    Mul(Mul(x, Add(...)), c) -> Mul(Gelu(x), 2·c)"""

    pattern = "y = Mul(p, q)"

    def __init__(self, opset: int = 17):
        self.opset = opset

    def check(self, m: Match) -> Match | NoMatch:
        y = m.value("y")
        if y.elem is None or str(y.elem) != "f32":
            return NoMatch("not a float32 Mul")
        p, q = m.value("p"), m.value("q")
        found = (
            self._form_a(m, p, q) or self._form_a(m, q, p) or self._form_b(m, p, q) or self._form_b(m, q, p)
        )
        scale = None
        if found is None:
            scaled = self._form_c(m, p, q) or self._form_c(m, q, p)
            if scaled is not None:
                found, scale = (scaled[0], scaled[1]), scaled[2]
        if found is None:
            return NoMatch(
                "not a GELU: Mul(Mul(x, Add(Erf(Div(x, √2)), 1)), 0.5 or a constant) or Mul(Mul(x, 0.5), Add(...))"
            )
        x, inner = found
        if scale is not None and (x.shape is None or m.value("y").shape != x.shape):
            return NoMatch("the constant factor broadcasts the GELU's output to another shape")
        for node in inner:
            if not _single_use(node.outputs[0], m.graph):
                return NoMatch(f"the intermediate '{node.outputs[0].name}' has other users")
        m.data.update(x=x, inner=inner, scale=scale)
        return m

    @staticmethod
    def _form_a(m: Match, mul_out: Value, half: Value | None) -> tuple[Value, list[Node]] | None:
        """y = Mul(Mul(x, a), 0.5); ``half`` None: any factor (form C checks it)"""
        if half is not None and not _const_scalar(half, 0.5):
            return None
        mul = _producer(mul_out, "Mul")
        if mul is None:
            return None
        for x, a in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
            branch = _erf_branch(a)
            if branch is not None and branch[0] is x:
                return x, [mul, *branch[1]]
        return None

    @staticmethod
    def _form_c(m: Match, mul_out: Value, c: Value) -> tuple[Value, list[Node], np.ndarray] | None:
        """y = Mul(Mul(x, a), c), c a float32 constant whose double is finite"""
        if c is None or not c.is_const:
            return None
        arr = np.asarray(c.const)
        if arr.dtype != np.float32:
            return None
        with np.errstate(over="ignore"):
            twice = np.multiply(arr, np.float32(2), dtype=np.float32)
        if not np.all(np.isfinite(twice)):  # an infinite or NaN c, or one whose double overflows
            return None
        found = FuseGelu._form_a(m, mul_out, None)
        return None if found is None else (*found, twice)

    @staticmethod
    def _form_b(m: Match, half_x: Value, a: Value) -> tuple[Value, list[Node]] | None:
        """y = Mul(Mul(x, 0.5), a)"""
        branch = _erf_branch(a)
        mul = _producer(half_x, "Mul")
        if branch is None or mul is None:
            return None
        x = branch[0]
        if (mul.inputs[0] is x and _const_scalar(mul.inputs[1], 0.5)) or (
            mul.inputs[1] is x and _const_scalar(mul.inputs[0], 0.5)
        ):
            return x, [mul, *branch[1]]
        return None

    def rewrite(self, m: Match, b: Builder) -> Value:
        x = m.data["x"]
        kwargs = {"domain": "com.microsoft"} if self.opset < 20 else {"attrs": {"approximate": "none"}}
        types = result_type(shape_from=m["y"], elem_from=m["y"])
        g = b.op("Gelu", [x], types=types, **kwargs)
        scale = m.data["scale"]
        if scale is None:
            return g
        return b.op("Mul", [g, b.const(f"{m['y'].name}_gelu_scale", scale)], types=types)


class FuseGeluPass(RewritePass):
    """FuseGelu and FuseGeluTanh (passes/rules/fuse_gelu_tanh.py): the erf and the tanh
    GELU of a quantized graph's float islands."""

    name = "fuse_gelu"

    def __init__(self, opset: int = 17):
        super().__init__([FuseGelu(opset), FuseGeluTanh(opset)])
