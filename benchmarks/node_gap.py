"""Where quanta's FP32 (or any) run of one file loses time to ONNX Runtime's, node by
node: both engines' profilers at 1 thread over the same feed, the time per run by
operator type, and the steps whose time exceeds ORT's time for the node of the same
name the most (ORT's fused or renamed nodes have no partner: their whole time shows).

    python benchmarks/node_gap.py ~/.cache/quanta-zoo/models/beats_tcn.onnx [--top 15]

The feed is zoodata's first evaluation feed of the zoo model the file belongs to
(``reference_sweep.feed_for``), else random inputs of the declared shapes. Profiled
times are wall clock on a shared machine: read them as sizes, and confirm a gain with
``fp32_latency.py`` or ``reference_sweep.py --all`` (thread CPU time, interleaved).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent / "zoo"))

import onnxruntime as ort
import reference_sweep
from _timing import ort_kernel_medians

import quanta
from quanta.runtime.profile import ProfileSummary, StepStat


def without_warmup(summary: ProfileSummary, before: dict[int, StepStat], warmup: int) -> ProfileSummary:
    """``summary`` of every profiled run less the first ``warmup`` runs, whose steps
    ``before`` holds (a summary taken after them): a first run's one-time work (packing,
    specializing, tuning) stays out of the per-run times."""
    runs = summary.runs - warmup
    steps = []
    for s in summary.steps:
        b = before.get(s.step)
        total = s.total_us - (b.total_us if b else 0.0)
        calls = s.calls - (b.calls if b else 0)
        steps.append(replace(s, total_us=total, calls=calls, mean_us=total / calls if calls else 0.0))
    all_us = sum(s.total_us for s in steps)
    steps = [replace(s, share=s.total_us / all_us if all_us else 0.0) for s in steps]
    per_run = all_us / runs if runs else 0.0
    return ProfileSummary(
        runs=runs,
        steps=sorted(steps, key=lambda s: -s.total_us),
        step_us_per_run=per_run,
        # the executor's time between steps, per run, as over all the profiled runs
        run_us_per_run=summary.overhead_us_per_run + per_run,
        n_steps=summary.n_steps,
    )


def quanta_step_medians(sess: quanta.InferenceSession) -> dict[str, float]:
    """Each quanta step's median time over the profiled runs (us, by node name; the
    trace is ORT's format, so ``ort_kernel_medians`` reads it): on a loaded machine a
    preempted run puts milliseconds into whichever step it hits, which a mean keeps."""
    med, _, _ = ort_kernel_medians(sess.end_profiling())
    return med


def profiles(
    path: Path, feed: dict[str, np.ndarray], runs: int, threads: int = 1, warmup: int = 2
) -> tuple[ProfileSummary, dict[str, float], dict[str, str]]:
    """Both engines' profiles of ``runs`` runs of ``path`` on ``feed`` (``threads``
    intra-op threads) after ``warmup`` runs: quanta's summary of every step, ORT's median
    kernel time per node (us) and each node's operator type
    (``_timing.ort_kernel_medians``)."""
    so = quanta.SessionOptions()
    so.intra_op_num_threads = threads
    so.profile_file_prefix = str(Path(tempfile.gettempdir()) / "node_gap_quanta")
    sess = quanta.InferenceSession(str(path), sess_options=so, enable_profiling=True)
    for _ in range(warmup):
        sess.run(None, feed)
    before = {s.step: s for s in sess.profile_summary(1 << 20).steps}
    for _ in range(runs):
        sess.run(None, feed)
    summary = without_warmup(sess.profile_summary(1 << 20), before, warmup)
    q_med = quanta_step_medians(sess)
    oso = ort.SessionOptions()
    oso.intra_op_num_threads = threads
    oso.log_severity_level = 3
    oso.enable_profiling = True
    oso.profile_file_prefix = str(Path(tempfile.gettempdir()) / "node_gap_ort")
    o = ort.InferenceSession(str(path), oso, providers=["CPUExecutionProvider"])
    for _ in range(runs):
        o.run(None, feed)
    ort_us, ops, _ = ort_kernel_medians(o.end_profiling())
    return summary, ort_us, ops, q_med


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--top", type=int, default=15, help="steps listed (default 15)")
    ap.add_argument("--runs", type=int, default=20, help="profiled runs per engine (default 20)")
    args = ap.parse_args(argv)
    path = Path(args.model).expanduser()
    so = quanta.SessionOptions()
    so.intra_op_num_threads = 1
    feed, source = reference_sweep.feed_for(path, quanta.InferenceSession(str(path), so))
    summary, ort_us, ops, _ = profiles(path, feed, args.runs)
    print(
        f"{path.name} (feed: {source}): quanta run {summary.run_us_per_run:.0f} us, "
        f"ORT's kernels {sum(ort_us.values()):.0f} us"
    )
    q_ops: dict[str, float] = {}
    o_ops: dict[str, float] = {}
    for s in summary.steps:
        q_ops[s.op_type] = q_ops.get(s.op_type, 0.0) + s.mean_us
    for n, us in ort_us.items():
        o_ops[ops[n]] = o_ops.get(ops[n], 0.0) + us
    for who, table in (("quanta", q_ops), ("ORT", o_ops)):
        top = sorted(table.items(), key=lambda kv: -kv[1])[:12]
        print(f"  by op, {who}: " + ", ".join(f"{k} {v:.0f}" for k, v in top))
    # ORT's NCHWc transform names a node after its first output: "<output>_nchwc"
    first_output = {
        n.name: n.output[0] for n in onnx.load(str(path), load_external_data=False).graph.node if n.output
    }
    rows = []
    for s in summary.steps:
        name = s.node.split(" ")[0]
        partner = ort_us.get(name, ort_us.get(f"{first_output.get(name)}_nchwc"))
        rows.append((s.mean_us - (partner or 0.0), s, partner))
    rows.sort(key=lambda r: -r[0])
    print(f"  {'excess us':>10}  {'node':58} {'op':16} {'kernel':36} {'quanta':>8} {'ORT':>8}")
    for excess, s, partner in rows[: args.top]:
        o_txt = "-" if partner is None else f"{partner:.1f}"
        print(
            f"  {excess:10.1f}  {s.node[:58]:58} {s.op_type[:16]:16} {s.kernel[:36]:36} {s.mean_us:8.1f} {o_txt:>8}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
