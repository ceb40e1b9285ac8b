"""The integer-only stage: lowered QOperator nodes become ``quanta.int`` operators that
carry their requantization explicitly.

::

    %y = QLinearConv(%x, sx, zx, %w, sw, 0, sy, zy, %b)
      -> %y = quanta.int::IntConv(%x, %w, %c) {multiplier[M], shift[M], rounding, x_zero_point, y_zero_point}
    %y = QLinearMatMul(%a, sa, za, %b, sb, zb, sy, zy)  -> quanta.int::IntMatMul(%a, %b, %c?)
    %y = com.microsoft::QGemm(...)                      -> quanta.int::IntMatMul(%a, %bᵀ, %c)
    %y = com.microsoft::QLinearAdd | QLinearMul(...)    -> quanta.int::IntAdd | IntMul
    %y = quanta::QLinearLookup(%x, ..., %table)         -> quanta.int::IntLookup(%x, %table)
    %y = com.microsoft::QLinearSigmoid | QLinearLeakyRelu(...) -> quanta.int::IntLookup(%x, %table)
    %y = com.microsoft::QLinearSoftmax(%x, ...)         -> quanta.int::IntSoftmax(%x, %E) [-> IntRescale]
    %y = QuantizeLinear(Softmax(DequantizeLinear(%x16)))  -> quanta.int::IntSoftmax(%x16) {exp_x0, exp_b, exp_c, exp_shift} [-> IntRescale]
    %y16 = QuantizeLinear(Gelu(DequantizeLinear(%x16)))   -> quanta.int::IntLookup(%x16, %T513)  (interpolated int16 table)
    %y8 = QuantizeLinear(Gelu(DequantizeLinear(%x16)))    -> quanta.int::IntGelu(%x16) {erf_b, erf_c, pre_shift, multiplier, shift}
    %y = com.microsoft::QLinearGlobalAveragePool(...)   -> quanta.int::IntGlobalAveragePool(%x)
    %y = com.microsoft::QLinearConcat(...)              -> Concat(IntRescale(%x_i)...)
    %y = QuantizeLinear(LayerNormalization(DequantizeLinear(%x), γ, β)) -> quanta.int::IntLayerNorm(%x, %G, %B)
    %y = QuantizeLinear(DequantizeLinear(%x))           -> quanta.int::IntRescale(%x)

Every real-valued quantity is derived here, once, from the float32 scales of the
quantized types (docs/passes.md "Integer-only stage", equations (IO1)-(IO14)); the kernels
(the golden :mod:`quanta.kernels.reference.intonly` and the npu-sim C++ kernels) only
consume the integers. A node that cannot be lowered keeps its form and the reason is
recorded in ``IntegerOnly.refused`` (the npu-sim verifier then names it).

This module may import only ``quanta.ir`` (docs/design.md layers): the derivations are
plain NumPy on the scales.
"""

from __future__ import annotations

import functools
import math
from typing import ClassVar

import numpy as np

from quanta.ir.graph import Graph, Node, Value
from quanta.ir.op_facts import Stage
from quanta.ir.types import I8, I16, QuantType, TensorType
from quanta.passes.manager import Pass, PassResult

__all__ = [
    "EXP_BITS",
    "INT_DOMAIN",
    "IntegerOnly",
    "add_params",
    "exp_poly_params",
    "fixed_point",
    "fixed_points",
    "gelu_poly_params",
    "layer_norm_params",
    "lut16_table",
    "softmax_exp_table",
]

INT_DOMAIN = "quanta.int"
#: the Softmax exp table's fixed-point bits (E[0] = 2^EXP_BITS)
EXP_BITS = 20
#: TFLite's left shift of 8-bit Add inputs (16-bit: 15)
ADD_LEFT_SHIFT = {8: 20, 16: 15}


def fixed_point(m: float) -> tuple[int, int]:
    """(IO2) ``m -> (M, s)`` with ``m ≈ M · 2^(s - 31)``, ``M ∈ [2^30, 2^31)``, as TFLite's
    ``QuantizeMultiplier``: ``m = q · 2^s`` with ``q ∈ [0.5, 1)``, ``M = round_half_away(q · 2^31)``
    (a carry to ``2^31`` halves ``M`` and increments ``s``); ``s < -31`` flushes to
    ``(0, 0)``; ``s > 30`` (``m >= 2^30``) is refused.

    >>> fixed_point(0.5), fixed_point(0.1), fixed_point(3.0)
    ((1073741824, 0), (1717986918, -3), (1610612736, 2))
    """
    m = float(m)
    if not math.isfinite(m) or m < 0:
        raise ValueError(f"requantization multiplier {m} is not a finite value >= 0")
    if m == 0.0:
        return 0, 0
    q, s = math.frexp(m)
    mq = math.floor(q * (1 << 31) + 0.5)
    if mq == 1 << 31:
        mq //= 2
        s += 1
    if s < -31:
        return 0, 0
    if s > 30:
        raise ValueError(f"requantization multiplier {m} is too large for a 32-bit shift")
    return int(mq), int(s)


def fixed_points(m: np.ndarray) -> tuple[list[int], list[int]]:
    """:func:`fixed_point` of every element: ``([M...], [s...])``."""
    pairs = [fixed_point(float(v)) for v in np.asarray(m, np.float64).reshape(-1)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def real_multiplier(*num: np.ndarray | float, den: np.ndarray | float) -> np.ndarray:
    """(IO1) ``m = Π num / den`` in float64 from the float32 scales (TFLite's derivation:
    the scales are exact float32 values, their product and quotient are rounded once)."""
    out = np.asarray(1.0, np.float64)
    for v in num:
        out = out * np.asarray(v, np.float32).astype(np.float64)
    return out / np.asarray(den, np.float32).astype(np.float64)


def add_params(sa: float, sb: float, sy: float, bits: int = 8) -> dict[str, int]:
    """(IO5) TFLite's integer Add: ``L``, input multipliers ``sa/2max``, ``sb/2max`` and
    the output multiplier ``2max / (2^L · sy)`` with ``max = max(sa, sb)``."""
    left = ADD_LEFT_SHIFT[16 if bits > 8 else 8]
    sa64, sb64, sy64 = (float(np.float32(v)) for v in (sa, sb, sy))
    twice_max = 2.0 * max(sa64, sb64)
    am, ash = fixed_point(sa64 / twice_max)
    bm, bsh = fixed_point(sb64 / twice_max)
    m, sh = fixed_point(twice_max / ((1 << left) * sy64))
    return {
        "left_shift": left,
        "a_multiplier": am,
        "a_shift": ash,
        "b_multiplier": bm,
        "b_shift": bsh,
        "multiplier": m,
        "shift": sh,
    }


def softmax_exp_table(sx: float) -> np.ndarray:
    """(IO7) ``E[j] = round(2^20 · exp(-sx · j))`` for ``j = max - x ∈ [0, 255]`` (int32)."""
    j = np.arange(256, dtype=np.float64)
    return np.rint(np.exp(-float(np.float32(sx)) * j) * (1 << EXP_BITS)).astype(np.int32)


#: I-BERT's second-order polynomials (Kim et al., "I-BERT: Integer-only BERT
#: Quantization", ICML 2021, §3.4-3.5): exp(r) ≈ A·(r + B)² + C on (-ln2, 0], and
#: erf(t) ≈ sign(t)·(1 - A'·(B' - min(|t|, B'))²)
IEXP_A, IEXP_B, IEXP_C = 0.3585, 1.353, 0.344
IERF_A, IERF_B = 0.2888, 1.769


def exp_poly_params(sx: float) -> dict[str, int]:
    """(IO12) I-BERT's i-exp constants for an input of scale ``sx``: ``exp_x0 =
    -round(ln2/sx)``, ``exp_b = floor(B/sx)``, ``exp_c = floor(C/(A·sx²))`` and
    ``exp_shift = 30 - bits(exp_b² + exp_c)`` (the polynomial's largest value, at 0,
    becomes a 30-bit integer)."""
    s = float(np.float32(sx))
    ln2 = max(1, round(math.log(2.0) / s))
    b = math.floor(IEXP_B / s)
    c = math.floor(IEXP_C / (IEXP_A * s * s))
    if b * b + c >= 1 << 62:
        raise ValueError(f"Softmax input scale {s:.3g} is too fine for a 64-bit exp polynomial")
    return {"exp_x0": -ln2, "exp_b": b, "exp_c": c, "exp_shift": 30 - (b * b + c).bit_length()}


def gelu_poly_params(sx: float, zx: int, sy: float, zy: int, rounding: str, bits: int = 16) -> dict:
    """(IO13) I-BERT's i-GELU constants for a ``bits``-bit input (scale ``sx``, zero point
    ``zx``) and the output (``sy``, ``zy``): ``erf_b = floor(B'/se)``, ``erf_c =
    floor(1/(A'·se²))`` with ``se = sx/√2``; ``pre_shift`` brings the largest ``|q| <=
    max|x - zx| · 2·erf_c`` into 30 bits; the multiplier is ``sx·A'·se²·2^t / (2·sy)``."""
    s = float(np.float32(sx))
    se = s / math.sqrt(2.0)
    b = max(1, math.floor(IERF_B / se))
    c = max(b * b, math.floor(1.0 / (IERF_A * se * se)))
    dmax = max(abs(-(1 << (bits - 1)) - zx), abs((1 << (bits - 1)) - 1 - zx))
    t = max(0, (dmax * 2 * c).bit_length() - 30)
    if t > 62:
        raise ValueError(f"GELU input scale {s:.3g} is too fine for a 64-bit erf polynomial")
    m, sh = fixed_point(s * IERF_A * se * se * 2.0**t / (2.0 * float(np.float32(sy))))
    return {
        "x_zero_point": int(zx),
        "erf_b": b,
        "erf_c": c,
        "pre_shift": t,
        "multiplier": m,
        "shift": sh,
        "y_zero_point": int(zy),
        "rounding": rounding,
    }


def lut16_table(f, sx: float, zx: int, sy: float, zy: int) -> np.ndarray:
    """(IO14) TFLite's int16 lookup table of ``f`` for an int16 input (``sx``, ``zx``) and
    an int16 output (``sy``, ``zy``): 513 samples ``f(DQ(-32768 + 128·i))``, ``i ∈ [0,
    512]`` (the last one past the range, for the slope), in output codes, each moved by
    half the interpolation error at the midpoint of its step (TFLite's ``LUTPopulate``):
    the kernel's linear interpolation then errs on both sides of ``f`` instead of one."""
    s, o = float(np.float32(sx)), float(np.float32(sy))
    codes = -32768.0 + 128.0 * np.arange(513, dtype=np.float64)
    val = f((codes - zx) * s) / o
    mid = f((codes[:-1] + 64.0 - zx) * s) / o
    sample = np.rint(val)
    interp = np.rint((val[1:] + sample[:-1]) / 2.0)
    bias = np.rint((interp - np.rint(mid)) / 2.0)
    table = sample.copy()
    table[:-1] -= bias
    return np.clip(table + zy, -32768, 32767).astype(np.int16)


def layer_norm_params(
    gamma: np.ndarray, beta: np.ndarray, sx: float, sy: float, eps: float, n: int
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(IO8) ``G = round(γ/sy · 2^g)``, ``B = round(β/sy · 2^g)`` (int32) with the largest
    ``g <= 31`` that keeps them below ``2^30``; ``eps_int = round(ε · n³ / sx²)``."""
    sy64 = float(np.float32(sy))
    g64 = np.asarray(gamma, np.float64) / sy64
    b64 = np.asarray(beta, np.float64) / sy64
    peak = max(float(np.abs(g64).max(initial=0.0)), float(np.abs(b64).max(initial=0.0)), 2.0**-31)
    g = int(min(31, max(0, math.floor(30 - math.log2(peak)) - 1)))
    G = np.rint(g64 * 2.0**g).astype(np.int64)
    B = np.rint(b64 * 2.0**g).astype(np.int64)
    if np.abs(G).max(initial=0) >= 1 << 31 or np.abs(B).max(initial=0) >= 1 << 31:
        raise ValueError(f"LayerNormalization: γ/sy or β/sy ({peak:.3g}) does not fit int32")
    sx64 = float(np.float32(sx))
    eps_int = min(round(float(eps) * float(n) ** 3 / (sx64 * sx64)), 1 << 62)
    return G.astype(np.int32), B.astype(np.int32), g, eps_int


def _gelu(x: np.ndarray, attrs: dict) -> np.ndarray:
    if attrs.get("approximate", "none") == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    from math import erf

    return 0.5 * x * (1.0 + np.vectorize(erf)(x / math.sqrt(2.0)))


#: elementwise functions IntegerOnly tabulates itself (float64, at compile time)
TABLE_FUNCTIONS = {"Gelu": _gelu}


# --------------------------------------------------------------------------------------


def _const(v: Value | None) -> np.ndarray | None:
    return None if v is None or v.const is None else np.asarray(v.const)


def _scalar(v: Value | None, default: float | int | None = None) -> float | int | None:
    a = _const(v)
    if a is None:
        return default
    if a.size != 1:
        return None
    return a.reshape(()).item()


def _all_dequantized(node: Node) -> bool:
    return all(
        v is not None
        and v.producer is not None
        and v.producer.op_type == "DequantizeLinear"
        and not v.producer.domain
        for v in node.inputs
    )


def _qtype(v: Value | None) -> QuantType | None:
    if v is None or v.type is None or not isinstance(v.type.elem, QuantType):
        return None
    return v.type.elem


def _storage_name(v: Value) -> str:
    return {"i8": "int8", "u8": "uint8", "i16": "int16", "u16": "uint16"}[str(v.type.elem.storage)]


class Refusal(str):
    """A reason a node stays in its QOperator form."""


class IntegerOnly(Pass):
    """Lower QOperator nodes to the ``quanta.int`` integer-only stage (module docstring).

    ``rounding`` is the requantization mode every node carries ("double": TFLite,
    "single": TFLite single rounding, "tosa": TOSA apply_scale with double_round)."""

    produces_stage: ClassVar[Stage | None] = Stage.LOWERED

    def __init__(self, rounding: str = "double") -> None:
        if rounding not in ("double", "single", "tosa"):
            raise ValueError(f"rounding: expected 'double', 'single' or 'tosa', got {rounding!r}")
        self.rounding = rounding
        self.refused: list[tuple[str, str]] = []

    # -- graph surgery ------------------------------------------------------------
    def _replace(self, graph: Graph, old: Node, op: str, inputs: list[Value | None], attrs: dict) -> Node:
        """Put ``quanta.int::op`` in ``old``'s place, keeping its output values."""
        idx = graph.nodes.index(old)
        for i, v in enumerate(old.inputs):
            if v is not None:
                v.uses.remove((old, i))
        graph.nodes.pop(idx)
        outs = list(old.outputs)
        for v in outs:
            v.producer = None
        new = Node(op, inputs, outs[:1], attrs, name=old.name, domain=INT_DOMAIN)
        graph.add_node(new, before=graph.nodes[idx] if idx < len(graph.nodes) else None)
        return new

    def _init(self, graph: Graph, base: str, array: np.ndarray) -> Value:
        return graph.add_initializer(graph.fresh_name(base), array)

    def _rescale_attrs(self, s_in: float, z_in: int, s_out: float, z_out: int, out_type: str) -> dict:
        m, sh = fixed_point(float(real_multiplier(s_in, den=s_out)))  # (IO10)
        return {
            "input_zero_point": int(z_in),
            "output_zero_point": int(z_out),
            "multiplier": [m],
            "shift": [sh],
            "rounding": self.rounding,
            "out_type": out_type,
        }

    # -- the pass -----------------------------------------------------------------
    def call(self, graph: Graph) -> PassResult:
        self.refused = []
        stats: dict[str, int] = {}
        handlers = {
            ("", "QLinearConv"): self._conv,
            ("", "QLinearMatMul"): self._matmul,
            ("com.microsoft", "QGemm"): self._gemm,
            ("com.microsoft", "QLinearAdd"): self._add,
            ("com.microsoft", "QLinearMul"): self._mul,
            ("quanta", "QLinearLookup"): self._lookup,
            ("com.microsoft", "QLinearSigmoid"): self._sigmoid,
            ("com.microsoft", "QLinearSoftmax"): self._softmax,
            ("com.microsoft", "QLinearGlobalAveragePool"): self._gap,
            ("com.microsoft", "QLinearConcat"): self._concat,
            ("", "LayerNormalization"): self._layer_norm,
            ("", "QuantizeLinear"): self._requantize,
        }
        for node in list(graph.nodes):
            if node not in graph.nodes:  # consumed by an earlier rewrite
                continue
            h = handlers.get((node.domain, node.op_type))
            if h is None:
                continue
            try:
                reason = h(graph, node)
            except ValueError as e:
                reason = str(e)
            if reason:
                self.refused.append((node.label, reason))
                key = f"refused {node.op_type}"
            else:
                key = f"lowered {node.op_type}"
            stats[key] = stats.get(key, 0) + 1
        # Shape(DQ(x)) reads only the shape: Shape(x) keeps the dequantization off the host
        for node in graph.nodes:
            x = node.input(0)
            if node.op_type == "Shape" and not node.domain and x is not None and x.producer is not None:
                dq = x.producer
                if dq.op_type == "DequantizeLinear" and not dq.domain:
                    node.replace_input(0, dq.inputs[0])
                    stats["Shape reads the integers"] = stats.get("Shape reads the integers", 0) + 1
        graph.remove_unused_initializers()
        return PassResult(graph, any(k.startswith("lowered") for k in stats), stats)

    # -- per operator ---------------------------------------------------------------
    def _act(self, v: Value | None, what: str) -> tuple[float, int] | str:
        q = _qtype(v)
        if q is None:
            return f"{what} is not quantized"
        if q.axis is not None:
            return f"{what} is quantized per axis (activations are per tensor on the device)"
        if str(q.storage) not in ("i8", "u8", "i16"):
            return f"{what} is {q.storage}, not an 8- or 16-bit integer"
        return float(q.scale[0]), int(q.zero_point[0])

    def _conv(self, graph: Graph, node: Node) -> str | None:
        if "output_clamp" in node.attrs:  # npu_pipeline leaves FoldCodeClampPass out
            return "the QLinearConv clamps its codes (output_clamp): IntConv has no clamp"
        x, w, b = node.inputs[0], node.inputs[3], node.input(8)
        px = self._act(x, "x")
        py = self._act(node.outputs[0], "y")
        if isinstance(px, str) or isinstance(py, str):
            return px if isinstance(px, str) else py
        wq = _const(w)
        sw = _const(node.inputs[4])
        zw = _const(node.inputs[5])
        if wq is None or sw is None or wq.dtype != np.int8:
            return "weights are not a constant int8 tensor"
        if zw is not None and np.any(zw != 0):
            return "weights are not symmetric (zero point != 0)"
        sx, zx = px
        sy, zy = py
        m_out = wq.shape[0]
        bias = np.zeros(m_out, np.int64) if b is None else _const(b)
        if bias is None:
            return "bias is not a constant"
        colsum = wq.reshape(m_out, -1).astype(np.int64).sum(axis=1)
        c = bias.astype(np.int64) - zx * colsum  # (IO4)
        if np.abs(c).max(initial=0) >= 1 << 31:
            return "bias - zx·Σw does not fit int32"
        mult, shift = fixed_points(np.broadcast_to(real_multiplier(sx, sw.reshape(-1), den=sy), (m_out,)))
        attrs = {
            k: v
            for k, v in node.attrs.items()
            if k in ("kernel_shape", "strides", "pads", "dilations", "group", "auto_pad")
        }
        attrs.update(
            x_zero_point=zx,
            y_zero_point=zy,
            multiplier=mult,
            shift=shift,
            rounding=self.rounding,
            out_type=_storage_name(node.outputs[0]),
        )
        cv = self._init(graph, f"{node.name or 'conv'}_c", c.astype(np.int32))
        self._replace(graph, node, "IntConv", [x, w, cv], attrs)
        return None

    def _mm_common(
        self,
        graph: Graph,
        node: Node,
        a: Value,
        b_val: Value | None,
        b_const: np.ndarray | None,
        sb: np.ndarray,
        zb: np.ndarray | None,
        bias: np.ndarray | None,
    ) -> str | None:
        pa = self._act(a, "a")
        py = self._act(node.outputs[0], "y")
        if isinstance(pa, str) or isinstance(py, str):
            return pa if isinstance(pa, str) else py
        sa, za = pa
        sy, zy = py
        attrs = {
            "a_zero_point": za,
            "y_zero_point": zy,
            "rounding": self.rounding,
            "out_type": _storage_name(node.outputs[0]),
        }
        if b_const is not None:
            if b_const.dtype != np.int8 or b_const.ndim != 2:
                return "B is not a 2-D constant int8 matrix"
            if zb is not None and np.any(zb != 0):
                return "B is not symmetric (zero point != 0)"
            n = b_const.shape[1]
            mult, shift = fixed_points(np.broadcast_to(real_multiplier(sa, sb.reshape(-1), den=sy), (n,)))
            c = -za * b_const.astype(np.int64).sum(axis=0)  # (IO4), zb = 0
            if bias is not None:
                c = c + bias.astype(np.int64)
            if np.abs(c).max(initial=0) >= 1 << 31:
                return "bias - za·Σb does not fit int32"
            attrs.update(b_zero_point=0, multiplier=mult, shift=shift)
            bv = self._init(graph, f"{node.name or 'matmul'}_b", b_const) if b_val is None else b_val
            cv = self._init(graph, f"{node.name or 'matmul'}_c", c.astype(np.int32))
            self._replace(graph, node, "IntMatMul", [a, bv, cv], attrs)
            return None
        pb = self._act(b_val, "b")
        if isinstance(pb, str):
            return pb
        if bias is not None:
            return "a bias with two activation operands"
        mult, shift = fixed_points(real_multiplier(sa, pb[0], den=sy))
        attrs.update(b_zero_point=pb[1], multiplier=mult, shift=shift)
        self._replace(graph, node, "IntMatMul", [a, b_val], attrs)
        return None

    def _matmul(self, graph: Graph, node: Node) -> str | None:
        a, b = node.inputs[0], node.inputs[3]
        bc = _const(b)
        sb = _const(node.inputs[4])
        if sb is None:
            return "b_scale is not a constant"
        return self._mm_common(graph, node, a, b, bc, sb, _const(node.inputs[5]), None)

    def _gemm(self, graph: Graph, node: Node) -> str | None:
        if node.attrs.get("transA", 0) or float(node.attrs.get("alpha", 1.0)) != 1.0:
            return "transA or alpha != 1"
        if len(node.inputs) < 8 or node.input(7) is None:
            return "float output (no y_scale)"
        a, b = node.inputs[0], node.inputs[3]
        bc = _const(b)
        sb = _const(node.inputs[4])
        if bc is None or sb is None:
            return "B is not a constant"
        if node.attrs.get("transB", 0):
            bc = np.ascontiguousarray(bc.T)
            b = None
        bias = _const(node.input(6))
        if node.input(6) is not None and (bias is None or bias.dtype != np.int32):
            return "C is not a constant int32 bias"
        return self._mm_common(graph, node, a, b, bc, sb, _const(node.inputs[5]), bias)

    def _binary_params(self, node: Node) -> tuple | str:
        pa = self._act(node.inputs[0], "A")
        pb = self._act(node.inputs[3], "B")
        py = self._act(node.outputs[0], "C")
        for p in (pa, pb, py):
            if isinstance(p, str):
                return p
        return pa, pb, py

    def _add(self, graph: Graph, node: Node) -> str | None:
        p = self._binary_params(node)
        if isinstance(p, str):
            return p
        (sa, za), (sb, zb), (sy, zy) = p
        bits = node.outputs[0].type.elem.storage.bits
        attrs = add_params(sa, sb, sy, bits)
        attrs.update(
            a_zero_point=za,
            b_zero_point=zb,
            y_zero_point=zy,
            rounding=self.rounding,
            out_type=_storage_name(node.outputs[0]),
        )
        attrs["multiplier"], attrs["shift"] = [attrs["multiplier"]], [attrs["shift"]]
        self._replace(graph, node, "IntAdd", [node.inputs[0], node.inputs[3]], attrs)
        return None

    def _mul(self, graph: Graph, node: Node) -> str | None:
        p = self._binary_params(node)
        if isinstance(p, str):
            return p
        (sa, za), (sb, zb), (sy, zy) = p
        m, sh = fixed_point(float(real_multiplier(sa, sb, den=sy)))  # (IO6)
        attrs = {
            "a_zero_point": za,
            "b_zero_point": zb,
            "y_zero_point": zy,
            "multiplier": [m],
            "shift": [sh],
            "rounding": self.rounding,
            "out_type": _storage_name(node.outputs[0]),
        }
        self._replace(graph, node, "IntMul", [node.inputs[0], node.inputs[3]], attrs)
        return None

    def _lookup(self, graph: Graph, node: Node) -> str | None:
        table = node.inputs[5]
        if _const(table) is None:
            return "table is not a constant"
        if node.attrs.get("axis") is not None:
            return "a table per channel (IntLookup holds one table)"
        self._replace(
            graph, node, "IntLookup", [node.inputs[0], table], {"function": node.attrs.get("function", "")}
        )
        return None

    def _sigmoid(self, graph: Graph, node: Node) -> str | None:
        px = self._act(node.inputs[0], "X")
        py = self._act(node.outputs[0], "Y")
        if isinstance(px, str) or isinstance(py, str):
            return px if isinstance(px, str) else py
        dt = node.inputs[0].type.elem.storage.numpy
        if dt.itemsize != 1 or node.outputs[0].type.elem.storage.numpy != dt:
            return "not an 8-bit table"
        codes = np.arange(256, dtype=np.uint8).view(dt).astype(np.float64)
        real = (codes - px[1]) * px[0]
        f = 1.0 / (1.0 + np.exp(-real))
        info = np.iinfo(dt)
        table = np.clip(np.rint(f / py[0]) + py[1], info.min, info.max).astype(dt)
        tv = self._init(graph, f"{node.name or 'sigmoid'}_table", table)
        self._replace(graph, node, "IntLookup", [node.inputs[0], tv], {"function": "Sigmoid"})
        return None

    def _softmax(self, graph: Graph, node: Node) -> str | None:
        px = self._act(node.inputs[0], "X")
        py = self._act(node.outputs[0], "Y")
        if isinstance(px, str) or isinstance(py, str):
            return px if isinstance(px, str) else py
        if node.attrs.get("opset", 13) < 13:
            return "opset < 13 (2-D coercion)"
        x = node.inputs[0]
        if x.type.elem.storage.bits != 8:
            return "input is not 8-bit"
        table = self._init(graph, f"{node.name or 'softmax'}_exp", softmax_exp_table(px[0]))
        self._emit_softmax(graph, node, [x, table], int(node.attrs.get("axis", -1)), {}, node.outputs[0], py)
        return None

    def _wide_softmax(self, graph: Graph, q: Node, sm: Node) -> str | None:
        """``Q(Softmax(DQ(x)))`` with a 16-bit ``x`` (no 256-entry table covers it): I-BERT's
        i-exp polynomial (eq. (IO12)) in IntSoftmax."""
        group = self._unary_group(graph, q, sm)
        if isinstance(group, str):
            return group
        dq, xi, px, py = group
        if xi.type.elem.storage.bits != 16:
            return "input is not 16-bit (8-bit inputs lower through QLinearSoftmax's table)"
        axis = int(sm.attrs.get("axis", -1))
        q.replace_input(0, None)
        graph.remove_node(sm)
        graph.remove_node(dq)
        self._emit_softmax(graph, q, [xi], axis, exp_poly_params(px[0]), q.outputs[0], py)
        return None

    def _emit_softmax(
        self,
        graph: Graph,
        node: Node,
        inputs: list[Value | None],
        axis: int,
        poly: dict,
        out: Value,
        py: tuple[float, int],
    ) -> None:
        """IntSoftmax (scale 2^-8, zero point -128; a 16-bit ``out``: 2^-15, 0) in ``node``'s
        place, followed by an IntRescale when ``out`` has other parameters."""
        sy, zy = py
        wide = out.type.elem.storage.bits == 16
        k, z0, store, name = (15, 0, I16, "int16") if wide else (8, -128, I8, "int8")
        attrs = {"axis": axis, "y_shift": k, "y_zero_point": z0, "out_type": name, **poly}
        if out.type.elem.storage.numpy == store.numpy and sy == 2.0**-k and zy == z0:
            self._replace(graph, node, "IntSoftmax", inputs, attrs)
            return
        # the integer softmax writes scale 2^-k, zero point z0; a Rescale gives the output type
        mid_type = TensorType(
            QuantType(store, out.type.elem.expressed, (2.0**-k,), (z0,)),
            out.type.shape,
        )
        mid = Value(graph.fresh_name(f"{out.name}_int"), mid_type)
        sm = Node(
            "IntSoftmax",
            inputs,
            [mid],
            attrs,
            name=graph.fresh_name(f"{node.name}_int"),
            domain=INT_DOMAIN,
        )
        graph.add_node(sm, before=node)
        self._replace(
            graph, node, "IntRescale", [mid], self._rescale_attrs(2.0**-k, z0, sy, zy, _storage_name(out))
        )

    def _gap(self, graph: Graph, node: Node) -> str | None:
        if node.attrs.get("channels_last", 0):
            return "channels_last layout"
        px = self._act(node.inputs[0], "X")
        py = self._act(node.outputs[0], "Y")
        if isinstance(px, str) or isinstance(py, str):
            return px if isinstance(px, str) else py
        shape = node.inputs[0].shape
        if shape is None or any(not isinstance(d, int) for d in shape[2:]):
            return "spatial size unknown at compile time"
        area = int(np.prod(shape[2:]))
        m, sh = fixed_point(float(real_multiplier(px[0], den=py[0] * area)))  # (IO9)
        attrs = {
            "x_zero_point": px[1],
            "y_zero_point": py[1],
            "multiplier": [m],
            "shift": [sh],
            "rounding": self.rounding,
            "out_type": _storage_name(node.outputs[0]),
        }
        self._replace(graph, node, "IntGlobalAveragePool", [node.inputs[0]], attrs)
        return None

    def _concat(self, graph: Graph, node: Node) -> str | None:
        py = self._act(node.outputs[0], "Y")
        if isinstance(py, str):
            return py
        sy, zy = py
        out_type = _storage_name(node.outputs[0])
        ins: list[Value] = []
        for k in range(2, len(node.inputs), 3):
            x = node.inputs[k]
            px = self._act(x, f"input {k}")
            if isinstance(px, str):
                return px
            if px == (sy, zy) and _storage_name(x) == out_type:
                ins.append(x)
                continue
            rv = Value(graph.fresh_name(f"{x.name}_rescaled"), TensorType(node.outputs[0].type.elem, x.shape))
            graph.add_node(
                Node(
                    "IntRescale",
                    [x],
                    [rv],
                    self._rescale_attrs(px[0], px[1], sy, zy, out_type),
                    name=graph.fresh_name(f"{node.name}_rescale"),
                    domain=INT_DOMAIN,
                ),
                before=node,
            )
            ins.append(rv)
        idx = graph.nodes.index(node)
        for i, v in enumerate(node.inputs):
            if v is not None:
                v.uses.remove((node, i))
        graph.nodes.pop(idx)
        out = node.outputs[0]
        out.producer = None
        graph.add_node(
            Node("Concat", ins, [out], {"axis": node.attrs.get("axis", 0)}, name=node.name),
            before=graph.nodes[idx] if idx < len(graph.nodes) else None,
        )
        return None

    def _layer_norm(self, graph: Graph, node: Node) -> str | None:
        x = node.inputs[0]
        dq = x.producer if x is not None else None
        if dq is None or dq.op_type != "DequantizeLinear" or dq.domain:
            return "input is not dequantized from an integer tensor"
        users = node.outputs[0].consumers()
        if (
            len(users) != 1
            or users[0].op_type != "QuantizeLinear"
            or any(o is node.outputs[0] for o in graph.outputs)
        ):
            return "output is not quantized (one QuantizeLinear consumer)"
        q = users[0]
        if len(node.outputs) > 1 and any(o.uses for o in node.outputs[1:]):
            return "mean / inv_std outputs are used"
        xi = dq.inputs[0]
        px = self._act(xi, "x")
        py = self._act(q.outputs[0], "y")
        if isinstance(px, str) or isinstance(py, str):
            return px if isinstance(px, str) else py
        axis = int(node.attrs.get("axis", -1))
        shape = xi.shape
        if shape is None or axis not in (-1, len(shape) - 1) or not isinstance(shape[-1], int):
            return "normalizes other than the last axis, or its size is unknown"
        n = int(shape[-1])
        gamma = _const(node.inputs[1])
        beta = _const(node.input(2)) if node.input(2) is not None else np.zeros(n, np.float32)
        if gamma is None or beta is None:
            return "scale or bias is not a constant"
        gamma = np.broadcast_to(gamma.astype(np.float64).reshape(-1), (n,))
        beta = np.broadcast_to(beta.astype(np.float64).reshape(-1), (n,))
        G, B, g, eps = layer_norm_params(gamma, beta, px[0], py[0], float(node.attrs.get("epsilon", 1e-5)), n)
        gv = self._init(graph, f"{node.name or 'ln'}_G", G)
        bv = self._init(graph, f"{node.name or 'ln'}_B", B)
        attrs = {
            "x_zero_point": px[1],
            "y_zero_point": py[1],
            "eps": eps,
            "gamma_shift": g,
            "out_type": _storage_name(q.outputs[0]),
        }
        # Q takes the integer node's place; LN (and DQ when nothing else reads it) go
        for o in node.outputs:
            o.uses = [u for u in o.uses if u[0] is not q]
        q.inputs[0] = None
        graph.remove_node(node)
        if not dq.outputs[0].uses and not any(o is dq.outputs[0] for o in graph.outputs):
            graph.remove_node(dq)
        self._replace(graph, q, "IntLayerNorm", [xi, gv, bv], attrs)
        return None

    def _group(self, graph: Graph, q: Node, op: Node) -> str | None:
        """``Q(MatMul|Add|Mul(DQ(a), DQ(b)))`` the QOperator rules left (a 16-bit operand:
        QLinearMatMul and QLinearAdd are 8-bit only): the same integer operators."""
        out = op.outputs[0]
        if len(out.uses) != 1 or any(o is out for o in graph.outputs):
            return "the float result has other readers"
        bias = None
        if op.op_type == "Gemm":
            if (
                op.attrs.get("transA", 0)
                or float(op.attrs.get("alpha", 1.0)) != 1.0
                or float(op.attrs.get("beta", 1.0)) != 1.0
            ):
                return "Gemm with transA, alpha or beta != 1"
            bv = op.input(2)
            if bv is not None:
                bp = bv.producer
                bias = _const(bp.inputs[0]) if bp is not None and bp.op_type == "DequantizeLinear" else None
                if bias is None or bias.dtype != np.int32 or bias.ndim != 1:
                    return "the Gemm bias is not an int32 constant"
        elif len(op.inputs) != 2:
            return "not a binary operator"
        dqs = []
        for v in op.inputs[:2]:
            p = v.producer if v is not None else None
            if p is None and v is not None and v.const is not None:
                return "an operand is a float constant"
            if p is None or p.op_type != "DequantizeLinear" or p.domain:
                return "an operand is not dequantized"
            dqs.append(p)
        a, b = dqs[0].inputs[0], dqs[1].inputs[0]
        py = self._act(q.outputs[0], "y")
        if isinstance(py, str):
            return py
        if op.op_type in ("MatMul", "Gemm"):
            bc = _const(b)
            pa = self._act(a, "a")
            if isinstance(pa, str):
                return pa
            if op.op_type == "Gemm" and bc is None:
                return "the Gemm's B is not a constant"
            if bc is not None:
                sb, zb = _const(dqs[1].inputs[1]), _const(dqs[1].input(2))
                if sb is None:
                    return "b's scale is not a constant"
                if op.op_type == "Gemm" and op.attrs.get("transB", 0):
                    bc = np.ascontiguousarray(bc.T)
                    b = self._init(graph, f"{op.name or 'gemm'}_bT", bc)
                attrs = self._matmul_const_attrs(pa, py, bc, sb, zb, bias, q.outputs[0])
            else:
                pb = self._act(b, "b")
                if isinstance(pb, str):
                    return pb
                attrs = self._matmul_act_attrs(pa, pb, py, q.outputs[0])
            if isinstance(attrs, str):
                return attrs
            attrs, c = attrs
            ins = [a, b] if c is None else [a, b, self._init(graph, f"{op.name or 'matmul'}_c", c)]
            new_op = "IntMatMul"
        else:
            pa, pb = self._act(a, "A"), self._act(b, "B")
            if isinstance(pa, str) or isinstance(pb, str):
                return pa if isinstance(pa, str) else pb
            attrs = self._binary_attrs(op.op_type, pa, pb, py, [a, b, q.outputs[0]])
            ins = [a, b]
            new_op = "IntAdd" if op.op_type == "Add" else "IntMul"
        q.replace_input(0, None)
        graph.remove_node(op)
        if bias is not None:
            dqs.append(op.inputs[2].producer)
        for d in dqs:
            if (
                d in graph.nodes
                and not d.outputs[0].uses
                and not any(o is d.outputs[0] for o in graph.outputs)
            ):
                graph.remove_node(d)
        self._replace(graph, q, new_op, ins, attrs)
        return None

    def _matmul_const_attrs(self, pa, py, bc, sb, zb, bias, y: Value):
        if bc.dtype != np.int8 or bc.ndim != 2:
            return "B is not a 2-D constant int8 matrix"
        if zb is not None and np.any(zb != 0):
            return "B is not symmetric (zero point != 0)"
        n = bc.shape[1]
        mult, shift = fixed_points(
            np.broadcast_to(real_multiplier(pa[0], np.asarray(sb).reshape(-1), den=py[0]), (n,))
        )
        c = -pa[1] * bc.astype(np.int64).sum(axis=0)  # (IO4), zb = 0
        if bias is not None:
            c = c + bias.astype(np.int64)
        if np.abs(c).max(initial=0) >= 1 << 31:
            return "bias - za·Σb does not fit int32"
        attrs = {
            "a_zero_point": pa[1],
            "b_zero_point": 0,
            "y_zero_point": py[1],
            "multiplier": mult,
            "shift": shift,
            "rounding": self.rounding,
            "out_type": _storage_name(y),
        }
        return attrs, c.astype(np.int32)

    def _matmul_act_attrs(self, pa, pb, py, y: Value):
        mult, shift = fixed_points(real_multiplier(pa[0], pb[0], den=py[0]))
        attrs = {
            "a_zero_point": pa[1],
            "b_zero_point": pb[1],
            "y_zero_point": py[1],
            "multiplier": mult,
            "shift": shift,
            "rounding": self.rounding,
            "out_type": _storage_name(y),
        }
        return attrs, None

    def _binary_attrs(self, op: str, pa, pb, py, values: list[Value]) -> dict:
        bits = max(v.type.elem.storage.bits for v in values)
        if op == "Add":
            attrs = add_params(pa[0], pb[0], py[0], bits)
            attrs["multiplier"], attrs["shift"] = [attrs["multiplier"]], [attrs["shift"]]
        else:
            m, sh = fixed_point(float(real_multiplier(pa[0], pb[0], den=py[0])))  # (IO6)
            attrs = {"multiplier": [m], "shift": [sh]}
        attrs.update(
            a_zero_point=pa[1],
            b_zero_point=pb[1],
            y_zero_point=py[1],
            rounding=self.rounding,
            out_type=_storage_name(values[-1]),
        )
        return attrs

    def _unary_group(self, graph: Graph, q: Node, fn: Node) -> tuple | str:
        """``Q(fn(DQ(x)))`` with nothing else reading the float values: ``(dq, x, (sx, zx),
        (sy, zy))``, or why not."""
        x = fn.inputs[0]
        dq = x.producer if x is not None else None
        if dq is None or dq.op_type != "DequantizeLinear" or dq.domain or len(x.uses) != 1:
            return f"input is not a dequantized integer tensor read by the {fn.op_type} alone"
        if len(fn.outputs[0].uses) != 1 or any(o is fn.outputs[0] for o in graph.outputs):
            return f"the {fn.op_type}'s float output has other readers"
        xi = dq.inputs[0]
        px = self._act(xi, "x")
        py = self._act(q.outputs[0], "y")
        if isinstance(px, str) or isinstance(py, str):
            return px if isinstance(px, str) else py
        return dq, xi, px, py

    def _table(self, graph: Graph, q: Node, fn: Node) -> str | None:
        """``Q(f(DQ(x)))`` for an 8-bit ``x`` and an elementwise ``f`` the planner quantized
        as one unary op (GELU of any domain; the output may be wider than 8 bits, which
        LowerLookup's same-storage tables do not cover): ``table[bits(c)] =
        Q(f(DQ(c)))`` computed in float64 (IO11). An int16 ``x`` with an int16 output
        gets TFLite's 513-entry interpolated table (IO14); an int16 GELU input with
        another output type, I-BERT's i-GELU polynomial (IO13)."""
        group = self._unary_group(graph, q, fn)
        if isinstance(group, str):
            return group
        dq, xi, px, py = group
        xdt = xi.type.elem.storage.numpy
        ydt = q.outputs[0].type.elem.storage.numpy
        if xdt == np.dtype(np.int16) and ydt == np.dtype(np.int16):
            # (IO14): 513 samples and linear interpolation (TFLite's int16 tables): the
            # error is the interpolation's, below one output step for GELU, where I-BERT's
            # erf polynomial is off by up to 0.018
            f16 = functools.partial(TABLE_FUNCTIONS[fn.op_type], attrs=fn.attrs)
            table = lut16_table(f16, px[0], px[1], py[0], py[1])
            tv = self._init(graph, f"{fn.name or fn.op_type}_table", table)
            q.replace_input(0, None)
            graph.remove_node(fn)
            graph.remove_node(dq)
            self._replace(graph, q, "IntLookup", [xi, tv], {"function": fn.op_type})
            return None
        if xdt.itemsize != 1:
            if fn.op_type != "Gelu" or xdt != np.dtype(np.int16):
                return "input is wider than 8 bits (a table has 256 entries)"
            attrs = gelu_poly_params(px[0], px[1], py[0], py[1], self.rounding)
            attrs["out_type"] = _storage_name(q.outputs[0])
            q.replace_input(0, None)
            graph.remove_node(fn)
            graph.remove_node(dq)
            self._replace(graph, q, "IntGelu", [xi], attrs)  # (IO13): I-BERT's i-GELU
            return None
        codes = np.arange(256, dtype=np.uint8).view(xdt).astype(np.float64)
        f = TABLE_FUNCTIONS[fn.op_type](((codes - px[1]) * px[0]), fn.attrs)
        info = np.iinfo(ydt)
        table = np.clip(np.rint(f / py[0]) + py[1], info.min, info.max).astype(ydt)
        tv = self._init(graph, f"{fn.name or fn.op_type}_table", table)
        q.replace_input(0, None)
        graph.remove_node(fn)
        graph.remove_node(dq)
        self._replace(graph, q, "IntLookup", [xi, tv], {"function": fn.op_type})
        return None

    def _add_host_operand(self, graph: Graph, q: Node, add: Node) -> str | None:
        """``Q(Add(DQ(a), f))`` with ``f`` a float value the host computes (an attention
        mask from the graph's inputs): the host quantizes ``f`` with the output's
        parameters and the device adds integers (IntAdd with ``b`` in the output's type).
        Where ``f`` saturates (a -3.4e38 mask) the sum saturates to qmin as the QDQ
        graph's QuantizeLinear does."""
        s = add.outputs[0]
        if len(s.uses) != 1 or any(o is s for o in graph.outputs):
            return "the Add's float output has other readers"
        k = next(
            (
                i
                for i, v in enumerate(add.inputs)
                if v is not None
                and v.producer is not None
                and v.producer.op_type == "DequantizeLinear"
                and not v.producer.domain
            ),
            None,
        )
        if k is None:
            return "no dequantized operand"
        dq, f = add.inputs[k].producer, add.inputs[1 - k]
        if f is None or f.is_const or f.type is None or _qtype(f) is not None:
            return "the other operand is not a float activation"
        pa = self._act(dq.inputs[0], "a")
        py = self._act(q.outputs[0], "y")
        if isinstance(pa, str) or isinstance(py, str):
            return pa if isinstance(pa, str) else py
        fq = Value(graph.fresh_name(f"{f.name}_quantized"), TensorType(q.outputs[0].type.elem, f.shape))
        graph.add_node(
            Node(
                "QuantizeLinear",
                [f, q.inputs[1], q.input(2)],
                [fq],
                name=graph.fresh_name(f"{f.name}_QuantizeLinear"),
            ),
            before=add,
        )
        attrs = add_params(pa[0], py[0], py[0], q.outputs[0].type.elem.storage.bits)
        attrs.update(
            a_zero_point=pa[1],
            b_zero_point=py[1],
            y_zero_point=py[1],
            rounding=self.rounding,
            out_type=_storage_name(q.outputs[0]),
        )
        attrs["multiplier"], attrs["shift"] = [attrs["multiplier"]], [attrs["shift"]]
        a = dq.inputs[0]
        q.replace_input(0, None)
        graph.remove_node(add)
        if not dq.outputs[0].uses and not any(o is dq.outputs[0] for o in graph.outputs):
            graph.remove_node(dq)
        self._replace(graph, q, "IntAdd", [a, fq], attrs)
        return None

    def _requantize(self, graph: Graph, node: Node) -> str | None:
        """Q(DQ(x)) between two integer types (a requantization written in float)."""
        x = node.inputs[0]
        dq = x.producer if x is not None else None
        if dq is not None and dq.op_type == "Add" and not dq.domain and not _all_dequantized(dq):
            return self._add_host_operand(graph, node, dq)
        if dq is not None and dq.op_type in TABLE_FUNCTIONS and dq.domain in ("", "com.microsoft"):
            return self._table(graph, node, dq)
        if dq is not None and dq.op_type == "Softmax" and not dq.domain:
            return self._wide_softmax(graph, node, dq)
        if dq is not None and dq.op_type in ("MatMul", "Add", "Mul", "Gemm") and not dq.domain:
            return self._group(graph, node, dq)
        if dq is None or dq.op_type != "DequantizeLinear" or dq.domain:
            return None  # a graph-input quantization: the host's
        px = self._act(dq.inputs[0], "x")
        py = self._act(node.outputs[0], "y")
        if isinstance(px, str) or isinstance(py, str):
            return px if isinstance(px, str) else py
        xi = dq.inputs[0]
        self._replace(
            graph,
            node,
            "IntRescale",
            [xi],
            self._rescale_attrs(px[0], px[1], py[0], py[1], _storage_name(node.outputs[0])),
        )
        if not dq.outputs[0].uses and not any(o is dq.outputs[0] for o in graph.outputs):
            graph.remove_node(dq)
        return None
