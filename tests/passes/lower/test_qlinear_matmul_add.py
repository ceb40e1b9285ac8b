"""FuseQLinearMatMulAdd: a QLinearMatMul and the QLinearAdd of a constant after it become
one quanta::QLinearMatMulAdd, bit for bit the pair it replaces (reference twin and native
session, every ISA the CPU runs, 1 and 2 threads), either operand order; the refusals with
their reasons."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.ir.verify import Stage
from quanta.kernels import _native
from quanta.passes.lower.qlinear_matmul_add import (
    FuseQLinearMatMulAdd,
    FuseQLinearMatMulAddPass,
    FuseQLinearMatMulAddSecond,
)
from quanta.passes.pattern import RewritePass
from quanta.passes.rules.eliminate_dead import EliminateDead
from quanta.session import InferenceSession, SessionOptions
from tests.passes.helpers import run_passes, run_ref

M, K, N = 7, 259, 17


def projection(
    *,
    c_first: bool = True,
    signed: bool = False,
    c_shape: tuple = (N,),
    extra_use: bool = False,
    const_b: bool = True,
    n: int = N,
) -> onnx.ModelProto:
    """x (8-bit codes, [2, M, K]) -> QLinearMatMul(W) -> QLinearAdd(bias) -> z; with
    ``extra_use`` the product is also a graph output."""
    t = np.int8 if signed else np.uint8
    rng = np.random.default_rng(3)
    w = rng.integers(-128, 128, (K, n)).astype(np.int8)
    c = rng.integers(-128 if signed else 0, 128 if signed else 256, int(np.prod(c_shape))).astype(t)
    sy = np.float32(np.sqrt(K) * 0.0098)
    inits = [
        numpy_helper.from_array(np.float32(0.0213), "sa"),
        numpy_helper.from_array(np.array(-9 if signed else 131, t), "za"),
        numpy_helper.from_array(np.linspace(0.0031, 0.0077, n).astype(np.float32), "sb"),
        numpy_helper.from_array(rng.integers(-20, 20, n).astype(np.int8), "zb"),
        numpy_helper.from_array(sy, "sy"),
        numpy_helper.from_array(np.array(-5 if signed else 119, t), "zy"),
        numpy_helper.from_array(sy, "sy2"),  # a second constant of the product's scale
        numpy_helper.from_array(c.reshape(c_shape), "c"),
        numpy_helper.from_array(np.float32(sy * 0.41), "sc"),
        numpy_helper.from_array(np.array(3 if signed else 77, t), "zc"),
        numpy_helper.from_array(np.float32(sy * 2), "sz"),  # sy / sz = 0.5: ties on odd codes
        numpy_helper.from_array(np.array(7 if signed else 140, t), "zz"),
    ]
    elem = TensorProto.INT8 if signed else TensorProto.UINT8
    inputs = [helper.make_tensor_value_info("x", elem, [2, M, K])]
    if const_b:
        inits.append(numpy_helper.from_array(w, "w"))
    else:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.INT8, [K, n]))
    add_in = ["c", "sc", "zc", "y", "sy2", "zy"] if c_first else ["y", "sy2", "zy", "c", "sc", "zc"]
    nodes = [
        helper.make_node("QLinearMatMul", ["x", "sa", "za", "w", "sb", "zb", "sy", "zy"], ["y"], name="mm"),
        helper.make_node("QLinearAdd", [*add_in, "sz", "zz"], ["z"], name="bias_add", domain="com.microsoft"),
    ]
    outputs = [helper.make_tensor_value_info("z", elem, None)]
    if extra_use:
        outputs.append(helper.make_tensor_value_info("y", elem, None))
    g = helper.make_graph(nodes, "proj", inputs, outputs, inits)
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


def feeds(signed: bool, n: int = N) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    lo, hi = (-128, 128) if signed else (0, 256)
    return {"x": rng.integers(lo, hi, (2, M, K)).astype(np.int8 if signed else np.uint8)}


@pytest.mark.parametrize("c_first", [True, False])
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("c_shape", [(N,), (1, 1, N), (1,), ()])
def test_fuses_bit_exact_reference_and_native(c_first, signed, c_shape):
    proto = projection(c_first=c_first, signed=signed, c_shape=c_shape)
    model = load(proto)
    result = run_passes(model, [FuseQLinearMatMulAddPass(), EliminateDead()], stage=Stage.LOWERED)
    rule = "FuseQLinearMatMulAdd" if c_first else "FuseQLinearMatMulAddSecond"
    assert result.fired(rule) == 1
    (node,) = model.graph.nodes
    assert (node.op_type, node.domain, node.attrs["c_first"]) == ("QLinearMatMulAdd", "quanta", int(c_first))
    f = feeds(signed)
    expected = run_ref(proto, f)[0]
    assert len(np.unique(expected)) > 40, "the case covers few codes"
    np.testing.assert_array_equal(run_ref(model, f)[0], expected)
    # the whole pipeline on the native target, every ISA: the fused kernel gives the pair's bytes
    for isa in _native.supported_isas():
        _native.set_isa(isa)
        try:
            for threads in (1, 2):
                opts = SessionOptions()
                opts.intra_op_num_threads = threads
                sess = InferenceSession(proto, opts, backend="native")
                kernels = [s.kernel.name for s in sess.plan.steps]
                assert kernels == [f"native:qlinear_matmul_add_{'s8' if signed else 'u8'}s8"], kernels
                got = sess.run(None, f)[0]
                assert got.tobytes() == expected.tobytes(), f"{isa} threads={threads}"
        finally:
            _native.clear_isa()


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"extra_use": True}, "is a graph output"),
        ({"const_b": False}, "not constants (or omitted): b"),
        ({"c_shape": (M, 1)}, "c has shape [7, 1]: expected one value or one per column (17)"),
        ({"c_shape": (1, 1, 1, N)}, "c of rank 4 would add axes to the product of rank 3"),
    ],
)
def test_refusals(kwargs, reason):
    model = load(projection(**kwargs))
    p = RewritePass([FuseQLinearMatMulAdd(), FuseQLinearMatMulAddSecond()])
    result = run_passes(model, [p], stage=Stage.LOWERED)
    assert result.fired("FuseQLinearMatMulAdd") == 0
    reasons = [r.reason for r in p.why_not("FuseQLinearMatMulAdd")]
    assert any(reason in r for r in reasons), reasons


def qdq_projection() -> onnx.ModelProto:
    """The QDQ form a quantizer writes: Q(Add(DQ(bias), DQ(Q(MatMul(DQ(x), DQ(W))))))."""
    rng = np.random.default_rng(7)
    w = rng.integers(-127, 128, (K, N)).astype(np.int8)
    bias = rng.integers(0, 256, N).astype(np.uint8)
    inits = [
        numpy_helper.from_array(w, "w_q"),
        numpy_helper.from_array(np.linspace(0.002, 0.004, N).astype(np.float32), "w_s"),
        numpy_helper.from_array(np.zeros(N, np.int8), "w_z"),
        numpy_helper.from_array(bias, "b_q"),
        numpy_helper.from_array(np.float32(0.0031), "b_s"),
        numpy_helper.from_array(np.uint8(128), "b_z"),
        numpy_helper.from_array(np.float32(0.0213), "x_s"),
        numpy_helper.from_array(np.uint8(131), "x_z"),
        numpy_helper.from_array(np.float32(0.0571), "y_s"),
        numpy_helper.from_array(np.uint8(119), "y_z"),
        numpy_helper.from_array(np.float32(0.0613), "z_s"),
        numpy_helper.from_array(np.uint8(125), "z_z"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["xq"], name="qx"),
        helper.make_node("DequantizeLinear", ["xq", "x_s", "x_z"], ["xd"], name="dqx"),
        helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["wd"], name="dqw", axis=1),
        helper.make_node("MatMul", ["xd", "wd"], ["y"], name="proj/MatMul"),
        helper.make_node("QuantizeLinear", ["y", "y_s", "y_z"], ["yq"], name="qy"),
        helper.make_node("DequantizeLinear", ["yq", "y_s", "y_z"], ["yd"], name="dqy"),
        helper.make_node("DequantizeLinear", ["b_q", "b_s", "b_z"], ["bd"], name="dqb"),
        helper.make_node("Add", ["bd", "yd"], ["z"], name="proj/Add"),
        helper.make_node("QuantizeLinear", ["z", "z_s", "z_z"], ["zq"], name="qz"),
        helper.make_node("DequantizeLinear", ["zq", "z_s", "z_z"], ["out"], name="dqz"),
    ]
    g = helper.make_graph(
        nodes,
        "qdq_proj",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, M, K])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, M, N])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_the_lowering_pipeline_fuses_a_qdq_file_and_the_coverage_report_counts_both_nodes():
    """QDQ -> QLinearMatMul + QLinearAdd -> QLinearMatMulAdd in lower_qdq; the fused node
    carries the MatMul's name, and the coverage report counts the MatMul and the bias Add
    as integer (passes/coverage.py _bias_add_holding); the native session gives the
    reference's bytes of the unfused pair."""
    from quanta.passes.coverage import coverage
    from quanta.passes.pipelines import lower_qdq

    proto = qdq_projection()
    before = load(proto)
    after = load(proto)
    pass_list = lower_qdq(opset=17)
    from quanta.passes.manager import PassManager

    PassManager(pass_list, verify=True).run(after)
    ops = [
        (n.op_type, n.name)
        for n in after.graph.nodes
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear")
    ]
    assert ops == [("QLinearMatMulAdd", "proj/MatMul")], ops
    report = coverage(before.graph, after.graph, [])
    by_name = {c.name: c for c in report.nodes}
    assert by_name["proj/MatMul"].integer_op == "QLinearMatMulAdd"
    assert by_name["proj/Add"].integer_op == "QLinearMatMulAdd"
    x = (np.random.default_rng(2).standard_normal((1, M, K)) * 1.3).astype(np.float32)
    unfused = load(proto)
    PassManager([p for p in pass_list if p.name != "fuse_qlinear_matmul_add"], verify=True).run(unfused)
    assert "QLinearAdd" in {n.op_type for n in unfused.graph.nodes}
    expected = run_ref(unfused, {"x": x})[0]
    assert len(np.unique(expected)) > 40
    assert run_ref(after, {"x": x})[0].tobytes() == expected.tobytes()
    got = InferenceSession(proto, SessionOptions(), backend="native").run(None, {"x": x})[0]
    assert got.tobytes() == expected.tobytes()
