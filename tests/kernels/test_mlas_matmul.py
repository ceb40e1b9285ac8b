"""quanta::MlasMatMul and quanta::MlasAveragePool (reference/mlas_matmul.py,
reference/mlas_pool.py): ONNX Runtime's float MatMul / FusedMatMul and AveragePool in
MLAS's orders.

Failure signature this guards against: a float MatMul (attention's probabilities · V, a
scaled Q · Kᵀ ORT fuses into FusedMatMul) or a float AveragePool summed in another order
than MLAS's, so a DynamicQuantizeLinear downstream picks another scale or code
(g2pid_tiny.ort_dynamic: 0 of 8 feeds equal to ORT, 0.0021 off).

Tolerance 0 everywhere: the twins are MLAS's schedules operation by operation, ORT runs
that code, and the native kernel (MlasConv's chains) computes each output with the same
float32 operations in the same order."""

from __future__ import annotations

import itertools

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.kernels import native_available
from quanta.kernels.reference.mlas_matmul import mlas_matmul
from quanta.kernels.reference.mlas_pool import mlas_average_pool

F32 = np.float32

# M 1 (MLAS's M = 1 kernel), 5, 97; K 7, 259 (three blocks), 1031; N 1 (N = 1 kernel), 17, 200
SHAPES = [((m, k), (k, n)) for m, k, n in itertools.product((1, 5, 97), (7, 259, 1031), (1, 17, 200))]
BATCHED = [
    ((3, 5, 40, 64), (3, 5, 64, 40)),  # attention scores: 15 GEMMs, one thread each
    ((2, 40, 300), (2, 300, 17)),  # probabilities · V with K = 300 > 258
    ((8, 1, 259), (8, 259, 33)),  # one query row per head: the M = 1 kernel
    ((3, 97, 33), (33, 200)),  # a 2-D B: A's batch folds into M
    ((1, 4, 7, 32), (2, 1, 32, 7)),  # broadcast batch dimensions
]


def _data(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return (rng.standard_normal(shape) * np.exp(rng.uniform(-3, 3, shape))).astype(F32)


def _ort_matmul(a, b, threads, *, alpha=1.0, trans_b=0, fused=False, const_b=False):
    bi = np.ascontiguousarray(np.swapaxes(b, -1, -2)) if trans_b else b
    if fused:
        node = helper.make_node(
            "FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft", alpha=alpha, transB=trans_b
        )
    else:
        node = helper.make_node("MatMul", ["a", "b"], ["y"])
    ins = [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a.shape))]
    inits = [numpy_helper.from_array(bi, "b")] if const_b else []
    if not const_b:
        ins.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, list(bi.shape)))
    g = helper.make_graph(
        [node], "g", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)]
    )
    m.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"a": a} if const_b else {"a": a, "b": bi})[0]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shapes", SHAPES + BATCHED, ids=str)
def test_mlas_matmul_twin_is_onnxruntime(shapes, threads):
    rng = np.random.default_rng(len(str(shapes)) + threads)
    a, b = _data(rng, shapes[0]), _data(rng, shapes[1])
    np.testing.assert_array_equal(mlas_matmul(a, b, threads=threads), _ort_matmul(a, b, threads))
    # FusedMatMul: attention's 1/sqrt(32) folded in (no M = 1 / N = 1 kernels, y = fma(acc, alpha, y))
    alpha = 0.1767766922712326
    want = _ort_matmul(a, b, threads, alpha=alpha, fused=True)
    np.testing.assert_array_equal(mlas_matmul(a, b, alpha=alpha, threads=threads), want)
    if len(shapes[1]) == 2:
        # B read transposed: one row takes MLAS's N = 1 kernel over B's columns
        want = _ort_matmul(a, b, threads, trans_b=1, fused=True)
        np.testing.assert_array_equal(mlas_matmul(a, b, threads=threads, trans_b=True), want)
        # a constant B: ORT packs it at load (slices of 128 columns, K blocks of 256)
        want = _ort_matmul(a, b, threads, const_b=True)
        np.testing.assert_array_equal(mlas_matmul(a, b, threads=threads, packed=True), want)


def test_mlas_matmul_differs_from_one_chain():
    """The K blocks matter: K = 1031 in blocks of 128 is not one FMA chain."""
    rng = np.random.default_rng(3)
    a, b = _data(rng, (5, 1031)), _data(rng, (1031, 200))
    one = np.zeros((5, 200), np.float64)
    assert not np.array_equal(
        mlas_matmul(a, b), np.float32(a.astype(np.float64) @ b.astype(np.float64) + one)
    )


@pytest.mark.skipif(not native_available(), reason="native extension not built")
@pytest.mark.parametrize("shapes", SHAPES + BATCHED, ids=str)
def test_mlas_matmul_native_equals_its_twin_on_every_isa(shapes):
    from quanta.kernels import _native
    from quanta.targets.native.mlas_matmul import _mlas_matmul

    rng = np.random.default_rng(len(str(shapes)))
    a, b = _data(rng, shapes[0]), _data(rng, shapes[1])
    for threads, alpha, trans_b in itertools.product((1, 2), (1.0, 0.1767766922712326), (0, 1)):
        want = mlas_matmul(a, b, alpha=alpha, threads=threads, trans_b=bool(trans_b))
        for isa in _native.supported_isas():
            got = _mlas_matmul(None, a, b, plans={}, isa=isa, alpha=alpha, threads=threads, trans_b=trans_b)
            np.testing.assert_array_equal(got, want, err_msg=f"isa {isa}, {threads} threads, alpha {alpha}")


# (shape, kernel, strides, pads, count_include_pad): the vector kernel (W stride <= 2), the
# generic one (W stride 3, 1-D), the global one (kernel = input), NCHWc (C % 8 = 0)
POOLS = [
    ((1, 480, 3, 80), (3, 2), (3, 2), (0, 0, 0, 0), 0),  # PaddleOCR's pool: NCHWc at ORT's default level
    ((1, 7, 9, 11), (3, 3), (2, 2), (0, 0, 0, 0), 0),
    ((1, 5, 9, 13), (3, 3), (1, 1), (1, 1, 1, 1), 0),  # padding: windows of 4, 6 and 9
    ((1, 5, 9, 13), (3, 3), (1, 1), (1, 1, 1, 1), 1),
    ((1, 16, 9, 13), (3, 3), (1, 1), (1, 1, 1, 1), 0),
    ((1, 3, 8, 17), (2, 5), (3, 3), (0, 2, 1, 2), 0),  # W stride 3: the generic kernel
    ((2, 3, 7, 9), (3, 2), (1, 2), (0, 0, 0, 0), 1),
    ((1, 17, 7, 9), (7, 9), (1, 1), (0, 0, 0, 0), 0),  # the global kernel
    ((2, 7, 259), (5,), (2,), (1, 2), 0),  # 1-D
    # a squeeze-excite mean written as AveragePool, kernel = strides = the input (MediaPipe's
    # selfie segmenter): the generic kernel, strides not 1; NCHWc at the default level for 24
    ((1, 24, 17, 19), (17, 19), (17, 19), (0, 0, 0, 0), 0),
    ((1, 7, 40, 40), (40, 40), (40, 40), (0, 0, 0, 0), 0),  # kernel > 32: generic
    ((1, 3, 37, 41), (9, 7), (3, 5), (2, 1, 3, 2), 0),  # 63 taps, overlapping windows, pads
    ((2, 7, 301), (37,), (5,), (3, 4), 1),  # 1-D, 37 taps
]


@pytest.mark.parametrize("level", ["disable", "all"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", POOLS, ids=str)
def test_mlas_average_pool_twin_is_onnxruntime(case, threads, level):
    shape, k, s, pads, cip = case
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-6, 6, shape))).astype(F32)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Mul", ["r", "x"], ["x2"]),  # many −0: the padding must not change a sign
        helper.make_node(
            "AveragePool",
            ["x2"],
            ["y"],
            kernel_shape=list(k),
            strides=list(s),
            pads=list(pads),
            count_include_pad=cip,
        ),
    ]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))]
    g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    so.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if level == "disable"
        else ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    )
    want = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    x2 = np.multiply(np.maximum(x, 0), x, dtype=F32)
    nchwc = level == "all" and len(k) == 2 and shape[1] % 8 == 0
    got = mlas_average_pool(x2, k, s, pads, cip, nchwc=nchwc)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
