"""Model benchmark: a quanta-quantized BERT-style encoder, quanta (native) vs ONNX Runtime
on the same QDQ file.

Run: ``python benchmarks/models.py`` (``--quick`` for fewer repetitions). A ratio table
from ONE run; nothing here is a timed test. The machine is shared and noisy, so only
ratios measured in the same run mean something.

OpenVINO (``--no-openvino`` skips it): quanta / OpenVINO median latency on quanta's file
and on NNCF's file, 1 and 2 threads (``openvino_section``).

Model: ``tests/ir/models.encoder_block(d=384, heads=6)`` (self-attention with an additive
mask, output projection, residual + LayerNorm, a 2·d MLP, residual + LayerNorm), quantized
by ``quanta.quantize_static`` (default recipe, MinMax, per-column weights) on 8 calibration
samples; timed at batch 1, sequence 128, 1 and 2 threads.

Method: both sessions get the same feeds; each engine runs blocks of ``runs`` calls in
turn (quanta, ORT, quanta, ...), with a 30 ms pause between blocks (both thread pools spin
for a while after a call; a spinning pool steals the other core from the other engine);
the median over all blocks' calls is reported, and the ratio quanta / ORT (< 1: quanta is
faster). ORT: ``intra_op_num_threads`` = threads, one inter-op thread, sequential
execution, ``ORT_ENABLE_ALL`` (its QDQ fusions on), as ``quanta bench --vs-ort``. The
slowest quanta steps (per-step profile, separate runs) show where the time goes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import quanta  # noqa: E402
from quanta.runtime.profile import Profiler  # noqa: E402
from tests.ir import models  # noqa: E402

D, HEADS, SEQ, BATCH = 384, 6, 128, 1


def encoder_feeds(n: int, seq: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "x": rng.standard_normal((BATCH, seq, D)).astype(np.float32),
            "mask": np.ones((BATCH, seq), np.int64),
        }
        for _ in range(n)
    ]


def ort_session(path: str, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"])


def time_alternating(fns: dict[str, Callable[[], object]], blocks: int, runs: int) -> dict[str, float]:
    """Median ms per call of each engine over ``blocks`` blocks of ``runs`` calls."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():  # warm-up: first-touch, arenas, thread pools
        for _ in range(3):
            fn()
    clock = time.perf_counter
    for _ in range(blocks):
        for name, fn in fns.items():
            for _ in range(runs):
                t0 = clock()
                fn()
                times[name].append((clock() - t0) * 1e3)
            time.sleep(0.03)
    return {k: float(np.median(v)) for k, v in times.items()}


def cnn_section(blocks: int, runs: int, size: int = 224) -> None:
    """A MobileNet-style CNN (benchmarks/runtime.py's mobilenet_like: stem, 6 inverted
    residual blocks with depthwise 3x3, GAP, FC) at batch 1: quanta int8 (native) vs ONNX
    Runtime int8 on the same QDQ file, and vs quanta's own FP32 path on the float file."""
    import onnxruntime

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from runtime import mobilenet_like

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = Path(tmp) / "mobilenet.onnx"
        int8 = Path(tmp) / "mobilenet.int8.onnx"
        onnx.save(mobilenet_like(size), fp32)
        calib = [{"input": rng.standard_normal((1, 3, size, size)).astype(np.float32)} for _ in range(4)]
        quanta.quantize_static(str(fp32), str(int8), calib, verbose=False)
        feeds = {"input": rng.standard_normal((1, 3, size, size)).astype(np.float32)}
        print(
            f"\nMobileNet-style CNN 1x3x{size}x{size}: quanta int8 (native) vs onnxruntime "
            f"{onnxruntime.__version__} int8 on the same QDQ file, and vs quanta's FP32 path"
        )
        print(
            f"  {'threads':>7} {'quanta int8':>12} {'ORT int8':>9} {'quanta/ORT':>11} {'quanta fp32':>12} {'fp32/int8':>10}"
        )
        for threads in (1, 2):
            opts = quanta.SessionOptions()
            opts.intra_op_num_threads = threads
            q8 = quanta.InferenceSession(str(int8), sess_options=opts, backend="native")
            q32 = quanta.InferenceSession(str(fp32), sess_options=opts, backend="native")
            o8 = ort_session(str(int8), threads)
            med = time_alternating(
                {"q8": lambda s=q8: s.run(None, feeds), "o8": lambda o=o8: o.run(None, feeds)}, blocks, runs
            )
            # quanta's FP32 path apart: its NumPy convolutions run on OpenBLAS, whose own
            # threads keep spinning after a call and would slow whatever runs next; and
            # after a pause, so that ONNX Runtime's spinning pool (allow_spinning) has gone
            # to sleep (timed right after it, the 2-thread FP32 path read 20-27 ms instead
            # of ~13)
            time.sleep(0.2)
            med.update(time_alternating({"q32": lambda s=q32: s.run(None, feeds)}, 1, max(5, runs // 4)))
            print(
                f"  {threads:>7} {med['q8']:>10.3f}ms {med['o8']:>7.3f}ms {med['q8'] / med['o8']:>10.2f}x"
                f" {med['q32']:>10.3f}ms {med['q32'] / med['q8']:>9.2f}x"
            )


def openvino_section(blocks: int, runs: int) -> None:
    """quanta / OpenVINO on quanta's file and on NNCF's (``nncf.quantize``; MiniLM also
    with the transformer preset), 1 and 2 threads, interleaved with ORT and with quanta on
    its own file (benchmarks/foreign_qdq.py). Models: the MobileNet-style CNN, and
    EfficientNet-Lite0 / all-MiniLM-L6-v2 when benchmarks/real_models/export.py has
    written them into the cache."""
    try:
        import nncf  # noqa: F401
        import openvino  # noqa: F401
    except ImportError:
        print("\nOpenVINO section skipped: pip install openvino nncf (the bench extra)")
        return
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import foreign_qdq
    from runtime import mobilenet_like

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        cnn = Path(tmp) / "mobilenet.onnx"
        onnx.save(mobilenet_like(224), cnn)
        cnn_calib = [{"input": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)} for _ in range(4)]
        cases.append(("mobilenet_like", cnn, cnn_calib, cnn_calib[0], ("nncf",)))
        for name in foreign_qdq.REAL:
            if (foreign_qdq.BENCH_CACHE / f"{name}.prep.onnx").exists():
                src, calib, feed, kind = foreign_qdq.model_and_feeds(name)
                cases.append(
                    (name, src, calib, feed, ("nncf", "nncf_transformer") if kind == "text" else ("nncf",))
                )
        print(
            "\nquanta vs OpenVINO on quanta's file and on NNCF's (median ms; own = quanta on quanta's file)"
        )
        print(
            f"  {'model':<20} {'file':<17} {'thr':>3} {'quanta':>8} {'OV':>8} {'q/OV':>6} {'own/OV':>7} {'q/own':>6}"
        )
        for name, src, calib, feed, layouts in cases:
            files = {}
            for layout in ("quanta", *layouts):
                files[layout] = Path(tmp) / f"{name}.{layout}.onnx"
                foreign_qdq.quantize(layout, src, files[layout], calib)
            for layout, path in files.items():
                for threads in (1, 2):
                    med, _ = foreign_qdq.compare(
                        path, files["quanta"], threads, feed, blocks, max(3, runs // 4)
                    )
                    ov = med.get("ov", float("nan"))
                    print(
                        f"  {name:<20} {layout:<17} {threads:>3} {med['q']:>8.2f} {ov:>8.2f} {med['q'] / ov:>6.2f} "
                        f"{med['own'] / ov:>7.2f} {med['q'] / med['own']:>6.2f}",
                        flush=True,
                    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--no-openvino", action="store_true", help="skip the OpenVINO section")
    args = ap.parse_args(argv)
    # long blocks: the first calls after a pause pay the pools' wake-up (a halted vCPU in a VM)
    blocks, runs = (3, 10) if args.quick else (6, 40)

    import onnxruntime

    cnn_section(blocks, runs)
    if not args.no_openvino:
        openvino_section(blocks, runs)

    with tempfile.TemporaryDirectory() as tmp:
        fp32 = Path(tmp) / "encoder_d384.onnx"
        int8 = Path(tmp) / "encoder_d384.int8.onnx"
        onnx.save(models.encoder_block(d=D, heads=HEADS), fp32)
        summary = quanta.quantize_static(str(fp32), str(int8), encoder_feeds(8, SEQ, seed=1), verbose=False)
        feeds = encoder_feeds(1, SEQ, seed=2)[0]
        print(
            f"BERT-style encoder block d={D}, heads={HEADS}, sequence {SEQ}, batch {BATCH}: "
            f"quanta.quantize_static (QDQ), quanta native vs onnxruntime {onnxruntime.__version__} on the same file"
        )
        print(
            f"  quantizer: {len(summary.quantized)} nodes quantized, {len(summary.float_nodes)} left float "
            f"({', '.join(sorted({op for _, op, _ in summary.float_nodes}))})"
        )
        print(
            f"  {'threads':>7} {'quanta ms':>10} {'ORT ms':>8} {'quanta/ORT':>11} {'fallbacks':>12}  max|diff|"
        )
        profiles = []
        for threads in (1, 2):
            opts = quanta.SessionOptions()
            opts.intra_op_num_threads = threads
            sess = quanta.InferenceSession(str(int8), sess_options=opts, backend="native")
            osess = ort_session(str(int8), threads)
            med = time_alternating(
                {"quanta": lambda s=sess: s.run(None, feeds), "ort": lambda o=osess: o.run(None, feeds)},
                blocks,
                runs,
            )
            diff = float(np.max(np.abs(sess.run(None, feeds)[0] - osess.run(None, feeds)[0])))
            n_steps = len(sess.plan.steps)
            print(
                f"  {threads:>7} {med['quanta']:>10.3f} {med['ort']:>8.3f} {med['quanta'] / med['ort']:>10.2f}x"
                f" {len(sess.fallbacks):>5} of {n_steps:<4}  {diff:.3g}"
            )
            profiler = Profiler(sess.plan)
            sess.executor.profiler = profiler
            for _ in range(20):
                sess.run(None, feeds)
            sess.executor.profiler = None
            profiles.append((threads, profiler.summary(12)))
        for threads, prof in profiles:
            print(f"\nquanta per-step profile, {threads} thread{'s' if threads > 1 else ''}:")
            print(prof)
    return 0


if __name__ == "__main__":
    sys.exit(main())
