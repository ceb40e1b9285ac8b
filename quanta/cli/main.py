"""The ``quanta`` command.

    quanta inspect MODEL                  ops by type, quantized tensors, parameters, size
    quanta inspect --ir MODEL             also the graph in quanta's textual IR
    quanta run MODEL [--inputs X.npz] [-o Y.npz] [--backend native|reference]
    quanta demo                           the built-in demo model, end to end

Errors in user input (a missing or invalid file, feeds that do not match the model)
print one line ``quanta: error: ...`` and exit with status 2; they never print a
traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

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


def random_feeds(sess, *, seed: int = 0, batch: int = 1) -> dict[str, np.ndarray]:
    """Random inputs of the right shapes and dtypes (symbolic dims become ``batch``
    for the first dimension and 1 elsewhere)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for arg in sess.get_inputs():
        t = sess.model.graph.value(arg.name).type
        shape = [
            d if isinstance(d, int) and d >= 0 else (batch if k == 0 else 1)
            for k, d in enumerate(arg.shape or [])
        ]
        dtype = np.dtype(t.elem.numpy) if t is not None else np.dtype(np.float32)
        if dtype.kind == "f" or dtype.kind == "V":
            arr = rng.standard_normal(shape).astype(np.float32).astype(dtype)
        elif dtype.kind == "b":
            arr = rng.integers(0, 2, shape).astype(bool)
        else:
            info = np.iinfo(dtype)
            lo, hi = max(info.min, -128), min(info.max, 127)
            arr = rng.integers(lo, hi + 1, shape).astype(dtype)
        feeds[arg.name] = arr
    return feeds


def cmd_inspect(args: argparse.Namespace) -> int:
    from quanta.debug.report import summarize
    from quanta.ir.onnx_io import load
    from quanta.ir.printer import format_graph

    model = load(args.model)
    print(summarize(model).format(max_tensors=args.max_tensors))
    if args.ir:
        print()
        print(format_graph(model.graph, show_consts=False))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import quanta

    sess = quanta.InferenceSession(args.model, backend=args.backend)
    if args.inputs:
        feeds = _load_npz(args.inputs)
    else:
        feeds = random_feeds(sess, seed=args.seed)
        print("no --inputs given: random inputs " + ", ".join(f"{k}{list(v.shape)} {v.dtype}" for k, v in feeds.items()))
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


def cmd_demo(args: argparse.Namespace) -> int:
    from quanta.cli.demo import run_demo

    return run_demo(backend=args.backend)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="quanta", description="Quantization backend for ONNX models.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("inspect", help="summarize a model: ops, quantized tensors, parameters, size")
    s.add_argument("model")
    s.add_argument("--ir", action="store_true", help="also print the graph in quanta's textual IR")
    s.add_argument("--max-tensors", type=int, default=40, help="quantized tensors to list (default 40)")
    s.set_defaults(func=cmd_inspect)

    s = sub.add_parser("run", help="run a model on inputs from an .npz file (or random inputs)")
    s.add_argument("model")
    s.add_argument("--inputs", help=".npz with one array per model input")
    s.add_argument("-o", "--output", help="write the outputs to this .npz")
    s.add_argument("--backend", choices=["native", "reference"], default="native")
    s.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    s.set_defaults(func=cmd_run)

    s = sub.add_parser("demo", help="run the built-in demo model end to end")
    s.add_argument("--backend", choices=["native", "reference"], default="reference")
    s.set_defaults(func=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from quanta.ir.graph import GraphError
    from quanta.ir.onnx_io import ModelLoadError
    from quanta.session import InvalidArgument
    from quanta.targets.base import TargetError

    try:
        return int(args.func(args) or 0)
    except (CliError, ModelLoadError, InvalidArgument, TargetError, GraphError, FileExistsError) as e:
        print(f"quanta: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
