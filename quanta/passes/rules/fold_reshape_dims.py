"""A Reshape whose target shape copies dimensions of its own input takes 0 for them.

PyTorch exports ``x.view(x.size(0), -1)`` with a symbolic batch as a shape subgraph the
batch keeps from folding::

    %y = Reshape(%x, %c = Concat(Unsqueeze(Gather(Shape(%x), 0), [0]), [-1]))
      -> %y = Reshape(%x, [0, -1])                                 FoldCopiedDimsIntoReshape

    %y = Reshape(%x, Concat(Slice(Shape(%x), [0], [2]), [-1]))
      -> %y = Reshape(%x, [0, 0, -1])                                  (x.flatten(2))

Exact: with ``allowzero=0`` a 0 in Reshape's shape copies the input's dimension at the
same position, which is what ``Gather(Shape(x), j)`` at position j of the target gives,
and so each element of a ``Slice(Shape(x), s, e)`` (constant bounds, step 1) at
positions s to e - 1.
The Shape may read x, or a QuantizeLinear / DequantizeLinear of x or the value x
quantizes or dequantizes (the same shape: ONNX Runtime's QOperator files reshape the codes
by the shape of their dequantized values). The rewrite applies only when every
non-constant piece of the Concat is such a copy at its own position (``Shape{start}``
counted in; x of unknown rank, made by an operator onnx cannot infer, takes a Gather
copy of a non-negative index of the whole shape), the other pieces being integer
constants; the Shape subgraph is then dead (EliminateDead). It leaves no float shape
arithmetic beside the quantized graph, and no Shape of a quantized value.

The result's shape is the one the constant target gives (a 0 copies the input's
dimension, static or symbolic; a -1 is computed when every other dimension is static),
each dimension the replaced Reshape's declared one where that is known: onnx's inference
at load time sees no value through the Concat, so the Reshape loaded with an unknown
shape, and what reads it (a grouped linear layer's Einsum) needs its rank and sizes.

NoMatch reasons: ``allowzero=1`` (0 means an empty dimension); a Concat piece that is
neither a constant nor such a copy; a copy of another tensor's dimension or of a
dimension at another position.
"""

from __future__ import annotations

import math

import numpy as np

from quanta.ir.graph import Node, Value, result_type
from quanta.ir.types import Dim
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


def _shape_of_x(shape: Node | None, x: Value) -> bool:
    """Whether ``shape`` is a Shape node of ``x``, or of a QuantizeLinear / DequantizeLinear
    of ``x`` or of which ``x`` is one (elementwise: the same shape; an ONNX Runtime
    QOperator file reshapes the codes by the shape of their dequantized values)."""
    if shape is None or shape.op_type != "Shape" or shape.input(0) is None:
        return False
    read = shape.input(0)
    if read is x:
        return True
    q_ops = ("QuantizeLinear", "DequantizeLinear")
    p = read.producer
    if p is not None and p.op_type in q_ops and p.input(0) is x:
        return True
    px = x.producer
    return px is not None and px.op_type in q_ops and px.input(0) is read


def _copied_dims(piece: Value, x: Value) -> list[int] | str:
    """The dimensions of ``x`` that ``piece`` holds, in order: one for
    ``Unsqueeze(Gather(Shape(x), k), [0])``, a run for ``Slice(Shape(x), s, e)``; or why
    it is neither."""
    node = piece.producer
    if node is not None and node.op_type == "Slice":
        return _sliced_dims(node, x)
    k = _copied_dim(piece, x)
    return k if isinstance(k, str) else [k]


def _sliced_dims(node: Node, x: Value) -> list[int] | str:
    """The dimensions of ``x`` that ``Slice(Shape(x), starts, ends[, [0], [1]])`` holds."""
    if len(node.inputs) >= 3:  # opset 10 on: starts, ends, axes, steps as inputs
        starts, ends = _const_ints(node.input(1)), _const_ints(node.input(2))
        axes = _const_ints(node.input(3)) if len(node.inputs) > 3 and node.input(3) is not None else [0]
        steps = _const_ints(node.input(4)) if len(node.inputs) > 4 and node.input(4) is not None else [1]
    else:  # opset 1-9: attributes
        starts, ends = list(node.attrs.get("starts", [])), list(node.attrs.get("ends", []))
        axes, steps = list(node.attrs.get("axes", [0])), [1]
    if starts is None or ends is None or axes is None or steps is None:
        return f"{describe(node.outputs[0])} slices a shape by bounds that are not constants"
    if len(starts) != 1 or len(ends) != 1 or axes not in ([0], [-1]) or steps != [1]:
        return f"{describe(node.outputs[0])} is not one step-1 slice of a shape"
    shape = node.input(0).producer if node.input(0) is not None else None
    if shape is None or not _shape_of_x(shape, x):
        return f"{describe(node.outputs[0])} reads the shape of another tensor than the Reshape's input"
    if x.shape is None:
        return f"{describe(x)} has an unknown rank"
    rank = len(x.shape)
    start = _clamped(int(shape.attrs.get("start", 0)), rank)
    end = rank if shape.attrs.get("end") is None else _clamped(int(shape.attrs["end"]), rank)
    n = end - start  # the sliced Shape's length; Slice clamps its bounds to it
    lo, hi = _clamped(starts[0], n), _clamped(ends[0], n)
    return [start + k for k in range(lo, hi)]


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
    if shape is None or not _shape_of_x(shape, x):
        return f"{describe(piece)} reads the shape of another tensor than the Reshape's input"
    k = int(np.asarray(index.const))
    if x.shape is None:
        # an operator onnx cannot infer made x (a QOperator file's com.microsoft op): a
        # non-negative index into the whole shape needs no rank
        if k >= 0 and "start" not in shape.attrs and "end" not in shape.attrs:
            return k
        return f"{describe(x)} has an unknown rank"
    rank = len(x.shape)
    # Shape{start, end} returns dimensions [start, end)
    start = _clamped(int(shape.attrs.get("start", 0)), rank)
    end = rank if shape.attrs.get("end") is None else _clamped(int(shape.attrs["end"]), rank)
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
            ks = _copied_dims(piece, x)
            if isinstance(ks, str):
                return NoMatch(ks)
            for k in ks:
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
        target = m.data["target"]
        shape = b.const(f"{y.name}_shape", target)
        return b.op(
            "Reshape",
            [m.value("x"), shape],
            node.attrs,
            # the replaced Reshape's output contract, its unknown dimensions filled in
            types=result_type(shape_from=_target_shape(m.value("x"), y, target), elem_from=y),
            name=node.name or None,
            attr_types=node.attr_types,
        )


def _target_shape(x: Value, y: Value, target: np.ndarray) -> tuple[Dim, ...] | None:
    """The shape ``Reshape(x, target)`` gives (allowzero=0), each dimension ``y``'s declared
    one where that is known; ``y``'s shape when the target does not fix the rank."""
    declared = y.shape
    if declared is not None and len(declared) != len(target):
        return declared  # a contract that contradicts the target: kept, as before
    dims: list[Dim] = []
    for j, t in enumerate(int(e) for e in target):
        if t == 0:
            dims.append(x.shape[j] if x.shape is not None and j < len(x.shape) else None)
        else:
            dims.append(t if t > 0 else None)
    t = target.tolist()
    if t.count(-1) == 1 and x.shape is not None:
        # the copied dimensions appear on both sides; -1 is what the others leave:
        # prod(x's other dimensions) / prod(the positive targets), when those are static
        rest = [d for j, d in enumerate(x.shape) if not (j < len(t) and t[j] == 0)]
        if all(isinstance(d, int) for d in rest):
            total = math.prod(int(d) for d in rest)  # type: ignore[arg-type]
            given = math.prod(e for e in t if e > 0)
            if given > 0 and total % given == 0:
                dims[t.index(-1)] = total // given
    if declared is not None:
        dims = [
            d if d is not None and not (isinstance(e, int) and e >= 0) else e for d, e in zip(dims, declared)
        ]
    return tuple(dims)


class FoldReshapeDims(RewritePass):
    name = "fold_reshape_dims"
    rules = (FoldCopiedDimsIntoReshape(),)
