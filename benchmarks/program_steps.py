"""What each step of a file costs as a normal run executes it (inside quanta's native
programs), and what a run saves when a chosen set of steps does not run at all: the
measure to take before fusing small steps.

    python benchmarks/program_steps.py FILE [--threads 1] [--ort] [--top 25]
    python benchmarks/program_steps.py FILE --drop QLinearSigmoid,QLinearMul --where /cell

The session profiler (``enable_profiling``) runs every step from the executor's Python
loop, which costs about 1 us a step of its own, so on a graph of many small steps it
shows the loop: captcha_crnn's unrolled LSTM cells (~600 steps on [1, 100] tensors) are a
third of a profiled run and 1-2 % of a normal one, whose native programs
(docs/runtime.md "Native programs") run a recorded step for tens of nanoseconds.

Per step: each recorded kernel call becomes a native program of its own, timed from
Python around its ``run()`` (the time of an empty program's ``run()`` subtracted); the
steps outside programs (graph inputs and outputs, control flow) are not listed. A step
run alone this way is not faster than inside one long program (its call, the GIL
released and taken back, a cold cache line), so read the small steps' times as upper
bounds. ``--drop``: the run with those steps (op types, optionally only nodes whose name
contains ``--where``) not recorded and not run, against the normal run, interleaved, in
process CPU time: the most that fusing them away can save (the outputs are wrong; only
the time is read). ``--ort``: ONNX Runtime's per-node medians of the same file from its
profiler, by node name (its layout transform's ``_token_N`` suffix dropped).

This reaches into ``quanta.runtime.execute`` (``_native_programs``, ``_picked``,
``_program_factory``) to wrap the recorder; a diagnostic, not an API.
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent / "zoo"))

import onnxruntime as ort
import reference_sweep
from _timing import ort_kernel_medians

import quanta
import quanta.runtime.execute as execute
from quanta.kernels import _native


class _Recorder:
    """Stands in for ``_native.Program``: with ``state.per_step`` each recorded call in a
    program of its own (timed per step), else one program as the executor's, without the
    calls ``state`` drops."""

    def __init__(self, state: _State) -> None:
        self.state = state
        self.per_step = state.per_step
        self.programs: list[tuple[int | None, Any]] = []
        self.one = _native.Program()

    def record(self, call: Callable[..., Any], *args: Any) -> bool:
        k = self.state.current
        if k is not None and self.state.drops(k):
            if k not in self.state.dropped:  # a second bind records the same steps again
                self.state.extracted.record(call, *args)  # timed on its own afterwards
            self.state.dropped.add(k)
            return True  # kept as far as the executor knows; never runs in the run
        if not self.per_step:
            return bool(self.one.record(call, *args))
        p = _native.Program()
        if not p.record(call, *args):
            return False
        self.programs.append((k, p))
        return True

    def __len__(self) -> int:
        return len(self.programs) if self.per_step else len(self.one)

    def run(self) -> None:
        if not self.per_step:
            self.one.run()
            return
        clock, times = time.perf_counter_ns, self.state.times
        for k, p in self.programs:
            t = clock()
            p.run()
            times[k].append(clock() - t)


class _State:
    """Which plan step the executor is recording (``_picked`` is called just before
    ``Program.record`` with the step's specialized call), and the per-step times."""

    def __init__(self, ops: set[str], where: str | None) -> None:
        self.ops, self.where = ops, where
        self.plan: Any = None
        self.step_of: dict[int, int] = {}  # id(specialized call) -> plan step
        self.current: int | None = None
        self.drop = False  # set while the dropping session binds
        self.dropped: set[int] = set()
        self.extracted = _native.Program()  # the dropped calls, in order
        self.per_step = False  # set while the timed session binds
        self.times: dict[int | None, list[int]] = collections.defaultdict(list)

    def drops(self, k: int) -> bool:
        if not self.drop:
            return False
        node = self.plan.steps[k].node
        return node.op_type in self.ops and (self.where is None or self.where in node.name)


def _install(state: _State) -> None:
    native_programs, picked = execute._native_programs, execute._picked

    def programs(plan: Any, bound: Any, unstable: frozenset[int] = frozenset()) -> None:
        state.plan = plan
        for t in bound.steps if bound.fast_steps is None else bound.fast_steps:
            state.step_of[id(t[1])] = t[0]
        native_programs(plan, bound, unstable)

    def picked_call(fn: Callable[..., Any], args: list[Any]) -> list[Any]:
        state.current = state.step_of.get(id(fn))
        return picked(fn, args)

    execute._native_programs = programs
    execute._picked = picked_call
    execute._program_factory = lambda target: lambda: _Recorder(state)


def _session(path: Path, threads: int) -> quanta.InferenceSession:
    so = quanta.SessionOptions()
    so.intra_op_num_threads = threads
    return quanta.InferenceSession(str(path), so)


def _process_cpu_ms(sess: quanta.InferenceSession, feed: dict, n: int) -> float:
    ts = []
    for _ in range(n):
        t = time.process_time()
        sess.run(None, feed)
        ts.append(time.process_time() - t)
    return statistics.median(ts) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=200, help="timed runs (default 200)")
    ap.add_argument("--top", type=int, default=25, help="steps listed (default 25)")
    ap.add_argument("--ort", action="store_true", help="ONNX Runtime's per-node medians beside")
    ap.add_argument("--drop", default="", help="op types (comma-separated) whose steps a second run drops")
    ap.add_argument("--where", default=None, help="with --drop: only nodes whose name contains this")
    ap.add_argument(
        "--blocks", type=int, default=12, help="--drop: interleaved blocks of 15 runs (default 12)"
    )
    args = ap.parse_args(argv)
    path = Path(args.model).expanduser()
    state = _State({o for o in args.drop.split(",") if o}, args.where)
    _install(state)
    state.per_step = not args.drop
    sess = _session(path, args.threads)
    feed, source = reference_sweep.feed_for(path, sess)
    for _ in range(3):
        sess.run(None, feed)
    state.per_step = False
    plan = sess.plan
    if args.drop:
        state.drop = True
        dropped = _session(path, args.threads)
        for _ in range(3):
            dropped.run(None, feed)
        state.drop = False
        full_ms, drop_ms = [], []
        for _ in range(args.blocks):
            full_ms.append(_process_cpu_ms(sess, feed, 15))
            drop_ms.append(_process_cpu_ms(dropped, feed, 15))
        f, d = statistics.median(full_ms), statistics.median(drop_ms)
        alone = []
        for _ in range(200):
            t = time.process_time()
            state.extracted.run()
            alone.append(time.process_time() - t)
        print(
            f"{path.name} ({source}), {args.threads} thread(s), process CPU medians: run {f:.3f} ms, "
            f"without the {len(state.dropped)} dropped steps {d:.3f} ms: at most {f - d:.3f} ms "
            f"({100 * (f - d) / f:.1f} %) to gain; the dropped steps' {len(state.extracted)} kernel "
            f"calls as one program: {1e3 * statistics.median(alone):.3f} ms"
        )
        return 0
    state.times.clear()
    for _ in range(args.runs):
        sess.run(None, feed)
    empty = _native.Program()
    base = []
    for _ in range(2000):
        t = time.perf_counter_ns()
        empty.run()
        base.append(time.perf_counter_ns() - t)
    zero = statistics.median(base)
    per = {k: max(0.0, statistics.median(v) - zero) / 1e3 for k, v in state.times.items() if k is not None}
    ort_us: dict[str, float] = {}
    if args.ort:
        oso = ort.SessionOptions()
        oso.intra_op_num_threads = args.threads
        oso.log_severity_level = 3
        oso.enable_profiling = True
        oso.profile_file_prefix = str(Path(tempfile.gettempdir()) / "program_steps_ort")
        o = ort.InferenceSession(str(path), oso, providers=["CPUExecutionProvider"])
        for _ in range(max(20, args.runs // 4)):
            o.run(None, feed)
        medians, _, _ = ort_kernel_medians(o.end_profiling())
        for n, us in medians.items():
            key = re.sub(r"_token_\d+$", "", n)
            ort_us[key] = ort_us.get(key, 0.0) + us
    total = sum(per.values())
    print(
        f"{path.name} ({source}), {args.threads} thread(s): {len(per)} steps in native programs, "
        f"{total:.0f} us a run (each step timed alone, {zero:.0f} ns of an empty program's run() "
        f"subtracted)"
    )
    by_op: dict[str, list[float]] = collections.defaultdict(list)
    ort_of: dict[str, float] = collections.defaultdict(float)  # ORT's time of the same nodes
    for k, us in per.items():
        node = plan.steps[k].node
        by_op[node.op_type].append(us)
        ort_of[node.op_type] += ort_us.get(node.name, 0.0)
    print(
        f"  {'op':24} {'steps':>5} {'us/run':>8} {'share':>6} {'ns/step (median)':>17} {'ORT us, same nodes':>19}"
    )
    for op, v in sorted(by_op.items(), key=lambda kv: -sum(kv[1])):
        o_txt = f"{ort_of[op]:.1f}" if ort_of[op] else "-"
        print(
            f"  {op[:24]:24} {len(v):5d} {sum(v):8.1f} {100 * sum(v) / total:5.1f}% "
            f"{1e3 * statistics.median(v):17.0f} {o_txt:>19}"
        )
    print(f"  {'us':>8} {'ORT us':>8}  {'op':18} {'node':50} kernel")
    for k, us in sorted(per.items(), key=lambda kv: -kv[1])[: args.top]:
        step = plan.steps[k]
        partner = ort_us.get(step.node.name)
        o_txt = "-" if partner is None else f"{partner:.1f}"
        print(
            f"  {us:8.1f} {o_txt:>8}  {step.node.op_type[:18]:18} {step.node.name[:50]:50} {step.kernel.name}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
