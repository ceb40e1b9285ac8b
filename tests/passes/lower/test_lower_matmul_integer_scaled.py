"""LowerMatMulIntegerScaled(First) (passes/lower/qdq_to_qlinear.py): the dequantization
``Mul(Cast(MatMulInteger(...)), Mul(sa, sb))`` that ONNX Runtime's quantize_dynamic
writes becomes one MatMulIntegerToFloat, and its bias Add joins it. Four parts (fired;
structure; bit-exact on the reference target; the verifier) and the NoMatch reasons."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.ir.verify import Stage
from quanta.passes.lower.qdq_to_qlinear import (
    FuseMatMulFloatBias,
    FuseMatMulFloatBiasFirst,
    LowerMatMulIntegerScaled,
    LowerMatMulIntegerScaledFirst,
)
from quanta.passes.pattern import RewritePass
from tests.passes.helpers import run_passes, run_ref

K, N = 300, 7  # K > 258: an int32 accumulation that float32 could not hold exactly


def dynamic_proto(*, scale_first=False, sb_shape=(N,), cast_to=TensorProto.FLOAT, b_rank=2):
    """ORT quantize_dynamic's form: DynamicQuantizeLinear(x) -> MatMulInteger(xq, wq, xz, wz)
    -> Cast -> Mul(., Mul(xs, ws)) -> Add(bias, .)."""
    rng = np.random.default_rng(3)
    wshape = (K, N) if b_rank == 2 else (2, K, N)
    inits = [
        numpy_helper.from_array(rng.integers(-127, 128, wshape).astype(np.int8), "wq"),
        numpy_helper.from_array((rng.random(sb_shape) * 0.01 + 0.001).astype(np.float32), "ws"),
        # non-zero weight zero points (per column, or one): the row-sum term is exercised
        numpy_helper.from_array(
            rng.integers(-9, 10, sb_shape).astype(np.int8) if sb_shape else np.int8(-3), "wz"
        ),
        numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "bias"),
    ]
    scale = ["s", "c"] if scale_first else ["c", "s"]
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="dql"),
        helper.make_node("MatMulInteger", ["xq", "wq", "xz", "wz"], ["acc"], name="mm"),
        helper.make_node("Cast", ["acc"], ["c"], to=cast_to, name="cast"),
        helper.make_node("Mul", ["xs", "ws"], ["s"], name="scales"),
        helper.make_node("Mul", scale, ["y0"], name="dequant"),
        helper.make_node("Add", ["bias", "y0"], ["y"], name="bias_add"),
    ]
    out_type = TensorProto.FLOAT if cast_to == TensorProto.FLOAT else TensorProto.DOUBLE
    if cast_to != TensorProto.FLOAT:
        nodes[3] = helper.make_node("Cast", ["xs"], ["xs64"], to=cast_to, name="xs64")
        nodes.insert(4, helper.make_node("Cast", ["ws"], ["ws64"], to=cast_to, name="ws64"))
        nodes.insert(5, helper.make_node("Mul", ["xs64", "ws64"], ["s"], name="scales"))
        nodes[-1] = helper.make_node("Identity", ["y0"], ["y"], name="id")
    out_shape = [3, 5, N] if b_rank == 2 else [2, 5, N]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3 if b_rank == 2 else 2, 5, K])],
        [helper.make_tensor_value_info("y", out_type, out_shape)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def lower(model):
    p = RewritePass(
        [
            LowerMatMulIntegerScaled(),
            LowerMatMulIntegerScaledFirst(),
            FuseMatMulFloatBias(),
            FuseMatMulFloatBiasFirst(),
        ]
    )
    p.produces_stage = Stage.LOWERED
    return p, run_passes(model, [p])


def feeds(proto):
    shape = [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
    return {"x": (np.random.default_rng(8).standard_normal(shape) * 2).astype(np.float32)}


@pytest.mark.parametrize("scale_first", [False, True])
@pytest.mark.parametrize("sb_shape", [(N,), ()])
def test_dequantization_and_bias_fold_into_one_op_bit_exact(scale_first, sb_shape):
    proto = dynamic_proto(scale_first=scale_first, sb_shape=sb_shape)
    model = load(proto)
    _, result = lower(model)
    rule = "LowerMatMulIntegerScaledFirst" if scale_first else "LowerMatMulIntegerScaled"
    assert result.fired(rule) == 1 and result.fired("FuseMatMulFloatBiasFirst") == 1
    ops = [n.op_type for n in model.graph.nodes]
    assert ops == ["DynamicQuantizeLinear", "MatMulIntegerToFloat"]
    mm = model.graph.nodes[1]
    assert [v.name if v is not None else None for v in mm.inputs[:4]] == ["xq", "wq", "xs", "ws"]
    assert mm.name == "mm" and mm.inputs[6].const.shape == (N,)
    f = feeds(proto)
    np.testing.assert_array_equal(run_ref(proto, f)[0], run_ref(model, f)[0])


def test_refuses_a_cast_to_double():
    model = load(dynamic_proto(cast_to=TensorProto.DOUBLE))
    p, result = lower(model)
    assert result.fired("LowerMatMulIntegerScaled") == 0
    assert "the Cast is not to float32" in {r.reason for r in p.why_not("LowerMatMulIntegerScaled")}


def test_refuses_a_per_column_scale_without_a_rank2_b():
    model = load(dynamic_proto(b_rank=3))
    p, result = lower(model)
    assert result.fired("LowerMatMulIntegerScaled") == 0
    assert {r.reason for r in p.why_not("LowerMatMulIntegerScaled")} == {
        "a per-column scale of 7 values needs a rank-2 b with 7 columns"
    }


@pytest.mark.parametrize("sb_shape", [(N,), ()])
def test_lowered_graph_runs_natively_bit_exact(sb_shape):
    """The session lowers the form itself; the native MatMulIntegerToFloat (prepacked b
    with non-zero zero points, the run-time a_scale of DynamicQuantizeLinear, the fused
    bias) gives the reference's bits at 1 and 2 threads."""
    import quanta

    proto = dynamic_proto(sb_shape=sb_shape)
    f = feeds(proto)
    ref = quanta.InferenceSession(proto, backend="reference").run(None, f)[0]
    for threads in (1, 2):
        opts = quanta.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = quanta.InferenceSession(proto, sess_options=opts, backend="native")
        assert [s.op_type for s in sess.plan.steps] == ["DynamicQuantizeLinear", "MatMulIntegerToFloat"]
        assert sess.fallbacks == []
        np.testing.assert_array_equal(sess.run(None, f)[0], ref)


def test_refuses_a_zero_point_of_unknown_shape():
    # a run-time weight zero point of symbolic length: refused with its reason (its size
    # is not a number the rule can check)
    proto = dynamic_proto()
    g = proto.graph
    kept = [t for t in g.initializer if t.name != "wz"]
    del g.initializer[:]
    g.initializer.extend(kept)
    g.input.append(helper.make_tensor_value_info("wz", TensorProto.INT8, ["cols"]))
    model = load(proto)
    p, result = lower(model)
    assert result.fired("LowerMatMulIntegerScaled") == 0
    assert "zero point 'wz' has an unknown shape" in {r.reason for r in p.why_not("LowerMatMulIntegerScaled")}
