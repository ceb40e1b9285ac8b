"""The reference ("golden") target: a plain interpreter over the IR.

Every node runs its NumPy twin from :mod:`quanta.kernels.reference` (the normative
definition of quanta's numerics). Values are freed after their last use, so peak
memory follows the graph's liveness rather than its size.

Control flow (If, Loop, Scan) and ops without a registered twin are reported at
prepare time, naming the node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.ir.onnx_io import node_from_proto_for_reference
from quanta.kernels.reference.registry import OpContext, OpError, get_op
from quanta.targets.base import Executable, Target, TargetError

__all__ = ["ReferenceExecutable", "ReferenceTarget", "Step"]


@dataclass
class Step:
    """One node bound to an implementation."""

    node: Node
    fn: Callable[..., Any]
    ctx: OpContext
    inputs: list[str | None]
    outputs: list[str]
    free_after: list[str]
    impl: str = "reference"


class ReferenceExecutable(Executable):
    def __init__(self, model: Model, steps: list[Step], constants: dict[str, np.ndarray]):
        self.model = model
        self.steps = steps
        self.constants = constants
        self.fallbacks = []

    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        *,
        on_value: Callable[[str, np.ndarray], None] | None = None,
    ) -> list[np.ndarray]:
        env: dict[str, np.ndarray] = dict(self.constants)
        env.update(feeds)
        keep = set(output_names)
        for step in self.steps:
            args = [None if n is None else env[n] for n in step.inputs]
            try:
                result = step.fn(step.ctx, *args, **step.node.attrs)
            except (OpError, ValueError, TypeError, IndexError, KeyError) as e:
                shapes = ", ".join("None" if a is None else f"{a.dtype}{list(a.shape)}" for a in args)
                raise TargetError(f"node {step.node.label}: {e} (inputs: {shapes})") from e
            if not isinstance(result, (tuple, list)):
                result = (result,)
            for name, arr in zip(step.outputs, result):
                if name:
                    env[name] = arr
                    if on_value is not None:
                        on_value(name, arr)
            for name in step.free_after:
                if name not in keep:
                    env.pop(name, None)
        missing = [n for n in output_names if n not in env]
        if missing:
            raise TargetError(f"outputs {missing} were not computed")
        return [env[n] for n in output_names]


class ReferenceTarget(Target):
    name = "reference"

    def unsupported(self, model: Model, node: Node) -> str | None:
        if get_op(node.op_type, node.domain) is None:
            domain = node.domain or "ai.onnx"
            return f"operator {domain}::{node.op_type} has no reference implementation"
        if node.domain not in model.opset_imports and not (node.domain == "" and "ai.onnx" in model.opset_imports):
            return f"model imports no opset for domain '{node.domain or 'ai.onnx'}'"
        return None

    def prepare(self, model: Model) -> ReferenceExecutable:
        return ReferenceExecutable(model, bind_reference_steps(self, model), constants_of(model))


def constants_of(model: Model) -> dict[str, np.ndarray]:
    return {name: v.const for name, v in model.graph.initializers.items()}


def bind_reference_steps(target: Target, model: Model) -> list[Step]:
    """One reference Step per node, with last-use freeing computed from the graph."""
    graph = model.graph
    problems = []
    for node in graph.nodes:
        reason = target.unsupported(model, node)
        if reason is not None:
            problems.append(f"node {node.label}: {reason}")
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise TargetError(problems[0] + more)
    last_use: dict[str, int] = {}
    for k, node in enumerate(graph.nodes):
        for v in node.inputs:
            if v is not None and not v.is_const:
                last_use[v.name] = k
    frees: dict[int, list[str]] = {}
    for name, k in last_use.items():
        frees.setdefault(k, []).append(name)
    steps = []
    for k, node in enumerate(graph.nodes):
        fn = get_op(node.op_type, node.domain)
        assert fn is not None
        ctx = OpContext(
            opset=model.opset_imports.get(node.domain, model.opset_imports.get("ai.onnx", 1)),
            n_outputs=len(node.outputs),
            node_name=node.name,
            op_type=node.op_type,
            domain=node.domain,
            onnx_node=node_from_proto_for_reference(node),
        )
        outputs = [v.name for v in node.outputs]
        steps.append(
            Step(node, fn, ctx, [None if v is None else v.name for v in node.inputs], outputs, sorted(frees.get(k, [])))
        )
    return steps
