"""Instruction selection for MX: a MatMul whose input passes through quanta::QuantizeMX
and whose weight is an MX constant becomes ``quanta::MatMulMX`` (reference
``reference/mx.py::matmul_mx_op``, native binder ``targets/native/mx.py`` onto the MX
GEMM kernel)::

    MatMul(DQ(e, s = QuantizeMX(x)), DQ(w: MX const, s_w: float8e8m0 const, axis 0, B))
        -> MatMulMX(x, w, s_w; k_block = B, x_dtype, mode)

What ``quantize_mx_model(form="e8m0")`` writes for a MatMul (docs/quantization-math.md
section 11). The lowered node computes eqs. (MX5)-(MX6): exact block dot products summed
in float32 in block order; the float MatMul it replaces sums the dequantized products,
so the two differ by float32 rounding (as the W4A8 rule's blocks do). Gemm and Conv stay
DequantizeLinear + float op for now.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, Rule

__all__ = ["LowerMatMulMX", "mx_rules"]

QUANTA_DOMAIN = "quanta"
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
#: the MX element storage types (reference/mx.py::MX_FORMATS; passes do not import kernels)
_MX_ELEMENT_DTYPES = frozenset(
    np.dtype(t)
    for t in (
        np.int8,
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float6_e3m2fn,
        ml_dtypes.float6_e2m3fn,
        ml_dtypes.float4_e2m1fn,
    )
)


def _dq_block(node, rank: int) -> tuple[int, int] | None:
    """(axis normalized, block_size) of a blocked DequantizeLinear, or None."""
    block = int(node.attrs.get("block_size", 0) or 0)
    if block <= 0:
        return None
    return int(node.attrs.get("axis", 1)) % rank, block


class LowerMatMulMX(Rule):
    """``MatMul(DQ(QuantizeMX(x)), DQ(MX weight)) -> quanta::MatMulMX(x, w, s_w)``."""

    pattern = (
        "c = MatMul(af = DequantizeLinear(ae = quanta::QuantizeMX(x), as, az?), "
        "bf = DequantizeLinear(bq, bs, bz?))"
    )
    # one QuantizeMX -> DQ feeds several MatMuls (Q, K, V); a shared weight DQ stays for
    # its other users
    shared_ok = frozenset({"af", "bf", "ae"})

    def check(self, m: Match) -> Match | NoMatch:
        qmx = m.node("ae")
        dqa, dqb = m.node("af"), m.node("bf")
        if m["az"] is not None or m["bz"] is not None:
            return NoMatch("an MX DequantizeLinear has no zero point")
        if len(qmx.outputs) < 2 or m["as"] is not qmx.outputs[1]:
            return NoMatch("the activation's scale is not the QuantizeMX's own")
        x = m.value("x")
        if x.elem is None or str(x.elem) != "f32" or x.shape is None or len(x.shape) < 1:
            return NoMatch("the activation is not float32 of known rank")
        rank = len(x.shape)
        block = int(qmx.attrs.get("block_size", 32))
        if int(qmx.attrs.get("axis", -1)) % rank != rank - 1:
            return NoMatch("QuantizeMX does not block along the MatMul's reduction (last) axis")
        if _dq_block(dqa, rank) != (rank - 1, block):
            return NoMatch("the activation's DequantizeLinear does not match its QuantizeMX")
        w, s = m.const("bq"), m.const("bs")
        if w is None or s is None or w.ndim != 2:
            return NoMatch("the weight is not a constant rank-2 MX tensor")
        if s.dtype != _E8M0:
            return NoMatch("the weight's scale is not float8e8m0")
        if _dq_block(dqb, 2) != (0, block):
            return NoMatch(f"the weight is not blocked along K (axis 0) by the activation's block {block}")
        if w.dtype not in _MX_ELEMENT_DTYPES:
            return NoMatch(f"the weight's elements ({w.dtype}) are no MX element type")
        if w.dtype == np.int8 and np.any((s.view(np.uint8) > 248) & (s.view(np.uint8) != 255)):
            return NoMatch("an MXINT8 weight scale above 2^121 has no OCP E8M0 code")
        c = m.value("c")
        if c.elem is None or str(c.elem) != "f32":
            return NoMatch("the product is not float32")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        qmx = m.node("ae")
        return b.op(
            "MatMulMX",
            [m["x"], m["bq"], m["bs"]],
            # "k_block", not "block_size": onnx_io reads a block_size attribute as the
            # block of every quantized operand of the node
            {
                "k_block": int(qmx.attrs.get("block_size", 32)),
                "x_dtype": int(qmx.attrs.get("output_dtype", 3)),
                "mode": str(qmx.attrs.get("mode", "ocp")),
            },
            domain=QUANTA_DOMAIN,
            types=result_type(shape_from=m["c"], elem_from=m["c"]),
            name=m.node("c").name or None,
        )


def mx_rules() -> list[Rule]:
    """The MX rules, in the order lower_rules tries them."""
    return [LowerMatMulMX()]
