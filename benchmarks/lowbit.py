"""Low-bit GEMM benchmark: A16W8, W4A8 and W4 (float activations) next to quanta's int8 and
fp32 GEMMs and ONNX Runtime's MatMulNBits, plus ppocr_cls quantized by ONNX Runtime with
16-bit activations (``ppocr_cls.ort_qdq_u16``), quanta vs ONNX Runtime.

Run: ``python benchmarks/lowbit.py`` (``--quick``: a short run; ``--threads N``;
``--no-model``: kernels only). A ratio table from ONE run; the machine is shared, so only
ratios measured in the same run mean anything: every library is timed in alternating
blocks and the best batch kept (benchmarks/_timing.py). GOPS counts 2·M·N·K.

Kernels (all with constant weights packed once, as sessions do):

- int8       ``qgemm``, u8 x s8 -> int32 (quanta's int8 GEMM)
- A16W8      ``a16w8_matmul``, u16 x s8 -> u16 requantized (exact int64 sums)
- W4A8       ``w4a8_matmul``, u8 x int4 per block of 32 -> float32 (exact block dots)
- bf16       ``bf16_matmul`` (vdpbf16ps where the CPU has AVX512_BF16; ``bf16_path``)
- fp32       ``matmul_f32`` (packed B)
- W4 float   MatMulNBits through a quanta session (weights dequantized at compile time)
- ORT W4 / ORT W4A8   ONNX Runtime's MatMulNBits, accuracy_level 0 (float) and 4 (int8 A)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from quanta.kernels import _native
from quanta.kernels.reference.bf16 import BF16
from quanta.targets.native.bf16 import pack_bf16

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import time_alternating

SHAPES = ((256, 1024, 1024), (128, 768, 3072), (1, 4096, 4096))


def _nbits_session(w_q: np.ndarray, scales: np.ndarray, m: int, level: int, threads: int, quanta_side: bool):
    from onnx import TensorProto, helper, numpy_helper

    n, k = w_q.shape
    kb = k // 32
    packed = (w_q[:, 0::2] | (w_q[:, 1::2] << 4)).astype(np.uint8).reshape(n, kb, 16)
    node = helper.make_node(
        "MatMulNBits",
        ["A", "B", "s"],
        ["Y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=4,
        block_size=32,
        accuracy_level=level,
    )
    graph = helper.make_graph(
        [node],
        "nbits",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(packed, "B"), numpy_helper.from_array(scales.reshape(-1), "s")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    blob = model.SerializeToString()
    if quanta_side:
        import quanta

        opts = quanta.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = quanta.InferenceSession(blob, opts)
    else:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        sess = ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])
    return lambda a: sess.run(None, {"A": a})


def _shape_fns(m: int, k: int, n: int, threads: int, rng: np.random.Generator) -> dict:
    """The callables timed for one shape (weights packed once, as sessions do)."""
    from quanta.targets.native.a16w8 import pack_weight, weight_terms
    from quanta.targets.native.w4 import pack_blocks

    x8 = rng.integers(0, 256, (m, k)).astype(np.uint8)
    x16 = rng.integers(0, 65536, (m, k)).astype(np.uint16)
    xf = rng.standard_normal((m, k)).astype(np.float32)
    w8 = rng.integers(-128, 128, (k, n)).astype(np.int8)
    w4 = rng.integers(-8, 8, (k, n)).astype(np.int64)
    p8 = _native.pack_weights_s8(w8, 0)
    ws = _native.QGemmWorkspace()
    wk = w8.astype(np.int64)
    p16 = pack_weight(wk)
    dw, cw = weight_terms(wk, w8.dtype, np.zeros(n, np.int64), n)
    mult = np.full(n, 1e-4, np.float32)
    pw4, cs4 = pack_blocks(w4, None, 32)
    c4 = np.full(cs4.shape, 1e-3, np.float32)
    pf = _native.sgemm_pack_b(rng.standard_normal((k, n)).astype(np.float32))
    pbf = pack_bf16(rng.standard_normal((k, n)).astype(BF16))
    wq = (w4.T + 8).astype(np.uint8)
    sc = np.full((n, k // 32), 0.01, np.float32)
    q4 = _nbits_session(wq, sc, m, 0, threads, True)
    o4 = _nbits_session(wq, sc, m, 0, threads, False)
    o48 = _nbits_session(wq, sc, m, 4, threads, False)
    return {
        "int8": lambda: _native.qgemm(x8, p8, 3, "int32", num_threads=threads, workspace=ws),
        "A16W8": lambda: _native.a16w8_matmul(
            x16, p16, k, n, dw, cw, None, mult, 1000, 0, "u16", num_threads=threads
        ),
        "W4A8": lambda: _native.w4a8_matmul(x8, pw4, cs4, c4, k, n, 32, 3, num_threads=threads),
        "bf16": lambda: _native.bf16_matmul(xf, pbf, n, num_threads=threads),
        "fp32": lambda: _native.matmul_f32(xf, None, pf, n, num_threads=threads),
        "W4 float (quanta)": lambda: q4(xf),
        "ORT W4 float": lambda: o4(xf),
        "ORT W4A8 (level 4)": lambda: o48(xf),
    }


def gemm_table(threads: int, budget: float) -> list[str]:
    rng = np.random.default_rng(0)
    rows: list[str] = []
    for m, k, n in SHAPES:
        fns = _shape_fns(m, k, n, threads, rng)
        if not rows:
            rows = ["| M x K x N | " + " | ".join(fns) + " |", "|---" * (len(fns) + 1) + "|"]
            print("\n".join(rows))
        gops = time_alternating(fns, 2 * m * n * k, budget)
        rows.append(f"| {m} x {k} x {n} | " + " | ".join(f"{gops[name]:.1f}" for name in fns) + " |")
        print(rows[-1], flush=True)
    return rows


def ppocr_u16(threads: int, runs: int) -> list[str]:
    import onnxruntime as ort

    import quanta

    path = os.path.expanduser("~/.cache/quanta-zoo/models/ppocr_cls.ort_qdq_u16.onnx")
    if not os.path.exists(path):
        return ["ppocr_cls.ort_qdq_u16.onnx not in the zoo cache: skipped"]
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    qs = quanta.InferenceSession(path, opts)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    os_ = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    name = qs.get_inputs()[0].name
    shape = [1, 3, 48, 192]  # the classifier's input (the file leaves H and W free)
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    yq, yo = qs.run(None, {name: x})[0], os_.run(None, {name: x})[0]
    wide = sum(1 for s in qs.plan.steps if s.node.op_type in ("QLinearConv16", "QLinearMatMul16"))
    fallbacks = len(qs.fallbacks)
    tq, to = [], []
    for _ in range(3):
        qs.run(None, {name: x})
        os_.run(None, {name: x})
    for _ in range(runs):  # interleaved single runs, medians
        t = time.perf_counter()
        qs.run(None, {name: x})
        tq.append(time.perf_counter() - t)
        t = time.perf_counter()
        os_.run(None, {name: x})
        to.append(time.perf_counter() - t)
    mq, mo = statistics.median(tq) * 1e3, statistics.median(to) * 1e3
    return [
        f"ppocr_cls.ort_qdq_u16, input {shape}, {threads} thread(s), {runs} interleaved runs, medians:",
        f"quanta {mq:.2f} ms, ONNX Runtime {mo:.2f} ms, quanta/ORT time ratio {mq / mo:.2f} "
        f"(speed-up {mo / mq:.2f}x); {wide} QLinear*16 steps, {fallbacks} reference fallbacks; "
        f"max |quanta - ORT| = {float(np.max(np.abs(yq - yo))):.3g} (outputs in [0, 1])",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-model", action="store_true")
    args = ap.parse_args(argv)
    print(f"ISA: {_native.active_isa()}, bf16 path: {_native.bf16_path()}, threads {args.threads}")
    gemm_table(args.threads, 1.0 if args.quick else 3.0)
    if not args.no_model:
        for line in ppocr_u16(args.threads, 20 if args.quick else 100):
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
