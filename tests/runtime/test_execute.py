"""The executor: same results as the plain interpreter on every test model, errors that
name the node, per-signature memory plans, and the arena handed to ``out=`` kernels
(no live buffer overwritten, no arena memory escaping to the caller)."""

from __future__ import annotations

import threading
from typing import ClassVar

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.graph import Model, Node
from quanta.ir.onnx_io import load
from quanta.runtime.compile import compile as compile_plan
from quanta.runtime.execute import Executor
from quanta.targets.base import Kernel, TargetError
from quanta.targets.reference import ReferenceTarget
from tests.ir import models


def _feeds_for(name: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    if name == "float_cnn":
        return {"x": rng.standard_normal((2, 3, 8, 6)).astype(np.float32)}
    if name == "qdq_conv":
        return {"x": rng.standard_normal((1, 3, 9, 5)).astype(np.float32) * 3}
    if name == "qoperator":
        return {
            "x": rng.standard_normal((1, 3, 7, 5)).astype(np.float32),
            "r": rng.standard_normal((1, 7, 7, 5)).astype(np.float32),
        }
    return models.encoder_feeds(1)[0]


@pytest.mark.parametrize("backend", ["reference", "native"])
@pytest.mark.parametrize("name", ["float_cnn", "qdq_conv", "qoperator", "encoder_block"])
def test_executor_matches_the_plain_interpreter_bit_exactly(name, backend):
    model = load(getattr(models, name)())
    feeds = _feeds_for(name)
    outputs = [v.name for v in model.graph.outputs]
    from quanta.targets import get_target

    want = get_target(backend).prepare(model).run(feeds, outputs)
    exe = Executor(compile_plan(model, backend))
    for _ in range(2):  # the measuring run, then the bound run
        got = exe.run(feeds, outputs)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)  # 0: same kernels on the same inputs


def test_on_value_sees_every_produced_value_once_in_order():
    model = load(models.qdq_conv())
    exe = Executor(compile_plan(model, "reference", passes=[]))  # the graph as loaded
    seen: list[str] = []
    feeds = _feeds_for("qdq_conv")
    for _ in range(2):
        seen.clear()
        exe.run(feeds, ["y"], on_value=lambda name, arr: seen.append(name))
        assert seen == ["xq", "xf", "wf", "c", "cq", "y"]


def test_kernel_error_names_the_node_and_its_inputs():
    exe = Executor(compile_plan(load(models.float_cnn()), "reference"))
    with pytest.raises(TargetError) as e:
        exe.run({"x": np.zeros((1, 3, 10, 6), np.float32)}, ["y"])
    assert str(e.value).startswith("node 'fc' (Gemm): ")
    assert str(e.value).endswith("(inputs: float32[1, 105], float32[5, 84], float32[5])")


def test_unknown_output_is_reported():
    exe = Executor(compile_plan(load(models.float_cnn()), "reference"))
    with pytest.raises(TargetError, match=r"outputs \['r'\] were not computed"):
        exe.run({"x": np.zeros((1, 3, 8, 6), np.float32)}, ["r"])


def test_symbolic_shapes_are_planned_per_input_signature_and_evicted_lru():
    exe = Executor(compile_plan(load(models.float_cnn()), "reference"), max_signatures=2)
    # batches of 4: every intermediate (Conv+Relu [N, 7, 8, 6], MaxPool [N, 7, 4, 3]) is then a
    # multiple of the 64-byte alignment, so the arena scales exactly with the batch
    x1, x2, x3 = (np.zeros((n, 3, 8, 6), np.float32) for n in (4, 8, 12))
    for x in (x1, x2, x1):
        exe.run({"x": x}, ["y"])
    assert len(exe.bound_runs()) == 2
    p1, p2 = exe.memory_plan({"x": x1}), exe.memory_plan({"x": x2})
    assert p2.peak_bytes == 2 * p1.peak_bytes  # every intermediate scales with the batch
    exe.run({"x": x3}, ["y"])  # evicts batch 2, the least recently used
    assert exe.memory_plan({"x": x2}) is None and exe.memory_plan({"x": x1}) is not None


# -- the arena: kernels that accept out= ----------------------------------------------


def _relu_out(ctx, x, *, out=None):
    del ctx  # unused
    return np.maximum(x, np.zeros((), x.dtype), out=out)


def _add_out(ctx, a, b, *, out=None):
    assert ctx.num_threads >= 1
    return np.add(a, b, out=out)


def _neg_out(ctx, x, *, out=None):
    del ctx  # unused
    return np.negative(x, out=out)


class ArenaTestTarget(ReferenceTarget):
    """Relu, Add and Neg write into the arena (``out=``); everything else is NumPy."""

    name = "arena-test"
    OUT_KERNELS: ClassVar[dict] = {"Relu": _relu_out, "Add": _add_out, "Neg": _neg_out}

    def select_kernel(self, model: Model, node: Node) -> Kernel:
        fn = self.OUT_KERNELS.get(node.op_type)
        if fn is not None:
            return Kernel(fn, "native", f"test:{node.op_type.lower()}_out", out=True)
        return super().select_kernel(model, node)


def _graph(nodes, outputs, inits=(), shape=(4, 6)) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes,
        "arena",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        list(inits),
    )
    return onnx.shape_inference.infer_shapes(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    )


def _views_model() -> onnx.ModelProto:
    n = helper.make_node
    nodes = [
        n("Relu", ["x"], ["a"], name="relu_a"),
        n("Add", ["a", "x"], ["b"], name="add_b"),
        n("Transpose", ["b"], ["t"], name="transpose"),  # NumPy returns a view of b (arena)
        n("Relu", ["t"], ["c"], name="relu_c"),
        n("Reshape", ["c", "flat"], ["v"], name="reshape"),  # a view of c: shares c's buffer
        n("Neg", ["v"], ["d"], name="neg_d"),  # must not be written over c (v reads it below)
        n("Add", ["d", "v"], ["e"], name="add_e"),
        n("Relu", ["e"], ["f"], name="relu_f"),
        n("Add", ["f", "e"], ["y"], name="add_y"),  # a graph output: never in the arena
        n("Reshape", ["e", "back"], ["y2"], name="reshape_out"),  # output viewing the arena
    ]
    inits = [
        numpy_helper.from_array(np.array([24], np.int64), "flat"),
        numpy_helper.from_array(np.array([4, 6], np.int64), "back"),
    ]
    # t is a graph output too, so the Transpose stays where it is (SinkTransposes would
    # move it below relu_c, and the view it makes of b is what this model tests)
    return _graph(nodes, ["y", "y2", "t"], inits)


def test_arena_out_kernels_match_the_reference_and_keep_views_alive():
    proto = _views_model()
    ref = ReferenceTarget().prepare(load(proto))
    exe = Executor(compile_plan(load(proto), ArenaTestTarget()))
    rng = np.random.default_rng(0)
    results = []
    for _ in range(4):  # measuring run, then runs that reuse the arena with new data
        x = rng.standard_normal((4, 6)).astype(np.float32)
        got = exe.run({"x": x}, ["y", "y2"])
        want = ref.run({"x": x}, ["y", "y2"])
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)  # 0: same float32 ops, only the memory differs
        results.append(got)
    (bound,) = exe.bound_runs().values()
    assert bound.arena is not None and bound.arena.ctypes.data % 64 == 0
    arena = bound.arena
    # graph outputs handed out earlier are not overwritten by later runs
    for got in results:
        for arr in got:
            assert not np.shares_memory(arr, arena)
    seen = {}
    exe.run({"x": x}, ["y", "y2"], on_value=lambda name, arr: seen.__setitem__(name, arr))
    in_arena = {name for name, arr in seen.items() if np.shares_memory(arr, arena)}
    # out= kernels write into the arena; the view of an arena value (Reshape) shares it;
    # the NumPy view Transpose made of an arena value was copied out; graph outputs never
    assert in_arena == {"a", "b", "c", "v", "d", "e", "f", "y2"}
    assert "t" not in in_arena and "y" not in in_arena


def test_arena_numpy_view_of_a_dead_buffer_is_copied_out():
    # Failure signature: Transpose (NumPy) returns a view of b's arena bytes; b is dead
    # after it, so the planner gives b's bytes to u = Neg(t); t then reads -t and
    # w = t + u comes out as -2t instead of 0.
    n = helper.make_node
    nodes = [
        n("Relu", ["x"], ["b"], name="relu_b"),
        n("Transpose", ["b"], ["t"], name="transpose"),
        n("Neg", ["t"], ["u"], name="neg_u"),
        n("Add", ["t", "u"], ["w"], name="add_w"),
    ]
    proto = _graph(nodes, ["w"], shape=(6, 6))
    exe = Executor(compile_plan(load(proto), ArenaTestTarget()))
    x = np.abs(np.random.default_rng(2).standard_normal((6, 6)).astype(np.float32)) + 1
    exe.run({"x": x}, ["w"])  # the measuring run plans the arena
    mem = exe.memory_plan({"x": x})
    slot = exe.plan.slot_of
    assert mem.offsets[slot["u"]] == mem.offsets[slot["b"]]  # the hazard is set up
    for _ in range(2):
        np.testing.assert_array_equal(exe.run({"x": x}, ["w"])[0], np.zeros((6, 6), np.float32))


def test_arena_is_not_shared_by_concurrent_runs():
    proto = _views_model()
    ref = ReferenceTarget().prepare(load(proto))
    exe = Executor(compile_plan(load(proto), ArenaTestTarget()))
    exe.run({"x": np.zeros((4, 6), np.float32)}, ["y", "y2"])
    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(30):
            x = rng.standard_normal((4, 6)).astype(np.float32)
            got, want = exe.run({"x": x}, ["y", "y2"]), ref.run({"x": x}, ["y", "y2"])
            if not all(np.array_equal(g, w) for g, w in zip(got, want)):
                errors.append(f"seed {seed}: wrong result")

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@st.composite
def random_dags(draw) -> onnx.ModelProto:
    """Random DAGs over 5x5 tensors: Relu/Add/Neg write into the arena; Transpose,
    Reshape, Identity (views NumPy makes) and Mul (fresh arrays) do not. Inputs come
    mostly from the last three values (chains, where buffers get reused) and sometimes
    from any earlier one (long lifetimes); outputs: the last value and a random one."""
    n_nodes = draw(st.integers(1, 20))
    names = ["x"]
    nodes = []

    def pick() -> str:
        if draw(st.booleans()):
            return draw(st.sampled_from(names[-3:]))
        return draw(st.sampled_from(names))

    for k in range(n_nodes):
        op = draw(st.sampled_from(["Relu", "Add", "Neg", "Transpose", "Reshape", "Identity", "Mul"]))
        out = f"v{k}"
        if op in ("Add", "Mul"):
            nodes.append(helper.make_node(op, [pick(), pick()], [out], name=f"n{k}"))
        elif op == "Reshape":
            nodes.append(helper.make_node("Reshape", [pick(), "shape55"], [out], name=f"n{k}"))
        else:
            nodes.append(helper.make_node(op, [pick()], [out], name=f"n{k}"))
        names.append(out)
    outputs = sorted({names[-1], draw(st.sampled_from(names[1:]))})
    return _graph(
        nodes, outputs, [numpy_helper.from_array(np.array([5, 5], np.int64), "shape55")], shape=(5, 5)
    )


@given(random_dags())
def test_arena_never_overwrites_a_live_value_on_random_graphs(proto):
    # Failure signature: a buffer reused while a value (or a NumPy view of it) is still
    # read later; results then differ from the reference on the second run.
    model = load(proto)
    outputs = [v.name for v in model.graph.outputs]
    ref = ReferenceTarget().prepare(model)
    exe = Executor(compile_plan(load(proto), ArenaTestTarget()))
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = rng.standard_normal((5, 5)).astype(np.float32)
        for g, w in zip(exe.run({"x": x}, outputs), ref.run({"x": x}, outputs)):
            np.testing.assert_array_equal(g, w)  # 0: same float32 ops
