"""Activations written out as arithmetic become the one operator they compute.

Rules (``c ≈ k``: the constant equals ``k`` within the relative tolerance ``RTOL``)::

    %y = Div(Clip(Add(%x, b), 0, h), d)            d ≈ h   -> %y = HardSigmoid(%x) {alpha = 1/d, beta = b/d}
    %y = Mul(Clip(Add(%x, b), 0, h), k)            k·h ≈ 1 -> %y = HardSigmoid(%x) {alpha = k,   beta = b·k}
                                                                              HardSigmoidFromClip
    %y = Div(Mul(%x, Clip(Add(%x, b), 0, h)), d)   d ≈ h   -> %y = Mul(%x, HardSigmoid(%x) {1/d, b/d})
    %y = Mul(Mul(%x, Clip(Add(%x, b), 0, h)), k)   k·h ≈ 1 -> %y = Mul(%x, HardSigmoid(%x) {k, b·k})
                                                                              HardSwishFromClip
    %y = Mul(%x, HardSigmoid(%x) {alpha ≈ 1/6, beta ≈ 1/2})  -> %y = HardSwish(%x)   (opset >= 14)
                                                                              HardSwishFromGate
    %y = Log(Add(Exp(%x), 1))                                -> %y = Softplus(%x)
                                                                              SoftplusFromLogExp

(Add, Mul and the gate's Mul in either operand order; ``Clip``'s bounds as inputs, the
``Relu6(x + 3)`` of exporters.)

Why: Paddle2ONNX writes hardswish as ``x * Clip(x + 3, 0, 6) / 6`` and hardsigmoid as
``Clip(x + 3, 0, 6) / 6``; left as arithmetic, the quantizer sees a Clip, a Div and two
Muls, quantizes some of them and leaves the Div float, and each activation runs as a
float island between Q/DQ pairs. As one operator (or the gated pair
``Mul(x, HardSigmoid(x))``, which the quantizer plans as one group, quantize/qdq.py) it
is a single function of one 8-bit input, which lowering turns into a 256-entry table.

Numerics: each rewrite is exact in real arithmetic
(``clip(x + b, 0, h) / h = clip(x/h + b/h, 0, 1)``: the Clip's lower bound is exactly 0
and its upper bound is the divisor) and differs from the float32 arithmetic it replaces
by the rounding of the few operations involved: at most 3 ulp of the gate and 4 ulp of
``x · gate`` (the arithmetic rounds after the Add, the Div and the Mul, HardSigmoid after
its multiply and add). ``RTOL = 1e-6``: exporters write 1/6 as the decimal ``0.1666667``
(2e-7 off) or as float32(1/6) (3e-8 off); a constant further off than one part in a
million is a different function, and the rule refuses it.

``hardswish=False`` leaves the hardswish forms as written (HardSwishFromClip and
HardSwishFromGate off): quantization does so (``pipelines.prepare_for_quantization``)
because a hardswish quantized as one group quantizes its input, the pre-activation
output of a convolution, and on Paddle2ONNX's OCR models that cost more than the float
island it removes (PP-OCRv4 detector map IoU 97.5 % -> 91.0 %, recognizer CER 8.5 % ->
15.5 % against FP32; docs/passes.md).

HardSwish is an ai.onnx operator from opset 14; before that the canonical form of
hardswish is the gated pair ``Mul(x, HardSigmoid(x) {1/6, 1/2})`` (ONNX's own definition
of HardSwish), which a file of the model's opset can hold. SiLU (``Mul(x, Sigmoid(x))``)
and Mish (``Mul(x, Tanh(Softplus(x)))``) keep their gated-pair form for the same reason
(SiLU has no ai.onnx operator; Mish only from opset 18).
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Graph, Node, Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule

__all__ = [
    "RTOL",
    "CanonicalizeActivations",
    "HardSigmoidFromClip",
    "HardSwishFromClip",
    "HardSwishFromGate",
    "SoftplusFromLogExp",
]

#: relative tolerance on the constants that identify an activation (module docstring)
RTOL = 1e-6

#: the first ai.onnx opset with HardSwish
HARDSWISH_OPSET = 14


def _scalar(v: Value | None) -> float | None:
    """The value of a one-element float constant, else None."""
    if v is None or not v.is_const:
        return None
    a = np.asarray(v.const)
    if a.size != 1 or a.dtype.kind != "f":
        return None
    return float(a.reshape(()))


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= RTOL * abs(b)


def _producer(v: Value | None, op: str) -> Node | None:
    if v is None or v.producer is None or v.producer.domain or v.producer.op_type != op:
        return None
    return v.producer


def _private(v: Value, graph: Graph) -> bool:
    """Used once and not a graph output: the node producing it can go with the rewrite."""
    return len(v.uses) == 1 and not any(o is v for o in graph.outputs)


def _const_and_other(node: Node) -> tuple[float, Value] | None:
    """For a two-input node with one scalar constant operand: (constant, the other); a
    Div only with the constant as its divisor."""
    if len(node.inputs) != 2:
        return None
    orders = [(node.inputs[1], node.inputs[0])]
    if node.op_type != "Div":
        orders.append((node.inputs[0], node.inputs[1]))
    for c, other in orders:
        k = _scalar(c)
        if k is not None and other is not None and not other.is_const:
            return k, other
    return None


def _shifted_relu(v: Value | None, graph: Graph) -> tuple[Value, float, float] | NoMatch:
    """``v = Clip(Add(x, b), 0, h)``: (x, b, h), or why not."""
    clip = _producer(v, "Clip")
    if clip is None:
        return NoMatch("not a Clip(Add(x, b), 0, h)")
    if len(clip.inputs) < 3 or clip.inputs[1] is None or clip.inputs[2] is None:
        return NoMatch(f"{clip.label} has no constant lower and upper bound inputs")
    lo, hi = _scalar(clip.inputs[1]), _scalar(clip.inputs[2])
    if lo is None or hi is None:
        return NoMatch(f"{clip.label}: its bounds are not scalar constants")
    if lo != 0.0 or not hi > 0.0:
        return NoMatch(f"{clip.label} clips to [{lo}, {hi}], not [0, h] with h > 0")
    add = _producer(clip.inputs[0], "Add")
    shifted = _const_and_other(add) if add is not None else None
    if shifted is None:
        return NoMatch(f"the input of {clip.label} is not Add(x, b) with a scalar constant b")
    if not _private(clip.inputs[0], graph) or not _private(v, graph):
        return NoMatch(f"an intermediate of {clip.label} has other users")
    b, x = shifted
    return x, b, hi


def _gate_of(scale_node: Node, graph: Graph) -> tuple[Value, float, float] | NoMatch:
    """``scale_node = Div(c, d)`` or ``Mul(c, k)`` with ``c = Clip(Add(x, b), 0, h)`` and the
    divisor the Clip's upper bound: (x, alpha, beta) of the HardSigmoid it computes."""
    found = _const_and_other(scale_node)
    if found is None:
        return NoMatch(f"{scale_node.label} does not scale a tensor by a scalar constant")
    k, c = found
    relu = _shifted_relu(c, graph)
    if isinstance(relu, NoMatch):
        return relu
    x, b, h = relu
    if scale_node.op_type == "Div":
        if not _close(k, h):
            return NoMatch(f"{scale_node.label} divides by {k}, not by the Clip's upper bound {h}")
        return x, 1.0 / k, b / k
    if not _close(k * h, 1.0):
        return NoMatch(f"{scale_node.label} multiplies by {k}, not by 1/{h} (the Clip's upper bound)")
    return x, k, b * k


def _hard_sigmoid_attrs(alpha: float, beta: float) -> dict[str, float]:
    return {"alpha": float(np.float32(alpha)), "beta": float(np.float32(beta))}


class HardSigmoidFromClip(Rule):
    """%y = Div(Clip(Add(%x, b), 0, h), h) or Mul(Clip(...), 1/h) -> %y = HardSigmoid(%x) {1/h, b/h}"""

    pattern = "y = Div|Mul(p, q)"

    def check(self, m: Match) -> Match | NoMatch:
        y = m.value("y")
        if y.elem is None or str(y.elem) != "f32":
            return NoMatch("not a float32 Div/Mul")
        gate = _gate_of(m.root, m.graph)
        if isinstance(gate, NoMatch):
            return gate
        m.data["gate"] = gate
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        x, alpha, beta = m.data["gate"]
        return b.op(
            "HardSigmoid",
            [x],
            _hard_sigmoid_attrs(alpha, beta),
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            name=m.root.name or None,
        )


class HardSwishFromClip(Rule):
    """%y = Div(Mul(%x, Clip(Add(%x, b), 0, h)), h) or Mul(Mul(...), 1/h)
    -> %y = Mul(%x, HardSigmoid(%x) {1/h, b/h})"""

    pattern = "y = Div|Mul(p, q)"

    def check(self, m: Match) -> Match | NoMatch:
        y = m.value("y")
        if y.elem is None or str(y.elem) != "f32":
            return NoMatch("not a float32 Div/Mul")
        found = _const_and_other(m.root)
        prod = _producer(found[1], "Mul") if found is not None else None
        if prod is None:
            return NoMatch(f"{m.root.label} does not scale Mul(x, Clip(Add(x, b), 0, h)) by a constant")
        if not _private(prod.outputs[0], m.graph):
            return NoMatch(f"the product {prod.label} has other users")
        why = NoMatch(f"{prod.label} is not Mul(x, Clip(Add(x, b), 0, h)) of one x")
        for x, c in ((prod.inputs[0], prod.inputs[1]), (prod.inputs[1], prod.inputs[0])):
            relu = _shifted_relu(c, m.graph)
            if isinstance(relu, NoMatch):
                if _producer(c, "Clip") is not None:
                    why = relu  # the Clip's own reason says more than the generic one
                continue
            if relu[0] is not x:
                continue
            k, (_, bias, h) = found[0], relu
            if m.root.op_type == "Div":
                if not _close(k, h):
                    return NoMatch(f"{m.root.label} divides by {k}, not by the Clip's upper bound {h}")
                m.data["gate"] = (x, 1.0 / k, bias / k)
            else:
                if not _close(k * h, 1.0):
                    return NoMatch(f"{m.root.label} multiplies by {k}, not by 1/{h} (the Clip's upper bound)")
                m.data["gate"] = (x, k, bias * k)
            return m
        return why

    def rewrite(self, m: Match, b: Builder) -> Value:
        x, alpha, beta = m.data["gate"]
        y = m["y"]
        gate = b.op(
            "HardSigmoid",
            [x],
            _hard_sigmoid_attrs(alpha, beta),
            types=result_type(shape_from=y, elem_from=y),  # elementwise of x: y's shape and type
            name=f"{m.root.name or 'hardswish'}_gate",
            out_names=[f"{y.name}_gate"],
        )
        return b.op("Mul", [x, gate], types=result_type(shape_from=y, elem_from=y), name=m.root.name or None)


class HardSwishFromGate(Rule):
    """%y = Mul(%x, HardSigmoid(%x) {alpha ≈ 1/6, beta ≈ 1/2}) -> %y = HardSwish(%x)  (opset >= 14)"""

    pattern = "y = Mul(p, q)"

    def __init__(self, opset: int = 21):
        self.opset = opset

    def check(self, m: Match) -> Match | NoMatch:
        if self.opset < HARDSWISH_OPSET:
            return NoMatch(
                f"the model imports opset {self.opset}; HardSwish is an operator from {HARDSWISH_OPSET}"
            )
        y = m.value("y")
        if y.elem is None or str(y.elem) != "f32":
            return NoMatch("not a float32 Mul")
        p, q = m.value("p"), m.value("q")
        for x, g in ((p, q), (q, p)):
            hs = _producer(g, "HardSigmoid")
            if hs is None or hs.inputs[0] is not x:
                continue
            alpha = float(hs.attrs.get("alpha", 0.2))
            beta = float(hs.attrs.get("beta", 0.5))
            if not (_close(alpha, 1.0 / 6.0) and _close(beta, 0.5)):
                return NoMatch(f"{hs.label} has alpha {alpha}, beta {beta}; HardSwish's are 1/6 and 1/2")
            if not _private(g, m.graph):
                return NoMatch(f"the gate {hs.label} has other users")
            m.data["x"] = x
            return m
        return NoMatch("not Mul(x, HardSigmoid(x))")

    def rewrite(self, m: Match, b: Builder) -> Value:
        return b.op(
            "HardSwish",
            [m.data["x"]],
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            name=m.root.name or None,
        )


class SoftplusFromLogExp(Rule):
    """%y = Log(Add(Exp(%x), 1)) -> %y = Softplus(%x)"""

    pattern = "y = Log(s = Add(p, q))"

    def check(self, m: Match) -> Match | NoMatch:
        found = _const_and_other(m.node("s"))
        if found is None or found[0] != 1.0:
            return NoMatch("the Log's input is not Add(e, 1)")
        exp = _producer(found[1], "Exp")
        if exp is None:
            return NoMatch("the Log's input is not Add(Exp(x), 1)")
        if not _private(found[1], m.graph):
            return NoMatch(f"{exp.label}'s output has other users")
        m.data["x"] = exp.inputs[0]
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        return b.op(
            "Softplus",
            [m.data["x"]],
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            name=m.root.name or None,
        )


class CanonicalizeActivations(RewritePass):
    """The rules above; HardSwishFromClip runs before HardSigmoidFromClip (which would
    otherwise take the inner Clip/Div of ``x · Clip(x + 3, 0, 6) / 6`` written as
    ``Mul(x, Div(Clip(...), 6))``: the gated pair it leaves is the same either way)."""

    name = "canonicalize_activations"

    def __init__(self, opset: int = 21, *, hardswish: bool = True):
        rules: list = [HardSigmoidFromClip(), SoftplusFromLogExp()]
        if hardswish:
            rules = [HardSwishFromClip(), rules[0], HardSwishFromGate(opset), rules[1]]
        super().__init__(rules)
