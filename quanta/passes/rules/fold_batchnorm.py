"""Fold an inference-mode BatchNormalization into the Conv / ConvTranspose / Gemm that
produces its input.

BatchNormalization (inference) is an affine map per channel c (axis 1)::

    y[:, c] = (x[:, c] - mean[c]) / sqrt(var[c] + eps) * g[c] + beta[c]
            = a[c] * x[:, c] + t[c]        a = g / sqrt(var + eps),  t = beta - mean * a     (1)

and each producer below is linear in its weight per output channel, so the map folds
into new constant weights W' and bias B'. Folded constants are computed in float64 from
the original ones and rounded once to the weight's type; the original constants are
never modified (they may be shared).

FoldBatchNormIntoConv (W: [M, C/group, k...], output channel m is axis 0 of W)::

    %y = BatchNormalization(%c = Conv(%x, %W, %B?), %g, %beta, %mean, %var)
      -> %y = Conv(%x, %W', %B')
    W'[m] = W[m] * a[m]                 B' = B * a + t   (B = 0 when omitted)

FoldBatchNormIntoConvTranspose (W: [C, M/group, k...], output channels on axis 1 of W:
input channel i, in group gi = i // (C/group), feeds output channel gi·(M/group) + j
through W[i, j], so W[i, j] takes the factor of that output channel)::

    %y = BatchNormalization(%c = ConvTranspose(%x, %W, %B?), ...) -> %y = ConvTranspose(%x, %W', %B')
    W'[i, j] = W[i, j] * a[gi·(M/group) + j]      B' = B * a + t

FoldBatchNormIntoGemm (Y = alpha·A·B + beta_g·C, output channel n is the last axis)::

    %y = BatchNormalization(%c = Gemm(%A, %W, %C?), ...) -> %y = Gemm(%A, %W', %C') {beta=1}
    W'[:, n] = W[:, n] * a[n]  (transB=0)     W'[n, :] = W[n, :] * a[n]  (transB=1)
    C' = beta_g · C · a + t    (C = 0 when omitted)

FoldBatchNormIntoQuantizedConv: the same fold into a Conv whose weight is
``DequantizeLinear(wq, sw, zw)``: the integers kept (negated where ``a < 0``), ``|a|``
folded into the per-channel scales (see the class).

NoMatch reasons: training mode, non-constant BN parameters, non-constant W or B (a
DequantizeLinear weight is FoldBatchNormIntoQuantizedConv's), W shared with another node, W not a
float tensor, a channel count that disagrees, the producer's output used elsewhere
(engine), ``spatial=0``.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.ir.types import F32
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import FOLDED_OFFSET, describe, first_nonconst

__all__ = [
    "FoldBatchNorm",
    "FoldBatchNormIntoConv",
    "FoldBatchNormIntoConvTranspose",
    "FoldBatchNormIntoGemm",
    "FoldBatchNormIntoQuantizedConv",
]

BN_PARAMS = ("g", "beta", "mean", "var")


def _check_bn(m: Match, weight: str, bias: str, channels: int | None) -> NoMatch | None:
    bn = m.root
    if int(bn.attrs.get("training_mode", 0)):
        return NoMatch("BatchNormalization is in training mode (training_mode=1): it uses batch statistics")
    extra = [o for o in bn.outputs[1:] if o.uses or any(o is x for x in m.graph.outputs)]
    if extra:
        return NoMatch(f"BatchNormalization output '{extra[0].name}' (running statistics) is used")
    if not int(bn.attrs.get("spatial", 1)):
        return NoMatch("BatchNormalization has spatial=0 (per-element statistics)")
    bad = first_nonconst(m, *BN_PARAMS)
    if bad is not None:
        return NoMatch(f"BatchNormalization parameter {bad} is not a constant")
    bad = first_nonconst(m, weight, bias)
    if bad is not None:
        return NoMatch(f"{bad} is not a constant")
    if m.has_outside_uses(weight):
        user = m.outside_users(weight)
        who = user[0].label if user else "a graph output"
        return NoMatch(f"{weight} {describe(m[weight])} is shared with another node ({who})")
    w = m.const(weight)
    if w.dtype.kind != "f":
        return NoMatch(f"{weight} has element type {w.dtype}, expected a float tensor")
    sizes = {n: np.asarray(m.const(n)).size for n in BN_PARAMS}
    if channels is not None and any(s != channels for s in sizes.values()):
        return NoMatch(
            f"BatchNormalization parameters have {sizes} elements, the producer has {channels} output channels"
        )
    return None


def _factors(m: Match) -> tuple[np.ndarray, np.ndarray]:
    """``a = g / sqrt(var + eps)`` and ``t = beta - mean * a`` in float64 (eq. (1))."""
    g, beta, mean, var = (np.asarray(m.const(n), np.float64).reshape(-1) for n in BN_PARAMS)
    eps = float(np.float32(m.root.attrs.get("epsilon", 1e-5)))
    a = g / np.sqrt(var + eps)
    return a, beta - mean * a


def _folded(b: Builder, m: Match, op: str, inputs: list[Value | None], attrs: dict) -> Value:
    producer = m.node("c")
    y = m.value("y")
    return b.op(
        op,
        inputs,
        attrs,
        types=result_type(shape_from=y, elem_from=y),  # the replaced BN output's contract
        name=producer.name or None,
        attr_types=producer.attr_types,
    )


class FoldBatchNormIntoConv(Rule):
    """%y = BatchNormalization(%c = Conv(%x, %W, %B?), %g, %beta, %mean, %var) -> %y = Conv(%x, %W', %B')

    W'[m] = W[m]·a[m], B' = B·a + t with a = g/sqrt(var + eps), t = beta - mean·a.
    """

    pattern = "y = BatchNormalization(c = Conv(x, W, B?), g, beta, mean, var)"

    def check(self, m: Match) -> Match | NoMatch:
        w = m.const("W")
        refused = _check_bn(m, "W", "B", None if w is None else w.shape[0])
        return m if refused is None else refused

    def rewrite(self, m: Match, b: Builder) -> Value:
        w = m.const("W")
        a, t = _factors(m)
        w2 = (w.astype(np.float64) * a.reshape(-1, *[1] * (w.ndim - 1))).astype(w.dtype)
        bias = np.zeros(a.shape) if m["B"] is None else np.asarray(m.const("B"), np.float64)
        b2 = (bias * a + t).astype(w.dtype)
        return _folded(
            b,
            m,
            "Conv",
            [m["x"], b.const(f"{m.value('W').name}_bn", w2), b.const(f"{m.value('y').name}_bias", b2)],
            m.node("c").attrs,
        )


class FoldBatchNormIntoConvTranspose(Rule):
    """%y = BatchNormalization(%c = ConvTranspose(%x, %W, %B?), ...) -> %y = ConvTranspose(%x, %W', %B')

    W'[i, j] = W[i, j]·a[(i // (C/group))·(M/group) + j], B' = B·a + t.
    """

    pattern = "y = BatchNormalization(c = ConvTranspose(x, W, B?), g, beta, mean, var)"

    def check(self, m: Match) -> Match | NoMatch:
        w = m.const("W")
        group = int(m.node("c").attrs.get("group", 1))
        if w is not None and w.shape[0] % group:
            return NoMatch(
                f"ConvTranspose W has {w.shape[0]} input channels, not a multiple of group {group}"
            )
        refused = _check_bn(m, "W", "B", None if w is None else w.shape[1] * group)
        return m if refused is None else refused

    def rewrite(self, m: Match, b: Builder) -> Value:
        w = m.const("W")
        group = int(m.node("c").attrs.get("group", 1))
        a, t = _factors(m)
        c_in, m_per_group = w.shape[0], w.shape[1]
        spatial = w.shape[2:]
        w64 = w.astype(np.float64).reshape(group, c_in // group, m_per_group, *spatial)
        factor = a.reshape(group, 1, m_per_group, *[1] * len(spatial))
        w2 = (w64 * factor).reshape(w.shape).astype(w.dtype)
        bias = np.zeros(a.shape) if m["B"] is None else np.asarray(m.const("B"), np.float64)
        b2 = (bias * a + t).astype(w.dtype)
        return _folded(
            b,
            m,
            "ConvTranspose",
            [m["x"], b.const(f"{m.value('W').name}_bn", w2), b.const(f"{m.value('y').name}_bias", b2)],
            m.node("c").attrs,
        )


class FoldBatchNormIntoGemm(Rule):
    """%y = BatchNormalization(%c = Gemm(%A, %W, %C?), ...) -> %y = Gemm(%A, %W', %C') {beta=1}

    W' scales output column n by a[n] (row n when transB=1); C' = beta_g·C·a + t.
    """

    pattern = "y = BatchNormalization(c = Gemm(A, W, C?), g, beta, mean, var)"

    def check(self, m: Match) -> Match | NoMatch:
        w = m.const("W")
        trans_b = int(m.node("c").attrs.get("transB", 0))
        if w is not None and w.ndim != 2:
            return NoMatch(f"Gemm W has rank {w.ndim}, expected 2")
        n = None if w is None else w.shape[0 if trans_b else 1]
        refused = _check_bn(m, "W", "C", n)
        return m if refused is None else refused

    def rewrite(self, m: Match, b: Builder) -> Value:
        gemm = m.node("c")
        w = m.const("W")
        trans_b = int(gemm.attrs.get("transB", 0))
        a, t = _factors(m)
        w2 = (w.astype(np.float64) * (a[:, None] if trans_b else a[None, :])).astype(w.dtype)
        beta_g = float(gemm.attrs.get("beta", 1.0))
        c = np.zeros(a.shape) if m["C"] is None else np.asarray(m.const("C"), np.float64)
        c2 = (beta_g * c * a + t).astype(w.dtype)
        attrs = dict(gemm.attrs, beta=1.0)
        return _folded(
            b,
            m,
            "Gemm",
            [m["A"], b.const(f"{m.value('W').name}_bn", w2), b.const(f"{m.value('y').name}_bias", c2)],
            attrs,
        )


class FoldBatchNormIntoQuantizedConv(Rule):
    """%y = BatchNormalization(%c = Conv(%x, DequantizeLinear(%wq, %sw, %zw?), %B?), ...)
    -> %y = Conv(%x, DequantizeLinear(%wq', %sw', %zw'), %B')

    A quantizer run on an export that still holds BatchNormalization (NNCF, ONNX
    Runtime's without its pre-processing) leaves a float BN after a quantized Conv, and
    the Conv's output is then not quantized: the Conv stays a float island. Per output
    channel the weight is ``(wq[m] − zw[m])·sw[m]``, so ``W'[m] = W[m]·a[m]`` is the same
    integers with scale ``sw'[m] = f32(sw[m]·|a[m]|)``, negated where ``a[m] < 0``
    (``wq' = −wq``, ``zw' = −zw``; refused when such a code is the int8 minimum, which has
    no negation). ``B' = B·a + t`` as in FoldBatchNormIntoConv (float32; an int32
    ``DequantizeLinear`` bias is read as the float it stands for). Exact in real
    arithmetic; the float32 rounding of ``sw'`` and ``B'`` is FoldBatchNormIntoConv's.

    ``B'`` is marked ``FOLDED_OFFSET`` (its ``doc``): the file computes the convolution in
    float and adds the affine's offset to the float result (ONNX Runtime runs such a
    group as written: its Conv + BatchNormalization fusion needs float weights), so the
    lowering adds ``B'`` in float32 after scaling the exact integer accumulator
    (``quanta::AccumulatorToFloat``, then the float consumers and QuantizeLinear) instead
    of rounding it to the int32 grid of ``sx·sw'``, which moves every output of a channel
    by up to ``0.5·sx·sw'/sy`` of a step and flips the rounding of the outputs that lie
    that close to a rounding boundary.
    """

    pattern = (
        "y = BatchNormalization(c = Conv(x, wf = DequantizeLinear(wq, sw, zw?), B?), g, beta, mean, var)"
    )

    def check(self, m: Match) -> Match | NoMatch:
        from quanta.passes.rules._util import node_qtype

        bn = m.root
        if int(bn.attrs.get("training_mode", 0)) or not int(bn.attrs.get("spatial", 1)):
            return NoMatch("BatchNormalization in training mode or with spatial=0")
        if any(o.uses or any(o is x for x in m.graph.outputs) for o in bn.outputs[1:]):
            return NoMatch("BatchNormalization's running statistics are used")
        bad = first_nonconst(m, *BN_PARAMS, "wq", "sw", "zw")
        if bad is not None:
            return NoMatch(f"{bad} is not a constant")
        wq = np.asarray(m.const("wq"))
        if wq.dtype != np.dtype(np.int8) or wq.ndim < 3:
            return NoMatch(f"the weight is {wq.dtype} of rank {wq.ndim}; expected int8 convolution weights")
        if np.asarray(m.const("sw")).dtype != np.float32 or m["c"].type is None or m["c"].type.elem != F32:
            # a float16 Conv (TensorRT-style files keep what is not quantized in half
            # precision): the folded scale and offset would need its rounding, not float32's
            return NoMatch("the convolution is not float32")
        q = node_qtype(m.node("wf"), m["wq"], m["sw"], m["zw"])
        if q is None or (q.axis is not None and q.axis % wq.ndim != 0):
            return NoMatch("the weight is not quantized per tensor or per output channel (axis 0)")
        channels = wq.shape[0]
        if any(np.asarray(m.const(n)).size != channels for n in BN_PARAMS):
            return NoMatch(f"BatchNormalization parameters do not have {channels} elements")
        bias = np.zeros(channels)
        bv = m["B"]
        if bv is not None:
            dq = bv.producer
            if bv.is_const and np.asarray(bv.const).dtype == np.float32:
                bias = np.asarray(bv.const, np.float64)
            elif (
                dq is not None
                and dq.op_type == "DequantizeLinear"
                and all(v is None or v.is_const for v in dq.inputs)
            ):
                qb = node_qtype(dq, dq.input(0), dq.input(1), dq.input(2))
                if qb is None or str(qb.storage) != "i32" or any(qb.zero_point):
                    return NoMatch(f"bias {describe(bv)} is not a float or int32 constant")
                codes = np.asarray(dq.input(0).const).astype(np.float32)
                scale = np.broadcast_to(np.asarray(qb.scale, np.float32), codes.shape)
                bias = np.multiply(codes, scale, dtype=np.float32).astype(np.float64)
            else:
                return NoMatch(f"bias {describe(bv)} is not a constant")
            if bias.shape != (channels,):
                return NoMatch(f"bias of shape {bias.shape} for {channels} output channels")
        a, t = _factors(m)
        if not (np.all(np.isfinite(a)) and np.all(a != 0)):
            return NoMatch("a BatchNormalization factor g/sqrt(var + eps) is zero or not finite")
        sw = np.broadcast_to(np.asarray(q.scale, np.float64), (channels,))
        zw = np.broadcast_to(np.asarray(q.zero_point, np.int64), (channels,))
        neg = a < 0
        if np.any(neg) and (np.any(wq[neg] == -128) or np.any(zw[neg] == -128)):
            return NoMatch("a channel with a negative BatchNormalization factor holds the code -128")
        new_sw = (sw * np.abs(a)).astype(np.float32)
        if not np.all(np.isfinite(new_sw)) or np.any(new_sw <= 0):
            return NoMatch("a folded weight scale is not a positive finite float32")
        sign = np.where(neg, -1, 1)
        new_wq = (wq.astype(np.int16) * sign.reshape((channels,) + (1,) * (wq.ndim - 1))).astype(np.int8)
        m.data.update(
            wq=new_wq, sw=new_sw, zw=(zw * sign).astype(np.int8), b=(bias * a + t).astype(np.float32), qtype=q
        )
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        from quanta.ir.types import QuantType, TensorType

        d = m.data
        q = d["qtype"]
        qt = QuantType(q.storage, q.expressed, d["sw"], d["zw"], axis=0)
        wq = b.const(f"{m['wq'].name}_bn", d["wq"], TensorType(qt, tuple(d["wq"].shape)))
        sw = b.const(f"{m['sw'].name}_bn", d["sw"])
        zw = b.const(f"{m['wq'].name}_bn_zero_point", d["zw"])
        wf = b.op(
            "DequantizeLinear",
            [wq, sw, zw],
            {"axis": 0},
            types=result_type(shape_from=m["wf"], elem_from=m["wf"]),
            name=m.node("wf").name or None,
        )
        bias = b.const(f"{m.node('c').name or 'conv'}_bn_bias", d["b"])
        bias.doc = FOLDED_OFFSET  # the lowering adds it after the scaling (module docstring)
        return _folded(b, m, "Conv", [m["x"], wf, bias], dict(m.node("c").attrs))


class FoldBatchNorm(RewritePass):
    name = "fold_batchnorm"
    rules = (
        FoldBatchNormIntoConv(),
        FoldBatchNormIntoConvTranspose(),
        FoldBatchNormIntoGemm(),
        FoldBatchNormIntoQuantizedConv(),
    )
