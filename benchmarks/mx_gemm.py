"""MX GEMM throughput next to quanta's per-tensor int8 GEMM, same shapes, same run.

Run: ``python benchmarks/mx_gemm.py`` (``--quick``, ``--threads 1 2``). One ratio table per
run; the libraries are timed in alternating blocks, best batch of each kept
(benchmarks/_timing.py); GOPS counts 2·M·N·K.

Columns:
- ``int8``: ``_native.qgemm`` u8 x s8 -> int32, per-tensor, prepacked weights (the
  kernel of benchmarks/kernels.py's "quanta" column, heuristic blocking);
- ``mxint8``: ``_native.mx_gemm`` on MXINT8 operands (A already quantized: bits and
  E8M0 codes), float32 output through eqs. (MX5)-(MX6);
- ``mxint8+q``: the same plus the run-time QuantizeMX of A (``_native.mx_quantize``);
- ``mxfp8``: MXFP8 E4M3 x E4M3 (exact float64 block dots), ``mxfp4w``: MXFP8 E4M3
  activations x MXFP4 weights (same path).
ratio = mxint8 / int8 (the issue's bar: >= 0.75).

``--isa avx2`` (or ``portable``) forces that ISA's kernels for both libraries' columns
(``_native.set_isa``; the int8 GEMM and the MX kernels alike). ``--tile12`` adds one
``mxint8`` column per form of the avx512vnni 12-row tile (``_native.mx_set_tile12``:
halves_scalef, halves_fma, wide; all bit-identical), timed in the same interleaved rounds,
and prints each one's ratio to int8; the ``mxint8`` column is then the CPU's default form.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from quanta.kernels import _native
from quanta.kernels.reference import mx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import time_alternating

SHAPES: tuple[tuple[int, int, int], ...] = (
    (1024, 1024, 1024),
    (128, 768, 768),
    (256, 3072, 768),
    (1, 4096, 4096),
)


def _cpu_time_gops(fns: dict, ops: int, budget: float) -> dict[str, float]:
    """GOPS per kernel from the best call's thread CPU time; five rounds, the kernels in
    turn within each, about ``budget`` seconds in all."""
    import time

    reps = max(3, int(budget * 1e9 / 5 / len(fns) / max(ops, 1) * 50))
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(5):
        for name, fn in fns.items():
            for _ in range(reps):
                t0 = time.thread_time()
                fn()
                best[name] = min(best[name], time.thread_time() - t0)
    return {k: ops / v / 1e9 for k, v in best.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--no-fp", action="store_true", help="skip the float-element (MXFP8 / MXFP4) columns")
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="one thread: best of rounds of this thread's CPU time (time.thread_time) per kernel, "
        "interleaved, instead of wall-clock blocks: preemption by other processes does not count",
    )
    ap.add_argument("--isa", help="force this ISA's kernels (portable, avx2, avx512vnni)")
    ap.add_argument("--tile12", action="store_true", help="one mxint8 column per avx512vnni 12-row tile form")
    args = ap.parse_args(argv)
    if args.isa:
        _native.set_isa(args.isa)
    forms = ("halves_scalef", "halves_fma", "wide") if args.tile12 else ()
    budget = 0.6 if args.quick else 2.0
    rng = np.random.default_rng(0)
    print(f"isa {_native.active_isa()}, block 32, avx512vnni 12-row tile form {_native.mx_tile12()}")
    print(
        f"{'M':>5} {'N':>5} {'K':>5} {'thr':>3} {'int8':>8} {'mxint8':>8} {'mxint8+q':>9} {'ratio':>6}"
        + ("" if args.no_fp else f" {'mxfp8':>8} {'mxfp4w':>8}")
        + "".join(f" {f:>13}" for f in forms)
    )
    for M, N, K in SHAPES:
        w8 = rng.integers(-128, 128, (K, N), dtype=np.int8)
        x8 = rng.integers(0, 256, (M, K), dtype=np.uint8)
        packed8 = _native.pack_weights_s8(w8, 0)
        ws = _native.QGemmWorkspace()
        xf = rng.standard_normal((M, K)).astype(np.float32)
        wf = rng.standard_normal((K, N)).astype(np.float32)
        b_el, b_c = mx.quantize_mx(wf, "i8", axis=0)
        pb = _native.mx_pack_weights(b_el.view(np.uint8), b_c.view(np.uint8), "i8", 32)
        a_bits, a_codes = _native.mx_quantize(xf, "i8", 32)
        fp = {}
        if not args.no_fp:
            e_el, e_c = mx.quantize_mx(wf, "f8e4m3fn", axis=0)
            f_el, f_c = mx.quantize_mx(wf, "f4e2m1fn", axis=0)
            fp["e4"] = _native.mx_pack_weights(e_el.view(np.uint8), e_c.view(np.uint8), "f8e4m3fn", 32)
            fp["f4"] = _native.mx_pack_weights(f_el.view(np.uint8), f_c.view(np.uint8), "f4e2m1fn", 32)
            ab8, ac8 = _native.mx_quantize(xf, "f8e4m3fn", 32)
        for t in args.threads:
            fns = {
                "int8": lambda x8=x8, p8=packed8, ws=ws, t=t: _native.qgemm(
                    x8, p8, 131, "int32", num_threads=t, workspace=ws
                ),
                "mxint8": lambda a=a_bits, c=a_codes, pb=pb, t=t: _native.mx_gemm(
                    a, c, "i8", pb, None, num_threads=t
                ),
                "mxint8+q": lambda xf=xf, pb=pb, t=t: _native.mx_gemm(
                    *_native.mx_quantize(xf, "i8", 32, num_threads=t), "i8", pb, None, num_threads=t
                ),
            }
            if fp:
                fns["mxfp8"] = lambda a=ab8, c=ac8, p=fp["e4"], t=t: _native.mx_gemm(
                    a, c, "f8e4m3fn", p, None, num_threads=t
                )
                fns["mxfp4w"] = lambda a=ab8, c=ac8, p=fp["f4"], t=t: _native.mx_gemm(
                    a, c, "f8e4m3fn", p, None, num_threads=t
                )
            for f in forms:

                def run_form(a=a_bits, c=a_codes, pb=pb, t=t, f=f):
                    _native.mx_set_tile12(f)
                    try:
                        return _native.mx_gemm(a, c, "i8", pb, None, num_threads=t)
                    finally:
                        _native.mx_set_tile12("")

                fns["mx:" + f] = run_form
            if args.cpu_time and t == 1:
                g = _cpu_time_gops(fns, 2 * M * N * K, budget)
            else:
                g = time_alternating(fns, 2 * M * N * K, budget)
            line = (
                f"{M:>5} {N:>5} {K:>5} {t:>3} {g['int8']:>8.1f} {g['mxint8']:>8.1f} {g['mxint8+q']:>9.1f} "
                f"{g['mxint8'] / g['int8']:>6.2f}"
            )
            if fp:
                line += f" {g['mxfp8']:>8.1f} {g['mxfp4w']:>8.1f}"
            for f in forms:
                line += f" {g['mx:' + f]:>6.1f} ({g['mx:' + f] / g['int8']:.2f})"
            print(line, flush=True)


if __name__ == "__main__":
    main()
