"""3-D convolutions and max pools on the native 2-D kernels over depth windows
(quanta/targets/native/conv3d.py, eq. (C3)).

- QLinearConv and ConvInteger: bit-exact with the reference's 3-D loops (the same int32
  products), for uint8 / int8 x, per-channel weight scales that differ, non-zero zero
  points (the depth pads are x's zero point), groups, strides, dilations, asymmetric and
  automatic pads;
- float Conv (and quanta::Conv with a fused clamp): within docs/float-ops.md eq. (FG1)
  of float64 with K = Cg·KD·KH·KW, the same bytes for 1 and 2 threads;
- MaxPool, float32 and 8-bit: the twin's values exactly, ceil_mode, dilations, pads, NaN;
- nothing of it on the reference (no fallback), and a quantized 3-D model lowers to
  integer kernels end to end.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.kernels.reference.nn_conv import conv as conv_twin
from quanta.runtime.coverage import lowered_coverage
from quanta.targets.native.float_gemm import RUNTIME_FALLBACKS

F32 = np.float32
U = 2.0**-24


def _model(nodes, inputs, outputs, inits, opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def _session(model, threads=1, backend="native"):
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    return quanta.InferenceSession(model, sess_options=opts, backend=backend)


@st.composite
def conv3d_cases(draw):
    group = draw(st.sampled_from([1, 1, 3, "dw"]))
    cg = draw(st.sampled_from([1, 2, 3]))
    if group == "dw":
        group, cg = draw(st.sampled_from([3, 7])), 1
    m = group * draw(st.sampled_from([1, 2, 5]))
    kernel = [draw(st.integers(1, 3)) for _ in range(3)]
    strides = [draw(st.integers(1, 2)) for _ in range(3)]
    dilations = [draw(st.integers(1, 2)) for _ in range(3)]
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    attrs = {"group": group, "strides": strides, "dilations": dilations}
    if auto_pad == "NOTSET":
        attrs["pads"] = [draw(st.integers(0, k - 1)) for k in kernel * 2]
    else:
        attrs["auto_pad"] = auto_pad
    spatial = [draw(st.integers(d * (k - 1) + 1, d * (k - 1) + 7)) for k, d in zip(kernel, dilations)]
    n = draw(st.integers(1, 2))
    return (n, group * cg, *spatial), (m, cg, *kernel), attrs


def _qconv_model(x_shape, w, attrs, *, x_dtype, seed, integer=False):
    rng = np.random.default_rng(seed)
    m = w.shape[0]
    xi = np.iinfo(x_dtype)
    tt = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}[x_dtype]
    zx = np.array(xi.min + 37 + seed % 50, x_dtype)
    if integer:
        zw = np.array(-3, np.int8) if w.dtype == np.int8 else np.array(5, np.uint8)
        inits = [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(zx, "zx"),
            numpy_helper.from_array(zw, "zw"),
        ]
        node = helper.make_node("ConvInteger", ["x", "w", "zx", "zw"], ["y"], **attrs)
        out = helper.make_tensor_value_info("y", TensorProto.INT32, None)
    else:
        consts = {
            "sx": np.array(0.031, F32),
            "zx": zx,
            "w": w,
            "sw": rng.uniform(0.002, 0.01, m).astype(F32),  # per channel, all different
            "zw": np.zeros(m, w.dtype),
            "sy": np.array(0.37, F32),
            "zy": np.array(xi.min + 101, x_dtype),
            "b": rng.integers(-3000, 3000, m).astype(np.int32),
        }
        inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
        node = helper.make_node("QLinearConv", ["x", *consts], ["y"], **attrs)
        out = helper.make_tensor_value_info("y", tt, None)
    return _model([node], [helper.make_tensor_value_info("x", tt, list(x_shape))], [out], inits, 13)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=conv3d_cases(), x_signed=st.booleans(), integer=st.booleans(), seed=st.integers(0, 999))
def test_integer_3d_convolutions_are_the_reference_bytes(case, x_signed, integer, seed):
    x_shape, w_shape, attrs = case
    rng = np.random.default_rng(seed)
    x_dtype = np.int8 if x_signed else np.uint8
    w = rng.integers(-127, 128, w_shape).astype(np.int8)
    if integer and seed % 2:
        w = rng.integers(0, 256, w_shape).astype(np.uint8)  # ConvInteger takes uint8 weights too
    model = _qconv_model(x_shape, w, attrs, x_dtype=x_dtype, seed=seed, integer=integer)
    info = np.iinfo(x_dtype)
    x = rng.integers(info.min, info.max + 1, x_shape).astype(x_dtype)
    want = _session(model, backend="reference").run(None, {"x": x})[0]
    for threads in (1, 2):
        sess = _session(model, threads)
        assert sess.fallbacks == [], sess.fallbacks
        (step,) = [s for s in sess.plan.steps if "Conv" in s.node.op_type]
        assert step.kernel.name.startswith("native:")  # a depth of one is a 2-D Conv (conv_depth_one)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)


def _float_conv_model(x_shape, w, b, attrs, relu=False):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if relu else "y"], **attrs)]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=conv3d_cases(), relu=st.booleans(), seed=st.integers(0, 999))
def test_float_3d_convolution_is_within_fg1(case, relu, seed):
    x_shape, w_shape, attrs = case
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal(x_shape).astype(F32), rng.standard_normal(w_shape).astype(F32)
    b = rng.standard_normal(w_shape[0]).astype(F32)
    model = _float_conv_model(x_shape, w, b, attrs, relu)
    y64 = conv_twin(None, x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), **attrs)
    mag = conv_twin(None, *(np.abs(a).astype(np.float64) for a in (x, w, b)), **attrs)
    if relu:
        y64 = np.maximum(y64, 0)
    k = w[0].size
    before = RUNTIME_FALLBACKS["Conv"] + RUNTIME_FALLBACKS["quanta::Conv"]
    got = []
    for threads in (1, 2):
        sess = _session(model, threads)
        assert sess.fallbacks == [], sess.fallbacks
        (step,) = [s for s in sess.plan.steps if s.node.op_type == "Conv"]
        assert step.kernel.name.startswith("native:")  # a depth of one is a 2-D Conv (conv_depth_one)
        y = sess.run(None, {"x": x})[0]
        err = np.abs(y.astype(np.float64) - y64)
        assert (err <= (k + 3) * U * mag).all(), float((err / ((k + 3) * U * mag + 1e-300)).max())
        got.append(y.tobytes())
    assert got[0] == got[1], "1 vs 2 threads"
    assert RUNTIME_FALLBACKS["Conv"] + RUNTIME_FALLBACKS["quanta::Conv"] == before


@pytest.mark.parametrize(
    "x_shape,w_shape,attrs",
    [
        ((1, 3, 7, 9, 8), (17, 3, 3, 3, 3), {"pads": [1, 0, 2, 2, 1, 0]}),
        ((2, 7, 5, 6, 7), (7, 1, 3, 3, 3), {"group": 7, "strides": [2, 1, 2], "pads": [1, 1, 1, 1, 1, 1]}),
        ((1, 300, 3, 4, 4), (5, 300, 2, 1, 1), {}),  # K = 600 > 258
        ((1, 6, 9, 5, 5), (9, 2, 3, 1, 1), {"group": 3, "dilations": [3, 1, 1], "auto_pad": "SAME_LOWER"}),
    ],
)
def test_float_3d_convolution_runs_the_depth_fold(x_shape, w_shape, attrs):
    rng = np.random.default_rng(sum(x_shape))
    x, w = rng.standard_normal(x_shape).astype(F32), rng.standard_normal(w_shape).astype(F32)
    b = rng.standard_normal(w_shape[0]).astype(F32)
    sess = _session(_float_conv_model(x_shape, w, b, attrs))
    (step,) = [s for s in sess.plan.steps if s.node.op_type == "Conv"]
    assert step.kernel.name.startswith("native:conv3d_f32_depthfold_")
    y64 = conv_twin(None, x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), **attrs)
    mag = conv_twin(None, *(np.abs(a).astype(np.float64) for a in (x, w, b)), **attrs)
    err = np.abs(sess.run(None, {"x": x})[0].astype(np.float64) - y64)
    assert (err <= (w[0].size + 3) * U * mag).all()


def _max_pool_model(x_shape, tt, attrs):
    return _model(
        [helper.make_node("MaxPool", ["x"], ["y"], **attrs)],
        [helper.make_tensor_value_info("x", tt, list(x_shape))],
        [helper.make_tensor_value_info("y", tt, None)],
        [],
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kernel=st.lists(st.integers(1, 3), min_size=3, max_size=3),
    strides=st.lists(st.integers(1, 3), min_size=3, max_size=3),
    dilations=st.lists(st.integers(1, 2), min_size=3, max_size=3),
    ceil=st.booleans(),
    padded=st.booleans(),
    dtype=st.sampled_from([np.float32, np.uint8, np.int8]),
    seed=st.integers(0, 999),
)
def test_max_pool_3d_is_the_twins_values(kernel, strides, dilations, ceil, padded, dtype, seed):
    rng = np.random.default_rng(seed)
    spatial = [d * (k - 1) + 1 + int(rng.integers(0, 6)) for k, d in zip(kernel, dilations)]
    x_shape = (int(rng.integers(1, 3)), 7, *spatial)
    attrs = {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "ceil_mode": int(ceil)}
    if padded:
        attrs["pads"] = [int(rng.integers(0, k)) for k in kernel] + [int(rng.integers(0, k)) for k in kernel]
    if dtype == np.float32:
        x = rng.standard_normal(x_shape).astype(F32)
        x.flat[rng.integers(0, x.size, 3)] = [np.nan, -np.inf, np.inf]
        tt = TensorProto.FLOAT
    else:
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max + 1, x_shape).astype(dtype)
        tt = TensorProto.UINT8 if dtype == np.uint8 else TensorProto.INT8
    model = _max_pool_model(x_shape, tt, attrs)
    want = _session(model, backend="reference").run(None, {"x": x})[0]
    for threads in (1, 2):
        sess = _session(model, threads)
        assert sess.fallbacks == [], sess.fallbacks
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)


def test_a_3d_network_quantizes_to_integer_kernels_and_runs_natively(tmp_path):
    """Conv3d -> Relu -> depthwise Conv3d -> MaxPool3d -> Conv3d (stride 2): quantize_static
    keeps every MAC integer and the native plan runs it with no fallback, bit-exact."""
    rng = np.random.default_rng(5)
    specs = [
        ("c0", 7, 3, (3, 3, 3), 1, [1, 1, 1]),
        ("c1", 7, 7, (3, 1, 3), 7, [1, 1, 1]),
        ("c2", 17, 7, (3, 3, 3), 1, [2, 2, 2]),
    ]
    nodes, inits, cur = [], [], "x"
    for name, m, c, k, g, s in specs:
        w = (rng.standard_normal((m, c // g, *k)) * 0.3).astype(F32)
        b = (rng.standard_normal(m) * 0.1).astype(F32)
        inits += [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")]
        pads = [kk // 2 for kk in k] * 2
        nodes.append(
            helper.make_node(
                "Conv", [cur, f"{name}_w", f"{name}_b"], [name], pads=pads, strides=s, group=g, name=name
            )
        )
        nodes.append(helper.make_node("Relu", [name], [f"{name}_r"]))
        cur = f"{name}_r"
        if name == "c1":
            nodes.append(helper.make_node("MaxPool", [cur], ["p"], kernel_shape=[2, 2, 2], strides=[1, 2, 2]))
            cur = "p"
    path = tmp_path / "c3d.onnx"
    path.write_bytes(
        _model(
            nodes,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 13, 11])],
            [helper.make_tensor_value_info(cur, TensorProto.FLOAT, None)],
            inits,
        )
    )
    feeds = [{"x": rng.standard_normal((1, 3, 9, 13, 11)).astype(F32)} for _ in range(4)]
    out = tmp_path / "c3d.int8.onnx"
    quanta.quantize_static(str(path), str(out), feeds, verbose=False)
    assert lowered_coverage(load(out)).integer_share == pytest.approx(1.0)
    native = _session(str(out))
    assert native.fallbacks == [], native.fallbacks
    kernels = {s.kernel.name for s in native.plan.steps if "Conv" in s.node.op_type}
    assert kernels and all("qconv3d_depthfold" in k for k in kernels), kernels
    x = {"x": feeds[0]["x"]}
    np.testing.assert_array_equal(
        native.run(None, x)[0], _session(str(out), backend="reference").run(None, x)[0]
    )
