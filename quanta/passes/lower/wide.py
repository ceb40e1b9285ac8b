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

from quanta.ir.graph import Node, Value, result_type
from quanta.ir.types import IntType, QuantType, TensorType
from quanta.passes.lower.lookup import group_table, lookup_codes
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import describe, node_qtype
from quanta.passes.rules.fold_constants import Evaluator

__all__ = [
    "LowerAffine16",
    "LowerBinary16",
    "LowerConv16",
    "LowerGemm16",
    "LowerMatMul16",
    "MsQdqToOnnx",
    "MsQdqToOnnxPass",
    "wide_rules",
]

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
    which ai.onnx opsets before 21 required), the 8-bit weights and int32 biases of such a
    file too (the int32 bias then reaches the lowering as its integers); the two
    ops compute the same map (eq. (2)) with float32 scales, so the groups become visible to constant folding
    (which keeps ai.onnx DequantizeLinear of a constant weight) and to the lowering rules."""

    pattern = "y = com.microsoft::QuantizeLinear|com.microsoft::DequantizeLinear(x, s, z?)"

    def check(self, m: Match) -> Match | NoMatch:
        z = m["z"]
        if z is None or z.type is None:
            return NoMatch("no zero point: the storage type is not known")
        elem = z.type.elem.storage if isinstance(z.type.elem, QuantType) else z.type.elem
        if str(elem) not in ("u8", "i8", "u16", "i16", "i32"):
            # 4-bit weights: WidenFourBitWeight (passes/lower/w4.py) writes them as int8
            return NoMatch(f"the zero point is {elem}: only 8-, 16- and 32-bit integer storage is converted")
        if str(elem) == "i32" and (
            m.root.op_type != "DequantizeLinear" or not z.is_const or np.any(np.asarray(z.const) != 0)
        ):
            # ai.onnx DequantizeLinear takes int32 codes with a zero point of 0 only (the
            # contrib op subtracts any: reference/ms_qops.py); QuantizeLinear none
            return NoMatch("int32 codes convert for a DequantizeLinear with a constant zero point of 0 only")
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


def wide_rules(evaluator: Evaluator | None = None) -> list[Rule]:
    """The 16-bit rules, in the order lower_rules tries them; with an ``evaluator`` (the
    reference kernels) LowerLookup takes the per-tensor elementwise groups whose affine map
    is not the float group's on every code, and those with a constant operand."""
    return [
        LowerConv16(),
        LowerMatMul16(),
        LowerGemm16(),
        LowerAffine16(evaluator),
        LowerBinary16(tables=evaluator is not None),
    ]


# -- elementwise groups on 16-bit codes: quanta::QLinearAffine16 / QLinearAdd16 / QLinearMul16 --

AFFINE_OPS = ("BatchNormalization", "Add", "Sub", "Mul", "Div", "HardSigmoid", "Relu", "Clip")
SIXTEEN = ("u16", "i16")


def _qdq_params(p: Node) -> tuple[np.ndarray, np.ndarray | None, int | None] | None:
    """Constant (scale, zero point, axis) of a Q / DQ node, else None."""
    s, z = p.input(1), p.input(2)
    if s is None or not s.is_const or (z is not None and not z.is_const):
        return None
    scale = np.asarray(s.const)
    axis = int(p.attrs.get("axis", 1)) if scale.size > 1 else None
    return scale, None if z is None else np.asarray(z.const), axis


def _along(param: np.ndarray, shape: tuple[int, ...], axis: int | None) -> np.ndarray:
    """A scale or zero point shaped to broadcast against ``shape`` (per tensor or along ``axis``)."""
    if axis is None or param.size == 1:
        return param.reshape(())
    dims = [1] * len(shape)
    dims[axis % len(shape)] = param.size
    return param.reshape(dims)


def _const_codes(v: Value | None) -> np.ndarray | None:
    """Constant codes: an initializer, or a QuantizeLinear of constants (eq. (2): float32
    division, round half to even, saturated)."""
    if v is None or v.is_const:
        return None if v is None else np.asarray(v.const)
    p = v.producer
    if (
        p is None
        or p.domain
        or p.op_type != "QuantizeLinear"
        or p.input(0) is None
        or not p.input(0).is_const
    ):
        return None
    params = _qdq_params(p)
    if params is None:
        return None
    scale, zp, axis = params
    x = np.asarray(p.input(0).const, np.float32)
    dt = np.dtype(np.uint8) if zp is None else zp.dtype
    if dt.kind not in "iu":
        return None
    info = np.iinfo(dt)
    z = 0 if zp is None else _along(zp.astype(np.int64), x.shape, axis)
    q = np.rint(x / _along(scale.astype(np.float32), x.shape, axis)).astype(np.float64) + z
    return np.clip(q, info.min, info.max).astype(dt)


def _float_const(v: Value | None) -> np.ndarray | None:
    """The float64 value of a float constant or of a DequantizeLinear of constant codes (a
    quantized BatchNormalization scale, a quantized Constant): ``f32(codes − zp) · scale``
    in float32, as DequantizeLinear computes it (eq. (1)), else None."""
    if v is None:
        return None
    if v.is_const:
        c = np.asarray(v.const)
        return c.astype(np.float64) if c.dtype.kind == "f" else None
    p = v.producer
    if p is None or p.domain or p.op_type != "DequantizeLinear":
        return None
    params = _qdq_params(p)
    codes = _const_codes(p.input(0))
    if params is None or codes is None or codes.dtype.kind not in "iu":
        return None
    scale, zp, axis = params
    if scale.dtype != np.float32:
        return None
    z = 0 if zp is None else _along(zp.astype(np.int64), codes.shape, axis)
    d = (codes.astype(np.int64) - z).astype(np.float32)
    return (d * _along(scale, codes.shape, axis)).astype(np.float64)


def _dq_input(v: Value | None) -> Node | None:
    """The ai.onnx DequantizeLinear producing ``v`` from non-constant codes, else None."""
    p = None if v is None else v.producer
    if p is None or p.domain or p.op_type != "DequantizeLinear" or _const_codes(p.input(0)) is not None:
        return None
    return p


def _channel_axis(k: np.ndarray, shape: tuple | None) -> int | NoMatch | None:
    """None for one value; else the axis, counted from the end (negative), along which a
    constant varies in the op's output (``shape``); NoMatch when it varies along several."""
    if k.size == 1:
        return None
    if shape is None or k.ndim > len(shape):
        return NoMatch(f"a constant of shape {list(k.shape)} against an output of unknown or lower rank")
    varying = [d for d, n in enumerate(k.shape) if n != 1]
    if len(varying) != 1:
        return NoMatch(f"a constant of shape {list(k.shape)} varies along several axes")
    return varying[0] - k.ndim


#: False: the per-tensor affine map is taken without comparing it with the float group
#: (tests force the map where the float group would go to LowerLookup)
EXACT_CHECK = True


class LowerAffine16(Rule):
    """``Q(f(DQ(x)))`` on 16-bit codes, f a real affine map per tensor or per channel with an
    optional clip -> ``quanta::QLinearAffine16(x, sx, zx, sy, zy, a, b) {axis?, y_min?, y_max?}``
    (docs/quantization-math.md eq. (E1)): BatchNormalization (inference), Add / Sub / Mul / Div
    by a constant (or a DequantizeLinear of constant codes), HardSigmoid, Relu, Clip of
    constant bounds. The 8-bit files' groups become a 256-entry table (LowerLookup); a
    16-bit table per channel would take C·128 KiB, the affine map two numbers."""

    pattern = "y = QuantizeLinear(c = BatchNormalization|Add|Sub|Mul|Div|HardSigmoid|Relu|Clip(...), sy, zy?)"

    def __init__(self, evaluator: Evaluator | None = None) -> None:
        super().__init__()
        # With the reference kernels, a per-tensor map is compared with the float group on
        # all 65536 codes and taken only where the two agree on every code; else
        # LowerLookup's table, which is the float group bit for bit. The map rounds the
        # exact value once, the float group rounds by its float32 steps: they part where
        # those steps cross a tie (HardSwish's x + 3 at a 6/65535 step: about half the
        # codes; ppocr_cls's 16-bit file, ORT's quantizer: 35 of 65536 codes of its
        # x + 3, which 29 output steps carried downstream). Where they agree the map is
        # the faster (a 128 KiB table per op leaves the cache for every op).
        self.evaluator = evaluator

    def check(self, m: Match) -> Match | NoMatch:
        bad = _check_consts(m, "sy", "zy")
        if bad is not None:
            return bad
        qy = _params(m, "y", "y", "sy", "zy")
        op = m.node("c")
        if qy is None or str(qy.storage) not in SIXTEEN or qy.axis is not None or qy.block is not None:
            return NoMatch("the output is not a per-tensor 16-bit quantized value")
        ins = list(op.inputs)
        xi = 0
        if op.op_type in ("Add", "Mul") and len(ins) == 2 and _dq_input(ins[0]) is None:
            xi = 1  # the constant first: Add(k, x), Mul(k, x)
        dq = _dq_input(ins[xi] if ins else None)
        if dq is None:
            return NoMatch("the input is not a DequantizeLinear of an activation")
        qx = node_qtype(dq, dq.input(0), dq.input(1), dq.input(2))
        if qx is None or str(qx.storage) not in SIXTEEN or qx.axis is not None or qx.block is not None:
            return NoMatch("the input is not a per-tensor 16-bit quantized value")
        shape = m.value("c").shape  # the float op's output: its constants broadcast against it
        got = self._affine(op, ins, xi, shape)
        if isinstance(got, NoMatch):
            return got
        a, b, axis, lo, hi = got
        if self.evaluator is not None and axis is None and EXACT_CHECK:
            differ = self._codes_apart(m, dq, op, qx, qy, a, b, lo, hi)
            if differ:
                return NoMatch(
                    f"the affine map (E1) and the float group give different codes for {differ} of "
                    f"the {1 << 16} input codes: LowerLookup's table computes the float group"
                )
        m.data.update(dq=dq, qx=qx, qy=qy, a=a, b=b, axis=axis, y_min=lo, y_max=hi)
        return m

    def _codes_apart(
        self,
        m: Match,
        dq: Node,
        op: Node,
        qx: QuantType,
        qy: QuantType,
        a: np.ndarray,
        b: np.ndarray,
        lo: float | None,
        hi: float | None,
    ) -> int:
        """How many of the 65536 codes eq. (E1) maps elsewhere than the float group does:
        both computed by the reference kernels (the injected evaluator), the map as a
        detached QLinearAffine16 node over every code."""
        assert self.evaluator is not None and isinstance(qy.storage, IntType)
        table = group_table(self.evaluator, dq, [op], m.root, qx, qy, None)
        attrs: dict[str, object] = {"function": op.op_type}
        if lo is not None:
            attrs["y_min"] = float(lo)
        if hi is not None:
            attrs["y_max"] = float(hi)
        probe = Node("QLinearAffine16", [], [Value("codes")], attrs, domain=QUANTA_DOMAIN)
        zx, zy = dq.input(2), m["zy"]
        (mapped,) = self.evaluator(
            probe,
            [
                lookup_codes(np.dtype(qx.storage.numpy)),  # type: ignore[union-attr]
                np.asarray(dq.input(1).const),
                None if zx is None else np.asarray(zx.const),
                np.asarray(m.const("sy")),
                np.zeros((), qy.storage.numpy) if zy is None else np.asarray(zy.const),
                np.asarray(a, np.float64),
                np.asarray(b, np.float64),
            ],
        )
        return int(np.count_nonzero(np.asarray(mapped) != table))

    @staticmethod
    def _affine(
        op: Node, ins: list[Value | None], xi: int, shape: tuple | None
    ) -> tuple[np.ndarray, np.ndarray, int | None, float | None, float | None] | NoMatch:
        """(a, b, axis, y_min, y_max) of the op as ``clip(a·v + b, y_min, y_max)``."""
        t = op.op_type
        one, zero = np.ones(1), np.zeros(1)
        if t == "BatchNormalization":
            if len(op.outputs) != 1 or int(op.attrs.get("training_mode", 0)):
                return NoMatch("BatchNormalization in training mode")
            vals = [_float_const(v) for v in ins[1:5]]
            if len(vals) != 4 or any(v is None for v in vals):
                return NoMatch("BatchNormalization parameters are not constants")
            scale, bias, mean, var = (np.asarray(v).reshape(-1) for v in vals)  # type: ignore[arg-type]
            if shape is not None and (len(shape) < 2 or not isinstance(shape[1], int)):
                return NoMatch(f"BatchNormalization output of shape {list(shape)}: no channel count")
            eps = float(op.attrs.get("epsilon", 1e-5))
            a = scale / np.sqrt(var + eps)
            b = bias - mean * a
            a, b = np.broadcast_arrays(a, b)
            if shape is not None and a.size not in (1, shape[1]):
                return NoMatch(f"BatchNormalization of {a.size} channels on {shape[1]}")
            return np.ascontiguousarray(a), np.ascontiguousarray(b), (1 if a.size > 1 else None), None, None
        if t in ("Add", "Sub", "Mul", "Div"):
            if xi == 1 and t in ("Sub", "Div"):
                return NoMatch(f"{t} of a constant by the input is not affine in it")
            k = _float_const(ins[1 - xi])
            if k is None:
                return NoMatch(f"{t}'s other operand is not a constant")
            axis = _channel_axis(k, shape)
            if isinstance(axis, NoMatch):
                return axis
            kv = k.reshape(-1)
            if t == "Div" and np.any(kv == 0):
                return NoMatch("Div by zero")
            ones, zeros = np.ones_like(kv), np.zeros_like(kv)
            if t in ("Add", "Sub"):
                return ones, kv if t == "Add" else -kv, axis, None, None
            return (kv if t == "Mul" else 1.0 / kv), zeros, axis, None, None
        if t == "HardSigmoid":
            alpha, beta = float(op.attrs.get("alpha", 0.2)), float(op.attrs.get("beta", 0.5))
            return alpha * one, beta * one, None, 0.0, 1.0
        if t == "Relu":
            return one, zero, None, 0.0, None
        # Clip: bounds from inputs (opset >= 11) or attributes
        lo_v = _float_const(ins[1]) if len(ins) > 1 and ins[1] is not None else None
        hi_v = _float_const(ins[2]) if len(ins) > 2 and ins[2] is not None else None
        if (len(ins) > 1 and ins[1] is not None and lo_v is None) or (
            len(ins) > 2 and ins[2] is not None and hi_v is None
        ):
            return NoMatch("Clip bounds are not constants")
        lo = float(lo_v.reshape(())) if lo_v is not None else op.attrs.get("min")
        hi = float(hi_v.reshape(())) if hi_v is not None else op.attrs.get("max")
        return one, zero, None, None if lo is None else float(lo), None if hi is None else float(hi)

    def rewrite(self, m: Match, b: Builder) -> Value:
        op, dq = m.node("c"), m.data["dq"]
        qx: QuantType = m.data["qx"]
        zx = dq.input(2)
        if zx is None:
            assert isinstance(qx.storage, IntType)
            zx = b.const("x_zero_point", np.zeros((), dtype=qx.storage.numpy))
        attrs: dict[str, object] = {"function": op.op_type}
        if m.data["axis"] is not None:
            attrs["axis"] = int(m.data["axis"])
        if m.data["y_min"] is not None:
            attrs["y_min"] = float(m.data["y_min"])
        if m.data["y_max"] is not None:
            attrs["y_max"] = float(m.data["y_max"])
        name = op.name or op.op_type
        return b.op(
            "QLinearAffine16",
            [
                dq.input(0),
                dq.input(1),
                zx,
                m["sy"],
                _zero_point_or_default(b, m, "zy", m.data["qy"], "y_zero_point"),
                b.const(f"{name}_affine_a", np.asarray(m.data["a"], np.float64)),
                b.const(f"{name}_affine_b", np.asarray(m.data["b"], np.float64)),
            ],
            attrs,
            domain=QUANTA_DOMAIN,
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            name=op.name or None,
        )


class LowerBinary16(Rule):
    """``Q(Add|Mul(DQ(a), DQ(b)))`` with a, b and y of one 16-bit type ->
    ``quanta::QLinearAdd16|QLinearMul16(a, sa, za, b, sb, zb, sy, zy)`` (eqs. (E2), (E3);
    numpy broadcasting, a squeeze-excitation's ``x · s[N, C, 1, 1]``)."""

    pattern = (
        "y = QuantizeLinear(c = Add|Mul(af = DequantizeLinear(a, sa, za?), "
        "bf = DequantizeLinear(bb, sb, zb?)), sy, zy?)"
    )
    shared_ok = frozenset({"af", "bf"})

    def __init__(self, *, tables: bool = False) -> None:
        super().__init__()
        self.tables = tables  # True: a constant operand is LowerLookup's (see LowerAffine16)

    def check(self, m: Match) -> Match | NoMatch:
        bad = _check_consts(m, "sa", "za", "sb", "zb", "sy", "zy")
        if bad is not None:
            return bad
        if self.tables and (_const_codes(m["a"]) is not None or _const_codes(m["bb"]) is not None):
            return NoMatch("a constant operand: LowerLookup's table computes the group as the float group")
        qa = _params(m, "af", "a", "sa", "za")
        qb = _params(m, "bf", "bb", "sb", "zb")
        qy = _params(m, "y", "y", "sy", "zy")
        for q, what in ((qa, "input a"), (qb, "input b"), (qy, "output y")):
            if q is None or str(q.storage) not in SIXTEEN or q.axis is not None or q.block is not None:
                return NoMatch(f"{what} is not a per-tensor 16-bit quantized value")
        assert qa is not None and qb is not None and qy is not None
        if not (qa.storage == qb.storage == qy.storage):
            return NoMatch(f"operands are {qa.storage}, {qb.storage} -> {qy.storage}; the op takes one type")
        m.data.update(qa=qa, qb=qb, qy=qy)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        op = m.node("c")
        return b.op(
            f"QLinear{op.op_type}16",
            [
                m["a"],
                m["sa"],
                _zero_point_or_default(b, m, "za", m.data["qa"], "a_zero_point"),
                m["bb"],
                m["sb"],
                _zero_point_or_default(b, m, "zb", m.data["qb"], "b_zero_point"),
                m["sy"],
                _zero_point_or_default(b, m, "zy", m.data["qy"], "y_zero_point"),
            ],
            domain=QUANTA_DOMAIN,
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            name=op.name or None,
        )


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
