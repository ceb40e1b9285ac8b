"""Gated activations after a float Conv become the Conv's fused activation.

Rules (``optimize_float``; the Conv an ai.onnx Conv with float32 constant weights, its
output read by the activation's nodes only)::

    %y = Mul(%p = Conv(...), Sigmoid(%p))   (either order)      -> quanta::Conv {activation="SiLU"}
    %y = HardSwish(%p = Conv(...))                              -> quanta::Conv {activation="HardSwish"}
    %y = HardSigmoid(%p = Conv(...)) {alpha, beta}              -> quanta::Conv {activation="HardSigmoid",
                                                                    activation_params=[alpha, beta]}
    %y = Div(Mul(%p, Clip(Add(%p, b), lo, hi)), d)  (Mul, Add in either order)
                                                                -> quanta::Conv {activation="ClipMulDiv",
                                                                    activation_params=[b, lo, hi, d]}
    %y = LeakyRelu(%p = Conv(...)) {alpha}                      -> quanta::Conv {activation="LeakyRelu",
                                                                    activation_params=[alpha, -inf]}
    %y = Max(LeakyRelu(%p = Conv(...)) {alpha}, c)  (either order; c a float32 scalar)
                                                                -> quanta::Conv {activation="LeakyRelu",
                                                                    activation_params=[alpha, c]}

Why: YOLO-style detectors write SiLU as ``Mul(x, Sigmoid(x))`` after nearly every
convolution, Paddle's OCR and layout models hardswish as ``x · Clip(x + 3, 0, 6) / 6``
(or ``HardSwish``), and each of those nodes is one more pass over a convolution's output.
Fused, the float GEMM family applies the activation to each thread task's finished block
while it is still in L2 (sgemm.h ``PostOp``).

Numerics: exact. The fused activation is, by definition, the chain of the float32 nodes
it replaces (the same operations in the same order: ``nn_conv.fused_conv`` calls the
nodes' own reference functions, and the native post-op calls the native kernels of
those nodes, which are bit-exact with them). Nothing is canonicalized: Paddle's
written-out hardswish stays ``Div(Mul(x, Clip(Add(x, b))), d)`` in float32, not
``HardSwish`` (which rounds differently, passes/rules/canonicalize_activations.py).
"""

from __future__ import annotations

import math

import numpy as np

from quanta.ir.graph import Node, Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import describe
from quanta.passes.rules.fuse_activation import QUANTA_DOMAIN, clamp_bounds

__all__ = [
    "ClipMulDivAfterConv",
    "FuseFloatGate",
    "HardSigmoidAfterConv",
    "HardSwishAfterConv",
    "LeakyReluAfterConv",
    "LeakyReluMaxAfterConv",
    "SiluAfterConv",
    "clip_mul_div_params",
    "f32_scalar",
]


def f32_scalar(v: Value | None) -> float | None:
    """The value of a one-element float32 constant, else None."""
    if v is None or not v.is_const:
        return None
    a = np.asarray(v.const)
    if a.size != 1 or a.dtype != np.float32:
        return None
    return float(a.reshape(()))


def clip_mul_div_params(x: Value, add: Node, clip: Node, d: Value | None) -> list[float] | NoMatch:
    """``[b, lo, hi, d]`` of Paddle's written-out hardswish ``Div(Mul(x, Clip(Add(x, b),
    lo, hi)), d)`` around ``x`` (the Add adds ``x`` and a float32 scalar constant, the
    bounds and the divisor are float32 values), or why not."""
    if len(add.inputs) != 2 or (add.inputs[0] is not x and add.inputs[1] is not x):
        return NoMatch(f"{add.label} does not add to {describe(x)}")
    other = add.inputs[1] if add.inputs[0] is x else add.inputs[0]
    bias = f32_scalar(other)
    if bias is None:
        return NoMatch(f"{add.label}: {describe(other)} is not a float32 scalar constant")
    div = f32_scalar(d)
    if div is None:
        return NoMatch(f"divisor {describe(d)} is not a float32 scalar constant")
    bounds = clamp_bounds(clip)
    if isinstance(bounds, NoMatch):
        return bounds
    lo, hi = bounds
    for v in (lo, hi):
        if math.isfinite(v) and float(np.float32(v)) != v:
            return NoMatch(f"Clip bound {v} is not a float32 value")
    return [bias, lo, hi, div]


class _AfterFloatConv(Rule):
    """Shared check: ``p`` is an ai.onnx Conv's output with float32 constant weights."""

    def check_conv(self, m: Match) -> Match | NoMatch:
        conv = m.node("p")
        w = conv.input(1)
        if w is None or w.const is None or np.asarray(w.const).dtype != np.float32:
            return NoMatch(f"Conv weights {describe(w)} are not a float32 constant")
        return m

    def check(self, m: Match) -> Match | NoMatch:
        return self.check_conv(m)

    def activation(self, m: Match) -> tuple[str, list[float] | None]:
        raise NotImplementedError

    def rewrite(self, m: Match, b: Builder) -> Value:
        conv: Node = m.node("p")
        y = m.value("y")
        attrs = dict(conv.attrs)
        act, params = self.activation(m)
        attrs["activation"] = act
        if params is not None:
            attrs["activation_params"] = params
        return b.op(
            "Conv",
            conv.inputs,
            attrs,
            types=result_type(shape_from=y, elem_from=y),  # the replaced activation output's contract
            domain=QUANTA_DOMAIN,
            name=conv.name or None,
            attr_types=conv.attr_types,
        )


class SiluAfterConv(_AfterFloatConv):
    """%y = Mul(%p = Conv(...), Sigmoid(%p)) -> quanta::Conv {activation="SiLU"}"""

    pattern = "y = Mul(p = Conv(...), s = Sigmoid(p))"

    def activation(self, m: Match) -> tuple[str, list[float] | None]:
        return "SiLU", None


class SiluAfterConvSwapped(SiluAfterConv):
    """%y = Mul(Sigmoid(%p), %p = Conv(...)) -> quanta::Conv {activation="SiLU"}"""

    pattern = "y = Mul(s = Sigmoid(p = Conv(...)), p)"


class HardSwishAfterConv(_AfterFloatConv):
    """%y = HardSwish(%p = Conv(...)) -> quanta::Conv {activation="HardSwish"}"""

    pattern = "y = HardSwish(p = Conv(...))"

    def activation(self, m: Match) -> tuple[str, list[float] | None]:
        return "HardSwish", None


class HardSigmoidAfterConv(_AfterFloatConv):
    """%y = HardSigmoid(%p = Conv(...)) -> quanta::Conv {activation="HardSigmoid", [alpha, beta]}"""

    pattern = "y = HardSigmoid(p = Conv(...))"

    def activation(self, m: Match) -> tuple[str, list[float] | None]:
        a = m.root.attrs
        # float32 parameters, as the HardSigmoid kernels compute with them
        return "HardSigmoid", [
            float(np.float32(a.get("alpha", 0.2))),
            float(np.float32(a.get("beta", 0.5))),
        ]


class LeakyReluAfterConv(_AfterFloatConv):
    """%y = LeakyRelu(%p = Conv(...)) {alpha} -> quanta::Conv {activation="LeakyRelu",
    activation_params=[alpha, -inf]} (ONNX Runtime's FusedConv takes LeakyRelu too)"""

    pattern = "y = LeakyRelu(p = Conv(...))"

    def check(self, m: Match) -> Match | NoMatch:
        base = self.check_conv(m)
        if not base:
            return base
        readers = m.value("y").consumers()
        if len(readers) == 1 and readers[0].op_type == "Max" and not readers[0].domain:
            max_node = readers[0]
            others = [v for v in max_node.inputs if v is not m.value("y")]
            if len(max_node.inputs) == 2 and len(others) == 1 and f32_scalar(others[0]) is not None:
                # the rules run node by node in order: the Max after it fuses both
                return NoMatch(f"{max_node.label} of a scalar follows: LeakyReluMaxAfterConv fuses both")
        return m

    def activation(self, m: Match) -> tuple[str, list[float] | None]:
        # float32 alpha, as the LeakyRelu kernels compute with it; no Max
        return "LeakyRelu", [float(np.float32(m.root.attrs.get("alpha", 0.01))), -math.inf]


class LeakyReluMaxAfterConv(_AfterFloatConv):
    """%y = Max(LeakyRelu(%p = Conv(...)) {alpha}, c) with c a float32 scalar constant ->
    quanta::Conv {activation="LeakyRelu", activation_params=[alpha, c]}: TensorFlow
    exports bound Keras' LeakyReLU from below this way (openWakeWord's embedding model)."""

    pattern = "y = Max(l = LeakyRelu(p = Conv(...)), c)"

    def check(self, m: Match) -> Match | NoMatch:
        base = self.check_conv(m)
        if not base:
            return base
        c = m["c"]
        floor = f32_scalar(c)
        if floor is None:
            return NoMatch(f"{describe(c)} is not a float32 scalar constant")
        w = m.node("p").input(1)
        if np.asarray(c.const).ndim > np.asarray(w.const).ndim:
            return NoMatch(f"{describe(c)} has more axes than the Conv's output: it broadcasts it")
        if math.isnan(floor):
            return NoMatch("the Max's constant is NaN")
        m.data["floor"] = floor
        return m

    def activation(self, m: Match) -> tuple[str, list[float] | None]:
        alpha = float(np.float32(m.node("l").attrs.get("alpha", 0.01)))
        return "LeakyRelu", [alpha, m.data["floor"]]


class LeakyReluMaxAfterConvSwapped(LeakyReluMaxAfterConv):
    """The same with the Max's operands swapped: Max(c, LeakyRelu(%p = Conv(...)))."""

    pattern = "y = Max(c, l = LeakyRelu(p = Conv(...)))"


class ClipMulDivAfterConv(_AfterFloatConv):
    """%y = Div(Mul(%p = Conv(...), Clip(Add(%p, b), lo, hi)), d) -> quanta::Conv
    {activation="ClipMulDiv", activation_params=[b, lo, hi, d]}"""

    pattern = "y = Div(g = Mul(p = Conv(...), c = Clip(a = Add(...), ...)), d)"

    def check(self, m: Match) -> Match | NoMatch:
        base = self.check_conv(m)
        if not base:
            return base
        p = m.value("p")
        add = m.node("a")
        params = clip_mul_div_params(p, add, m.node("c"), m["d"])
        if isinstance(params, NoMatch):
            return params
        # the Conv's output is read by the Add and the Mul only (the engine checked the
        # Mul, Clip and Add intermediates; p is captured inside the Mul)
        outside = [n for n in p.consumers() if n is not m.node("g") and n is not add]
        if outside or m.has_outside_uses("p"):
            return NoMatch("the Conv's output has other users")
        m.data["params"] = params
        return m

    def activation(self, m: Match) -> tuple[str, list[float] | None]:
        return "ClipMulDiv", [float(v) for v in m.data["params"]]


class ClipMulDivAfterConvSwapped(ClipMulDivAfterConv):
    """The same with the Mul's operands swapped: Div(Mul(Clip(Add(%p, b)), %p), d)."""

    pattern = "y = Div(g = Mul(c = Clip(a = Add(...), ...), p = Conv(...)), d)"


class FuseFloatGate(RewritePass):
    name = "fuse_float_gate"
    rules = (
        SiluAfterConv(),
        SiluAfterConvSwapped(),
        HardSwishAfterConv(),
        HardSigmoidAfterConv(),
        ClipMulDivAfterConv(),
        ClipMulDivAfterConvSwapped(),
        # the Max rules first: a LeakyRelu fused alone would leave its Max a pass of its own
        LeakyReluMaxAfterConv(),
        LeakyReluMaxAfterConvSwapped(),
        LeakyReluAfterConv(),
    )
