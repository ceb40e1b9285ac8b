"""Foreign QDQ layouts: quanta on files quantized by other tools, side by side with ONNX
Runtime and OpenVINO on the same files, and with quanta on its own file.

Run::

    python benchmarks/foreign_qdq.py [--models efficientnet_lite0,all_minilm_l6_v2,ppocr_cls]
                                     [--layouts quanta,ort_qdq,ort_qdq_pc,trt,ort_qop,...]
                                     [--threads 1 2] [--blocks 5] [--runs 8] [--cache DIR]
                                     [--no-openvino] [--ort-float-orders matmul,pool]

Models: ``efficientnet_lite0`` and ``all_minilm_l6_v2`` from ``benchmarks/real_models``
(run its ``export.py`` first; the ``.prep.onnx`` files are quantized), and any model of the
public zoo (``~/.cache/quanta-zoo``, calibration feeds from ``benchmarks/zoo/zoodata.py``).

Layouts, each written once into ``<cache>/foreign/<model>.<layout>.onnx`` (nothing here is
committed; ``--force`` writes them again):

- ``quanta``: ``quanta.quantize_static`` with its defaults (the reference row);
- ``ort_qdq``: ONNX Runtime's ``quantize_static`` with its defaults (``QuantFormat.QDQ``,
  uint8 asymmetric activations, int8 weights per tensor);
- ``ort_qdq_pc``: the same with per-channel weights;
- ``ort_qop``: ONNX Runtime's ``QuantFormat.QOperator`` (QLinearConv, QLinearAdd, ...,
  per-channel weights);
- ``ort_dynamic``: ONNX Runtime's ``quantize_dynamic`` (text models only; the chains
  DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul);
- ``nncf``: ``nncf.quantize`` on the ONNX model with its defaults (NNCF's placement:
  Q/DQ on both inputs of Add, on Concat inputs, symmetric int8 weights per channel,
  mixed u8/i8 activations);
- ``nncf_transformer``: the same with ``model_type=nncf.ModelType.TRANSFORMER`` (text
  models only);
- ``trt``: TensorRT-style symmetric QDQ, written by ONNX Runtime's ``quantize_static``
  (``QuantFormat.QDQ``, int8 activations and weights, ``ActivationSymmetric`` and
  ``WeightSymmetric``, per-channel weights on axis 0, Q/DQ on every input);
- ``quark``: AMD Quark's ``ModelQuantizer`` with its ``XINT8`` configuration (symmetric
  int8 activations, power-of-two scales) when ``amd-quark`` imports.

Beside the times, ``codes`` is max |quanta − ORT| at the first output in units of its
step (the scale of the DequantizeLinear that writes it, ``zoo.output_step``) on the timed
feed, or ``-`` when the output has no quantized step.

Timing: for each file and thread count, four engines run blocks of ``runs`` calls in turn
(quanta on the file, quanta on quanta's own file, ONNX Runtime on the file, OpenVINO on
the file), with a 300 ms pause between blocks (thread pools spin after a call, OpenVINO's longest); medians
over all calls. ORT: ``intra_op_num_threads`` = threads, sequential, ``ORT_ENABLE_ALL``.
OpenVINO: ``Core().compile_model(model, "CPU")`` with ``INFERENCE_NUM_THREADS`` =
threads, one stream, the latency hint, on the model reshaped to the feed's static
shapes (what an OpenVINO user does for batch-1 latency). Ratios < 1: quanta is faster.
The machine is shared and noisy: only ratios of one run mean something; nothing here
is a test.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "zoo"))
sys.path.insert(0, str(ROOT / "benchmarks" / "real_models"))

Feed = dict[str, np.ndarray]
BENCH_CACHE = Path(os.environ.get("QUANTA_BENCH_CACHE", Path.home() / ".cache" / "quanta-bench"))
REAL = ("efficientnet_lite0", "all_minilm_l6_v2")
LAYOUTS = (
    "quanta",
    "ort_qdq",
    "ort_qdq_pc",
    "trt",
    "ort_qop",
    "ort_dynamic",
    "nncf",
    "nncf_transformer",
    "quark",
)
TEXT_ONLY = ("nncf_transformer", "ort_dynamic")
N_CALIB = 16


# --- models and feeds ----------------------------------------------------------------


def model_and_feeds(name: str) -> tuple[Path, list[Feed], Feed, str]:
    """(float model path, calibration feeds, the timed feed, kind "image" | "text")."""
    if name in REAL:
        import accuracy  # benchmarks/real_models

        path = BENCH_CACHE / f"{name}.prep.onnx"
        if not path.exists():
            raise SystemExit(f"{path} is missing: run benchmarks/real_models/export.py first")
        if name == "efficientnet_lite0":
            calib, _ = accuracy.image_data(N_CALIB, 1, 1)
            feed = {"input": np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)}
            return path, calib, feed, "image"
        calib, _ = accuracy.sentence_data(N_CALIB, 1)
        ones = np.ones((1, 128), np.int64)
        feed = {"input_ids": ones, "attention_mask": ones, "token_type_ids": np.zeros_like(ones)}
        return path, calib, feed, "text"
    import zoodata

    cache = zoodata.cache_dir(None)
    path = cache / "models" / f"{name}.onnx"
    if name.startswith("minilm"):
        vocab = cache / "models" / "minilm_vocab.txt"
        calib = zoodata.token_feeds(vocab, "calib", N_CALIB, batch=1)
        return path, calib, zoodata.token_feeds(vocab, "eval", 1, batch=1)[0], "text"
    calib = zoodata.image_feeds(name, "calib", N_CALIB)
    return path, calib, zoodata.image_feeds(name, "eval", 1)[0], "image"


# --- quantizers ----------------------------------------------------------------------


class _Reader:
    """ONNX Runtime's CalibrationDataReader protocol over a list of feeds."""

    def __init__(self, feeds: list[Feed]):
        self.feeds, self.i = feeds, 0

    def get_next(self) -> Feed | None:
        self.i += 1
        return self.feeds[self.i - 1] if self.i <= len(self.feeds) else None

    def rewind(self) -> None:
        self.i = 0


def quantize(layout: str, src: Path, dst: Path, calib: list[Feed]) -> None:
    if layout == "quanta":
        import quanta

        quanta.quantize_static(str(src), str(dst), calib, verbose=False, progress=False)
    elif layout in ("nncf", "nncf_transformer"):
        import nncf
        import onnx

        kw: dict[str, Any] = {"subset_size": len(calib)}
        if layout == "nncf_transformer":
            kw["model_type"] = nncf.ModelType.TRANSFORMER
        q = nncf.quantize(onnx.load(str(src)), nncf.Dataset(calib), **kw)
        onnx.save(q, str(dst))
    elif layout in ("ort_qdq", "ort_qdq_pc", "ort_qop", "trt"):
        from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

        trt = layout == "trt"
        quantize_static(
            str(src),
            str(dst),
            _Reader(calib),
            quant_format=QuantFormat.QOperator if layout == "ort_qop" else QuantFormat.QDQ,
            per_channel=layout != "ort_qdq",
            activation_type=QuantType.QInt8 if trt else QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True} if trt else None,
        )
    elif layout == "ort_dynamic":
        from onnxruntime.quantization import quantize_dynamic

        quantize_dynamic(str(src), str(dst))
    elif layout == "quark":
        from quark.onnx import ModelQuantizer
        from quark.onnx.quantization.config import Config, get_default_config

        quantizer = ModelQuantizer(Config(global_quant_config=get_default_config("XINT8")))
        # Quark writes quantized_info.csv into the working directory: keep it beside the file
        with contextlib.chdir(dst.parent):
            quantizer.quantize_model(str(src), str(dst), _Reader(calib))
    else:
        raise ValueError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")


# --- engines -------------------------------------------------------------------------


#: quanta's ``SessionOptions.ort_float_orders`` for every session (``--ort-float-orders``)
ORT_FLOAT_ORDERS: frozenset[str] | None = None


def quanta_run(path: Path, threads: int) -> tuple[Callable[[Feed], object], Any]:
    import quanta

    opts = quanta.SessionOptions(ort_float_orders=ORT_FLOAT_ORDERS)
    opts.intra_op_num_threads = threads
    s = quanta.InferenceSession(str(path), sess_options=opts)
    return (lambda f: s.run(None, f)), s


def ort_run(path: Path, threads: int) -> Callable[[Feed], object]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return lambda f: s.run(None, f)


def openvino_run(path: Path, threads: int, feed: Feed) -> Callable[[Feed], object]:
    """OpenVINO's CPU plugin on the file, reshaped to the feed's static shapes."""
    import openvino as ov

    core = ov.Core()
    model = core.read_model(str(path))
    model.reshape({inp.get_any_name(): list(feed[inp.get_any_name()].shape) for inp in model.inputs})
    compiled = core.compile_model(
        model,
        "CPU",
        {
            "INFERENCE_NUM_THREADS": threads,
            "NUM_STREAMS": 1,
            "PERFORMANCE_HINT": "LATENCY",
        },
    )
    req = compiled.create_infer_request()
    return lambda f: req.infer(f)


def time_alternating(fns: dict[str, Callable[[], object]], blocks: int, runs: int) -> dict[str, float]:
    """Median ms per call of each engine over ``blocks`` blocks of ``runs`` calls, in turn."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
        fn()
    for _ in range(blocks):
        for k, fn in fns.items():
            # let the previous engine's threads go idle: ORT's and quanta's pools spin for
            # a while after a call, and OpenVINO's CPU threads longer (after 30 ms the next
            # engine's first call of the block measured 56 ms instead of 2.5)
            time.sleep(0.3)
            for _ in range(runs):
                t0 = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def compare(
    path: Path, own: Path, threads: int, feed: Feed, blocks: int, runs: int, openvino: bool
) -> tuple[dict[str, float], Any]:
    """Median ms of quanta on ``path`` (q), quanta on ``own`` (own), ONNX Runtime (ort)
    and OpenVINO (ov, left out when OpenVINO cannot compile the file) on ``path``,
    interleaved; and quanta's session on ``path``."""
    q, qs = quanta_run(path, threads)
    q_own, _ = quanta_run(own, threads)
    ort = ort_run(path, threads)
    fns: dict[str, Callable[[], object]] = {
        "q": lambda: q(feed),
        "own": lambda: q_own(feed),
        "ort": lambda: ort(feed),
    }
    try:
        if openvino:
            ov = openvino_run(path, threads, feed)
            fns["ov"] = lambda: ov(feed)
    except Exception as e:  # OpenVINO refusing a file is a missing column
        print(f"  OpenVINO failed on {path.name}: {str(e).splitlines()[0][:90]}", flush=True)
    return time_alternating(fns, blocks, runs), qs


def codes_from_ort(path: Path, qs: Any, feed: Feed) -> str:
    """max |quanta − ORT| at the first output in units of its step, or "-" (no step)."""
    import zoo

    step = zoo.output_step(path)
    if not isinstance(step, float) or step <= 0:
        return "-"
    got_q = np.asarray(qs.run(None, feed)[0], np.float64)
    got_ort = np.asarray(ort_run(path, 1)(feed)[0], np.float64)  # type: ignore[index]
    return f"{float(np.max(np.abs(got_q - got_ort))) / step:.0f}"


def float_ops(sess: Any) -> str:
    """The compute steps that stayed float in quanta's plan (op type counts)."""
    from collections import Counter

    heavy = {"Conv", "MatMul", "Gemm", "ConvTranspose"}
    c = Counter(s.op_type for s in sess.plan.steps if getattr(s, "op_type", "") in heavy)
    return ",".join(f"{k}x{v}" for k, v in sorted(c.items())) or "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(REAL))
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--cache", type=Path, default=BENCH_CACHE / "foreign")
    ap.add_argument("--force", action="store_true", help="quantize again even if the files exist")
    ap.add_argument("--no-openvino", dest="openvino", action="store_false", help="leave OpenVINO out")
    ap.add_argument(
        "--ort-float-orders",
        help="quanta's SessionOptions.ort_float_orders, comma-separated ('matmul,pool': "
        "the Conv groups ORT leaves float on quanta's exact integer sum; '' none)",
    )
    args = ap.parse_args(argv)
    global ORT_FLOAT_ORDERS
    if args.ort_float_orders is not None:
        ORT_FLOAT_ORDERS = frozenset(x for x in args.ort_float_orders.split(",") if x)
    args.cache.mkdir(parents=True, exist_ok=True)
    print("# median ms; q = quanta on the file, own = quanta on quanta's own file, ORT / OV on the file")
    print(
        f"{'model':<20} {'layout':<17} {'thr':>3} {'q':>8} {'own':>8} {'ORT':>8} {'OV':>8} "
        f"{'q/own':>6} {'q/ORT':>6} {'q/OV':>6} {'own/OV':>6} {'codes':>5}  float compute in quanta",
        flush=True,
    )
    for name in args.models.split(","):
        src, calib, feed, kind = model_and_feeds(name)
        files: dict[str, Path] = {}
        layouts = ["quanta"] + [x for x in args.layouts.split(",") if x != "quanta"]
        for layout in layouts:
            if layout in TEXT_ONLY and kind != "text":
                continue
            dst = args.cache / f"{name}.{layout}.onnx"
            if args.force or not dst.exists():
                try:
                    with contextlib.redirect_stdout(io.StringIO()):
                        quantize(layout, src, dst, calib)
                except Exception as e:  # a quantizer failing is a table row
                    print(
                        f"{name:<20} {layout:<17} quantization failed: {str(e).splitlines()[0][:90]}",
                        flush=True,
                    )
                    continue
            files[layout] = dst
        for layout, path in files.items():
            for threads in args.threads:
                try:
                    med, qs = compare(
                        path, files["quanta"], threads, feed, args.blocks, args.runs, args.openvino
                    )
                    codes = codes_from_ort(path, qs, feed) if threads == args.threads[0] else ""
                except Exception as e:  # an engine failing is a table row
                    print(
                        f"{name:<20} {layout:<17} {threads:>3} failed: {str(e).splitlines()[0][:90]}",
                        flush=True,
                    )
                    continue
                ovm = med.get("ov", float("nan"))
                print(
                    f"{name:<20} {layout:<17} {threads:>3} {med['q']:>8.2f} {med['own']:>8.2f} {med['ort']:>8.2f} "
                    f"{ovm:>8.2f} {med['q'] / med['own']:>6.2f} {med['q'] / med['ort']:>6.2f} "
                    f"{med['q'] / ovm:>6.2f} {med['own'] / ovm:>6.2f} {codes:>5}  {float_ops(qs)}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
