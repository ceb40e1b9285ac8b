"""Differential tests of the native int8 GEMM core (quanta/kernels/cpp/qgemm).

Every micro-kernel family the CPU runs (portable always) is compared bit-exactly
(``tobytes`` equality; float32 outputs included) against the NumPy twin
``quanta.kernels.reference.qgemm``, which is itself tested against its triple-loop form.
Tolerance everywhere: 0 — the accumulator is exact int32 arithmetic (wrapping), and the
output stages perform the same float32 / integer operations in the same order as
``reference/requant.py``.

Defaults are not coincidental (docs/style.md §6): zero points drawn per operand and per
column, per-channel multipliers that differ, shapes at tile edges (MR = 4/8, NR = 16/32,
KR = 2/4), K = 1, K > 258, N = 1, M = 1, odd N, both saturation ends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from quanta.kernels import _native
from quanta.kernels.reference import qgemm as ref
from quanta.kernels.reference import requant
from tests.strategies import K_EDGES, M_EDGES, N_EDGES, zero_points

ISAS: list[str] = list(_native.supported_isas())  # portable first; always present
ALL_ISAS = ("portable", "avx2", "avx512vnni")
THREADS = (1, 2)

# Tile edges of every family: MR 4 (portable) / 6 (avx2; 5 for its 7-bit family,
# test_qgemm_avx2.py) / 12 (avx512vnni; 8 to 11 rows left: an 8-row tile and the rest),
# NR 16 / 32.
M_VALUES, N_VALUES, K_VALUES = M_EDGES, N_EDGES, K_EDGES


def isa_param(isa: str):
    return pytest.param(isa, marks=pytest.mark.skipif(isa not in ISAS, reason=f"this CPU does not run {isa}"))


@dataclass
class Case:
    """One GEMM problem; ``stage`` holds the output-stage keywords of ref.output_stage."""

    x: np.ndarray
    w: np.ndarray
    zx: np.ndarray | int
    zw: np.ndarray | int
    out_dtype: np.dtype
    bias: np.ndarray | None = None
    stage: dict = field(default_factory=dict)

    @property
    def mnk(self) -> str:
        M = int(np.prod(self.x.shape[:-1]))
        return f"{M}x{self.w.shape[1]}x{self.w.shape[0]}"

    def describe(self) -> str:
        zw = self.zw if np.ndim(self.zw) == 0 else f"per-column {np.asarray(self.zw)[:4].tolist()}..."
        zx = self.zx if np.ndim(self.zx) == 0 else f"per-row {np.asarray(self.zx)[:4].tolist()}..."
        parts = [
            f"M×N×K={self.mnk}",
            f"x {self.x.dtype} zx={zx}",
            f"w {self.w.dtype} zw={zw}",
            f"out {self.out_dtype}",
            f"bias={'yes' if self.bias is not None else 'no'}",
        ]
        for k, v in self.stage.items():
            v = np.asarray(v)
            parts.append(f"{k}={v.tolist() if v.size <= 4 else [*v[:4].tolist(), '...']}")
        return ", ".join(parts)


def pack(case: Case, isa: str) -> _native.PackedWeights:
    fn = _native.pack_weights_s8 if case.w.dtype == np.int8 else _native.pack_weights_u8
    zw = case.zw if np.ndim(case.zw) == 0 else np.asarray(case.zw, np.int32)
    return fn(case.w, zw, isa=isa)


def run_native(case: Case, packed: _native.PackedWeights, threads: int, **extra) -> np.ndarray:
    return _native.qgemm(
        case.x, packed, case.zx, case.out_dtype, bias=case.bias, num_threads=threads, **case.stage, **extra
    )


def run_twin(case: Case) -> np.ndarray:
    return ref.qgemm(case.x, case.w, case.zx, case.zw, case.out_dtype, bias=case.bias, **case.stage)


def assert_bitexact(expected: np.ndarray, actual: np.ndarray, case: Case, label: str) -> None:
    """Bytes equal, or a ruy-style report: M×N×K, first bad index, expected/actual, params."""
    if (
        expected.dtype == actual.dtype
        and expected.shape == actual.shape
        and expected.tobytes() == actual.tobytes()
    ):
        return
    if expected.dtype != actual.dtype or expected.shape != actual.shape:
        raise AssertionError(
            f"{label}: expected {expected.dtype}{expected.shape}, got {actual.dtype}{actual.shape}; {case.describe()}"
        )
    e2 = expected.reshape(-1, expected.shape[-1])
    a2 = actual.reshape(-1, actual.shape[-1])
    view = np.int32 if e2.dtype == np.float32 else e2.dtype
    bad = np.argwhere(e2.view(view) != a2.view(view))
    m, n = (int(i) for i in bad[0])
    acc = ref.accumulate(case.x, case.w, case.zx, case.zw, case.bias).reshape(-1, e2.shape[-1])[m, n]
    rows = np.unique(bad[:, 0])
    cols = np.unique(bad[:, 1])
    raise AssertionError(
        f"{label}: {len(bad)} of {e2.size} elements differ; first bad index (m={m}, n={n}): "
        f"expected {e2[m, n]!r}, actual {a2[m, n]!r}, accumulator {int(acc)}; "
        f"rows with errors {rows[:8].tolist()}{'...' if len(rows) > 8 else ''}, "
        f"cols with errors {cols[:8].tolist()}{'...' if len(cols) > 8 else ''}; {case.describe()}"
    )


def check_all_variants(case: Case, isas: list[str] | tuple[str, ...] = tuple(ISAS)) -> None:
    """Twin vs every ISA x thread count; equal to the twin means pairwise-equal bytes too."""
    expected = run_twin(case)
    first = None
    for isa in isas:
        packed = pack(case, isa)
        for threads in THREADS:
            got = run_native(case, packed, threads)
            assert_bitexact(expected, got, case, f"{isa} threads={threads} vs twin")
            if first is None:
                first = (f"{isa} threads={threads}", got)
            else:
                assert_bitexact(first[1], got, case, f"{isa} threads={threads} vs {first[0]}")


# --------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------


def _range(dtype: type) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


@st.composite
def gemm_cases(draw, m_values=M_VALUES, n_values=N_VALUES, k_values=K_VALUES) -> Case:
    M, N, K = (
        draw(st.sampled_from(m_values)),
        draw(st.sampled_from(n_values)),
        draw(st.sampled_from(k_values)),
    )
    x_dtype = draw(st.sampled_from([np.uint8, np.int8]))
    w_dtype = draw(st.sampled_from([np.int8, np.uint8]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    xlo, xhi = _range(x_dtype)
    wlo, whi = _range(w_dtype)
    x = rng.integers(xlo, xhi + 1, (M, K), dtype=x_dtype)
    w = rng.integers(wlo, whi + 1, (K, N), dtype=w_dtype)
    if draw(st.booleans()):  # one zero point per row (MatMulInteger)
        zx: np.ndarray | int = rng.integers(xlo, xhi + 1, M).astype(np.int32)
        zx[zx == 0] = 1
    else:
        zx = draw(zero_points(x_dtype))
    if draw(st.booleans()):
        zw: np.ndarray | int = rng.integers(wlo, whi + 1, N).astype(np.int32)
        zw[zw == 0] = 1
    else:
        zw = draw(zero_points(w_dtype))
    bias = rng.integers(-(2**20), 2**20, N).astype(np.int32) if draw(st.booleans()) else None
    out_dtype = np.dtype(draw(st.sampled_from([np.uint8, np.int8, np.int32, np.float32])))
    case = Case(x, w, zx, zw, out_dtype, bias)

    # Output parameters derived from the accumulator's real range (XNNPACK habit), with a
    # per-channel factor in [0.5, 2] so channels differ and some saturate at both ends.
    acc = ref.accumulate(x, w, zx, zw, bias).astype(np.float64)
    span = max(1.0, float(acc.max(initial=0) - acc.min(initial=0)))
    per_channel = draw(st.booleans())
    factor = rng.uniform(0.5, 2.0, N) if per_channel else np.float64(rng.uniform(0.5, 2.0))
    clamp_it = draw(st.booleans())
    if out_dtype in (np.uint8, np.int8):
        qlo, qhi = _range(out_dtype.type)
        m = np.float32((qhi - qlo) / span) * np.asarray(factor, np.float32)
        center = float(np.median(acc)) if acc.size else 0.0
        zy = int(np.clip(round((qlo + qhi) / 2 - center * float(np.mean(m))), qlo, qhi))
        case.stage["zy"] = zy
        if draw(st.booleans()):  # float requantization, eq. (6)
            case.stage["multiplier"] = m.astype(np.float32)
        else:  # fixed point, eq. (7)
            pairs = [requant.quantize_multiplier(float(v)) for v in np.atleast_1d(m)]
            fm = np.array([p[0] for p in pairs], np.int32)
            fs = np.array([p[1] for p in pairs], np.int32)
            case.stage["fixed_multiplier"] = fm if per_channel else int(fm[0])
            case.stage["fixed_shift"] = fs if per_channel else int(fs[0])
        if clamp_it:
            a, b = sorted(draw(st.lists(st.integers(qlo, qhi), min_size=2, max_size=2)))
            case.stage["clamp"] = (a, b)
    elif out_dtype == np.float32:
        m = (rng.uniform(1e-4, 1e-2, N) if per_channel else np.float64(rng.uniform(1e-4, 1e-2))).astype(
            np.float32
        )
        case.stage["multiplier"] = m
        if draw(st.booleans()):
            case.stage["float_bias"] = rng.uniform(-100, 100, N).astype(np.float32)
        if clamp_it:
            case.stage["clamp"] = (0.0, float(rng.uniform(0, 50)))  # a fused Relu-N
    elif clamp_it:  # int32 output, clamp inside the accumulator range
        lo_q, hi_q = np.quantile(acc, [0.25, 0.75]) if acc.size else (0.0, 0.0)
        case.stage["clamp"] = (int(lo_q), int(hi_q))
    return case


# --------------------------------------------------------------------------------------
# The twin against its own truth
# --------------------------------------------------------------------------------------


@given(case=gemm_cases(m_values=(1, 2, 3, 5), n_values=(1, 2, 3, 7), k_values=(1, 2, 3, 5, 9)))
def test_twin_vectorised_and_folded_forms_match_loop(case: Case) -> None:
    """qgemm == qgemm_loop, and eq. (5)/(8) (accumulate_folded) == eq. (4) (accumulate_loop)."""
    loop_acc = ref.accumulate_loop(case.x, case.w, case.zx, case.zw, case.bias)
    np.testing.assert_array_equal(ref.accumulate(case.x, case.w, case.zx, case.zw, case.bias), loop_acc)
    np.testing.assert_array_equal(
        ref.accumulate_folded(case.x, case.w, case.zx, case.zw, case.bias), loop_acc
    )
    expected = ref.qgemm_loop(case.x, case.w, case.zx, case.zw, case.out_dtype, bias=case.bias, **case.stage)
    assert_bitexact(expected, run_twin(case), case, "twin vs loop")


def test_twin_folded_form_long_k_wraps_like_loop() -> None:
    """Folded terms wrap individually; their sum must still equal the wrapped loop (K = 259)."""
    rng = np.random.default_rng(7)
    x = rng.integers(-128, 128, (2, 259), dtype=np.int8)
    w = rng.integers(0, 256, (259, 3), dtype=np.uint8)
    zw = np.array([3, 200, 255], np.int32)
    loop = ref.accumulate_loop(x, w, -77, zw)
    np.testing.assert_array_equal(ref.accumulate_folded(x, w, -77, zw), loop)


# --------------------------------------------------------------------------------------
# Native against the twin: every ISA, threads 1 and 2
# --------------------------------------------------------------------------------------


@given(case=gemm_cases())
def test_qgemm_matches_twin_every_isa_and_thread_count(case: Case) -> None:
    check_all_variants(case)


@pytest.mark.parametrize("isa", [isa_param(i) for i in ALL_ISAS])
def test_qgemm_k_chunks_row_blocks_and_row_split(isa: str) -> None:
    """K = 4099 > KC (several K chunks through the partial-sum buffer), M = 130 > MC (two
    row blocks), K % KR != 0 (activation packing); N = 7 is one panel, so threads=2 splits
    the rows instead of the panels."""
    rng = np.random.default_rng(11)
    for N in (7, 33):
        x = rng.integers(-128, 128, (130, 4099), dtype=np.int8)
        w = rng.integers(-128, 128, (4099, N), dtype=np.int8)
        zw = rng.integers(-128, 128, N).astype(np.int32)
        case = Case(x, w, -3, zw, np.dtype(np.int32), rng.integers(-1000, 1000, N).astype(np.int32))
        check_all_variants(case, isas=(isa,))


@pytest.mark.parametrize("stage", ["uint8 float", "int8 fixed", "float32", "int32"])
@pytest.mark.parametrize("N", [1, 7, 16, 48])
def test_qgemm_narrow_panels_every_output_stage(N: int, stage: str) -> None:
    """A panel with at most 16 valid columns (N <= 16; the last panel of N = 48) runs the
    avx512vnni narrow tile: one B vector a k-group, the output stage on one vector a row
    (four rows a pack for 8-bit outputs). M = 53: four 12-row tiles and an edge tile;
    K = 2051 > KC: the narrow tile's sums go through `partial` between K chunks; per-row zx,
    per-column zw and multipliers that differ per column."""
    rng = np.random.default_rng(N)
    M, K = 53, 2051
    x = rng.integers(0, 256, (M, K), dtype=np.uint8)
    w = rng.integers(-128, 128, (K, N), dtype=np.int8)
    zx = rng.integers(1, 256, M).astype(np.int32)
    zw = rng.integers(-9, 10, N).astype(np.int32)
    bias = rng.integers(-50000, 50000, N).astype(np.int32)
    out = {"uint8 float": np.uint8, "int8 fixed": np.int8, "float32": np.float32, "int32": np.int32}[stage]
    case = Case(x, w, zx, zw, np.dtype(out), bias)
    acc = ref.accumulate(x, w, zx, zw, bias).astype(np.float64)
    m = (250.0 / max(1.0, float(np.ptp(acc))) * rng.uniform(0.5, 2.0, N)).astype(np.float32)
    if stage == "uint8 float":
        case.stage = {"multiplier": m, "zy": 131}
    elif stage == "int8 fixed":
        pairs = [requant.quantize_multiplier(float(v)) for v in m]
        case.stage = {
            "fixed_multiplier": np.array([p[0] for p in pairs], np.int32),
            "fixed_shift": np.array([p[1] for p in pairs], np.int32),
            "zy": -7,
        }
    elif stage == "float32":
        case.stage = {"multiplier": m, "float_bias": rng.uniform(-3, 3, N).astype(np.float32)}
    check_all_variants(case)


@pytest.mark.parametrize(
    ("M", "N", "K", "out"), [(49, 192, 1152, np.uint8), (17, 65, 259, np.int32), (23, 97, 4100, np.int8)]
)
def test_qgemm_two_dimensional_split(M: int, N: int, K: int, out: type) -> None:
    """Few row groups and few panel groups (a 7x7 pointwise layer: 7 row groups of 8, 3
    panel groups): threads=2 splits rows and panels at once (qgemm.cc split_2d), with a
    short last row group and panel; K = 4100 adds K chunks through the partial buffer.
    Failure signature: a (row group, panel group) block missing or written twice, or the
    bytes depend on the thread count."""
    rng = np.random.default_rng(M * 31 + N)
    x = rng.integers(0, 256, (M, K), dtype=np.uint8)
    w = rng.integers(-128, 128, (K, N), dtype=np.int8)
    zw = rng.integers(-128, 128, N).astype(np.int32)
    bias = rng.integers(-(2**16), 2**16, N).astype(np.int32)
    stage = {}
    if out != np.int32:  # per-column multipliers that differ, a zero point inside the range
        stage = {"multiplier": rng.uniform(3e-5, 9e-5, N).astype(np.float32), "zy": 5}
    check_all_variants(Case(x, w, 37, zw, np.dtype(out), bias, stage))


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 8, 12, 13, 16, 17, 20, 24, 25])
def test_qgemm_few_rows_stream_b_and_give_the_rows_of_the_large_product(rows: int) -> None:
    """Up to 24 rows (qgemm.cc kStreamRows) run as one row block, each panel's K chunks against
    every row tile before the next panel, the first tile prefetching B ahead (its 1-8-row
    intrinsics form or the 12-row asm one); more rows run row tiles outer. The int32 sums
    wrap, so the rows' bytes are those rows of the large product and the twin's, on every
    ISA and thread count. K = 2053 > KC (three K chunks through the partial buffer, K % 4
    != 0: packed x'), N = 707 (22 full panels and a short one), zw != 0 (row sums), float
    output with per-column multipliers. Failure signature: a row tile after the first
    reading a stale partial, or rows missing from the one block."""
    rng = np.random.default_rng(rows)
    M, N, K = 64, 707, 2053
    x = rng.integers(-128, 128, (M, K), dtype=np.int8)
    w = rng.integers(-128, 128, (K, N), dtype=np.int8)
    zw = rng.integers(-128, 128, N).astype(np.int32)
    bias = rng.integers(-(2**16), 2**16, N).astype(np.int32)
    stage = {"multiplier": rng.uniform(1e-6, 9e-6, N).astype(np.float32)}
    big = Case(x, w, 9, zw, np.dtype(np.float32), bias, stage)
    few = Case(x[:rows], w, 9, zw, np.dtype(np.float32), bias, stage)
    check_all_variants(few)
    for isa in ISAS:
        packed = pack(big, isa)
        large = run_native(big, packed, 1)
        for threads in THREADS:
            got = run_native(few, packed, threads)
            assert_bitexact(large[:rows], got, few, f"{isa} threads={threads} vs rows of {M}")


def test_qgemm_l2_sized_row_blocks_and_colterm_started_chunks() -> None:
    """Failure signature: rows of a later row block off by bias − zx'·cs (the column term
    the AVX-512 tiles start their first K chunk from, added twice or never), or garbage in
    the last, shorter row block. One thread: B (32 panels, 1 MiB) leaves the L2 share of a
    2 MiB L2 room for 96 rows with their int32 output (qgemm.cc l2_share_bytes), so M = 401
    runs as 4 blocks of 88 rows and one of 49; two threads: a task's 4 panels leave MC at the 256 KiB A budget,
    2 blocks of 208 and 193. K = 1030 > KC gives two K chunks; zw != 0 adds the row-sum
    term, and a per-row zx the zx'[m]·cs one."""
    rng = np.random.default_rng(17)
    M, N, K = 401, 1000, 1030
    x = rng.integers(0, 256, (M, K), dtype=np.uint8)
    w = rng.integers(-128, 128, (K, N), dtype=np.int8)
    zw = rng.integers(-128, 128, N).astype(np.int32)
    bias = rng.integers(-(2**20), 2**20, N).astype(np.int32)
    check_all_variants(Case(x, w, 131, zw, np.dtype(np.int32), bias))
    zx_rows = rng.integers(0, 256, M).astype(np.int32)
    check_all_variants(Case(x, w, zx_rows, 7, np.dtype(np.int32), bias))


@pytest.mark.parametrize("K", [259, 1030])
def test_qgemm_int32_output_without_zero_points_stored_by_the_tile(K: int) -> None:
    """An int32 output with no weight zero point, per-row zx or clamp is the 12 x 32 asm
    tile's sums themselves, which it stores straight into y (qgemm_avx512vnni.cc
    sums_are_output); every other case goes through the C++ output stage. Failure
    signature: rows of a 12-row tile shifted or swapped (the four-row store groups), the
    column term missing, or a partial last panel (N = 100: 3 full panels and 4 columns)
    written past its columns. M = 69: five 12-row tiles, then 8 + 1 rows; K = 1030 gives two K
    chunks (the first ends in the partial-sum buffer); uint8 and int8 x (the shifted zx)."""
    rng = np.random.default_rng(23)
    M, N = 69, 100
    w = rng.integers(-128, 128, (K, N), dtype=np.int8)
    bias = rng.integers(-(2**20), 2**20, N).astype(np.int32)
    for x, zx in (
        (rng.integers(0, 256, (M, K), dtype=np.uint8), 131),
        (rng.integers(-128, 128, (M, K), dtype=np.int8), -7),
    ):
        check_all_variants(Case(x, w, zx, 0, np.dtype(np.int32), bias))
        check_all_variants(Case(x, w, zx, 0, np.dtype(np.int32), None))


def test_qgemm_int32_accumulator_wraps_long_k() -> None:
    """Failure signature: results that differ between ISAs, or a UBSan 'signed integer
    overflow', once Σ(x − zx)(w − zw) leaves int32. ONNX's accumulator is int32 and
    wraps; every variant must wrap identically (K = 70001: 255·(−128)·K < −2^31)."""
    K = 70001
    x = np.full((2, K), 255, np.uint8)
    w = np.full((K, 3), -128, np.int8)
    w[:, 1] = 127
    case = Case(x, w, 0, np.array([0, 0, 5], np.int32), np.dtype(np.int32))
    acc64 = x.astype(np.int64) @ (w.astype(np.int64) - np.array([0, 0, 5]))
    assert acc64.min() < -(2**31) and acc64.max() > 2**31 - 1  # the hazard is really exercised
    check_all_variants(case)


def test_qgemm_s8_activation_shift_compensation() -> None:
    """Failure signature: every output off by 128·Σ(w − zw) (the +128 shift of int8 x for
    vpdpbusd, eq. (8), not compensated), or by 128·K·zw when it is applied to the wrong
    term. int8 x at both extremes, uint8 weights (their own −128 shift), per-column zw."""
    rng = np.random.default_rng(3)
    x = np.array([[-128, 127, -1, 0, 1] * 13], np.int8).repeat(9, axis=0)
    w = rng.integers(0, 256, (65, 17), dtype=np.uint8)
    zw = rng.integers(0, 256, 17).astype(np.int32)
    for zx in (-128, -1, 127):
        check_all_variants(Case(x, w, zx, zw, np.dtype(np.int32)))


@pytest.mark.parametrize("out_dtype", [np.uint8, np.int8])
def test_qgemm_requant_ties_round_half_to_even(out_dtype: type) -> None:
    """Golden vectors on ties (TVM habit): acc·0.5 = ±2.5, ±3.5 -> ±2, ±4 (half to even),
    never ±3 / ±4 (half away from zero) or ±3 / ±3 (half up)."""
    x = np.array([[5], [7], [-5], [-7], [1], [-1]], np.int8)
    w = np.array([[1]], np.int8)
    zy = 10
    case = Case(x, w, 0, 0, np.dtype(out_dtype), stage={"multiplier": np.float32(0.5), "zy": zy})
    expected = np.array([[2], [4], [-2], [-4], [0], [0]]) + zy
    np.testing.assert_array_equal(run_twin(case), expected.astype(out_dtype))
    check_all_variants(case)


@pytest.mark.parametrize("out_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("mode", ["float", "fixed"])
def test_qgemm_saturates_at_both_ends(out_dtype: type, mode: str) -> None:
    """A multiplier 100x too large drives outputs to qmin and qmax; both must appear."""
    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, (17, 65), dtype=np.uint8)
    w = rng.integers(-128, 128, (65, 33), dtype=np.int8)
    m = np.float32(0.5)
    stage: dict = {"zy": 3}
    if mode == "float":
        stage["multiplier"] = m
    else:
        stage["fixed_multiplier"], stage["fixed_shift"] = requant.quantize_multiplier(float(m))
    case = Case(x, w, 129, -7, np.dtype(out_dtype), stage=stage)
    y = run_twin(case)
    qlo, qhi = _range(out_dtype)
    assert (y == qlo).any() and (y == qhi).any()
    check_all_variants(case)


def test_qgemm_fused_clamp_relu6() -> None:
    """clamp = (zy, zy + round(6/sy)) as a fused Relu6, per-channel multipliers."""
    rng = np.random.default_rng(9)
    x = rng.integers(0, 256, (33, 17), dtype=np.uint8)
    w = rng.integers(-128, 128, (17, 7), dtype=np.int8)
    m = np.array([1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3, 7e-3], np.float32)
    case = Case(x, w, 100, 2, np.dtype(np.uint8), stage={"multiplier": m, "zy": 20, "clamp": (20, 80)})
    y = run_twin(case)
    assert y.min() == 20 and y.max() == 80
    check_all_variants(case)


@pytest.mark.parametrize("out_dtype", [np.uint8, np.int8])
def test_qgemm_requant_beyond_int32_and_fused_lower_clamp(out_dtype: type) -> None:
    """Failure signature: 0 / qmin (or a wrapped byte) where qmax is due, or values below a
    fused Relu's lo, in rows of an odd tile (M = 17: 8 + 8 + 1) or a 1-column panel.

    The AVX-512 output stage packs two rows with saturating int32 -> int16 -> int8 packs
    and clamps only the top in float32: fl(acc·m) >= 2^31 (m = 1e30) or = +inf (m = 1e38)
    must still give H, and -inf / < -2^31 (rne gives INT32_MIN) must give L, as the
    contract's float32 clamp does; the fused lower clamp (lo > qmin) is a byte max.
    """
    rng = np.random.default_rng(12)
    x = rng.integers(0, 256, (17, 65), dtype=np.uint8)
    w = rng.integers(-128, 128, (65, 33), dtype=np.int8)
    m = np.array([1e-3, 1e30, 1e38, 1e-30, 2e-3] * 6 + [3e-3, 1e38, 5e-4], np.float32)
    lo, hi = _range(out_dtype)
    zy = 5 if out_dtype == np.uint8 else -3
    for clamp in (None, (zy, hi - 7)):
        stage: dict = {"multiplier": m, "zy": zy}
        if clamp is not None:
            stage["clamp"] = clamp
        case = Case(x, w, 129, -7, np.dtype(out_dtype), stage=stage)
        with np.errstate(over="ignore"):  # fl(acc·1e38) = ±inf on purpose
            y = run_twin(case)
            L, H = clamp if clamp is not None else (lo, hi)
            assert (y == L).any() and (y == H).any()
            check_all_variants(case)


def test_qgemm_float_output_is_not_fused_multiply_add() -> None:
    """Failure signature: float32 outputs that differ from NumPy in the last bit where
    float32(acc)·m + float_bias was contracted into one FMA (one rounding instead of two;
    the SIMD files are built with -mfma)."""
    rng = np.random.default_rng(13)
    x = rng.integers(0, 256, (31, 65), dtype=np.uint8)
    w = rng.integers(-128, 128, (65, 47), dtype=np.int8)
    m = rng.uniform(1e-4, 1e-2, 47).astype(np.float32)
    fb = rng.uniform(-10, 10, 47).astype(np.float32)
    case = Case(x, w, 7, 1, np.dtype(np.float32), stage={"multiplier": m, "float_bias": fb})
    acc = ref.accumulate(x, w, 7, 1).astype(np.float64)
    fma = (acc * m.astype(np.float64) + fb.astype(np.float64)).astype(np.float32)
    assert (fma != run_twin(case)).any()  # the data really tells FMA from mul + add
    check_all_variants(case)


@pytest.mark.parametrize(("M", "N", "K"), [(0, 5, 7), (3, 0, 7), (3, 5, 0), (0, 0, 0)])
def test_qgemm_zero_dims(M: int, N: int, K: int) -> None:
    """Empty M or N writes nothing; K = 0 gives acc = bias."""
    x = np.zeros((M, K), np.uint8)
    w = np.zeros((K, N), np.int8)
    bias = np.arange(N, dtype=np.int32) - 2
    for out_dtype, stage in ((np.int32, {}), (np.uint8, {"multiplier": np.float32(0.5), "zy": 4})):
        check_all_variants(Case(x, w, 3, 1, np.dtype(out_dtype), bias, stage))


@pytest.mark.parametrize("out_dtype", [np.uint8, np.int8, np.float32, np.int32])
@pytest.mark.parametrize(("M", "N", "K"), [(17, 33, 259), (64, 65, 7), (9, 1, 300), (37, 16, 259)])
def test_qgemm_transposed_output_stage_row_bias_and_row_multiplier(
    out_dtype: type, M: int, N: int, K: int
) -> None:
    """The per-row output stage (a 1x1 NCHW convolution computed as w·x): row_bias[m] and
    row_multiplier[m] that differ per row, on every ISA and thread count."""
    rng = np.random.default_rng(M * 1000 + N)
    x = rng.integers(-128, 128, (M, K), dtype=np.int8)
    w = rng.integers(0, 256, (K, N), dtype=np.uint8)
    zx, zw = -7, 131
    row_bias = rng.integers(-50000, 50000, M).astype(np.int32)
    bias = rng.integers(-900, 900, N).astype(np.int32)
    stage: dict = {"row_bias": row_bias}
    if out_dtype != np.int32:  # per row: 200 / max |acc| times 0.5 .. 2, so both ends saturate
        acc = ref.accumulate(x, w, zx, zw, bias).astype(np.int64) + row_bias[:, None]
        peak = np.maximum(np.abs(acc).max(axis=1), 1).astype(np.float64)
        stage["row_multiplier"] = (200.0 / peak * rng.uniform(0.5, 2.0, M)).astype(np.float32)
    if out_dtype in (np.uint8, np.int8):
        stage["zy"] = 5
    if out_dtype == np.float32:
        stage["float_bias"] = rng.uniform(-3, 3, N).astype(np.float32)
    case = Case(x, w, zx, zw, np.dtype(out_dtype), bias, stage)
    expected = run_twin(case)
    if out_dtype in (np.uint8, np.int8):  # both saturation ends occur
        info = np.iinfo(out_dtype)
        assert (expected == info.min).any() or (expected == info.max).any(), (
            "no saturation: widen the multipliers"
        )
    check_all_variants(case)


def test_qgemm_row_multiplier_refuses_a_second_multiplier_and_a_bad_shape() -> None:
    packed = _native.pack_weights_s8(np.ones((4, 3), np.int8), 0)
    x = np.ones((2, 4), np.uint8)
    with pytest.raises(ValueError, match="row_multiplier: expected None for multiplier"):
        _native.qgemm(x, packed, 0, "uint8", multiplier=0.5, row_multiplier=np.ones(2, np.float32))
    with pytest.raises(ValueError, match=re.escape("row_multiplier: expected shape (2,)")):
        _native.qgemm(x, packed, 0, "uint8", row_multiplier=np.ones(3, np.float32))
    with pytest.raises(ValueError, match=re.escape("row_bias: expected shape (2,)")):
        _native.qgemm(x, packed, 0, "int32", row_bias=np.ones(3, np.int32))
    with pytest.raises(ValueError, match=r"row_multiplier\[1\]: expected a finite value > 0"):
        _native.qgemm(x, packed, 0, "float32", row_multiplier=np.array([1.0, np.nan], np.float32))


def test_qgemm_per_row_zero_points_batched() -> None:
    """MatMulInteger's per-row a_zero_point on x [2, 3, K]: zx of shape (2, 3), int8 x (the
    +128 shift applies per row), per-column zw; zx must not leak into a column constant."""
    rng = np.random.default_rng(29)
    x = rng.integers(-128, 128, (2, 3, 259), dtype=np.int8)
    w = rng.integers(-128, 128, (259, 17), dtype=np.int8)
    zx = np.array([[-128, -1, 5], [127, 0, -77]], np.int32)
    zw = rng.integers(-128, 128, 17).astype(np.int32)
    check_all_variants(Case(x, w, zx, zw, np.dtype(np.int32), rng.integers(-99, 99, 17).astype(np.int32)))
    check_all_variants(
        Case(x, w, zx.reshape(-1), zw, np.dtype(np.uint8), stage={"multiplier": np.float32(1e-3), "zy": 9})
    )


def test_qgemm_more_threads_than_work() -> None:
    x = np.array([[200]], np.uint8)
    w = np.array([[-3]], np.int8)
    for isa in ISAS:
        y = _native.qgemm(x, _native.pack_weights_s8(w, 1, isa=isa), 7, "int32", num_threads=8)
        np.testing.assert_array_equal(y, [[(200 - 7) * (-3 - 1)]])


def test_qgemm_batched_x_out_and_workspace_reuse() -> None:
    """x [2, 3, K] -> [2, 3, N]; `out=` is written in place; one workspace serves calls of
    different sizes (grown once, then reused)."""
    rng = np.random.default_rng(17)
    w = rng.integers(-128, 128, (21, 9), dtype=np.int8)
    ws = _native.QGemmWorkspace()
    for isa in ISAS:
        packed = _native.pack_weights_s8(w, 5, isa=isa)
        for shape in ((2, 3, 21), (70, 21), (21,)):
            x = rng.integers(0, 256, shape, dtype=np.uint8)
            out = np.empty((*shape[:-1], 9), np.int8)
            y = _native.qgemm(x, packed, 9, "int8", multiplier=0.01, zy=-5, workspace=ws, out=out)
            assert y is out
            np.testing.assert_array_equal(
                out, ref.qgemm(x, w, 9, 5, np.int8, multiplier=np.float32(0.01), zy=-5)
            )
    assert ws.nbytes > 0


def test_pack_weights_exposes_column_sums_and_zero_points() -> None:
    rng = np.random.default_rng(19)
    w = rng.integers(0, 256, (259, 17), dtype=np.uint8)
    zw = rng.integers(0, 256, 17).astype(np.int32)
    for isa in ISAS:
        packed = _native.pack_weights_u8(w, zw, isa=isa)
        assert (packed.K, packed.N, packed.isa, packed.weights_dtype) == (259, 17, isa, "uint8")
        np.testing.assert_array_equal(packed.column_sums, (w.astype(np.int64) - zw).sum(axis=0))
        np.testing.assert_array_equal(packed.zero_point, zw)
        assert re.fullmatch(rf"qgemm_u8s8_s32_\d+x\d+c\d__{isa}", packed.kernel), packed.kernel


def test_kernel_names_follow_the_grammar() -> None:
    """docs/kernels.md: <op>_<xdtype><wdtype>_<acc>_<MR>x<NR>c<KR>__<isa>."""
    for isa in ISAS:
        assert re.fullmatch(rf"qgemm_u8s8_s32_\d+x\d+c\d__{isa}", _native.qgemm_kernel_name(isa))


@pytest.mark.skipif("avx512vnni" not in ISAS, reason="this CPU does not run avx512vnni")
def test_vnni_peak_probe_reports_positive_throughput() -> None:
    assert _native.vnni_peak_probe(0.01) > 1.0


# --------------------------------------------------------------------------------------
# The binding boundary: exact messages
# --------------------------------------------------------------------------------------

_W = np.arange(-6, 6, dtype=np.int8).reshape(4, 3)
_X = np.arange(8, dtype=np.uint8).reshape(2, 4)


def _packed():
    return _native.pack_weights_s8(_W, 0, isa="portable")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: _native.pack_weights_s8(_W.astype(np.uint8)),
            "pack_weights_s8: w: expected dtype int8, got uint8",
        ),
        (
            lambda: _native.pack_weights_s8(_W[0]),
            "pack_weights_s8: w: expected a 2-D array [K, N], got shape (3,)",
        ),
        (lambda: _native.pack_weights_s8(_W.T), "pack_weights_s8: w: expected a C-contiguous array"),
        (
            lambda: _native.pack_weights_s8(_W, 128),
            "pack_weights_s8: zero_point: expected a value in [-128, 127], got 128",
        ),
        (
            lambda: _native.pack_weights_u8(_W.astype(np.uint8), np.array([1, 2], np.int32)),
            "pack_weights_u8: zero_point: expected a scalar or shape (3,), got shape (2,)",
        ),
        (
            lambda: _native.pack_weights_s8(_W, isa="sse9"),
            "isa: expected one of portable, avx2, avx512vnni, got 'sse9'",
        ),
        (
            lambda: _native.qgemm(_X[:, :3].copy(), _packed(), 0),
            "qgemm: x: expected last dimension K = 4 (the packed weights' K), got shape (2, 3)",
        ),
        (
            lambda: _native.qgemm(_X.astype(np.int16), _packed(), 0),
            "qgemm: x: expected dtype uint8 or int8, got int16",
        ),
        (lambda: _native.qgemm(_X.T.copy().T, _packed(), 0), "qgemm: x: expected a C-contiguous array"),
        (
            lambda: _native.qgemm(_X, _packed(), 256),
            "qgemm: zx (x is uint8): expected a value in [0, 255], got 256",
        ),
        (
            lambda: _native.qgemm(_X.astype(np.int8), _packed(), 128),
            "qgemm: zx (x is int8): expected a value in [-128, 127], got 128",
        ),
        (
            lambda: _native.qgemm(_X, _packed(), np.array([1, 2, 3], np.int32)),
            "qgemm: zx: expected an integer or one zero point per row, shape (2,), got shape (3,)",
        ),
        (
            lambda: _native.qgemm(_X, _packed(), np.array([1, 256], np.int32)),
            "qgemm: zx (x is uint8)[1]: expected a value in [0, 255], got 256",
        ),
        (
            lambda: _native.qgemm(_X, _packed(), 0, "float64"),
            "qgemm: out_dtype: expected one of uint8, int8, int32, float32, got float64",
        ),
        (
            lambda: _native.qgemm(_X, _packed(), 0, "int32", bias=np.zeros(4, np.int32)),
            "qgemm: bias: expected shape (3,), got shape (4,)",
        ),
        (
            lambda: _native.qgemm(_X, _packed(), 0, "int32", bias=np.zeros(3, np.int64)),
            "qgemm: bias: expected dtype int32, got int64",
        ),
        (
            lambda: _native.qgemm(_X, _packed(), 0, "uint8"),
            "qgemm: expected exactly one of multiplier (float requantization) or fixed_multiplier + "
            "fixed_shift (fixed-point) for out_dtype uint8",
        ),
        (
            lambda: _native.qgemm(_X, _packed(), 0, "int32", multiplier=0.5),
            "qgemm: multiplier: expected None for out_dtype int32 (the raw accumulator)",
        ),
        (
            lambda: _native.qgemm(_X, _packed(), 0, "float32"),
            "qgemm: multiplier: expected sx*sw (scalar or [N]) for out_dtype float32, got None",
        ),
        (
            lambda: _native.qgemm(_X, _packed(), 0, "uint8", multiplier=float("inf")),
            "qgemm: multiplier[0]: expected a finite value > 0, got inf",
        ),
        (
            lambda: _native.qgemm(_X, _packed(), 0, "uint8", multiplier=np.ones(2, np.float32)),
            "qgemm: multiplier: expected a scalar or shape (3,), got shape (2,)",
        ),
        (
            lambda: _native.qgemm(_X, _packed(), 0, "int8", fixed_multiplier=1 << 30),
            "qgemm: fixed_multiplier and fixed_shift: expected both, got only one",
        ),
        (
            lambda: _native.qgemm(_X, _packed(), 0, "int8", fixed_multiplier=1 << 31, fixed_shift=0),
            "qgemm: fixed_multiplier: expected an int32 number or numpy array, got 2147483648",
        ),
        (
            lambda: _native.qgemm(_X, _packed(), 0, "int8", fixed_multiplier=1 << 30, fixed_shift=31),
            "qgemm: fixed_shift[0]: expected a value in [-31, 30], got 31",
        ),
        (
            lambda: _native.qgemm(_X, _packed(), 0, "int8", multiplier=0.5, zy=200),
            "qgemm: zy (out_dtype int8): expected a value in [-128, 127], got 200",
        ),
        (
            lambda: _native.qgemm(_X, _packed(), 0, "int32", zy=1),
            "qgemm: zy: expected 0 for out_dtype int32 (uint8/int8 outputs only), got 1",
        ),
        (
            lambda: _native.qgemm(_X, _packed(), 0, "uint8", multiplier=0.5, clamp=(9, 3)),
            "qgemm: clamp: expected lo <= hi, got (9, 3)",
        ),
        (
            lambda: _native.qgemm(_X, _packed(), 0, "uint8", multiplier=0.5, clamp=(0, 300)),
            "qgemm: clamp[1] (out_dtype uint8): expected a value in [0, 255], got 300",
        ),
        (
            lambda: _native.qgemm(_X, _packed(), 0, "int32", float_bias=np.zeros(3, np.float32)),
            "qgemm: float_bias: expected None for out_dtype int32 (float32 output only)",
        ),
        (lambda: _native.qgemm(_X, _packed(), 0, num_threads=0), "qgemm: num_threads: expected >= 1, got 0"),
        (
            lambda: _native.qgemm(_X, _packed(), 0, out=np.empty((2, 4), np.int32)),
            "qgemm: out: expected shape (2, 3), got shape (2, 4)",
        ),
        (
            lambda: _native.qgemm(_X, _packed(), 0, out=np.empty((2, 3), np.int64)),
            "qgemm: out: expected dtype int32, got int64",
        ),
    ],
)
def test_qgemm_boundary_errors(call, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call()


def test_qgemm_out_overlapping_x_is_refused() -> None:
    """Failure signature: garbage outputs when `out` aliases x (the direct path reads x
    while the epilogue writes)."""
    buf = np.zeros(64, np.uint8)
    x = buf[:12].reshape(3, 4)
    out = buf[4:13].reshape(3, 3)
    w = np.ones((4, 3), np.int8)
    with pytest.raises(ValueError, match=r"^qgemm: out: expected a buffer that does not overlap x$"):
        _native.qgemm(x, _native.pack_weights_s8(w), 0, "uint8", multiplier=0.5, out=out)


# --------------------------------------------------------------------------------------
# Threads: concurrency and fork
# --------------------------------------------------------------------------------------


def _threaded_case() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(23)
    x = rng.integers(0, 256, (65, 259), dtype=np.uint8)
    w = rng.integers(-128, 128, (259, 129), dtype=np.int8)
    return x, w, ref.qgemm(x, w, 77, -9, np.int8, multiplier=np.float32(3e-4), zy=-3)


def test_qgemm_concurrent_callers_share_the_pool() -> None:
    """Failure signature: a deadlock or mixed-up chunks when several Python threads run
    multi-threaded GEMMs at once (the GIL is released; the pool takes one job at a time
    and a concurrent caller runs its chunks on its own thread)."""
    from concurrent.futures import ThreadPoolExecutor

    x, w, expected = _threaded_case()
    packed = _native.pack_weights_s8(w, -9)

    def call(_: int) -> bytes:
        ws = _native.QGemmWorkspace()
        y = _native.qgemm(x, packed, 77, "int8", multiplier=3e-4, zy=-3, num_threads=2, workspace=ws)
        return y.tobytes()

    with ThreadPoolExecutor(max_workers=4) as ex:
        results = list(ex.map(call, range(16)))
    assert all(r == expected.tobytes() for r in results)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_qgemm_threads_after_fork() -> None:
    """Failure signature: the child process hangs forever in qgemm(num_threads=2) because
    the pool's worker threads were not copied by fork() (the child must start a new pool)."""
    import os
    import time

    x, w, expected = _threaded_case()
    packed = _native.pack_weights_s8(w, -9)
    _native.qgemm(x, packed, 77, "int8", multiplier=3e-4, zy=-3, num_threads=2)  # parent pool exists
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 1
        try:
            y = _native.qgemm(x, packed, 77, "int8", multiplier=3e-4, zy=-3, num_threads=2)
            code = 0 if y.tobytes() == expected.tobytes() else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("child process hung in qgemm after fork")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0
