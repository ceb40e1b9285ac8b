"""The layer that computes a Log's input stays float when that input's own input spreads
over many powers of two (docs/calibration.md eq. (HB2)).

A log-mel front end (an STFT as Conv, the power as Mul / Add, a mel filter bank as MatMul,
then ``Log(mel + eps)``) turns every absolute error at the Log's input into a relative
one: ``log(x + e) - log(x) ≈ e / x``. An 8-bit grid over the power spectrum's range rounds
its quiet bins to 0 (eq. (26)'s ``small(8)``), and the log then reads the floor ``eps``
where FP32 reads the quiet bin: NVIDIA's MarbleNet voice activity detector quantized with
the filter bank in integer agrees with FP32 on 65.8 % of its frames (76 % of them speech),
and with that one MatMul float (the STFT Convs still integer, their outputs float since
only float ops read them) on 98.4 %.

So ``quantize_static`` finds each Conv / Gemm / MatMul whose output reaches a Log through
element-wise ops with one data input (the others constant: ``+ eps``, ``· scale``, Clip,
Max) and views, observes that layer's data input on the first calibration feeds
(SpreadObserver), and keeps the layer float when ``small(8) >= SPREAD_LIMIT``, with the
reason. An input reaching ``EXTREME`` with no negative value is left to eq. (25) (16-bit
storage): that rule already gives such data an integer form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from quanta.calibrate.observer import EXTREME
from quanta.ir.graph import Graph, Node, Value
from quanta.ir.onnx_io import VIEW_OPS_KEEPING_TYPE

__all__ = ["log_layers", "log_reasons"]

#: element-wise ops a Log's input may pass through back to its layer (one data input)
_THROUGH = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Clip"})
_LAYERS = frozenset({"Conv", "Gemm", "MatMul"})


def _data_inputs(node: Node) -> list[Value]:
    return [v for v in node.inputs if v is not None and not v.is_const and not _constant_node(v)]


def _constant_node(v: Value) -> bool:
    p = v.producer
    return p is not None and p.op_type == "Constant" and not p.domain


def log_layers(graph: Graph) -> dict[str, tuple[str, str]]:
    """Layer name -> (its data input's name, the Log's name) for each Conv / Gemm / MatMul
    of ``graph`` whose output a Log reads through one-data-input element-wise ops and
    views (module docstring). A layer with two data inputs (attention scores) is none."""
    out: dict[str, tuple[str, str]] = {}
    for log in graph.nodes:
        if log.op_type != "Log" or log.domain or not log.inputs or log.inputs[0] is None:
            continue
        v = log.inputs[0]
        while v.producer is not None and not v.producer.domain:
            p = v.producer
            live = _data_inputs(p)
            # an op that keeps its input's type (op facts, column view) moves its values unchanged
            if p.op_type in VIEW_OPS_KEEPING_TYPE and p.inputs and p.inputs[0] is not None:
                v = p.inputs[0]
            elif p.op_type in _THROUGH and len(live) == 1:
                v = live[0]
            else:
                break
        p = v.producer
        if p is None or p.domain or p.op_type not in _LAYERS or not p.name:
            continue
        live = _data_inputs(p)
        if len(live) == 1:
            out[p.name] = (live[0].name, log.name)
    return out


def log_reasons(
    layers: dict[str, tuple[str, str]], observe: Callable[[list[str]], dict[str, Any]], limit: float
) -> dict[str, str]:
    """Layer name -> why it stays float, for the layers of :func:`log_layers` whose data
    input's eq. (26) share at 8 bits is at least ``limit``. ``observe(names)`` returns a
    SpreadObserver (or its result) per input name, over the first calibration feeds."""
    from quanta.calibrate.spread import SPREAD

    seen = observe(sorted({x for x, _ in layers.values()}))
    out = {}
    for layer, (x, log) in layers.items():
        obs = seen.get(x)
        share = obs.spread(8) if obs is not None else None
        if share is None or share < limit:
            continue
        ext = obs.extrema()
        lo, hi = float(np.min(ext.min)), float(np.max(ext.max))
        if lo >= 0 and hi >= EXTREME:
            continue  # eq. (25): 16-bit storage is this data's integer form
        top = max(abs(lo), abs(hi))
        out[layer] = (
            f"{SPREAD}: {share:.0%} of the non-zero values of its input '{x}' lie below half an "
            f"8-bit step of [0, {top:.3g}], and its output reaches Log '{log}', which turns an "
            "absolute rounding error into a relative one (eq. (HB2) of docs/calibration.md)"
        )
    return out
