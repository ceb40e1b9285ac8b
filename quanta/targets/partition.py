"""Graph partitioning: consecutive steps on the same device form a partition; values
that cross partitions are explicit transfers.

Input: the steps in graph order (a topological order), each with its device ("" for the
host), input and output value ids; the constant ids; the graph's outputs. A partition is
a maximal run of consecutive steps on one device, so executing partitions in order
respects every dependency. For a device partition:

- ``uploads``: non-constant values it reads that it does not produce (host -> device);
- ``downloads``: values it produces that a later partition reads or that are graph
  outputs (device -> host);
- ``constants``: the constants it reads (resident in device memory, uploaded once).

Host partitions read and write host memory directly; their ``uploads`` / ``downloads``
list the same crossings from the host's side and are not transfers. The reason each host
step is not on the device is kept with the partition (``reasons``), so a plan, ``quanta
inspect --lowered`` and the profile show why. Nothing here runs anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["Partition", "PartitionStep", "partition_steps", "transfer_count"]


@dataclass(frozen=True)
class PartitionStep:
    index: int
    device: str  # "" for the host
    inputs: tuple[int, ...]  # value ids (0: an omitted input)
    outputs: tuple[int, ...]
    reason: str = ""  # why a host step is not on the device


@dataclass
class Partition:
    index: int
    device: str  # "" for the host
    steps: list[int]
    uploads: list[int] = field(default_factory=list)
    downloads: list[int] = field(default_factory=list)
    constants: list[int] = field(default_factory=list)
    reasons: dict[int, str] = field(default_factory=dict)  # host step -> why not on the device

    @property
    def on_host(self) -> bool:
        return not self.device

    @property
    def label(self) -> str:
        return self.device or "host"


def partition_steps(
    steps: Sequence[PartitionStep], constants: Iterable[int], graph_outputs: Iterable[int]
) -> list[Partition]:
    """The partitions of ``steps`` (module docstring)."""
    consts = set(constants)
    outs = set(graph_outputs)
    parts: list[Partition] = []
    owner: dict[int, int] = {}  # value -> partition producing it
    for s in steps:
        if not parts or parts[-1].device != s.device:
            parts.append(Partition(len(parts), s.device, []))
        p = parts[-1]
        p.steps.append(s.index)
        if s.reason:
            p.reasons[s.index] = s.reason
        for v in s.inputs:
            if v == 0:
                continue
            if v in consts:
                if v not in p.constants:
                    p.constants.append(v)
            elif owner.get(v) != p.index and v not in p.uploads:
                p.uploads.append(v)
        for v in s.outputs:
            if v:
                owner[v] = p.index
    for p in parts:
        for v in p.uploads:
            src = owner.get(v)
            if src is not None and v not in parts[src].downloads:
                parts[src].downloads.append(v)
    for v in outs:
        src = owner.get(v)
        if src is not None and v not in parts[src].downloads:
            parts[src].downloads.append(v)
    return parts


def transfer_count(parts: Sequence[Partition]) -> tuple[int, int]:
    """(uploads, downloads) per run: the crossings of the device partitions."""
    up = sum(len(p.uploads) for p in parts if not p.on_host)
    down = sum(len(p.downloads) for p in parts if not p.on_host)
    return up, down
