"""The hardware abstraction layer: devices with capabilities as data, device buffers,
command buffers, queues, timeline semaphores and an executable cache
(:mod:`quanta.hal.device`; docs/design.md "HAL", docs/runtime.md §7).

Layering: ``quanta.hal`` imports only NumPy; targets build on it
(``quanta/targets/registry.py``), the runtime drives it (``quanta/runtime/hetero.py``).
"""

from __future__ import annotations

from quanta.hal.capabilities import ALL_OPS, Capabilities
from quanta.hal.device import (
    Binding,
    Buffer,
    CommandBuffer,
    CommandRecord,
    Device,
    DeviceExecutable,
    Queue,
    Semaphore,
    Submission,
)
from quanta.hal.errors import AllocationError, DeviceLostError, FenceTimeout, HalError, UnsupportedError
from quanta.hal.host import HOST_CAPABILITIES, HostDevice

__all__ = [
    "ALL_OPS",
    "HOST_CAPABILITIES",
    "AllocationError",
    "Binding",
    "Buffer",
    "Capabilities",
    "CommandBuffer",
    "CommandRecord",
    "Device",
    "DeviceExecutable",
    "DeviceLostError",
    "FenceTimeout",
    "HalError",
    "HostDevice",
    "Queue",
    "Semaphore",
    "Submission",
    "UnsupportedError",
]
