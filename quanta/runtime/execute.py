"""The executor: runs a Plan's steps over a list of slots, with little per-step work.

Per step the hot loop does: gather the input slots, call the kernel, store the
result, clear the slots whose last reader this was. Everything else is decided before
the loop, per *input-shape signature* (the shapes and dtypes of the feeds):

1. The first run of a signature is a *measuring run*: it records the shape and dtype
   of every value, plans the arena for exactly those sizes
   (:func:`quanta.runtime.compile.plan_static_memory`; also for static models, so a
   wrong static shape can never misplace a buffer) and caches a :class:`BoundRun`
   (at most ``max_signatures``, least recently used first out).
2. A BoundRun's steps hand every kernel that accepts ``out=`` (``Kernel.out``) a view
   of its planned place in a preallocated, 64-byte aligned arena; NumPy kernels
   allocate their results as before (their place in the plan is reported, not used).
3. Arena safety: view outputs (Reshape, Flatten, ...) share their input's buffer and
   the planner keeps it alive for them; any other kernel that reads an arena-resident
   value has its result checked, and a result that shares memory with the arena (a
   view NumPy made) is copied out. Graph outputs that share the arena are copied
   before they are returned, so a caller never holds arena memory. Each BoundRun's
   arena is used by one run at a time; a concurrent run of the same signature runs
   without it.

Profiling (a :class:`quanta.runtime.profile.Profiler` attached to the executor) and
``on_value`` callbacks take a slower loop that times each step.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from quanta.runtime.compile import plan_static_memory
from quanta.runtime.control_flow import reset_observer, set_observer
from quanta.runtime.memory import VIEW_OPS, MemoryPlan
from quanta.runtime.plan import NONE_SLOT, Plan, SlotKind
from quanta.runtime.profile import Profiler
from quanta.runtime.static_steps import (
    root_shape_args,
    signature_shape_roots,
    signature_shape_unstable,
    signature_static_steps,
)
from quanta.targets.base import Executable, Specialization, TargetError
from quanta.targets.reference import KERNEL_ERRORS, describe_args

__all__ = ["BoundRun", "Executor"]

# (step index, fn, ctx, input slots, number of inputs, the single output slot or -1,
#  output slots, slots to free, keyword arguments or None when there are none)
_StepTuple = tuple[
    int,
    Callable[..., Any],
    Any,
    tuple[int, ...],
    int,
    int,
    tuple[int | None, ...],
    tuple[int, ...],
    "dict | None",
]
Specs = dict[int, tuple[tuple[int, ...], np.dtype]]

#: Speculative binds of one signature (docs/runtime.md §3, "Data-dependent shapes"):
#: after this many, a signature whose data-dependent shapes keep changing is bound with
#: those shapes unspecialized.
MAX_SPECULATIVE_BINDS = 2


@dataclass
class Speculation:
    """A BoundRun bound to the measuring run's data-dependent shapes: ``misses`` counts
    the runs whose root steps (quanta.runtime.static_steps.signature_shape_roots) gave
    other shapes; ``binds`` the speculative binds of the signature so far."""

    binds: int = 1
    misses: int = 0


class _ShapeMiss(Exception):
    """A root step of a speculative BoundRun gave shapes other than the measuring run's:
    ``res`` is its result, the run goes on with the generic steps after it."""

    def __init__(self, res: Any) -> None:
        super().__init__("data-dependent shape changed")
        self.res = res


@dataclass
class BoundRun:
    """The steps of one input-shape signature, with their arena (if any kernel uses it)."""

    steps: list[_StepTuple]
    specs: Specs  # slot -> (shape, dtype) of every value seen in the measuring run
    memory: MemoryPlan | None
    arena: np.ndarray | None = None  # aligned uint8 view, peak_bytes long
    arena_slots: frozenset[int] = frozenset()  # slots whose arrays live in the arena
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: ``steps`` without the signature-static ones (quanta.runtime.static_steps), and the
    #: (slot, value) pairs those steps produced in the measuring run
    fast_steps: list[_StepTuple] | None = None
    static_values: tuple[tuple[int, np.ndarray], ...] = ()
    #: the fast loop's steps: ``fast_steps`` (or ``steps``) with every specialized call
    #: made direct (see :func:`_direct`), and step index -> the guarded call a direct
    #: one hands a ValueError to
    #: (None: not made yet; made on first use, so a BoundRun built by a subclass's
    #: ``_bind`` gets them too)
    direct_steps: list[_StepTuple] | None = None
    guards: dict[int, Callable[..., Any]] = field(default_factory=dict)
    #: slot -> its planned view of the arena (the outputs of the steps that write there)
    slot_views: dict[int, np.ndarray] = field(default_factory=dict)
    #: how many steps run inside native programs (:func:`_native_programs`), of how many
    program_steps: tuple[int, int] = (0, 0)
    #: set when the steps are specialized to the measuring run's data-dependent shapes,
    #: which the root steps check on every run (docs/runtime.md §3)
    speculation: Speculation | None = None
    #: the root steps' indices (checked) when speculative
    roots: frozenset[int] = frozenset()
    #: (slot, array) of every value a native program writes or a dropped view step made:
    #: put in place when a run leaves the speculative steps for the generic ones
    program_values: tuple[tuple[int, np.ndarray], ...] = ()
    #: (slot, buffer, its read-only view) of each small graph input a native program
    #: reads (:func:`_native_programs`): every run copies the feed into the buffer
    staged: tuple[tuple[int, np.ndarray, np.ndarray], ...] = ()

    def fast(self, vals: list[Any]) -> list[_StepTuple]:
        """Copies the staged feeds into their buffers and puts the recorded
        signature-static values into ``vals``; the steps left to run."""
        for k, buf, view in self.staged:
            np.copyto(buf, vals[k])
            vals[k] = view
        for k, v in self.static_values:
            vals[k] = v
        steps = self.direct_steps
        if steps is None:
            steps = self.make_direct()
        return steps

    def make_direct(self) -> list[_StepTuple]:
        """Makes ``direct_steps`` and ``guards`` from the steps the fast loop runs (the
        guards first: a concurrent run that sees the steps sees their guards)."""
        steps = self.steps if self.fast_steps is None else self.fast_steps
        direct: list[_StepTuple] = []
        guards: dict[int, Callable[..., Any]] = {}
        for t in steps:
            d = _direct(t)
            if d[4] < 0:
                guards[t[0]] = t[1]
            direct.append(d)
        self.guards = guards
        self.direct_steps = direct
        return direct


class Executor(Executable):
    """Runs ``plan``; see the module docstring. ``profiler``: record per-step times."""

    #: run the recordable steps of a bound signature as native programs
    #: (:func:`_native_programs`); off: every step from the Python loop
    native_programs: bool = True
    #: bind a signature whose shapes follow the data to the measuring run's shapes, checked
    #: at the root steps (docs/runtime.md §3, "Data-dependent shapes"); off: such shapes
    #: get no arena place and no shape-bound specialization
    speculate: bool = True

    def __init__(self, plan: Plan, *, profiler: Profiler | None = None, max_signatures: int = 8):
        self.plan = plan
        self.profiler = profiler
        self.max_signatures = max_signatures
        self.fallbacks = plan.fallbacks
        template: list[Any] = [None] * len(plan.slots)
        for k, arr in plan.constants.items():
            template[k] = arr
        graph = plan.model.graph
        for v in graph.inputs:  # an input with an initializer defaults to it
            if v.const is not None:
                template[plan.inputs[v.name]] = v.const
        self._template = template
        self._input_slots = sorted(set(plan.inputs.values()))
        self._plain: list[_StepTuple] = [
            (
                s.index,
                s.kernel.fn,
                s.ctx,
                s.inputs,
                len(s.inputs),
                s.outputs[0] if len(s.outputs) == 1 and s.outputs[0] is not None else -1,
                s.outputs,
                s.free_after,
                s.attrs or None,
            )
            for s in plan.steps
        ]
        self._static = signature_static_steps(plan)
        #: slots whose shape a signature does not fix (after a NonZero, ...): no arena
        #: place and no specialization, since the next run of the signature may differ
        self._unstable = signature_shape_unstable(plan)
        self._roots = signature_shape_roots(plan) if self._unstable else frozenset()
        #: steps that are signature-static once the roots' shapes are checked (the Shape
        #: of a value after a NonZero ...): skipped by speculative binds only
        self._checked_static = (
            signature_static_steps(plan, self._roots) - self._static if self._roots else frozenset()
        )
        #: root -> the positions of the value arguments that size its outputs; the
        #: measuring run records their values, which a speculative bind's root compares
        self._root_args = {k: a for k, a in root_shape_args(plan).items() if a} if self._roots else {}
        self._bound: OrderedDict[tuple, BoundRun] = OrderedDict()
        self._bound_lock = threading.Lock()
        self._call_inputs: list[int] = []
        self._call_outputs: list[int] = []
        self._call_order: list[int] | None = None
        self._call_in_order = False

    # -- public ------------------------------------------------------------------
    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        *,
        on_value: Callable[[str, np.ndarray], None] | None = None,
    ) -> list[np.ndarray]:
        plan = self.plan
        out_slots = []
        missing = []
        for n in output_names:
            k = plan.outputs.get(n)
            if k is None:
                missing.append(n)
            out_slots.append(k)
        if missing:
            raise TargetError(f"outputs {missing} were not computed")
        vals = self._template.copy()
        inputs = plan.inputs
        for name, arr in feeds.items():
            k = inputs.get(name)
            if k is None:
                raise TargetError(f"unknown input '{name}'; the plan's inputs are {sorted(inputs)}")
            vals[k] = arr
        if on_value is None:
            return self._run_slots(vals, out_slots, None)
        token = set_observer(on_value)  # If / Loop / Scan bodies report to it too
        try:
            return self._run_slots(vals, out_slots, on_value)
        finally:
            reset_observer(token)

    def bind_positional(self, input_names: Sequence[str], output_names: Sequence[str]) -> None:
        """Fixes the inputs and outputs of :meth:`call`, by position (a compiled If / Loop
        / Scan body runs this way: no names to look up per call)."""
        self._call_inputs = [self.plan.inputs[n] for n in input_names]
        self._call_outputs = [self.plan.outputs[n] for n in output_names]
        # the signature straight from the arguments when they are exactly the input slots
        position = {k: i for i, k in enumerate(self._call_inputs)}
        complete = sorted(position) == self._input_slots and len(position) == len(self._call_inputs)
        self._call_order = [position[k] for k in self._input_slots] if complete else None
        #: the arguments are already in the order of the input slots (a signature of the
        #: arguments is the executor's own)
        self._call_in_order = self._call_order == list(range(len(self._call_inputs)))

    def call(
        self,
        args: Sequence[Any],
        *,
        on_value: Callable[[str, np.ndarray], None] | None = None,
        signature: tuple | None = None,
    ) -> list[Any]:
        """Runs on ``args`` (the inputs :meth:`bind_positional` named, in its order; no
        validation) and returns its outputs, in its order. ``signature``: the (shape,
        dtype) of each argument (None for a non-array), when the caller has it."""
        vals = self._template.copy()
        for k, arr in zip(self._call_inputs, args):
            vals[k] = arr
        if on_value is None:
            order = self._call_order
            if order is not None and self.profiler is None:
                # the common case of a body run per window or per iteration, with the
                # fewest Python calls: a known signature that uses no arena
                if signature is None or not self._call_in_order:
                    signature = tuple(
                        [
                            (a.shape, a.dtype) if isinstance(a, np.ndarray) else None
                            for a in map(args.__getitem__, order)
                        ]
                    )
                bound = self._bound.get(signature)
                if bound is not None and len(self._bound) == 1 and not _stale(bound):
                    if bound.arena is None:
                        self._run_fast(vals, bound.fast(vals), bound.guards, bound.program_values)
                        return _outputs(vals, self._call_outputs)
                    # with its arena (a body whose steps write into one): what _run_slots
                    # does, without finding the signature and the loop again (~2 us of
                    # a Silero VAD window's 16 kHz branch)
                    if bound.lock.acquire(blocking=False):
                        try:
                            self._run_fast(vals, bound.fast(vals), bound.guards, bound.program_values)
                            return _arena_outputs(vals, self._call_outputs, bound.arena)
                        finally:
                            bound.lock.release()
            return self._run_slots(vals, self._call_outputs, None)
        token = set_observer(on_value)
        try:
            return self._run_slots(vals, self._call_outputs, on_value)
        finally:
            reset_observer(token)

    def _run_slots(
        self, vals: list[Any], out_slots: list[int], on_value: Callable[[str, np.ndarray], None] | None
    ) -> list[Any]:
        """Runs with the feeds in place in ``vals``; the values of ``out_slots``."""
        signature = self._signature(vals)
        bound = self._bound.get(signature)
        if (
            bound is not None
            and on_value is None
            and self.profiler is None
            and len(self._bound) == 1
            and (bound.speculation is None or not bound.speculation.misses)
        ):
            # the common case, with the fewest Python calls (a small model's run is ~30 µs,
            # the glue around its steps ~4): one bound signature, its fast loop
            if bound.arena is None:
                self._run_fast(vals, bound.fast(vals), bound.guards, bound.program_values)
                return _outputs(vals, out_slots)
            if bound.lock.acquire(blocking=False):
                try:
                    self._run_fast(vals, bound.fast(vals), bound.guards, bound.program_values)
                    return _arena_outputs(vals, out_slots, bound.arena)
                finally:
                    bound.lock.release()
        if bound is not None and len(self._bound) > 1:
            self._touch(signature)
        profiler = self.profiler
        binds = 0
        if bound is not None and _stale(bound):
            # a root step gave other shapes than those the steps were bound to: measure
            # this run's, and bind them, or, after MAX_SPECULATIVE_BINDS, bind without
            binds = bound.speculation.binds if bound.speculation is not None else 0
            bound = None
        if bound is None:
            specs: Specs = {}
            captured: dict[int, np.ndarray] = {}
            root_values: dict[int, tuple[Any, ...]] = {}
            self._run_instrumented(
                vals, self._plain, on_value, profiler, specs, capture=captured, root_values=root_values
            )
            self._remember(signature, specs, captured, binds, root_values)
            return _outputs(vals, out_slots)
        if bound.arena is None:
            self._run_bound(vals, bound, on_value)
            return _outputs(vals, out_slots)
        if not bound.lock.acquire(blocking=False):  # the arena is busy: run without it
            self._run_bound(vals, bound, on_value, self._plain)
            return _outputs(vals, out_slots)
        try:
            self._run_bound(vals, bound, on_value)
            return _arena_outputs(vals, out_slots, bound.arena)
        finally:
            bound.lock.release()

    def bound_runs(self) -> dict[tuple, BoundRun]:
        """Signature -> BoundRun, for inspection (most recently used last)."""
        return dict(self._bound)

    def memory_plan(self, feeds: Mapping[str, np.ndarray] | None = None) -> MemoryPlan | None:
        """The static memory plan, or the plan of ``feeds``' signature once it ran."""
        if feeds is None:
            return self.plan.memory
        vals = self._template.copy()
        for name, arr in feeds.items():
            vals[self.plan.inputs[name]] = np.asarray(arr)
        bound = self._bound.get(self._signature(vals))
        return None if bound is None else bound.memory

    def _signature(self, vals: list[Any]) -> tuple:
        """Shapes and dtypes of the input slots: what a BoundRun is cached by."""
        # a list comprehension, not a generator (a frame per item): ~1.4 -> ~0.6 µs
        return tuple(
            [
                (a.shape, a.dtype) if isinstance(a, np.ndarray) else None
                for a in map(vals.__getitem__, self._input_slots)
            ]
        )

    # -- loops -----------------------------------------------------------------------
    def _run_bound(
        self,
        vals: list[Any],
        bound: BoundRun,
        on_value: Callable[[str, np.ndarray], None] | None,
        plain: list[_StepTuple] | None = None,
    ) -> None:
        """Runs ``bound``'s steps (or ``plain``, without the arena); the fast loop skips
        the signature-static steps, the instrumented one runs every step."""
        if self.profiler is None and on_value is None:
            if plain is None:
                self._run_fast(vals, bound.fast(vals), bound.guards, bound.program_values)
            else:
                self._run_fast(vals, plain)
        else:
            self._run_instrumented(
                vals,
                bound.steps if plain is None else plain,
                on_value,
                self.profiler,
                None,
                bound.specs,
                program_values=bound.program_values,
            )

    def _run_fast(
        self,
        vals: list[Any],
        steps: list[_StepTuple],
        guards: dict[int, Callable[..., Any]] | None = None,
        program_values: tuple[tuple[int, np.ndarray], ...] = (),
    ) -> None:
        # Unrolled for 1-3 inputs and no keyword arguments: a list comprehension and an
        # empty **kw cost ~0.4 us per step, the whole step ~0.15 us (docs/runtime.md).
        # A negative input count is a direct specialized call (_direct): the inputs it
        # reads, no ctx; a ValueError from it goes to its guarded call (``guards``),
        # which runs the generic kernel, and the loop resumes after that step.
        todo = steps
        while True:
            k = -1
            try:
                for k, fn, ctx, ins, n_in, out1, outs, frees, kw in todo:  # noqa: B007 - k names a failing step
                    if n_in < 0:
                        if n_in == -1:
                            res = fn(vals[ins[0]])
                        elif n_in == -2:
                            res = fn(vals[ins[0]], vals[ins[1]])
                        else:
                            res = fn(*[vals[i] for i in ins])
                    elif kw is None:
                        if n_in == 1:
                            res = fn(ctx, vals[ins[0]])
                        elif n_in == 2:
                            res = fn(ctx, vals[ins[0]], vals[ins[1]])
                        elif n_in == 3:
                            res = fn(ctx, vals[ins[0]], vals[ins[1]], vals[ins[2]])
                        else:
                            res = fn(ctx, *[vals[i] for i in ins])
                    else:
                        res = fn(ctx, *[vals[i] for i in ins], **kw)
                    if out1 >= 0 and not isinstance(res, (tuple, list)):
                        vals[out1] = res
                    else:
                        _store_many(vals, outs, res)
                    for f in frees:
                        vals[f] = None
                return
            except KERNEL_ERRORS as e:
                guard = guards.get(k) if guards and isinstance(e, ValueError) else None
                if guard is None:
                    raise self._error(k, vals, e) from e
                todo = self._guarded_step(vals, todo, k, guard)
            except _ShapeMiss as miss:
                todo = self._leave_speculation(vals, k, miss.res, program_values)
                guards = None

    def _leave_speculation(
        self, vals: list[Any], k: int, res: Any, program_values: tuple[tuple[int, np.ndarray], ...]
    ) -> list[_StepTuple]:
        """After root step ``k`` of a speculative BoundRun gave other shapes (its result
        ``res``): stores it and returns the generic steps after it, which read every
        value computed so far (those native programs wrote are put in place; the arena
        is not written again in this run, so they stay valid) and allocate their own
        results."""
        for slot, arr in program_values:
            vals[slot] = arr
        _, _, _, _, _, _, outs, frees, _ = self._plain[k]
        _store_many(vals, outs, res)
        for f in frees:
            vals[f] = None
        return self._plain[k + 1 :]

    def _guarded_step(
        self, vals: list[Any], todo: list[_StepTuple], k: int, guard: Callable[..., Any]
    ) -> list[_StepTuple]:
        """Runs step ``k``, whose direct call refused its arguments, by its guarded call
        (the generic kernel); the steps of ``todo`` after it."""
        step = self.plan.steps[k]
        try:
            res = guard(step.ctx, *[vals[i] for i in step.inputs])
        except KERNEL_ERRORS as e:
            raise self._error(k, vals, e) from e
        pos = next(i for i, t in enumerate(todo) if t[0] == k)
        _, _, _, _, _, _, outs, frees, _ = todo[pos]
        _store_many(vals, outs, res)  # a single result too: off the hot loop, no fast path
        for f in frees:
            vals[f] = None
        return todo[pos + 1 :]

    def _run_instrumented(
        self,
        vals: list[Any],
        steps: list[_StepTuple],
        on_value: Callable[[str, np.ndarray], None] | None,
        profiler: Profiler | None,
        record: Specs | None,
        specs: Specs | None = None,
        capture: dict[int, np.ndarray] | None = None,
        program_values: tuple[tuple[int, np.ndarray], ...] = (),
        root_values: dict[int, tuple[Any, ...]] | None = None,
    ) -> None:
        """The loop with timing (``profiler``), callbacks (``on_value``), shape
        recording (``record``: filled with the (shape, dtype) of every input and value) and
        ``capture``: slot -> a copy of each small output of a signature-static step (and
        of a step static once the roots are checked). ``root_values``: root step -> a copy
        of the arguments that size its outputs (``root_shape_args``).
        ``program_values``: the speculative BoundRun's (:meth:`_leave_speculation`)."""
        static = self._static | self._checked_static if capture is not None else frozenset()
        root_args = self._root_args if root_values is not None else {}
        slots = self.plan.slots
        clock = time.perf_counter_ns
        if record is not None:
            for k in self._input_slots:
                if isinstance(vals[k], np.ndarray):
                    record[k] = (vals[k].shape, vals[k].dtype)
        watch = record is not None or on_value is not None
        # two flat lists of ints: tuples per step would be objects the garbage collector
        # scans again and again while the profiler keeps them (10x slower runs)
        starts = [0] * len(self.plan.steps)
        ends = [0] * len(self.plan.steps)
        run_start = clock()
        k = -1
        todo = steps
        while todo is not None:
            try:
                for k, fn, ctx, ins, _, out1, outs, frees, kw in todo:
                    args = [vals[i] for i in ins]
                    if k in root_args:
                        root_values[k] = tuple(_copied(args[j]) for j in root_args[k])  # type: ignore[index]
                    starts[k] = clock()
                    res = fn(ctx, *args) if kw is None else fn(ctx, *args, **kw)
                    ends[k] = clock()
                    if out1 >= 0 and not isinstance(res, (tuple, list)):
                        vals[out1] = res
                    else:
                        _store_many(vals, outs, res)
                    if k in static:
                        _capture(vals, outs, capture)
                    if watch:
                        for o in outs:
                            if o is None:
                                continue
                            arr = vals[o]
                            if record is not None and isinstance(arr, np.ndarray):
                                record[o] = (arr.shape, arr.dtype)
                            if on_value is not None:
                                on_value(slots[o].name, arr)
                    for f in frees:
                        vals[f] = None
                todo = None
            except KERNEL_ERRORS as e:
                raise self._error(k, vals, e) from e
            except _ShapeMiss as miss:
                ends[k] = clock()
                if on_value is not None:
                    for o, arr in zip(self.plan.steps[k].outputs, _as_tuple(miss.res)):
                        if o is not None:
                            on_value(slots[o].name, arr)
                todo = self._leave_speculation(vals, k, miss.res, program_values)
        run_end = clock()
        if profiler is not None:
            profiler.record_run(run_start, run_end, starts, ends, record if record is not None else specs)

    def _error(self, k: int, vals: list[Any], e: Exception) -> TargetError:
        step = self.plan.steps[k]
        args = [vals[i] for i in step.inputs]
        return TargetError(f"node {step.node.label}: {e} (inputs: {describe_args(args)})")

    # -- binding a signature ------------------------------------------------------------
    def _remember(
        self,
        signature: tuple,
        specs: Specs,
        captured: dict[int, np.ndarray],
        binds: int = 0,
        root_values: dict[int, tuple[Any, ...]] | None = None,
    ) -> None:
        """Binds ``signature`` to the measuring run's ``specs``; ``binds``: the speculative
        binds the signature had (a later one after a root step gave other shapes);
        ``root_values``: the roots' sizing arguments in the measuring run."""
        speculate = (
            self.speculate
            and bool(self._roots)
            and binds < MAX_SPECULATIVE_BINDS
            and all(o in specs for k in self._roots for o in self.plan.steps[k].outputs if o is not None)
        )
        if not speculate:
            captured = self._static_only(captured)
        bound = self._bind(specs, captured, speculate=speculate, root_values=root_values or {})
        if bound.speculation is not None:
            bound.speculation.binds = binds + 1
        self._add_static(bound, captured)
        if bound.arena is not None and self.native_programs:
            _native_programs(self.plan, bound, self._unstable)
        with self._bound_lock:
            self._bound[signature] = bound
            while len(self._bound) > self.max_signatures:
                self._bound.popitem(last=False)

    def _static_only(self, captured: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        """``captured`` without the values that are fixed only while a speculative bind's
        roots hold (``_checked_static``): an unspeculative bind must not take them for
        constants."""
        if not self._checked_static:
            return captured
        loose = {o for s in self.plan.steps if s.index in self._checked_static for o in s.outputs}
        return {k: v for k, v in captured.items() if k not in loose}

    def _touch(self, signature: tuple) -> None:
        with self._bound_lock:
            if signature in self._bound:
                self._bound.move_to_end(signature)

    def _bind(
        self,
        specs: Specs,
        captured: dict[int, np.ndarray] | None = None,
        *,
        speculate: bool = False,
        root_values: dict[int, tuple[Any, ...]] | None = None,
    ) -> BoundRun:
        """The BoundRun of the measuring run's ``specs``. ``speculate``: the shapes the
        signature does not fix are bound too, to this run's, and the root steps check
        theirs on every run (:func:`_speculative_root`; docs/runtime.md §3)."""
        plan = self.plan
        unstable = frozenset() if speculate else self._unstable
        roots = self._roots if speculate else frozenset()
        # strings (numpy object arrays of str: a tokenizer's, a OneHotEncoder's input)
        # hold references, not bytes: they never live in the arena
        nbytes = {
            k: int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            for k, (shape, dtype) in specs.items()
            if plan.slots[k].kind is SlotKind.INTERMEDIATE and k not in unstable and dtype.kind not in "OUS"
        }
        memory = plan_static_memory(plan, nbytes)
        steps = list(self._plain)
        out_steps = [
            s
            for s in plan.steps
            if s.kernel.out
            and s.outputs[0] is not None
            and s.outputs[0] in memory.offsets
            and s.index not in roots
            # a kernel of several outputs writes all of them, or none, into the arena
            and (not s.kernel.out_all or all(o is None or o in memory.offsets for o in s.outputs))
        ]
        root_outs = [o for k in roots for o in plan.steps[k].outputs if o is not None and o in memory.offsets]
        speculation = Speculation() if speculate else None
        if not out_steps and not root_outs:
            self._specialize(steps, specs, captured or {}, {}, unstable, roots)
            self._check_roots(steps, specs, roots, {}, None, speculation, captured or {}, root_values or {})
            return BoundRun(steps, specs, memory, speculation=speculation, roots=roots)
        # 64 bytes of slack so the arena can start on a 64-byte boundary
        raw = np.empty(memory.peak_bytes + memory.alignment, np.uint8)
        shift = (-raw.ctypes.data) % memory.alignment
        arena = raw[shift : shift + memory.peak_bytes]

        def view_of(o: int) -> np.ndarray:
            shape, dtype = specs[o]
            off = memory.offsets[o]
            return arena[off : off + nbytes[o]].view(dtype).reshape(shape)

        resident = set()
        views: dict[int, Any] = {}  # step -> its out= (a view, or a tuple of them: out_all)
        slot_views: dict[int, np.ndarray] = {}
        for s in out_steps:
            places = [
                (o, view_of(o)) for o in (s.outputs if s.kernel.out_all else s.outputs[:1]) if o is not None
            ]
            slot_views.update(places)
            resident.update(o for o, _ in places)
            if s.kernel.out_all:
                views[s.index] = tuple(None if o is None else slot_views[o] for o in s.outputs)
            else:
                views[s.index] = places[0][1]
            k, fn, ctx, ins, n_in, out1, outs, frees, kw = steps[s.index]
            steps[s.index] = (k, fn, ctx, ins, n_in, out1, outs, frees, {**(kw or {}), "out": views[s.index]})
        root_views = {o: view_of(o) for o in root_outs}
        resident.update(root_views)
        self._specialize(steps, specs, captured or {}, views, unstable, roots)
        resident |= {view for view, root in memory.aliases.items() if root in resident}
        for s in plan.steps:
            if (
                (s.kernel.out and s.index not in roots)
                or s.op_type in VIEW_OPS
                or not resident.intersection(s.inputs)
            ):
                continue
            k, fn, ctx, ins, n_in, out1, outs, frees, kw = steps[s.index]
            if getattr(fn, "fresh", False):
                continue  # a specialized call that never returns a view of an input
            steps[s.index] = (k, _copy_out_of(arena, fn), ctx, ins, n_in, out1, outs, frees, kw)
        self._check_roots(
            steps, specs, roots, root_views, arena, speculation, captured or {}, root_values or {}
        )
        bound = BoundRun(
            steps, specs, memory, arena, frozenset(resident), speculation=speculation, roots=roots
        )
        bound.slot_views = slot_views | root_views
        return bound

    def _check_roots(
        self,
        steps: list[_StepTuple],
        specs: Specs,
        roots: frozenset[int],
        root_views: dict[int, np.ndarray],
        arena: np.ndarray | None,
        speculation: Speculation | None,
        captured: dict[int, np.ndarray],
        root_values: dict[int, tuple[Any, ...]],
    ) -> None:
        """Makes each root step of a speculative bind check its outputs' shapes
        (:func:`_speculative_root`); a root whose sizing arguments the measuring run
        recorded first compares those (:meth:`_guarded_root`)."""
        if speculation is None:
            return
        for k in roots:
            step = self.plan.steps[k]
            _, fn, ctx, ins, n_in, out1, outs, frees, kw = steps[k]
            if kw is not None:
                fn = functools.partial(fn, **kw)
            expect = tuple(None if o is None else specs[o] for o in step.outputs)
            places = tuple(None if o is None else root_views.get(o) for o in step.outputs)
            view = step.op_type in VIEW_OPS
            check = _speculative_root(fn, expect, places, arena, speculation, view)
            if k in root_values:
                check = self._guarded_root(k, check, specs, places, arena, captured, root_values[k], view)
            steps[k] = (k, check, ctx, ins, n_in, out1, outs, frees, None)

    def _guarded_root(
        self,
        k: int,
        check: Callable[..., Any],
        specs: Specs,
        places: tuple[np.ndarray | None, ...],
        arena: np.ndarray | None,
        captured: dict[int, np.ndarray],
        recorded: tuple[Any, ...],
        view: bool,
    ) -> Callable[..., Any]:
        """Root step ``k`` of a speculative bind whose output shapes follow from its input
        shapes (checked upstream) and the values of a few arguments
        (``static_steps.root_shape_args``): when those hold the measuring run's values
        (``recorded``; compared as shape, dtype and bytes, a few int64s), the outputs have
        the measuring run's shapes, and the step runs as a non-root step of the bind
        would: its kernel specialized to those shapes with the arguments as constants,
        into its planned place. Otherwise ``check`` (the generic call, its shapes
        compared). The same bytes either way: the specialized call computes what the
        generic one does on these arguments."""
        step = self.plan.steps[k]
        positions = self._root_args[k]
        if (
            len(step.outputs) != 1
            or step.outputs[0] is None
            or any(not isinstance(r, np.ndarray) or r.dtype.kind == "O" for r in recorded)
        ):
            return check
        overridable = set(self.plan.inputs.values())
        consts: dict[int, Any] = {k2: v for k2, v in self.plan.constants.items() if k2 not in overridable}
        consts.update(captured)
        guards = []
        for j, r in zip(positions, recorded):
            if step.inputs[j] in consts:
                continue  # fixed for the bind already
            consts[step.inputs[j]] = r
            guards.append((j, r.shape, r.dtype, r.tobytes()))
        # no guards left: the sizing arguments are fixed while the upstream checks hold
        # (a Reshape's target computed from the Shape of a value after a NonZero)
        place = places[0]
        bound = self._root_call(step, specs, consts, place)
        if bound is None:
            return check
        slow = getattr(check, "direct", None)
        if slow is None:
            ctx = step.ctx

            def slow(*args: Any) -> Any:
                return check(ctx, *args)

        def run(*args: Any) -> Any:
            for j, shape, dtype, data in guards:
                a = args[j]
                if not (
                    isinstance(a, np.ndarray)
                    and a.shape == shape
                    and a.dtype == dtype
                    and a.tobytes() == data
                ):
                    return slow(*args)
            res = bound(*args)
            if view or res is place:
                return res
            if place is None:  # never the fixed result itself, nor arena memory
                return res.copy() if not res.flags.writeable else res if arena is None else _fresh(res, arena)
            np.copyto(place, res)
            return place

        def root(ctx: Any, *args: Any) -> Any:
            del ctx  # bound in
            return run(*args)

        root.direct = run  # type: ignore[attr-defined]
        root.__wrapped__ = check  # type: ignore[attr-defined]
        return root

    def _root_call(
        self, step: Any, specs: Specs, consts: dict[int, Any], place: np.ndarray | None
    ) -> Callable[..., Any] | None:
        """A guarded root's call for the measuring run's shapes (all inputs, no ctx), with
        ``consts`` (its sizing arguments among them) as constants: the kernel's
        specialization into ``place``; else, when every input is constant, the result
        computed once (a Range or ConstantOfShape of recorded operands); else None."""
        ins = step.inputs
        values = tuple(consts.get(i) if i else None for i in ins)
        if step.kernel.specialize is not None and all(not i or i in specs or i in consts for i in ins):
            known = [
                None if not i else (v.shape, v.dtype) if isinstance(v, np.ndarray) else specs.get(i)
                for i, v in zip(ins, values)
            ]
            o = step.outputs[0]
            sig = Specialization(
                shapes=tuple(None if kd is None else tuple(kd[0]) for kd in known),
                dtypes=tuple(None if kd is None else kd[1] for kd in known),
                consts=values,
                out_shape=tuple(specs[o][0]),
                out_dtype=specs[o][1],
                out=place if step.kernel.out and not step.kernel.out_all else None,
                num_threads=max(1, int(getattr(step.ctx, "num_threads", 1) or 1)),
                ctx=step.ctx,
            )
            try:
                fast = step.kernel.specialize(sig, **(step.attrs or {}))
            except (ValueError, TypeError, KeyError, IndexError):
                fast = None
            if fast is not None:
                ctx = step.ctx

                def call(*args: Any) -> Any:
                    return fast(ctx, *args)

                return call
        if all(not i or i in consts for i in ins):
            try:
                kw = {"out": None} if step.kernel.out else {}
                res = step.kernel.fn(step.ctx, *values, **(step.attrs or {}), **kw)
            except KERNEL_ERRORS:
                return None
            if not isinstance(res, np.ndarray) or res.dtype.kind == "O":
                return None
            fixed = res.copy()
            fixed.flags.writeable = False

            def same(*args: Any) -> Any:
                del args  # the result is fixed while the guarded arguments are
                return fixed

            return same
        return None

    def _specialize(
        self,
        steps: list[_StepTuple],
        specs: Specs,
        captured: dict[int, np.ndarray],
        views: dict[int, Any],
        unstable: frozenset[int] | None = None,
        roots: frozenset[int] = frozenset(),
    ) -> None:
        """Replaces in ``steps`` the call of every kernel that offers ``specialize`` by the
        callable it returns for this signature (its output view bound in; no keyword
        arguments left, so the loop takes its unrolled calls). ``unstable``: the slots
        whose shapes are not bound (default: those the signature does not fix); the
        ``roots`` of a speculative bind are specialized as if it were not one (they
        compute the shapes it checks)."""
        if unstable is None:
            unstable = self._unstable
        plan = self.plan
        # an input with an initializer is a constant slot a feed may override: not constant
        overridable = set(plan.inputs.values())
        consts = {k: v for k, v in plan.constants.items() if k not in overridable}
        for s in plan.steps:
            spec_fn = s.kernel.specialize
            if spec_fn is None:
                continue
            ins = s.inputs
            values = tuple(consts.get(i, captured.get(i)) if i else None for i in ins)
            known = [
                None if not i else (v.shape, v.dtype) if isinstance(v, np.ndarray) else specs.get(i)
                for i, v in zip(ins, values)
            ]
            o = s.outputs[0] if s.outputs else None
            out_spec = specs.get(o) if o is not None else None
            sig = Specialization(
                shapes=tuple(None if k is None else tuple(k[0]) for k in known),
                dtypes=tuple(None if k is None else k[1] for k in known),
                consts=values,
                out_shape=None if out_spec is None else tuple(out_spec[0]),
                out_dtype=None if out_spec is None else out_spec[1],
                out=views.get(s.index),
                num_threads=max(1, int(getattr(s.ctx, "num_threads", 1) or 1)),
                ctx=s.ctx,
            )
            if any(k is None and i for k, i in zip(known, ins)):
                continue  # an input the measuring run did not see as an array
            hidden = self._unstable if s.index in roots else unstable
            if hidden.intersection(ins) or hidden.intersection(s.outputs):
                if not getattr(spec_fn, "shape_free", False):
                    continue  # a shape this signature does not fix
                # a hook that binds no shape: it sees none of the shapes that may change
                sig = dataclasses.replace(
                    sig,
                    shapes=tuple(None if i in hidden else sh for i, sh in zip(ins, sig.shapes)),
                    out_shape=None,
                    out=None if s.index in roots else sig.out,
                )
            try:
                fast = spec_fn(sig, **(s.attrs or {}))
            except (ValueError, TypeError, KeyError, IndexError):
                fast = None  # an optimization that did not happen: the generic call runs
            if fast is None:
                continue
            k, _, ctx, ins_, n_in, out1, outs, frees, _ = steps[s.index]
            steps[s.index] = (k, fast, ctx, ins_, n_in, out1, outs, frees, None)

    def _add_static(self, bound: BoundRun, captured: dict[int, np.ndarray]) -> None:
        """Drops from ``bound``'s fast loop the signature-static steps whose outputs were
        all captured (small, not graph outputs: a caller may write into what it gets)."""
        outputs = set(self.plan.outputs.values())
        static = self._static if bound.speculation is None else self._static | self._checked_static
        skip = set()
        for s in self.plan.steps:
            if s.index not in static:
                continue
            outs = [o for o in s.outputs if o is not None]
            if outs and all(o in captured and o not in outputs for o in outs):
                skip.add(s.index)
        if not skip:
            return
        produced = {o for s in self.plan.steps if s.index in skip for o in s.outputs if o is not None}
        bound.static_values = tuple((k, captured[k]) for k in sorted(produced))
        bound.fast_steps = [t for t in bound.steps if t[0] not in skip]
        bound.direct_steps = None  # made again from the fast steps


#: Largest output of a signature-static step that the executor records (a shape
#: subgraph's values are a few int64s; larger constant-derived values are recomputed).
STATIC_VALUE_MAX_BYTES = 64 << 10

#: Largest graph input a native program reads from a staged copy (:func:`_native_programs`):
#: the copy costs each run about what a Python step costs (~1-2 us) up to a few KB, and
#: more above, where a model's steps are long enough for a Python step not to matter.
STAGED_INPUT_MAX_BYTES = 64 << 10


def _native_programs(plan: Plan, bound: BoundRun, unstable: frozenset[int] = frozenset()) -> None:
    """Replaces each run of consecutive recordable steps of ``bound``'s fast loop by one
    native program (``_native.Program``, docs/runtime.md "Native programs"): the steps'
    kernel calls recorded once, here, and run as one C++ call with the GIL released once.

    A step is recorded when its specialized call says it makes exactly one kernel call
    into its planned output (``fn.recordable``, set by the binders' specialize hooks)
    and every array it reads or writes stays where it is on every run of the signature:
    constants, signature-static values, arena views, and the views a view step (Reshape,
    Squeeze, ...) makes of those, which are made here once and dropped from the loop.
    The values a Python step or the caller reads from such slots are put in place with
    the signature-static ones at the start of each run (the arrays are the same; the
    programs write their contents).

    A small graph input (up to STAGED_INPUT_MAX_BYTES, its shape bound by the signature)
    counts as an array that stays where it is: it gets a buffer of its own, which each
    run fills with the feed (``BoundRun.staged``), so the steps that read it (the Cast,
    Gather or Transpose of a text model's ids or states) are recorded too instead of each
    running from the Python loop. Every reader then reads the buffer, through a read-only
    view (an output that is, or views, the input is copied for the caller), and the
    buffer holds the feed's values: the same bytes.

    A view step is made once only when its output shape is bound: not when it is in
    ``unstable`` (a Reshape to a target computed from the data: the arena holds no
    values yet when this runs) unless the bind is speculative; a speculative bind's
    root view steps (a Reshape to a data-dependent target) keep running, as the check
    of their shapes, while their consumers read the view of the checked shape, made
    here."""
    Program = _program_factory(plan.target)
    if Program is None:
        return
    arena = bound.arena
    overridable = set(plan.inputs.values())
    fixed: dict[int, np.ndarray] = {k: v for k, v in plan.constants.items() if k not in overridable}
    fixed.update(bound.slot_views)
    # a signature-static step does not run: its recorded value, not its arena place
    fixed.update(bound.static_values)
    staged: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for k in sorted(overridable):
        spec = bound.specs.get(k)
        if spec is None or k in unstable or k in fixed:
            continue
        shape, dtype = spec
        if (
            dtype.kind in "OUSV"
            or int(np.prod(shape, dtype=np.int64)) * dtype.itemsize > STAGED_INPUT_MAX_BYTES
        ):
            continue
        buf = np.empty(shape, dtype)
        view = buf.view()
        view.flags.writeable = False
        staged[k] = (buf, view)
        fixed[k] = view
    staged_used: set[int] = set()
    steps = bound.steps if bound.fast_steps is None else bound.fast_steps
    out: list[_StepTuple] = []
    program: Any = None
    first = -1
    made: dict[int, np.ndarray] = {}  # slots whose arrays a dropped view step made
    recorded = 0

    def args_of(ins: tuple[int, ...]) -> list[Any] | None:
        if not all(i == NONE_SLOT or i in fixed for i in ins):
            return None
        return [None if i == NONE_SLOT else fixed[i] for i in ins]

    def flush() -> None:
        nonlocal program
        if program is not None and len(program):
            out.append((first, program.run, _PROGRAM, (), -3, -1, (), (), None))
        program = None

    produced: set[int] = set()
    bound_shapes = bound.speculation is not None
    for t in steps:
        k, fn, ctx, ins, _, _, outs, _, kw = t
        step = plan.steps[k]
        args = args_of(ins)
        if args is not None and step.op_type in VIEW_OPS and k in bound.roots:
            x = args[0]
            o = outs[0] if len(outs) == 1 else None
            if isinstance(x, np.ndarray) and x.flags.c_contiguous and o is not None and o in bound.specs:
                fixed[o] = made[o] = x.reshape(bound.specs[o][0])
                staged_used.update(i for i in ins[:1] if i in staged)
        elif (
            args is not None
            and step.op_type in VIEW_OPS
            and (bound_shapes or not unstable.intersection(o for o in outs if o is not None))
        ):
            views = _fixed_views(fn, ctx, args, kw, outs, arena, [staged[i][0] for i in ins if i in staged])
            if views is not None:
                for o, v in views.items():
                    fixed[o] = made[o] = v
                staged_used.update(i for i in ins if i in staged)
                continue
        call = getattr(fn, "direct", None)
        if (
            args is not None
            and call is not None
            and getattr(fn, "recordable", False)
            and all(o is None or o in bound.slot_views for o in outs)
            and (
                getattr(fn, "strided", False)  # its binding reads strided views in place
                or all(a is None or not isinstance(a, np.ndarray) or a.flags.c_contiguous for a in args)
            )
        ):
            picked = _picked(fn, args)
            if program is None:
                program, first = Program(), k
            if program.record(call, *picked):
                recorded += 1
                produced.update(o for o in outs if o is not None)
                staged_used.update(i for i in ins if i in staged)
                continue
        flush()
        out.append(t)
    flush()
    if not recorded and not made:
        return
    # the inputs a recorded step or a view made here reads (a view of an input made once
    # is a view of its buffer: that buffer must be filled on every run)
    bound.staged = tuple((k, *staged[k]) for k in sorted(staged_used))
    # the arrays Python steps and the caller read from slots no Python step now writes
    wanted = {i for t in out if t[2] is not _PROGRAM for i in plan.steps[t[0]].inputs}
    wanted |= set(plan.outputs.values())
    arrays = {**{o: bound.slot_views[o] for o in produced}, **made}
    extra = tuple((k, arrays[k]) for k in sorted(arrays) if k in wanted)
    bound.static_values = bound.static_values + extra
    bound.program_values = tuple(sorted(arrays.items(), key=lambda kv: kv[0]))
    bound.fast_steps = out
    bound.direct_steps = None
    bound.program_steps = (recorded, len(steps))


def _program_factory(target: str) -> Callable[[], Any] | None:
    """The recorder of the target that chose the plan's kernels, or of its host target
    (which chose the kernels of a device plan's host partitions); None: no programs."""
    from quanta.targets.registry import get_target, registered_targets, target_info

    if target not in registered_targets():
        return None  # a target object compiled directly (tests): its steps run from the loop
    info = target_info(target)
    for name in (info.name, info.host):
        if name is not None:
            make = get_target(name).program_factory()
            if make is not None:
                return make
    return None


def _picked(fn: Callable[..., Any], args: list[Any]) -> list[Any]:
    """The arguments a direct call takes (``fn.reads``, as :func:`_direct` picks them)."""
    reads = getattr(fn, "reads", None)
    if reads is None:
        return args
    if isinstance(reads, int):
        return args[:reads]
    return [args[p] for p in reads]


#: the ctx of a native program's step in the fast loop
_PROGRAM = object()


def _fixed_views(
    fn: Callable[..., Any],
    ctx: Any,
    args: list[Any],
    kw: dict | None,
    outs: tuple[int | None, ...],
    arena: np.ndarray,
    buffers: Sequence[np.ndarray] = (),
) -> dict[int, np.ndarray] | None:
    """A view step's results made once from arrays that never move, when every one is a
    view of one of its inputs in the arena or in one of ``buffers`` (staged graph inputs),
    so it shows what is written there on each run; else None. A result that is not a view
    of an input (a Slice or a Split part copied into the step's own planned place) must be
    made on every run."""
    try:
        res = fn(ctx, *args, **(kw or {}))
    except KERNEL_ERRORS:
        return None
    res = res if isinstance(res, (tuple, list)) else (res,)
    sources = [
        a
        for a in args
        if isinstance(a, np.ndarray)
        and (np.may_share_memory(a, arena) or any(np.may_share_memory(a, b) for b in buffers))
    ]
    views = {}
    for o, r in zip(outs, res):
        if o is None:
            continue
        if (
            not isinstance(r, np.ndarray)
            or r.base is None
            or not any(np.shares_memory(r, a) for a in sources)
        ):
            return None
        views[o] = r
    return views


def _stale(bound: BoundRun) -> bool:
    """A speculative BoundRun one of whose runs left it (a root step gave other shapes)."""
    return bound.speculation is not None and bound.speculation.misses > 0


def _as_tuple(res: Any) -> tuple[Any, ...]:
    return tuple(res) if isinstance(res, (tuple, list)) else (res,)


def _speculative_root(
    fn: Callable[..., Any],
    expect: tuple[tuple[tuple[int, ...], np.dtype] | None, ...],
    places: tuple[np.ndarray | None, ...],
    arena: np.ndarray | None,
    speculation: Speculation,
    view: bool,
) -> Callable[..., Any]:
    """A root step of a speculative bind: ``fn`` (its call as the non-speculative bind
    makes it), then each output's shape and dtype compared with the measuring run's
    (``expect``). Equal: an output with a place in the arena is copied there (its
    consumers were bound to that place, and may run in native programs), one without
    is returned as it is when the step is a view step (its consumers read the view of
    the checked shape), else never sharing the arena. Not equal: ``speculation.misses``
    counts it and :class:`_ShapeMiss` hands the result to the executor, which finishes
    the run with the generic steps and binds the signature again on its next run."""

    def check(res: Any) -> Any:
        many = isinstance(res, (tuple, list))
        rs = res if many else (res,)
        for r, e in zip(rs, expect):
            if e is not None and (not isinstance(r, np.ndarray) or r.shape != e[0] or r.dtype != e[1]):
                speculation.misses += 1
                raise _ShapeMiss(res)
        if view:
            return res
        kept = []
        for r, place in zip(rs, places):
            if place is not None:
                np.copyto(place, r)
                r = place
            elif arena is not None:
                r = _fresh(r, arena)
            kept.append(r)
        return tuple(kept) if many else kept[0]

    def root(ctx: Any, *args: Any) -> Any:
        return check(fn(ctx, *args))

    direct = getattr(fn, "direct", None)
    if direct is not None:  # the fast loop's direct call (an If reading its run-time values only), checked

        def checked_direct(*args: Any) -> Any:
            return check(direct(*args))

        root.direct = checked_direct  # type: ignore[attr-defined]
        root.reads = getattr(fn, "reads", None)  # type: ignore[attr-defined]
    root.__wrapped__ = fn  # type: ignore[attr-defined]
    return root


def _copied(arr: Any) -> Any:
    return arr.copy() if isinstance(arr, np.ndarray) else arr


def _capture(vals: list[Any], outs: tuple[int | None, ...], capture: dict[int, np.ndarray]) -> None:
    for o in outs:
        if o is None:
            continue
        arr = vals[o]
        if isinstance(arr, np.ndarray) and arr.nbytes <= STATIC_VALUE_MAX_BYTES:
            value = arr.copy()
            value.flags.writeable = False  # shared by every run of the signature
            capture[o] = value


def _outputs(vals: list[Any], out_slots: list[int]) -> list[Any]:
    """The graph outputs; a read-only one (a view of a recorded signature-static value or
    of a constant) is copied, so the caller may write into what it gets."""
    return [_writeable(vals[k]) for k in out_slots]


def _arena_outputs(vals: list[Any], out_slots: list[int], arena: np.ndarray) -> list[Any]:
    """The graph outputs of a run with ``arena``: one that shares it is copied, and so is a
    read-only one (a view of a staged input's buffer, of a constant or of a recorded
    value), so the caller may write into what it gets."""
    outs = []
    for k in out_slots:
        arr = vals[k]
        # an array that owns its memory is not the arena's (np.may_share_memory: ~0.7 µs)
        if isinstance(arr, np.ndarray) and (
            not arr.flags.writeable or (arr.base is not None and np.may_share_memory(arr, arena))
        ):
            arr = arr.copy()
        outs.append(arr)
    return outs


def _writeable(arr: Any) -> Any:
    if isinstance(arr, np.ndarray) and not arr.flags.writeable:
        return arr.copy()
    return arr


def _store_many(vals: list[Any], outs: tuple[int | None, ...], res: Any) -> None:
    if not isinstance(res, (tuple, list)):
        res = (res,)
    for o, arr in zip(outs, res):
        if o is not None:
            vals[o] = arr


def _direct(step: _StepTuple) -> _StepTuple:
    """``step`` calling its specialized call directly when it has one (``fn.direct``, set
    by quanta.targets.native._specialize.guarded): the inputs it reads (``fn.reads``)
    and no ctx, flagged by a negative input count; else ``step`` with its keyword
    arguments (attributes, the arena's ``out=``) bound into the callable once, so the
    loop makes its unrolled positional call instead of building a list and a ``**``
    dict per call (~0.4 µs: a duration net's 143 such steps of 336); else ``step``."""
    k, fn, ctx, ins, _, out1, outs, frees, kw = step
    call = getattr(fn, "direct", None)
    if kw is not None:
        return (k, functools.partial(fn, **kw), ctx, ins, len(ins), out1, outs, frees, None)
    if call is None:
        return step
    reads = getattr(fn, "reads", None)
    if reads is None:
        used = ins
    elif isinstance(reads, int):
        used = ins[:reads]
    else:  # the positions of the inputs it reads (an If with its constant operands bound)
        used = tuple(ins[p] for p in reads)
    if not used:
        return step
    return (k, call, ctx, used, -len(used), out1, outs, frees, None)


def _copy_out_of(arena: np.ndarray, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` whose results never share memory with ``arena`` (copied when they do); a
    specialized ``fn``'s direct call (``fn.direct``, :func:`_direct`) stays direct, its
    results checked the same way (an If or an LSTM cell that reads an arena value kept
    its generic call: a list and a frame more per step)."""

    def fresh(res: Any) -> Any:
        if isinstance(res, (tuple, list)):
            return tuple([_fresh(r, arena) for r in res])
        return _fresh(res, arena)

    def checked(ctx: Any, *args: Any, **kw: Any) -> Any:
        return fresh(fn(ctx, *args, **kw))

    checked.__wrapped__ = fn  # type: ignore[attr-defined]
    call = getattr(fn, "direct", None)
    if call is not None:

        def direct(*args: Any) -> Any:
            return fresh(call(*args))

        checked.direct = direct  # type: ignore[attr-defined]
        checked.reads = getattr(fn, "reads", None)  # type: ignore[attr-defined]
    return checked


def _fresh(arr: Any, arena: np.ndarray) -> Any:
    # an array that owns its memory is not the arena's (np.may_share_memory: ~0.7 µs)
    if isinstance(arr, np.ndarray) and arr.base is not None and np.may_share_memory(arr, arena):
        return arr.copy()
    return arr
