"""Kernel benchmark: quanta's int8 GEMM vs ONNX Runtime's MatMulInteger vs the machine's peak.

Run: ``python benchmarks/kernels.py`` (``--quick`` for a short run, ``--json FILE`` to keep
the numbers, ``--gemm-only`` to skip the convolution layers). After the GEMM table, the
convolution layers of ``benchmarks/conv.py`` (ResNet-50, MobileNet-V2 and depthwise
layers; QLinearConv NCHW and NHWC, ConvInteger) with the same peak column.

A ratio table from ONE run; nothing here is a timed test. The machine is shared and noisy, so the only meaningful numbers are ratios measured in the same run:
quanta and ONNX Runtime are timed alternately, batch by batch, and the best batch of each
is kept (the least-disturbed one).

GOPS counts 2·M·N·K operations (a multiply and an add per MAC). The peak is the
``vpdpbusd`` throughput from ``_native.vnni_peak_probe`` (20 independent register-only
chains, so neither latency nor memory limits it), measured before and after the GEMMs;
the larger value is used.

``--cpu-time``: one-thread rows time each call in this thread's CPU time, the libraries
alternating in blocks of calls (``_timing.cpu_time_calls``; best call, and the median
call in the ``med.`` columns; the peak probe times its batches in thread CPU time in any
case): on a shared machine wall-clock batches also count the time the OS gave other
processes. Rows with more threads keep the wall-clock blocks.

quanta runs with the autotuner's blocking for each shape (quanta/runtime/tuner.py: measured
now, or from the user cache); the "heur." column is the built-in heuristic blocking, timed
in the same alternation (``--no-tune``: heuristics only).

Both sides compute the same thing: x uint8 [M, K] with a run-time zero point, constant
int8 weights [K, N] (prepacked once by each library), int32 output.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Callable

import numpy as np

from quanta.kernels import _native

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import cpu_time_calls, time_alternating

SHAPES: tuple[tuple[int, int, int], ...] = ((1024, 1024, 1024), (128, 768, 768), (1, 4096, 4096))


def _ort_matmul_integer(
    w: np.ndarray, M: int, zx: int, threads: int, spinning: bool
) -> Callable[[np.ndarray], object]:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    K, N = w.shape
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["x", "w", "zx"], ["y"])],
        "matmul_integer",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [M, K])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [M, N])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(zx, np.uint8), "zx")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return lambda x: sess.run(None, {"x": x})


def _quanta_qgemm(w: np.ndarray, M: int, zx: int, threads: int) -> Callable[[np.ndarray], object]:
    packed = _native.pack_weights_s8(w, 0)
    ws = _native.QGemmWorkspace()
    out = _aligned_empty((M, w.shape[1]), np.int32)
    return lambda x: _native.qgemm(x, packed, zx, "int32", num_threads=threads, workspace=ws, out=out)


def _aligned_empty(shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """An array whose data starts on a 64-byte line, as the runtime's arena places every
    value (quanta/runtime/memory.py) and ONNX Runtime's allocator its outputs: NumPy's
    own start 16 bytes into a line, and every 64-byte store of the int32 output then
    splits two lines (1024^3: 692 against 763 GOPS, one thread, same run)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    buf = np.empty(nbytes + 64, np.uint8)
    start = (-buf.ctypes.data) % 64
    return buf[start : start + nbytes].view(dtype).reshape(shape)


def _tune(M: int, N: int, K: int, threads: int) -> dict | None:
    """The autotuner's blocking for the shape (from the user cache, or measured now)."""
    from quanta.runtime import tuner

    shape = tuner.GemmShape(_native.active_isa(), M, N, K, threads)
    report = tuner.tune_shapes({shape: 1}, budget_s=2.0)
    return report.choices[0].blocking or None if report.choices else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="0.5 s per measurement instead of 2 s")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument(
        "--gemm-only", action="store_true", help="skip the convolution layers (benchmarks/conv.py's table)"
    )
    ap.add_argument("--no-tune", action="store_true", help="the heuristic blockings only (no autotuner)")
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="one thread: each call timed in this thread's CPU time, the libraries alternating in blocks "
        "(best and median call) instead of wall-clock blocks",
    )
    args = ap.parse_args(argv)
    budget = 0.5 if args.quick else 2.0

    try:
        import onnxruntime

        ort_version: str | None = onnxruntime.__version__
    except ImportError:
        ort_version = None

    has_vnni = "avx512vnni" in _native.supported_isas()
    peak_before = _native.vnni_peak_probe(0.5) if has_vnni else None
    rng = np.random.default_rng(0)
    rows = []
    tuned_rows: list[tuple[int, int, int, int, dict | None]] = []
    for M, N, K in SHAPES:
        w = rng.integers(-128, 128, (K, N), dtype=np.int8)
        x = rng.integers(0, 256, (M, K), dtype=np.uint8)
        zx = 131
        for threads in args.threads:
            fns: dict[str, Callable[[], object]] = {}
            q = _quanta_qgemm(w, M, zx, threads)
            choice = None
            if not args.no_tune:
                choice = _tune(M, N, K, threads)
                tuned_rows.append((M, N, K, threads, choice))
            key = (_native.active_isa(), M, N, K, threads)
            fns["quanta"] = lambda q=q, x=x, c=choice, k=key: (_native.qgemm_set_tuned(*k, c), q(x))
            if choice:
                fns["heur"] = lambda q=q, x=x, k=key: (_native.qgemm_set_tuned(*k, None), q(x))
            if ort_version:
                o = _ort_matmul_integer(w, M, zx, threads, spinning=True)
                fns["ort"] = lambda o=o, x=x: o(x)
            if args.cpu_time and threads == 1:
                gops, med = cpu_time_calls(fns, 2 * M * N * K, budget)
                gops |= {f"{k}_median": v for k, v in med.items()}
            else:
                gops = time_alternating(fns, 2 * M * N * K, budget)
            rows.append({"M": M, "N": N, "K": K, "threads": threads, **gops})
    conv_rows = []
    if not args.gemm_only:
        import conv

        conv_rows = conv.measure(args.threads, 0.5 if args.quick else 1.5, ort=ort_version is not None)
    peak_after = _native.vnni_peak_probe(0.5) if has_vnni else None
    peak = max(peak_before, peak_after) if has_vnni else None

    kernel = _native.qgemm_kernel_name()
    print(f"# {platform.processor() or platform.machine()}, {kernel}, onnxruntime {ort_version or 'absent'}")
    if peak is not None:
        print(
            f"# vpdpbusd peak (1 thread): {peak_before:.0f} GOPS before, {peak_after:.0f} after; using {peak:.0f}"
        )
    header = f"{'M x N x K':>18} {'thr':>3} {'quanta':>8} {'heur.':>8} {'ORT':>8} {'q/ORT':>6} {'q/peak':>7} {'ORT/peak':>8}"
    if args.cpu_time:
        header += f" {'med. q':>7} {'med. ORT':>8} {'q/ORT':>6} {'q/peak':>7}"
    print(header)
    print("-" * len(header))
    for r in rows:
        shape = f"{r['M']}x{r['N']}x{r['K']}"
        ort_g = r.get("ort")
        thr_peak = peak * r["threads"] if peak else None
        cells = [
            f"{shape:>18}",
            f"{r['threads']:>3}",
            f"{r['quanta']:8.0f}",
            f"{r['heur']:8.0f}" if r.get("heur") else f"{'=':>8}",
            f"{ort_g:8.0f}" if ort_g else f"{'-':>8}",
            f"{r['quanta'] / ort_g:6.2f}" if ort_g else f"{'-':>6}",
            f"{r['quanta'] / thr_peak:7.1%}" if thr_peak else f"{'-':>7}",
            f"{ort_g / thr_peak:8.1%}" if (thr_peak and ort_g) else f"{'-':>8}",
        ]
        if "quanta_median" in r:
            q_med, o_med = r["quanta_median"], r.get("ort_median")
            cells += [
                f"{q_med:7.0f}",
                f"{o_med:8.0f}" if o_med else f"{'-':>8}",
                f"{q_med / o_med:6.2f}" if o_med else f"{'-':>6}",
                f"{q_med / thr_peak:7.1%}" if thr_peak else f"{'-':>7}",
            ]
        print(" ".join(cells))
    print("# q/peak and ORT/peak use threads x the single-thread peak; GEMV (M = 1) is memory bound.")
    if args.cpu_time:
        print(
            "# one-thread rows: thread CPU time per call, alternating blocks (best call; med.: the median call)"
        )
    if hasattr(os, "getloadavg"):
        print("# load average at the end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    for M, N, K, threads, choice in tuned_rows:
        print(f"# tuner {M}x{N}x{K} thr {threads}: {choice or 'heuristic blocking kept'}")
    if conv_rows:
        print()
        print(f"# convolution layers (benchmarks/conv.py), active ISA {_native.active_isa()}")
        conv.print_table(conv_rows, peak)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "kernel": kernel,
                    "peak_gops": peak,
                    "ort": ort_version,
                    "rows": rows,
                    "conv_rows": conv_rows,
                    "tuned": tuned_rows,
                },
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
