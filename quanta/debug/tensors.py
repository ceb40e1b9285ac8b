"""Per-tensor fidelity of a QDQ model against its float original.

For every activation Q/DQ pair of the quantized model (graph order), on the same feeds,
both models run as written on quanta's reference target (no fusion, so every tensor
keeps its name)::

    local SQNR  = 10 log10(Σ x_q² / Σ (x_q - DQ(Q(x_q)))²)    what this pair's rounding
                                                              and clipping cost, on its own input
    total SQNR  = 10 log10(Σ x² / Σ (x - DQ(Q(x_q)))²)        against the FP32 tensor x of the
                                                              same name: every error up to here

A tensor whose local SQNR is fine but whose total collapses is where upstream error gets
amplified; one whose local SQNR is poor is a range problem (docs/accuracy.md,
layout_cdla). ``clipped`` is the share of x_q outside the representable range.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

__all__ = ["TensorFidelity", "compare_tensors", "format_tensors"]


@dataclass
class TensorFidelity:
    name: str  # the quantized (float) tensor: QuantizeLinear's input
    local_db: float
    total_db: float | None  # None: the float model has no tensor of that name
    clipped: float
    scale: float
    zero_point: int


def _proto(m: str | os.PathLike | onnx.ModelProto) -> onnx.ModelProto:
    return m if isinstance(m, onnx.ModelProto) else onnx.load(os.fspath(m))


def _values(proto: onnx.ModelProto, feed: dict[str, np.ndarray], names: set[str]) -> dict[str, np.ndarray]:
    """The named tensors of one run of the graph as written (the reference target, as
    calibration runs it)."""
    from quanta.ir.onnx_io import from_proto
    from quanta.targets.reference import ReferenceTarget

    model = from_proto(proto, "model")
    got: dict[str, np.ndarray] = {k: v for k, v in feed.items() if k in names}

    def keep(name: str, arr: np.ndarray) -> None:
        if name in names and isinstance(arr, np.ndarray):
            got[name] = arr

    ReferenceTarget().prepare(model).run(dict(feed), [v.name for v in model.graph.outputs], on_value=keep)
    return got


def _db(signal: float, noise: float) -> float:
    if noise == 0.0:
        return float("inf")
    return float(10.0 * np.log10(signal / noise)) if signal > 0 else float("-inf")


def compare_tensors(
    float_model: str | os.PathLike | onnx.ModelProto,
    quantized_model: str | os.PathLike | onnx.ModelProto,
    feeds: list[dict[str, np.ndarray]],
) -> list[TensorFidelity]:
    """One row per activation Q/DQ pair of ``quantized_model`` (module docstring); both
    models run as written on quanta's reference target."""
    q = _proto(quantized_model)
    f = _proto(float_model)
    inits = {i.name: i for i in q.graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in q.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    pairs: list[tuple[str, str, float, int]] = []
    grid: dict[str, tuple[float, float]] = {}  # representable range of each pair
    for n in q.graph.node:
        if n.op_type != "QuantizeLinear" or n.input[0] in inits:
            continue
        dq = next((c for c in consumers.get(n.output[0], []) if c.op_type == "DequantizeLinear"), None)
        if dq is None or n.input[1] not in inits:
            continue
        scale = float(onnx.numpy_helper.to_array(inits[n.input[1]]).reshape(-1)[0])
        zp_arr = onnx.numpy_helper.to_array(inits[n.input[2]]) if len(n.input) > 2 else np.zeros(1, np.uint8)
        zp = int(zp_arr.reshape(-1)[0])
        info = np.iinfo(zp_arr.dtype)
        # a value beyond half a step outside the grid's ends is clipped, not rounded
        grid[n.input[0]] = ((info.min - zp - 0.5) * scale, (info.max - zp + 0.5) * scale)
        pairs.append((n.input[0], dq.output[0], scale, zp))
    float_names = {o for n in f.graph.node for o in n.output} | {i.name for i in f.graph.input}
    q_wanted = {p[0] for p in pairs} | {p[1] for p in pairs}
    f_wanted = {p[0] for p in pairs if p[0] in float_names}
    acc: dict[str, list[float]] = {p[0]: [0.0, 0.0, 0.0, 0.0, 0.0, 0.0] for p in pairs}
    for feed in feeds:
        qo: dict[str, Any] = _values(q, feed, q_wanted)
        fo: dict[str, Any] = _values(f, feed, f_wanted)
        for x, d, _, _ in pairs:
            if x not in qo or d not in qo:
                continue
            a = acc[x]
            xq = np.asarray(qo[x], np.float64)
            dq = np.asarray(qo[d], np.float64)
            a[0] += float(np.sum(xq**2))
            a[1] += float(np.sum((xq - dq) ** 2))
            lo, hi = grid[x]
            a[4] += float(np.sum((xq < lo) | (xq > hi)))
            a[5] += xq.size
            if x in fo and x in qo:
                r = np.asarray(fo[x], np.float64)
                a[2] += float(np.sum(r**2))
                a[3] += float(np.sum((r - dq) ** 2))
    rows = []
    for x, _, scale, zp in pairs:
        a = acc[x]
        total = _db(a[2], a[3]) if x in float_names else None
        rows.append(TensorFidelity(x, _db(a[0], a[1]), total, a[4] / max(a[5], 1.0), scale, zp))
    return rows


def format_tensors(rows: list[TensorFidelity]) -> str:
    """A table in graph order; the largest drops of the total SQNR are the places to look."""
    width = max((len(r.name) for r in rows), default=6)
    lines = [f"{'tensor':{width}s}  local dB  total dB  clipped   scale      zp"]
    for r in rows:
        total = "       -" if r.total_db is None else f"{r.total_db:8.1f}"
        lines.append(
            f"{r.name:{width}s}  {r.local_db:8.1f}  {total}  {r.clipped:7.1e}  {r.scale:9.4g}  {r.zero_point:4d}"
        )
    return "\n".join(lines)
