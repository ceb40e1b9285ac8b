"""Signed 8-bit Q/DQ files at opset >= 21 that ONNX Runtime's QDQ propagation would break.

Failure signature guarded against: ONNX Runtime (extended optimizations, x86) refuses a
quantized file with ``output_dtype INT8 does not match y_zero_point type UINT8`` on a
``..._q`` node it inserted itself, after a data-movement op (Unsqueeze, Reshape, ...)
that a signed 8-bit DequantizeLinear feeds and whose output goes on in float (a GQA
key's ``Unsqueeze -> Expand``). quanta writes those pairs itself
(quanta.quantize.ort_propagation); they change no value.

Tolerances: quanta's file against ONNX Runtime with and without its optimizations:
within one step of the coarsest activation grid of the model (the two engines round
their float ops differently); the settled graph against the unsettled one in quanta: 0.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta import InferenceSession, quantize_static
from quanta.ir.onnx_io import from_proto, to_proto
from quanta.quantize.ort_propagation import settle_dq_propagation

ort = pytest.importorskip("onnxruntime")

F = TensorProto.FLOAT


def _ort(model: onnx.ModelProto | str, feeds, optimize: bool):
    so = ort.SessionOptions()
    so.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    data = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _qdq_chain(opset: int, zp: int, dtype) -> onnx.ModelProto:
    """x -> Q -> DQ -> Unsqueeze -> Expand -> Relu -> y, the pattern of a GQA key."""
    inits = [
        numpy_helper.from_array(np.array(0.0173, np.float32), "s"),
        numpy_helper.from_array(np.array(zp, dtype), "z"),
        numpy_helper.from_array(np.array([1], np.int64), "axes"),
        numpy_helper.from_array(np.array([3, 7, 17, 5], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node("Unsqueeze", ["xd", "axes"], ["u"]),
        helper.make_node("Expand", ["u", "shape"], ["e"]),
        helper.make_node("Relu", ["e"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", F, [3, 17, 5])],
        [helper.make_tensor_value_info("y", F, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def test_onnx_runtime_refuses_the_unsettled_signed_chain():
    """The premise: if this starts passing, ONNX Runtime fixed its propagation and the
    pairs quanta writes are no longer needed (they stay harmless)."""
    x = np.random.default_rng(0).standard_normal((3, 17, 5)).astype(np.float32)
    with pytest.raises(Exception, match="y_zero_point"):
        _ort(_qdq_chain(21, -3, np.int8), {"x": x}, optimize=True)
    _ort(_qdq_chain(21, 3, np.uint8), {"x": x}, optimize=True)  # unsigned: fine
    _ort(_qdq_chain(19, -3, np.int8), {"x": x}, optimize=True)  # opset 19: fine


@pytest.mark.parametrize(
    ("opset", "zp", "dtype", "pairs"),
    [(21, -3, np.int8, 1), (23, 5, np.int8, 1), (21, 3, np.uint8, 0), (19, -3, np.int8, 0)],
)
def test_settled_chain_runs_in_onnx_runtime_and_computes_the_same(opset, zp, dtype, pairs):
    proto = _qdq_chain(opset, zp, dtype)
    model = from_proto(proto, "chain")
    assert settle_dq_propagation(model.graph, opset) == pairs
    settled = to_proto(model)
    onnx.checker.check_model(settled, full_check=True)
    x = np.random.default_rng(1).standard_normal((3, 17, 5)).astype(np.float32) * 2
    (plain,) = _ort(proto, {"x": x}, optimize=False)
    (opt,) = _ort(settled, {"x": x}, optimize=True)
    np.testing.assert_array_equal(opt, plain)  # codes moved, Q(DQ(q)) = q: bit for bit
    for backend in ("reference", "native"):
        (mine,) = InferenceSession(settled.SerializeToString(), backend=backend).run(None, {"x": x})
        np.testing.assert_array_equal(mine, plain)


def test_int8_activations_gqa_attention_file_runs_in_onnx_runtime(tmp_path):
    """ONNX's GQA Attention with past / present (its node test): quanta expands the
    function and quantizes inside it; the present key (a quantized graph output) leaves a
    signed DQ into the ``Unsqueeze -> Expand`` that repeats it over the query heads."""
    from tests import onnx_node

    case = next(c for c in onnx_node._all_cases() if c.name == "test_attention_4d_gqa_with_past_and_present")
    src, dst = tmp_path / "gqa.onnx", tmp_path / "gqa_q.onnx"
    onnx.save(case.model, src)
    names = [i.name for i in case.model.graph.input]
    feeds = {k: onnx_node._array(v) for k, v in zip(names, case.data_sets[0][0])}
    quantize_static(src, dst, [feeds, feeds], activation_type="int8", quantize_outputs=True)
    out = onnx.load(dst)
    onnx.checker.check_model(out, full_check=True)
    assert out.opset_import[0].version >= 21
    mine = InferenceSession(str(dst)).run(None, feeds)
    plain = _ort(str(dst), feeds, optimize=False)
    opt = _ort(str(dst), feeds, optimize=True)  # refused before the pairs were written
    scales = [
        float(numpy_helper.to_array(t))
        for t in out.graph.initializer
        if t.name.endswith("_scale") and t.dims == []
    ]
    step = max(scales)
    for a, b, c in zip(mine, plain, opt):
        assert np.abs(a - b).max() <= step
        assert np.abs(c - b).max() <= step


def test_a_chain_of_data_movement_ops_gets_a_pair_after_each():
    """DQ -> Reshape -> Transpose -> Relu: ONNX Runtime would insert a pair after the
    Reshape (its output goes on into a Transpose, not a Q) and, carried from that pair's
    DQ, one after the Transpose; quanta writes both, and the values are the same."""
    inits = [
        numpy_helper.from_array(np.array(0.0173, np.float32), "s"),
        numpy_helper.from_array(np.array(-3, np.int8), "z"),
        numpy_helper.from_array(np.array([3, 5, 17], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node("Reshape", ["xd", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 1]),
        helper.make_node("Relu", ["t"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "chain2",
        [helper.make_tensor_value_info("x", F, [3, 17, 5])],
        [helper.make_tensor_value_info("y", F, None)],
        inits,
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    model = from_proto(proto, "chain2")
    assert settle_dq_propagation(model.graph, 21) == 2
    settled = to_proto(model)
    x = np.random.default_rng(4).standard_normal((3, 17, 5)).astype(np.float32) * 2
    (plain,) = _ort(proto, {"x": x}, optimize=False)
    (opt,) = _ort(settled, {"x": x}, optimize=True)
    np.testing.assert_array_equal(opt, plain)
    (mine,) = InferenceSession(settled.SerializeToString(), backend="native").run(None, {"x": x})
    np.testing.assert_array_equal(mine, plain)
