"""Instruction selection for 8-bit activations times 4-bit weights per block (W4A8):
``quanta::MatMulW4A8`` (reference/w4.py, docs/quantization-math.md eqs. (W3)-(W5))::

    Q(MatMul(DQ(a), DQ(w: int4/uint4 const, block_size B, axis 0)))  -> MatMulW4A8(a, sa, za, w, sw, zw?, sy, zy)
    MatMul(DQ(a), DQ(w: ... per block))  (float product)             -> MatMulW4A8(a, sa, za, w, sw, zw?)

What quanta's quantizer writes with ``weight_type="int4"`` (and ONNX Runtime's with
int4 weights in QDQ form): per-block weights have no single ``sx·sw`` per column, so the
8-bit rules refuse them; here each block's exact integer dot product is scaled by its
own ``sa·sw_b`` and the blocks are summed in float32 in order (W4), one rounding more
per block than the float group's, which sums dequantized products in float32 too.
A weight-only file (float activations: ``DQ(w)`` only) is not matched: its MatMul stays
float and FoldFloatWeight dequantizes the weight once.

4-bit weights with one scale per tensor or per channel (ONNX Runtime's
``quantize_static(weight_type=QInt4 | QUInt4)``, per_channel or not) are 8-bit weights with
fewer codes: before the lowering, ``WidenFourBitWeight`` writes each as int8 with zero
point 0, so the 8-bit rules take their Conv / Gemm / MatMul groups (QLinearConv, QGemm,
QLinearMatMul, MatMulIntegerToFloat) and the prepacked int8 kernels run them::

    DequantizeLinear(w: int4 | uint4 const, s, z?) {axis}        (ai.onnx or com.microsoft)
      -> DequantizeLinear(w - z: int8 const, s, 0: int8) {axis}                 (WidenFourBitWeight)

Exact (docs/quantization-math.md eq. (W10)): DequantizeLinear computes ``f32((q - z)·s)``,
and ``q - z`` of two int4 (or two uint4) codes lies in [-15, 15], so the int8 code
``q - z`` with zero point 0 dequantizes to the same float32 bits channel by channel. Weights quantized per block keep their 4-bit codes (MatMulW4A8 above).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.ir.types import QuantType, TensorType, elem_from_numpy
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import describe, node_qtype

__all__ = [
    "LowerMatMulW4A8",
    "LowerMatMulW4A8FloatOutput",
    "WidenFourBitWeight",
    "WidenFourBitWeightsPass",
    "w4_rules",
]

QUANTA_DOMAIN = "quanta"


def _check_w4a8(m: Match, with_output: bool) -> Match | NoMatch:
    bad = _check_consts(m, "sa", "za", "sb", "zb", *(("sy", "zy") if with_output else ()))
    if bad is not None:
        return bad
    if not m.is_const("bq"):
        return NoMatch(f"weight {describe(m['bq'])} is not a constant")
    qa = _params(m, "af", "a", "sa", "za")
    qb = _params(m, "bf", "bq", "sb", "zb")
    if qa is None or str(qa.storage) not in ("u8", "i8") or qa.axis is not None:
        return NoMatch("input a is not uint8/int8 per tensor with constant parameters")
    if qb is None or str(qb.storage) not in ("i4", "u4"):
        return NoMatch("weight b is not int4/uint4 with constant parameters (the 8-bit rules handle it)")
    shape = m.value("bq").shape
    if qb.block is None or shape is None or len(shape) != 2 or qb.axis % 2 != 0:
        return NoMatch("weight b is not a rank-2 weight quantized per block along K (axis 0)")
    if qb.block % 4 or qb.block > 4096:
        return NoMatch(f"weight b's block size {qb.block} is not a multiple of 4 up to 4096")
    qy: QuantType | None = None
    if with_output:
        qy = _params(m, "y", "y", "sy", "zy")
        if qy is None or str(qy.storage) not in ("u8", "i8") or qy.axis is not None:
            return NoMatch("output y is not uint8/int8 per tensor")
    m.data.update(qa=qa, qb=qb, qy=qy)
    return m


def _rewrite(m: Match, b: Builder, out: str, with_output: bool) -> Value:
    inputs: list[Value | None] = [
        m["a"],
        m["sa"],
        _zero_point_or_default(b, m, "za", m.data["qa"], "a_zero_point"),
        m["bq"],
        m["sb"],
        m["zb"],
    ]
    if with_output:
        inputs += [m["sy"], _zero_point_or_default(b, m, "zy", m.data["qy"], "y_zero_point")]
    return b.op(
        "MatMulW4A8",
        inputs,
        # "k_block", not "block_size": onnx_io reads a block_size attribute as the block of
        # every quantized operand of the node
        {"k_block": int(m.data["qb"].block)},
        domain=QUANTA_DOMAIN,
        types=result_type(shape_from=m[out], elem_from=m[out]),
        name=m.node("c").name or None,
    )


class LowerMatMulW4A8(Rule):
    """``Q(MatMul(DQ(a), DQ(w4 per block))) -> quanta::MatMulW4A8(.., sy, zy)``."""

    pattern = (
        "y = QuantizeLinear(c = MatMul(af = DequantizeLinear(a, sa, za?), "
        "bf = DequantizeLinear(bq, sb, zb?)), sy, zy?)"
    )
    shared_ok = frozenset({"af", "bf"})

    def check(self, m: Match) -> Match | NoMatch:
        return _check_w4a8(m, with_output=True)

    def rewrite(self, m: Match, b: Builder) -> Value:
        return _rewrite(m, b, "y", with_output=True)


class LowerMatMulW4A8FloatOutput(Rule):
    """``MatMul(DQ(a), DQ(w4 per block)) -> quanta::MatMulW4A8(a, sa, za, w, sw, zw?)`` (float32
    product: a residual Add, the last layer)."""

    pattern = "c = MatMul(af = DequantizeLinear(a, sa, za?), bf = DequantizeLinear(bq, sb, zb?))"
    shared_ok = frozenset({"af", "bf"})

    def check(self, m: Match) -> Match | NoMatch:
        if any(u.op_type == "QuantizeLinear" for u in m.value("c").consumers()):
            return NoMatch("the output is quantized (LowerMatMulW4A8 handles it)")
        if m["c"].type is None or str(m["c"].type.elem) != "f32":
            return NoMatch("the product is not float32")
        return _check_w4a8(m, with_output=False)

    def rewrite(self, m: Match, b: Builder) -> Value:
        return _rewrite(m, b, "c", with_output=False)


def w4_rules() -> list[Rule]:
    """The W4A8 rules, in the order lower_rules tries them."""
    return [LowerMatMulW4A8(), LowerMatMulW4A8FloatOutput()]


class WidenFourBitWeight(Rule):
    """``DequantizeLinear(w: int4|uint4 const, s, z?)`` per tensor or per channel ->
    ``DequantizeLinear(w - z: int8 const, s, 0)`` (eq. (W10)); the ai.onnx op either way."""

    pattern = "y = DequantizeLinear|com.microsoft::DequantizeLinear(w, s, z?)"

    def check(self, m: Match) -> Match | NoMatch:
        w = m["w"]
        if not w.is_const:
            return NoMatch(f"{describe(w)} is not a constant", "pattern")
        codes = np.asarray(w.const)
        if codes.dtype.name not in ("int4", "uint4"):
            return NoMatch(f"{describe(w)} is not stored in 4 bits", "pattern")
        if not m.all_const("s", "z"):
            return NoMatch(f"the parameters of {describe(w)} are not constants")
        q = node_qtype(m.root, w, m["s"], m["z"])
        if not isinstance(q, QuantType) or str(q.storage) not in ("i4", "u4"):
            return NoMatch(f"the scale / zero point of {describe(w)} do not describe an int4 / uint4 type")
        if q.block is not None:
            return NoMatch(f"{describe(w)} is quantized per block (MatMulW4A8 takes it)")
        if set(m.root.attrs) - {"axis"}:
            return NoMatch(f"attributes {sorted(set(m.root.attrs) - {'axis'})} have no 8-bit equivalent here")
        if m.root.domain and str(np.asarray(m.const("s")).dtype) != "float32":
            # the contrib op computes in its scale's precision (reference/ms_qops.py)
            return NoMatch(f"scale {describe(m['s'])} of a com.microsoft DequantizeLinear is not float32")
        m.data["q"] = q
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        q: QuantType = m.data["q"]
        codes = np.asarray(m.const("w")).astype(np.int16)
        zp = np.asarray(q.zero_point, np.int16)
        if q.axis is not None and codes.ndim:
            shape = [1] * codes.ndim
            shape[q.axis % codes.ndim] = zp.size
            zp = zp.reshape(shape)
        else:
            zp = zp.reshape(())
        # eq. (W10): q - z of 4-bit codes lies in [-15, 15]
        wide = (codes - zp).astype(np.int8)
        scale_shape = np.asarray(m.const("s")).shape
        storage = elem_from_numpy(np.dtype(np.int8))
        qt = dataclasses.replace(q, storage=storage, zero_point=(0,) * len(q.zero_point))
        node = m.root
        return b.op(
            "DequantizeLinear",
            [
                b.const(f"{m['w'].name}_int8", wide, TensorType(qt, wide.shape)),
                m["s"],
                b.const(f"{m['w'].name}_int8_zero_point", np.zeros(scale_shape, np.int8)),
            ],
            dict(node.attrs),
            types=m["y"].type,
            attr_types=node.attr_types,
            name=node.name or None,
        )


class WidenFourBitWeightsPass(RewritePass):
    """:class:`WidenFourBitWeight` as a pass (in ``pipelines.lower_qdq``, before constant
    folding, which keeps an ai.onnx DequantizeLinear of a constant weight)."""

    name = "widen_4bit_weights"
    rules = (WidenFourBitWeight(),)


# Imported last: qdq_to_qlinear builds its rule list (which includes this module's rules)
# when it is first imported, so this module must define them before it imports from there.
from quanta.passes.lower.qdq_to_qlinear import (  # noqa: E402
    _check_consts,
    _params,
    _zero_point_or_default,
)
