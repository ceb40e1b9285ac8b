"""FoldFloatWeights (passes/lower/fold_float_weights.py): DequantizeLinear of a constant
read only by float ops becomes a float constant. Four parts (fired; structure; bit-exact
on the reference target, the constant being the reference's own DequantizeLinear
output; the verifier in the lowered stage) and one negative test per NoMatch reason."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.ir.verify import Stage
from quanta.passes.lower.fold_float_weights import FoldFloatWeight, FoldFloatWeights
from quanta.passes.pattern import RewritePass
from quanta.runtime.compile import reference_evaluator
from tests.passes.helpers import run_passes, run_ref

D = 17


def ln_proto(*, gamma_reader: str = "LayerNormalization", gamma_const: bool = True):
    """x -> LayerNormalization(x, DQ(gamma_i8), DQ(beta_i32)) the way ONNX Runtime's QDQ
    files carry LayerNorm parameters (per-tensor int8 gamma, int32 beta)."""
    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array(rng.integers(-127, 128, D).astype(np.int8), "g_q"),
        numpy_helper.from_array(np.float32(0.0123), "g_s"),
        numpy_helper.from_array(np.int8(3), "g_z"),
        numpy_helper.from_array(rng.integers(-5000, 5000, D).astype(np.int32), "b_q"),
        numpy_helper.from_array(np.float32(0.00071), "b_s"),
        numpy_helper.from_array(np.int32(0), "b_z"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5, D])]
    if not gamma_const:
        inits = inits[1:]
        inputs.append(helper.make_tensor_value_info("g_q", TensorProto.INT8, [D]))
    nodes = [
        helper.make_node("DequantizeLinear", ["g_q", "g_s", "g_z"], ["g"], name="dq_g"),
        helper.make_node("DequantizeLinear", ["b_q", "b_s", "b_z"], ["b"], name="dq_b"),
    ]
    if gamma_reader == "LayerNormalization":
        nodes.append(helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, name="ln"))
    else:  # the dequantized weight is re-quantized: a QDQ pair the lowering left
        nodes.append(helper.make_node("QuantizeLinear", ["g", "g_s", "g_z"], ["gq2"], name="q_g"))
        nodes.append(helper.make_node("DequantizeLinear", ["gq2", "g_s", "g_z"], ["g2"], name="dq_g2"))
        nodes.append(helper.make_node("LayerNormalization", ["x", "g2", "b"], ["y"], axis=-1, name="ln"))
    g = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5, D])], inits
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def fold(model, **kw):
    p = RewritePass([FoldFloatWeight(reference_evaluator(model.opset_imports), **kw)])
    return p, run_passes(model, [p], stage=Stage.LOWERED)


def feeds():
    return {"x": np.random.default_rng(4).standard_normal((3, 5, D)).astype(np.float32)}


def test_layernorm_parameters_fold_bit_exact():
    proto = ln_proto()
    model = load(proto)
    _, result = fold(model)
    assert result.fired("FoldFloatWeight") == 2
    assert [n.op_type for n in model.graph.nodes] == ["LayerNormalization"]
    g = model.graph.nodes[0].inputs[1]
    assert g.is_const and g.const.dtype == np.float32 and g.const.shape == (D,)
    np.testing.assert_array_equal(run_ref(proto, feeds())[0], run_ref(model, feeds())[0])


def test_the_pass_wrapper_runs_the_rule():
    model = load(ln_proto())
    result = run_passes(
        model, [FoldFloatWeights(reference_evaluator(model.opset_imports))], stage=Stage.LOWERED
    )
    assert result.fired("FoldFloatWeight") == 2


def test_a_weight_read_by_quantize_linear_is_kept():
    model = load(ln_proto(gamma_reader="QuantizeLinear"))
    p, result = fold(model)
    assert result.fired("FoldFloatWeight") == 1  # beta; the second DQ reads a computed tensor
    assert [r.reason for r in p.why_not("FoldFloatWeight")] == [
        "read by QuantizeLinear (a quantized weight stays quantized)"
    ]


def test_a_large_weight_stays_int8():
    model = load(ln_proto())
    p, result = fold(model, max_output_elements=16)
    assert result.fired("FoldFloatWeight") == 0
    assert {r.reason for r in p.why_not("FoldFloatWeight")} == {"17 elements (> 16): the int8 copy is kept"}


@pytest.mark.parametrize("gamma_const", [False])
def test_a_runtime_input_is_not_folded(gamma_const):
    model = load(ln_proto(gamma_const=gamma_const))
    _, result = fold(model)
    assert result.fired("FoldFloatWeight") == 1  # beta only
    assert any(n.op_type == "DequantizeLinear" and n.name == "dq_g" for n in model.graph.nodes)


# -- GatherDequantizedRows -------------------------------------------------------------


def embedding_proto(*, zero_points: bool, rows: int = 19, width: int = 7, s_shape=None, gather_axis: int = 0):
    """ids -> Gather(DequantizeLinear(table_i8 [19, 7], per-row scales {axis 0}), ids): NNCF's
    embedding layout; distinct scales, and non-zero zero points that differ per row."""
    rng = np.random.default_rng(2)
    s = np.linspace(0.002, 0.09, rows).astype(np.float32)
    inits = [
        numpy_helper.from_array(rng.integers(-128, 128, (rows, width)).astype(np.int8), "t_q"),
        numpy_helper.from_array(s if s_shape is None else np.resize(s, s_shape), "t_s"),
    ]
    dq_in = ["t_q", "t_s"]
    if zero_points:
        inits.append(numpy_helper.from_array(rng.integers(-9, 10, rows).astype(np.int8), "t_z"))
        dq_in.append("t_z")
    nodes = [
        helper.make_node("DequantizeLinear", dq_in, ["t"], name="dq_t", axis=0),
        helper.make_node("Gather", ["t", "ids"], ["y"], name="gather", axis=gather_axis),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("zero_points", [False, True])
def test_gather_dequantized_rows_bit_exact(zero_points):
    from quanta.passes.lower.fold_float_weights import GatherDequantizedRows

    proto = embedding_proto(zero_points=zero_points)
    model = load(proto)
    result = run_passes(model, [RewritePass([GatherDequantizedRows(min_elements=1)])], stage=Stage.LOWERED)
    assert result.fired("GatherDequantizedRows") == 1
    ops = model.graph.op_counts()
    assert "DequantizeLinear" not in ops
    assert ops == {
        "Gather": 3 if zero_points else 2,
        "Cast": 1,
        "Mul": 1,
        **({"Sub": 1} if zero_points else {}),
    }
    ids = np.array([[0, 18, 3, 3, 7], [-1, 5, 11, 2, 17]], np.int64)  # a negative index counts from the end
    want = run_ref(proto, {"ids": ids})[0]
    got = run_ref(model, {"ids": ids})[0]
    assert want.shape == (2, 5, 7)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    # the native target runs the rewritten graph as written: the same bits
    from quanta import GraphOptimizationLevel, InferenceSession, SessionOptions
    from quanta.ir.onnx_io import to_proto

    options = SessionOptions(graph_optimization_level=GraphOptimizationLevel.ORT_DISABLE_ALL)
    native = InferenceSession(to_proto(model), options, backend="native")
    assert not native.fallbacks
    np.testing.assert_array_equal(native.run(None, {"ids": ids})[0].view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        (dict(s_shape=(1,)), "the table is not quantized per row (one float32 scale per row, axis 0)"),
        (dict(gather_axis=1), "the DequantizeLinear's axis or the Gather's axis is not 0"),
    ],
)
def test_gather_dequantized_rows_refusals(kwargs, reason):
    from quanta.passes.lower.fold_float_weights import GatherDequantizedRows

    p = RewritePass([GatherDequantizedRows(min_elements=1)])
    model = load(embedding_proto(zero_points=False, **kwargs))
    result = run_passes(model, [p], stage=Stage.LOWERED)
    assert result.fired("GatherDequantizedRows") == 0
    assert [r.reason for r in p.why_not("GatherDequantizedRows")] == [reason]
    assert "DequantizeLinear" in model.graph.op_counts()
