"""The host stage's requantization multipliers: derived once by the lowering
(``CarryRequantization``, quanta/passes/lower/requant_params.py), carried on the nodes,
and taken as they are by the native binders of QLinearConv, QLinearMatMul and QGemm.

A binder that derived its multiplier from the scales itself would ignore a node whose
carried multiplier was altered: here every carried multiplier is doubled (exactly: a
power of two) and the native outputs must equal the reference twins' on a model whose
y_scales are halved — and differ from the unaltered run.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from quanta.ir.onnx_io import load
from quanta.kernels import native_available
from quanta.passes.lower.requant_params import (
    REQUANT_OPS,
    CarryRequantization,
    FloatRequant,
    float_multiplier,
    requant_params,
)
from quanta.passes.manager import PassManager
from quanta.passes.pipelines import lower_qdq
from quanta.runtime.compile import compile as compile_plan
from quanta.runtime.compile import reference_evaluator
from quanta.runtime.execute import Executor

MS = "com.microsoft"
pytestmark = pytest.mark.skipif(not native_available(), reason="native extension not built")


def _init(name: str, arr) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.asarray(arr), name)


def qoperator_chain(y_scale_factor: float = 1.0) -> onnx.ModelProto:
    """QLinearConv (uint8 x, int8 per-channel w, 7 channels) -> Reshape -> QLinearMatMul
    (int8 b per column, 17 columns) -> com.microsoft QGemm (alpha 0.5, transB, per-column
    b, int32 C) -> DequantizeLinear. Each node's y_scale is its own initializer
    (``*_ys``, times ``y_scale_factor``); its reader takes the unscaled value under
    another name."""
    rng = np.random.default_rng(14)
    w = rng.integers(-127, 128, (7, 3, 3, 3)).astype(np.int8)
    ws = np.array([0.011, 0.007, 0.013, 0.005, 0.009, 0.012, 0.004], np.float32)
    b = rng.integers(-127, 128, (35, 17)).astype(np.int8)
    bs = rng.uniform(0.002, 0.02, 17).astype(np.float32)
    g = rng.integers(-127, 128, (11, 17)).astype(np.int8)  # transB: [N, K]
    gs = rng.uniform(0.003, 0.03, 11).astype(np.float32)
    f = np.float32(y_scale_factor)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node(
            "QLinearConv",
            ["xq", "xs", "xz", "w", "ws", "wz", "conv_ys", "cz"],
            ["c"],
            name="conv",
            pads=[1, 1, 1, 1],
        ),
        helper.make_node("Reshape", ["c", "shape"], ["cr"]),
        helper.make_node(
            "QLinearMatMul", ["cr", "cs", "cz", "b", "bs", "bz", "mm_ys", "mz"], ["m"], name="mm"
        ),
        helper.make_node(
            "QGemm",
            ["m", "ms", "mz", "g", "gs", "gz", "gc", "gemm_ys", "yz"],
            ["y8"],
            name="gemm",
            domain=MS,
            alpha=0.5,
            transB=1,
        ),
        helper.make_node("DequantizeLinear", ["y8", "ys", "yz"], ["y"]),
    ]
    cs, ms, ys = np.float32(0.09), np.float32(0.21), np.float32(0.05)
    inits = [
        _init("xs", np.float32(0.02)),
        _init("xz", np.uint8(131)),
        _init("w", w),
        _init("ws", ws),
        _init("wz", np.zeros(7, np.int8)),
        _init("conv_ys", cs * f),
        _init("cs", cs),
        _init("cz", np.uint8(117)),
        _init("shape", np.array([7, 35], np.int64)),
        _init("b", b),
        _init("bs", bs),
        _init("bz", np.zeros(17, np.int8)),
        _init("mm_ys", ms * f),
        _init("ms", ms),
        _init("mz", np.uint8(121)),
        _init("g", g),
        _init("gs", gs),
        _init("gz", np.zeros(11, np.int8)),
        _init("gc", rng.integers(-3000, 3000, 11).astype(np.int32)),
        _init("gemm_ys", ys * f),
        _init("ys", ys),
        _init("yz", np.uint8(126)),
    ]
    graph = helper.make_graph(
        nodes,
        "requant_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 7, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [7, 11])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])


def _feeds() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(3).normal(0.0, 1.0, (1, 3, 7, 5)).astype(np.float32)}


def _run(model, target: str, passes=None) -> tuple[np.ndarray, object]:
    plan = compile_plan(model, target, passes=passes)
    return Executor(plan).run(_feeds(), ["y"])[0], plan


def test_the_lowering_carries_each_multiplier_and_the_native_kernels_run_them():
    _, plan = _run(load(qoperator_chain()), "native")
    steps = {s.node.name: s for s in plan.steps if (s.node.op_type, s.node.domain) in REQUANT_OPS}
    assert sorted(steps) == ["conv", "gemm", "mm"]
    for s in steps.values():
        assert s.kernel.impl == "native", (s.node.name, s.kernel.name)
        assert isinstance(s.node.requant, FloatRequant)
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in qoperator_chain().graph.initializer}
    want = {
        "conv": float_multiplier(consts["xs"], consts["ws"], consts["conv_ys"]),
        "mm": float_multiplier(consts["cs"], consts["bs"], consts["mm_ys"]),
        "gemm": float_multiplier(consts["ms"], consts["gs"], consts["gemm_ys"], 0.5),
    }
    for name, m in want.items():
        got = steps[name].node.requant.multiplier
        assert got.dtype == np.float32 and got.tobytes() == m.tobytes(), name


def test_native_binders_take_the_carried_multiplier_not_the_scales():
    model = load(qoperator_chain())
    PassManager(lower_qdq(opset=21, evaluator=reference_evaluator(model.opset_imports))).run(model)
    altered = 0
    for node in model.graph.nodes:
        if (node.op_type, node.domain) in REQUANT_OPS:
            node.requant = FloatRequant(node.requant.multiplier * np.float32(2.0))
            altered += 1
    assert altered == 3
    got, plan = _run(model, "native", passes=[])
    assert all(s.kernel.impl == "native" for s in plan.steps if s.node.requant is not None)
    # the same multipliers from halved y_scales, on the twins (which derive them per call)
    want, _ = _run(load(qoperator_chain(0.5)), "reference", passes=[])
    plain, _ = _run(load(qoperator_chain()), "native")
    assert got.tobytes() == want.tobytes()
    assert not np.array_equal(got, plain)


def test_derivation_is_once_and_refuses_run_time_or_per_row_scales():
    model = load(qoperator_chain())
    stats = CarryRequantization()(model.graph).stats
    assert stats == {"carried": 3}
    conv = next(n for n in model.graph.nodes if n.name == "conv")
    first = conv.requant
    assert requant_params(conv) is first  # read, not derived again
    assert CarryRequantization()(model.graph).stats == {"carried": 0}
    # a scale that is a run-time tensor: nothing to carry (the kernel takes it per call)
    mm = next(n for n in model.graph.nodes if n.name == "mm")
    mm.requant = None
    mm.replace_input(1, model.graph.inputs[0])
    assert requant_params(mm) is None


@pytest.mark.parametrize(
    ("sa", "sb", "sy", "alpha"),
    [
        (0.5, [0.25, 0.125], 2.0, 1.0),
        (0.1, [0.3, 0.7, 1e-3], 0.0173, 1.0),
        (0.02, [0.011], 0.09, 0.5),
        (3.0e-3, [0.7, 0.1], None, 0.37),
    ],
)
def test_float_multiplier_rounds_each_float32_operation_in_order(sa, sb, sy, alpha):
    a, b = np.float32(sa), np.asarray(sb, np.float32)
    got = float_multiplier(a, b, None if sy is None else np.float32(sy), alpha)
    prod = (np.float32(alpha) * a).astype(np.float32) * b
    want = (
        prod.astype(np.float32)
        if sy is None
        else (prod.astype(np.float32) / np.float32(sy)).astype(np.float32)
    )
    assert got.tobytes() == want.reshape(got.shape).tobytes()
    assert got.shape == (() if b.size == 1 else b.shape)
