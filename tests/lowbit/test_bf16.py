"""bf16 islands: quanta::MatMulBf16 (reference/bf16.py, kernels/cpp/bf16).

Bound, derived (docs/float-ops.md "bf16 islands"): the products of two bf16 values are
exact in float32, so every path (vdpbf16ps, widened fma, the twin's BLAS) differs from
the float64 product of the *rounded* operands only by float32 summation:
``|y − y64| ≤ γ_{K+1} · (Σ_k |a_k·w_k| + |bias|)``, ``γ_n = n·u/(1 − n·u)``, ``u = 2^-24``.
Against the float32 operands the bf16 rounding adds at most ``(2·2^-8 + 2^-16)`` relative
per product. The vdpbf16ps path runs where the CPU has AVX512_BF16, and the widened
fallback is forced with ``_native.set_avx512bf16(False)``; every ISA; 1 and 2 threads.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from quanta.kernels import _native
from quanta.kernels.reference.bf16 import matmul_bf16, round_bf16
from quanta.targets.native.bf16 import pack_bf16

F32 = np.float32
U = 2.0**-24
BF16 = ml_dtypes.bfloat16


def _paths():
    """(isa, bf16 on?) pairs this CPU can run."""
    out = [(isa, False) for isa in _native.supported_isas()]
    if _native.avx512bf16_supported():
        out.append(("avx512vnni", True))
    return out


def _run(a, w, bias, isa, bf16_on, threads):
    try:
        _native.set_isa(isa)
        if _native.avx512bf16_supported():
            _native.set_avx512bf16(bf16_on)
        y = _native.bf16_matmul(a, pack_bf16(w), w.shape[1], bias, num_threads=threads)
        return y, _native.bf16_path()
    finally:
        _native.clear_isa()
        _native.clear_avx512bf16()


def _bound(a, w, bias):
    ar = round_bf16(a).astype(np.float64)
    wf = np.asarray(w).astype(np.float64)
    y64 = ar @ wf + (0 if bias is None else bias.astype(np.float64))
    mag = np.abs(ar) @ np.abs(wf) + (0 if bias is None else np.abs(bias.astype(np.float64)))
    n = a.shape[-1] + 1
    return y64, mag * (n * U / (1 - n * U))


@given(
    m=st.integers(1, 11),
    k=st.integers(1, 600),
    n=st.integers(1, 70),
    bias=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_every_path_within_the_bound(m, k, n, bias, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(F32) * rng.uniform(0.1, 10)
    w = rng.standard_normal((k, n)).astype(BF16)
    b = rng.standard_normal(n).astype(F32) if bias else None
    y64, bound = _bound(a, w, b)
    assert np.all(np.abs(matmul_bf16(a, w, b) - y64) <= bound)
    seen = set()
    for isa, on in _paths():
        y, path = _run(a, w, b, isa, on, 1)
        seen.add(path)
        assert np.all(np.abs(y - y64) <= bound), (isa, path)
    assert ("bf16" in seen) == _native.avx512bf16_supported()


def test_threads_identical_and_long_reduction():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((37, 777)).astype(F32)
    w = rng.standard_normal((777, 33)).astype(BF16)
    for isa, on in _paths():
        y1, _ = _run(a, w, None, isa, on, 1)
        y2, _ = _run(a, w, None, isa, on, 2)
        np.testing.assert_array_equal(y1, y2)


def test_rounding_is_nearest_even_like_ml_dtypes():
    """The kernel rounds a to bf16 as ml_dtypes does: ties to even, both signs; a weight of
    1.0 in one column makes the output the rounded input itself."""
    vals = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.0e-39, 65504.0, -0.0], F32)
    a = vals.reshape(-1, 1)
    w = np.ones((1, 1), BF16)
    for isa, on in _paths():
        y, _ = _run(a, w, None, isa, on, 1)
        if on:  # vdpbf16ps flushes denormal inputs to zero (DAZ)
            continue
        np.testing.assert_array_equal(y[:, 0], round_bf16(vals))


def test_accuracy_against_float32_operands():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((16, 300)).astype(F32)
    wf = rng.standard_normal((300, 24)).astype(F32)
    y, _ = _run(a, wf.astype(BF16), None, _native.supported_isas()[-1], _native.avx512bf16_supported(), 1)
    exact = a.astype(np.float64) @ wf.astype(np.float64)
    mag = np.abs(a.astype(np.float64)) @ np.abs(wf.astype(np.float64))
    assert np.all(np.abs(y - exact) <= mag * (2 * 2**-8 + 2**-16 + 301 * U * 1.01))


def test_binding_refuses_bad_packing():
    with pytest.raises(ValueError, match=r"bf16_matmul: packed: expected shape \(2, 3, 32\)"):
        _native.bf16_matmul(np.zeros((2, 5), F32), np.zeros((2, 2, 32), np.uint16), 3)
