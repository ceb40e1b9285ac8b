"""Fewer data-movement steps: views of views become one view, Transposes that move only
axes of size 1 become views, and a Concat of one input or a Split into one output go.

Rules (each exact, bit for bit: they move no value, or the same values in the same
row-major order)::

    %y = Transpose(%x) {perm}      -> %y = Reshape(%x, shape(y))      TransposeOfUnitAxes
         when perm keeps the axes of size > 1 in their order (%x itself when
         shape(y) = shape(x), e.g. perm [1, 0, 2] of [1, 1, 128]; so for the next rule)
    %y = V2(%v = V1(%x, ...), ...) -> %y = Reshape(%x, shape(y))      CollapseViewChain
         V1, V2 in Reshape, Squeeze, Unsqueeze, Flatten
    %y = Concat(%x)                -> %x                              ConcatOfOne
    %y = Split(%x) {one output}    -> %x                              SplitOfOne

Why: streaming audio models exported from PyTorch and Keras (GTCRN, DTLN) run a frame of
a few hundred values through hundreds of nodes, a third of them Squeeze / Unsqueeze /
Reshape / Transpose between a GRU and a MatMul (``[1, 1, 16] -> perm [1, 0, 2]``), and
Keras' unrolled LSTM cells wrap their one time step in a Split and a Concat of one. On
such graphs the executor's cost per step, not the arithmetic, is the run time; a
Transpose is a copy where a Reshape is a view.

A Transpose that moves only axes of size 1 keeps every element's row-major position:
dropping the unit axes from both shapes leaves the same axes in the same order. The
rules need static shapes (the Reshape's target is the output shape; a 0 in it would
copy an input dimension, so empty tensors are refused).
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule

__all__ = [
    "CollapseViewChain",
    "CollapseViews",
    "ConcatOfOne",
    "SplitOfOne",
    "TransposeOfUnitAxes",
]


def _static(v: Value | None) -> tuple[int, ...] | None:
    """``v``'s shape when every dimension is a known positive integer."""
    shape = None if v is None else v.shape
    if shape is None or not all(isinstance(d, int) and d > 0 for d in shape):
        return None
    return tuple(int(d) for d in shape)


def _reshape(m: Match, b: Builder, x: Value, y: Value, shape: tuple[int, ...]) -> Value:
    if _static(x) == shape:
        return x  # the view of x as it is: nothing to do
    target = b.const(f"{y.name}_shape", np.asarray(shape, np.int64))
    return b.op(
        "Reshape", [x, target], types=result_type(shape_from=y, elem_from=y), name=m.root.name or None
    )


class TransposeOfUnitAxes(Rule):
    """%y = Transpose(%x) {perm moving only size-1 axes} -> Reshape(%x, shape(y))"""

    pattern = "y = Transpose(x)"

    def check(self, m: Match) -> Match | NoMatch:
        xs, ys = _static(m["x"]), _static(m["y"])
        if xs is None or ys is None:
            return NoMatch("input or output shape is not static")
        perm = m.root.attrs.get("perm")
        perm = list(range(len(xs)))[::-1] if perm is None else [int(p) for p in perm]
        if sorted(perm) != list(range(len(xs))):
            return NoMatch(f"perm {perm} is not a permutation of rank {len(xs)}")
        moved = [p for p in perm if xs[p] != 1]
        if moved != sorted(moved):
            return NoMatch(f"perm {perm} reorders axes of size > 1 of {list(xs)}")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        y = m["y"]
        return _reshape(m, b, m["x"], y, _static(y))


class CollapseViewChain(Rule):
    """%y = V2(%v = V1(%x, ...), ...) -> Reshape(%x, shape(y)) (views: Reshape, Squeeze,
    Unsqueeze, Flatten); %v stays when something else reads it"""

    pattern = "y = Reshape|Squeeze|Unsqueeze|Flatten(v = Reshape|Squeeze|Unsqueeze|Flatten(x, ...), ...)"
    shared_ok = ("v",)

    def check(self, m: Match) -> Match | NoMatch:
        if m.root.domain or m["v"].producer.domain:
            return NoMatch("a view of another domain")
        ys = _static(m["y"])
        if ys is None:
            return NoMatch("output shape is not static")
        xs = _static(m["x"])
        if xs is None or int(np.prod(xs)) != int(np.prod(ys)):
            return NoMatch("input shape is not static")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        y = m["y"]
        return _reshape(m, b, m["x"], y, _static(y))


class ConcatOfOne(Rule):
    """%y = Concat(%x) -> %x"""

    pattern = "y = Concat(x)"

    def rewrite(self, m: Match, b: Builder) -> Value:
        return m.value("x")


class SplitOfOne(Rule):
    """%y = Split(%x, ...) with one output -> %x"""

    pattern = "y = Split(x, ...)"

    def check(self, m: Match) -> Match | NoMatch:
        # one output holds the whole axis: the only split sizes a valid Split can give it
        if len(m.root.outputs) != 1:
            return NoMatch(f"Split into {len(m.root.outputs)} outputs")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        return m.value("x")


class CollapseViews(RewritePass):
    name = "collapse_views"
    rules = (TransposeOfUnitAxes(), CollapseViewChain(), ConcatOfOne(), SplitOfOne())
