"""PeelLoopIteration (passes/rules/peel_loop_iteration.py): a Loop variable updated as
Paddle2ONNX writes an assign, ``Squeeze(Unsqueeze(f) + 0)``, is invariant from
iteration 1 on; iteration 0 runs before the Loop and the variable passes through the
rest, so HoistLoopInvariants moves the MatMul on it out of the body. The features hold
−0 (before the ``+ 0``; +0 after it), which 1 / f makes −inf on iteration 0 and +inf
later: the bytes equal the graph as written, for early exits by the
condition, one trip, the iteration number read; refusals where the peel is not exact
or gains nothing."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.passes.rules.hoist_loop_invariants import HoistLoopInvariants
from quanta.passes.rules.peel_loop_iteration import PeelLoopIteration
from tests.passes.helpers import run_passes, run_ref

F = TensorProto.FLOAT
RNG = np.random.default_rng(11)


def peel_model(
    *,
    trips: int | None = 6,
    stop_after: int | None = None,
    add: float = 0.0,
    unsqueeze_axes: tuple[int, ...] = (0,),
    squeeze_axes: tuple[int, ...] = (0,),
    scan: bool = False,
    m_input: bool = False,
    assign_op: str = "Add",
    omitted_output: bool = False,
    outer_half: str | None = None,
):
    """h [1, 7] updated from the features f [1, 5, 7] (a loop variable updated by
    Squeeze(Unsqueeze(f) + add)) through 1 / f (∓inf at ∓0), a clip, MatMul by W and a
    sum over the five rows, plus the iteration number."""
    body_nodes = [
        helper.make_node("Unsqueeze", ["f_in", "uax"], ["fu"], name="unsq"),
        helper.make_node(assign_op, ["fu", "zero"], ["fa"], name="assign"),
        helper.make_node("Squeeze", ["fa", "sax"], ["f_out"], name="sq"),
        helper.make_node("Div", ["one", "f_in"], ["inv"], name="inv"),
        helper.make_node("Clip", ["inv", "lo", "hi"], ["cl"], name="clip"),
        helper.make_node("MatMul", ["cl", "W"], ["proj"], name="proj"),
        helper.make_node(
            "ReduceSum", ["pm" if omitted_output else "proj", "ax1"], ["r"], name="rsum", keepdims=0
        ),
        helper.make_node("Mul", ["h_in", outer_half or "half"], ["hh"], name="decay"),
        helper.make_node("Cast", ["i"], ["fi"], name="icast", to=F),
        helper.make_node("Add", ["hh", "r"], ["h1"], name="hr"),
        helper.make_node("Add", ["h1", "fi"], ["h_out"], name="hi"),
    ]
    if omitted_output:  # MaxPool's optional Indices left out: an output named ""
        body_nodes.insert(6, helper.make_node("MaxPool", ["proj"], ["pm", ""], name="pool", kernel_shape=[1]))
    if stop_after is None:
        body_nodes.append(helper.make_node("Identity", ["c_in"], ["c_out"], name="cond"))
    else:
        body_nodes.append(helper.make_node("Less", ["i", "stop"], ["c_out"], name="cond"))
    outputs = [
        helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
        helper.make_tensor_value_info("f_out", F, [1, 5, 7]),
        helper.make_tensor_value_info("h_out", F, [1, 7]),
    ]
    if scan:
        outputs.append(helper.make_tensor_value_info("h1", F, [1, 7]))
    inits = [
        numpy_helper.from_array(np.array(list(unsqueeze_axes), np.int64), "uax"),
        numpy_helper.from_array(np.array(list(squeeze_axes), np.int64), "sax"),
        numpy_helper.from_array(np.array([add], np.float32), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "ax1"),
        numpy_helper.from_array(np.float32(1.0), "one"),
        numpy_helper.from_array(np.float32(-5.0), "lo"),
        numpy_helper.from_array(np.float32(5.0), "hi"),
        numpy_helper.from_array(np.float32(0.5), "half"),
        numpy_helper.from_array(np.array(stop_after or 0, np.int64), "stop"),
    ]
    body = helper.make_graph(
        body_nodes,
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("f_in", F, [1, 5, 7]),
            helper.make_tensor_value_info("h_in", F, [1, 7]),
        ],
        outputs,
        inits,
    )
    loop_outputs = ["f_final", "h_final"] + (["scans"] if scan else [])
    m_name = "M" if trips is not None else ""
    nodes = [
        helper.make_node("Abs", ["x"], ["f0"], name="feat"),
        helper.make_node("Neg", ["f0"], ["f"], name="feat_neg"),  # −0 where x is ±0
        helper.make_node("Loop", [m_name, "cond", "f", "h0"], loop_outputs, name="loop", body=body),
        helper.make_node("Neg", ["f_final"], ["f_neg"], name="f_neg"),
    ]
    graph_inits = [
        numpy_helper.from_array(np.array(True), "cond"),
        numpy_helper.from_array(RNG.uniform(0.1, 1.0, (7, 7)).astype(np.float32), "W"),
    ]
    if outer_half:  # the body reads its decay from the enclosing graph under this name
        graph_inits.append(numpy_helper.from_array(np.float32(0.5), outer_half))
    inputs = [
        helper.make_tensor_value_info("x", F, [1, 5, 7]),
        helper.make_tensor_value_info("h0", F, [1, 7]),
    ]
    if m_input:
        inputs.append(helper.make_tensor_value_info("M", TensorProto.INT64, []))
    elif trips is not None:
        graph_inits.append(numpy_helper.from_array(np.array(trips, np.int64), "M"))
    graph_outputs = [
        helper.make_tensor_value_info("h_final", F, [1, 7]),
        helper.make_tensor_value_info("f_neg", F, [1, 5, 7]),
    ]
    if scan:
        graph_outputs.append(helper.make_tensor_value_info("scans", F, None))
    g = helper.make_graph(nodes, "g", inputs, graph_outputs, graph_inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def feeds(m: int | None = None):
    x = RNG.standard_normal((1, 5, 7)).astype(np.float32)
    x[0, 2] = 0.0  # a row of −0 after Neg(Abs(x)) on iteration 0, +0 after
    x[0, 4, ::2] = 0.0
    f = {"x": x, "h0": RNG.standard_normal((1, 7)).astype(np.float32)}
    if m is not None:
        f["M"] = np.array(m, np.int64)
    return f


def assert_same_bytes(proto, model, f):
    want = run_ref(proto, f)
    got = run_ref(model, f)
    for w, g in zip(want, got, strict=True):
        assert w.dtype == g.dtype and w.shape == g.shape
        assert w.tobytes() == g.tobytes()
    return want


@pytest.mark.parametrize(
    ("trips", "stop_after"),
    [(6, None), (1, None), (6, 2), (6, 0), (None, 3)],
    ids=["six", "one_trip", "cond_stops_after_3", "cond_stops_after_1", "no_trip_count"],
)
def test_iteration_zero_runs_before_the_loop_and_the_matmul_leaves_the_body(trips, stop_after):
    proto = peel_model(trips=trips, stop_after=stop_after)
    model = load(proto)
    result = run_passes(model, [PeelLoopIteration(), HoistLoopInvariants(nodes=True)])
    assert result.records[0].stats["peeled"] == 1
    loop = model.graph.find_nodes("Loop")[0]
    if trips is not None:
        assert int(loop.inputs[0].const) == trips - 1
    body = loop.attrs["body"]
    assert "MatMul" not in [n.op_type for n in body.node]  # hoisted once peeled
    assert [n.op_type for n in model.graph.nodes].count("MatMul") == 2  # iteration 0's, the hoisted
    assert_same_bytes(proto, model, feeds())


def test_the_model_tells_iteration_zero_from_the_later_ones():
    """The test model is sensitive to the peel: a Loop that passed f through from
    iteration 0 on (−0 forever) gives another h."""
    proto = peel_model(trips=6)
    naive = peel_model(trips=6)
    (loop,) = [n for n in naive.graph.node if n.op_type == "Loop"]
    loop.attribute[0].g.output[1].name = "f_in"
    f = feeds()
    assert run_ref(proto, f)[0].tobytes() != run_ref(naive, f)[0].tobytes()


def test_the_same_bytes_in_sessions_and_the_body_runs_no_matmul():
    proto = peel_model(trips=9)
    p = proto.SerializeToString()
    sess = quanta.InferenceSession(p)
    (loop,) = [s for s in sess.plan.steps if s.op_type == "Loop"]
    assert "MatMul" not in [s.op_type for s in loop.kernel.bodies["body"].plan.steps]
    as_written = quanta.SessionOptions(graph_optimization_level=quanta.GraphOptimizationLevel.ORT_DISABLE_ALL)
    ref = quanta.InferenceSession(p, as_written, backend="reference")
    f = feeds()
    for want, got in zip(ref.run(None, f), sess.run(None, f), strict=True):
        assert want.tobytes() == got.tobytes()


@pytest.mark.parametrize(
    "kw",
    [
        {"add": 1.0},  # x + 1: not idempotent
        {"unsqueeze_axes": (0,), "squeeze_axes": (1,)},  # views that do not cancel
        {"scan": True},  # scan outputs: iteration 0's slice would need a Concat
        {"m_input": True},  # a run-time trip count may be 0
    ],
    ids=["add_one", "views_differ", "scan_output", "runtime_trip_count"],
)
def test_refusals_leave_the_loop(kw):
    proto = peel_model(**kw)
    model = load(proto)
    result = run_passes(model, [PeelLoopIteration()])
    assert result.records[0].stats["peeled"] == 0
    assert [n.op_type for n in model.graph.nodes].count("MatMul") == 0
    f = feeds(3 if kw.get("m_input") else None)
    if "squeeze_axes" not in kw:  # the mismatched views do not run at all
        assert_same_bytes(proto, model, f)


@pytest.mark.parametrize(("op", "c"), [("Add", -0.0), ("Sub", 0.0), ("Mul", 1.0), ("Div", 1.0)])
def test_the_other_idempotent_updates_peel_too(op, c):
    """x + (−0), x − 0, x · 1 and x / 1 are x itself: each peels, same bytes."""
    proto = peel_model(add=c, assign_op=op)
    model = load(proto)
    assert run_passes(model, [PeelLoopIteration()]).records[0].stats["peeled"] == 1
    assert_same_bytes(proto, model, feeds())


def test_an_omitted_optional_output_of_the_body_gets_a_name_of_its_own():
    """Iteration 0's copy of a body node whose optional output is omitted ("") gives that
    output a private, unused name, as loading does; the session's bytes are the graph's."""
    proto = peel_model(omitted_output=True)
    model = load(proto)
    assert run_passes(model, [PeelLoopIteration()]).records[0].stats["peeled"] == 1
    names = [v.name for n in model.graph.nodes for v in n.outputs]
    assert "" not in names and len(names) == len(set(names))
    assert_same_bytes(proto, model, feeds())
    p = proto.SerializeToString()
    as_written = quanta.SessionOptions(graph_optimization_level=quanta.GraphOptimizationLevel.ORT_DISABLE_ALL)
    ref = quanta.InferenceSession(p, as_written, backend="reference")
    f = feeds()
    for want, got in zip(ref.run(None, f), quanta.InferenceSession(p).run(None, f), strict=True):
        assert want.tobytes() == got.tobytes()


def test_the_shifted_iteration_number_does_not_shadow_an_outer_value():
    """The body reads an enclosing-scope value named as the pass would name the shifted
    iteration number (i_plus_1): the new names avoid it, the bytes are the graph's."""
    proto = peel_model(outer_half="i_plus_1")
    model = load(proto)
    assert run_passes(model, [PeelLoopIteration()]).records[0].stats["peeled"] == 1
    assert_same_bytes(proto, model, feeds())
