"""Memory of a session, quanta against ONNX Runtime, on the zoo's files: what an engine
costs a process that runs a model (its imports, the session, the run's peak), and what one
more session of the same file adds, each engine measured in a fresh process of its own.

    python benchmarks/memory.py --run ~/.cache/quanta-zoo/runs/<run> --models ppocr_cls,yunet
    python benchmarks/memory.py --models ppocr_cls --configs fp32      # the FP32 files

Each measurement is one child process that loads the feed (written by the parent as .npz)
with NumPy alone, notes its resident set, then imports the engine, creates a session and
runs it ``--runs`` times: ``process`` is the high-water mark over that start (imports,
session and the run's peak: what a user's process pays). Then the kernel's high-water
mark is reset (``/proc/self/clear_refs`` ``5``) and a second session of the same file is
created and run: ``session`` is its peak over the resident set before it (what one more
model costs once the library is loaded), ``held`` what it still holds after its runs. Linux only. Memory, unlike time, does not depend
on the machine's load: one process an engine and file is enough.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent / "zoo"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoodata
from int8_latency import eval_feed, model_files

_CHILD = r"""
import json
import numpy as np

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)

with np.load({feed!r}) as f:
    feed = {{k: f[k] for k in f.files}}

def session():
    if {engine!r} == "quanta":
        import quanta
        so = quanta.SessionOptions()
        so.intra_op_num_threads = {threads}
        return quanta.InferenceSession({path!r}, so)
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = {threads}
    so.log_severity_level = 3
    return ort.InferenceSession({path!r}, so, providers=["CPUExecutionProvider"])

start = status("VmRSS")
s = session()
for _ in range({runs}):
    s.run(None, feed)
process = status("VmHWM") - start
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets VmHWM to the current resident set
before = status("VmRSS")
s2 = session()
for _ in range({runs}):
    s2.run(None, feed)
print(json.dumps({{"process": process, "session": status("VmHWM") - before, "held": status("VmRSS") - before}}))
"""


def measure(engine: str, path: Path, feed: Path, runs: int, threads: int) -> dict[str, int]:
    """``engine``'s cost on ``path`` in a child process, in bytes: the process's high-water
    mark over its start once the engine is imported and a session created and run
    (``process``), and a second session's peak (``session``)."""
    code = _CHILD.format(feed=str(feed), engine=engine, path=str(path), runs=runs, threads=threads)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{engine} on {path}: {tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="append", default=[], help="folder of quantized files (repeatable)")
    ap.add_argument("--models", required=True)
    ap.add_argument("--configs", default="quanta,ort_minmax", help="file configs; 'fp32' is the zoo's model")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    cache = zoodata.cache_dir()
    manifest = {m["name"]: m for m in json.loads((cache / "manifest.json").read_text())["models"]}
    mb = 1 / 2**20
    rows = []
    tmp = tempfile.TemporaryDirectory(prefix="quanta-memory-")
    print(
        "| model | file | size MB | q process MB | ORT process MB | q/ORT process "
        "| q session MB | ORT session MB | q/ORT session | q held MB | ORT held MB | q/ORT held |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.models.split(","):
        entry = manifest[name]
        base = entry.get("source", name)
        files = model_files(name, entry, cache, args.run, args.configs.split(","))
        feed_path = Path(tmp.name) / f"{name}.npz"
        np.savez(feed_path, **eval_feed(base, entry["kind"], cache))
        for config, path in files:
            try:
                q = measure("quanta", path, feed_path, args.runs, args.threads)
                o = measure("ort", path, feed_path, args.runs, args.threads)
            except Exception as e:  # one file's failure does not end the table
                print(f"| {name} | {config} | {type(e).__name__}: {str(e)[:120]} |", flush=True)
                continue
            size = path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*"))
            rows.append(
                {"model": name, "config": config, "path": str(path), "size": size, "quanta": q, "ort": o}
            )
            print(
                f"| {name} | {config} | {size * mb:.1f} | {q['process'] * mb:.1f} | {o['process'] * mb:.1f} "
                f"| {q['process'] / max(o['process'], 1):.2f} | {q['session'] * mb:.1f} | {o['session'] * mb:.1f} "
                f"| {q['session'] / max(o['session'], 1):.2f} | {q['held'] * mb:.1f} | {o['held'] * mb:.1f} "
                f"| {q['held'] / max(o['held'], 1):.2f} |",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
