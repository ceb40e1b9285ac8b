"""MatMulNBits at accuracy_level 4 (docs/quantization-math.md eqs. (W6)-(W9)): A quantized to
int8 per row and block by ONNX Runtime's rule, exact block dots, float32 block sums in
order. The twin (reference/w4.py::matmul_nbits_a8) against plain loops, the native kernel
(w4/nbits_a8.h: raw codes two to a byte, the zero point through the row's code sum, eq.
(W10)) against the twin bit for bit on every ISA and thread count, and the session on a
MatMulNBits graph.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import numpy_helper

import quanta
from quanta.kernels import _native
from quanta.kernels.reference.w4 import matmul_nbits_a8, nbits_codes, quantize_rows_a8
from quanta.targets.native.w4 import nbits_block_params, pack_nibbles
from tests.lowbit.test_w4 import _nbits_model

F32 = np.float32
ISAS = list(_native.supported_isas())


def _loops(a, q, zp, s, block, bias):
    m, k = a.shape
    n = q.shape[1]
    kb = -(-k // block)
    y = np.zeros((m, n), F32)
    for i in range(m):
        codes, scales = [], []
        for b in range(kb):
            blk = a[i, b * block : min(k, (b + 1) * block)]
            mx = F32(max(abs(float(v)) for v in blk))
            scales.append(F32(mx / F32(127)))
            r = F32(F32(127) / mx) if mx != 0 else F32(0)
            codes.append([int(np.rint(F32(v * r))) for v in blk])
        for j in range(n):
            t = F32(0)
            for b in range(kb):
                acc = sum(c * (int(q[b * block + x, j]) - int(zp[b, j])) for x, c in enumerate(codes[b]))
                t = F32(t + F32(F32(acc) * F32(scales[b] * s[b, j])))
            y[i, j] = t if bias is None else F32(t + bias[j])
    return y


def _case(rng, m, k, n, block, bias):
    kb = -(-k // block)
    a = (rng.standard_normal((m, k)) * rng.uniform(0.1, 30, (m, 1))).astype(F32)
    q = rng.integers(0, 16, (k, n))
    zp = rng.integers(0, 16, (kb, n))
    s = rng.uniform(0.002, 0.05, (kb, n)).astype(F32)
    b = rng.standard_normal(n).astype(F32) if bias else None
    return a, q, zp, s, block, b


def test_row_quantizer_follows_w6_ties_to_even_and_zero_blocks():
    a = np.array([[63.5 / 127, -1.0, 0.0, 0.0, 0.5, -0.25, 0.125]], F32)
    q, s = quantize_rows_a8(a, 2)
    # block 0: m 1, 63.5 -> 64 (tie to even); block 1: all zero -> scale 0, codes 0;
    # block 2: m 0.5, r 254; block 3 (short): m 0.125, r 1016
    assert q.tolist() == [[[64, -127], [0, 0], [127, -64], [127, 0]]]
    assert s.tolist() == [[F32(1) / F32(127), 0.0, F32(0.5) / F32(127), F32(0.125) / F32(127)]]


@pytest.mark.parametrize(("m", "k", "n", "block", "bias"), [(3, 70, 7, 16, True), (2, 301, 17, 32, False)])
def test_twin_matches_loops(m, k, n, block, bias):
    case = _case(np.random.default_rng(k), m, k, n, block, bias)
    got = matmul_nbits_a8(*case)
    np.testing.assert_array_equal(got.view(np.uint32), _loops(*case).view(np.uint32))


def _native_run(a, q, zp, s, block, bias, threads):
    k, n = q.shape
    zpp, sw = nbits_block_params(zp, s, n)
    return _native.nbits_a8_matmul(
        a, pack_nibbles(q, block), zpp, sw, k, n, block, bias=bias, num_threads=threads
    )


def test_pack_nibbles_layout():
    k, n, block = 37, 35, 16
    q = np.random.default_rng(0).integers(0, 16, (k, n))
    p = pack_nibbles(q, block)
    assert p.shape == (2, 3, 4, 64) and p.dtype == np.uint8
    for kk in range(3 * block):
        for col in range(64):
            b, g, t = kk // block, kk % block // 4, kk % 4
            pn, c, hi = col // 32, col % 16, col % 32 // 16
            want = q[kk, col] if kk < k and col < n else 0
            assert (p[pn, b, g, c * 4 + t] >> (4 * hi)) & 15 == want


def _check_all_isas(a, q, zp, s, block, b):
    want = matmul_nbits_a8(a, q, zp, s, block, b)
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            for threads in (1, 2):
                _same_bits(_native_run(a, q, zp, s, block, b, threads), want)
    finally:
        _native.clear_isa()


def _same_bits(got, want):
    # NaN rows compare by position (payloads are not part of the contract)
    assert got.shape == want.shape and got.dtype == F32
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 11),
    k=st.integers(1, 420),
    n=st.integers(1, 50),
    block=st.sampled_from([16, 32, 64, 128]),
    bias=st.booleans(),
    special=st.sampled_from(["none", "zero_row", "inf", "nan"]),
    seed=st.integers(0, 2**31),
)
def test_native_matches_twin_bit_for_bit(m, k, n, block, bias, special, seed):
    rng = np.random.default_rng(seed)
    a, q, zp, s, block, b = _case(rng, m, k, n, block, bias)
    if special == "zero_row":
        a[rng.integers(m)] = 0
    elif special != "none":
        a[rng.integers(m), rng.integers(k)] = np.inf if special == "inf" else np.nan
    _check_all_isas(a, q, zp, s, block, b)


@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize(("k", "n"), [(300, 17), (777, 1000), (300, 1000), (777, 17)])
@pytest.mark.parametrize("zp_kind", ["uint8", "none"])
def test_native_small_m_matches_twin_bit_for_bit(m, k, n, zp_kind):
    # decode rows (M <= 3) over K that no block divides; absent zero points are 8 (W1)
    rng = np.random.default_rng(k * n + m)
    a, q, zp, s, block, b = _case(rng, m, k, n, 32, zp_kind == "uint8")
    if zp_kind == "none":
        zp = np.full_like(zp, 8)
    # extreme codes next to extreme activations: q 0 / 15 against qa ±127, zp 0 / 15
    q[:4, :3] = [[0, 15, 15]] * 4
    zp[0, :2] = [15, 0] if zp_kind == "uint8" else 8
    a[0, :4] = [-30.0, 30.0, -30.0, 30.0]
    # block 1 of row 0: maximum 127, so r = 1 and the codes are rne(a): ties to even
    a[0, 32:40] = [127.0, 0.5, 1.5, 2.5, -0.5, -2.5, 3.5, -3.5]
    # the short last block (K mod 32 = 12 or 9) of the last row with an inf: its row is NaN
    if m > 1:
        a[m - 1, k - 3] = np.inf
    _check_all_isas(a, q, zp, s, block, b)


def test_native_3d_a_and_out_and_errors_named():
    a, q, zp, s, block, b = _case(np.random.default_rng(5), 6, 259, 33, 32, True)
    a3 = a.reshape(2, 3, 259)
    want = matmul_nbits_a8(a3, q, zp, s, block, b)
    k, n = q.shape
    packed = pack_nibbles(q, block)
    zpp, sw = nbits_block_params(zp, s, n)
    out = np.empty((2, 3, n), F32)
    got = _native.nbits_a8_matmul(a3, packed, zpp, sw, k, n, block, bias=b, num_threads=2, out=out)
    assert got is out
    _same_bits(out, want)
    with pytest.raises(ValueError, match="nbits_a8_matmul: a: expected float32, got float64"):
        _native.nbits_a8_matmul(a.astype(np.float64), packed, zpp, sw, k, n, block)
    with pytest.raises(ValueError, match="nbits_a8_matmul: bias: expected 33 values"):
        _native.nbits_a8_matmul(a, packed, zpp, sw, k, n, block, bias=b[:5])
    with pytest.raises(ValueError, match="nbits_a8_matmul: packed: expected 9216 uint8 values"):
        _native.nbits_a8_matmul(a, packed[1:], zpp, sw, k, n, block)
    with pytest.raises(ValueError, match="nbits_a8_matmul: packed: expected dtype uint8, got int8"):
        _native.nbits_a8_matmul(a, packed.view(np.int8), zpp, sw, k, n, block)
    with pytest.raises(ValueError, match="nbits_a8_matmul: zp, sw: expected 576 values each"):
        _native.nbits_a8_matmul(a, packed, zpp[:1], sw, k, n, block)
    with pytest.raises(ValueError, match="nbits_a8_matmul: zp: expected dtype uint8, got int32"):
        _native.nbits_a8_matmul(a, packed, zpp.astype(np.int32), sw, k, n, block)


@pytest.mark.parametrize(
    ("k", "block", "zp_kind"), [(300, 32, "uint8"), (129, 64, "none"), (777, 16, "uint8")]
)
def test_accuracy_level_4_session_is_the_twin_and_ort_within_its_rounding(k, block, zp_kind):
    n = 17
    model = _nbits_model(k, n, block, zp_kind=zp_kind, bias=zp_kind != "none", seed=k, accuracy_level=4)
    blob = model.SerializeToString()
    a = (np.random.default_rng(1).standard_normal((3, 5, k)) * 3).astype(F32)
    sess = quanta.InferenceSession(blob)
    assert [s.kernel.name for s in sess.plan.steps] == ["native:matmul_nbits_w4a8"]
    y = sess.run(None, {"A": a})[0]
    r = quanta.InferenceSession(blob, backend="reference").run(None, {"A": a})[0]
    np.testing.assert_array_equal(y.view(np.uint32), r.view(np.uint32))
    # against float32 A the int8 codes cost about one code in 254 per block, not more
    level0 = _nbits_model(k, n, block, zp_kind=zp_kind, bias=zp_kind != "none", seed=k)
    f = quanta.InferenceSession(level0.SerializeToString(), backend="reference").run(None, {"A": a})[0]
    assert 0 < np.max(np.abs(y - f)) < 0.02 * np.max(np.abs(f))
    # ONNX Runtime quantizes A to the same codes and scales; it sums the block terms (and
    # the zero-point terms, separately) in another float32 order: within that rounding
    ort = pytest.importorskip("onnxruntime")
    o = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"A": a})[0]
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    q, zp, s, _ = nbits_codes(inits["B"], inits["scales"], inits.get("zp"), k=k, n=n, block_size=block)
    qa, sa = quantize_rows_a8(a, block)
    kb = sa.shape[-1]
    qb = q[:, : kb * block].T.reshape(kb, block, n).astype(np.float64)
    mag = np.zeros(y.shape)
    for b in range(kb):
        c = sa[..., b, None].astype(np.float64) * s[:, b]
        mag += c * (np.abs(qa[..., b, :] @ qb[b]) + np.abs(qa[..., b, :].sum(-1))[..., None] * zp[:, b])
    if "bias" in inits:
        mag += np.abs(inits["bias"])
    assert np.all(np.abs(y - o) <= (4 * kb + 8) * 2.0**-24 * mag)


@pytest.mark.parametrize(("k", "n"), [(300, 1000), (777, 17)])
@pytest.mark.parametrize("zp_kind", ["uint8", "none"])
def test_accuracy_level_4_session_decode_rows_are_the_twin(k, n, zp_kind):
    model = _nbits_model(k, n, 32, zp_kind=zp_kind, bias=zp_kind == "uint8", seed=n, accuracy_level=4)
    for v in (*model.graph.input, *model.graph.output):
        v.type.tensor_type.shape.dim[0].dim_param = "M"
        del v.type.tensor_type.shape.dim[1]
    blob = model.SerializeToString()
    sess = quanta.InferenceSession(blob)
    assert [s.kernel.name for s in sess.plan.steps] == ["native:matmul_nbits_w4a8"]
    ref = quanta.InferenceSession(blob, backend="reference")
    for m in (1, 2, 3):
        a = (np.random.default_rng(m).standard_normal((m, k)) * 3).astype(F32)
        y = sess.run(None, {"A": a})[0]
        np.testing.assert_array_equal(y.view(np.uint32), ref.run(None, {"A": a})[0].view(np.uint32))


def test_accuracy_level_4_with_float_zero_points_stays_float():
    model = _nbits_model(300, 17, 64, zp_kind="float", seed=3, accuracy_level=4)
    blob = model.SerializeToString()
    a = np.random.default_rng(2).standard_normal((3, 5, 300)).astype(F32)
    sess = quanta.InferenceSession(blob)
    assert [s.kernel.name for s in sess.plan.steps] == ["native:matmul_nbits_w4_f32"]
    level0 = _nbits_model(300, 17, 64, zp_kind="float", seed=3)
    r0 = quanta.InferenceSession(level0.SerializeToString(), backend="reference").run(None, {"A": a})[0]
    r4 = quanta.InferenceSession(blob, backend="reference").run(None, {"A": a})[0]
    np.testing.assert_array_equal(r0, r4)
