"""Reference twins that run on NumPy's BLAS (float Conv, MatMul, Gemm, ...) start their
own threads; on the native target the kernel pool's workers rest before them instead of
spinning for the next native kernel (targets/native/__init__.py BLAS_OPS). Resting
changes when the workers sleep, never what a kernel computes."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.kernels import _native
from quanta.targets.native import BLAS_OPS


def float_conv_then_int8_model():
    """A float Conv whose weights are an input (no native float kernel: the kernel packs
    constant weights; its reference twin runs, on BLAS) between two native integer steps."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q_in"),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq_in"),
        helper.make_node("Conv", ["xd", "w"], ["c"], name="float_conv", pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c", "s2", "z2"], ["y"], name="q_out"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 7, 9]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [17, 3, 3, 3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [2, 17, 7, 9])],
        [
            numpy_helper.from_array(np.array(0.02, np.float32), "s"),
            numpy_helper.from_array(np.array(131, np.uint8), "z"),
            numpy_helper.from_array(np.array(0.07, np.float32), "s2"),
            numpy_helper.from_array(np.array(121, np.uint8), "z2"),
        ],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def test_blas_fallback_rests_the_pool_and_keeps_the_bytes():
    m = float_conv_then_int8_model()
    rng = np.random.default_rng(3)
    feeds = {
        "x": rng.standard_normal((2, 3, 7, 9)).astype(np.float32),
        "w": rng.standard_normal((17, 3, 3, 3)).astype(np.float32),
    }
    want = quanta.InferenceSession(m, backend="reference").run(None, feeds)[0]
    for threads in (1, 2):
        opts = quanta.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = quanta.InferenceSession(m, sess_options=opts, backend="native")
        assert [f[1] for f in sess.fallbacks] == ["Conv"]  # the float Conv runs on its twin
        for _ in range(3):  # rest, wake, rest: the same bytes every run
            assert sess.run(None, feeds)[0].tobytes() == want.tobytes(), threads


def test_pool_rest_between_parallel_kernels():
    rng = np.random.default_rng(11)
    w = rng.integers(-128, 128, (300, 67), dtype=np.int8)
    x = rng.integers(0, 256, (129, 300), dtype=np.uint8)
    packed = _native.pack_weights_s8(w, 0)
    one = _native.qgemm(x, packed, 37, "int32", num_threads=1)
    for _ in range(3):
        _native.pool_rest()
        assert _native.qgemm(x, packed, 37, "int32", num_threads=2).tobytes() == one.tobytes()
    _native.pool_rest()
    _native.pool_rest()  # twice in a row: harmless


def test_blas_ops_are_float_compute_ops():
    assert {"Conv", "MatMul", "Gemm"} <= BLAS_OPS
    assert not BLAS_OPS & {"QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger", "Relu", "Add"}
