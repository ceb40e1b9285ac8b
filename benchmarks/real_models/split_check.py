"""What EfficientNet-Lite0's top-1 agreement on accuracy.py's evaluation split can say.

The split is 200 random crops of scikit-learn's two sample photographs (accuracy.py
``image_data``), and the agreement is a count of crops whose FP32 argmax the quantized
file keeps. This prints, in one run:

- the FP32 model on the crops: how many distinct top-1 classes, the top-1/top-2 logit
  margin (median, quartiles, how many crops below 0.1 / 0.25 / 0.5);
- the count's uncertainty: the Clopper-Pearson 95 % interval of k of n agreeing (docs/accuracy.md
  eq. (A13a)), and the chance that a file whose agreement on crops like these is p measures
  >= ``--bar`` (eq. (A13b));
- how fragile FP32's own top-1 is on these crops: its agreement with itself when the
  image gets Gaussian noise of 0.5 / 1 grey level (of 255) or is JPEG re-encoded at
  quality 90, and with its weights rounded to float16;
- the same margins, and the half-grey-level noise test, under EfficientNet-Lite's own
  normalisation ((v - 127) / 128, the TF builders' mean 127 / std 128) instead of
  accuracy.py's ImageNet mean / std;
- for each quantized file given (run by ONNX Runtime): its agreement, logit SQNR, the
  crops that flip and their FP32 margins (rank among the split's margins, 0 the smallest),
  and its agreement on the crops whose FP32 margin is at least 0.1 / 0.25.

    python benchmarks/real_models/split_check.py [QDQ.onnx ...] [--bar 0.98]

Not a test; nothing is written. The numbers of 2026-12-07 are in
benchmarks/results/2026-12-07h-acc13.md.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import accuracy as A  # noqa: E402  (this folder is not a package)
from export import DEFAULT_CACHE, EFFICIENTNET, model_paths  # noqa: E402

N_CALIB, N_EVAL, BATCH = 100, 200, 10


def margins(logits: np.ndarray) -> np.ndarray:
    s = np.sort(logits, axis=1)
    return s[:, -1] - s[:, -2]


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact binomial interval of an agreement of k crops of n (docs/accuracy.md eq. (A13a))."""
    from scipy import stats

    a = (1 - level) / 2
    lo = float(stats.beta.ppf(a, k, n - k + 1)) if k > 0 else 0.0
    hi = float(stats.beta.ppf(1 - a, k + 1, n - k)) if k < n else 1.0
    return lo, hi


def run(path: Path | str, x: np.ndarray) -> np.ndarray:
    return A.run_ort(Path(path), A._batches(x, BATCH, "input"))


def agreement(ref: np.ndarray, got: np.ndarray) -> float:
    return float(np.mean(ref.argmax(1) == got.argmax(1)))


def describe(name: str, logits: np.ndarray) -> None:
    m = margins(logits)
    classes, counts = np.unique(logits.argmax(1), return_counts=True)
    top = np.argsort(-counts)[:6]
    print(
        f"{name}: {len(logits)} crops, {classes.size} distinct FP32 top-1 classes (most: "
        + ", ".join(f"{classes[i]} x{counts[i]}" for i in top)
        + f"); top-1/top-2 logit margin median {np.median(m):.3f}, quartiles "
        f"{np.percentile(m, 25):.3f} / {np.percentile(m, 75):.3f}; below 0.1: {int((m < 0.1).sum())}, "
        f"0.25: {int((m < 0.25).sum())}, 0.5: {int((m < 0.5).sum())}"
    )


def main(argv: list[str] | None = None) -> int:
    from PIL import Image
    from scipy import stats

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("files", nargs="*", type=Path, help="quantized EfficientNet-Lite0 files (QDQ)")
    ap.add_argument("--bar", type=float, default=0.98)
    args = ap.parse_args(argv)

    _, fp32 = model_paths(DEFAULT_CACHE, EFFICIENTNET)
    crops = A._random_crops(N_EVAL, seed=20240602)
    x = A._imagenet(crops)
    ref = run(fp32, x)
    describe("evaluation split", ref)
    describe("calibration split", run(fp32, A._imagenet(A._random_crops(N_CALIB, seed=20240601))))

    n = len(ref)
    need = int(np.ceil(args.bar * n - 1e-9))
    lo, hi = clopper_pearson(need, n)
    print(
        f"\n{args.bar} of {n} is {need} crops ({n - need} flips allowed); {need}/{n}: 95 % interval [{lo:.3f}, {hi:.3f}]"
    )
    for p in (0.95, 0.96, 0.97, 0.98, 0.99):  # eq. (A13b)
        print(
            f"  a file agreeing with probability {p} per crop measures >= {args.bar}: {stats.binom.sf(need - 1, n, p):.3f}"
        )

    print("\nFP32 against itself:")
    rng = np.random.default_rng(0)
    std = A.IMAGENET_STD.reshape(1, 3, 1, 1)
    for grey in (0.5, 1.0):
        noisy = (x + rng.normal(0.0, grey / 255, x.shape).astype(np.float32) / std).astype(np.float32)
        got = run(fp32, noisy)
        print(
            f"  image + N(0, {grey}/255) noise: top-1 {agreement(ref, got):.3f}, {A.sqnr_db(ref, got):.2f} dB"
        )
    jpeg = []
    for c in crops:
        buf = io.BytesIO()
        Image.fromarray(c).save(buf, "JPEG", quality=90)
        jpeg.append(np.asarray(Image.open(buf).convert("RGB")))
    got = run(fp32, A._imagenet(np.stack(jpeg)))
    print(f"  JPEG re-encoded (quality 90): top-1 {agreement(ref, got):.3f}, {A.sqnr_db(ref, got):.2f} dB")
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(fp32))
    for init in m.graph.initializer:
        a = numpy_helper.to_array(init)
        if a.dtype == np.float32:
            init.CopyFrom(numpy_helper.from_array(a.astype(np.float16).astype(np.float32), init.name))
    buf16 = io.BytesIO()
    onnx.save(m, buf16)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        p16 = Path(tmp) / "fp16w.onnx"
        p16.write_bytes(buf16.getvalue())
        got = run(p16, x)
    print(f"  weights rounded to float16: top-1 {agreement(ref, got):.3f}, {A.sqnr_db(ref, got):.2f} dB")

    # EfficientNet-Lite's TF preprocessing maps a pixel v to (v - 127) / 128
    tf = np.ascontiguousarray(((crops.astype(np.float32) - 127.0) / 128.0).transpose(0, 3, 1, 2))
    ref_tf = run(fp32, tf)
    describe("\nthe same crops, (v - 127) / 128 normalisation", ref_tf)
    noisy = (tf + rng.normal(0.0, 0.5 / 128, tf.shape).astype(np.float32)).astype(np.float32)
    got = run(fp32, noisy)
    print(f"  FP32 against itself, image + N(0, 0.5/255) noise: top-1 {agreement(ref_tf, got):.3f}")

    rank = np.argsort(np.argsort(margins(ref)))
    for f in args.files:
        got = run(f, x)
        flips = np.nonzero(ref.argmax(1) != got.argmax(1))[0]
        k = n - flips.size
        lo, hi = clopper_pearson(k, n)
        print(
            f"\n{f}: top-1 {k}/{n} = {k / n:.3f} (95 % [{lo:.3f}, {hi:.3f}]), {A.sqnr_db(ref, got):.2f} dB; "
            f"flips {flips.tolist()}, FP32 margins {[round(float(v), 3) for v in margins(ref)[flips]]}, "
            f"margin ranks {rank[flips].tolist()}"
        )
        keep = ref.argmax(1) == got.argmax(1)
        for floor in (0.1, 0.25):
            sel = margins(ref) >= floor
            print(f"  crops with FP32 margin >= {floor}: {int(keep[sel].sum())}/{int(sel.sum())} agree")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
