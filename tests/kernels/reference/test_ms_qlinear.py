"""com.microsoft quantized ops against ONNX Runtime itself (single-node models, domain
com.microsoft version 1), random inputs, distinct scales, non-zero zero points.

Tolerances (ms_qlinear.py module docstring):
- 0 for every op: the reference performs ORT's float32 operations in ORT's order
  (QLinearAdd: ORT's x86 FMA form; QLinearSigmoid: MlasComputeLogistic's rational form).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

from quanta.kernels.reference import registry
from quanta.kernels.reference.ms_qlinear import (
    qlinear_add,
    qlinear_add_portable,
    qlinear_average_pool,
    qlinear_concat,
    qlinear_global_average_pool,
    qlinear_leaky_relu,
    qlinear_mul,
    qlinear_sigmoid,
)
from quanta.kernels.reference.registry import MS_DOMAIN
from tests.strategies import qparams

F32 = np.float32
EIGHT_BIT = [np.uint8, np.int8]


def _ort_ms(op_type, inputs, out_dtype, attrs=None):
    """Run one com.microsoft node in ONNX Runtime; ``inputs`` are arrays or None."""
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
    node = helper.make_node(op_type, names, ["out"], domain=MS_DOMAIN, **(attrs or {}))
    out = helper.make_tensor_value_info("out", helper.np_dtype_to_tensor_dtype(np.dtype(out_dtype)), None)
    model = helper.make_model(
        helper.make_graph([node], "g", infos, [out]),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS_DOMAIN, 1)],
    )
    model.ir_version = 10
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )[0]


def _rand(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


BROADCAST_SHAPES = [
    ((3, 7, 17), (3, 7, 17)),
    ((3, 7, 17), (7, 1)),
    ((1,), (2, 33)),
    ((5, 1, 3), (1, 4, 1)),
    ((2, 40), ()),
]


@st.composite
def binary_case(draw):
    dtype = draw(st.sampled_from(EIGHT_BIT))
    sa, sb = draw(st.sampled_from(BROADCAST_SHAPES))
    if draw(st.booleans()):
        sa, sb = sb, sa
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    a, b = _rand(rng, dtype, sa), _rand(rng, dtype, sb)
    (a_s, a_z), (b_s, b_z), (c_s, c_z) = (
        draw(qparams(dtype)),
        draw(qparams(dtype)),
        draw(qparams(dtype, 0.02, 0.5)),
    )
    return a, a_s, a_z, b, b_s, b_z, c_s, c_z


@given(binary_case())
def test_qlinear_add_matches_onnxruntime(case):
    np.testing.assert_array_equal(qlinear_add(*case), _ort_ms("QLinearAdd", list(case), case[0].dtype))


# (sa, sb, sc, za, zb, zc) for int8; uint8 shifts the zero points by 128. The first row is
# PP-OCRv4's HardSwish ``x + 3`` (sb/sc = 0.5): the portable form is off by 1 on many codes.
_TIE_PRONE = [
    (0.05121425, 0.011764706, 0.023529412, 26, -100, -128),
    (0.05313121, 0.011764706, 0.023529412, -35, -128, -128),  # a = za: 0 + 3 is 127.5 steps
    (0.0371, 0.02, 0.04, 5, 3, 11),
]


@pytest.mark.parametrize("dtype", EIGHT_BIT)
@pytest.mark.parametrize("params", _TIE_PRONE)
@pytest.mark.parametrize("scalar_b", [False, True])
def test_qlinear_add_matches_onnxruntime_on_every_code_pair(dtype, params, scalar_b):
    """Failure signature: ORT-quantized files whose HardSwish or residual Adds drift by 1 on
    a few percent of codes (PP-OCRv4: 2.5 %), because MLAS's portable form (dequantize,
    add, divide) is not what ORT runs on x86 (FMAs on the codes scaled by sa/sc, sb/sc)."""
    sa, sb, sc, za, zb, zc = params
    shift = 128 if dtype == np.uint8 else 0
    info = np.iinfo(dtype)
    codes = np.arange(info.min, info.max + 1)
    a = np.repeat(codes, 256).reshape(256, 256).astype(dtype)
    b = np.array([info.max], dtype) if scalar_b else np.tile(codes, 256).reshape(256, 256).astype(dtype)
    args = (a, F32(sa), dtype(za + shift), b, F32(sb), dtype(zb + shift), F32(sc), dtype(zc + shift))
    expected = _ort_ms("QLinearAdd", list(args), dtype)
    np.testing.assert_array_equal(qlinear_add(*args), expected)


def test_qlinear_add_portable_form_differs_from_onnxruntime_near_ties():
    """Pins why the portable form is not the definition: on the HardSwish scales it differs
    from ORT (x86) on some codes; both agree within 1."""
    sa, sb, sc, za, zb, zc = _TIE_PRONE[0]
    a = np.arange(-128, 128).astype(np.int8)[:, None].repeat(256, 1)
    b = np.arange(-128, 128).astype(np.int8)[None, :].repeat(256, 0)
    args = (a, F32(sa), np.int8(za), b, F32(sb), np.int8(zb), F32(sc), np.int8(zc))
    expected = _ort_ms("QLinearAdd", list(args), np.int8)
    d = np.abs(qlinear_add_portable(*args).astype(int) - expected.astype(int))
    assert d.max() == 1 and (d > 0).sum() > 0


@given(binary_case())
def test_qlinear_mul_matches_onnxruntime_exactly(case):
    np.testing.assert_array_equal(qlinear_mul(*case), _ort_ms("QLinearMul", list(case), case[0].dtype))


def test_qlinear_add_zero_point_added_before_rounding():
    """ORT's own definition (and MLAS portable path): rint(v + zc). v = 2.5, zc = 3 -> 6
    (rint(5.5)), where the ONNX-style rint(v) + zc would give 5. Pinned against ORT."""
    a, b = np.array([5], np.uint8), np.array([0], np.uint8)
    args = (a, F32(0.5), np.uint8(0), b, F32(1.0), np.uint8(0), F32(1.0), np.uint8(3))
    assert qlinear_add(*args)[0] == 6
    assert _ort_ms("QLinearAdd", list(args), np.uint8)[0] == 6


def test_qlinear_add_optional_zero_points_default_to_zero():
    """Omitted zero points are 0. (ORT 1.32's type inference rejects a QLinearAdd node
    with an omitted zero point, so the ORT pin passes explicit zeros.)"""
    a = np.array([10, 20], np.uint8)
    got = registry.get_op("QLinearAdd", MS_DOMAIN)(
        registry.OpContext(), a, F32(0.5), None, a, F32(0.5), None, F32(0.25), None
    )
    np.testing.assert_array_equal(got, [40, 80])
    zero = np.uint8(0)
    np.testing.assert_array_equal(
        got, _ort_ms("QLinearAdd", [a, F32(0.5), zero, a, F32(0.5), zero, F32(0.25), zero], np.uint8)
    )


@st.composite
def unary_case(draw):
    dtype = draw(st.sampled_from(EIGHT_BIT))
    info = np.iinfo(dtype)
    x = np.arange(info.min, info.max + 1).astype(dtype)  # every code: the whole table
    (xs, xz), (ys, yz) = draw(qparams(dtype, 0.01, 0.1)), draw(qparams(dtype, 0.002, 0.05))
    return x, xs, xz, ys, yz


@given(unary_case(), st.floats(0.01, 0.9))
def test_qlinear_leaky_relu_matches_onnxruntime_exactly(case, alpha):
    alpha = float(F32(alpha))
    np.testing.assert_array_equal(
        qlinear_leaky_relu(*case, alpha=alpha),
        _ort_ms("QLinearLeakyRelu", list(case), case[0].dtype, {"alpha": alpha}),
    )


@given(unary_case())
def test_qlinear_sigmoid_matches_onnxruntime(case):
    x, xs, xz, _, yz = case
    ys = F32(1 / 256) if x.dtype == np.uint8 else F32(1 / 128)  # outputs spread over [0, 1]
    args = [x, xs, xz, ys, yz if x.dtype == np.int8 else np.uint8(0)]
    if x.dtype == np.int8:
        args[4] = np.int8(-128)
    np.testing.assert_array_equal(qlinear_sigmoid(*args), _ort_ms("QLinearSigmoid", args, x.dtype))


@pytest.mark.parametrize("dtype", EIGHT_BIT)
def test_qlinear_sigmoid_matches_onnxruntime_on_every_code_of_a_tiny_output_range(dtype):
    """Failure signature: a detector's objectness Sigmoid (YOLOX-style head of an ORT-quantized
    file: sx = 0.0418 with every code at or below zero, sy = 2.7e-7) moves codes by 1,
    because the exact float32 sigmoid and ORT's rational MlasComputeLogistic differ by an
    ulp, and at this output scale an ulp of sigmoid(-10) crosses x.5 boundaries (2 codes of
    256 with the exact sigmoid)."""
    info = np.iinfo(dtype)
    x = np.arange(info.min, info.max + 1).astype(dtype)
    zx, zy = (dtype(127), dtype(-128)) if dtype == np.int8 else (dtype(255), dtype(0))
    args = [x, F32(0.04179762), zx, F32(2.6997398e-07), zy]
    np.testing.assert_array_equal(qlinear_sigmoid(*args), _ort_ms("QLinearSigmoid", args, dtype))


@st.composite
def concat_case(draw):
    dtype = draw(st.sampled_from(EIGHT_BIT))
    axis = draw(st.sampled_from([0, 1, -1]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    sy, zy = draw(qparams(dtype))
    base = [2, 3, 5]
    triples = []
    for i in range(draw(st.integers(1, 4))):
        shape = list(base)
        shape[axis] = [1, 3, 7, 17][i]
        sx, zx = draw(qparams(dtype)) if draw(st.booleans()) else (sy, zy)  # sometimes the copy path
        triples.append((_rand(rng, dtype, shape), sx, zx))
    return sy, zy, triples, axis


@given(concat_case())
def test_qlinear_concat_matches_onnxruntime_exactly(case):
    sy, zy, triples, axis = case
    flat = [sy, zy] + [v for t in triples for v in t]
    np.testing.assert_array_equal(
        qlinear_concat(sy, zy, triples, axis), _ort_ms("QLinearConcat", flat, zy.dtype, {"axis": axis})
    )


@st.composite
def pool_input(draw):
    dtype = draw(st.sampled_from(EIGHT_BIT))
    nsp = draw(st.integers(1, 3))
    spatial = [draw(st.integers(1, 9)) for _ in range(nsp)]
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    x = _rand(rng, dtype, (draw(st.integers(1, 2)), draw(st.sampled_from([1, 3, 7, 17])), *spatial))
    (xs, xz), (ys, yz) = draw(qparams(dtype, 0.01, 0.1)), draw(qparams(dtype, 0.005, 0.1))
    return x, xs, xz, ys, yz


@given(pool_input(), st.booleans())
def test_qlinear_global_average_pool_matches_onnxruntime_exactly(case, channels_last):
    x, xs, xz, ys, yz = case
    if channels_last:
        x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    got = qlinear_global_average_pool(x, xs, xz, ys, yz, channels_last)
    expected = _ort_ms(
        "QLinearGlobalAveragePool", [x, xs, xz, ys, yz], x.dtype, {"channels_last": int(channels_last)}
    )
    np.testing.assert_array_equal(got, expected)


@st.composite
def average_pool_case(draw):
    x, xs, xz, ys, yz = draw(pool_input())
    nsp = x.ndim - 2
    spatial = x.shape[2:]
    kernel = [draw(st.integers(1, d)) for d in spatial]
    attrs = {"kernel_shape": kernel, "strides": [draw(st.integers(1, 3)) for _ in range(nsp)]}
    auto_pad = draw(st.sampled_from(["NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"]))
    if auto_pad == "NOTSET":
        # ORT: "Pad should be smaller than kernel"
        attrs["pads"] = [draw(st.integers(0, k - 1)) for k in kernel + kernel]
        attrs["ceil_mode"] = int(draw(st.booleans()))
    else:
        attrs["auto_pad"] = auto_pad
    attrs["count_include_pad"] = int(draw(st.booleans()))
    channels_last = draw(st.booleans())
    if channels_last:
        x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    attrs["channels_last"] = int(channels_last)
    return (x, xs, xz, ys, yz), attrs


@given(average_pool_case())
def test_qlinear_average_pool_matches_onnxruntime_exactly(case):
    args, attrs = case
    got = registry.get_op("QLinearAveragePool", MS_DOMAIN)(registry.OpContext(), *args, **attrs)
    np.testing.assert_array_equal(got, _ort_ms("QLinearAveragePool", list(args), args[0].dtype, attrs))


def test_qlinear_average_pool_whole_image_uses_integer_global_path():
    """ORT's fallback_to_global: kernel == input, no pads -> integer sum and eq. (6), which
    rounds the zero point after (not before) the average. Σ(x − zx) = 10 over 4 pixels,
    sy = 1: mean 2.5; global path rint(2.5) + 3 = 5, the float path would give rint(5.5) = 6."""
    x = np.array([[[[1, 2], [3, 4]]]], np.uint8)
    args = (x, F32(1.0), np.uint8(0), F32(1.0), np.uint8(3))
    assert qlinear_average_pool(*args, kernel_shape=[2, 2])[0, 0, 0, 0] == 5
    assert _ort_ms("QLinearAveragePool", list(args), np.uint8, {"kernel_shape": [2, 2]})[0, 0, 0, 0] == 5
    padded = qlinear_average_pool(*args, kernel_shape=[2, 2], pads=[0, 0, 1, 1], count_include_pad=0)
    assert padded[0, 0, 0, 0] == 6
    assert (
        _ort_ms("QLinearAveragePool", list(args), np.uint8, {"kernel_shape": [2, 2], "pads": [0, 0, 1, 1]})[
            0, 0, 0, 0
        ]
        == 6
    )


def test_qlinear_average_pool_ceil_mode_drops_window_starting_in_padding():
    """D = 8, k = 2, s = 3, pads (0, 1): ceil((8 + 1 − 2)/3) + 1 = 4 windows, the 4th would
    start at 9 >= 8 + 0: ORT keeps 3."""
    x = np.arange(64, dtype=np.uint8).reshape(1, 1, 8, 8)
    got = qlinear_average_pool(
        x,
        F32(0.1),
        np.uint8(3),
        F32(0.2),
        np.uint8(7),
        kernel_shape=[2, 2],
        strides=[3, 3],
        pads=[0, 0, 1, 1],
        ceil_mode=True,
    )
    assert got.shape == (1, 1, 3, 3)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_binary_op_error_on_mismatched_types(op):
    a = np.zeros(3, np.uint8)
    b = np.zeros(3, np.int8)
    with pytest.raises(registry.OpError, match=r"^B: expected the type of A \(uint8\), got int8$"):
        registry.get_op(op, MS_DOMAIN)(registry.OpContext(), a, F32(1), None, b, F32(1), None, F32(1), None)


def test_concat_error_on_incomplete_triple():
    with pytest.raises(
        registry.OpError,
        match=r"expected \(tensor, scale, zero_point\) triples after Y_zero_point, got 2 inputs",
    ):
        registry.get_op("QLinearConcat", MS_DOMAIN)(
            registry.OpContext(), F32(1), np.uint8(0), np.zeros(2, np.uint8), F32(1), axis=0
        )
