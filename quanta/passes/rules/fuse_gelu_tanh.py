"""The tanh GELU written out as eight float ops becomes one fused op.

    %h = Mul(%x, 0.5);  %p = Pow(%x, 3) | Mul(Mul(%x, %x), %x)         (either operand order)
    %a = Mul(Add(%x, Mul(%p, C)), K);  %t = Tanh(%a) | quanta::MlasTanh(%a)
    %y = Mul(%h, Add(%t, 1))
      -> %y = quanta::MlasGeluTanh(%x)                   the Tanh is ORT's (MlasTanh)
      -> %y = Gelu(%x, approximate="tanh")               a Tanh, the model imports opset >= 20
                                                                               FuseGeluTanh

    C = f32(0.044715) (0x3D372713), K = f32(√(2/π)) (0x3F4C422A)

Why: T5 v1.1 / mT5 / Flan-T5 feed-forwards (``NewGELUActivation``, GPT-2's ``gelu_new``)
export ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`` as eight nodes over a
[tokens, d_ff] tensor; the fused op is one step and one pass. On the int8 T5 encoder
ORT's quantize_dynamic wrote, they are 64 of the plan's steps.

Numerics: exact. Eq. (G2) of docs/float-ops.md is this sequence of float32 operations in
this order (f32(0.5 · x), f32(f32(x · x) · x) — Pow's exponent 3, math_ops.POW_EXACT_FORMS
— the product by C, the sum with x, the product by K, tanh, the sum with 1, the
product), and each is one IEEE operation whichever operand comes first. The tanh is the
graph's own: MLAS's rational tanh for the MlasTanh that ``float_functions`` puts in a
file ORT's quantizer wrote (quanta::MlasGeluTanh, reference/ort_float.py), quanta's
(T1)-(T4) for an ai.onnx Tanh (ai.onnx Gelu-20, approximate "tanh"; before opset 20
there is no ai.onnx Gelu and com.microsoft FastGelu computes another order, so such a
graph is left as it is). Only these constants match.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Node, Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, Rule

__all__ = ["FuseGeluTanh"]

#: the constants of (G2), as float32 (kernels/reference/float_ops.py GELU_K, GELU_C)
GELU_K = np.uint32(0x3F4C422A).view(np.float32)  # f32(√(2/π))
GELU_C = np.uint32(0x3D372713).view(np.float32)  # f32(0.044715)


def _const(v: Value | None, value: np.float32) -> bool:
    """``v`` is a float32 constant of one element equal to ``value``."""
    if v is None or not v.is_const:
        return False
    a = np.asarray(v.const)
    return a.dtype == np.float32 and a.size == 1 and a.ndim <= 1 and a.reshape(()) == value


def _producer(v: Value | None, op: str, domain: str = "") -> Node | None:
    if v is None or v.producer is None or v.producer.domain != domain or v.producer.op_type != op:
        return None
    return v.producer


def _by_const(v: Value | None, op: str, value: np.float32) -> tuple[Node, Value] | None:
    """``v = op(w, value)`` in either operand order: (node, w)."""
    node = _producer(v, op)
    if node is None or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if _const(b, value) and a is not None:
        return node, a
    if _const(a, value) and b is not None:
        return node, b
    return None


def _cube(p: Value, x: Value) -> list[Node] | None:
    """The nodes of ``p = Pow(x, 3)`` or ``Mul(Mul(x, x), x)`` (either order)."""
    pow_ = _by_const(p, "Pow", np.float32(3.0))
    if pow_ is not None:
        return [pow_[0]] if pow_[0].inputs[0] is x else None
    mul = _producer(p, "Mul")
    if mul is None or len(mul.inputs) != 2:
        return None
    for sq, other in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
        square = _producer(sq, "Mul")
        if other is x and square is not None and list(square.inputs) == [x, x]:
            return [mul, square]
    return None


class FuseGeluTanh(Rule):
    """Mul(Mul(x, 0.5), Add(Tanh(Mul(Add(x, Mul(x³, C)), K)), 1)) -> MlasGeluTanh(x) | Gelu(x)"""

    pattern = "y = Mul(p, q)"

    def __init__(self, opset: int = 17):
        self.opset = opset

    def check(self, m: Match) -> Match | NoMatch:
        y = m.value("y")
        if y.elem is None or str(y.elem) != "f32":
            return NoMatch("not a float32 Mul")
        p, q = m.value("p"), m.value("q")
        found = self._match(p, q) or self._match(q, p)
        if found is None:
            return NoMatch(
                "not a tanh GELU: Mul(Mul(x, 0.5), Add(Tanh(Mul(Add(x, Mul(Pow(x, 3), C)), K)), 1))"
            )
        x, tanh, inner = found
        if tanh.domain == "" and self.opset < 20:
            return NoMatch("an ai.onnx Tanh before opset 20: no ai.onnx Gelu to write (FastGelu is not (G2))")
        g = m.graph
        for node in inner:
            out = node.outputs[0]
            if len(out.consumers()) != 1 or any(o is out for o in g.outputs):
                return NoMatch(f"the intermediate '{out.name}' has other users")
        m.data.update(x=x, mlas=tanh.domain == "quanta")
        # the engine removes the matched nodes whose outputs the rewrite left unread, in
        # this order: from the product back to the cube
        m.matched = [m.root, *inner]
        return m

    @staticmethod
    def _match(half_x: Value, t1: Value) -> tuple[Value, Node, list[Node]] | None:
        """(x, the tanh node, the nodes between x and y) for y = Mul(half_x, t1)."""
        half = _by_const(half_x, "Mul", np.float32(0.5))
        plus1 = _by_const(t1, "Add", np.float32(1.0))
        if half is None or plus1 is None:
            return None
        x = half[1]
        tanh = _producer(plus1[1], "Tanh") or _producer(plus1[1], "MlasTanh", "quanta")
        scaled = None if tanh is None else _by_const(tanh.inputs[0], "Mul", GELU_K)
        add = None if scaled is None else _producer(scaled[1], "Add")
        if tanh is None or scaled is None or add is None or len(add.inputs) != 2:
            return None
        if add.inputs[0] is x:
            c = add.inputs[1]
        elif add.inputs[1] is x:
            c = add.inputs[0]
        else:
            return None
        times_c = _by_const(c, "Mul", GELU_C)
        cube = None if times_c is None else _cube(times_c[1], x)
        if times_c is None or cube is None:
            return None
        return x, tanh, [half[0], plus1[0], tanh, scaled[0], add, times_c[0], *cube]

    def rewrite(self, m: Match, b: Builder) -> Value:
        x, types = m.data["x"], result_type(shape_from=m["y"], elem_from=m["y"])
        if m.data["mlas"]:
            return b.op("MlasGeluTanh", [x], types=types, domain="quanta")
        return b.op("Gelu", [x], {"approximate": "tanh"}, types=types)
