"""fold_code_clamp: a QLinearLookup that only clamps a QLinearConv's codes becomes the
convolution's ``output_clamp`` (quanta/passes/lower/fold_code_clamp.py, eq. (6c)).

Four parts (docs/style.md §6.7): the rule fired; the lowered structure (no table, the
printer shows the clamp); the reference target on the graph before and after the fold,
bit for bit (tolerance 0: the clamp is the table's own values, (C1)); the LOWERED
verifier. One negative test per refusal, asserting its reason.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.graph import Model
from quanta.ir.onnx_io import load
from quanta.ir.printer import format_graph
from quanta.ir.verify import Stage, VerifyError, verify
from quanta.passes.lower.fold_code_clamp import FoldCodeClampPass, clamp_of_table
from quanta.passes.manager import PassManager
from quanta.passes.pipelines import lower_qdq
from tests.passes.helpers import reference_evaluator, rng_data, run_passes, run_ref_ir


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def conv_act_model(
    act: str, ys: float, yz, lo=None, hi=None, *, act_ys=None, act_yz=None, conv_output: bool = False
) -> onnx.ModelProto:
    """x -Q(u8, 0.03, 131)-DQ-> Conv(3 -> 7, DQ(w i8 per channel), b) -Q(ys, yz)-DQ-> act
    -Q(act_ys, act_yz)-DQ-> y (the activation's quantization defaults to the Conv's: the
    layout AMD Quark writes after QuantizeBeforeActivation's split). ``conv_output``: the
    Conv's dequantized codes are a second graph output."""
    rng = np.random.default_rng(3)
    wq = rng.integers(-127, 128, (7, 3, 3, 3)).astype(np.int8)
    ws = np.array([0.011, 0.007, 0.013, 0.005, 0.009, 0.012, 0.004], np.float32) * 3
    ins, act_inits = ["cf"], []
    for name, v in (("lo", lo), ("hi", hi)):
        if v is not None:
            ins.append(name)
            act_inits.append(_init(name, np.float32(v)))
    act_node = helper.make_node(act, ins, ["a"], name="act")
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="q_x"),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xf"], name="dq_x"),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wf"], name="dq_w", axis=0),
        helper.make_node("Conv", ["xf", "wf", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"], name="q_c"),
        helper.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["cf"], name="dq_c"),
        act_node,
        helper.make_node("QuantizeLinear", ["a", "ays", "ayz"], ["aq"], name="q_a"),
        helper.make_node("DequantizeLinear", ["aq", "ays", "ayz"], ["y"], name="dq_a"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if conv_output:
        outputs.append(helper.make_tensor_value_info("cf", TensorProto.FLOAT, None))
    inits = [
        _init("xs", np.float32(0.03)),
        _init("xz", np.uint8(131)),
        _init("wq", wq),
        _init("ws", ws),
        _init("wz", np.zeros(7, np.int8)),
        _init("b", rng.uniform(-1, 1, 7).astype(np.float32)),
        _init("ys", np.asarray(ys, np.float32)),
        _init("yz", np.asarray(yz)),
        _init("ays", np.asarray(ys if act_ys is None else act_ys, np.float32)),
        _init("ayz", np.asarray(yz if act_yz is None else act_yz)),
        *act_inits,
    ]
    g = helper.make_graph(
        nodes,
        "conv_act",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 5])],
        outputs,
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def lowered_without_fold(proto: onnx.ModelProto, *, rest: bool = False) -> Model:
    """The host pipeline up to the fold (QLinearConv, then the activation's table); with
    ``rest`` also the passes after it."""
    model = load(proto)
    passes = lower_qdq(opset=21, evaluator=reference_evaluator(model.opset_imports))
    at = next(i for i, p in enumerate(passes) if isinstance(p, FoldCodeClampPass))
    PassManager(passes[:at] + (passes[at + 1 :] if rest else [])).run(model)
    return model


CASES = [
    # AMD Quark: uint8 at zero point 128, power-of-two scale; Relu6 = codes [128, 224]
    pytest.param("Clip", 0.0625, np.uint8(128), 0.0, 6.0, (128, 224), id="quark_u8_zp128_relu6"),
    # symmetric int8 Relu: codes [0, 127] (the upper bound at the code range)
    pytest.param("Relu", 0.05, np.int8(0), None, None, (0, 127), id="symmetric_i8_relu"),
    # int8 zero point -7, bounds that are not multiples of the step: Q(-1) = -39, Q(2.5) = 74
    pytest.param("Clip", 0.031, np.int8(-7), -1.0, 2.5, (-39, 74), id="i8_zp-7_clip_off_grid"),
]


@pytest.mark.parametrize(("act", "ys", "yz", "lo", "hi", "codes"), CASES)
def test_fold_code_clamp_is_exact(act, ys, yz, lo, hi, codes):
    proto = conv_act_model(act, ys, yz, lo, hi)
    model = lowered_without_fold(proto)
    assert model.graph.op_counts().get("quanta::QLinearLookup") == 1
    x = rng_data((1, 3, 9, 5), seed=11, low=-8.0, high=8.0)
    before = run_ref_ir(model, {"x": x})[0]
    result = run_passes(model, [FoldCodeClampPass()], stage=Stage.LOWERED)
    assert result.fired("FoldCodeClamp") + result.fired("FoldCodeClampMs") == 1
    counts = model.graph.op_counts()
    assert "quanta::QLinearLookup" not in counts and counts.get("QLinearConv") == 1, counts
    conv = model.graph.find_nodes("QLinearConv")[0]
    assert conv.attrs["output_clamp"] == list(codes)
    assert f"output_clamp=[{codes[0]}, {codes[1]}]" in format_graph(model.graph)
    after = run_ref_ir(model, {"x": x})[0]
    np.testing.assert_array_equal(before, after)  # 0: the clamp is the table's values (C1)
    # the cases are strong enough to tell a clamp from none: both bounds bite where inside
    y_codes = np.rint(after / ys).astype(np.int64) + int(yz)
    info = np.iinfo(np.asarray(yz).dtype)
    assert y_codes.min() == codes[0] and y_codes.max() == codes[1]
    assert codes[0] > info.min or codes[1] < info.max
    verify(model.graph, Stage.LOWERED)


@pytest.mark.parametrize(("act", "ys", "yz", "lo", "hi", "codes"), CASES)
def test_session_runs_the_clamp_in_the_convolution_epilogue(act, ys, yz, lo, hi, codes):
    """The native session plans one QLinearConv step and no table, and its bytes equal the
    reference session's and those of the unfolded graph on the native target."""
    import quanta

    del codes  # the test above checks them
    proto = conv_act_model(act, ys, yz, lo, hi)
    native = quanta.InferenceSession(proto, backend="native")
    ops = sorted(s.op_type for s in native.plan.steps)
    assert "QLinearLookup" not in ops and "QLinearConv" in ops, ops
    x = rng_data((1, 3, 9, 5), seed=12, low=-8.0, high=8.0)
    got = native.run(None, {"x": x})[0]
    twin = quanta.InferenceSession(proto, backend="reference").run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, twin)  # 0: integer ops, the twins' arithmetic
    unfolded = run_ref_ir(lowered_without_fold(proto, rest=True), {"x": x})[0]
    np.testing.assert_array_equal(got, unfolded)


def fold_reasons(model: Model) -> list[str]:
    before = format_graph(model.graph)
    result = run_passes(model, [FoldCodeClampPass()], stage=Stage.LOWERED)
    assert not result.modified and format_graph(model.graph) == before
    return [r.reason for r in result.why_not("FoldCodeClamp")] + [
        r.reason for r in result.why_not("FoldCodeClampMs")
    ]


def test_fold_refuses_a_table_that_is_not_a_clamp():
    model = lowered_without_fold(conv_act_model("Tanh", 0.0625, np.uint8(128)))
    assert fold_reasons(model) == ["the table is not a clamp of the codes (C1): it stays a table"]


def test_fold_refuses_a_table_that_requantizes():
    # Relu6 from zero point 128 into another scale and zero point 0 (6 not implied: 192
    # steps): a table of codes, but not a clamp of them
    model = lowered_without_fold(
        conv_act_model("Clip", 0.0625, np.uint8(128), 0.0, 6.0, act_ys=0.03125, act_yz=np.uint8(0))
    )
    assert fold_reasons(model) == [
        "the table's output quantization (0.03125, 0) is not the convolution's (0.0625, 128): the table requantizes"
    ]


def test_fold_refuses_a_per_channel_table():
    model = lowered_without_fold(conv_act_model("Clip", 0.0625, np.uint8(128), 0.0, 6.0))
    model.graph.find_nodes("QLinearLookup")[0].attrs["axis"] = 1
    assert fold_reasons(model) == ["the table is per channel (attribute axis): not one clamp of the codes"]


def test_fold_refuses_a_convolution_that_already_clamps():
    model = lowered_without_fold(conv_act_model("Clip", 0.0625, np.uint8(128), 0.0, 6.0))
    model.graph.find_nodes("QLinearConv")[0].attrs["output_clamp"] = [0, 255]
    assert fold_reasons(model) == ["the convolution already clamps its codes (output_clamp)"]


def test_fold_refuses_codes_read_outside_the_table():
    model = lowered_without_fold(conv_act_model("Clip", 0.0625, np.uint8(128), 0.0, 6.0, conv_output=True))
    before = format_graph(model.graph)
    result = run_passes(model, [FoldCodeClampPass()], stage=Stage.LOWERED)
    assert not result.modified and format_graph(model.graph) == before
    reasons = [r.reason for r in result.why_not("FoldCodeClamp", include_pattern=True)]
    assert any("outside the pattern" in r or "is a graph output" in r for r in reasons), reasons


def test_clamp_of_table_every_code_both_signednesses():
    byte_codes_u8 = np.arange(256)
    byte_codes_i8 = np.arange(256, dtype=np.uint8).view(np.int8).astype(np.int64)
    for codes, dtype in ((byte_codes_u8, np.uint8), (byte_codes_i8, np.int8)):
        info = np.iinfo(dtype)
        for lo, hi in ((info.min, info.max), (info.min + 3, info.max), (info.min, info.max - 9), (5, 5)):
            table = np.clip(codes, lo, hi).astype(dtype)
            assert clamp_of_table(table) == (lo, hi)
            bent = table.copy()
            bent[np.argmax(codes == (lo + hi) // 2)] ^= 1  # one code off the clamp
            assert clamp_of_table(bent) is None
    assert clamp_of_table(np.zeros((7, 256), np.uint8)) is None  # per channel
    assert clamp_of_table(np.arange(256).astype(np.uint16)) is None  # not 8-bit


@pytest.mark.parametrize(
    ("clamp", "message"),
    [
        ([224, 128], "expected [lo, hi] with 0 <= lo <= hi <= 255 (codes of u8)"),
        ([-1, 224], "expected [lo, hi] with 0 <= lo <= hi <= 255 (codes of u8)"),
        ([128], "expected [lo, hi] with 0 <= lo <= hi <= 255 (codes of u8)"),
    ],
)
def test_verifier_names_an_output_clamp_outside_the_codes(clamp, message):
    model = lowered_without_fold(conv_act_model("Clip", 0.0625, np.uint8(128), 0.0, 6.0))
    conv = model.graph.find_nodes("QLinearConv")[0]
    conv.attrs["output_clamp"] = clamp
    with pytest.raises(VerifyError) as e:
        verify(model.graph, Stage.LOWERED)
    assert str(e.value) == f"QLinearConv {conv.label}: output_clamp {clamp!r}: {message}"
