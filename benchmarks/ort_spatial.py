"""ONNX Runtime's float spatial orders on the native target: quanta::OrtResizeLinear and
quanta::MlasAveragePool on their C++ kernels (kernels/cpp/ort_spatial), against ONNX
Runtime's Resize / AveragePool node and, with ``--numpy FILE`` (a native binder module of
an earlier tree, e.g. ``git show REV:quanta/targets/native/ort_resize.py``), that tree's
NumPy binder code, all in one process, in interleaved rounds, 1 thread.

    python benchmarks/ort_spatial.py [--rounds 9] [--numpy-resize F] [--numpy-pool F]

Each case: every implementation runs 3 times per round, rounds interleaved; the table
gives medians (ms) and ratios to ORT, and checks that the C++ kernel's bytes equal the
twin's. ORT runs a one-node model (Mul -> op, the Mul outside the timing only as much as
its cost is small against the op's; its share is stated by the ``mul`` column) at its
default optimization level, as a session of the real model does (an AveragePool of C % 8
= 0 channels then runs as NCHWc, eq. (AP-M5))."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from quanta.kernels.reference.mlas_pool import mlas_average_pool
from quanta.kernels.reference.ort_resize import ort_resize_geometry, ort_resize_linear
from quanta.targets.native.mlas_pool import average_pool
from quanta.targets.native.ort_resize import resize_linear

F32 = np.float32

# (label, shape, scales) 2x bilinear half_pixel: the large Resize of issue 12 and the
# selfie segmenter's three decoder upsamples
RESIZES = [
    ("resize 2x [1,64,96,112]", (1, 64, 96, 112), (2.0, 2.0)),
    ("resize 2x [1,128,16,16] selfie", (1, 128, 16, 16), (2.0, 2.0)),
    ("resize 2x [1,24,32,32] selfie", (1, 24, 32, 32), (2.0, 2.0)),
    ("resize 2x [1,16,64,64] selfie", (1, 16, 64, 64), (2.0, 2.0)),
]
# (label, shape, kernel, strides, pads): the selfie segmenter's squeeze-excite means, a
# generic pool with pads, PaddleOCR's pool (the vector order at ORT_DISABLE_ALL, NCHWc at
# the default level)
POOLS = [
    ("pool 128x128 [1,16,128,128] selfie", (1, 16, 128, 128), (128, 128), (128, 128), (0, 0, 0, 0)),
    ("pool 64x64 [1,16,64,64] selfie", (1, 16, 64, 64), (64, 64), (64, 64), (0, 0, 0, 0)),
    ("pool 32x32 [1,24,32,32] selfie", (1, 24, 32, 32), (32, 32), (32, 32), (0, 0, 0, 0)),
    ("pool 16x16 [1,96,16,16] selfie", (1, 96, 16, 16), (16, 16), (16, 16), (0, 0, 0, 0)),
    ("pool 9x7/3x5 pads [1,17,37,41]", (1, 17, 37, 41), (9, 7), (3, 5), (2, 1, 3, 2)),
    ("pool 3x2/3x2 [1,480,3,80] ppocr", (1, 480, 3, 80), (3, 2), (3, 2), (0, 0, 0, 0)),
    ("pool 3x3/1x1 pads [1,7,56,56]", (1, 7, 56, 56), (3, 3), (1, 1), (1, 1, 1, 1)),
]


def _ort(node: Any, shape: tuple[int, ...], inits: list) -> Callable[[np.ndarray], Any]:
    inits = [numpy_helper.from_array(np.array([1.0], F32), "one"), *inits]
    nodes = [helper.make_node("Mul", ["x0", "one"], ["x"]), node]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x0", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return lambda x: s.run(None, {"x0": x})[0]


def _load(path: str | None, name: str) -> Callable[..., Any] | None:
    """``name`` from a binder module's source, its binder registration left out."""
    if not path:
        return None
    src = "\n".join(
        line for line in open(path).read().splitlines() if not line.startswith("@register_binder")
    )
    ns: dict[str, Any] = {"__name__": "numpy_binder"}
    exec(compile(src, path, "exec"), ns)
    return ns[name]


def _median_ms(fn: Callable[[], Any], times: list[float]) -> None:
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--numpy-resize", help="an earlier tree's targets/native/ort_resize.py")
    ap.add_argument("--numpy-pool", help="an earlier tree's targets/native/mlas_pool.py")
    a = ap.parse_args()
    np_resize, np_pool = _load(a.numpy_resize, "resize_linear"), _load(a.numpy_pool, "average_pool")
    rng = np.random.default_rng(0)
    cases: list[tuple[str, dict[str, Callable[[], Any]], np.ndarray]] = []
    for label, shape, (sh, sw) in RESIZES:
        x = rng.standard_normal(shape).astype(F32)
        s_h, s_w, n_h, n_w = ort_resize_geometry(shape, [sh, sw], [0, 0])
        want = ort_resize_linear(x, s_h, s_w, n_h, n_w, "half_pixel")
        node = helper.make_node("Resize", ["x", "roi", "s"], ["y"], mode="linear")
        inits = [
            numpy_helper.from_array(np.array([], F32), "roi"),
            numpy_helper.from_array(np.array([1, 1, sh, sw], F32), "s"),
        ]
        run_ort = _ort(node, shape, inits)
        impls = {
            "ort": lambda r=run_ort, x=x: r(x),
            "cpp": lambda x=x, g=(s_h, s_w, n_h, n_w): resize_linear(x, *g, "half_pixel"),
        }
        if np_resize is not None:
            impls["numpy"] = lambda x=x, g=(s_h, s_w, n_h, n_w): np_resize(x, *g, "half_pixel")
        cases.append((label, impls, want))
    for label, shape, k, s, p in POOLS:
        x = rng.standard_normal(shape).astype(F32)
        nchwc = len(k) == 2 and shape[1] % 8 == 0
        want = mlas_average_pool(x, k, s, p, 0, nchwc)
        node = helper.make_node(
            "AveragePool", ["x"], ["y"], kernel_shape=list(k), strides=list(s), pads=list(p)
        )
        run_ort = _ort(node, shape, [])
        impls = {
            "ort": lambda r=run_ort, x=x: r(x),
            "cpp": lambda x=x, a=(k, s, p, 0, nchwc): average_pool(x, *a),
        }
        if np_pool is not None:
            impls["numpy"] = lambda x=x, a=(k, s, p, 0, nchwc): np_pool(x, *a)
        cases.append((label, impls, want))
    for label, impls, want in cases:
        got = impls["cpp"]()
        assert np.array_equal(got.view(np.int32), want.view(np.int32)), label
    times = {(label, k): [] for label, impls, _ in cases for k in impls}
    loads = [os.getloadavg()[0]]
    for _ in range(a.rounds):
        for label, impls, _ in cases:
            for k, fn in impls.items():
                _median_ms(fn, times[(label, k)])
        loads.append(os.getloadavg()[0])
    print(
        f"1 thread, {a.rounds} interleaved rounds x 3 runs, medians; load {min(loads):.1f}-{max(loads):.1f}"
    )
    print("| op | ORT ms | C++ ms | C++ / ORT | NumPy ms | NumPy / ORT |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, impls, _ in cases:
        med = {k: 1e3 * float(np.median(times[(label, k)])) for k in impls}
        npy = f"{med['numpy']:.3f} | {med['numpy'] / med['ort']:.2f}" if "numpy" in med else "- | -"
        print(f"| {label} | {med['ort']:.3f} | {med['cpp']:.3f} | {med['cpp'] / med['ort']:.2f} | {npy} |")


if __name__ == "__main__":
    main()
