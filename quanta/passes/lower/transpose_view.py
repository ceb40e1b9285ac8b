"""A Transpose read only by batched integer GEMMs with a run-time b becomes a strided view
(TransposeAsView)::

    %t = Transpose(%x) {perm}          every reader: QLinearMatMul (a or b) or
                                       com.microsoft MatMulIntegerToFloat (a or b), b not a constant
      -> %t = quanta::TransposeView(%x) {perm}

Why: an exported attention transposes the heads of Q, K and V ([S, heads, dh] ->
[heads, S, dh] and Kᵀ [heads, dh, S]) before its Q·Kᵀ and P·V products, one copy each
(all-MiniLM-L6-v2: 18 Transpose steps, ~7-10 µs each). The batched GEMM of a run-time b
(native ``qgemm_batched``, quanta/kernels/cpp/gemm) packs its panels from strided views
anyway, so the view is all it needs: ``quanta::TransposeView`` is an alias op (no buffer,
no step in a native program; quanta/runtime/memory.py), ``np.transpose`` without the copy.

When: ``perm`` given, rank >= 3 (a batched product), the Transpose's output not a graph
output; as a reader's ``a`` the last axis stays last (the kernel reads a's rows with unit
stride along K); as ``b`` any perm. A GEMM whose b is a constant (prepacked) needs a
contiguous a: one such reader keeps the copy.

Numerics: exact. The readers' integer sums do not depend on the memory layout (int32
wraps; every order gives the same bits), and their output stages are per element. A
reader that cannot take the view (a batch of views whose axes do not merge into one) is
handed to its generic kernel, which copies what it needs (quanta/targets/native/gemm.py).
"""

from __future__ import annotations

from quanta.ir.graph import Node, Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule

__all__ = ["TransposeAsView", "TransposeAsViewPass"]

QUANTA_DOMAIN = "quanta"

#: readers by (domain, op): (input index of a, input index of b)
_READERS: dict[tuple[str, str], tuple[int, int]] = {
    ("", "QLinearMatMul"): (0, 3),
    ("com.microsoft", "MatMulIntegerToFloat"): (0, 1),
}


def _refusal(node: Node, index: int, perm: list[int]) -> str | None:
    """Why ``node`` cannot read the view at input ``index`` (None: it can)."""
    pos = _READERS.get((node.domain, node.op_type))
    if pos is None or index not in pos:
        return f"{node.label} reads it (not an integer GEMM's a or b)"
    b = node.input(pos[1])
    if b is None or b.is_const:
        return f"{node.label} has a constant b: its prepacked GEMM reads a contiguous a"
    if index == pos[0] and perm[-1] != len(perm) - 1:
        return f"{node.label} reads it as a, and perm {perm} moves the last axis"
    return None


class TransposeAsView(Rule):
    """Transpose(x) read by run-time-b integer GEMMs only -> quanta::TransposeView(x)"""

    pattern = "t = Transpose(x)"

    def check(self, m: Match) -> Match | NoMatch:
        node, t, x = m.node("t"), m.value("t"), m.value("x")
        perm = node.attrs.get("perm")
        if perm is None:
            return NoMatch("no perm attribute")
        perm = [int(p) for p in perm]
        if len(perm) < 3:
            return NoMatch(f"rank {len(perm)}: not a batched product's operand")
        if x.is_const:
            return NoMatch("x is a constant (folded elsewhere)")
        if any(o is t for o in m.graph.outputs) or not t.uses:
            return NoMatch("the Transpose's output is a graph output or unread")
        for reader, index in t.uses:
            why = _refusal(reader, index, perm)
            if why is not None:
                return NoMatch(why)
        m.data["perm"] = perm
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        t = m.value("t")
        return b.op(
            "TransposeView",
            [m["x"]],
            {"perm": m.data["perm"]},
            domain=QUANTA_DOMAIN,
            types=result_type(shape_from=t, elem_from=t),
            name=m.node("t").name or None,
        )


class TransposeAsViewPass(RewritePass):
    """TransposeAsView (the module docstring)."""

    name = "transpose_as_view"

    def __init__(self) -> None:
        super().__init__([TransposeAsView()])
