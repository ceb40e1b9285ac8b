"""Differential tests of ``_native.qgemm_batched`` (quanta/kernels/cpp/gemm): a batch of
GEMMs whose weights are run-time activations, over strided views.

Every batch matrix is compared bit-exactly with ``reference.qgemm.qgemm`` on the
contiguous copy, on every ISA the CPU runs, threads 1 and 2 (identical bytes). Tolerance:
0 — the strided packer produces the layout and column sums of ``pack_weights`` (eq. (5)),
and the GEMM is qgemm itself.

Views: w transposed (k contiguous, as Kᵀ in attention scores), row-major (as V in the
context product), flipped (negative strides), every other column (n stride 2), a batch
broadcast with stride 0; x rows with a stride > K (a transposed Q).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from quanta.kernels import _native
from quanta.kernels.reference import qgemm as ref

ISAS: list[str] = list(_native.supported_isas())
U8, I8 = np.dtype(np.uint8), np.dtype(np.int8)


def q8(rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(int(info.min), int(info.max) + 1, shape).astype(dtype)


def w_view(rng: np.random.Generator, dtype: np.dtype, B: int, K: int, N: int, layout: str) -> np.ndarray:
    if layout == "row_major":
        return q8(rng, dtype, (B, K, N))
    if layout == "k_contiguous":
        return np.swapaxes(q8(rng, dtype, (B, N, K)), 1, 2)
    if layout == "flipped":
        return q8(rng, dtype, (B, K, N))[:, ::-1, ::-1]
    if layout == "every_other_column":
        return q8(rng, dtype, (B, K, 2 * N))[:, :, ::2]
    assert layout == "broadcast_batch"
    return np.broadcast_to(q8(rng, dtype, (1, K, N)), (B, K, N))


@st.composite
def batched_cases(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    B = draw(st.sampled_from([1, 2, 3, 6]))
    # Tile edges: MR 4/8, NR 16/32, KR 2/4; K = 1 and K > 258.
    M = draw(st.sampled_from([1, 3, 8, 17, 65]))
    K = draw(st.sampled_from([1, 3, 4, 64, 259]))
    N = draw(st.sampled_from([1, 7, 16, 17, 33, 64]))
    x_dt, w_dt = draw(st.sampled_from([U8, I8])), draw(st.sampled_from([U8, I8]))
    x = q8(rng, x_dt, (B, M, K))
    if draw(st.booleans()):  # rows with a stride > K, as a transposed Q [S, heads, dh]
        x = np.swapaxes(q8(rng, x_dt, (M, B, K)), 0, 1)
    layout = draw(
        st.sampled_from(["row_major", "k_contiguous", "flipped", "every_other_column", "broadcast_batch"])
    )
    w = w_view(rng, w_dt, B, K, N, layout)
    info = np.iinfo(x_dt)
    zx = int(rng.integers(int(info.min) + 1, int(info.max)))
    winfo = np.iinfo(w_dt)
    zw = (
        rng.integers(int(winfo.min), int(winfo.max) + 1, N).astype(np.int32)
        if draw(st.booleans())
        else int(rng.integers(int(winfo.min), int(winfo.max) + 1))
    )
    out_dtype = draw(st.sampled_from(["uint8", "int8", "int32", "float32"]))
    stage: dict = {}
    if out_dtype != "int32":
        # multipliers per column that differ, sized so outputs cover the 8-bit range
        stage["multiplier"] = (rng.uniform(0.5, 2.0, N) / (60.0 * max(K, 1) ** 0.5)).astype(np.float32)
    if out_dtype in ("uint8", "int8"):
        stage["zy"] = int(rng.integers(-100, 100)) + (128 if out_dtype == "uint8" else 0)
    bias = rng.integers(-5000, 5000, N).astype(np.int32) if draw(st.booleans()) else None
    return x, w, zx, zw, out_dtype, bias, stage


def expected_of(x, w, zx, zw, out_dtype, bias, stage) -> np.ndarray:
    return np.stack(
        [
            ref.qgemm(
                np.ascontiguousarray(x[i]), np.ascontiguousarray(w[i]), zx, zw, out_dtype, bias=bias, **stage
            )
            for i in range(x.shape[0])
        ]
    )


@given(case=batched_cases())
def test_qgemm_batched_strided_views_match_reference_every_isa_and_thread_count(case) -> None:
    x, w, zx, zw, out_dtype, bias, stage = case
    expected = expected_of(*case)
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            for threads in (1, 2):
                got = _native.qgemm_batched(x, w, zx, zw, out_dtype, bias=bias, num_threads=threads, **stage)
                assert got.dtype == expected.dtype and got.shape == expected.shape
                if got.tobytes() != expected.tobytes():
                    bad = np.argwhere(got != expected)[0]
                    raise AssertionError(
                        f"isa={isa} threads={threads} B×M×N×K={x.shape[0]}x{x.shape[1]}x{w.shape[2]}x{x.shape[2]} "
                        f"x {x.dtype} zx={zx}, w {w.dtype} strides {w.strides}, out {out_dtype}: first bad "
                        f"{tuple(bad)} expected {expected[tuple(bad)]!r} got {got[tuple(bad)]!r}"
                    )
    finally:
        _native.clear_isa()


def test_qgemm_batched_scratch_reused_across_shapes_writes_every_padding_byte() -> None:
    """Hazard: a reused (grown, never cleared) packed buffer leaking stale weights into
    the zero padding of a later, smaller matrix (K and N not multiples of KR / NR)."""
    rng = np.random.default_rng(4)
    scratch = _native.BatchedQGemmScratch()
    for B, M, K, N in ((2, 9, 259, 65), (3, 5, 7, 17), (1, 17, 1, 1), (2, 9, 259, 65)):
        x = q8(rng, U8, (B, M, K))
        w = q8(rng, I8, (B, K, N))
        got = _native.qgemm_batched(x, w, 7, 3, "int32", scratch=scratch)
        np.testing.assert_array_equal(got, expected_of(x, w, 7, 3, "int32", None, {}))


def test_qgemm_batched_out_buffer_and_errors() -> None:
    rng = np.random.default_rng(5)
    x = q8(rng, U8, (2, 3, 5))
    w = q8(rng, I8, (2, 5, 4))
    out = np.empty((2, 3, 4), np.int32)
    assert _native.qgemm_batched(x, w, 1, 2, "int32", out=out) is out
    np.testing.assert_array_equal(out, expected_of(x, w, 1, 2, "int32", None, {}))
    with pytest.raises(
        ValueError,
        match=r"qgemm_batched: w: expected shape \(2, 5, N\) for x of shape \(2, 3, 5\), got shape \(2, 4, 4\)",
    ):
        _native.qgemm_batched(x, w[:, :4], 1, 2)
    with pytest.raises(
        ValueError, match=r"qgemm_batched: x: expected unit stride along K, got strides \(15, 1, 3\)"
    ):
        _native.qgemm_batched(np.swapaxes(q8(rng, U8, (2, 5, 3)), 1, 2), w, 1, 2)
    with pytest.raises(
        ValueError, match=r"qgemm_batched: zx \(x is uint8\): expected a value in \[0, 255\], got 300"
    ):
        _native.qgemm_batched(x, w, 300, 2)
    with pytest.raises(
        ValueError,
        match=r"qgemm_batched: multiplier: expected a scalar or \[N\] float32 for out_dtype uint8, got None",
    ):
        _native.qgemm_batched(x, w, 1, 2, "uint8")
    with pytest.raises(
        ValueError, match=r"qgemm_batched: out: expected a buffer that does not overlap x or w"
    ):
        buf = np.zeros(64, np.uint8)
        xs = buf[:30].reshape(2, 3, 5)
        _native.qgemm_batched(
            xs, w, 1, 2, "uint8", multiplier=np.float32(0.01), out=buf[8:32].reshape(2, 3, 4)
        )
