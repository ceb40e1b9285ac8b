"""Files ORT's quantizer wrote under quanta's default session, with and without ONNX
Runtime's float orders (``quanta.session.AUTO_FLOAT_ORDERS``: MlasConv, MlasMatMul,
MlasPool), against ORT's default session.

    python benchmarks/ort_orders.py OUT.json [NAMES ...] [--orders conv,matmul,pool] [--reps 11]
    python benchmarks/ort_orders.py OUT.json --orders ""        # "auto" without the orders

Per file (zoo manifest names; default: the files of issue 11): feeds bit-identical, max
|quanta − ORT| over every output and ``zoo.lsb_distance`` on the first 8 evaluation feeds,
then the time per run of the first feed, quanta / ORT interleaved run by run (a 50 ms
pause before each), medians of ``--reps``: wall time and process CPU time (both engines at
their default thread counts, the machine's cores). docs/float-ops.md, "Which of ORT's float
orders "auto" takes", has the tables this writes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo
from _timing import SPIN_SETTLE_S

ISSUE_11 = [
    "nudenet_320n.ort_qdq",
    "nudenet_320n.ort_qdq_pc_sym",
    "ppocr_cls.ort_qdq_u16",
    "g2pid_bert.ort_dynamic",
    "ppocr_rec.ort_dynamic",
    "effword_resnet50_qint8",
    "g2pid_tiny.ort_dynamic",
]


def distance(m: zoo.Model, got_ort: list, got_q: list) -> dict:
    """Feeds identical, max abs over every output, and the LSB distance (None: no step)."""
    same = sum(
        all(np.array_equal(x, y) for x, y in zip(fo, fq, strict=True))
        for fo, fq in zip(got_ort, got_q, strict=True)
    )
    diffs = [
        float(np.max(np.abs(x.astype(np.float64) - y)))
        for fo, fq in zip(got_ort, got_q, strict=True)
        for x, y in zip(fo, fq, strict=True)
        if x.size
    ]
    return {
        "identical": f"{same}/{len(got_ort)}",
        "max_abs": max(diffs, default=0.0),
        "lsb": zoo.lsb_distance(m, m.path, got_ort, got_q).get("q_vs_ort_lsb"),
    }


def timed(sessions: dict, feed: dict, reps: int) -> dict:
    """Median wall and process-CPU seconds per run of each session, interleaved."""
    for s in sessions.values():
        s.run(None, feed)
        s.run(None, feed)
    wall: dict[str, list[float]] = {k: [] for k in sessions}
    cpu: dict[str, list[float]] = {k: [] for k in sessions}
    for _ in range(reps):
        for k, s in sessions.items():
            time.sleep(SPIN_SETTLE_S)  # both thread pools spin after a run: let them settle
            w, c = time.perf_counter(), time.process_time()
            s.run(None, feed)
            wall[k].append(time.perf_counter() - w)
            cpu[k].append(time.process_time() - c)
    return {k: (float(np.median(wall[k])), float(np.median(cpu[k]))) for k in sessions}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("names", nargs="*", default=ISSUE_11)
    ap.add_argument("--orders", default=None, help="AUTO_FLOAT_ORDERS, comma-separated ('' for none)")
    ap.add_argument("--reps", type=int, default=11)
    args = ap.parse_args(argv)
    if args.orders is not None:
        import quanta.session

        quanta.session.AUTO_FLOAT_ORDERS = frozenset(o for o in args.orders.split(",") if o)
    cache = zoo.zoodata.cache_dir()
    manifest = {e["name"]: e for e in json.loads((cache / "manifest.json").read_text())["models"]}
    rows = {}
    for name in args.names:
        m = zoo.Model(manifest[name], cache)
        m.eval = m.eval[:8]
        ort_sess, q_sess = zoo.ort_session(m.path), zoo.quanta_session(m.path)
        row = distance(m, zoo.run_all(ort_sess, m.eval), zoo.run_all(q_sess, m.eval))
        t = timed({"ort": ort_sess, "quanta": q_sess}, m.eval[0], args.reps)
        row.update(
            ort_ms=1e3 * t["ort"][0],
            quanta_ms=1e3 * t["quanta"][0],
            wall_ratio=t["quanta"][0] / t["ort"][0],
            cpu_ratio=t["quanta"][1] / t["ort"][1],
        )
        rows[name] = row
        print(name, json.dumps(row), flush=True)
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
