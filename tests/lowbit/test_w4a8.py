"""quanta::MatMulW4A8 (reference/w4.py, kernels/cpp/w4): the twin against loops, the native
kernel against the twin bit for bit on every ISA and thread count.

Exact: the block dots are integer sums (eq. (W3)), the float steps (W4)-(W5) one float32
operation each in the same order in both implementations.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from quanta.kernels import _native
from quanta.kernels.reference.quantize import quantize_linear
from quanta.kernels.reference.w4 import matmul_w4a8
from quanta.targets.native.w4 import pack_blocks

F32 = np.float32
ISAS = list(_native.supported_isas())


def _loops(a, sa, za, w, sw, zw, block):
    m, k = a.shape
    n = w.shape[1]
    t = np.zeros((m, n), F32)
    for i in range(m):
        for j in range(n):
            acc_t = F32(0)
            for b in range(-(-k // block)):
                acc = sum(
                    (int(a[i, kk]) - int(za)) * (int(w[kk, j]) - (int(zw[b, j]) if zw is not None else 0))
                    for kk in range(b * block, min(k, (b + 1) * block))
                )
                acc_t = F32(acc_t + F32(F32(acc) * F32(F32(sa) * sw[b, j])))
            t[i, j] = acc_t
    return t


def test_twin_matches_loops_with_a_short_last_block():
    rng = np.random.default_rng(0)
    m, k, n, block = 3, 70, 5, 32  # blocks of 32, 32, 6
    a = rng.integers(0, 256, (m, k)).astype(np.uint8)
    w = rng.integers(0, 16, (k, n)).astype(ml_dtypes.uint4)
    sw = rng.uniform(0.01, 0.02, (3, n)).astype(F32)
    zw = rng.integers(0, 16, (3, n)).astype(ml_dtypes.uint4)
    got = matmul_w4a8(a, F32(0.05), np.uint8(117), w, sw, zw, block)
    np.testing.assert_array_equal(got, _loops(a, 0.05, 117, w, sw, zw, block))


def _case(rng, m, k, n, block, a_signed, w_signed, zp, out):
    a_dt = np.int8 if a_signed else np.uint8
    ia = np.iinfo(a_dt)
    a = rng.integers(ia.min, ia.max + 1, (m, k)).astype(a_dt)
    w_dt = ml_dtypes.int4 if w_signed else ml_dtypes.uint4
    lo, hi = (-8, 8) if w_signed else (0, 16)
    w = rng.integers(lo, hi, (k, n)).astype(w_dt)
    kb = -(-k // block)
    sw = rng.uniform(0.005, 0.02, (kb, n)).astype(F32)
    zw = rng.integers(lo, hi, (kb, n)).astype(w_dt) if zp else None
    za = a_dt(rng.integers(ia.min, ia.max + 1))
    sa = F32(0.03)
    sy = zy = None
    if out is not None:
        sy, zy = F32(0.05 * np.sqrt(k)), out(3)
    return a, sa, za, w, sw, zw, block, sy, zy


def _native_run(a, sa, za, w, sw, zw, block, sy, zy, threads):
    k, n = w.shape
    packed, colsum = pack_blocks(w, zw, block)
    ntiles = -(-n // 16)
    c = np.zeros((sw.shape[0], ntiles * 16), F32)
    c[:, :n] = np.multiply(sa, sw, dtype=F32)
    kind = "f32" if sy is None else ("u8" if zy.dtype == np.uint8 else "i8")
    return _native.w4a8_matmul(
        a,
        packed,
        colsum,
        c,
        k,
        n,
        block,
        int(za),
        y_scale=None if sy is None else float(sy),
        zy=0 if zy is None else int(zy),
        out_dtype=kind,
        num_threads=threads,
    )


@given(
    m=st.integers(1, 9),
    k=st.integers(1, 400),
    n=st.integers(1, 40),
    block=st.sampled_from([16, 32, 64, 128]),
    a_signed=st.booleans(),
    w_signed=st.booleans(),
    zp=st.booleans(),
    out=st.sampled_from([None, np.uint8, np.int8]),
    seed=st.integers(0, 2**31),
)
def test_native_matches_twin(m, k, n, block, a_signed, w_signed, zp, out, seed):
    rng = np.random.default_rng(seed)
    case = _case(rng, m, k, n, block, a_signed, w_signed, zp, out)
    want = matmul_w4a8(*case)
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            for threads in (1, 2):
                got = _native_run(*case, threads)
                if out is None:
                    assert got.dtype == F32 and np.array_equal(got.view(np.uint32), want.view(np.uint32)), isa
                else:
                    np.testing.assert_array_equal(got, want, err_msg=isa)
    finally:
        _native.clear_isa()


def test_long_reduction_quantized_output_uses_quantize_linear():
    rng = np.random.default_rng(4)
    case = (*_case(rng, 5, 777, 33, 32, False, True, True, None)[:7], F32(0.05), np.uint8(128))
    t = matmul_w4a8(*case[:7])
    want = quantize_linear(t, case[7], case[8])
    np.testing.assert_array_equal(matmul_w4a8(*case), want)
    assert len(np.unique(want)) > 20
    np.testing.assert_array_equal(_native_run(*case, 2), want)


def test_binding_errors_name_the_argument():
    packed, colsum = pack_blocks(np.zeros((32, 3), np.int8), None, 32)
    c = np.ones(colsum.shape, F32)
    with pytest.raises(ValueError, match="w4a8_matmul: a: expected uint8 or int8, got uint16"):
        _native.w4a8_matmul(np.zeros((2, 32), np.uint16), packed, colsum, c, 32, 3, 32, 0)
    with pytest.raises(ValueError, match="block: expected a multiple of 4"):
        _native.w4a8_matmul(np.zeros((2, 32), np.uint8), packed, colsum, c, 32, 3, 30, 0)
    with pytest.raises(ValueError, match="y_scale: required for a quantized output"):
        _native.w4a8_matmul(np.zeros((2, 32), np.uint8), packed, colsum, c, 32, 3, 32, 0, out_dtype="u8")
