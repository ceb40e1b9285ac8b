"""Dynamic quantization recorded into native programs (docs/runtime.md "Native programs"):
``dynamic_quantize_linear_into`` writes DynamicQuantizeLinear's codes, scale and zero
point into given arrays, and a recorded ``qgemm_scaled_float`` (MatMulIntegerToFloat with
a run-time a_scale / a_zero_point) reads the scale and zero point when its program runs,
not when it was recorded.

Failure signature guarded: a program that replays the multiplier and zero point it saw
while recording. Its first run is right; every later run with another input range is
scaled wrong (a relative error of the ratio of the two ranges) and shifted by the zero
point difference.

Tolerance 0 everywhere: the recorded calls run the kernels of the direct calls, which are
bit-exact against the twins (test_elementwise_native.py, tests/targets/test_native_gemm.py),
and the fallback for a multiplier the kernel refuses computes the twin's float32 steps
(reference/ms_qgemm.py (3)) in its order.
"""

from __future__ import annotations

import numpy as np
import pytest

from quanta.kernels import _native
from quanta.kernels.reference.ms_qgemm import matmul_integer_to_float
from quanta.kernels.reference.quantize import dynamic_quantize_linear
from tests.kernels.test_elementwise_native import assert_same

ISAS: list[str] = list(_native.supported_isas())
F32 = np.float32


def _ranges(rng: np.random.Generator, shape: tuple[int, ...]) -> list[np.ndarray]:
    """Inputs whose ranges differ run to run (a scale recorded once shows on the second),
    with one-sided ranges (zero point 0 and 255), a tie grid, all zeros (scale 1/255) and
    an infinity (an infinite scale: the multiplier the GEMM kernel refuses)."""
    x = rng.standard_normal(shape).astype(F32)
    out = [
        x * F32(3),
        x * F32(0.01) + F32(0.004),
        np.abs(x) + F32(0.5),
        -np.abs(x) - F32(0.25),
        (np.floor(x * 4) / 4 + F32(0.125)).astype(F32),
        np.zeros(shape, F32),
    ]
    inf = x.copy()
    inf.reshape(-1)[-1] = np.inf
    out.append(inf)
    return out


@pytest.mark.parametrize("shape", [(1,), (7, 17), (3, 300), (5, 1031)])
@pytest.mark.parametrize("threads", [1, 2])
def test_dynamic_quantize_into_recorded_follows_each_runs_data(shape: tuple[int, ...], threads: int) -> None:
    rng = np.random.default_rng(sum(shape) * 10 + threads)
    x = np.empty(shape, F32)
    y, scale, zero_point = np.empty(shape, np.uint8), np.empty((), F32), np.empty((), np.uint8)
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            program = _native.Program()
            x[...] = rng.standard_normal(shape)
            assert program.record(_native.dynamic_quantize_linear_into, x, y, scale, zero_point, threads)
            for k, data in enumerate(_ranges(rng, shape)):
                x[...] = data
                with np.errstate(invalid="ignore"):
                    want = dynamic_quantize_linear(x)
                program.run()
                for name, e, a in zip(
                    ("y", "scale", "zero_point"), want, (y, scale, zero_point), strict=True
                ):
                    assert_same(e, a, f"{isa}, threads {threads}, input {k}: {name}")
    finally:
        _native.clear_isa()


def test_dynamic_quantize_into_refuses_a_scale_of_two_values() -> None:
    x = np.ones((3, 7), F32)
    with pytest.raises(ValueError) as e:
        _native.dynamic_quantize_linear_into(
            x, np.empty((3, 7), np.uint8), np.empty(2, F32), np.empty((), np.uint8)
        )
    assert str(e.value) == (
        "dynamic_quantize_linear_into: scale, zero_point: expected one value each, got shapes (2,) and ()"
    )


def test_dynamic_quantize_into_refuses_outputs_that_overlap() -> None:
    """A zero point placed inside y would be overwritten by a code (or the reverse)."""
    x = np.ones((3, 7), F32)
    y = np.empty((3, 7), np.uint8)
    with pytest.raises(ValueError) as e:
        _native.dynamic_quantize_linear_into(x, y, np.empty((), F32), y.reshape(-1)[:1])
    assert (
        str(e.value) == "dynamic_quantize_linear_into: expected outputs that overlap neither x nor each other"
    )


def _weights(rng: np.random.Generator, k: int, n: int, per_column: bool) -> tuple:
    """int8 weights with non-zero zero points (per column: each its own) and scales that
    differ per column over two binades."""
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    if per_column:
        zb = rng.integers(-9, 10, n).astype(np.int8)
        sb = (rng.uniform(0.5, 2.0, n) * 2.0 ** rng.integers(-9, -7, n)).astype(F32)
    else:
        zb, sb = np.int8(-3), F32(0.0037)
    return w, zb, sb


@pytest.mark.parametrize(("m", "k", "n"), [(1, 17, 3), (7, 259, 17), (33, 300, 7), (5, 1031, 17)])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_recorded_scaled_gemm_reads_the_scale_of_each_run(
    m: int, k: int, n: int, per_column: bool, bias: bool, threads: int
) -> None:
    """DynamicQuantizeLinear then MatMulIntegerToFloat recorded once, run on inputs of
    other ranges: each run equals the twins on that run's data (the infinity: the
    refused multiplier's fallback)."""
    rng = np.random.default_rng(m * 1000 + k + n + 7 * per_column + 3 * bias + threads)
    w, zb, sb = _weights(rng, k, n, per_column)
    fb = rng.standard_normal(n).astype(F32) if bias else None
    packed = _native.pack_weights_s8(w, np.asarray(zb, np.int32) if per_column else int(zb))
    sb_arg = np.ascontiguousarray(sb, F32)
    a = np.empty((m, k), F32)
    qa, sa, za = np.empty((m, k), np.uint8), np.empty((), F32), np.empty((), np.uint8)
    out = np.empty((m, n), F32)
    ws = _native.QGemmWorkspace()
    program = _native.Program()
    a[...] = rng.standard_normal((m, k))
    _native.dynamic_quantize_linear_into(a, qa, sa, za, threads)
    assert program.record(_native.dynamic_quantize_linear_into, a, qa, sa, za, threads)
    assert program.record(_native.qgemm_scaled_float, qa, packed, sa, za, sb_arg, fb, threads, ws, out)
    for run, data in enumerate(_ranges(rng, (m, k))):
        a[...] = data
        program.run()
        with np.errstate(invalid="ignore", over="ignore"):
            q, s, z = dynamic_quantize_linear(a)
            want = matmul_integer_to_float(q, w, s, sb, z, zb, fb)
        assert_same(want, out, f"{m}x{k}x{n}, run {run}, scale {s}, zero point {z}")


@pytest.mark.parametrize("value", [0.0, np.inf, np.nan, -0.5])
def test_recorded_scaled_gemm_with_a_scale_the_kernel_refuses_follows_the_twin(value: float) -> None:
    """A scale written after recording that makes the multiplier 0, infinite, NaN or
    negative: the recorded call cannot raise to the generic path, so it computes the
    twin's f32(f32(f32(acc) · m[n]) + bias[n]) itself. Failure signature: the kernel's
    output stage run with a multiplier it was never tested with."""
    rng = np.random.default_rng(3)
    m, k, n = 7, 259, 17
    w, zb, sb = _weights(rng, k, n, True)
    fb = rng.standard_normal(n).astype(F32)
    packed = _native.pack_weights_s8(w, np.asarray(zb, np.int32))
    qa = rng.integers(0, 256, (m, k)).astype(np.uint8)
    sa, za = np.array(0.02, F32), np.array(131, np.uint8)
    out = np.empty((m, n), F32)
    program = _native.Program()
    assert program.record(
        _native.qgemm_scaled_float, qa, packed, sa, za, sb, fb, 2, _native.QGemmWorkspace(), out
    )
    sa[...] = value
    za[...] = 17
    program.run()
    with np.errstate(invalid="ignore", over="ignore"):
        want = matmul_integer_to_float(qa, w, sa, sb, za, zb, fb)
    assert_same(want, out, f"a_scale {value}")
    sa[...] = 0.013  # back to a valid multiplier: the kernel's own output stage again
    program.run()
    assert_same(matmul_integer_to_float(qa, w, sa, sb, za, zb, fb), out, "a_scale 0.013")


@pytest.mark.parametrize("while_recording", [np.nan, 0.0, -1.0])
def test_scaled_gemm_records_whatever_the_scale_holds_while_recording(while_recording: float) -> None:
    """The executor records a program before any run has written the arena, so a_scale's
    place may hold anything then (a NaN, a zero). Failure signature: the record refused
    (the GEMM left in the Python loop) or the multiplier checked once against that value."""
    rng = np.random.default_rng(11)
    m, k, n = 5, 300, 7
    w, zb, sb = _weights(rng, k, n, False)
    packed = _native.pack_weights_s8(w, int(zb))
    sb_arg = np.asarray(sb, F32)
    qa = rng.integers(0, 256, (m, k)).astype(np.uint8)
    sa, za = np.array(while_recording, F32), np.array(0, np.uint8)
    out = np.empty((m, n), F32)
    program = _native.Program()
    assert program.record(
        _native.qgemm_scaled_float, qa, packed, sa, za, sb_arg, None, 1, _native.QGemmWorkspace(), out
    )
    sa[...], za[...] = 0.021, 140
    program.run()
    assert_same(matmul_integer_to_float(qa, w, sa, sb, za, zb, None), out, "after recording")
