"""MatMulNBits with 8-bit weights (docs/quantization-math.md eqs. (NB8-1)-(NB8-3)): one code a
byte, zero points one a byte (128 when absent). accuracy_level 4 runs the int8 path of
eqs. (W6)-(W9) on the 8-bit codes, as ONNX Runtime does; levels 0-3 compute (W1)-(W2).
The twin against plain loops, the layout against (W1), the native kernel (one code a byte)
against the twin bit for bit on every ISA and thread count, and sessions against ONNX
Runtime within the float32 rounding of its other summation order.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.kernels import _native
from quanta.kernels.reference.registry import OpError
from quanta.kernels.reference.w4 import dequantize_nbits, matmul_nbits_a8, nbits_codes, quantize_rows_a8
from quanta.targets.native.w4 import nbits_block_params, pack_bytes, pack_nibbles
from tests.lowbit.test_nbits_a8 import _loops

F32 = np.float32


def nbits8_model(k, n, block, *, zp_kind="uint8", bias=True, seed=0, accuracy_level=4, m=(3, 5)):
    """A one-node MatMulNBits bits 8 graph with distinct per-block scales and zero points."""
    rng = np.random.default_rng(seed)
    kb = -(-k // block)
    q = rng.integers(0, 256, (n, kb, block)).astype(np.uint8)
    q.reshape(n, kb * block)[:, k:] = 0
    scales = rng.uniform(0.002, 0.02, n * kb).astype(F32)
    inits = [numpy_helper.from_array(q, "B"), numpy_helper.from_array(scales, "scales")]
    inputs = ["A", "B", "scales"]
    if zp_kind == "uint8":
        inits.append(numpy_helper.from_array(rng.integers(1, 256, n * kb).astype(np.uint8), "zp"))
        inputs.append("zp")
    else:
        inputs.append("")
    if bias:
        inputs += ["", "bias"]
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(F32), "bias"))
    node = helper.make_node(
        "MatMulNBits",
        inputs,
        ["Y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=8,
        block_size=block,
        accuracy_level=accuracy_level,
    )
    graph = helper.make_graph(
        [node],
        "nbits8",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [*m, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [*m, n])],
        inits,
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )


def _operands(model, k, n, block):
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    q, zp, s, integer_zp = nbits_codes(
        inits["B"], inits["scales"], inits.get("zp"), k=k, n=n, block_size=block, bits=8
    )
    return inits, q, zp, s, integer_zp


def test_codes_are_bytes_and_absent_zero_points_are_128():
    model = nbits8_model(40, 3, 16, zp_kind="none", bias=False, seed=4)
    inits, q, zp, _, integer_zp = _operands(model, 40, 3, 16)
    assert integer_zp and q.shape == (3, 48) and zp.tolist() == [[128.0] * 3] * 3
    assert q[:, :40].tolist() == inits["B"].reshape(3, 48)[:, :40].tolist()
    w = dequantize_nbits(inits["B"], inits["scales"], None, k=40, n=3, block_size=16, bits=8)
    # (W1) on one element: block 2 of column 1, k = 37
    code, scale = int(inits["B"][1, 2, 5]), inits["scales"].reshape(3, 3)[1, 2]
    assert w[37, 1] == F32(F32(code - 128) * scale)


def test_zero_points_are_one_a_byte():
    model = nbits8_model(100, 7, 32, seed=5)
    inits, _, zp, _, _ = _operands(model, 100, 7, 32)
    assert zp.tolist() == inits["zp"].reshape(7, 4).astype(F32).tolist()
    with pytest.raises(OpError, match=r"zero_points: expected uint8 \[7, 4\]"):
        nbits_codes(inits["B"], inits["scales"], inits["zp"][:14], k=100, n=7, block_size=32, bits=8)


@pytest.mark.parametrize("bits", [2, 3, 5])
def test_other_bit_widths_are_refused_by_name(bits):
    with pytest.raises(OpError, match=rf"bits: only 4 and 8 are supported, got {bits}"):
        nbits_codes(np.zeros(64, np.uint8), np.ones(4, F32), None, k=32, n=2, block_size=16, bits=bits)


@pytest.mark.parametrize(("m", "k", "n", "block", "bias"), [(1, 100, 17, 32, True), (7, 300, 3, 16, False)])
def test_twin_matches_loops_on_8_bit_codes(m, k, n, block, bias):
    rng = np.random.default_rng(k + n)
    kb = -(-k // block)
    a = (rng.standard_normal((m, k)) * rng.uniform(0.1, 30, (m, 1))).astype(F32)
    q = rng.integers(0, 256, (k, n))
    zp = rng.integers(0, 256, (kb, n))
    s = rng.uniform(0.002, 0.05, (kb, n)).astype(F32)
    b = rng.standard_normal(n).astype(F32) if bias else None
    got = matmul_nbits_a8(a, q, zp, s, block, b)
    np.testing.assert_array_equal(got.view(np.uint32), _loops(a, q, zp, s, block, b).view(np.uint32))


def _ort_bound(model, a, k, n, block):
    """(4·kb + 8)·2^-24 times the magnitudes ONNX Runtime and quanta both round: the same
    codes qa and scales sa, exact integer block dots; each sums its float32 terms in its own
    order (ONNX Runtime: the raw codes' dots, then the zero-point terms through a float
    GEMM of block sums)."""
    inits, q, zp, s, _ = _operands(model, k, n, block)
    qa, sa = quantize_rows_a8(a, block)
    kb = sa.shape[-1]
    qb = q[:, : kb * block].T.reshape(kb, block, n).astype(np.float64)
    mag = np.zeros((*a.shape[:-1], n))
    for b in range(kb):
        c = sa[..., b, None].astype(np.float64) * s[:, b]
        mag += c * (np.abs(qa[..., b, :] @ qb[b]) + np.abs(qa[..., b, :].sum(-1))[..., None] * zp[:, b])
    if "bias" in inits:
        mag += np.abs(inits["bias"])
    return (4 * kb + 8) * 2.0**-24 * mag


@pytest.mark.parametrize(
    ("k", "n", "block", "zp_kind", "m"),
    [
        (100, 17, 32, "uint8", (1, 1)),
        (300, 17, 32, "none", (1, 7)),
        (300, 7, 64, "uint8", (3, 5)),
        (129, 3, 16, "uint8", (2, 3)),
    ],
)
def test_accuracy_level_4_session_is_the_twin_and_ort_within_its_rounding(k, n, block, zp_kind, m):
    model = nbits8_model(k, n, block, zp_kind=zp_kind, bias=zp_kind == "uint8", seed=k + n, m=m)
    blob = model.SerializeToString()
    a = (np.random.default_rng(k).standard_normal((*m, k)) * 3).astype(F32)
    y = quanta.InferenceSession(blob).run(None, {"A": a})[0]
    r = quanta.InferenceSession(blob, backend="reference").run(None, {"A": a})[0]
    np.testing.assert_array_equal(y.view(np.uint32), r.view(np.uint32))
    # the int8 activation codes cost about a code in 254 per block against level 0's float
    level0 = nbits8_model(
        k, n, block, zp_kind=zp_kind, bias=zp_kind == "uint8", seed=k + n, m=m, accuracy_level=0
    )
    f = quanta.InferenceSession(level0.SerializeToString(), backend="reference").run(None, {"A": a})[0]
    assert 0 < np.max(np.abs(y - f)) < 0.02 * np.max(np.abs(f))
    ort = pytest.importorskip("onnxruntime")
    o = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"A": a})[0]
    assert np.all(np.abs(y - o) <= _ort_bound(model, a, k, n, block))
    # ONNX Runtime's level 0 is the float product of (W1)-(W2): within the float GEMM bound
    o0 = ort.InferenceSession(level0.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"A": a}
    )[0]
    assert np.max(np.abs(o0 - f)) <= 2.0**-20 * k * np.max(np.abs(f))


# --------------------------------------------------------------------------------------
# the native kernel (w4/nbits_a8.h with one code a byte) against the twin, bit for bit
# --------------------------------------------------------------------------------------


def test_pack_bytes_layout():
    k, n, block = 37, 35, 16
    q = np.random.default_rng(0).integers(0, 256, (k, n))
    p = pack_bytes(q, block)
    assert p.shape == (2, 3, 4, 128) and p.dtype == np.uint8
    for kk in range(3 * block):
        for col in range(64):
            b, g, t = kk // block, kk % block // 4, kk % 4
            pn, c, h = col // 32, col % 16, col % 32 // 16
            want = q[kk, col] if kk < k and col < n else 0
            assert p[pn, b, g, h * 64 + c * 4 + t] == want


def _native8(a, q, zp, s, block, bias, threads):
    k, n = q.shape
    zpp, sw = nbits_block_params(zp, s, n)
    return _native.nbits_a8_matmul(a, pack_bytes(q, block), zpp, sw, k, n, block, bias, threads, None, 8)


def _all_isas_bit_for_bit(a, q, zp, s, block, bias):
    want = matmul_nbits_a8(a, q, zp, s, block, bias)
    try:
        for isa in _native.supported_isas():
            _native.set_isa(isa)
            for threads in (1, 2):
                got = _native8(a, q, zp, s, block, bias, threads)
                nan = np.isnan(want)
                assert np.array_equal(np.isnan(got), nan), isa
                assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32)), isa
    finally:
        _native.clear_isa()


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 9),
    k=st.integers(1, 420),
    n=st.integers(1, 50),
    block=st.sampled_from([16, 32, 64, 128]),
    bias=st.booleans(),
    special=st.sampled_from(["none", "zero_row", "inf"]),
    seed=st.integers(0, 2**31),
)
def test_native_matches_twin_bit_for_bit(m, k, n, block, bias, special, seed):
    rng = np.random.default_rng(seed)
    kb = -(-k // block)
    a = (rng.standard_normal((m, k)) * rng.uniform(0.1, 30, (m, 1))).astype(F32)
    q = rng.integers(0, 256, (k, n))
    zp = rng.integers(0, 256, (kb, n))
    s = rng.uniform(0.002, 0.05, (kb, n)).astype(F32)
    b = rng.standard_normal(n).astype(F32) if bias else None
    if special == "zero_row":
        a[rng.integers(m)] = 0
    elif special == "inf":
        a[rng.integers(m), rng.integers(k)] = np.inf
    _all_isas_bit_for_bit(a, q, zp, s, block, b)


@pytest.mark.parametrize(("m", "k", "n"), [(1, 300, 17), (3, 4096, 33), (7, 100, 40)])
def test_native_extreme_codes_match_twin(m, k, n):
    # codes 255 against qa ±127 in every pair of a group (what would saturate a whole-byte
    # vpmaddubsw pair on AVX2), zero points 0 and 255, a block of 4096 (|acc| > 2^24)
    block = 4096 if k == 4096 else 32
    kb = -(-k // block)
    rng = np.random.default_rng(k + n)
    a = rng.choice(np.array([-127.0, 127.0], F32), (m, k))
    q = np.full((k, n), 255)
    q[:, 1::2] = rng.integers(0, 256, (k, n // 2))
    zp = rng.choice(np.array([0, 255]), (kb, n))
    s = rng.uniform(0.002, 0.05, (kb, n)).astype(F32)
    _all_isas_bit_for_bit(a, q, zp, s, block, None)


def test_session_runs_8_bit_level_4_natively():
    model = nbits8_model(300, 17, 32, seed=3)
    blob = model.SerializeToString()
    sess = quanta.InferenceSession(blob)
    assert [s.kernel.name for s in sess.plan.steps] == ["native:matmul_nbits_w8a8"]
    a = (np.random.default_rng(4).standard_normal((3, 5, 300)) * 3).astype(F32)
    want = quanta.InferenceSession(blob, backend="reference").run(None, {"A": a})[0]
    np.testing.assert_array_equal(sess.run(None, {"A": a})[0].view(np.uint32), want.view(np.uint32))


def test_native_refuses_other_bit_widths_and_short_weights_by_name():
    a = np.zeros((1, 64), F32)
    q = np.zeros((64, 3), np.int64)
    zpp, sw = nbits_block_params(np.zeros((2, 3), np.int64), np.ones((2, 3), F32), 3)
    with pytest.raises(ValueError, match="nbits_a8_matmul: bits: expected 4 or 8, got 5"):
        _native.nbits_a8_matmul(a, pack_bytes(q, 32), zpp, sw, 64, 3, 32, None, 1, None, 5)
    # a 4-bit packing handed over as 8-bit codes is half the bytes
    with pytest.raises(ValueError, match="nbits_a8_matmul: packed: expected 2048 uint8 values"):
        _native.nbits_a8_matmul(a, pack_nibbles(q, 32), zpp, sw, 64, 3, 32, None, 1, None, 8)
