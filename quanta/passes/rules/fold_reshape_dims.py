"""A Reshape whose target shape copies dimensions of its own input takes 0 for them.

PyTorch exports ``x.view(x.size(0), -1)`` with a symbolic batch as a shape subgraph the
batch keeps from folding::

    %y = Reshape(%x, %c = Concat(Unsqueeze(Gather(Shape(%x), 0), [0]), [-1]))
      -> %y = Reshape(%x, [0, -1])                                 FoldCopiedDimsIntoReshape

Exact: with ``allowzero=0`` a 0 in Reshape's shape copies the input's dimension at the
same position, which is what ``Gather(Shape(x), j)`` at position j of the target gives.
The rewrite applies only when every non-constant piece of the Concat is such a copy at
its own position (``Shape{start}`` counted in), the other pieces being integer
constants; the Shape subgraph is then dead (EliminateDead). It leaves no float shape
arithmetic beside the quantized graph, and no Shape of a quantized value.

NoMatch reasons: ``allowzero=1`` (0 means an empty dimension); a Concat piece that is
neither a constant nor such a copy; a copy of another tensor's dimension or of a
dimension at another position.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Node, Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import describe

__all__ = ["FoldCopiedDimsIntoReshape", "FoldReshapeDims"]


def _const_ints(v: Value | None) -> list[int] | None:
    if v is None or not v.is_const:
        return None
    a = np.asarray(v.const)
    return [int(e) for e in a.reshape(-1)] if a.dtype.kind in "iu" else None


def _clamped(axis: int, rank: int) -> int:
    """Shape's start / end: negative counts from the back, then clamped to [0, rank]."""
    if axis < 0:
        axis += rank
    return min(max(axis, 0), rank)


def _copied_dim(piece: Value, x: Value) -> int | str:
    """The dimension of ``x`` that ``Unsqueeze(Gather(Shape(x), k), [0])`` reads, or why not."""
    unsq = piece.producer
    if unsq is None or unsq.op_type != "Unsqueeze":
        return f"{describe(piece)} is neither a constant nor Unsqueeze(Gather(Shape(...)))"
    axes = _const_ints(unsq.input(1)) if unsq.input(1) is not None else list(unsq.attrs.get("axes", []))
    gather = unsq.input(0).producer if unsq.input(0) is not None else None
    if axes != [0] or gather is None or gather.op_type != "Gather" or int(gather.attrs.get("axis", 0)) != 0:
        return f"{describe(piece)} is neither a constant nor Unsqueeze(Gather(Shape(...)), [0])"
    index = gather.input(1)
    if index is None or not index.is_const or np.asarray(index.const).ndim != 0:
        return f"{describe(piece)} gathers a non-constant or non-scalar index"
    shape: Node | None = gather.input(0).producer if gather.input(0) is not None else None
    if shape is None or shape.op_type != "Shape" or shape.input(0) is not x:
        return f"{describe(piece)} reads the shape of another tensor than the Reshape's input"
    if x.shape is None:
        return f"{describe(x)} has an unknown rank"
    rank = len(x.shape)
    # Shape{start, end} returns dimensions [start, end)
    start = _clamped(int(shape.attrs.get("start", 0)), rank)
    end = rank if shape.attrs.get("end") is None else _clamped(int(shape.attrs["end"]), rank)
    k = int(np.asarray(index.const))
    return start + (k if k >= 0 else (end - start) + k)


class FoldCopiedDimsIntoReshape(Rule):
    """%y = Reshape(%x, %c = Concat(..., Unsqueeze(Gather(Shape(%x), j), [0]), ...)) -> %y = Reshape(%x, const with 0 at j)"""

    pattern = "y = Reshape(x, c = Concat(...))"

    def check(self, m: Match) -> Match | NoMatch:
        if int(m.root.attrs.get("allowzero", 0)):
            return NoMatch("allowzero=1: a 0 in the shape means an empty dimension, not a copy")
        x, concat = m.value("x"), m.node("c")
        target: list[int] = []
        copies = 0
        for piece in concat.inputs:
            ints = _const_ints(piece)
            if ints is not None:
                target.extend(ints)
                continue
            k = _copied_dim(piece, x)
            if isinstance(k, str):
                return NoMatch(k)
            if k != len(target):
                return NoMatch(
                    f"{describe(piece)} copies dimension {k} of the input to position {len(target)}"
                )
            target.append(0)
            copies += 1
        if not copies:
            return NoMatch("every piece is a constant (FoldConstants folds the Concat)", "pattern")
        m.data["target"] = np.asarray(target, np.int64)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        node, y = m.root, m.value("y")
        shape = b.const(f"{y.name}_shape", m.data["target"])
        return b.op(
            "Reshape",
            [m.value("x"), shape],
            node.attrs,
            types=result_type(shape_from=y, elem_from=y),  # the replaced Reshape's output contract
            name=node.name or None,
            attr_types=node.attr_types,
        )


class FoldReshapeDims(RewritePass):
    name = "fold_reshape_dims"
    rules = (FoldCopiedDimsIntoReshape(),)
