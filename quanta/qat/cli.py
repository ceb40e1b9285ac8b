"""``quanta qat FP32.onnx --data D -o OUT.onnx [--time-budget S]``: quantize with
quanta's defaults (or ``--recipe``), distill against the FP32 model on the same data,
write the QDQ file. ``D`` is what ``quanta quantize --calib`` takes."""

from __future__ import annotations

import argparse

from quanta.cli.images import add_image_options

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    s = sub.add_parser(
        "qat",
        help="quantization-aware distillation: quantize, then train against the FP32 model (needs torch)",
    )
    s.add_argument("model", help="the FP32 ONNX model")
    s.add_argument(
        "--data", required=True, help="unlabelled data: .npz file, folder of .npz files or of images"
    )
    s.add_argument("-o", "--output", required=True, help="path of the QDQ model (never the input)")
    s.add_argument("--time-budget", type=float, help="seconds of training (default: --steps)")
    s.add_argument("--steps", type=int, help="training steps (default 100 without --time-budget)")
    s.add_argument(
        "--lr", type=float, default=0.002, help="Adam step, in quantization steps of each parameter"
    )
    s.add_argument("--batch-size", type=int, default=8)
    s.add_argument("--holdout", type=float, default=0.2, help="share of the data held out for early stopping")
    s.add_argument("--learn-scales", action="store_true", help="train the scales too (LSQ)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--recipe", help="YAML/JSON recipe for the quantization")
    add_image_options(s, "image folder")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from quanta.calibrate.readers import iter_feeds
    from quanta.cli.images import image_preprocess, require_preprocess
    from quanta.ir.onnx_io import from_proto, load_proto

    try:
        from quanta.qat import distill, export, prepare
    except ImportError as e:
        raise SystemExit(f"quanta: error: {e}") from e
    if Path(args.output).resolve() == Path(args.model).resolve():
        raise SystemExit("quanta: error: -o must not be the input model")
    pre = image_preprocess(args)
    if pre is None:
        missing = require_preprocess(args.data, args.model)
        if missing is not None:
            raise SystemExit(f"quanta: error: {missing}")
    proto, _ = load_proto(args.model)
    feeds = list(iter_feeds(args.data, from_proto(proto).graph.inputs, preprocess=pre))
    model = prepare(args.model, calibration_data=feeds, recipe=args.recipe, learn_scales=args.learn_scales)
    res = distill(
        model,
        args.model,
        feeds,
        steps=args.steps,
        time_budget=args.time_budget,
        lr=args.lr,
        batch_size=args.batch_size,
        holdout=args.holdout,
        seed=args.seed,
        progress=not args.quiet,
    )
    export(model, args.output)
    print(res.format())
    print(f"wrote {args.output}")
    return 0
