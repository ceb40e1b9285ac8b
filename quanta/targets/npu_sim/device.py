"""The simulated integer accelerator: an asynchronous HAL device with its own memory.

- **Memory**: one ``memory_bytes`` block (a NumPy byte array standing for device DRAM),
  handed out by a first-fit allocator in ``alignment``-byte units. Only the device's
  commands touch it; the host moves data with copy commands.
- **Queue**: :meth:`NpuSimQueue.submit` appends the submission to a FIFO and returns at
  once; one worker thread executes submissions in order and signals their semaphores.
  A host array that a download writes is complete only once the fence signalled.
- **Faults** (:class:`Faults`, for the conformance suite): fail the n-th allocation, never
  signal a submission's semaphores (a waiter times out), lose the device at the n-th
  command (that submission and every later one fail with DeviceLostError).

The kernels a dispatch runs are loaded through the executable cache by the runtime
(``quanta/runtime/hetero.py``); which kernel an operator gets is the target's business
(``quanta/targets/npu_sim/__init__.py``).
"""

from __future__ import annotations

import bisect
import collections
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from quanta.hal.capabilities import Capabilities
from quanta.hal.device import Binding, Buffer, CommandRecord, Device, Queue, Semaphore, Submission
from quanta.hal.errors import AllocationError, DeviceLostError, HalError

__all__ = ["Faults", "NpuSimDevice", "NpuSimQueue"]


@dataclass
class Faults:
    """Injected failures (all off by default)."""

    #: the n-th allocation (1-based, counted from when this is set) raises AllocationError
    fail_allocation: int | None = None
    #: submissions after which the semaphores are never signalled (the worker drops them)
    drop_signals: bool = False
    #: the device is lost when it starts executing the n-th command (1-based, counted
    #: over the device's lifetime)
    lose_at_command: int | None = None


class NpuSimQueue(Queue):
    """Hands submissions to the device's worker thread; returns immediately."""

    device: NpuSimDevice

    def submit(self, command_buffers, *, wait=(), signal=()) -> Submission:
        sub = self._submission(command_buffers, wait, signal)
        self.device._enqueue(sub)
        return sub


class NpuSimDevice(Device):
    """See the module docstring. ``capabilities.memory_bytes`` sizes the memory."""

    name = "npu-sim"

    def __init__(self, capabilities: Capabilities, *, faults: Faults | None = None):
        if not capabilities.memory_bytes or capabilities.memory_bytes <= 0:
            raise ValueError(f"npu-sim: memory_bytes must be > 0, got {capabilities.memory_bytes}")
        super().__init__(capabilities)
        self.faults = faults or Faults()
        self._memory = np.zeros(capabilities.memory_bytes, np.uint8)
        self._free: list[tuple[int, int]] = [(0, capabilities.memory_bytes)]  # (offset, size), sorted
        self._live: dict[int, Buffer] = {}
        self._alloc_lock = threading.Lock()
        self._allocations = 0
        self._commands = 0
        self._pending: collections.deque[Submission | None] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        # the worker holds the device weakly: a device nobody references is collected,
        # and its __del__ stops the worker
        self._worker = threading.Thread(
            target=_work,
            args=(weakref.ref(self), self._cond, self._pending),
            name="npu-sim worker",
            daemon=True,
        )
        self._worker.start()

    def _make_queue(self) -> Queue:
        return NpuSimQueue(self)

    # -- memory -------------------------------------------------------------------
    @property
    def memory_bytes(self) -> int:
        return int(self._memory.size)

    @property
    def allocations(self) -> int:
        """Allocations attempted so far."""
        return self._allocations

    @property
    def commands_executed(self) -> int:
        """Commands the worker started so far (Faults.lose_at_command counts these)."""
        return self._commands

    @property
    def memory_used(self) -> int:
        return sum(b.nbytes for b in self._live.values())

    def allocate(self, nbytes: int) -> Buffer:
        if nbytes < 0:
            raise AllocationError(f"{self.name}: cannot allocate {nbytes} bytes")
        align = self.capabilities.alignment
        size = max(align, -(-nbytes // align) * align)
        with self._alloc_lock:
            self._allocations += 1
            f = self.faults.fail_allocation
            if f is not None and self._allocations >= f:
                self.faults.fail_allocation = None
                raise AllocationError(f"{self.name}: allocation of {nbytes} bytes failed (injected fault)")
            if self._lost is not None:
                raise DeviceLostError(f"{self.name}: device lost ({self._lost})")
            for k, (off, free) in enumerate(self._free):
                if free >= size:
                    if free == size:
                        del self._free[k]
                    else:
                        self._free[k] = (off + size, free - size)
                    buf = Buffer(self, off, size)
                    self._live[off] = buf
                    return buf
            largest = max((s for _, s in self._free), default=0)
            raise AllocationError(
                f"{self.name}: cannot allocate {nbytes} bytes: {self.memory_bytes - self.memory_used} of "
                f"{self.memory_bytes} bytes free, largest free block {largest}"
            )

    def release(self, buffer: Buffer) -> None:
        with self._alloc_lock:
            if buffer.device is not self or self._live.get(buffer.offset) is not buffer:
                raise HalError(f"release of {buffer!r}: not a live buffer of {self.name}")
            del self._live[buffer.offset]
            buffer.released = True
            k = bisect.bisect(self._free, (buffer.offset, 0))
            self._free.insert(k, (buffer.offset, buffer.nbytes))
            # coalesce with the neighbours
            merged: list[tuple[int, int]] = []
            for off, size in self._free:
                if merged and merged[-1][0] + merged[-1][1] == off:
                    merged[-1] = (merged[-1][0], merged[-1][1] + size)
                else:
                    merged.append((off, size))
            self._free = merged

    def _buffer_array(self, binding: Binding) -> np.ndarray:
        start = binding.buffer.offset + binding.offset
        return self._memory[start : start + binding.nbytes].view(binding.dtype).reshape(binding.shape)

    # -- the worker -------------------------------------------------------------------
    def _enqueue(self, sub: Submission) -> None:
        with self._cond:
            if self._closed:
                raise HalError(f"{self.name}: device closed")
            self._pending.append(sub)
            self._cond.notify()

    def _run_next(self, sub: Submission) -> None:
        if self.faults.drop_signals:
            sub.signal = []  # the fence this submission would signal never is
            try:
                self._run_submission(sub, timeout=None)
            except BaseException:  # a dropped fence reports nothing
                pass
            return
        self._run_submission(sub, timeout=None)

    def _execute_one(self, cmd: CommandRecord) -> None:
        self._commands += 1
        lose = self.faults.lose_at_command
        if lose is not None and self._commands >= lose and self._lost is None:
            self._lost = DeviceLostError(
                f"{self.name}: device lost while executing command {self._commands} ({cmd.kind} {cmd.label})"
            )
        if self._lost is not None:
            raise self._lost
        super()._execute_one(cmd)

    def wait_idle(self, timeout: float | None = None) -> None:
        """Block until every submission so far has executed."""
        sem = Semaphore(0, f"{self.name} idle")
        self.queue.submit([], signal=[(sem, 1)])
        sem.wait(1, timeout)

    def close(self) -> None:
        """Stop the worker after the pending submissions."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if threading.current_thread() is not self._worker:
            self._worker.join(timeout=5)

    def __del__(self) -> None:
        try:
            with self._cond:
                self._closed = True
                self._pending.append(None)  # wakes the worker, which then finds no device
                self._cond.notify()
        except Exception:
            pass


def _work(ref: weakref.ref, cond: threading.Condition, pending: collections.deque) -> None:
    """The worker loop: one submission at a time, in order; ends when the device closes
    or is collected."""
    while True:
        with cond:
            while not pending:
                device = ref()
                if device is None or device._closed:
                    return
                del device
                cond.wait(1.0)
            sub = pending.popleft()
        if sub is None:
            return
        device = ref()
        if device is None:
            return
        device._run_next(sub)
        del device
