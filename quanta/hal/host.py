"""The host CPU as a HAL device.

Its memory is host memory (a buffer is an aligned NumPy array), its queue executes on
the submitting thread, and its capabilities are those of the host target it stands for
(every operator: the reference kernels define the host numerics and the native target
runs them faster, bit for bit). A whole model placed on the host is one executable,
:class:`quanta.runtime.execute.Executor`, and a session calls it directly: a synchronous
queue with nothing to wait for adds only cost, so the native path has no HAL layer in
its hot loop. Mixed plans use the host device for the host partitions
(``quanta/runtime/hetero.py``).
"""

from __future__ import annotations

import numpy as np

from quanta.hal.capabilities import Capabilities
from quanta.hal.device import Binding, Buffer, Device
from quanta.hal.errors import AllocationError, HalError

__all__ = ["HOST_CAPABILITIES", "HostDevice"]

HOST_CAPABILITIES = Capabilities(
    name="host",
    ops=None,
    element_types=frozenset(),  # every dtype
    requant_modes=("float-scale", "fixed-point"),
    memory_bytes=None,
    alignment=64,
)


class HostDevice(Device):
    name = "host"

    def __init__(self, capabilities: Capabilities = HOST_CAPABILITIES):
        super().__init__(capabilities)
        self._arrays: dict[int, np.ndarray] = {}
        self._used = 0

    def allocate(self, nbytes: int) -> Buffer:
        if nbytes < 0:
            raise AllocationError(f"host: cannot allocate {nbytes} bytes")
        align = self.capabilities.alignment
        raw = np.empty(nbytes + align, np.uint8)
        shift = (-raw.ctypes.data) % align
        buf = Buffer(self, 0, nbytes)
        self._arrays[id(buf)] = raw[shift : shift + nbytes]
        self._used += nbytes
        return buf

    def release(self, buffer: Buffer) -> None:
        if buffer.released or id(buffer) not in self._arrays:
            raise HalError(f"release of {buffer!r}: not a live buffer of this device")
        del self._arrays[id(buffer)]
        buffer.released = True
        self._used -= buffer.nbytes

    @property
    def memory_used(self) -> int:
        return self._used

    def _buffer_array(self, binding: Binding) -> np.ndarray:
        raw = self._arrays[id(binding.buffer)]
        return (
            raw[binding.offset : binding.offset + binding.nbytes].view(binding.dtype).reshape(binding.shape)
        )
