"""compile(model, target) -> Plan: kernel binding, slots, frees, threads, the pass hook,
and the printed form."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

import quanta
from quanta.ir.onnx_io import load
from quanta.passes.manager import Pass, PassResult
from quanta.passes.pipelines import optimize_float
from quanta.runtime.compile import compile as compile_plan
from quanta.runtime.compile import default_pipeline
from quanta.runtime.plan import NONE_SLOT, SlotKind
from quanta.targets import get_target
from quanta.targets.base import TargetError
from tests.ir import models


def test_plan_binds_every_node_and_records_native_fallbacks():
    # passes=[]: the graph as loaded (the default pipeline would lower Q->Conv->Q)
    plan = compile_plan(load(models.qdq_conv()), "native", passes=[])
    kernels = {s.name: s.kernel for s in plan.steps}
    assert [s.name for s in plan.steps] == ["q_x", "dq_x", "dq_w", "conv", "q_c", "dq_c"]
    assert kernels["q_x"].name == "native:quantize_linear_u8" and kernels["q_x"].impl == "native"
    # a float Conv whose weights are computed (DequantizeLinear of int8 weights) cannot be
    # prepacked: it falls back, with the reason, and is listed
    assert kernels["conv"].name == "reference:Conv"
    assert (
        "conv",
        "Conv",
        "weights w are not a constant (the native kernel packs them at compile time)",
    ) in (plan.fallbacks)
    # every fallback is a step run by its reference twin, and only those
    assert [f[0] for f in plan.fallbacks] == [s.name for s in plan.steps if s.kernel.impl == "reference"]
    assert all(k.fallback for k in kernels.values() if k.impl == "reference")
    assert compile_plan(load(models.qdq_conv()), "reference", passes=[]).fallbacks == []


def test_plan_slots_kinds_and_frees():
    plan = compile_plan(load(models.qdq_conv()), "reference", passes=[])
    assert plan.slots[NONE_SLOT].kind is SlotKind.NONE
    counts = {kind: plan.count(kind) for kind in SlotKind}
    assert counts == {
        SlotKind.NONE: 1,
        SlotKind.CONSTANT: 7,
        SlotKind.INPUT: 1,
        SlotKind.INTERMEDIATE: 5,
        SlotKind.OUTPUT: 1,
    }
    slot = plan.slot_of
    conv = plan.steps[3]
    assert conv.inputs == (slot["xf"], slot["wf"], NONE_SLOT)[: len(conv.inputs)]
    assert conv.outputs == (slot["c"],)
    # every intermediate and input is freed exactly once, by its last reader; constants
    # and the graph output never
    freed = [k for s in plan.steps for k in s.free_after]
    assert sorted(freed) == sorted([slot["x"], slot["xq"], slot["xf"], slot["wf"], slot["c"], slot["cq"]])
    assert plan.steps[3].free_after == tuple(sorted((slot["xf"], slot["wf"])))


def test_plan_threads_reach_every_kernel_context():
    plan = compile_plan(load(models.qdq_conv()), "native", num_threads=3)
    assert {s.ctx.num_threads for s in plan.steps} == {3}
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = quanta.InferenceSession(models.qdq_conv(), sess_options=opts)
    assert {s.ctx.num_threads for s in sess.plan.steps} == {2}
    assert sess.get_session_options() is opts
    assert sess.get_providers() == ["quanta:native"]
    with pytest.raises(ValueError, match="num_threads: expected >= 1, got 0"):
        compile_plan(load(models.qdq_conv()), "native", num_threads=0)


def test_plan_prints_steps_kernels_slots_and_memory():
    text = str(compile_plan(load(models.qdq_conv()), "native", num_threads=2, passes=[]))
    lines = text.splitlines()
    assert lines[0] == "plan 'qdq_conv' on target native: 6 steps, 2 threads"
    assert lines[1].startswith("  slots: 7 constants, 1 input, 5 intermediates, 1 output; ")
    n_native = sum(1 for line in lines[4:] if " native:" in line)
    assert lines[1].endswith(
        f"{n_native} steps on native kernels, {6 - n_native} fallback" + ("s" if 6 - n_native != 1 else "")
    )
    assert lines[2].startswith("  memory: arena ") and "liveness lower bound" in lines[2]
    assert lines[3].split() == ["step", "node", "op", "kernel", "outputs", "<-", "inputs", "memory"]
    assert lines[4].split()[:4] == ["0", "q_x", "QuantizeLinear", "native:quantize_linear_u8"]
    assert "%9 xq <- %8 x, %1, %2" in lines[4] and lines[4].endswith("+135 arena")
    assert lines[-1].endswith("output")


def test_plan_of_symbolic_shapes_defers_memory_to_the_first_run():
    plan = compile_plan(load(models.float_cnn()), "reference")
    assert plan.memory is None
    assert "planned at the first run of each input-shape signature" in str(plan)


def test_unsupported_node_names_the_node_and_counts_the_rest():
    nodes = [
        helper.make_node("Frobnicate", ["x"], ["a"], name="f1", domain="example.org"),
        helper.make_node("Frobnicate", ["a"], ["y"], name="f2", domain="example.org"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    proto = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.org", 1)]
    )
    with pytest.raises(TargetError) as e:
        compile_plan(load(proto), "native")
    assert str(e.value) == (
        "node 'f1' (Frobnicate): operator example.org::Frobnicate has no reference implementation (and 1 more)"
    )


class DropIdentityForTest(Pass):
    """Identity(x) -> x (a stand-in for the real pipeline in the hook test)."""

    def call(self, graph):
        n = 0
        for node in list(graph.nodes):
            if node.op_type == "Identity" and node.outputs[0] not in graph.outputs:
                graph.replace_all_uses(node.outputs[0], node.inputs[0])
                graph.remove_node(node)
                n += 1
        return PassResult(graph, n > 0, {"DropIdentity": n})


def _identity_model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="r1"),
        helper.make_node("Identity", ["a"], ["b"], name="id"),
        helper.make_node("Relu", ["b"], ["y"], name="r2"),
    ]
    g = helper.make_graph(
        nodes,
        "ids",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_pass_hook_runs_the_pipeline_before_binding():
    plan = compile_plan(load(_identity_model()), "native", passes=[DropIdentityForTest()])
    assert [s.op_type for s in plan.steps] == ["Relu", "Relu"]
    assert plan.passes is not None and plan.passes.fired("DropIdentity") == 1
    assert "  passes: drop_identity_for_test" in str(plan).splitlines()


def test_default_pipeline_is_the_same_for_every_target():
    # Failure signature: "native" runs a lowered graph and "reference" the QDQ graph, so
    # the golden checks a different arithmetic than the one that runs.
    ref = compile_plan(load(models.qdq_conv()), "reference")
    nat = compile_plan(load(models.qdq_conv()), "native")
    assert [s.op_type for s in ref.steps] == [s.op_type for s in nat.steps]
    # one convolution alone is no channels-last region: no Transposes around it
    assert [s.op_type for s in ref.steps] == ["QuantizeLinear", "QLinearConv", "DequantizeLinear"]
    # a float graph: constants and BatchNormalizations folded, nothing lowered
    assert [p.name for p in default_pipeline(get_target("reference"), load(models.float_cnn()))] == [
        p.name for p in optimize_float()
    ]
    # graph_optimization_level = ORT_DISABLE_ALL runs the graph as written
    opts = quanta.SessionOptions()
    opts.graph_optimization_level = quanta.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = quanta.InferenceSession(models.qdq_conv(), sess_options=opts, backend="reference")
    assert [s.op_type for s in sess.plan.steps][3] == "Conv"
