"""Quantization-aware distillation (quanta.qat) on EfficientNet-Lite0: top-1 agreement
with FP32 of quanta's default PTQ and of the same file after QAD, within a wall-clock
budget on this machine. Not a test (minutes of CPU).

Model and data as benchmarks/real_models/accuracy.py (run its export.py first): the
FP32 ONNX in ``~/.cache/quanta-bench``; 100 calibration crops (seed 20240601) and 200
evaluation crops (seed 20240602) of scikit-learn's sample photos. QAD uses only the
calibration crops (no labels: the FP32 logits are the targets; 20 of the 100 are held
out for early stopping); the evaluation crops are used for nothing but the final
measurement.

    python benchmarks/qat.py [--start default|gptq] [--budget 600] [--clock wall|cpu]
        [--lr 0.002] [--batch 8] [--learn-scales] [--schedule cosine --warmup 0.05]
        [--temperature T] [--features auto --feature-weight W] [--augment hflip]

``--start gptq`` quantizes with ``weight_rounding="gptq"`` (GPTQ-rounded weights) before
the distillation. ``--clock cpu`` measures the budget in CPU seconds of this process
divided by ``--threads`` (what the run would take on a quiet machine with that many
cores, when PyTorch keeps them busy): the shared machine's wall clock runs 2-8 times
slower than that under load. Every phase reports its wall and CPU time
(``time.process_time``, all threads of the process).

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


# intermediate tensors of EfficientNet-Lite0 matched with ``--features auto``: the end of
# the 28x28 and 14x14 stages and the last convolution (7x7x1280)
AUTO_FEATURES = ("/_blocks.4/Add_output_0", "/_blocks.10/Add_output_0", "/_conv_head/Conv_output_0")


class _Phases:
    """Wall and CPU seconds of each phase."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float]] = []
        self._t = (time.perf_counter(), time.process_time())

    def mark(self, name: str) -> None:
        t = (time.perf_counter(), time.process_time())
        self.rows.append((name, t[0] - self._t[0], t[1] - self._t[1]))
        self._t = t

    def format(self) -> str:
        lines = [f"  {n:<28} wall {w:7.1f} s  cpu {c:7.1f} s" for n, w, c in self.rows]
        w = sum(r[1] for r in self.rows)
        c = sum(r[2] for r in self.rows)
        lines.append(f"  {'total':<28} wall {w:7.1f} s  cpu {c:7.1f} s")
        return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--budget", type=float, default=600.0, help="seconds for PTQ + QAD + export (see --clock)"
    )
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    ap.add_argument("--start", choices=["default", "gptq"], default="default", help="the PTQ to start from")
    ap.add_argument("--lr", type=float, default=0.002, help="Adam step in LSBs of each parameter")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--learn-scales", action="store_true")
    ap.add_argument("--schedule", choices=["constant", "cosine"], default="constant")
    ap.add_argument("--warmup", type=float, default=0.0)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--features", default="", help="'auto' or comma-separated tensor names")
    ap.add_argument("--feature-weight", type=float, default=1.0)
    ap.add_argument("--augment", choices=["hflip"], default=None)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--patience", type=int, default=6)
    ap.add_argument("--eval-images", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, help="keep the files in this folder")
    ap.add_argument(
        "--ptq",
        type=Path,
        help="reuse this PTQ file (the same model, data and recipe give these bytes); its time is "
        "then --ptq-cpu seconds of CPU",
    )
    ap.add_argument("--ptq-cpu", type=float, default=0.0, help="CPU seconds the reused --ptq file took")
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

    ph = _Phases()
    ptq = out / f"ptq_{args.start}.onnx"
    if args.ptq:
        ptq = args.ptq
        ph.rows.append(("PTQ (reused; CPU given)", args.ptq_cpu, args.ptq_cpu))
        ph.mark("PTQ file read")
    else:
        kw = {"weight_rounding": "gptq"} if args.start == "gptq" else {}
        quanta.quantize_static(src, ptq, calib, verbose=False, progress=False, **kw)
        ph.mark(f"PTQ ({args.start})")
    model = QatModel(onnx.load(ptq), learn_scales=args.learn_scales)  # = quanta.qat.prepare(src, calib)
    ph.mark("QatModel")
    if args.clock == "cpu":

        def clock() -> float:
            return time.process_time() / args.threads

        # PTQ is charged its whole CPU time, as if it ran on one core (conservative)
        spent = sum(c for _, _, c in ph.rows)
    else:
        clock = time.perf_counter
        spent = sum(w for _, w, _ in ph.rows)
    # the training loop gets what is left of the budget after PTQ, the teacher's outputs
    # (inside distill, before its clock starts: ~10 s of CPU, twice with --augment) and
    # the export (~5 s)
    train_budget = max(30.0, args.budget - spent - 25.0)
    features = AUTO_FEATURES if args.features == "auto" else tuple(f for f in args.features.split(",") if f)
    res = distill(
        model,
        src,
        calib,
        time_budget=train_budget,
        clock=clock,
        lr=args.lr,
        batch_size=args.batch,
        eval_every=args.eval_every,
        patience=args.patience,
        temperature=args.temperature,
        features=features,
        feature_weight=args.feature_weight,
        augment=args.augment,
        schedule=args.schedule,
        warmup=args.warmup,
    )
    ph.mark("teacher + distill")
    qad = out / "qad.onnx"
    export(model, qad)
    ph.mark("export")
    print(res.format())
    print(f"phases ({args.clock} budget {args.budget:.0f} s; training budget {train_budget:.0f} s):")
    print(ph.format())

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
    print(f"PTQ ({args.start}): top-1 agreement {a_ptq[0]:.3f} (quanta native) / {a_ptq[1]:.3f} (ORT)")
    print(
        f"QAD: top-1 agreement {a_qad[0]:.3f} (quanta native) / {a_qad[1]:.3f} (ORT); gap to FP32 closed "
        f"{gap_closed:.0%} ({res.steps} steps, batch {args.batch}, lr {args.lr}, {args.schedule}, "
        f"warmup {args.warmup}, T {args.temperature}, features {args.features or 'none'} x "
        f"{args.feature_weight}, augment {args.augment}, learn_scales={args.learn_scales})"
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
