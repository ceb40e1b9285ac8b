"""The native float GEMM-family binders (quanta/targets/native/float_gemm.py).

1. the bound kernels called as the runtime calls them (with and without ``out=``, 1 and
   2 threads) against float64 within docs/float-ops.md eq. (FG1), and bit-identical for 1
   vs 2 threads; ``RUNTIME_FALLBACKS`` must not move (a silent hand-over to the twin
   would pass a tolerance test);
2. binder refusals (with their reasons) and run-time hand-overs;
3. a whole float model through a session: every Conv / ConvTranspose / MatMul / Gemm
   runs natively (none in ``sess.fallbacks``), the weights of Paddle-style exports held
   by Constant nodes included, and native vs reference agree within the bound.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.graph import Node, Value
from quanta.ir.types import TensorType, elem_from_numpy
from quanta.kernels import _native
from quanta.kernels.reference.nn_conv import conv as conv_twin
from quanta.kernels.reference.nn_conv import conv_transpose as conv_transpose_twin
from quanta.targets.base import KernelContext
from quanta.targets.native import BINDERS, _load_families
from quanta.targets.native.float_gemm import RUNTIME_FALLBACKS

F32 = np.float32
U = 2.0**-24
_load_families()


def value(name: str, const=None, dtype=np.float32, shape=None) -> Value:
    if const is not None:
        return Value(name, type=TensorType(elem_from_numpy(const.dtype), tuple(const.shape)), const=const)
    if dtype is None:  # type unknown at compile time
        return Value(name)
    return Value(name, type=TensorType(elem_from_numpy(np.dtype(dtype)), shape))


def bind(op_type: str, inputs: list[Value | None], attrs: dict | None = None):
    node = Node(op_type, inputs, [Value("y")], attrs or {})
    return BINDERS[("", op_type)](None, node)


def check_kernel(op_type, kernel, inputs, attrs, y64, magnitude, k) -> None:
    """The bound kernel, threads 1 and 2, with and without out=, within (FG1)."""
    before = RUNTIME_FALLBACKS[op_type]
    ys = []
    for threads in (1, 2):
        ctx = KernelContext(opset=21, num_threads=threads)
        y = kernel.fn(ctx, *inputs, **attrs, **kernel.params)
        out = np.full(y64.shape, np.nan, F32)
        assert kernel.fn(ctx, *inputs, **attrs, **kernel.params, out=out) is out
        for got in (y, out):
            assert got.dtype == F32 and got.shape == y64.shape
            err = np.abs(got.astype(np.float64) - y64)
            assert (err <= (k + 3) * U * magnitude).all(), float((err / ((k + 3) * U * magnitude)).max())
        assert y.tobytes() == out.tobytes()
        ys.append(y)
    assert ys[0].tobytes() == ys[1].tobytes(), "1 vs 2 threads"
    assert RUNTIME_FALLBACKS[op_type] == before, "the kernel handed a supported call to the twin"


# --------------------------------------------------------------------------------------
# 1. kernels
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "xshape,wshape,attrs",
    [
        ((2, 7, 9, 11), (17, 7, 1, 1), {}),
        ((1, 17, 10, 12), (17, 1, 3, 3), {"group": 17, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
        ((1, 3, 15, 16), (8, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
        ((1, 6, 9, 8), (9, 2, 3, 2), {"group": 3, "dilations": [2, 1], "pads": [1, 0, 2, 1]}),
        ((2, 7, 31), (5, 7, 3), {"pads": [1, 1]}),  # 1-D
        ((1, 300, 3, 4), (7, 300, 1, 1), {}),  # K > 258
    ],
)
def test_conv_kernel(xshape, wshape, attrs) -> None:
    rng = np.random.default_rng(sum(xshape) + sum(wshape))
    x, w, b = (rng.standard_normal(s).astype(F32) for s in (xshape, wshape, (wshape[0],)))
    kernel, reason = bind("Conv", [value("x"), value("w", w), value("b", b)], attrs)
    assert kernel is not None, reason
    assert kernel.name.startswith("native:conv_f32_")
    y64 = conv_twin(None, x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), **attrs)
    mag = conv_twin(
        None,
        np.abs(x).astype(np.float64),
        np.abs(w).astype(np.float64),
        np.abs(b).astype(np.float64),
        **attrs,
    )
    k = w[0].size
    check_kernel("Conv", kernel, [x, w, b], attrs, y64, mag, k)


@pytest.mark.parametrize(
    "xshape,wshape,attrs",
    [
        ((1, 8, 5, 6), (8, 3, 2, 2), {"strides": [2, 2]}),  # the ppocr_det upsampling
        ((2, 6, 4, 5), (6, 2, 3, 3), {"group": 3, "strides": [2, 1], "pads": [1, 0, 0, 1]}),
        ((1, 4, 3, 4), (4, 5, 3, 3), {"strides": [2, 2], "output_padding": [1, 1], "dilations": [1, 2]}),
        ((1, 3, 4, 4), (3, 7, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ],
)
def test_conv_transpose_kernel(xshape, wshape, attrs) -> None:
    rng = np.random.default_rng(sum(xshape) + sum(wshape))
    group = attrs.get("group", 1)
    x, w, b = (rng.standard_normal(s).astype(F32) for s in (xshape, wshape, (wshape[1] * group,)))
    kernel, reason = bind("ConvTranspose", [value("x"), value("w", w), value("b", b)], attrs)
    assert kernel is not None, reason
    y64 = conv_transpose_twin(None, x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), **attrs)
    mag = conv_transpose_twin(
        None,
        np.abs(x).astype(np.float64),
        np.abs(w).astype(np.float64),
        np.abs(b).astype(np.float64),
        **attrs,
    )
    # each output sums at most kh·kw columns of C/G products, then the bias
    k = (xshape[1] // group) + wshape[2] * wshape[3]
    check_kernel("ConvTranspose", kernel, [x, w, b], attrs, y64, mag, k)


@pytest.mark.parametrize(
    "xshape,wshape,attrs",
    [
        ((1, 32, 2, 4, 4), (32, 16, 2, 2, 2), {"strides": [2, 2, 2]}),  # a 3-D U-Net's upsampling
        ((2, 6, 3, 4, 5), (6, 2, 3, 3, 3), {"group": 3, "strides": [2, 1, 2], "pads": [1, 0, 1, 0, 1, 1]}),
        (
            (1, 3, 4, 3, 3),
            (3, 7, 3, 2, 3),
            {"strides": [1, 2, 2], "output_padding": [0, 1, 1], "dilations": [2, 1, 1]},
        ),
        ((1, 5, 3, 3, 2), (5, 4, 2, 3, 3), {"strides": [2, 2, 2], "auto_pad": "SAME_UPPER"}),
    ],
)
def test_conv_transpose_3d_kernel(xshape, wshape, attrs) -> None:
    """Per kernel depth a 2-D col2im with the input depths as the batch, added into the
    output depths it reaches, the bias at the end: within (FG1) with K = C/G + KD·KH·KW + 1."""
    rng = np.random.default_rng(sum(xshape) + sum(wshape))
    group = attrs.get("group", 1)
    x, w, b = (rng.standard_normal(s).astype(F32) for s in (xshape, wshape, (wshape[1] * group,)))
    kernel, reason = bind("ConvTranspose", [value("x"), value("w", w), value("b", b)], attrs)
    assert kernel is not None, reason
    assert kernel.name.startswith("native:conv_transpose3d_f32_")
    y64 = conv_transpose_twin(None, x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), **attrs)
    mag = conv_transpose_twin(None, *(np.abs(a).astype(np.float64) for a in (x, w, b)), **attrs)
    k = (xshape[1] // group) + wshape[2] * wshape[3] * wshape[4] + 1
    check_kernel("ConvTranspose", kernel, [x, w, b], attrs, y64, mag, k)


@given(
    batch=st.sampled_from([(), (1,), (3,), (2, 3)]),
    m=st.integers(1, 20),
    k=st.integers(1, 300),
    n=st.integers(1, 40),
    const_b=st.booleans(),
)
def test_matmul_kernel(batch, m, k, n, const_b) -> None:
    rng = np.random.default_rng(m * 7 + k * 3 + n)
    a = rng.standard_normal((*batch, m, k)).astype(F32)
    b = rng.standard_normal((k, n) if const_b else (*batch, k, n)).astype(F32)
    kernel, reason = bind("MatMul", [value("a"), value("b", b) if const_b else value("b")])
    assert kernel is not None, reason
    assert kernel.name == ("native:matmul_f32_packed" if const_b else "native:matmul_f32")
    y64 = np.matmul(a.astype(np.float64), b.astype(np.float64))
    mag = np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64))
    check_kernel("MatMul", kernel, [a, b], {}, y64, mag, k)


def test_matmul_vector_operand_with_packed_weight() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(37).astype(F32), rng.standard_normal((37, 5)).astype(F32)
    kernel, _ = bind("MatMul", [value("a"), value("b", b)])
    y64 = a.astype(np.float64) @ b.astype(np.float64)
    check_kernel("MatMul", kernel, [a, b], {}, y64, np.abs(a).astype(np.float64) @ np.abs(b), 37)


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (), (1,), (17,), (1, 17), (9, 1), (9, 17)])
@pytest.mark.parametrize("const_b", [True, False])
def test_gemm_kernel(trans_a, trans_b, c_shape, const_b) -> None:
    rng = np.random.default_rng(11)
    m, k, n = 9, 260, 17
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(F32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(F32)
    c = None if c_shape is None else rng.standard_normal(c_shape).astype(F32)
    attrs = {"transA": trans_a, "transB": trans_b, "alpha": 0.75, "beta": -1.5}
    a_value = value("a", shape=a.shape)
    inputs = [a_value, value("b", b) if const_b else value("b")] + ([] if c is None else [value("c", c)])
    kernel, reason = bind("Gemm", inputs, attrs)
    assert kernel is not None, reason
    a64 = (a.T if trans_a else a).astype(np.float64)
    b64 = (b.T if trans_b else b).astype(np.float64)
    y64 = 0.75 * (a64 @ b64)
    mag = 0.75 * (np.abs(a64) @ np.abs(b64))
    if c is not None:
        y64 = y64 - 1.5 * c.astype(np.float64)
        mag = mag + 1.5 * np.abs(c.astype(np.float64))
    check_kernel(
        "Gemm", kernel, [a, b] + ([] if c is None else [c]), attrs, y64, np.broadcast_to(mag, y64.shape), k
    )


# --------------------------------------------------------------------------------------
# 2. refusals and hand-overs
# --------------------------------------------------------------------------------------


def test_binders_refuse_with_reasons() -> None:
    w = np.ones((4, 3, 3, 3), F32)
    assert bind("Conv", [value("x"), value("w")])[1] == (
        "weights w are not a constant (the native kernel packs them at compile time)"
    )
    assert "rank 6" in bind("Conv", [value("x"), value("w", np.ones((4, 3, 2, 2, 2, 2), F32))])[1]
    assert bind("Conv", [value("x", dtype=np.float64), value("w", w)])[1] == (
        "native float Conv takes float32 x, got float64"
    )
    assert "float32 B" in bind("MatMul", [value("a"), value("b", dtype=np.float16)])[1]
    assert "rank 4" in bind("ConvTranspose", [value("x"), value("w", np.ones((3, 4, 3), F32))])[1]


def test_run_time_hand_over_to_the_twin() -> None:
    """A call outside the native path (float64 inputs despite unknown types) is computed by
    the twin and counted."""
    kernel, _ = bind("MatMul", [value("a", dtype=None), value("b", dtype=None)])
    a, b = np.ones((2, 3)), np.ones((3, 4))
    before = RUNTIME_FALLBACKS["MatMul"]
    y = kernel.fn(KernelContext(opset=21), a, b, **kernel.params)
    assert y.dtype == np.float64 and (y == 3).all()
    assert RUNTIME_FALLBACKS["MatMul"] == before + 1


# --------------------------------------------------------------------------------------
# 3. a float model through a session
# --------------------------------------------------------------------------------------


def float_model(seed: int = 0):
    """Conv stem (weights in a Constant node, as Paddle exports), depthwise, pointwise,
    ConvTranspose, a Gemm head and an attention-style MatMul of two activations."""
    rng = np.random.default_rng(seed)

    def t(name, *shape, s=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * s).astype(F32), name)

    nodes = [
        helper.make_node("Constant", [], ["w0"], value=t("w0v", 8, 3, 3, 3)),
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "w1"], ["c1"], group=8, pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c1", "w2", "b2"], ["c2"]),
        helper.make_node("ConvTranspose", ["c2", "w3", "b3"], ["c3"], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["c3"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "w4", "b4"], ["logits"], transB=1, alpha=0.5),
        helper.make_node("Reshape", ["c2", "shape"], ["seq"]),
        helper.make_node("Transpose", ["seq"], ["seq_t"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["seq", "seq_t"], ["att"]),
    ]
    graph = helper.make_graph(
        nodes,
        "float_gemm_family",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 17, 19])],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("att", TensorProto.FLOAT, None),
        ],
        [
            t("b0", 8),
            t("w1", 8, 1, 3, 3),
            t("w2", 17, 8, 1, 1),
            t("b2", 17),
            t("w3", 17, 7, 2, 2),
            t("b3", 7),
            t("w4", 5, 7),
            t("b4", 5),
            numpy_helper.from_array(np.array([1, 17, 90], np.int64), "shape"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_float_model_runs_the_gemm_family_natively() -> None:
    model = float_model()
    x = np.random.default_rng(1).standard_normal((1, 3, 17, 19)).astype(F32)
    want = quanta.InferenceSession(model, backend="reference").run(None, {"x": x})
    for threads in (1, 2):
        opts = quanta.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = quanta.InferenceSession(model, sess_options=opts, backend="native")
        family = [f for f in sess.fallbacks if f[1] in ("Conv", "ConvTranspose", "MatMul", "Gemm")]
        assert family == []
        got = sess.run(None, {"x": x})
        for w, g in zip(want, got, strict=True):
            # float32 vs float32 through a few layers: a relative bound well above the
            # (FG1) growth of 5 layers of K <= 72, far below any wrong window or weight
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * float(np.abs(w).max()))
        if threads == 1:
            first = got
        else:
            assert all(a.tobytes() == b.tobytes() for a, b in zip(first, got, strict=True))


def test_float_graph_folds_batchnorm_and_constant_weights() -> None:
    """A float graph compiles with optimize_float: the Constant-node weights become
    constants and the BatchNormalization folds into the Conv before it, on both targets
    (so the reference is the golden of the folded graph)."""
    rng = np.random.default_rng(4)

    def t(name, *shape, lo=-0.5, hi=0.5):
        return numpy_helper.from_array(rng.uniform(lo, hi, shape).astype(F32), name)

    nodes = [
        helper.make_node("Constant", [], ["w"], value=t("wv", 7, 3, 3, 3)),
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["y"], epsilon=1e-3),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_bn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 11])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [t("g", 7, lo=0.5, hi=2), t("beta", 7), t("mean", 7), t("var", 7, lo=0.1, hi=2)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((1, 3, 9, 11)).astype(F32)
    ref = quanta.InferenceSession(model, backend="reference")
    nat = quanta.InferenceSession(model, backend="native")
    assert [s.op_type for s in ref.plan.steps] == [s.op_type for s in nat.plan.steps] == ["Conv"]
    assert nat.plan.steps[0].kernel.name == "native:conv_f32_im2col_3x3"
    opts = quanta.SessionOptions()
    opts.graph_optimization_level = quanta.GraphOptimizationLevel.ORT_DISABLE_ALL
    as_written = quanta.InferenceSession(model, sess_options=opts, backend="reference").run(None, {"x": x})[0]
    want = ref.run(None, {"x": x})[0]
    # folding rounds the scaled weights once instead of scaling each output: float32 noise
    np.testing.assert_allclose(want, as_written, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(nat.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------
# 4. Relu / Clip fused into the float Conv (quanta::Conv)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "wshape,attrs,activation",
    [
        ((17, 7, 1, 1), {}, {"activation": "Relu"}),
        (
            (7, 1, 3, 3),
            {"group": 7, "pads": [1, 1, 1, 1], "strides": [2, 2]},
            {"activation": "Clip", "activation_params": [-0.25, 0.5]},
        ),
        ((5, 7, 3, 3), {"pads": [0, 1, 2, 1]}, {"activation": "Clip", "activation_params": [0.0, 6.0]}),
    ],
)
def test_fused_conv_kernel_clamps_in_the_store(wshape, attrs, activation) -> None:
    """quanta::Conv: the clamp of the GEMM / depthwise epilogue, within (FG1) of the
    clamped float64 result (a clamp never widens an error)."""
    rng = np.random.default_rng(sum(wshape))
    x = rng.standard_normal((1, 7, 9, 11)).astype(F32)
    w, b = rng.standard_normal(wshape).astype(F32), rng.standard_normal(wshape[0]).astype(F32)
    node = Node(
        "Conv",
        [value("x"), value("w", w), value("b", b)],
        [Value("y")],
        {**attrs, **activation},
        domain="quanta",
    )
    kernel, reason = BINDERS[("quanta", "Conv")](None, node)
    assert kernel is not None, reason
    assert kernel.name.endswith("_clamp")
    lo, hi = activation.get("activation_params", [0.0, np.inf])
    y64 = np.clip(
        conv_twin(None, x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), **attrs), lo, hi
    )
    mag = conv_twin(
        None,
        np.abs(x).astype(np.float64),
        np.abs(w).astype(np.float64),
        np.abs(b).astype(np.float64),
        **attrs,
    )
    assert (y64 == lo).any() and (y64 > lo).any(), "the data must reach the clamp"
    check_kernel("quanta::Conv", kernel, [x, w, b], {**attrs, **activation}, y64, mag, w[0].size)


def test_fused_conv_binder_refuses_an_unknown_activation() -> None:
    w = np.ones((3, 2, 1, 1), F32)
    node = Node("Conv", [value("x"), value("w", w)], [Value("y")], {"activation": "Tanh"}, domain="quanta")
    kernel, reason = BINDERS[("quanta", "Conv")](None, node)
    assert kernel is None and "Tanh" in reason


def test_float_graph_fuses_relu_and_clip_into_conv() -> None:
    """optimize_float turns Conv -> Relu and Conv -> Clip into quanta::Conv on both
    targets; the reference of the fused graph is bit for bit the graph as written (Conv,
    then the clamp), the native one within the float tolerance. A Conv whose output has a
    second reader, and a Clip with a computed bound, stay as written."""
    rng = np.random.default_rng(7)

    def t(name, *shape):
        return numpy_helper.from_array(rng.uniform(-0.5, 0.5, shape).astype(F32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "w1"], ["c1"], group=7, pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"]),
        helper.make_node("Relu", ["c2"], ["r2"]),  # c2 also read by the Add: not fused
        helper.make_node("Add", ["r2", "c2"], ["s"]),
        helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
        helper.make_node("Conv", ["s", "w3"], ["c3"]),
        helper.make_node("Clip", ["c3", "lo", "m"], ["y"]),  # a computed bound: not fused
    ]
    graph = helper.make_graph(
        nodes,
        "conv_act",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 11])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            t("w0", 7, 3, 3, 3),
            t("b0", 7),
            t("w1", 7, 1, 3, 3),
            t("w2", 5, 7, 1, 1),
            t("w3", 3, 5, 1, 1),
            numpy_helper.from_array(np.array(-0.1, F32), "lo"),
            numpy_helper.from_array(np.array(0.3, F32), "hi"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((1, 3, 9, 11)).astype(F32)
    ref = quanta.InferenceSession(model, backend="reference")
    nat = quanta.InferenceSession(model, backend="native")
    for sess in (ref, nat):
        ops = [(s.node.domain, s.op_type) for s in sess.plan.steps]
        assert ops.count(("quanta", "Conv")) == 2 and ops.count(("", "Conv")) == 2, ops
        assert ops.count(("", "Relu")) == 1 and ops.count(("", "Clip")) == 1, ops
    assert [s.kernel.name for s in nat.plan.steps if s.node.domain == "quanta"] == [
        "native:conv_f32_im2col_3x3_clamp",
        "native:conv_f32_dw_3x3_clamp",
    ]
    opts = quanta.SessionOptions()
    opts.graph_optimization_level = quanta.GraphOptimizationLevel.ORT_DISABLE_ALL
    as_written = quanta.InferenceSession(model, sess_options=opts, backend="reference").run(None, {"x": x})[0]
    want = ref.run(None, {"x": x})[0]
    assert want.tobytes() == as_written.tobytes()
    np.testing.assert_allclose(nat.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("k", "rows_path"), [(1, "pointwise_rows"), (3, "im2col_rows")])
def test_session_runs_small_plane_convolutions_as_pixel_rows(monkeypatch, k, rows_path) -> None:
    """A 1x1 or 3x3 Conv + HardSwish on a 7x7 plane (a MobileNet / ResNet tail) is
    specialized to the pixels-as-rows GEMM (sgemm.h kPointwiseRows, kIm2colRows) and gives
    conv_f32's NCHW bytes, at 1 and 2 threads; a 40x40 plane keeps the NCHW GEMM (the
    blocked layout, which would take this chain, is off: this is the NCHW path's test)."""
    monkeypatch.setenv("QUANTA_NCHWC", "0")
    rng = np.random.default_rng(7)
    wt, b = rng.standard_normal((256, 17, k, k)).astype(F32), rng.standard_normal(256).astype(F32)
    pads = [k // 2] * 4
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], pads=pads),
            helper.make_node("HardSwish", ["c"], ["y"]),
        ],
        "pw",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 17, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(wt, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    packed = _native.conv_pack_f32(wt, 1)
    conv_f32, conv_call, calls = _native.conv_f32, _native.ConvF32Call, []

    def recording(*args, **kwargs):
        calls.append(kwargs.get("rows", False))
        return conv_f32(*args, **kwargs)

    def recording_call(*args):  # a specialized step: conv_f32 bound once, rows its last argument
        bound = conv_call(*args)

        def call(x):
            calls.append(args[-1])
            return bound(x)

        return call

    monkeypatch.setattr(_native, "conv_f32", recording)
    monkeypatch.setattr(_native, "ConvF32Call", recording_call)
    for hw in (7, 40):
        x = rng.standard_normal((1, 17, hw, hw)).astype(F32)
        geometry = (256, k, k, [1, 1], [1, 1], pads, 1)
        assert _native.conv_path_f32(x, *geometry, rows=True) == (rows_path if hw == 7 else rows_path[:-5])
        want = conv_f32(x, packed, b, *geometry, post=2)
        for threads in (1, 2):
            opts = quanta.SessionOptions()
            opts.intra_op_num_threads = threads
            sess = quanta.InferenceSession(model, sess_options=opts, backend="native")
            for _ in range(2):  # the first run measures, later ones take the specialized step
                calls.clear()
                (got,) = sess.run(None, {"x": x})
                assert got.tobytes() == want.tobytes(), (hw, threads)
            assert calls == [hw == 7], (hw, threads, calls)
