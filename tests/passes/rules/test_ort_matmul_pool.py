"""ort_float_functions' MatMul, AveragePool and norm-fusion rules against ONNX Runtime:
sessions with ``float_functions="ort"`` equal ORT's default session bit for bit.

Failure signature this guards against: g2pid_tiny.ort_dynamic (ORT fuses its post-norm
residual Adds into SkipLayerNormalization, Welford's sums) and PaddleOCR's first encoder
norm (a row length shape inference does not know) computed with the plain LayerNorm
kernel or quanta's own, so a DynamicQuantizeLinear downstream picks another scale."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.passes.manager import PassManager
from quanta.passes.rules.ort_float_functions import OrtFloatFunctions

F32 = np.float32


def _data(rng: np.random.Generator, shape) -> np.ndarray:
    return (rng.standard_normal(shape) * np.exp(rng.uniform(-2, 2, shape))).astype(F32)


def _both(model, feeds, threads: int = 1):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    want = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    qo = quanta.SessionOptions()
    qo.float_functions = "ort"
    qo.intra_op_num_threads = threads
    got = quanta.InferenceSession(model.SerializeToString(), qo).run(None, feeds)
    return want, got


def _model(nodes, ins, outs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", ins, outs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def test_scaled_attention_and_pool_equal_onnxruntime():
    """Div(Q, c) · Kᵀ (ORT: FusedMatMul, alpha = f32(1 / c)) -> Softmax -> · V, and an
    AveragePool; at 1 and 2 threads (MLAS's schedule follows ORT's thread count)."""
    rng = np.random.default_rng(5)
    q, k, v = (_data(rng, (1, 2, 9, 32)) for _ in range(3))
    x = _data(rng, (1, 16, 6, 10))
    nodes = [
        helper.make_node("Div", ["q", "c"], ["qs"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["qs", "kt"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
        helper.make_node("Relu", ["x"], ["xr"]),
        helper.make_node("AveragePool", ["xr"], ["z"], kernel_shape=[3, 2], strides=[3, 2]),
    ]
    ins = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, list(t.shape))
        for n, t in zip("qkvx", (q, k, v, x))
    ]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "yz"]
    m = _model(nodes, ins, outs, [numpy_helper.from_array(np.array(5.656854, F32), "c")], opset=13)
    for threads in (1, 2):
        want, got = _both(m, {"q": q, "k": k, "v": v, "x": x}, threads)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g, w)


# (shape of a and b, whether the sum is read elsewhere too): ORT fuses only rank 3 with one reader
SKIP_CASES = [((28, 1, 64), False), ((1, 28, 64), False), ((28, 64), False), ((28, 1, 64), True)]


@pytest.mark.parametrize("written", [False, True], ids=["LayerNormalization", "written-out"])
@pytest.mark.parametrize("case", SKIP_CASES, ids=str)
def test_norm_of_a_sum_takes_the_kernel_ort_fuses_it_into(case, written):
    shape, extra = case
    rng = np.random.default_rng(len(shape) + extra)
    a, b = _data(rng, shape), _data(rng, shape)
    w, bias = _data(rng, (64,)), _data(rng, (64,))
    nodes = [helper.make_node("Add", ["a", "b"], ["s"])]
    if written:
        nodes += [
            helper.make_node("ReduceMean", ["s"], ["mu"], axes=[-1]),
            helper.make_node("Sub", ["s", "mu"], ["d"]),
            helper.make_node("Pow", ["d", "two"], ["d2"]),
            helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1]),
            helper.make_node("Add", ["var", "eps"], ["ve"]),
            helper.make_node("Sqrt", ["ve"], ["sd"]),
            helper.make_node("Div", ["d", "sd"], ["n"]),
            helper.make_node("Mul", ["n", "w"], ["nw"]),
            helper.make_node("Add", ["nw", "bias"], ["y"]),
        ]
    else:
        nodes.append(helper.make_node("LayerNormalization", ["s", "w", "bias"], ["y"], axis=-1, epsilon=1e-5))
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra:
        nodes.append(helper.make_node("Relu", ["s"], ["r"]))
        outs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)) for n in "ab"]
    inits = [numpy_helper.from_array(t, n) for n, t in (("w", w), ("bias", bias))]
    inits += [
        numpy_helper.from_array(np.array(2, F32), "two"),
        numpy_helper.from_array(np.array(1e-5, F32), "eps"),
    ]
    want, got = _both(_model(nodes, ins, outs, inits, opset=17 if not written else 13), {"a": a, "b": b})
    for w_, g in zip(want, got):
        np.testing.assert_array_equal(g, w_)


def test_written_norm_of_unknown_row_length_is_fused_as_ort_fuses_it():
    """A row length shape inference does not know (a named dimension): ORT's LayerNormFusion
    still fuses the one-row scale and bias; so does the rule, and the result is ORT's."""
    rng = np.random.default_rng(9)
    x = _data(rng, (1, 40, 120))
    w, bias = _data(rng, (120,)), _data(rng, (120,))
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]),
        helper.make_node("Sub", ["x", "mu"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["d2"]),
        helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["d", "sd"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["nw"]),
        helper.make_node("Add", ["nw", "bias"], ["y"]),
    ]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "t", "d"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    inits = [numpy_helper.from_array(t, n) for n, t in (("w", w), ("bias", bias))]
    inits += [
        numpy_helper.from_array(np.array(2, F32), "two"),
        numpy_helper.from_array(np.array(1e-5, F32), "eps"),
    ]
    m = _model(nodes, ins, outs, inits, opset=13)
    graph = load(m)
    PassManager([OrtFloatFunctions(threads=1)]).run(graph)
    assert [n.op_type for n in graph.graph.nodes] == ["OrtLayerNorm"]
    want, got = _both(m, {"x": x})
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize(
    "k_shape, perm",
    [((1, 7, 2, 64), [0, 2, 3, 1]), ((7, 2, 64), [1, 2, 0]), ((2, 7, 64), [0, 2, 1])],
    ids=["rank-4 (t5: stays a Transpose)", "rank-3 (1, 2, 0): transBatchB + transB", "last two swapped"],
)
def test_one_query_row_takes_the_kernel_of_how_ort_reads_b(k_shape, perm):
    """M = 1 (one token): MLAS's M = 1 kernel, or its N = 1 kernel over B's columns where
    ORT folds the key's Transpose into FusedMatMul (transB); the rule follows ORT's fusion."""
    rng = np.random.default_rng(11)
    k = _data(rng, k_shape)
    kt_shape = tuple(k_shape[i] for i in perm)
    q = _data(rng, (*kt_shape[:-2], 1, kt_shape[-2]))
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=perm),
        helper.make_node("MatMul", ["q", "kt"], ["y"]),
    ]
    ins = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, list(t.shape)) for n, t in (("q", q), ("k", k))
    ]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    want, got = _both(_model(nodes, ins, outs, opset=13), {"q": q, "k": k})
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize("constant_nodes", [False, True], ids=["initializers", "Constant nodes"])
@pytest.mark.parametrize("gelu_is_output", [False, True], ids=["read by a Mul", "a graph output"])
def test_written_tanh_gelu_is_orts_fast_gelu_where_ort_fuses_it(constant_nodes, gelu_is_output):
    """T5's gelu_new written out (Pow, Mul by C, Add, Mul by K, Tanh, Add 1, Mul 0.5, Mul)
    then a Mul (T5's gate): ORT's FastGeluFusion runs it as FastGelu, (FG1); as a graph
    output it stays the written ops (fast_gelu_fusion.cc CheckNode). The rule follows, also
    with the constants in Constant nodes (the pass runs before constant folding)."""
    rng = np.random.default_rng(13)
    x = (rng.standard_normal((1, 26, 1024)) * 3).astype(F32)
    g = rng.standard_normal((1, 26, 1024)).astype(F32)
    consts = {"three": 3.0, "c": 0.044715, "k": 0.7978845608028654, "one": 1.0, "half": 0.5}
    nodes, inits = [], []
    for name, value in consts.items():
        arr = np.array(value, F32)
        if constant_nodes:
            nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(arr)))
        else:
            inits.append(numpy_helper.from_array(arr, name))
    nodes += [
        helper.make_node("Mul", ["x", "half"], ["h"]),
        helper.make_node("Pow", ["x", "three"], ["p"]),
        helper.make_node("Mul", ["p", "c"], ["pc"]),
        helper.make_node("Add", ["x", "pc"], ["s"]),
        helper.make_node("Mul", ["s", "k"], ["a"]),
        helper.make_node("Tanh", ["a"], ["t"]),
        helper.make_node("Add", ["t", "one"], ["t1"]),
        helper.make_node("Mul", ["h", "t1"], ["gelu"]),
    ]
    if not gelu_is_output:
        nodes.append(helper.make_node("Mul", ["gelu", "g"], ["y"]))
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(x.shape)) for n in "xg"]
    outs = [helper.make_tensor_value_info("gelu" if gelu_is_output else "y", TensorProto.FLOAT, None)]
    m = _model(nodes, ins, outs, inits, opset=13)
    graph = load(m)
    PassManager([OrtFloatFunctions()]).run(graph)
    assert ("OrtFastGelu" in [n.op_type for n in graph.graph.nodes]) != gelu_is_output
    want, got = _both(m, {"x": x, "g": g})
    np.testing.assert_array_equal(got[0], want[0])


# (a shape, b shape, scaled): shapes the specialized call reads in place (equal batch
# dimensions, a 2-D B folded into M), K past one 256 block, odd M / N, and a 1/√d scale
SPECIALIZED_CASES = [
    ((3, 7, 259), (3, 259, 17), False),
    ((2, 5, 300), (300, 33), False),
    ((1, 3, 17, 32), (1, 3, 32, 19), True),
]


@pytest.mark.parametrize("case", SPECIALIZED_CASES, ids=str)
def test_matmul_specialized_call_equals_onnxruntime(case, monkeypatch):
    """Failure signature: a specialized MlasMatMul that reads a stale or transposed operand
    (a view reshaped into a copy and recorded) or drops alpha: outputs differ from ORT's on
    the second run. Every run after a session's first (the measuring run, which binds the
    shapes) takes the specialized call, and every run equals ORT's at 1 and 2 threads."""
    import quanta.targets.native.mlas_matmul as native_mm

    a_shape, b_shape, scaled = case
    rng = np.random.default_rng(len(a_shape) * 7 + b_shape[-1])
    a, b = _data(rng, a_shape), _data(rng, b_shape)
    nodes = [helper.make_node("MatMul", ["as" if scaled else "a", "b"], ["y"])]
    inits = []
    if scaled:  # ORT: FusedMatMul with alpha = f32(1 / c); K = 32 is one block
        nodes.insert(0, helper.make_node("Div", ["a", "c"], ["as"]))
        inits.append(numpy_helper.from_array(np.array(5.656854, F32), "c"))
    ins = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, list(t.shape)) for n, t in (("a", a), ("b", b))
    ]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    m = _model(nodes, ins, outs, inits, opset=13)
    generic = native_mm._mlas_matmul
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return generic(*args, **kwargs)

    monkeypatch.setattr(native_mm, "_mlas_matmul", counted)
    for threads in (1, 2):
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.log_severity_level = 3
        ort_sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        qo = quanta.SessionOptions(float_functions="ort", intra_op_num_threads=threads)
        q_sess = quanta.InferenceSession(m.SerializeToString(), qo)
        for run, shift in enumerate((0.0, 1.5, -0.75)):  # a recorded call must read new operands
            feeds = {"a": (a + F32(shift)).astype(F32), "b": b}
            want = ort_sess.run(None, feeds)[0]
            np.testing.assert_array_equal(q_sess.run(None, feeds)[0], want)
            if run == 0:
                calls.clear()
        assert not calls, "the generic MlasMatMul call ran after binding: the specialization refused"
