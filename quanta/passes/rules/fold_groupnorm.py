"""Reshape -> InstanceNormalization -> Reshape folded into GroupNormalization.

Exporters (PyTorch before opset 18) write GroupNorm with G groups over x: (N, C, *S) as::

    %r = Reshape(%x, [N|0, G, -1])                     (N, G, (C/G)·prod(S))
    %n = InstanceNormalization(%r, %gamma, %beta)      gamma, beta: (G,)
    %y = Reshape(%n, shape(x))                         back to (N, C, *S)
  ->
    %y = GroupNormalization(%x, %scale, %bias) {num_groups=G, epsilon}

InstanceNormalization of ``r`` normalizes each (n, g) row over its (C/G)·prod(S)
elements, which are exactly the channels of group g in x (channels are contiguous in
the row-major reshape), and scales it by gamma[g], beta[g]; that is GroupNormalization's
definition. Its scale and bias are per group up to opset 20 (scale = gamma,
bias = beta) and per channel from opset 21 (each group's value repeated C/G times).

The folded node's result type is the replaced output's (``%y``): with ``x`` at scale
0.02 and ``%y`` at 0.08 the GroupNormalization output carries 0.08, never x's type
(docs/design.md). The folded node needs opset 18; the rule refuses below it.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import describe, first_nonconst
from quanta.passes.rules.remove_noops import resolve_reshape

__all__ = ["FoldGroupNorm", "FoldReshapeInstanceNormIntoGroupNorm"]


def _fmt(shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


class FoldReshapeInstanceNormIntoGroupNorm(Rule):
    """%y = Reshape(%n = InstanceNormalization(%r = Reshape(%x, %s1), %gamma, %beta), %s2)
    -> %y = GroupNormalization(%x, %scale, %bias) {num_groups=G}"""

    pattern = "y = Reshape(n = InstanceNormalization(r = Reshape(x, s1), gamma, beta), s2)"

    def __init__(self, opset: int = 21):
        self.opset = opset

    def check(self, m: Match) -> Match | NoMatch:
        if self.opset < 18:
            return NoMatch(f"opset {self.opset} has no GroupNormalization (added in opset 18)")
        bad = first_nonconst(m, "s1", "s2")
        if bad is not None:
            return NoMatch(f"Reshape target {bad} is not a constant")
        bad = first_nonconst(m, "gamma", "beta")
        if bad is not None:
            return NoMatch(f"InstanceNormalization {bad} is not a constant")
        x = m.value("x")
        if x.shape is None or len(x.shape) < 3:
            return NoMatch(
                f"{describe(x)} has shape {None if x.shape is None else _fmt(x.shape)}: expected (N, C, spatial...)"
            )
        if not all(isinstance(d, int) for d in x.shape[1:]):
            return NoMatch(
                f"{describe(x)} has shape {_fmt(x.shape)}: channel and spatial dimensions must be static"
            )
        c = x.shape[1]
        per_row = int(np.prod(x.shape[1:]))
        first = resolve_reshape(
            [int(v) for v in np.asarray(m.const("s1")).reshape(-1)],
            tuple(x.shape),
            bool(m.node("r").attrs.get("allowzero", 0)),
        )
        if first is None or len(first) < 3 or first[0] != x.shape[0] or not isinstance(first[1], int):
            shown = "unknown" if first is None else _fmt(first)
            return NoMatch(f"the first Reshape gives {shown}, expected [N, G, ...] keeping N = {x.shape[0]}")
        groups = first[1]
        inner = first[2:]
        if (
            groups <= 0
            or c % groups
            or not all(isinstance(d, int) for d in inner)
            or int(np.prod(inner)) * groups != per_row
        ):
            return NoMatch(
                f"the first Reshape gives {_fmt(first)}: it does not split the {c} channels into groups "
                f"(expected [N, G, ...] with G dividing {c})"
            )
        gamma, beta = np.asarray(m.const("gamma")), np.asarray(m.const("beta"))
        if gamma.shape != (groups,) or beta.shape != (groups,):
            return NoMatch(
                f"InstanceNormalization scale/bias have shapes {gamma.shape}, {beta.shape}, expected ({groups},)"
            )
        second = resolve_reshape(
            [int(v) for v in np.asarray(m.const("s2")).reshape(-1)],
            tuple(first),
            bool(m.root.attrs.get("allowzero", 0)),
        )
        if second is None or tuple(second) != tuple(x.shape):
            shown = "unknown" if second is None else _fmt(second)
            return NoMatch(f"the second Reshape gives {shown}, not the input shape {_fmt(x.shape)}")
        m.data.update(groups=groups, channels=c)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        groups, c = m.data["groups"], m.data["channels"]
        gamma, beta = np.asarray(m.const("gamma")), np.asarray(m.const("beta"))
        if self.opset >= 21:  # per channel: each group's value repeated C/G times
            gamma, beta = np.repeat(gamma, c // groups), np.repeat(beta, c // groups)
        inorm = m.node("n")
        y = m.value("y")
        attrs = {"num_groups": groups, "epsilon": float(inorm.attrs.get("epsilon", 1e-5))}
        return b.op(
            "GroupNormalization",
            [m["x"], b.const(f"{y.name}_scale", gamma), b.const(f"{y.name}_bias", beta)],
            attrs,
            types=result_type(shape_from=y, elem_from=y),  # the replaced output's contract, not x's
            name=inorm.name or None,
        )


class FoldGroupNorm(RewritePass):
    """``opset``: the model's ai.onnx opset (decides per-group or per-channel scale)."""

    name = "fold_groupnorm"

    def __init__(self, opset: int = 21):
        super().__init__([FoldReshapeInstanceNormIntoGroupNorm(opset)])
