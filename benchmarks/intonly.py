"""Integer-only (npu-sim) accuracy on real models, against FP32 and quanta's usual int8 file.

Run: ``python benchmarks/intonly.py [--models efficientnet_lite0,all_minilm_l6_v2]
[--calib N] [--eval N]``. Needs the exported models of benchmarks/real_models/export.py
(``~/.cache/quanta-bench/*.prep.onnx``). Nothing here is a test; results go to
benchmarks/results/<date>-intonly.md by hand.

For each model:

- FP32: ONNX Runtime on the float file (the reference);
- ``int8 (float requant)``: ``quantize_static`` with the default recipe, run by a quanta
  session (native): the float-multiplier requantization of eq. (6);
- ``npu-sim (integer-only)``: ``quantize_static(..., target="npu-sim")``, lowered to the
  integer-only stage (``lower_for_npu``), the device partition verified (no float tensor
  in it), the Ethos-U profile checked, and run node by node: device nodes on the npu-sim
  kernels (C++ where they exist, else the golden), host nodes (input quantization, the
  float prologue/epilogue the partition leaves to the host) on the reference kernels.

EfficientNet-Lite0: top-1 agreement with FP32 on random 224x224 crops of scikit-image's
sample photos (benchmarks/zoo/zoodata.py's photos and crops; seeds 1001 / 1002). all-MiniLM-L6-v2: cosine of the
sentence embedding (the model's own mean pooling and normalization) against FP32, on
the zoo's sentences (benchmarks/zoo/zoodata.token_feeds, one sentence per batch).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "zoo"))
sys.path.insert(0, str(ROOT / "benchmarks" / "real_models"))

import quanta  # noqa: E402
from quanta.ir.onnx_io import load  # noqa: E402
from quanta.runtime.npu_sim import lower_for_npu, run_lowered  # noqa: E402

CACHE = Path.home() / ".cache" / "quanta-bench"


def ort_run(path: Path, feeds: list[dict]) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
    return [s.run(None, f)[0] for f in feeds]


def quanta_run(path: Path, feeds: list[dict]) -> list[np.ndarray]:
    s = quanta.InferenceSession(str(path), backend="native")
    return [s.run(None, f)[0] for f in feeds]


def npu_run(path: Path, feeds: list[dict], log: list[str]) -> list[np.ndarray]:
    model = load(str(path))
    t0 = time.perf_counter()
    rep = lower_for_npu(model, profile="ethos-u")
    log.append(f"lowered in {time.perf_counter() - t0:.1f} s")
    log.append(rep.summary())
    if rep.stage_problems:
        raise SystemExit("the device partition does not verify:\n" + "\n".join(rep.stage_problems))
    out = []
    t0 = time.perf_counter()
    for f in feeds:
        out.append(run_lowered(model, f)[0])
    log.append(f"ran {len(feeds)} feeds in {time.perf_counter() - t0:.1f} s")
    return out


def image_feeds(n: int, seed: int) -> list[dict]:
    """Random 224x224 crops of scikit-image's sample photos (zoodata's), ImageNet-normalized."""
    import zoodata

    rng = np.random.default_rng(seed)
    plist = zoodata.photos()
    return [
        {
            "input": zoodata.nchw(
                zoodata.random_crop(rng, plist[rng.integers(len(plist))], (224, 224)),
                (0.485, 0.456, 0.406),
                (0.229, 0.224, 0.225),
            )
        }
        for _ in range(n)
    ]


def efficientnet(n_calib: int, n_eval: int, tmp: Path) -> list[str]:
    src = CACHE / "efficientnet_lite0.prep.onnx"
    calib, evals = image_feeds(n_calib, zoodata_seed := 1001), image_feeds(n_eval, zoodata_seed + 1)
    log = [f"## EfficientNet-Lite0 ({n_calib} calibration, {n_eval} evaluation images)"]
    ref = np.concatenate(ort_run(src, evals))
    default = tmp / "effnet.int8.onnx"
    quanta.quantize_static(str(src), str(default), calib, verbose=False, progress=False)
    d = np.concatenate(quanta_run(default, evals))
    npu = tmp / "effnet.npu.onnx"
    quanta.quantize_static(str(src), str(npu), calib, target="npu-sim", verbose=False, progress=False)
    n = np.concatenate(npu_run(npu, evals, log))
    top = ref.argmax(1)
    a_d = float(np.mean(d.argmax(1) == top))
    a_n = float(np.mean(n.argmax(1) == top))
    log.append(
        f"top-1 agreement with FP32: int8 (float requant) {100 * a_d:.1f} %, npu-sim integer-only "
        f"{100 * a_n:.1f} % (difference {100 * (a_n - a_d):+.1f} points); npu-sim vs int8 file "
        f"{100 * float(np.mean(n.argmax(1) == d.argmax(1))):.1f} %"
    )
    return log


def minilm(n_calib: int, n_eval: int, tmp: Path) -> list[str]:
    import zoodata

    src = CACHE / "all_minilm_l6_v2.prep.onnx"
    vocab = Path.home() / ".cache" / "quanta-zoo" / "models" / "minilm_vocab.txt"
    calib = zoodata.token_feeds(vocab, "calib", n_calib, batch=1)
    evals = zoodata.token_feeds(vocab, "eval", n_eval, batch=1)
    log = [f"## all-MiniLM-L6-v2 ({n_calib} calibration, {len(evals)} evaluation sentences)"]
    ref = np.concatenate(ort_run(src, evals))
    npu = tmp / "minilm.npu.onnx"
    quanta.quantize_static(str(src), str(npu), calib, target="npu-sim", verbose=False, progress=False)
    got = np.concatenate(npu_run(npu, evals, log))
    qdq = np.concatenate(ort_run(npu, evals))  # the same file, float requantization (ORT)

    def cosines(a: np.ndarray) -> np.ndarray:
        r64, g64 = ref.astype(np.float64), a.astype(np.float64)
        return (r64 * g64).sum(1) / (np.linalg.norm(r64, axis=1) * np.linalg.norm(g64, axis=1))

    cos, cos_ort = cosines(got), cosines(qdq)

    def stats(c: np.ndarray) -> str:
        p1, p5, p50 = np.percentile(c, [1, 5, 50])
        return f"mean {c.mean():.4f}, min {c.min():.4f}, p1 {p1:.4f}, p5 {p5:.4f}, median {p50:.4f}"

    log.append(f"embedding cosine vs FP32: {stats(cos)}")
    log.append(f"the same file on ORT (float requantization): {stats(cos_ort)}")
    worst = np.argsort(cos)[:3]
    log.append("worst sentences (index: integer-only / ORT): " + ", ".join(
        f"{i}: {cos[i]:.4f} / {cos_ort[i]:.4f}" for i in worst
    ))  # fmt: skip
    return log


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="efficientnet_lite0,all_minilm_l6_v2")
    ap.add_argument("--calib", type=int, default=32)
    ap.add_argument("--eval", type=int, default=200)
    ap.add_argument(
        "--wide",
        help="npu-sim's int16 activation kinds, comma-separated (default: the recipe's; "
        "residual, gelu, gelu_input, softmax, outputs)",
    )
    args = ap.parse_args(argv)
    if args.wide is not None:
        from quanta.quantize.recipe import TARGETS

        TARGETS["npu-sim"]["wide_activations"] = tuple(k for k in args.wide.split(",") if k)
    with tempfile.TemporaryDirectory() as d:
        for name in args.models.split(","):
            fn = {"efficientnet_lite0": efficientnet, "all_minilm_l6_v2": minilm}[name]
            print("\n".join(fn(args.calib, args.eval, Path(d))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
