"""Where an int8 file's time goes in quanta and in ONNX Runtime, by class of operator,
and how much of quanta's excess over ORT is not in the integer Conv / GEMM kernels.

    python benchmarks/int8_gap.py --run /tmp/run --models ppocr_cls,ddddocr \\
        [--latency /tmp/lat.json] [--json /tmp/gap.json]

Per file (``int8_latency.model_files``: ``<model>.<config>.onnx`` of ``--run``, or the
shipped / tool-made file), both engines are profiled at 1 thread on the model's first
evaluation feed (``node_gap.profiles``), and each step's (node's) time goes to a class:

- ``gemm``: integer Conv / GEMM kernels (QLinearConv, QGemm, QLinearMatMul,
  MatMulInteger(ToFloat), ConvInteger, DynamicQuantizeMatMul and quanta's fused forms);
- ``rnn``: recurrent layers (LSTM, GRU, their dynamic int8 forms);
- ``fconv``: float Conv / ConvTranspose / MatMul / Gemm (float islands);
- ``rest``: everything else.

The shares come from the profiles, each step's (node's) median over the runs in both
engines (wall clock: a preempted run's milliseconds stay out of a median); the size of
the gap comes from quanta / ORT thread-CPU time at 1 thread, ``R`` (``--latency``: int8_latency.py's ``--json``; else the profiles' kernel sums). In
units of ORT's run time, with ``K`` = quanta's kernel time / ORT's (the medians' sums),
quanta's excess ``R - 1`` splits as

    excess_c       = K · q_c - o_c    (q_c, o_c: class c's share of each engine's kernel time)
    excess_between = R - K            (outside the kernels: the executor's time between steps)

summed over the classes. ``gemm`` and ``fconv`` are shown together (ORT runs as a float
Conv some convolutions quanta runs in integer, when their output is not quantized), and
``excess_rest`` ranks the files whose gap is not the AVX2 GEMM bound (docs/kernels.md
"AVX2"); the top quanta steps of the ``rest`` class and any ``numpy:`` / ``reference:``
kernel are listed for each file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "zoo"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import int8_latency
import node_gap
import zoodata

#: the classes of the module docstring, by operator type (both engines' names)
CLASSES = {
    "gemm": {
        "QLinearConv",
        "ConvInteger",
        "QLinearMatMul",
        "MatMulInteger",
        "QGemm",
        "MatMulIntegerToFloat",
        "DynamicQuantizeMatMul",
        "QLinearMatMulAdd",
        "NhwcQLinearConv",
        "QAttention",
        "MlasQLinearConv",
        "MatMulW4A8",
    },
    "rnn": {"LSTM", "GRU", "RNN", "DynamicQuantizeLSTM", "DynamicQuantizeGRU", "OrtLSTM", "OrtGRU"},
    "fconv": {
        "Conv",
        "ConvTranspose",
        "MatMul",
        "Gemm",
        "FusedConv",
        "FusedMatMul",
        "FusedGemm",
        "NchwcConv",
        "ConvNchwc",
        "MlasConv",
        "MlasMatMul",
        "MatMulBias",
        "MatMulW8",
        "MatMulBf16",
    },
}


def op_class(op_type: str) -> str:
    """The class of an operator type (a domain prefix ``x::`` ignored)."""
    op = op_type.rsplit("::", 1)[-1]
    return next((c for c, ops in CLASSES.items() if op in ops), "rest")


def gap(path: Path, feed: dict, runs: int, ratio: float | None) -> dict:
    """Both engines' time by class (share of each engine's run) and the split of
    quanta's excess (module docstring) for one file."""
    summary, ort_us, ops, q_med = node_gap.profiles(path, feed, runs)
    q = {c: 0.0 for c in (*CLASSES, "rest")}
    slow_rest: list[tuple[float, str]] = []
    twins = []
    q_ops: dict[str, float] = {}
    for s in summary.steps:
        us = q_med.get(s.node.split(" ")[0], s.mean_us)  # the median (node_gap.quanta_step_medians)
        c = op_class(s.op_type)
        q[c] += us
        q_ops[s.op_type] = q_ops.get(s.op_type, 0.0) + us
        if c == "rest":
            slow_rest.append((us, f"{s.op_type} {s.kernel}"))
        if s.kernel.startswith(("numpy:", "reference:")):
            twins.append(f"{s.kernel} {s.node[:40]}")
    o = {c: 0.0 for c in q}
    for n, us in ort_us.items():
        o[op_class(ops[n])] += us
    q_run, o_run = sum(q.values()), sum(o.values())
    k = q_run / o_run  # quanta's kernels / ORT's kernels
    r = ratio if ratio is not None else k
    q_share = {c: v / q_run for c, v in q.items()}
    o_share = {c: v / o_run for c, v in o.items()}
    excess = {c: k * q_share[c] - o_share[c] for c in q}
    excess["between"] = r - k  # time outside the kernels: the executor between steps
    # the top rest steps merged by operator and kernel
    merged: dict[str, float] = {}
    for us, key in slow_rest:
        merged[key] = merged.get(key, 0.0) + us
    top = sorted(merged.items(), key=lambda kv: -kv[1])[:4]
    o_ops: dict[str, float] = {}
    for n, us in ort_us.items():
        o_ops[ops[n]] = o_ops.get(ops[n], 0.0) + us
    return {
        "q_op_us": q_ops,
        "o_op_us": o_ops,
        "ratio": r,
        "ratio_from": "cpu" if ratio is not None else "profile",
        "q_share": q_share,
        "o_share": o_share,
        "excess": excess,
        "q_steps": summary.n_steps,
        "o_nodes": len(ort_us),
        "top_rest": [(k, us / q_run) for k, us in top],
        "twins": twins,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="append", default=[], help="folder of quantized files (repeatable)")
    ap.add_argument("--models", required=True)
    ap.add_argument("--configs", default="quanta,ort_minmax")
    ap.add_argument("--runs", type=int, default=20, help="profiled runs per engine (default 20)")
    ap.add_argument("--latency", action="append", default=[], help="int8_latency.py --json output(s): R")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    cache = zoodata.cache_dir()
    manifest = {m["name"]: m for m in json.loads((cache / "manifest.json").read_text())["models"]}
    cpu: dict[str, float] = {}
    for f in args.latency:
        for row in json.loads(Path(f).read_text()):
            cpu[row["path"]] = row["q1_cpu_ms"] / row["o1_cpu_ms"]
    print(
        "| model | file | q/ORT 1t | gemm q / ORT share | rnn q / ORT | float conv q / ORT | rest q / ORT "
        "| excess gemm + fconv | excess rnn | excess rest | excess between steps | top rest steps (share of quanta's run) |"
    )
    print("|---|---|---:|---|---|---|---|---:|---:|---:|---:|---|")
    rows = []
    for name in args.models.split(","):
        entry = manifest[name]
        base = entry.get("source", name)
        files = int8_latency.model_files(name, entry, cache, args.run, args.configs.split(","))
        feed = int8_latency.eval_feed(base, entry["kind"], cache)
        for config, path in files:
            try:
                g = gap(path, feed, args.runs, cpu.get(str(path)))
            except Exception as e:  # one file's failure does not end the table
                print(f"| {name} | {config} | {type(e).__name__}: {str(e)[:100]} |", flush=True)
                continue
            rows.append({"model": name, "config": config, "path": str(path), **g})
            qs, os_, ex = g["q_share"], g["o_share"], g["excess"]
            top = "; ".join(f"{k} {100 * v:.0f} %" for k, v in g["top_rest"])
            if g["twins"]:
                top += f"; TWINS: {', '.join(g['twins'][:3])}"
            print(
                f"| {name} | {config} | {g['ratio']:.2f}{'' if g['ratio_from'] == 'cpu' else ' (p)'} "
                + " ".join(
                    f"| {100 * qs[c]:.0f} / {100 * os_[c]:.0f} %" for c in ("gemm", "rnn", "fconv", "rest")
                )
                + f" | {ex['gemm'] + ex['fconv']:+.2f} | {ex['rnn']:+.2f} | {ex['rest']:+.2f} | {ex['between']:+.2f} | {top} |",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
