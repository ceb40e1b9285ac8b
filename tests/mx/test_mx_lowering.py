"""MX lowering (quanta/passes/lower/mx.py): MatMul(DQ(QuantizeMX(x)), DQ(MX weight)) ->
quanta::MatMulMX, whose reference is the golden MX GEMM (eqs. (MX5)-(MX6)) and whose native
kernel (the MX GEMM) is bit-exact with it on every ISA and thread count."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import from_proto
from quanta.kernels import _native
from quanta.kernels.reference import mx
from quanta.passes.manager import PassManager
from quanta.passes.pipelines import lower_qdq
from quanta.quantize.mx import quantize_mx_model
from quanta.session import GraphOptimizationLevel, SessionOptions

ISAS: list[str] = list(_native.supported_isas())
# (weight_type, activation_type): each pair the native kernel runs exactly
PAIRS = [
    ("mxint8", "mxint8"),
    ("mxfp8_e4m3", "mxfp8_e4m3"),
    ("mxfp4", "mxfp8_e4m3"),
    ("mxfp8_e4m3", "mxint8"),
]


def _two_matmuls(rng, K: int = 77, n1: int = 5, n2: int = 17) -> onnx.ModelProto:
    """x [2, 3, K] -> MatMul(w1 [K, n1]) and MatMul(w2 [K, n2]) of the same x (one
    QuantizeMX feeds both), K with a short last block."""
    w1 = rng.standard_normal((K, n1)).astype(np.float32)
    w2 = (rng.standard_normal((K, n2)) * np.exp(rng.uniform(-4, 4, (1, n2)))).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["y1"], name="mm1"),
            helper.make_node("MatMul", ["x", "w2"], ["y2"], name="mm2"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, K])],
        [
            helper.make_tensor_value_info("y1", TensorProto.FLOAT, [2, 3, n1]),
            helper.make_tensor_value_info("y2", TensorProto.FLOAT, [2, 3, n2]),
        ],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def _x(rng, K: int = 77) -> np.ndarray:
    x = (rng.standard_normal((2, 3, K)) * np.exp(rng.uniform(-6, 6, (2, 3, 1)))).astype(np.float32)
    x[0, 1, :32] = 0.0  # an all-zero block
    return x


def _golden(x: np.ndarray, w: np.ndarray, wt: str, at: str, mode: str = "ocp") -> np.ndarray:
    we, ws = mx.quantize_mx(w, wt, axis=0, mode=mode)
    xe, xs = mx.quantize_mx(x.reshape(-1, x.shape[-1]), at, axis=-1, mode=mode)
    return mx.mx_gemm(xe, xs, we, ws).reshape((*x.shape[:-1], w.shape[1]))


@pytest.mark.parametrize("wt,at", PAIRS)
def test_lowered_matmul_is_the_golden_mx_gemm(wt, at):
    rng = np.random.default_rng(21)
    src = _two_matmuls(rng)
    q, _ = quantize_mx_model(src, wt, at)
    model = from_proto(q)
    PassManager(lower_qdq(opset=model.opset()), verify=True).run(model)
    ops = sorted(n.op_type for n in model.graph.nodes)
    assert ops == ["MatMulMX", "MatMulMX"], ops
    x = _x(rng)
    w = {t.name: numpy_helper.to_array(t) for t in src.graph.initializer}
    y1, y2 = quanta.InferenceSession(q, backend="reference").run(None, {"x": x})
    assert np.array_equal(y1, _golden(x, w["w1"], wt, at))
    assert np.array_equal(y2, _golden(x, w["w2"], wt, at))
    # the unlowered graph (float MatMul of the dequantized values) differs by rounding only
    so = SessionOptions()
    so.graph_optimization_level = GraphOptimizationLevel.ORT_DISABLE_ALL
    f1, f2 = quanta.InferenceSession(q, so, backend="reference").run(None, {"x": x})
    for a, b in ((y1, f1), (y2, f2)):
        assert np.allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("wt,at", PAIRS)
def test_native_matmul_mx_is_bit_exact_with_its_twin(isa, wt, at):
    rng = np.random.default_rng(22)
    q, _ = quantize_mx_model(_two_matmuls(rng, K=300, n1=7, n2=33), wt, at)
    x = _x(rng, K=300)
    want = quanta.InferenceSession(q, backend="reference").run(None, {"x": x})
    try:
        _native.set_isa(isa)
        for threads in (1, 2):
            so = SessionOptions()
            so.intra_op_num_threads = threads
            s = quanta.InferenceSession(q, so, backend="native")
            assert s.fallbacks == [], s.fallbacks
            got = s.run(None, {"x": x})
            for g, w in zip(got, want):
                assert np.array_equal(g, w), (isa, threads)
    finally:
        _native.clear_isa()


def test_pairs_without_a_native_kernel_run_on_the_twin():
    # MXINT8 weights with MXFP8 activations: lowered, refused by the native binder with
    # a reason, computed by the twin
    rng = np.random.default_rng(25)
    src = _two_matmuls(rng)
    q, _ = quantize_mx_model(src, "mxint8", "mxfp8_e4m3")
    s = quanta.InferenceSession(q, backend="native")
    assert {op for _, op, _ in s.fallbacks} == {"MatMulMX"}
    assert all("MXINT8 weights with f8e4m3fn activations" in why for _, _, why in s.fallbacks)
    x = _x(rng)
    w = numpy_helper.to_array(src.graph.initializer[0])
    assert np.array_equal(s.run(None, {"x": x})[0], _golden(x, w, "mxint8", "mxfp8_e4m3"))


def test_modes_the_native_quantizer_lacks_run_on_the_twin():
    # mode="ceil" (eq. (MX3c)): still lowered, the native binder refuses with a reason and
    # the twin computes the golden of that mode
    rng = np.random.default_rng(23)
    src = _two_matmuls(rng)
    q, _ = quantize_mx_model(src, "mxfp8_e4m3", "mxfp8_e4m3", mode="ceil")
    s = quanta.InferenceSession(q, backend="native")
    assert {(n, op) for n, op, _ in s.fallbacks} == {("mm1", "MatMulMX"), ("mm2", "MatMulMX")}
    assert all("mode='ceil'" in why for _, _, why in s.fallbacks)
    x = _x(rng)
    w = numpy_helper.to_array(src.graph.initializer[0])
    assert np.array_equal(s.run(None, {"x": x})[0], _golden(x, w, "mxfp8_e4m3", "mxfp8_e4m3", "ceil"))


def test_matmul_mx_refuses_bad_shapes_clearly():
    rng = np.random.default_rng(24)
    we, ws = mx.quantize_mx(rng.standard_normal((40, 3)).astype(np.float32), "i8", axis=0)
    with pytest.raises(Exception, match=r"expected x \[\.\.\., K\] and w \[K, N\]"):
        mx.matmul_mx_op(None, np.zeros((2, 39), np.float32), we, mx.dq_scale_codes(ws, "i8"))
    with pytest.raises(Exception, match=r"w_scale: expected shape \[2, 3\]"):
        mx.matmul_mx_op(None, np.zeros((2, 40), np.float32), we, mx.dq_scale_codes(ws, "i8")[:1])


def test_the_rule_knows_every_mx_element_type():
    # passes/lower/mx.py keeps its own list (passes do not import kernels): the golden's
    from quanta.passes.lower import mx as lower_mx

    assert {f.dtype for f in mx.MX_FORMATS.values()} == set(lower_mx._MX_ELEMENT_DTYPES)


def _convnet(rng, C: int = 37, n_out: int = 11) -> onnx.ModelProto:
    """x [2, C, 9, 8] -> Conv C->n_out 3x3 (stride 2, pads 1,0,2,1, bias) and Conv C->7 1x1
    (dilation 1, no bias) on the same x, and a depthwise Conv that stays float."""
    w1 = rng.standard_normal((n_out, C, 3, 3)).astype(np.float32)
    w2 = (rng.standard_normal((7, C, 1, 1)) * np.exp(rng.uniform(-3, 3, (7, 1, 1, 1)))).astype(np.float32)
    dw = rng.standard_normal((C, 1, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["y1"], strides=[2, 2], pads=[1, 0, 2, 1], name="c1"),
        helper.make_node("Conv", ["x", "w2"], ["y2"], name="c2"),
        helper.make_node("Conv", ["x", "dw"], ["y3"], group=C, pads=[1, 1, 1, 1], name="dw"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, C, 9, 8])],
        [
            helper.make_tensor_value_info("y1", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("y2", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("y3", TensorProto.FLOAT, None),
        ],
        [
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(rng.standard_normal(n_out).astype(np.float32), "b1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(dw, "dw"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("wt,at", PAIRS[:3])
def test_lowered_conv_is_the_golden_mx_conv_and_native_matches(wt, at):
    rng = np.random.default_rng(26)
    src = _convnet(rng)
    q, summary = quantize_mx_model(src, wt, at)
    assert summary.quantized == ["c1", "c2"]
    model = from_proto(q)
    PassManager(lower_qdq(opset=model.opset()), verify=True).run(model)
    assert sorted(n.op_type for n in model.graph.nodes) == ["Conv", "ConvMX", "ConvMX"]
    x = (rng.standard_normal((2, 37, 9, 8)) * np.exp(rng.uniform(-5, 5, (2, 1, 9, 8)))).astype(np.float32)
    w = {t.name: numpy_helper.to_array(t) for t in src.graph.initializer}
    xe, xs = mx.quantize_mx(x, at, axis=1)
    we1, ws1 = mx.quantize_mx(w["w1"], wt, axis=1)
    we2, ws2 = mx.quantize_mx(w["w2"], wt, axis=1)
    want1 = mx.mx_conv(xe, xs, we1, ws1, bias=w["b1"], pads=(1, 0, 2, 1), strides=(2, 2))
    want2 = mx.mx_conv(xe, xs, we2, ws2)
    ref = quanta.InferenceSession(q, backend="reference").run(None, {"x": x})
    assert np.array_equal(ref[0], want1) and np.array_equal(ref[1], want2)
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            so = SessionOptions()
            so.intra_op_num_threads = 2
            s = quanta.InferenceSession(q, so, backend="native")
            assert not [f for f in s.fallbacks if f[1] == "ConvMX"], s.fallbacks
            got = s.run(None, {"x": x})
            assert np.array_equal(got[0], want1) and np.array_equal(got[1], want2), isa
            assert np.array_equal(got[2], ref[2]) or np.allclose(got[2], ref[2], rtol=1e-5, atol=1e-4)
    finally:
        _native.clear_isa()


def test_conv_mx_refuses_bad_shapes_clearly():
    rng = np.random.default_rng(27)
    we, ws = mx.quantize_mx(rng.standard_normal((4, 5, 3, 3)).astype(np.float32), "i8", axis=1)
    with pytest.raises(Exception, match=r"expected x \[N, C, H, W\] and w \[O, C, kh, kw\]"):
        mx.conv_mx_op(None, np.zeros((1, 6, 5, 5), np.float32), we, mx.dq_scale_codes(ws, "i8"))
    with pytest.raises(Exception, match=r"w_scale: expected shape \[4, 1, 3, 3\]"):
        mx.conv_mx_op(None, np.zeros((1, 5, 5, 5), np.float32), we, mx.dq_scale_codes(ws, "i8")[:, :, :1])
