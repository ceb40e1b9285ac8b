"""Running a partitioned plan: host partitions on the host executor, device partitions
as command buffers on a HAL device (docs/runtime.md §7).

At construction (before any run), :func:`plan_device_memory` sizes what the device
partitions need — constants resident for the session's lifetime, plus one activation
arena the device partitions share (they run one after another); values inside a
partition are placed by the runtime's arena planner. When constants + arena exceed the
device memory the constants are *streamed* instead (each dispatch's constants are copied
into a scratch region just before it); when even that does not fit, the session is
refused with the sizes named, before anything is allocated. Then the arena, the scratch
region and the resident constants are allocated and the constants uploaded (one
submission, awaited).

Per run and device partition, one command buffer: a copy per upload (host -> device),
per step a dispatch of the step's kernel (from the device's executable cache) followed
by a barrier, a copy per download (device -> host, into fresh host arrays). The
submission signals the executor's timeline semaphore; the host waits on it with the
session's timeout. The downloaded arrays are read only after the fence signalled; a
failed or timed-out fence raises before any of them is used, so a failed run returns
nothing and leaves the session's host state as it was. ``on_value`` sees every value
that reaches the host (the host partitions' values and the downloads); values that stay
in device memory are not observed.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from quanta.hal.device import Binding, Buffer, CommandBuffer, Device, DeviceExecutable
from quanta.hal.errors import HalError
from quanta.runtime.compile import _set_frees, plan_static_memory
from quanta.runtime.execute import Executor
from quanta.runtime.memory import align, liveness, plan_arena
from quanta.runtime.plan import NONE_SLOT, Plan, PlanStep, SlotKind
from quanta.runtime.profile import Profiler
from quanta.targets.base import Executable, TargetError
from quanta.targets.partition import Partition

__all__ = [
    "DeviceMemoryPlan",
    "HeteroExecutor",
    "SignatureExecutor",
    "host_subplan",
    "plan_device_memory",
]

#: input-shape signatures whose device arena is kept allocated
MAX_SIGNATURES = 4

#: seconds a run waits for a device fence before it fails (SessionOptions.device_timeout_s)
DEFAULT_TIMEOUT_S = 60.0


@dataclass
class DeviceMemoryPlan:
    """Where the device partitions' values live in device memory: the constant block
    (once per session) and the activation arena of one input-shape signature."""

    capacity: int
    alignment: int
    constants: dict[int, int]  # constant slot -> offset in the constant block
    constant_bytes: int
    #: partition -> value slot -> offset in the arena (the partitions share the arena, one
    #: after the other: a value two partitions hold has an offset in each)
    arena: dict[int, dict[int, int]]
    arena_bytes: int
    shapes: dict[int, tuple[int, ...]]  # value slot -> its shape in this signature
    streaming: bool = False
    scratch: dict[int, dict[int, int]] = field(default_factory=dict)  # step -> const slot -> offset
    scratch_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.arena_bytes + (self.scratch_bytes if self.streaming else self.constant_bytes)

    def summary(self) -> str:
        mode = (
            f"constants streamed through a {self.scratch_bytes:,} B scratch region "
            f"({self.constant_bytes:,} B do not fit)"
            if self.streaming
            else f"constants resident {self.constant_bytes:,} B"
        )
        return f"{self.total_bytes:,} of {self.capacity:,} B: activation arena {self.arena_bytes:,} B, {mode}"


def bind_symbols(plan: Plan, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """Symbolic dimension -> size, from the graph inputs' shapes in ``shapes``."""
    bound: dict[str, int] = {}
    for v in plan.model.graph.inputs:
        if v.type is None or v.type.shape is None or v.name not in shapes:
            continue
        for d, n in zip(v.type.shape, shapes[v.name]):
            if isinstance(d, str):
                if bound.setdefault(d, int(n)) != n:
                    raise TargetError(
                        f"input '{v.name}': dimension '{d}' is {n}, but another input binds it to {bound[d]}"
                    )
    return bound


def device_shapes(plan: Plan, symbols: Mapping[str, int]) -> dict[int, tuple[int, ...]]:
    """The shape of every non-constant value of the device partitions, with ``symbols``."""
    out: dict[int, tuple[int, ...]] = {}
    for p in plan.partitions or []:
        if p.on_host:
            continue
        for k in p.steps:
            s = plan.steps[k]
            for v in (*s.inputs, *s.outputs):
                if v is None or v == NONE_SLOT or v in plan.constants or v in out:
                    continue
                t = plan.slots[v].type
                dims = []
                for d in t.shape:
                    if isinstance(d, str):
                        if d not in symbols:
                            raise TargetError(
                                f"value '{plan.slots[v].name}': dimension '{d}' is not bound by the inputs"
                            )
                        d = symbols[d]
                    dims.append(int(d))
                out[v] = tuple(dims)
    return out


def _const_nbytes(plan: Plan, k: int) -> int:
    return int(np.asarray(plan.constants[k]).nbytes)


def plan_device_memory(
    plan: Plan, capacity: int, alignment: int, symbols: Mapping[str, int], *, streaming: bool | None = None
) -> DeviceMemoryPlan:
    """Sizes and offsets of every device value for the signature that binds ``symbols``
    (module docstring). ``streaming``: None decides (resident when everything fits);
    raises TargetError when the device partitions cannot fit ``capacity``."""
    parts = [p for p in plan.partitions or [] if not p.on_host]
    shapes = device_shapes(plan, symbols)

    def nbytes(k: int) -> int:
        if k in plan.constants:
            return _const_nbytes(plan, k)
        return int(np.prod(shapes[k], dtype=np.int64)) * np.dtype(plan.slots[k].type.elem.numpy).itemsize

    constants: dict[int, int] = {}
    const_bytes = 0
    for p in parts:
        for k in p.constants:
            if k not in constants:
                constants[k] = const_bytes
                const_bytes += align(nbytes(k), alignment)
    arena: dict[int, dict[int, int]] = {}
    arena_bytes = 0
    scratch: dict[int, dict[int, int]] = {}
    scratch_bytes = 0
    for p in parts:
        steps: list[tuple[str, list, list]] = [("upload", [], list(p.uploads))]
        sizes = {k: nbytes(k) for k in p.uploads}
        for k in p.steps:
            s = plan.steps[k]
            outs = [o for o in s.outputs if o is not None]
            sizes.update((o, nbytes(o)) for o in outs)
            steps.append(("device", [i for i in s.inputs if i != NONE_SLOT], outs))
        intervals, _ = liveness(steps, sizes, outputs=p.downloads)
        mem = plan_arena(intervals, alignment)
        arena[p.index] = dict(mem.offsets)
        arena_bytes = max(arena_bytes, mem.peak_bytes)
        for k in p.steps:
            offs: dict[int, int] = {}
            used = 0
            for c in plan.steps[k].inputs:
                if c in plan.constants and c not in offs:
                    offs[c] = used
                    used += align(nbytes(c), alignment)
            scratch[k] = offs
            scratch_bytes = max(scratch_bytes, used)
    dm = DeviceMemoryPlan(
        capacity, alignment, constants, const_bytes, arena, arena_bytes, shapes, False, scratch, scratch_bytes
    )
    dm.streaming = arena_bytes + const_bytes > capacity if streaming is None else streaming
    if dm.total_bytes <= capacity:
        return dm
    raise TargetError(
        f"the model does not fit the device: its device partitions need {arena_bytes + const_bytes:,} B "
        f"(activations {arena_bytes:,} B + constants {const_bytes:,} B), or {arena_bytes + scratch_bytes:,} B "
        f"with the constants streamed (the largest step's constants: {scratch_bytes:,} B); "
        f"the device has {capacity:,} B" + (f" (shapes with {dict(symbols)})" if symbols else "")
    )


def host_subplan(plan: Plan, part: Partition) -> Plan:
    """The steps of host partition ``part`` as a Plan of their own (same slot numbers):
    values it reads from elsewhere are its inputs, values others read its outputs."""
    uploads, downloads = set(part.uploads), set(part.downloads)
    graph_inputs = set(plan.inputs.values())
    slots = []
    for s in plan.slots:
        if s.index in downloads and s.kind is SlotKind.INTERMEDIATE:
            s = replace(s, kind=SlotKind.OUTPUT)
        elif s.index in uploads and s.kind in (SlotKind.INTERMEDIATE, SlotKind.OUTPUT):
            s = replace(s, kind=SlotKind.INPUT)
        slots.append(s)
    steps = []
    for local, k in enumerate(part.steps):
        s = plan.steps[k]
        steps.append(PlanStep(local, s.node, s.kernel, s.ctx, s.attrs, s.inputs, s.outputs, ()))
    inputs = {plan.slots[k].name: k for k in part.uploads}
    # overridable initializers stay inputs of every host partition (the executor's
    # template sets their defaults)
    for name, k in plan.inputs.items():
        if k in graph_inputs and k not in plan.constants:
            continue
        inputs.setdefault(name, k)
    outputs = {plan.slots[k].name: k for k in part.downloads}
    _set_frees(steps, slots, set(outputs.values()))
    sub = Plan(
        plan.model,
        plan.target,
        steps,
        slots,
        plan.constants,
        inputs,
        outputs,
        memory=None,
        num_threads=plan.num_threads,
        slot_of=plan.slot_of,
    )
    sub.memory = plan_static_memory(sub)
    return sub


def _contiguous(arr: Any) -> np.ndarray:
    """``arr`` as a C-contiguous array of its own shape (0-d stays 0-d)."""
    arr = np.asarray(arr)
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def _device_call(fn: Callable[..., Any], ctx: Any, attrs: Mapping[str, Any]) -> Callable[..., Any]:
    def call(*inputs: Any) -> Any:
        return fn(ctx, *inputs, **attrs)

    return call


@dataclass
class _DevicePart:
    part: Partition
    executables: list[DeviceExecutable]


@dataclass
class _HostPart:
    part: Partition
    executor: Executor
    input_names: list[str]
    output_names: list[str]
    profiler: Profiler | None = None


class HeteroExecutor(Executable):
    """Runs a partitioned ``plan`` on ``device`` and the host (module docstring)."""

    def __init__(
        self,
        plan: Plan,
        device: Device,
        *,
        profiler: Profiler | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ):
        if not plan.partitions:
            raise TargetError("a plan without partitions runs on the host executor")
        self.plan = plan
        self.device = device
        self.timeout = timeout
        self.fallbacks = plan.fallbacks
        self.profiler = profiler
        caps = device.capabilities
        self._capacity = caps.memory_bytes or 0
        self._alignment = caps.alignment
        # sized and checked before anything is allocated; a symbolic dimension counts as
        # 1 here (the smallest run), and each input-shape signature is checked again
        # before its arena is allocated
        self._symbols = sorted(
            {
                d
                for v in plan.model.graph.inputs
                if v.type is not None and v.type.shape
                for d in v.type.shape
                if isinstance(d, str)
            }
        )
        self.memory = plan_device_memory(
            plan, self._capacity, self._alignment, dict.fromkeys(self._symbols, 1)
        )
        plan.device_memory = self.memory
        self._buffers: list[Buffer] = []
        self._arenas: OrderedDict[tuple, tuple[DeviceMemoryPlan, Buffer]] = OrderedDict()
        self._fence = device.semaphore(0, f"{device.name} fence")
        self._fence_value = 0
        self._lock = threading.Lock()
        self._parts: list[_HostPart | _DevicePart] = []
        try:
            self._allocate_and_upload()
            for p in plan.partitions:
                self._parts.append(self._host_part(p) if p.on_host else self._device_part(p))
        except BaseException:
            self.close()
            raise

    # -- setup ---------------------------------------------------------------------
    def _allocate_and_upload(self) -> None:
        m = self.memory
        dev = self.device
        self._arenas[self._signature_of(dict.fromkeys(self._symbols, 1))] = (m, self._allocate(m.arena_bytes))
        if m.streaming:
            self._consts = self._allocate(m.scratch_bytes)
            return
        self._consts = self._allocate(m.constant_bytes)
        if not m.constants:
            return
        cb = dev.command_buffer()
        for k, off in m.constants.items():
            arr = _contiguous(self.plan.constants[k])
            cb.copy(
                arr,
                self._consts.binding(arr.shape, arr.dtype, off),
                label=f"constant {self.plan.slots[k].name}",
            )
        self._submit_and_wait(cb, "uploading the constants")

    def _allocate(self, nbytes: int) -> Buffer:
        buf = self.device.allocate(max(nbytes, 1))
        self._buffers.append(buf)
        return buf

    def _signature_of(self, symbols: Mapping[str, int]) -> tuple:
        return tuple(symbols[d] for d in self._symbols)

    def _arena_for(self, feeds: Mapping[str, Any]) -> tuple[DeviceMemoryPlan, Buffer]:
        """The memory plan and arena of the feeds' signature: planned, checked against
        the free device memory and allocated at its first run (at most
        ``MAX_SIGNATURES`` kept, least recently used released first)."""
        if not self._symbols:
            return next(iter(self._arenas.values()))
        symbols = bind_symbols(self.plan, {n: np.shape(a) for n, a in feeds.items()})
        key = self._signature_of(symbols)
        got = self._arenas.get(key)
        if got is not None:
            self._arenas.move_to_end(key)
            return got
        while len(self._arenas) >= MAX_SIGNATURES:
            _, (_, old) = self._arenas.popitem(last=False)
            self._release(old)
        m = plan_device_memory(
            self.plan, self._capacity, self._alignment, symbols, streaming=self.memory.streaming
        )
        free = self._capacity - self.device.memory_used
        while m.arena_bytes > free and self._arenas:  # other signatures' arenas make room
            _, (_, old) = self._arenas.popitem(last=False)
            self._release(old)
            free = self._capacity - self.device.memory_used
        if m.arena_bytes > free:
            raise TargetError(
                f"a run with {symbols} needs a {m.arena_bytes:,} B activation arena on {self.device.name}; "
                f"{free:,} of {self._capacity:,} B are free ({self.memory.summary()})"
            )
        got = (m, self._allocate(m.arena_bytes))
        self._arenas[key] = got
        return got

    def _release(self, buf: Buffer) -> None:
        if buf in self._buffers:
            self._buffers.remove(buf)
        if not buf.released:
            self.device.release(buf)

    def _host_part(self, p: Partition) -> _HostPart:
        sub = host_subplan(self.plan, p)
        prof = Profiler(sub) if self.profiler is not None else None
        exe = Executor(sub, profiler=prof)
        return _HostPart(p, exe, list(sub.inputs), list(sub.outputs), prof)

    def _device_part(self, p: Partition) -> _DevicePart:
        exes = []
        for k in p.steps:
            s = self.plan.steps[k]
            # a device kernel is bound to its node (its types and parameters): one
            # executable per node; the cache holds the node, so its id stays unique
            key = (s.kernel.name, id(s.node))
            exes.append(
                self.device.executable(
                    key,
                    lambda s=s, key=key: DeviceExecutable(
                        key, s.kernel.name, _device_call(s.kernel.fn, s.ctx, s.attrs)
                    ),
                )
            )
        return _DevicePart(p, exes)

    def close(self) -> None:
        """Release the device memory this executor holds (idempotent)."""
        for b in self._buffers:
            if not b.released:
                try:
                    self.device.release(b)
                except HalError:
                    pass
        self._buffers = []

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- bindings --------------------------------------------------------------------
    def _binding(
        self, m: DeviceMemoryPlan, arena: Buffer, part: int, k: int, step: int | None = None
    ) -> Binding | None:
        if k == NONE_SLOT:
            return None
        plan = self.plan
        if k in plan.constants:
            arr = plan.constants[k]
            if m.streaming:
                assert step is not None
                return self._consts.binding(arr.shape, arr.dtype, m.scratch[step][k])
            return self._consts.binding(arr.shape, arr.dtype, self.memory.constants[k])
        return arena.binding(m.shapes[k], np.dtype(plan.slots[k].type.elem.numpy), m.arena[part][k])

    # -- running ---------------------------------------------------------------------------
    def _submit_and_wait(self, cb: CommandBuffer, what: str) -> tuple[Any, int, int]:
        self._fence_value += 1
        value = self._fence_value
        sub = self.device.queue.submit([cb], signal=[(self._fence, value)])
        t0 = time.perf_counter_ns()
        try:
            self._fence.wait(value, self.timeout)
        except HalError as e:
            # a failed fence stays failed: the next submission needs a fresh one
            self._fence = self.device.semaphore(0, f"{self.device.name} fence")
            self._fence_value = 0
            raise type(e)(f"{self.device.name}, {what}: {e}") from e
        return sub, t0, time.perf_counter_ns()

    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        *,
        on_value: Callable[[str, np.ndarray], None] | None = None,
    ) -> list[np.ndarray]:
        with self._lock:  # one run at a time owns the fence and the arena
            return self._run(feeds, output_names, on_value)

    def _run(
        self,
        feeds: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        on_value: Callable[[str, np.ndarray], None] | None,
    ) -> list[np.ndarray]:
        plan = self.plan
        vals: dict[int, Any] = {}
        for name, arr in feeds.items():
            k = plan.inputs.get(name)
            if k is None:
                raise TargetError(f"unknown input '{name}'; the plan's inputs are {sorted(plan.inputs)}")
            vals[k] = arr
        prof = self.profiler
        trace = _RunTrace(len(plan.steps)) if prof is not None else None
        memory, arena = self._arena_for(feeds)
        run_start = time.perf_counter_ns()
        for part in self._parts:
            if isinstance(part, _HostPart):
                feeds_p = {n: vals.get(plan.inputs.get(n, plan.slot_of.get(n))) for n in part.input_names}
                feeds_p = {n: v for n, v in feeds_p.items() if v is not None}
                outs = part.executor.run(feeds_p, part.output_names, on_value=on_value)
                for n, arr in zip(part.output_names, outs):
                    vals[plan.slot_of[n]] = arr
                if trace is not None and part.profiler is not None and part.profiler.runs:
                    trace.host(part, part.profiler.runs[-1])
            else:
                self._run_device(part, vals, trace, memory, arena)
                if on_value is not None:
                    for k in part.part.downloads:
                        on_value(plan.slots[k].name, vals[k])
        run_end = time.perf_counter_ns()
        if prof is not None and trace is not None:
            trace.record(prof, plan, run_start, run_end, memory)
            prof.record_events(trace.events, self.device.name)
        missing = [n for n in output_names if plan.outputs.get(n) not in vals]
        if missing:
            raise TargetError(f"outputs {missing} were not computed")
        return [vals[plan.outputs[n]] for n in output_names]

    def _run_device(
        self,
        dp: _DevicePart,
        vals: dict[int, Any],
        trace: _RunTrace | None,
        m: DeviceMemoryPlan,
        arena: Buffer,
    ) -> None:
        plan = self.plan
        p = dp.part
        cb = self.device.command_buffer()
        kinds: list[
            tuple[str, int]
        ] = []  # per command: ("upload"|"download"|"stream", slot) or ("dispatch", step)
        for k in p.uploads:
            b = self._binding(m, arena, p.index, k)
            assert b is not None
            arr = vals[k]
            if arr.shape != b.shape or arr.dtype != b.dtype:
                raise TargetError(
                    f"value '{plan.slots[k].name}': {arr.dtype}{list(arr.shape)} where the device plan has "
                    f"{b.dtype}{list(b.shape)} (unsupported shape: the device plans static shapes)"
                )
            cb.copy(arr, b, label=f"upload {plan.slots[k].name}")
            kinds.append(("upload", k))
        for k, exe in zip(p.steps, dp.executables):
            s = plan.steps[k]
            if m.streaming:
                for c in m.scratch[k]:
                    cb.copy(
                        _contiguous(plan.constants[c]),
                        self._binding(m, arena, p.index, c, k),
                        label=f"stream {plan.slots[c].name}",
                    )
                    kinds.append(("stream", c))
            cb.dispatch(
                exe,
                [self._binding(m, arena, p.index, i, k) for i in s.inputs],
                [self._binding(m, arena, p.index, o, k) for o in s.outputs if o is not None],
                label=f"node {s.node.label}",
            )
            kinds.append(("dispatch", k))
            cb.barrier()
            kinds.append(("barrier", k))
        host_outs: dict[int, np.ndarray] = {}
        for k in p.downloads:
            b = self._binding(m, arena, p.index, k)
            assert b is not None
            host_outs[k] = np.empty(b.shape, b.dtype)
            cb.copy(b, host_outs[k], label=f"download {plan.slots[k].name}")
            kinds.append(("download", k))
        sub, w0, w1 = self._submit_and_wait(cb, f"partition #{p.index}")
        vals.update(host_outs)  # visible only now that the fence signalled
        if trace is not None:
            trace.device(sub, kinds, w0, w1, p.index)


class _RunTrace:
    """One profiled run of a partitioned plan, gathered for the Profiler."""

    def __init__(self, n_steps: int):
        self.starts = [0] * n_steps
        self.ends = [0] * n_steps
        self.tids: dict[int, int] = {}
        self.specs: dict[int, tuple[tuple[int, ...], np.dtype]] = {}
        self.events: list[tuple[str, str, int, int, int, dict[str, Any]]] = []

    def host(self, part: _HostPart, run: Any) -> None:
        for local, k in enumerate(part.part.steps):
            self.starts[k] = run.starts[local]
            self.ends[k] = run.ends[local]
        self.specs.update(run.specs)

    def device(self, sub: Any, kinds: list[tuple[str, int]], w0: int, w1: int, part: int) -> None:
        tid = sub.thread_id
        for (kind, k), (_, label, t0, t1) in zip(kinds, sub.timings):
            if kind == "dispatch":
                self.starts[k], self.ends[k] = t0, t1
                self.tids[k] = tid
            elif kind != "barrier":
                self.events.append(("Transfer", label, t0, t1, tid, {"kind": kind, "partition": str(part)}))
        self.events.append(("Wait", f"wait partition #{part}", w0, w1, 0, {"partition": str(part)}))

    def record(self, prof: Profiler, plan: Plan, t0: int, t1: int, m: DeviceMemoryPlan) -> None:
        for k, shape in m.shapes.items():
            self.specs[k] = (shape, np.dtype(plan.slots[k].type.elem.numpy))
        prof.record_run(t0, t1, self.starts, self.ends, self.specs, tids=self.tids)


class SignatureExecutor(Executable):
    """A device target's model compiled once per input-shape signature.

    When shape inference leaves device values with dimensions the graph's inputs do not
    bind (a Reshape to a computed shape: ``unk__0``), the device cannot plan them and
    they would run on the host. This executor instead compiles the model again for each
    signature with the graph inputs' shapes fixed (``build(shapes)``: every shape is
    then static) and runs that signature's plan; at most ``max_signatures`` are kept
    (the least recently used is closed, releasing its device memory). ``plan`` is the
    plan of the last signature run."""

    def __init__(
        self,
        build: Callable[[dict[str, tuple[int, ...]]], Executable],
        plan: Plan,
        *,
        max_signatures: int = 2,
        profiler: Profiler | None = None,
    ):
        self._build = build
        self.plan = plan
        self.fallbacks = plan.fallbacks
        self.max_signatures = max_signatures
        self._cache: OrderedDict[tuple, Executable] = OrderedDict()
        self._profiler = profiler
        self._lock = threading.Lock()

    @property
    def profiler(self) -> Profiler | None:
        return self._profiler

    @profiler.setter
    def profiler(self, profiler: Profiler | None) -> None:
        self._profiler = profiler
        for exe in self._cache.values():
            exe.profiler = profiler  # type: ignore[attr-defined]

    def executor_for(self, feeds: Mapping[str, np.ndarray]) -> Executable:
        shapes = {n: tuple(int(d) for d in np.shape(a)) for n, a in feeds.items()}
        key = tuple(sorted(shapes.items()))
        exe = self._cache.get(key)
        if exe is None:
            while len(self._cache) >= self.max_signatures:
                _, old = self._cache.popitem(last=False)
                close = getattr(old, "close", None)
                if close is not None:
                    close()
            exe = self._build(shapes)
            exe.profiler = self._profiler  # type: ignore[attr-defined]
            self._cache[key] = exe
        else:
            self._cache.move_to_end(key)
        self.plan = exe.plan  # type: ignore[attr-defined]
        self.fallbacks = self.plan.fallbacks
        return exe

    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        *,
        on_value: Callable[[str, np.ndarray], None] | None = None,
    ) -> list[np.ndarray]:
        with self._lock:  # the cache, and the device arena of each signature's executor
            exe = self.executor_for(feeds)
            if self._profiler is not None:
                self._profiler.plan = exe.plan  # type: ignore[attr-defined]
            return exe.run(feeds, output_names, on_value=on_value)

    def close(self) -> None:
        while self._cache:
            _, old = self._cache.popitem()
            close = getattr(old, "close", None)
            if close is not None:
                close()
