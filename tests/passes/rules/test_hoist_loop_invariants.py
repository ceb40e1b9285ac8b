"""HoistLoopInvariants (passes/rules/hoist_loop_invariants.py): a Loop variable the body
passes through becomes an enclosing-scope value of the body, and (``nodes=True``) the
body's nodes on such values alone move before the Loop. Fired and the structure (the
Loop loses the variable, its final value's readers read the initial one; the moved
nodes); the session's bytes equal the graph as written; the body's Transpose of a
constant folds; the refusals (a variable the body changes, a final value that is a graph
output; nodes reading the iteration's values, random ones, Q / DQ, a result the body
returns)."""

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


def test_a_computed_value_passed_through_is_read_from_the_enclosing_scope():
    """A run-time initial value (the encoder's features a decoder carries) is hoisted as
    well: not a constant of the body, but the same array on every iteration."""
    proto = loop_model(w_computed=True)
    model = load(proto)
    result = run_passes(model, [HoistLoopInvariants()])
    assert result.records[0].stats["hoisted"] == 1
    loop = model.graph.find_nodes("Loop")[0]
    assert "w_run" in loop.outer_names and len(loop.inputs) - len(loop.outer_names) == 3
    f = feeds(computed=True)
    for want, got in zip(run_ref(proto, f), run_ref(model, f), strict=True):
        assert want.tobytes() == got.tobytes()


def test_refusals_leave_the_loop():
    for kw in ({"w_changes": True}, {"w_final_output": True}):
        proto = loop_model(**kw)
        model = load(proto)
        result = run_passes(model, [HoistLoopInvariants()])
        assert result.records[0].stats["hoisted"] == 0, kw
        loop = model.graph.find_nodes("Loop")[0]
        assert len(loop.inputs) - len(loop.outer_names) == 4, kw
        f = feeds()
        for want, got in zip(run_ref(proto, f), run_ref(model, f), strict=True):
            assert want.tobytes() == got.tobytes()


def test_float_and_quantized_pipelines_hoist():
    """Float graphs with a Loop (simplify_control_flow) and QDQ graphs (lower_qdq: the
    quantized SLANet files keep the decoder Loop float) both run the pass."""
    from quanta.passes.pipelines import lower_qdq, simplify_control_flow

    for passes in (simplify_control_flow(), lower_qdq()):
        assert any(isinstance(p, HoistLoopInvariants) for p in passes)


def decoder_model(m: int = 6):
    """A decoder Loop in Paddle2ONNX's form: the features f [5, 8] carried through
    unchanged, the body projecting them by a constant W [8, 7] (loop-invariant: MatMul,
    then Add of a body constant and Tanh), then mixing in the carried state h [5, 7]
    (Mul, Add: not invariant), a RandomUniformLike of the projection (never moved), and a
    DequantizeLinear of a constant (never moved)."""
    body_nodes = [
        helper.make_node("Identity", ["c_in"], ["c_out"], name="cond"),
        helper.make_node("MatMul", ["f_in", "W"], ["proj"], name="proj"),
        helper.make_node("Add", ["proj", "b"], ["projb"], name="bias"),
        helper.make_node("Tanh", ["projb"], ["t"], name="tanh"),
        helper.make_node("Mul", ["h_in", "t"], ["ht"], name="gate"),
        helper.make_node("Add", ["ht", "t"], ["h_out"], name="mix"),
        helper.make_node("RandomUniformLike", ["proj"], ["noise"], name="noise", seed=1.0),
        helper.make_node("Mul", ["noise", "zero"], ["nz"], name="nz"),
        helper.make_node("Add", ["h_out", "nz"], ["scan"], name="scan"),
        helper.make_node("DequantizeLinear", ["q8", "qs"], ["dq"], name="dq"),
        helper.make_node("Add", ["t", "dq"], ["t_dq"], name="t_dq"),
    ]
    body = helper.make_graph(
        body_nodes,
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_in", F, [5, 7]),
            helper.make_tensor_value_info("f_in", F, [5, 8]),
        ],
        [
            helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_out", F, [5, 7]),
            helper.make_tensor_value_info("f_in", F, [5, 8]),
            helper.make_tensor_value_info("scan", F, [5, 7]),
            helper.make_tensor_value_info("t_dq", F, [5, 7]),
        ],
        [
            numpy_helper.from_array(RNG.standard_normal(7).astype(np.float32), "b"),
            numpy_helper.from_array(np.float32(0.0), "zero"),
        ],
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["feat"], name="encoder"),
        helper.make_node(
            "Loop",
            ["M", "cond", "h0", "feat"],
            ["h_final", "f_final", "scans", "tdqs"],
            name="loop",
            body=body,
        ),
    ]
    inits = [
        numpy_helper.from_array(np.array(m, np.int64), "M"),
        numpy_helper.from_array(np.array(True), "cond"),
        numpy_helper.from_array(RNG.standard_normal((8, 7)).astype(np.float32), "W"),
        numpy_helper.from_array(RNG.integers(-128, 128, (5, 7)).astype(np.int8), "q8"),
        numpy_helper.from_array(np.float32(0.03), "qs"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F, [5, 8]), helper.make_tensor_value_info("h0", F, [5, 7])],
        [
            helper.make_tensor_value_info("h_final", F, [5, 7]),
            helper.make_tensor_value_info("scans", F, [m, 5, 7]),
            helper.make_tensor_value_info("tdqs", F, [m, 5, 7]),
        ],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _decoder_feeds():
    return {
        "x": RNG.standard_normal((5, 8)).astype(np.float32),
        "h0": RNG.standard_normal((5, 7)).astype(np.float32),
    }


def test_loop_invariant_nodes_move_before_the_loop_with_the_same_bytes():
    proto = decoder_model()
    model = load(proto)
    result = run_passes(model, [HoistLoopInvariants(nodes=True)])
    assert result.records[0].stats == {"hoisted": 1, "nodes": 3}
    names = [n.name for n in model.graph.nodes]
    assert (
        names.index("loop/proj") < names.index("loop/bias") < names.index("loop/tanh") < names.index("loop")
    )
    loop = model.graph.find_nodes("Loop")[0]
    body_ops = [n.name for n in loop.attrs["body"].node]
    assert body_ops == ["cond", "gate", "mix", "noise", "nz", "scan", "dq", "t_dq"]
    assert "t" in loop.outer_names and "proj" in loop.outer_names  # the noise still reads proj
    assert "feat" not in loop.outer_names and "W" not in loop.outer_names  # read by the moved MatMul only
    f = _decoder_feeds()
    for want, got in zip(run_ref(proto, f), run_ref(model, f), strict=True):
        assert want.tobytes() == got.tobytes()


def test_sessions_run_the_moved_nodes_once_with_the_bytes_of_the_graph_as_written():
    """A float session compiles with simplify_control_flow (nodes=True): the body keeps
    the steps that read the iteration; zero iterations give the initial values too."""
    for m in (6, 0):
        p = decoder_model(m).SerializeToString()
        sess = quanta.InferenceSession(p)
        (loop,) = [s for s in sess.plan.steps if s.op_type == "Loop"]
        body_ops = sorted(s.op_type for s in loop.kernel.bodies["body"].plan.steps)
        assert "MatMul" not in body_ops and "Tanh" not in body_ops, body_ops
        as_written = quanta.SessionOptions(
            graph_optimization_level=quanta.GraphOptimizationLevel.ORT_DISABLE_ALL
        )
        ref = quanta.InferenceSession(p, as_written, backend="reference")
        f = _decoder_feeds()
        for want, got in zip(ref.run(None, f), sess.run(None, f), strict=True):
            assert want.shape == got.shape and want.tobytes() == got.tobytes()


def test_the_quantized_pipeline_moves_no_nodes():
    from quanta.passes.pipelines import lower_qdq, simplify_control_flow

    assert [p.nodes for p in lower_qdq() if isinstance(p, HoistLoopInvariants)] == [False]
    assert [p.nodes for p in simplify_control_flow() if isinstance(p, HoistLoopInvariants)] == [True]
