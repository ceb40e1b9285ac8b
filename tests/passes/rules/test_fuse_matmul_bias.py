"""FuseMatMulBias (passes/rules/fuse_matmul_bias.py): a constant bias Add after a float
MatMul by a constant weight becomes one quanta::MatMulBias, bit for bit the graph as
written on the reference target (the twin is the MatMul, then the Add) and on the native
target (the GEMM's store adds the bias with the Add's one rounding); a bias that
broadcasts further, a product read twice, a weight computed at run time or an A of rank 1
stay as written."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta

F32 = np.float32
K, N = 259, 71  # K past 258 (two K blocks), N odd: a full and a masked 16-column tile


def model(bias_shape, *, bias_first=False, rank=3, second_reader=False, weight_const=True):
    rng = np.random.default_rng(4)
    w = rng.standard_normal((K, N)).astype(F32)
    c = rng.standard_normal(bias_shape).astype(F32)
    dims = {1: [K], 2: ["M", K], 3: [3, "M", K]}[rank]
    inputs = [helper.make_tensor_value_info("A", TensorProto.FLOAT, dims)]
    inits = [numpy_helper.from_array(c, "c")]
    if weight_const:
        inits.append(numpy_helper.from_array(w, "W"))
    else:
        inputs.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [K, N]))
    nodes = [
        helper.make_node("MatMul", ["A", "W"], ["T"], name="mm"),
        helper.make_node("Add", ["c", "T"] if bias_first else ["T", "c"], ["Y"]),
    ]
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)]
    if second_reader:
        nodes.append(helper.make_node("Relu", ["T"], ["R"]))
        outputs.append(helper.make_tensor_value_info("R", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return m.SerializeToString(), w


def feeds(rank, w, weight_const):
    rng = np.random.default_rng(2)
    shape = {1: (K,), 2: (13, K), 3: (3, 7, K)}[rank]
    f = {"A": (rng.standard_normal(shape) * 2).astype(F32)}
    if not weight_const:
        f["W"] = w
    return f


def run_all(blob, f):
    """(fused plan's op types, native kernel names, outputs) after checking every target
    against the graph as written, bit for bit."""
    off = quanta.SessionOptions()
    off.graph_optimization_level = quanta.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = quanta.InferenceSession(blob, backend="reference")
    want = quanta.InferenceSession(blob, sess_options=off, backend="reference").run(None, f)
    for g, w in zip(ref.run(None, f), want):
        np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
    nat = quanta.InferenceSession(blob)
    nat_off = quanta.InferenceSession(blob, sess_options=off)
    for threads in (1, 2):
        nat_t = nat
        if threads == 2:
            so = quanta.SessionOptions()
            so.intra_op_num_threads = 2
            nat_t = quanta.InferenceSession(blob, sess_options=so)
        for g, w in zip(nat_t.run(None, f), nat_off.run(None, f)):
            np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
    return [s.op_type for s in ref.plan.steps], [s.kernel.name for s in nat.plan.steps]


@pytest.mark.parametrize("bias_first", [False, True])
@pytest.mark.parametrize(("rank", "bias_shape"), [(3, (N,)), (3, (1, 1, N)), (2, (1, N)), (2, (N,))])
def test_bias_add_fuses_and_is_exact(bias_first, rank, bias_shape):
    blob, w = model(bias_shape, bias_first=bias_first, rank=rank)
    ops, kernels = run_all(blob, feeds(rank, w, True))
    assert ops == ["MatMulBias"]
    assert kernels == ["native:matmul_bias_f32"]


def test_what_broadcasts_further_or_is_shared_stays():
    for kwargs, bias_shape, rank, want in [
        ({}, (7, N), 3, ["MatMul", "Add"]),  # a bias per row and column
        ({}, (1, 1, N), 2, ["MatMul", "Add"]),  # a bias of higher rank than A widens the output
        ({}, (N,), 1, ["MatMul", "Add"]),  # A of rank 1
        ({"second_reader": True}, (N,), 3, ["MatMul", "Add", "Relu"]),  # the product read twice
        ({"weight_const": False}, (N,), 3, ["MatMul", "Add"]),  # a weight fed at run time
    ]:
        blob, w = model(bias_shape, rank=rank, **kwargs)
        ops, _ = run_all(blob, feeds(rank, w, kwargs.get("weight_const", True)))
        assert sorted(ops) == sorted(want), (kwargs, bias_shape, rank, ops)
