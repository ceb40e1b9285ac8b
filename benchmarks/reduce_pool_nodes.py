"""One-node float32 reductions and pools at the zoo's shapes: quanta against ONNX Runtime,
1 thread, thread CPU time per run, the two sessions alternating in rounds (medians).

    python benchmarks/reduce_pool_nodes.py [--rounds 7]

The shapes are the zoo nodes node_gap.py found slow: magika's LayerNorm sums ([8, 512,
256] over axis 1) and GlobalMaxPool ([8, 512, 508]), all-MiniLM's mean pooling ([1, 128,
384] over axis 1), the beats TCN's time mean ([600, 1, 16] over axis 0) and its [1, 3]
stride [1, 3] MaxPools, and VGG's 2 x 2 stride 2 pool.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import ModelProto, TensorProto, helper

import quanta


def one_node(op: str, shape: tuple[int, ...], attrs: dict, axes: list[int] | None = None) -> ModelProto:
    inputs, inits = ["x"], []
    if axes is not None:
        inputs.append("axes")
        inits = [helper.make_tensor("axes", TensorProto.INT64, [len(axes)], axes)]
    graph = helper.make_graph(
        [helper.make_node(op, inputs, ["y"], **attrs)],
        op,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


CASES: list[tuple[str, str, tuple[int, ...], dict, list[int] | None]] = [
    ("magika LayerNorm sum", "ReduceSum", (8, 512, 256), {"keepdims": 0}, [1]),
    ("MiniLM mean pooling sum", "ReduceSum", (1, 128, 384), {"keepdims": 0}, [1]),
    ("beats TCN time mean", "ReduceMean", (600, 1, 16), {"keepdims": 0}, [0]),
    ("magika GlobalMaxPool", "GlobalMaxPool", (8, 512, 508), {}, None),
    ("beats max_pool_15", "MaxPool", (1, 16, 602, 79), {"kernel_shape": [1, 3], "strides": [1, 3]}, None),
    ("beats max_pool_32", "MaxPool", (1, 16, 600, 24), {"kernel_shape": [1, 3], "strides": [1, 3]}, None),
    ("VGG 2x2 s2", "MaxPool", (1, 64, 112, 112), {"kernel_shape": [2, 2], "strides": [2, 2]}, None),
    (
        "[1, 5] stride [1, 5]",
        "MaxPool",
        (1, 64, 56, 56),
        {"kernel_shape": [1, 5], "strides": [1, 5]},
        None,
    ),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    print("| node | shape | quanta us | ORT us | q/ORT |\n|---|---|---|---|---|")
    for name, op, shape, attrs, axes in CASES:
        model = one_node(op, shape, attrs, axes).SerializeToString()
        so = quanta.SessionOptions()
        so.intra_op_num_threads = 1
        q = quanta.InferenceSession(model, sess_options=so)
        oso = ort.SessionOptions()
        oso.intra_op_num_threads = 1
        o = ort.InferenceSession(model, oso, providers=["CPUExecutionProvider"])
        feed = {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
        reps = 50 if np.prod(shape) < 1e6 else 10
        times: dict[str, list[float]] = {"q": [], "o": []}
        for _ in range(2):
            q.run(None, feed)
            o.run(None, feed)
        for _ in range(args.rounds):
            for key, sess in (("q", q), ("o", o)):
                t = time.thread_time()
                for _ in range(reps):
                    sess.run(None, feed)
                times[key].append((time.thread_time() - t) / reps * 1e6)
        ratio = float(np.median(np.array(times["q"]) / np.array(times["o"])))
        tq, to = float(np.median(times["q"])), float(np.median(times["o"]))
        print(f"| {name} | {list(shape)} | {tq:.1f} | {to:.1f} | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
