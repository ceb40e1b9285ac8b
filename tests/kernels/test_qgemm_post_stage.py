"""The second affine stage of qgemm's uint8/int8 output stage (qgemm.h ``post_k``): a
QLinearMatMul and the QLinearAdd of a constant after it in one GEMM call, bit-exact with
the two twins in order (reference/qlinear_matmul_add.py, (QA1)-(QA3)) on every ISA the
CPU runs, 1 and 2 threads.

Not coincidental (docs/style.md §6): N of 1, 7, 17, 31, 33 and 384 + 3 (narrow panels, the
N edge of both SIMD widths), K of 3, 64 and 259 / 300 (> 258), M at the tile edges, distinct
scales, non-zero zero points, both operand orders, a per-column and a one-value constant,
and an Add whose ratio sB/sz = 0.5 puts every odd code on a rounding tie."""

from __future__ import annotations

import numpy as np
import pytest

from quanta.kernels import _native
from quanta.kernels.reference.qlinear_matmul import qlinear_matmul
from quanta.kernels.reference.qlinear_matmul_add import post_stage_constants, qlinear_matmul_add
from quanta.passes.lower.requant_params import float_multiplier

ISAS: list[str] = list(_native.supported_isas())
ALL_ISAS = ("portable", "avx2", "avx512vnni")
F32 = np.float32


def _case(rng, M, N, K, *, x_signed, w_signed, c_first, c_per_column, tie=False):
    xt = np.int8 if x_signed else np.uint8
    wt = np.int8 if w_signed else np.uint8
    yt = np.int8 if x_signed else np.uint8  # QLinearAdd: product, c and sum of one type
    lo, hi = (-128, 128) if x_signed else (0, 256)
    wlo, whi = (-128, 128) if w_signed else (0, 256)
    x = rng.integers(lo, hi, (M, K)).astype(xt)
    w = rng.integers(wlo, whi, (K, N)).astype(wt)
    za = xt(-9 if x_signed else 131)
    zb = np.asarray(rng.integers(wlo // 2, whi // 2, N)).astype(wt)  # per column
    sa = F32(0.0213)
    sb = np.linspace(0.0031, 0.0077, N).astype(F32)
    zy = yt(-5 if x_signed else 119)
    sy = F32(np.sqrt(K) * 0.0098)  # product codes spread over about ±60
    c = rng.integers(lo, hi, N if c_per_column else 1).astype(yt)
    if not c_per_column:
        c = c.reshape(())
    sc, zc = F32(sy * 0.41), yt(3 if x_signed else 77)
    # sz: with `tie`, the product's ratio sy/sz is 0.5: odd codes land on x.5
    sz = F32(sy * 2) if tie else F32(sy * 1.37)
    zz = yt(7 if x_signed else 140)
    return dict(
        x=x, w=w, za=za, zb=zb, sa=sa, sb=sb, sy=sy, zy=zy, c=c, sc=sc, zc=zc, sz=sz, zz=zz, c_first=c_first
    )


def _expected(t):
    return qlinear_matmul_add(
        t["x"], t["sa"], t["za"], t["w"], t["sb"], t["zb"], t["sy"], t["zy"],
        t["c"], t["sc"], t["zc"], t["sz"], t["zz"], t["c_first"],
    )  # fmt: skip


def _native_call(t, isa, threads, out=None):
    w = t["w"]
    fn = _native.pack_weights_s8 if w.dtype == np.int8 else _native.pack_weights_u8
    packed = fn(w, np.asarray(t["zb"], np.int32), isa=isa)
    n = w.shape[1]
    k, u, r1, r2 = post_stage_constants(
        t["c"], t["sc"], t["zc"], t["sy"], t["zy"], t["sz"], t["zz"], n, t["c_first"]
    )
    m = float_multiplier(t["sa"], t["sb"], t["sy"])
    return _native.qgemm(
        t["x"],
        packed,
        int(t["za"]),
        str(t["zy"].dtype),
        multiplier=m,
        zy=int(t["zy"]),
        post_add=(k, u, float(r1), float(r2)),
        num_threads=threads,
        out=out,
    )


SHAPES = [(1, 7, 3), (5, 17, 259), (13, 384 + 3, 300), (12, 31, 64), (25, 33, 65), (128, 1, 259), (3, 1, 1)]


@pytest.mark.parametrize(("M", "N", "K"), SHAPES)
@pytest.mark.parametrize("c_first", [True, False])
@pytest.mark.parametrize(("x_signed", "w_signed"), [(False, True), (True, True), (False, False)])
def test_post_stage_is_the_two_twins_every_isa(M, N, K, c_first, x_signed, w_signed):
    rng = np.random.default_rng(M * 1000 + N * 7 + K + 3 * c_first + 5 * x_signed)
    for c_per_column in (True, False):
        for tie in (False, True):
            t = _case(rng, M, N, K, x_signed=x_signed, w_signed=w_signed, c_first=c_first,
                      c_per_column=c_per_column, tie=tie)  # fmt: skip
            expected = _expected(t)
            if M * N >= 16:
                assert len(np.unique(expected)) > 8, "the case covers few codes"
            for isa in ISAS:
                for threads in (1, 2):
                    got = _native_call(t, isa, threads)
                    assert got.dtype == expected.dtype
                    assert got.tobytes() == expected.tobytes(), (
                        f"{isa} threads={threads} M×N×K={M}×{N}×{K} c_first={c_first} "
                        f"c_per_column={c_per_column} tie={tie}: "
                        f"{int(np.sum(got != expected))} codes differ"
                    )


@pytest.mark.parametrize(
    "isa", [pytest.param(i, marks=pytest.mark.skipif(i not in ISAS, reason=f"no {i}")) for i in ALL_ISAS]
)
def test_post_stage_ties_and_saturation(isa):
    """sB/sz = 0.5 on the product puts every odd code at x.5 (round half to even decides);
    a large constant against a small sz saturates both ends."""
    rng = np.random.default_rng(17)
    t = _case(rng, 12, 33, 259, x_signed=False, w_signed=True, c_first=True, c_per_column=True, tie=True)
    e = _expected(t)
    y = qlinear_matmul(t["x"], t["sa"], t["za"], t["w"], t["sb"], t["zb"], t["sy"], t["zy"])
    assert np.any(y % 2 == 1), "no odd product codes: no ties"
    assert _native_call(t, isa, 1).tobytes() == e.tobytes()
    t["sz"] = F32(t["sy"] / 40)  # |z| far beyond the range: both ends saturate
    e = _expected(t)
    assert e.min() == 0 and e.max() == 255
    assert _native_call(t, isa, 2).tobytes() == e.tobytes()


def test_post_stage_writes_out_and_refuses_bad_arguments():
    rng = np.random.default_rng(4)
    t = _case(rng, 6, 17, 40, x_signed=False, w_signed=True, c_first=False, c_per_column=True)
    out = np.empty((6, 17), np.uint8)
    got = _native_call(t, ISAS[-1], 1, out=out)
    assert got is out or np.shares_memory(got, out)
    assert out.tobytes() == _expected(t).tobytes()
    packed = _native.pack_weights_s8(t["w"], np.asarray(t["zb"], np.int32))
    k = np.zeros(17, F32)
    with pytest.raises(ValueError, match="post_add: expected None unless out_dtype is uint8/int8"):
        _native.qgemm(t["x"], packed, 3, "int32", post_add=(k, k, 1.0, 1.0))
    with pytest.raises(ValueError, match=r"post_add k: expected shape \(17,\)"):
        _native.qgemm(t["x"], packed, 3, "uint8", multiplier=0.01, post_add=(k[:5], k, 1.0, 1.0))
    bad = k.copy()
    bad[3] = np.inf
    with pytest.raises(ValueError, match=r"post_add u\[3\]: expected a finite value"):
        _native.qgemm(t["x"], packed, 3, "uint8", multiplier=0.01, post_add=(k, bad, 1.0, 1.0))
    with pytest.raises(ValueError, match="r1, r2: expected finite"):
        _native.qgemm(t["x"], packed, 3, "uint8", multiplier=0.01, post_add=(k, k, float("nan"), 1.0))
    with pytest.raises(ValueError, match="post_add: expected None unless"):
        _native.qgemm(
            t["x"], packed, 3, "uint8", fixed_multiplier=1 << 30, fixed_shift=-3, post_add=(k, k, 1.0, 1.0)
        )
