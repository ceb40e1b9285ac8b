"""``npu-sim``: a simulated integer-only accelerator behind the HAL.

The target places every node its device can run (:data:`NPU_SIM_CAPABILITIES`, checked
by :meth:`quanta.hal.Capabilities.unsupported`) on the device, and the rest on its host
target ("native") as host partitions with explicit transfers
(``quanta/targets/partition.py``); nothing falls back per node. The device
(:mod:`quanta.targets.npu_sim.device`) has its own memory and executes command streams
on a worker thread.

Device kernels: each device node runs the integer kernel :func:`device_kernel` picks —
the integer-only kernels of :mod:`quanta.targets.npu_sim.kernels` when that module
offers one for the node, else the node's reference twin from
:mod:`quanta.kernels.reference` (the host numerics, so a device partition is then
bit-identical with the reference target).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quanta.hal.capabilities import Capabilities
from quanta.ir.graph import Model, Node
from quanta.targets.base import Kernel, Target

__all__ = [
    "DEFAULT_MEMORY_BYTES",
    "NPU_SIM_CAPABILITIES",
    "NPU_SIM_OPS",
    "NpuSimTarget",
    "device_kernel",
    "make_device",
]

MS = "com.microsoft"

#: (domain, op_type) the device runs: integer compute, pooling and data movement
NPU_SIM_OPS: frozenset[tuple[str, str]] = frozenset(
    {
        ("", "QLinearConv"),
        (MS, "QLinearConv"),
        ("", "QLinearMatMul"),
        ("", "MatMulInteger"),
        ("", "ConvInteger"),
        (MS, "QGemm"),
        (MS, "QLinearAdd"),
        (MS, "QLinearMul"),
        (MS, "QLinearConcat"),
        (MS, "QLinearGlobalAveragePool"),
        (MS, "QLinearAveragePool"),
        (MS, "QLinearLeakyRelu"),
        (MS, "QLinearSigmoid"),
        (MS, "QLinearSoftmax"),
        ("quanta", "QLinearLookup"),
        ("", "MaxPool"),
        (MS, "NhwcMaxPool"),
        ("", "Reshape"),
        ("", "Flatten"),
        ("", "Transpose"),
        ("", "Squeeze"),
        ("", "Unsqueeze"),
        ("", "Concat"),
        ("", "Identity"),
    }
)

#: the default device memory: 8 MiB (an Ethos-U55-class system's SRAM + a slice of DRAM)
DEFAULT_MEMORY_BYTES = 8 << 20

NPU_SIM_CAPABILITIES = Capabilities(
    name="npu-sim",
    ops=NPU_SIM_OPS,
    element_types=frozenset({"int8", "uint8", "int32"}),
    requant_modes=("float-scale",),
    weight_granularity=("per-tensor", "per-channel"),
    symmetric_weights=False,
    activation_granularity=("per-tensor",),
    memory_bytes=DEFAULT_MEMORY_BYTES,
    alignment=64,
    max_rank=6,
    max_dim=65536,
)


def make_device(
    *, memory_bytes: int | None = None, faults: Any = None, capabilities: Capabilities | None = None
) -> Any:
    """A fresh simulated device (``memory_bytes``: its memory size; ``faults``: a
    :class:`quanta.targets.npu_sim.device.Faults`)."""
    from dataclasses import replace

    from quanta.targets.npu_sim.device import NpuSimDevice

    caps = capabilities or NPU_SIM_CAPABILITIES
    if memory_bytes is not None:
        caps = replace(caps, memory_bytes=int(memory_bytes))
    return NpuSimDevice(caps, faults=faults)


def device_kernel(model: Model, node: Node) -> tuple[Callable[..., Any], str]:
    """``(fn, name)``: the integer kernel a device node runs, with the calling
    convention of :mod:`quanta.targets.base` (module docstring)."""
    from quanta.targets.reference import reference_kernel

    try:
        from quanta.targets.npu_sim import kernels as integer_kernels  # integer-only numerics
    except ImportError:
        integer_kernels = None
    pick = getattr(integer_kernels, "device_kernel", None) if integer_kernels is not None else None
    if pick is not None:
        fn = pick(model, node)
        if fn is not None:
            return fn, f"npu-sim:{node.op_type}"
    return reference_kernel(node).fn, f"npu-sim:{node.op_type}"


class NpuSimTarget(Target):
    """Device nodes: :func:`device_kernel`; host nodes: the ``host`` target."""

    name = "npu-sim"
    host = "native"

    def __init__(self, capabilities: Capabilities = NPU_SIM_CAPABILITIES):
        self.capabilities = capabilities
        self._symbols: tuple[int, frozenset[str]] | None = None

    def unsupported(self, model: Model, node: Node) -> str | None:
        return self.capabilities.unsupported(node, self._input_symbols(model))

    def _input_symbols(self, model: Model) -> frozenset[str]:
        """The symbolic dimensions of the graph's inputs (a feed fixes each)."""
        if self._symbols is None or self._symbols[0] != id(model):
            found = {
                d
                for v in model.graph.inputs
                if v.type is not None and v.type.shape is not None
                for d in v.type.shape
                if isinstance(d, str)
            }
            self._symbols = (id(model), frozenset(found))
        return self._symbols[1]

    def select_kernel(self, model: Model, node: Node) -> Kernel:
        fn, name = device_kernel(model, node)
        return Kernel(fn, "npu-sim", name, device="npu-sim")
