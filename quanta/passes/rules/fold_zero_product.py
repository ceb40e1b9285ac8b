"""Products with an all-zero activation: the matrix product is zero, only the bias is left.

Rules::

    %z = ConstantOfShape(%s) {value = 0}
    %y = Gemm(%z, %w, %c?) {alpha, beta, transA, transB}
        -> %y = Add(ConstantOfShape(Concat(Gather(%s, [transA]), [N])), beta·c)   ZeroStateGemm
           (no %c: the ConstantOfShape alone)
    %y = MatMul(%z, %w: K x N)
        -> %y = ConstantOfShape(Concat(Slice(%s, 0, -1), [N]))                      ZeroStateMatMul

Why: an RNN unrolled by the exporter into Gemm cells (``torch.onnx`` of an ``LSTMCell``
loop) starts from a zero state whose shape depends on the batch, ``ConstantOfShape`` of
a shape computed at run time, so constant folding cannot remove it. The first cell's
recurrent product ``Gemm(h0, W_hh, b_hh)`` then has an input whose calibrated range is
[0, 0]: degenerate, so that Gemm stays float, and its MACs count as float compute in
the coverage report. Its result is ``beta·c`` broadcast to ``[M, N]`` whatever ``W``
holds, as long as ``W`` is finite (``0·inf`` is NaN, so a non-finite weight refuses).

Exactness: every product ``0·w`` is ±0 and a sum of zeros is ±0, so the float Gemm
gives ``±0 + beta·c``, equal to ``beta·c`` as a number (the sign of a zero result may
differ: ``-0 == 0``). ``beta·c`` is folded in float32 as the reference Gemm computes
it. The shape comes from ``%s``: M is its entry 0 (1 with ``transA``), N the weight's.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value
from quanta.ir.types import I64, TensorType
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule

__all__ = ["FoldZeroProduct", "ZeroStateGemm", "ZeroStateMatMul"]


def _zero_fill(m: Match) -> NoMatch | None:
    """A refusal unless ``z`` is ConstantOfShape filled with a float 0 and ``w`` a finite constant."""
    fill = m.node("z").attrs.get("value")
    if fill is not None:
        arr = np.asarray(fill)
        if arr.size != 1 or arr.dtype.kind != "f" or arr.reshape(-1)[0] != 0:
            return NoMatch(
                f"ConstantOfShape fills with {arr.reshape(-1)[:1].tolist()} ({arr.dtype}), not a float 0"
            )
    if not m.is_const("w"):
        return NoMatch("the weight is not a constant")
    w = np.asarray(m.const("w"))
    if w.ndim != 2:
        return NoMatch(f"the weight has rank {w.ndim}, not 2")
    if not np.isfinite(w).all():
        return NoMatch("the weight holds inf or NaN (0 x inf is NaN)")
    s = m["s"]
    if s.shape is None or len(s.shape) != 1 or not isinstance(s.shape[0], int):
        return NoMatch("the zero tensor's shape input has no static length")
    return None


def _out_type(m: Match) -> TensorType:
    """The product's type: its element type is the weight's (a constant, always typed: the
    output may have none when shape inference stopped at the run-time shape)."""
    y, w = m.value("y"), m.value("w")
    assert w.type is not None
    return TensorType(w.type.elem, y.type.shape if y.type is not None else None)


def _shape(b: Builder, m: Match, lead: Value, n: int) -> Value:
    """``Concat(lead, [n])``: the product's shape, its leading dimensions from the zero tensor's."""
    tail = b.const(f"{m.root.name or 'product'}_cols", np.array([n], np.int64))
    return b.op(
        "Concat", [lead, tail], {"axis": 0}, types=TensorType(I64, (None,)), name=f"{m.root.name}/shape"
    )


class ZeroStateGemm(Rule):
    """%y = Gemm(ConstantOfShape(s) {value 0}, w, c?) -> beta·c broadcast to [M, N]"""

    pattern = "y = Gemm(z = ConstantOfShape(s), w, c?)"
    shared_ok = frozenset({"z"})  # the zero state is read by the cell's other ops too

    def check(self, m: Match) -> Match | NoMatch:
        refused = _zero_fill(m)
        if refused is not None:
            return refused
        if m.value("s").shape != (2,):
            return NoMatch(f"the zero tensor has rank {m.value('s').shape[0]}, Gemm needs 2")
        if m["c"] is not None and not m.is_const("c"):
            return NoMatch("the bias is not a constant")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        a = m.root.attrs
        w = np.asarray(m.const("w"))
        n = int(w.shape[0] if a.get("transB", 0) else w.shape[1])
        row = b.const(f"{m.root.name or 'gemm'}_m_axis", np.array([1 if a.get("transA", 0) else 0], np.int64))
        lead = b.op(
            "Gather",
            [m.value("s"), row],
            {"axis": 0},
            types=TensorType(I64, (1,)),
            name=f"{m.root.name}/rows",
        )
        fill = np.zeros(1, dtype=w.dtype)
        zeros = b.op(
            "ConstantOfShape",
            [_shape(b, m, lead, n)],
            {"value": fill},
            types=_out_type(m),
            name=f"{m.root.name}/zeros" if m["c"] is not None else m.root.name,
        )
        if m["c"] is None:
            return zeros
        beta = w.dtype.type(a.get("beta", 1.0))
        bias = b.const(f"{m['c'].name}_scaled", (beta * np.asarray(m.const("c"), w.dtype)).astype(w.dtype))
        return b.op("Add", [zeros, bias], types=_out_type(m), name=m.root.name)


class ZeroStateMatMul(Rule):
    """%y = MatMul(ConstantOfShape(s) {value 0}, w: K x N) -> zeros [..., M, N]"""

    pattern = "y = MatMul(z = ConstantOfShape(s), w)"
    shared_ok = frozenset({"z"})

    def check(self, m: Match) -> Match | NoMatch:
        refused = _zero_fill(m)
        if refused is not None:
            return refused
        if m.value("s").shape[0] < 2:
            return NoMatch("the zero tensor is 1-D (a vector product)")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        w = np.asarray(m.const("w"))
        n = int(w.shape[1])
        r = int(m.value("s").shape[0])
        name = m.root.name or "matmul"
        lead = b.op(
            "Slice",
            [
                m.value("s"),
                b.const(f"{name}_start", np.array([0], np.int64)),
                b.const(f"{name}_end", np.array([r - 1], np.int64)),
            ],
            types=TensorType(I64, (r - 1,)),
            name=f"{name}/rows",
        )
        return b.op(
            "ConstantOfShape",
            [_shape(b, m, lead, n)],
            {"value": np.zeros(1, dtype=w.dtype)},
            types=_out_type(m),
            name=m.root.name,
        )


class FoldZeroProduct(RewritePass):
    name = "fold_zero_product"

    def __init__(self) -> None:
        super().__init__([ZeroStateGemm(), ZeroStateMatMul()])
