"""quanta::GRUGates: the twin (reference/rnn.py gru_gates) computes (GG1)-(GG3), the native
kernel gives the twin's bytes on every ISA, the specialized call the generic one's, and
inputs outside the form are named."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quanta.kernels import _native
from quanta.kernels.reference.float_ops import sigmoid_f32, tanh_f32
from quanta.kernels.reference.registry import OpError
from quanta.kernels.reference.rnn import gru_gates
from quanta.targets.base import KernelContext, Specialization
from quanta.targets.native import recurrent

F32 = np.float32
ISAS: list[str] = list(_native.supported_isas())


def _inputs(rng, b: int, h: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    gx = (rng.standard_normal((b, 3 * h)) * 4).astype(F32)
    gh = (rng.standard_normal((b, 3 * h)) * 3).astype(F32)
    gx.flat[:: max(1, gx.size // 5)] = 0.0  # exact zeros: σ(0) and tanh's sign of zero
    gh.flat[:: max(1, gh.size // 7)] = -0.0
    hs = (rng.standard_normal((b, h)) * 2).astype(F32)
    return gx, gh, hs


def _spec(gx, gh, hs) -> Specialization:
    ctx = KernelContext(num_threads=1)
    return Specialization(
        shapes=(gx.shape, gh.shape, hs.shape),
        dtypes=(gx.dtype, gh.dtype, hs.dtype),
        consts=(None, None, None),
        out_shape=hs.shape,
        out_dtype=hs.dtype,
        out=None,
        num_threads=1,
        ctx=ctx,
    )


def test_twin_computes_gg1_to_gg3_one_lane_at_a_time() -> None:
    rng = np.random.default_rng(3)
    gx, gh, hs = _inputs(rng, 3, 17)
    order = (2, 0, 1)  # r in chunk 2, z in chunk 0, n in chunk 1
    got = gru_gates(None, gx, gh, hs, order=order)
    h = 17
    for b in range(3):
        for j in range(h):
            xr, xz, xn = (gx[b, k * h + j] for k in order)
            yr, yz, yn = (gh[b, k * h + j] for k in order)
            r = sigmoid_f32(np.array([F32(yr + xr)], F32))[0]
            z = sigmoid_f32(np.array([F32(yz + xz)], F32))[0]
            n = tanh_f32(np.array([F32(xn + F32(r * yn))], F32))[0]
            want = F32(F32(F32(hs[b, j] - n) * z) + n)
            assert got[b, j].tobytes() == want.tobytes(), (b, j)


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 7),
    h=st.sampled_from([1, 3, 17, 33, 100, 256]),
    order=st.permutations(range(3)),
    seed=st.integers(0, 2**16),
)
def test_native_equals_twin_on_every_isa(b, h, order, seed) -> None:
    gx, gh, hs = _inputs(np.random.default_rng(seed), b, h)
    want = gru_gates(None, gx, gh, hs, order=order)
    ctx = KernelContext(num_threads=1)
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            generic = recurrent._gru_gates_native(ctx, gx, gh, hs, order=order)
            fast = recurrent._gru_gates_specialized(_spec(gx, gh, hs), order=order)(ctx, gx, gh, hs)
            for got in (generic, fast):
                assert got.tobytes() == want.tobytes(), isa
    finally:
        _native.clear_isa()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_saturated_and_special_values_are_the_twins() -> None:
    vals = np.array([0.0, -0.0, 1e-30, 30.0, -30.0, 100.0, -100.0, np.inf, -np.inf, np.nan], F32)
    rng = np.random.default_rng(11)
    gx = rng.choice(vals, size=(4, 3 * 23)).astype(F32)
    gh = rng.choice(vals, size=(4, 3 * 23)).astype(F32)
    hs = rng.choice(vals, size=(4, 23)).astype(F32)
    want = gru_gates(None, gx, gh, hs)
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            got = recurrent._gru_gates_native(None, gx, gh, hs)
            # NaN where the twin has NaN (its sign and payload are not part of the contract)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=isa)
            keep = ~np.isnan(want)
            assert got[keep].tobytes() == want[keep].tobytes(), isa
    finally:
        _native.clear_isa()


def test_a_row_of_one_broadcasts_as_in_the_replaced_nodes() -> None:
    rng = np.random.default_rng(21)
    gx, gh, hs = _inputs(rng, 5, 33)
    cases = [(gx, gh[:1], hs), (gx[:1], gh, hs[:1]), (gx[:1], gh[:1], hs)]
    for a, b, c in cases:
        r, z, n = (a[:, k * 33 : (k + 1) * 33] for k in range(3))
        y = [b[:, k * 33 : (k + 1) * 33] for k in range(3)]
        rr = sigmoid_f32(y[0] + r)
        zz = sigmoid_f32(y[1] + z)
        nn = tanh_f32(n + rr * y[2])
        want = (c - nn) * zz + nn  # each operator broadcasting on its own, as the graph does
        assert gru_gates(None, a, b, c).tobytes() == want.tobytes()
        try:
            for isa in ISAS:
                _native.set_isa(isa)
                assert recurrent._gru_gates_native(None, a, b, c).tobytes() == want.tobytes(), isa
        finally:
            _native.clear_isa()


def test_bad_inputs_are_named() -> None:
    gx, gh, hs = _inputs(np.random.default_rng(0), 2, 3)
    with pytest.raises(OpError, match="h must be"):
        recurrent._gru_gates_native(None, gx, gh, hs[:, :2])
    with pytest.raises(OpError, match="gh must be"):
        recurrent._gru_gates_native(None, gx, gh[:, :6], hs)
    three = np.concatenate([gx, gx[:1]])
    with pytest.raises(OpError, match="do not broadcast"):
        recurrent._gru_gates_native(None, three, gh, hs)
    with pytest.raises(OpError, match="gx must be"):
        recurrent._gru_gates_native(None, gx[:, :8], gh, hs)
    with pytest.raises(OpError, match="float32"):
        recurrent._gru_gates_native(None, gx.astype(np.float64), gh, hs)
    with pytest.raises(ValueError, match="permutation"):
        _native.gru_gates_f32(gx, gh, hs, [0, 1, 1])
    with pytest.raises(ValueError, match="gh: expected shape"):
        _native.gru_gates_f32(gx, gh[:1], hs, [0, 1, 2])
