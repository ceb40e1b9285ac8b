"""``quanta bench MODEL``: latency over repeated runs, optionally side by side with
ONNX Runtime on the same file and the same inputs.

    quanta bench model.onnx [--vs-ort] [--threads N] [--batch B] [--dim NAME=SIZE]
                 [--feeds FILE.npz] [--warmup W] [--runs R] [--backend native|reference]

Method: the inputs of ``--feeds``, or generated ones of the model's shapes (float:
standard normal; integer: ones, valid ids and masks for language models; symbolic
dimensions: ``--dim NAME=SIZE``, else ``--batch`` for the first and 1 elsewhere); ``W`` warm-up runs of each engine, then ``R`` timed runs with
quanta and ONNX Runtime interleaved (q, o, q, o, ...) so that a noisy neighbour slows
both alike; the median and the 90th percentile of the wall time of ``sess.run``.
ONNX Runtime gets ``intra_op_num_threads = N`` (the same count quanta uses),
``inter_op_num_threads = 1``, sequential execution and ``ORT_ENABLE_ALL``. Then
``min(R, 20)`` more quanta runs with the profiler on give the per-step profile (kept
apart from the timed runs: timing each step costs ~0.2 us per step). The report ends
with the autotuner's choices (quanta/runtime/tuner.py): per GEMM shape, the blocking it
runs with, whether measured now or taken from the cache, and its measured gain over the
built-in heuristics.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["BenchResult", "Latency", "bench_model", "format_result", "reference_steps", "run_bench"]

PROFILE_RUNS = 20


@dataclass
class Latency:
    """Wall times of repeated runs of one engine, in milliseconds."""

    engine: str
    times_ms: list[float]

    @property
    def median(self) -> float:
        return float(np.median(self.times_ms))

    @property
    def p90(self) -> float:
        return float(np.percentile(self.times_ms, 90))


@dataclass
class BenchResult:
    model: str
    backend: str
    threads: int
    batch: int
    warmup: int
    runs: int
    inputs: dict[str, tuple[tuple[int, ...], str]]
    quanta: Latency
    ort: Latency | None = None
    ort_error: str = ""
    #: output name -> max |quanta - onnxruntime| (nan: shapes or types differ)
    agreement: dict[str, float] = field(default_factory=dict)
    profile: object = None  # quanta.runtime.profile.ProfileSummary
    n_steps: int = 0
    fallbacks: list[tuple[str, str, str]] = field(default_factory=list)
    #: fallback steps the executor runs once per input shape (runtime/static_steps.py)
    static_fallbacks: int = 0
    #: (op type, node name, reason) of the fallback steps that run in every timed run
    #: (the fallbacks less the signature-static ones): NumPy twins on the timed path
    reference_steps: list[tuple[str, str, str]] = field(default_factory=list)
    #: quanta.quantize.ort_saturation's advice when ONNX Runtime's int8 GEMM saturates some
    #: of the file's weights on this CPU (x86 without VNNI): the agreement includes ORT's error
    ort_note: str | None = None
    #: what the autotuner chose (quanta.runtime.tuner.TuneReport), None when it was off
    tuning: object = None


def bench_model(
    model: str | Path,
    *,
    backend: str = "native",
    threads: int = 0,
    batch: int = 1,
    warmup: int = 5,
    runs: int = 50,
    vs_ort: bool = False,
    seed: int = 0,
    top: int = 10,
    dims: dict[str, int] | None = None,
    feeds: dict[str, np.ndarray] | None = None,
) -> BenchResult:
    """Time ``model`` (see the module docstring); ``threads`` 0: all cores."""
    import quanta
    from quanta.cli.main import CliError, defaulted_dims, random_feeds
    from quanta.runtime.profile import Profiler
    from quanta.session import resolve_threads

    if runs < 1:
        raise CliError(f"--runs: expected >= 1, got {runs}")
    if warmup < 0:
        raise CliError(f"--warmup: expected >= 0, got {warmup}")
    if batch < 1:
        raise CliError(f"--batch: expected >= 1, got {batch}")
    if threads < 0:
        raise CliError(f"--threads: expected >= 0 (0: all cores), got {threads}")
    n_threads = resolve_threads(threads)
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = n_threads
    sess = quanta.InferenceSession(str(model), sess_options=opts, backend=backend)
    guessed: list[str] = []
    if feeds is None:
        feeds = random_feeds(sess, seed=seed, batch=batch, dims=dims)
        guessed = defaulted_dims(sess, dims)
    if guessed:  # sizes of 1 the model may not take (a pooling window larger than the image)
        try:
            sess.run(None, feeds)
        except Exception as e:
            sizes = " ".join(f"--dim {n}=SIZE" for n in guessed)
            raise CliError(
                f"{model}: the generated inputs set the symbolic dimension(s) {', '.join(guessed)} to 1 "
                f"and the model does not run at that size ({e}); give real sizes: {sizes}"
            ) from e
    ort_sess = None
    ort_error = ""
    if vs_ort:
        ort_sess, ort_error = _ort_session(str(model), n_threads)

    for _ in range(warmup):
        sess.run(None, feeds)
        if ort_sess is not None:
            ort_sess.run(None, feeds)
    q_times: list[float] = []
    o_times: list[float] = []
    clock = time.perf_counter
    for _ in range(runs):
        t0 = clock()
        q_out = sess.run(None, feeds)
        q_times.append((clock() - t0) * 1e3)
        if ort_sess is not None:
            t0 = clock()
            o_out = ort_sess.run(None, feeds)
            o_times.append((clock() - t0) * 1e3)

    # one instrumented run first, not counted: the instrumented path binds its steps on
    # its first run, and that one-time work averaged into 20 runs of a model of tens of
    # microseconds made one step look like the whole run
    sess.executor.profiler = Profiler(sess.plan)
    try:
        sess.run(None, feeds)
    finally:
        sess.executor.profiler = None
    profiler = Profiler(sess.plan)
    sess.executor.profiler = profiler
    try:
        for _ in range(min(runs, PROFILE_RUNS)):
            sess.run(None, feeds)
    finally:
        sess.executor.profiler = None

    from quanta.runtime.static_steps import signature_static_steps

    static = signature_static_steps(sess.plan)
    result = BenchResult(
        model=str(model),
        backend=backend,
        threads=n_threads,
        batch=batch,
        warmup=warmup,
        runs=runs,
        inputs={k: (tuple(v.shape), str(v.dtype)) for k, v in feeds.items()},
        quanta=Latency(f"quanta ({backend})", q_times),
        ort_error=ort_error,
        profile=profiler.summary(top),
        n_steps=sess.plan.total_steps,
        fallbacks=sess.fallbacks,
        static_fallbacks=sum(1 for i in static if sess.plan.steps[i].kernel.fallback),
        reference_steps=reference_steps(sess.plan),
        tuning=sess.tuning,
    )
    if ort_sess is not None:
        import onnxruntime

        result.ort = Latency(f"onnxruntime {onnxruntime.__version__}", o_times)
        from quanta.quantize.ort_saturation import file_note

        result.ort_note = file_note(model)
        names = [o.name for o in sess.get_outputs()]
        for name, a, b in zip(names, q_out, o_out):
            a, b = np.asarray(a), np.asarray(b)
            if a.shape != b.shape or a.dtype.kind not in "fiub":
                result.agreement[name] = float("nan")
            else:
                diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
                result.agreement[name] = float(np.max(diff)) if diff.size else 0.0
    return result


def reference_steps(plan) -> list[tuple[str, str, str]]:
    """(op type, node name, reason) of the steps of ``plan`` that run a NumPy reference
    twin in every run: its fallbacks less the signature-static ones, which the executor
    runs once per input shape (runtime/static_steps.py)."""
    from quanta.runtime.static_steps import signature_static_steps

    static = signature_static_steps(plan)
    return [
        (s.op_type, s.name, s.kernel.fallback)
        for s in plan.steps
        if s.kernel.fallback and s.index not in static
    ]


def _ort_session(path: str, threads: int):
    """An ONNX Runtime session as the comparison uses it, or (None, why not)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None, "onnxruntime is not installed (pip install onnxruntime)"
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    try:
        return ort.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"]), ""
    except Exception as e:  # ORT raises its own exception types for models it cannot load
        return None, f"onnxruntime cannot load the model: {str(e).splitlines()[0]}"


def format_result(r: BenchResult) -> str:
    threads = f"{r.threads} thread{'s' if r.threads != 1 else ''}"
    lines = [
        f"quanta bench {r.model}: batch {r.batch}, {threads}, {r.warmup} warm-up + {r.runs} timed runs"
        + (" (interleaved with onnxruntime)" if r.ort is not None else ""),
        "inputs: " + ", ".join(f"{k}{list(shape)} {dtype}" for k, (shape, dtype) in r.inputs.items()),
    ]
    rows = [("", "median ms", "p90 ms")]
    rows.append((r.quanta.engine, f"{r.quanta.median:.3f}", f"{r.quanta.p90:.3f}"))
    if r.ort is not None:
        rows.append((r.ort.engine, f"{r.ort.median:.3f}", f"{r.ort.p90:.3f}"))
        rows.append(
            (
                "ratio quanta/onnxruntime",
                f"{r.quanta.median / r.ort.median:.2f}x",
                f"{r.quanta.p90 / r.ort.p90:.2f}x",
            )
        )
    w0 = max(len(row[0]) for row in rows)
    w1 = max(len(row[1]) for row in rows)
    w2 = max(len(row[2]) for row in rows)
    for row in rows:
        lines.append(f"  {row[0]:<{w0}}  {row[1]:>{w1}}  {row[2]:>{w2}}")
    if r.ort_error:
        lines.append(f"onnxruntime: {r.ort_error}")
    if r.agreement:
        parts = []
        for name, d in r.agreement.items():
            parts.append(f"{name} {d:.3g}")
        lines.append("outputs: max |quanta - onnxruntime| " + ", ".join(parts))
        if r.ort_note:
            lines.append(f"  note: {r.ort_note}")
    if r.backend == "native":
        line = f"fallbacks: {len(r.fallbacks)} of {r.n_steps} steps ran on reference kernels"
        if r.static_fallbacks:
            line += f" ({r.static_fallbacks} of them once per input shape: signature-static)"
        lines.append(line)
        for op, name, reason in r.reference_steps:
            lines.append(f"  reference:{op} {name}: {reason}")
    lines.append(str(r.profile))
    if r.backend == "native":
        lines.append(
            str(r.tuning)
            if r.tuning is not None
            else "tuner: off (SessionOptions.enable_tuning, QUANTA_TUNE=0)"
        )
    return "\n".join(lines)


def run_bench(args: argparse.Namespace) -> int:
    """The ``bench`` subcommand (parsed in quanta.cli.main)."""
    from quanta.cli.main import CliError, _load_npz, parse_dims

    if not Path(args.model).is_file():
        raise CliError(f"{args.model}: no such file")
    result = bench_model(
        args.model,
        dims=parse_dims(args.dim),
        feeds=_load_npz(args.feeds) if args.feeds else None,
        backend=args.backend,
        threads=args.threads,
        batch=args.batch,
        warmup=args.warmup,
        runs=args.runs,
        vs_ort=args.vs_ort,
    )
    print(format_result(result))
    return 0
