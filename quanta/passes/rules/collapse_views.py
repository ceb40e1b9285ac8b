"""Fewer data-movement steps: views of views become one view, Transposes that move only
axes of size 1 become views, and a Concat of one input or a Split into one output go.

Rules (each exact, bit for bit: they move no value, or the same values in the same
row-major order)::

    %y = Transpose(%x) {perm}      -> %y = Reshape(%x, shape(y))      TransposeOfUnitAxes
         when perm keeps the axes of size > 1 in their order (%x itself when
         shape(y) = shape(x), e.g. perm [1, 0, 2] of [1, 1, 128]; so for the next rule)
    %y = Transpose(%v = Transpose(%x) {p}) {q}                        TransposeOfTranspose
      -> %x when p∘q is the identity, else %y = Transpose(%x) {p∘q}
    %y = V2(%v = V1(%x, ...), ...) -> %y = Reshape(%x, shape(y))      CollapseViewChain
         V1, V2 in Reshape, Squeeze, Unsqueeze, Flatten
    %y = Concat(%x)                -> %x                              ConcatOfOne
    %y = Split(%x) {one output}    -> %x                              SplitOfOne
    %y = Gather(%x, c) {axis a}    -> %y = Reshape(%x, shape(y))      GatherOfUnitAxis
         when x's axis a has size 1 and the constant indices c are all 0 (or -1)
    %y = Add(%x, 0) | Add(0, %x)   -> %x   (integers; 0 of one element)  IntegerAddOfZero
    %y = Concat(V(%x_1), ..., V(%x_n)) {axis k}                       ConcatOfUnsqueezed
         V: a view inserting a size-1 axis k, k < rank(x_i)
      -> %y = Reshape(Concat(%x_1, ..., %x_n) {axis k}, shape(y))

Why: streaming audio models exported from PyTorch and Keras (GTCRN, DTLN) run a frame of
a few hundred values through hundreds of nodes, a third of them Squeeze / Unsqueeze /
Reshape / Transpose between a GRU and a MatMul (``[1, 1, 16] -> perm [1, 0, 2]``), and
Keras' unrolled LSTM cells wrap their one time step in a Split and a Concat of one. On
such graphs the executor's cost per step, not the arithmetic, is the run time; a
Transpose is a copy where a Reshape is a view.

Paddle2ONNX writes an assignment inside a Loop body as Unsqueeze, Add of a zero,
Squeeze (SLANet's decoder, every iteration): on integers the Add is the identity, and the
two views around it then collapse (on floats x + 0 turns -0 into +0: those stay).

Stacking equal-shaped tensors along a new axis k lays out, for each index of the axes
before k, the trailing block of x_1, then of x_2, ...: the bytes of concatenating them
along their own axis k (one Concat instead of n views and a Concat; GTCRN's channel
interleaves, DTLN's state stacks). A Gather of index 0 from an axis of size 1 copies
every element once, in order (GTCRN's unfold: ``x[:, :, [[0]]]``).

The lowering leaves Transpose pairs where a model's own Transpose meets one that the
channels-last regions add (open_nsfw's NHWC input: the model turns it to NCHW, the region
of its first convolution back to NHWC: two copies of the image for nothing).

A Transpose that moves only axes of size 1 keeps every element's row-major position:
dropping the unit axes from both shapes leaves the same axes in the same order. The
rules need static shapes (the Reshape's target is the output shape; a 0 in it would
copy an input dimension, so empty tensors are refused).
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Node, Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule

__all__ = [
    "CollapseViewChain",
    "CollapseViews",
    "ConcatOfOne",
    "ConcatOfUnsqueezed",
    "GatherOfUnitAxis",
    "IntegerAddOfZero",
    "SplitOfOne",
    "TransposeOfTranspose",
    "TransposeOfUnitAxes",
]


def _static(v: Value | None) -> tuple[int, ...] | None:
    """``v``'s shape when every dimension is a known positive integer."""
    shape = None if v is None else v.shape
    if shape is None or not all(isinstance(d, int) and d > 0 for d in shape):
        return None
    return tuple(int(d) for d in shape)


def _reshape(m: Match, b: Builder, x: Value) -> Value:
    """``x`` viewed in the shape of the match's output ``y`` (static: the rules check)."""
    y = m["y"]
    shape = _static(y)
    assert shape is not None
    if _static(x) == shape:
        return x  # the view of x as it is: nothing to do
    target = b.const(f"{y.name}_shape", np.asarray(shape, np.int64))
    return b.op(
        "Reshape", [x, target], types=result_type(shape_from=y, elem_from=y), name=m.root.name or None
    )


class _ViewOfX(Rule):
    """A rule whose match is ``x`` seen in ``y``'s shape: its rewrite is that Reshape."""

    def rewrite(self, m: Match, b: Builder) -> Value:
        return _reshape(m, b, m["x"])


class TransposeOfUnitAxes(_ViewOfX):
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


def _perm(node: Node, rank: int) -> list[int] | None:
    perm = node.attrs.get("perm")
    perm = list(range(rank))[::-1] if perm is None else [int(p) for p in perm]
    return perm if sorted(perm) == list(range(rank)) else None


class TransposeOfTranspose(Rule):
    """%y = Transpose(%v = Transpose(%x) {p}) {q} -> %x (p∘q the identity) or
    Transpose(%x) {p∘q}; %v stays when something else reads it"""

    pattern = "y = Transpose(v = Transpose(x))"
    shared_ok = ("v",)

    def check(self, m: Match) -> Match | NoMatch:
        inner = m["v"].producer
        if m.root.domain or inner.domain:
            return NoMatch("a Transpose of another domain")
        xs = m["x"].shape
        if xs is None:
            return NoMatch("input rank is not known")
        p, q = _perm(inner, len(xs)), _perm(m.root, len(xs))
        if p is None or q is None:
            return NoMatch("a perm that is not a permutation of the input's rank")
        m.data["perm"] = [p[i] for i in q]  # y[.., i, ..] = v[.., q[i], ..] = x[.., p[q[i]], ..]
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        r = m.data["perm"]
        if r == list(range(len(r))):
            return m["x"]
        y = m["y"]
        return b.op("Transpose", [m["x"]], {"perm": r}, types=y.type, name=m.root.name or None)


class CollapseViewChain(_ViewOfX):
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


class GatherOfUnitAxis(_ViewOfX):
    """%y = Gather(%x, c) {axis a}, x.shape[a] == 1, c all 0 (or -1) -> Reshape(%x, shape(y))"""

    pattern = "y = Gather(x, c)"

    def check(self, m: Match) -> Match | NoMatch:
        if not m.is_const("c"):
            return NoMatch("indices are not a constant")
        xs, ys = _static(m["x"]), _static(m["y"])
        if xs is None or ys is None:
            return NoMatch("input or output shape is not static")
        a = int(m.root.attrs.get("axis", 0))
        if not -len(xs) <= a < len(xs) or xs[a] != 1:
            return NoMatch(f"axis {a} of {list(xs)} is not of size 1")
        c = np.asarray(m.const("c"))
        if c.dtype.kind not in "iu" or not np.all((c == 0) | (c == -1)):
            return NoMatch("an index other than 0 / -1")
        return m


class IntegerAddOfZero(Rule):
    """%y = Add(%x, 0) (either order), integer x, a zero of one element -> %x"""

    pattern = "y = Add(a, b)"

    def check(self, m: Match) -> Match | NoMatch:
        a, b = m["a"], m["b"]
        x, c = (a, b) if b.is_const else (b, a)
        if not c.is_const or x.is_const:
            return NoMatch("no constant operand, or both")
        zero = np.asarray(c.const)
        if zero.dtype.kind not in "iu" or zero.size != 1 or zero.reshape(()) != 0:
            return NoMatch("the constant is not one integer zero")
        xs, ys = x.shape, m["y"].shape
        if xs is None or ys is None or len(xs) < zero.ndim or len(ys) != len(xs):
            return NoMatch("the zero would broadcast x to a higher rank")
        if x.type is None or m["y"].type is None or x.type.elem != m["y"].type.elem:
            return NoMatch("x's element type is not known to be the output's")
        m.data["x"] = x
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        return m.data["x"]


_INSERTING_VIEWS = ("Unsqueeze", "Reshape")


class ConcatOfUnsqueezed(Rule):
    """%y = Concat(V(%x_1), ..., V(%x_n)) {axis k} -> Reshape(Concat(%x_i) {axis k}, shape(y))
    (V inserts a size-1 axis k; module docstring); also com.microsoft QLinearConcat, whose
    inputs are (y_scale, y_zero_point, then x, scale, zero point per input)"""

    pattern = "y = Concat|com.microsoft::QLinearConcat(a, ...)"

    def _data_positions(self, m: Match) -> list[int]:
        n = len(m.root.inputs)
        return list(range(n)) if m.root.op_type == "Concat" else list(range(2, n, 3))

    def check(self, m: Match) -> Match | NoMatch:
        ys = _static(m["y"])
        ins = m.root.inputs
        positions = self._data_positions(m)
        if ys is None or len(positions) < 2:
            return NoMatch("output shape is not static, or one input")
        k = int(m.root.attrs.get("axis", 0))
        k = k + len(ys) if k < 0 else k
        sources = []
        for i in positions:
            v = ins[i]
            p = None if v is None else v.producer
            if p is None or p.domain or p.op_type not in _INSERTING_VIEWS:
                return NoMatch("an input that is not an Unsqueeze / Reshape")
            us, xs = _static(v), _static(p.inputs[0])
            if us is None or xs is None or len(us) != len(xs) + 1 or us[k] != 1:
                return NoMatch(f"input '{v.name}' does not insert a size-1 axis {k}")
            if us[:k] + us[k + 1 :] != xs or k >= len(xs):
                return NoMatch(f"input '{v.name}' does not insert axis {k} before an axis of its input")
            sources.append(p.inputs[0])
        if len({_static(x) for x in sources}) != 1:
            return NoMatch("inputs of different shapes")
        m.data["sources"], m.data["axis"] = sources, k
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        y, k, sources = m["y"], m.data["axis"], m.data["sources"]
        xs = _static(sources[0])
        shape = (*xs[:k], xs[k] * len(sources), *xs[k + 1 :])
        inputs = list(m.root.inputs)
        for i, x in zip(self._data_positions(m), sources, strict=True):
            inputs[i] = x
        cat = b.op(
            m.root.op_type,
            inputs,
            {**m.root.attrs, "axis": k},
            domain=m.root.domain,
            types=result_type(shape_from=shape, elem_from=y),
            name=f"{m.root.name}_flat" if m.root.name else None,
        )
        return _reshape(m, b, cat)


class CollapseViews(RewritePass):
    name = "collapse_views"
    rules = (
        TransposeOfTranspose(),
        TransposeOfUnitAxes(),
        GatherOfUnitAxis(),
        IntegerAddOfZero(),
        ConcatOfUnsqueezed(),
        CollapseViewChain(),
        ConcatOfOne(),
        SplitOfOne(),
    )
