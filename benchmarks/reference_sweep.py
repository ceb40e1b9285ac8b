"""Every step of every given model that runs on a NumPy reference twin, with its share of
the run: the zoo-wide form of ``quanta bench``'s "reference:" lines.

    python benchmarks/reference_sweep.py ~/.cache/quanta-zoo/models /tmp/zoo/run
    python benchmarks/reference_sweep.py model.onnx --json sweep.jsonl

Arguments are .onnx files or folders (searched one level deep). Each file runs in a
native session at one thread with the profiler on, fed by ``zoodata``'s evaluation feeds
for the zoo model its name starts with (``tesseranet_3x3.ort_minmax.onnx`` ->
``tesseranet_3x3``), else by random inputs of the declared shapes (symbolic dimensions
1). Printed per file with a fallback: the plan's fallbacks (signature-static ones, which
run once per input shape and not in a timed run, marked so), and for the steps that ran
the median time per run and the share of the profiled run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent / "zoo"))

import fp32_latency
import zoodata

import quanta
from quanta.cli.bench import reference_steps


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
    zoo = {s.name for s in zoodata.SPECS}
    stem = path.name.split(".")[0] if path.parent.name not in zoo else path.parent.name
    if stem in zoo:
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
        if "int" in i.type:
            feed[i.name] = rng.integers(0, 5, shape).astype(np.int64 if "64" in i.type else np.int32)
        elif "bool" in i.type:
            feed[i.name] = np.ones(shape, bool)
        else:
            feed[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feed, "random"


def sweep(path: Path, runs: int) -> dict:
    rec: dict = {"file": str(path)}
    try:
        so = quanta.SessionOptions()
        so.intra_op_num_threads = 1
        sess = quanta.InferenceSession(str(path), sess_options=so, enable_profiling=True)
        every_run = {name for _, name, _ in reference_steps(sess.plan)}
        rec["fallbacks"] = [
            {"node": n, "op": op, "reason": why, "every_run": n in every_run} for n, op, why in sess.fallbacks
        ]
        if sess.fallbacks:
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
    except Exception as e:  # one file that does not load or run must not end the sweep
        rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help=".onnx files or folders")
    ap.add_argument("--runs", type=int, default=5, help="profiled runs per file")
    ap.add_argument("--json", help="also write one JSON record per file to this file")
    a = ap.parse_args(argv)
    out = open(a.json, "w") if a.json else None
    files = model_files(a.paths)
    with_fallbacks = 0
    for path in files:
        rec = sweep(path, a.runs)
        if out:
            out.write(json.dumps(rec) + "\n")
            out.flush()
        if "error" in rec:
            print(f"{path}: {rec['error']}", flush=True)
            continue
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
