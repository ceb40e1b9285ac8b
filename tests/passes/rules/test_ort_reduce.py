"""ReduceToOrtReduce (passes/rules/ort_float_functions.py): float32 ReduceMean / ReduceSum
over the trailing axes become ONNX Runtime's row sums in Eigen's order, (ER1)-(ER4) of
docs/float-ops.md. The twin (reference/ort_float.py ``eigen_sum_rows``) is onnxruntime's
kernel bit for bit (rows longer than 258, odd lengths, every a0, rows shorter than a
packet), and quanta's own order (R1)-(R3) is not; the native kernel
(``ort_reduce_rows_f32``) is the twin on every ISA and thread count; the rule fires on
the trailing axes only, and leaves a norm written out to FuseLayerNorm / FuseRMSNorm."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from quanta.ir.onnx_io import load
from quanta.kernels import _native
from quanta.kernels.reference.ort_float import eigen_sum_rows, ort_reduce_mean_op, ort_reduce_sum_op
from quanta.kernels.reference.registry import OpContext
from quanta.passes.rules.ort_float_functions import OrtFloatFunctions
from quanta.session import InferenceSession, SessionOptions
from tests.passes.helpers import run_passes, run_ref

ISAS = list(_native.supported_isas())

# (shape, axes): NCHW's spatial mean (the SE block), odd rows, rows past 258, every
# a0 = (−d·N) mod 4, rows shorter than a packet, all axes
CASES = [
    ((1, 64, 29, 29), [2, 3]),
    ((3, 7, 17), [-1]),
    ((5, 3, 300), [2]),
    ((2, 3, 5, 7), [1, 2, 3]),
    ((4, 513), [1]),
    ((9, 258), [1]),
    ((7, 1), [1]),
    ((11, 3), [1]),
    ((6, 2), [1]),
    ((33, 37), [1]),
    ((5, 6), [0, 1]),
    ((2, 3, 1, 9), [2, 3]),
]


def reduce_proto(op: str, shape, axes, keepdims=1, opset=18, producer="onnx.quantize"):
    """y = op(Neg(x), axes): the Neg makes the reduced tensor one of ORT's own buffers."""
    inputs = ["nx"]
    inits = []
    attrs = {"keepdims": keepdims}
    if (op == "ReduceMean" and opset < 18) or (op == "ReduceSum" and opset < 13):
        attrs["axes"] = axes
    else:
        inits.append(helper.make_tensor("axes", TensorProto.INT64, [len(axes)], axes))
        inputs.append("axes")
    g = helper.make_graph(
        [
            helper.make_node("Neg", ["x"], ["nx"], name="neg"),
            helper.make_node(op, inputs, ["y"], name="red", **attrs),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.producer_name = producer
    return m


def data(shape, seed=3):
    """Values over 14 decades, so that every order of the sum gives its own bits."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * np.exp(rng.uniform(-7, 7, shape))).astype(np.float32)


def ort_run(proto, f):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, f
    )[0]


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum"])
@pytest.mark.parametrize(("shape", "axes"), CASES)
def test_twin_is_onnxruntime_bit_for_bit_and_sum16_is_not(op, shape, axes):
    x = data(shape)
    want = ort_run(reduce_proto(op, shape, axes), {"x": x})
    fn = ort_reduce_mean_op if op == "ReduceMean" else ort_reduce_sum_op
    got = fn(OpContext(op_type="Ort" + op), -x, axes=axes, keepdims=1)
    np.testing.assert_array_equal(got, want)


def test_quanta_order_differs_from_orts_on_long_rows():
    x = data((1, 64, 29, 29))
    proto = reduce_proto("ReduceMean", x.shape, [2, 3], producer="")
    assert np.count_nonzero(run_ref(load(proto), {"x": x})[0] != ort_run(proto, {"x": x})) > 32


def test_eigen_sum_is_the_stated_order():
    """(ER1)-(ER4) one scalar at a time, on values where the order shows in the result."""
    f = np.float32
    n = 23
    rows = data((4, n), seed=9)
    for d in range(4):
        x = rows[d]
        a0 = min((-d * n) % 4, n)
        k = (n - a0) // 4
        pk = [x[a0 + 4 * j : a0 + 4 * j + 4] for j in range(k)]
        p0, p1 = pk[0].copy(), pk[1].copy()
        for j in range(1, k // 2):
            p0, p1 = p0 + pk[2 * j], p1 + pk[2 * j + 1]
        p0 = p0 + p1
        if k % 2:
            p0 = p0 + pk[k - 1]
        s = f(f(p0[0] + p0[2]) + f(p0[1] + p0[3]))
        for i in [*range(a0), *range(a0 + 4 * k, n)]:
            s = f(s + x[i])
        assert eigen_sum_rows(rows)[d] == s, d
    short = np.array([[3e-8, 1.0, -1.0]], np.float32)  # a0 = 0 but no whole packet: (ER4)
    assert eigen_sum_rows(short)[0] == f(f(f(3e-8) + f(1)) - f(1))


@pytest.mark.parametrize(("shape", "axes"), CASES)
def test_native_kernel_is_the_twin_on_every_isa_and_thread_count(shape, axes):
    x = data(shape, seed=5)
    n = int(np.prod([shape[a] for a in axes]))
    rows = x.reshape(-1, n)
    want_sum = eigen_sum_rows(rows)
    want_mean = np.divide(want_sum, np.float32(n), dtype=np.float32)
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            for threads in (1, 2):
                np.testing.assert_array_equal(_native.ort_reduce_rows_f32(rows, False, threads), want_sum)
                out = np.empty(rows.shape[0], np.float32)
                _native.ort_reduce_rows_f32(rows, True, threads, out)
                np.testing.assert_array_equal(out, want_mean)
    finally:
        _native.clear_isa()


@pytest.mark.parametrize("backend", ["native", "reference"])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize(("op", "opset"), [("ReduceMean", 13), ("ReduceMean", 18), ("ReduceSum", 13)])
def test_session_runs_orts_reduction_for_orts_files(backend, keepdims, op, opset):
    shape = (2, 7, 17, 19)
    proto = reduce_proto(op, shape, [2, 3], keepdims, opset)
    x = data(shape, seed=8)
    want = ort_run(proto, {"x": x})
    sess = InferenceSession(proto, backend=backend)
    assert "Ort" + op in {n.op_type for n in sess.model.graph.nodes}
    assert sess.fallbacks == [] or backend == "reference"
    for threads in (1, 2):
        so = SessionOptions()
        so.intra_op_num_threads = threads
        np.testing.assert_array_equal(
            InferenceSession(proto, so, backend=backend).run(None, {"x": x})[0], want
        )
    onnx_sess = InferenceSession(proto, SessionOptions(float_functions="onnx"), backend=backend)
    assert op in {n.op_type for n in onnx_sess.model.graph.nodes}


def test_middle_axes_are_left_with_their_reason():
    model = load(reduce_proto("ReduceMean", (2, 7, 17), [1]))
    p = OrtFloatFunctions()
    result = run_passes(model, [p])
    assert not result.records[0].modified
    assert [r.reason for r in p.why_not("ReduceToOrtReduce")] == [
        "axes [1] are not the trailing axes of rank 3 (ORT: KRK / RK, not modelled)"
    ]


def layer_norm_proto():
    """A LayerNorm written out (mean, x − mean, Pow 2, mean, + eps, Sqrt, Div), and an RMS
    norm of its output written with Mul(a, a)."""
    c = lambda name, v: helper.make_tensor(name, TensorProto.FLOAT, [], [v])  # noqa: E731
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1], name="mean"),
        helper.make_node("Sub", ["x", "mu"], ["d"], name="sub"),
        helper.make_node("Pow", ["d", "two"], ["d2"], name="pow"),
        helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1], name="var"),
        helper.make_node("Add", ["var", "eps"], ["ve"], name="add"),
        helper.make_node("Sqrt", ["ve"], ["sd"], name="sqrt"),
        helper.make_node("Div", ["d", "sd"], ["ln"], name="div"),
        helper.make_node("Mul", ["ln", "ln"], ["sq"], name="sq"),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], name="ms"),
        helper.make_node("Add", ["ms", "eps"], ["mse"], name="add2"),
        helper.make_node("Sqrt", ["mse"], ["rms"], name="sqrt2"),
        helper.make_node("Div", ["ln", "rms"], ["y"], name="div2"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5, 300])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5, 300])],
        [c("two", 2.0), c("eps", 1e-5)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.producer_name = "onnx.quantize"
    return m


def test_norms_written_out_are_left_to_the_norm_fusions():
    model = load(layer_norm_proto())
    p = OrtFloatFunctions()
    result = run_passes(model, [p])
    assert not result.records[0].modified
    assert [r.reason for r in p.why_not("ReduceToOrtReduce")] == [
        "the ReduceMean belongs to a written-out norm (FuseLayerNorm / FuseRMSNorm)"
    ] * 3
    # and the session still fuses them, with the float functions of ORT's files on
    x = data((3, 5, 300), seed=4)
    for backend in ("native", "reference"):
        sess = InferenceSession(layer_norm_proto(), backend=backend)
        ops = [n.op_type for n in sess.model.graph.nodes]
        assert "ReduceMean" not in ops and "OrtReduceMean" not in ops, ops
        plain = InferenceSession(layer_norm_proto(), SessionOptions(float_functions="onnx"), backend=backend)
        assert [n.op_type for n in plain.model.graph.nodes] == ops
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], plain.run(None, {"x": x})[0])


def split_norm_mean_proto():
    """A global LayerNorm's centring as ORT's quantizer leaves it (Conv-TasNet's gLN):
    mean over the trailing axes, x − mean, and the difference read only by a
    QuantizeLinear; the mean is an output too, to compare its bits."""
    nodes = [
        helper.make_node("Neg", ["x"], ["nx"], name="neg"),
        helper.make_node("ReduceMean", ["nx"], ["mu"], axes=[1, 2], name="mean"),
        helper.make_node("Sub", ["nx", "mu"], ["d"], name="sub"),
        helper.make_node("QuantizeLinear", ["d", "s", "z"], ["dq8"], name="q"),
        helper.make_node("DequantizeLinear", ["dq8", "s", "z"], ["y"], name="dq"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 37, 301])],
        [
            helper.make_tensor_value_info("mu", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor("s", TensorProto.FLOAT, [], [0.0173]),
            helper.make_tensor("z", TensorProto.UINT8, [], [117]),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])
    m.producer_name = "onnx.quantize"
    return m


@pytest.mark.parametrize("backend", ["native", "reference"])
def test_mean_of_a_norm_split_by_quantization_is_orts_reduction(backend):
    """The difference x − mean read only by a QuantizeLinear: no norm fusion takes it, so the
    mean takes ORT's order (it kept quanta's 16 lanes, 1 LSB off ORT's codes in Conv-TasNet)."""
    proto = split_norm_mean_proto()
    x = np.random.default_rng(5).uniform(0.0, 1.5, (1, 37, 301)).astype(np.float32)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    want = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    sess = InferenceSession(proto, backend=backend)
    assert "OrtReduceMean" in {n.op_type for n in sess.model.graph.nodes}
    got = sess.run(None, {"x": x})
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    # the order matters here: the plain reduction gives other bits of the mean
    plain = InferenceSession(proto, SessionOptions(float_functions="onnx"), backend=backend)
    assert not np.array_equal(plain.run(None, {"x": x})[0], want[0])
