"""4-bit weights per block: com.microsoft MatMulNBits (reference/w4.py, targets/native/w4.py)
and DequantizeLinear-21 int4 ``block_size`` files.

Bounds, derived: the dequantized weights are the same float32 values in the twin and the
native kernel (eq. (W1) is one rounding per element, computed by the same NumPy code), so
the two differ only in the float32 GEMM's summation order: eq. (FG1) of docs/float-ops.md,
``|y − y64| ≤ γ_K · Σ_k |a_k·w_k|`` with ``γ_K = K·u / (1 − K·u)``, ``u = 2^-24``, checked
against float64 for both. ONNX Runtime (accuracy_level 0) sums in float32 too: the same
bound against float64.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.kernels.reference.registry import OpError
from quanta.kernels.reference.w4 import dequantize_nbits, unpack_nibbles

F32 = np.float32
U = 2.0**-24


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    q = np.asarray(q, np.uint8)
    if q.shape[-1] % 2:
        q = np.concatenate([q, np.zeros((*q.shape[:-1], 1), np.uint8)], axis=-1)
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def _nbits_model(k, n, block, *, zp_kind="uint8", bias=True, seed=0, accuracy_level=0):
    rng = np.random.default_rng(seed)
    kb = -(-k // block)
    q = rng.integers(0, 16, (n, kb * block)).astype(np.uint8)
    b = _pack_nibbles(q).reshape(n, kb, block // 2)
    scales = rng.uniform(0.01, 0.05, n * kb).astype(F32)
    inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(scales, "scales")]
    inputs = ["A", "B", "scales"]
    if zp_kind == "uint8":
        zq = rng.integers(0, 16, (n, kb)).astype(np.uint8)
        inits.append(numpy_helper.from_array(_pack_nibbles(zq).reshape(-1), "zp"))
        inputs.append("zp")
    elif zp_kind == "float":
        inits.append(numpy_helper.from_array(rng.uniform(0, 15, n * kb).astype(F32), "zp"))
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
        bits=4,
        block_size=block,
        accuracy_level=accuracy_level,
    )
    graph = helper.make_graph(
        [node],
        "nbits",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [3, 5, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 5, n])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    return model


def _float64_reference(model, a):
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    node = model.graph.node[0]
    attrs = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    zp = inits.get(node.input[3]) if len(node.input) > 3 and node.input[3] else None
    w = dequantize_nbits(
        inits["B"], inits["scales"], zp, k=attrs["K"], n=attrs["N"], block_size=attrs["block_size"]
    )
    y = a.astype(np.float64) @ w.astype(np.float64)
    mag = np.abs(a.astype(np.float64)) @ np.abs(w.astype(np.float64))
    if "bias" in inits:
        y += inits["bias"].astype(np.float64)
        mag += np.abs(inits["bias"].astype(np.float64))
    k = attrs["K"] + 1
    return y, mag * (k * U / (1 - k * U))


def test_unpack_is_low_nibble_first_and_dequantize_follows_w1():
    assert unpack_nibbles(np.array([0xF0, 0x1E], np.uint8), 4).tolist() == [0, 15, 14, 1]
    b = _pack_nibbles(np.arange(16, dtype=np.uint8)[None]).reshape(1, 1, 8)
    w = dequantize_nbits(b, np.array([0.5], F32), None, k=16, n=1, block_size=16)
    assert w[:, 0].tolist() == [(i - 8) * 0.5 for i in range(16)]  # default zero point 8


@pytest.mark.parametrize(
    ("k", "block", "zp_kind"), [(64, 32, "uint8"), (300, 64, "float"), (129, 128, "none"), (777, 32, "uint8")]
)
def test_matmul_nbits_native_reference_and_ort_within_the_float_bound(k, block, zp_kind):
    n = 17
    model = _nbits_model(k, n, block, zp_kind=zp_kind, bias=zp_kind != "none", seed=k)
    blob = model.SerializeToString()
    a = np.random.default_rng(1).standard_normal((3, 5, k)).astype(F32)
    sess = quanta.InferenceSession(blob)
    assert [s.kernel.name for s in sess.plan.steps] == ["native:matmul_nbits_w4_f32"]
    y = sess.run(None, {"A": a})[0]
    r = quanta.InferenceSession(blob, backend="reference").run(None, {"A": a})[0]
    y64, bound = _float64_reference(model, a)
    assert np.all(np.abs(y - y64) <= bound) and np.all(np.abs(r - y64) <= bound)
    ort = pytest.importorskip("onnxruntime")
    o = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"A": a})[0]
    assert np.all(np.abs(o - y64) <= bound)


def test_matmul_nbits_threads_give_identical_results():
    model = _nbits_model(300, 40, 32, seed=3)
    a = np.random.default_rng(2).standard_normal((3, 5, 300)).astype(F32)
    outs = []
    for t in (1, 2):
        opts = quanta.SessionOptions()
        opts.intra_op_num_threads = t
        outs.append(quanta.InferenceSession(model.SerializeToString(), opts).run(None, {"A": a})[0])
    np.testing.assert_array_equal(outs[0], outs[1])


def test_matmul_nbits_refuses_bad_files_with_the_attribute_named():
    with pytest.raises(OpError, match="bits: only 4 and 8 are supported, got 3"):
        dequantize_nbits(
            np.zeros((1, 1, 12), np.uint8), np.ones(1, F32), None, k=32, n=1, block_size=32, bits=3
        )
    with pytest.raises(OpError, match=r"B: expected uint8 \[2, 1, 16\]"):
        dequantize_nbits(np.zeros((1, 1, 16), np.uint8), np.ones(2, F32), None, k=32, n=2, block_size=32)
    with pytest.raises(OpError, match="block_size: expected a power of 2 >= 16, got 24"):
        dequantize_nbits(np.zeros((1, 1, 12), np.uint8), np.ones(1, F32), None, k=24, n=1, block_size=24)
