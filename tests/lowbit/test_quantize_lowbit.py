"""Quantizer options for the low-bit fallbacks: ``activation_type`` / ``weight_type`` int16 /
uint16 (and int4, per block) in quantize_static, recipes and per-tensor overrides; the
files run in ONNX Runtime, and quanta lowers them to its 16-bit / W4A8 kernels.

Tolerances, derived: ONNX Runtime runs the QDQ file as float DQ -> op -> Q; quanta's
lowered integer ops round the same real values once (tests/passes/lower/
test_qdq_to_qlinear.py), so each quantized tensor differs by at most one step, which
grows through the layers by at most the float layers' gain; the checks use a few output
steps and state which.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.quantize.recipe import Recipe
from tests.ir import models

F32 = np.float32


def _cnn_feeds(n=6, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((2, 3, 8, 6)).astype(F32)} for _ in range(n)]


def _storage_of_q(path) -> dict[str, int]:
    m = onnx.load(path)
    inits = {i.name: i for i in m.graph.initializer}
    out = {}
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear" and len(n.input) > 2 and n.input[2] in inits:
            out[n.output[0]] = inits[n.input[2]].data_type
    return out


@pytest.mark.parametrize("act", ["uint16", "int16"])
def test_sixteen_bit_activations_run_in_ort_and_lower_to_the_a16w8_kernels(tmp_path, act):
    src, out = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(models.float_cnn(), src)
    # 16-bit weights too (two byte planes in the kernel): then the error is the activations'
    quanta.quantize_static(src, out, _cnn_feeds(), verbose=False, activation_type=act, weight_type="int16")
    want = TensorProto.UINT16 if act == "uint16" else TensorProto.INT16
    assert want in set(_storage_of_q(out).values())
    feed = _cnn_feeds()[2]  # inside the calibrated ranges: the error is quantization noise only
    ort = pytest.importorskip("onnxruntime")
    o = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    sess = quanta.InferenceSession(str(out))
    ops = {s.node.op_type for s in sess.plan.steps}
    assert "QLinearConv16" in ops and "Conv" not in ops, ops
    assert not [f for f in sess.fallbacks if "16" in str(f)]
    y = sess.run(None, feed)[0]
    # the integer steps are the twins' bytes: the 16-bit codes the Gemm reads, exposed as a
    # second output, are equal; the float Gemm at the end keeps the GEMM family's error
    # bound (docs/float-ops.md (FG1)), its twin being NumPy's BLAS, whose summation order
    # is the CPU's (an ulp apart on AVX-512 OpenBLAS kernels)
    probe = onnx.load(out)
    codes = [n.output[0] for n in probe.graph.node if n.op_type == "QuantizeLinear"][-1]
    probe.graph.output.append(onnx.ValueInfoProto(name=codes))
    native_codes = quanta.InferenceSession(probe.SerializeToString()).run([codes], feed)[0]
    ref_codes = quanta.InferenceSession(probe.SerializeToString(), backend="reference").run([codes], feed)[0]
    assert native_codes.dtype == np.dtype(act) and np.unique(native_codes).size > 16  # codes, not a constant
    np.testing.assert_array_equal(native_codes, ref_codes)
    ref = quanta.InferenceSession(str(out), backend="reference").run(None, feed)[0]
    np.testing.assert_allclose(y, ref, rtol=4e-6, atol=1e-6)
    f = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    # 16 bits: the error against the float model is far below 8-bit's
    err16 = float(np.max(np.abs(y - f)))
    q8 = tmp_path / "q8.onnx"
    quanta.quantize_static(src, q8, _cnn_feeds(), verbose=False)
    err8 = float(np.max(np.abs(quanta.InferenceSession(str(q8)).run(None, feed)[0] - f)))
    assert err16 < err8 / 50, (err16, err8)  # measured: 7.9e-5 against 0.022
    assert float(np.max(np.abs(y - o))) <= 4 * err16 + 1e-4


def test_per_tensor_override_makes_one_activation_sixteen_bit(tmp_path):
    src, out = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(models.float_cnn(), src)
    quanta.quantize_static(src, out, _cnn_feeds(), verbose=False, overrides={"x": {"dtype": "uint16"}})
    st = _storage_of_q(out)
    assert list(st.values()).count(TensorProto.UINT16) == 1  # x only
    assert TensorProto.UINT8 in st.values()  # the others keep the recipe's uint8
    feed = _cnn_feeds(1, seed=3)[0]
    ort = pytest.importorskip("onnxruntime")
    o = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    sess = quanta.InferenceSession(str(out))
    assert "QLinearConv16" in {s.node.op_type for s in sess.plan.steps}
    y = sess.run(None, feed)[0]
    assert np.max(np.abs(y - o)) < 0.1


def test_recipe_round_trips_the_sixteen_bit_types():
    r = Recipe(activation_type="int16", weight_type="int16", overrides={"t": {"dtype": "uint16"}})
    assert Recipe.from_dict(r.to_dict()) == r
    assert str(r.activation_storage) == "i16" and str(r.weight_storage) == "i16"


def _mlp(k=96, n=40, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(F32) * 0.1
    w2 = rng.standard_normal((n, 10)).astype(F32) * 0.1
    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["y"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 10])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w2, "w2")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def test_int4_weights_lower_to_w4a8_and_run_in_ort(tmp_path):
    src, out = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(_mlp(), src)
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((4, 96)).astype(F32)} for _ in range(6)]
    quanta.quantize_static(src, out, feeds, verbose=False, weight_type="int4", weight_block_size=32)
    feed = {"x": rng.standard_normal((4, 96)).astype(F32)}
    sess = quanta.InferenceSession(str(out))
    names = [s.kernel.name for s in sess.plan.steps if s.node.op_type == "MatMulW4A8"]
    assert len(names) == 2 and all(n.startswith("native:matmul_w4a8") for n in names), names
    y = sess.run(None, feed)[0]
    np.testing.assert_array_equal(
        y, quanta.InferenceSession(str(out), backend="reference").run(None, feed)[0]
    )
    ort = pytest.importorskip("onnxruntime")
    o = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    # one step of the hidden activation (uint8) through |w2| column sums, plus float rounding
    assert np.max(np.abs(y - o)) < 0.05 * max(1.0, float(np.max(np.abs(o))))
