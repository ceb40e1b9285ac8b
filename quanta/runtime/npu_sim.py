"""npu-sim's lowering pipeline, partition and stage check, and a direct runner.

:func:`lower_for_npu` turns a quantized (QDQ) model into the integer-only stage: the
runtime's ``lower_qdq`` clean-up and instruction selection (without the channels-last
layout, which the device does not use), then :class:`IntegerOnly` (every requantization
derived once, docs/passes.md "Integer-only stage"). :func:`partition` splits the nodes
into device nodes (:func:`~quanta.targets.npu_sim.kernels.supported`) and host nodes;
:func:`check` verifies the device nodes (``verify_integer_stage``: no float tensor, no
missing parameter) and optionally a constraint profile (``"ethos-u"``).

:func:`run_lowered` executes a lowered model node by node: device nodes through
:func:`quanta.targets.npu_sim.kernels.execute` (C++ where it exists, else the golden),
host nodes through their reference kernels. It is the simulator's numerics without its
device machinery (queues, buffers, fences: the HAL's npu-sim device adds those).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.passes.manager import PassManager
from quanta.targets.npu_sim.kernels import execute, supported
from quanta.targets.npu_sim.pipeline import npu_pipeline
from quanta.targets.npu_sim.rules import Violation, check_profile, verify_integer_stage

__all__ = ["NpuReport", "check", "lower_for_npu", "npu_pipeline", "partition", "run_lowered"]


@dataclass
class NpuReport:
    """What lowering for npu-sim did: device and host nodes, refusals, violations."""

    device: list[Node] = field(default_factory=list)
    host: list[tuple[Node, str]] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    stage_problems: list[str] = field(default_factory=list)
    profile_violations: list[Violation] = field(default_factory=list)

    def summary(self) -> str:
        ops: dict[str, int] = {}
        for n in self.device:
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
        host_ops: dict[str, int] = {}
        for n, _ in self.host:
            host_ops[n.op_type] = host_ops.get(n.op_type, 0) + 1
        lines = [
            f"device nodes: {len(self.device)} {dict(sorted(ops.items()))}",
            f"host nodes: {len(self.host)} {dict(sorted(host_ops.items()))}",
            f"integer-only stage problems: {len(self.stage_problems)}",
        ]
        lines += [f"  {p}" for p in self.stage_problems[:10]]
        if self.refused:
            lines.append(f"refused lowerings: {len(self.refused)}")
            lines += [f"  {a}: {b}" for a, b in self.refused[:10]]
        if self.profile_violations:
            lines.append(f"profile violations: {len(self.profile_violations)}")
            lines += [f"  {v}" for v in self.profile_violations[:20]]
        return "\n".join(lines)


def partition(model: Model) -> tuple[list[Node], list[tuple[Node, str]]]:
    """(device nodes, [(host node, why not on the device)]) in graph order."""
    device, host = [], []
    for node in model.graph.nodes:
        reason = supported(node)
        if reason is None:
            device.append(node)
        else:
            host.append((node, reason))
    return device, host


def check(model: Model, profile: str | None = None) -> NpuReport:
    """Partition ``model`` (already lowered) and verify the device partition."""
    device, host = partition(model)
    rep = NpuReport(device=device, host=host)
    rep.stage_problems = verify_integer_stage(device)
    if profile is not None:
        rep.profile_violations = check_profile(device, profile)
    return rep


def lower_for_npu(model: Model, *, rounding: str = "double", profile: str | None = None) -> NpuReport:
    """Lower ``model`` in place to the integer-only stage and check it."""
    passes = npu_pipeline(model, rounding)
    PassManager(passes).run(model)
    rep = check(model, profile)
    rep.refused = list(passes[-2].refused)  # IntegerOnly's
    return rep


def run_lowered(
    model: Model,
    feeds: Mapping[str, np.ndarray],
    output_names: Sequence[str] | None = None,
    *,
    impl: str = "auto",
) -> list[np.ndarray]:
    """Run a lowered model: device nodes on the npu-sim kernels, host nodes on the
    reference kernels (module docstring)."""
    from quanta.targets.base import kernel_context
    from quanta.targets.reference import constants_of, reference_kernel

    graph = model.graph
    env: dict[str, np.ndarray] = dict(constants_of(model))
    env.update(feeds)
    names = list(output_names) if output_names is not None else [v.name for v in graph.outputs]
    for node in graph.nodes:
        args = [None if v is None else env[v.name] for v in node.inputs]
        if supported(node) is None:
            outs = execute(node, args, impl=impl)
        else:
            k = reference_kernel(node)
            r = k.fn(kernel_context(model, node), *args, **node.attrs)
            outs = list(r) if isinstance(r, (tuple, list)) else [r]
        for v, a in zip(node.outputs, outs):
            if v.name:
                env[v.name] = a
    return [env[n] for n in names]
