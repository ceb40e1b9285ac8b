"""The named pipelines end to end on models built by code: the verifier after every
pass, exact numerics on the reference target for QDQ graphs, derived tolerances for
float folds."""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.ir.types import QuantType
from quanta.ir.verify import Stage, verify
from quanta.passes.manager import PassManager
from quanta.passes.pipelines import PREPARE_FOR_LOWERING, SIMPLIFY, prepare_for_lowering, simplify
from tests.passes.helpers import assert_close, dot_tolerance, out_info, reference_evaluator, rng_data, run_ref


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def qdq_cnn() -> onnx.ModelProto:
    """x -Q/DQ(0.03, 128)-> Conv(DQ(w1 per-channel), b1) -> Relu -Q/DQ(0.05, 0)-> MaxPool
    -Q/DQ(0.05, 0)-> [Conv 1x1 -Q/DQ(0.04, 120)->, Identity] -> Concat -Q/DQ(0.06, 110)->
    Reshape(Shape subgraph: [N, -1]) -Q/DQ(0.06, 110)-> Gemm(DQ(w2)) -Q/DQ(0.09, 125)-> y"""
    rng = np.random.default_rng(0)
    w1 = rng.integers(-127, 128, (7, 3, 3, 3)).astype(np.int8)
    w1s = np.array([0.011, 0.007, 0.013, 0.005, 0.009, 0.012, 0.004], np.float32) * 2
    w3 = rng.integers(-127, 128, (5, 7, 1, 1)).astype(np.int8)
    w2 = rng.integers(-127, 128, (12 * 4 * 3, 17)).astype(np.int8)

    def qdq(src, dst, s, z, tag):
        return [
            helper.make_node("QuantizeLinear", [src, s, z], [f"{tag}_q"], name=f"q_{tag}"),
            helper.make_node("DequantizeLinear", [f"{tag}_q", s, z], [dst], name=f"dq_{tag}"),
        ]

    nodes = [
        *qdq("x", "xf", "s_x", "z_x", "x"),
        helper.make_node("DequantizeLinear", ["w1q", "w1s", "w1z"], ["w1f"], name="dq_w1", axis=0),
        helper.make_node("Conv", ["xf", "w1f", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        *qdq("r1", "r1f", "s_r", "z_r", "r1"),
        helper.make_node("MaxPool", ["r1f"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        *qdq("p", "pf", "s_r", "z_r", "p"),
        helper.make_node("DequantizeLinear", ["w3q", "w3s", "w3z"], ["w3f"], name="dq_w3"),
        helper.make_node("Conv", ["pf", "w3f"], ["c3"], name="conv3"),
        *qdq("c3", "c3f", "s_c3", "z_c3", "c3"),
        helper.make_node("Identity", ["pf"], ["skip"], name="skip"),
        helper.make_node("Concat", ["c3f", "skip"], ["cat"], name="cat", axis=1),
        *qdq("cat", "catf", "s_cat", "z_cat", "cat"),
        helper.make_node("Shape", ["catf"], ["shp"], name="shape"),
        helper.make_node("Gather", ["shp", "zero"], ["n"], name="gather", axis=0),
        helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"], name="unsq"),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], name="target", axis=0),
        helper.make_node("Reshape", ["catf", "target"], ["flat"], name="flatten"),
        *qdq("flat", "flatf", "s_cat", "z_cat", "flat"),
        helper.make_node("DequantizeLinear", ["w2q", "w2s", "w2z"], ["w2f"], name="dq_w2"),
        helper.make_node("Gemm", ["flatf", "w2f", "b2"], ["g"], name="fc"),
        *qdq("g", "y", "s_y", "z_y", "y"),
    ]
    inits = [
        _init("s_x", np.float32(0.03)), _init("z_x", np.uint8(128)),
        _init("w1q", w1), _init("w1s", w1s), _init("w1z", np.zeros(7, np.int8)),
        _init("b1", rng.uniform(-0.5, 0.5, 7).astype(np.float32)),
        _init("s_r", np.float32(0.05)), _init("z_r", np.uint8(0)),
        _init("w3q", w3), _init("w3s", np.float32(0.008)), _init("w3z", np.int8(0)),
        _init("s_c3", np.float32(0.04)), _init("z_c3", np.uint8(120)),
        _init("s_cat", np.float32(0.06)), _init("z_cat", np.uint8(110)),
        _init("zero", np.int64(0)), _init("ax0", np.array([0], np.int64)), _init("minus1", np.array([-1], np.int64)),
        _init("w2q", w2), _init("w2s", np.float32(0.003)), _init("w2z", np.int8(0)),
        _init("b2", rng.uniform(-1, 1, 17).astype(np.float32)),
        _init("s_y", np.float32(0.09)), _init("z_y", np.uint8(125)),
    ]  # fmt: skip
    g = helper.make_graph(
        nodes,
        "qdq_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 9, 7])],
        [out_info("y", 2)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("with_evaluator", [False, True])
def test_simplify_qdq_cnn_is_exact(with_evaluator):
    proto = qdq_cnn()
    model = load(proto)
    ev = reference_evaluator(model.opset_imports) if with_evaluator else None
    result = PassManager(simplify(opset=model.opset(), evaluator=ev), verify=True).run(model)
    counts = model.graph.op_counts()
    assert (
        "Relu" not in counts and "Identity" not in counts and "Shape" not in counts
    )  # dropped / removed / folded
    assert result.fired("DropActivationImpliedByQuantize") == 1  # zero point 0 = qmin
    assert result.fired("AlignConcatInputs") == 1
    pool = model.graph.find_nodes("MaxPool")[0]
    assert isinstance(pool.inputs[0].elem, QuantType)  # the view runs on quantized values
    concat = model.graph.find_nodes("Concat")[0]
    assert {v.producer.inputs[0].elem for v in concat.inputs} == {model.graph.value("cat_q").elem}
    x = rng_data((2, 3, 9, 7), seed=1, low=-3, high=3)
    # tolerance 0: every rule in SIMPLIFY is exact for QDQ graphs (each module proves it)
    np.testing.assert_array_equal(run_ref(proto, {"x": x})[0], run_ref(model, {"x": x})[0])
    verify(model.graph, Stage.QDQ)


def float_cnn_with_bn() -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu -> Dropout -> Flatten -> Identity -> Gemm."""
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["bn"], name="bn"),
        helper.make_node("Relu", ["bn"], ["r"], name="relu"),
        helper.make_node("Dropout", ["r"], ["d"], name="drop"),
        helper.make_node("Flatten", ["d"], ["f"], name="flat"),
        helper.make_node("Identity", ["f"], ["fi"], name="id"),
        helper.make_node("Gemm", ["fi", "fc", "fcb"], ["y"], name="fc", transB=1),
    ]
    inits = [
        _init("w", rng.standard_normal((7, 3, 3, 3)).astype(np.float32) * 0.3),
        _init("b", rng.standard_normal(7).astype(np.float32) * 0.1),
        _init("g", rng.uniform(0.5, 1.5, 7).astype(np.float32)),
        _init("beta", rng.uniform(-0.5, 0.5, 7).astype(np.float32)),
        _init("mean", rng.uniform(-0.2, 0.2, 7).astype(np.float32)),
        _init("var", rng.uniform(0.5, 2.0, 7).astype(np.float32)),
        _init("fc", rng.standard_normal((5, 7 * 4 * 3)).astype(np.float32) * 0.1),
        _init("fcb", rng.standard_normal(5).astype(np.float32)),
    ]
    g = helper.make_graph(
        nodes,
        "float_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 3])],
        [out_info("y", 2)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_simplify_float_cnn_folds_batchnorm_and_removes_noops():
    proto = float_cnn_with_bn()
    model = load(proto)
    out = io.StringIO()
    result = PassManager(
        simplify(opset=model.opset()), verify=True, dump_after={"fold_batchnorm"}, dump_to=out
    ).run(model)
    assert model.graph.op_counts() == {"Conv": 1, "Flatten": 1, "Gemm": 1, "Relu": 1}
    assert result.fired("FoldBatchNormIntoConv") == 1
    assert out.getvalue().startswith("// IR after step 3/10 'fold_batchnorm'\ngraph float_cnn(")
    x = rng_data((2, 3, 4, 3), seed=4)
    conv = model.graph.find_nodes("Conv")[0]
    fc = model.graph.initializers["fc"].const
    conv_mag = np.abs(x).max() * np.abs(conv.inputs[1].const).reshape(7, -1).sum(1).max() + 4.0
    # the conv-side bound (K = 27) carried through Relu (1-Lipschitz) and the Gemm
    # (scaled by Σ|fc| of a row), plus the Gemm's own rounding on identical inputs (0)
    tol = dot_tolerance(27, conv_mag) * np.abs(fc).sum(1).max()
    assert_close(run_ref(proto, {"x": x}), run_ref(model, {"x": x}), tol)
    verify(model.graph, Stage.FLOAT)


def test_pipelines_are_plain_lists_in_order():
    assert [p.name for p in SIMPLIFY] == [
        "fold_constants",
        "remove_noops",
        "fold_batchnorm",
        "fold_groupnorm",
        "propagate_views",
        "remove_noops",
        "fold_constants",  # Q(constant) left where a view moved above a Q
        "drop_implied_activation",
        "align_scales",
        "eliminate_common",
        "eliminate_dead",
    ]
    assert [p.name for p in PREPARE_FOR_LOWERING][-2:] == ["fuse_activation", "eliminate_dead"]
    assert (
        prepare_for_lowering() is not PREPARE_FOR_LOWERING and simplify()[0] is not SIMPLIFY[0]
    )  # fresh lists


def test_why_not_across_a_pipeline():
    # the conv weight is dequantized: BatchNormalization cannot fold; the reason is kept
    proto = float_cnn_with_bn()
    w = next(i for i in proto.graph.initializer if i.name == "w")
    proto.graph.initializer.remove(w)
    wq = np.clip(np.rint(numpy_helper.to_array(w) / 0.01), -127, 127).astype(np.int8)
    proto.graph.initializer.extend([_init("wq", wq), _init("ws", np.float32(0.01)), _init("wz", np.int8(0))])
    proto.graph.node.insert(0, helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], name="dq_w"))
    model = load(proto)
    result = PassManager(simplify(opset=model.opset()), verify=True).run(model)
    assert [str(r) for r in result.why_not("fold_batch_norm_into_conv")] == [
        "FoldBatchNormIntoConv at 'bn' (BatchNormalization) -> %bn: W 'w' (output of 'dq_w' (DequantizeLinear)) "
        "is not a constant"
    ]


def test_lower_qdq_runs_the_clean_up_then_instruction_selection():
    # Numerics of instruction selection are tested with the lowering rules
    # (tests/passes/lower); here: the pipeline's order and that every step verifies.
    from quanta.passes.pipelines import lower_qdq

    passes = lower_qdq(opset=21)
    names = [p.name for p in passes]
    assert names[-20:] == [
        "lower_qdq_to_qlinear",
        "eliminate_dead",
        "fold_constants",  # without an evaluator: no fold_requantized_constants
        "compose_lookups",
        "fold_code_clamp",  # a clamp-only table into its QLinearConv, before channels_last
        "quantize_pad",
        "conv_transpose_1d_as_2d",
        "fuse_gelu",
        "fuse_layer_norm",
        "canonicalize_einsum",
        "fuse_accumulator_to_quant",
        "fuse_softmax_quant",
        "fuse_mul_quant",
        "channels_last",
        "collapse_views",
        "fuse_qlinear_matmul_add",
        "transpose_as_view",
        "relabel_codes",  # an identity table: an alias under its output type, after channels_last
        "eliminate_dead",
        "carry_requantization",
    ]
    assert "align_scales" not in names and "fuse_activation" not in names
    model = load(qdq_cnn())
    PassManager(passes, verify=True).run(model)
    counts = model.graph.op_counts()
    assert (
        counts.get("com.microsoft::QLinearConv", 0) >= 1
        and counts.get("com.microsoft::QLinearConcat", 0) == 1
    )
    assert "QLinearConv" not in counts  # every convolution runs channels-last
    verify(model.graph, Stage.LOWERED)
    # and carries its requantization multiplier (passes/lower/requant_params.py)
    convs = [n for n in model.graph.nodes if n.op_type == "QLinearConv"]
    assert convs and all(n.requant is not None for n in convs)


def test_prepare_for_quantization_folds_float_weights_only():
    from quanta.passes.pipelines import prepare_for_quantization

    assert [p.name for p in prepare_for_quantization(opset=21)] == [
        "fold_constants",
        "fold_static_dims",
        "fold_constants",
        "fold_reshape_dims",
        "refine_shapes",
        "canonicalize",
        "canonicalize_activations",
        "remove_noops",
        "widen_half_islands",
        "sink_transposes",
        "eliminate_dead",
        "fold_pad",
        "fold_batchnorm",
        "fold_conv_affine",
        "scale_through_relu",
        "fold_zero_product",
        "conv_transpose_as_conv",
        "conv_depth_one",
        "fold_groupnorm",
        "hoist_gathered_gemm",
        "canonicalize_activation_einsum",
        "eliminate_common",
        "eliminate_dead",
    ]
    # below opset 21 no GroupNormalization is created (onnx's checker rejects GroupNormalization-18)
    assert "fold_groupnorm" not in [p.name for p in prepare_for_quantization(opset=18)]
    proto = float_cnn_with_bn()
    model = load(proto)
    PassManager(prepare_for_quantization(opset=model.opset()), verify=True).run(model)
    assert model.graph.op_counts() == {"Conv": 1, "Flatten": 1, "Gemm": 1, "Relu": 1}
