"""What every back end offers: a kernel for each node, and a plain interpreter.

A target decides per node whether it can run it (:meth:`Target.unsupported` returns a
reason or None) and which implementation runs it (:meth:`Target.select_kernel`
returns a :class:`Kernel`). :func:`quanta.runtime.compile` turns those choices into a
Plan (slots, memory plan, profiling); :meth:`Target.prepare` is the plain interpreter
over the same choices (no plan, used by calibration). The reference target is the
living definition of the numerics; other targets are tested bit-exact against it.

Kernel calling convention (extends the reference contract of
``quanta/kernels/reference/registry.py``)::

    fn(ctx, *inputs, **attributes, **kernel.params[, out=array]) -> array | tuple

- ``ctx`` is a :class:`KernelContext`: the reference ``OpContext`` plus
  ``num_threads`` (the session's intra-op thread count; native kernels pass it on);
- ``kernel.params`` are compile-time constants of this node (prepacked weights, column
  sums, requantization multipliers), passed as keyword arguments;
- when ``kernel.out`` is True the kernel also accepts ``out=`` (None, or a preallocated
  C-contiguous array of the output's shape and dtype, a view into the runtime's arena);
  it writes its single output there and returns it. A kernel never keeps ``out``.
  With ``kernel.out_all`` as well, the node may have several outputs and ``out=`` is
  None or a tuple of one place per output (None for an omitted one); the kernel writes
  each output into its place and returns the tuple.

Optionally a kernel offers ``specialize`` (:class:`Specialization`): once the runtime
knows the shapes and dtypes of one input signature, it asks for a callable valid for
that signature only (conversions, bounds, thread counts decided once), and calls that
instead of ``fn`` on the runs of the signature.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels.reference.registry import OpContext

__all__ = ["Executable", "Kernel", "KernelContext", "Specialization", "Target", "TargetError"]


class TargetError(ValueError):
    """A node a target cannot run, or a failure while running one; names the node."""


@dataclass
class KernelContext(OpContext):
    """The reference ``OpContext`` plus what the runtime hands a kernel.

    ``num_threads``: intra-op threads this kernel may use (>= 1; results must not
    depend on it, docs/design.md "Threads")."""

    num_threads: int = 1


@dataclass
class Kernel:
    """The implementation a target chose for one node.

    ``impl`` is "native" or "reference"; ``name`` what plans and profiles print
    (``native:quantize_linear_u8``, ``reference:Conv``); ``fallback`` is the reason a
    native target ran the node on its reference twin ("" when it did not fall back);
    ``params`` compile-time keyword arguments; ``out``: the kernel accepts ``out=``
    (module docstring); ``bodies``: the compiled subgraphs of a control-flow node."""

    fn: Callable[..., Any]
    impl: str
    name: str
    fallback: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    out: bool = False
    #: with ``out``: ``out=`` is a tuple of places, one per output of the node (module
    #: docstring), so a kernel of several outputs (DynamicQuantizeLinear's codes, scale
    #: and zero point) writes all of them into the arena
    out_all: bool = False
    #: If / Loop / Scan: attribute name -> its compiled subgraph (the runtime's
    #: ``quanta.runtime.control_flow.Body``); empty for every other kernel
    bodies: dict[str, Any] = field(default_factory=dict)
    #: optional: ``specialize(sig, **attributes_and_params)`` -> ``f(ctx, *inputs)`` for
    #: one input signature, or None (the runtime then calls ``fn``); see Specialization
    specialize: Callable[..., Callable[..., Any] | None] | None = None
    #: the HAL device this kernel runs on ("": the host, called directly by the executor;
    #: else the name of a registered target's device, run through command buffers)
    device: str = ""


@dataclass(frozen=True)
class Specialization:
    """What the runtime knows about one step when it binds an input signature.

    ``shapes`` / ``dtypes``: of each input (None for an omitted one) and ``out_shape``
    / ``out_dtype`` of the first output, as every run of the signature has them;
    ``consts``: each input's value when it is the same on every run of the signature
    (an initializer, or a value computed from shapes alone), else None; ``out``: the
    arena view the output must be written to, or None (allocate); a tuple of views, one
    per output, for a kernel with ``out_all``; ``num_threads``: the
    session's count, which a specialized call may lower for a step too small to share
    (results never depend on it); ``ctx``: the step's kernel context.

    The callable returned is called as ``f(ctx, *inputs)`` and must compute exactly
    what ``fn`` computes (bit for bit), writing into ``out`` when given. Inputs that
    are not contiguous can still reach it (a view another step made): it then hands
    the call to ``fn``.
    """

    shapes: tuple[tuple[int, ...] | None, ...]
    dtypes: tuple[np.dtype | None, ...]
    consts: tuple[np.ndarray | None, ...]
    out_shape: tuple[int, ...] | None
    out_dtype: np.dtype | None
    out: np.ndarray | tuple[np.ndarray | None, ...] | None
    num_threads: int
    ctx: Any = None


class Executable(ABC):
    """A model prepared for one target."""

    #: nodes this executable runs with a fallback implementation (name, op, reason)
    fallbacks: list[tuple[str, str, str]]

    @abstractmethod
    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        *,
        on_value: Callable[[str, np.ndarray], None] | None = None,
    ) -> list[np.ndarray]:
        """Run on validated feeds; return the named outputs in order.

        ``on_value(name, array)`` is called for every value a node produces, as soon as
        it is produced (calibration observes activations this way without keeping
        them alive). The array may be reused after the callback returns: copy it to
        keep it."""


class Target(ABC):
    name: str = ""
    #: the target that runs the nodes this one cannot (``unsupported`` gives the reason),
    #: as host partitions with explicit transfers (quanta/targets/partition.py); None: a
    #: node this target cannot run is an error
    host: str | None = None

    @abstractmethod
    def unsupported(self, model: Model, node: Node) -> str | None:
        """Why this target cannot run ``node``, or None when it can."""

    @abstractmethod
    def select_kernel(self, model: Model, node: Node) -> Kernel:
        """The kernel that runs ``node`` (only called when ``unsupported`` is None)."""

    def program_factory(self) -> Callable[[], Any] | None:
        """What makes a recorder of this target's kernel calls (docs/runtime.md "Native
        programs"): the executor records runs of the steps whose kernels say they are
        recordable and replays each run as one call. None: this target's kernels are not
        recorded and every step runs from the executor's loop."""
        return None

    def verify_partition(self, nodes: list[Node]) -> list[str]:
        """A device target's check of one device partition after partitioning (each
        problem names the node and the rule; empty: the partition is valid)."""
        del nodes
        return []

    def prepare(self, model: Model) -> Executable:
        """The plain interpreter over this target's kernels (no memory plan, no
        profiling); raise TargetError for unsupported nodes. Sessions use
        :func:`quanta.runtime.compile` instead."""
        from quanta.targets.reference import ReferenceExecutable, bind_steps, constants_of

        steps = bind_steps(self, model)
        exe = ReferenceExecutable(model, steps, constants_of(model))
        exe.fallbacks = [(s.node.name, s.node.op_type, s.kernel.fallback) for s in steps if s.kernel.fallback]
        return exe


def check_supported(target: Target, model: Model) -> None:
    """Raise TargetError naming the first node ``target`` cannot run (and how many more)."""
    problems = []
    for node in model.graph.nodes:
        reason = target.unsupported(model, node)
        if reason is not None:
            problems.append(f"node {node.label}: {reason}")
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise TargetError(problems[0] + more)


def kernel_context(model: Model, node: Node, *, num_threads: int = 1) -> KernelContext:
    """The context a kernel of ``node`` receives."""
    from quanta.ir.onnx_io import node_from_proto_for_reference

    return KernelContext(
        opset=model.opset_imports.get(node.domain, model.opset_imports.get("ai.onnx", 1)),
        n_outputs=len(node.outputs),
        node_name=node.name,
        op_type=node.op_type,
        domain=node.domain,
        onnx_node=node_from_proto_for_reference(node),
        num_threads=num_threads,
        # If/Loop/Scan: which subgraph names the inputs after the node's own bind to
        extra={"outer_names": node.outer_names} if node.outer_names else {},
    )
