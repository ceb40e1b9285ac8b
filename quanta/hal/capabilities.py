"""What a device can run, as data: :class:`Capabilities`.

A target's partitioner asks :meth:`Capabilities.unsupported` per node; the answer is a
reason (the rule that failed, naming the operator, value or dimension) or None. Nothing
here runs kernels: the same record describes a simulated device, a real one, or the host.

Rules, in the order they are checked (the first failing one is the reason):

1. ``ops``: the ``(domain, op_type)`` pairs the device runs (None: every operator);
2. ``element_types``: every non-constant input and output has one of these NumPy dtypes;
3. planned shapes: every value of the node has a shape whose dimensions are integers or
   symbols the graph's inputs bind (``symbols``: a batch size ``N`` is fixed by the feeds
   before a run is planned; device memory is planned before anything runs), of rank <=
   ``max_rank`` and every integer dimension <= ``max_dim``;
4. constants: integer constants of any width are parameters (shapes, axes, zero points,
   int32 bias); a float constant is accepted only as a requantization parameter, when
   ``"float-scale"`` is in ``requant_modes`` and the operator is a quantized one;
5. ``weight_granularity`` / ``symmetric_weights``: the zero point of a constant 8-bit
   weight is per tensor or per channel as listed, and all zero when symmetric weights are
   required.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["ALL_OPS", "UNPLANNED_SHAPE", "Capabilities"]

#: the words of the shape rule's reason (a runtime that can fix the input shapes and
#: compile again per signature looks for them)
UNPLANNED_SHAPE = "not fixed by the graph's input shapes"

#: ``Capabilities.ops`` value meaning "every operator"
ALL_OPS = None

#: operators whose float constant inputs are scales (requantization parameters), with
#: the input index of each constant 8-bit weight and of its zero point
_QUANT_WEIGHTS: dict[str, tuple[int, int]] = {
    "QLinearConv": (3, 5),
    "QLinearMatMul": (3, 5),
    "QGemm": (3, 5),
}


@dataclass(frozen=True)
class Capabilities:
    """A device's capabilities (module docstring)."""

    name: str
    #: (domain, op_type) pairs, domain "" for ai.onnx; None: every operator
    ops: frozenset[tuple[str, str]] | None = ALL_OPS
    #: NumPy dtype names of the non-constant values it computes on
    element_types: frozenset[str] = frozenset()
    #: "float-scale" (QLinear* ops with float32 scales), "fixed-point" (int32 multiplier
    #: + shift), or both
    requant_modes: tuple[str, ...] = ()
    #: per-tensor and/or per-channel zero points of constant weights
    weight_granularity: tuple[str, ...] = ("per-tensor", "per-channel")
    symmetric_weights: bool = False
    #: activations: per-tensor only on every integer device modelled here
    activation_granularity: tuple[str, ...] = ("per-tensor",)
    #: device memory in bytes (None: host memory, not planned)
    memory_bytes: int | None = None
    #: every buffer offset is a multiple of this
    alignment: int = 64
    max_rank: int = 8
    max_dim: int = 1 << 31
    #: anything else a profile wants to state (documented where it is used)
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def runs_every_op(self) -> bool:
        return self.ops is None

    def unsupported(self, node: Any, symbols: frozenset[str] = frozenset()) -> str | None:
        """Why a device with these capabilities cannot run ``node`` (a quanta IR Node),
        or None. ``symbols``: the symbolic dimensions the graph's inputs bind."""
        key = (node.domain or "", node.op_type)
        if self.ops is not None and key not in self.ops:
            return f"operator {node.domain or 'ai.onnx'}::{node.op_type} is not among {self.name}'s operators"
        for role, values in (("input", node.inputs), ("output", node.outputs)):
            for v in values:
                if v is None or not v.name:
                    continue
                why = self._value_rule(node, role, v, symbols)
                if why is not None:
                    return why
        return self._weight_rule(node)

    def _value_rule(self, node: Any, role: str, v: Any, symbols: frozenset[str]) -> str | None:
        t = v.type
        if v.is_const:
            arr = np.asarray(v.const)
            if arr.dtype.kind in "iub":
                return None
            if (
                arr.dtype.kind == "f"
                and "float-scale" in self.requant_modes
                and node.op_type.startswith(("QLinear", "QGemm"))
            ):
                return None
            return f"{role} '{v.name}' is a {arr.dtype} constant; {self.name} takes float constants only as requantization scales"
        if t is None:
            return f"{role} '{v.name}' has no type; {self.name} plans types and shapes before running"
        try:
            dtype = np.dtype(t.elem.numpy)
        except Exception:
            return f"{role} '{v.name}' has element type {t.elem}, which {self.name} does not compute on"
        if self.element_types and dtype.name not in self.element_types:
            return f"{role} '{v.name}' is {dtype.name}; {self.name} computes on {', '.join(sorted(self.element_types))}"
        shape = t.shape
        if shape is None or not all((isinstance(d, int) and d >= 0) or d in symbols for d in shape):
            return (
                f"{role} '{v.name}' has shape {'unknown' if shape is None else list(shape)}, {UNPLANNED_SHAPE}; "
                f"{self.name} plans its memory before running"
            )
        if len(shape) > self.max_rank:
            return f"{role} '{v.name}' has rank {len(shape)} > {self.max_rank}"
        big = [d for d in shape if isinstance(d, int) and d > self.max_dim]
        if big:
            return f"{role} '{v.name}' has dimension {big[0]} > {self.max_dim}"
        return None

    def _weight_rule(self, node: Any) -> str | None:
        where = _QUANT_WEIGHTS.get(node.op_type)
        if where is None or len(node.inputs) <= where[1]:
            return None
        w, zp = node.inputs[where[0]], node.inputs[where[1]]
        if w is None or not w.is_const or zp is None or not zp.is_const:
            return None
        z = np.asarray(zp.const)
        granularity = "per-tensor" if z.size == 1 else "per-channel"
        if granularity not in self.weight_granularity:
            return f"weight '{w.name}' is quantized {granularity}; {self.name} takes {', '.join(self.weight_granularity)}"
        if self.symmetric_weights and np.any(z != 0):
            return f"weight '{w.name}' has a non-zero zero point; {self.name} takes symmetric weights only"
        return None
