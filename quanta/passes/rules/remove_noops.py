"""Remove operators that compute nothing.

Rules (each exact, bit for bit)::

    %y = Identity(%x)                        -> %x                       RemoveIdentity
    %y = Dropout(%x, ...)   (inference)      -> %x                       RemoveDropout
    %y = Reshape(%x: tensor<2x3x5>, [2, 3, -1]) -> %x                    RemoveReshapeToSameShape
    %y = Transpose(%x) {perm=[0, 1, 2]}      -> %x                       RemoveIdentityTranspose
    %y = Cast(%x: f32) {to=FLOAT}            -> %x                       RemoveCastToSameType
    %q2 = QuantizeLinear(%f = DequantizeLinear(%q, %s, %z), %s', %z')  -> %q
          when (s, z) and (s', z') describe the same quantized type      RemoveDequantizeQuantize

Which Q/DQ pair is a no-op. ``DequantizeLinear -> QuantizeLinear`` with identical
parameters is the identity on the integers: with ``d = q - z`` (exact),
``rint(fl(fl(d·s) / s)) = d`` whenever the storage has at most 16 bits and ``s`` is a
normal float32 (proof in :func:`quanta.passes.qmath.dq_q_is_identity`, which the rule
checks). The other order, ``QuantizeLinear -> DequantizeLinear``, is *not* a no-op: it
is the quantization itself (it rounds to the grid and saturates), so removing it would
change results; no rule here touches it.

A removed node whose output is a graph output hands its name to the value that
replaces it, unless that value is a graph input, a constant or another graph output
(then the rule refuses: the output would lose its name).
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value
from quanta.ir.types import QuantType
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.qmath import dq_q_is_identity
from quanta.passes.rules._util import describe, node_qtype

__all__ = [
    "RemoveCastToSameType",
    "RemoveDequantizeQuantize",
    "RemoveDropout",
    "RemoveIdentity",
    "RemoveIdentityTranspose",
    "RemoveNoops",
    "RemoveReshapeToSameShape",
    "resolve_reshape",
]


class RemoveIdentity(Rule):
    """%y = Identity(%x) -> %x"""

    pattern = "y = Identity(x)"

    def rewrite(self, m: Match, b: Builder) -> Value:
        return m.value("x")


class RemoveDropout(Rule):
    """%y = Dropout(%x, ...) -> %x in inference (training_mode absent or false, mask unused)

    ``is_test`` (opset < 7) is ignored, as the reference Dropout does: a deployed model
    runs inference either way."""

    pattern = "y = Dropout(x, ...)"

    def check(self, m: Match) -> Match | NoMatch:
        node = m.root
        training = node.input(2)
        if training is not None:
            if not training.is_const:
                return NoMatch(f"training_mode {describe(training)} is not a constant")
            if bool(np.asarray(training.const).reshape(())):
                return NoMatch("Dropout is in training mode")
        mask = node.outputs[1:]
        if any(v.uses or any(v is o for o in m.graph.outputs) for v in mask):
            return NoMatch("Dropout's mask output is used")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        return m.value("x")


def resolve_reshape(target: list[int], in_shape: tuple, allowzero: bool) -> list | None:
    """The output shape of ``Reshape(x, target)`` for ``x`` of ``in_shape`` (entries may
    be symbolic), or None when it cannot be known statically. A symbolic dimension is
    carried through 0 (copy) and may be recovered by -1 when it is the only unknown."""
    dims: list = []
    for k, d in enumerate(target):
        if d == 0 and not allowzero:
            if k >= len(in_shape):
                return None
            dims.append(in_shape[k])
        else:
            dims.append(int(d))
    if dims.count(-1) > 1:
        return None
    if -1 in dims:
        known_in = [d for d in in_shape if isinstance(d, int)]
        sym_in = sorted(str(d) for d in in_shape if not isinstance(d, int))
        rest = [d for d in dims if d != -1]
        known_out = [d for d in rest if isinstance(d, int)]
        sym_out = sorted(str(d) for d in rest if not isinstance(d, int))
        if None in in_shape or "None" in sym_in:
            return None
        left = list(sym_in)
        for sdim in sym_out:
            if sdim not in left:
                return None
            left.remove(sdim)
        num, den = int(np.prod(known_in)), int(np.prod(known_out))
        if den == 0 or num % den:
            return None
        ratio = num // den
        if not left:
            dims[dims.index(-1)] = ratio
        elif len(left) == 1 and ratio == 1:
            dims[dims.index(-1)] = next(d for d in in_shape if str(d) == left[0])
        else:
            return None
    return dims


class RemoveReshapeToSameShape(Rule):
    """%y = Reshape(%x, %shape) -> %x when the resolved target equals x's static shape"""

    pattern = "y = Reshape(x, shape)"

    def check(self, m: Match) -> Match | NoMatch:
        x, shape = m.value("x"), m.value("shape")
        if not shape.is_const:
            return NoMatch(f"target shape {describe(shape)} is not a constant")
        if x.shape is None:
            return NoMatch(f"{describe(x)} has an unknown rank")
        if any(d is None for d in x.shape):
            return NoMatch(
                f"{describe(x)} has unknown dimensions {['?' if d is None else d for d in x.shape]}"
            )
        target = [int(v) for v in np.asarray(shape.const).reshape(-1)]
        resolved = resolve_reshape(target, tuple(x.shape), bool(m.root.attrs.get("allowzero", 0)))
        if resolved is None or tuple(resolved) != tuple(x.shape):
            return NoMatch(f"target shape {target} differs from the input shape {list(x.shape)}")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        return m.value("x")


class RemoveIdentityTranspose(Rule):
    """%y = Transpose(%x) {perm=[0, 1, ..., n-1]} -> %x"""

    pattern = "y = Transpose(x)"

    def check(self, m: Match) -> Match | NoMatch:
        perm = m.root.attrs.get("perm")
        x = m.value("x")
        if perm is None:
            if x.shape is not None and len(x.shape) <= 1:
                return m
            return NoMatch("Transpose without perm reverses the axes")
        if list(perm) != list(range(len(perm))):
            return NoMatch(f"perm {list(perm)} moves axes")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        return m.value("x")


class RemoveCastToSameType(Rule):
    """%y = Cast(%x: T) {to=T} -> %x"""

    pattern = "y = Cast(x)"

    def check(self, m: Match) -> Match | NoMatch:
        x = m.value("x")
        if x.type is None or isinstance(x.type.elem, QuantType):
            return NoMatch(f"{describe(x)} has no plain element type")
        to = int(m.root.attrs.get("to", 0))
        if getattr(x.type.elem, "onnx", None) != to:
            return NoMatch(f"Cast changes the element type {x.type.elem} to ONNX type {to}")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        return m.value("x")


class RemoveDequantizeQuantize(Rule):
    """%q2 = QuantizeLinear(%f = DequantizeLinear(%q, %s, %z), %s2, %z2) -> %q  (same quantized type)"""

    pattern = "q2 = QuantizeLinear(f = DequantizeLinear(q, s, z?), s2, z2?)"
    shared_ok = frozenset({"f"})  # the DequantizeLinear stays for its other users

    def check(self, m: Match) -> Match | NoMatch:
        dq, qn = m.node("f"), m.root
        before = node_qtype(dq, m["q"], m["s"], m["z"])
        after = node_qtype(qn, m["q2"], m["s2"], m["z2"])
        if before is None or after is None:
            return NoMatch("scale / zero point are not constants")
        if before != after:
            return NoMatch(
                f"parameters differ: DequantizeLinear reads {before}, QuantizeLinear writes {after}"
            )
        reason = dq_q_is_identity(before)
        if reason is not None:
            return NoMatch(f"DequantizeLinear -> QuantizeLinear may not round-trip: {reason}")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        return m.value("q")


class RemoveNoops(RewritePass):
    name = "remove_noops"
    rules = (
        RemoveIdentity(),
        RemoveDropout(),
        RemoveReshapeToSameShape(),
        RemoveIdentityTranspose(),
        RemoveCastToSameType(),
        RemoveDequantizeQuantize(),
    )
