"""quantize_static's wall time against ONNX Runtime's, and the bytes of quanta's file.

    python benchmarks/quantize_time.py --models ppocr_det,captcha_crnn --record /tmp/sha.json
    python benchmarks/quantize_time.py --models ppocr_det,captcha_crnn --check /tmp/sha.json --ort
    python benchmarks/quantize_time.py --models mp_pose --feeds /tmp/held22/feeds.py --profile /tmp/p
    python benchmarks/quantize_time.py --models rxnmap --stages --ort

Per model (zoo manifest names, with the zoo's calibration feeds; or names of a
``--feeds`` module's ``MODELS`` dict, entries with ``path`` and ``calib()``): quanta's
default ``quantize_static`` is timed (wall clock) and its file's sha256 is recorded
(``--record``) or compared with a recorded one (``--check``; a mismatch exits 1): a
change that makes quantization faster must not change a byte of the file. ``--ort``:
also ONNX Runtime's ``quantize_static`` on the same feeds with its defaults (MinMax, QDQ),
run after quanta's, and the ratio. ``--profile DIR``: cProfile of quanta's run, one
``.prof`` per model and the 25 functions of most cumulative time printed. ``--stages``:
quanta's process CPU seconds split by stage (StageTimer: each stage is charged the CPU
time spent in it and not in a stage it calls, so the stages sum to the total), printed
as a table and kept in the JSON row. Process CPU time counts every thread, so ORT's
two-thread session and quanta's native kernels are counted alike; on a loaded machine
it moves far less than wall time.
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


class StageTimer:
    """Process CPU seconds charged to the innermost running stage. Stages are entered by
    wrappers around quanta's functions (``install``): Python calls around large work, so
    the wrappers cost nothing measurable; time outside every stage is "rest"."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.mark = time.process_time()

    def _charge(self) -> None:
        now = time.process_time()
        label = self.stack[-1] if self.stack else "rest"
        self.seconds[label] = self.seconds.get(label, 0.0) + now - self.mark
        self.mark = now

    def enter(self, label: str) -> None:
        self._charge()
        self.stack.append(label)
        self.calls[label] = self.calls.get(label, 0) + 1

    def leave(self) -> None:
        self._charge()
        self.stack.pop()

    def wrap(self, owner: Any, attr: str, label: Any) -> None:
        """Replace ``owner.attr`` (a module's function or a class's own method) by a
        timed call; ``label`` is a stage name or ``label(timer, args, kwargs)``."""
        fn = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            self.enter(label(self, args, kwargs) if callable(label) else label)
            try:
                return fn(*args, **kwargs)
            finally:
                self.leave()

        timed.__wrapped__ = fn  # type: ignore[attr-defined]
        setattr(owner, attr, timed)

    def install(self) -> None:
        """Wrap the stages of quanta's quantize_static (names as quanta.quantize.static
        imports them, so the calls it makes go through the wrappers)."""
        import quanta.calibrate.runner as runner
        import quanta.quantize.range_choice as range_choice
        import quanta.quantize.replay as replay
        import quanta.quantize.rounding as rounding
        import quanta.quantize.static as static
        from quanta.calibrate import (
            entropy,
            histogram,
            minmax,
            moving_average,
            mse,
            observer,
            percentile,
            spread,
            weighted_mse,
        )

        observer_modules = (
            entropy,
            histogram,
            minmax,
            moving_average,
            mse,
            observer,
            percentile,
            spread,
            weighted_mse,
        )
        passes = ("SmoothQuant statistics pass", "eq. (HB2) spread pass", "equalization pass")

        def calibrate_label(timer: StageTimer, args: tuple, kwargs: dict) -> str:
            parent = timer.stack[-1] if timer.stack else ""
            if parent in passes:
                return parent
            return "GPTQ statistics pass, forward" if kwargs.get("stats") else "calibration pass, forward"

        self.wrap(static, "load_for_quantization", "load + prepare")
        self.wrap(static, "prepare_float_graph", "load + prepare")
        self.wrap(static, "_smooth", passes[0])
        self.wrap(static, "_log_float", passes[1])
        self.wrap(static, "_equalize", passes[2])
        self.wrap(static, "calibrate", calibrate_label)
        self.wrap(static, "compile_executor", "compile executor")
        self.wrap(runner, "compile_executor", "compile executor")
        for name in ("plan_qdq", "plan_bodies"):
            self.wrap(static, name, "plan")
        self.wrap(rounding, "plan_rounding", "plan")
        classes = [
            c
            for m in observer_modules
            for c in vars(m).values()
            if isinstance(c, type) and c.__module__ == m.__name__
        ]
        for cls in classes:
            if "observe" in cls.__dict__:
                self.wrap(cls, "observe", "observers (histograms)")
            for name in ("range", "tensor_range", "extrema", "degenerate"):
                if name in cls.__dict__ and callable(cls.__dict__[name]):
                    self.wrap(cls, name, "range search")
        self.wrap(rounding.RoundedLayer, "observe", "GPTQ Gram")
        self.wrap(rounding, "apply_rounding", "GPTQ rounding")
        self.wrap(replay.InputReplay, "replay", "GPTQ replay")
        self.wrap(static, "run_file", "measurement runs (run_file)")
        self.wrap(range_choice, "choose", "eq. (24)/(29b) choice, less its runs")
        for name in ("from_proto", "to_proto"):
            self.wrap(static, name, "proto copies (to_proto / from_proto)")
        self.wrap(static, "save", "save")
        self.wrap(static, "share_equal_initializers", "save")
        self.wrap(static, "resolve_params", "params + Q/DQ")
        self.wrap(static, "insert_qdq", "params + Q/DQ")
        self.wrap(static, "pair_safe_codes", "params + Q/DQ")
        self.wrap(static, "correct_biases", "params + Q/DQ")
        self.wrap(static, "settle_dq_propagation", "params + Q/DQ")
        self.wrap(static, "verify", "verify")
        self.wrap(static, "lowered_coverage", "coverage")
        self.wrap(static, "_wider_if_better", "eq. (27) wide fallback, less its stages")

    def table(self) -> str:
        total = sum(self.seconds.values())
        rows = sorted(self.seconds.items(), key=lambda kv: -kv[1])
        lines = [f"{'stage':44s} {'CPU s':>8s} {'share':>6s} {'calls':>6s}"]
        lines += [f"{k:44s} {v:8.2f} {v / total:6.1%} {self.calls.get(k, 0):6d}" for k, v in rows]
        lines.append(f"{'total':44s} {total:8.2f}")
        return "\n".join(lines)


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


def run_quanta(
    src: Path, dst: str, calib: Any, profile: str | None, stages: StageTimer | None = None
) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of quanta's quantize_static."""
    import quanta

    prof = cProfile.Profile() if profile else None
    if stages is not None:
        stages.seconds.clear()
        stages.calls.clear()
        stages.mark = time.process_time()
    c0 = time.process_time()
    t0 = time.perf_counter()
    if prof is not None:
        prof.enable()
    quanta.quantize_static(str(src), dst, calib, verbose=False, progress=False)
    if prof is not None:
        prof.disable()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    if stages is not None:
        stages._charge()
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
    ap.add_argument("--stages", action="store_true", help="split quanta's CPU seconds by stage (StageTimer)")
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
    timer = None
    if args.stages:
        timer = StageTimer()
        timer.install()
    failed = False
    with tempfile.TemporaryDirectory(prefix="quanta-qtime-") as tmp:
        folder = args.keep or tmp
        os.makedirs(folder, exist_ok=True)
        for name, (src, calib) in models.items():
            dst = os.path.join(folder, f"{name}.quanta.onnx")
            prof = os.path.join(args.profile, f"{name}.prof") if args.profile else None
            seconds, cpu = run_quanta(src, dst, calib, prof, timer)
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
            if timer is not None:
                print(f"{name}: quanta's CPU seconds by stage", flush=True)
                print(timer.table(), flush=True)
                row["stages"] = {k: round(v, 2) for k, v in timer.seconds.items()}
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
