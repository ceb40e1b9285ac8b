"""The HAL's errors: each names what failed (device, buffer, command, node) and why."""

from __future__ import annotations

__all__ = ["AllocationError", "DeviceLostError", "FenceTimeout", "HalError", "UnsupportedError"]


class HalError(RuntimeError):
    """A device, queue, buffer or command failed."""


class AllocationError(HalError):
    """Device memory could not be allocated (too little free, or an injected fault)."""


class DeviceLostError(HalError):
    """The device stopped executing; every later submission fails with this error."""


class FenceTimeout(HalError, TimeoutError):
    """A semaphore did not reach the awaited value within the timeout."""


class UnsupportedError(HalError):
    """A command the device cannot execute (an operator, type or shape outside its
    capabilities)."""
