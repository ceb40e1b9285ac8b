"""FoldZeroProduct (passes/rules/fold_zero_product.py): a Gemm / MatMul of a zero
ConstantOfShape (an unrolled RNN's initial state, its shape known only at run time)
becomes the bias broadcast to the product's shape. Four parts (fired; structure;
numerics on the reference target, equal as numbers; the verifier), the refusals, and
the quantizer: the cell's Gemms all run in integer afterwards."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.passes.rules.fold_zero_product import FoldZeroProduct
from tests.passes.helpers import run_passes, run_ref

K, N = 7, 17  # distinct, odd


def zero_state_proto(
    op: str = "Gemm", *, trans_a: int = 0, trans_b: int = 1, fill: float = 0.0, w_inf: bool = False
):
    """x [B, K] -> h0 = ConstantOfShape([B, K] computed from Shape(x)) -> op(h0, w, c) + x·w2."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((N, K) if trans_b else (K, N)).astype(np.float32)
    if w_inf:
        w[2, 3] = np.inf
    c = rng.standard_normal(N).astype(np.float32)
    w2 = rng.standard_normal((K, N)).astype(np.float32)
    shape_nodes = [
        helper.make_node("Shape", ["x"], ["xs"], name="shape"),
        helper.make_node("Gather", ["xs", "zero"], ["b"], name="batch", axis=0),
        helper.make_node("Concat", ["b", "k"] if not trans_a else ["k", "b"], ["hs"], name="hshape", axis=0),
        helper.make_node(
            "ConstantOfShape",
            ["hs"],
            ["h0"],
            name="h0",
            value=helper.make_tensor("v", TensorProto.FLOAT, [1], [fill]),
        ),
    ]
    if op == "Gemm":
        cell = helper.make_node(
            "Gemm", ["h0", "w", "c"], ["g"], name="cell", transA=trans_a, transB=trans_b, beta=0.5
        )
    else:
        cell = helper.make_node("MatMul", ["h0", "w"], ["g"], name="cell")
    nodes = [
        *shape_nodes,
        cell,
        helper.make_node("MatMul", ["x", "w2"], ["xw"], name="input_proj"),
        helper.make_node("Add", ["g", "xw"], ["s"], name="sum"),
        helper.make_node("Mul", ["h0", "h0"], ["hh"], name="state_use"),  # the zero state has other readers
    ]
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(c, "c"),
        numpy_helper.from_array(w2, "w2"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([K], np.int64), "k"),
    ]
    g = helper.make_graph(
        nodes,
        "zero_state",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", K])],
        [
            helper.make_tensor_value_info("s", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("hh", TensorProto.FLOAT, None),
        ],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def feeds(batch: int = 3):
    return {"x": np.random.default_rng(5).standard_normal((batch, K)).astype(np.float32)}


@pytest.mark.parametrize("op", ["Gemm", "MatMul"])
def test_zero_state_product_becomes_its_bias(op):
    proto = zero_state_proto(op, trans_b=int(op == "Gemm"))
    model = load(proto)
    result = run_passes(model, [FoldZeroProduct()])
    assert result.fired("ZeroStateGemm" if op == "Gemm" else "ZeroStateMatMul") == 1
    ops = [n.op_type for n in model.graph.nodes]
    assert ops.count(op) == (0 if op == "Gemm" else 1)  # the input projection MatMul stays
    assert "ConstantOfShape" in ops and "Mul" in ops  # the state's other reader keeps it
    for batch in (1, 3, 5):  # the batch is only known at run time
        want, got = run_ref(proto, feeds(batch)), run_ref(model, feeds(batch))
        for a, b in zip(want, got, strict=True):
            assert a.shape == b.shape
            np.testing.assert_array_equal(a, b)


def test_trans_a_takes_the_rows_from_the_second_entry():
    proto = zero_state_proto("Gemm", trans_a=1, trans_b=0)
    model = load(proto)
    assert run_passes(model, [FoldZeroProduct()]).fired("ZeroStateGemm") == 1
    np.testing.assert_array_equal(run_ref(proto, feeds(4))[0], run_ref(model, feeds(4))[0])


@pytest.mark.parametrize(
    ("kw", "reason"),
    [({"fill": 1.0}, "not a float 0"), ({"w_inf": True}, "inf or NaN")],
)
def test_refusals_name_their_reason(kw, reason):
    model = load(zero_state_proto("Gemm", **kw))
    fold = FoldZeroProduct()
    result = run_passes(model, [fold])
    assert result.fired("ZeroStateGemm") == 0
    assert any(reason in r.reason for r in fold.no_matches())


def test_the_quantized_cell_runs_in_integer(tmp_path):
    import quanta

    src = tmp_path / "m.onnx"
    src.write_bytes(zero_state_proto("Gemm").SerializeToString())
    calib = [feeds(b) for b in (2, 3, 4)]
    summary = quanta.quantize_static(src, tmp_path / "q.onnx", calib, verbose=False)
    assert summary.coverage.integer_share == pytest.approx(1.0)
