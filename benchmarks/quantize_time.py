"""quantize_static's wall time against ONNX Runtime's, and the bytes of quanta's file.

    python benchmarks/quantize_time.py --models ppocr_det,captcha_crnn --record /tmp/sha.json
    python benchmarks/quantize_time.py --models ppocr_det,captcha_crnn --check /tmp/sha.json --ort
    python benchmarks/quantize_time.py --models mp_pose --feeds /tmp/held22/feeds.py --profile /tmp/p

Per model (zoo manifest names, with the zoo's calibration feeds; or names of a
``--feeds`` module's ``MODELS`` dict, entries with ``path`` and ``calib()``): quanta's
default ``quantize_static`` is timed (wall clock) and its file's sha256 is recorded
(``--record``) or compared with a recorded one (``--check``; a mismatch exits 1): a
change that makes quantization faster must not change a byte of the file. ``--ort``:
also ONNX Runtime's ``quantize_static`` on the same feeds with its defaults (MinMax, QDQ),
run after quanta's, and the ratio. ``--profile DIR``: cProfile of quanta's run, one
``.prof`` per model and the 25 functions of most cumulative time printed.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import importlib.util
import io
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_models(names: list[str], feeds_module: str | None, cache: Path) -> dict[str, tuple[Path, Any]]:
    """name -> (model path, calibration feeds)."""
    extra: dict[str, Any] = {}
    if feeds_module:
        spec = importlib.util.spec_from_file_location("quantize_time_feeds", feeds_module)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        extra = mod.MODELS
    out: dict[str, tuple[Path, Any]] = {}
    manifest = None
    for name in names:
        if name in extra:
            out[name] = (Path(extra[name]["path"]), extra[name]["calib"]())
            continue
        import zoo

        if manifest is None:
            manifest = {e["name"]: e for e in json.loads((cache / "manifest.json").read_text())["models"]}
        model = zoo.Model(manifest[name], cache)
        out[name] = (model.path, model.calib)
    return out


def run_quanta(src: Path, dst: str, calib: Any, profile: str | None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of quanta's quantize_static."""
    import quanta

    prof = cProfile.Profile() if profile else None
    c0 = time.process_time()
    t0 = time.perf_counter()
    if prof is not None:
        prof.enable()
    quanta.quantize_static(str(src), dst, calib, verbose=False, progress=False)
    if prof is not None:
        prof.disable()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    if prof is not None and profile:
        prof.dump_stats(profile)
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
        print(s.getvalue())
    return seconds, cpu


def run_ort(src: Path, dst: str, calib: Any) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of ONNX Runtime's quantize_static with its defaults."""
    import zoo

    c0 = time.process_time()
    t0 = time.perf_counter()
    zoo.quantize_ort(src, Path(dst), calib, "MinMax")
    return time.perf_counter() - t0, time.process_time() - c0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", required=True, help="comma-separated names")
    ap.add_argument("--feeds", help="a module with a MODELS dict (path, calib()) for names not in the zoo")
    ap.add_argument(
        "--cache", default=os.environ.get("QUANTA_ZOO_CACHE", str(Path.home() / ".cache/quanta-zoo"))
    )
    ap.add_argument("--record", help="write {model: sha256} of quanta's files to this JSON file")
    ap.add_argument("--check", help="compare quanta's files with the sha256 recorded in this JSON file")
    ap.add_argument(
        "--ort", action="store_true", help="also time ONNX Runtime's quantize_static (MinMax, QDQ)"
    )
    ap.add_argument("--profile", help="folder for one cProfile .prof per model")
    ap.add_argument("--keep", help="folder to keep quanta's files in (default: a temporary one)")
    args = ap.parse_args(argv)

    names = args.models.split(",")
    models = load_models(names, args.feeds, Path(args.cache))
    expected = json.loads(Path(args.check).read_text()) if args.check else {}
    recorded: dict[str, str] = (
        json.loads(Path(args.record).read_text()) if args.record and Path(args.record).exists() else {}
    )
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    failed = False
    with tempfile.TemporaryDirectory(prefix="quanta-qtime-") as tmp:
        folder = args.keep or tmp
        os.makedirs(folder, exist_ok=True)
        for name, (src, calib) in models.items():
            dst = os.path.join(folder, f"{name}.quanta.onnx")
            prof = os.path.join(args.profile, f"{name}.prof") if args.profile else None
            seconds, cpu = run_quanta(src, dst, calib, prof)
            digest = sha256(dst)
            row: dict[str, Any] = {
                "model": name,
                "quanta_s": round(seconds, 2),
                "quanta_cpu_s": round(cpu, 2),
            }
            row["sha256"] = digest
            if name in expected:
                row["same_bytes"] = expected[name] == digest
                failed |= not row["same_bytes"]
            if args.ort:
                ort, ort_cpu = run_ort(src, os.path.join(folder, f"{name}.ort.onnx"), calib)
                row["ort_s"], row["ort_cpu_s"] = round(ort, 2), round(ort_cpu, 2)
                row["ratio"] = round(seconds / ort, 2)
                row["cpu_ratio"] = round(cpu / ort_cpu, 2)
            recorded[name] = digest
            print(json.dumps(row), flush=True)
    if args.record:
        Path(args.record).write_text(json.dumps(recorded, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
