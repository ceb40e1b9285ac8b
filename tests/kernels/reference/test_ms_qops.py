"""com.microsoft QGemm, MatMulIntegerToFloat, DynamicQuantizeMatMul (ms_qgemm.py) and
QLinearSoftmax, QLinearWhere, QuantizeLinear, DequantizeLinear (ms_qops.py) against ONNX
Runtime itself.

Every case is one single-node model (onnx.helper, com.microsoft version 1) run by ONNX
Runtime (CPU, optimizations off) and by ``quanta.InferenceSession(backend="reference")``;
inputs random with distinct scales, non-zero zero points and odd shapes (K > 258 included).

Tolerances:
- 0 for every op but QLinearSoftmax: the reference performs ORT's own float32 operations in
  ORT's order (module docstrings), integer and float outputs alike; float16 outputs are the
  float32 result rounded once, as ORT's Cast around its float32 kernel.
- QLinearSoftmax: ±1 on at most 1% of codes (measured: ~2 in 10^5). ORT 1.32 picks a SIMD
  kernel by CPU that sums the exponentials in lanes (and may fuse T·m + zy into an FMA);
  that moves T·m + zy by float32 ulps, which changes a code only within those ulps of an x.5
  boundary (ms_qops.py docstring).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.kernels.reference import registry
from quanta.kernels.reference.ms_qgemm import dynamic_quantize_matmul, matmul_integer_to_float, qgemm_ms
from quanta.kernels.reference.ms_qops import (
    ms_dequantize_linear,
    ms_quantize_linear,
    qlinear_softmax,
    qlinear_where,
)
from quanta.kernels.reference.registry import MS_DOMAIN, OpError
from tests.ort_int8 import fit_s8

F32 = np.float32
EIGHT_BIT = [np.uint8, np.int8]
# (A, B) type pairs ONNX Runtime registers for its integer GEMMs.
AB_TYPES = [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)]


def _rand(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


def _operand(rng, dtype, shape):
    """A GEMM operand: int8 over the range ORT's u8 x s8 kernels compute exactly on this
    CPU (tests/ort_int8.py), any other type over its whole range."""
    return fit_s8(_rand(rng, dtype, shape))


def _model(op_type, inputs, out_dtype, out_shape, attrs, consts):
    """One com.microsoft node; inputs listed in ``consts`` become initializers (ORT then
    takes its constant-input paths: prepacked B, fixed lookup tables)."""
    names, infos, inits, feeds = [], [], [], {}
    for i, v in enumerate(inputs):
        if v is None:
            names.append("")
            continue
        name = f"in{i}"
        names.append(name)
        v = np.asarray(v)
        if i in consts:
            inits.append(numpy_helper.from_array(v, name))
            continue
        feeds[name] = v
        infos.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape))
    node = helper.make_node(op_type, names, ["out"], domain=MS_DOMAIN, **(attrs or {}))
    out = helper.make_tensor_value_info(
        "out", helper.np_dtype_to_tensor_dtype(np.dtype(out_dtype)), out_shape
    )
    model = helper.make_model(
        helper.make_graph([node], "g", infos, [out], inits),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS_DOMAIN, 1)],
    )
    model.ir_version = 10
    return model, feeds


def _run_both(op_type, inputs, out_dtype, attrs=None, consts=()):
    """(quanta reference output, ONNX Runtime output) of the same single-node model."""
    model, feeds = _model(op_type, inputs, out_dtype, None, attrs, set(consts))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )[0]
    model, feeds = _model(op_type, inputs, out_dtype, expected.shape, attrs, set(consts))
    got = quanta.InferenceSession(model.SerializeToString(), backend="reference").run(None, feeds)[0]
    return got, expected


def _assert_same(got, expected):
    assert got.dtype == expected.dtype and got.shape == expected.shape, (got.dtype, got.shape, expected.shape)
    np.testing.assert_array_equal(got, expected)


def _const_subset(draw, indices):
    return {i for i in indices if draw(st.booleans())}


# --------------------------------------------------------------------------------------
# QGemm
# --------------------------------------------------------------------------------------


@st.composite
def qgemm_case(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    adt, bdt = draw(st.sampled_from(AB_TYPES))
    m, k, n = draw(
        st.sampled_from([(1, 1, 1), (3, 7, 17), (7, 17, 3), (15, 259, 9), (2, 300, 33), (17, 64, 1)])
    )
    trans_a, trans_b = draw(st.booleans()), draw(st.booleans())
    a = _operand(rng, adt, (k, m) if trans_a else (m, k))
    b = _operand(rng, bdt, (n, k) if trans_b else (k, n))
    sa, za = F32(rng.uniform(0.01, 0.05)), _operand(rng, adt, ())
    if draw(st.booleans()):  # per column, each scale its own
        sb, zb = rng.uniform(0.002, 0.02, n).astype(F32), _operand(rng, bdt, (n,))
    else:
        sb, zb = F32(rng.uniform(0.002, 0.02)), _operand(rng, bdt, ())
    c_shape = draw(st.sampled_from([None, (), (1,), (n,), (1, n), (m, 1), (m, n)]))
    c = None if c_shape is None else rng.integers(-3000, 3000, c_shape).astype(np.int32)
    alpha = draw(st.sampled_from([1.0, 0.75, 1.3]))
    if draw(st.booleans()):
        # Output scale from the accumulator's actual range (XNNPACK), so y covers the storage range.
        acc = qgemm_ms(a, sa, za, b, sb, zb, c, alpha=alpha, trans_a=trans_a, trans_b=trans_b)
        span = float(acc.max() - acc.min()) or 1.0
        sy, zy = F32(span / 250), _operand(rng, adt, ())
        inputs, out_dtype = [a, sa, za, b, sb, zb, c, sy, zy], adt
    else:
        inputs, out_dtype = [a, sa, za, b, sb, zb, c], np.float32
    while inputs[-1] is None:
        inputs.pop()
    attrs = {"alpha": alpha, "transA": int(trans_a), "transB": int(trans_b)}
    return inputs, out_dtype, attrs, _const_subset(draw, [3, 4, 5, 6])


@given(qgemm_case())
def test_qgemm_matches_onnxruntime_exactly(case):
    inputs, out_dtype, attrs, consts = case
    _assert_same(*_run_both("QGemm", inputs, out_dtype, attrs, consts))


def test_qgemm_alpha_enters_before_b_scale():
    """Failure signature: results off by one code where alpha·sa·sb/sy rounds differently
    when alpha is applied last. (1): m = f32(f32(f32(alpha·sa)·sb)/sy), pinned on a sweep of
    accumulators against ORT."""
    a = np.arange(0, 250, dtype=np.uint8).reshape(-1, 1)
    b = np.array([[1, 3, 7]], np.int8)
    inputs = [a, F32(0.0371), np.uint8(3), b, F32(0.0113), np.int8(0), None, F32(0.00291), np.uint8(5)]
    _assert_same(*_run_both("QGemm", inputs, np.uint8, {"alpha": 0.3}))


def test_qgemm_error_on_int8_a_with_uint8_b():
    """ORT registers (u8, u8), (u8, s8), (s8, s8) only."""
    a, b = np.zeros((2, 3), np.int8), np.zeros((3, 2), np.uint8)
    with pytest.raises(OpError, match="B: expected int8 for an int8 A"):
        qgemm_ms(a, F32(1), np.int8(0), b, F32(1), np.uint8(0))


def test_qgemm_error_on_bias_that_does_not_broadcast():
    a, b = np.zeros((2, 3), np.uint8), np.zeros((3, 5), np.uint8)
    with pytest.raises(
        OpError, match=r"C: expected a shape that broadcasts to \[M, N\] = \[2, 5\], got \(3,\)"
    ):
        qgemm_ms(a, F32(1), np.uint8(0), b, F32(1), np.uint8(0), np.zeros(3, np.int32))


# --------------------------------------------------------------------------------------
# MatMulIntegerToFloat, DynamicQuantizeMatMul
# --------------------------------------------------------------------------------------

# (A shape, B shape): rank-2, A batched over a shared B, both batched, K > 258.
MATMUL_SHAPES = [((3, 7), (7, 17)), ((2, 5, 33), (33, 7)), ((3, 1, 9), (3, 9, 5)), ((4, 301), (301, 3))]


@st.composite
def matmul_to_float_case(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    adt, bdt = draw(st.sampled_from(AB_TYPES))
    a_shape, b_shape = draw(st.sampled_from(MATMUL_SHAPES))
    n = b_shape[-1]
    a, b = _operand(rng, adt, a_shape), _operand(rng, bdt, b_shape)
    fdt = draw(st.sampled_from([np.float32, np.float16]))
    sa = np.asarray(rng.uniform(0.01, 0.05), fdt)
    per_column_shape = (n,) if len(b_shape) == 2 else (*b_shape[:-2], 1, n)
    b_layout = draw(st.sampled_from(["scalar", "column"]))
    sb = (
        rng.uniform(0.002, 0.02, per_column_shape)
        if b_layout == "column"
        else np.asarray(rng.uniform(0.002, 0.02))
    ).astype(fdt)
    za = _operand(rng, adt, ()) if draw(st.booleans()) else None
    zb = _operand(rng, bdt, sb.shape) if draw(st.booleans()) else None
    bias = rng.standard_normal(n).astype(fdt) if draw(st.booleans()) else None
    inputs = [a, b, sa, sb, za, zb, bias]
    while inputs[-1] is None:
        inputs.pop()
    return inputs, fdt, _const_subset(draw, [1, 3, 5, 6])


@given(matmul_to_float_case())
def test_matmul_integer_to_float_matches_onnxruntime_exactly(case):
    inputs, fdt, consts = case
    _assert_same(*_run_both("MatMulIntegerToFloat", inputs, fdt, None, consts))


def test_matmul_integer_to_float_per_row_a_scale_applied_after_bias():
    """Failure signature: off by float32 ulps. A per-row a_scale [M, 1] enters ORT's GEMM as
    1.0 and multiplies the output after the bias: y = f32(f32(f32(acc·sb) + bias)·sa)."""
    rng = np.random.default_rng(5)
    a, b = _operand(rng, np.uint8, (7, 33)), _operand(rng, np.int8, (33, 5))
    sa = rng.uniform(0.01, 0.05, (7, 1)).astype(F32)
    inputs = [a, b, sa, F32(0.0137), np.uint8(129), None, rng.standard_normal(5).astype(F32)]
    _assert_same(*_run_both("MatMulIntegerToFloat", inputs, np.float32))


def test_matmul_integer_to_float_swapped_scales_are_fixed_up():
    """ORT's FixupScaleTensor: a per-column scale passed as a_scale (and the scalar as
    b_scale) is swapped back before use."""
    rng = np.random.default_rng(6)
    a, b = _operand(rng, np.uint8, (3, 17)), _operand(rng, np.int8, (17, 7))
    sb = rng.uniform(0.002, 0.02, 7).astype(F32)
    swapped = matmul_integer_to_float(a, b, sb, F32(0.031), np.uint8(7))
    np.testing.assert_array_equal(swapped, matmul_integer_to_float(a, b, F32(0.031), sb, np.uint8(7)))
    _assert_same(
        swapped, _run_both("MatMulIntegerToFloat", [a, b, sb, F32(0.031), np.uint8(7)], np.float32)[1]
    )


@st.composite
def dynamic_matmul_case(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    bdt = draw(st.sampled_from(EIGHT_BIT))
    a_shape, b_shape = draw(st.sampled_from(MATMUL_SHAPES))
    n = b_shape[-1]
    # An offset and a scale per example: the dynamic range need not be centred on 0.
    a = (rng.standard_normal(a_shape) * rng.uniform(0.1, 5) + rng.uniform(-2, 2)).astype(F32)
    b = _operand(rng, bdt, b_shape)
    per_column_shape = (n,) if len(b_shape) == 2 else (*b_shape[:-2], 1, n)
    column = draw(st.booleans())
    sb = (
        rng.uniform(0.002, 0.02, per_column_shape) if column else np.asarray(rng.uniform(0.002, 0.02))
    ).astype(F32)
    zb = _operand(rng, bdt, sb.shape) if draw(st.booleans()) else None
    bias = rng.standard_normal(n).astype(F32) if draw(st.booleans()) else None
    inputs = [a, b, sb, zb, bias]
    while inputs[-1] is None:
        inputs.pop()
    return inputs, _const_subset(draw, [1, 2, 3, 4])


@given(dynamic_matmul_case())
def test_dynamic_quantize_matmul_matches_onnxruntime_exactly(case):
    inputs, consts = case
    _assert_same(*_run_both("DynamicQuantizeMatMul", inputs, np.float32, None, consts))


def test_dynamic_quantize_matmul_all_zero_input_gives_bias():
    """DynamicQuantizeLinear's scale for an all-zero input is 1/255 here and 1 in ORT; the
    codes equal the zero point either way, so y == bias exactly."""
    b = np.arange(-10, 11, dtype=np.int8).reshape(3, 7)
    bias = np.linspace(-1, 1, 7).astype(F32)
    inputs = [np.zeros((2, 3), F32), b, F32(0.02), np.int8(3), bias]
    got, expected = _run_both("DynamicQuantizeMatMul", inputs, np.float32)
    _assert_same(got, expected)
    np.testing.assert_array_equal(got, np.broadcast_to(bias, (2, 7)))
    np.testing.assert_array_equal(dynamic_quantize_matmul(*inputs), got)


# --------------------------------------------------------------------------------------
# QLinearSoftmax
# --------------------------------------------------------------------------------------


@st.composite
def softmax_case(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    dtype = draw(st.sampled_from(EIGHT_BIT))
    shape = draw(st.sampled_from([(17,), (3, 7), (2, 3, 17), (5, 1, 9), (2, 3, 1, 7), (1, 300)]))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    opset = draw(st.sampled_from([11, 12, 13, 17]))
    x = _rand(rng, dtype, shape)
    # ORT's quantizer fixes sy = 1/256 for softmax; other values exercise Ys = floor(1/sy).
    sy = draw(st.sampled_from([F32(1 / 256), F32(rng.uniform(0.003, 0.03))]))
    sx = F32(rng.uniform(0.005, 0.3))
    inputs = [x, sx, _rand(rng, dtype, ()), sy, _rand(rng, dtype, ())]
    attrs = {"opset": opset}
    if draw(st.booleans()):
        attrs["axis"] = axis
    return inputs, dtype, attrs, _const_subset(draw, [1, 2, 3, 4])


@given(softmax_case())
def test_qlinear_softmax_matches_onnxruntime_exactly(case):
    inputs, dtype, attrs, consts = case
    _assert_same(*_run_both("QLinearSoftmax", inputs, dtype, attrs, consts))


@pytest.mark.parametrize("dtype", EIGHT_BIT)
@pytest.mark.parametrize("d", [7, 37, 300])
def test_qlinear_softmax_is_onnxruntime_bit_for_bit(dtype, d):
    """Many rows, so that some value lies within a float32 ulp of a rounding tie: with the
    table's log in float64 or the product by a float32 reciprocal (the earlier twin), 2 to
    14 codes of these 20,000 · D differ from ORT 1.32; odd zero points pin that the tie is
    rounded before zy is added; sy = 0.003 makes Ys = floor(1 / sy) = 333."""
    rng = np.random.default_rng(d)
    info = np.iinfo(dtype)
    centre = 200 if dtype == np.uint8 else 60
    x = np.clip(rng.normal(centre, 30, (20000, d)), info.min, info.max).astype(dtype)
    for sy, zy in ((F32(1 / 256), info.min), (F32(0.003), info.min + 5)):
        inputs = [x, F32(0.07), dtype(0), sy, dtype(zy)]
        _assert_same(*_run_both("QLinearSoftmax", inputs, dtype, {"axis": -1, "opset": 13}))


def test_qlinear_softmax_table_log_is_logf():
    """(1)'s log is glibc's logf of f32(FLT_MAX / D): f32(log(q)) equals it for D < 60,594."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("m")
    if name is None:
        pytest.skip("no libm to compare with")
    logf = ctypes.CDLL(name).logf
    logf.restype, logf.argtypes = ctypes.c_float, [ctypes.c_float]
    top = F32(np.finfo(np.float32).max)
    for d in [*range(1, 4097), *range(4097, 60594, 61)]:
        q = top / F32(d)
        assert F32(np.log(np.float64(q))) == F32(logf(float(q))), d


@pytest.mark.parametrize("dtype", EIGHT_BIT)
def test_qlinear_softmax_single_element_rows_saturate(dtype):
    """Failure signature: qmax where ORT gives Ys + zy. With D = 1 the table's top entry is
    FLT_MAX / e^5, and a float32 product T · Ys overflows to +inf once Ys > e^5 ≈ 148; ORT
    1.32 (and (5)) form T · Ys / sum in float64."""
    x = np.array([[3], [100], [0]], dtype)
    zy = np.iinfo(dtype).min + 7
    for ys in (256, 149, 147, 100):
        inputs = [x, F32(0.1), dtype(0), F32(1 / ys), dtype(zy)]
        got, expected = _run_both("QLinearSoftmax", inputs, dtype, {"axis": -1, "opset": 13})
        _assert_same(got, expected)


def test_qlinear_softmax_ignores_x_zero_point():
    """Softmax is shift invariant and ORT only reads max(x) − x: x_zero_point has no effect."""
    rng = np.random.default_rng(3)
    x = _rand(rng, np.uint8, (3, 17))
    op = registry.get_op("QLinearSoftmax", MS_DOMAIN)
    ctx = registry.OpContext()
    outs = [op(ctx, x, F32(0.07), np.uint8(z), F32(1 / 256), np.uint8(0), opset=13) for z in (0, 77, 255)]
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


def test_qlinear_softmax_error_without_opset_attribute():
    op = registry.get_op("QLinearSoftmax", MS_DOMAIN)
    x = np.zeros((2, 3), np.uint8)
    with pytest.raises(OpError, match="opset: expected the attribute"):
        op(registry.OpContext(), x, F32(0.1), np.uint8(0), F32(1 / 256), np.uint8(0))


def test_qlinear_softmax_axis_defaults_to_last_for_every_opset():
    """Failure signature: one distribution over 3·17 values instead of one per row of 17.
    The contrib schema's axis default is -1, also for opset < 13 (not Softmax-11's 1)."""
    x = _rand(np.random.default_rng(4), np.uint8, (2, 3, 17))
    inputs = [x, F32(0.11), np.uint8(0), F32(1 / 256), np.uint8(9)]
    got, expected = _run_both("QLinearSoftmax", inputs, np.uint8, {"opset": 11})
    _assert_same(got, expected)
    np.testing.assert_array_equal(
        got, qlinear_softmax(x, F32(0.11), F32(1 / 256), np.uint8(9), axis=-1, opset=11)
    )


def test_qlinear_softmax_opset_12_coerces_trailing_dims_to_one_row():
    """opset < 13: softmax over Π shape[axis:] (one row of 3·4), not over shape[axis]."""
    x = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    flat = qlinear_softmax(x, F32(0.2), F32(1 / 256), np.uint8(0), axis=1, opset=12)
    per_axis = qlinear_softmax(x, F32(0.2), F32(1 / 256), np.uint8(0), axis=1, opset=13)
    assert int(flat[0].astype(int).sum()) in range(250, 262)  # one distribution per batch row
    assert not np.array_equal(flat, per_axis)


# --------------------------------------------------------------------------------------
# QLinearWhere
# --------------------------------------------------------------------------------------

WHERE_SHAPES = [((3, 7), (3, 7), (3, 7)), ((3, 1), (1, 17), (3, 17)), ((), (2, 5), (5,)), ((7,), (), (3, 1))]


@st.composite
def where_case(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    dtype = draw(st.sampled_from(EIGHT_BIT))
    c_shape, x_shape, y_shape = draw(st.sampled_from(WHERE_SHAPES))
    cond = rng.random(c_shape) < 0.5
    x, y = _rand(rng, dtype, x_shape), _rand(rng, dtype, y_shape)
    sz, zz = F32(rng.uniform(0.01, 0.1)), _rand(rng, dtype, ())
    # Sometimes an input shares z's parameters: ORT's copy path.
    sx, zx = (sz, zz) if draw(st.booleans()) else (F32(rng.uniform(0.01, 0.1)), _rand(rng, dtype, ()))
    sy, zy = (sz, zz) if draw(st.booleans()) else (F32(rng.uniform(0.01, 0.1)), _rand(rng, dtype, ()))
    # Scales and zero points all constant or all fed: ORT 1.32 dereferences a null x/y zero
    # point (segfault) when only z's parameters are constant.
    consts = {2, 3, 5, 6, 7, 8} if draw(st.booleans()) else set()
    return [np.asarray(cond), x, sx, zx, y, sy, zy, sz, zz], dtype, consts


@given(where_case())
def test_qlinear_where_matches_onnxruntime_exactly(case):
    inputs, dtype, consts = case
    _assert_same(*_run_both("QLinearWhere", inputs, dtype, None, consts))


def test_qlinear_where_same_parameters_is_a_copy():
    """The requantization q_z(dq_x(v)) is the identity when (sx, zx) == (sz, zz)."""
    x = np.arange(-128, 128, dtype=np.int8)
    y = np.zeros_like(x)
    for s in (F32(0.0173), F32(3.1e-5), F32(117.0)):
        z = qlinear_where(np.ones(256, bool), x, s, np.int8(-9), y, F32(1), np.int8(0), s, np.int8(-9))
        np.testing.assert_array_equal(z, x)


# --------------------------------------------------------------------------------------
# com.microsoft QuantizeLinear / DequantizeLinear
# --------------------------------------------------------------------------------------

STORAGE_16 = [np.int8, np.uint8, np.int16, np.uint16]


@st.composite
def quantize_case(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    dtype = draw(st.sampled_from(STORAGE_16))
    fdt = draw(st.sampled_from([np.float32, np.float16]))
    x = (rng.standard_normal((3, 7, 5)) * 40).astype(fdt)
    ranged = 256 if np.dtype(dtype).itemsize == 1 else 65536
    axis = draw(st.sampled_from([None, 0, 1, -1]))
    if axis is None:
        scale, zp = np.asarray(rng.uniform(0.05, 0.5) * 256 / ranged, fdt), _rand(rng, dtype, ())
        attrs = {}
    else:
        n = x.shape[axis]
        scale = (rng.uniform(0.05, 0.5, n) * 256 / ranged).astype(fdt)
        zp, attrs = _rand(rng, dtype, (n,)), {"axis": axis}
    return x, scale, zp, attrs, _const_subset(draw, [1, 2])


@given(quantize_case())
def test_ms_quantize_linear_matches_onnxruntime_exactly(case):
    x, scale, zp, attrs, consts = case
    _assert_same(*_run_both("QuantizeLinear", [x, scale, zp], zp.dtype, attrs, consts))


@given(quantize_case())
def test_ms_dequantize_linear_matches_onnxruntime_exactly(case):
    x, scale, zp, attrs, consts = case
    rng = np.random.default_rng(int(abs(float(x.ravel()[0])) * 1000))
    q = _rand(rng, zp.dtype, x.shape)
    _assert_same(*_run_both("DequantizeLinear", [q, scale, zp], scale.dtype, attrs, consts))


def test_ms_quantize_linear_ties_round_half_to_even():
    """x.5 golden vectors for both signs, for the storage types ORT adds (int16/uint16)."""
    x = np.array([2.5, 3.5, -2.5, -3.5, 0.5, -0.5], F32)
    expected = np.array([12, 14, 8, 6, 10, 10], np.int16)  # rne(x) + 10
    got = ms_quantize_linear(x, F32(1.0), np.int16(10))
    np.testing.assert_array_equal(got, expected)
    _assert_same(got, _run_both("QuantizeLinear", [x, F32(1.0), np.int16(10)], np.int16)[1])


def test_ms_dequantize_linear_int32_subtracts_its_zero_point():
    """ORT's contrib DequantizeLinear accepts int32 with any zero point (ONNX's requires 0)."""
    x = np.array([[1, -5, 2**20]], np.int32)
    got, expected = _run_both("DequantizeLinear", [x, F32(0.1), np.int32(2)], np.float32)
    _assert_same(got, expected)
    np.testing.assert_array_equal(got, ms_dequantize_linear(x, F32(0.1), np.int32(2)))


@pytest.mark.parametrize("scale_shape,zp_shape", [((1,), ()), ((), (1,)), ((1,), (1,))])
@pytest.mark.parametrize("backend", ["reference", "native"])
def test_ms_qdq_one_element_scale_and_scalar_zero_point_are_per_tensor(scale_shape, zp_shape, backend):
    """AMD Quark writes a bias DequantizeLinear with a [1] scale beside a scalar int32 zero
    point; ONNX Runtime's contrib kernels read any mix of scalar and 1-element vector as
    per tensor."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2, 7, 3)) * 50).astype(F32)
    scale = np.full(scale_shape, 0.37, F32)
    for op_type, inputs, out in (
        ("QuantizeLinear", [x, scale, np.full(zp_shape, -3, np.int16)], np.int16),
        (
            "DequantizeLinear",
            [rng.integers(-900, 900, (17,)).astype(np.int32), scale, np.full(zp_shape, 5, np.int32)],
            F32,
        ),
    ):
        model, feeds = _model(op_type, inputs, out, None, None, {1, 2})
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        expected = ort.InferenceSession(
            model.SerializeToString(), so, providers=["CPUExecutionProvider"]
        ).run(None, feeds)[0]
        model, feeds = _model(op_type, inputs, out, expected.shape, None, {1, 2})
        got = quanta.InferenceSession(model.SerializeToString(), backend=backend).run(None, feeds)[0]
        _assert_same(got, expected)


@pytest.mark.parametrize(
    ("dtype", "code"), [(ml_dtypes.int4, TensorProto.INT4), (ml_dtypes.uint4, TensorProto.UINT4)]
)
def test_ms_quantize_dequantize_int4_round_trip_matches_onnxruntime(dtype, code):
    """int4 values cannot cross ORT's Python boundary, so Q -> DQ runs inside one model;
    zero point 3, values past both ends of the storage range saturate."""
    x = np.linspace(-2.3, 2.3, 47).astype(F32).reshape(1, 47)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], domain=MS_DOMAIN),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], domain=MS_DOMAIN),
    ]
    inits = [numpy_helper.from_array(np.array(0.13, F32), "s"), helper.make_tensor("z", code, [], [3])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS_DOMAIN, 1)]
    )
    model.ir_version = 10
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    got = quanta.InferenceSession(model.SerializeToString(), backend="reference").run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, expected)
    z = np.array(3, dtype)
    np.testing.assert_array_equal(
        ms_dequantize_linear(ms_quantize_linear(x, F32(0.13), z), F32(0.13), z), got
    )


def test_ms_quantize_linear_error_on_scale_of_another_type():
    with pytest.raises(OpError, match="y_scale: expected the type of x"):
        ms_quantize_linear(np.zeros(3, np.float16), F32(0.1), np.uint8(0))


def test_matmul_integer_to_float_of_two_vectors_is_a_scalar() -> None:
    # numpy.matmul of 1-D operands: a dot product with no N axis (quantize_static writes
    # it for a MatMul of two 1-D activations)
    rng = np.random.default_rng(11)
    a = rng.integers(0, 256, 259).astype(np.uint8)
    b = rng.integers(0, 256, 259).astype(np.uint8)
    sa, sb, za, zb = np.float32(0.013), np.float32(0.071), np.uint8(117), np.uint8(131)
    got = matmul_integer_to_float(a, b, sa, sb, za, zb)
    acc = int(np.dot(a.astype(np.int64) - 117, b.astype(np.int64) - 131))
    assert got.shape == ()
    assert got == np.float32(np.float32(acc) * np.float32(sa * sb))
    col = matmul_integer_to_float(a[None], b, sa, sb, za, zb)  # [1, K] @ [K] -> [1]
    assert col.shape == (1,) and col[0] == got
