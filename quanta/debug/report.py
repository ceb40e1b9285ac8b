"""Model summaries: what ``quanta inspect`` prints.

``summarize(model)`` counts ops by type, lists every quantized tensor with its scheme
(storage, per-tensor / per-axis / per-block, scale range, zero points), counts
parameters (elements of initializers) and their bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from quanta.ir.graph import Model
from quanta.ir.types import QuantType

__all__ = ["ModelSummary", "QuantizedTensor", "summarize"]


@dataclass
class QuantizedTensor:
    name: str
    kind: str  # "weight" (constant) or "activation"
    type: QuantType

    @property
    def scheme(self) -> str:
        q = self.type
        if q.axis is None:
            gran = "per-tensor"
        elif q.block is not None:
            gran = f"per-block(axis={q.axis}, block={q.block})"
        else:
            gran = f"per-axis(axis={q.axis}, {len(q.scale)} channels)"
        mid = 0 if getattr(q.storage, "signed", True) else 1 << (q.storage.bits - 1)
        sym = "symmetric" if all(z == mid for z in q.zero_point) else "asymmetric"
        lo, hi = min(q.scale), max(q.scale)
        scale = f"scale {lo:.4g}" if lo == hi else f"scale {lo:.4g}..{hi:.4g}"
        zps = sorted(set(q.zero_point))
        zp = f"zp {zps[0]}" if len(zps) == 1 else f"zp {zps[0]}..{zps[-1]}"
        return f"{q.storage} {gran} {sym}, {scale}, {zp}"


@dataclass
class ModelSummary:
    path: str | None
    file_bytes: int | None
    opsets: dict[str, int]
    op_counts: dict[str, int]
    n_nodes: int
    n_parameters: int
    parameter_bytes: int
    inputs: list[tuple[str, str]]
    outputs: list[tuple[str, str]]
    quantized: list[QuantizedTensor] = field(default_factory=list)

    def format(self, *, max_tensors: int = 40) -> str:
        lines = []
        if self.path:
            size = f" ({_human(self.file_bytes)})" if self.file_bytes is not None else ""
            lines.append(f"model: {self.path}{size}")
        lines.append("opsets: " + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(self.opsets.items())))
        for name, t in self.inputs:
            lines.append(f"input  {name}: {t}")
        for name, t in self.outputs:
            lines.append(f"output {name}: {t}")
        lines.append(
            f"parameters: {self.n_parameters:,} ({_human(self.parameter_bytes)} in initializers), nodes: {self.n_nodes}"
        )
        lines.append("ops by type:")
        width = max((len(k) for k in self.op_counts), default=0)
        for op, n in sorted(self.op_counts.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"  {op:<{width}}  {n}")
        if self.quantized:
            n_w = sum(1 for q in self.quantized if q.kind == "weight")
            lines.append(
                f"quantized tensors: {len(self.quantized)} ({n_w} weights, {len(self.quantized) - n_w} activations)"
            )
            for q in self.quantized[:max_tensors]:
                lines.append(f"  {q.kind:<10} {q.name}: {q.scheme}")
            if len(self.quantized) > max_tensors:
                lines.append(f"  ... and {len(self.quantized) - max_tensors} more")
        else:
            lines.append("quantized tensors: none (a float model)")
        return "\n".join(lines)


def _human(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def summarize(model: Model) -> ModelSummary:
    g = model.graph
    n_params = sum(int(np.asarray(v.const).size) for v in g.initializers.values())
    p_bytes = sum(int(np.asarray(v.const).nbytes) for v in g.initializers.values())
    quantized = []
    for v in g.values():
        if v.type is not None and isinstance(v.type.elem, QuantType):
            quantized.append(QuantizedTensor(v.name, "weight" if v.is_const else "activation", v.type.elem))
    quantized.sort(key=lambda q: (q.kind != "weight", q.name))
    file_bytes = os.path.getsize(model.path) if model.path and os.path.exists(model.path) else None
    return ModelSummary(
        path=model.path,
        file_bytes=file_bytes,
        opsets=dict(model.opset_imports),
        op_counts=g.op_counts(),
        n_nodes=len(g.nodes),
        n_parameters=n_params,
        parameter_bytes=p_bytes,
        inputs=[(v.name, str(v.type)) for v in g.inputs],
        outputs=[(v.name, str(v.type)) for v in g.outputs],
        quantized=quantized,
    )
