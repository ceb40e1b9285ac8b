"""Profiler: per-step wall times, a Chrome trace as ONNX Runtime writes it, a summary.

The executor calls :meth:`Profiler.record_run` once per profiled run with the start
and end of every step (``time.perf_counter_ns``, indexed by step). The trace
(:meth:`Profiler.trace`, written by :meth:`Profiler.write` and by
``InferenceSession.end_profiling()`` to ``{profile_file_prefix}_{%Y-%m-%d_%H-%M-%S}_{ms}.json``)
is a JSON list of Chrome "complete" events in ONNX Runtime's format, so the same tools
read both (chrome://tracing, Perfetto, onnxruntime's profile parsers)::

    {"cat": "Session", "name": "session_initialization", "ph": "X", "ts": 0, "dur": 1830,
     "pid": 4242, "tid": 4242, "args": {}}
    {"cat": "Node", "name": "conv_kernel_time", "ph": "X", "ts": 2051, "dur": 37,
     "pid": 4242, "tid": 4242,
     "args": {"op_name": "Conv", "provider": "quanta:reference", "kernel": "reference:Conv", "node_index": "3",
              "output_size": "1260", "activation_size": "1296", "parameter_size": "0",
              "input_type_shape": [{"float": [1, 3, 9, 5]}, {"float": [7, 3, 3, 3]}],
              "output_type_shape": [{"float": [1, 7, 9, 5]}]}}
    {"cat": "Session", "name": "model_run", "ph": "X", "ts": 2040, "dur": 95, ...}

``ts`` and ``dur`` are microseconds since the profiler started (session creation), as
in ONNX Runtime. Node event names are ``{node name}_kernel_time`` (ORT's naming), the
op type when the node has no name.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from quanta.runtime.plan import Plan

__all__ = ["ProfileSummary", "Profiler", "StepStat"]

# numpy dtype name -> ONNX Runtime's type name in input/output_type_shape
_ORT_TYPE_NAMES = {"float32": "float", "float64": "double", "bool": "bool", "str": "string"}


@dataclass(frozen=True)
class StepStat:
    """One step's times over the profiled runs."""

    step: int
    node: str
    op_type: str
    kernel: str
    calls: int
    total_us: float
    mean_us: float
    share: float  # of the total time spent in steps


@dataclass
class ProfileSummary:
    """The slowest steps (by total time), and where the rest of a run's time went."""

    runs: int
    steps: list[StepStat]
    step_us_per_run: float  # Σ step times / runs
    run_us_per_run: float  # mean wall time of a run
    n_steps: int  # steps in the plan

    @property
    def overhead_us_per_run(self) -> float:
        """Run wall time not spent inside kernels (executor loop, timers, feeds)."""
        return self.run_us_per_run - self.step_us_per_run

    def format(self) -> str:
        if not self.runs:
            return "no profiled runs"
        lines = [
            f"slowest {len(self.steps)} of {self.n_steps} steps over {self.runs} profiled run"
            f"{'s' if self.runs != 1 else ''}: run {self.run_us_per_run / 1e3:.3f} ms, in kernels "
            f"{self.step_us_per_run / 1e3:.3f} ms, executor overhead {self.overhead_us_per_run / 1e3:.3f} ms",
        ]
        rows = [("step", "node", "op", "kernel", "mean ms", "share")]
        for s in self.steps:
            rows.append(
                (str(s.step), s.node, s.op_type, s.kernel, f"{s.mean_us / 1e3:.4f}", f"{100 * s.share:.1f}%")
            )
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        right = {0, 4, 5}
        for r in rows:
            cells = [r[c].rjust(widths[c]) if c in right else r[c].ljust(widths[c]) for c in range(len(r))]
            lines.append(("  " + "  ".join(cells)).rstrip())
        return "\n".join(lines)

    __str__ = format


@dataclass
class _Run:
    start_ns: int
    end_ns: int
    starts: list[int]  # ns, indexed by step
    ends: list[int]
    specs: Mapping[int, tuple[tuple[int, ...], np.dtype]]  # slot -> (shape, dtype) of this run's signature
    tid: int
    #: steps that ran on another thread (a device's worker): step -> thread id
    tids: Mapping[int, int] | None = None


class Profiler:
    """Collects per-step times of one plan's runs (see the module docstring)."""

    def __init__(self, plan: Plan | None = None, *, start_ns: int | None = None):
        self.plan = plan
        self.start_ns = time.perf_counter_ns() if start_ns is None else start_ns
        self.start_time_ns = time.time_ns()  # wall clock at start (ORT: get_profiling_start_time_ns)
        self.runs: list[_Run] = []
        self.session_events: list[tuple[str, int, int]] = []  # (name, start_ns, end_ns)
        #: device-side and transfer events: (cat, name, start_ns, end_ns, tid or 0 for
        #: the run's thread, args, the run's thread)
        self.events: list[tuple[str, str, int, int, int, dict[str, Any], int]] = []
        self.thread_names: dict[int, str] = {}
        self.pid = os.getpid()
        self._lock = threading.Lock()

    def record_session_event(self, name: str, start_ns: int, end_ns: int) -> None:
        self.session_events.append((name, start_ns, end_ns))

    def record_run(
        self,
        start_ns: int,
        end_ns: int,
        starts: list[int],
        ends: list[int],
        specs: Mapping[int, tuple[tuple[int, ...], np.dtype]] | None = None,
        *,
        tids: Mapping[int, int] | None = None,
    ) -> None:
        """One run: its span, and step ``k`` from ``starts[k]`` to ``ends[k]`` (ns);
        ``tids``: the thread of each step that did not run on the calling thread."""
        with self._lock:
            tid = threading.get_native_id()
            self.runs.append(_Run(start_ns, end_ns, starts, ends, specs or {}, tid, tids or None))
            if tids:
                for t in set(tids.values()):
                    self.thread_names.setdefault(t, "device")

    def record_events(
        self, events: Sequence[tuple[str, str, int, int, int, dict[str, Any]]], device: str = "device"
    ) -> None:
        """Events beside the steps: transfers (cat "Transfer") on the device's thread,
        waits for a fence (cat "Wait") on the host thread (tid 0: the calling thread)."""
        with self._lock:
            host = threading.get_native_id()
            self.thread_names.setdefault(host, "host")
            for cat, name, t0, t1, tid, args in events:
                if tid:
                    self.thread_names[tid] = f"{device} device"
                self.events.append((cat, name, t0, t1, tid, args, host))

    # -- summary ---------------------------------------------------------------
    def summary(self, top: int = 10) -> ProfileSummary:
        """The ``top`` slowest steps by total time over all recorded runs."""
        n_steps = len(self.plan.steps) if self.plan is not None else 0
        total: dict[int, int] = {}
        calls: dict[int, int] = {}
        run_ns = 0
        for run in self.runs:
            run_ns += run.end_ns - run.start_ns
            for k, (t0, t1) in enumerate(zip(run.starts, run.ends)):
                total[k] = total.get(k, 0) + (t1 - t0)
                calls[k] = calls.get(k, 0) + 1
        all_ns = sum(total.values())
        order = sorted(total, key=lambda k: (-total[k], k))[:top]
        stats = []
        for k in order:
            node, op, kernel = self._step_names(k)
            stats.append(
                StepStat(
                    step=k,
                    node=node,
                    op_type=op,
                    kernel=kernel,
                    calls=calls[k],
                    total_us=total[k] / 1e3,
                    mean_us=total[k] / 1e3 / calls[k],
                    share=total[k] / all_ns if all_ns else 0.0,
                )
            )
        runs = len(self.runs)
        return ProfileSummary(
            runs=runs,
            steps=stats,
            step_us_per_run=all_ns / 1e3 / runs if runs else 0.0,
            run_us_per_run=run_ns / 1e3 / runs if runs else 0.0,
            n_steps=n_steps,
        )

    def _step_names(self, k: int) -> tuple[str, str, str]:
        if self.plan is None:
            return f"step_{k}", "", ""
        s = self.plan.steps[k]
        return s.name, s.op_type, s.kernel.name

    # -- Chrome trace ------------------------------------------------------------
    def trace(self) -> list[dict[str, Any]]:
        """All recorded events in ONNX Runtime's Chrome trace format."""
        events = []
        for name, t0, t1 in self.session_events:
            events.append(self._event("Session", name, t0, t1, self.pid, {}))
        for run in self.runs:
            for k, (t0, t1) in enumerate(zip(run.starts, run.ends)):
                events.append(self._node_event(k, t0, t1, run))
            events.append(self._event("Session", "model_run", run.start_ns, run.end_ns, run.tid, {}))
        for cat, name, t0, t1, tid, args, host in self.events:
            events.append(self._event(cat, name, t0, t1, tid or host, args))
        for tid, name in self.thread_names.items():  # Chrome's names for the timelines
            events.append(
                {"name": "thread_name", "ph": "M", "pid": self.pid, "tid": tid, "args": {"name": name}}
            )
        return events

    def write(self, path: str | os.PathLike) -> str:
        """Write :meth:`trace` to ``path`` (one event per line, as ORT does); return it."""
        path = Path(path)
        text = "[\n" + ",\n".join(json.dumps(e) for e in self.trace()) + "\n]\n"
        path.write_text(text)
        return str(path)

    def write_with_prefix(self, prefix: str) -> str:
        """Write to ``{prefix}_{%Y-%m-%d_%H-%M-%S}_{milliseconds}.json`` (ONNX Runtime's
        file naming); return the path."""
        now = datetime.datetime.now()
        stamp = now.strftime("%Y-%m-%d_%H-%M-%S") + f"_{now.microsecond // 1000:03d}"
        return self.write(f"{prefix}_{stamp}.json")

    def _event(self, cat: str, name: str, t0: int, t1: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
        return {
            "cat": cat,
            "pid": self.pid,
            "tid": tid,
            "dur": (t1 - t0) // 1000,
            "ts": (t0 - self.start_ns) // 1000,
            "ph": "X",
            "name": name,
            "args": args,
        }

    def _node_event(self, k: int, t0: int, t1: int, run: _Run) -> dict[str, Any]:
        if self.plan is None:
            return self._event("Node", f"step_{k}_kernel_time", t0, t1, run.tid, {"op_name": ""})
        step = self.plan.steps[k]
        args: dict[str, Any] = {
            "op_name": step.op_type,
            "provider": f"quanta:{step.kernel.impl}",
            "kernel": step.kernel.name,
            "node_index": str(k),
        }
        ins = _type_shapes(step.inputs, run.specs, self.plan)
        outs = _type_shapes([o for o in step.outputs if o is not None], run.specs, self.plan)
        if outs is not None:
            args["output_size"] = str(sum(b for _, b in outs))
        if ins is not None:
            consts = self.plan.constants
            args["activation_size"] = str(
                sum(b for (k2, (_, b)) in zip(step.inputs, ins) if k2 not in consts)
            )
            args["parameter_size"] = str(sum(b for (k2, (_, b)) in zip(step.inputs, ins) if k2 in consts))
            args["input_type_shape"] = [t for t, _ in ins]
        if outs is not None:
            args["output_type_shape"] = [t for t, _ in outs]
        name = step.node.name or step.op_type
        tid = run.tid
        if step.kernel.device:
            args["device"] = step.kernel.device
            if run.tids is not None:
                tid = run.tids.get(k, tid)
        return self._event("Node", f"{name}_kernel_time", t0, t1, tid, args)


def _type_shapes(
    slots: Sequence[int], specs: Mapping[int, tuple[tuple[int, ...], np.dtype]], plan: Plan
) -> list[tuple[dict[str, list[int]], int]] | None:
    """[({"float": [1, 3]}, nbytes), ...] for ``slots``, or None when a shape is unknown."""
    out = []
    for k in slots:
        if k == 0:
            continue
        if k in plan.constants:
            arr = plan.constants[k]
            shape, dtype = arr.shape, arr.dtype
        elif k in specs:
            shape, dtype = specs[k]
        else:
            return None
        name = _ORT_TYPE_NAMES.get(dtype.name, dtype.name)
        out.append(({name: [int(d) for d in shape]}, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize))
    return out
