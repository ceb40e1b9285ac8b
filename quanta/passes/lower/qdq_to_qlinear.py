"""Instruction selection: ``Q -> op -> DQ`` groups of a QDQ graph become integer operators.

Each rule matches a float op whose inputs come from DequantizeLinear and whose output
goes to QuantizeLinear, all with constant parameters, and replaces the group by one
integer operator of ONNX's QOperator form (the form ONNX Runtime's QDQ transformer
produces, so a lowered model is also a valid ONNX model that ONNX Runtime runs)::

    %y = QuantizeLinear(Conv(DequantizeLinear(%x, sx, zx), DequantizeLinear(%w, sw, zw), %b?), sy, zy)
      -> %y = QLinearConv(%x, sx, zx, %w, sw, zw, sy, zy, %bq?)                       (LowerConv)
    ... MatMul ...                 -> QLinearMatMul                                  (LowerMatMul)
    MatMul(DQ, DQ), float output   -> com.microsoft::MatMulIntegerToFloat           (LowerMatMulFloatOutput)
    Conv(DQ, DQ), float output     -> ConvInteger -> Add(bq) -> Cast -> Mul(sx·sw)    (LowerConvFloatOutput)
    ... Gemm ...                   -> com.microsoft::QGemm (float output when no Q)   (LowerGemm)
    ... Add | Mul ...              -> com.microsoft::QLinearAdd | QLinearMul          (LowerBinary)
    ... Concat ...                 -> com.microsoft::QLinearConcat                    (LowerConcat)
    ... AveragePool | GlobalAveragePool -> com.microsoft::QLinear(Global)AveragePool (LowerPool)
    ... Sigmoid | LeakyRelu ...    -> com.microsoft::QLinearSigmoid | QLinearLeakyRelu (LowerUnary)
    ... Softmax ...                -> com.microsoft::QLinearSoftmax {opset, axis}     (LowerSoftmax)
    Q(f(DQ(x))), f elementwise     -> quanta::QLinearLookup (a 256-entry table)       (LowerLookup, lookup.py)
    Add(MatMulIntegerToFloat(...), bias[N]) -> MatMulIntegerToFloat(..., bias)      (FuseMatMulFloatBias)
    Mul(Cast(MatMulInteger(a, b, za, zb)), Mul(sa, sb))
                                   -> com.microsoft::MatMulIntegerToFloat            (LowerMatMulIntegerScaled)
    DequantizeLinear(MatMulInteger(a, b, za, zb), s)
                                   -> com.microsoft::MatMulIntegerToFloat            (LowerMatMulIntegerDequantized)

The integer operator's numerics (docs/quantization-math.md eqs. (4)-(6)) differ from the
float QDQ group only in where rounding happens: the group rounds once after a float32
convolution of dequantized values, the integer op accumulates exactly in int32 and
rounds once in the requantization, so outputs agree within one quantization step.

Bias: an int32 bias given as ``DequantizeLinear(%bq, sx·sw, 0)`` (what quanta's and ONNX
Runtime's quantizers write) is used as is; an integer bias with another scale or a zero
point (an int32 one shared by Convs of other ``sx·sw``; AMD Quark's int8 bias with its
own power-of-two scale) is requantized to ``sx·sw`` (``_rescaled_bias``, eq. (6b)); a
float constant bias of a Conv is quantized to int32 with scale ``sx·sw`` as ONNX
Runtime's BiasQuantization does (it then fuses the group too), except an offset a pass
folded from a BatchNormalization after the Conv (``_util.FOLDED_OFFSET``), which
LowerConvFloatOutput adds in float after the scaling, as the file's float group adds it;
other float biases are refused.

The DequantizeLinear nodes of the inputs may feed other consumers: they stay for those
(``shared_ok``) and dead-code elimination removes them when nothing uses them anymore.
Every refusal names its reason (``quanta inspect --lowered`` lists them).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from quanta.ir.graph import Node, Value, result_type
from quanta.ir.op_facts import MS as MS_DOMAIN
from quanta.ir.op_rules import Stage
from quanta.ir.types import IntType, QuantType
from quanta.passes.lower.conv_float_output import LowerConvFloatOutput
from quanta.passes.lower.lookup import LowerLookup, constant_codes
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import FOLDED_OFFSET, describe, node_qtype
from quanta.passes.rules.fold_constants import Evaluator

__all__ = [
    "LOWER_RULES",
    "FuseMatMulFloatBias",
    "FuseMatMulFloatBiasFirst",
    "LowerBinary",
    "LowerConcat",
    "LowerConv",
    "LowerGemm",
    "LowerLookup",
    "LowerMatMul",
    "LowerMatMulFloatOutput",
    "LowerMatMulIntegerDequantized",
    "LowerMatMulIntegerScaled",
    "LowerMatMulIntegerScaledFirst",
    "LowerPool",
    "LowerQdqToQLinear",
    "LowerSoftmax",
    "LowerUnary",
]

CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
STORAGE_8BIT = ("u8", "i8")


def _params(m: Match, node_name: str, operand: str, scale: str, zp: str) -> QuantType | None:
    """The QuantType of a captured Q/DQ node's constant (scale, zero point)."""
    return node_qtype(m.node(node_name), m[operand], m[scale], m[zp])


def _check_consts(m: Match, *names: str) -> NoMatch | None:
    for n in names:
        v = m[n]
        if v is not None and not v.is_const:
            return NoMatch(f"quantization parameter {n} {describe(v)} is not a constant")
    return None


def _check_8bit(q: QuantType | None, what: str, *, per_tensor: bool = True) -> NoMatch | None:
    if q is None:
        return NoMatch(f"{what} has no constant quantization parameters")
    if q.block is not None:
        # a scale per block of a row or column has no single sx·sw per output channel
        # (ORT's BlockSize along N: scales [K, N / B]); per block along K: MatMulW4A8 (w4.py)
        return NoMatch(
            f"{what} is quantized per block of {q.block} along axis {q.axis}; the integer kernels "
            "take one scale per tensor or per output channel"
        )
    if str(q.storage) not in STORAGE_8BIT:
        return NoMatch(f"{what} is stored as {q.storage}; the integer kernels take u8 or i8")
    if per_tensor and q.axis is not None:
        return NoMatch(f"{what} is quantized per axis ({q.axis}); the integer op takes one scale here")
    return None


def _check_per_column(m: Match, qb: QuantType) -> NoMatch | None:
    """A per-axis MatMul operand b must be quantized per column of a rank-2 matrix."""
    if qb.axis is None:
        return None
    shape = m.value("bq").shape
    if shape is None or len(shape) != 2 or qb.axis % 2 != 1:
        return NoMatch("input b is quantized per axis other than the columns of a rank-2 matrix")
    return None


def _zero_point_or_default(b: Builder, m: Match, zp: str, q: QuantType, base: str) -> Value:
    """The captured zero point, or a constant 0 of the storage type when it was omitted
    (ONNX DequantizeLinear's default; the QLinear* ops require the input)."""
    v = m[zp]
    if v is not None:
        return v
    assert isinstance(q.storage, IntType)
    return b.const(base, np.zeros((), dtype=q.storage.numpy))


def _scalar_if_uniform(b: Builder, v: Value, base: str) -> Value:
    """ONNX Runtime's QLinearConv takes one weight zero point: a per-channel vector
    whose entries are all equal (symmetric weights: all 0) becomes that scalar."""
    c = np.asarray(v.const)
    if c.ndim == 1 and c.size > 1 and np.all(c == c[0]):
        return b.const(base, c[:1].reshape(()).astype(c.dtype))
    return v


def _quantize_float_bias(bv: Value, sx: QuantType, sw: QuantType) -> np.ndarray | NoMatch:
    """ONNX Runtime's BiasQuantization for a float constant bias between quantized x and w:
    ``bq = int32(rne(f32(b / f32(sx·sw[m]))))`` per output channel (its Mul, Div, Round,
    Cast nodes, constant-folded). ORT then fuses the group into QLinearConv, so a file whose
    exporter wrote the bias as a float Constant (PaddlePaddle) runs the integer op in ORT;
    against the float group the rounded bias moves the output by at most
    ``0.5·sx·sw/sy`` of a step (docs/quantization-math.md, ORT section). Values outside
    int32 saturate (ORT's Cast leaves them undefined)."""
    b = np.asarray(bv.const, np.float32)
    scale = np.float32(sx.scale[0]) * np.asarray(sw.scale, np.float32)
    if b.ndim != 1 or scale.size not in (1, b.size):
        return NoMatch(f"float bias {describe(bv)} of shape {b.shape} does not match the weight's channels")
    if not np.all(np.isfinite(b)):
        return NoMatch(f"float bias {describe(bv)} holds NaN or inf")
    q = np.rint(np.divide(b, scale, dtype=np.float32).astype(np.float64))
    info = np.iinfo(np.int32)
    return np.clip(q, info.min, info.max).astype(np.int32)


def _int32_bias(
    m: Match, bias: str, sx: QuantType, sw: QuantType, *, quantize_float: bool = False
) -> Value | np.ndarray | NoMatch | None:
    """The int32 bias tensor behind ``DequantizeLinear(bq, sx·sw, 0)``, or (``quantize_float``)
    the int32 codes of a float constant bias quantized as ONNX Runtime does; None when there
    is no bias, NoMatch when the bias cannot be used."""
    bv = m[bias]
    if bv is None:
        return None
    dq = bv.producer
    if quantize_float and bv.is_const and np.asarray(bv.const).dtype == np.float32:
        return _quantize_float_bias(bv, sx, sw)
    if dq is None or dq.op_type != "DequantizeLinear":
        return NoMatch(
            f"bias {describe(bv)} is float; the integer op needs an int32 bias DequantizeLinear(bq, sx*sw, 0)"
        )
    bq = dq.input(0)
    qb = node_qtype(dq, bq, dq.input(1), dq.input(2))
    if bq is None or not bq.is_const or qb is None or str(qb.storage) not in BIAS_STORAGES:
        return NoMatch(
            f"bias {describe(bv)} is not an integer constant ({', '.join(BIAS_STORAGES)}) behind DequantizeLinear"
        )
    # eq. (6): the bias scale must be sx*sw (float32 product) channel by channel
    want = np.float32(sx.scale[0]) * np.asarray(sw.scale, np.float32)
    got = np.asarray(qb.scale, np.float32)
    zero = np.asarray(qb.zero_point, np.int64)
    if got.size == 1 and want.size > 1:
        got = np.full(want.shape, got[0], np.float32)
    codes = np.asarray(bq.const)
    if got.size != 1 and got.shape != want.shape:
        return NoMatch(f"bias {describe(bv)} has {got.size} scales for {want.size} output channels")
    if zero.size != 1 and zero.shape != codes.shape:
        return NoMatch(f"bias {describe(bv)} has {zero.size} zero points for {codes.size} values")
    exact = str(qb.storage) == "i32" and not zero.any()
    if exact and np.array_equal(np.broadcast_to(got, want.shape), want):
        return bq
    # another tool's bias (AMD Quark: int8 with its own power-of-two scale; a uint8 one
    # with a zero point): DequantizeLinear's float value, f32((bq - zb)·sb), on the grid
    # of sx·sw, eq. (6b)
    return _rescaled_bias(codes.astype(np.int64) - zero, got, want)


def _rescaled_bias(codes: np.ndarray, scale: np.ndarray, want: np.ndarray) -> np.ndarray:
    """A bias whose scale is not sx·sw, requantized to sx·sw: the float bias the
    DequantizeLinear gives, ``f32(bq·sb)`` (``codes`` = bq − zb), rounded half to even to
    the nearest multiple of ``sx·sw`` and saturated to int32 (eq. (6b)). Exporters
    deduplicate equal constants, so one bias DequantizeLinear written for one Conv can feed
    Convs of other ``sx·sw`` (ONNX Runtime's quantizer, a shared zero bias), and other
    tools write 8-bit biases with their own scale (AMD Quark: int8, a power-of-two ``sb``
    that is a power-of-two multiple of ``sx·sw``, so the result is exact); against the
    float group the result moves by at most ``0.5·sx·sw`` per channel, less than half a
    step of the output."""
    floats = (codes.astype(np.float32) * np.broadcast_to(scale, codes.shape)).astype(np.float64)
    q = np.rint(floats / np.broadcast_to(want, codes.shape).astype(np.float64))
    info = np.iinfo(np.int32)
    return np.clip(q, info.min, info.max).astype(np.int32)


#: the storages of a bias DequantizeLinear a lowered group takes: int32 with scale sx·sw
#: as is, every other (another scale, a zero point, 8 or 16 bits) by eq. (6b)
BIAS_STORAGES = ("i32", "i16", "u16", "i8", "u8")

StorageCheck = Callable[[tuple[tuple[QuantType | None, str, bool], ...]], NoMatch | None]


def storage_8bit(items: tuple[tuple[QuantType | None, str, bool], ...]) -> NoMatch | None:
    """Every (params, what, per_tensor) operand u8/i8 with constant parameters, per tensor
    where the flag says so (the 8-bit rules; wide.py passes its 16-bit check)."""
    for q, what, per_tensor in items:
        bad = _check_8bit(q, what, per_tensor=per_tensor)
        if bad is not None:
            return bad
    return None


def conv_check(m: Match, storage: StorageCheck, op: str) -> Match | NoMatch:
    """The check of ``Q(Conv(DQ(x), DQ(w), b?))`` for ``op`` (QLinearConv, QLinearConv16):
    constant parameters and weight, ``storage`` on the three operands, per-output-channel
    weight axis, the bias as an int32 of scale sx·sw."""
    bad = _check_consts(m, "sx", "zx", "sw", "zw", "sy", "zy")
    if bad is not None:
        return bad
    if not m.is_const("w"):
        return NoMatch(f"weight {describe(m['w'])} is not a constant")
    qx = _params(m, "xf", "x", "sx", "zx")
    qw = _params(m, "wf", "w", "sw", "zw")
    qy = _params(m, "y", "y", "sy", "zy")
    bad = storage(((qx, "input x", True), (qw, "weight w", False), (qy, "output y", True)))
    if bad is not None:
        return bad
    assert qx is not None and qw is not None
    if qw.axis is not None and qw.axis % len(m.value("w").const.shape) != 0:
        return NoMatch(f"weight w is quantized along axis {qw.axis}; {op} takes axis 0 (output channels)")
    bv = m["b"]
    folded = bv is not None and bv.is_const and bv.doc == FOLDED_OFFSET
    if op == "QLinearConv" and folded and float_elem_name(m["c"]) == "f32":
        # 8-bit operands and a float32 result: LowerConvFloatOutput takes the group (the
        # wide and per-channel forms have no float-output stage, and neither takes
        # another result type, so they round the offset to the int32 grid)
        return NoMatch(
            f"bias {describe(bv)} is an offset folded from a per-channel affine after the "
            "convolution: added in float after the scaling (LowerConvFloatOutput)"
        )
    bq = _int32_bias(m, "b", qx, qw, quantize_float=True)
    if isinstance(bq, NoMatch):
        return bq
    m.data.update(qx=qx, qw=qw, qy=qy, bq=bq)
    return m


def conv_rewrite(m: Match, b: Builder, op: str, domain: str = "", *, scalar_zw: bool = True) -> Value:
    """``op(x, sx, zx, w, sw, zw, sy, zy, bq?)`` with the Conv's geometry attributes;
    ``scalar_zw``: a per-channel zero point whose values are all equal becomes a scalar."""
    conv = m.node("c")
    attrs = {k: v for k, v in conv.attrs.items() if k in CONV_ATTRS}
    zx = _zero_point_or_default(b, m, "zx", m.data["qx"], "x_zero_point")
    zw = _zero_point_or_default(b, m, "zw", m.data["qw"], "w_zero_point")
    if scalar_zw:
        zw = _scalar_if_uniform(b, zw, "w_zero_point")
    zy = _zero_point_or_default(b, m, "zy", m.data["qy"], "y_zero_point")
    inputs = [m["x"], m["sx"], zx, m["w"], m["sw"], zw, m["sy"], zy]
    bq = m.data["bq"]
    if isinstance(bq, np.ndarray):  # a float bias quantized, or an int32 one requantized
        bq = b.const(f"{m['b'].name}_quantized", bq)
    if bq is not None:
        inputs.append(bq)
    return b.op(
        op,
        inputs,
        attrs,
        domain=domain,
        types=result_type(shape_from=m["y"], elem_from=m["y"]),
        attr_types=conv.attr_types,
        name=conv.name or None,
    )


class LowerConv(Rule):
    """``Q(Conv(DQ(x), DQ(w), b?)) -> QLinearConv(x, sx, zx, w, sw, zw, sy, zy, bq?)``."""

    pattern = (
        "y = QuantizeLinear(c = Conv(xf = DequantizeLinear(x, sx, zx?), "
        "wf = DequantizeLinear(w, sw, zw?), b?), sy, zy?)"
    )
    shared_ok = frozenset({"xf", "wf"})

    def check(self, m: Match) -> Match | NoMatch:
        return conv_check(m, storage_8bit, "QLinearConv")

    def rewrite(self, m: Match, b: Builder) -> Value:
        return conv_rewrite(m, b, "QLinearConv")


def matmul_check(m: Match, storage: StorageCheck) -> Match | NoMatch:
    """The check of ``Q(MatMul(DQ(a), DQ(b)))``: constant parameters, ``storage`` on the
    three operands, b per tensor or per column of a rank-2 matrix."""
    bad = _check_consts(m, "sa", "za", "sb", "zb", "sy", "zy")
    if bad is not None:
        return bad
    qa = _params(m, "af", "a", "sa", "za")
    qb = _params(m, "bf", "bq", "sb", "zb")
    qy = _params(m, "y", "y", "sy", "zy")
    bad = storage(((qa, "input a", True), (qb, "input b", False), (qy, "output y", True)))
    if bad is not None:
        return bad
    assert qb is not None
    bad = _check_per_column(m, qb)
    if bad is not None:
        return bad
    m.data.update(qa=qa, qb=qb, qy=qy)
    return m


def matmul_rewrite(
    m: Match, b: Builder, op: str, domain: str = "", attrs: dict[str, int] | None = None
) -> Value:
    """``op(a, sa, za, b, sb, zb, sy, zy)`` with ``attrs`` (none by default)."""
    za = _zero_point_or_default(b, m, "za", m.data["qa"], "a_zero_point")
    zb = _zero_point_or_default(b, m, "zb", m.data["qb"], "b_zero_point")
    zy = _zero_point_or_default(b, m, "zy", m.data["qy"], "y_zero_point")
    return b.op(
        op,
        [m["a"], m["sa"], za, m["bq"], m["sb"], zb, m["sy"], zy],
        attrs,
        domain=domain,
        types=result_type(shape_from=m["y"], elem_from=m["y"]),
        name=m.node("c").name or None,
    )


class LowerMatMul(Rule):
    """``Q(MatMul(DQ(a), DQ(b))) -> QLinearMatMul(a, sa, za, b, sb, zb, sy, zy)``; b may be
    a constant (per column) or an activation (attention: both operands per tensor)."""

    pattern = (
        "y = QuantizeLinear(c = MatMul(af = DequantizeLinear(a, sa, za?), "
        "bf = DequantizeLinear(bq, sb, zb?)), sy, zy?)"
    )
    shared_ok = frozenset({"af", "bf"})

    def check(self, m: Match) -> Match | NoMatch:
        return matmul_check(m, storage_8bit)

    def rewrite(self, m: Match, b: Builder) -> Value:
        return matmul_rewrite(m, b, "QLinearMatMul")


class LowerMatMulFloatOutput(Rule):
    """``MatMul(DQ(a), DQ(b)) -> com.microsoft::MatMulIntegerToFloat(a, b, sa, sb, za, zb)``
    when the product is not quantized (its consumers are float: a residual Add before
    LayerNorm, the last layer). Integer multiply-accumulate, float32 result
    ``(a - za)(b - zb)·sa·sb`` (ONNX Runtime's op)."""

    pattern = "c = MatMul(af = DequantizeLinear(a, sa, za?), bf = DequantizeLinear(bq, sb, zb?))"
    shared_ok = frozenset({"af", "bf"})

    def check(self, m: Match) -> Match | NoMatch:
        if any(u.op_type == "QuantizeLinear" for u in m.value("c").consumers()):
            return NoMatch("the output is quantized (LowerMatMul handles it)")
        bad = _check_consts(m, "sa", "za", "sb", "zb")
        if bad is not None:
            return bad
        qa = _params(m, "af", "a", "sa", "za")
        qb = _params(m, "bf", "bq", "sb", "zb")
        for q, what, per_tensor in ((qa, "input a", True), (qb, "input b", False)):
            bad = _check_8bit(q, what, per_tensor=per_tensor)
            if bad is not None:
                return bad
        assert qb is not None
        bad = _check_per_column(m, qb)
        if bad is not None:
            return bad
        if float_elem_name(m["c"]) != "f32":
            return NoMatch("the product is not float32")
        m.data.update(qa=qa, qb=qb)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        za = _zero_point_or_default(b, m, "za", m.data["qa"], "a_zero_point")
        zb = _zero_point_or_default(b, m, "zb", m.data["qb"], "b_zero_point")
        return b.op(
            "MatMulIntegerToFloat",
            [m["a"], m["bq"], m["sa"], m["sb"], za, zb],
            domain=MS_DOMAIN,
            types=result_type(shape_from=m["c"], elem_from=m["c"]),
            name=m.node("c").name or None,
        )


def float_elem_name(v: Value | None) -> str | None:
    return None if v is None or v.type is None else str(v.type.elem)


def _gemm_check(m: Match, with_output: bool) -> Match | NoMatch:
    names = ["sa", "za", "sb", "zb"] + (["sy", "zy"] if with_output else [])
    bad = _check_consts(m, *names)
    if bad is not None:
        return bad
    gemm = m.node("c")
    if not m.is_const("bq"):
        return NoMatch(f"weight {describe(m['bq'])} is not a constant")
    if float(gemm.attrs.get("beta", 1.0)) != 1.0 and m["cb"] is not None:
        return NoMatch("Gemm with a bias and beta != 1")
    qa = _params(m, "af", "a", "sa", "za")
    qb = _params(m, "bf", "bq", "sb", "zb")
    for q, what, per_tensor in ((qa, "input a", True), (qb, "weight b", False)):
        bad = _check_8bit(q, what, per_tensor=per_tensor)
        if bad is not None:
            return bad
    assert qa is not None and qb is not None
    if qb.axis is not None:
        want = 0 if gemm.attrs.get("transB", 0) else 1
        if qb.axis % 2 != want:
            return NoMatch(
                f"weight b is quantized along axis {qb.axis}, not its output columns (axis {want})"
            )
    qy = None
    if with_output:
        qy = _params(m, "y", "y", "sy", "zy")
        bad = _check_8bit(qy, "output y")
        if bad is not None:
            return bad
        assert qy is not None
        if str(qy.storage) != str(qa.storage):
            # QGemm's Y has A's type (ms_qgemm); NNCF writes int8 inputs and a uint8 output
            # after a ReLU: the float-output QGemm, then the QuantizeLinear, take the group
            return NoMatch(f"output y is {qy.storage} and input a {qa.storage}: QGemm's Y has A's type")
    float_bias = None
    cb = m["cb"]
    if not with_output and cb is not None and cb.is_const and np.asarray(cb.const).dtype == np.float32:
        # a float bias of a float-output Gemm (NNCF's classifier head): added in float32
        # after the integer product, as FuseMatMulFloatBias's op adds it
        float_bias, bias = cb, None
        n = m.value("c").shape[-1] if m.value("c").shape else None
        if np.asarray(cb.const).ndim > 1 and any(d != 1 for d in np.asarray(cb.const).shape[:-1]):
            return NoMatch(f"float bias {describe(cb)} is not one value per output column")
        if not isinstance(n, int) or np.asarray(cb.const).shape[-1:] not in ((n,), (1,)):
            return NoMatch(f"float bias {describe(cb)} does not broadcast over the {n} output columns")
    else:
        bias = _int32_bias(m, "cb", qa, qb, quantize_float=with_output)
        if isinstance(bias, NoMatch):
            return bias
    m.data.update(qa=qa, qb=qb, qy=qy, bias=bias, float_bias=float_bias)
    return m


def _gemm_rewrite(
    m: Match, b: Builder, out: str, with_output: bool, extra: dict[str, int] | None = None
) -> Value:
    gemm = m.node("c")
    za = _zero_point_or_default(b, m, "za", m.data["qa"], "a_zero_point")
    zb = _zero_point_or_default(b, m, "zb", m.data["qb"], "b_zero_point")
    bias = m.data["bias"]
    if isinstance(bias, np.ndarray):  # an int32 bias requantized to sa·sb at compile time
        bias = b.const(f"{m['cb'].name}_requantized", bias)
    inputs: list[Value | None] = [m["a"], m["sa"], za, m["bq"], m["sb"], zb, bias]
    if with_output:
        inputs += [m["sy"], _zero_point_or_default(b, m, "zy", m.data["qy"], "y_zero_point")]
    attrs = {k: gemm.attrs[k] for k in ("alpha", "transA", "transB") if k in gemm.attrs} | (extra or {})
    y = b.op(
        "QGemm",
        inputs,
        attrs,
        domain=MS_DOMAIN,
        types=result_type(shape_from=m[out], elem_from=m[out]),
        attr_types=gemm.attr_types,
        name=gemm.name or None,
    )
    if m.data.get("float_bias") is None:
        return y
    return b.op("Add", [y, m.data["float_bias"]], types=result_type(shape_from=m[out], elem_from=m[out]))


class LowerGemm(Rule):
    """``Q(Gemm(DQ(a), DQ(b), c?)) -> com.microsoft::QGemm(a, sa, za, b, sb, zb, cq?, sy, zy)``."""

    pattern = (
        "y = QuantizeLinear(c = Gemm(af = DequantizeLinear(a, sa, za?), "
        "bf = DequantizeLinear(bq, sb, zb?), cb?), sy, zy?)"
    )
    shared_ok = frozenset({"af", "bf"})

    def check(self, m: Match) -> Match | NoMatch:
        return _gemm_check(m, with_output=True)

    def rewrite(self, m: Match, b: Builder) -> Value:
        return _gemm_rewrite(m, b, "y", with_output=True)

    def rewrite_with(self, m: Match, b: Builder, attrs: dict[str, int]) -> Value:
        """:meth:`rewrite` whose QGemm also carries ``attrs`` (the session's
        ``saturating_pairs``, rules/ort_float_functions.py)."""
        return _gemm_rewrite(m, b, "y", with_output=True, extra=attrs)


class LowerGemmFloatOutput(Rule):
    """``Gemm(DQ(a), DQ(b), c?) -> com.microsoft::QGemm(a, sa, za, b, sb, zb, cq?)`` with a
    float output (the classifier head: quanta leaves graph outputs float). A float
    constant bias (NNCF's head) is added after the op in float32:
    ``Add(QGemm(a, sa, za, b, sb, zb), c)``, which is the float Gemm up to float32
    rounding (the product is exact in int32, scaled once, then the bias added)."""

    pattern = "c = Gemm(af = DequantizeLinear(a, sa, za?), bf = DequantizeLinear(bq, sb, zb?), cb?)"
    shared_ok = frozenset({"af", "bf"})

    def check(self, m: Match) -> Match | NoMatch:
        users = m.value("c").consumers()
        qa = _params(m, "af", "a", "sa", "za")
        a_storage = None if qa is None else str(qa.storage)
        for u in users:
            if u.op_type != "QuantizeLinear":
                continue
            y = u.outputs[0].type.elem if u.outputs and u.outputs[0].type is not None else None
            # an 8-bit output of the other signedness than A (NNCF: int8 in, uint8 after a
            # ReLU) stays here: QGemm's Y has A's type, so LowerGemm refuses it; a wider
            # output (an integer-only target's 16-bit one) is the other lowerings'
            if (
                not isinstance(y, QuantType)
                or str(y.storage) == a_storage
                or getattr(y.storage, "bits", None) != 8
            ):
                return NoMatch("the output is quantized (LowerGemm handles it)")
        return _gemm_check(m, with_output=False)

    def rewrite(self, m: Match, b: Builder) -> Value:
        return _gemm_rewrite(m, b, "c", with_output=False)


class LowerBinary(Rule):
    """``Q(Add|Mul(DQ(a), DQ(b))) -> com.microsoft::QLinearAdd|QLinearMul(a, sa, za, b, sb, zb, sy, zy)``.

    Refused for int8 with one constant operand (``x + 1`` and ``x * 0.5`` of a GELU
    written out, a normalization's constants): ONNX Runtime runs that group in float
    on x86, and QLinearAdd's single rounding of ``a·ra + b·rb + zy`` parts from the
    float group's on the many exact ties such constants make (40 % of the codes of
    ``erf + 1`` in a GELU: 2/255-scaled codes plus one, requantized at 2/255).
    The group is then a function of one 8-bit tensor, and LowerLookup's table computes
    it as the file does.
    """

    pattern = (
        "y = QuantizeLinear(c = Add|Mul(af = DequantizeLinear(a, sa, za?), "
        "bf = DequantizeLinear(bb, sb, zb?)), sy, zy?)"
    )
    shared_ok = frozenset({"af", "bf"})

    def check(self, m: Match) -> Match | NoMatch:
        bad = _check_consts(m, "sa", "za", "sb", "zb", "sy", "zy")
        if bad is not None:
            return bad
        qa = _params(m, "af", "a", "sa", "za")
        qb = _params(m, "bf", "bb", "sb", "zb")
        qy = _params(m, "y", "y", "sy", "zy")
        for q, what in ((qa, "input a"), (qb, "input b"), (qy, "output y")):
            bad = _check_8bit(q, what)
            if bad is not None:
                return bad
        assert qa is not None and qb is not None and qy is not None
        if not (qa.storage == qb.storage == qy.storage):
            return NoMatch(
                f"operands are stored as {qa.storage}, {qb.storage} -> {qy.storage}; the op takes one type"
            )
        if str(qy.storage) == "i8" and (constant_codes(m["a"]) or constant_codes(m["bb"])):
            return NoMatch(
                "int8 with a constant operand: ONNX Runtime computes this group in float "
                "(on x86 it moves each int8 Q -> DQ pair to uint8 but not a constant's "
                "DequantizeLinear, so the types differ and it fuses no QLinearAdd / "
                "QLinearMul); LowerLookup's table is that float group bit for bit"
            )
        m.data.update(qa=qa, qb=qb, qy=qy)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        op = m.node("c")
        za = _zero_point_or_default(b, m, "za", m.data["qa"], "a_zero_point")
        zb = _zero_point_or_default(b, m, "zb", m.data["qb"], "b_zero_point")
        zy = _zero_point_or_default(b, m, "zy", m.data["qy"], "y_zero_point")
        return b.op(
            f"QLinear{op.op_type}",
            [m["a"], m["sa"], za, m["bb"], m["sb"], zb, m["sy"], zy],
            domain=MS_DOMAIN,
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            name=op.name or None,
        )


def _check_unary(m: Match) -> NoMatch | None:
    """Operand checks of the one-input ops (x -> y, one storage type); records qx, qy.
    (NoMatch is falsy: test results with ``is not None``.)"""
    bad = _check_consts(m, "sx", "zx", "sy", "zy")
    if bad is not None:
        return bad
    qx = _params(m, "xf", "x", "sx", "zx")
    qy = _params(m, "y", "y", "sy", "zy")
    for q, what in ((qx, "input x"), (qy, "output y")):
        bad = _check_8bit(q, what)
        if bad is not None:
            return bad
    assert qx is not None and qy is not None
    if qx.storage != qy.storage:
        return NoMatch(f"input is {qx.storage} and output {qy.storage}; the op takes one type")
    m.data.update(qx=qx, qy=qy)
    return None


def _unary_rewrite(m: Match, b: Builder, keep: tuple[str, ...]) -> Value:
    """``com.microsoft::QLinear<Op>(x, sx, zx, sy, zy)`` with the attributes in ``keep``;
    the result type is the replaced QuantizeLinear output's."""
    op = m.node("c")
    zx = _zero_point_or_default(b, m, "zx", m.data["qx"], "x_zero_point")
    zy = _zero_point_or_default(b, m, "zy", m.data["qy"], "y_zero_point")
    return b.op(
        f"QLinear{op.op_type}",
        [m["x"], m["sx"], zx, m["sy"], zy],
        {k: v for k, v in op.attrs.items() if k in keep},
        domain=MS_DOMAIN,
        types=result_type(shape_from=m["y"], elem_from=m["y"]),
        attr_types=op.attr_types,
        name=op.name or None,
    )


class LowerPool(Rule):
    """``Q(AveragePool|GlobalAveragePool(DQ(x))) -> com.microsoft::QLinearAveragePool|
    QLinearGlobalAveragePool(x, sx, zx, sy, zy)``."""

    pattern = (
        "y = QuantizeLinear(c = AveragePool|GlobalAveragePool(xf = DequantizeLinear(x, sx, zx?)), sy, zy?)"
    )
    shared_ok = frozenset({"xf"})

    def check(self, m: Match) -> Match | NoMatch:
        bad = _check_unary(m)
        if bad is not None:
            return bad
        pool = m.node("c")
        if (
            pool.op_type == "AveragePool"
            and pool.attrs.get("dilations")
            and any(d != 1 for d in pool.attrs["dilations"])
        ):
            return NoMatch("AveragePool with dilations has no quantized form")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        keep = ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides")
        return _unary_rewrite(m, b, keep)


class LowerUnary(Rule):
    """``Q(Sigmoid|LeakyRelu(DQ(x))) -> com.microsoft::QLinearSigmoid|QLinearLeakyRelu``."""

    pattern = "y = QuantizeLinear(c = Sigmoid|LeakyRelu(xf = DequantizeLinear(x, sx, zx?)), sy, zy?)"
    shared_ok = frozenset({"xf"})

    def check(self, m: Match) -> Match | NoMatch:
        bad = _check_unary(m)
        return m if bad is None else bad

    def rewrite(self, m: Match, b: Builder) -> Value:
        return _unary_rewrite(m, b, ("alpha",))


class LowerSoftmax(Rule):
    """``Q(Softmax(DQ(x))) -> com.microsoft::QLinearSoftmax(x, sx, zx, sy, zy) {opset, axis}``.

    ONNX Runtime fuses this group whenever x and y share one 8-bit type (its QDQ unary
    selector), also on x86 with int8 activations, so a file it quantized runs its table
    softmax (``ms_qops.qlinear_softmax``), not the float one: keeping the group float moves
    about 6 % of the codes by 1 (YOLOv8's DFL softmax). The table kernel's output scale is
    ``1 / floor(1 / sy)``, within one step of the float group's (docs/quantization-math.md,
    "Where ONNX Runtime and the ONNX reference differ", row 5).

    The Softmax's meaning depends on the ai.onnx opset (< 13: the input coerced to 2-D at
    ``axis``, default 1; >= 13: one axis, default -1). With ``opset`` unknown the rule fuses
    only where both readings agree: an explicit ``axis`` (or rank 2) and only 1s after it.
    """

    pattern = "y = QuantizeLinear(c = Softmax(xf = DequantizeLinear(x, sx, zx?)), sy, zy?)"
    shared_ok = frozenset({"xf"})

    def __init__(self, opset: int | None = None) -> None:
        super().__init__()
        self.opset = opset

    def check(self, m: Match) -> Match | NoMatch:
        bad = _check_unary(m)
        if bad is not None:
            return bad
        shape = next((v.shape for v in (m.value("x"), m.value("c"), m.value("y")) if v.shape), None)
        if shape is None:
            return NoMatch("Softmax input of unknown rank (the fused op needs its axis)")
        rank = len(shape)
        op = m.node("c")
        if self.opset is not None:
            opset = self.opset
            axis = int(op.attrs.get("axis", -1 if opset >= 13 else 1))
        else:
            if "axis" not in op.attrs and rank != 2:
                return NoMatch(
                    "Softmax without an axis attribute and the opset unknown: its default axis depends on it"
                )
            axis = int(op.attrs.get("axis", 1))
            if not -rank <= axis < rank:
                return NoMatch(f"Softmax axis {axis} outside rank {rank}")
            if any(d != 1 for d in shape[axis % rank + 1 :]):
                return NoMatch(
                    "Softmax over a non-last axis and the opset unknown (opset < 13 reads it as 2-D)"
                )
            opset = 13
        if not -rank <= axis < rank:
            return NoMatch(f"Softmax axis {axis} outside rank {rank}")
        m.data.update(opset=opset, axis=axis % rank)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        op = m.node("c")
        zx = _zero_point_or_default(b, m, "zx", m.data["qx"], "x_zero_point")
        zy = _zero_point_or_default(b, m, "zy", m.data["qy"], "y_zero_point")
        return b.op(
            "QLinearSoftmax",
            [m["x"], m["sx"], zx, m["sy"], zy],
            {"opset": m.data["opset"], "axis": m.data["axis"]},
            domain=MS_DOMAIN,
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            name=op.name or None,
        )


class LowerConcat(Rule):
    """``Q(Concat(DQ(x1), DQ(x2), ...)) -> com.microsoft::QLinearConcat(sy, zy, x1, s1, z1, ...)``."""

    pattern = "y = QuantizeLinear(c = Concat(...), sy, zy?)"

    def check(self, m: Match) -> Match | NoMatch:
        bad = _check_consts(m, "sy", "zy")
        if bad is not None:
            return bad
        qy = _params(m, "y", "y", "sy", "zy")
        bad = _check_8bit(qy, "output y")
        if bad is not None:
            return bad
        assert qy is not None
        operands = []
        for k, v in enumerate(m.node("c").inputs):
            dq = v.producer if v is not None else None
            if dq is None or dq.op_type != "DequantizeLinear":
                return NoMatch(f"input {k} {describe(v)} does not come from DequantizeLinear")
            if any(p is not None and not p.is_const for p in dq.inputs[1:]):
                return NoMatch(f"input {k}: its DequantizeLinear parameters are not constants")
            q = node_qtype(dq, dq.input(0), dq.input(1), dq.input(2))
            bad = _check_8bit(q, f"input {k}")
            if bad is not None:
                return bad
            assert q is not None
            if q.storage != qy.storage:
                return NoMatch(f"input {k} is {q.storage}, the output {qy.storage}; the op takes one type")
            operands.append((dq, q))
        m.data.update(qy=qy, operands=operands)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        concat = m.node("c")
        zy = _zero_point_or_default(b, m, "zy", m.data["qy"], "y_zero_point")
        inputs: list[Value | None] = [m["sy"], zy]
        for dq, q in m.data["operands"]:
            z = dq.input(2)
            if z is None:
                z = b.const("zero_point", np.zeros((), dtype=q.storage.numpy))
            inputs += [dq.input(0), dq.input(1), z]
        return b.op(
            "QLinearConcat",
            inputs,
            {"axis": concat.attrs["axis"]},
            domain=MS_DOMAIN,
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            attr_types=concat.attr_types,
            name=concat.name or None,
        )


def _static_size(v: Value) -> int | None:
    """Number of elements of a value whose shape is fully known, else None."""
    if v.shape is None or not all(isinstance(d, int) for d in v.shape):
        return None
    return int(np.prod(v.shape, dtype=np.int64))


class LowerMatMulIntegerScaled(Rule):
    """``Mul(Cast(MatMulInteger(a, b, za?, zb?), to=FLOAT), Mul(sa, sb))`` (either order of
    either Mul) -> ``com.microsoft::MatMulIntegerToFloat(a, b, sa, sb, za, zb)``.

    The dequantization ONNX Runtime's ``quantize_dynamic`` writes after every
    MatMulInteger (and that older exporters write by hand): three full passes over a
    float32 tensor per matrix product become the op's fused epilogue. Exact, bit for bit:
    the op computes ``fl(f32(acc) · fl(sa · sb))`` (ms_qgemm._integer_to_float), and the
    graph computed the same two roundings (Cast rounds int32 to float32 to nearest even,
    float multiplication is commutative). Refused unless sa is one value and sb one value
    or one per column of a rank-2 b (the op's scale layouts)."""

    pattern = "y = Mul(c = Cast(mm = MatMulInteger(a, b, za?, zb?)), s = Mul(sa, sb))"
    shared_ok = frozenset({"s"})

    def check(self, m: Match) -> Match | NoMatch:
        if m.node("c").attrs.get("to") != 1:
            return NoMatch("the Cast is not to float32")
        if float_elem_name(m["y"]) != "f32":
            return NoMatch("the product is not float32")
        b = m.value("b")
        n = None if b.shape is None or len(b.shape) != 2 else b.shape[-1]
        sizes = []
        for name in ("sa", "sb"):
            v = m.value(name)
            size = _static_size(v)
            if float_elem_name(v) != "f32" or size is None:
                return NoMatch(f"scale '{v.name}' is not a float32 tensor of known shape")
            if len(v.shape) > 1 or size < 1:
                return NoMatch(
                    f"scale '{v.name}' of shape {list(v.shape)}: expected one value or one per column"
                )
            sizes.append(size)
        # the per-tensor one is a_scale; a [N] one must be b's, per column of a rank-2 b
        order = ("sa", "sb") if sizes[0] == 1 else ("sb", "sa")
        if sizes[0] != 1 and sizes[1] != 1:
            return NoMatch("neither scale is a single value (the op takes a per-tensor a_scale)")
        b_size = max(sizes)
        if b_size != 1 and b_size != n:
            return NoMatch(f"a per-column scale of {b_size} values needs a rank-2 b with {b_size} columns")
        for name in ("za", "zb"):
            v = m[name]
            if v is not None and _static_size(v) is None:
                return NoMatch(f"zero point '{v.name}' has an unknown shape")
        za = m["za"]
        if za is not None and _static_size(za) != 1:
            return NoMatch("a per-row a_zero_point (the op takes one)")
        m.data["order"] = order
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        sa_name, sb_name = m.data["order"]
        inputs = [m["a"], m["b"], m[sa_name], m[sb_name]]
        za, zb = m["za"], m["zb"]
        if za is not None or zb is not None:
            inputs.append(za)
        if zb is not None:
            inputs.append(zb)
        # the session's ORT arithmetic (rules/ort_float_functions.py) stays with the product
        sat = m.node("mm").attrs.get("saturating_pairs")
        return b.op(
            "MatMulIntegerToFloat",
            inputs,
            {"saturating_pairs": sat} if sat else None,
            domain=MS_DOMAIN,
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            name=m.node("mm").name or None,
        )


class LowerMatMulIntegerScaledFirst(LowerMatMulIntegerScaled):
    """``Mul(Mul(sa, sb), Cast(MatMulInteger(...)))``: see LowerMatMulIntegerScaled."""

    pattern = "y = Mul(s = Mul(sa, sb), c = Cast(mm = MatMulInteger(a, b, za?, zb?)))"


class LowerMatMulIntegerDequantized(Rule):
    """``DequantizeLinear(MatMulInteger(a, b, za?, zb?), s, 0?)`` -> ``com.microsoft::
    MatMulIntegerToFloat(a, b, s, 1, za, zb)`` (s one value), or ``(a, b, 1, s, ...)`` (s one
    value per column of a rank-2 b, the DequantizeLinear's axis the last).

    The int32 accumulator dequantized by one DequantizeLinear, as onnx-quantize writes its
    static and dynamic MatMuls (its ``QMatMulStatic8bits`` function: QuantizeLinear,
    MatMulInteger, DequantizeLinear(acc, x_scale · w_scale)). quanta's native
    DequantizeLinear takes 8- and 16-bit codes: an int32 one ran on the reference, and the
    product was not counted as integer. Exact, bit for bit: ONNX's DequantizeLinear of
    int32 with a zero point of 0 is ``fl(f32(acc) · s)``, and the op computes
    ``fl(f32(acc) · fl(s · 1))`` (ms_qgemm._integer_to_float) with ``fl(s · 1) = s``.
    Refused: a nonzero or unknown zero point, a scale of another layout."""

    pattern = "y = DequantizeLinear(mm = MatMulInteger(a, b, za?, zb?), s, zs?)"

    def check(self, m: Match) -> Match | NoMatch:
        if float_elem_name(m["y"]) != "f32":
            return NoMatch("the dequantized product is not float32")
        zs = m["zs"]
        if zs is not None and (not zs.is_const or np.any(np.asarray(zs.const) != 0)):
            return NoMatch("the DequantizeLinear's zero point is not a constant 0")
        s = m.value("s")
        size = _static_size(s)
        if float_elem_name(s) != "f32" or size is None or size < 1:
            return NoMatch(f"scale '{s.name}' is not a float32 tensor of known shape")
        b = m.value("b")
        y = m.value("y")
        if size == 1:
            m.data["per_column"] = False
            return m
        n = None if b.shape is None or len(b.shape) != 2 else b.shape[-1]
        rank = None if y.shape is None else len(y.shape)
        axis = int(m.root.attrs.get("axis", 1))
        if len(s.shape) != 1 or size != n or rank is None or axis % rank != rank - 1:
            return NoMatch(
                f"scale '{s.name}' of shape {list(s.shape)}: expected one value, or one per column "
                "of a rank-2 b along the last axis"
            )
        za = m["za"]
        if za is not None and _static_size(za) != 1:
            return NoMatch("a per-row a_zero_point (the op takes one)")
        m.data["per_column"] = True
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        one = b.const("one", np.ones((), np.float32))
        scales = [one, m["s"]] if m.data["per_column"] else [m["s"], one]
        inputs = [m["a"], m["b"], *scales]
        za, zb = m["za"], m["zb"]
        if za is not None or zb is not None:
            inputs.append(za)
        if zb is not None:
            inputs.append(zb)
        return b.op(
            "MatMulIntegerToFloat",
            inputs,
            domain=MS_DOMAIN,
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            name=m.node("mm").name or None,
        )


class FuseMatMulFloatBias(Rule):
    """``Add(com.microsoft::MatMulIntegerToFloat(a, b, sa, sb, za?, zb?), bias)`` with a
    constant float32 bias of N values (any leading 1s) ->
    ``MatMulIntegerToFloat(a, b, sa, sb, za, zb, bias)``; FuseMatMulFloatBiasFirst takes
    ``Add(bias, MatMulIntegerToFloat(...))``.

    Exact, bit for bit: with a per-tensor a_scale the op computes
    ``fl(fl(f32(acc) · m) + bias[n])`` (ms_qgemm._integer_to_float: the multiply, then the
    bias, two float32 roundings, no fused multiply-add), which is what the separate Add
    computed on the op's output; float addition is commutative, so the operand order
    does not matter."""

    pattern = "y = Add(mm = com.microsoft::MatMulIntegerToFloat(a, b, sa, sb, za?, zb?), bias)"

    def check(self, m: Match) -> Match | NoMatch:
        node, mm, bias, y = m.node("mm"), m.value("mm"), m.value("bias"), m.value("y")
        if node.input(6) is not None:
            return NoMatch("the MatMulIntegerToFloat already has a bias")
        if not bias.is_const:
            return NoMatch(f"bias {describe(bias)} is not a constant")
        c = np.asarray(bias.const)
        if c.dtype != np.float32 or float_elem_name(mm) != "f32":
            return NoMatch("bias or product is not float32")
        sa = m.value("sa")
        if (
            sa.shape is None
            or len(sa.shape) > 1
            or any(not isinstance(d, int) for d in sa.shape)
            or (int(np.prod(sa.shape)) != 1)
        ):
            return NoMatch("a_scale is not one value (the op applies a per-row scale after the bias)")
        if not m.is_const("sb") or np.asarray(m.const("sb")).ndim > 1:
            return NoMatch("b_scale is not a constant scalar or per-column vector")
        b_shape = m.value("b").shape
        n = None if b_shape is None else b_shape[-1]
        if not isinstance(n, int) or c.size != n or any(d != 1 for d in c.shape[:-1]):
            return NoMatch(f"bias of shape {list(c.shape)} is not one value per output column ({n})")
        if mm.shape is None or c.ndim > len(mm.shape) or y.shape != mm.shape:
            return NoMatch("the Add broadcasts the product to another shape")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        node = m.node("mm")
        bias = m.value("bias")
        c = b.const(bias.name, np.ascontiguousarray(np.asarray(bias.const).reshape(-1)))
        return b.op(
            "MatMulIntegerToFloat",
            [*(node.input(i) for i in range(6)), c],
            dict(node.attrs),
            domain=MS_DOMAIN,
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            name=node.name or None,
        )


class FuseMatMulFloatBiasFirst(FuseMatMulFloatBias):
    """``Add(bias, MatMulIntegerToFloat(...))``: see FuseMatMulFloatBias."""

    pattern = "y = Add(bias, mm = com.microsoft::MatMulIntegerToFloat(a, b, sa, sb, za?, zb?))"


def lower_rules(
    opset: int | None = None, evaluator: Evaluator | None = None, *, wide: bool = True
) -> list[Rule]:
    """The instruction-selection rules in the order they are tried; ``opset`` (ai.onnx) lets
    LowerSoftmax read a Softmax over any axis; ``evaluator`` (the reference kernels) lets
    LowerLookup compute its tables. LowerLookup comes last: ORT's own operators first.
    ``wide=False`` leaves 16-bit and 4-bit groups as QDQ (an integer-only target lowers
    them itself)."""
    from quanta.passes.lower.mx import mx_rules
    from quanta.passes.lower.per_channel_activation import LowerConvPerChannelDepthwise
    from quanta.passes.lower.w4 import w4_rules
    from quanta.passes.lower.wide import wide_rules
    from quanta.passes.rules.propagate_views import MoveDequantizeAfterConcat

    return [
        LowerConv(),
        LowerConvPerChannelDepthwise(),  # NNCF: a per-channel activation into a depthwise conv
        LowerMatMul(),
        LowerMatMulFloatOutput(),
        LowerGemm(),
        LowerGemmFloatOutput(),
        # a 16-bit operand: quanta::QLinearConv16 / QLinearMatMul16 (wide.py)
        *(wide_rules(evaluator) if wide else []),
        # 4-bit weights per block, 8-bit activations: quanta::MatMulW4A8 (w4.py)
        *(w4_rules() if wide else []),
        # MX activations (quanta::QuantizeMX) times MX weights: quanta::MatMulMX (mx.py)
        *(mx_rules() if wide else []),
        LowerConvFloatOutput(),
        LowerBinary(),
        LowerPool(),
        LowerUnary(),
        LowerSoftmax(opset),
        LowerConcat(),
        MoveDequantizeAfterConcat(),  # NNCF: a float Concat of one quantized type feeding a Conv
        LowerMatMulIntegerScaled(),
        LowerMatMulIntegerScaledFirst(),
        LowerMatMulIntegerDequantized(),  # onnx-quantize: DQ(MatMulInteger(...), sa · sb)
        FuseMatMulFloatBias(),
        FuseMatMulFloatBiasFirst(),
        LowerLookup(evaluator, per_channel=wide),
    ]


LOWER_RULES: list[Rule] = lower_rules()


class LowerQdqToQLinear(RewritePass):
    """All instruction-selection rules as one pass (see the module docstring)."""

    name = "lower_qdq_to_qlinear"
    produces_stage = Stage.LOWERED

    def __init__(
        self, opset: int | None = None, evaluator: Evaluator | None = None, *, wide: bool = True
    ) -> None:
        super().__init__(lower_rules(opset, evaluator, wide=wide))


def is_integer_op(node: Node) -> bool:
    """An operator that computes on quantized integers (what the rules produce)."""
    return node.op_type.startswith("QLinear") or node.op_type in (
        "QGemm",
        "MatMulInteger",
        "ConvInteger",
        "MatMulIntegerToFloat",
    )
