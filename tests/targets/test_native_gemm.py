"""Native integer GEMMs (quanta/targets/native/gemm.py) against their reference twins.

QLinearMatMul, MatMulInteger, com.microsoft QGemm, MatMulIntegerToFloat and
DynamicQuantizeMatMul: every native kernel is compared with the NumPy twin registered for
the op, bit-exact (``assert_array_equal``). Tolerance everywhere: 0 — the accumulator is
exact int32 arithmetic (wrapping) in both, and the multiplier and output stage are the
same float32 operations in the same order (requant.py, ms_qgemm.py).

Each example runs on every ISA the CPU supports (packing happens at bind time with the
active ISA, so the ISA is set before binding) and with 1 and 2 threads, which must give
identical bytes. Defaults are not coincidental (docs/style.md §6): zero points drawn per
operand and non-zero, per-column scales that differ, output scales derived from the
accumulator range, odd shapes (M = 1, K = 259, N = 7 / 17), uint8 and int8 on both sides.

Unit tests bind the node directly (``native_kernel_for`` on a one-node IR graph: a
session costs ~20 ms to compile); session tests run whole models (single nodes, the QDQ
encoder block, the demo CNN's QGemm head) through ``InferenceSession`` on both backends.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.graph import Graph, Model, Node, Value
from quanta.ir.types import TensorType, elem_from_numpy
from quanta.kernels import _native
from quanta.kernels.reference.integer_ops import matmul_integer
from quanta.kernels.reference.registry import MS_DOMAIN, get_op
from quanta.targets.base import KernelContext, Specialization
from quanta.targets.native import gemm, native_kernel_for
from tests.ir import models

ISAS: list[str] = list(_native.supported_isas())
THREADS = (1, 2)
F32 = np.float32
U8, I8 = np.dtype(np.uint8), np.dtype(np.int8)
ASSETS = Path(quanta.__file__).parent / "cli" / "assets"

# Shapes with reasons: M = 1 (GEMV), 5 and 17 (not multiples of MR = 4/8); K = 1
# (shallow), 7 (not a multiple of KR = 2/4), 64, 259 (past the float32-exact K <= 258);
# N = 1, 7, 17, 33 (odd, around NR = 16/32).
M_VALUES = (1, 5, 17)
K_VALUES = (1, 7, 64, 259)
N_VALUES = (1, 7, 17, 33)


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------


class Operand:
    """One input of a node: its array and whether the node sees it as a constant."""

    def __init__(self, array: np.ndarray | None, const: bool = True):
        self.array = array
        self.const = const


def bind(op: str, domain: str, operands: list[Operand], attrs: dict | None = None):
    """Bind a one-node IR graph with the native target's binder: (kernel, reason)."""
    g = Graph()
    values: list[Value | None] = []
    for i, o in enumerate(operands):
        if o.array is None:
            values.append(None)
        elif o.const:
            values.append(g.add_initializer(f"in{i}", o.array))
        else:
            values.append(
                g.add_input(f"in{i}", TensorType(elem_from_numpy(o.array.dtype), tuple(o.array.shape)))
            )
    node = Node(op, values, [Value("y")], attrs or {}, name="node", domain=domain)
    g.add_node(node)
    model = Model(g, opset_imports={"": 21, MS_DOMAIN: 1})
    return native_kernel_for(model, node)


def ctx_for(op: str, domain: str, threads: int) -> KernelContext:
    return KernelContext(
        opset=1 if domain else 21, op_type=op, domain=domain, node_name="node", num_threads=threads
    )


def reference(op: str, domain: str, operands: list[Operand], attrs: dict | None = None) -> np.ndarray:
    return get_op(op, domain)(ctx_for(op, domain, 1), *(o.array for o in operands), **(attrs or {}))


class RuntimeFallbacks:
    """Counts the calls a native kernel hands to its reference twin at run time (a test
    where the fast path silently fell back would compare the reference with itself)."""

    def __init__(self) -> None:
        self.count = 0
        self._original = gemm.run_twin

    def __enter__(self) -> RuntimeFallbacks:
        def counting(*args, **kwargs):
            self.count += 1
            return self._original(*args, **kwargs)

        gemm.run_twin = counting
        return self

    def __exit__(self, *exc) -> None:
        gemm.run_twin = self._original


def check_native(
    op: str,
    domain: str,
    operands: list[Operand],
    attrs: dict | None = None,
    *,
    runtime_fallback: bool = False,
) -> np.ndarray:
    """Native == reference on every ISA, threads 1 and 2, with and without ``out=``;
    the native fast path must have run (``runtime_fallback``: the twin must have run)."""
    attrs = attrs or {}
    expected = reference(op, domain, operands, attrs)
    with RuntimeFallbacks() as fallbacks:
        _check_every_variant(op, domain, operands, attrs, expected)
    assert (fallbacks.count > 0) == runtime_fallback, (
        f"{op}: {fallbacks.count} run-time fallbacks to the twin"
    )
    return expected


def _check_every_variant(
    op: str, domain: str, operands: list[Operand], attrs: dict, expected: np.ndarray
) -> None:
    inputs = [o.array for o in operands]
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            kernel, reason = bind(op, domain, operands, attrs)
            assert kernel is not None, f"{op} refused on {isa}: {reason}"
            assert kernel.impl == "native" and kernel.name.startswith("native:"), kernel.name
            for threads in THREADS:
                ctx = ctx_for(op, domain, threads)
                got = kernel.fn(ctx, *inputs, **attrs, **kernel.params)
                assert_same(expected, got, f"{op} {kernel.name} isa={isa} threads={threads}")
                if kernel.out:
                    buf = np.full(expected.shape, 0x5A, expected.dtype)
                    got = kernel.fn(ctx, *inputs, **attrs, **kernel.params, out=buf)
                    assert got is buf
                    assert_same(expected, buf, f"{op} {kernel.name} out= isa={isa} threads={threads}")
                _check_specialized(kernel, operands, attrs, expected, ctx, threads, f"isa={isa}")
    finally:
        _native.clear_isa()


def _check_specialized(kernel, operands, attrs, expected, ctx, threads: int, where: str) -> None:
    """The kernel's specialized call for the operands' signature (if it offers one), with
    and without a planned output, gives ``expected``'s bytes."""
    if kernel.specialize is None:
        return
    inputs = [o.array for o in operands]
    for out in (None, np.full(expected.shape, 0x5A, expected.dtype)) if kernel.out else (None,):
        sig = Specialization(
            shapes=tuple(None if a is None else tuple(np.shape(a)) for a in inputs),
            dtypes=tuple(None if a is None else np.asarray(a).dtype for a in inputs),
            consts=tuple(a if o.const else None for o, a in zip(operands, inputs)),
            out_shape=tuple(expected.shape),
            out_dtype=expected.dtype,
            out=out,
            num_threads=threads,
            ctx=ctx,
        )
        fn = kernel.specialize(sig, **attrs, **kernel.params)
        if fn is None:
            continue
        got = fn(ctx, *inputs)
        assert_same(
            expected, got, f"{kernel.name} specialized out={out is not None} {where} threads={threads}"
        )


def assert_same(expected: np.ndarray, got: np.ndarray, label: str) -> None:
    assert got.dtype == expected.dtype, f"{label}: dtype {got.dtype}, expected {expected.dtype}"
    assert got.shape == expected.shape, f"{label}: shape {got.shape}, expected {expected.shape}"
    if expected.tobytes() == got.tobytes():
        return
    bad = np.argwhere(expected != got)
    i = tuple(int(v) for v in bad[0])
    raise AssertionError(
        f"{label}: {len(bad)} of {expected.size} differ, shape {expected.shape}; first at {i}: "
        f"expected {expected[i]!r}, got {got[i]!r}"
    )


def q8(rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(int(info.min), int(info.max) + 1, shape).astype(dtype)


def nonzero_zero_point(rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...] = ()) -> np.ndarray:
    """Zero points away from 0 (and from the int8/uint8 midpoints' trivial cases)."""
    lo, hi = (-100, 100) if dtype == I8 else (20, 235)
    z = rng.integers(lo, hi, shape)
    z[z == 0] = 3
    return np.asarray(z, dtype)


def output_params(real: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(sy, zy) from the real output range, so the outputs cover the storage range
    (XNNPACK habit) instead of saturating or collapsing to zy."""
    info = np.iinfo(dtype)
    lo, hi = min(float(real.min()), 0.0), max(float(real.max()), 0.0)
    sy = F32(max(hi - lo, 1e-3) / (int(info.max) - int(info.min)))
    zy = int(np.clip(round(int(info.min) - lo / float(sy)), info.min, info.max))
    return np.asarray(sy, F32), np.asarray(zy, dtype)


# --------------------------------------------------------------------------------------
# QLinearMatMul
# --------------------------------------------------------------------------------------


@st.composite
def qlinear_matmul_cases(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    M, K, N = (
        draw(st.sampled_from(M_VALUES)),
        draw(st.sampled_from(K_VALUES)),
        draw(st.sampled_from(N_VALUES)),
    )
    a_dt, b_dt, y_dt = (draw(st.sampled_from([U8, I8])) for _ in range(3))
    # const2d: prepacked at bind time; runtime*: packed per call (attention-style).
    b_kind = draw(
        st.sampled_from(
            ["const2d", "runtime2d", "runtime_batched", "runtime_transposed", "runtime_broadcast"]
        )
    )
    a_batch = draw(st.sampled_from([(), (3,), (2, 3)]))
    if b_kind in ("const2d", "runtime2d"):
        b_shape = (K, N)
    elif b_kind == "runtime_broadcast":  # b's batch broadcasts against a's: (2, 3) with (1, 3)
        a_batch, b_shape = (2, 3), (1, 3, K, N)
    else:
        b_shape = (*(a_batch or (2,)), K, N)
    a = q8(rng, a_dt, (*a_batch, M, K))
    if b_kind == "runtime_transposed":  # a non-contiguous view, as Transpose(K) gives
        b = np.swapaxes(q8(rng, b_dt, (*b_shape[:-2], N, K)), -1, -2)
    else:
        b = q8(rng, b_dt, b_shape)
    per_column = draw(st.booleans())
    sa = np.asarray(rng.uniform(0.005, 0.05), F32)
    za = nonzero_zero_point(rng, a_dt)
    if per_column:  # distinct scales and zero points per column
        sb = rng.uniform(0.002, 0.02, N).astype(F32)
        zb = nonzero_zero_point(rng, b_dt, (N,))
    else:
        sb = np.asarray(rng.uniform(0.002, 0.02), F32)
        zb = nonzero_zero_point(rng, b_dt)
    acc = matmul_integer(a, b, za, zb).astype(np.float64)
    sy, zy = output_params(acc * float(sa) * np.asarray(sb, np.float64), y_dt)
    const_b = b_kind == "const2d"
    return [
        Operand(a, const=False),
        Operand(sa),
        Operand(za),
        Operand(b, const=const_b),
        Operand(sb),
        Operand(zb),
        Operand(sy),
        Operand(zy),
    ]


@given(case=qlinear_matmul_cases())
def test_qlinear_matmul_matches_reference_every_isa_and_thread_count(case) -> None:
    check_native("QLinearMatMul", "", case)


def test_qlinear_matmul_constant_b_prepacked_once_and_shared_by_the_batch() -> None:
    """Hazard: a rank-2 constant b repacked per call or copied per batch matrix. The
    binder packs it once (params) and a batched a [2, 3, M, K] is one GEMM over 6·M rows."""
    rng = np.random.default_rng(11)
    b = q8(rng, I8, (259, 17))
    case = [
        Operand(q8(rng, U8, (2, 3, 5, 259)), const=False),
        Operand(np.asarray(0.02, F32)),
        Operand(np.asarray(131, np.uint8)),
        Operand(b),
        Operand(rng.uniform(0.002, 0.02, 17).astype(F32)),
        Operand(nonzero_zero_point(rng, I8, (17,))),
        Operand(np.asarray(0.9, F32)),
        Operand(np.asarray(-5, np.int8)),
    ]
    kernel, _ = bind("QLinearMatMul", "", case)
    packed = kernel.params["packed"]
    assert (packed.K, packed.N) == b.shape and "_runtime_b" not in kernel.name
    assert kernel.params["multiplier"].shape == (17,)
    check_native("QLinearMatMul", "", case)


def test_steps_reading_one_constant_share_its_packing() -> None:
    """Hazard: an LSTM unrolled into integer ops (ORT's QDQ files) reads each weight at
    every time step, and each step packing its own copy held 20 copies of every weight.
    The binder packs a constant once for every step that reads it; another zero point,
    or the constant changed in place, packs again."""
    rng = np.random.default_rng(23)
    b = q8(rng, I8, (259, 17))

    def case(zb: np.ndarray) -> list[Operand]:
        return [
            Operand(q8(rng, U8, (5, 259)), const=False),
            Operand(np.asarray(0.02, F32)),
            Operand(np.asarray(131, np.uint8)),
            Operand(b),
            Operand(rng.uniform(0.002, 0.02, 17).astype(F32)),
            Operand(zb),
            Operand(np.asarray(0.9, F32)),
            Operand(np.asarray(-5, np.int8)),
        ]

    zb = nonzero_zero_point(rng, I8, (17,))
    first, _ = bind("QLinearMatMul", "", case(zb))
    again, _ = bind("QLinearMatMul", "", case(zb))
    assert again.params["packed"] is first.params["packed"]
    other, _ = bind("QLinearMatMul", "", case(zb + np.int8(1)))
    assert other.params["packed"] is not first.params["packed"]
    b[0] = np.where(b[0] == 127, -128, b[0] + 1).astype(I8)  # in place
    changed = case(zb)
    rebound, _ = bind("QLinearMatMul", "", changed)
    assert rebound.params["packed"] is not first.params["packed"]
    check_native("QLinearMatMul", "", changed)


def test_qlinear_matmul_saturates_at_both_ends() -> None:
    """Hazard: requantization that wraps instead of saturating. sy tiny: every output at
    qmin or qmax; the clamp happens in float32 before the round (requant.py)."""
    rng = np.random.default_rng(3)
    a = q8(rng, U8, (17, 64))
    b = q8(rng, I8, (64, 7))
    for y_dt, zy in ((U8, 128), (I8, 0)):
        case = [
            Operand(a, const=False),
            Operand(np.asarray(0.05, F32)),
            Operand(np.asarray(128, np.uint8)),
            Operand(b),
            Operand(np.asarray(0.03, F32)),
            Operand(np.asarray(1, np.int8)),
            Operand(np.asarray(1e-4, F32)),
            Operand(np.asarray(zy, y_dt)),
        ]
        y = check_native("QLinearMatMul", "", case)
        info = np.iinfo(y_dt)
        assert (y == info.min).any() and (y == info.max).any()


def test_qlinear_matmul_per_row_a_scale_is_refused_with_a_reason() -> None:
    rng = np.random.default_rng(5)
    case = [
        Operand(q8(rng, U8, (5, 7)), const=False),
        Operand(rng.uniform(0.01, 0.02, 5).astype(F32)),
        Operand(np.full(5, 9, np.uint8)),
        Operand(q8(rng, I8, (7, 3))),
        Operand(np.asarray(0.02, F32)),
        Operand(np.asarray(0, np.int8)),
        Operand(np.asarray(0.5, F32)),
        Operand(np.asarray(1, np.uint8)),
    ]
    kernel, reason = bind("QLinearMatMul", "", case)
    assert kernel is None
    assert reason == "a_scale per row of a: the native GEMM requantizes per column only"


def test_qlinear_matmul_nonpositive_runtime_multiplier_runs_the_reference() -> None:
    """Hazard: qgemm requires multipliers > 0; a run-time b_scale with a negative entry
    goes to the reference inside the kernel, with the same result."""
    rng = np.random.default_rng(6)
    sb = rng.uniform(0.002, 0.02, 7).astype(F32)
    sb[3] = -sb[3]
    case = [
        Operand(q8(rng, U8, (5, 64)), const=False),
        Operand(np.asarray(0.02, F32)),
        Operand(np.asarray(100, np.uint8)),
        Operand(q8(rng, I8, (64, 7))),
        Operand(sb, const=False),
        Operand(nonzero_zero_point(rng, I8, (7,))),
        Operand(np.asarray(0.5, F32)),
        Operand(np.asarray(120, np.uint8)),
    ]
    check_native("QLinearMatMul", "", case, runtime_fallback=True)


def test_qlinear_matmul_constant_nonpositive_multiplier_is_refused() -> None:
    rng = np.random.default_rng(6)
    case = [
        Operand(q8(rng, U8, (5, 64)), const=False),
        Operand(np.asarray(0.02, F32)),
        Operand(np.asarray(100, np.uint8)),
        Operand(q8(rng, I8, (64, 7))),
        Operand(np.asarray(-0.01, F32)),
        Operand(np.asarray(0, np.int8)),
        Operand(np.asarray(0.5, F32)),
        Operand(np.asarray(120, np.uint8)),
    ]
    kernel, reason = bind("QLinearMatMul", "", case)
    assert kernel is None
    assert reason == "requantization multiplier sa·sb/sy is not finite and > 0 for every column"


# --------------------------------------------------------------------------------------
# MatMulInteger
# --------------------------------------------------------------------------------------


@st.composite
def matmul_integer_cases(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    M, K, N = (
        draw(st.sampled_from(M_VALUES)),
        draw(st.sampled_from(K_VALUES)),
        draw(st.sampled_from(N_VALUES)),
    )
    a_dt, b_dt = draw(st.sampled_from([U8, I8])), draw(st.sampled_from([U8, I8]))  # every pairing
    a_batch = draw(st.sampled_from([(), (3,)]))
    const_b = draw(st.booleans())
    b_batch = () if const_b else draw(st.sampled_from([(), a_batch]))
    a = q8(rng, a_dt, (*a_batch, M, K))
    b = q8(rng, b_dt, (*b_batch, K, N))
    za_kind = draw(st.sampled_from(["none", "scalar", "per_row"]))
    za = {
        "none": None,
        "scalar": nonzero_zero_point(rng, a_dt),
        "per_row": nonzero_zero_point(rng, a_dt, (M,)),
    }[za_kind]
    zb_kind = draw(st.sampled_from(["none", "scalar", "per_column"]))
    zb = {
        "none": None,
        "scalar": nonzero_zero_point(rng, b_dt),
        "per_column": nonzero_zero_point(rng, b_dt, (N,)),
    }[zb_kind]
    return [Operand(a, const=False), Operand(b, const=const_b), Operand(za), Operand(zb)]


@given(case=matmul_integer_cases())
def test_matmul_integer_matches_reference_every_isa_and_thread_count(case) -> None:
    check_native("MatMulInteger", "", case)


def test_matmul_integer_k_past_float_exact_limit_wraps_like_int32() -> None:
    """Hazard: accumulating in float32 past K = 258 (65025·K >= 2^24) loses bits; int32
    wraps. K = 70000 with extreme operands: |acc| > 2^31, so the int32 wrap is exercised."""
    K = 70000
    a = np.full((2, K), 255, np.uint8)
    b = np.full((K, 3), -128, np.int8)
    b[:, 1] = 127
    case = [
        Operand(a, const=False),
        Operand(b),
        Operand(np.asarray(0, np.uint8)),
        Operand(np.asarray(0, np.int8)),
    ]
    y = check_native("MatMulInteger", "", case)
    assert y[0, 0] == np.int64(255 * -128 * K).astype(np.int32)  # wrapped: -2284800000 + 2^32


# --------------------------------------------------------------------------------------
# com.microsoft QGemm
# --------------------------------------------------------------------------------------


@st.composite
def qgemm_cases(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    M, K, N = (
        draw(st.sampled_from(M_VALUES)),
        draw(st.sampled_from(K_VALUES)),
        draw(st.sampled_from(N_VALUES)),
    )
    a_dt = draw(st.sampled_from([U8, I8]))
    b_dt = I8 if a_dt == I8 else draw(st.sampled_from([U8, I8]))  # ORT has no int8 x uint8
    trans_a, trans_b = draw(st.booleans()), draw(st.booleans())
    alpha = draw(st.sampled_from([1.0, 0.75, 2.5]))
    a = q8(rng, a_dt, (K, M) if trans_a else (M, K))
    b = q8(rng, b_dt, (N, K) if trans_b else (K, N))
    const_b = draw(st.booleans())
    sa = np.asarray(rng.uniform(0.005, 0.05), F32)
    za = nonzero_zero_point(rng, a_dt)
    if draw(st.booleans()):
        sb = rng.uniform(0.002, 0.02, N).astype(F32)
        zb = nonzero_zero_point(rng, b_dt, (N,))
    else:
        sb = np.asarray(rng.uniform(0.002, 0.02), F32)
        zb = nonzero_zero_point(rng, b_dt)
    c_kind = draw(st.sampled_from(["none", "scalar", "n", "1n"]))
    c = {
        "none": None,
        "scalar": np.asarray(rng.integers(-5000, 5000), np.int32),
        "n": rng.integers(-5000, 5000, N).astype(np.int32),
        "1n": rng.integers(-5000, 5000, (1, N)).astype(np.int32),
    }[c_kind]
    float_out = draw(st.booleans())
    operands = [
        Operand(a, const=False),
        Operand(sa),
        Operand(za),
        Operand(b, const=const_b),
        Operand(sb),
        Operand(zb),
    ]
    if float_out:
        operands.append(Operand(c))
    else:
        acc = matmul_integer(a.T if trans_a else a, b.T if trans_b else b, za, zb).astype(np.float64)
        if c is not None:
            acc = acc + c
        sy, zy = output_params(acc * alpha * float(sa) * np.asarray(sb, np.float64), a_dt)
        omit_zy = draw(st.booleans())
        if omit_zy:
            sy, zy = output_params(np.maximum(acc * alpha * float(sa) * np.asarray(sb, np.float64), 0), a_dt)
        operands += [Operand(c), Operand(sy), Operand(None if omit_zy else zy)]
    attrs = {"alpha": alpha, "transA": int(trans_a), "transB": int(trans_b)}
    return operands, attrs


@given(case=qgemm_cases())
def test_qgemm_ms_matches_reference_every_isa_and_thread_count(case) -> None:
    operands, attrs = case
    check_native("QGemm", MS_DOMAIN, operands, attrs)


def test_qgemm_ms_per_row_bias_is_refused_with_a_reason() -> None:
    rng = np.random.default_rng(8)
    case = [
        Operand(q8(rng, U8, (5, 7)), const=False),
        Operand(np.asarray(0.02, F32)),
        Operand(np.asarray(3, np.uint8)),
        Operand(q8(rng, I8, (7, 17))),
        Operand(np.asarray(0.01, F32)),
        Operand(np.asarray(0, np.int8)),
        Operand(rng.integers(-100, 100, (5, 17)).astype(np.int32)),
    ]
    kernel, reason = bind("QGemm", MS_DOMAIN, case)
    assert kernel is None
    assert reason == "C of shape [5, 17] adds per row: the native GEMM takes a per-column int32 bias"
    case[6] = Operand(case[6].array, const=False)  # a run-time per-row C: the twin at run time
    check_native("QGemm", MS_DOMAIN, case, runtime_fallback=True)


# --------------------------------------------------------------------------------------
# com.microsoft MatMulIntegerToFloat, DynamicQuantizeMatMul
# --------------------------------------------------------------------------------------


@st.composite
def integer_to_float_cases(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    M, K, N = (
        draw(st.sampled_from(M_VALUES)),
        draw(st.sampled_from(K_VALUES)),
        draw(st.sampled_from(N_VALUES)),
    )
    a_dt = draw(st.sampled_from([U8, I8]))
    b_dt = I8 if a_dt == I8 else draw(st.sampled_from([U8, I8]))
    a = q8(rng, a_dt, (*draw(st.sampled_from([(), (3,)])), M, K))
    b = q8(rng, b_dt, (K, N))
    per_column = draw(st.booleans())
    sb = rng.uniform(0.002, 0.02, N).astype(F32) if per_column else np.asarray(rng.uniform(0.002, 0.02), F32)
    zb = draw(st.sampled_from([None, "z"]))
    if zb is not None:
        zb = nonzero_zero_point(rng, b_dt, (N,) if per_column else ())
    za = draw(st.sampled_from([None, "z"]))
    if za is not None:
        za = nonzero_zero_point(rng, a_dt)
    bias = rng.uniform(-1, 1, N).astype(F32) if draw(st.booleans()) else None
    return [
        Operand(a, const=False),
        Operand(b, const=draw(st.booleans())),
        Operand(np.asarray(rng.uniform(0.005, 0.05), F32)),
        Operand(sb),
        Operand(za),
        Operand(zb),
        Operand(bias),
    ]


@given(case=integer_to_float_cases())
def test_matmul_integer_to_float_matches_reference(case) -> None:
    check_native("MatMulIntegerToFloat", MS_DOMAIN, case)


@given(case=integer_to_float_cases())
def test_matmul_integer_to_float_run_time_a_scale_and_zero_point(case) -> None:
    """ORT's quantize_dynamic feeds a_scale and a_zero_point from DynamicQuantizeLinear: with
    b, b_scale and bias constant the call goes straight to the kernel (gemm.py ``direct``
    with a b_scale), its multiplier sa·sb[n] computed per call; the bytes are the twin's."""
    a, b, sa, sb, za, zb, bias = case
    zero = np.zeros((), a.array.dtype)
    case = [a, Operand(b.array), Operand(sa.array, const=False), sb]
    case += [Operand(zero if za.array is None else za.array, const=False), zb, bias]
    check_native("MatMulIntegerToFloat", MS_DOMAIN, case)


def test_matmul_integer_to_float_run_time_a_scale_outside_the_kernel_goes_to_the_twin() -> None:
    """A run-time a_scale that is not a positive float32 scalar ([1, 1] here, then a negative
    one) leaves the direct call for the checked path, which hands it to the twin."""
    rng = np.random.default_rng(12)
    a, b = q8(rng, U8, (3, 300)), q8(rng, I8, (300, 33))
    for sa in (np.asarray([[0.02]], F32), np.asarray(-0.02, F32)):
        case = [
            Operand(a, const=False),
            Operand(b),
            Operand(sa, const=False),
            Operand(np.asarray(0.01, F32)),
            Operand(np.asarray(7, np.uint8), const=False),
            Operand(None),
            Operand(None),
        ]
        check_native("MatMulIntegerToFloat", MS_DOMAIN, case, runtime_fallback=True)


@given(case=integer_to_float_cases())
def test_dynamic_quantize_matmul_matches_reference(case) -> None:
    rng = np.random.default_rng(case[0].array.size)
    a = (rng.standard_normal(case[0].array.shape) * 3 + 0.5).astype(F32)
    check_native(
        "DynamicQuantizeMatMul", MS_DOMAIN, [Operand(a, const=False), case[1], case[3], case[5], case[6]]
    )


def test_matmul_integer_to_float_float16_scales_are_refused() -> None:
    rng = np.random.default_rng(9)
    case = [
        Operand(q8(rng, U8, (5, 7)), const=False),
        Operand(q8(rng, I8, (7, 3))),
        Operand(np.asarray(0.02, np.float16)),
        Operand(np.asarray(0.01, np.float16)),
    ]
    kernel, reason = bind("MatMulIntegerToFloat", MS_DOMAIN, case)
    assert kernel is None
    assert reason == "native MatMulIntegerToFloat takes float32 scales and bias, a_scale is float16"


# --------------------------------------------------------------------------------------
# Sessions: single nodes and whole models, native vs reference backend
# --------------------------------------------------------------------------------------


def _session_pair(model: onnx.ModelProto | str, threads: int):
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    native = quanta.InferenceSession(model, sess_options=opts, backend="native")
    ref = quanta.InferenceSession(model, backend="reference")
    return native, ref


def _init(name: str, arr: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(arr, name)


def test_session_single_nodes_run_native_without_fallbacks() -> None:
    rng = np.random.default_rng(12)
    M, K, N = 5, 259, 17
    w = q8(rng, I8, (K, N))
    sb = rng.uniform(0.002, 0.02, N).astype(F32)
    zb = nonzero_zero_point(rng, I8, (N,))
    inits = [
        _init("sa", np.asarray(0.03, F32)),
        _init("za", np.asarray(77, np.uint8)),
        _init("w", w),
        _init("wt", np.ascontiguousarray(w.T)),
        _init("sb", sb),
        _init("zb", zb),
        _init("sy", np.asarray(0.6, F32)),
        _init("zy", np.asarray(131, np.uint8)),
        _init("c", rng.integers(-3000, 3000, N).astype(np.int32)),
        _init("bias", rng.uniform(-1, 1, N).astype(F32)),
    ]
    n = helper.make_node
    nodes = [
        n("QLinearMatMul", ["a", "sa", "za", "w", "sb", "zb", "sy", "zy"], ["y0"], name="qlinear_matmul"),
        n("MatMulInteger", ["a", "w", "za", "zb"], ["y1"], name="matmul_integer"),
        n(
            "QGemm",
            ["a", "sa", "za", "wt", "sb", "zb", "c", "sy", "zy"],
            ["y2"],
            name="qgemm",
            domain=MS_DOMAIN,
            transB=1,
            alpha=0.75,
        ),
        n("QGemm", ["a", "sa", "za", "w", "sb", "zb", "c"], ["y3"], name="qgemm_float", domain=MS_DOMAIN),
        n(
            "MatMulIntegerToFloat",
            ["a", "w", "sa", "sb", "za", "zb", "bias"],
            ["y4"],
            name="mmitf",
            domain=MS_DOMAIN,
        ),
        n("DynamicQuantizeMatMul", ["f", "w", "sb", "zb", "bias"], ["y5"], name="dqmm", domain=MS_DOMAIN),
        n("QLinearMatMul", ["a3", "sa", "za", "at", "sa", "za", "sy", "zy"], ["y6"], name="runtime_b"),
    ]
    outs = [("y0", TensorProto.UINT8, [M, N]), ("y1", TensorProto.INT32, [M, N]),
            ("y2", TensorProto.UINT8, [M, N]), ("y3", TensorProto.FLOAT, [M, N]),
            ("y4", TensorProto.FLOAT, [M, N]), ("y5", TensorProto.FLOAT, [M, N]),
            ("y6", TensorProto.UINT8, [3, M, M])]  # fmt: skip
    g = helper.make_graph(
        nodes,
        "gemms",
        [
            helper.make_tensor_value_info("a", TensorProto.UINT8, [M, K]),
            helper.make_tensor_value_info("f", TensorProto.FLOAT, [M, K]),
            helper.make_tensor_value_info("a3", TensorProto.UINT8, [3, M, K]),
            helper.make_tensor_value_info("at", TensorProto.UINT8, [3, K, M]),
        ],
        [helper.make_tensor_value_info(*o) for o in outs],
        inits,
    )
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS_DOMAIN, 1)]
    )
    a3 = q8(rng, U8, (3, M, K))
    feeds = {
        "a": q8(rng, U8, (M, K)),
        "f": rng.standard_normal((M, K)).astype(F32),
        "a3": a3,
        "at": np.ascontiguousarray(np.swapaxes(a3[::-1], 1, 2)),
    }
    results = {}
    for threads in THREADS:
        native, ref = _session_pair(model, threads)
        assert native.fallbacks == []
        assert all(s.kernel.impl == "native" for s in native.plan.steps)
        got, want = native.run(None, feeds), ref.run(None, feeds)
        for (name, *_), g_, w_ in zip(outs, got, want, strict=True):
            assert_same(w_, g_, f"{name} threads={threads}")
        results[threads] = got
    for g1, g2 in zip(results[1], results[2], strict=True):
        assert g1.tobytes() == g2.tobytes()


def _quantize(src: onnx.ModelProto | str, feeds: list[dict], tmp_path: Path, name: str) -> str:
    out = tmp_path / f"{name}.int8.onnx"
    quanta.quantize_static(src, out, feeds, verbose=False)
    return str(out)


GEMM_OPS = {"QLinearMatMul", "MatMulInteger", "QGemm", "MatMulIntegerToFloat", "DynamicQuantizeMatMul"}


@pytest.mark.parametrize("threads", THREADS)
def test_session_quantized_encoder_block_native_matches_reference(tmp_path: Path, threads: int) -> None:
    """The QDQ encoder block (per-column weight scales, attention MatMuls with both
    operands activations): every QLinearMatMul native, outputs bit-exact. (Which MatMuls
    the quantizer lowers is its recipe's choice; every one it lowers must run native.)"""
    path = _quantize(models.encoder_block(), models.encoder_feeds(), tmp_path, "encoder")
    native, ref = _session_pair(path, threads)
    matmuls = [s for s in native.plan.steps if s.op_type == "QLinearMatMul"]
    assert matmuls and all(s.kernel.impl == "native" for s in matmuls)
    # projections with a prepacked constant b, and attention (context P·V) with a run-time b
    assert any("_runtime_b" in s.kernel.name for s in matmuls)
    assert any("_runtime_b" not in s.kernel.name for s in matmuls)
    assert not [f for f in native.fallbacks if f[1] in GEMM_OPS]
    rng = np.random.default_rng(21)
    for S in (1, 7, 33):
        mask = np.ones((2, S), np.int64)
        mask[1, S // 2 :] = 0
        feeds = {"x": rng.standard_normal((2, S, 24)).astype(F32), "mask": mask}
        for got, want in zip(native.run(None, feeds), ref.run(None, feeds), strict=True):
            assert_same(want, got, f"encoder S={S} threads={threads}")


def test_session_demo_cnn_qgemm_head_native_matches_reference(tmp_path: Path) -> None:
    data = np.load(ASSETS / "digits_data.npz")
    calib = [{"input": data["calib_x"][i : i + 16]} for i in range(0, 64, 16)]
    path = _quantize(str(ASSETS / "digits_cnn.onnx"), calib, tmp_path, "digits")
    x = data["test_x"][:37]
    outs = {}
    for threads in THREADS:
        native, ref = _session_pair(path, threads)
        heads = [s for s in native.plan.steps if s.op_type == "QGemm"]
        assert len(heads) == 1 and heads[0].kernel.impl == "native", heads
        assert not [f for f in native.fallbacks if f[1] in GEMM_OPS]
        got, want = native.run(None, {"input": x})[0], ref.run(None, {"input": x})[0]
        assert_same(want, got, f"digits threads={threads}")
        outs[threads] = got
    assert outs[1].tobytes() == outs[2].tobytes()
