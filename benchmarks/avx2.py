"""The AVX2 path against ONNX Runtime's AVX2 path, on a CPU that has AVX-512 VNNI.

Run: ``python benchmarks/avx2.py`` (``--quick``; ``--part gemm,conv,models``;
``--models nudenet_320n,ppocr_cls``; ``--json FILE``). A ratio table from ONE run;
nothing here is a timed test.

quanta runs with ``_native.set_isa("avx2")`` set before anything is packed or compiled
(weights packed for the ``qgemm_u8s8_s32_6x16c2__avx2`` family, or
``qgemm_u8s8p_s32_5x16c4__avx2`` for pair-safe (e.g. 7-bit) weights; the AVX2 depthwise and im2col paths). ONNX Runtime runs as it would on an AVX2-only CPU: ``ort_avx2.py`` loads a
copy of the package whose MLAS platform constructor skips its AVX-VNNI and AVX-512
blocks (MLAS has no switch for it), so MatMulInteger / QLinearConv / QLinearMatMul run
MLAS's ``MlasGemmU8S8KernelAvx2`` (``vpmaddubsw``, which saturates; the script prints the
proof) and ``MlasConvSymDispatchAvx2``. Both are exact on the data used for timing
(weights in [-127, 127] never reach the saturating pair, see docs/kernels.md "AVX2").

Timing (``--fastest``: the fastest of single calls interleaved call by call, in thread
CPU time at one thread, for a machine other processes load) otherwise: the two engines alternate in blocks (about 50 ms of calls each, a 30 ms pause
between blocks so that neither thread pool spins into the other's block), every call is
timed, and each side's MEDIAN call time over all blocks is reported with the ratio
quanta / ORT (< 1: quanta is faster).

Parts: ``gemm`` (uint8 x with zx = 131, int8 weights [K, N] prepacked, int32 out:
quanta ``qgemm`` vs ORT MatMulInteger; full-range weights and the same halved into
[-64, 63], which quanta runs on its vpmaddubsw family and ORT on the same kernel), ``conv`` (QLinearConv NCHW, the stem, depthwise
and ResNet/MobileNet layers of ``benchmarks/conv.py``; the non-depthwise layers also with
their weights halved into [-64, 63], which quanta runs on the 7-bit family, implicit
path where a tap chunk is whole groups of 4 k), ``models`` (zoo models quantized
by quanta with ``weight_bits`` 8 and 7, plus ONNX Runtime's own QDQ files where the zoo
has one; both engines run the same file; batch 1, one evaluation feed, 1 and 2 threads).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import ort_avx2  # noqa: E402
from _timing import SPIN_SETTLE_S, fastest_calls  # noqa: E402

ort = ort_avx2.load()  # before quanta (or anything else) imports the stock package

import numpy as np  # noqa: E402

sys.path.insert(0, str(HERE.parent))
from quanta.kernels import _native  # noqa: E402

GEMM_SHAPES = ((1024, 1024, 1024), (256, 1024, 1024), (128, 768, 768), (128, 3072, 768), (1, 4096, 4096))
CONV_LAYERS = (
    "stem 3->16 s2",
    "stem 3->32 s2",
    "mobilenet dw",
    "mobilenet dw s2",
    "mnet dw 96",
    "mobilenet dw 7x7",
    "resnet50 3x3",
    "resnet50 3x3 s2",
    "narrow 3x3 16->16",
    "resnet50 1x1",
    "mobilenet pw",
)
MODELS = ("nudenet_320n", "ppocr_cls", "minilm_int8")


def alternate_medians(fns: dict[str, Callable[[], object]], budget_s: float) -> dict[str, float]:
    """Median seconds per call of each callable, timed in alternating blocks."""
    for fn in fns.values():
        fn()
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    end = time.perf_counter() + budget_s
    while time.perf_counter() < end or min(len(v) for v in times.values()) < 5:
        for name, fn in fns.items():
            time.sleep(SPIN_SETTLE_S)
            block_end = time.perf_counter() + 0.05
            while True:
                t = time.perf_counter()
                fn()
                now = time.perf_counter()
                times[name].append(now - t)
                if now >= block_end:
                    break
    return {k: float(np.median(v)) for k, v in times.items()}


def _timer(
    fastest: bool, threads: int
) -> Callable[[dict[str, Callable[[], object]], float], dict[str, float]]:
    if fastest:
        return lambda fns, budget: fastest_calls(fns, budget, threads)
    return alternate_medians


def _ort_options(threads: int):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return so


def gemm_rows(threads: list[int], budget: float, fastest: bool = False) -> list[dict]:
    import kernels  # benchmarks/kernels.py: the same MatMulInteger session builder

    rng = np.random.default_rng(0)
    rows = []
    for M, N, K in GEMM_SHAPES:
        w8 = rng.integers(-127, 128, (K, N), dtype=np.int8)
        x = rng.integers(0, 256, (M, K), dtype=np.uint8)
        for bits, w in ((8, w8), (7, (w8 // 2).astype(np.int8))):  # 7: in [-64, 63]
            for t in threads:
                q = kernels._quanta_qgemm(w, M, 131, t)
                o = kernels._ort_matmul_integer(w, M, 131, t, spinning=True)
                med = _timer(fastest, t)(
                    {"quanta": lambda q=q, x=x: q(x), "ort": lambda o=o, x=x: o(x)}, budget
                )
                ops = 2 * M * N * K
                fam = _native.pack_weights_s8(w, 0).kernel
                rows.append(
                    {
                        "what": f"gemm {M}x{N}x{K}, {bits}-bit w ({fam})",
                        "threads": t,
                        **{k: v * 1e3 for k, v in med.items()},
                        "gops_quanta": ops / med["quanta"] / 1e9,
                        "gops_ort": ops / med["ort"] / 1e9,
                    }
                )
                print(".", end="", flush=True)
    print()
    return rows


def conv_rows(threads: list[int], budget: float, fastest: bool = False) -> list[dict]:
    import conv

    rows = []
    for name, *shape in conv.SHAPES:
        if name not in CONV_LAYERS:
            continue
        for bits in (8, 7):
            p = conv.Problem(*shape)
            if bits == 7:
                if p.attrs["group"] > 1 and p.w.shape[1] == 1:
                    continue  # depthwise: the same int16 kernels whatever the weights
                p.w = (p.w // 2).astype(np.int8)  # in [-64, 63]: the vpmaddubsw family
            for t in threads:
                q, kernel = conv._quanta(p, "QLinearConv", t)
                o = conv._ort_session(p, "QLinearConv", t)
                med = _timer(fastest, t)({"quanta": q, "ort": o}, budget)
                rows.append(
                    {
                        "what": f"conv {name}, {bits}-bit w ({kernel})",
                        "threads": t,
                        "kernel": kernel,
                        **{k: v * 1e3 for k, v in med.items()},
                    }
                )
                print(".", end="", flush=True)
    print()
    return rows


def model_rows(names: list[str], threads: list[int], budget: float) -> list[dict]:
    import quanta

    sys.path.insert(0, str(HERE / "zoo"))
    import zoo as zoo_bench

    cache = Path(os.environ.get("QUANTA_ZOO_CACHE", Path.home() / ".cache" / "quanta-zoo"))
    manifest = json.loads((cache / "manifest.json").read_text())
    entries = {e["name"]: e for e in (manifest["models"] if "models" in manifest else manifest.values())}
    tmp = Path(tempfile.mkdtemp(prefix="avx2-bench-"))
    rows = []
    for name in names:
        entry = entries[name]
        model = zoo_bench.Model(entry, cache)
        files: list[tuple[str, Path]] = []
        if entry.get("made_by") or name == "minilm_int8":
            files.append(("as shipped", model.path))
        else:
            for bits in (8, 7):
                dst = tmp / f"{name}.quanta{bits}.onnx"
                with contextlib.redirect_stdout(io.StringIO()):
                    quanta.quantize_static(
                        str(model.path),
                        str(dst),
                        model.calib,
                        verbose=False,
                        progress=False,
                        weight_bits=bits,
                    )
                files.append((f"quanta's file, weight_bits={bits}", dst))
            if (cache / "models" / f"{name}.ort_qdq.onnx").exists():
                files.append(("ORT's file", cache / "models" / f"{name}.ort_qdq.onnx"))
        feed = model.eval[0]
        for label, path in files:
            for t in threads:
                so = quanta.SessionOptions()
                so.intra_op_num_threads = t
                qs = quanta.InferenceSession(str(path), so)
                os_ = ort.InferenceSession(str(path), _ort_options(t), providers=["CPUExecutionProvider"])
                med = alternate_medians(
                    {
                        "quanta": lambda s=qs, f=feed: s.run(None, f),
                        "ort": lambda s=os_, f=feed: s.run(None, f),
                    },
                    budget,
                )
                rows.append(
                    {"what": f"{name} ({label})", "threads": t, **{k: v * 1e3 for k, v in med.items()}}
                )
                print(".", end="", flush=True)
    print()
    return rows


def print_rows(title: str, rows: list[dict]) -> None:
    print(f"\n## {title}\n")
    print("| what | threads | quanta ms | ORT ms | quanta / ORT |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['what']} | {r['threads']} | {r['quanta']:.3f} | {r['ort']:.3f} | {r['quanta'] / r['ort']:.2f} |"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="0.6 s per measurement instead of 2 s")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--part", default="gemm,conv,models", help="comma-separated: gemm, conv, models")
    ap.add_argument("--models", default=",".join(MODELS), help="zoo manifest names")
    ap.add_argument(
        "--fastest",
        action="store_true",
        help="gemm, conv: the fastest of interleaved single calls (thread CPU time at one thread) "
        "instead of medians of alternating blocks",
    )
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    budget = 0.6 if args.quick else 2.0
    parts = args.part.split(",")

    saturates, got, exact = ort_avx2.check(ort)
    if not saturates:
        print(
            "ORT's AVX2 kernel does not run (no saturation on the probe): refusing to compare",
            file=sys.stderr,
        )
        return 1
    _native.set_isa("avx2")
    print(
        f"# quanta ISA {_native.active_isa()} ({_native.qgemm_kernel_name()}); ONNX Runtime {ort.__version__} "
        f"with MLAS forced to AVX2 (saturating probe: {got}, exact {exact})"
    )
    out: dict[str, list[dict]] = {}
    timing = ", fastest single calls" if args.fastest else ", medians"
    if "gemm" in parts:
        out["gemm"] = gemm_rows(args.threads, budget, args.fastest)
        print_rows("int8 GEMM (MatMulInteger)" + timing, out["gemm"])
    if "conv" in parts:
        out["conv"] = conv_rows(args.threads, budget, args.fastest)
        print_rows("QLinearConv layers (NCHW)" + timing, out["conv"])
    if "models" in parts:
        out["models"] = model_rows(args.models.split(","), args.threads, budget * 2)
        print_rows("zoo models, batch 1", out["models"])
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
