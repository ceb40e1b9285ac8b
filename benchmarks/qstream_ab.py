"""int8 GEMM with few rows against ONNX Runtime (issue 12): models of the shape ORT's
quantize_dynamic writes (DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul), quanta vs
ORT interleaved in one process, 1 thread, calling-thread CPU time, medians.

Each model holds ``copies`` different weights of one K x N shape read by one quantized
input, so that, as in a model, a weight is not in L2 when its MatMul starts (t5_enc_int8's
56 weights are 19 MB). ``--mix t5`` is t5's eight blocks of q, k, v, o, wi_0, wi_1, wo.

    python benchmarks/qstream_ab.py --rows 16 --shapes 512x384,512x1024,1024x512
    python benchmarks/qstream_ab.py --rows 16 --mix t5

To compare two builds, run it alternately with each on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import quanta

T5_BLOCK = [(512, 384)] * 3 + [(384, 512), (512, 1024), (512, 1024), (1024, 512)]


def build(shapes: list[tuple[int, int]], rows: int, seed: int = 0) -> bytes:
    """One float input per distinct K, quantized once (DynamicQuantizeLinear); one
    MatMulInteger -> Cast -> Mul chain per weight, each its own output."""
    rng = np.random.default_rng(seed)
    nodes, inits, outs = [], [], []
    ks = sorted({k for k, _ in shapes})
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [rows, k]) for k in ks]
    for k in ks:
        nodes.append(helper.make_node("DynamicQuantizeLinear", [f"x{k}"], [f"q{k}", f"s{k}", f"z{k}"]))
    for i, (k, n) in enumerate(shapes):
        w = rng.integers(-127, 128, size=(k, n), dtype=np.int8)
        inits += [
            numpy_helper.from_array(w, f"w{i}"),
            numpy_helper.from_array(np.array(0, np.int8), f"wz{i}"),
            numpy_helper.from_array(np.array(0.01 + 0.001 * (i % 7), np.float32), f"ws{i}"),
        ]
        nodes += [
            helper.make_node("MatMulInteger", [f"q{k}", f"w{i}", f"z{k}", f"wz{i}"], [f"acc{i}"]),
            helper.make_node("Cast", [f"acc{i}"], [f"f{i}"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [f"s{k}", f"ws{i}"], [f"sc{i}"]),
            helper.make_node("Mul", [f"f{i}", f"sc{i}"], [f"y{i}"]),
        ]
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [rows, n]))
    g = helper.make_graph(nodes, "qstream", inputs, outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return bytes(m.SerializeToString())


def measure(model: bytes, feed: dict, rounds: int, per: int) -> dict[str, float]:
    qo = quanta.SessionOptions()
    qo.intra_op_num_threads = 1
    o = ort.SessionOptions()
    o.intra_op_num_threads = 1
    o.log_severity_level = 3
    sess = {"quanta": quanta.InferenceSession(model, sess_options=qo), "ort": ort.InferenceSession(model, o)}
    ya, yb = (s.run(None, feed) for s in sess.values())
    err = max(float(np.max(np.abs(a - b))) for a, b in zip(ya, yb))
    times: dict[str, list[float]] = {k: [] for k in sess}
    for _ in range(rounds):
        for k, s in sess.items():
            s.run(None, feed)
            for _ in range(per):
                t = time.thread_time()
                s.run(None, feed)
                times[k].append(time.thread_time() - t)
    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    med["ratio"] = med["quanta"] / med["ort"]
    med["max_abs_diff"] = err
    return med


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="16")
    ap.add_argument("--shapes", default="512x384,512x1024,1024x512")
    ap.add_argument("--mix", choices=["t5"], default=None)
    ap.add_argument("--weight-mb", type=float, default=16.0, help="weights per shape model")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--per", type=int, default=5)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    rng = np.random.default_rng(1)
    for rows in (int(r) for r in a.rows.split(",")):
        cases: list[tuple[str, list[tuple[int, int]]]] = []
        if a.mix == "t5":
            cases.append(("t5 mix (56 weights, 19 MB)", T5_BLOCK * 8))
        else:
            for s in a.shapes.split(","):
                k, n = (int(v) for v in s.split("x"))
                copies = max(1, int(a.weight_mb * 2**20 / (k * n)))
                cases.append((f"{k}x{n} x{copies}", [(k, n)] * copies))
        for name, shapes in cases:
            feed = {
                f"x{k}": rng.standard_normal((rows, k)).astype(np.float32) for k in {k for k, _ in shapes}
            }
            r = measure(build(shapes, rows), feed, a.rounds, a.per)
            r_per = {k: round(v / len(shapes) * 1e3, 2) for k, v in r.items() if k in ("quanta", "ort")}
            print(
                json.dumps(
                    {
                        "label": a.label,
                        "M": rows,
                        "case": name,
                        "quanta_ms": round(r["quanta"], 3),
                        "ort_ms": round(r["ort"], 3),
                        "ratio": round(r["ratio"], 3),
                        "per_op_us": r_per,
                        "max_abs_diff": r["max_abs_diff"],
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
