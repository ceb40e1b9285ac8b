"""HoistGatheredGemm: an unrolled recurrence's per-step input Gemms become one MatMul over
the whole sequence (docs/passes.md, (HG1)); the graph computes the same values within the
float GEMM bound on both targets, and what the rewrite cannot take stays as written."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.passes.rules.hoist_gathered_gemm import HoistGatheredGemm

F32 = np.float32


def unrolled(t_steps: int, b: int, k: int, n: int, *, trans_b: int, bias: str, seed: int = 0):
    """X [T, B, K] -> per step Gather(X, t) -> Gemm(W, C) -> Tanh, the steps summed; plus
    a Gemm on another weight (a lone step) and one with alpha = 2 (not taken)."""
    rng = np.random.default_rng(seed)
    w = rng.uniform(-0.5, 0.5, (n, k) if trans_b else (k, n)).astype(F32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w.copy() * 0.5, "w_other")]
    if bias == "row":
        inits.append(numpy_helper.from_array(rng.uniform(-1, 1, (n,)).astype(F32), "c"))
    elif bias == "scalar":
        inits.append(numpy_helper.from_array(np.array([0.375], F32), "c"))
    c = ["c"] if bias != "none" else []
    nodes, acc = [], None
    for t in range(t_steps):
        inits.append(numpy_helper.from_array(np.array(t, np.int64), f"i{t}"))
        nodes.append(helper.make_node("Gather", ["x", f"i{t}"], [f"x{t}"], axis=0))
        nodes.append(helper.make_node("Gemm", [f"x{t}", "w", *c], [f"p{t}"], transB=trans_b))
        nodes.append(helper.make_node("Tanh", [f"p{t}"], [f"h{t}"]))
        if acc is None:
            acc = f"h{t}"
        else:
            nodes.append(helper.make_node("Add", [acc, f"h{t}"], [f"s{t}"]))
            acc = f"s{t}"
    nodes.append(helper.make_node("Gemm", ["x0", "w_other", *c], ["q0"], transB=trans_b))
    nodes.append(helper.make_node("Gemm", ["x1", "w", *c], ["q1"], transB=trans_b, alpha=2.0))
    graph = helper.make_graph(
        nodes,
        "unrolled",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [t_steps, b, k])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in (acc, "q0", "q1")],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def expected(model, x: np.ndarray) -> list[np.ndarray]:
    """The graph as written, in float64."""
    init = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    trans = bool(model.graph.node[1].attribute[0].i) if model.graph.node[1].attribute else False
    w = init["w"].T if trans else init["w"]
    wo = init["w_other"].T if trans else init["w_other"]
    c = init.get("c", 0.0)
    x64 = x.astype(np.float64)
    acc = sum(np.tanh(x64[t] @ w + c) for t in range(x.shape[0]))
    return [acc, x64[0] @ wo + c, 2 * (x64[1] @ w) + c]


@pytest.mark.parametrize(
    ("t_steps", "b", "k", "n", "trans_b", "bias"),
    [(5, 3, 7, 17, 1, "row"), (4, 1, 259, 12, 0, "scalar"), (3, 2, 9, 5, 1, "none")],
)
def test_steps_become_one_product(t_steps, b, k, n, trans_b, bias) -> None:
    model = unrolled(t_steps, b, k, n, trans_b=trans_b, bias=bias)
    x = np.random.default_rng(1).standard_normal((t_steps, b, k)).astype(F32)
    want = expected(model, x)
    for backend in ("reference", "native"):
        sess = quanta.InferenceSession(model, backend=backend)
        ops = [s.op_type for s in sess.plan.steps]
        # one MatMul for the shared weight (with its bias Add: one quanta::MatMulBias,
        # optimize_float's FuseMatMulBias); the lone step and the alpha = 2 step stay Gemms
        assert ops.count("MatMul") == (bias == "none") and ops.count("Gemm") == 2, ops
        assert ops.count("MatMulBias") == (bias != "none"), ops
        assert ops.count("Add") == t_steps - 1
        got = sess.run(None, {"x": x})
        for g, w in zip(got, want, strict=True):
            # the float GEMM bound: K·eps·Σ|x·w| per output, here well under 1e-5 relative
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5 * np.sqrt(k))


def test_what_is_not_taken() -> None:
    """A single step, a non-constant index, a gather along axis 1, and T steps of which
    fewer than half are gathered: nothing changes."""
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.uniform(-1, 1, (6, 4)).astype(F32), "w")
    nodes = [
        helper.make_node("Gather", ["x", "i0"], ["x0"], axis=0),
        helper.make_node("Gemm", ["x0", "w"], ["p0"], transB=1),
        helper.make_node("Gather", ["x", "j"], ["xj"], axis=0),
        helper.make_node("Gemm", ["xj", "w"], ["pj"], transB=1),
        helper.make_node("Gather", ["y", "i0"], ["y0"], axis=1),
        helper.make_node("Gemm", ["y0", "w"], ["q0"], transB=1),
        helper.make_node("Gather", ["y", "i1"], ["y1"], axis=1),
        helper.make_node("Gemm", ["y1", "w"], ["q1"], transB=1),
        helper.make_node("Gather", ["z", "i0"], ["z0"], axis=0),
        helper.make_node("Gemm", ["z0", "w"], ["r0"], transB=1),
        helper.make_node("Gather", ["z", "i1"], ["z1"], axis=0),
        helper.make_node("Gemm", ["z1", "w"], ["r1"], transB=1),
    ]
    inits = [
        w,
        numpy_helper.from_array(np.array(0, np.int64), "i0"),
        numpy_helper.from_array(np.array(1, np.int64), "i1"),
    ]
    graph = helper.make_graph(
        nodes,
        "not_taken",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2, 4]),
            helper.make_tensor_value_info("j", TensorProto.INT64, []),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [9, 2, 4]),
        ],
        [
            helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
            for o in ("p0", "pj", "q0", "q1", "r0", "r1")
        ],
        inits,
    )
    g = load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])).graph
    result = HoistGatheredGemm()(g)
    assert not result.modified
    assert g.op_counts() == {"Gather": 6, "Gemm": 6}


def test_float16_steps_with_a_weight_copy_each_become_one_product() -> None:
    """NVIDIA ModelOpt's float16 form of an unrolled recurrence: the graph is float16 and
    every step reads its own initializer holding the same weight (and bias). The copies
    merge and the island widens before the rule runs, so the default pipeline takes the
    steps as it takes the float32 export's; a copy that differs keeps its own Gemm."""
    t_steps, b, k, n = 5, 3, 19, 7
    rng = np.random.default_rng(4)
    w = rng.uniform(-0.5, 0.5, (n, k)).astype(np.float16)
    c = rng.uniform(-1, 1, (n,)).astype(np.float16)
    inits, nodes, outs = [], [], []
    for t in range(t_steps):
        wt = w.copy()
        if t == t_steps - 1:
            wt[2, 3] += np.float16(0.25)  # not the same weight: stays its own step
        inits += [
            numpy_helper.from_array(wt, f"w_{t}"),
            numpy_helper.from_array(c.copy(), f"c_{t}"),
            numpy_helper.from_array(np.array(t, np.int64), f"i{t}"),
        ]
        nodes.append(helper.make_node("Gather", ["x", f"i{t}"], [f"x{t}"], axis=0))
        nodes.append(helper.make_node("Gemm", [f"x{t}", f"w_{t}", f"c_{t}"], [f"p{t}"], transB=1))
        nodes.append(helper.make_node("Tanh", [f"p{t}"], [f"h{t}"]))
        outs.append(f"h{t}")
    graph = helper.make_graph(
        nodes,
        "unrolled_f16",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [t_steps, b, k])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT16, None) for o in outs],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((t_steps, b, k)).astype(np.float16)
    x64 = x.astype(np.float64)
    for backend in ("reference", "native"):
        sess = quanta.InferenceSession(model, backend=backend)
        ops = [s.op_type for s in sess.plan.steps]
        assert ops.count("MatMul") + ops.count("MatMulBias") == 1 and ops.count("Gemm") == 1, ops
        got = sess.run(None, {"x": x})
        for t, g in enumerate(got):
            wt = numpy_helper.to_array(inits[3 * t]).astype(np.float64)
            want = np.tanh(x64[t] @ wt.T + c.astype(np.float64))
            assert g.dtype == np.float16
            # each island output is the float32 result rounded once to float16
            np.testing.assert_allclose(g.astype(np.float64), want, rtol=2e-3, atol=1e-3)
