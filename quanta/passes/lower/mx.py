"""Instruction selection for MX: a MatMul whose input passes through quanta::QuantizeMX
and whose weight is an MX constant becomes ``quanta::MatMulMX`` (reference
``reference/mx.py::matmul_mx_op``, native binder ``targets/native/mx.py`` onto the MX
GEMM kernel)::

    MatMul(DQ(e, s = QuantizeMX(x)), DQ(w: MX const, s_w: float8e8m0 const, axis 0, B))
        -> MatMulMX(x, w, s_w; k_block = B, x_dtype, mode)
    Conv(DQ(QuantizeMX(x), axis 1), DQ(w: MX const, axis 1, B), b?)   (group 1, 2-D)
        -> ConvMX(x, w, s_w, b?; k_block = B, x_dtype, mode, pads, strides, dilations)

What ``quantize_mx_model(form="e8m0")`` writes for a MatMul (docs/quantization-math.md
section 11). The lowered node computes eqs. (MX5)-(MX6): exact block dot products summed
in float32 in block order; the float MatMul it replaces sums the dequantized products,
so the two differ by float32 rounding (as the W4A8 rule's blocks do); the same holds for
the convolution (eq. (MX7)). Gemm stays DequantizeLinear + float op for now.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, Rule

__all__ = ["LowerConvMX", "LowerMatMulMX", "mx_rules"]

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
        bad = _check_mx_operands(m, -1, 0, 2)
        if bad is not None:
            return bad
        c = m.value("c")
        if c.elem is None or str(c.elem) != "f32":
            return NoMatch("the product is not float32")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        return b.op(
            "MatMulMX",
            [m["x"], m["bq"], m["bs"]],
            _mx_attrs(m),
            domain=QUANTA_DOMAIN,
            types=result_type(shape_from=m["c"], elem_from=m["c"]),
            name=m.node("c").name or None,
        )


def _check_mx_operands(m: Match, x_axis: int, w_axis: int, w_rank: int) -> NoMatch | None:
    """The shared checks: the activation's QuantizeMX and DequantizeLinear agree, blocked
    along ``x_axis``; the weight is an MX constant of rank ``w_rank`` with float8e8m0
    scales blocked along ``w_axis`` by the same block."""
    qmx = m.node("ae")
    if m["az"] is not None or m["bz"] is not None:
        return NoMatch("an MX DequantizeLinear has no zero point")
    if len(qmx.outputs) < 2 or m["as"] is not qmx.outputs[1]:
        return NoMatch("the activation's scale is not the QuantizeMX's own")
    x = m.value("x")
    if x.elem is None or str(x.elem) != "f32" or x.shape is None or len(x.shape) < 1:
        return NoMatch("the activation is not float32 of known rank")
    rank = len(x.shape)
    block = int(qmx.attrs.get("block_size", 32))
    if int(qmx.attrs.get("axis", -1)) % rank != x_axis % rank:
        return NoMatch("QuantizeMX does not block along the reduction axis")
    if _dq_block(m.node("af"), rank) != (x_axis % rank, block):
        return NoMatch("the activation's DequantizeLinear does not match its QuantizeMX")
    w, s = m.const("bq"), m.const("bs")
    if w is None or s is None or w.ndim != w_rank:
        return NoMatch(f"the weight is not a constant rank-{w_rank} MX tensor")
    if s.dtype != _E8M0:
        return NoMatch("the weight's scale is not float8e8m0")
    if _dq_block(m.node("bf"), w_rank) != (w_axis, block):
        return NoMatch(
            f"the weight is not blocked along its reduction axis {w_axis} by the activation's block {block}"
        )
    if w.dtype not in _MX_ELEMENT_DTYPES:
        return NoMatch(f"the weight's elements ({w.dtype}) are no MX element type")
    if w.dtype == np.int8 and np.any((s.view(np.uint8) > 248) & (s.view(np.uint8) != 255)):
        return NoMatch("an MXINT8 weight scale above 2^121 has no OCP E8M0 code")
    return None


def _mx_attrs(m: Match) -> dict:
    qmx = m.node("ae")
    # "k_block", not "block_size": onnx_io reads a block_size attribute as the block of
    # every quantized operand of the node
    return {
        "k_block": int(qmx.attrs.get("block_size", 32)),
        "x_dtype": int(qmx.attrs.get("output_dtype", 3)),
        "mode": str(qmx.attrs.get("mode", "ocp")),
    }


class LowerConvMX(Rule):
    """``Conv(DQ(QuantizeMX(x)), DQ(MX weight), b?) -> quanta::ConvMX(x, w, s_w, b?)``
    (group 1, 2-D, explicit pads)."""

    pattern = (
        "c = Conv(af = DequantizeLinear(ae = quanta::QuantizeMX(x), as, az?), "
        "bf = DequantizeLinear(bq, bs, bz?), b?)"
    )
    shared_ok = frozenset({"af", "bf", "ae"})

    def check(self, m: Match) -> Match | NoMatch:
        conv = m.node("c")
        if int(conv.attrs.get("group", 1)) != 1:
            return NoMatch("grouped / depthwise convolution (no MX block along its reduction)")
        if str(conv.attrs.get("auto_pad", "NOTSET")) not in ("NOTSET", "b'NOTSET'"):
            return NoMatch("auto_pad: only explicit pads")
        bad = _check_mx_operands(m, 1, 1, 4)
        if bad is not None:
            return bad
        if m["b"] is not None and (not m.is_const("b") or str(m["b"].elem) != "f32"):
            return NoMatch("the bias is not a float32 constant")
        c = m.value("c")
        if c.elem is None or str(c.elem) != "f32":
            return NoMatch("the output is not float32")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        conv = m.node("c")
        attrs = _mx_attrs(m)
        attrs.update(
            pads=[int(p) for p in conv.attrs.get("pads", [0, 0, 0, 0])],
            strides=[int(s) for s in conv.attrs.get("strides", [1, 1])],
            dilations=[int(d) for d in conv.attrs.get("dilations", [1, 1])],
        )
        inputs = [m["x"], m["bq"], m["bs"]] + ([m["b"]] if m["b"] is not None else [])
        return b.op(
            "ConvMX",
            inputs,
            attrs,
            domain=QUANTA_DOMAIN,
            types=result_type(shape_from=m["c"], elem_from=m["c"]),
            name=conv.name or None,
        )


def mx_rules() -> list[Rule]:
    """The MX rules, in the order lower_rules tries them."""
    return [LowerMatMulMX(), LowerConvMX()]
