"""fold_groupnorm: Reshape -> InstanceNormalization -> Reshape into GroupNormalization,
with the result type taken from the replaced output."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.graph import Graph, Node, Value
from quanta.ir.onnx_io import load
from quanta.ir.printer import format_graph
from quanta.ir.types import F32, I8, QuantType, TensorType
from quanta.ir.verify import Stage, verify
from quanta.passes.manager import PassManager
from quanta.passes.rules.fold_groupnorm import FoldGroupNorm
from tests.passes.helpers import F32_EPS, assert_close, out_info, rng_data, run_passes, run_ref, run_ref_ir

SHAPE = (2, 6, 7, 5)  # every dimension different
GAMMA = np.array([0.5, -1.25, 2.0], np.float32)  # differs per group
BETA = np.array([0.1, -0.3, 0.7], np.float32)


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def gn_model(
    opset: int = 21,
    s1=(0, 3, -1),
    s2=SHAPE,
    x_dims=SHAPE,
    qdq: tuple[float, float] | None = None,
    gamma=GAMMA,
    beta=BETA,
) -> onnx.ModelProto:
    """x -> Reshape(s1) -> InstanceNormalization(gamma, beta, eps 1e-3) -> Reshape(s2) -> y.

    ``qdq=(sx, sy)``: x and y quantized (u8, zero points 121 / 118)."""
    src, nodes, inits = "x", [], []
    if qdq is not None:
        nodes += [
            helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="q_x"),
            helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xf"], name="dq_x"),
        ]
        inits += [_init("xs", np.float32(qdq[0])), _init("xz", np.uint8(121))]
        src = "xf"
    nodes += [
        helper.make_node("Reshape", [src, "s1"], ["r"], name="split"),
        helper.make_node("InstanceNormalization", ["r", "gamma", "beta"], ["n"], name="inorm", epsilon=1e-3),
        helper.make_node("Reshape", ["n", "s2"], ["t" if qdq else "y"], name="merge"),
    ]
    if qdq is not None:
        nodes += [
            helper.make_node("QuantizeLinear", ["t", "ys", "yz"], ["tq"], name="q_y"),
            helper.make_node("DequantizeLinear", ["tq", "ys", "yz"], ["y"], name="dq_y"),
        ]
        inits += [_init("ys", np.float32(qdq[1])), _init("yz", np.uint8(118))]
    inits += [
        _init("s1", np.array(s1, np.int64)),
        _init("s2", np.array(s2, np.int64)),
        _init("gamma", np.asarray(gamma, np.float32)),
        _init("beta", np.asarray(beta, np.float32)),
    ]
    g = helper.make_graph(
        nodes,
        "gn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_dims))],
        [out_info("y", 4)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def norm_tolerance(x: np.ndarray, groups: int, gamma, beta, eps: float = 1e-3) -> float:
    """Both sides compute mean and variance over L = size/(N·G) float32 elements (in a
    different order) and then a few roundings: the normalized value z = (x - μ)/σ is
    within γ_{2L+8}·(max|x - μ| + |μ|)/σ of exact on each side (sums of L terms for μ
    and for σ², both relative γ_L, plus ≤ 8 roundings), so the outputs differ by at most
    twice that, times max|gamma|, plus one rounding of |beta|."""
    n = x.shape[0]
    rows = x.reshape(n, groups, -1).astype(np.float64)
    length = rows.shape[-1]
    mu = rows.mean(-1, keepdims=True)
    sigma = np.sqrt(rows.var(-1, keepdims=True) + eps)
    u = F32_EPS / 2
    k = 2 * length + 8
    gamma_k = k * u / (1 - k * u)
    z_err = gamma_k * ((np.abs(rows - mu).max(-1) + np.abs(mu[..., 0])) / sigma[..., 0]).max()
    return float(2 * z_err * np.abs(gamma).max() + 2 * u * (np.abs(beta).max() + 10 * np.abs(gamma).max()))


@pytest.mark.parametrize(
    ("opset", "s1"),
    [
        (21, (0, 3, -1)),  # per-channel scale/bias, N copied by 0
        (18, (2, 3, -1)),  # per-group scale/bias, N written out
        (21, (-1, 3, 2, 7, 5)),  # N recovered by -1, the group kept as (C/G, H, W)
    ],
)
def test_fold_groupnorm_float(opset, s1):
    proto = gn_model(opset, s1=s1)
    model = load(proto)
    result = run_passes(model, [FoldGroupNorm(opset)])
    assert result.fired("FoldReshapeInstanceNormIntoGroupNorm") == 1
    assert model.graph.op_counts() == {"GroupNormalization": 1}
    gn = model.graph.nodes[0]
    assert gn.inputs[0].name == "x" and gn.outputs[0].name == "y" and gn.attrs["num_groups"] == 3
    scale = gn.inputs[1].const
    expected_scale = np.repeat(GAMMA, 2) if opset >= 21 else GAMMA
    np.testing.assert_array_equal(scale, expected_scale)
    x = rng_data(SHAPE, seed=2, low=-3, high=5)
    # onnx's checker rejects GroupNormalization-18 as deprecated, so the opset-18 graph
    # runs on the reference target directly instead of through a reloaded file
    actual = run_ref(model, {"x": x}) if opset >= 21 else run_ref_ir(model, {"x": x})
    assert_close(run_ref(proto, {"x": x}), actual, norm_tolerance(x, 3, GAMMA, BETA))
    verify(model.graph, Stage.FLOAT)


def test_fold_groupnorm_with_symbolic_batch():
    proto = gn_model(21, s1=(0, 3, -1), s2=(0, 6, 7, 5), x_dims=("N", 6, 7, 5))
    model = load(proto)
    assert run_passes(model, [FoldGroupNorm(21)]).fired("FoldReshapeInstanceNormIntoGroupNorm") == 1
    x = rng_data((3, 6, 7, 5), seed=4)
    assert_close(run_ref(proto, {"x": x}), run_ref(model, {"x": x}), norm_tolerance(x, 3, GAMMA, BETA))


def test_fold_groupnorm_in_a_qdq_graph():
    # x at 0.02, y at 0.08: the GroupNormalization sits between DQ(x) and Q(y)
    proto = gn_model(21, qdq=(0.02, 0.08))
    model = load(proto)
    result = run_passes(model, [FoldGroupNorm(21)])
    assert result.fired("FoldReshapeInstanceNormIntoGroupNorm") == 1
    assert model.graph.op_counts() == {"DequantizeLinear": 2, "GroupNormalization": 1, "QuantizeLinear": 2}
    x = rng_data(SHAPE, seed=5, low=-2, high=3)
    expected, actual = run_ref(proto, {"x": x})[0], run_ref(model, {"x": x})[0]
    # the float results differ by far less than half a step (norm_tolerance << 0.04), so
    # after Q they differ by at most one step 0.08, and only where a value sits at a tie
    steps = np.abs(expected.astype(np.float64) - actual) / np.float32(0.08)
    assert np.all(steps <= 1 + 1e-6) and np.mean(steps > 0) < 0.01
    verify(model.graph, Stage.QDQ)


# -- the result type comes from the replaced output ------------------------------------


def q(scale: float, zp: int) -> QuantType:
    return QuantType(I8, F32, scale, zp)


def lowered_gn_graph(in_scale: float, out_scale: float) -> Graph:
    """Lowered stage: x: Q(in) -> Reshape (view, keeps Q(in)) -> InstanceNormalization -> Q(out)
    -> Reshape (keeps Q(out)) -> y."""
    g = Graph()
    x = g.add_input("x", TensorType(q(in_scale, 3), SHAPE))
    s1 = g.add_initializer("s1", np.array([0, 3, -1], np.int64))
    s2 = g.add_initializer("s2", np.array(SHAPE, np.int64))
    gamma = g.add_initializer("gamma", GAMMA)
    beta = g.add_initializer("beta", BETA)
    r = Value("r", TensorType(q(in_scale, 3), (2, 3, 70)))
    n = Value("n", TensorType(q(out_scale, -5), (2, 3, 70)))
    y = Value("y", TensorType(q(out_scale, -5), SHAPE))
    g.add_node(Node("Reshape", [x, s1], [r], name="split"))
    g.add_node(Node("InstanceNormalization", [r, gamma, beta], [n], {"epsilon": 1e-3}, name="inorm"))
    g.add_node(Node("Reshape", [n, s2], [y], name="merge"))
    g.set_outputs([y])
    return g


def test_fold_groupnorm_result_carries_the_output_scale_not_the_input_scale():
    # Failure signature: the folded node typed from its input (0.02) instead of the
    # replaced output (0.08); the verifier would report the graph signature broken.
    g = lowered_gn_graph(0.02, 0.08)
    result = PassManager([FoldGroupNorm(21)], verify=True, stage=Stage.LOWERED).run(g)
    assert result.fired("FoldReshapeInstanceNormIntoGroupNorm") == 1
    (gn,) = g.nodes
    assert gn.op_type == "GroupNormalization" and gn.inputs[0].elem == q(0.02, 3)
    assert gn.outputs[0].elem == q(0.08, -5)
    verify(g, Stage.LOWERED)


def test_fold_groupnorm_result_does_not_follow_a_changed_input_scale():
    # Converse: only the input's scale changes (0.05); the folded output stays at 0.08.
    g = lowered_gn_graph(0.05, 0.08)
    PassManager([FoldGroupNorm(21)], verify=True, stage=Stage.LOWERED).run(g)
    (gn,) = g.nodes
    assert gn.inputs[0].elem == q(0.05, 3) and gn.outputs[0].elem == q(0.08, -5)
    verify(g, Stage.LOWERED)


# -- NoMatch reasons: a pattern that fails its check leaves the graph untouched --------------


def reasons(proto_or_graph, opset: int = 21, include_pattern: bool = False) -> list[str]:
    target = load(proto_or_graph) if isinstance(proto_or_graph, onnx.ModelProto) else proto_or_graph
    graph = target if isinstance(target, Graph) else target.graph
    before = format_graph(graph)
    result = PassManager([FoldGroupNorm(opset)], verify=True).run(target)
    assert not result.modified and format_graph(graph) == before
    return [
        r.reason
        for r in result.why_not("FoldReshapeInstanceNormIntoGroupNorm", include_pattern=include_pattern)
    ]


def test_fold_groupnorm_refuses_opset_17():
    assert reasons(gn_model(17), opset=17) == ["opset 17 has no GroupNormalization (added in opset 18)"]


def test_fold_groupnorm_refuses_non_constant_target_shape():
    proto = gn_model()
    s1 = next(i for i in proto.graph.initializer if i.name == "s1")
    proto.graph.initializer.remove(s1)
    proto.graph.input.append(helper.make_tensor_value_info("s1", TensorProto.INT64, [3]))
    assert reasons(proto) == ["Reshape target s1 's1' (a graph input) is not a constant"]


def test_fold_groupnorm_refuses_non_constant_gamma():
    proto = gn_model()
    gm = next(i for i in proto.graph.initializer if i.name == "gamma")
    proto.graph.initializer.remove(gm)
    proto.graph.input.append(helper.make_tensor_value_info("gamma", TensorProto.FLOAT, [3]))
    assert reasons(proto) == ["InstanceNormalization gamma 'gamma' (a graph input) is not a constant"]


def test_fold_groupnorm_refuses_dynamic_channels():
    proto = gn_model(s2=(0, 0, 7, 5), x_dims=(2, "C", 7, 5))
    assert reasons(proto) == [
        "'x' (a graph input) has shape [2, C, 7, 5]: channel and spatial dimensions must be static"
    ]


def test_fold_groupnorm_refuses_rank_2_input():
    g = Graph()
    x = g.add_input("x", TensorType(F32, (6, 35)))
    s1 = g.add_initializer("s1", np.array([2, 3, -1], np.int64))
    s2 = g.add_initializer("s2", np.array([6, 35], np.int64))
    gamma, beta = g.add_initializer("gamma", GAMMA), g.add_initializer("beta", BETA)
    r, n, y = (
        Value("r", TensorType(F32, (2, 3, 35))),
        Value("n", TensorType(F32, (2, 3, 35))),
        Value("y", TensorType(F32, (6, 35))),
    )
    g.add_node(Node("Reshape", [x, s1], [r], name="split"))
    g.add_node(Node("InstanceNormalization", [r, gamma, beta], [n], name="inorm"))
    g.add_node(Node("Reshape", [n, s2], [y], name="merge"))
    g.set_outputs([y])
    assert reasons(g) == ["'x' (a graph input) has shape [6, 35]: expected (N, C, spatial...)"]


def test_fold_groupnorm_refuses_a_reshape_that_mixes_the_batch():
    # [1, 3, -1] on N = 2 folds the batch into the groups: not a GroupNorm
    proto = gn_model(s1=(1, 3, -1), s2=SHAPE)
    assert reasons(proto) == ["the first Reshape gives [1, 3, 140], expected [N, G, ...] keeping N = 2"]


def test_fold_groupnorm_refuses_groups_that_do_not_divide_channels():
    # 5 rows of 42 = 1.2 channels each: InstanceNormalization runs, but it is not a GroupNorm
    proto = gn_model(s1=(0, 5, -1), gamma=np.ones(5), beta=np.zeros(5))
    assert reasons(proto) == [
        "the first Reshape gives [2, 5, 42]: it does not split the 6 channels into groups "
        "(expected [N, G, ...] with G dividing 6)"
    ]


def test_fold_groupnorm_refuses_a_second_reshape_to_another_shape():
    proto = gn_model(s2=(2, 6, 5, 7))
    assert reasons(proto) == ["the second Reshape gives [2, 6, 5, 7], not the input shape [2, 6, 7, 5]"]


def test_fold_groupnorm_refuses_gamma_of_the_wrong_length():
    # ill-formed for InstanceNormalization: built past the checker by editing the IR
    model = load(gn_model())
    model.graph.initializers["gamma"].const = np.ones(6, np.float32)
    model.graph.initializers["gamma"].type = TensorType(F32, (6,))
    assert reasons(model) == ["InstanceNormalization scale/bias have shapes (6,), (3,), expected (3,)"]


def test_fold_groupnorm_refuses_intermediate_used_elsewhere():
    proto = gn_model()
    proto.graph.node.append(helper.make_node("Neg", ["n"], ["neg"], name="neg"))
    proto.graph.output.append(out_info("neg", 3))
    assert reasons(proto) == [
        "'n' (output of 'inorm' (InstanceNormalization)) is also used by 'neg' (Neg) outside the pattern"
    ]
