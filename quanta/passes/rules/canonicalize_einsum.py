"""A two-operand Einsum becomes the MatMul it computes, between Transposes and Reshapes.

::

    %y = Einsum(%a, %b, equation="bcd,bnd->bcn")
      -> %y = MatMul(%a, Transpose(%b, perm=[0, 2, 1]))                       EinsumToMatMul
    %y = Einsum(%a, %b, equation="bcd,bdhw->bchw")
      -> %y = Reshape(MatMul(%a, Reshape(%b, [0, 128, 256])), [0, 17, 16, 16])

The labels of an equation with two operands fall into four groups (each label once per
operand): batch (in a, b and the output), free of a (in a and the output), free of b
(in b and the output) and contracted (in a and b only). Then

    y[batch, fa, fb] = Σ_{k in contracted} a[batch, fa, k] · b[batch, k, fb]

which is the MatMul of a laid out as [batch…, M, K] and b as [batch…, K, N], M, K and N the
products of the free-of-a, contracted and free-of-b dimensions: a Transpose puts each
operand's labels in that order, a Reshape merges a group of several (or supplies the 1 of
an empty one), and a Reshape and a Transpose after the MatMul restore the output's labels.
When the free-of-a dimensions are several and their product is not static (a grouped
linear layer "btgi,gih->btgh" over a symbolic batch and time), they stay separate: a is
[batch…, fa_1, …, fa_n, K], b is reshaped to [batch…, 1, …, 1, K, N] (n − 1 ones), and the
MatMul broadcasts b over fa_1 … fa_{n−1} (the same products and sums).
The products and the sums are the ones the spec defines; only their summation order is
the MatMul's (the float GEMM family's (FG1) bound on the native target,
docs/float-ops.md), where the reference Einsum is ``np.einsum``'s, whose order NumPy
does not state either. The Reshapes copy batch dimensions with 0 (allowzero=0) and take
the merged sizes from static dimensions (at most one group of unknown size, as −1), so
a symbolic batch is fine. The Einsum's element type stays (Transpose and Reshape keep
it, MatMul's result is the Einsum's type).

Why: Einsum has no native kernel, MatMul has (a packed float GEMM); TesseraNet's three
Einsums ran on ``np.einsum``.

NoMatch reasons: not two operands, an ellipsis, a label repeated within an operand (a
diagonal) or summed within one operand only (a reduction), an operand of unknown rank
or a rank that differs from its subscript, a non-float element type, and merged groups
whose sizes are not static (more than one unknown).
"""

from __future__ import annotations

import math

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.ir.types import Dim, FloatType, TensorType
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule

__all__ = [
    "ActivationEinsumToMatMul",
    "CanonicalizeActivationEinsum",
    "CanonicalizeEinsum",
    "EinsumToMatMul",
    "operand_shape",
    "parse_equation",
]


def parse_equation(equation: str, n_operands: int) -> tuple[list[str], str] | str:
    """(operand subscripts, output subscript) of an Einsum equation, the output of an
    implicit one being its labels that occur once, in alphabetical order (numpy's and
    ONNX's convention); or why it is not one this rule handles."""
    eq = equation.replace(" ", "")
    if "." in eq:
        return "an ellipsis in the equation"
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != n_operands:
        return f"the equation names {len(terms)} operands, the node has {n_operands}"
    labels = lhs.replace(",", "")
    if not all(c.isalpha() for c in labels + out):
        return f"equation {equation!r} has a character that is not a label"
    if not arrow:
        out = "".join(sorted(c for c in set(labels) if labels.count(c) == 1))
    return terms, out


class EinsumToMatMul(Rule):
    """%y = Einsum(%a, %b) -> %y = Transpose(Reshape(MatMul(Reshape(Transpose(%a)), Reshape(Transpose(%b)))))
    (each Transpose / Reshape only where needed)

    y[batch, fa, fb] = Σ_k a[batch, fa, k] · b[batch, k, fb]   (the module docstring)
    """

    pattern = "y = Einsum(a, b, ...)"

    def check(self, m: Match) -> Match | NoMatch:
        plan = _plan_of(m)
        return NoMatch(plan) if isinstance(plan, str) else m

    def rewrite(self, m: Match, b: Builder) -> Value:
        plan = _plan_of(m)
        assert not isinstance(plan, str), plan  # check() accepted this match
        a, bv, y = m.value("a"), m.value("b"), m.value("y")
        elem = plan.elem
        for v in (a, bv):  # a shape carried through a DequantizeLinear becomes the value's
            if v.shape is None:
                v.type = TensorType(
                    v.type.elem if v.type is not None and v.type.elem is not None else elem, operand_shape(v)
                )
        ta = _arrange(b, a, plan.sa, [*plan.batch, *plan.free_a, *plan.contract], plan.a_target, elem, "a")
        tb = _arrange(b, bv, plan.sb, [*plan.batch, *plan.contract, *plan.free_b], plan.b_target, elem, "b")
        mm_shape = (*(plan.dim[c] for c in plan.batch), *plan.mm_free_a(), plan.size(plan.free_b))
        r = b.op("MatMul", [ta, tb], types=TensorType(elem, mm_shape), name=f"{m.root.name}_matmul")
        labels = [*plan.batch, *plan.free_a, *plan.free_b]
        if plan.y_target is not None:
            shape = tuple(plan.dim[c] for c in labels)
            r = b.op(
                "Reshape",
                [r, b.const("einsum_shape", np.asarray(plan.y_target, np.int64))],
                types=TensorType(elem, shape),
                name=f"{m.root.name}_reshape_y",
            )
        perm = [labels.index(c) for c in plan.out]
        if perm != list(range(len(perm))):
            r = b.op(
                "Transpose",
                [r],
                {"perm": perm},
                types=result_type(shape_from=y, elem_from=y),
                name=f"{m.root.name}_transpose_y",
            )
        return r


def operand_shape(v: Value) -> tuple[Dim, ...] | None:
    """``v``'s shape; for a DequantizeLinear / QuantizeLinear output of unknown shape, its
    input's (elementwise: the same shape). An ONNX Runtime QOperator file dequantizes the
    codes a ``com.microsoft`` operator made, whose shapes onnx's inference does not reach;
    the codes' Reshape knows its rank (FoldReshapeDims), the DequantizeLinear after it does
    not."""
    if v.shape is not None:
        return tuple(v.shape)
    p = v.producer
    if p is not None and p.op_type in ("DequantizeLinear", "QuantizeLinear") and p.input(0) is not None:
        shape = p.input(0).shape
        return None if shape is None else tuple(shape)
    return None


def _plan_of(m: Match) -> _Plan | str:
    """The rewrite's plan for the matched Einsum, or why it has none."""
    if len(m.root.inputs) != 2:
        return f"Einsum of {len(m.root.inputs)} operands (only two are a MatMul)"
    parsed = parse_equation(str(m.root.attrs.get("equation", "")), 2)
    if isinstance(parsed, str):
        return parsed
    (sa, sb), out = parsed
    y = m.value("y")
    if y.type is None or not isinstance(y.type.elem, FloatType):
        return f"Einsum '{m.root.name}' has no float result type"
    shapes: list[tuple[Dim, ...]] = []
    for name, sub in (("a", sa), ("b", sb)):
        v = m.value(name)
        shape = operand_shape(v)
        if shape is None:
            return f"operand {name} '{v.name}' has an unknown rank"
        if len(shape) != len(sub):
            return f"operand {name} '{v.name}' has rank {len(shape)}, its subscript {sub!r} {len(sub)}"
        if not sub:
            return f"operand {name} '{v.name}' is a scalar"
        if len(set(sub)) != len(sub):
            return f"subscript {sub!r} repeats a label (a diagonal)"
        shapes.append(tuple(shape))
    if len(set(out)) != len(out):
        return f"output subscript {out!r} repeats a label"
    for c in sorted(set(sa) ^ set(sb)):
        if c not in out:
            return f"label {c!r} is summed within one operand (a reduction, not a product)"
    if not set(out) <= set(sa) | set(sb):
        return f"output subscript {out!r} has a label no operand has"
    plan = _Plan(sa, sb, out, shapes[0], shapes[1], y.type.elem)
    return plan.refusal or plan


def _dim_rank(d: Dim) -> int:
    return 3 if isinstance(d, int) and d != 1 else 2 if isinstance(d, str) else 1 if d is None else 0


class _Plan:
    """The label groups of a two-operand equation, the sizes of its merged groups and the
    Reshape targets (None: the layout needs no Reshape); ``refusal`` when a merged size
    cannot be written."""

    def __init__(
        self, sa: str, sb: str, out: str, shape_a: tuple[Dim, ...], shape_b: tuple[Dim, ...], elem: FloatType
    ):
        self.sa, self.sb, self.out, self.elem = sa, sb, out, elem
        self.batch = [c for c in out if c in sa and c in sb]
        self.free_a = [c for c in out if c in sa and c not in sb]
        self.free_b = [c for c in out if c in sb and c not in sa]
        self.contract = [c for c in sa if c in sb and c not in out]
        # a label's size: a static size other than 1 over a symbolic one, over an unknown
        # one, over a 1 that may be a broadcast batch dimension
        self.dim: dict[str, Dim] = {}
        for sub, shape in ((sa, shape_a), (sb, shape_b)):
            for c, d in zip(sub, shape):
                if c not in self.dim or _dim_rank(d) > _dim_rank(self.dim[c]):
                    self.dim[c] = d
        self.refusal = ""
        nb = len(self.batch)
        #: a's free labels stay separate dimensions (all but the last MatMul batch
        #: dimensions that b broadcasts over with unit ones) when two of them are not
        #: static (a symbolic batch and time before a grouped linear layer): no Reshape
        #: can merge them (one −1 at most)
        self.split_a = sum(not isinstance(self.dim[c], int) for c in self.free_a) > 1
        if self.split_a:
            na = len(self.free_a)
            self.a_target = self._target(nb + na, [self.contract], "merging a's groups")
            self.b_target = self._unit_target(nb, na - 1, [self.contract, self.free_b], "merging b's groups")
            self.y_target = self._target(
                nb + na, [[c] for c in self.free_b], "splitting the product into", [self.free_b]
            )
        else:
            self.a_target = self._target(nb, [self.free_a, self.contract], "merging a's groups")
            self.b_target = self._target(nb, [self.contract, self.free_b], "merging b's groups")
            self.y_target = self._target(
                nb,
                [[c] for c in self.free_a + self.free_b],
                "splitting the product into",
                [self.free_a, self.free_b],
            )

    def mm_free_a(self) -> tuple[Dim, ...]:
        """The MatMul result's dimensions for a's free labels: one merged, or each."""
        if self.split_a:
            return tuple(self.dim[c] for c in self.free_a)
        return (self.size(self.free_a),)

    def _unit_target(self, nb: int, units: int, groups: list[list[str]], what: str) -> list[int] | None:
        """b's Reshape when a's free labels stay separate: 0 for each batch dimension,
        ``units`` ones for a's leading free labels, then each group's size."""
        sizes = [self.size(g) for g in groups]
        if sum(not isinstance(z, int) for z in sizes) > 1:
            self.refusal = self.refusal or (
                f"{what} "
                + ", ".join(repr("".join(g)) for g in groups)
                + " needs two sizes that are not static"
            )
            return None
        return [0] * nb + [1] * units + [-1 if not isinstance(z, int) else int(z) for z in sizes]

    def size(self, group: list[str]) -> Dim:
        """The product of a group's dimensions (1 for none), None when one is not static."""
        dims = [self.dim[c] for c in group]
        if len(dims) == 1:
            return dims[0]
        return math.prod(dims) if all(isinstance(d, int) for d in dims) else None  # type: ignore[arg-type]

    def _target(
        self, nb: int, groups: list[list[str]], what: str, layout: list[list[str]] | None = None
    ) -> list[int] | None:
        """A Reshape's shape: 0 for each batch dimension, then each group's size (−1 for
        one of unknown size); None when ``layout`` (default ``groups``) is already one
        dimension per group."""
        if all(len(g) == 1 for g in layout or groups):
            return None
        sizes = [self.size(g) for g in groups]
        unknown = [i for i, s in enumerate(sizes) if not isinstance(s, int)]
        if len(unknown) > 1:
            self.refusal = self.refusal or (
                f"{what} "
                + ", ".join(repr("".join(g)) for g in groups)
                + " needs two sizes that are not static"
            )
            return None
        return [0] * nb + [-1 if not isinstance(s, int) else int(s) for s in sizes]


def _arrange(
    b: Builder,
    v: Value,
    sub: str,
    order: list[str],
    target: list[int] | None,
    elem: FloatType,
    which: str,
) -> Value:
    """``v`` transposed to the labels ``order`` and reshaped to ``target`` (each only when
    needed). Transpose and Reshape keep the element type: the operand's, which is the
    Einsum's (one type variable)."""
    perm = [sub.index(c) for c in order]
    assert v.shape is not None
    shape = tuple(v.shape[p] for p in perm)
    name = b.match.root.name
    if perm != list(range(len(perm))):
        v = b.op(
            "Transpose", [v], {"perm": perm}, types=TensorType(elem, shape), name=f"{name}_transpose_{which}"
        )
    if target is not None:
        # a 0 copies the dimension at its position; b's unit dimensions (split_a) come
        # after the batch ones, which are all 0
        dims: list[Dim] = [shape[i] if t == 0 else (None if t == -1 else t) for i, t in enumerate(target)]
        v = b.op(
            "Reshape",
            [v, b.const("einsum_shape", np.asarray(target, np.int64))],
            types=TensorType(elem, tuple(dims)),
            name=f"{name}_reshape_{which}",
        )
    return v


class ActivationEinsumToMatMul(EinsumToMatMul):
    """EinsumToMatMul where neither operand is a constant: an attention product
    ("BGHID,BGHJD->BGHIJ" in MaxViT), which the quantizer then plans as the MatMul it is
    (an attention written with MatMul is quantized; one written with Einsum was not).
    An Einsum with a constant operand (a grouped linear layer "btgi,gih->btgh") stays:
    its [g, i, h] weight would be one per-tensor grid over all groups as a MatMul's,
    which ONNX Runtime's quantizer does not do either."""

    def check(self, m: Match) -> Match | NoMatch:
        if m.value("a").is_const or m.value("b").is_const:
            return NoMatch("an operand is a constant (a weight): the Einsum stays for the quantizer")
        return super().check(m)


class CanonicalizeEinsum(RewritePass):
    name = "canonicalize_einsum"
    rules = (EinsumToMatMul(),)


class CanonicalizeActivationEinsum(RewritePass):
    """Before quantization: only the Einsums of two run-time operands (ActivationEinsumToMatMul)."""

    name = "canonicalize_activation_einsum"
    rules = (ActivationEinsumToMatMul(),)
