"""An RMS norm written out as float ops (T5's) becomes one quanta::RMSNormDiv.

    %p = Pow(%x, 2) | Mul(%x, %x);  %v = ReduceMean(%p, axes)       axes: the trailing axes, keepdims 1
    %s = Sqrt(Add(%v, eps))                                          eps: a float32 scalar
    %y = Div(%x, %s)                                                 reciprocal 0, eq. (RMS3)
       | Mul(%x, Div(1, %s) | Reciprocal(%s))                        reciprocal 1, eq. (RMS3')
    [%y = Mul(%y, scale)] [%y = Add(%y, bias)]                       constants, either order
      -> %y = quanta::RMSNormDiv(%x, scale?, bias?, axis, epsilon, reciprocal)     FuseRMSNorm

Why: T5 encoders (and the LLaMA-style decoders that copied its norm) export
``x * rsqrt(mean(x²) + eps) * w`` as six or seven nodes of a few thousand elements each,
seventeen times in a T5-small encoder; on such a model the executor's cost per step, not
the arithmetic, is much of the run time. The fused op is one step and two passes over
the row.

Numerics: exact. The fused op computes eqs. (RMS1)-(RMS4) of docs/float-ops.md, which are
the replaced nodes' own float32 operations in their order: ReduceMean is f32(sum16 / D)
on both targets (reduce_ops, native/reduce.py), Pow's exponent 2 is f32(x · x)
(math_ops.POW_EXACT_FORMS), then one IEEE addition and square root per row and, per
element, the division by the root mean square (Div) or the product with its rounded
reciprocal (Div(1, ·) or Reciprocal, then Mul: a different rounding, hence the
``reciprocal`` attribute), then one multiplication and addition. A Mul or Add whose
constant would broadcast the result to a larger shape is left as it is.

The rule runs in FuseLayerNormPass after FuseLayerNorm: a mean-subtracting LayerNorm
(whose tail, Pow(d, 2) .. Div(d, s), is an RMS norm of d) becomes a LayerNormDiv first.
In a quantized graph that pass runs after lowering (``lower_qdq``): the island is
Pow .. Mul between a DequantizeLinear (or an integer GEMM's float output) and a
(Dynamic)QuantizeLinear.
"""

from __future__ import annotations

from quanta.ir.graph import Node, Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, Rule
from quanta.passes.rules.fuse_layer_norm import (
    _affine,
    _f32_const,
    _internal,
    _is_f32,
    _mean_axis,
    _mean_square_root,
    _producer,
    _rank,
    _scalar_operand,
)

__all__ = ["FuseRMSNorm"]


def _reciprocal_of(r: Value, rank: int | None) -> Node | None:
    """The Reciprocal(s) or Div(1, s) (1: a float32 constant of size 1) producing ``r``."""
    node = _producer(r, "Reciprocal", "Div")
    if node is None or node.op_type == "Reciprocal":
        return node
    one = node.inputs[0]
    if len(node.inputs) != 2 or node.inputs[1] is None or node.inputs[1] is one:
        return None
    arr = _f32_const(one)
    if arr is None or _scalar_operand(node, node.inputs[1], 1.0, rank) is None:
        return None
    return node


class FuseRMSNorm(Rule):
    """Div(x, Sqrt(Add(ReduceMean(Pow(x, 2)), eps))) | Mul(x, 1 / Sqrt(...)) [· scale] [+ bias]
    -> quanta::RMSNormDiv(x, scale?, bias?)"""

    pattern = "y = Mul|Div(a, b)"

    def check(self, m: Match) -> Match | NoMatch:
        y, root = m.value("y"), m.root
        if not _is_f32(y) or len(root.inputs) != 2:
            return NoMatch("not a float32 Mul or Div")
        a, b = m.value("a"), m.value("b")
        recip: Node | None = None
        x: Value | None = None
        sqrt: Node | None = None
        if root.op_type == "Div":
            x, sqrt = a, _producer(b, "Sqrt")
        else:
            for xc, r in ((a, b), (b, a)):
                node = _reciprocal_of(r, _rank(xc))
                s = None if node is None else _producer(node.inputs[-1], "Sqrt")
                if s is not None:
                    x, recip, sqrt = xc, node, s
                    break
        if x is None or sqrt is None:
            return NoMatch("not Div(x, Sqrt(...)) nor Mul(x, Reciprocal(Sqrt(...)) | Div(1, Sqrt(...)))")
        if not _is_f32(x):
            return NoMatch("x is not known to be float32")
        rank = _rank(x)
        found = _mean_square_root(sqrt, x, rank, "the normalized x")
        if isinstance(found, NoMatch):
            return found
        add, mean_node, square, eps = found
        axis = None if rank == 0 else _mean_axis(mean_node, rank)
        if axis is None:
            return NoMatch("the mean square is not over the trailing axes with keepdims 1")
        g = m.graph
        chain = [square, mean_node, add, sqrt] + ([recip] if recip is not None else [])
        for node in chain:
            if not _internal(node.outputs[0], g):
                return NoMatch(f"the intermediate '{node.outputs[0].name}' has other users")
        scale = _affine(y, g, "Mul", x, axis)
        bias = _affine(scale[0].outputs[0] if scale else y, g, "Add", x, axis)
        m.data.update(
            x=x,
            axis=axis,
            eps=float(eps.reshape(())),
            scale=scale,
            bias=bias,
            reciprocal=int(recip is not None),
        )
        # the engine removes the matched nodes whose outputs the rewrite left unread, in
        # this order: from the last node the fused op replaces back to the square
        tail = [t[0] for t in (bias, scale) if t is not None]
        m.matched = [*tail, root, *reversed(chain)]
        return m

    def rewrite(self, m: Match, b: Builder) -> None:
        x, scale, bias = m.data["x"], m.data["scale"], m.data["bias"]
        inputs: list[Value | None] = [x, scale[2] if scale else None, bias[2] if bias else None]
        while inputs[-1] is None:
            inputs.pop()
        last = (bias or scale or (None, None, None))[0]
        old = m["y"] if last is None else last.outputs[0]
        assert old is not None
        attrs = {"axis": int(m.data["axis"]), "epsilon": m.data["eps"], "reciprocal": m.data["reciprocal"]}
        new = b.op(
            "RMSNormDiv", inputs, attrs, types=result_type(shape_from=old, elem_from=old), domain="quanta"
        )
        b.replace(old, new)
