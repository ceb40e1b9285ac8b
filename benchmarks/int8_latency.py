"""One latency table for already-quantized zoo files: quanta / ONNX Runtime, 1 and 2
threads, and quanta's 2 threads / its 1 thread, all four sessions of a file timed in one
process in interleaved blocks (medians of the blocks' medians).

    python benchmarks/int8_latency.py --run ~/.cache/quanta-zoo/runs/<run> --models ppocr_cls,ddddocr
    python benchmarks/int8_latency.py --run ~/.cache/quanta-zoo/models --models nudenet_320n \
        --configs ort_qdq --float-functions ort     # ORT's float Conv order (quanta::MlasConv)

Each file ``<model>.<config>.onnx`` of ``--run`` (configs ``quanta`` and ``ort_minmax``
unless ``--configs`` says otherwise) and each shipped-quantized model named is timed on
one evaluation feed of the model (``zoo/zoodata.py``). Besides the wall-clock medians the
table gives quanta's and ORT's caller-thread CPU time at 1 thread (``time.thread_time``),
which preemption by the other processes on the machine does not inflate.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent / "zoo"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoodata
from _timing import SPIN_SETTLE_S

Feed = dict[str, np.ndarray]


def eval_feed(name: str, kind: str, cache: Path) -> Feed:
    if kind == "vad":
        from zoo import ort_session

        ref = ort_session(cache / "models" / f"{name}.onnx")
        return zoodata.vad_stream(ref, zoodata.clips("eval", 1)[0])[0][3]
    if kind == "embedding":
        return zoodata.token_feeds(cache / "models" / "minilm_vocab.txt", "eval", 1)[0]
    # zoodata's table: text, audio, graph, the later batches' own feeds, or image
    return zoodata.feeds(name, "eval", 1, cache)[0]


def model_files(
    name: str, entry: dict, cache: Path, runs: list[str], configs: list[str]
) -> list[tuple[str, Path]]:
    """The files of zoo model ``name`` to measure, as (config, path): a model shipped
    quantized (or made by another tool) as it is; else ``<name>.<config>.onnx`` from the
    last of ``runs`` that has it, and for config ``fp32`` the zoo's float model."""
    from zoo import SHIPPED_QUANTIZED

    if entry.get("made_by") or entry.get("source") or name in SHIPPED_QUANTIZED:
        return [("as shipped", cache / entry["path"])]
    files = []
    for config in configs:
        if config == "fp32":
            files.append((config, cache / entry["path"]))
            continue
        found = [p for p in (Path(r).expanduser() / f"{name}.{config}.onnx" for r in runs) if p.exists()]
        if found:
            files.append((config, found[-1]))
    return files


def time_file(
    path: Path,
    feed: Feed,
    rounds: int,
    per_round: int,
    float_functions: str = "auto",
    thread_counts: tuple[int, ...] = (1, 2),
) -> dict[str, float]:
    import onnxruntime as ort

    import quanta

    sessions = {}
    for threads in thread_counts:
        so = quanta.SessionOptions(float_functions=float_functions)
        so.intra_op_num_threads = threads
        sessions[f"q{threads}"] = quanta.InferenceSession(str(path), so)
        oso = ort.SessionOptions()
        oso.intra_op_num_threads = threads
        oso.log_severity_level = 3
        sessions[f"o{threads}"] = ort.InferenceSession(str(path), oso, providers=["CPUExecutionProvider"])
    wall: dict[str, list[float]] = {k: [] for k in sessions}
    cpu: dict[str, list[float]] = {k: [] for k in sessions}
    from quanta.kernels import _native

    # quanta's pool runs a job on the caller alone while it backs off from contention
    # (docs/kernels.md, "Threads"): the share of the 2-thread jobs it did so says whether
    # a 2-thread row measured two threads at all.
    jobs = solo = backoffs = 0
    for s in sessions.values():
        for _ in range(3):
            s.run(None, feed)
    for _ in range(rounds):
        for k, s in sessions.items():
            time.sleep(SPIN_SETTLE_S)  # the other library's spinning pool goes idle
            w, c = [], []
            before = _native.pool_stats()
            for _ in range(per_round):
                t, tc = time.perf_counter(), time.thread_time()
                s.run(None, feed)
                w.append(time.perf_counter() - t)
                c.append(time.thread_time() - tc)
            wall[k].append(float(np.median(w)))
            cpu[k].append(float(np.median(c)))
            if k == "q2":
                after = _native.pool_stats()
                jobs += after["jobs"] - before["jobs"]
                solo += after["solo_jobs"] - before["solo_jobs"]
                backoffs += after["backoffs"] - before["backoffs"]
    out = {f"{k}_ms": 1e3 * float(np.median(v)) for k, v in wall.items()}
    out.update({f"{k}_cpu_ms": 1e3 * float(np.median(v)) for k, v in cpu.items()})
    out["q2_solo_share"] = solo / jobs if jobs else 0.0
    out["q2_backoffs"] = float(backoffs)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="append", default=[], help="folder of quantized files (repeatable)")
    ap.add_argument("--models", required=True)
    ap.add_argument("--configs", default="quanta,ort_minmax")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--per-round", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument(
        "--threads",
        default="1,2",
        choices=("1,2", "1"),
        help="'1': the 1-thread sessions alone (the 2-thread columns read '-'), half the time on a busy machine",
    )
    ap.add_argument(
        "--float-functions",
        default="auto",
        choices=("auto", "onnx", "ort"),
        help="quanta's SessionOptions.float_functions ('ort': ORT's float order, MlasConv included, docs/float-ops.md)",
    )
    args = ap.parse_args(argv)
    cache = zoodata.cache_dir()
    manifest = {m["name"]: m for m in json.loads((cache / "manifest.json").read_text())["models"]}
    rows = []
    print(
        "| model | file | q 1t ms | ORT 1t ms | q/ORT 1t | q 2t ms | ORT 2t ms | q/ORT 2t | q2t/q1t | q/ORT 1t CPU | q 2t solo jobs |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    thread_counts = tuple(int(t) for t in args.threads.split(","))
    for name in args.models.split(","):
        entry = manifest[name]
        base = entry.get("source", name)
        files = model_files(name, entry, cache, args.run, args.configs.split(","))
        feed = eval_feed(base, entry["kind"], cache)
        for config, path in files:
            try:
                t = time_file(path, feed, args.rounds, args.per_round, args.float_functions, thread_counts)
            except Exception as e:  # one file's failure does not end the table
                print(f"| {name} | {config} | {type(e).__name__}: {str(e)[:100]} |", flush=True)
                continue
            row = {"model": name, "config": config, "path": str(path), **t}
            rows.append(row)
            two = (
                f"| {t['q2_ms']:.3f} | {t['o2_ms']:.3f} | {t['q2_ms'] / t['o2_ms']:.2f} | {t['q2_ms'] / t['q1_ms']:.2f} "
                if "q2_ms" in t
                else "| - | - | - | - "
            )
            print(
                f"| {name} | {config} | {t['q1_ms']:.3f} | {t['o1_ms']:.3f} | {t['q1_ms'] / t['o1_ms']:.2f} "
                + two
                + f"| {t['q1_cpu_ms'] / t['o1_cpu_ms']:.2f} "
                f"| {100 * t['q2_solo_share']:.0f} % ({t['q2_backoffs']:.0f} back-offs) |",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
