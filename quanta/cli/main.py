"""The ``quanta`` command.

    quanta inspect MODEL                  ops by type, quantized tensors, parameters, size
    quanta inspect --ir MODEL             also the graph in quanta's textual IR
    quanta run MODEL [--inputs X.npz] [-o Y.npz] [--backend native|reference]
    quanta run MODEL --inputs DIR -o OUTDIR --engine ray [--workers N] [--address ADDR]
    quanta quantize IN -o OUT --calib DATA [--method ...] [--dynamic] [--per-channel|--per-tensor]
                   [--activation-type uint8|int8] [--weight-type int8|uint8|int4] [--exclude NODE...]
                   [--recurrent auto|dynamic|float] [--subgraphs quantize|float] [--recipe FILE]
                   [--engine inprocess|local|ray] [--workers N] [--shards S] [--address ADDR]
    quanta bench MODEL [--vs-ort] [--threads N] [--batch B] [--dim NAME=SIZE] [--feeds F.npz] [--warmup W] [--runs R]
                                          latency (median, p90), side by side with ONNX Runtime
    quanta qat FP32 --data D -o OUT [--time-budget S]   quantize, then distill against FP32 (needs torch)
    quanta demo                           the built-in demo model, end to end

Errors in user input (a missing or invalid file, feeds that do not match the model)
print one line ``quanta: error: ...`` and exit with status 2; they never print a
traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from quanta.cli.images import add_image_options

__all__ = ["main"]


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def _load_npz(path: str) -> dict[str, np.ndarray]:
    p = Path(path)
    if not p.is_file():
        raise CliError(f"{path}: no such file")
    try:
        with np.load(p, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except ValueError as e:
        raise CliError(f"{path}: cannot read as .npz without pickle ({e})") from None
    except OSError as e:
        raise CliError(f"{path}: not a valid .npz file ({e})") from None


def random_feeds(
    source: Any, *, seed: int = 0, batch: int = 1, dims: dict[str, int] | None = None
) -> dict[str, np.ndarray]:
    """Inputs of the right shapes and dtypes for timing a model (``source``: an
    InferenceSession or a loaded Model; its graph inputs without an initializer): float
    inputs are standard normal, bool inputs random, integer inputs ones (a valid token id,
    attention mask, segment id or length for every language model; random integers would
    index outside small embedding tables). Symbolic dimensions: ``dims[name]`` when given
    (``--dim sequence=128``), else ``batch`` for the first dimension and 1 elsewhere."""
    rng = np.random.default_rng(seed)
    dims = dims or {}
    feeds = {}
    model = getattr(source, "model", source)
    for v in model.graph.inputs:
        if v.const is not None:
            continue  # an overridable initializer: its default is the feed
        t = v.type
        shape = _feed_shape(t, batch, dims)
        dtype = np.dtype(t.elem.numpy) if t is not None else np.dtype(np.float32)
        if dtype.kind == "f" or dtype.kind == "V":
            arr = rng.standard_normal(shape).astype(np.float32).astype(dtype)
        elif dtype.kind == "b":
            arr = rng.integers(0, 2, shape).astype(bool)
        else:
            arr = np.ones(shape, dtype)
        feeds[v.name] = arr
    return feeds


def _feed_shape(t: Any, batch: int, dims: dict[str, int], guessed: list[str] | None = None) -> list[int]:
    """An input's generated shape (:func:`random_feeds`' rule); the names of the symbolic
    dimensions after the first that no ``dims`` entry sizes (set to 1) go into ``guessed``."""
    shape = []
    for k, d in enumerate((t.shape if t is not None else None) or []):
        if isinstance(d, int) and d >= 0:
            shape.append(d)
            continue
        if k and str(d) not in dims and guessed is not None and str(d) not in guessed:
            guessed.append(str(d))
        shape.append(dims.get(str(d), batch if k == 0 else 1))
    return shape


def defaulted_dims(source: Any, dims: dict[str, int] | None = None) -> list[str]:
    """The symbolic dimensions after an input's first that :func:`random_feeds` sets to
    1 because ``dims`` does not name them (an image model's ``height`` and ``width``)."""
    names: list[str] = []
    for v in getattr(source, "model", source).graph.inputs:
        if v.const is None:
            _feed_shape(v.type, 1, dims or {}, names)
    return names


def parse_dims(items: list[str] | None) -> dict[str, int]:
    """``["sequence=128", "batch=4"]`` -> {"sequence": 128, "batch": 4}."""
    out: dict[str, int] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.isdigit() or int(value) < 1:
            raise CliError(f"--dim {item}: expected NAME=SIZE with SIZE >= 1, e.g. --dim sequence=128")
        out[name] = int(value)
    return out


def _run_shapes(model, dims: dict[str, int], batch: int) -> dict[str, tuple[int, ...]]:
    """Every value's shape in one run of the graph as written (the reference target) on
    random inputs whose symbolic dimensions take ``dims`` (``--dim``; the first ``batch``,
    others 1): MACs are then counted at those sizes, not with every symbolic dimension 1
    (a transformer's attention products at a sequence of 1)."""
    from quanta.targets.reference import ReferenceTarget

    feeds = random_feeds(model, batch=batch, dims=dims)
    shapes: dict[str, tuple[int, ...]] = {k: tuple(v.shape) for k, v in feeds.items()}

    def keep(name: str, arr: object) -> None:
        if isinstance(arr, np.ndarray):
            shapes[name] = tuple(arr.shape)

    ReferenceTarget().prepare(model).run(dict(feeds), [v.name for v in model.graph.outputs], on_value=keep)
    return shapes


def cmd_inspect(args: argparse.Namespace) -> int:
    from quanta.debug.report import summarize
    from quanta.ir.onnx_io import load
    from quanta.ir.printer import format_graph
    from quanta.runtime.coverage import lowered_coverage

    model = load(args.model)
    print(summarize(model).format(max_tensors=args.max_tensors))
    shapes = _run_shapes(model, parse_dims(args.dim), args.batch) if args.dim else None
    print(lowered_coverage(model, shapes, target=args.target).format_share())
    if args.ir:
        print()
        print(format_graph(model.graph, show_consts=False))
    if args.kernels:
        from quanta.kernels import native_available

        print()
        if native_available():
            from quanta.kernels import _native

            print(
                f"native kernels: ISAs {', '.join(_native.supported_isas())}; active {_native.active_isa()}"
            )
            print("dispatch table (op, dtype, isa -> kernel [tunables]; * = runs on this CPU):")
            for row in _native.kernel_table():
                tun = f" [{', '.join(row['tunables'])}]" if row["tunables"] else ""
                mark = "*" if row["supported"] else " "
                print(f"  {mark} {row['op']:<26} {row['dtype']:<10} {row['isa']:<11} {row['kernel']}{tun}")
        else:
            print("native kernels: the extension is not built")
    if args.lowered or args.why_not or args.dump_after:
        _inspect_lowered(args, model)
    return 0


def _inspect_lowered(args: argparse.Namespace, model) -> None:
    """The lowered graph, the fusion-coverage table and NoMatch reasons."""
    from quanta.debug.coverage import coverage
    from quanta.ir.onnx_io import load
    from quanta.ir.printer import format_graph
    from quanta.passes.manager import PassManager
    from quanta.runtime.compile import target_pipeline
    from quanta.runtime.coverage import file_target
    from quanta.targets import get_target

    before = load(args.model)
    # the pipeline of the target asked for, else of the one the file was quantized for
    # (an npu-sim file lowers to the integer-only stage, not to the host's operators)
    passes = target_pipeline(get_target(args.target or file_target(model)), model)
    known = {p.name for p in passes}
    unknown = [d for d in args.dump_after or [] if d != "*" and d not in known]
    if unknown:
        raise CliError(
            f"--dump-after: unknown pass {unknown[0]!r}; the pipeline's passes are {sorted(known)}"
        )
    result = PassManager(passes, dump_after=set(args.dump_after or [])).run(model)
    if args.lowered:
        print()
        print(format_graph(model.graph, show_consts=False))
        print()
        print(coverage(before.graph, model.graph, result.no_matches).format())
    if args.lowered and getattr(args, "target", None):
        from quanta.runtime.compile import compile as compile_model

        plan = compile_model(load(args.model), args.target)
        print()
        print(f"target {args.target}:")
        print(plan.format_partitions() if plan.partitions is not None else "  every node on the host")
    if args.why_not:
        records = result.why_not(args.why_not)
        print()
        if not records:
            print(f"{args.why_not}: no refusals (it fired everywhere it applied, or the name is unknown)")
        for r in records:
            print(str(r))


def _backends() -> list[str]:
    """The registered targets (quanta.targets.registry), for --backend / --target."""
    from quanta.targets import registered_targets

    return registered_targets()


def cmd_run(args: argparse.Namespace) -> int:
    import quanta

    if args.engine == "ray":
        return _run_on_ray(args)
    sess = quanta.InferenceSession(args.model, backend=args.backend)
    if args.inputs:
        feeds = _load_npz(args.inputs)
    else:
        feeds = random_feeds(sess, seed=args.seed)
        print(
            "no --inputs given: random inputs "
            + ", ".join(f"{k}{list(v.shape)} {v.dtype}" for k, v in feeds.items())
        )
    t0 = time.perf_counter()
    outs = sess.run(None, feeds)
    dt = time.perf_counter() - t0
    names = [o.name for o in sess.get_outputs()]
    for name, arr in zip(names, outs):
        arr = np.asarray(arr)
        stats = ""
        if arr.size and arr.dtype.kind in "fiu":
            a = arr.astype(np.float64)
            stats = f" min {a.min():.6g} max {a.max():.6g} mean {a.mean():.6g}"
        print(f"{name}: {arr.dtype} {list(arr.shape)}{stats}")
    print(f"backend {sess.backend}: {dt * 1e3:.2f} ms")
    if sess.fallbacks and args.backend == "native":
        print(f"{len(sess.fallbacks)} node(s) ran on the reference implementation (no native kernel yet)")
    if args.output:
        out = Path(args.output)
        tmp = out.with_name(out.name + ".tmp.npz")
        np.savez(tmp, **dict(zip(names, outs)))
        tmp.replace(out)
        print(f"wrote {out}")
    return 0


def _run_on_ray(args: argparse.Namespace) -> int:
    """``quanta run MODEL --inputs DIR -o OUT --engine ray``: every DIR/*.npz through Ray
    Data, outputs to OUT/<same name>.npz; inputs already done are skipped (resume)."""
    import functools

    import quanta

    if not args.inputs or not Path(args.inputs).is_dir() or not args.output:
        raise CliError("--engine ray needs --inputs FOLDER (of .npz feeds) and -o OUTPUT_FOLDER")
    try:
        import ray
    except ImportError:
        raise CliError("--engine ray needs Ray: pip install 'quanta[ray]'") from None
    from quanta.scale import run_folder

    workers = args.workers or 2
    started = not ray.is_initialized()
    if started:
        if args.address:
            ray.init(address=args.address, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        factory = functools.partial(
            quanta.InferenceSession, str(Path(args.model).resolve()), backend=args.backend
        )
        done, skipped = run_folder(
            str(Path(args.inputs).resolve()), str(Path(args.output).resolve()), factory, concurrency=workers
        )
    finally:
        if started:
            ray.shutdown()
    print(f"ran {done} input(s), {skipped} already done; outputs in {args.output}")
    return 0


def cmd_quantize(args: argparse.Namespace) -> int:
    from quanta.cli.images import image_preprocess, require_preprocess
    from quanta.quantize.dynamic import quantize_dynamic
    from quanta.quantize.static import quantize_static

    options: dict = {}
    if args.method:
        options["method"] = args.method
    if args.per_channel is not None:
        options["per_channel"] = args.per_channel
    if args.activation_type:
        options["activation_type"] = args.activation_type
    if args.weight_type:
        options["weight_type"] = args.weight_type
    if args.symmetric_activations:
        options["symmetric_activations"] = True
    if args.exclude:
        options["exclude"] = list(args.exclude)
    if args.op_types:
        options["op_types"] = list(args.op_types)
    if args.samples is not None:
        options["calibration_samples"] = args.samples
    if args.min_integer_share is not None:
        options["min_integer_share"] = args.min_integer_share
    if args.recurrent:
        options["recurrent"] = args.recurrent
    if getattr(args, "target", None):
        options["target"] = args.target
    if args.subgraphs:
        options["subgraphs"] = args.subgraphs
    if getattr(args, "weight_rounding", None):
        options["weight_rounding"] = args.weight_rounding
    if getattr(args, "weight_pairs", None):
        options["weight_pairs"] = args.weight_pairs
    if getattr(args, "weight_bits", None):
        options["weight_bits"] = args.weight_bits
    if getattr(args, "equalize", False):
        options["equalize"] = True
    if args.dynamic:
        quantize_dynamic(args.model, args.output, args.recipe, **options)
    else:
        if not args.calib:
            raise CliError(
                "static quantization needs --calib DATA (an .npz file or a folder); or use --dynamic"
            )
        pre = image_preprocess(args)
        if pre is None:
            missing = require_preprocess(args.calib, args.model)
            if missing is not None:
                raise CliError(missing)
        if getattr(args, "recalibrate", False):
            options["keep_file_parameters"] = False
        accuracy = None
        targets = [
            (m, v)
            for m, v in (
                ("sqnr", args.target_sqnr),
                ("cosine", args.target_cosine),
                ("top1_agreement", args.target_agreement),
            )
            if v is not None
        ]
        if len(targets) > 1:
            raise CliError("give one of --target-sqnr, --target-cosine, --target-agreement")
        if targets:
            from quanta.quantize.accuracy import AccuracyTarget

            accuracy = AccuracyTarget(metric=targets[0][0], minimum=targets[0][1], eval_data=args.eval_data)
        engine, address = args.engine, args.address
        if args.ray is not None:
            engine, address = "ray", address or (None if args.ray == "local" else args.ray)
        if args.workers is not None and args.workers < 1:
            raise CliError(f"--workers {args.workers}: expected an integer >= 1")
        if args.shards is not None and args.shards < 1:
            raise CliError(f"--shards {args.shards}: expected an integer >= 1")
        if address and engine != "ray":
            raise CliError("--address names a Ray cluster: use it with --engine ray")
        quantize_static(
            args.model,
            args.output,
            args.calib,
            args.recipe,
            preprocess=pre,
            engine=engine,
            workers=args.workers,
            address=address,
            shards=args.shards,
            accuracy=accuracy,
            **options,
        )
    print(f"wrote {args.output}")
    return 0


def cmd_debug(args: argparse.Namespace) -> int:
    """Layer-wise error of a QDQ model against its FP32 original (quanta.debug.compare);
    without QUANTIZED, the FP32 model is quantized with the default recipe on the data
    first (into a temporary file), and an already-quantized MODEL is measured against
    its own float view (quanta.quantize.float_view; the report says the reference is
    derived)."""
    import tempfile

    from quanta.cli.images import image_preprocess, require_preprocess
    from quanta.debug.compare import compare

    data = args.data
    pre = image_preprocess(args)
    if pre is None:
        missing = require_preprocess(args.data, args.model)
        if missing is not None:
            raise CliError(missing)
    else:  # images: read once, with the declared preprocessing, for both passes
        from quanta.calibrate.readers import iter_feeds
        from quanta.ir.onnx_io import from_proto, load_proto

        inputs = from_proto(load_proto(args.model)[0], args.model).graph.inputs
        data = list(iter_feeds(args.data, inputs, preprocess=pre, limit=args.samples))
    with tempfile.TemporaryDirectory() as tmp:
        quantized = args.quantized
        fp32: str | None = args.model
        if quantized is None:
            from quanta.ir.onnx_io import load_proto
            from quanta.quantize.float_view import is_quantized
            from quanta.quantize.static import quantize_static

            proto, _ = load_proto(args.model)
            if is_quantized(proto):
                # one quantized file (shipped without its float original): measured
                # against its own float view, which the report names as the reference
                fp32, quantized = None, args.model
            else:
                quantized = os.path.join(tmp, "quantized.onnx")
                quantize_static(args.model, quantized, data, args.recipe, verbose=False, progress=False)
        result = compare(
            fp32,
            quantized,
            data,
            limit=args.samples,
            ablation=args.ablation,
            ablation_mode=args.ablation_mode,
            engine=None if args.engine == "inprocess" else args.engine,
            workers=args.workers,
            address=args.address,
        )
    print(result.format(k=args.top))
    if args.json:
        with open(args.json, "w") as f:
            f.write(result.to_json())
        print(f"wrote {args.json}")
    if args.html:
        from quanta.debug.html import write_html

        write_html(result, args.html, title=os.path.basename(str(args.model)))
        print(f"wrote {args.html}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from quanta.cli.demo import run_demo

    return run_demo(backend=args.backend)


def cmd_bench(args: argparse.Namespace) -> int:
    from quanta.cli.bench import run_bench

    return run_bench(args)


def build_parser() -> argparse.ArgumentParser:
    from quanta.quantize.recipe import CalibrationMethod

    p = argparse.ArgumentParser(prog="quanta", description="Quantization backend for ONNX models.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("inspect", help="summarize a model: ops, quantized tensors, parameters, size")
    s.add_argument("model")
    s.add_argument("--ir", action="store_true", help="also print the graph in quanta's textual IR")
    s.add_argument("--max-tensors", type=int, default=40, help="quantized tensors to list (default 40)")
    s.add_argument(
        "--lowered",
        action="store_true",
        help="lower it as a session would; print the graph and fusion coverage",
    )
    s.add_argument("--why-not", metavar="RULE", help="why a compiler rule did not fire (e.g. LowerConv)")
    s.add_argument(
        "--dump-after", metavar="PASS", action="append", help="print the IR after this pass ('*': every)"
    )
    s.add_argument("--kernels", action="store_true", help="list the native kernel ISAs of this machine")
    s.add_argument(
        "--target",
        choices=_backends(),
        help="with --lowered: compile for this target and show its partitions and transfers",
    )
    s.add_argument(
        "--dim",
        action="append",
        metavar="NAME=SIZE",
        help="count MACs at this size of a named symbolic dimension, e.g. --dim sequence=128 "
        "(one run on random inputs; repeatable; others: 1)",
    )
    s.add_argument("--batch", type=int, default=1, help="with --dim: size of a symbolic first dimension")
    s.set_defaults(func=cmd_inspect)

    s = sub.add_parser("run", help="run a model on inputs from an .npz file (or random inputs)")
    s.add_argument("model")
    s.add_argument("--inputs", help=".npz with one array per model input")
    s.add_argument("-o", "--output", help="write the outputs to this .npz")
    s.add_argument("--backend", choices=_backends(), default="native")
    s.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    s.add_argument(
        "--engine",
        choices=["inprocess", "ray"],
        default="inprocess",
        help="ray: --inputs is a folder of .npz feeds, -o a folder; one session per Ray actor; resumable",
    )
    s.add_argument("--workers", type=int, help="--engine ray: number of actors (default 2)")
    s.add_argument("--address", help="--engine ray: address of a running Ray cluster (default: start one)")
    s.set_defaults(func=cmd_run)

    s = sub.add_parser("quantize", help="quantize a float model (static with calibration data, or --dynamic)")
    s.add_argument("model")
    s.add_argument("-o", "--output", required=True, help="path of the quantized model (never the input)")
    s.add_argument("--calib", help="calibration data: .npz file, folder of .npz files or of images")
    s.add_argument("--method", choices=[m.value for m in CalibrationMethod], help="docs/calibration.md §2")
    s.add_argument("--dynamic", action="store_true", help="dynamic quantization (no calibration data)")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--per-channel", dest="per_channel", action="store_true", default=None)
    g.add_argument("--per-tensor", dest="per_channel", action="store_false")
    s.add_argument("--activation-type", choices=["uint8", "int8"])
    s.add_argument("--weight-type", choices=["int8", "uint8", "int4"])
    s.add_argument("--symmetric-activations", action="store_true")
    s.add_argument(
        "--weight-bits",
        type=int,
        choices=[7, 8],
        help="8-bit weights on 7 bits (ORT's reduce_range grid), for ONNX Runtime on x86 CPUs "
        "without VNNI, whose int8 kernels saturate full-range weights (default 8)",
    )
    s.add_argument(
        "--weight-pairs",
        choices=["ort", "ort_rows", "off"],
        help="ort: full-range int8 weights whose pairs, in ONNX Runtime's order, no uint8 input can "
        "overflow in its saturating int16 kernels (x86 without VNNI), so ORT runs the file exactly "
        "on every CPU with all 8 weight bits (docs/debugger.md eq. (12m)); ort_rows: each output row "
        "takes the 7-bit grid instead where that errs less (eq. (12n))",
    )
    s.add_argument(
        "--exclude", nargs="+", metavar="NODE", help="node names or regular expressions to keep float"
    )
    s.add_argument("--op-types", nargs="+", metavar="OP", help="only quantize these op types")
    s.add_argument("--samples", type=int, help="use at most this many calibration samples")
    s.add_argument("--recipe", help="YAML or JSON recipe file (options on the command line win)")
    s.add_argument(
        "--target",
        choices=["npu-sim"],
        help="the device the file is for: npu-sim = integer only (int8 per-tensor activations, "
        "int8 symmetric per-channel weights, every operator quantized; Recipe.target)",
    )
    s.add_argument(
        "--min-integer-share",
        type=float,
        metavar="SHARE",
        help="fail, writing nothing, when fewer of the MACs (0..1, e.g. 0.99) would run in integer",
    )
    s.add_argument(
        "--recurrent",
        choices=["auto", "dynamic", "float"],
        help="LSTMs / GRUs: DynamicQuantizeLSTM / DynamicQuantizeGRU, kept float, or auto (default): "
        "dynamic unless the file with them float measures closer to FP32 (docs/calibration.md eq. (30))",
    )
    s.add_argument(
        "--subgraphs",
        choices=["quantize", "float"],
        help="If / Loop / Scan bodies: quantized inside by the same rules (default) or kept float",
    )
    s.add_argument(
        "--weight-rounding",
        choices=["gptq", "gptq_cd", "gptaq", "brecq", "nearest"],
        help="weights: GPTQ second-order rounding on the calibration data (default), GPTQ refined "
        "by coordinate descent on the same objective (gptq_cd), GPTQ then each layer fitted for "
        "the FP32 output from its quantized input (gptaq), GPTQ then each block's rounding learned "
        "against the FP32 block output (brecq), or each to nearest",
    )
    s.add_argument(
        "--equalize",
        action="store_true",
        help="cross-layer equalization: even out the channels of the activations between two "
        "Convs (Conv -> Relu / Clip(0, H) -> Conv) by factors folded into both layers' weights",
    )
    s.add_argument(
        "--recalibrate",
        action="store_true",
        help="an already-quantized MODEL: calibrate every tensor anew instead of keeping the "
        "file's own activation scales and zero points",
    )
    add_image_options(s)
    s.add_argument(
        "--target-sqnr",
        type=float,
        metavar="DB",
        help="accuracy target: output SQNR against FP32 on held-out calibration data",
    )
    s.add_argument(
        "--target-cosine", type=float, metavar="C", help="accuracy target: worst output-row cosine"
    )
    s.add_argument("--target-agreement", type=float, metavar="A", help="accuracy target: top-1 agreement")
    s.add_argument(
        "--eval-data", help="measure the target on these feeds instead of held-out calibration data"
    )
    s.add_argument(
        "--engine",
        choices=["inprocess", "local", "ray"],
        default="inprocess",
        help="where calibration runs: this process (default), --workers local processes, or Ray tasks; "
        "the file is the same byte for byte",
    )
    s.add_argument("--workers", type=int, help="workers of the local or Ray engine (default 2)")
    s.add_argument(
        "--shards",
        type=int,
        help="shards the calibration samples are cut into on the local or Ray engine "
        "(default: one per worker, up to 4 per worker while a shard keeps >= 128 samples; "
        "shards are handed out as workers free up)",
    )
    s.add_argument("--address", help="--engine ray: address of a running Ray cluster (default: start one)")
    s.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="shorthand for --engine ray [--address ADDRESS]",
    )
    s.set_defaults(func=cmd_quantize)

    s = sub.add_parser(
        "bench", help="latency (median, p90) after warm-up; --vs-ort: side by side with ONNX Runtime"
    )
    s.add_argument("model")
    s.add_argument("--vs-ort", action="store_true", help="also time ONNX Runtime on the same file and inputs")
    s.add_argument(
        "--threads", type=int, default=0, help="intra-op threads for both engines (default 0: all cores)"
    )
    s.add_argument("--batch", type=int, default=1, help="size of a symbolic first dimension (default 1)")
    s.add_argument(
        "--dim",
        action="append",
        metavar="NAME=SIZE",
        help="size of a named symbolic dimension, e.g. --dim sequence=128 (repeatable; others: 1)",
    )
    s.add_argument("--feeds", metavar="FILE.npz", help="time these inputs instead of generated ones")
    s.add_argument("--warmup", type=int, default=5, help="untimed runs first (default 5)")
    s.add_argument("--runs", type=int, default=50, help="timed runs (default 50)")
    s.add_argument("--backend", choices=_backends(), default="native")
    s.set_defaults(func=cmd_bench)

    s = sub.add_parser(
        "debug", help="which layers lose accuracy: local vs inherited error per quantized node, with fixes"
    )
    s.add_argument("model", help="the FP32 model, or a quantized model alone (compared with its float view)")
    s.add_argument(
        "quantized", nargs="?", help="its QDQ model (default: quantize MODEL with the default recipe)"
    )
    s.add_argument("--data", required=True, help="feeds: .npz file or folder of .npz files or of images")
    s.add_argument("--samples", type=int, help="use at most this many feeds")
    add_image_options(s)
    s.add_argument("--recipe", help="recipe for quantizing MODEL when QUANTIZED is not given")
    s.add_argument(
        "--ablation",
        type=int,
        default=0,
        metavar="K",
        help="also measure the K worst layers one at a time (K extra passes)",
    )
    s.add_argument(
        "--ablation-mode",
        choices=["only", "float"],
        default="only",
        help="ablation: each layer alone quantized (its contribution; default) or alone float (what that wins)",
    )
    s.add_argument("--top", type=int, default=10, help="rows of the terminal table (default 10)")
    s.add_argument(
        "--engine",
        choices=["inprocess", "local", "ray"],
        default="inprocess",
        help="where the feeds are compared: this process, --workers local processes or a Ray cluster "
        "(shards merged exactly: the same report)",
    )
    s.add_argument("--workers", type=int, help="--engine local|ray: number of workers (default 2)")
    s.add_argument("--address", help="--engine ray: address of a running Ray cluster (default: start one)")
    s.add_argument("--html", help="write the HTML report here")
    s.add_argument("--json", help="write every row as JSON here")
    s.set_defaults(func=cmd_debug)

    from quanta.qat.cli import add_parser as add_qat_parser  # imports torch only when run

    add_qat_parser(sub)

    s = sub.add_parser("demo", help="quantize the built-in demo model and compare FP32 with int8")
    s.add_argument("--backend", choices=_backends(), default="native")
    s.set_defaults(func=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from quanta.calibrate.readers import CalibrationDataError
    from quanta.ir.graph import GraphError
    from quanta.ir.onnx_io import ModelLoadError
    from quanta.quantize.recipe import RecipeError
    from quanta.session import InvalidArgument
    from quanta.targets.base import TargetError

    try:
        return int(args.func(args) or 0)
    except (
        CliError,
        ModelLoadError,
        InvalidArgument,
        TargetError,
        GraphError,
        FileExistsError,
        CalibrationDataError,
        RecipeError,
    ) as e:
        print(f"quanta: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except OSError as e:  # a folder that does not exist, a path that is a directory, permissions
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"quanta: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    # run as `python -m quanta.cli.main`, this file is `__main__`, a second module whose
    # CliError is another class than the one the subcommands import: run the package's
    # own module so their errors are caught and printed as one line
    from quanta.cli import main as _cli

    sys.exit(_cli.main())
