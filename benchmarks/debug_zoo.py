"""``quanta debug`` with its HTML and JSON reports over the public zoo (and, with
``--real``, EfficientNet-Lite0 and all-MiniLM-L6-v2): one line per model with the wall
time of the debug step, the report sizes, the output SQNR and the worst layer.

Each model goes through the command line exactly as a user types it: the calibration
feeds (benchmarks/zoo's) are written as a folder of ``.npz`` files, then

    quanta debug FP32 [QUANTIZED] --data FEEDS --html R.html --json R.json

with QUANTIZED given for files another tool quantized (the manifest's ``source`` is
their FP32 original) and omitted otherwise (quanta quantizes a float model with its
defaults first; a shipped quantized file without an FP32 original is measured against
its own float view, the derived reference of quanta/quantize/float_view.py). With
``--alone``, the files another tool quantized are given alone instead (derived reference,
not their FP32 original).

    python benchmarks/debug_zoo.py                      # every zoo model
    python benchmarks/debug_zoo.py --models ppocr_cls,vit_focus --real
    python benchmarks/debug_zoo.py --alone --models ppocr_cls.ort_qop,tashkeel_int8
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "real_models"))


def write_feeds(feeds: list[dict], folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(feeds):
        np.savez(folder / f"{i:04d}.npz", **{k: np.asarray(v) for k, v in f.items()})
    return folder


def run_debug(
    name: str, fp32: Path, quantized: Path | None, feeds: list[dict], out: Path, samples: int
) -> dict:
    from quanta.cli.main import main as cli

    with tempfile.TemporaryDirectory() as tmp:
        data = write_feeds(feeds, Path(tmp) / "feeds")
        html, js = out / f"{name}.html", out / f"{name}.json"
        argv = ["debug", str(fp32), *([str(quantized)] if quantized else [])]
        argv += ["--data", str(data), "--samples", str(samples), "--html", str(html), "--json", str(js)]
        buf = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(buf):
            rc = cli(argv)
        seconds = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"quanta debug exited {rc}: {buf.getvalue()[-300:]}")
    d = json.loads(js.read_text())
    worst = d["nodes"] and max(d["nodes"], key=lambda r: r.get("contribution") or 0)
    return {
        "seconds": seconds,
        "html_kb": html.stat().st_size / 1024,
        "json_kb": js.stat().st_size / 1024,
        "output_sqnr_db": d.get("output_sqnr_db"),
        "nodes": len(d["nodes"]),
        "worst": worst and f"{worst['name']} ({worst['op']})",
        "command": "quanta " + " ".join(argv),
    }


def zoo_cases(names: list[str] | None, alone: bool = False):
    import zoo as Z

    cache = Z.zoodata.cache_dir()
    manifest = json.loads((cache / "manifest.json").read_text())["models"]
    entries = {e["name"]: e for e in manifest if e["kind"] != "vocab"}
    for name in names or list(entries):
        e = entries[name]
        model = Z.Model(e, cache)
        if e.get("source") and not alone:  # quantized by another tool: compare with its FP32 original
            yield name, cache / entries[e["source"]]["path"], model.path, model.calib
        else:
            yield name, model.path, None, model.calib


def real_cases():
    import accuracy as A
    from export import DEFAULT_CACHE, EFFICIENTNET, MINILM, model_paths

    calib, _ = A.image_data(100, 200, 10)
    yield EFFICIENTNET, model_paths(DEFAULT_CACHE, EFFICIENTNET)[1], None, calib
    calib, _ = A.sentence_data(100, 8)
    yield MINILM, model_paths(DEFAULT_CACHE, MINILM)[1], None, calib


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help="comma-separated zoo names (default: all)")
    ap.add_argument("--real", action="store_true", help="also EfficientNet-Lite0 and MiniLM")
    ap.add_argument("--no-zoo", action="store_true")
    ap.add_argument(
        "--alone", action="store_true", help="files another tool quantized: without their FP32 original"
    )
    ap.add_argument("--samples", type=int, default=8, help="feeds the debugger runs on (default 8)")
    ap.add_argument("--skip", default="", help="comma-separated zoo names to leave out")
    ap.add_argument("--out", type=Path, default=Path("/tmp/quanta-debug-zoo"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cases = [] if args.no_zoo else [zoo_cases(args.models.split(",") if args.models else None, args.alone)]
    if args.real:
        cases.append(real_cases())
    failures = 0
    for gen in cases:
        while True:
            try:
                case = next(gen)
            except StopIteration:
                break
            name, fp32, quantized, feeds = case
            if name in args.skip.split(","):
                continue
            # quanta quantizes with the feeds the debugger reads (a few: this checks that the
            # debugger and its report work, the zoo benchmark measures fidelity)
            feeds = feeds[: args.samples]
            try:
                r = run_debug(name, fp32, quantized, feeds, args.out, args.samples)
                print(
                    f"{name}: ok, {r['seconds']:.1f} s, html {r['html_kb']:.0f} KB, json {r['json_kb']:.0f} KB, "
                    f"{r['nodes']} nodes, output SQNR {r['output_sqnr_db']}, worst {r['worst']}",
                    flush=True,
                )
            except Exception as e:  # one model's failure is one line
                failures += 1
                print(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
                traceback.print_exc(file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
