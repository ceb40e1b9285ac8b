"""eliminate_common: equal constants and equal nodes merged; never across different
quantization parameters."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.ir.types import QuantType
from quanta.ir.verify import Stage, verify
from quanta.passes.rules.eliminate_common import EliminateCommon
from quanta.passes.rules.eliminate_dead import EliminateDead
from tests.passes.helpers import out_info, rng_data, run_passes, run_ref


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def cse_model() -> onnx.ModelProto:
    """Two Q of x with equal scales held in two initializers (merge), a third Q with a
    different scale (keep); two Transposes (merge); one i8 tensor stored twice with the
    same parameters (merge) and once more under other parameters (keep)."""
    w = np.random.default_rng(0).integers(-127, 128, (7, 5)).astype(np.int8)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sa", "z"], ["qa"], name="qa"),
        helper.make_node("QuantizeLinear", ["x", "sb", "z"], ["qb"], name="qb"),
        helper.make_node("QuantizeLinear", ["x", "sc", "z"], ["qc"], name="qc"),
        helper.make_node("DequantizeLinear", ["qa", "sa", "z"], ["fa"], name="dqa"),
        helper.make_node("DequantizeLinear", ["qb", "sb", "z"], ["fb"], name="dqb"),
        helper.make_node("DequantizeLinear", ["qc", "sc", "z"], ["fc"], name="dqc"),
        helper.make_node("Transpose", ["fa"], ["ta"], name="ta", perm=[1, 0]),
        helper.make_node("Transpose", ["fb"], ["tb"], name="tb", perm=[1, 0]),
        helper.make_node("DequantizeLinear", ["w1", "sw", "zw"], ["w1f"], name="dqw1"),
        helper.make_node("DequantizeLinear", ["w2", "sw", "zw"], ["w2f"], name="dqw2"),
        helper.make_node("DequantizeLinear", ["w3", "sw3", "zw"], ["w3f"], name="dqw3"),
        helper.make_node("Add", ["ta", "tb"], ["t"], name="add_t"),
        helper.make_node("Sub", ["fc", "fa"], ["d"], name="sub"),
        helper.make_node("MatMul", ["fa", "w1f"], ["m1"], name="mm1"),
        helper.make_node("MatMul", ["fb", "w2f"], ["m2"], name="mm2"),
        helper.make_node("MatMul", ["fc", "w3f"], ["m3"], name="mm3"),
    ]
    inits = [
        _init("sa", np.float32(0.02)),
        _init("sb", np.float32(0.02)),
        _init("sc", np.float32(0.03)),
        _init("z", np.uint8(131)),
        _init("w1", w),
        _init("w2", w.copy()),
        _init("w3", w.copy()),
        _init("sw", np.float32(0.011)),
        _init("sw3", np.float32(0.013)),
        _init("zw", np.int8(-3)),
    ]
    g = helper.make_graph(
        nodes,
        "cse",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7])],
        [out_info("t", 2), out_info("d", 2), out_info("m1", 2), out_info("m2", 2), out_info("m3", 2)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def test_eliminate_common_merges_equal_and_keeps_different_quantization():
    proto = cse_model()
    model = load(proto)
    result = run_passes(model, [EliminateCommon(), EliminateDead()])
    # constants: sb into sa, w2 into w1; nodes: qb, dqb, tb, dqw2, mm2 (m2 is a graph
    # output, so mm2 stays), so 4 nodes
    assert result.records[0].stats == {"constants": 2, "nodes": 4}
    assert model.graph.op_counts() == {
        "Add": 1,
        "DequantizeLinear": 4,
        "MatMul": 3,
        "QuantizeLinear": 2,
        "Sub": 1,
        "Transpose": 1,
    }
    assert sorted(model.graph.initializers) == ["sa", "sc", "sw", "sw3", "w1", "w3", "z", "zw"]
    # the i8 tensors with the same bytes but different scales stay apart
    w1, w3 = model.graph.initializers["w1"], model.graph.initializers["w3"]
    assert isinstance(w1.type.elem, QuantType) and w1.type.elem != w3.type.elem
    qs = model.graph.find_nodes("QuantizeLinear")
    assert [n.inputs[1].name for n in qs] == ["sa", "sc"]
    add = model.graph.find_nodes("Add")[0]
    assert add.inputs[0] is add.inputs[1]
    x = rng_data((3, 7), seed=1)
    for e, a in zip(run_ref(proto, {"x": x}), run_ref(model, {"x": x})):
        np.testing.assert_array_equal(e, a)  # exact: merged nodes computed the same thing
    verify(model.graph, Stage.QDQ)


def test_eliminate_common_never_merges_nodes_with_different_output_types():
    # Hazard: two views of the same value typed differently (a lowered graph where a
    # rule retyped one); merging would silently pick one quantization.
    from quanta.ir.graph import Graph, Node, Value
    from quanta.ir.types import F32, I8, TensorType

    g = Graph()
    x = g.add_input("x", TensorType(QuantType(I8, F32, 0.02, 3), (3, 7)))
    a = Value("a", TensorType(QuantType(I8, F32, 0.02, 3), (7, 3)))
    b = Value("b", TensorType(QuantType(I8, F32, 0.08, 3), (7, 3)))
    g.add_node(Node("Transpose", [x], [a], {"perm": [1, 0]}, name="ta"))
    g.add_node(Node("Transpose", [x], [b], {"perm": [1, 0]}, name="tb"))
    g.set_outputs([a, b])
    assert not EliminateCommon()(g).modified


def test_eliminate_common_skips_random_ops_and_graph_outputs():
    nodes = [
        helper.make_node("RandomNormalLike", ["x"], ["r1"], name="r1"),
        helper.make_node("RandomNormalLike", ["x"], ["r2"], name="r2"),
        helper.make_node("Neg", ["x"], ["n1"], name="n1"),
        helper.make_node("Neg", ["x"], ["n2"], name="n2"),
    ]
    g = helper.make_graph(
        nodes,
        "rnd",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [out_info("r1", 1), out_info("r2", 1), out_info("n1", 1), out_info("n2", 1)],
    )
    model = load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]))
    assert not run_passes(model, [EliminateCommon()]).modified
    assert len(model.graph.nodes) == 4


def test_constants_equal_only_off_the_fingerprints_sample_are_compared_whole():
    """Constants of one dtype and shape whose sampled elements agree: those equal bit for
    bit merge (a NaN payload included), one that differs in a single unsampled element
    stays, and a later copy of it merges into it, not into the first."""
    from quanta.ir.graph import FINGERPRINT_SAMPLE, Graph, Node, Value

    n = 3 * FINGERPRINT_SAMPLE + 7  # the sample reads every third element
    base = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    base[5] = np.frombuffer(np.uint32(0x7FC00123).tobytes(), np.float32)[0]  # a NaN with a payload
    off = base.copy()
    off[1] += 1.0  # element 1 is not in the sample
    consts = {"c0": base, "c1": base.copy(), "c2": off, "c3": off.copy()}
    g = Graph(name="g")
    x = g.add_input("x", None)
    outs = []
    for name, arr in consts.items():
        c = g.add_initializer(name, arr)
        y = Value(f"y_{name}", None)
        g.add_node(Node("Add", [x, c], [y], name=f"add_{name}"))
        outs.append(y)
    g.set_outputs(outs)
    assert EliminateCommon._merge_constants(g) == 2
    assert sorted(g.initializers) == ["c0", "c2"]
    readers = {n.name: n.inputs[1].name for n in g.nodes}
    assert readers == {"add_c0": "c0", "add_c1": "c0", "add_c2": "c2", "add_c3": "c2"}


def test_nodes_alike_but_for_attributes_merge_with_the_one_of_equal_attributes():
    """Three nodes on one input with list attributes: the second and the third are equal
    (a NaN entry included) and merge, the first differs in one entry of many and stays;
    attributes are compared only between nodes whose op, inputs and output types agree."""
    from quanta.ir.graph import Graph, Node, Value
    from quanta.ir.types import F32, TensorType

    g = Graph()
    x = g.add_input("x", TensorType(F32, (3, 7)))
    long = [float(i) / 7 for i in range(3001)]
    first = [*long[:-1], 5.0, float("nan")]
    other = [*long, float("nan")]
    outs = [Value(n, TensorType(F32, (3, 7))) for n in ("a", "b", "c")]
    for v, vals in zip(outs, (first, other, list(other)), strict=True):
        g.add_node(Node("Custom", [x], [v], {"vals": vals, "k": 3}, domain="test", name=v.name))
    s = Value("s", TensorType(F32, (3, 7)))
    g.add_node(Node("Sum", [*outs], [s], {}, name="sum"))
    g.set_outputs([s])
    assert EliminateCommon()(g).modified
    kept = [n.name for n in g.nodes if n.op_type == "Custom"]
    assert kept == ["a", "b"]
    assert [v.name for v in g.nodes[-1].inputs] == ["a", "b", "b"]
