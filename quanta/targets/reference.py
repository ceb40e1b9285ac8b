"""The reference ("golden") target, and the plain interpreter every target can use.

Every node runs its NumPy twin from :mod:`quanta.kernels.reference` (the normative
definition of quanta's numerics). :class:`ReferenceExecutable` is the plain
interpreter over a list of :class:`Step`: a dict of values, freed after their last
use, so peak memory follows the graph's liveness rather than its size. Sessions run
through :func:`quanta.runtime.compile` and its executor instead (slots, memory plan,
profiling); this interpreter stays as the simplest statement of what running a graph
means, and serves calibration.

Ops without a registered twin are reported at prepare time, naming the node. Here
If / Loop / Scan evaluate their subgraphs with ``onnx.reference``; sessions run them as
compiled plans instead (:mod:`quanta.runtime.control_flow`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels.reference.registry import OpContext, OpError, get_op, refusal
from quanta.targets.base import (
    Executable,
    Kernel,
    KernelContext,
    Target,
    TargetError,
    check_supported,
    kernel_context,
)

__all__ = [
    "ReferenceExecutable",
    "ReferenceTarget",
    "Step",
    "bind_steps",
    "reference_evaluator",
    "reference_kernel",
]

#: Exceptions a kernel raises for bad inputs; reported as TargetError naming the node.
KERNEL_ERRORS = (OpError, ValueError, TypeError, IndexError, KeyError)


@dataclass
class Step:
    """One node bound to a kernel, with value names (the interpreter's form)."""

    node: Node
    kernel: Kernel
    ctx: KernelContext
    inputs: list[str | None]
    outputs: list[str]
    free_after: list[str]

    @property
    def impl(self) -> str:
        return self.kernel.impl


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
                result = step.kernel.fn(step.ctx, *args, **step.node.attrs, **step.kernel.params)
            except KERNEL_ERRORS as e:
                raise TargetError(f"node {step.node.label}: {e} (inputs: {describe_args(args)})") from e
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


def describe_args(args: Sequence[np.ndarray | None]) -> str:
    """``float32[1, 3], None`` — how errors show a kernel's inputs."""
    return ", ".join("None" if a is None else f"{a.dtype}{list(a.shape)}" for a in args)


def reference_kernel(node: Node, *, fallback: str = "") -> Kernel:
    """The NumPy twin of ``node`` as a Kernel (``fallback``: why a native target used it)."""
    fn = get_op(node.op_type, node.domain)
    if fn is None:
        raise TargetError(
            f"node {node.label}: operator {node.domain or 'ai.onnx'}::{node.op_type} has no reference implementation"
        )
    return Kernel(fn, "reference", f"reference:{node.op_type}", fallback=fallback)


class ReferenceTarget(Target):
    name = "reference"

    def unsupported(self, model: Model, node: Node) -> str | None:
        if get_op(node.op_type, node.domain) is None:
            domain = node.domain or "ai.onnx"
            why = f"operator {domain}::{node.op_type} has no reference implementation"
            note = model.load_notes.get(node.name)
            return why if note is None else f"{why}; the loader left it as written: {note}"
        if node.domain not in model.opset_imports and not (
            node.domain == "" and "ai.onnx" in model.opset_imports
        ):
            return f"model imports no opset for domain '{node.domain or 'ai.onnx'}'"
        return refusal(node.op_type, node.domain, dict(node.attrs), [v is not None for v in node.inputs])

    def select_kernel(self, model: Model, node: Node) -> Kernel:
        del model  # unused: every node runs its twin
        return reference_kernel(node)


def constants_of(model: Model) -> dict[str, np.ndarray]:
    return {name: v.const for name, v in model.graph.initializers.items()}


def bind_steps(target: Target, model: Model) -> list[Step]:
    """One Step per node with ``target``'s kernel, and last-use freeing from the graph."""
    graph = model.graph
    check_supported(target, model)
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
        steps.append(
            Step(
                node,
                target.select_kernel(model, node),
                kernel_context(model, node),
                [None if v is None else v.name for v in node.inputs],
                [v.name for v in node.outputs],
                sorted(frees.get(k, [])),
            )
        )
    return steps


def reference_evaluator(opset_imports: Mapping[str, int]):
    """Constant folding's evaluator: a node's reference kernel (passes may not import
    kernels, so the runtime injects this). ``evaluate(node, inputs) -> outputs``; the
    opset of each op's domain comes from ``opset_imports`` (a model's)."""

    def evaluate(node, inputs):
        fn = get_op(node.op_type, node.domain)
        if fn is None:
            raise LookupError(f"no reference kernel for {node.op_type}")
        ctx = OpContext(
            opset=opset_imports.get(node.domain, 1 if node.domain else 21),
            n_outputs=len(node.outputs),
            node_name=node.name,
            op_type=node.op_type,
            domain=node.domain,
        )
        out = fn(ctx, *inputs, **node.attrs)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    return evaluate
