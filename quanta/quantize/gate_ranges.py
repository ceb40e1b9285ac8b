"""The input range of a gated activation ends where its output codes stop changing.

A gated activation ``y = x · g(x)`` (SiLU: g = Sigmoid; HardSwish: g = HardSigmoid; Mish:
g = Tanh(Softplus)) reads only ``x`` quantized and is one table of its code
(qdq.gated_activation). Calibration gives ``x`` the range of a Conv's pre-activation
output, whose negative tail is long (YOLO necks: [-25.8, 9.8]), while ``y`` is flat there:
``|y| <= 0.0011`` below x = -9 for SiLU, exactly 0 below -3 for HardSwish. Every code of
that tail maps to the same output code, so the tail buys nothing and costs its share of
the step::

    (G1) lo' = max(lo, sup{t <= 0 : |f(u)| <= s_y / 4 for every u in [lo, t]})

with ``s_y`` the output's step (its range over its levels). An input below ``lo'``
saturates to ``lo'``, whose output ``|f(lo')| <= s_y / 4`` quantizes to the same code as
every value of the dropped tail (``|f| < s_y / 2`` rounds to the zero point's code), so
the output codes of the tail are unchanged and the step of ``x`` shrinks by
``(hi - lo') / (hi - lo)``. YOLO26n's ``/model.16/cv2`` (isbnx): [-25.8, 9.8] ->
[-6.5, 9.8], a 2.2x finer step. The bound is found on a grid of 4097 points over
``[lo, min(hi, 0)]``.

Only a per-tensor ``x`` read by the gated activation alone (the gate and the Mul), with a
per-tensor quantized output, is trimmed; a range the recipe fixes is kept.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from quanta.ir.graph import Graph
from quanta.ir.types import CalibratedType

__all__ = ["trim_gate_inputs"]

_GRID = 4097


def _gate_function(gate_ops: tuple[str, ...], attrs: dict):
    """f(x) = x · g(x) for the gate chain (innermost op last, as gated_activation lists
    it), in float64; None for a chain it does not know."""
    if gate_ops == ("Sigmoid",):
        return lambda x: x * 0.5 * (1.0 + np.tanh(0.5 * x))  # x·sigmoid(x), no overflow
    if gate_ops == ("HardSigmoid",):
        alpha, beta = float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
        return lambda x: x * np.clip(alpha * x + beta, 0.0, 1.0)
    if gate_ops == ("Tanh", "Softplus"):
        return lambda x: x * np.tanh(np.logaddexp(0.0, x))
    return None


def _step(cal: CalibratedType, bits: int, symmetric: bool) -> float | None:
    if cal.axis is not None:
        return None
    lo, hi = float(cal.min), float(cal.max)
    levels = (1 << bits) - 1
    if symmetric:
        return 2.0 * max(abs(lo), abs(hi)) / levels
    return (max(hi, 0.0) - min(lo, 0.0)) / levels


def trimmed_low(f, lo: float, hi: float, step_y: float) -> float:
    """(G1): the lowest input worth a code (``lo`` itself when the tail is not flat)."""
    top = min(hi, 0.0)
    if lo >= top:
        return lo
    xs = np.linspace(lo, top, _GRID)
    flat = np.abs(f(xs)) <= step_y / 4.0
    if not flat[0]:
        return lo
    first_not_flat = int(np.argmin(flat)) if not flat.all() else len(xs)
    return float(xs[first_not_flat - 1])


def trim_gate_inputs(graph: Graph, plan, ranges: dict[str, CalibratedType]) -> dict[str, CalibratedType]:
    """``ranges`` with the input range of every gated activation trimmed by (G1)."""
    from quanta.quantize.qdq import gated_activation

    out = dict(ranges)
    graph_outputs = {id(v) for v in graph.outputs}
    for node in graph.nodes:
        found = gated_activation(node, graph)
        if found is None:
            continue
        xi, gate_nodes = found
        x, y = node.inputs[xi], node.outputs[0]
        tx, ty = plan.tensors.get(x.name), plan.tensors.get(y.name)
        if tx is None or ty is None or x.name not in out or y.name not in out:
            continue
        if tx.fixed_range is not None or tx.inherit_from or tx.share_with or id(x) in graph_outputs:
            continue
        if tx.float_reason is not None or ty.float_reason is not None or ty.share_with or ty.inherit_from:
            continue
        readers = {id(c) for c in x.consumers()}
        if readers != {id(node), id(gate_nodes[-1])}:
            continue  # x is read elsewhere too: its tail may matter there
        f = _gate_function(tuple(g.op_type for g in gate_nodes), gate_nodes[-1].attrs)
        step_y = _step(out[y.name], ty.storage.bits, ty.symmetric)
        cal = out[x.name]
        if f is None or step_y is None or cal.axis is not None or step_y <= 0.0:
            continue
        lo = trimmed_low(f, float(cal.min), float(cal.max), step_y)
        if lo > float(cal.min):
            out[x.name] = dataclasses.replace(cal, min=lo)
    return out
