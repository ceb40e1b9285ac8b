"""CanonicalizeEinsum (passes/rules/canonicalize_einsum.py): a two-operand Einsum becomes
MatMul between Transposes / Reshapes. Fired; structure (no Einsum left, only the needed
Transposes / Reshapes); numerics against float64 within the recursive-summation bound of
a K-term dot product (the MatMul's order is not np.einsum's, so not bit for bit); the
refusals with their reasons; symbolic batch dimensions; and the native target, where the
Einsum no longer runs on a NumPy twin."""

from __future__ import annotations

import string

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from quanta.ir.onnx_io import load
from quanta.passes.rules.canonicalize_einsum import CanonicalizeEinsum, parse_equation
from tests.passes.helpers import F32_EPS, run_passes, run_ref


def einsum_proto(equation: str, shape_a, shape_b, shape_y=None, opset: int = 17):
    g = helper.make_graph(
        [helper.make_node("Einsum", ["a", "b"], ["y"], name="einsum", equation=equation)],
        "g",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, shape_a),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, shape_b),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape_y)],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def assert_within_dot_bound(equation: str, a: np.ndarray, b: np.ndarray, y: np.ndarray) -> None:
    """|y − y64| ≤ 2·(K + 2)·u·Σ_k |a·b| per element (u = 2^-24): recursive summation of
    K products, whatever the order, plus the rounding of each product and of the result
    (K the number of contracted terms; doubled for slack against BLAS's blocking)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    exact = np.einsum(equation, a64, b64)
    mag = np.einsum(equation, np.abs(a64), np.abs(b64))
    (sa, sb), out = parse_equation(equation, 2)  # type: ignore[misc]
    dims = dict(zip(sa, a.shape)) | dict(zip(sb, b.shape))
    k = int(np.prod([dims[c] for c in sa if c in sb and c not in out] or [1]))
    bound = 2 * (k + 2) * (F32_EPS / 2) * mag
    assert y.shape == exact.shape
    assert np.all(np.abs(y.astype(np.float64) - exact) <= bound + 1e-45)


def run_rule(proto):
    model = load(proto)
    p = CanonicalizeEinsum()
    result = run_passes(model, [p])
    return model, result, p


@pytest.mark.parametrize(
    "equation, shape_a, shape_b, ops",
    [
        # TesseraNet's two forms
        ("bcd,bnd->bcn", [2, 17, 128], [2, 16, 128], ["Transpose", "MatMul"]),
        ("bcd,bdhw->bchw", [2, 17, 9], [2, 9, 3, 7], ["Reshape", "MatMul", "Reshape"]),
        ("ij,jk->ik", [3, 7], [7, 17], ["MatMul"]),
        ("ij,jk", [3, 7], [7, 17], ["MatMul"]),  # implicit output: "ik"
        ("ij,jk->ki", [3, 7], [7, 17], ["MatMul", "Transpose"]),
        ("bij,bjk->bik", [5, 3, 7], [5, 7, 17], ["MatMul"]),
        ("i,i->", [7], [7], ["Reshape", "Reshape", "MatMul", "Reshape"]),  # a dot product
        ("i,j->ij", [3], [7], ["Reshape", "Reshape", "MatMul"]),  # outer: K = 1
        ("bhqd,bhkd->bhqk", [1, 3, 5, 7], [1, 3, 17, 7], ["Transpose", "MatMul"]),
        ("abc,cd->abd", [2, 3, 7], [7, 17], ["Reshape", "MatMul", "Reshape"]),
    ],
)
def test_two_operand_einsum_becomes_matmul(equation, shape_a, shape_b, ops):
    proto = einsum_proto(equation, shape_a, shape_b)
    model, result, _ = run_rule(proto)
    assert result.fired("EinsumToMatMul") == 1
    assert sorted(n.op_type for n in model.graph.nodes) == sorted(ops)
    rng = np.random.default_rng(3)
    a = rng.standard_normal(shape_a).astype(np.float32)
    b = (rng.standard_normal(shape_b) * 3).astype(np.float32)
    (y,) = run_ref(model, {"a": a, "b": b})
    assert_within_dot_bound(equation, a, b, y)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_random_equations_within_the_dot_bound(data):
    """Random label groups (batch, free of a, free of b, contracted; each 0-2 labels of
    sizes 1-7), each operand's and the output's labels in a random order."""
    labels = iter(string.ascii_lowercase)
    groups = {
        g: [next(labels) for _ in range(data.draw(st.integers(0, 2), label=g))]
        for g in ("bt", "fa", "fb", "k")
    }
    if not groups["bt"] + groups["fa"] + groups["k"] or not groups["bt"] + groups["fb"] + groups["k"]:
        groups["k"].append(next(labels))
    size = {c: data.draw(st.sampled_from([1, 3, 7, 17]), label=c) for g in groups.values() for c in g}
    sa = data.draw(st.permutations(groups["bt"] + groups["fa"] + groups["k"]), label="a")
    sb = data.draw(st.permutations(groups["bt"] + groups["k"] + groups["fb"]), label="b")
    out = data.draw(st.permutations(groups["bt"] + groups["fa"] + groups["fb"]), label="out")
    equation = f"{''.join(sa)},{''.join(sb)}->{''.join(out)}"
    shape_a, shape_b = [size[c] for c in sa], [size[c] for c in sb]
    model, result, _ = run_rule(einsum_proto(equation, shape_a, shape_b))
    assert result.fired("EinsumToMatMul") == 1, equation
    assert "Einsum" not in {n.op_type for n in model.graph.nodes}
    rng = np.random.default_rng(len(equation))
    a = rng.standard_normal(shape_a).astype(np.float32)
    b = rng.standard_normal(shape_b).astype(np.float32)
    (y,) = run_ref(model, {"a": a, "b": b})
    assert_within_dot_bound(equation, a, b, y)


def test_symbolic_batch_is_copied_by_the_reshapes():
    """TesseraNet's mask head with a symbolic batch: the Reshapes write 0 for it."""
    equation = "bcd,bdhw->bchw"
    model, result, _ = run_rule(einsum_proto(equation, ["N", 17, 9], ["N", 9, 3, 7]))
    assert result.fired("EinsumToMatMul") == 1
    targets = [np.asarray(n.input(1).const).tolist() for n in model.graph.nodes if n.op_type == "Reshape"]
    assert targets == [[0, 9, 21], [0, 17, 3, 7]]
    rng = np.random.default_rng(4)
    for n in (1, 3):
        a = rng.standard_normal([n, 17, 9]).astype(np.float32)
        b = rng.standard_normal([n, 9, 3, 7]).astype(np.float32)
        (y,) = run_ref(model, {"a": a, "b": b})
        assert_within_dot_bound(equation, a, b, y)


def test_a_batch_dimension_of_one_broadcasts_as_in_np_einsum():
    """a's batch is 1, b's is 3 (np.einsum broadcasts it): MatMul broadcasts it too, and
    the result's type takes the 3, not the 1."""
    equation = "bcd,bdn->bcn"
    model, result, _ = run_rule(einsum_proto(equation, [1, 17, 9], [3, 9, 5]))
    assert result.fired("EinsumToMatMul") == 1
    (mm,) = [n for n in model.graph.nodes if n.op_type == "MatMul"]
    assert mm.outputs[0].shape == (3, 17, 5)
    rng = np.random.default_rng(7)
    a = rng.standard_normal([1, 17, 9]).astype(np.float32)
    b = rng.standard_normal([3, 9, 5]).astype(np.float32)
    (y,) = run_ref(model, {"a": a, "b": b})
    assert_within_dot_bound(equation, a, b, y)


def test_one_unknown_group_size_is_minus_one():
    model, result, _ = run_rule(einsum_proto("bcd,bdhw->bchw", ["N", 17, 9], ["N", 9, "H", 7]))
    assert result.fired("EinsumToMatMul") == 1
    targets = [np.asarray(n.input(1).const).tolist() for n in model.graph.nodes if n.op_type == "Reshape"]
    assert targets == [[0, 9, -1], [0, 17, -1, 7]]
    rng = np.random.default_rng(5)
    a = rng.standard_normal([2, 17, 9]).astype(np.float32)
    b = rng.standard_normal([2, 9, 5, 7]).astype(np.float32)
    (y,) = run_ref(model, {"a": a, "b": b})
    assert_within_dot_bound("bcd,bdhw->bchw", a, b, y)


@pytest.mark.parametrize(
    "equation, shape_a, shape_b, b_target, sizes",
    [
        # DeepFilterNet3's grouped linear layer after a GRU whose output shape is unknown:
        # batch and time are two unrelated symbols
        ("btgi,gih->btgh", ["B", "T", 3, 17], [3, 17, 7], [0, 1, 17, 7], [(1, 29), (2, 5)]),
        ("bxij,bjk->bxik", ["N", "X", "I", 7], ["N", 7, 5], [0, 1, 7, 5], [(2, 3, 4), (1, 5, 2)]),
        # three free labels of a, the contracted pair merged into K = 21
        ("xyzij,ijk->xyzk", ["X", "Y", 2, 3, 7], [3, 7, 5], [1, 1, 21, 5], [(2, 3), (1, 4)]),
    ],
)
def test_free_labels_of_a_without_a_static_product_stay_separate(equation, shape_a, shape_b, b_target, sizes):
    """a's free labels whose product no Reshape can write (two symbolic sizes) stay
    separate dimensions: all but the last become MatMul batch dimensions, which b's
    Reshape gives unit sizes to broadcast over."""
    model, result, _ = run_rule(einsum_proto(equation, shape_a, shape_b))
    assert result.fired("EinsumToMatMul") == 1
    (mm,) = [n for n in model.graph.nodes if n.op_type == "MatMul"]
    b_reshape = mm.input(1).producer
    assert b_reshape is not None and b_reshape.op_type == "Reshape"
    assert np.asarray(b_reshape.input(1).const).tolist() == b_target
    rng = np.random.default_rng(9)
    for dims in sizes:
        it = iter(dims)
        sa = [d if isinstance(d, int) else next(it) for d in shape_a]
        sb = [d if isinstance(d, int) else sa[0] for d in shape_b]  # "N" is a's first label
        a = rng.standard_normal(sa).astype(np.float32)
        b = rng.standard_normal(sb).astype(np.float32)
        (y,) = run_ref(model, {"a": a, "b": b})
        assert_within_dot_bound(equation, a, b, y)


@pytest.mark.parametrize(
    "equation, shape_a, shape_b, reason",
    [
        ("...ij,...jk->...ik", [2, 3, 7], [2, 7, 5], "an ellipsis in the equation"),
        ("ii,ij->j", [3, 3], [3, 5], "subscript 'ii' repeats a label (a diagonal)"),
        ("ij,jk->i", [3, 7], [7, 5], "label 'k' is summed within one operand (a reduction, not a product)"),
        ("ij,jkl->ik", [3, 7], [7, 5], "operand b 'b' has rank 2, its subscript 'jkl' 3"),
        (
            "bij,bjk->bik",
            ["N", "I", 7],
            ["N", 7, "K"],
            None,
        ),
        (
            "iyj,yjk->ik",
            ["I", "Y", 7],
            ["Y", 7, 5],
            "merging a's groups 'i', 'yj' needs two sizes that are not static",
        ),
        (
            "bij,bjkl->bikl",
            ["N", 3, 7],
            ["N", 7, "K", "L"],
            "splitting the product into 'i', 'k', 'l' needs two sizes that are not static",
        ),
    ],
)
def test_refusals_say_why(equation, shape_a, shape_b, reason):
    _model, result, p = run_rule(einsum_proto(equation, shape_a, shape_b))
    if reason is None:  # one label per group: no Reshape, any dimension symbolic
        assert result.fired("EinsumToMatMul") == 1
        return
    assert not result.records[0].modified
    assert [r.reason for r in p.why_not("EinsumToMatMul")] == [reason]


def test_three_operands_are_left():
    g = helper.make_graph(
        [helper.make_node("Einsum", ["a", "b", "c"], ["y"], name="einsum", equation="ij,jk,kl->il")],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3, 3]) for n in "abc"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    _model, result, p = run_rule(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert not result.records[0].modified
    assert [r.reason for r in p.why_not("EinsumToMatMul")] == ["Einsum of 3 operands (only two are a MatMul)"]


def test_native_session_runs_no_einsum_on_the_twin():
    """The default float pipeline applies the rule: the plan's steps are native and the
    result is within the float GEMM family's bound (FG1) of float64."""
    pytest.importorskip("quanta.kernels._native")
    import quanta

    proto = einsum_proto("bcd,bnd->bcn", ["N", 17, 33], ["N", 16, 33], None)
    sess = quanta.InferenceSession(proto.SerializeToString(), backend="native")
    assert sess.fallbacks == []
    assert "Einsum" not in {s.op_type for s in sess.plan.steps}
    rng = np.random.default_rng(6)
    a = rng.standard_normal([2, 17, 33]).astype(np.float32)
    b = rng.standard_normal([2, 16, 33]).astype(np.float32)
    (y,) = sess.run(None, {"a": a, "b": b})
    assert_within_dot_bound("bcd,bnd->bcn", a, b, y)


def test_an_einsum_between_q_and_dq_stays_a_float_product_in_lower_qdq():
    """lower_qdq runs the rule after the lowering: DQ -> Einsum -> Q is not an integer
    group, so it becomes a float MatMul between the DQs and the Q, not a QLinearMatMul."""
    from onnx import numpy_helper

    from quanta.passes.pipelines import lower_qdq

    inits = [
        numpy_helper.from_array(np.array(0.05, np.float32), "s"),
        numpy_helper.from_array(np.array(3, np.uint8), "z"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["a", "s", "z"], ["qa"]),
        helper.make_node("DequantizeLinear", ["qa", "s", "z"], ["da"]),
        helper.make_node("QuantizeLinear", ["b", "s", "z"], ["qb"]),
        helper.make_node("DequantizeLinear", ["qb", "s", "z"], ["db"]),
        helper.make_node("Einsum", ["da", "db"], ["e"], name="einsum", equation="bcd,bnd->bcn"),
        helper.make_node("QuantizeLinear", ["e", "s", "z"], ["qe"]),
        helper.make_node("DequantizeLinear", ["qe", "s", "z"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 7, 17]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 3, 17]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 7, 3])],
        inits,
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model = load(proto)
    run_passes(model, lower_qdq(opset=17))
    ops = {n.op_type for n in model.graph.nodes}
    assert "Einsum" not in ops and "MatMul" in ops and "QLinearMatMul" not in ops


def test_an_operand_of_unknown_shape_behind_a_dequantize_takes_its_codes_shape():
    """ONNX Runtime's QOperator file of DeepFilterNet3: the Einsum reads
    DequantizeLinear(Reshape(codes of a com.microsoft op)); the Reshape's shape is known
    (FoldReshapeDims), the DequantizeLinear's is not (onnx's inference stops at the contrib
    op). Elementwise, the DequantizeLinear has its input's shape: the rule uses it and
    gives it to the value, where it refused ("unknown rank")."""
    from onnx import numpy_helper

    from quanta.ir.types import TensorType

    inits = [
        numpy_helper.from_array(np.array(0.03, np.float32), "s"),
        numpy_helper.from_array(np.array(131, np.uint8), "z"),
        numpy_helper.from_array(np.random.default_rng(2).standard_normal((3, 17, 7)).astype(np.float32), "w"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["a"], name="dequant"),
        helper.make_node("Einsum", ["a", "w"], ["y"], name="einsum", equation="btgi,gih->btgh"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("q", TensorProto.UINT8, [1, "T", 3, 17])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model = load(proto)
    (a,) = [n.outputs[0] for n in model.graph.nodes if n.op_type == "DequantizeLinear"]
    a.type = TensorType(a.type.elem, None)  # what the contrib op's file loads with
    p = CanonicalizeEinsum()
    result = run_passes(model, [p])
    assert result.fired("EinsumToMatMul") == 1
    assert a.shape == (1, "T", 3, 17)
    rng = np.random.default_rng(3)
    q = rng.integers(0, 256, (1, 29, 3, 17)).astype(np.uint8)
    (y,) = run_ref(model, {"q": q})
    deq = (q.astype(np.float32) - np.float32(131)) * np.float32(0.03)
    assert_within_dot_bound("btgi,gih->btgh", deq, numpy_helper.to_array(inits[2]), y)
