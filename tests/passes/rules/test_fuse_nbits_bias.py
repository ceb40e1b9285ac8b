"""FuseNBitsBias (passes/rules/fuse_nbits_bias.py): a constant bias Add after a MatMulNBits
becomes the node's bias input, bit for bit the graph as written on the reference target
(MatMulNBits adds its bias last, eqs. (W2), (W9)), and the native level-4 kernel equals
the reference; a bias that broadcasts further, a product read twice, or a node with a bias
already stays as written."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from tests.lowbit.test_w4 import _nbits_model

F32 = np.float32
K, N = 300, 17


def with_add(bias_shape, *, level=4, bias_first=False, rank=3, second_reader=False, own_bias=False):
    model = _nbits_model(K, N, 32, zp_kind="uint8", bias=own_bias, seed=4, accuracy_level=level)
    g = model.graph
    g.node[0].output[0] = "T"
    add_in = ["c", "T"] if bias_first else ["T", "c"]
    g.node.append(helper.make_node("Add", add_in, ["Y"]))
    c = np.random.default_rng(9).standard_normal(bias_shape).astype(F32)
    g.initializer.append(numpy_helper.from_array(c, "c"))
    dims = ["M", K] if rank == 2 else [3, "M", K]
    g.input[0].CopyFrom(helper.make_tensor_value_info("A", TensorProto.FLOAT, dims))
    g.output[0].CopyFrom(helper.make_tensor_value_info("Y", TensorProto.FLOAT, None))
    if second_reader:
        g.node.append(helper.make_node("Relu", ["T"], ["R"]))
        g.output.append(helper.make_tensor_value_info("R", TensorProto.FLOAT, None))
    return model.SerializeToString()


def ops_and_check(blob, rank=3):
    """The plan's op types; the fused graph equal to the graph as written, bit for bit on
    the reference target, and the native session equal to the reference at level 4."""
    a = (np.random.default_rng(2).standard_normal((3, 5, K) if rank == 3 else (4, K)) * 2).astype(F32)
    off = quanta.SessionOptions()
    off.graph_optimization_level = quanta.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = quanta.InferenceSession(blob, backend="reference")
    want = quanta.InferenceSession(blob, sess_options=off, backend="reference").run(None, {"A": a})
    got = ref.run(None, {"A": a})
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
    return [s.op_type for s in ref.plan.steps], a, got


@pytest.mark.parametrize("bias_first", [False, True])
@pytest.mark.parametrize(("rank", "bias_shape"), [(3, (N,)), (3, (1, 1, N)), (2, (1, N))])
def test_bias_add_fuses_and_is_exact(bias_first, rank, bias_shape):
    blob = with_add(bias_shape, bias_first=bias_first, rank=rank)
    ops, a, want = ops_and_check(blob, rank)
    assert ops == ["MatMulNBits"]
    sess = quanta.InferenceSession(blob)
    assert [s.kernel.name for s in sess.plan.steps] == ["native:matmul_nbits_w4a8"]
    np.testing.assert_array_equal(sess.run(None, {"A": a})[0].view(np.uint32), want[0].view(np.uint32))


def test_float_path_fuses_too():
    ops, *_ = ops_and_check(with_add((N,), level=0))
    assert ops == ["MatMulNBits"]


def test_what_broadcasts_further_or_is_shared_stays():
    # a bias per row and column is no bias of the product's
    assert ops_and_check(with_add((5, N)))[0] == ["MatMulNBits", "Add"]
    # a bias of higher rank than A widens the output
    assert ops_and_check(with_add((1, 1, N), rank=2), rank=2)[0] == ["MatMulNBits", "Add"]
    # the product read by another node too
    assert ops_and_check(with_add((N,), second_reader=True))[0] == ["MatMulNBits", "Add", "Relu"]
    # the node has a bias already
    assert ops_and_check(with_add((N,), own_bias=True))[0] == ["MatMulNBits", "Add"]
