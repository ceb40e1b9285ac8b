"""Quantization-aware distillation (quanta.qat) on EfficientNet-Lite0: top-1 agreement
with FP32 of quanta's default PTQ and of the same file after QAD, within a wall-clock
budget on this machine. Not a test (minutes of CPU).

Model and data as benchmarks/real_models/accuracy.py (run its export.py first): the
FP32 ONNX in ``~/.cache/quanta-bench``; 100 calibration crops (seed 20240601) and 200
evaluation crops (seed 20240602) of scikit-learn's sample photos. QAD uses only the
calibration crops (no labels: the FP32 logits are the targets; 20 of the 100 are held
out for early stopping); the evaluation crops are used for nothing but the final
measurement.

    python benchmarks/qat.py [--budget 600] [--lr 0.002] [--batch 4] [--learn-scales]

Reported: agreement of PTQ and QAD (quanta native backend on the exported files, and
ONNX Runtime on the same files), the integer MAC share of the exported file, and whether
the exact fake-quantized PyTorch forward predicts the same classes as the exported file
run by quanta (and its largest logit difference).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "real_models"))

from accuracy import image_data  # noqa: E402
from export import DEFAULT_CACHE  # noqa: E402


def _logits(run, feeds) -> np.ndarray:
    return np.concatenate([run(f) for f in feeds])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=600.0, help="wall-clock seconds for PTQ + QAD + export")
    ap.add_argument("--lr", type=float, default=0.002, help="Adam step in LSBs of each parameter")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--learn-scales", action="store_true")
    ap.add_argument("--eval-images", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, help="keep the files in this folder")
    ap.add_argument(
        "--ptq",
        type=Path,
        help="reuse this quanta default PTQ file (the same model, data and recipe give these bytes)",
    )
    ap.add_argument("--sim-images", type=int, default=50, help="images for the fake-quant vs deployed check")
    args = ap.parse_args(argv)

    import onnx
    import onnxruntime as ort
    import torch

    import quanta
    from quanta.ir.onnx_io import from_proto
    from quanta.qat import QatModel, distill, export
    from quanta.runtime.coverage import lowered_coverage

    torch.set_num_threads(args.threads)
    src = Path(DEFAULT_CACHE) / "efficientnet_lite0.prep.onnx"
    calib, evals = image_data(100, args.eval_images, 1)
    out = args.out or Path(tempfile.mkdtemp(prefix="qat-bench-"))
    out.mkdir(parents=True, exist_ok=True)

    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    fp = ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    ref = _logits(lambda f: fp.run(None, f)[0], evals)
    top_ref = ref.argmax(1)

    def agreement(path: Path) -> tuple[float, float, np.ndarray]:
        q = quanta.InferenceSession(str(path))
        ours = _logits(lambda f: q.run(None, f)[0], evals)
        o = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        theirs = _logits(lambda f: o.run(None, f)[0], evals)
        return float((ours.argmax(1) == top_ref).mean()), float((theirs.argmax(1) == top_ref).mean()), ours

    t0 = time.perf_counter()
    ptq = out / "ptq.onnx"
    if args.ptq:
        ptq = args.ptq
    else:
        quanta.quantize_static(src, ptq, calib, verbose=False)
    t_ptq = time.perf_counter() - t0
    model = QatModel(
        onnx.load(ptq), learn_scales=args.learn_scales
    )  # = quanta.qat.prepare(src, calibration_data=calib)
    t_prep = time.perf_counter() - t0
    # the training loop gets what is left of the budget after PTQ, the teacher's logits
    # (inside distill, before its clock starts: ~10 s) and the export (~5 s)
    train_budget = max(30.0, args.budget - t_prep - 20.0)
    res = distill(
        model,
        src,
        calib,
        time_budget=train_budget,
        lr=args.lr,
        batch_size=args.batch,
        eval_every=5,
        patience=6,
    )
    qad = out / "qad.onnx"
    export(model, qad)
    t_total = time.perf_counter() - t0
    print(res.format())

    a_ptq = agreement(ptq)
    a_qad = agreement(qad)
    share = lowered_coverage(from_proto(onnx.load(qad)), {}).integer_share
    model.exact = True
    with torch.no_grad():
        sim = np.concatenate([model(torch.from_numpy(f["input"])).numpy() for f in evals[: args.sim_images]])
    dep = a_qad[2][: len(sim)]
    same = float((sim.argmax(1) == dep.argmax(1)).mean())
    maxdiff = float(np.abs(sim - dep).max())
    gap_closed = (a_qad[0] - a_ptq[0]) / max(1e-9, 1.0 - a_ptq[0])
    print(
        f"PTQ (quanta default): top-1 agreement {a_ptq[0]:.3f} (quanta native) / {a_ptq[1]:.3f} (ORT), {t_ptq:.0f} s"
    )
    print(
        f"QAD: top-1 agreement {a_qad[0]:.3f} (quanta native) / {a_qad[1]:.3f} (ORT); gap to FP32 closed "
        f"{gap_closed:.0%}; wall {t_total:.0f} s for PTQ + QAD + export ({res.steps} steps, "
        f"batch {args.batch}, lr {args.lr}, learn_scales={args.learn_scales})"
    )
    print(
        f"exported: integer MAC share {share:.4f}; exact fake-quant forward vs quanta native: same top-1 {same:.3f} on {len(sim)} images, max |logit diff| {maxdiff:.3g}"
    )
    print(
        "history (step, train loss, held-out loss):",
        [(s, round(a, 4), round(b, 4)) for s, a, b in res.history],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
