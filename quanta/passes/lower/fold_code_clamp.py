"""A table that only clamps a QLinearConv's codes becomes the convolution's output clamp
(FoldCodeClamp)::

    %y = QLinearConv(x, sx, zx, w, sw, zw, sy, zy, B?)
    %z = quanta::QLinearLookup(%y, sy, zy, sy, zy, table)
      -> %z = QLinearConv(x, sx, zx, w, sw, zw, sy, zy, B?) {output_clamp = [lo, hi]}

    when table[bits(c)] = min(max(c, lo), hi) for every code c of y's type      (C1)

(and the same for com.microsoft QLinearConv, before or after ChannelsLast). Why: a file
that quantizes a Conv's output before its Relu6 / Clip (AMD Quark: uint8 at zero point
128, where ``Q(0) = 128`` is not the type's minimum, so the quantization does not imply
the clamp) lowers to QLinearConv, then the clamp as a 256-entry table on the codes
(fuse_activation.QuantizeBeforeActivation, LowerLookup): a second pass over every
output. The integer epilogue clamps anyway (to the type's range, eq. (6)); with the
bounds of (C1) it clamps to ``[lo, hi]`` in the same instructions (eq. (6c),
docs/quantization-math.md; conv.h ``ConvArgs::clamp_lo``).

Numerics: exact. The table is what the unlowered group computes on each code (LowerLookup
runs the group's own nodes on the 256 codes), and (C1) checks that it is a clamp of the
codes, so ``min(max(y, lo), hi)`` is ``table[bits(y)]`` for every y the convolution can
write. The float bounds map to codes exactly or not at all matters only through the table:
Q(clip(DQ(c), l, h)) is a clamp of codes whenever ``Q(DQ(c)) = c`` on every code (which
QuantizeBeforeActivation checks), the bounds rounded to the codes ``Q(l)``, ``Q(h)``. A
table that is not (C1) (a clamp at a float bound read with another rounding, a Relu
followed by a rescale, a table per channel) stays a table, with the reason.

Refused, each with its reason: a per-channel table (attribute ``axis``); the table or the
scales / zero points not constants; the lookup's input or output quantization differing
from the convolution's (a requantizing table is not a clamp); a table that is not (C1);
a convolution that already clamps; y a graph output or read elsewhere (the pattern
engine's reason).
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.ir.op_facts import MS
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule

__all__ = ["FoldCodeClamp", "FoldCodeClampPass", "clamp_of_table"]

_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))
_CONV = "QLinearConv(x, sx, zx, w, sw, zw, sy, zy, ...)"


def _const(v: Value | None) -> np.ndarray | None:
    return None if v is None or not v.is_const else np.asarray(v.const)


def clamp_of_table(table: np.ndarray) -> tuple[int, int] | None:
    """``(lo, hi)`` when the 256-entry ``table`` (indexed by a code's byte, of uint8 or
    int8) is ``min(max(c, lo), hi)`` on every code c (C1), else None.

    >>> clamp_of_table(np.clip(np.arange(256), 128, 224).astype(np.uint8))
    (128, 224)
    >>> clamp_of_table(np.minimum(np.arange(256), 200).astype(np.uint8)[::-1].copy()) is None
    True
    >>> codes = np.arange(256).astype(np.uint8).view(np.int8)  # byte order: 0..127, -128..-1
    >>> clamp_of_table(np.clip(codes, -7, 100).astype(np.int8))
    (-7, 100)
    """
    table = np.asarray(table)
    if table.shape != (256,) or table.dtype not in _EIGHT_BIT:
        return None
    codes = np.arange(256, dtype=np.uint8).view(table.dtype).astype(np.int64)  # the code of each byte
    info = np.iinfo(table.dtype)
    lo, hi = int(table[info.min % 256]), int(table[info.max % 256])  # the bytes of qmin, qmax
    if lo > hi or not np.array_equal(table.astype(np.int64), np.clip(codes, lo, hi)):
        return None
    return lo, hi


class _FoldBase(Rule):
    def check(self, m: Match) -> Match | NoMatch:
        conv, look = m.node("y"), m.root
        if "axis" in look.attrs:
            return NoMatch("the table is per channel (attribute axis): not one clamp of the codes")
        if "output_clamp" in conv.attrs:
            return NoMatch("the convolution already clamps its codes (output_clamp)")
        consts = {k: _const(m[k]) for k in ("sy", "zy", "sy1", "zy1", "sz", "zz", "table")}
        missing = [k for k, v in consts.items() if v is None]
        if missing:
            return NoMatch(f"not constants (or omitted): {', '.join(missing)}")
        sy, zy = consts["sy"], consts["zy"]
        assert sy is not None and zy is not None
        for ks, kz in (("sy1", "zy1"), ("sz", "zz")):
            s, z = consts[ks], consts[kz]
            assert s is not None and z is not None
            if (
                s.dtype != sy.dtype
                or z.dtype != zy.dtype
                or s.tobytes() != sy.tobytes()
                or z.tobytes() != zy.tobytes()
            ):
                side = "input" if ks == "sy1" else "output"
                return NoMatch(
                    f"the table's {side} quantization ({s.tolist()}, {z.tolist()}) is not the convolution's "
                    f"({sy.tolist()}, {zy.tolist()}): the table requantizes"
                )
        table = consts["table"]
        assert table is not None
        if table.dtype != zy.dtype:
            return NoMatch(f"the table is {table.dtype}, the convolution's codes {zy.dtype}")
        bounds = clamp_of_table(table)
        if bounds is None:
            return NoMatch("the table is not a clamp of the codes (C1): it stays a table")
        m.data["bounds"] = bounds
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        conv, z = m.node("y"), m.value("z")
        lo, hi = m.data["bounds"]
        inputs = list(conv.inputs)
        return b.op(
            conv.op_type,
            inputs,
            {**conv.attrs, "output_clamp": [lo, hi]},
            domain=conv.domain,
            types=result_type(shape_from=z, elem_from=z),  # the replaced lookup's contract
            # the convolution's name: it carries the MACs (the coverage report finds it)
            name=conv.name or None,
            attr_types={**conv.attr_types, "output_clamp": 7},  # onnx AttributeProto.INTS
        )


class FoldCodeClamp(_FoldBase):
    """quanta::QLinearLookup(QLinearConv(..), sy, zy, sy, zy, clamp table) -> QLinearConv(..) {output_clamp}"""

    pattern = f"z = quanta::QLinearLookup(y = {_CONV}, sy1, zy1, sz, zz, table)"


class FoldCodeClampMs(_FoldBase):
    """The same on com.microsoft QLinearConv (ChannelsLast's NHWC form)."""

    pattern = f"z = quanta::QLinearLookup(y = {MS}::{_CONV}, sy1, zy1, sz, zz, table)"


class FoldCodeClampPass(RewritePass):
    """FoldCodeClamp on both QLinearConv domains (the module docstring)."""

    name = "fold_code_clamp"

    def __init__(self) -> None:
        super().__init__([FoldCodeClamp(), FoldCodeClampMs()])
