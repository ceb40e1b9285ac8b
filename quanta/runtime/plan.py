"""The compiled form of a model: slots, steps, constants and a memory plan.

Every value of the graph gets a *slot*, an index into the list of values the executor
keeps while it runs (slot 0 always holds None: it stands for an omitted optional
input). Constants are placed in their slots once; feeds fill the input slots; a step
reads its input slots, calls its kernel, writes its output slots and clears the slots
whose last reader it is.

Printed form (``str(plan)``; constants are shown by slot only)::

    plan 'qdq_conv' on target native: 6 steps, 2 threads
      slots: 7 constants, 1 input, 5 intermediates, 1 output; 2 steps on native kernels, 4 fallbacks
      memory: arena 2,624 B, liveness lower bound 2,624 B (1.000x), 5 buffers, alignment 64
        step  node  op                kernel                      outputs <- inputs        memory
           0  q_x   QuantizeLinear    native:quantize_linear_u8   %9 xq <- %8 x, %1, %2    @0 +135 heap
           1  dq_x  DequantizeLinear  reference:DequantizeLinear  %10 xf <- %9 xq, %1, %2  @2048 +540 heap
           ...
           5  dq_c  DequantizeLinear  reference:DequantizeLinear  %14 y <- %13 cq, %6, %7  output

``memory`` says where the output's planned buffer sits (``@offset +bytes``) and whether
the executor really writes there (``arena``: the kernel accepts ``out=``) or the
kernel allocates its own array (``heap``: NumPy kernels); ``view of %k`` for view
outputs that share their input's buffer, ``output`` for graph outputs (allocated by the
kernel and handed to the caller).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.ir.types import TensorType
from quanta.runtime.memory import VIEW_OPS, MemoryPlan
from quanta.targets.base import Kernel, KernelContext

if TYPE_CHECKING:
    from quanta.passes.manager import PipelineResult

__all__ = ["Plan", "PlanStep", "Slot", "SlotKind", "static_nbytes"]

NONE_SLOT = 0


class SlotKind(enum.Enum):
    NONE = "none"  # slot 0: an omitted optional input
    CONSTANT = "constant"
    INPUT = "input"
    INTERMEDIATE = "intermediate"
    OUTPUT = "output"


@dataclass(frozen=True)
class Slot:
    index: int
    name: str
    kind: SlotKind
    type: TensorType | None
    #: bytes from the static type, None when a dimension is symbolic or unknown
    nbytes: int | None


@dataclass
class PlanStep:
    """One node bound to one kernel, reading and writing slots."""

    index: int
    node: Node
    kernel: Kernel
    ctx: KernelContext
    attrs: dict[str, Any]  # node attributes + kernel.params: the call's keyword arguments
    inputs: tuple[int, ...]  # NONE_SLOT for an omitted optional input
    outputs: tuple[int | None, ...]  # None for an omitted output
    free_after: tuple[int, ...]  # slots whose last reader this step is

    @property
    def name(self) -> str:
        return self.node.name or f"{self.node.op_type}_{self.index}"

    @property
    def op_type(self) -> str:
        return self.node.op_type


@dataclass
class Plan:
    """What :func:`quanta.runtime.compile` produces and the executor runs."""

    model: Model
    target: str
    steps: list[PlanStep]
    slots: list[Slot]
    constants: dict[int, np.ndarray]  # slot -> value
    inputs: dict[str, int]  # graph input name -> slot (overridable initializers too)
    outputs: dict[str, int]  # graph output name -> slot
    #: static memory plan (None when an intermediate has a symbolic or unknown shape:
    #: the executor then plans at the first run of each input-shape signature)
    memory: MemoryPlan | None
    num_threads: int = 1
    #: result of the pass pipeline that ran before binding (None: no passes ran)
    passes: PipelineResult | None = None
    compile_seconds: float = 0.0
    slot_of: dict[str, int] = field(default_factory=dict)  # value name -> slot
    #: device targets: the steps grouped by device, with their transfers
    #: (quanta.targets.partition.Partition); None for host targets (one host partition)
    partitions: list[Any] | None = None
    #: the device's memory plan (quanta.runtime.hetero.DeviceMemoryPlan), once known
    device_memory: Any = None

    @property
    def transfers(self) -> tuple[int, int]:
        """(uploads, downloads) per run between host and device (0, 0 on a host target)."""
        if not self.partitions:
            return (0, 0)
        from quanta.targets.partition import transfer_count

        return transfer_count(self.partitions)

    @property
    def fallbacks(self) -> list[tuple[str, str, str]]:
        """(node name, op type, reason) of every step on a fallback kernel; the steps of
        compiled If / Loop / Scan bodies are named ``{node}/{attribute}/{node in body}``."""
        out = []
        for s in self.steps:
            if s.kernel.fallback:
                out.append((s.node.name, s.node.op_type, s.kernel.fallback))
            for attribute, body in s.kernel.bodies.items():
                out.extend((f"{s.name}/{attribute}/{n}", op, why) for n, op, why in body.plan.fallbacks)
        return out

    @property
    def total_steps(self) -> int:
        """Steps of this plan and of the compiled If / Loop / Scan bodies in it (the
        generic plans: what :attr:`fallbacks` counts over)."""
        return len(self.steps) + sum(b.plan.total_steps for s in self.steps for b in s.kernel.bodies.values())

    def count(self, kind: SlotKind) -> int:
        return sum(1 for s in self.slots if s.kind is kind)

    def format(self, *, max_steps: int | None = None) -> str:
        n_native = sum(1 for s in self.steps if s.kernel.impl == "native")
        devices: dict[str, int] = {}
        for s in self.steps:
            if s.kernel.device:
                devices[s.kernel.device] = devices.get(s.kernel.device, 0) + 1
        on_devices = "".join(f", {_n(k, 'step')} on {d}" for d, k in devices.items())
        threads = f"{self.num_threads} thread{'s' if self.num_threads != 1 else ''}"
        name = self.model.graph.name
        lines = [
            f"plan '{name}' on target {self.target}: {len(self.steps)} steps, {threads}",
            f"  slots: {_n(self.count(SlotKind.CONSTANT), 'constant')}, {_n(self.count(SlotKind.INPUT), 'input')}, "
            f"{_n(self.count(SlotKind.INTERMEDIATE), 'intermediate')}, {_n(self.count(SlotKind.OUTPUT), 'output')}; "
            f"{_n(n_native, 'step')} on native kernels{on_devices}, {_n(len(self.fallbacks), 'fallback')}",
        ]
        if self.passes is not None:
            lines.append(f"  passes: {', '.join(r.name for r in self.passes.records) or '(none)'}")
        if self.partitions is not None:
            lines.append(self.format_partitions())
        if self.memory is not None:
            lines.append(f"  memory: {self.memory.summary()}")
        else:
            lines.append("  memory: planned at the first run of each input-shape signature (symbolic shapes)")
        rows = [("step", "node", "op", "kernel", "outputs <- inputs", "memory")]
        shown = self.steps if max_steps is None else self.steps[:max_steps]
        for s in shown:
            outs = ", ".join("_" if o is None else self._slot_label(o) for o in s.outputs)
            ins = ", ".join("_" if i == NONE_SLOT else self._slot_label(i) for i in s.inputs)
            rows.append(
                (str(s.index), s.name, s.op_type, s.kernel.name, f"{outs} <- {ins}", self._memory_label(s))
            )
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        for r in rows:
            cells = [r[0].rjust(widths[0])] + [r[c].ljust(widths[c]) for c in range(1, len(r))]
            lines.append(("    " + "  ".join(cells)).rstrip())
        if max_steps is not None and len(self.steps) > max_steps:
            lines.append(f"    ... {_n(len(self.steps) - max_steps, 'more step')}")
        return "\n".join(lines)

    __str__ = format

    def format_partitions(self) -> str:
        """The partitions, their transfers and why each host step is not on the device."""
        parts = self.partitions or []
        up, down = self.transfers
        n_dev = sum(1 for p in parts if not p.on_host)
        lines = [
            f"  partitions: {_n(len(parts), 'partition')} ({n_dev} on device, {len(parts) - n_dev} on host); "
            f"transfers per run: {_n(up, 'upload')}, {_n(down, 'download')}"
        ]
        if self.device_memory is not None:
            lines.append(f"  device memory: {self.device_memory.summary()}")
        for p in parts:
            first, last = p.steps[0], p.steps[-1]
            span = f"step {first}" if first == last else f"steps {first}-{last}"
            ups = ", ".join(self._slot_label(v) for v in p.uploads) or "-"
            downs = ", ".join(self._slot_label(v) for v in p.downloads) or "-"
            if p.on_host:
                lines.append(f"    #{p.index} host: {span}; reads {ups}; hands on {downs}")
                for k, why in p.reasons.items():
                    lines.append(f"       step {k} {self.steps[k].name}: {why}")
            else:
                lines.append(
                    f"    #{p.index} {p.device}: {span}; upload {ups}; download {downs}; "
                    f"{_n(len(p.constants), 'constant')}"
                )
        return "\n".join(lines)

    def _slot_label(self, k: int) -> str:
        """``%k name``; constants only ``%k`` (their names make rows unreadably long)."""
        if self.slots[k].kind is SlotKind.CONSTANT:
            return f"%{k}"
        return f"%{k} {self.slots[k].name}"

    def _memory_label(self, step: PlanStep) -> str:
        o = step.outputs[0] if step.outputs else None
        if o is None:
            return ""
        if step.kernel.device:  # placed by the device memory plan (plan.device_memory)
            return f"{step.kernel.device} memory"
        if self.slots[o].kind is SlotKind.OUTPUT:
            return "output"
        if self.memory is None:
            return "view" if step.op_type in VIEW_OPS else ("arena" if step.kernel.out else "heap")
        alias = self.memory.aliases.get(o)
        if alias is not None:
            return f"view of %{alias}"
        off = self.memory.offsets.get(o)
        if off is None:
            return "view" if step.op_type in VIEW_OPS else ""
        return f"@{off} +{self.slots[o].nbytes} {'arena' if step.kernel.out else 'heap'}"


def _n(k: int, word: str) -> str:
    return f"{k} {word}{'' if k == 1 else 's'}"


def static_nbytes(t: TensorType | None) -> int | None:
    """Bytes of a tensor of type ``t`` (None when its shape or element size is unknown)."""
    if t is None or t.shape is None:
        return None
    n = 1
    for d in t.shape:
        if not isinstance(d, int) or d < 0:
            return None
        n *= d
    try:
        itemsize = np.dtype(t.elem.numpy).itemsize
    except Exception:
        return None
    return n * itemsize
