"""quanta::MlasConv (reference/mlas_conv.py, mlas_conv/mlas_conv.h): ONNX Runtime's float
Conv in MLAS's order.

Failure signature this guards against: a float Conv that ORT leaves unfused between a
DequantizeLinear and a QuantizeLinear summed in another order than MLAS's, so codes differ
by 1 on 1e-6..2e-4 of a group's outputs and grow downstream (nudenet_320n's per-channel
file: 16 output steps).

Tolerance 0 everywhere: the twin is MLAS's schedule operation by operation (FMA chains,
K blocks, the M = 1 and N = 1 kernels), ORT runs that same code, and the native kernel
computes each output with the same float32 operations in the same order. ORT runs at
ORT_ENABLE_EXTENDED so that its NCHWc rewrite (constant float weights only; a QDQ file's
Conv reads a DequantizeLinear) does not replace the MLAS Conv."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.kernels import native_available
from quanta.kernels.reference.mlas_conv import CHAINS, DOT, M1, mlas_conv, mlas_conv_plan, stride_k

# (C, H, W, M, k, stride, pad, group, dilation), with why
CASES = [
    (32, 20, 20, 32, 3, 1, 1, 1, 1),  # K = 288 > 258: three K blocks of 128, two thread segments
    (64, 10, 10, 64, 3, 1, 1, 1, 1),  # N < K: the K block grows to 256, a 64 + 36 segment split
    (17, 13, 11, 7, 3, 2, 1, 1, 1),  # odd channels, stride 2
    (3, 33, 35, 16, 3, 2, 1, 1, 1),  # 3 channels: K = 27, one block
    (300, 5, 5, 20, 1, 1, 0, 1, 1),  # pointwise, K = 300 over 25 pixels
    (7, 6, 6, 100, 3, 1, 1, 1, 1),  # F > N: im2col then one GEMM, rows split over threads
    (17, 15, 15, 17, 3, 1, 1, 17, 1),  # depthwise: MLAS's M = 1 kernel per group
    (21, 9, 9, 21, 5, 2, 2, 21, 1),  # depthwise 5x5 stride 2
    (12, 10, 10, 18, 3, 1, 1, 3, 1),  # grouped
    (260, 7, 9, 33, 3, 1, 1, 1, 2),  # dilation 2, K = 2340
    (8, 30, 30, 1, 3, 1, 1, 1, 1),  # one filter: M = 1 kernel
    (480, 1, 1, 120, 1, 1, 0, 1, 1),  # one pixel: MLAS's N = 1 kernel, rows in blocks of 4
    (37, 1, 1, 7, 1, 1, 0, 1, 1),  # N = 1 with 7 rows: 4, then a pair, then a single
    (9, 3, 3, 3, 3, 1, 0, 1, 1),  # 3 filters over one pixel: rows split 2 + 1 at 2 threads
]


def _case(c, h, w, m, k, g, rng):
    x = (rng.integers(-128, 128, (1, c, h, w)) * 0.0213).astype(np.float32)
    wq = rng.integers(-127, 128, (m, c // g, k, k))
    wt = (wq * rng.uniform(0.001, 0.01, (m, 1, 1, 1))).astype(np.float32)
    b = rng.normal(size=m).astype(np.float32)
    return x, wt, b


def _ort(x, w, b, attrs, threads):
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
def test_mlas_conv_twin_equals_onnxruntime_bit_for_bit(case, threads):
    c, h, w, m, k, s, p, g, d = case
    x, wt, b = _case(c, h, w, m, k, g, np.random.default_rng(c * 31 + m))
    attrs = dict(pads=[p] * 4, strides=[s, s], group=g, dilations=[d, d])
    want = _ort(x, wt, b, attrs, threads)
    got = mlas_conv(x, wt, b, strides=(s, s), dilations=(d, d), pads=(p,) * 4, group=g, threads=threads)
    assert got is not None
    bad = np.argwhere(got != want)
    assert bad.size == 0, (
        f"{len(bad)} of {want.size} differ, first {bad[0]}: {got[tuple(bad[0])]} vs {want[tuple(bad[0])]}"
    )


@pytest.mark.skipif(not native_available(), reason="the native extension is not built")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
def test_mlas_conv_native_equals_its_twin_on_every_isa(case, threads):
    from quanta.kernels import _native
    from quanta.targets.native.mlas_conv import _plan

    c, h, w, m, k, s, p, g, d = case
    x, wt, b = _case(c, h, w, m, k, g, np.random.default_rng(c * 37 + m))
    attrs = dict(pads=[p] * 4, strides=[s, s], group=g, dilations=[d, d], threads=threads)
    want = mlas_conv(x, wt, b, strides=(s, s), dilations=(d, d), pads=(p,) * 4, group=g, threads=threads)
    parts, st, dl, pd, gr = _plan(x.shape, wt.shape, attrs)
    for isa in _native.supported_isas():
        for nt in (1, 2, 3):
            got = _native.mlas_conv_f32(
                x, wt, b, list(st), list(dl), list(pd), gr, parts, num_threads=nt, isa=isa
            )
            np.testing.assert_array_equal(got, want, err_msg=f"isa {isa}, {nt} kernel threads")


def test_mlas_schedule_blocks_and_kernels():
    """The K block follows the columns a call sees (MlasSgemmOperation's strides), and the
    one-row and one-pixel calls take MLAS's M = 1 and N = 1 kernels."""
    assert stride_k(1600, 288) == (128, 128)  # N >= K: blocks of 128
    assert stride_k(50, 300) == (64, 256)  # N < K: StrideK doubles while StrideN / 2 >= N
    assert stride_k(16, 2000) == (16, 1024)
    plan = mlas_conv_plan(64, 576, 100, pointwise=False, spans_input=False, many=False, threads=2)
    assert plan == [(0, 64, 0, 64, 256, CHAINS), (0, 64, 64, 36, 256, CHAINS)]
    assert mlas_conv_plan(1, 9, 400, pointwise=False, spans_input=False, many=True, threads=2)[0][5] == M1
    assert mlas_conv_plan(120, 480, 1, pointwise=True, spans_input=False, many=False, threads=2) == [
        (0, 120, 0, 1, 480, DOT)
    ]
    assert mlas_conv_plan(4, 9, 3, pointwise=False, spans_input=True, many=False, threads=1) is None
