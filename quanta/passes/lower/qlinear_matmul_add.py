"""A QLinearMatMul and the QLinearAdd of a constant after it as one node
(FuseQLinearMatMulAdd)::

    %y = QLinearMatMul(a, sa, za, b, sb, zb, sy, zy)
    %z = com.microsoft::QLinearAdd(c, sc, zc, %y, sy', zy', sz, zz)      (or %y first)
      -> %z = quanta::QLinearMatMulAdd(a, sa, za, b, sb, zb, sy, zy, c, sc, zc, sz, zz)
                                       {c_first = 1}                 ({c_first = 0})

Why: a transformer's Q / K / V projections are a QLinearMatMul and the QLinearAdd of the
layer's bias (a QDQ file quantizes the MatMul's output, then the bias Add's):
all-MiniLM-L6-v2 has 18 such pairs, ~14 µs a QLinearAdd step that reads and writes the
whole [128, 384] product again. On the codes of one column, QLinearAdd with a constant
operand is an affine map with per-column constants, (QA1)-(QA3) of
docs/quantization-math.md (reference/qlinear_matmul_add.py): two fused multiply-adds on the
code in the GEMM's registers before it is stored (qgemm.h ``post_k``).

When: ``c`` a constant of one value or one per column of y (leading 1s, no broadcasting
of y); every scale and zero point of both nodes constant, the QLinearAdd's per tensor and
its scales finite and > 0; ``b`` a constant of rank 2 (the prepacked GEMM whose output
stage takes the second stage); y read by the QLinearAdd only; y, c and z of one 8-bit
type (QLinearAdd takes one); the QLinearAdd's (sy', zy') for y the QLinearMatMul's (sy, zy)
in value (a QDQ file's one Q / DQ pair between them gives that), so the node keeps one pair.

Numerics: exact. The node is defined as the two twins in order
(reference/qlinear_matmul_add.py); the second stage computes QLinearAdd's own float32
operations (note (a) of reference/ms_qlinear.py).

A cheaper exact form does not exist in general: folding the Add into the GEMM's single
requantization would round once where the pair rounds twice (rne(acc·m) + zy, then the
Add's rne), and even with sy' = sz (rA or rB = 1) ``rne(y + t)`` differs from
``y + rne(t)`` when ``f32(y + t)`` drops the bits of t that break a tie.
"""

from __future__ import annotations

import math

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule

__all__ = ["FuseQLinearMatMulAdd", "FuseQLinearMatMulAddPass"]

QUANTA_DOMAIN = "quanta"
_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))

_PRODUCT = "y = QLinearMatMul(a, sa, za, b, sb, zb, sy, zy)"


def _const(v: Value | None) -> np.ndarray | None:
    return None if v is None or not v.is_const else np.asarray(v.const)


class _FuseBase(Rule):
    c_first: bool

    def check(self, m: Match) -> Match | NoMatch:
        y, z = m.value("y"), m.value("z")
        if any(o is y for o in m.graph.outputs):
            return NoMatch("the product is a graph output")
        names = ("sa", "za", "b", "sb", "zb", "sy", "zy", "c", "sc", "zc", "sy2", "zy2", "sz", "zz")
        consts = {k: _const(m[k]) for k in names}
        missing = [k for k, v in consts.items() if v is None]
        if missing:
            return NoMatch(f"not constants (or omitted): {', '.join(missing)}")
        wb, c = consts["b"], consts["c"]
        assert wb is not None and c is not None
        if wb.ndim != 2:
            return NoMatch(f"b has rank {wb.ndim}: the fused stage runs on the prepacked rank-2 GEMM")
        n = wb.shape[1]
        for k in ("sa", "za", "sy", "zy", "sc", "zc", "sy2", "zy2", "sz", "zz"):
            arr = consts[k]
            assert arr is not None
            if arr.size != 1:
                return NoMatch(f"{k} has shape {list(arr.shape)}: expected one value (per tensor)")
        for k1, k2 in (("sy", "sy2"), ("zy", "zy2")):
            p1, p2 = consts[k1], consts[k2]
            assert p1 is not None and p2 is not None
            if p1.dtype != p2.dtype or p1.reshape(()).tobytes() != p2.reshape(()).tobytes():
                return NoMatch(
                    f"the QLinearAdd reads the product with {k2} = {p2} != the product's {k1} = {p1}"
                )
        dt = np.dtype(consts["zy"].dtype)  # type: ignore[union-attr]
        if dt not in _EIGHT_BIT or c.dtype != dt or consts["zz"].dtype != dt:  # type: ignore[union-attr]
            return NoMatch("the product, c and the sum are not of one 8-bit type")
        if c.size != 1 and (c.shape[-1] != n or any(d != 1 for d in c.shape[:-1])):
            return NoMatch(f"c has shape {list(c.shape)}: expected one value or one per column ({n})")
        # the product's rank is a's (b is a matrix); c of one value or one per column
        # broadcasts into it unless it has more axes
        a = m.value("a")
        rank = len(y.shape) if y.shape is not None else (len(a.shape) if a.shape is not None else None)
        if c.ndim > 1 and (rank is None or c.ndim > rank):
            return NoMatch(f"c of rank {c.ndim} would add axes to the product of rank {rank}")
        if y.shape is not None and z.shape is not None and tuple(y.shape) != tuple(z.shape):
            return NoMatch(f"the Add broadcasts the product: {list(y.shape)} -> {list(z.shape)}")
        scales = [np.asarray(consts[k], np.float64).reshape(()) for k in ("sc", "sy2", "sz")]
        if any(consts[k].dtype != np.float32 for k in ("sc", "sy2", "sz")):  # type: ignore[union-attr]
            return NoMatch("the QLinearAdd's scales are not float32")
        if not all(math.isfinite(float(s)) and float(s) > 0 for s in scales):
            return NoMatch("a QLinearAdd scale is not finite and > 0")
        # the ratios f32(s/sz) of (QA1) far from overflow: every constant of (QA1)-(QA3) is
        # then finite (8-bit codes times them); the binder computes them exactly
        with np.errstate(all="ignore"):
            ratios = [np.float32(np.float32(s) / np.float32(scales[2])) for s in scales[:2]]
        if not all(math.isfinite(float(r)) and abs(float(r)) < 1e30 for r in ratios):
            return NoMatch("the QLinearAdd's scale ratios are not finite")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        z = m.value("z")
        ins = [m[k] for k in ("a", "sa", "za", "b", "sb", "zb", "sy", "zy", "c", "sc", "zc", "sz", "zz")]
        return b.op(
            "QLinearMatMulAdd",
            ins,
            {"c_first": int(self.c_first)},
            domain=QUANTA_DOMAIN,
            types=result_type(shape_from=z, elem_from=z),
            # the product's name: it carries the MACs (the coverage report finds the
            # MatMul by it; passes/coverage.py counts the bias Add fused into it)
            name=m.node("y").name or None,
        )


class FuseQLinearMatMulAdd(_FuseBase):
    """QLinearAdd(c, sc, zc, QLinearMatMul(..), sy', zy', sz, zz) -> quanta::QLinearMatMulAdd {c_first = 1}"""

    pattern = f"z = com.microsoft::QLinearAdd(c, sc, zc, {_PRODUCT}, sy2, zy2, sz, zz)"
    c_first = True


class FuseQLinearMatMulAddSecond(_FuseBase):
    """QLinearAdd(QLinearMatMul(..), sy', zy', c, sc, zc, sz, zz) -> quanta::QLinearMatMulAdd {c_first = 0}"""

    pattern = f"z = com.microsoft::QLinearAdd({_PRODUCT}, sy2, zy2, c, sc, zc, sz, zz)"
    c_first = False


class FuseQLinearMatMulAddPass(RewritePass):
    """FuseQLinearMatMulAdd, either operand order (the module docstring)."""

    name = "fuse_qlinear_matmul_add"

    def __init__(self) -> None:
        super().__init__([FuseQLinearMatMulAdd(), FuseQLinearMatMulAddSecond()])
