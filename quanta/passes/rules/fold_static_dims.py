"""Fold the static dimensions a shape subgraph reads, when other dimensions are symbolic.

``FoldShape`` (fold_constants.py) folds ``Shape(x)`` only when every dimension it returns
is static. Exports with a symbolic batch read the spatial sizes they need through
``Gather`` or ``Slice`` of the shape (TF-style "same" padding computed at run time:
``ih, iw = x.size()[-2:]``); those elements are fixed by the model's input shapes::

    %y = Gather(%s = Shape(%x: tensor<?x3x224x224>), 2)          -> %y = const 224
    %y = Slice(%s = Shape(%x: tensor<?x3x224x224>), [-2], [max])  -> %y = const [224, 224]
                                                                   FoldStaticShapeElement
    %y = Size(%s = Shape(%x: tensor<?x?x64>))                     -> %y = const 3 (the rank)
                                                                   FoldShapeSize

Exact: the result is the selected dimensions, which shape inference fixed. The rule
applies the Gather / Slice to the dimension *positions* ``[start, ..., end)`` of
``Shape{start, end}`` and folds when every selected position is a static dimension.
``Shape`` stays for its other readers (the batch dimension). After it, the arithmetic
between the dimensions and a ``Pad`` or ``Reshape`` folds with FoldConstants. The number
of dimensions a ``Shape`` returns is fixed by the rank alone (ONNX's RMSNormalization
body reduces over ``Range(rank + axis, rank)``, ``rank = Size(Shape(x))``): folded, the
ReduceMean's axes are a constant and the norm fuses (FuseRMSNorm).

NoMatch reasons: the rank of ``x`` unknown; indices / starts / ends / axes / steps not
constants; a selected dimension symbolic.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.ir.types import TensorType, elem_from_numpy
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import describe
from quanta.passes.rules.fold_constants import _slice

__all__ = ["FoldShapeSize", "FoldStaticDims", "FoldStaticShapeElement"]


class FoldStaticShapeElement(Rule):
    """%y = Gather|Slice(%s = Shape(%x), ...) -> %y = const, the selected dimensions of %x being static"""

    pattern = "y = Gather|Slice(s = Shape(x), ...)"
    shared_ok: ClassVar[frozenset[str]] = frozenset({"s"})  # Shape stays for the symbolic dimensions' readers

    def check(self, m: Match) -> Match | NoMatch:
        node, shape_node, x = m.root, m.node("s"), m.value("x")
        if x.shape is None:
            return NoMatch(f"{describe(x)} has an unknown rank")
        rest = node.inputs[1:]
        for v in rest:
            if v is not None and not v.is_const:
                return NoMatch(f"{node.op_type} input {describe(v)} is not a constant")
        rank = len(x.shape)
        start = int(shape_node.attrs.get("start", 0))
        end = shape_node.attrs.get("end")
        positions = np.arange(rank, dtype=np.int64)[start : None if end is None else int(end)]
        arrays = [positions, *(None if v is None else np.asarray(v.const) for v in rest)]
        try:
            if node.op_type == "Gather":
                if int(node.attrs.get("axis", 0)) not in (0, -1):
                    return NoMatch("Gather of a shape on an axis other than 0")
                picked = np.take(positions, arrays[1])
            else:
                picked = _slice(node, arrays)
        except (ValueError, IndexError, TypeError) as e:
            return NoMatch(f"{node.op_type} cannot be evaluated on the shape's positions: {e}")
        dims = [x.shape[int(p)] for p in np.asarray(picked).reshape(-1)]
        symbolic = [
            int(p)
            for p, d in zip(np.asarray(picked).reshape(-1), dims)
            if not (isinstance(d, int) and d >= 0)
        ]
        if symbolic:
            return NoMatch(f"{describe(x)} has symbolic dimension(s) at {symbolic} among those read")
        m.data["array"] = np.asarray(dims, np.int64).reshape(np.shape(picked))
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        y, a = m.value("y"), m.data["array"]
        t = (
            TensorType(elem_from_numpy(a.dtype), tuple(a.shape))
            if y.type is None
            else result_type(shape_from=tuple(a.shape), elem_from=y)  # the replaced op's int64 contract
        )
        return b.const(y.name, a, t)


class FoldShapeSize(Rule):
    """%y = Size(%s = Shape(%x)) -> %y = const, the number of dimensions %s holds"""

    pattern = "y = Size(s = Shape(x))"
    shared_ok: ClassVar[frozenset[str]] = frozenset({"s"})

    def check(self, m: Match) -> Match | NoMatch:
        x, shape_node = m.value("x"), m.node("s")
        if x.shape is None:
            return NoMatch(f"{describe(x)} has an unknown rank")
        rank = len(x.shape)
        start = int(shape_node.attrs.get("start", 0))
        end = shape_node.attrs.get("end")
        m.data["array"] = np.array(np.arange(rank)[start : None if end is None else int(end)].size, np.int64)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        y, a = m.value("y"), m.data["array"]
        t = (
            TensorType(elem_from_numpy(a.dtype), ())
            if y.type is None
            else result_type(shape_from=(), elem_from=y)
        )
        return b.const(y.name, a, t)


class FoldStaticDims(RewritePass):
    name = "fold_static_dims"
    rules = (FoldStaticShapeElement(), FoldShapeSize())
