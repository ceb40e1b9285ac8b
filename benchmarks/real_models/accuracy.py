"""Side-by-side int8 accuracy of ONNX Runtime's and quanta's static quantization on two
real models: EfficientNet-Lite0 (ImageNet CNN) and all-MiniLM-L6-v2 (BERT sentence
embeddings). Not a test: nothing here runs in CI, and no model file is committed.

Run ``export.py`` first (it writes the FP32 models into the cache), then::

    python benchmarks/real_models/accuracy.py                    # both models, default configs
    python benchmarks/real_models/accuracy.py --models all_minilm_l6_v2 --configs ort_default,quanta_default
    python benchmarks/real_models/accuracy.py --write-doc docs/accuracy.md

For each model, in one run, with the same calibration and evaluation data:

- FP32, run by ONNX Runtime (the reference every number is measured against);
- ``onnxruntime.quantization.quantize_static`` with its defaults (QDQ, MinMax, per tensor,
  int8 activations and weights) and with ``per_channel=True``;
- ``quanta.quantize_static`` with its defaults and with ``method`` entropy / percentile / mse;
- optional extra configurations (``--configs``, see ``CONFIGS``).

Every quantized model (a QDQ ONNX file) is run by ONNX Runtime, so the comparison
isolates the quantization choices, not the runtime. Metrics against FP32: top-1 agreement
and logit SQNR (EfficientNet); mean / min cosine of the sentence embeddings and their SQNR
(MiniLM); plus file size and quantization wall time (calibration included). quanta's
reference backend also runs quanta's files (``--reference-configs``) on one batch, lowered
and as written, against ONNX Runtime the same two ways (``reference_check``).

Data (nothing is downloaded):

- images: random crops (scale 5-100 % of the area, aspect 3/4-4/3), horizontal flips and
  rescales of the two photographs scikit-learn ships (``china.jpg``, ``flower.jpg``),
  resized to 224x224, ImageNet mean/std, NCHW. Calibration (100) and evaluation (200)
  come from different random streams; every crop is distinct (checked by hash).
- sentences: ``sentences.txt`` beside this file (306 sentences of 1 to ~50 words),
  shuffled with a fixed seed; calibration 100 / evaluation the rest; batches of 8 padded
  to the longest sentence of the batch, so the sequence length varies from batch to batch.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from export import (  # noqa: E402  (this folder is not a package)
    DEFAULT_CACHE,
    EFFICIENTNET,
    MINILM,
    MINILM_INPUTS,
    load_minilm_tokenizer,
    model_paths,
)

Feed = dict[str, np.ndarray]

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)


# ----------------------------------------------------------------------------- data


def _random_crops(n: int, seed: int, size: int = 224) -> np.ndarray:
    """``n`` distinct random crops of scikit-learn's sample photos, uint8 [n, size, size, 3]."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = [Image.fromarray(a) for a in load_sample_images().images]
    rng = np.random.default_rng(seed)
    out = np.empty((n, size, size, 3), np.uint8)
    for i in range(n):
        photo = photos[i % len(photos)]
        w, h = photo.size
        area = rng.uniform(0.05, 1.0) * w * h
        aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        cw = int(min(w, round(np.sqrt(area * aspect))))
        ch = int(min(h, round(np.sqrt(area / aspect))))
        x0 = int(rng.integers(0, w - cw + 1))
        y0 = int(rng.integers(0, h - ch + 1))
        img = photo.crop((x0, y0, x0 + cw, y0 + ch)).resize((size, size), Image.BILINEAR)
        if rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        out[i] = np.asarray(img)
    return out


def _imagenet(batch_u8: np.ndarray) -> np.ndarray:
    x = (batch_u8.astype(np.float32) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def _batches(x: np.ndarray, batch: int, name: str) -> list[Feed]:
    return [{name: x[i : i + batch]} for i in range(0, len(x), batch)]


def image_data(n_calib: int, n_eval: int, batch: int) -> tuple[list[Feed], list[Feed]]:
    calib = _random_crops(n_calib, seed=20240601)
    evals = _random_crops(n_eval, seed=20240602)
    digests = {hashlib.sha1(a.tobytes()).hexdigest() for a in np.concatenate([calib, evals])}
    if len(digests) != n_calib + n_eval:
        raise RuntimeError("image crops are not all distinct")
    return _batches(_imagenet(calib), batch, "input"), _batches(_imagenet(evals), batch, "input")


def sentence_data(n_calib: int, batch: int) -> tuple[list[Feed], list[Feed]]:
    lines = [
        s.strip() for s in (HERE / "sentences.txt").read_text(encoding="utf-8").splitlines() if s.strip()
    ]
    order = np.random.default_rng(7).permutation(len(lines))
    lines = [lines[i] for i in order]
    tok = load_minilm_tokenizer()

    def encode(sents: Sequence[str]) -> list[Feed]:
        feeds = []
        for i in range(0, len(sents), batch):
            enc = tok(
                list(sents[i : i + batch]), padding=True, truncation=True, max_length=128, return_tensors="np"
            )
            feeds.append({k: enc[k].astype(np.int64) for k in MINILM_INPUTS})
        return feeds

    return encode(lines[:n_calib]), encode(lines[n_calib:])


# ----------------------------------------------------------------------------- runs


class _Reader:
    """ONNX Runtime's CalibrationDataReader protocol over a list of feeds."""

    def __init__(self, feeds: list[Feed]) -> None:
        self.feeds = feeds
        self.it = iter(feeds)

    def get_next(self) -> Feed | None:
        return next(self.it, None)

    def rewind(self) -> None:
        self.it = iter(self.feeds)


def ort_session(path: Path, *, optimize: bool = True) -> Any:
    """ONNX Runtime as users run it (``optimize``: QDQ fused into integer kernels), or with
    graph optimisations off (every DQ/op/Q runs as written: the spec's QDQ semantics)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def run_ort(path: Path, feeds: list[Feed]) -> np.ndarray:
    sess = ort_session(path)
    return np.concatenate([sess.run(None, f)[0] for f in feeds])


def quantize_ort(src: Path, dst: Path, calib: list[Feed], **kw: Any) -> str:
    from onnxruntime.quantization import CalibrationMethod, quantize_static

    if isinstance(kw.get("calibrate_method"), str):
        kw["calibrate_method"] = getattr(CalibrationMethod, kw["calibrate_method"])
    quantize_static(str(src), str(dst), _Reader(calib), **kw)
    return ""


def quantize_quanta(src: Path, dst: Path, calib: list[Feed], **kw: Any) -> str:
    import quanta

    if "__target__" in kw:
        kw = {**{k: v for k, v in kw.items() if k != "__target__"}, **_target(*kw["__target__"])}
    summary = quanta.quantize_static(str(src), str(dst), calib, verbose=False, progress=False, **kw)
    return summary.format(max_rows=60)


@dataclass(frozen=True)
class Config:
    name: str
    label: str
    quantize: Callable[..., str]
    options: dict[str, Any] = field(default_factory=dict)
    models: tuple[str, ...] = (EFFICIENTNET, MINILM)  # where the configuration means something


# MiniLM recipes found with this benchmark (docs/accuracy.md): the residual stream and the
# input of each FFN down-projection (GELU output, values up to ~25 with std ~0.26) are what
# 8-bit per-tensor activations cannot hold.
_FFN_DOWN = r".*layer\.[0-9]+/output/dense/MatMul"
_RESIDUAL_ADD = r".*/output/Add"

CONFIGS: dict[str, Config] = {
    c.name: c
    for c in [
        Config("ort_default", "ORT defaults (MinMax, per-tensor)", quantize_ort),
        Config("ort_per_channel", "ORT per_channel=True", quantize_ort, {"per_channel": True}),
        Config("quanta_default", "quanta defaults", quantize_quanta),
        Config("quanta_entropy", "quanta method=entropy", quantize_quanta, {"method": "entropy"}),
        Config("quanta_percentile", "quanta method=percentile", quantize_quanta, {"method": "percentile"}),
        Config("quanta_mse", "quanta method=mse", quantize_quanta, {"method": "mse"}),
        # extras (--configs all, or by name)
        Config(
            "ort_entropy",
            "ORT per_channel, Entropy",
            quantize_ort,
            {"per_channel": True, "calibrate_method": "Entropy"},
        ),
        Config(
            "ort_percentile",
            "ORT per_channel, Percentile",
            quantize_ort,
            {"per_channel": True, "calibrate_method": "Percentile"},
        ),
        Config(
            "ort_matmul_only",
            "ORT per_channel, op_types=[MatMul]",
            quantize_ort,
            {"per_channel": True, "op_types_to_quantize": ["MatMul"]},
            (MINILM,),
        ),
        Config("quanta_per_tensor", "quanta per_channel=False", quantize_quanta, {"per_channel": False}),
        Config(
            "quanta_matmul_only",
            "quanta op_types=[MatMul]",
            quantize_quanta,
            {"op_types": ["MatMul"]},
            (MINILM,),
        ),
        Config(
            "quanta_float_residual_ffn",
            "quanta defaults, exclude residual Adds + FFN down-proj",
            quantize_quanta,
            {"exclude": [_RESIDUAL_ADD, _FFN_DOWN, _FFN_DOWN.replace("MatMul", "Add")]},
            (MINILM,),
        ),
        Config(
            "quanta_matmul_ffn_float",
            "quanta op_types=[MatMul], exclude FFN down-proj",
            quantize_quanta,
            {"op_types": ["MatMul"], "exclude": [_FFN_DOWN]},
            (MINILM,),
        ),
    ]
}


def _target(metric: str, minimum: float) -> dict[str, Any]:
    import quanta

    # a few trials: on this shared 2-core machine one EfficientNet trial takes minutes
    return {"accuracy": quanta.AccuracyTarget(metric=metric, minimum=minimum, max_steps=6, debug_feeds=1)}


# accuracy-driven quantization (docs/debugger.md): the target is searched on a held-out part
# of the calibration data, never on the evaluation data
CONFIGS.update(
    {
        c.name: c
        for c in [
            Config(
                "quanta_gptq", "quanta weight_rounding=gptq", quantize_quanta, {"weight_rounding": "gptq"}
            ),
            Config(
                "quanta_target_agreement",
                "quanta, target top-1 agreement 0.98",
                quantize_quanta,
                {"__target__": ("top1_agreement", 0.98)},
                (EFFICIENTNET,),
            ),
            Config(
                "quanta_target_cosine",
                "quanta, target mean cosine 0.998",
                quantize_quanta,
                {"__target__": ("mean_cosine", 0.998)},
                (MINILM,),
            ),
        ]
    }
)
DEFAULT_CONFIGS = [
    "ort_default",
    "ort_per_channel",
    "quanta_default",
    "quanta_entropy",
    "quanta_percentile",
    "quanta_mse",
]


def _fix_ort_types(opts: dict[str, Any]) -> dict[str, Any]:
    from onnxruntime.quantization import QuantType

    return {
        k: getattr(QuantType, v) if k.endswith("_type") and isinstance(v, str) else v for k, v in opts.items()
    }


# ----------------------------------------------------------------------------- metrics


def sqnr_db(ref: np.ndarray, got: np.ndarray) -> float:
    """10·log10(Σ ref² / Σ (ref − got)²) over every element."""
    noise = float(np.sum((ref.astype(np.float64) - got) ** 2))
    signal = float(np.sum(ref.astype(np.float64) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(signal / noise)


def cosines(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    ref = ref.astype(np.float64)
    got = got.astype(np.float64)
    return np.sum(ref * got, 1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1) + 1e-30)


@dataclass
class Row:
    model: str
    config: str
    label: str
    size_mb: float
    seconds: float | None
    metrics: dict[str, float]
    error: str = ""


def metrics_for(model: str, ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    if model == EFFICIENTNET:
        return {
            "top1_agreement": float(np.mean(ref.argmax(1) == got.argmax(1))),
            "sqnr_db": sqnr_db(ref, got),
        }
    cos = cosines(ref, got)
    return {"mean_cosine": float(cos.mean()), "min_cosine": float(cos.min()), "sqnr_db": sqnr_db(ref, got)}


# ----------------------------------------------------------------------------- driver


def benchmark_model(
    model: str, cache: Path, out_dir: Path, configs: list[str], args: argparse.Namespace, log: list[str]
) -> tuple[list[Row], dict[str, Any]]:
    _, fp32 = model_paths(cache, model)
    if not fp32.exists():
        raise SystemExit(f"{fp32} is missing: run benchmarks/real_models/export.py first")
    if model == EFFICIENTNET:
        calib, evals = image_data(args.calib_images, args.eval_images, args.batch)
    else:
        calib, evals = sentence_data(args.calib_sentences, 8)
    n_calib = sum(len(next(iter(f.values()))) for f in calib)
    n_eval = sum(len(next(iter(f.values()))) for f in evals)
    info: dict[str, Any] = {"calibration_samples": n_calib, "evaluation_samples": n_eval}
    if model == MINILM:
        lens = [f["input_ids"].shape[1] for f in calib + evals]
        info["sequence_lengths"] = f"{min(lens)}-{max(lens)} tokens per batch"
    print(f"\n=== {model}: {n_calib} calibration / {n_eval} evaluation samples", flush=True)
    ref = run_ort(fp32, evals)
    rows = [
        Row(
            model,
            "fp32",
            "FP32 (ONNX Runtime)",
            fp32.stat().st_size / 1e6,
            None,
            metrics_for(model, ref, ref),
        )
    ]
    if model == EFFICIENTNET:
        info["fp32_top1_classes"] = len(np.unique(ref.argmax(1)))
    for name in configs:
        cfg = CONFIGS[name]
        if model not in cfg.models:
            continue
        dst = out_dir / f"{model}.{name}.onnx"
        dst.unlink(missing_ok=True)
        opts = _fix_ort_types(cfg.options) if cfg.quantize is quantize_ort else dict(cfg.options)
        print(f"--- {name}: {cfg.label}", flush=True)
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                summary = cfg.quantize(fp32, dst, calib, **opts)
            seconds = time.perf_counter() - t0
        except Exception as e:
            tb = traceback.format_exc()
            log.append(f"## {model} / {name}: quantization FAILED\n\n```\n{tb}```\n")
            print(f"    FAILED: {type(e).__name__}: {e}", flush=True)
            rows.append(Row(model, name, cfg.label, 0.0, None, {}, f"quantize: {type(e).__name__}: {e}"))
            continue
        if summary:
            log.append(f"## {model} / {name}: quanta summary\n\n```\n{summary}\n```\n")
        try:
            got = run_ort(dst, evals)
        except Exception as e:
            log.append(f"## {model} / {name}: ONNX Runtime run FAILED\n\n```\n{traceback.format_exc()}```\n")
            print(f"    ORT run FAILED: {type(e).__name__}: {e}", flush=True)
            rows.append(Row(model, name, cfg.label, dst.stat().st_size / 1e6, seconds, {}, f"ORT run: {e}"))
            continue
        m = metrics_for(model, ref, got)
        rows.append(Row(model, name, cfg.label, dst.stat().st_size / 1e6, seconds, m))
        print("    " + ", ".join(f"{k} {v:.4f}" for k, v in m.items()) + f", {seconds:.1f} s", flush=True)
    if not args.skip_reference:
        for name in args.reference_configs.split(","):
            if name in configs and model in CONFIGS[name].models:
                print(f"--- reference backend check on {name}", flush=True)
                info[f"reference_vs_ort[{name}]"] = reference_check(
                    out_dir / f"{model}.{name}.onnx", evals[0], log, model
                )
    return rows, info


def _with_q_outputs(path: Path) -> tuple[bytes, list[str]]:
    """The model with every QuantizeLinear output listed as a graph output too."""
    import onnx

    proto = onnx.load(str(path))
    outs = {o.name for o in proto.graph.output}
    names = [
        n.output[0] for n in proto.graph.node if n.op_type == "QuantizeLinear" and n.output[0] not in outs
    ]
    # ONNX Runtime wants a type on graph outputs: take them from shape inference.
    inferred = onnx.shape_inference.infer_shapes(proto)
    types = {v.name: v.type for v in inferred.graph.value_info}
    missing = [n for n in names if n not in types]
    if missing:
        raise RuntimeError(f"shape inference gave no type for {missing[:5]}")
    for name in names:
        vi = onnx.ValueInfoProto(name=name)
        vi.type.CopyFrom(types[name])
        proto.graph.output.append(vi)
    return proto.SerializeToString(), names


def reference_check(path: Path, feed: Feed, log: list[str], model: str) -> dict[str, Any]:
    """quanta's reference backend vs ONNX Runtime on the same quanta-made QDQ file, both ways
    each of them runs it:

    - ``lowered``: default session options on both sides (QDQ groups fused into integer
      operators: ORT's QLinear kernels, quanta's lowering pipeline); float output compared.
    - ``as_written``: graph optimisations off on both sides (every DQ / float op / Q runs as
      written); float output compared, and every quantized tensor (each QuantizeLinear
      output, exposed as a graph output) compared in integer steps (LSB). A one-step
      rounding difference early in the network propagates, so the first differing tensor
      shows whether the two agree where their inputs are identical, and the largest step
      difference over all tensors how far such a difference travels.
    """
    if not path.exists():
        return {"error": f"{path.name} was not written"}
    import onnxruntime as ort

    import quanta
    from quanta.session import GraphOptimizationLevel, SessionOptions

    out: dict[str, Any] = {"batch": len(next(iter(feed.values())))}
    try:
        t0 = time.perf_counter()
        lowered = quanta.InferenceSession(str(path), backend="reference").run(None, feed)[0]
        out["seconds_lowered"] = round(time.perf_counter() - t0, 1)
        model_bytes, q_names = _with_q_outputs(path)
        opts = SessionOptions(graph_optimization_level=GraphOptimizationLevel.ORT_DISABLE_ALL)
        t0 = time.perf_counter()
        written = quanta.InferenceSession(model_bytes, opts, backend="reference").run(None, feed)
        out["seconds_as_written"] = round(time.perf_counter() - t0, 1)
    except Exception as e:
        log.append(
            f"## {model}: quanta reference backend FAILED on {path.name}\n\n```\n{traceback.format_exc()}```\n"
        )
        print(f"    reference backend FAILED: {type(e).__name__}: {e}", flush=True)
        return {"error": f"{type(e).__name__}: {e}"}
    ort_lowered = ort_session(path).run(None, feed)[0]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    ort_written = ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"]).run(None, feed)

    def compare(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
        r: dict[str, Any] = {"max_abs_diff": float(np.abs(a.astype(np.float64) - b).max())}
        if model == EFFICIENTNET:
            r["top1_equal"] = bool(np.all(a.argmax(1) == b.argmax(1)))
        else:
            r["min_cosine"] = float(cosines(a, b).min())
        return r

    out["output_max_abs"] = float(np.abs(ort_lowered).max())
    out["lowered"] = compare(lowered, ort_lowered)
    out["as_written"] = compare(written[0], ort_written[0])
    out["ort_lowered_vs_ort_as_written"] = compare(ort_lowered, ort_written[0])
    n_out = len(written) - len(q_names)
    steps = [
        np.abs(a.astype(np.int64) - b.astype(np.int64)) for a, b in zip(written[n_out:], ort_written[n_out:])
    ]
    if steps:
        aw = out["as_written"]
        aw["quantized_tensors"] = len(steps)
        aw["tensors_differing"] = sum(1 for d in steps if d.max() > 0)
        aw["max_lsb_diff"] = max(int(d.max()) for d in steps)
        aw["elements_differing"] = float(sum(int((d > 0).sum()) for d in steps) / sum(d.size for d in steps))
        first = next((k for k, d in enumerate(steps) if d.max() > 0), None)
        if first is not None:
            d = steps[first]
            aw["first_differing_tensor"] = (
                f"{q_names[first]} (#{first}, max {int(d.max())} LSB, {float(np.mean(d > 0)):.1e} of elements)"
            )
    print(f"    {out}", flush=True)
    return out


# ----------------------------------------------------------------------------- report


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}, Python {platform.python_version()}"


def versions() -> str:
    from importlib.metadata import version

    return ", ".join(f"{n} {version(n)}" for n in ("onnxruntime", "onnx", "torch", "numpy"))


def table(rows: list[Row]) -> str:
    out = []
    for model in dict.fromkeys(r.model for r in rows):
        mr = [r for r in rows if r.model == model]
        if model == EFFICIENTNET:
            head = "| configuration | top-1 agreement | logit SQNR (dB) | size (MB) | quantize time (s) |"
            sep = "|---|---:|---:|---:|---:|"
        else:
            head = "| configuration | mean cosine | min cosine | SQNR (dB) | size (MB) | quantize time (s) |"
            sep = "|---|---:|---:|---:|---:|---:|"
        out += [f"**{model}**", "", head, sep]
        for r in mr:
            t = "—" if r.seconds is None else f"{r.seconds:.1f}"
            if r.error:
                blanks = " |" * (1 if model == EFFICIENTNET else 2)
                out.append(f"| {r.label} | FAILED ({r.error[:100]}) |{blanks} — | — |")
                continue
            m = r.metrics
            sq = "∞" if m["sqnr_db"] == float("inf") else f"{m['sqnr_db']:.1f}"
            if model == EFFICIENTNET:
                out.append(
                    f"| {r.label} | {100 * m['top1_agreement']:.1f} % | {sq} | {r.size_mb:.1f} | {t} |"
                )
            else:
                out.append(
                    f"| {r.label} | {m['mean_cosine']:.4f} | {m['min_cosine']:.4f} | {sq} | {r.size_mb:.1f} | {t} |"
                )
        out.append("")
    return "\n".join(out)


def reference_table(infos: dict[str, Any]) -> str:
    out = [
        "| model / quanta file | reference (lowered) vs ORT (optimized) | reference vs ORT, both as written "
        "| ORT optimized vs ORT as written | quantized tensors that differ (as written) | first difference |",
        "|---|---|---|---|---|---|",
    ]

    def cell(r: dict[str, Any]) -> str:
        extra = f"top-1 same: {r['top1_equal']}" if "top1_equal" in r else f"min cos {r['min_cosine']:.4f}"
        return f"max abs {r['max_abs_diff']:.3g} ({extra})"

    for model, info in infos.items():
        for key, r in info.items():
            if not key.startswith("reference_vs_ort"):
                continue
            name = key[key.index("[") + 1 : -1]
            if "error" in r:
                out.append(f"| {model} / {name} | FAILED: {r['error'][:120]} | | | | |")
                continue
            aw = r["as_written"]
            out.append(
                f"| {model} / {name} (batch {r['batch']}, outputs up to {r['output_max_abs']:.3g}) "
                f"| {cell(r['lowered'])} | {cell(aw)} | {cell(r['ort_lowered_vs_ort_as_written'])} "
                f"| {aw.get('tensors_differing', 0)} of {aw.get('quantized_tensors', 0)}, "
                f"max {aw.get('max_lsb_diff', 0)} LSB, {100 * aw.get('elements_differing', 0):.2f} % of elements "
                f"| {aw.get('first_differing_tensor', 'none')} |"
            )
    return "\n".join(out)


def data_lines(infos: dict[str, Any]) -> str:
    lines = []
    for model, info in infos.items():
        d = {k: v for k, v in info.items() if not k.startswith("reference_vs_ort")}
        lines.append(f"- {model}: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in d.items()))
    return "\n".join(lines)


def write_doc(path: Path, text: str) -> None:
    """Replace the block between the results markers of ``path`` (or append one)."""
    begin, end = "<!-- results:begin -->", "<!-- results:end -->"
    block = f"{begin}\n{text}\n{end}"
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    if begin in old and end in old:
        new = old[: old.index(begin)] + block + old[old.index(end) + len(end) :]
    else:
        new = old + ("\n" if old else "") + block + "\n"
    path.write_text(new, encoding="utf-8")


def run_dir(cache: Path, out: Path | None) -> Path:
    """Where this run writes its quantized files: ``out``, or a fresh folder of its own
    under ``<cache>/runs`` (runs sharing the cache never overwrite each other's files),
    which ``<cache>/quantized`` then points to (diagnose.py reads it)."""
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        return out
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    d = cache / "runs" / f"{stamp}-{os.getpid()}"
    d.mkdir(parents=True)
    link = cache / "quantized"
    if link.exists() and not link.is_symlink():
        print(
            f"note: {link} is a folder (an older layout); left as it is, not pointed to this run", flush=True
        )
        return d
    tmp = cache / f".quantized-{os.getpid()}"
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(d.relative_to(cache))
        tmp.replace(link)  # atomic: a concurrent reader sees the old run or this one
    return d


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--models", default=f"{EFFICIENTNET},{MINILM}")
    ap.add_argument(
        "--configs", default=",".join(DEFAULT_CONFIGS), help=f"'all', or from: {', '.join(CONFIGS)}"
    )
    ap.add_argument("--calib-images", type=int, default=100)
    ap.add_argument("--eval-images", type=int, default=200)
    ap.add_argument("--calib-sentences", type=int, default=100)
    ap.add_argument("--batch", type=int, default=10, help="images per batch")
    ap.add_argument("--skip-reference", action="store_true", help="skip the reference-backend check")
    ap.add_argument(
        "--reference-configs",
        default="quanta_default,quanta_matmul_ffn_float",
        help="quanta files (those run) that the reference backend also runs, on one evaluation batch",
    )
    ap.add_argument(
        "--out", type=Path, help="write the quantized files here (default: a new <cache>/runs/ folder)"
    )
    ap.add_argument("--json", type=Path, help="also write the results as JSON")
    ap.add_argument("--log", type=Path, help="write quanta summaries and tracebacks here")
    ap.add_argument("--write-doc", type=Path, help="replace the results block of this markdown file")
    ap.add_argument(
        "--render", type=Path, help="run nothing: print (and --write-doc) the results of a --json file"
    )
    args = ap.parse_args(argv)
    configs = list(CONFIGS) if args.configs == "all" else [c for c in args.configs.split(",") if c]
    for c in configs:
        if c not in CONFIGS:
            ap.error(f"--configs: unknown configuration {c!r}; expected one of {', '.join(CONFIGS)}")
    cache = args.cache.expanduser()
    if args.render:
        saved = json.loads(args.render.read_text())
        rows = [Row(**r) for r in saved["rows"]]
        infos, when, where, vers = saved["info"], saved["when"], saved["machine"], saved["versions"]
    else:
        rows = []
        infos = {}
        log: list[str] = []
        out_dir = run_dir(cache, args.out)
        print(f"quantized files: {out_dir}", flush=True)
        for model in args.models.split(","):
            r, info = benchmark_model(model, cache, out_dir, configs, args, log)
            rows += r
            infos[model] = info
        when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        where, vers = machine(), versions()
        if args.log:
            args.log.write_text("\n".join(log), encoding="utf-8")
    text = "\n".join(
        [
            f"Run {when} on {where}; {vers}.",
            "",
            table(rows),
            "Data:",
            "",
            data_lines(infos),
            "",
            "quanta's reference backend against ONNX Runtime on the same file (one evaluation batch):",
            "",
            reference_table(infos)
            if any(k.startswith("reference_vs_ort") for i in infos.values() for k in i)
            else "(not run)",
        ]
    )
    print("\n" + text)
    if args.json and not args.render:
        saved = {
            "when": when,
            "machine": where,
            "versions": vers,
            "info": infos,
            "rows": [r.__dict__ for r in rows],
        }
        args.json.write_text(json.dumps(saved, indent=2))
    if args.write_doc:
        write_doc(args.write_doc, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
