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

FoldPadIntoAveragePool, the same sum of pads, with ``count_include_pad=1``::

    %y = AveragePool(%p = Pad(%x, ...)) {pads=[p, q], count_include_pad=c}
      -> %y = AveragePool(%x) {pads=[p_i + b_{i+2}, q_i + e_{i+2}], count_include_pad=1}

Exact when the divisor was already the kernel size over the padded tensor: ``ceil_mode=0``
(no window reaches past the padding) and either ``count_include_pad=1`` or no pads of
its own.

FoldPadIntoMaxPool: a MaxPool pads with -inf; an edge Pad before an undilated MaxPool
(TF's "same" MaxPool) or a zero Pad of a non-negative input (after a Relu) give the same
maxima, when no window lies in the padding alone (its docstring).

The Pad's output used by another node refuses the match (engine), so the Pad is never
duplicated.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import describe

__all__ = ["FoldPad", "FoldPadIntoAveragePool", "FoldPadIntoConv", "FoldPadIntoMaxPool"]


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


def _summed_pads(m: Match, op: str, rank: int | None) -> list[int] | NoMatch:
    """The consumer's new ``pads`` (its own plus the Pad's spatial ones), or why not."""
    pad, consumer = m.node("p"), m.root
    if _mode(pad) != "constant":
        return NoMatch(f"Pad mode is {_mode(pad)!r}: only constant padding is what a {op} pads with")
    if m["v"] is not None:
        if not m.is_const("v"):
            return NoMatch(f"the pad value {describe(m['v'])} is not a constant")
        if not _is_positive_zero(m.const("v")):
            shown = np.asarray(m.const("v")).reshape(-1)[:1].tolist()
            return NoMatch(f"the pad value is {shown} (not +0.0): a {op} pads with zeros")
    if rank is None:
        return NoMatch("the rank is unknown")
    auto_pad = consumer.attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    if auto_pad not in ("NOTSET", "VALID"):
        return NoMatch(f"{op} auto_pad is {auto_pad}: its pads depend on the input size")
    got = _begin_end(m, rank)
    if isinstance(got, NoMatch):
        return got
    begin, end = got
    if begin[:2] != [0, 0] or end[:2] != [0, 0]:
        return NoMatch(f"Pad pads the batch or channel axis (begin {begin[:2]}, end {end[:2]})")
    if any(p < 0 for p in begin + end):
        return NoMatch(f"a negative pad (begin {begin}, end {end}) crops: no {op} padding expresses it")
    n = rank - 2
    old = (
        [0] * (2 * n) if auto_pad == "VALID" else [int(p) for p in consumer.attrs.get("pads", [0] * (2 * n))]
    )
    if len(old) != 2 * n:
        return NoMatch(f"{op} has {len(old)} pads for {n} spatial axes")
    return [old[i] + begin[i + 2] for i in range(n)] + [old[n + i] + end[i + 2] for i in range(n)]


def _refolded(m: Match, b: Builder, inputs: list[Value | None], **changed: int | list[int]) -> Value:
    node, y = m.root, m.value("y")
    attrs = {k: v for k, v in node.attrs.items() if k != "auto_pad"}
    attrs.update(changed)
    return b.op(
        node.op_type,
        inputs,
        attrs,
        types=result_type(shape_from=y, elem_from=y),  # the replaced op's output contract
        name=node.name or None,
        attr_types={k: t for k, t in node.attr_types.items() if k not in ("auto_pad", *changed)},
    )


class FoldPadIntoConv(Rule):
    """%y = Conv(%p = Pad(%x, %pads, %v?, %axes?), %W, %B?) -> %y = Conv(%x, %W, %B?) {pads += spatial pads}

    Conv pads ``[p_i + b_{i+2}, q_i + e_{i+2}]`` for Pad pads ``[b, e]`` (module docstring).
    """

    pattern = "y = Conv(p = Pad(x, pads, v?, axes?), W, B?)"

    def check(self, m: Match) -> Match | NoMatch:
        w = m.value("W")
        if w.shape is None:
            return NoMatch(f"W {describe(w)} has an unknown rank")
        pads = _summed_pads(m, "Conv", len(w.shape))
        if isinstance(pads, NoMatch):
            return pads
        m.data["pads"] = pads
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        return _refolded(m, b, [m.value("x"), m.value("W"), m["B"]], pads=m.data["pads"])


class FoldPadIntoAveragePool(Rule):
    """%y = AveragePool(%p = Pad(%x, %pads, %v?, %axes?)) -> %y = AveragePool(%x) {pads += spatial pads, count_include_pad=1}

    Exact when every window lies inside the padded tensor (``ceil_mode=0``) and the
    divisor already counted the padded cells: ``count_include_pad=1``, or no pads of
    its own (then every cell it sees is an input cell: the kernel size). The sums read
    the same zero-padded tensor.
    """

    pattern = "y = AveragePool(p = Pad(x, pads, v?, axes?))"

    def check(self, m: Match) -> Match | NoMatch:
        pool = m.root
        if int(pool.attrs.get("ceil_mode", 0)):
            return NoMatch("AveragePool has ceil_mode=1: a window past the padding would count differently")
        own = [int(p) for p in pool.attrs.get("pads", [])]
        if not int(pool.attrs.get("count_include_pad", 0)) and any(own):
            return NoMatch(
                "AveragePool has pads of its own and count_include_pad=0: its divisor excludes them, the Pad's cells count"
            )
        x = m.value("x")
        pads = _summed_pads(m, "AveragePool", None if x.shape is None else len(x.shape))
        if isinstance(pads, NoMatch):
            return pads
        m.data["pads"] = pads
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        return _refolded(m, b, [m.value("x")], pads=m.data["pads"], count_include_pad=1)


def _non_negative(v: Value) -> bool:
    """``v`` is never negative: a Relu's output, or a Clip's with a lower bound >= 0."""
    n = v.producer
    if n is None or n.domain:
        return False
    if n.op_type == "Relu":
        return True
    if n.op_type == "Clip":
        if "min" in n.attrs:
            return float(n.attrs["min"]) >= 0.0
        lo = n.input(1)
        return (
            lo is not None
            and lo.is_const
            and np.asarray(lo.const).size == 1
            and float(np.asarray(lo.const)) >= 0.0
        )
    return False


class FoldPadIntoMaxPool(Rule):
    """%y = MaxPool(%p = Pad(%x, %pads, %v?, %axes?)) -> %y = MaxPool(%x) {pads += spatial pads}

    A MaxPool pads with -inf. The folded pool has the same maxima when every window keeps
    one input cell (``ceil_mode=0``, each summed pad smaller than the window) and

    - the Pad is ``mode=edge`` and the pool undilated: a padded cell repeats the border
      cell next to it, which every window reaching that pad also covers (TF's "same"
      MaxPool as tf2onnx writes it: open_nsfw), for any input;
    - or the Pad is constant +0.0 and ``x`` is never negative (a Relu's output, or a
      Clip's with a lower bound >= 0): the window's maximum is >= 0 either way.
    """

    pattern = "y = MaxPool(p = Pad(x, pads, v?, axes?))"

    def check(self, m: Match) -> Match | NoMatch:
        pool, pad = m.root, m.node("p")
        if len(pool.outputs) > 1 and pool.outputs[1].uses:
            return NoMatch("MaxPool's Indices output is read")
        if int(pool.attrs.get("ceil_mode", 0)):
            return NoMatch("MaxPool has ceil_mode=1: a window may lie in the padding alone")
        ks = [int(k) for k in pool.attrs.get("kernel_shape", [])]
        n = len(ks)
        dil = [int(d) for d in pool.attrs.get("dilations", [1] * n)]
        x = m.value("x")
        if n == 0 or x.shape is None or len(x.shape) != n + 2:
            return NoMatch("MaxPool's kernel_shape does not match the input's rank")
        if _mode(pad) == "edge":
            if any(d != 1 for d in dil):
                return NoMatch("an edge Pad before a dilated MaxPool: a window may skip the border cell")
            auto_pad = pool.attrs.get("auto_pad", "NOTSET")
            auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
            if auto_pad not in ("NOTSET", "VALID"):
                return NoMatch(f"MaxPool auto_pad is {auto_pad}: its pads depend on the input size")
            got = _begin_end(m, n + 2)
            if isinstance(got, NoMatch):
                return got
            begin, end = got
            if begin[:2] != [0, 0] or end[:2] != [0, 0] or any(q < 0 for q in begin + end):
                return NoMatch(f"Pad pads the batch or channel axis or crops (begin {begin}, end {end})")
            old = (
                [0] * (2 * n)
                if auto_pad == "VALID"
                else [int(q) for q in pool.attrs.get("pads", [0] * (2 * n))]
            )
            if any(old):
                return NoMatch("the MaxPool pads with -inf of its own next to the edge Pad's copies")
            pads = [begin[i + 2] for i in range(n)] + [end[i + 2] for i in range(n)]
        else:
            if not _non_negative(x):
                return NoMatch(f"{describe(m['x'])} may be negative: a zero pad is not a -inf pad for it")
            pads = _summed_pads(m, "MaxPool", n + 2)
            if isinstance(pads, NoMatch):
                return pads
        if any(
            pads[i] >= (ks[i] - 1) * dil[i] + 1 or pads[n + i] >= (ks[i] - 1) * dil[i] + 1 for i in range(n)
        ):
            return NoMatch(f"summed pads {pads} reach a whole window of {ks}")
        m.data["pads"] = pads
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        pool = m.root
        y = m.value("y")
        attrs = {k: v for k, v in pool.attrs.items() if k != "auto_pad"}
        attrs["pads"] = m.data["pads"]
        return b.op(
            "MaxPool",
            [m.value("x")],
            attrs,
            types=result_type(shape_from=y, elem_from=y),
            name=pool.name or None,
            attr_types={k: t for k, t in pool.attr_types.items() if k not in ("auto_pad", "pads")},
        )


class FoldPad(RewritePass):
    name = "fold_pad"
    rules = (FoldPadIntoConv(), FoldPadIntoAveragePool(), FoldPadIntoMaxPool())
