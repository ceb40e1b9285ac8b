"""Ops without a NumPy twin fall back to onnx.reference (listed in
DELEGATED_AT_RUNTIME); control flow, whose subgraphs read the enclosing scope, runs
through its own kernel (kernels/reference/control_flow.py), which is given those values."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import quanta
from quanta.kernels.reference.registry import DELEGATED_AT_RUNTIME, OPS, get_op
from tests.onnx_node import _all_cases, cases_for, run_case

DELEGATED = {"RNN", "NonMaxSuppression", "Det", "Unique"}
#: ops with a NumPy twin for their common forms that delegate the rest to onnx.reference
#: (GridSample: cubic, reflection, N-D; RoiAlign: other dtypes)
PARTLY_DELEGATED = {"GridSample", "RoiAlign"}


def _two_per_op():
    seen: dict[str, int] = {}
    out = []
    for c in cases_for(DELEGATED):
        op = c.model.graph.node[0].op_type
        if seen.get(op, 0) < 2:
            seen[op] = seen.get(op, 0) + 1
            out.append(c)
    return out


@pytest.mark.parametrize("case", _two_per_op(), ids=lambda c: c.name)
def test_delegated_op_node_tests(case):
    assert ("", case.model.graph.node[0].op_type) not in OPS  # really delegated
    run_case(case)
    assert ("", case.model.graph.node[0].op_type) in DELEGATED_AT_RUNTIME


@pytest.mark.parametrize("case", cases_for(PARTLY_DELEGATED), ids=lambda c: c.name)
def test_partly_delegated_ops_pass_every_node_case_on_both_targets(case):
    """The twin (and the delegation it keeps) passes ONNX's expectations; the native
    session, which runs the common forms natively, within each case's tolerance."""
    assert ("", case.model.graph.node[0].op_type) in OPS
    run_case(case)
    model = case.model
    names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    sess = quanta.InferenceSession(model.SerializeToString(), backend="native")
    for inputs, expected in case.data_sets:
        for got, want in zip(sess.run(None, dict(zip(names, inputs, strict=True))), expected, strict=True):
            np.testing.assert_allclose(got, np.asarray(want), rtol=case.rtol, atol=case.atol)


def test_control_flow_is_not_delegated_and_its_branches_see_the_outer_scope():
    assert get_op("If") is OPS[("", "If")]
    then = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])],
    )
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=other)],
        "g",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = quanta.InferenceSession(m, backend="reference")
    x = np.array([1.5, -2.0], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"c": np.array(True), "x": x})[0], x)
    np.testing.assert_array_equal(sess.run(None, {"c": np.array(False), "x": x})[0], -x)
    assert ("", "If") not in DELEGATED_AT_RUNTIME


def _named(*names: str) -> list:
    want = set(names)
    return [c for c in _all_cases() if c.name in want]


@pytest.mark.parametrize(
    "case",
    _named(
        "test_ai_onnx_ml_binarizer",
        "test_ai_onnx_ml_array_feature_extractor",
        "test_ai_onnx_ml_tree_ensemble_single_tree",
    ),
    ids=lambda c: c.name,
)
def test_ai_onnx_ml_ops_without_a_twin_run_on_onnx_reference(case):
    # scikit-learn pipelines converted to ONNX use these; quanta has no twin of its own
    op = case.model.graph.node[0].op_type
    assert ("ai.onnx.ml", op) not in OPS
    run_case(case)
    assert ("ai.onnx.ml", op) in DELEGATED_AT_RUNTIME


def test_a_function_op_runs_through_its_schema_body():
    # MeanVarianceNormalization is defined by the standard as a function: onnx.reference
    # has no class for it but expands the body; quanta runs it the same way
    (case,) = _named("test_mvn")
    assert ("", "MeanVarianceNormalization") not in OPS
    run_case(case)
    assert ("", "MeanVarianceNormalization") in DELEGATED_AT_RUNTIME
    x = np.random.default_rng(3).standard_normal((2, 7, 3, 5)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MeanVarianceNormalization", ["x"], ["y"], axes=[0, 2, 3])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
    )
    sess = quanta.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
    mean = x.mean(axis=(0, 2, 3), keepdims=True)
    want = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=(0, 2, 3), keepdims=True) + 1e-9)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-5)


def test_an_operator_nobody_implements_is_named_at_load():
    g = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"], name="mystery")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(Exception, match="NoSuchOp"):
        quanta.InferenceSession(m)


STRING_OPS = {"StringNormalizer", "StringConcat", "StringSplit", "RegexFullMatch"}


@pytest.mark.parametrize("case", cases_for(STRING_OPS), ids=lambda c: c.name)
def test_string_ops_return_object_arrays_as_onnx_runtime_does(case):
    run_case(case)  # compares the strings; the dtype check asks for object arrays


@pytest.mark.parametrize("case", cases_for({"SplitToSequence"}), ids=lambda c: c.name)
def test_sequences_of_tensors_of_different_shapes_stay_lists(case):
    run_case(case)


def test_a_sequence_output_keeps_its_declared_type_through_quantization(tmp_path):
    # the IR has no sequence type: the file quanta writes declares the output as loaded
    rng = np.random.default_rng(5)
    w = rng.standard_normal((7, 6)).astype(np.float32)
    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("SplitToSequence", ["h", "sizes"], ["parts"], axis=1),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7])],
        [helper.make_tensor_sequence_value_info("parts", TensorProto.FLOAT, None)],
        [
            helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel()),
            helper.make_tensor("sizes", TensorProto.INT64, [2], [2, 4]),
        ],
    )
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    feeds = [{"x": rng.standard_normal((3, 7)).astype(np.float32)} for _ in range(3)]
    quanta.quantize_static(str(src), str(dst), feeds, progress=False, verbose=False)
    onnx.checker.check_model(str(dst), full_check=True)
    out = onnx.load(str(dst)).graph.output[0]
    assert out.type.WhichOneof("value") == "sequence_type"
    parts = quanta.InferenceSession(str(dst)).run(None, feeds[0])[0]
    assert [p.shape for p in parts] == [(3, 2), (3, 4)]
    np.testing.assert_allclose(np.concatenate(parts, axis=1), feeds[0]["x"] @ w, atol=0.1)
