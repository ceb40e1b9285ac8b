"""A table that maps every code to itself becomes a relabelling of the same bytes
(RelabelCodesOfIdentityTable)::

    %z = quanta::QLinearLookup(%x, sx, zx, sz, zz, table)
      -> %z = quanta::RelabelCodes(%x)         z's type: Q(storage of x, sz, zz)

    when table[bits(c)] = c for every code c of x's type          (IS1), docs/passes.md

Why: PP-OCR's learnable affine blocks (``w0 · x + w1`` of learnt scalars after each
HardSwish) quantize to the same codes under a scale and zero point chosen for them:
quanta's calibration sets ``sz = w0 · sx`` and moves the zero point by ``w1 / sz``
when that is exact, so ComposeCodeMaps8 composes the group into a table that is the
identity on the codes (17 per PP-OCRv4 file of quanta's, 4-6 in ORT's files after a
QuantizeLinear). The lookup reads and writes every element of the tensor for nothing;
``quanta::RelabelCodes`` is an alias op (no buffer, no step in a native program:
quanta/runtime/memory.py, targets/native/views.py): its output is its input's memory
with the lookup's output type, so the readers see the bytes the table would write.

Numerics: exact. (IS1) is checked on all 256 codes with ``clamp_of_table`` (the
identity is the clamp to the type's whole range), so the output bytes are the input
bytes; the type the readers are lowered against is the lookup's own output type.

Refused, each with its reason: a per-channel table (attribute ``axis``); the table not a
constant; input and output stored in different integer types, or quantized per axis; a
table that is not (IS1). (A lowered graph's outputs are float: z is never one.)
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.ir.op_facts import QUANTA
from quanta.ir.types import QuantType
from quanta.passes.lower.fold_code_clamp import clamp_of_table
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule

__all__ = ["RelabelCodesOfIdentityTable", "RelabelCodesPass"]


class RelabelCodesOfIdentityTable(Rule):
    """quanta::QLinearLookup(x, .., identity table) -> quanta::RelabelCodes(x) (IS1)"""

    pattern = "z = quanta::QLinearLookup(x, sx, zx, sz, zz, table)"

    def check(self, m: Match) -> Match | NoMatch:
        look, x, z = m.root, m.value("x"), m.value("z")
        if "axis" in look.attrs:
            return NoMatch("the table is per channel (attribute axis)")
        table = m["table"]
        if table is None or not table.is_const:
            return NoMatch("the table is not a constant")
        src = None if x.type is None else x.type.elem
        dst = None if z.type is None else z.type.elem
        if not (isinstance(src, QuantType) and isinstance(dst, QuantType)):
            return NoMatch(f"not quantized on both sides ({src} -> {dst})")
        if src.storage != dst.storage or src.axis is not None or dst.axis is not None:
            return NoMatch(f"not one per-tensor storage type on both sides ({src} -> {dst})")
        codes = np.asarray(table.const)
        if codes.dtype != np.dtype(src.storage.numpy):
            return NoMatch(f"the table is {codes.dtype}, the codes {src.storage}")
        info = np.iinfo(codes.dtype)
        if clamp_of_table(codes) != (int(info.min), int(info.max)):
            return NoMatch("the table changes some code (IS1): it stays a table")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        z = m.value("z")
        return b.op(
            "RelabelCodes",
            [m["x"]],
            {},
            domain=QUANTA,
            types=result_type(shape_from=z, elem_from=z),
            name=m.root.name or None,
        )


class RelabelCodesPass(RewritePass):
    """RelabelCodesOfIdentityTable (the module docstring)."""

    name = "relabel_codes"

    def __init__(self) -> None:
        super().__init__([RelabelCodesOfIdentityTable()])
