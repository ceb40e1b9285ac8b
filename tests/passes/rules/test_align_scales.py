"""align_scales: Concat inputs requantized to the output type (exact); Add inputs too
when asked (at most one output step of difference)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.ir.printer import format_graph
from quanta.ir.verify import Stage, verify
from quanta.passes.manager import PassManager
from quanta.passes.rules.align_scales import AlignScales
from quanta.passes.rules.remove_noops import RemoveNoops
from tests.passes.helpers import out_info, rng_data, run_passes, run_ref

# (scale, zero point) per input: distinct; the output is (0.04, 118)
INPUT_PARAMS = [(0.02, 131), (0.05, 120), (0.03, 125)]
OUT = (0.04, 118)


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def merge_model(op: str = "Concat", params=INPUT_PARAMS, out=OUT, out_axis: bool = False) -> onnx.ModelProto:
    """x_i -Q/DQ(params_i)-> op(axis 1 for Concat) -Q/DQ(out)-> y."""
    nodes, inits, inputs, dq_outs = [], [], [], []
    for k, (s, z) in enumerate(params):
        nodes += [
            helper.make_node("QuantizeLinear", [f"x{k}", f"s{k}", f"z{k}"], [f"q{k}"], name=f"q{k}"),
            helper.make_node("DequantizeLinear", [f"q{k}", f"s{k}", f"z{k}"], [f"f{k}"], name=f"dq{k}"),
        ]
        inits += [_init(f"s{k}", np.float32(s)), _init(f"z{k}", np.uint8(z))]
        inputs.append(helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [3, 2 + k, 5]))
        dq_outs.append(f"f{k}")
    if op == "Add":
        inputs = [
            helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [3, 7, 5]) for k in range(len(params))
        ]
    attrs = {"axis": 1} if op == "Concat" else {}
    q_attrs = {"axis": 1} if out_axis else {}
    nodes += [
        helper.make_node(op, dq_outs, ["c"], name="merge", **attrs),
        helper.make_node("QuantizeLinear", ["c", "sy", "zy"], ["qy"], name="qy", **q_attrs),
        helper.make_node("DequantizeLinear", ["qy", "sy", "zy"], ["y"], name="dqy", **q_attrs),
    ]
    if out_axis:
        width = 9 if op == "Concat" else 7
        inits += [
            _init("sy", np.full(width, out[0], np.float32)),
            _init("zy", np.full(width, out[1], np.uint8)),
        ]
    else:
        inits += [_init("sy", np.float32(out[0])), _init("zy", np.uint8(out[1]))]
    g = helper.make_graph(nodes, "merge", inputs, [out_info("y", 3)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def feeds(proto, seed=0) -> dict[str, np.ndarray]:
    out = {}
    for k, inp in enumerate(proto.graph.input):
        shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        out[inp.name] = rng_data(shape, seed=seed + k, low=-2.4, high=2.4)
    return out


@pytest.mark.parametrize("aligned_first", [False, True])
def test_align_concat_inputs(aligned_first):
    params = [OUT, *INPUT_PARAMS[1:]] if aligned_first else INPUT_PARAMS
    proto = merge_model("Concat", params)
    model = load(proto)
    result = run_passes(model, [AlignScales()])
    assert result.fired("AlignConcatInputs") == 1
    n_requant = 2 if aligned_first else 3
    assert model.graph.op_counts() == {
        "Concat": 1,
        "DequantizeLinear": 4 + n_requant,
        "QuantizeLinear": 4 + n_requant,
    }
    concat = model.graph.find_nodes("Concat")[0]
    for v in concat.inputs:  # every Concat input is now dequantized from the output type
        assert (
            v.producer.op_type == "DequantizeLinear"
            and v.producer.inputs[0].elem == model.graph.value("qy").elem
        )
    f = feeds(proto)
    # tolerance 0: Q(Concat(a_i)) = Q(Concat(DQ(Q(a_i)))) exactly (module docstring)
    np.testing.assert_array_equal(run_ref(proto, f)[0], run_ref(model, f)[0])
    verify(model.graph, Stage.QDQ)


def test_align_concat_then_remove_noops_keeps_only_requantizations():
    # the aligned input's DQ -> Q pair is an identity and goes; the others requantize
    proto = merge_model("Concat", [OUT, *INPUT_PARAMS[1:]])
    model = load(proto)
    result = run_passes(model, [AlignScales(), RemoveNoops()])
    assert result.fired("AlignConcatInputs") == 1 and result.fired("RemoveDequantizeQuantize") == 0
    f = feeds(proto, seed=3)
    np.testing.assert_array_equal(run_ref(proto, f)[0], run_ref(model, f)[0])


def test_align_add_inputs_is_within_one_output_step():
    proto = merge_model("Add", INPUT_PARAMS[:2], out=(0.06, 128))
    model = load(proto)
    result = run_passes(model, [AlignScales(add=True)])
    assert result.fired("AlignAddInputs") == 1
    assert model.graph.op_counts() == {"Add": 1, "DequantizeLinear": 5, "QuantizeLinear": 5}
    f = feeds(proto, seed=7)
    expected, actual = run_ref(proto, f)[0], run_ref(model, f)[0]
    # |Δq| <= 1: rint(u1) + rint(u2) vs rint(u1 + u2) (module docstring), i.e. one step 0.06
    steps = np.rint(np.abs(expected.astype(np.float64) - actual) / np.float32(0.06))
    assert steps.max() == 1 and np.mean(steps > 0) > 0.01  # the bound is reached: not exact
    verify(model.graph, Stage.QDQ)


def test_align_scales_leaves_add_alone_by_default():
    proto = merge_model("Add", INPUT_PARAMS[:2], out=(0.06, 128))
    model = load(proto)
    assert not run_passes(model, [AlignScales()]).modified


# -- NoMatch reasons -------------------------------------------------------------------------


def reasons(proto_or_model, rule: str = "AlignConcatInputs", add: bool = False) -> list[str]:
    model = load(proto_or_model) if isinstance(proto_or_model, onnx.ModelProto) else proto_or_model
    before = format_graph(model.graph)
    result = PassManager([AlignScales(add=add)], verify=True).run(model)
    assert format_graph(model.graph) == before
    return [r.reason for r in result.why_not(rule)]


def test_align_refuses_per_axis_output():
    assert reasons(merge_model(out_axis=True)) == ["per-axis output quantization (axis 1)"]


def test_align_refuses_non_constant_output_scale():
    proto = merge_model()
    sy = next(i for i in proto.graph.initializer if i.name == "sy")
    proto.graph.initializer.remove(sy)
    proto.graph.input.append(helper.make_tensor_value_info("sy", TensorProto.FLOAT, []))
    assert reasons(proto) == ["output scale / zero point are not constants"]


def test_align_refuses_an_input_that_is_not_dequantized():
    proto = merge_model()
    proto.graph.node.insert(6, helper.make_node("Relu", ["f2"], ["f2r"], name="relu"))
    proto.graph.node[7].input[2] = "f2r"
    assert reasons(proto) == ["input 2 of Concat 'f2r' (output of 'relu' (Relu)) is not dequantized"]


def test_align_refuses_an_input_with_non_constant_parameters():
    proto = merge_model()
    s1 = next(i for i in proto.graph.initializer if i.name == "s1")
    proto.graph.initializer.remove(s1)
    proto.graph.input.append(helper.make_tensor_value_info("s1", TensorProto.FLOAT, []))
    assert reasons(proto) == ["input 1 of Concat: its DequantizeLinear has non-constant parameters"]


def test_align_refuses_a_subnormal_output_scale():
    assert reasons(merge_model(out=(1e-40, 118))) == [
        "requantizing to the output type may not round-trip: scale 9.99994610111476e-41 is subnormal or too large "
        "for exact round trips"
    ]


def test_align_refuses_float8_output():
    model = load(merge_model())
    model.graph.initializers["zy"].const = np.array(0, dtype=__import__("ml_dtypes").float8_e4m3fn)
    # retype the Q output to what its parameters now say (float8 storage)
    from quanta.ir.onnx_io import annotate_quantized_types

    annotate_quantized_types(model.graph)
    model.graph.output_signature = [v.type for v in model.graph.outputs]
    assert reasons(model) == ["output storage f8e4m3fn is not an integer type"]


def test_align_concat_output_used_elsewhere():
    proto = merge_model()
    proto.graph.node.append(helper.make_node("Neg", ["c"], ["n"], name="neg"))
    proto.graph.output.append(out_info("n", 3))
    assert reasons(proto) == [
        "'c' (output of 'merge' (Concat)) is also used by 'neg' (Neg) outside the pattern"
    ]


def test_align_add_refuses_an_input_range_that_would_saturate():
    # input 1 (0.05, 120) spans [-6, 6.75]; the output (0.03, 128) only [-3.84, 3.81]
    proto = merge_model("Add", INPUT_PARAMS[:2], out=(0.03, 128))
    assert reasons(proto, "AlignAddInputs", add=True) == [
        "input 1 of Add spans [-6, 6.75], outside the output's representable range [-3.84, 3.81]: "
        "requantizing it would saturate"
    ]


def test_align_add_refuses_per_axis_input():
    proto = merge_model("Add", INPUT_PARAMS[:2], out=(0.06, 128))
    proto.graph.node[0].attribute.append(helper.make_attribute("axis", 1))
    proto.graph.node[1].attribute.append(helper.make_attribute("axis", 1))
    for i in proto.graph.initializer:
        if i.name in ("s0", "z0"):
            arr = numpy_helper.to_array(i)
            i.CopyFrom(_init(i.name, np.full(7, arr, arr.dtype)))
    assert reasons(proto, "AlignAddInputs", add=True) == ["input 0 of Add has per-axis quantization (axis 1)"]
