"""MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv and conv geometry.

- loop twins: the vectorised reference against the loop form written from the formula;
- ONNX Runtime: bit-exact (0 tolerance: integer accumulation, and the float32 eq. (6)
  computed the same way as ORT's MlasRequantizeOutput);
- the ONNX reference implementation: pinned where it differs (float64 product, zero point
  added before rounding);
- the algebra of docs/quantization-math.md, eqs. (5), (8), (9), evaluated.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from quanta.kernels.reference import registry
from quanta.kernels.reference.conv_geometry import conv_attrs, output_spatial, resolve_pads
from quanta.kernels.reference.integer_ops import (
    conv_integer,
    conv_integer_loops,
    matmul_integer,
    matmul_integer_loops,
)
from quanta.kernels.reference.qlinear_conv import qlinear_conv
from quanta.kernels.reference.qlinear_matmul import qlinear_matmul
from quanta.kernels.reference.requant import requant_multiplier, requantize
from tests.ort_int8 import fit_s8

F32 = np.float32
EIGHT_BIT = [np.uint8, np.int8]
# (x, w) type pairs ONNX Runtime's CPU QLinearMatMul/QLinearConv kernels implement.
ORT_PAIRS = [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)]


def _info(dt):
    i = np.iinfo(dt)
    return int(i.min), int(i.max)


def _ort_node(op_type, inputs, out_type, attrs=None, opset=21):
    """Run one ai.onnx node in ONNX Runtime (graph optimizations off). ``inputs`` is a
    list of arrays or None (omitted optional input)."""
    names, feeds, infos = [], {}, []
    for i, v in enumerate(inputs):
        if v is None:
            names.append("")
            continue
        name = f"in{i}"
        names.append(name)
        feeds[name] = np.asarray(v)
        infos.append(
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(feeds[name].dtype), None)
        )
    node = helper.make_node(op_type, names, ["out"], **(attrs or {}))
    out = helper.make_tensor_value_info("out", helper.np_dtype_to_tensor_dtype(np.dtype(out_type)), None)
    model = helper.make_model(
        helper.make_graph([node], "g", infos, [out]), opset_imports=[helper.make_opsetid("", opset)]
    )
    model.ir_version = 10
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0], model, feeds


def _output_params(real: np.ndarray, dtype) -> tuple[np.float32, np.ndarray]:
    """sy, zy covering the actual real-valued output range (XNNPACK habit), 0 included."""
    qmin, qmax = _info(dtype)
    lo, hi = min(float(real.min()), 0.0), max(float(real.max()), 0.0)
    sy = F32((hi - lo) / (qmax - qmin)) if hi > lo else F32(1.0)
    zy = int(np.clip(qmin - np.rint(lo / sy), qmin, qmax))
    return sy, np.array(zy, dtype)


# ----------------------------------------------------------------------------- loop twins


@st.composite
def matmul_case(draw):
    m, k, n = draw(st.integers(1, 7)), draw(st.integers(1, 19)), draw(st.integers(1, 7))
    adt, bdt = draw(st.sampled_from(EIGHT_BIT)), draw(st.sampled_from(EIGHT_BIT))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    a = rng.integers(*_info(adt), (m, k), endpoint=True).astype(adt)
    b = rng.integers(*_info(bdt), (k, n), endpoint=True).astype(bdt)
    per_row, per_col = draw(st.booleans()), draw(st.booleans())
    za = rng.integers(*_info(adt), m if per_row else (), endpoint=True).astype(adt)
    zb = rng.integers(*_info(bdt), n if per_col else (), endpoint=True).astype(bdt)
    return a, b, za, zb


@given(matmul_case())
def test_matmul_integer_matches_loop_form(case):
    a, b, za, zb = case
    np.testing.assert_array_equal(matmul_integer(a, b, za, zb), matmul_integer_loops(a, b, za, zb))


@st.composite
def conv_case(draw, ort_supported=False):
    nsp = draw(st.integers(1, 3))
    group = draw(st.sampled_from([1, 2, 3]))
    cg, mg = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    kernel = [draw(st.integers(1, 3)) for _ in range(nsp)]
    dil = [draw(st.integers(1, 2)) for _ in range(nsp)]
    strides = [draw(st.integers(1, 3)) for _ in range(nsp)]
    auto_pad = draw(st.sampled_from(["NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"]))
    pads = [draw(st.integers(0, 2)) for _ in range(2 * nsp)]
    spatial = [
        draw(st.integers(max(1, d * (k - 1) + 1 - pads[i] - pads[i + nsp]), 6))
        for i, (k, d) in enumerate(zip(kernel, dil))
    ]
    if auto_pad.startswith("SAME") and ort_supported:
        dil = [1] * nsp  # ORT: "Dilation not supported for AutoPadType::SAME_UPPER or SAME_LOWER"
    if auto_pad == "VALID":
        spatial = [max(s, d * (k - 1) + 1) for s, k, d in zip(spatial, kernel, dil)]
    if ort_supported:
        xdt, wdt = draw(st.sampled_from(ORT_PAIRS))
    else:
        xdt, wdt = draw(st.sampled_from(EIGHT_BIT)), draw(st.sampled_from(EIGHT_BIT))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    x = rng.integers(*_info(xdt), (draw(st.integers(1, 2)), cg * group, *spatial), endpoint=True).astype(xdt)
    w = rng.integers(*_info(wdt), (mg * group, cg, *kernel), endpoint=True).astype(wdt)
    zx = rng.integers(*_info(xdt), endpoint=True).astype(xdt)
    zw = rng.integers(*_info(wdt), mg * group if draw(st.booleans()) else (), endpoint=True).astype(wdt)
    attrs = {"strides": strides, "dilations": dil, "auto_pad": auto_pad}
    if auto_pad == "NOTSET":
        attrs["pads"] = pads
    return x, w, zx, zw, group, attrs


@given(conv_case())
def test_conv_integer_matches_loop_form(case):
    """1-D/2-D/3-D, groups, strides, dilations, explicit and auto pads, per-channel zw."""
    x, w, zx, zw, group, attrs = case
    geom = conv_attrs(x.shape, w.shape[2:], **attrs)
    expected = conv_integer_loops(x, w, int(zx), zw, geom, group)
    np.testing.assert_array_equal(conv_integer(x, w, zx, zw, group=group, **attrs), expected)


@given(conv_case(ort_supported=True))
def test_conv_integer_matches_onnxruntime_exactly(case):
    x, w, zx, zw, group, attrs = case
    zw = zw.reshape(-1)[:1].reshape(())  # ORT's ConvInteger: per-tensor w_zero_point only
    expected, _, _ = _ort_node("ConvInteger", [x, w, zx, zw], np.int32, {**attrs, "group": group}, opset=10)
    np.testing.assert_array_equal(conv_integer(x, w, zx, zw, group=group, **attrs), expected)


@given(matmul_case())
def test_matmul_integer_matches_onnxruntime_exactly(case):
    a, b, za, zb = case
    za = za.reshape(-1)[:1].reshape(())  # ORT's MatMulInteger: per-tensor a_zero_point only
    if (a.dtype, b.dtype) not in [(np.dtype(p), np.dtype(q)) for p, q in ORT_PAIRS]:
        a = a.view(np.uint8) if a.dtype == np.int8 else a
        za = za.view(np.uint8) if za.dtype == np.int8 else za
    a, b, za, zb = (fit_s8(v) for v in (a, b, za, zb))  # tests/ort_int8.py
    expected, _, _ = _ort_node("MatMulInteger", [a, b, za, zb], np.int32, opset=10)
    np.testing.assert_array_equal(matmul_integer(a, b, za, zb), expected)


def test_conv_integer_pads_with_zero_point_not_zero():
    """Failure signature: padding with quantized 0 instead of zx adds −zx·Σw at borders."""
    x = np.full((1, 1, 3), 7, np.uint8)
    w = np.ones((1, 1, 3), np.uint8)
    got = conv_integer(x, w, np.uint8(7), None, pads=[1, 1])
    np.testing.assert_array_equal(got, [[[0, 0, 0]]])


# ----------------------------------------------------------------------------- hazards


def test_matmul_integer_k_above_258_exact_where_float32_accumulation_rounds():
    """Failure signature: an accumulator kept in float32 past 65025·K ≥ 2^24 (eq. (9)).
    K = 300, 299 products of 255·255 and one of 0: acc = 65025·299 = 19442475, odd and
    > 2^24, so float32 (spacing 2 there) cannot hold it."""
    k = 300
    a = np.full((1, k), 255, np.uint8)
    b = np.full((k, 1), 255, np.uint8)
    a[0, -1] = 0
    acc = int(matmul_integer(a, b)[0, 0])
    assert acc == 65025 * 299
    assert int(np.float32(acc)) != acc
    f32_sum = np.float32(0)
    for v in (a.astype(F32) * b[:, 0].astype(F32))[0]:
        f32_sum = np.float32(f32_sum + v)
    assert int(f32_sum) != acc


def test_matmul_integer_wraps_int32_as_onnx_specifies():
    """acc = 65025·33100 = 2152327500 > 2^31 − 1 wraps to 2152327500 − 2^32."""
    k = 33100
    a = np.full((1, k), 255, np.uint8)
    b = np.full((k, 1), 255, np.uint8)
    np.testing.assert_array_equal(matmul_integer(a, b), [[65025 * k - 2**32]])


def test_matmul_integer_shared_rank2_b_not_copied_per_batch():
    """Failure signature: np.broadcast_to(B, (batch, K, N)).copy() — 64 copies of B as
    int64 would be 64·300·200·8 B = 30.7 MB. Allowed peak: one int64 copy of A (0.6 MB),
    of B (0.5 MB), the output (0.4 MB) and its int32 wrap, with slack: 4 MB."""
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (64, 4, 300)).astype(np.uint8)
    b = rng.integers(-128, 128, (300, 200)).astype(np.int8)
    za = rng.integers(0, 256, (64, 4, 1)).astype(np.uint8)  # per-row, batched
    zb = rng.integers(-128, 128, 200).astype(np.int8)
    tracemalloc.start()
    try:
        got = matmul_integer(a, b, za, zb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, f"peak {peak / 2**20:.1f} MB"
    expected = (a[5].astype(np.int64) - za[5]) @ (b.astype(np.int64) - zb)
    np.testing.assert_array_equal(got[5], expected)


# ----------------------------------------------------------------------------- algebra


@given(matmul_case())
def test_four_term_zero_point_folding_eq5(case):
    """eq. (5): Σ(x−zx)(w−zw) = Σx·w − zx·Σw − zw·Σx + K·zx·zw (per row zx, per column zw)."""
    a, b, za, zb = case
    x, w = a.astype(np.int64), b.astype(np.int64)
    zx = np.broadcast_to(za.astype(np.int64).reshape(-1, 1), (x.shape[0], 1))
    zw = np.broadcast_to(zb.astype(np.int64).reshape(1, -1), (1, w.shape[1]))
    k = x.shape[1]
    folded = x @ w - zx * w.sum(axis=0, keepdims=True) - zw * x.sum(axis=1, keepdims=True) + k * zx * zw
    np.testing.assert_array_equal(matmul_integer(a, b, za, zb), folded)


@given(matmul_case())
def test_u8s8_shift_compensation_eq8(case):
    """eq. (8): int8 x as u8 x' = x + 128 (vpdpbusd takes u8 × s8):
    Σ(x−zx)(w−zw) = Σx'·(w−zw) − (128 + zx)·Σ(w−zw); the last term folds into the
    per-column sums of the (zero-point-shifted) weights."""
    a, b, za, zb = case
    a = (a.astype(np.int16) - 128 * (a.dtype == np.uint8)).astype(np.int8)  # force an int8 x
    za = (za.astype(np.int16) - 128 * (za.dtype == np.uint8)).astype(np.int8)
    x_u8 = (a.astype(np.int16) + 128).astype(np.uint8)
    wz = b.astype(np.int64) - zb.astype(np.int64).reshape(1, -1)
    col = wz.sum(axis=0, keepdims=True)
    zx = za.astype(np.int64).reshape(-1, 1)
    shifted = x_u8.astype(np.int64) @ wz - (128 + zx) * col
    np.testing.assert_array_equal(matmul_integer(a, b, za, zb), shifted)


def test_float_accumulation_bound_eq9():
    """eq. (9): the largest |product| of 8-bit operands after zero-point subtraction is
    255·255 = 65025 (u8 with zp 0 vs u8 with zp 255, or s8 −128·−128 = 16384 < 65025), and
    K·65025 < 2^24 ⇔ K ≤ 258."""
    assert 65025 * 258 < 2**24 <= 65025 * 259
    assert max(abs(a * b) for a in (-255, 255) for b in (-255, 255)) == 65025


# ----------------------------------------------------------------------------- QLinearMatMul


@st.composite
def qlinear_matmul_case(draw):
    adt, bdt = draw(st.sampled_from(ORT_PAIRS))
    batch = draw(st.sampled_from([(), (2,), (3, 1)]))
    b_batch = draw(st.sampled_from([(), (1,)])) if batch else ()
    m, n = draw(st.integers(1, 9)), draw(st.sampled_from([1, 3, 7, 17]))
    k = draw(st.sampled_from([1, 5, 16, 33, 259, 300]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    a = rng.integers(*_info(adt), (*batch, m, k), endpoint=True).astype(adt)
    b = rng.integers(*_info(bdt), (*b_batch, k, n), endpoint=True).astype(bdt)
    za = rng.integers(*_info(adt), endpoint=True).astype(adt)
    per_col = draw(st.booleans())
    col_shape = ((*b_batch, 1, n) if b_batch else (n,)) if per_col else ()  # ORT: [N] or [..., 1, N]
    zb = rng.integers(*_info(bdt), col_shape, endpoint=True).astype(bdt)
    sa = F32(rng.uniform(0.002, 0.05))
    sb = rng.uniform(0.002, 0.05, col_shape).astype(F32)
    ydt = adt
    real = matmul_integer(a, b, za, zb).astype(np.float64) * float(sa) * np.asarray(sb, np.float64)
    sy, zy = _output_params(real, ydt)
    return a, sa, za, b, sb, zb, sy, zy


@given(qlinear_matmul_case())
def test_qlinear_matmul_matches_onnxruntime_exactly(case):
    """0 tolerance: int32 accumulation and float32 eq. (6), as MlasRequantizeOutput."""
    a, sa, za, b, sb, zb, sy, zy = case
    case = (fit_s8(a), sa, fit_s8(za), fit_s8(b), sb, fit_s8(zb), sy, zy)  # tests/ort_int8.py
    got = qlinear_matmul(*case)
    expected, _, _ = _ort_node("QLinearMatMul", list(case), case[-1].dtype)
    np.testing.assert_array_equal(got, expected)


@given(qlinear_matmul_case())
def test_qlinear_matmul_is_requantized_matmul_integer(case):
    a, sa, za, b, sb, zb, sy, zy = case
    m = requant_multiplier(sa, sb, sy)
    expected = requantize(matmul_integer(a, b, za, zb), m, int(zy), zy.dtype)
    np.testing.assert_array_equal(qlinear_matmul(*case), expected)


def test_qlinear_matmul_per_row_a_scale():
    """QLinearMatMul-21: per-row a (``[M]``) and per-column b (``[N]``) at once."""
    a = np.array([[10, 20], [30, 40], [50, 60]], np.uint8)
    b = np.array([[1, 2], [3, 4]], np.uint8)
    sa = np.array([0.5, 0.25, 0.125], F32)
    za = np.array([10, 30, 50], np.uint8)
    sb = np.array([1.0, 2.0], F32)
    zb = np.array([1, 2], np.uint8)
    got = qlinear_matmul(a, sa, za, b, sb, zb, F32(1.0), np.uint8(100))
    acc = (a.astype(int) - za[:, None]) @ (b.astype(int) - zb)  # [[20, 20]] * 3
    expected = np.rint(acc * sa[:, None] * sb) + 100
    np.testing.assert_array_equal(got, expected)


def _qlmm_model():
    names = ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"]
    types = [TensorProto.UINT8, TensorProto.FLOAT, TensorProto.UINT8] * 2 + [
        TensorProto.FLOAT,
        TensorProto.UINT8,
    ]
    node = helper.make_node("QLinearMatMul", names, ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, t, None) for n, t in zip(names, types)],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model, names


def test_qlinear_matmul_odd_zero_point_tie_onnx_reference_differs():
    """Where the ONNX reference implementation differs: it computes rint(acc·m + zy).
    acc·m = 2.5, zy = 3: spec and ORT give rint(2.5) + 3 = 5; onnx.reference gives
    rint(5.5) = 6. quanta follows the spec."""
    model, names = _qlmm_model()
    vals = [
        np.array([[5]], np.uint8),
        F32(0.5),
        np.uint8(0),
        np.array([[1]], np.uint8),
        F32(1),
        np.uint8(0),
        F32(1),
        np.uint8(3),
    ]
    feeds = {n: np.asarray(v) for n, v in zip(names, vals)}
    assert qlinear_matmul(*vals)[0, 0] == 5
    assert ReferenceEvaluator(model).run(None, feeds)[0][0, 0] == 6
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert (
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
            None, feeds
        )[0][0, 0]
        == 5
    )


def test_qlinear_matmul_float64_product_onnx_reference_differs():
    """Where the ONNX reference implementation differs: int32 · float32 0-d array is
    float64 under NumPy 2. acc = 3·103·103 = 31827, m = 0.0031262764: float32 product 99.5
    -> 100 (quanta, ORT), float64 99.49999975 -> 99 (onnx.reference); zy = 100 (even, so
    the zero-point order plays no part)."""
    model, names = _qlmm_model()
    a = np.full((1, 3), 103, np.uint8)
    b = np.full((3, 1), 103, np.uint8)
    vals = [a, F32(0.0031262764), np.uint8(0), b, F32(1), np.uint8(0), F32(1), np.uint8(100)]
    feeds = {n: np.asarray(v) for n, v in zip(names, vals)}
    assert qlinear_matmul(*vals)[0, 0] == 200
    assert ReferenceEvaluator(model).run(None, feeds)[0][0, 0] == 199
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert (
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
            None, feeds
        )[0][0, 0]
        == 200
    )


def test_qlinear_matmul_op_rejects_float8():
    import ml_dtypes

    a = np.zeros((2, 2), ml_dtypes.float8_e4m3fn)
    with pytest.raises(
        registry.OpError,
        match=r"a: expected int8 or uint8 \(float8 QLinearMatMul is not implemented\), got float8_e4m3fn",
    ):
        registry.get_op("QLinearMatMul")(
            registry.OpContext(), a, F32(1), a[0, 0], a, F32(1), a[0, 0], F32(1), a[0, 0]
        )


# ----------------------------------------------------------------------------- QLinearConv


@st.composite
def qlinear_conv_case(draw):
    x, w, zx, zw, group, attrs = draw(conv_case(ort_supported=True))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    m_out = w.shape[0]
    per_channel = zw.ndim == 1
    sx = F32(rng.uniform(0.005, 0.05))
    sw = rng.uniform(0.005, 0.05, m_out if per_channel else ()).astype(F32)
    bias = rng.integers(-3000, 3000, m_out).astype(np.int32) if draw(st.booleans()) else None
    acc = conv_integer(x, w, zx, zw, group=group, **attrs).astype(np.int64)
    if bias is not None:
        acc = acc + bias.reshape((m_out,) + (1,) * (x.ndim - 2))
    real = (
        acc
        * float(sx)
        * np.asarray(sw, np.float64).reshape((-1,) + (1,) * (x.ndim - 2) if per_channel else ())
    )
    sy, zy = _output_params(real, x.dtype)
    return (x, sx, zx, w, sw, zw, sy, zy, bias), group, attrs


@given(qlinear_conv_case())
def test_qlinear_conv_matches_onnxruntime_exactly(case):
    """0 tolerance (see module docstring). 1-D/2-D/3-D, groups, auto_pad, per-channel w."""
    args, group, attrs = case
    got = qlinear_conv(*args, group=group, **attrs)
    expected, _, _ = _ort_node("QLinearConv", list(args), args[-2].dtype, {**attrs, "group": group}, opset=10)
    np.testing.assert_array_equal(got, expected)


def test_qlinear_conv_per_channel_scales_three_channels():
    """MLIR-style distinct per-channel scales {2:10, 3:20, 4:30} style, channels 3."""
    x = np.arange(1, 6, dtype=np.uint8).reshape(1, 1, 5)
    w = np.array([[[1, 1]], [[1, 2]], [[2, 1]]], np.int8)
    sw = np.array([2.0, 3.0, 4.0], F32)
    zw = np.zeros(3, np.int8)
    got = qlinear_conv(x, F32(0.25), np.uint8(1), w, sw, zw, F32(1.0), np.uint8(10))
    acc = np.array([[1, 3, 5, 7], [2, 5, 8, 11], [1, 4, 7, 10]])  # (x − 1) windows · w
    expected = np.clip(np.rint(acc * (0.25 * sw)[:, None]) + 10, 0, 255)
    np.testing.assert_array_equal(got[0], expected)


# ----------------------------------------------------------------------------- geometry


@pytest.mark.parametrize(
    ("size", "k", "s", "d", "mode", "pads", "out"),
    [
        (7, 3, 2, 1, "SAME_UPPER", (1, 1), 4),
        (6, 3, 2, 1, "SAME_UPPER", (0, 1), 3),
        (6, 3, 2, 1, "SAME_LOWER", (1, 0), 3),
        (5, 3, 1, 2, "SAME_UPPER", (2, 2), 5),
        (5, 2, 3, 1, "SAME_UPPER", (0, 0), 2),
        (7, 3, 2, 2, "VALID", (0, 0), 2),
    ],
)
def test_conv_auto_pad_golden(size, k, s, d, mode, pads, out):
    p = resolve_pads([size], [k], [s], [d], auto_pad=mode)
    assert p == pads
    assert output_spatial([size], [k], [s], [d], p) == (out,)


def test_conv_geometry_error_messages():
    with pytest.raises(
        registry.OpError,
        match=r"^auto_pad: expected one of NOTSET, VALID, SAME_UPPER, SAME_LOWER, got 'SAME'$",
    ):
        resolve_pads([5], [3], [1], [1], auto_pad="SAME")
    with pytest.raises(
        registry.OpError, match=r"^pads: expected 2 values \(begin and end for 1 spatial axes\), got 1$"
    ):
        resolve_pads([5], [3], [1], [1], pads=[1])
    with pytest.raises(
        registry.OpError,
        match=r"^kernel: expected a dilated kernel extent <= padded input \(4\) on spatial axis 0, got 5$",
    ):
        output_spatial([4], [3], [1], [2], [0, 0])
