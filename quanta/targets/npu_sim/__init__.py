"""``npu-sim``: a simulated integer-only accelerator behind the HAL.

- this module — the target: :data:`NPU_SIM_CAPABILITIES` (the HAL capabilities, derived
  from the device's rules), :class:`NpuSimTarget` (device nodes on the device kernels,
  the rest on its host target "native" as host partitions with explicit transfers,
  ``quanta/targets/partition.py``; nothing falls back per node) and its lowering
  pipeline (:func:`npu_sim_pipeline`);
- :mod:`~quanta.targets.npu_sim.device` — the simulated device: its own memory, command
  streams executed on a worker thread, fences;
- :mod:`~quanta.targets.npu_sim.kernels` — the one entry point that executes an
  integer-only node (``execute``) and says whether the device can (``supported``);
- :mod:`~quanta.targets.npu_sim.rules` — the device's rules as data, the verifier of the
  integer-only stage and the constraint profiles of real NPU families (Arm Ethos-U);
- :mod:`~quanta.targets.npu_sim.pipeline` — the integer-only lowering the target
  declares (``npu_pipeline``).

The partition into device and host nodes for reports, the stage check and a
node-by-node runner of the device numerics without the device machinery live one layer
up, in :mod:`quanta.runtime.npu_sim`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quanta.hal.capabilities import Capabilities
from quanta.ir.graph import Model, Node
from quanta.targets.base import Kernel, Target
from quanta.targets.npu_sim import rules

__all__ = [
    "NPU_SIM_CAPABILITIES",
    "NPU_SIM_OPS",
    "NpuSimTarget",
    "device_kernel",
    "golden",
    "make_device",
    "npu_sim_pipeline",
]

_STORAGE = {"i8": "int8", "u8": "uint8", "i16": "int16", "i32": "int32"}


def _pair(key: str) -> tuple[str, str]:
    domain, _, op = key.partition("::")
    return domain, op


#: (domain, op_type) the device runs: the integer-only stage's operators and integer
#: data movement (rules.CAPABILITIES, the one table)
NPU_SIM_OPS: frozenset[tuple[str, str]] = frozenset(
    _pair(k) for k in (*rules.CAPABILITIES.ops, *rules.CAPABILITIES.movement)
)

NPU_SIM_CAPABILITIES = Capabilities(
    name="npu-sim",
    ops=NPU_SIM_OPS,
    # activations (rules.CAPABILITIES.activation_types) and the int32 of biases,
    # accumulators and column sums
    element_types=frozenset(
        {_STORAGE[t] for t in (*rules.CAPABILITIES.activation_types, *rules.CAPABILITIES.bias_types)}
    ),
    requant_modes=tuple(f"fixed-point:{m}" for m in rules.CAPABILITIES.rounding_modes),
    weight_granularity=("per-tensor", "per-channel"),
    symmetric_weights=True,
    activation_granularity=("per-tensor",),
    memory_bytes=rules.CAPABILITIES.memory_bytes,
    alignment=rules.CAPABILITIES.alignment,
    max_rank=6,
    max_dim=65536,
    extra=dict(rules.CAPABILITIES.notes),
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


def npu_sim_pipeline(model: Model) -> list[Any] | None:
    """The passes compile() runs for npu-sim: a quantized graph is lowered to the
    integer-only stage (``pipeline.npu_pipeline``: ``lower_qdq`` without the
    channels-last layout, then IntegerOnly); a float graph gets the host targets'
    pipeline (None: it runs on the host, nothing float runs on the device)."""
    from quanta.ir.op_rules import QUANT_OPS

    if not any(n.op_type in QUANT_OPS for n in model.graph.nodes):
        return None
    from quanta.targets.npu_sim.pipeline import npu_pipeline

    return npu_pipeline(model)


def golden(model: Any, feeds: Any, *, host: str | None = None) -> list[Any]:
    """npu-sim's golden on ``model`` (path, bytes, proto): lowered by
    :func:`npu_sim_pipeline`, every node the device takes on the NumPy golden of the
    integer-only kernels, every other node on the ``host`` target's kernel (default:
    the target's own host, so host partitions compare like for like), run by the plain
    interpreter — no device machinery. The simulator's outputs are bit-identical with
    it."""
    from quanta.ir.onnx_io import load
    from quanta.passes.manager import PassManager
    from quanta.passes.pipelines import optimize_float
    from quanta.targets.reference import reference_evaluator

    m = load(model)
    passes = npu_sim_pipeline(m)
    if passes is None:  # a float graph: the host pipeline
        passes = optimize_float(
            opset=m.opset_imports.get("", 21), evaluator=reference_evaluator(m.opset_imports)
        )
    PassManager(passes).run(m)
    target = _GoldenTarget(host or NpuSimTarget.host)
    return target.prepare(m).run(feeds, [v.name for v in m.graph.outputs])


class _GoldenTarget(Target):
    """Device nodes on the golden kernels, the others on ``host``'s (for :func:`golden`)."""

    name = "npu-sim-golden"

    def __init__(self, host: str):
        from quanta.targets.registry import get_target

        self.device = NpuSimTarget()
        self.host_target = get_target(host)

    def unsupported(self, model: Model, node: Node) -> str | None:
        if self.device.unsupported(model, node) is None:
            return None
        return self.host_target.unsupported(model, node)

    def select_kernel(self, model: Model, node: Node) -> Kernel:
        if self.device.unsupported(model, node) is None:
            return Kernel(device_kernel(node, impl="reference"), "npu-sim-golden", f"golden:{node.op_type}")
        return self.host_target.select_kernel(model, node)


def device_kernel(node: Node, *, impl: str = "auto") -> Callable[..., Any]:
    """The device's kernel for ``node`` with the calling convention of
    :mod:`quanta.targets.base`: ``kernels.execute`` (C++ where it exists, else the
    golden; ``impl="reference"``: the golden)."""
    from quanta.targets.npu_sim.kernels import execute

    def run(ctx: Any, *inputs: Any, **attrs: Any) -> list[Any]:
        del ctx, attrs  # execute reads them from the node
        return execute(node, list(inputs), impl=impl)

    return run


class NpuSimTarget(Target):
    """Device nodes: :func:`device_kernel`; host nodes: the ``host`` target. A node runs
    on the device when the HAL capabilities (shapes fixed by the inputs, element types,
    rank) and the device's rules (``kernels.supported``) both allow it.

    ``impl="reference"``: the device kernels are the golden (the definition of the
    device numerics), and so is the host target."""

    name = "npu-sim"
    host = "native"

    def __init__(self, capabilities: Capabilities = NPU_SIM_CAPABILITIES, *, impl: str = "auto"):
        self.capabilities = capabilities
        self.impl = impl
        if impl == "reference":
            self.host = "reference"
        self._symbols: tuple[int, frozenset[str]] | None = None

    def unsupported(self, model: Model, node: Node) -> str | None:
        why = self.capabilities.unsupported(node, self._input_symbols(model))
        if why is not None:
            return why
        from quanta.targets.npu_sim.kernels import supported

        return supported(node)

    def select_kernel(self, model: Model, node: Node) -> Kernel:
        del model
        return Kernel(
            device_kernel(node, impl=self.impl), "npu-sim", f"npu-sim:{node.op_type}", device="npu-sim"
        )

    def verify_partition(self, nodes: list[Node]) -> list[str]:
        """The integer-only stage's verifier over a device partition: empty proves no
        float operation remains on the device (rules.verify_integer_stage)."""
        return rules.verify_integer_stage(nodes, rules.CAPABILITIES)

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
