"""quanta::MlasQLinearConv natively (``_native.mlas_qconv``, mlas_qconv/mlas_qconv.h): ONNX
Runtime's QLinearConv as its u8·s8 kernels without VNNI compute it, bit-exact with the twin
(reference/mlas_qconv.py, docs/float-ops.md (QC1)-(QC4)) on both paths (avx2: qgemm's
saturating vpmaddubsw family; portable: the same pairs in scalar C++), at 1 and 2 threads.

Geometries: C = 3, 7, 17, 24; kernels 1, 3, 5; strides 1, 2; pads (asymmetric among them);
a dilation; groups of 2-4 (one GEMM each); K past 258; uint8 and int8 x with x at its zero
point over a band and at its largest code over another (pairs that saturate), per-tensor
and per-channel weights, zero points that are not 0, uint8 and int8 y. Every case checks
that the exact sum gives other codes (else the exact sum could pass it too). Against
onnxruntime's QLinearConv itself where this host's ORT saturates.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.kernels import _native
from quanta.kernels.reference.mlas_qconv import mlas_qlinear_conv_op
from quanta.kernels.reference.qlinear_conv import qlinear_conv
from quanta.quantize.ort_saturation import onnxruntime_int8_saturates
from quanta.targets.native.mlas_qconv import multipliers

ISAS = ["portable", *(["avx2"] if "avx2" in _native.supported_isas() else [])]


def case(c, f, k, s, group, x_dtype, per_channel, seed, *, h=9, w=11, dilation=1):
    """Operands and attributes of one MlasQLinearConv: x at its zero point over rows 0-1,
    at its largest code over rows 3-5 (pairs of products of ±128 weights saturate)."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(x_dtype)
    x = rng.integers(info.min, info.max + 1, (2, c, h, w)).astype(x_dtype)
    zx = np.array(info.min + 137, x_dtype)
    x[:, :, 0:2] = zx
    x[:, :, 3:6] = info.max
    wq = rng.integers(-128, 128, (f, c // group, k, k))
    big = rng.random(wq.shape) < 0.6
    wq = np.where(big, np.where(rng.random(wq.shape) < 0.5, -128, 127), wq).astype(np.int8)
    n = f if per_channel else 1
    sw = rng.uniform(0.0005, 0.002, n).astype(np.float32)
    zw = rng.integers(-4, 5, n).astype(np.int8)
    sx = np.array(0.021, np.float32)
    y_dtype = np.int8 if seed % 2 else np.uint8
    sy = np.array(0.11 * k * np.sqrt(c), np.float32)
    zy = np.array(-9 if y_dtype == np.int8 else 121, y_dtype)
    b = rng.integers(-20000, 20000, f).astype(np.int32)
    p = k // 2
    pads = [p, p, p, p] if s == 1 else [p, max(p - 1, 0), 0, p]
    attrs = dict(strides=[s, s], pads=pads, dilations=[dilation, dilation], group=group)
    return (x, sx, zx, wq, sw, zw, sy, zy, b), attrs


def native(inputs, attrs, isa, threads, channels_last=False):
    x, sx, zx, wq, sw, zw, sy, zy, b = inputs
    f = wq.shape[0]
    zw32 = np.ascontiguousarray(np.broadcast_to(zw.astype(np.int32), (f,)))
    packed = _native.mlas_qconv_pack(wq, zw32, attrs["group"], isa)
    assert packed.isa == isa
    return _native.mlas_qconv(
        x,
        packed,
        int(zx),
        multipliers(sx, sw, sy, f),
        int(zy),
        zy.dtype == np.int8,
        b,
        attrs["strides"],
        attrs["dilations"],
        attrs["pads"],
        threads,
        channels_last=channels_last,
    )


def exact(inputs, attrs):
    """quanta's exact integer Conv of the same codes (QLinearConv's own twin)."""
    x, sx, zx, wq, sw, zw, sy, zy, b = inputs
    return qlinear_conv(x, sx, zx, wq, sw, zw, sy, zy, b, **attrs)


GEOMETRIES = [  # C, F, kernel, stride, group
    (3, 8, 3, 2, 1),
    (3, 5, 5, 1, 1),
    (7, 9, 3, 1, 1),
    (7, 11, 5, 2, 1),
    (17, 7, 1, 1, 1),
    (17, 13, 3, 2, 1),
    (24, 16, 1, 2, 1),
    (24, 10, 3, 1, 2),
    (24, 9, 3, 2, 3),
    (24, 12, 1, 1, 4),
    (24, 8, 5, 1, 4),
    (7, 6, 3, 1, 1),
    (36, 5, 3, 1, 1),  # K = 324
    (68, 6, 3, 2, 2),  # K = 306 per group
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("c, f, k, s, group", GEOMETRIES)
@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("per_channel", [False, True])
def test_native_equals_the_twin(isa, c, f, k, s, group, x_dtype, per_channel):
    seed = c * 131 + f * 7 + k + s + group + (x_dtype == np.int8) + 2 * per_channel
    inputs, attrs = case(c, f, k, s, group, x_dtype, per_channel, seed)
    expected = mlas_qlinear_conv_op(None, *inputs, **attrs)
    assert expected.dtype == inputs[7].dtype
    for threads in (1, 2):
        got = native(inputs, attrs, isa, threads)
        np.testing.assert_array_equal(got, expected, err_msg=f"{isa}, {threads} threads")
    assert np.count_nonzero(exact(inputs, attrs) != expected) > 0, "no pair saturated"


def nhwc(a):
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("c, f, k, s, group", GEOMETRIES)
@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
def test_channels_last_equals_the_twin(isa, c, f, k, s, group, x_dtype):
    """x [N, H, W, C] -> y [N, oh, ow, F]: the NCHW twin's codes with the channel axis moved
    (the twin's channels_last=1 is that by construction; the kernel skips its transposes)."""
    seed = c * 17 + f + k * 3 + s + group + (x_dtype == np.int8)
    inputs, attrs = case(c, f, k, s, group, x_dtype, True, seed, h=11, w=7)
    expected = mlas_qlinear_conv_op(None, *inputs, **attrs)
    nhwc_inputs = (nhwc(inputs[0]), *inputs[1:])
    np.testing.assert_array_equal(
        mlas_qlinear_conv_op(None, *nhwc_inputs, **attrs, channels_last=1), nhwc(expected)
    )
    for threads in (1, 2):
        got = native(nhwc_inputs, attrs, isa, threads, channels_last=True)
        np.testing.assert_array_equal(got, nhwc(expected), err_msg=f"{isa}, {threads} threads")
    assert np.count_nonzero(exact(inputs, attrs) != expected) > 0, "no pair saturated"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("c, f, k, s", [(3, 16, 3, 2), (7, 17, 3, 1), (17, 7, 1, 2)])
def test_a_large_plane_splits_its_im2col(isa, channels_last, c, f, k, s):
    """Planes whose im2col passes 256 KiB (the threshold for splitting its rows over the
    threads): an odd 131 x 97 image; the same codes at 1 and 2 threads and as the twin."""
    inputs, attrs = case(c, f, k, s, 1, np.uint8, True, c + f + k, h=131, w=97)
    expected = mlas_qlinear_conv_op(None, *inputs, **attrs)
    if channels_last:
        inputs, expected = (nhwc(inputs[0]), *inputs[1:]), nhwc(expected)
    for threads in (1, 2):
        got = native(inputs, attrs, isa, threads, channels_last=channels_last)
        np.testing.assert_array_equal(got, expected, err_msg=f"{isa}, {threads} threads")


def test_channels_last_refusals_name_the_layout():
    (x, sx, _, wq, sw, _, sy, _, b), _ = case(7, 9, 3, 1, 1, np.uint8, False, 3)
    packed = _native.mlas_qconv_pack(wq, np.zeros(9, np.int32), 1)
    m = multipliers(sx, sw, sy, 9)
    with pytest.raises(ValueError, match="x has 11 channels, the weights 7"):  # NCHW given as NHWC
        _native.mlas_qconv(x, packed, 3, m, 0, False, b, [1, 1], [1, 1], [1, 1, 1, 1], channels_last=True)
    with pytest.raises(ValueError, match=r"x must be 4-D \[B, H, W, G·C\]"):
        _native.mlas_qconv(x[0], packed, 3, m, 0, False, b, [1, 1], [1, 1], [1, 1, 1, 1], channels_last=True)


@pytest.mark.parametrize("isa", ISAS)
def test_dilation_and_a_wide_image(isa):
    inputs, attrs = case(7, 9, 3, 1, 1, np.uint8, True, 5, h=13, w=40, dilation=2)
    np.testing.assert_array_equal(native(inputs, attrs, isa, 2), mlas_qlinear_conv_op(None, *inputs, **attrs))


def test_refusals_name_the_argument():
    (x, sx, _, wq, sw, _, sy, _, b), _ = case(7, 9, 3, 1, 1, np.uint8, False, 3)
    with pytest.raises(ValueError, match="group must divide"):
        _native.mlas_qconv_pack(wq, np.zeros(9, np.int32), 2)
    packed = _native.mlas_qconv_pack(wq, np.zeros(9, np.int32), 1)
    m = multipliers(sx, sw, sy, 9)
    with pytest.raises(ValueError, match="x has 6 channels, the weights 7"):
        _native.mlas_qconv(x[:, :6].copy(), packed, 3, m, 0, False, b, [1, 1], [1, 1], [1, 1, 1, 1])
    with pytest.raises(ValueError, match="multiplier must be float32"):
        _native.mlas_qconv(x, packed, 3, m[:4].copy(), 0, False, b, [1, 1], [1, 1], [1, 1, 1, 1])
    with pytest.raises(ValueError, match="zx is outside"):
        _native.mlas_qconv(x, packed, 300, m, 0, False, b, [1, 1], [1, 1], [1, 1, 1, 1])
    # the window checks MlasConv shares (mlas_conv::set_window), named by this kernel
    with pytest.raises(ValueError, match=r"^mlas_qconv: pads must be >= 0, got \(1, -1, 1, 1\)$"):
        _native.mlas_qconv(x, packed, 3, m, 0, False, b, [1, 1], [1, 1], [1, -1, 1, 1])
    with pytest.raises(ValueError, match=r"^mlas_qconv: strides, dilations need 2 values, pads 4$"):
        _native.mlas_qconv(x, packed, 3, m, 0, False, b, [1], [1, 1], [1, 1, 1, 1])
    with pytest.raises(ValueError, match=r"^mlas_qconv: the output would be empty$"):
        _native.mlas_qconv(x, packed, 3, m, 0, False, b, [1, 1], [40, 1], [0, 0, 0, 0])


def ort_qlinear_conv(inputs, attrs):
    import onnxruntime as ort

    x, sx, zx, wq, sw, zw, sy, zy, b = inputs
    values = dict(sx=sx, zx=zx, w=wq, sw=sw, zw=zw, sy=sy, zy=zy, b=b)
    k = wq.shape[2]
    node = helper.make_node("QLinearConv", ["x", *values], ["y"], kernel_shape=[k, k], **attrs)
    dt = TensorProto.UINT8 if x.dtype == np.uint8 else TensorProto.INT8
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", dt, list(x.shape))],
        [
            helper.make_tensor_value_info(
                "y", TensorProto.UINT8 if zy.dtype == np.uint8 else TensorProto.INT8, None
            )
        ],
        initializer=[numpy_helper.from_array(np.asarray(v), n) for n, v in values.items()],
    )
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]


@pytest.mark.skipif(
    not onnxruntime_int8_saturates(), reason="ONNX Runtime's u8·s8 kernels saturate only on x86 without VNNI"
)
@pytest.mark.parametrize(
    "c, f, k, s, group", [g for g in GEOMETRIES if g[4] == 1] + [(24, 10, 3, 1, 2), (24, 12, 1, 1, 4)]
)
@pytest.mark.parametrize("per_channel", [False, True])
def test_native_equals_onnxruntime(c, f, k, s, group, per_channel):
    # ORT's QLinearConv: uint8 x and y (its int8 x is s8·s8, not this op), symmetric
    # per-channel weights (ORT requires zw = 0 per channel)
    inputs, attrs = case(c, f, k, s, group, np.uint8, per_channel, c + f + k)
    zw = np.zeros(f, np.int8) if per_channel else inputs[5]
    inputs = (*inputs[:5], zw, inputs[6], np.array(121, np.uint8), inputs[8])
    expected = ort_qlinear_conv(inputs, attrs)
    got = native(inputs, attrs, ISAS[-1], 2)
    np.testing.assert_array_equal(got, expected)
    assert np.count_nonzero(exact(inputs, attrs) != expected) > 0


def case_1d(c, f, k, s, seed, length=29):
    """A 1-D MlasQLinearConv: x [2, C, L] uint8 with a band at its zero point and one at
    255, heavy int8 weights [F, C, k], asymmetric pads, per-channel weights."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (2, c, length)).astype(np.uint8)
    zx = np.array(137, np.uint8)
    x[:, :, 0:3] = zx
    x[:, :, 5:11] = 255
    wq = rng.integers(-128, 128, (f, c, k))
    big = rng.random(wq.shape) < 0.6
    wq = np.where(big, np.where(rng.random(wq.shape) < 0.5, -128, 127), wq).astype(np.int8)
    sw = rng.uniform(0.0005, 0.002, f).astype(np.float32)
    zw = np.zeros(f, np.int8)  # ORT's QLinearConv takes per-channel weights symmetric only
    sx, sy, zy = (
        np.array(0.021, np.float32),
        np.array(0.11 * k * np.sqrt(c), np.float32),
        np.array(121, np.uint8),
    )
    b = rng.integers(-20000, 20000, f).astype(np.int32)
    attrs = dict(strides=[s], pads=[k // 2, max(k // 2 - 1, 0)], dilations=[1], group=1)
    return (x, sx, zx, wq, sw, zw, sy, zy, b), attrs


def as_height_one(inputs, attrs):
    """The 2-D Conv of height 1 the native binder runs a 1-D Conv as (native/mlas_qconv.py)."""
    x, sx, zx, wq, sw, zw, sy, zy, b = inputs
    p = attrs["pads"]
    attrs2 = dict(strides=[1, *attrs["strides"]], pads=[0, p[0], 0, p[1]], dilations=[1, 1], group=1)
    return (x[:, :, None, :], sx, zx, wq[:, :, None, :], sw, zw, sy, zy, b), attrs2


GEOMETRIES_1D = [  # C, F, kernel, stride
    (3, 7, 3, 1),
    (7, 17, 5, 2),
    (17, 3, 3, 2),
    (80, 9, 5, 1),  # K = 400 > 258, the Whisper stem's 80 mel bands
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("c, f, k, s", GEOMETRIES_1D)
def test_one_dimensional_conv_is_the_two_dimensional_one_of_height_one(isa, c, f, k, s):
    inputs, attrs = case_1d(c, f, k, s, c + f)
    expected = mlas_qlinear_conv_op(None, *inputs, **attrs)
    inputs2, attrs2 = as_height_one(inputs, attrs)
    for threads in (1, 2):
        got = native(inputs2, attrs2, isa, threads)
        np.testing.assert_array_equal(
            got.reshape(expected.shape), expected, err_msg=f"{isa}, {threads} threads"
        )
    assert np.count_nonzero(exact(inputs, attrs) != expected) > 0, "no pair saturated"


@pytest.mark.skipif(
    not onnxruntime_int8_saturates(), reason="ONNX Runtime's u8·s8 kernels saturate only on x86 without VNNI"
)
@pytest.mark.parametrize("c, f, k, s", GEOMETRIES_1D)
def test_one_dimensional_twin_equals_onnxruntime(c, f, k, s):
    import onnxruntime as ort

    inputs, attrs = case_1d(c, f, k, s, c * f)
    x, *rest = inputs
    names = ["sx", "zx", "w", "sw", "zw", "sy", "zy", "b"]
    node = helper.make_node("QLinearConv", ["x", *names], ["y"], kernel_shape=[k], **attrs)
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        initializer=[numpy_helper.from_array(np.asarray(v), n) for n, v in zip(names, rest, strict=True)],
    )
    so = ort.SessionOptions()
    so.log_severity_level = 3
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    got = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    expected = mlas_qlinear_conv_op(None, *inputs, **attrs)
    np.testing.assert_array_equal(got, expected)
    assert np.count_nonzero(exact(inputs, attrs) != expected) > 0
