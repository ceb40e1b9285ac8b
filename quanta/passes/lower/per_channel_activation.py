"""A convolution feeding a depthwise convolution through a per-channel quantized activation.

NNCF (OpenVINO's quantizer) quantizes the input of a depthwise convolution per channel
(``QuantizeLinear`` / ``DequantizeLinear`` with a scale vector on axis 1), a placement
OpenVINO's FakeQuantize takes natively. ONNX's QLinearConv takes one x scale and one y
scale, so ``LowerConv`` refuses both convolutions around such a value and they stay float.
But a depthwise convolution reads each channel of x alone, so a per-channel x scale is
one more per-channel factor of its requantization multiplier, and the producing
convolution's per-channel y scale is one per output channel of its multiplier::

    %v = QuantizeLinear(Conv(DQ(%x, sx, zx), DQ(%w1, sw1, zw1), %b1?), sv[C], zv)       (axis 1)
    %y = QuantizeLinear(Conv(DQ(%v, sv[C], zv), DQ(%w, sw, zw), %b?) {group = C}, sy, zy)
      -> %v' = QLinearConv(%x, sx, zx, %w1, sw1', zw1, 1, zv, %b1q?)       %v': Q(storage, 1, zv)
         %y  = QLinearConv(%v', 1, zv, %w, sw', zw, sy, zy, %bq?) {group = C}

with ``sw'[c] = f32(sv[c]·sw[c])`` (the depthwise multiplier ``f32(f32(1·sw'[c]) / sy)``
is then ``f32(f32(sv[c]·sw[c]) / sy)``, eq. (6) with the channel's own x scale, exactly)
and ``sw1'[m]`` the float32 nearest ``m1[m] / sx`` for which ``f32(sx·sw1'[m])`` equals
``m1[m] = f32(f32(sx·sw1[m]) / sv[m])`` (eq. (6) with the channel's own y scale; the
search over neighbouring floats finds one for every scale seen in practice, and otherwise
the closest product, within 2^-23 relative of m1). The intermediate value carries the
integers of %v unchanged, typed with scale 1. The depthwise bias: an int32
``DequantizeLinear(bq, sv[c]·sw[c], 0)`` is used as is (another scale is requantized,
eq. (6b)), a float constant is quantized with scale ``f32(sv[c]·sw[c])`` as ONNX
Runtime quantizes a Conv's float bias.

Against the float QDQ graph the two integer ops round where every lowering rounds (once
per requantization), so each output is within one step of its float group. Refused:
per-channel zero points that differ, a consumer that is not depthwise (group = C = M),
other consumers of %v, per-axis x or y of the outer operators.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.ir.types import QuantType, TensorType
from quanta.passes.pattern import Builder, Match, NoMatch, Rule
from quanta.passes.rules._util import describe, node_qtype

__all__ = ["LowerConvPerChannelDepthwise", "product_operand"]

_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def product_operand(sx: np.float32, target: np.ndarray) -> np.ndarray:
    """Per entry, the float32 ``t`` whose product ``f32(sx·t)`` equals ``target`` (or is
    closest to it): ``f32(target / sx)`` and its neighbours within 4 ulps (the product is
    monotone in ``t``, so the exact one, if any, is among them)."""
    sx = np.float32(sx)
    target = np.asarray(target, np.float32)
    base = np.divide(target, sx, dtype=np.float32)
    cands = [base]
    up, down = base, base
    for _ in range(4):
        up = np.nextafter(up, np.float32(np.inf), dtype=np.float32)
        down = np.nextafter(down, np.float32(0), dtype=np.float32)
        cands += [up, down]
    stack = np.stack(cands)  # [9, n]
    prods = np.multiply(sx, stack, dtype=np.float32)
    err = np.abs(prods.astype(np.float64) - target.astype(np.float64))
    best = np.argmin(err, axis=0)  # the first minimum: the quotient itself on a tie
    return stack[best, np.arange(stack.shape[1])].astype(np.float32)


def _qtype(m: Match, node: str, operand: str, scale: str, zp: str) -> QuantType | None:
    return node_qtype(m.node(node), m[operand], m[scale], m[zp])


def _bias_codes(bv: Value | None, want: np.ndarray) -> np.ndarray | Value | NoMatch | None:
    """The depthwise bias as int32 codes of scale ``want`` (one per channel)."""
    if bv is None:
        return None
    if bv.is_const and np.asarray(bv.const).dtype == np.float32:
        b = np.asarray(bv.const, np.float32)
        if b.shape != want.shape or not np.all(np.isfinite(b)):
            return NoMatch(f"float bias {describe(bv)} does not hold one finite value per channel")
        q = np.rint(np.divide(b, want, dtype=np.float32).astype(np.float64))
        info = np.iinfo(np.int32)
        return np.clip(q, info.min, info.max).astype(np.int32)
    dq = bv.producer
    if dq is None or dq.op_type != "DequantizeLinear":
        return NoMatch(f"bias {describe(bv)} is neither a float constant nor DequantizeLinear(int32)")
    bq = dq.input(0)
    qb = node_qtype(dq, bq, dq.input(1), dq.input(2))
    if bq is None or not bq.is_const or qb is None or str(qb.storage) != "i32" or any(qb.zero_point):
        return NoMatch(f"bias {describe(bv)} is not an int32 constant with zero point 0")
    got = np.broadcast_to(np.asarray(qb.scale, np.float32), want.shape)
    if np.array_equal(got, want):
        return bq
    from quanta.passes.lower.qdq_to_qlinear import _rescaled_bias

    return _rescaled_bias(np.asarray(bq.const), got, want)


def _uniform_zero_point(q: QuantType) -> int | None:
    zps = set(int(z) for z in q.zero_point)
    return zps.pop() if len(zps) == 1 else None


class LowerConvPerChannelDepthwise(Rule):
    """``Q(DWConv(DQ(Q(Conv(...), sv[C]), sv[C]), DQ(w))) -> QLinearConv(QLinearConv(...))``
    (module docstring)."""

    pattern = (
        "y = QuantizeLinear(c = Conv(vf = DequantizeLinear(v = QuantizeLinear(c1 = Conv("
        "x1f = DequantizeLinear(x1, sx1, zx1?), w1f = DequantizeLinear(w1, sw1, zw1?), b1?), sv, zv?), "
        "svd, zvd?), wf = DequantizeLinear(w, sw, zw?), b?), sy, zy?)"
    )
    shared_ok = frozenset({"x1f", "w1f", "wf"})

    def check(self, m: Match) -> Match | NoMatch:
        from quanta.passes.lower.qdq_to_qlinear import _check_8bit, _check_consts, _int32_bias

        bad = _check_consts(m, "sx1", "zx1", "sw1", "zw1", "sv", "zv", "svd", "zvd", "sw", "zw", "sy", "zy")
        if bad is not None:
            return bad
        for w in ("w1", "w"):
            if not m.is_const(w):
                return NoMatch(f"weight {describe(m[w])} is not a constant")
        qx1 = _qtype(m, "x1f", "x1", "sx1", "zx1")
        qw1 = _qtype(m, "w1f", "w1", "sw1", "zw1")
        qv = _qtype(m, "v", "v", "sv", "zv")
        qvd = _qtype(m, "vf", "v", "svd", "zvd")
        qw = _qtype(m, "wf", "w", "sw", "zw")
        qy = _qtype(m, "y", "y", "sy", "zy")
        for q, what, per_tensor in (
            (qx1, "input x", True),
            (qw1, "weight w1", False),
            (qv, "the activation between", False),
            (qw, "depthwise weight w", False),
            (qy, "output y", True),
        ):
            bad = _check_8bit(q, what, per_tensor=per_tensor)
            if bad is not None:
                return bad
        assert qx1 is not None and qw1 is not None and qv is not None and qw is not None and qy is not None
        if qvd != qv:
            return NoMatch("the activation's QuantizeLinear and DequantizeLinear have different parameters")
        v = m.value("v")
        if qv.axis is None or v.shape is None or qv.axis % len(v.shape) != 1:
            return NoMatch("the activation between the convolutions is not quantized per channel (axis 1)")
        zv = _uniform_zero_point(qv)
        if zv is None:
            return NoMatch("the per-channel activation has zero points that differ between channels")
        channels = len(qv.scale)
        dw = m.node("c")
        w = np.asarray(m.const("w"))
        w1 = np.asarray(m.const("w1"))
        if int(dw.attrs.get("group", 1)) != channels or w.shape[0] != channels or w.shape[1] != 1:
            return NoMatch(f"the consumer is not a depthwise convolution over the {channels} channels")
        if w1.shape[0] != channels:
            return NoMatch("the producing convolution's output channels do not match the scales")
        for q, wc, what in ((qw1, w1, "w1"), (qw, w, "w")):
            if q.axis is not None and q.axis % wc.ndim != 0:
                return NoMatch(f"weight {what} is quantized along axis {q.axis}, not its output channels")
        b1 = _int32_bias(m, "b1", qx1, qw1, quantize_float=True)
        if isinstance(b1, NoMatch):
            return b1
        sv = np.asarray(qv.scale, np.float32)
        sw = np.broadcast_to(np.asarray(qw.scale, np.float32), (channels,))
        sw_dw = np.multiply(sv, sw, dtype=np.float32)  # sw'[c] = f32(sv[c]·sw[c])
        bq = _bias_codes(m["b"], sw_dw)
        if isinstance(bq, NoMatch):
            return bq
        sx = np.float32(qx1.scale[0])
        sw1 = np.broadcast_to(np.asarray(qw1.scale, np.float32), (channels,))
        m1 = np.divide(np.multiply(sx, sw1, dtype=np.float32), sv, dtype=np.float32)
        sw1_new = product_operand(sx, m1)
        if not (
            np.all(np.isfinite(sw1_new))
            and np.all(sw1_new > 0)
            and np.all(np.isfinite(sw_dw))
            and np.all(sw_dw > 0)
        ):
            return NoMatch("the folded weight scales are not positive finite float32 numbers")
        m.data.update(
            qx1=qx1, qw1=qw1, qv=qv, qw=qw, qy=qy, zv=zv, b1=b1, bq=bq, sw_dw=sw_dw, sw1_new=sw1_new
        )
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        from quanta.passes.lower.qdq_to_qlinear import _scalar_if_uniform, _zero_point_or_default

        d = m.data
        qv: QuantType = d["qv"]
        storage = qv.storage
        one = b.const("unit_scale", np.ones((), np.float32))
        zv = b.const("v_zero_point", np.array(d["zv"], dtype=storage.numpy))

        def weight(name: str, q: QuantType, scales: np.ndarray) -> tuple[Value, Value]:
            wv = m.value(name)
            wq = QuantType(
                q.storage,
                q.expressed,
                scales,
                np.broadcast_to(np.asarray(q.zero_point), scales.shape),
                axis=0,
            )
            return b.const(f"{name}_refolded", np.asarray(wv.const), TensorType(wq, wv.shape)), b.const(
                f"{name}_scale", scales
            )

        w1, sw1 = weight("w1", d["qw1"], d["sw1_new"])
        w, sw = weight("w", d["qw"], d["sw_dw"])
        zx1 = _zero_point_or_default(b, m, "zx1", d["qx1"], "x_zero_point")
        zw1 = _scalar_if_uniform(
            b, _zero_point_or_default(b, m, "zw1", d["qw1"], "w_zero_point"), "w_zero_point"
        )
        zw = _scalar_if_uniform(
            b, _zero_point_or_default(b, m, "zw", d["qw"], "w_zero_point"), "w_zero_point"
        )
        zy = _zero_point_or_default(b, m, "zy", d["qy"], "y_zero_point")
        inputs1 = [m["x1"], m["sx1"], zx1, w1, sw1, zw1, one, zv]
        if d["b1"] is not None:
            inputs1.append(
                b.const(f"{m['b1'].name}_quantized", d["b1"]) if isinstance(d["b1"], np.ndarray) else d["b1"]
            )
        conv1 = m.node("c1")
        vq = QuantType(storage, qv.expressed, [1.0], [d["zv"]])
        v_new = b.op(
            "QLinearConv",
            inputs1,
            {k: x for k, x in conv1.attrs.items() if k in _CONV_ATTRS},
            types=result_type(shape_from=m["v"], elem_from=vq),
            attr_types=conv1.attr_types,
            name=conv1.name or None,
            out_names=[m["v"].name],
        )
        inputs = [v_new, one, zv, w, sw, zw, m["sy"], zy]
        if d["bq"] is not None:
            inputs.append(
                b.const(f"{m['b'].name}_quantized", d["bq"]) if isinstance(d["bq"], np.ndarray) else d["bq"]
            )
        dw = m.node("c")
        return b.op(
            "QLinearConv",
            inputs,
            {k: x for k, x in dw.attrs.items() if k in _CONV_ATTRS},
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            attr_types=dw.attr_types,
            name=dw.name or None,
        )
