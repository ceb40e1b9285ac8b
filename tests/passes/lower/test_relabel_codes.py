"""relabel_codes: a QLinearLookup whose table maps every code to itself becomes
quanta::RelabelCodes, an alias of its input under the lookup's output type
(quanta/passes/lower/relabel_codes.py, (IS1)).

Four parts (docs/style.md §6.7): the rule fired; the lowered structure (no table, one
RelabelCodes read by the convolution); the reference target on the graph before and
after, bit for bit (tolerance 0: (IS1) says the bytes are the table's); the LOWERED
verifier. One negative test per refusal, asserting its reason; the verifier's rule for
RelabelCodes; a native session against the reference one.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.graph import Model
from quanta.ir.onnx_io import load
from quanta.ir.types import IntType
from quanta.ir.verify import Stage, VerifyError, verify
from quanta.passes.lower.relabel_codes import RelabelCodesPass
from quanta.passes.manager import PassManager
from quanta.passes.pipelines import lower_qdq
from tests.passes.helpers import reference_evaluator, rng_data, run_passes, run_ref_ir


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def affine_conv_model(
    dtype: type, s1: float, z1: int, w0: float, w1: float, s2: float, z2: int
) -> onnx.ModelProto:
    """x -Q(s1, z1)-DQ-> Mul(w0) -> Add(w1) -Q(s2, z2)-DQ-> Conv(3 -> 7, 3x3) -Q-DQ-> y:
    PP-OCR's learnable affine block (w0 · x + w1 of learnt scalars) before a convolution."""
    rng = np.random.default_rng(5)
    wq = rng.integers(-127, 128, (7, 3, 3, 3)).astype(np.int8)
    ws = np.array([0.011, 0.007, 0.013, 0.005, 0.009, 0.012, 0.004], np.float32)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s1", "z1"], ["xq"], name="q_x"),
        helper.make_node("DequantizeLinear", ["xq", "s1", "z1"], ["xf"], name="dq_x"),
        helper.make_node("Mul", ["xf", "w0"], ["m"], name="affine_mul"),
        helper.make_node("Add", ["m", "w1"], ["a"], name="affine_add"),
        helper.make_node("QuantizeLinear", ["a", "s2", "z2"], ["aq"], name="q_a"),
        helper.make_node("DequantizeLinear", ["aq", "s2", "z2"], ["af"], name="dq_a"),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wf"], name="dq_w", axis=0),
        helper.make_node("Conv", ["af", "wf", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"], name="q_c"),
        helper.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["y"], name="dq_c"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    inits = [
        _init("s1", np.float32(s1)),
        _init("z1", np.asarray(z1, dtype)),
        _init("w0", np.float32(w0)),
        _init("w1", np.float32(w1)),
        _init("s2", np.float32(s2)),
        _init("z2", np.asarray(z2, dtype)),
        _init("wq", wq),
        _init("ws", ws),
        _init("wz", np.zeros(7, np.int8)),
        _init("b", rng.uniform(-1, 1, 7).astype(np.float32)),
        _init("ys", np.float32(0.05)),
        _init("yz", np.asarray(3, dtype)),
    ]
    g = helper.make_graph(
        nodes,
        "affine_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 5])],
        outputs,
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def lowered_without_relabel(proto: onnx.ModelProto, *, rest: bool = False) -> Model:
    """The host pipeline without RelabelCodesPass (``rest``: also the passes after it)."""
    model = load(proto)
    passes = lower_qdq(opset=21, evaluator=reference_evaluator(model.opset_imports))
    at = next(i for i, p in enumerate(passes) if isinstance(p, RelabelCodesPass))
    PassManager(passes[:at] + (passes[at + 1 :] if rest else [])).run(model)
    return model


CASES = [
    # uint8: w0 = 0.5 halves the step (s2 = s1 · w0 exactly), w1 = 3 · s2 moves the zero point by -3
    pytest.param(np.uint8, 0.0625, 131, 0.5, 3 * 0.03125, 0.03125, 128, id="u8_half_scale_zp_shift"),
    # int8 zero point -5: w0 = 4 (s2 = 0.125), w1 = -7 · s2 moves the zero point by +7
    pytest.param(np.int8, 0.03125, -5, 4.0, -7 * 0.125, 0.125, 2, id="i8_zp-5_times4_zp_shift"),
]


@pytest.mark.parametrize(("dtype", "s1", "z1", "w0", "w1", "s2", "z2"), CASES)
def test_identity_table_becomes_a_relabel_and_is_exact(dtype, s1, z1, w0, w1, s2, z2):
    model = lowered_without_relabel(affine_conv_model(dtype, s1, z1, w0, w1, s2, z2))
    look = model.graph.find_nodes("QLinearLookup")
    assert len(look) == 1, model.graph.op_counts()
    x = rng_data((1, 3, 9, 5), seed=7, low=-3.0, high=3.0)
    before = run_ref_ir(model, {"x": x})[0]
    result = run_passes(model, [RelabelCodesPass()], stage=Stage.LOWERED)
    assert result.fired("RelabelCodesOfIdentityTable") == 1
    counts = model.graph.op_counts()
    assert "quanta::QLinearLookup" not in counts and counts.get("quanta::RelabelCodes") == 1, counts
    relabel = model.graph.find_nodes("RelabelCodes")[0]
    out = relabel.outputs[0].type.elem
    assert out.scale == (s2,) and out.zero_point == (z2,)
    assert relabel.input(0).type.elem.zero_point == (z1,)  # the same bytes, another label
    after = run_ref_ir(model, {"x": x})[0]
    np.testing.assert_array_equal(before, after)  # 0: the table maps every code to itself (IS1)
    verify(model.graph, Stage.LOWERED)


@pytest.mark.parametrize(("dtype", "s1", "z1", "w0", "w1", "s2", "z2"), CASES)
def test_session_plans_no_lookup_step_and_gives_the_reference_bytes(dtype, s1, z1, w0, w1, s2, z2):
    import quanta

    proto = affine_conv_model(dtype, s1, z1, w0, w1, s2, z2)
    x = rng_data((1, 3, 9, 5), seed=8, low=-3.0, high=3.0)
    twin = quanta.InferenceSession(proto, backend="reference").run(None, {"x": x})[0]
    unrelabelled = run_ref_ir(lowered_without_relabel(proto, rest=True), {"x": x})[0]
    np.testing.assert_array_equal(twin, unrelabelled)
    for threads in (1, 2):
        so = quanta.SessionOptions()
        so.intra_op_num_threads = threads
        native = quanta.InferenceSession(proto, so, backend="native")
        assert native.fallbacks == []
        ops = [s.op_type for s in native.plan.steps]
        assert "QLinearLookup" not in ops, ops
        for _ in range(3):  # the first run sees the signature, the next ones run its specialization
            np.testing.assert_array_equal(native.run(None, {"x": x})[0], twin)


def relabel_reasons(model: Model) -> list[str]:
    result = run_passes(model, [RelabelCodesPass()], stage=Stage.LOWERED)
    assert not result.modified
    return [r.reason for r in result.why_not("RelabelCodesOfIdentityTable")]


def test_relabel_refuses_a_table_that_changes_a_code():
    # w0 = 0.5 with s2 = 0.0625: the step stays, the codes halve about the zero point
    model = lowered_without_relabel(affine_conv_model(np.uint8, 0.0625, 131, 0.5, 0.0, 0.0625, 131))
    assert relabel_reasons(model) == ["the table changes some code (IS1): it stays a table"]


def test_relabel_refuses_a_per_channel_table():
    model = lowered_without_relabel(affine_conv_model(*CASES[0].values))
    model.graph.find_nodes("QLinearLookup")[0].attrs["axis"] = 1
    assert relabel_reasons(model) == ["the table is per channel (attribute axis)"]


def test_verifier_names_a_relabel_across_storage_types():
    model = lowered_without_relabel(affine_conv_model(*CASES[0].values))
    run_passes(model, [RelabelCodesPass()], stage=Stage.LOWERED)
    out = model.graph.find_nodes("RelabelCodes")[0].outputs[0]
    out.type = replace(out.type, elem=replace(out.type.elem, storage=IntType(8, True), zero_point=(0,)))
    with pytest.raises(VerifyError) as e:
        verify(model.graph, Stage.LOWERED)
    assert "expected one per-tensor storage type on both sides" in str(e.value)
