"""The HAL: devices, buffers, command buffers, queues, timeline semaphores.

The entry points a device implements (everything else is derived from them)::

    Device.allocate(nbytes) -> Buffer          device memory, ``capabilities.alignment``-aligned
    Device.release(buffer)                     give it back
    Device._execute(commands, submission)      run recorded commands (the queue calls it)
    Device._buffer_array(buffer, shape, dtype) the device's own view of a buffer (its
                                               kernels read and write through it; the host
                                               never does: it copies)

and the objects every device shares::

    CommandBuffer.copy(src, dst)               host array <-> buffer, buffer -> buffer
    CommandBuffer.fill(binding, value)
    CommandBuffer.dispatch(executable, inputs, outputs, label=)   a kernel with its bindings
    CommandBuffer.barrier()                    later commands see earlier writes
    Queue.submit(command_buffers, wait=, signal=)   (semaphore, value) pairs
    Semaphore.signal(value) / .wait(value, timeout) / .fail(error)
    Device.executable(key, build)              the executable cache

A submission waits until every ``wait`` semaphore reached its value, executes its
command buffers in order, then signals every ``signal`` semaphore. A failing command
puts the ``signal`` semaphores into their failure state carrying the error (a waiter
gets that error, not a timeout); a submission whose wait semaphore failed fails the same
way without executing. :class:`Queue` is synchronous (the submitting thread executes);
an asynchronous device overrides :meth:`Queue.submit` to hand submissions to its worker
(``quanta/targets/npu_sim/device.py``).
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from quanta.hal.capabilities import Capabilities
from quanta.hal.errors import FenceTimeout, HalError, UnsupportedError

__all__ = [
    "Binding",
    "Buffer",
    "CommandBuffer",
    "CommandRecord",
    "Device",
    "DeviceExecutable",
    "Queue",
    "Semaphore",
]


# -- buffers ---------------------------------------------------------------------------
@dataclass(eq=False)
class Buffer:
    """``nbytes`` of ``device`` memory at ``offset``. Only the device reads or writes it;
    the host moves data with copy commands."""

    device: Device
    offset: int
    nbytes: int
    released: bool = False

    def binding(self, shape: Sequence[int], dtype: Any, offset: int = 0) -> Binding:
        """A typed window of this buffer (what a copy or a dispatch names)."""
        return Binding(self, offset, tuple(int(d) for d in shape), np.dtype(dtype))

    def __repr__(self) -> str:
        return f"Buffer({self.device.name}, @{self.offset} +{self.nbytes}{', released' if self.released else ''})"


@dataclass(frozen=True)
class Binding:
    """A tensor in a buffer: ``shape`` and ``dtype`` at ``offset`` bytes into ``buffer``."""

    buffer: Buffer
    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def check(self) -> None:
        if self.buffer.released:
            raise HalError(f"{self.buffer!r} was released")
        if self.offset < 0 or self.offset + self.nbytes > self.buffer.nbytes:
            raise HalError(
                f"binding {self.dtype}{list(self.shape)} at +{self.offset} overruns {self.buffer!r}"
            )


# -- semaphores --------------------------------------------------------------------------
class Semaphore:
    """A timeline semaphore: a value that only grows, or a failure carrying an error."""

    def __init__(self, initial: int = 0, name: str = "semaphore"):
        self.name = name
        self._value = initial
        self._error: BaseException | None = None
        self._cond = threading.Condition()

    @property
    def value(self) -> int:
        return self._value

    @property
    def error(self) -> BaseException | None:
        return self._error

    def signal(self, value: int) -> None:
        with self._cond:
            if value < self._value:
                raise HalError(f"{self.name}: signal {value} below the current value {self._value}")
            self._value = value
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """Failure state: every present and future wait raises ``error``."""
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

    def wait(self, value: int, timeout: float | None = None) -> None:
        """Block until the value is >= ``value``; raise the failure's error, or
        FenceTimeout after ``timeout`` seconds (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._error is None and self._value < value:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise FenceTimeout(
                        f"{self.name} did not reach {value} within {timeout:g} s (it is at {self._value})"
                    )
                self._cond.wait(left)
            if self._error is not None:
                raise self._error

    def __repr__(self) -> str:
        state = f"failed: {self._error}" if self._error is not None else f"value {self._value}"
        return f"Semaphore({self.name}, {state})"


# -- executables and commands -------------------------------------------------------------
@dataclass
class DeviceExecutable:
    """A kernel loaded on a device: ``fn(*inputs) -> array | tuple`` over the device's
    views of the input bindings; ``name`` what traces show."""

    key: Hashable
    name: str
    fn: Callable[..., Any]


@dataclass
class CommandRecord:
    """One recorded command. ``kind``: "copy", "fill", "dispatch" or "barrier"."""

    kind: str
    label: str = ""
    src: Any = None  # copy: np.ndarray or Binding
    dst: Any = None  # copy / fill: np.ndarray or Binding
    value: int = 0  # fill: the byte value
    executable: DeviceExecutable | None = None
    inputs: tuple[Binding | None, ...] = ()
    outputs: tuple[Binding, ...] = ()


class CommandBuffer:
    """Commands recorded for one device, executed in order when submitted."""

    def __init__(self, device: Device):
        self.device = device
        self.commands: list[CommandRecord] = []
        self._ended = False

    def _add(self, record: CommandRecord) -> CommandBuffer:
        if self._ended:
            raise HalError("command buffer already submitted: record a new one")
        self.commands.append(record)
        return self

    def copy(self, src: np.ndarray | Binding, dst: np.ndarray | Binding, label: str = "") -> CommandBuffer:
        """Host array -> binding (upload), binding -> host array (download, the array is
        written when the submission's fence signals), or binding -> binding."""
        for end in (src, dst):
            if isinstance(end, Binding):
                end.check()
                if end.buffer.device is not self.device:
                    raise HalError(f"{end.buffer!r} belongs to another device than {self.device.name}")
            elif not isinstance(end, np.ndarray):
                raise HalError(f"copy: expected a numpy array or a Binding, got {type(end).__name__}")
        if isinstance(src, np.ndarray) and isinstance(dst, np.ndarray):
            raise HalError("copy: host to host is not a device command")
        if src.shape != dst.shape or np.dtype(src.dtype) != np.dtype(dst.dtype):
            raise HalError(f"copy {label}: {src.dtype}{list(src.shape)} into {dst.dtype}{list(dst.shape)}")
        if isinstance(dst, np.ndarray) and not dst.flags.c_contiguous:
            raise HalError("copy: a host destination must be C-contiguous")
        return self._add(CommandRecord("copy", label, src=src, dst=dst))

    def fill(self, dst: Binding, value: int = 0, label: str = "") -> CommandBuffer:
        dst.check()
        return self._add(CommandRecord("fill", label, dst=dst, value=int(value) & 0xFF))

    def dispatch(
        self,
        executable: DeviceExecutable,
        inputs: Sequence[Binding | None],
        outputs: Sequence[Binding],
        label: str = "",
    ) -> CommandBuffer:
        """Run ``executable`` on ``inputs`` (None: an omitted optional input), writing
        each result into its output binding (shape and dtype must match exactly)."""
        for b in (*inputs, *outputs):
            if b is not None:
                b.check()
        return self._add(
            CommandRecord(
                "dispatch",
                label or executable.name,
                executable=executable,
                inputs=tuple(inputs),
                outputs=tuple(outputs),
            )
        )

    def barrier(self) -> CommandBuffer:
        return self._add(CommandRecord("barrier"))


@dataclass
class Submission:
    command_buffers: list[CommandBuffer]
    wait: list[tuple[Semaphore, int]]
    signal: list[tuple[Semaphore, int]]
    #: (kind, label, start_ns, end_ns) of each executed command, for the profiler
    timings: list[tuple[str, str, int, int]] = field(default_factory=list)
    thread_id: int = 0


class Queue:
    """Submits command buffers to its device. This one executes on the submitting thread
    (the host device); asynchronous devices override :meth:`submit`."""

    def __init__(self, device: Device):
        self.device = device

    def submit(
        self,
        command_buffers: Sequence[CommandBuffer],
        *,
        wait: Sequence[tuple[Semaphore, int]] = (),
        signal: Sequence[tuple[Semaphore, int]] = (),
    ) -> Submission:
        sub = self._submission(command_buffers, wait, signal)
        self.device._run_submission(sub, timeout=None)
        return sub

    def _submission(self, command_buffers, wait, signal) -> Submission:
        for cb in command_buffers:
            if cb.device is not self.device:
                raise HalError(f"a command buffer of {cb.device.name} submitted to {self.device.name}")
            cb._ended = True
        return Submission(list(command_buffers), list(wait), list(signal))


# -- devices ----------------------------------------------------------------------------------
class Device(ABC):
    """A device: capabilities, memory, a queue and an executable cache (module docstring)."""

    name: str = "device"

    def __init__(self, capabilities: Capabilities):
        self.capabilities = capabilities
        self.queue = self._make_queue()
        self._executables: dict[Hashable, DeviceExecutable] = {}
        self.executable_builds = 0  # cache misses: kernels built
        self._lost: BaseException | None = None

    def _make_queue(self) -> Queue:
        return Queue(self)

    # -- entry points -------------------------------------------------------------
    @abstractmethod
    def allocate(self, nbytes: int) -> Buffer:
        """``nbytes`` of device memory; AllocationError when it cannot."""

    @abstractmethod
    def release(self, buffer: Buffer) -> None:
        """Return ``buffer``'s memory (releasing twice is an error)."""

    @abstractmethod
    def _buffer_array(self, binding: Binding) -> np.ndarray:
        """The device-side array a binding names (for this device's own commands only)."""

    # -- derived ----------------------------------------------------------------------
    @property
    def memory_used(self) -> int:
        return 0

    @property
    def lost(self) -> BaseException | None:
        """The error the device was lost with, or None."""
        return self._lost

    def command_buffer(self) -> CommandBuffer:
        return CommandBuffer(self)

    def semaphore(self, initial: int = 0, name: str = "") -> Semaphore:
        return Semaphore(initial, name or f"{self.name} semaphore")

    def executable(self, key: Hashable, build: Callable[[], DeviceExecutable]) -> DeviceExecutable:
        """The executable cached under ``key``; ``build()`` it on the first request."""
        exe = self._executables.get(key)
        if exe is None:
            exe = build()
            self.executable_builds += 1
            self._executables[key] = exe
        return exe

    def _run_submission(self, sub: Submission, timeout: float | None) -> None:
        """Wait, execute, signal (module docstring); failures go to the signal semaphores."""
        sub.thread_id = threading.get_native_id()
        try:
            for sem, value in sub.wait:
                sem.wait(value, timeout)
            if self._lost is not None:
                raise self._lost
            for cb in sub.command_buffers:
                self._execute(cb.commands, sub)
        except BaseException as e:  # every failure belongs to the fence
            for sem, _ in sub.signal:
                sem.fail(e)
            if not sub.signal:
                raise
            return
        for sem, value in sub.signal:
            sem.signal(value)

    def _execute(self, commands: Sequence[CommandRecord], sub: Submission) -> None:
        """Executes recorded commands in order (in-order execution makes a barrier a
        no-op here; it is kept in the stream for devices that reorder)."""
        clock = time.perf_counter_ns
        for cmd in commands:
            t0 = clock()
            self._execute_one(cmd)
            sub.timings.append((cmd.kind, cmd.label, t0, clock()))

    def _execute_one(self, cmd: CommandRecord) -> None:
        kind = cmd.kind
        if kind == "dispatch":
            assert cmd.executable is not None
            args = [None if b is None else self._buffer_array(b) for b in cmd.inputs]
            try:
                res = cmd.executable.fn(*args)
            except HalError:
                raise
            except Exception as e:
                raise UnsupportedError(f"{self.name}: {cmd.label}: {e}") from e
            results = res if isinstance(res, (tuple, list)) else (res,)
            if len(results) < len(cmd.outputs):
                raise UnsupportedError(
                    f"{self.name}: {cmd.label}: {len(results)} results for {len(cmd.outputs)} outputs"
                )
            for b, r in zip(cmd.outputs, results):
                r = np.asarray(r)
                if r.shape != b.shape or r.dtype != b.dtype:
                    raise UnsupportedError(
                        f"{self.name}: {cmd.label}: produced {r.dtype}{list(r.shape)}, "
                        f"its output buffer holds {b.dtype}{list(b.shape)} (unsupported shape)"
                    )
                self._buffer_array(b)[...] = r
        elif kind == "copy":
            src = cmd.src if isinstance(cmd.src, np.ndarray) else self._buffer_array(cmd.src)
            dst = cmd.dst if isinstance(cmd.dst, np.ndarray) else self._buffer_array(cmd.dst)
            np.copyto(dst, src)
        elif kind == "fill":
            self._buffer_array(cmd.dst).reshape(-1).view(np.uint8)[...] = cmd.value
        elif kind != "barrier":
            raise HalError(f"unknown command {kind}")
