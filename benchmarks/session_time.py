"""Session creation time against ONNX Runtime's, and a fingerprint of what was compiled.

    python benchmarks/session_time.py --files zoo --record /tmp/plans.json
    python benchmarks/session_time.py --files zoo --check /tmp/plans.json --ort
    python benchmarks/session_time.py --files a.onnx,b.onnx --profile /tmp/prof

Per file, in a fresh process: quanta's ``InferenceSession(file)`` is created once
untimed (module imports, the reference kernels' lazy registry: what a user's first
session also pays, reported as ``cold``), then ``--repeat`` times timed (wall and CPU
seconds of the process, median); with ``--ort`` ONNX Runtime's ``InferenceSession``
(CPU provider, default options) the same way. ``--record`` / ``--check``: the sha256 of
the compiled plan's fingerprint (:func:`plan_fingerprint`: the graph after the passes in
the printer's text with every constant's bytes, every step's kernel, attributes,
requantization parameters and slots, the memory plan); a change that makes compiling
faster must not change it (a mismatch exits 1, ``--dump DIR`` writes the fingerprint
text to diff). ``--profile DIR``: cProfile of one timed creation per file.

``zoo`` names the largest files of the zoo cache: quanta's and ONNX Runtime's QDQ files
of the zoo run, the zoo's QOperator / integer files, held23's Kokoro when present.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ZOO = Path(os.environ.get("QUANTA_ZOO_CACHE", str(Path.home() / ".cache/quanta-zoo")))
RUN = ZOO / "runs/20261206T064003Z-9071"
#: the zoo's largest quantized files (QDQ of both quantizers, QOperator, integer ops)
ZOO_FILES = [
    RUN / "ppocr_rec.ort_minmax.onnx",
    RUN / "ppocr_rec.quanta.onnx",
    RUN / "effword_resnet50.quanta.onnx",
    RUN / "effword_resnet50.ort_minmax.onnx",
    RUN / "craft.quanta.onnx",
    RUN / "craft.ort_minmax.onnx",
    RUN / "fall_yolov8.quanta.onnx",
    RUN / "fall_yolov8.ort_minmax.onnx",
    RUN / "sface.ort_minmax.onnx",
    RUN / "captcha_crnn.ort_minmax.onnx",
    ZOO / "models/minilm_int8.onnx",
    ZOO / "models/t5_enc_int8/encoder.onnx",
    ZOO / "models/smart_turn_int8.onnx",
    ZOO / "models/centerface.ort_qop.onnx",
    Path("/tmp/held23/models/kokoro-v1.0.int8.onnx"),
]


def _array_digest(a: Any) -> str:
    a = np.asarray(a)
    raw = repr(a.tolist()).encode() if a.dtype.hasobject else np.ascontiguousarray(a).tobytes()
    return f"{a.dtype}{list(a.shape)}:{hashlib.sha256(raw).hexdigest()[:24]}"


def _attr_text(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return _array_digest(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_attr_text(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_attr_text(v[k])}" for k in sorted(v)) + "}"
    if hasattr(v, "SerializeToString"):  # GraphProto and other protos
        return "proto:" + hashlib.sha256(v.SerializeToString()).hexdigest()[:24]
    if hasattr(v, "__dataclass_fields__"):
        return type(v).__name__ + _attr_text({k: getattr(v, k) for k in v.__dataclass_fields__})
    return repr(v)


def plan_fingerprint(plan: Any) -> str:
    """Text that changes whenever what a session compiled changes: the compiled graph
    (names, types, attributes, order), every constant's bytes, every step's kernel,
    keyword arguments, requantization parameters and slots, and the memory plan."""
    from quanta.ir.printer import format_graph

    g = plan.model.graph
    lines = [format_graph(g), plan.format()]
    for name, v in g.initializers.items():
        lines.append(f"init {name}: {v.type} {_array_digest(v.const)}")
    for k in sorted(plan.constants):
        lines.append(f"const slot {k}: {_array_digest(plan.constants[k])}")
    for s in plan.steps:
        lines.append(
            f"step {s.index} {s.name} {s.kernel.name} in={s.inputs} out={s.outputs} free={s.free_after} "
            f"attrs={_attr_text(s.attrs)} requant={_attr_text(s.node.requant)} "
            f"node_attrs={_attr_text(s.node.attrs)}"
        )
    for sl in plan.slots:
        lines.append(f"slot {sl.index} {sl.name} {sl.kind.value} {sl.type} {sl.nbytes}")
    lines.append(f"inputs {sorted(plan.inputs.items())} outputs {sorted(plan.outputs.items())}")
    if plan.memory is not None:
        lines.append(f"memory {_attr_text(plan.memory)}")
    # an object without a value repr (a kernel's cache) shows its type, not its address
    return re.sub(r" object at 0x[0-9a-f]+", " object", "\n".join(lines)) + "\n"


def _timed(fn: Any, repeat: int) -> tuple[float, float, list[float]]:
    walls, cpus = [], []
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus), walls


def measure(path: str, repeat: int, ort: bool, profile: str | None, dump: str | None) -> dict[str, Any]:
    """One file, in this process (``main`` runs each file in a fresh one)."""
    c0, t0 = time.process_time(), time.perf_counter()
    import quanta

    sess = quanta.InferenceSession(path)
    row: dict[str, Any] = {
        "file": path,
        "cold_s": round(time.perf_counter() - t0, 2),
        "cold_cpu_s": round(time.process_time() - c0, 2),
        "nodes": len(sess.model.graph.nodes),
    }
    text = plan_fingerprint(sess.plan)
    row["plan_sha256"] = hashlib.sha256(text.encode()).hexdigest()
    if dump:
        os.makedirs(dump, exist_ok=True)
        Path(dump, Path(path).name + ".plan.txt").write_text(text)
    del sess
    if profile:
        os.makedirs(profile, exist_ok=True)
        prof = cProfile.Profile()
        prof.enable()
        quanta.InferenceSession(path)
        prof.disable()
        prof.dump_stats(os.path.join(profile, Path(path).name + ".prof"))
    wall, cpu, _ = _timed(lambda: quanta.InferenceSession(path), repeat)
    row["quanta_s"], row["quanta_cpu_s"] = round(wall, 3), round(cpu, 3)
    if ort:
        import onnxruntime as ortlib

        ortlib.InferenceSession(path, providers=["CPUExecutionProvider"])  # warm
        wall, cpu, _ = _timed(
            lambda: ortlib.InferenceSession(path, providers=["CPUExecutionProvider"]), repeat
        )
        row["ort_s"], row["ort_cpu_s"] = round(wall, 3), round(cpu, 3)
        row["ratio"] = round(row["quanta_s"] / row["ort_s"], 2)
        row["cpu_ratio"] = round(row["quanta_cpu_s"] / row["ort_cpu_s"], 2)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", default="zoo", help="comma-separated paths, or 'zoo'")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ort", action="store_true", help="also time ONNX Runtime's InferenceSession")
    ap.add_argument("--record", help="write {file: plan sha256} to this JSON file")
    ap.add_argument("--check", help="compare the plans' sha256 with this JSON file (exit 1 on a difference)")
    ap.add_argument("--profile", help="folder for one cProfile .prof per file")
    ap.add_argument("--dump", help="folder for the fingerprint text of each plan")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the child process: one file
    args = ap.parse_args(argv)

    if args.one:
        row = measure(args.one, args.repeat, args.ort, args.profile, args.dump)
        print("ROW " + json.dumps(row), flush=True)
        return 0
    files = [str(p) for p in ZOO_FILES if p.exists()] if args.files == "zoo" else args.files.split(",")
    expected = json.loads(Path(args.check).read_text()) if args.check else {}
    recorded: dict[str, str] = (
        json.loads(Path(args.record).read_text()) if args.record and Path(args.record).exists() else {}
    )
    failed = False
    for path in files:
        cmd = [sys.executable, __file__, "--one", path, "--repeat", str(args.repeat)]
        cmd += ["--ort"] if args.ort else []
        cmd += ["--profile", args.profile] if args.profile else []
        cmd += ["--dump", args.dump] if args.dump else []
        out = subprocess.run(cmd, capture_output=True, text=True)
        rows = [ln[4:] for ln in out.stdout.splitlines() if ln.startswith("ROW ")]
        if out.returncode != 0 or not rows:
            print(json.dumps({"file": path, "error": out.stderr.strip().splitlines()[-1:]}), flush=True)
            failed = True
            continue
        row = json.loads(rows[0])
        key = Path(path).name if Path(path).name != "encoder.onnx" else "t5_enc_int8/encoder.onnx"
        if key in expected:
            row["same_plan"] = expected[key] == row["plan_sha256"]
            failed |= not row["same_plan"]
        recorded[key] = row["plan_sha256"]
        print(json.dumps(row), flush=True)
    if args.record:
        Path(args.record).write_text(json.dumps(recorded, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
