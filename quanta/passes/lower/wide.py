"""Instruction selection for QDQ groups with a 16-bit operand: ``quanta::QLinearConv16`` /
``quanta::QLinearMatMul16`` (docs/quantization-math.md §A16W8)::

    Q(Conv(DQ(x), DQ(w), b?))      -> quanta::QLinearConv16(x, sx, zx, w, sw, zw, sy, zy, bq?)   (LowerConv16)
    Q(MatMul(DQ(a), DQ(b)))        -> quanta::QLinearMatMul16(a, sa, za, b, sb, zb, sy, zy)      (LowerMatMul16)
    Q(Gemm(DQ(a), DQ(b), c?))      -> quanta::QLinearMatMul16(a, sa, za, bᵀ?, sb, zb, sy, zy, cq?) (LowerGemm16)

They fire where the 8-bit rules refuse because an operand (the activation, typically:
ONNX Runtime's quantizer with ``activation_type=QUInt16``, quanta's
``activation_type="int16"``) is stored in 16 bits; every operand is one of u8, i8, u16,
i16 and at least one has 16 bits. ONNX Runtime has no integer operator for these groups
(its QDQ transformer leaves 16-bit groups as float DQ -> op -> Q); quanta accumulates
them exactly in int64 and requantizes once (eqs. (A1)-(A4)), so the lowered op differs
from the float group only where rounding happens, as the 8-bit ops do.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.ir.types import QuantType, TensorType
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import describe

__all__ = ["LowerConv16", "LowerGemm16", "LowerMatMul16", "MsQdqToOnnx", "MsQdqToOnnxPass", "wide_rules"]

QUANTA_DOMAIN = "quanta"
WIDE_STORAGE = ("u8", "i8", "u16", "i16")


def _check_wide(items: tuple[tuple[QuantType | None, str, bool], ...]) -> NoMatch | None:
    """Every operand u8/i8/u16/i16 with constant parameters, per tensor where the flag
    says so, and at least one of 16 bits (8-bit groups go to the 8-bit rules)."""
    wide = False
    for q, what, per_tensor in items:
        if q is None:
            return NoMatch(f"{what} has no constant quantization parameters")
        if str(q.storage) not in WIDE_STORAGE:
            return NoMatch(f"{what} is stored as {q.storage}; QLinear*16 takes u8, i8, u16 or i16")
        if per_tensor and q.axis is not None:
            return NoMatch(f"{what} is quantized per axis ({q.axis}); the op takes one scale here")
        if q.block is not None:
            return NoMatch(f"{what} is quantized per block; QLinear*16 takes per-tensor or per-channel")
        wide = wide or str(q.storage) in ("u16", "i16")
    if not wide:
        return NoMatch("no operand is stored in 16 bits (the 8-bit rules handle it)")
    return None


class LowerConv16(Rule):
    """``Q(Conv(DQ(x), DQ(w), b?)) -> quanta::QLinearConv16(...)`` with a 16-bit operand."""

    pattern = (
        "y = QuantizeLinear(c = Conv(xf = DequantizeLinear(x, sx, zx?), "
        "wf = DequantizeLinear(w, sw, zw?), b?), sy, zy?)"
    )
    shared_ok = frozenset({"xf", "wf"})

    def check(self, m: Match) -> Match | NoMatch:
        return conv_check(m, _check_wide, "QLinearConv16")

    def rewrite(self, m: Match, b: Builder) -> Value:
        return conv_rewrite(m, b, "QLinearConv16", QUANTA_DOMAIN, scalar_zw=False)


class LowerMatMul16(Rule):
    """``Q(MatMul(DQ(a), DQ(b))) -> quanta::QLinearMatMul16(...)`` with a 16-bit operand;
    b a constant (per tensor or per column) or an activation (per tensor)."""

    pattern = (
        "y = QuantizeLinear(c = MatMul(af = DequantizeLinear(a, sa, za?), "
        "bf = DequantizeLinear(bq, sb, zb?)), sy, zy?)"
    )
    shared_ok = frozenset({"af", "bf"})

    def check(self, m: Match) -> Match | NoMatch:
        got = matmul_check(m, _check_wide)
        if isinstance(got, NoMatch):
            return got
        bshape = m.value("bq").shape
        if bshape is None or len(bshape) < 2:
            return NoMatch("input b is not known to be of rank >= 2")
        return got

    def rewrite(self, m: Match, b: Builder) -> Value:
        return matmul_rewrite(m, b, "QLinearMatMul16", QUANTA_DOMAIN)


class LowerGemm16(Rule):
    """``Q(Gemm(DQ(a), DQ(b), c?)) -> quanta::QLinearMatMul16(a, .., b or bᵀ, .., cq?)`` with a
    16-bit operand: b a constant (transB transposes it here), alpha 1, transA 0, the bias an
    int32 ``DQ(cq, sa·sb, 0)`` or a float constant (quantized as ONNX Runtime does)."""

    pattern = (
        "y = QuantizeLinear(c = Gemm(af = DequantizeLinear(a, sa, za?), "
        "bf = DequantizeLinear(bq, sb, zb?), cb?), sy, zy?)"
    )
    shared_ok = frozenset({"af", "bf"})

    def check(self, m: Match) -> Match | NoMatch:
        bad = _check_consts(m, "sa", "za", "sb", "zb", "sy", "zy")
        if bad is not None:
            return bad
        gemm = m.node("c")
        if not m.is_const("bq"):
            return NoMatch(f"weight {describe(m['bq'])} is not a constant")
        if float(gemm.attrs.get("alpha", 1.0)) != 1.0 or int(gemm.attrs.get("transA", 0)):
            return NoMatch("Gemm with alpha != 1 or transA")
        if float(gemm.attrs.get("beta", 1.0)) != 1.0 and m["cb"] is not None:
            return NoMatch("Gemm with a bias and beta != 1")
        qa = _params(m, "af", "a", "sa", "za")
        qb = _params(m, "bf", "bq", "sb", "zb")
        qy = _params(m, "y", "y", "sy", "zy")
        bad = _check_wide(((qa, "input a", True), (qb, "weight b", False), (qy, "output y", True)))
        if bad is not None:
            return bad
        assert qa is not None and qb is not None
        trans_b = int(gemm.attrs.get("transB", 0))
        if qb.axis is not None and qb.axis % 2 != (0 if trans_b else 1):
            return NoMatch(f"weight b is quantized along axis {qb.axis}, not its output columns")
        bias = _int32_bias(m, "cb", qa, qb, quantize_float=True)
        if isinstance(bias, NoMatch):
            return bias
        m.data.update(qa=qa, qb=qb, qy=qy, bias=bias, trans_b=trans_b)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        qb: QuantType = m.data["qb"]
        wb = m["bq"]
        if m.data["trans_b"]:
            wt = np.ascontiguousarray(np.asarray(wb.const).T)
            qt = dataclasses.replace(qb, axis=None if qb.axis is None else 1)
            wb = b.const(f"{wb.name}_transposed", wt, TensorType(qt, tuple(wt.shape)))
        inputs: list[Value | None] = [
            m["a"],
            m["sa"],
            _zero_point_or_default(b, m, "za", m.data["qa"], "a_zero_point"),
            wb,
            m["sb"],
            _zero_point_or_default(b, m, "zb", qb, "b_zero_point"),
            m["sy"],
            _zero_point_or_default(b, m, "zy", m.data["qy"], "y_zero_point"),
        ]
        bias = m.data["bias"]
        if isinstance(bias, np.ndarray):
            bias = b.const(f"{m['cb'].name}_quantized", bias)
        if bias is not None:
            inputs.append(bias)
        return b.op(
            "QLinearMatMul16",
            inputs,
            domain=QUANTA_DOMAIN,
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            name=m.node("c").name or None,
        )


class MsQdqToOnnx(Rule):
    """``com.microsoft::QuantizeLinear|DequantizeLinear`` -> the ai.onnx op (integer storage).

    ONNX Runtime's quantizer writes 16-bit Q/DQ in its contrib domain (``use_qdq_contrib_ops``,
    which ai.onnx opsets before 21 required), the 8-bit weights of such a file too; the two
    ops compute the same map (eq. (2)) with float32 scales, so the groups become visible to constant folding
    (which keeps ai.onnx DequantizeLinear of a constant weight) and to the lowering rules."""

    pattern = "y = com.microsoft::QuantizeLinear|com.microsoft::DequantizeLinear(x, s, z?)"

    def check(self, m: Match) -> Match | NoMatch:
        z = m["z"]
        if z is None or z.type is None:
            return NoMatch("no zero point: the storage type is not known")
        elem = z.type.elem.storage if isinstance(z.type.elem, QuantType) else z.type.elem
        if str(elem) not in ("u8", "i8", "u16", "i16"):
            return NoMatch(f"the zero point is {elem}: only 8- and 16-bit integer storage is converted")
        sv = m["s"]
        if sv.type is None or str(sv.type.elem) != "f32":
            # float16 scales: the contrib op rounds in its own precision (reference/ms_qops.py)
            return NoMatch(f"scale {describe(sv)} is not float32")
        # (QuantizeLinear's x has its scale's type: a float32 scale means a float32 x)
        if set(m.root.attrs) - {"axis"}:
            return NoMatch(
                f"attributes {sorted(set(m.root.attrs) - {'axis'})} have no ai.onnx equivalent here"
            )
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        node = m.root
        return b.op(
            node.op_type,
            [m["x"], m["s"], m["z"]],
            dict(node.attrs),
            # the same operator in another domain: its output keeps what the graph knew
            types=m["y"].type,
            attr_types=node.attr_types,
            name=node.name or None,
        )


class MsQdqToOnnxPass(RewritePass):
    """:class:`MsQdqToOnnx` as a pass (first in ``pipelines.lower_qdq``)."""

    name = "ms_qdq_to_onnx"
    rules = (MsQdqToOnnx(),)


def wide_rules() -> list[Rule]:
    """The 16-bit rules, in the order lower_rules tries them."""
    return [LowerConv16(), LowerMatMul16(), LowerGemm16()]


# Imported last: qdq_to_qlinear builds its rule list (which includes this module's rules)
# when it is first imported, so this module must define them before it imports from there.
from quanta.passes.lower.qdq_to_qlinear import (  # noqa: E402
    _check_consts,
    _int32_bias,
    _params,
    _zero_point_or_default,
    conv_check,
    conv_rewrite,
    matmul_check,
    matmul_rewrite,
)
