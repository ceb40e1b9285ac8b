"""Fold an explicit zero ``Pad`` into the padding of the ``Conv`` that reads it.

Exporters of TensorFlow-style "same" padding (EfficientNet, MobileNet ports) write an
explicit ``Pad`` before a convolution whose own ``pads`` are zero. Left in place, the Pad
is a float op between a quantized activation and a quantized convolution; folded, the
convolution reads the activation directly.

FoldPadIntoConv (spatial rank n, Pad's pads over all r = n + 2 axes as
``[b_0, ..., b_{r-1}, e_0, ..., e_{r-1}]``, Conv's as ``[p_0, ..., p_{n-1}, q_0, ..., q_{n-1}]``)::

    %y = Conv(%p = Pad(%x, %pads, %v?, %axes?) {mode=constant}, %W, %B?) {pads=[p, q]}
      -> %y = Conv(%x, %W, %B?) {pads=[p_i + b_{i+2}, q_i + e_{i+2}]}

Exact, bit for bit: a Conv pads its input with zeros before the windows are read (the
reference's ``x_padded``; ONNX Conv), so padding with +0.0 first and then by ``p, q``
gives the convolution the same padded tensor as padding by ``p + b, q + e`` at once;
output sizes ``floor((H + p + b + q + e - dk)/s) + 1`` agree. Hence only:

- ``mode=constant`` with value +0.0 (omitted, empty, or a constant +0.0; a -0.0 fill
  would differ in the sign of a zero result);
- pads that are constants, zero on the batch and channel axes, non-negative on the
  spatial axes (a negative pad crops, which no Conv padding expresses);
- Conv ``auto_pad`` NOTSET or VALID (VALID means zero pads; SAME_* would re-derive the
  pads from the padded size).

The Pad's output used by another node refuses the match (engine), so the Pad is never
duplicated. Pooling is not folded here: ``AveragePool`` divides by the count of
non-padding elements unless ``count_include_pad``, and ``MaxPool`` pads with -inf.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import describe

__all__ = ["FoldPad", "FoldPadIntoConv"]


def _mode(node) -> str:
    mode = node.attrs.get("mode", "constant")
    return mode.decode() if isinstance(mode, bytes) else str(mode)


def _is_positive_zero(v: np.ndarray) -> bool:
    v = np.asarray(v)
    return v.size == 0 or bool(np.all(v == 0) and not np.any(np.signbit(v)))


def _begin_end(m: Match, rank: int) -> tuple[list[int], list[int]] | NoMatch:
    """The Pad's per-axis begin / end pads over all ``rank`` axes (a Pad before opset
    11 takes its pads as an attribute and has one input: the pattern skips it)."""
    if not m.is_const("pads"):
        return NoMatch(f"pads {describe(m['pads'])} are not a constant")
    pads = [int(v) for v in np.asarray(m.const("pads")).reshape(-1)]
    if m["axes"] is None:
        axes = list(range(rank))
    elif not m.is_const("axes"):
        return NoMatch(f"axes {describe(m['axes'])} are not a constant")
    else:
        axes = [int(a) % rank for a in np.asarray(m.const("axes")).reshape(-1)]
    if len(pads) != 2 * len(axes):
        return NoMatch(f"{len(pads)} pads for {len(axes)} axes")
    begin, end = [0] * rank, [0] * rank
    for i, a in enumerate(axes):
        begin[a] += pads[i]
        end[a] += pads[len(axes) + i]
    return begin, end


class FoldPadIntoConv(Rule):
    """%y = Conv(%p = Pad(%x, %pads, %v?, %axes?), %W, %B?) -> %y = Conv(%x, %W, %B?) {pads += spatial pads}

    Conv pads ``[p_i + b_{i+2}, q_i + e_{i+2}]`` for Pad pads ``[b, e]`` (module docstring).
    """

    pattern = "y = Conv(p = Pad(x, pads, v?, axes?), W, B?)"

    def check(self, m: Match) -> Match | NoMatch:
        pad, conv = m.node("p"), m.root
        if _mode(pad) != "constant":
            return NoMatch(f"Pad mode is {_mode(pad)!r}: only constant padding is what a Conv pads with")
        if m["v"] is not None:
            if not m.is_const("v"):
                return NoMatch(f"the pad value {describe(m['v'])} is not a constant")
            if not _is_positive_zero(m.const("v")):
                shown = np.asarray(m.const("v")).reshape(-1)[:1].tolist()
                return NoMatch(f"the pad value is {shown} (not +0.0): a Conv pads with zeros")
        w = m.value("W")
        if w.shape is None:
            return NoMatch(f"W {describe(w)} has an unknown rank")
        rank = len(w.shape)
        auto_pad = conv.attrs.get("auto_pad", "NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
        if auto_pad not in ("NOTSET", "VALID"):
            return NoMatch(f"Conv auto_pad is {auto_pad}: its pads depend on the input size")
        got = _begin_end(m, rank)
        if isinstance(got, NoMatch):
            return got
        begin, end = got
        if begin[:2] != [0, 0] or end[:2] != [0, 0]:
            return NoMatch(f"Pad pads the batch or channel axis (begin {begin[:2]}, end {end[:2]})")
        if any(p < 0 for p in begin + end):
            return NoMatch(f"a negative pad (begin {begin}, end {end}) crops: no Conv padding expresses it")
        n = rank - 2
        old = [0] * (2 * n) if auto_pad == "VALID" else [int(p) for p in conv.attrs.get("pads", [0] * (2 * n))]
        if len(old) != 2 * n:
            return NoMatch(f"Conv has {len(old)} pads for {n} spatial axes")
        m.data["pads"] = [old[i] + begin[i + 2] for i in range(n)] + [old[n + i] + end[i + 2] for i in range(n)]
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        conv, y = m.root, m.value("y")
        attrs = {k: v for k, v in conv.attrs.items() if k != "auto_pad"}
        attrs["pads"] = m.data["pads"]
        return b.op(
            "Conv",
            [m.value("x"), m.value("W"), m["B"]],
            attrs,
            types=result_type(shape_from=y, elem_from=y),  # the replaced Conv output's contract
            name=conv.name or None,
            attr_types={k: t for k, t in conv.attr_types.items() if k != "auto_pad"},
        )


class FoldPad(RewritePass):
    name = "fold_pad"
    rules = (FoldPadIntoConv(),)
