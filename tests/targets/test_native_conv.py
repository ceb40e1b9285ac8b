"""Native QLinearConv / ConvInteger through sessions (quanta/targets/native/conv.py):
``backend="native"`` against ``backend="reference"``, bit-exact, with the fallbacks the
binders record and the kernel each node got.

The kernels themselves are tested over the space of geometries and every ISA in
tests/kernels/test_conv_native.py; here: the compile-time binding (prepacked weights,
attributes, refusals with their reasons), the run-time hand-over to the twin, and the
demo CNN quantized statically (QLinearConv) and dynamically (ConvInteger).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.cli.demo import DATA, MODEL
from quanta.kernels import _native

THREADS = (1, 2)


def _assets():
    return MODEL, np.load(DATA)


def _conv_steps(sess):
    return [(s.node.name, s.node.op_type, s.kernel.name) for s in sess.plan.steps if "Conv" in s.node.op_type]


def _sessions(model, threads: int):
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    native = quanta.InferenceSession(model, sess_options=opts, backend="native")
    reference = quanta.InferenceSession(model, backend="reference")
    return native, reference


def _assert_same(native, reference, feeds):
    got = native.run(None, feeds)
    want = reference.run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.fixture(scope="module")
def digits_static(tmp_path_factory):
    model, data = _assets()
    out = tmp_path_factory.mktemp("conv") / "digits.int8.onnx"
    calib = [{"input": x[None]} for x in data["calib_x"]]
    quanta.quantize_static(str(model), str(out), calib, verbose=False)
    return out, data["test_x"][:64]


@pytest.mark.parametrize("threads", THREADS)
def test_digits_cnn_static_native_matches_reference(digits_static, threads):
    path, x = digits_static
    native, reference = _sessions(str(path), threads)
    steps = _conv_steps(native)
    assert len(steps) == 6 and all(op == "QLinearConv" for _, op, _ in steps)
    assert not [f for f in native.fallbacks if f[1] == "QLinearConv"], native.fallbacks
    kernels = {k.split(":")[1].split("_")[1] for _, _, k in steps}  # dw / dwc, implicit+qgemm / im2col+qgemm
    assert kernels & {"dw", "dwc"}, steps
    _assert_same(native, reference, {"input": x})


@pytest.mark.parametrize("threads", THREADS)
def test_digits_cnn_dynamic_conv_integer_native_matches_reference(tmp_path, threads):
    model, data = _assets()
    out = tmp_path / "digits.dyn.onnx"
    quanta.quantize_dynamic(str(model), str(out))
    native, reference = _sessions(str(out), threads)
    steps = _conv_steps(native)
    assert len(steps) == 6 and all(op == "ConvInteger" and k.startswith("native:") for _, op, k in steps), (
        steps
    )
    _assert_same(native, reference, {"input": data["test_x"][:16]})


# --------------------------------------------------------------------------------------
# One-node models: attributes and types the binder passes on
# --------------------------------------------------------------------------------------


def _qlinear_conv_model(
    x_shape,
    w,
    *,
    x_dtype=np.uint8,
    y_dtype=np.uint8,
    zw=None,
    sw=None,
    bias=True,
    weights_as_input=False,
    y_scale_as_input=False,
    channels_last=None,
    **attrs,
):
    """A one-node QLinearConv model; channels_last 0 / 1: the com.microsoft op with that
    attribute (x_shape is then the node's own layout)."""
    rng = np.random.default_rng(7)
    M = w.shape[0]
    xi, yi = np.iinfo(x_dtype), np.iinfo(y_dtype)
    onnx_type = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}
    consts = {
        "sx": np.array(0.031, np.float32),
        "zx": np.array(xi.min + 37, x_dtype),
        "w": w,
        "sw": rng.uniform(0.002, 0.01, M).astype(np.float32) if sw is None else sw,
        "zw": np.zeros((), w.dtype) if zw is None else zw,
        "sy": np.array(0.45, np.float32),
        "zy": np.array(yi.min + 101, y_dtype),
    }
    names = ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"]
    if bias:
        consts["b"] = rng.integers(-3000, 3000, M).astype(np.int32)
        names.append("b")
    inputs = [helper.make_tensor_value_info("x", onnx_type[x_dtype], list(x_shape))]
    as_inputs = {"w"} if weights_as_input else set()
    if y_scale_as_input:
        as_inputs.add("sy")
    for n in sorted(as_inputs):
        inputs.append(
            helper.make_tensor_value_info(
                n, helper.np_dtype_to_tensor_dtype(consts[n].dtype), consts[n].shape
            )
        )
    inits = [numpy_helper.from_array(v, n) for n, v in consts.items() if n not in as_inputs]
    opsets = [helper.make_opsetid("", 13)]
    if channels_last is not None:
        attrs = {**attrs, "channels_last": channels_last, "domain": "com.microsoft"}
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    node = helper.make_node("QLinearConv", names, ["y"], name="conv", **attrs)
    graph = helper.make_graph(
        [node], "g", inputs, [helper.make_tensor_value_info("y", onnx_type[y_dtype], None)], inits
    )
    return helper.make_model(graph, opset_imports=opsets), consts


CONFIGS = [
    ("dense 3x3 pads", (2, 8, 9, 11), (7, 8, 3, 3), {"pads": [1, 0, 2, 1]}),
    ("depthwise s2", (1, 17, 13, 13), (17, 1, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2], "group": 17}),
    (
        "grouped dilated",
        (1, 12, 11, 9),
        (9, 4, 3, 3),
        {"pads": [2, 2, 2, 2], "dilations": [2, 2], "group": 3},
    ),
    ("3 channels", (1, 3, 10, 10), (5, 3, 5, 5), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ("1-D", (2, 8, 31), (6, 8, 5), {"pads": [2, 1], "strides": [2]}),
    ("1-D depthwise", (1, 7, 20), (7, 1, 3), {"auto_pad": "SAME_UPPER", "group": 7}),
]


@pytest.mark.parametrize(("name", "x_shape", "w_shape", "attrs"), CONFIGS, ids=[c[0] for c in CONFIGS])
@pytest.mark.parametrize(
    ("x_dtype", "w_dtype", "y_dtype"), [(np.uint8, np.int8, np.uint8), (np.int8, np.uint8, np.int8)]
)
def test_qlinear_conv_node_native_matches_reference(name, x_shape, w_shape, attrs, x_dtype, w_dtype, y_dtype):
    del name  # the test id
    rng = np.random.default_rng(sum(x_shape))
    wi, xi = np.iinfo(w_dtype), np.iinfo(x_dtype)
    w = rng.integers(wi.min, wi.max + 1, w_shape).astype(w_dtype)
    zw = rng.integers(wi.min, wi.max + 1, w_shape[0]).astype(w_dtype)  # per channel, not uniform
    model, _ = _qlinear_conv_model(x_shape, w, x_dtype=x_dtype, y_dtype=y_dtype, zw=zw, **attrs)
    x = rng.integers(xi.min, xi.max + 1, x_shape).astype(x_dtype)
    for threads in THREADS:
        native, reference = _sessions(model, threads)
        (step,) = _conv_steps(native)
        assert step[2].startswith("native:qconv_"), native.fallbacks
        _assert_same(native, reference, {"x": x})


@pytest.mark.parametrize(("name", "x_shape", "w_shape", "attrs"), CONFIGS, ids=[c[0] for c in CONFIGS])
@pytest.mark.parametrize("channels_last", [1, 0])
def test_ms_qlinear_conv_node_native_matches_reference(name, x_shape, w_shape, attrs, channels_last):
    # com.microsoft QLinearConv (what the NHWC pass produces): channels_last=1 runs the
    # kernel's NHWC mode, x [N, *spatial, C] and y [N, *out, M]; 0 is the ai.onnx op
    del name  # the test id
    if channels_last:
        x_shape = (x_shape[0], *x_shape[2:], x_shape[1])
    rng = np.random.default_rng(sum(x_shape) + channels_last)
    w = rng.integers(-128, 128, w_shape).astype(np.int8)
    zw = rng.integers(-128, 128, w_shape[0]).astype(np.int8)
    for x_dtype, y_dtype in ((np.uint8, np.uint8), (np.int8, np.int8)):
        model, _ = _qlinear_conv_model(
            x_shape, w, x_dtype=x_dtype, y_dtype=y_dtype, zw=zw, channels_last=channels_last, **attrs
        )
        xi = np.iinfo(x_dtype)
        x = rng.integers(xi.min, xi.max + 1, x_shape).astype(x_dtype)
        for threads in THREADS:
            native, reference = _sessions(model, threads)
            (step,) = _conv_steps(native)
            assert step[2].startswith("native:qconv_"), native.fallbacks
            if channels_last and attrs.get("group", 1) == w_shape[0]:
                assert step[2].startswith("native:qconv_dwc_"), step
            _assert_same(native, reference, {"x": x})


def test_ms_qlinear_conv_bad_channels_last_falls_back_with_the_reason():
    w = np.ones((4, 8, 3, 3), np.int8)
    model, _ = _qlinear_conv_model((1, 8, 5, 5), w, channels_last=2, pads=[1, 1, 1, 1])
    native = quanta.InferenceSession(model, backend="native")
    assert ("conv", "QLinearConv", "channels_last: expected 0 or 1, got 2") in native.fallbacks


@pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")  # the twin's sx*sw/0
def test_ms_qlinear_conv_call_the_binding_refuses_runs_on_the_ms_twin():
    # y_scale = 0 at run time: refused by the binding, computed by the com.microsoft twin
    # (channels_last layout kept)
    w = np.arange(-36, 36, dtype=np.int8).reshape(2, 4, 3, 3)
    model, _ = _qlinear_conv_model((1, 6, 6, 4), w, y_scale_as_input=True, channels_last=1, pads=[1, 1, 1, 1])
    native, reference = _sessions(model, 1)
    assert _conv_steps(native)[0][2].startswith("native:qconv_")
    x = np.arange(144, dtype=np.uint8).reshape(1, 6, 6, 4)
    for sy in (np.array(0.0, np.float32), np.array(0.37, np.float32)):
        _assert_same(native, reference, {"x": x, "sy": sy})


def _conv_integer_model(x_shape, w, zw=None, with_zx=True, **attrs):
    inits = [numpy_helper.from_array(w, "w")]
    names = ["x", "w"]
    if with_zx:
        inits.append(numpy_helper.from_array(np.array(131, np.uint8), "zx"))
        names.append("zx")
    if zw is not None:
        if not with_zx:
            names.append("")
        inits.append(numpy_helper.from_array(zw, "zw"))
        names.append("zw")
    node = helper.make_node("ConvInteger", names, ["y"], name="conv", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("with_zx", [True, False])
@pytest.mark.parametrize("group", [1, 8])
def test_conv_integer_node_native_matches_reference(with_zx, group):
    rng = np.random.default_rng(group)
    w = rng.integers(0, 256, (8, 8 // group, 3, 3)).astype(np.uint8)
    zw = rng.integers(0, 256, 8).astype(np.uint8)
    model = _conv_integer_model(
        (2, 8, 9, 7), w, zw, with_zx=with_zx, pads=[1, 1, 0, 2], strides=[1, 2], group=group
    )
    x = rng.integers(0, 256, (2, 8, 9, 7)).astype(np.uint8)
    native, reference = _sessions(model, 2)
    assert _conv_steps(native)[0][2].startswith("native:qconv_")
    _assert_same(native, reference, {"x": x})


# --------------------------------------------------------------------------------------
# What stays on the reference twin, and why
# --------------------------------------------------------------------------------------


def test_weights_that_are_not_constants_fall_back_with_the_reason():
    w = np.ones((4, 8, 3, 3), np.int8)
    model, consts = _qlinear_conv_model((1, 8, 5, 5), w, weights_as_input=True, pads=[1, 1, 1, 1])
    native, reference = _sessions(model, 1)
    assert (
        "conv",
        "QLinearConv",
        "weights w are not a constant (the native kernel packs them at compile time)",
    ) in (native.fallbacks)
    x = np.arange(200, dtype=np.uint8).reshape(1, 8, 5, 5)
    _assert_same(native, reference, {"x": x, "w": consts["w"]})


def test_three_d_convolution_runs_the_2d_kernel_over_depth_windows():
    # the geometry space is tests/targets/test_native_conv3d.py's; here the binder's kernel
    w = np.arange(-108, 108, dtype=np.int8).reshape(4, 2, 3, 3, 3)
    model, _ = _qlinear_conv_model((1, 2, 4, 5, 6), w, sw=np.array(0.01, np.float32), pads=[1] * 6)
    native, reference = _sessions(model, 1)
    assert native.fallbacks == []
    assert _conv_steps(native)[0][2].startswith("native:qconv3d_depthfold+qconv_")
    x = np.arange(240, dtype=np.uint8).reshape(1, 2, 4, 5, 6)
    _assert_same(native, reference, {"x": x})


@pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")  # the twin's sx*sw/0
def test_a_call_the_binding_refuses_runs_on_the_twin():
    # y_scale = 0 at run time: infinite multipliers, refused by the binding; the twin
    # computes the same bytes the reference session does (saturation, NaN -> qmin)
    w = np.arange(-36, 36, dtype=np.int8).reshape(2, 4, 3, 3)
    model, _ = _qlinear_conv_model((1, 4, 6, 6), w, y_scale_as_input=True, pads=[1, 1, 1, 1])
    native, reference = _sessions(model, 1)
    assert _conv_steps(native)[0][2].startswith("native:qconv_")
    x = np.arange(144, dtype=np.uint8).reshape(1, 4, 6, 6)
    for sy in (np.array(0.0, np.float32), np.array(0.37, np.float32)):
        _assert_same(native, reference, {"x": x, "sy": sy})


def test_kernel_names_say_which_path_runs():
    isa = _native.active_isa()
    cases = [
        (
            (1, 8, 6, 6),
            (8, 1, 3, 3),
            {"group": 8},
            "native:qconv_dw_",
        ),  # a lone depthwise convolution stays NCHW (ChannelsLast builds no region of one)
        # C = 3: the direct small-channel kernel (AVX-512 VNNI and AVX2, channels-last), else im2col
        (
            (1, 3, 6, 6),
            (4, 3, 3, 3),
            {},
            "native:qconv_direct_" if isa in ("avx512vnni", "avx2") else "native:qconv_im2col+",
        ),
    ]
    if isa != "avx2":
        cases.append(((1, 8, 6, 6), (4, 8, 3, 3), {}, "native:qconv_implicit+"))
    for x_shape, w_shape, attrs, prefix in cases:
        model, _ = _qlinear_conv_model(x_shape, np.ones(w_shape, np.int8), **attrs)
        native = quanta.InferenceSession(model, backend="native")
        assert _conv_steps(native)[0][2].startswith(prefix)
