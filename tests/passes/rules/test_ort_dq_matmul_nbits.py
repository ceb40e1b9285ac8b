"""OrtDQMatMulNBits (passes/rules/ort_dq_matmul_nbits.py): a weight-only MatMul / Gemm becomes
com.microsoft::MatMulNBits as ONNX Runtime 1.32 rewrites it (docs/quantization-math.md
(NB8-2), (NB8-3)). At accuracy_level 0 the new node is the graph as written bit for bit
(the weight moves over exactly); at 4 it is the MatMulNBits twin, within ONNX Runtime's own
float rounding of ORT's result. Each refusal names its reason and leaves the graph as it was.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.passes.rules.ort_dq_matmul_nbits import OrtDQMatMulNBits, nbits_operands
from tests.passes.helpers import run_passes, run_ref

F32 = np.float32
K, N, M = 100, 17, 7
RANGES = {
    TensorProto.INT4: (-8, 7),
    TensorProto.UINT4: (0, 15),
    TensorProto.INT8: (-128, 127),
    TensorProto.UINT8: (0, 255),
}


def weight_only(
    wtype=TensorProto.INT8,
    kind="channel",
    *,
    zp=True,
    block=16,
    op="MatMul",
    gemm_attrs=None,
    bias="const",
    extra=(),
    outputs=("y",),
    k=K,
    seed=0,
):
    """x [M, K] float32 -> MatMul / Gemm(x, DequantizeLinear(w)) -> y, with distinct scales and
    zero points per block / column."""
    rng = np.random.default_rng(seed)
    lo, hi = RANGES[wtype]
    shape = {"channel": (N,), "channel_m1": (N,), "tensor": (), "block": (-(-k // block), N), "row": (k,)}[
        kind
    ]
    q = rng.integers(lo, hi + 1, (k, N))
    s = rng.uniform(0.01, 0.05, shape).astype(F32)
    inits = [helper.make_tensor("w", wtype, [k, N], q.reshape(-1).tolist()), numpy_helper.from_array(s, "s")]
    dq_in = ["w", "s"]
    if zp:
        z = rng.integers(lo + 1, hi, shape)
        inits.append(helper.make_tensor("z", wtype, list(shape), np.atleast_1d(z).reshape(-1).tolist()))
        dq_in.append("z")
    attrs = {"block": {"axis": 0, "block_size": block}, "row": {"axis": 0}, "channel_m1": {"axis": -1}}.get(
        kind, {}
    )
    nodes = [helper.make_node("DequantizeLinear", dq_in, ["wf"], name="dq", **attrs)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, k])]
    if op == "MatMul":
        nodes.append(helper.make_node("MatMul", ["x", "wf"], ["y"], name="mm"))
    else:
        gin = ["x", "wf"]
        if bias == "const":
            inits.append(numpy_helper.from_array(rng.standard_normal(N).astype(F32), "c"))
            gin.append("c")
        elif bias is not None:
            inits.append(numpy_helper.from_array(rng.standard_normal(bias).astype(F32), "c"))
            gin.append("c")
        nodes.append(helper.make_node("Gemm", gin, ["y"], name="mm", **(gemm_attrs or {})))
    nodes += list(extra)
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    graph = helper.make_graph(nodes, "weight_only", inputs, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def x_feed(k=K, seed=1):
    return {"x": (np.random.default_rng(seed).standard_normal((M, k)) * 2).astype(F32)}


def rewrite(proto, accuracy_level=4):
    model = load(proto)
    p = OrtDQMatMulNBits(accuracy_level=accuracy_level)
    result = run_passes(model, [p])
    return model, result, p


CASES = [
    (TensorProto.INT8, "channel", True, 16),
    (TensorProto.INT8, "tensor", False, 16),
    (TensorProto.UINT8, "channel", False, 16),
    (TensorProto.UINT8, "block", True, 16),
    (TensorProto.INT8, "block", True, 64),
    (TensorProto.INT4, "block", True, 32),
    (TensorProto.UINT4, "channel", True, 16),
    (TensorProto.INT4, "tensor", False, 16),
]


@pytest.mark.parametrize(("wtype", "kind", "zp", "block"), CASES)
def test_weight_moves_over_exactly_and_level_4_is_ort(wtype, kind, zp, block):
    proto = weight_only(wtype, kind, zp=zp, block=block, seed=wtype + block)
    feeds = x_feed()
    want = run_ref(proto, feeds)
    # accuracy_level 0: the MatMulNBits computes the float product of (W1): the graph as written
    model, result, _ = rewrite(proto, accuracy_level=0)
    assert result.fired("DQMatMulToNBits") == 1
    assert model.graph.op_counts() == {"com.microsoft::MatMulNBits": 1}
    node = model.graph.nodes[0]
    bits = 8 if wtype in (TensorProto.INT8, TensorProto.UINT8) else 4
    assert node.attrs == {
        "K": K,
        "N": N,
        "bits": bits,
        "block_size": block if kind == "block" else 32,
        "accuracy_level": 0,
    }
    got = run_ref(model, feeds)
    np.testing.assert_array_equal(got[0].view(np.uint32), want[0].view(np.uint32))
    # accuracy_level 4 (ONNX Runtime's): the activation quantized per block, about a code
    # in 254 of each block's maximum; within ONNX Runtime's other float order of its result
    model4, result4, _ = rewrite(proto)
    assert result4.fired("DQMatMulToNBits") == 1
    y4 = run_ref(model4, feeds)[0]
    assert 0 < np.max(np.abs(y4 - want[0])) < 0.03 * np.max(np.abs(want[0]))
    ort = pytest.importorskip("onnxruntime")
    o = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[
        0
    ]
    assert np.max(np.abs(y4 - o)) < 1e-5 * np.max(np.abs(o))
    assert np.max(np.abs(want[0] - o)) > 100 * np.max(np.abs(y4 - o))


def test_operands_shift_signed_codes_and_repeat_a_channel_scale_per_block():
    q = np.array([[-128, 5], [127, -1], [0, 3]], np.int8)  # K 3, N 2
    s = np.array([0.5, 0.25], F32)
    z = np.array([-3, 4], np.int8)
    b, scales, zps, bits = nbits_operands(q, s, z, 16)
    assert bits == 8 and b.shape == (2, 1, 16)
    assert b[:, 0, :4].tolist() == [[0, 255, 128, 0], [133, 127, 131, 0]]
    assert scales.tolist() == [0.5, 0.25] and zps.tolist() == [125, 132]
    # K 40 in blocks of 16: three blocks per column, the channel's scale in each
    b, scales, zps, _ = nbits_operands(np.zeros((40, 2), np.uint8), s, None, 16)
    assert b.shape == (2, 3, 16) and scales.tolist() == [0.5, 0.5, 0.5, 0.25, 0.25, 0.25]
    assert zps.tolist() == [0] * 6


def test_int4_codes_and_zero_points_pack_two_to_a_byte():
    import ml_dtypes

    q = np.array([[1, -8], [-1, 7], [2, 0]], ml_dtypes.int4)
    z = np.array([[-2, 3]], ml_dtypes.int4)  # one block of 16
    b, _, zps, bits = nbits_operands(q, np.ones((1, 2), F32), z, 16)
    assert bits == 4 and b.shape == (2, 1, 8)
    # column 0: codes 9, 7, 10 (+8), low nibble first; column 1: 0, 15, 8
    assert b[0, 0, :2].tolist() == [9 | 7 << 4, 10] and b[1, 0, :2].tolist() == [0 | 15 << 4, 8]
    assert zps.tolist() == [6, 11]


@pytest.mark.parametrize("bias", ["const", None])
def test_gemm_takes_its_bias_as_the_nodes(bias):
    proto = weight_only(op="Gemm", bias=bias, seed=5)
    feeds = x_feed()
    want = run_ref(proto, feeds)
    model, result, _ = rewrite(proto, accuracy_level=0)
    assert result.fired("DQGemmToNBits") == 1
    assert model.graph.op_counts() == {"com.microsoft::MatMulNBits": 1}
    node = model.graph.nodes[0]
    assert (len(node.inputs) == 6 and node.inputs[5].name == "c") if bias else len(node.inputs) == 4
    np.testing.assert_array_equal(run_ref(model, feeds)[0].view(np.uint32), want[0].view(np.uint32))


def _refused(proto, rule, reason):
    model, result, p = rewrite(proto)
    before = load(proto).graph.op_counts()
    assert result.fired(rule) == 0 and model.graph.op_counts() == before
    reasons = [r.reason for r in p.why_not(rule, include_pattern=True)]
    assert any(reason in r for r in reasons), reasons


def test_refusals_name_their_reason_and_leave_the_graph():
    _refused(weight_only(kind="row"), "DQMatMulToNBits", f"the scale [{K}] is neither per block")
    # axis -1 names N too, but ONNX Runtime 1.32 compares the attribute with 1 and keeps the
    # float product (NNCF's compress_weights writes -1): so does quanta
    _refused(weight_only(kind="channel_m1"), "DQMatMulToNBits", f"the scale [{N}] runs along axis -1, not 1")
    _refused(
        weight_only(kind="block", block=8),
        "DQMatMulToNBits",
        "block_size 8 is not a power of 2 of at least 16",
    )
    relu = helper.make_node("Relu", ["wf"], ["r"])
    _refused(weight_only(extra=[relu], outputs=("y", "r")), "DQMatMulToNBits", "is also used by")
    _refused(weight_only(outputs=("y", "wf")), "DQMatMulToNBits", "graph output")
    q = helper.make_node("QuantizeLinear", ["y", "ys"], ["yq"])
    proto = weight_only(extra=[q], outputs=("y",))
    proto.graph.initializer.append(numpy_helper.from_array(F32(0.1), "ys"))
    _refused(proto, "DQMatMulToNBits", "a QuantizeLinear reads the product")
    proto = weight_only()
    proto.graph.node.insert(0, helper.make_node("DequantizeLinear", ["xq", "xs"], ["x"]))
    proto.graph.input[0].CopyFrom(helper.make_tensor_value_info("xq", TensorProto.UINT8, [M, K]))
    proto.graph.initializer.append(numpy_helper.from_array(F32(0.02), "xs"))
    _refused(proto, "DQMatMulToNBits", "the activation is dequantized too")
    _refused(weight_only(op="Gemm", gemm_attrs={"alpha": 2.0}), "DQGemmToNBits", "alpha is 2.0, not 1")
    _refused(weight_only(op="Gemm", gemm_attrs={"beta": 0.5}), "DQGemmToNBits", "beta is 0.5 with a bias")
    _refused(weight_only(op="Gemm", bias=(1, N)), "DQGemmToNBits", f"is not float32 [{N}]")
    proto = weight_only(op="Gemm", gemm_attrs={"transB": 1}, bias=None)
    _refused(proto, "DQGemmToNBits", "the Gemm transposes an operand")
    # a scale that is a graph input, not a constant
    proto = weight_only()
    proto.graph.input.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, [N]))
    del proto.graph.initializer[1]
    _refused(proto, "DQMatMulToNBits", "is not a constant")


def _session(proto, **opts):
    options = quanta.SessionOptions(**opts)
    return quanta.InferenceSession(proto.SerializeToString(), options, backend="reference")


def test_the_session_follows_ort_unless_it_keeps_onnxs_functions():
    proto = weight_only(TensorProto.UINT8, "block", block=32, seed=9)
    feeds = x_feed()
    float_y = run_ref(proto, feeds)[0]
    for ff in ("auto", "ort"):
        sess = _session(proto, float_functions=ff)
        assert [s.op_type for s in sess.plan.steps] == ["MatMulNBits"]
        assert not np.array_equal(sess.run(None, feeds)[0], float_y)
    # ONNX's float product: "onnx", and the levels below ONNX Runtime's level 2
    sess = _session(proto, float_functions="onnx")
    assert "MatMulNBits" not in [s.op_type for s in sess.plan.steps]
    np.testing.assert_array_equal(sess.run(None, feeds)[0], float_y)
    basic = _session(proto, graph_optimization_level=quanta.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    assert "MatMulNBits" not in [s.op_type for s in basic.plan.steps]
