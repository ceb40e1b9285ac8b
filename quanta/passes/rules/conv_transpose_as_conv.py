"""A 2-D ConvTranspose with stride s (the 2x2 / stride-2 upsampling of YOLOv8-seg's mask
prototypes and of PaddleOCR's DB heads, the 4x4 / stride-2 / pad-1 decoders of U-Nets and
ViT dense heads) is one Conv computing its s² output phases as channels, followed by
DepthToSpace (sub-pixel convolution); rewritten so before quantization, it quantizes
and runs as an integer convolution (ConvTranspose has no integer kernel) and a view.

ConvTransposeAsConv, per spatial axis (kernel k, stride s, pads p_b / p_e, output
padding o_p; weight ``w[C_i, C_o, k_h, k_w]``, bias ``b[C_o]``)::

    %y = ConvTranspose(%x, %w, %b?) {strides=[s, s], group=1, dilations=1}
      -> %y = DepthToSpace(Conv(%x, %w', %b') {kernel K, pads [P_b, P_e]}) {blocksize=s, mode=DCR}

ConvTranspose writes ``y[Y] = Σ_c Σ_i x[c, h]·w[c, o, i]`` over ``Y = h·s + i − p_b``.
For output phase ``a`` (``Y = s·q + a``) the taps are ``i = i0 + s·t`` with
``i0 = (a + p_b) mod s``, reading ``h = q + d − t``, ``d = ⌊(a + p_b)/s⌋``: a correlation
over input offsets ``d − t``. The union of the phases' offsets ``[lo, hi]`` is one Conv
of kernel ``K = hi − lo + 1`` with begin pad ``P_b = −lo`` whose tap ``r`` reads offset
``lo + r``; each phase's kernel holds ``w[.., i0 + s·(d − lo − r)]`` where that tap exists
and 0 elsewhere. The output ``H·s + c``, ``c = k − s − p_b − p_e + o_p``, must be a
multiple of s (``c mod s = 0``); then the Conv yields ``H + c/s`` positions with end pad
``P_e = c/s − 1 + K − P_b`` (for every H, so symbolic sizes work). DepthToSpace in DCR
mode (the default in every opset) moves channel ``(a·s + b')·C_o + o`` of ``(q_h, q_w)``
to ``(o, s·q_h + a, s·q_w + b')``, and the bias repeats per phase. Stride = kernel, no
pads: ``K = 1``. k=4, s=2, p=1: ``K = 3``, pads 1 (2.25x the MACs, in integers).

Equal up to float rounding: every output sums the same ``C_i·T`` products (the zero taps
add exact zeros) in the order each kernel chooses (tolerance γ_{C_i·K²+1}·Σ|x·w| per side).

Refused: unequal strides or stride 1, output_shape, dilations, groups, auto_pad other
than NOTSET / VALID, a non-constant weight or bias, a spatial rank other than 1 or 2, and
pads / output padding for which the output is not a multiple of the stride or a Conv
pad would be negative.

A 1-D ConvTranspose (weight ``w[C_i, C_o, k]``, the upsampling necks of 1-D segmentation
heads over signals) is the same rule on one axis. DepthToSpace is 4-D only, so the
phases move as ``Reshape [N, s, C_o, L] -> Transpose [N, C_o, L, s] -> Reshape
[N, C_o, L·s]``: channel ``a·C_o + o`` at position q goes to ``(o, s·q + a)``, as the
single-axis DCR order puts it. Views only, so the same products as the 2-D form. The
Reshapes take their shape as an input, as from opset 5 on; the rule runs where opsets are
10 or newer (quantization's minimum, QDQ files).

ConvTransposeUnitStride: with stride 1 on every axis (the 1x1 projections and the dilated
depthwise "deconvolutions" of streaming speech-enhancement decoders such as GTCRN's), a
ConvTranspose is a Conv over the same input with the kernel flipped, the weight's two
channel axes exchanged within each group, and the pads mirrored; groups and dilations
carry over unchanged (weight ``w[C_i, C_o/g, k...]``, dilation d, pads p_b / p_e,
output padding o_p per axis)::

    %y = ConvTranspose(%x, %w, %b?) {strides=1, group=g, dilations=d}
      -> %y = Conv(%x, %w', %b?) {group=g, dilations=d, pads [d·(k−1) − p_b, d·(k−1) − p_e + o_p]}
    w'[G·C_o/g + o, c, r...] = w[G·C_i/g + c, o, k−1−r...]

ConvTranspose writes ``y[Y] = Σ_c Σ_i x[c, Y + p_b − d·i]·w[c, o, i]``; with ``r = k−1−i``
that reads ``x[Y + d·r − (d·(k−1) − p_b)]``, a Conv's tap r under begin pad
``d·(k−1) − p_b``. Its output length ``H + d·(k−1) − p_b − p_e + o_p`` fixes the end pad.
Exact in structure (the same products, summed in the Conv's order: tolerance
γ_{C_i/g·Πk+1}·Σ|x·w| per side). Refused: a stride other than 1, output_shape, auto_pad
other than NOTSET / VALID, a non-constant weight or bias, a non-float32 weight, and pads
larger than ``d·(k−1)`` (a negative Conv pad: the ConvTranspose crops).

ConvTranspose1dAs2d: in a float graph a strided 1-D ConvTranspose (stride 1 is the Conv
above) is the 2-D one over a unit height, which the native float kernel runs (it takes 2-D
and 3-D weights)::

    %y = ConvTranspose(%x, %w, %b?) {strides [s], pads [p_b, p_e], dilations [d], group g}
      -> %y = Squeeze(ConvTranspose(Unsqueeze(%x, 2), %w[:, :, None, :], %b?), 2)
              {strides [1, s], pads [0, p_b, 0, p_e], dilations [1, d], group g}

The same products in the same order (the unit axis has one tap): exact. Refused: a
stride of 1, output_shape, auto_pad other than NOTSET / VALID, a non-constant weight, a
non-float32 weight.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.ir.types import QuantType, TensorType
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule

__all__ = [
    "ConvTranspose1dAs2d",
    "ConvTransposeAs2d",
    "ConvTransposeAsConv",
    "ConvTransposeAsConvs",
    "ConvTransposeUnitStride",
    "ConvTransposeUnitStrides",
    "QdqConvTransposeAsConv",
    "QdqConvTransposesAsConvs",
]


def _ints(v, n: int, default: int) -> list[int]:
    return [int(a) for a in v] if v is not None and len(v) else [default] * n


def _constant_kernel(m: Match, rank: int, *, or_more: bool = False) -> np.ndarray | NoMatch:
    """The ConvTranspose's float32 weight when it and the bias are constants, the weight
    of rank ``rank`` (or more) and ``kernel_shape`` (if given) its spatial shape; else why
    not."""
    w_v, b_v = m["w"], m["b"]
    if not w_v.is_const or (b_v is not None and not b_v.is_const):
        return NoMatch("the weight or the bias is not a constant")
    w = np.asarray(w_v.const)
    if not (w.ndim >= rank if or_more else w.ndim == rank) or w.dtype != np.float32:
        wanted = f"{rank} or more" if or_more else str(rank)
        return NoMatch(
            f"the weight is {w.dtype} of rank {w.ndim}; expected a float32 kernel of rank {wanted}"
        )
    n = w.ndim - 2
    if _ints(m.root.attrs.get("kernel_shape"), n, 0) not in ([int(k) for k in w.shape[2:]], [0] * n):
        return NoMatch("kernel_shape disagrees with the weight")
    return w


def _output_form_refusal(a: dict) -> NoMatch | None:
    """An explicit output_shape or a SAME auto_pad: forms the rewrites do not take."""
    if a.get("output_shape") is not None and len(a.get("output_shape")):
        return NoMatch("output_shape given")
    auto_pad = a.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    if auto_pad not in ("NOTSET", "VALID"):
        return NoMatch(f"auto_pad={auto_pad}")
    return None


def _phases(k: int, s: int, pb: int, pe: int, op: int) -> tuple[np.ndarray, int, int] | None:
    """One spatial axis: the selection ``M[a, r, i]`` (1 where kernel tap ``i`` feeds
    output phase ``a`` through Conv tap ``r``), the Conv's kernel size and its pads
    (begin, end); None when the output length is not a multiple of the stride."""
    c = k - s - pb - pe + op  # out = H·s + c
    if c % s:
        return None
    i0 = [(a + pb) % s for a in range(s)]
    d = [(a + pb) // s for a in range(s)]
    taps = [len(range(i0[a], k, s)) for a in range(s)]
    lo = min(d[a] - taps[a] + 1 for a in range(s))
    hi = max(d)
    size = hi - lo + 1
    m = np.zeros((s, size, k), np.float64)
    for a in range(s):
        for t in range(taps[a]):
            m[a, d[a] - t - lo, i0[a] + s * t] = 1.0
    begin = -lo
    end = c // s - 1 + size - begin
    return (m, begin, end) if begin >= 0 and end >= 0 else None


def _phases_shape(y: Value, s: int, co: int) -> tuple | None:
    """The shape of the Conv over the s² output phases of ConvTranspose output ``y``
    [N, C_o, OH, OW]: [N, s²·C_o, OH / s, OW / s] (None when y's rank is unknown)."""
    if y.shape is None or len(y.shape) != 4:
        return None
    n, _, oh, ow = y.shape
    return (n, s * s * co, oh // s if isinstance(oh, int) else None, ow // s if isinstance(ow, int) else None)


def _phases_shape_1d(y: Value, s: int, co: int) -> tuple | None:
    """The shape of the Conv over the s output phases of a 1-D ConvTranspose output
    ``y`` [N, C_o, OL]: [N, s·C_o, OL / s] (None when y's rank is unknown)."""
    if y.shape is None or len(y.shape) != 3:
        return None
    n, _, ol = y.shape
    return (n, s * co, ol // s if isinstance(ol, int) else None)


def _move_phases(
    b: Builder, src: Value, n: int, s: int, co: int, y: Value, elem_from: Value, name: str
) -> Value:
    """The phases ``src`` holds as channels (phase-major, DCR) moved to their places in
    ``y``'s layout: DepthToSpace for a 2-D output, Reshape / Transpose / Reshape for 1-D
    (the same element moves; views, so ``src``'s element type carries through); ``n`` is
    the spatial rank."""
    if n == 2:
        return b.op(
            "DepthToSpace",
            [src],
            {"blocksize": s},
            types=result_type(shape_from=y, elem_from=elem_from),
            name=name,
        )
    n, _, q = src.shape if src.shape is not None else (None, None, None)
    split = b.op(
        "Reshape",
        [src, b.const(f"{name}_split_shape", np.array([0, s, co, -1], np.int64))],
        types=result_type(shape_from=(n, s, co, q), elem_from=elem_from),
        name=f"{name}/split",
    )
    moved = b.op(
        "Transpose",
        [split],
        {"perm": [0, 2, 3, 1]},
        types=result_type(shape_from=(n, co, q, s), elem_from=elem_from),
        name=f"{name}/interleave",
    )
    return b.op(
        "Reshape",
        [moved, b.const(f"{name}_merge_shape", np.array([0, 0, -1], np.int64))],
        types=result_type(shape_from=y, elem_from=elem_from),
        name=name,
    )


class ConvTransposeAsConv(Rule):
    """%y = ConvTranspose(x, w, b?) {stride s} -> DepthToSpace(Conv(x, w', b'), s)"""

    pattern = "y = ConvTranspose(x, w, b?)"

    def check(self, m: Match) -> Match | NoMatch:
        w = _constant_kernel(m, 3, or_more=True)
        if isinstance(w, NoMatch):
            return w
        n = w.ndim - 2
        if n not in (1, 2):
            return NoMatch(f"a {n}-D ConvTranspose; the rule takes 1-D and 2-D")
        a = m.root.attrs
        strides = _ints(a.get("strides"), n, 1)
        if len(set(strides)) != 1 or strides[0] < 2:
            return NoMatch(f"strides {strides}: not one stride >= 2 on every axis")
        s = strides[0]
        if _ints(a.get("dilations"), n, 1) != [1] * n or int(a.get("group", 1)) != 1:
            return NoMatch("dilations or groups")
        refusal = _output_form_refusal(a)
        if refusal is not None:
            return refusal
        if m["x"].shape is not None and len(m["x"].shape) != n + 2:
            return NoMatch(f"the input is not {n + 2}-D")
        pads = _ints(a.get("pads"), 2 * n, 0)
        op = _ints(a.get("output_padding"), n, 0)
        axes = [_phases(k, s, pads[d], pads[d + n], op[d]) for d, k in enumerate(w.shape[2:])]
        if any(ax is None for ax in axes):
            return NoMatch(
                "the output is not a stride multiple of phases one Conv computes (pads, output_padding)"
            )
        m.data["axes"] = axes
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        w = np.asarray(m.const("w"))
        co = w.shape[1]
        axes = m.data["axes"]
        s = axes[0][0].shape[0]
        w2 = _relaid(w.astype(np.float64), axes).astype(np.float32)
        inputs = [m["x"], b.const(f"{m['w'].name}_as_conv", w2)]
        if m["b"] is not None:
            bias = np.asarray(m.const("b"), np.float32).reshape(co)
            inputs.append(b.const(f"{m['b'].name}_as_conv", np.tile(bias, s ** len(axes))))
        y = m["y"]
        conv = b.op(
            "Conv",
            inputs,
            _conv_attrs(axes),
            types=result_type(shape_from=_conv_shape(y, s, co, len(axes)), elem_from=y),
            name=f"{m.root.name}/as_conv",
        )
        return _move_phases(b, conv, len(axes), s, co, y, y, m.root.name)


def _relaid(w: np.ndarray, axes: list) -> np.ndarray:
    """The Conv weight over the output phases: ``w'[(a·s + b)·C_o + o, c, r, q] =
    Σ_ij w[c, o, i, j]·Mh[a, r, i]·Mw[b, q, j]`` (2-D; 1-D: ``w'[a·C_o + o, c, r] =
    Σ_i w[c, o, i]·M[a, r, i]``), a selection, so exact in the input's dtype."""
    ci, co = w.shape[:2]
    if len(axes) == 2:
        (mh, _, _), (mw, _, _) = axes
        s = mh.shape[0]
        w2 = np.einsum("coij,ari,bqj->abocrq", w, mh, mw)
        return np.ascontiguousarray(w2.reshape(s * s * co, ci, mh.shape[1], mw.shape[1]))
    (mx, _, _) = axes[0]
    w2 = np.einsum("coi,ari->aocr", w, mx)
    return np.ascontiguousarray(w2.reshape(mx.shape[0] * co, ci, mx.shape[1]))


def _conv_attrs(axes: list) -> dict:
    return {
        "kernel_shape": [ax[0].shape[1] for ax in axes],
        "strides": [1] * len(axes),
        "pads": [ax[1] for ax in axes] + [ax[2] for ax in axes],
    }


def _conv_shape(y: Value, s: int, co: int, n: int) -> tuple | None:
    return _phases_shape(y, s, co) if n == 2 else _phases_shape_1d(y, s, co)


def _dq_of_const(v: Value, what: str):
    """The DequantizeLinear node of ``v`` when it dequantizes a constant with constant
    parameters, unblocked; else why not."""
    dq = v.producer
    if dq is None or dq.op_type != "DequantizeLinear" or dq.domain or not dq.inputs[0].is_const:
        return NoMatch(f"the {what} is not DequantizeLinear of a constant")
    if any(p is not None and not p.is_const for p in dq.inputs[1:]):
        return NoMatch(f"the {what}'s scale or zero point is not a constant")
    if dq.attrs.get("block_size"):
        return NoMatch(f"the {what} is quantized per block")
    return dq


class QdqConvTransposeAsConv(ConvTransposeAsConv):
    """A quantized file's strided ConvTranspose (``DQ(w) -> ConvTranspose -> Q``, as ONNX
    Runtime's QDQ format writes the 2x2 / stride-2 upsampling of CenterFace's and
    PP-OCR's DB heads) -> ``Q(Conv) -> DepthToSpace``: the integer convolution over the
    output phases, then the phases moved on the integers::

        %q = QuantizeLinear(ConvTranspose(%x, DQ(%wq, %sw, %zw), DQ(%bq, %sb, %zb)?), %sy, %zy)
          -> %q = DepthToSpace(QuantizeLinear(Conv(%x, DQ(%wq', %sw', %zw'), DQ(%bq', %sb', %zb')?), %sy, %zy))

    The weight's integers are re-laid as in :class:`ConvTransposeAsConv` (a selection),
    the taps no phase reads set to the zero point, so they dequantize to exact zeros; a
    per-output-channel scale (axis 1 of the ConvTranspose weight) and the bias repeat
    per phase. DepthToSpace only moves elements, so quantizing before it is quantizing
    after it: the rewrite returns ``DQ(DepthToSpace(...), sy, zy)``, whose ``Q -> DQ``
    pair with the file's QuantizeLinear :mod:`.remove_noops` removes. Every output
    sums the same products as the ConvTranspose (the zero taps add exact zeros).

    Refused, beyond :class:`ConvTransposeAsConv`'s refusals: a weight or bias that is
    not DequantizeLinear of a constant, a weight quantized along an axis other than the
    output channels (1), an output read by anything but one per-tensor QuantizeLinear."""

    pattern = "y = ConvTranspose(x, w, b?)"

    def check(self, m: Match) -> Match | NoMatch:
        dq = _dq_of_const(m["w"], "weight")
        if isinstance(dq, NoMatch):
            return dq
        codes = np.asarray(dq.inputs[0].const)
        if codes.ndim not in (3, 4):
            return NoMatch(f"the quantized weight has rank {codes.ndim}")
        if np.asarray(dq.inputs[1].const).size > 1 and int(dq.attrs.get("axis", 1)) % codes.ndim != 1:
            return NoMatch("the weight is quantized along an axis other than the output channels")
        bias_dq = None
        if m["b"] is not None and not m["b"].is_const:
            bias_dq = _dq_of_const(m["b"], "bias")
            if isinstance(bias_dq, NoMatch):
                return bias_dq
        y = m["y"]
        uses = list(y.uses)
        if len(uses) != 1 or uses[0][0].op_type != "QuantizeLinear" or uses[0][0].domain or uses[0][1] != 0:
            return NoMatch("the output is not read by one QuantizeLinear alone")
        q = uses[0][0]
        if any(p is not None and not p.is_const for p in q.inputs[1:]):
            return NoMatch("the output's QuantizeLinear has a non-constant scale or zero point")
        if np.asarray(q.inputs[1].const).size != 1:
            return NoMatch("the output is quantized per channel")
        if any(o is y for o in m.graph.outputs):
            return NoMatch("the output is a graph output")
        # the float rule's checks on the kernel shape, strides, pads and groups
        float_m = super().check(_WithKernel(m, codes))
        if isinstance(float_m, NoMatch):
            return float_m
        m.data.update(dq=dq, bias_dq=bias_dq, q=q)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        dq, bias_dq, q = m.data["dq"], m.data["bias_dq"], m.data["q"]
        codes = np.asarray(dq.inputs[0].const)
        co = codes.shape[1]
        axes = m.data["axes"]
        s = axes[0][0].shape[0]
        reps = s ** len(axes)
        per_channel = np.asarray(dq.inputs[1].const).size > 1
        zw = np.zeros(1, np.int64) if dq.inputs[2] is None else np.asarray(dq.inputs[2].const, np.int64)
        ones = (1,) * (codes.ndim - 2)
        zw_o = zw.reshape(1, -1, *ones) if per_channel else zw.reshape(1, 1, *ones)
        # the selection of the float rule on the codes less their zero point (exact in
        # float64: 8-bit integers, one tap each), the zero point added back
        sel = _relaid((codes.astype(np.int64) - zw_o).astype(np.float64), axes)
        w2 = np.rint(sel).astype(np.int64)
        zw2 = np.tile(zw.reshape(-1), reps) if per_channel else zw.reshape(-1)
        w2 = (w2 + (zw2.reshape(-1, 1, *ones) if per_channel else zw2.reshape(1, 1, *ones))).astype(
            codes.dtype
        )
        weight = self._dq(b, dq, w2, per_channel, reps, m["w"])
        inputs = [m["x"], weight]
        if m["b"] is not None:
            if bias_dq is None:
                bias = np.asarray(m.const("b"), np.float32).reshape(co)
                inputs.append(b.const(f"{m['b'].name}_as_conv", np.tile(bias, reps)))
            else:
                bq = np.asarray(bias_dq.inputs[0].const).reshape(co)
                b_pc = np.asarray(bias_dq.inputs[1].const).size > 1
                inputs.append(self._dq(b, bias_dq, np.tile(bq, reps), b_pc, reps, m["b"]))
        y = m["y"]
        shape = _conv_shape(y, s, co, len(axes))
        conv = b.op(
            "Conv",
            inputs,
            _conv_attrs(axes),
            types=result_type(shape_from=shape, elem_from=y),
            name=m.root.name,
        )
        q_out = q.outputs[0]
        quantized = b.op(
            "QuantizeLinear",
            [conv, *q.inputs[1:]],
            dict(q.attrs),
            types=result_type(shape_from=shape, elem_from=q_out),
            name=f"{m.root.name}/as_conv_quantized",
        )
        moved = _move_phases(b, quantized, len(axes), s, co, y, q_out, f"{m.root.name}/phases")
        return b.op(
            "DequantizeLinear",
            [moved, *q.inputs[1:]],
            {k: v for k, v in q.attrs.items() if k in ("axis",)},
            types=result_type(shape_from=y, elem_from=y),
            name=f"{m.root.name}/phases_dequantized",
        )

    @staticmethod
    def _dq(b: Builder, dq, data: np.ndarray, per_channel: bool, reps: int, like: Value) -> Value:
        """DequantizeLinear of the re-laid integers ``data``: per-channel parameters
        repeated ``reps`` times along the new axis 0."""
        codes = dq.inputs[0]
        params = list(dq.inputs[1:])
        attrs = {k: v for k, v in dq.attrs.items() if k != "axis"}
        elem = codes.type.elem if codes.type is not None else None
        if per_channel:
            params = [
                None
                if p is None
                else b.const(f"{p.name}_phases", np.tile(np.asarray(p.const).reshape(-1), reps))
                for p in params
            ]
            attrs["axis"] = 0
            if isinstance(elem, QuantType):
                elem = dataclasses.replace(
                    elem, scale=elem.scale * reps, zero_point=elem.zero_point * reps, axis=0
                )
        q_type = TensorType(elem, tuple(data.shape)) if elem is not None else None
        return b.op(
            "DequantizeLinear",
            [b.const(f"{codes.name}_as_conv", data, q_type), *params],
            attrs,
            types=result_type(shape_from=tuple(data.shape), elem_from=like),
            name=f"{dq.name}_as_conv",
        )


class _WithKernel:
    """A match seen with the float rule's eyes: ``w`` the quantized weight's integers
    (float32, for the shape checks), everything else the match's own."""

    def __init__(self, m: Match, codes: np.ndarray) -> None:
        self._m, self._w = m, codes

    def __getitem__(self, name: str):
        if name == "w":
            return _ConstView(self._w)
        if name == "b":
            return None
        return self._m[name]

    def __getattr__(self, name: str):
        return getattr(self._m, name)


class _ConstView:
    def __init__(self, codes: np.ndarray) -> None:
        self.const = codes.astype(np.float32)
        self.is_const = True


class ConvTransposeUnitStride(Rule):
    """%y = ConvTranspose(x, w, b?) {strides 1} -> Conv(x, w', b?) (module docstring)"""

    pattern = "y = ConvTranspose(x, w, b?)"

    def check(self, m: Match) -> Match | NoMatch:
        w = _constant_kernel(m, 3, or_more=True)
        if isinstance(w, NoMatch):
            return w
        a = m.root.attrs
        n = w.ndim - 2
        kernel = [int(k) for k in w.shape[2:]]
        if _ints(a.get("strides"), n, 1) != [1] * n:
            return NoMatch("a stride other than 1")
        refusal = _output_form_refusal(a)
        if refusal is not None:
            return refusal
        group = int(a.get("group", 1))
        if w.shape[0] % group:
            return NoMatch(f"{w.shape[0]} input channels are not a multiple of group={group}")
        dil = _ints(a.get("dilations"), n, 1)
        pads = _ints(a.get("pads"), 2 * n, 0)
        op = _ints(a.get("output_padding"), n, 0)
        begin = [d * (k - 1) - pads[i] for i, (d, k) in enumerate(zip(dil, kernel, strict=True))]
        end = [d * (k - 1) - pads[n + i] + op[i] for i, (d, k) in enumerate(zip(dil, kernel, strict=True))]
        if min(begin + end) < 0:
            return NoMatch(f"pads {pads} exceed dilation x (kernel - 1): the Conv's pads would be negative")
        m.data.update(group=group, dilations=dil, pads=begin + end)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        w = np.asarray(m.const("w"))
        g = m.data["group"]
        ci, cog = w.shape[:2]
        spatial = w.shape[2:]
        # [g, C_i/g, C_o/g, k...] -> [g, C_o/g, C_i/g, k...] -> [C_o, C_i/g, k...], kernel flipped
        w2 = w.reshape(g, ci // g, cog, *spatial).swapaxes(1, 2).reshape(g * cog, ci // g, *spatial)
        w2 = np.ascontiguousarray(np.flip(w2, axis=tuple(range(2, w2.ndim))))
        inputs = [m["x"], b.const(f"{m['w'].name}_as_conv", w2)]
        if m["b"] is not None:
            inputs.append(m["b"])
        y = m["y"]
        return b.op(
            "Conv",
            inputs,
            {
                "kernel_shape": list(spatial),
                "strides": [1] * len(spatial),
                "dilations": m.data["dilations"],
                "group": g,
                "pads": m.data["pads"],
            },
            types=result_type(shape_from=y, elem_from=y),
            name=m.root.name,
        )


class ConvTranspose1dAs2d(Rule):
    """%y = ConvTranspose(x, w, b?) {1-D, stride s > 1} -> Squeeze(ConvTranspose(Unsqueeze(x), w'), 2)
    (module docstring)"""

    pattern = "y = ConvTranspose(x, w, b?)"

    def __init__(self, opset: int = 21) -> None:
        self.opset = opset

    def check(self, m: Match) -> Match | NoMatch:
        w = _constant_kernel(m, 3)
        if isinstance(w, NoMatch):
            return w
        a = m.root.attrs
        if _ints(a.get("strides"), 1, 1) == [1]:
            return NoMatch("stride 1: the Conv it is (ConvTransposeUnitStride)")
        refusal = _output_form_refusal(a)
        if refusal is not None:
            return refusal
        if m["x"].shape is not None and len(m["x"].shape) != 3:
            return NoMatch("the input is not 3-D")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        w = np.asarray(m.const("w"))
        a = m.root.attrs
        x, y = m["x"], m["y"]
        pads = _ints(a.get("pads"), 2, 0)
        attrs = {
            "kernel_shape": [1, int(w.shape[2])],
            "strides": [1, _ints(a.get("strides"), 1, 1)[0]],
            "dilations": [1, _ints(a.get("dilations"), 1, 1)[0]],
            "pads": [0, pads[0], 0, pads[1]],
            "group": int(a.get("group", 1)),
        }
        op = _ints(a.get("output_padding"), 1, 0)
        if op != [0]:
            attrs["output_padding"] = [0, op[0]]
        x4 = None if x.shape is None else (x.shape[0], x.shape[1], 1, x.shape[2])
        y4 = None if y.shape is None or len(y.shape) != 3 else (y.shape[0], y.shape[1], 1, y.shape[2])
        inputs = [self._axes(b, "Unsqueeze", x, x4, x), b.const(f"{m['w'].name}_2d", w[:, :, None, :])]
        if m["b"] is not None:
            inputs.append(m["b"])
        deconv = b.op(
            "ConvTranspose", inputs, attrs, types=result_type(shape_from=y4, elem_from=y), name=m.root.name
        )
        return self._axes(b, "Squeeze", deconv, y.shape, y)

    def _axes(self, b: Builder, op: str, v: Value, shape: tuple | None, elem_from: Value) -> Value:
        """Squeeze / Unsqueeze of axis 2 in the form the opset takes (an attribute before
        13, a constant input from 13 on)."""
        types = result_type(shape_from=shape, elem_from=elem_from)
        name = f"{b.match.root.name or 'conv_transpose'}/{op.lower()}"
        if self.opset < 13:
            return b.op(op, [v], {"axes": [2]}, types=types, name=name)
        return b.op(op, [v, b.const("axis_2", np.asarray([2], np.int64))], types=types, name=name)


class ConvTransposeAsConvs(RewritePass):
    name = "conv_transpose_as_conv"

    def __init__(self) -> None:
        super().__init__([ConvTransposeAsConv(), ConvTransposeUnitStride()])


class QdqConvTransposesAsConvs(RewritePass):
    """The quantized-file rule alone, for the lowering of QDQ files (``lower_qdq``)."""

    name = "qdq_conv_transpose_as_conv"

    def __init__(self) -> None:
        super().__init__([QdqConvTransposeAsConv()])


class ConvTransposeUnitStrides(RewritePass):
    """The stride-1 rule alone, for float graphs (``optimize_float``): a stride-1
    ConvTranspose then runs on the native Conv paths (pointwise, depthwise, NCHW16c)
    instead of a GEMM followed by col2im over the whole canvas, the same products within
    the float GEMM family's bound (docs/float-ops.md (FG1)). The strided rule stays out:
    its Conv over the output phases multiplies zero taps in float."""

    name = "conv_transpose_unit_stride"

    def __init__(self) -> None:
        super().__init__([ConvTransposeUnitStride()])


class ConvTransposeAs2d(RewritePass):
    """The 1-D rule alone, for float graphs (``optimize_float``): a strided 1-D
    ConvTranspose runs on the native 2-D float kernel instead of the reference twin."""

    name = "conv_transpose_1d_as_2d"

    def __init__(self, opset: int = 21) -> None:
        super().__init__([ConvTranspose1dAs2d(opset)])
