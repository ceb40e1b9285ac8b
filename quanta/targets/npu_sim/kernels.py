"""npu-sim kernels: execute one integer-only node (the device's instruction set).

Contract with the device and the runtime (stable)::

    supported(node) -> str | None
        None when the device can run ``node`` (a quanta IR ``Node``), else the reason
        naming the rule it breaks (the op is not in CAPABILITIES, a value is not an
        integer tensor, a missing or out-of-range requantization parameter...).

    execute(node, inputs: list[np.ndarray | None]) -> list[np.ndarray]
        Run ``node`` on host NumPy arrays (the device memory's contents) and return one
        array per output. Only integer arrays go in and come out; no float arithmetic
        runs. Raises :class:`DeviceKernelError` naming the node on bad input. Thread-safe
        and stateless: the simulated device may call it from its worker thread.

``execute`` runs the C++ ``intonly`` kernels where they exist (the ``_native`` module's
``intonly_*`` functions) and the NumPy golden
(:mod:`quanta.kernels.reference.intonly`) otherwise; both are bit-exact by test
(tests/intonly). ``execute(node, inputs, impl="reference")`` forces the golden.

The device's capabilities (which ops, element types, granularity, rounding modes,
memory) are data: :data:`quanta.targets.npu_sim.rules.CAPABILITIES`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from quanta.ir.graph import Node
from quanta.kernels.reference import intonly  # noqa: F401  (registers the golden ops)
from quanta.kernels.reference.registry import OpContext, OpError, get_op
from quanta.targets.npu_sim.rules import check_node

__all__ = ["DeviceKernelError", "execute", "supported"]


class DeviceKernelError(ValueError):
    """A node the device kernels refuse, naming the node and the reason."""


def supported(node: Node) -> str | None:
    """None when npu-sim runs ``node``, else why not (module docstring)."""
    return check_node(node)


def _native() -> Any:
    try:
        from quanta.kernels import _native  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _native if hasattr(_native, "intonly_requantize") else None


def _native_call(node: Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray | None:
    """The C++ kernel's result, or None when there is none for this node."""
    nat = _native()
    if nat is None:
        return None
    from quanta.targets.npu_sim import native_bind

    return native_bind.run(nat, node, inputs)


def execute(node: Node, inputs: Sequence[np.ndarray | None], *, impl: str = "auto") -> list[np.ndarray]:
    """Execute one integer-only node on host arrays (module docstring)."""
    reason = supported(node)
    if reason is not None:
        raise DeviceKernelError(f"node {node.label}: npu-sim cannot run it: {reason}")
    for i, a in enumerate(inputs):
        if a is not None and np.asarray(a).dtype.kind not in "iub":
            raise DeviceKernelError(
                f"node {node.label}: input {i} is {np.asarray(a).dtype}: the device holds integer tensors only"
            )
    try:
        if impl in ("auto", "native"):
            out = _native_call(node, inputs)
            if out is not None:
                return [out]
            if impl == "native":
                raise DeviceKernelError(f"node {node.label}: no native npu-sim kernel for {node.op_type}")
        fn = get_op(node.op_type, node.domain)
        if fn is None:  # CAPABILITIES lists only ops with a golden
            raise DeviceKernelError(f"node {node.label}: no kernel for {node.domain}::{node.op_type}")
        ctx = OpContext(
            n_outputs=len(node.outputs), node_name=node.name, op_type=node.op_type, domain=node.domain
        )
        result = fn(ctx, *inputs, **node.attrs)
    except (OpError, ValueError, TypeError, IndexError) as e:
        if isinstance(e, DeviceKernelError):
            raise
        raise DeviceKernelError(f"node {node.label}: {e}") from e
    outs = list(result) if isinstance(result, (tuple, list)) else [result]
    for o in outs:
        if np.asarray(o).dtype.kind not in "iub":
            raise DeviceKernelError(
                f"node {node.label}: produced {np.asarray(o).dtype}, not an integer tensor"
            )
    return outs
