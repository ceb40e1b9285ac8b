"""The target registry: every target by name, with its capabilities, its device and its
lowering pipeline.

A :class:`TargetInfo` is what a target declares: ``make_target()`` (the kernel choice per
node, :class:`quanta.targets.base.Target`), ``capabilities`` (what its device runs, as
data: :class:`quanta.hal.Capabilities`), ``make_device(**options)`` (a HAL device, None
for the host targets), ``pipeline(model)`` (the passes :func:`quanta.runtime.compile`
runs for it; None: the default pipeline every host target shares) and ``host`` (the
target that runs what the device cannot, as host partitions; None: the target runs
every node itself). ``register_target`` adds one; ``get_target`` / ``target_info`` /
``registered_targets`` read the table. Adding a target: docs/extending.md "A target".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quanta.hal.capabilities import Capabilities
from quanta.hal.host import HOST_CAPABILITIES

if TYPE_CHECKING:
    from quanta.hal.device import Device
    from quanta.ir.graph import Model
    from quanta.targets.base import Target

__all__ = ["TargetInfo", "get_target", "register_target", "registered_targets", "target_info"]


@dataclass(frozen=True)
class TargetInfo:
    name: str
    make_target: Callable[[], Target]
    capabilities: Capabilities
    description: str = ""
    make_device: Callable[..., Device] | None = None
    pipeline: Callable[[Model], list[Any] | None] | None = None
    host: str | None = None
    #: the numerics contract: targets with the same one give bit-identical outputs on
    #: the same lowered graph ("host": the reference target's kernels define them)
    numerics: str = "host"
    #: ``golden(model, feeds) -> outputs``: the definition of this target's numerics
    #: when it is not the reference target's (None: "reference" is its golden)
    golden: Callable[[Any, Any], list[Any]] | None = None


_TARGETS: dict[str, TargetInfo] = {}


def register_target(info: TargetInfo) -> None:
    """Add (or replace) the target ``info.name``."""
    _TARGETS[info.name] = info


def registered_targets() -> list[str]:
    return list(_TARGETS)


def target_info(name: str) -> TargetInfo:
    info = _TARGETS.get(name)
    if info is None:
        known = ", ".join(f"'{n}'" for n in _TARGETS)
        raise ValueError(f"unknown backend '{name}': expected one of {known}")
    return info


def get_target(name: str) -> Target:
    """A fresh Target object for ``name``."""
    return target_info(name).make_target()


def _reference() -> Target:
    from quanta.targets.reference import ReferenceTarget

    return ReferenceTarget()


def _native() -> Target:
    from quanta.targets.native import NativeTarget

    return NativeTarget()


def _npu_sim() -> Target:
    from quanta.targets.npu_sim import NpuSimTarget

    return NpuSimTarget()


def _npu_sim_device(**options: Any) -> Device:
    from quanta.targets.npu_sim import make_device

    return make_device(**options)


def _npu_sim_pipeline(model: Model) -> list[Any] | None:
    from quanta.targets.npu_sim import npu_sim_pipeline

    return npu_sim_pipeline(model)


def _npu_sim_golden(model: Any, feeds: Any) -> list[Any]:
    from quanta.targets.npu_sim import golden

    return golden(model, feeds)


def _npu_sim_capabilities() -> Capabilities:
    from quanta.targets.npu_sim import NPU_SIM_CAPABILITIES

    return NPU_SIM_CAPABILITIES


register_target(
    TargetInfo("reference", _reference, HOST_CAPABILITIES, "bit-exact NumPy golden: the host numerics")
)
register_target(
    TargetInfo("native", _native, HOST_CAPABILITIES, "C++ kernels on the host, bit-exact with reference")
)
register_target(
    TargetInfo(
        "npu-sim",
        _npu_sim,
        _npu_sim_capabilities(),
        "simulated integer-only accelerator: own memory, asynchronous queue, fences",
        make_device=_npu_sim_device,
        pipeline=_npu_sim_pipeline,
        host="native",
        numerics="npu-sim",
        golden=_npu_sim_golden,
    )
)
