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
    (40, 30, 30, 1, 3, 1, 1, 1, 1),  # one filter, K = 360: the M = 1 kernel over K blocks 128 + 128 + 104
    (19, 17, 23, 29, 3, 1, 1, 1, 1),  # K = 171 > 128: the second block is 43 rows; 29 rows = 4 tiles + 5
    (
        64,
        13,
        11,
        1,
        1,
        1,
        0,
        1,
        1,
    ),  # pointwise, one filter (yunet's heads): M = 1 on the input planes in place
    (7, 9, 13, 1, 1, 1, 0, 1, 1),  # the same with K = 7: a group of four, a pair, a single; 117 columns
    (300, 7, 9, 1, 1, 1, 0, 1, 1),  # the same with K = 300
    (7, 13, 11, 7, 3, 1, 1, 7, 1),  # depthwise, K = 9 (two fours and a single), 143 columns: 17 vectors + 7
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


def _native_call(x, wt, attrs):
    from quanta.targets.native.mlas_conv import _call

    s, parts = _call(x.shape, wt.shape, attrs)
    return s, parts, (list(s.strides), list(s.dilations), list(s.pads), s.group)


@pytest.mark.skipif(not native_available(), reason="the native extension is not built")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
def test_mlas_conv_native_equals_its_twin_on_every_isa(case, threads):
    from quanta.kernels import _native

    c, h, w, m, k, s, p, g, d = case
    x, wt, b = _case(c, h, w, m, k, g, np.random.default_rng(c * 37 + m))
    attrs = dict(pads=[p] * 4, strides=[s, s], group=g, dilations=[d, d], threads=threads)
    want = mlas_conv(x, wt, b, strides=(s, s), dilations=(d, d), pads=(p,) * 4, group=g, threads=threads)
    _, parts, geometry = _native_call(x, wt, attrs)
    for isa in _native.supported_isas():
        for nt in (1, 2, 3):
            got = _native.mlas_conv_f32(x, wt, b, *geometry, parts, num_threads=nt, isa=isa)
            np.testing.assert_array_equal(got, want, err_msg=f"isa {isa}, {nt} kernel threads")
            out = np.full_like(want, np.nan)
            assert _native.mlas_conv_f32(x, wt, b, *geometry, parts, nt, out, isa) is out
            np.testing.assert_array_equal(out, want, err_msg=f"out=, isa {isa}, {nt} kernel threads")


# (x shape, w shape, attributes): a 2-D Conv with uneven pads and strides, K = 171 (two K
# blocks); a grouped 1-D Conv over a batch of 2 (MLAS's unit-height 2-D form)
SESSION_CASES = [
    ((1, 19, 17, 23), (29, 19, 3, 3), dict(pads=[1, 2, 0, 1], strides=[1, 2], dilations=[1, 1], group=1)),
    ((2, 12, 41), (18, 4, 3), dict(pads=[2, 1], strides=[2], dilations=[1], group=3)),
]


def _session_case(x_shape, w_shape, attrs, threads, rng):
    x = (rng.integers(-128, 128, x_shape) * 0.0213).astype(np.float32)
    wt = (rng.integers(-127, 128, w_shape) * 0.0037).astype(np.float32)
    b = rng.normal(size=w_shape[0]).astype(np.float32)
    want = mlas_conv(
        x,
        wt,
        b,
        strides=attrs["strides"],
        dilations=attrs["dilations"],
        pads=attrs["pads"],
        group=attrs["group"],
        threads=threads,
    )
    return x, wt, b, want


@pytest.mark.skipif(not native_available(), reason="the native extension is not built")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", SESSION_CASES, ids=["2d", "1d_grouped"])
def test_mlas_conv_session_runs_give_the_twins_bytes(case, threads):
    """Through the runtime: weights packed at bind time, the per-signature call into the
    arena (a Relu after it keeps the MlasConv's output inside the plan), recorded into a
    native program after the first run: every run gives the twin's bytes."""
    import quanta

    x_shape, w_shape, attrs = case
    x, wt, b, want = _session_case(x_shape, w_shape, attrs, threads, np.random.default_rng(5 + threads))
    node = helper.make_node("MlasConv", ["x", "w", "b"], ["y"], domain="quanta", threads=threads, **attrs)
    g = helper.make_graph(
        [node, helper.make_node("Relu", ["y"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(wt, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("quanta", 1)]
    )
    so = quanta.SessionOptions()
    so.intra_op_num_threads = threads
    session = quanta.InferenceSession(model.SerializeToString(), so)
    step = next(s for s in session.plan.steps if s.op_type == "MlasConv")
    assert step.kernel.params["packed"].flags.c_contiguous  # the driver's layout, made once
    for run in range(3):
        np.testing.assert_array_equal(
            session.run(None, {"x": x})[0], np.maximum(want, 0), err_msg=f"run {run}"
        )


@pytest.mark.skipif(not native_available(), reason="the native extension is not built")
@pytest.mark.parametrize("case", SESSION_CASES, ids=["2d", "1d_grouped"])
def test_mlas_conv_generic_call_gives_the_twins_bytes(case):
    """The generic kernel (a signature the specialization does not take), with run-time
    weights and a non-contiguous x, keeps each shape's geometry and parts."""
    from quanta.targets.base import KernelContext
    from quanta.targets.native.mlas_conv import _mlas_conv

    x_shape, w_shape, attrs = case
    x, wt, b, want = _session_case(x_shape, w_shape, attrs, 2, np.random.default_rng(11))
    calls: dict = {}
    strided = np.repeat(x, 2, axis=-1)[..., ::2]
    got = _mlas_conv(KernelContext(num_threads=2), strided, wt, b, calls=calls, threads=2, **attrs)
    np.testing.assert_array_equal(got, want)
    assert x.shape in calls


@pytest.mark.skipif(not native_available(), reason="the native extension is not built")
def test_mlas_conv_binding_refuses_overlapping_parts_and_negative_pads():
    """Failure signature: parts whose areas sum to F·N but overlap leave outputs unwritten
    (uninitialized memory in y); a negative pad reads outside x."""
    from quanta.kernels import _native

    x = np.ones((1, 2, 6, 6), np.float32)
    wt = np.ones((8, 2, 3, 3), np.float32)
    geometry = ([1, 1], [1, 1], [1, 1, 1, 1], 1)
    ok = np.array([[0, 4, 0, 36, 128, 0], [4, 4, 0, 36, 128, 0]], np.int64)
    assert _native.mlas_conv_f32(x, wt, None, *geometry, ok).shape == (1, 8, 6, 6)
    overlap = np.array([[0, 4, 0, 36, 128, 0], [2, 4, 0, 18, 128, 0], [6, 2, 18, 18, 128, 0]], np.int64)
    with pytest.raises(ValueError, match=r"^mlas_conv_f32: parts 0 and 1 overlap$"):
        _native.mlas_conv_f32(x, wt, None, *geometry, overlap)
    with pytest.raises(ValueError, match=r"^mlas_conv_f32: pads must be >= 0, got \(1, -1, 1, 1\)$"):
        _native.mlas_conv_f32(x, wt, None, [1, 1], [1, 1], [1, -1, 1, 1], 1, ok)
    with pytest.raises(
        ValueError, match=r"^mlas_conv_f32: the parts must cover every output of a group once$"
    ):
        _native.mlas_conv_f32(x, wt, None, *geometry, ok[:1])


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
