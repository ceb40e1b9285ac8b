"""A constant per-channel scale or shift after a float Conv folds into its weights and bias.

Rules (``optimize_float`` only: float graphs)::

    %y = Mul(%c = Conv(%x, %W, %B?), %s)   (either order)  -> %y = Conv(%x, %W', %B')
         W'[m] = W[m] · s[m]      B' = B · s
    %y = Add(%c = Conv(%x, %W, %B?), %t)   (either order)  -> %y = Conv(%x, %W, %B')
         B' = B + t
    %y = Sub(%c = Conv(%x, %W, %B?), %t)                   -> %y = Conv(%x, %W, %B')
         B' = B - t    (a BatchNormalization written out as Sub, Mul, Add: TF exports)

ConvTranspose (W: [C, M/group, k...], output channels on axis 1 of W) takes the shifts
only (``FoldConvTransposeAffine``, the float runtime's pipeline)::

    %y = Add(%c = ConvTranspose(%x, %W, %B?), %t)   (either order) -> %y = ConvTranspose(%x, %W, %B + t)
    %y = Sub(%c = ConvTranspose(%x, %W, %B?), %t)                  -> %y = ConvTranspose(%x, %W, %B - t)

PaddleOCR's DB heads write the ConvTranspose bias as a separate Add and a BatchNormalization
after it; once the Add is the bias, fold_batchnorm.py's ConvTranspose fold takes the
BatchNormalization too (three passes over the largest tensor of the model become none).
Without a bias B the fold is exact: the ConvTranspose twin adds its bias once after the
scatter (nn_conv.conv_transpose), the same float32 addition as the Add.

``s`` and ``t`` are float32 constants that are one value or one value per output channel
(shape ``[M, 1, 1]``, ``[1, M, 1, 1]``: every axis 1 but the Conv output's channel axis).

A positive scale also folds through a Relu or LeakyRelu between them
(``ScaleThroughRelu``, ``prepare_for_quantization`` only)::

    %y = Mul(%r = Relu(%c = Conv(%x, %W, %B?)), %s)   (either order, s > 0)
         -> %y = Relu(Conv(%x, %W', %B'))      W'[m] = W[m] · s[m]      B' = B · s

since s·max(z, 0) = max(s·z, 0) and s·LeakyRelu(z) = LeakyRelu(s·z) for s > 0 (positive
homogeneity). Why: Keras models put BatchNormalization after the activation, and tf2onnx
writes it as ``Add(Mul(Relu(Conv(x)), s), t)``. Left so, the quantized graph rounds the
Relu output, the product and the sum (three steps where a folded BatchNormalization has
one), and the Mul's per-channel factors are stored per tensor at the widest channel's
step (a U-Net's factors span 0.2 to 31: the smallest keeps one or two steps). Folded, the
factors sit in the per-channel weight scales and the product is never rounded; the
shift ``t`` stays an Add (after a Relu it does not commute into the Conv). A scale that
is zero or negative in some channel stays as written (zero: a channel of zero weights;
negative: max(s·z, 0) is then not s·max(z, 0)).

Why: Paddle's PP-OCRv4 models follow many convolutions with a learnable affine
(``mobile_one_block``: ``Add(Mul(w_0, conv), w_1)``, two scalars) before the hardswish;
each is a full pass over the output, and it hides the Conv from the gate fusion
(fuse_float_gate.py). ONNX Runtime folds the same pairs (its ConvMulFusion and
ConvAddFusion, basic level).

Numerics: not bit-exact with the graph as written, exactly as BatchNormalization folding
(fold_batchnorm.py): W' and B' are computed in float64 from the original constants and
rounded once to float32, so the product is W'·x instead of f32(f32(W·x)·s); the
difference is a few float32 roundings of each output, inside the float GEMM family's
bound (FG1) for the folded weights plus one ulp of the scale.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import describe

__all__ = [
    "AddIntoConv",
    "AddIntoConvTranspose",
    "FoldConvAffine",
    "FoldConvTransposeAffine",
    "MulIntoConv",
    "ScaleThroughRelu",
    "SubIntoConv",
    "SubIntoConvTranspose",
]


def _per_channel(v: Value | None, w: np.ndarray, m: int | None = None) -> np.ndarray | NoMatch:
    """The float64 factor per output channel ([M]; M = w.shape[0] unless given) of a
    constant that broadcasts along the Conv output's channel axis only (or is one value),
    or why not."""
    if v is None or v.const is None:
        return NoMatch(f"{describe(v)} is not a constant")
    a = np.asarray(v.const)
    if a.dtype != np.float32:
        return NoMatch(f"{describe(v)} is {a.dtype}, expected float32")
    m, rank = (w.shape[0] if m is None else m), w.ndim
    if a.size == 1:
        if a.ndim > rank:
            return NoMatch(f"{describe(v)} has rank {a.ndim} > the Conv output's {rank}")
        return np.full(m, float(a.reshape(())), np.float64)
    if a.ndim > rank or a.ndim < rank - 1:
        return NoMatch(
            f"{describe(v)} of shape {list(a.shape)} does not broadcast along the channel axis only"
        )
    shape = [1] * (rank - a.ndim) + list(a.shape)  # right-aligned with [N, M, spatial...]
    if shape[1] != m or any(d != 1 for k, d in enumerate(shape) if k != 1):
        return NoMatch(f"{describe(v)} of shape {list(a.shape)} is not one value per output channel ({m})")
    return a.reshape(-1).astype(np.float64)


class _AffineIntoConv(Rule):
    def check(self, m: Match) -> Match | NoMatch:
        w = m.const("W")
        if w is None or w.dtype != np.float32:
            return NoMatch(f"Conv weights {describe(m['W'])} are not a float32 constant")
        if m["B"] is not None and (m.const("B") is None or m.const("B").dtype != np.float32):
            return NoMatch(f"Conv bias {describe(m['B'])} is not a float32 constant")
        f = _per_channel(m["k"], w)
        if isinstance(f, NoMatch):
            return f
        m.data["f"] = f
        return m

    def folded(self, m: Match, w: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def rewrite(self, m: Match, b: Builder) -> Value:
        w = m.const("W")
        bias = np.zeros(w.shape[0]) if m["B"] is None else np.asarray(m.const("B"), np.float64)
        w2, b2 = self.folded(m, w, bias)
        conv = m.node("c")
        y = m.value("y")
        return b.op(
            "Conv",
            [m["x"], b.const(f"{m.value('W').name}_affine", w2), b.const(f"{y.name}_bias", b2)],
            conv.attrs,
            types=result_type(shape_from=y, elem_from=y),  # the replaced Mul / Add output's contract
            name=conv.name or None,
            attr_types=conv.attr_types,
        )


class MulIntoConv(_AffineIntoConv):
    """%y = Mul(%c = Conv(%x, %W, %B?), %k) -> %y = Conv(%x, %W·k, %B·k)"""

    pattern = "y = Mul(c = Conv(x, W, B?), k)"

    def folded(self, m: Match, w: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        f = m.data["f"]
        w2 = (w.astype(np.float64) * f.reshape(-1, *[1] * (w.ndim - 1))).astype(np.float32)
        return w2, (bias * f).astype(np.float32)


class MulIntoConvSwapped(MulIntoConv):
    pattern = "y = Mul(k, c = Conv(x, W, B?))"


class AddIntoConv(_AffineIntoConv):
    """%y = Add(%c = Conv(%x, %W, %B?), %k) -> %y = Conv(%x, %W, %B + k)"""

    pattern = "y = Add(c = Conv(x, W, B?), k)"

    def folded(self, m: Match, w: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return w, (bias + m.data["f"]).astype(np.float32)


class AddIntoConvSwapped(AddIntoConv):
    pattern = "y = Add(k, c = Conv(x, W, B?))"


class SubIntoConv(_AffineIntoConv):
    """%y = Sub(%c = Conv(%x, %W, %B?), %k) -> %y = Conv(%x, %W, %B - k)"""

    pattern = "y = Sub(c = Conv(x, W, B?), k)"

    def folded(self, m: Match, w: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return w, (bias - m.data["f"]).astype(np.float32)


class FoldConvAffine(RewritePass):
    name = "fold_conv_affine"
    rules = (MulIntoConv(), MulIntoConvSwapped(), AddIntoConv(), AddIntoConvSwapped(), SubIntoConv())


class MulThroughRelu(MulIntoConv):
    """%y = Mul(%r = Relu|LeakyRelu(%c = Conv(%x, %W, %B?)), %k), k > 0
    -> %y = Relu|LeakyRelu(Conv(%x, %W·k, %B·k))"""

    pattern = "y = Mul(r = Relu|LeakyRelu(c = Conv(x, W, B?)), k)"

    def check(self, m: Match) -> Match | NoMatch:
        got = super().check(m)
        if isinstance(got, NoMatch):
            return got
        f = m.data["f"]
        if not np.all(np.isfinite(f)) or not np.all(f > 0):
            return NoMatch(
                f"{describe(m['k'])} is not positive in every channel (min {float(np.min(f)):.3g})"
            )
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        act = m.node("r")
        y = m.value("y")
        conv = super().rewrite(m, b)
        return b.op(
            act.op_type,
            [conv],
            act.attrs,
            types=result_type(shape_from=y, elem_from=y),
            name=act.name or None,
            attr_types=act.attr_types,
        )


class MulThroughReluSwapped(MulThroughRelu):
    pattern = "y = Mul(k, r = Relu|LeakyRelu(c = Conv(x, W, B?)))"


class ScaleThroughRelu(RewritePass):
    name = "scale_through_relu"
    rules = (MulThroughRelu(), MulThroughReluSwapped())


class _ShiftIntoConvTranspose(Rule):
    sign = 1.0

    def check(self, m: Match) -> Match | NoMatch:
        w = m.const("W")
        if w is None or w.dtype != np.float32:
            return NoMatch(f"ConvTranspose weights {describe(m['W'])} are not a float32 constant")
        if m["B"] is not None and (m.const("B") is None or m.const("B").dtype != np.float32):
            return NoMatch(f"ConvTranspose bias {describe(m['B'])} is not a float32 constant")
        group = int(m.node("c").attrs.get("group", 1))
        f = _per_channel(m["k"], w, w.shape[1] * group)
        if isinstance(f, NoMatch):
            return f
        m.data["f"] = f
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        f = m.data["f"]
        bias = np.zeros(f.shape) if m["B"] is None else np.asarray(m.const("B"), np.float64)
        conv = m.node("c")
        y = m.value("y")
        return b.op(
            "ConvTranspose",
            [m["x"], m["W"], b.const(f"{y.name}_bias", (bias + self.sign * f).astype(np.float32))],
            conv.attrs,
            types=result_type(shape_from=y, elem_from=y),  # the replaced Add / Sub output's contract
            name=conv.name or None,
            attr_types=conv.attr_types,
        )


class AddIntoConvTranspose(_ShiftIntoConvTranspose):
    """%y = Add(%c = ConvTranspose(%x, %W, %B?), %k) -> %y = ConvTranspose(%x, %W, %B + k)"""

    pattern = "y = Add(c = ConvTranspose(x, W, B?), k)"


class AddIntoConvTransposeSwapped(AddIntoConvTranspose):
    pattern = "y = Add(k, c = ConvTranspose(x, W, B?))"


class SubIntoConvTranspose(_ShiftIntoConvTranspose):
    """%y = Sub(%c = ConvTranspose(%x, %W, %B?), %k) -> %y = ConvTranspose(%x, %W, %B - k)"""

    pattern = "y = Sub(c = ConvTranspose(x, W, B?), k)"
    sign = -1.0


class FoldConvTransposeAffine(RewritePass):
    name = "fold_conv_transpose_affine"
    rules = (AddIntoConvTranspose(), AddIntoConvTransposeSwapped(), SubIntoConvTranspose())
