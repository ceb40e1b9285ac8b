"""The exhaustive accuracy sweeps of docs/float-ops.md: a native float32 function on every
float32 of a range of magnitudes, both signs, against float64, in chunks of 2^24.

    python benchmarks/float_ulp_sweep.py --op sigmoid --lo 2e-30 --hi 104
    python benchmarks/float_ulp_sweep.py --op expm1 --lo 1e-45 --hi 104
    python benchmarks/float_ulp_sweep.py --op softplus --lo 1e-45 --hi 104
    python benchmarks/float_ulp_sweep.py --op erf --lo 1e-45 --hi 4

Prints the largest error in ulps of the float64 result rounded to float32 (normal results;
results past FLT_MAX are left to the tests' edge cases),
per sign, with the input where it occurs, and the largest absolute error of subnormal
results in units of 2^-149. The native kernel is bit-exact with its twin
(tests/kernels/test_float_ops_native.py), so this measures the twin's contract; the
NumPy twin itself would take hours for 2^31 inputs.
"""

from __future__ import annotations

import argparse

import numpy as np

from quanta.kernels import _native

F32 = np.float32


def exact(op: str, x: np.ndarray) -> np.ndarray:
    if op == "sigmoid":
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1 / (1 + e), e / (1 + e))
    if op == "expm1":
        return np.expm1(x)
    if op == "softplus":
        return np.logaddexp(0, x)
    if op == "erf":
        from quanta.kernels.reference.nn import erf

        return erf(x)
    raise SystemExit(f"--op: expected sigmoid, expm1, softplus or erf, got {op!r}")


def native(op: str, x: np.ndarray) -> np.ndarray:
    """The native result: one unary_f32 call, or Softplus's binder (native exp and log,
    then its NumPy tail: (SP1)-(SP3))."""
    if op == "softplus":
        from quanta.targets.base import KernelContext
        from quanta.targets.native.float_ops import _softplus_native

        return _softplus_native(KernelContext(opset=13, num_threads=1), x)
    return _native.unary_f32(op, x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", required=True)
    ap.add_argument("--lo", type=float, required=True, help="smallest |x|")
    ap.add_argument("--hi", type=float, required=True, help="largest |x|")
    args = ap.parse_args()
    lo, hi = int(np.float32(args.lo).view(np.uint32)), int(np.float32(args.hi).view(np.uint32))
    step = 1 << 24
    for sign, label in ((0, "x > 0"), (0x80000000, "x < 0")):
        worst, at, worst_sub = 0.0, 0.0, 0.0
        for b in range(lo, hi + 1, step):
            bits = np.arange(b, min(b + step, hi + 1), dtype=np.uint32) | np.uint32(sign)
            x = bits.view(F32)
            with np.errstate(all="ignore"):
                y = native(args.op, x).astype(np.float64)
                ex = exact(args.op, x.astype(np.float64))
                # normal float32 results (an overflowing one is checked by the tests' edges)
                normal = (np.abs(ex) >= 2.0**-126) & (np.abs(ex) <= np.finfo(F32).max)
                err = np.where(
                    normal, np.abs(y - ex) / np.spacing(np.abs(ex.astype(F32))).astype(np.float64), 0
                )
            i = int(np.argmax(err))
            if err[i] > worst:
                worst, at = float(err[i]), float(x[i])
            sub = np.abs(ex) < 2.0**-126
            if sub.any():
                worst_sub = max(worst_sub, float(np.max(np.abs(y - ex)[sub])) / 2.0**-149)
        print(
            f"{args.op} {label}: max {worst:.4f} ulp at x = {at!r}; subnormal results {worst_sub:.3f} x 2^-149"
        )


if __name__ == "__main__":
    main()
