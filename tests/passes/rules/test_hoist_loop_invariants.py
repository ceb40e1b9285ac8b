"""HoistLoopInvariants (passes/rules/hoist_loop_invariants.py): a constant Loop variable
the body passes through becomes an enclosing-scope constant of the body. Fired and the
structure (the Loop loses the variable, its final value's readers read the constant);
the session's bytes equal the graph as written; the body's Transpose of it folds; the
refusals (a variable the body changes, a computed initial value, a final value that is a
graph output)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.passes.rules.hoist_loop_invariants import HoistLoopInvariants
from tests.passes.helpers import run_passes, run_ref

RNG = np.random.default_rng(5)
F = TensorProto.FLOAT


def loop_model(*, w_changes: bool = False, w_computed: bool = False, w_final_output: bool = False):
    """acc [3, 7] += Transpose(w [7, 3]) five times, w carried as a loop variable (as
    Paddle2ONNX carries a decoder's weights); w's final value read by a Neg."""
    body_nodes = [
        helper.make_node("Identity", ["c_in"], ["c_out"], name="cond"),
        helper.make_node("Transpose", ["w_in"], ["wt"], name="tr", perm=[1, 0]),
        helper.make_node("Add", ["acc_in", "wt"], ["acc_out"], name="acc"),
        helper.make_node("Mul", ["acc_out", "half"], ["scan"], name="scan_mul"),
    ]
    w_out = "w_in"
    if w_changes:
        body_nodes.append(helper.make_node("Neg", ["w_in"], ["w_next"], name="w_next"))
        w_out = "w_next"
    body = helper.make_graph(
        body_nodes,
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", F, [3, 7]),
            helper.make_tensor_value_info("w_in", F, [7, 3]),
        ],
        [
            helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", F, [3, 7]),
            helper.make_tensor_value_info(w_out, F, [7, 3]),
            helper.make_tensor_value_info("scan", F, [3, 7]),
        ],
    )
    nodes = []
    w_name = "w"
    if w_computed:  # a run-time initial value: no hoisting
        nodes.append(helper.make_node("Abs", ["x7"], ["w_run"], name="w_run"))
        w_name = "w_run"
    nodes += [
        helper.make_node(
            "Loop", ["M", "cond", "x", w_name], ["acc_final", "w_final", "scans"], name="loop", body=body
        ),
        helper.make_node("Neg", ["w_final"], ["w_neg"], name="w_neg"),
    ]
    inits = [
        numpy_helper.from_array(np.array(5, np.int64), "M"),
        numpy_helper.from_array(np.array(True), "cond"),
        numpy_helper.from_array(RNG.standard_normal((7, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(np.float32(0.5), "half"),
    ]
    inputs = [helper.make_tensor_value_info("x", F, [3, 7])]
    if w_computed:
        inputs.append(helper.make_tensor_value_info("x7", F, [7, 3]))
    outputs = [
        helper.make_tensor_value_info("acc_final", F, [3, 7]),
        helper.make_tensor_value_info("w_neg", F, [7, 3]),
        helper.make_tensor_value_info("scans", F, [5, 3, 7]),
    ]
    if w_final_output:
        outputs.append(helper.make_tensor_value_info("w_final", F, [7, 3]))
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def feeds(computed: bool = False):
    f = {"x": RNG.standard_normal((3, 7)).astype(np.float32)}
    if computed:
        f["x7"] = RNG.standard_normal((7, 3)).astype(np.float32)
    return f


def test_a_constant_passed_through_becomes_a_constant_of_the_body():
    proto = loop_model()
    model = load(proto)
    result = run_passes(model, [HoistLoopInvariants()])
    assert result.records[0].stats["hoisted"] == 1
    loop = model.graph.find_nodes("Loop")[0]
    assert len(loop.inputs) - len(loop.outer_names) == 3  # M, cond, acc
    assert [o.name for o in loop.outputs] == ["acc_final", "scans"]
    assert "w" in loop.outer_names
    neg = model.graph.find_nodes("Neg")[0]
    assert neg.inputs[0].is_const  # the final value is the constant
    body = loop.attrs["body"]
    assert [i.name for i in body.input] == ["i", "c_in", "acc_in"]
    f = feeds()
    for want, got in zip(run_ref(proto, f), run_ref(model, f), strict=True):
        assert want.tobytes() == got.tobytes()


def test_sessions_fold_the_bodys_transpose_of_it_and_give_the_same_bytes():
    proto = loop_model()
    p = proto.SerializeToString()
    sess = quanta.InferenceSession(p)
    (loop,) = [s for s in sess.plan.steps if s.op_type == "Loop"]
    body_ops = [s.op_type for s in loop.kernel.bodies["body"].plan.steps]
    assert "Transpose" not in body_ops, body_ops
    as_written = quanta.SessionOptions(graph_optimization_level=quanta.GraphOptimizationLevel.ORT_DISABLE_ALL)
    ref = quanta.InferenceSession(p, as_written, backend="reference")
    f = feeds()
    for want, got in zip(ref.run(None, f), sess.run(None, f), strict=True):
        assert want.tobytes() == got.tobytes()


def test_refusals_leave_the_loop():
    for kw in ({"w_changes": True}, {"w_computed": True}, {"w_final_output": True}):
        proto = loop_model(**kw)
        model = load(proto)
        result = run_passes(model, [HoistLoopInvariants()])
        assert result.records[0].stats["hoisted"] == 0, kw
        loop = model.graph.find_nodes("Loop")[0]
        assert len(loop.inputs) - len(loop.outer_names) == 4, kw
        f = feeds(computed=bool(kw.get("w_computed")))
        for want, got in zip(run_ref(proto, f), run_ref(model, f), strict=True):
            assert want.tobytes() == got.tobytes()


def test_float_and_quantized_pipelines_hoist():
    """Float graphs with a Loop (simplify_control_flow) and QDQ graphs (lower_qdq: the
    quantized SLANet files keep the decoder Loop float) both run the pass."""
    from quanta.passes.pipelines import lower_qdq, simplify_control_flow

    for passes in (simplify_control_flow(), lower_qdq()):
        assert any(isinstance(p, HoistLoopInvariants) for p in passes)
