"""Relu, Relu6 and Clip: removed where the quantization already implies them, else
fused into the producing op as an output clamp.

All three are clamps: ``Relu = Clip(x, 0, +inf)``, ``Relu6 = Clip(x, 0, 6)`` (ONNX has
no Relu6 op; exporters write Clip(0, 6)). ``Clip(x, lo, hi) = min(max(x, lo), hi)``.

DropActivationImpliedByQuantize (QDQ graphs)::

    %q = QuantizeLinear(%a = Relu|Clip(%x, ...), %s, %z) -> %q = QuantizeLinear(%x, %s, %z)

Exact, bit for bit, when the quantizer saturates where the clamp would:
``Q(v) = saturate(round_half_even(v / s) + z)`` is monotone non-decreasing, so every
``v < lo`` has ``qmin <= Q(v) <= Q(lo)``; if ``Q(lo) = qmin`` then
``Q(v) = qmin = Q(lo) = Q(max(v, lo))``. Likewise ``Q(hi) = qmax`` makes the upper
bound redundant. Hence the condition, checked with the reference arithmetic (float32
division, round half to even; :func:`quanta.passes.qmath.quantize_value`)::

    Q(lo) == qmin   (Relu: lo = 0, i.e. zero point == qmin)     and     Q(hi) == qmax

For per-axis quantization it must hold on every channel. NaN: ``Relu(NaN)`` is NaN and
``Q(NaN) = qmin`` either way. When only one bound is implied nothing is removed (the
fusion below still applies).

QuantizeBeforeActivation (QDQ graphs, a clamp the quantization does not imply)::

    %q = QuantizeLinear(%a = Relu|Clip(%p = Conv|Gemm|MatMul|Add(DQ(...), ...)), %s, %z)
      -> %c = QuantizeLinear(%p, %s, %z)
         %q = QuantizeLinear(Relu|Clip(DequantizeLinear(%c, %s, %z)), %s, %z)

Exact, bit for bit (NaN aside, as below): with ``Q`` monotone, ``Q(clamp(v, lo, hi)) =
clamp(Q(v), Q(lo), Q(hi))``, and for a code ``c`` with ``Q(DQ(c)) = c`` (checked on every
code of the type) ``Q(clamp(DQ(c), lo, hi)) = clamp(c, Q(lo), Q(hi))``; so both sides are
``clamp(Q(v), Q(lo), Q(hi))``. It lets instruction selection lower the producer as an
integer group (``QLinearConv``, ...) and the clamp as a table on its codes
(``QLinearLookup``), the placement ONNX Runtime's quantizer writes for symmetric
activations, instead of the producer running in float with a float clamp and a separate
QuantizeLinear. The files it serves: AMD Quark's (uint8 with zero point 128, Relu6 at
scale 2^-4: ``Q(0) = 128 > qmin``, ``Q(6) = 224 < qmax``) and any symmetric int8 file whose
quantizer kept Relu / Clip inside the group.

FuseActivationIntoProducer::

    %y = Relu|Clip(%p = Conv|Gemm|MatMul|Add(...), ...) -> %y = quanta::Conv|Gemm|MatMul|Add(...)
                                                                 {activation, activation_params}

The fused node is the producer with two extra attributes, in the ``quanta`` domain (the
attribute names are ONNX Runtime's ``com.microsoft::FusedConv``): ``activation="Relu"``,
or ``activation="Clip"`` with ``activation_params=[lo, hi]`` (an absent bound is
-inf / +inf). Its meaning is the producer's result, then the clamp, computed in the
producer's output type: bit-exact by definition. For the integer lowering the clamp
becomes output saturation bounds: ``Q(clamp(v, lo, hi)) = clamp(Q(v), Q(lo), Q(hi))``
(monotone Q; the only difference is NaN, which maps to qmin on the left and Q(lo) on
the right).

The fused ops need reference implementations in the ``quanta`` domain (not part of this
module: kernels are below passes); until they exist, a pipeline whose result runs on the
reference target must not include it (see :mod:`quanta.passes.pipelines`).
"""

from __future__ import annotations

import math

import numpy as np

from quanta.ir.graph import Node, Value, result_type
from quanta.ir.op_facts import derive
from quanta.ir.types import IntType
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.qmath import quantize_value, quantize_values
from quanta.passes.rules._util import describe, node_qtype

__all__ = [
    "FUSABLE_PRODUCERS",
    "QUANTA_DOMAIN",
    "DropActivationImpliedByQuantize",
    "DropImpliedActivation",
    "FuseActivation",
    "FuseActivationIntoProducer",
    "FuseFloatActivation",
    "FuseFloatConvActivation",
    "QuantizeBeforeActivation",
    "QuantizeBeforeActivationPass",
    "clamp_bounds",
]

QUANTA_DOMAIN = "quanta"

#: producers that take an output clamp, with the reason each is listed
FUSABLE_PRODUCERS = derive(
    "quanta.passes.rules.fuse_activation.FUSABLE_PRODUCERS", lambda t: t.column("fuse_clamp")
)


def clamp_bounds(node: Node) -> tuple[float, float] | NoMatch:
    """``(lo, hi)`` of a Relu or Clip node (absent bounds are -inf / +inf), or why they
    are not known constants."""
    if node.op_type == "Relu":
        return 0.0, math.inf
    if "min" in node.attrs or "max" in node.attrs:  # Clip before opset 11: attributes
        return float(node.attrs.get("min", -math.inf)), float(node.attrs.get("max", math.inf))
    bounds = []
    for k, default in ((1, -math.inf), (2, math.inf)):
        v = node.input(k)
        if v is None:
            bounds.append(default)
            continue
        if not v.is_const:
            which = "min" if k == 1 else "max"
            return NoMatch(f"Clip {which} {describe(v)} is not a constant")
        arr = np.asarray(v.const)
        if arr.size != 1:
            return NoMatch(f"Clip bound {describe(v)} has shape {list(arr.shape)}, expected a scalar")
        bounds.append(float(arr.reshape(())))
    return bounds[0], bounds[1]


def _fmt(v: float) -> str:
    return repr(float(np.float32(v))) if math.isfinite(v) else str(v)


class DropActivationImpliedByQuantize(Rule):
    """%q = QuantizeLinear(%a = Relu|Clip(%x, ...), %s, %z) -> %q = QuantizeLinear(%x, %s, %z)

    when Q(lo) == qmin and Q(hi) == qmax (the quantizer saturates where the clamp would).
    """

    pattern = "q = QuantizeLinear(a = Relu|Clip(x, ...), s, z?)"

    def check(self, m: Match) -> Match | NoMatch:
        qnode = m.root
        qt = node_qtype(qnode, m["q"], m["s"], m["z"])
        if qt is None:
            return NoMatch("QuantizeLinear scale/zero point are not constants")
        if not isinstance(qt.storage, IntType):
            return NoMatch(f"storage {qt.storage} is not an integer type (no saturation to rely on)")
        act = m.node("a")
        bounds = clamp_bounds(act)
        if isinstance(bounds, NoMatch):
            return bounds
        lo, hi = bounds
        what = "Relu" if act.op_type == "Relu" else f"Clip lower bound {_fmt(lo)}"
        # every channel at once (quantize_values), then the first that fails, lower
        # bound first, as a loop over the channels would find it
        ok_lo = quantize_values(lo, qt) == qt.qmin if lo > -math.inf else np.ones(len(qt.scale), bool)
        ok_hi = quantize_values(hi, qt) == qt.qmax if hi < math.inf else np.ones(len(qt.scale), bool)
        bad = np.flatnonzero(~(ok_lo & ok_hi))
        for ch in bad[:1].tolist():
            where = f" (channel {ch})" if qt.axis is not None else ""
            if lo > -math.inf:
                q = quantize_value(lo, qt, ch)
                if q != qt.qmin:
                    return NoMatch(
                        f"{what} is not implied{where}: QuantizeLinear maps {_fmt(lo)} to {q} > qmin {qt.qmin} "
                        f"(zero point {qt.zero_point[ch]})"
                    )
            if hi < math.inf:
                q = quantize_value(hi, qt, ch)
                if q != qt.qmax:
                    return NoMatch(
                        f"Clip upper bound {_fmt(hi)} is not implied{where}: QuantizeLinear maps it to {q} < "
                        f"qmax {qt.qmax}"
                    )
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        qnode = m.root
        q = m.value("q")
        return b.op(
            "QuantizeLinear",
            [m["x"], m["s"], m["z"]],
            qnode.attrs,
            types=result_type(shape_from=q, elem_from=q),  # the replaced Q output's contract
            name=qnode.name or None,
            attr_types=qnode.attr_types,
        )


class QuantizeBeforeActivation(Rule):
    """%q = QuantizeLinear(%a = Relu|Clip(%p = Conv|Gemm|MatMul|Add(DQ(...), ...)), %s, %z)
    -> %q = QuantizeLinear(Relu|Clip(DequantizeLinear(QuantizeLinear(%p, %s, %z), %s, %z)), %s, %z)

    when the clamp is not implied (DropActivationImpliedByQuantize refused it), the
    quantization is 8-bit per tensor, and ``Q(DQ(c)) = c`` on every code ``c``.
    """

    # the producers whose groups instruction selection lowers to integer ops (QLinearConv,
    # QGemm, QLinearMatMul, QLinearAdd) once the clamp is split off
    pattern = "q = QuantizeLinear(a = Relu|Clip(p = Conv|Gemm|MatMul|Add(x, ...), ...), s, z?)"

    def check(self, m: Match) -> Match | NoMatch:
        qt = node_qtype(m.root, m["q"], m["s"], m["z"])
        if qt is None or qt.axis is not None or len(qt.scale) != 1:
            return NoMatch("QuantizeLinear parameters are not constants of one tensor-wide scale")
        if not isinstance(qt.storage, IntType) or qt.storage.bits != 8:
            return NoMatch(
                f"storage {qt.storage} is not 8-bit (the clamp would not become a 256-entry table)"
            )
        x = m["x"]
        if x is None or x.producer is None or x.producer.op_type != "DequantizeLinear":
            return NoMatch(f"{m.node('p').op_type} input {describe(x)} is not dequantized (not a QDQ group)")
        # a producer or clamp output read elsewhere: the pattern engine refuses the match
        bounds = clamp_bounds(m.node("a"))
        if isinstance(bounds, NoMatch):
            return bounds
        codes = np.arange(qt.qmin, qt.qmax + 1, dtype=np.int64)
        scale, zero = np.float32(qt.scale[0]), int(qt.zero_point[0])
        # DequantizeLinear's float32 value of every code, then QuantizeLinear's rounding
        with np.errstate(over="ignore", invalid="ignore"):  # an overflowing product is a refusal
            back = np.rint(np.divide((codes - zero).astype(np.float32) * scale, scale, dtype=np.float32))
        if not np.array_equal(np.clip(back + zero, qt.qmin, qt.qmax), codes):
            return NoMatch(
                f"scale {_fmt(float(scale))}: Q(DQ(c)) != c for some code, the split would not be exact"
            )
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        qnode, act = m.root, m.node("a")
        q, a = m.value("q"), m.value("a")
        codes = b.op(
            "QuantizeLinear",
            [m["p"], m["s"], m["z"]],
            qnode.attrs,
            types=result_type(shape_from=q, elem_from=q),  # the replaced Q output's contract
            attr_types=qnode.attr_types,
        )
        real = b.op(
            "DequantizeLinear",
            [codes, m["s"], m["z"]],
            types=result_type(shape_from=a, elem_from=a),  # the clamp's input: the float it read
        )
        clamped = b.op(
            act.op_type,
            [real, *act.inputs[1:]],
            act.attrs,
            types=result_type(shape_from=a, elem_from=a),  # the replaced clamp's contract
            name=act.name or None,
            attr_types=act.attr_types,
        )
        return b.op(
            "QuantizeLinear",
            [clamped, m["s"], m["z"]],
            qnode.attrs,
            types=result_type(shape_from=q, elem_from=q),  # the replaced Q output's contract
            name=qnode.name or None,
            attr_types=qnode.attr_types,
        )


class FuseActivationIntoProducer(Rule):
    """%y = Relu|Clip(%p = Conv|Gemm|MatMul|Add(...), ...) -> %y = quanta::<op>(...) {activation, activation_params}"""

    pattern = "y = Relu|Clip(p = Conv|Gemm|MatMul|Add(...), ...)"

    def check(self, m: Match) -> Match | NoMatch:
        bounds = clamp_bounds(m.root)
        if isinstance(bounds, NoMatch):
            return bounds
        m.data["bounds"] = bounds
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        producer = m.node("p")
        y = m.value("y")
        attrs = dict(producer.attrs)
        if m.root.op_type == "Relu":
            attrs["activation"] = "Relu"
        else:
            attrs["activation"] = "Clip"
            attrs["activation_params"] = [float(v) for v in m.data["bounds"]]
        return b.op(
            producer.op_type,
            producer.inputs,
            attrs,
            types=result_type(shape_from=y, elem_from=y),  # the replaced activation output's contract
            domain=QUANTA_DOMAIN,
            name=producer.name or None,
            attr_types=producer.attr_types,
        )


class FuseFloatConvActivation(FuseActivationIntoProducer):
    """%y = Relu|Clip(%p = Conv(%x, %w, %b?)) -> %y = quanta::Conv(...) {activation, activation_params}

    The float form of the rule above for ``optimize_float``: only a float32 Conv (the
    float GEMM family clamps in its store, docs/float-ops.md), and only with Clip bounds
    that are float32 values, so the fused clamp is the Clip's, bit for bit."""

    pattern = "y = Relu|Clip(p = Conv(x, w, b?), ...)"

    def check(self, m: Match) -> Match | NoMatch:
        w = m.value("w")
        if w.const is None or np.asarray(w.const).dtype != np.float32:
            return NoMatch(f"Conv weights {describe(w)} are not a float32 constant")  # x has w's type
        return super().check(m)


class DropImpliedActivation(RewritePass):
    name = "drop_implied_activation"
    rules = (DropActivationImpliedByQuantize(),)


class QuantizeBeforeActivationPass(RewritePass):
    name = "quantize_before_activation"
    rules = (QuantizeBeforeActivation(),)


class FuseActivation(RewritePass):
    name = "fuse_activation"
    rules = (FuseActivationIntoProducer(),)


class FuseFloatActivation(RewritePass):
    name = "fuse_float_activation"
    rules = (FuseFloatConvActivation(),)
