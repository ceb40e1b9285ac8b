"""Files whose quantized MatMuls are model-local functions (onnx-quantize 0.2's
``quant::QMatMulStatic8bits`` / ``QMatMulDynamic8bits``: QuantizeLinear or
DynamicQuantizeLinear, MatMulInteger, and a DequantizeLinear of the int32 accumulator by
``x_scale · w_scale``). The loader writes the calls out as their bodies
(ir/onnx_functions.inline_model_functions), and LowerMatMulIntegerDequantized makes each
``DequantizeLinear(MatMulInteger(...), s)`` one MatMulIntegerToFloat: no reference step,
every product integer, outputs equal to ONNX Runtime's bit for bit. The graphs are built
here in onnx-quantize's form (scale layouts, zero points, K > 258)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.cli.bench import reference_steps
from quanta.ir.onnx_functions import inline_model_functions
from quanta.ir.onnx_io import load
from quanta.passes.lower.qdq_to_qlinear import LowerMatMulIntegerDequantized
from quanta.passes.pattern import RewritePass
from tests.passes.helpers import run_passes

K, N = 301, 7


def _function(mode: str) -> onnx.FunctionProto:
    if mode == "static":
        nodes = [
            helper.make_node("QuantizeLinear", ["X", "x_scale", "x_zero_point"], ["xq"]),
            helper.make_node("MatMulInteger", ["xq", "W", "x_zero_point", "w_zero_point"], ["acc"]),
            helper.make_node("DequantizeLinear", ["acc", "s"], ["Y"]),
        ]
        # the product x_scale · w_scale given as one constant: folded at load, a computed
        # scale leaves the accumulator's type to the verifier (the note's "left" list)
        inputs = ["X", "W", "x_scale", "s", "x_zero_point", "w_zero_point"]
    else:
        nodes = [
            helper.make_node("DynamicQuantizeLinear", ["X"], ["xq", "xs", "xz"]),
            helper.make_node("MatMulInteger", ["xq", "W", "xz", "w_zero_point"], ["acc"]),
            helper.make_node("Mul", ["xs", "w_scale"], ["s"]),
            helper.make_node("DequantizeLinear", ["acc", "s"], ["Y"]),
        ]
        inputs = ["X", "W", "w_scale", "w_zero_point"]
    name = "QMatMulStatic8bits" if mode == "static" else "QMatMulDynamic8bits"
    return helper.make_function("quant", name, inputs, ["Y"], nodes, [helper.make_opsetid("", 21)])


def qmatmul_proto(mode: str, *, per_column: bool = False) -> onnx.ModelProto:
    """x [5, K] -> quant::QMatMul*(x, wq, ...) -> Relu -> y [5, N]; weights symmetric int8
    (per tensor, or per column), x uint8 with a nonzero zero point (static)."""
    rng = np.random.default_rng(11)
    # scalars per tensor, as onnx-quantize writes them; 7-bit weights: ONNX Runtime's u8·s8
    # kernels saturate pairs of full-range products on AVX2 (docs/calibration.md)
    ws = (rng.random(N if per_column else ()) * 0.01 + 0.002).astype(np.float32)
    inits = [
        numpy_helper.from_array(rng.integers(-63, 64, (K, N)).astype(np.int8), "wq"),
        numpy_helper.from_array(ws, "ws"),
        numpy_helper.from_array(np.zeros(N, np.int8) if per_column else np.array(0, np.int8), "wz"),
    ]
    if mode == "static":
        inits += [
            numpy_helper.from_array(np.array(0.0213, np.float32), "xs"),
            numpy_helper.from_array(np.float32(0.0213) * ws, "s"),
            numpy_helper.from_array(np.array(117, np.uint8), "xz"),
        ]
        call = ["x", "wq", "xs", "s", "xz", "wz"]
    else:
        call = ["x", "wq", "ws", "wz"]
    fn = _function(mode)
    g = helper.make_graph(
        [
            helper.make_node(fn.name, call, ["mm"], domain="quant", name="qmm"),
            helper.make_node("Relu", ["mm"], ["y"], name="relu"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, N])],
        inits,
    )
    return helper.make_model(
        g,
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("quant", 1)],
        functions=[fn],
        ir_version=10,
    )


def _x() -> np.ndarray:
    return np.random.default_rng(5).uniform(-2.4, 3.0, (5, K)).astype(np.float32)


@pytest.mark.parametrize("mode,per_column", [("static", False), ("dynamic", False), ("dynamic", True)])
def test_function_file_runs_natively_and_equals_onnxruntime(mode, per_column):
    proto = qmatmul_proto(mode, per_column=per_column)
    onnx.checker.check_model(proto, full_check=True)
    sess = quanta.InferenceSession(proto.SerializeToString())
    assert sess.fallbacks == []
    assert reference_steps(sess.plan) == []  # the int32 DequantizeLinear ran on the reference
    got = sess.run(None, {"x": _x()})[0]
    ort = pytest.importorskip("onnxruntime")
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": _x()}
    )[0]
    assert got.dtype == np.float32 and np.array_equal(got, want)


def test_inlining_writes_out_the_calls_and_keeps_quantas_own_functions():
    proto = qmatmul_proto("static")
    own = helper.make_function(
        "quanta",
        "Twice",
        ["a"],
        ["b"],
        [helper.make_node("Add", ["a", "a"], ["b"])],
        [helper.make_opsetid("", 21)],
    )
    proto.functions.append(own)
    proto.opset_import.append(helper.make_opsetid("quanta", 1))
    proto.graph.node.append(helper.make_node("Twice", ["y"], ["y2"], domain="quanta", name="twice"))
    assert inline_model_functions(proto) == 1
    ops = [(n.domain, n.op_type) for n in proto.graph.node]
    assert ("quant", "QMatMulStatic8bits") not in ops and ("", "MatMulInteger") in ops
    assert ("quanta", "Twice") in ops and [f.name for f in proto.functions] == ["Twice"]
    bare = qmatmul_proto("static")
    del bare.graph.node[:]  # functions nobody calls: the file is left as it is
    assert inline_model_functions(bare) == 0 and len(bare.functions) == 1


def _inlined(proto: onnx.ModelProto):
    inline_model_functions(proto)
    return load(proto)


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_rule_fires_once_per_product(mode):
    model = _inlined(qmatmul_proto(mode))
    p = RewritePass([LowerMatMulIntegerDequantized()])
    assert run_passes(model, [p]).fired("LowerMatMulIntegerDequantized") == 1
    mm = [n for n in model.graph.nodes if n.op_type == "MatMulIntegerToFloat"]
    assert len(mm) == 1 and "DequantizeLinear" not in [n.op_type for n in model.graph.nodes]


def test_refusals():
    proto = qmatmul_proto("static")
    inline_model_functions(proto)
    dq = next(n for n in proto.graph.node if n.op_type == "DequantizeLinear")
    proto.graph.initializer.append(numpy_helper.from_array(np.array(3, np.int32), "acc_zp"))
    dq.input.append("acc_zp")  # a nonzero zero point of the accumulator: not the op's form
    p = RewritePass([LowerMatMulIntegerDequantized()])
    assert not run_passes(load(proto), [p]).records[0].modified
    assert [r.reason for r in p.why_not("LowerMatMulIntegerDequantized")] == [
        "the DequantizeLinear's zero point is not a constant 0"
    ]


def computed_scale_proto(scale: str) -> onnx.ModelProto:
    """x [5, K] -> QuantizeLinear -> MatMulInteger -> DequantizeLinear(acc, s) -> Relu, with
    the accumulator's scale s = x_scale · w_scale written as a computation over
    constants, the ways files write it: onnx-quantize's static function body (``Mul``),
    a one-element [1] product, the product reshaped to [1], a Cast of it, and a plain
    [1] constant (a per-tensor scale in ONNX Runtime, per axis of size 1 in ONNX)."""
    rng = np.random.default_rng(23)
    x_scale, w_scale = np.float32(0.0213), np.float32(0.0057)
    one = scale in ("mul_1", "const_1")
    inits = [
        numpy_helper.from_array(rng.integers(-63, 64, (K, N)).astype(np.int8), "wq"),
        numpy_helper.from_array(np.array(117, np.uint8), "xz"),
        numpy_helper.from_array(np.array(x_scale), "xs"),
        numpy_helper.from_array(np.array([w_scale] if one else w_scale), "ws"),
        numpy_helper.from_array(np.array([1], np.int64), "shape_1"),
        numpy_helper.from_array(np.array([x_scale * w_scale], np.float32), "s_1"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("MatMulInteger", ["xq", "wq", "xz"], ["acc"]),
    ]
    if scale == "const_1":
        s = "s_1"
    else:
        nodes.append(helper.make_node("Mul", ["xs", "ws"], ["prod"]))
        s = "prod"
        if scale == "reshape_1":
            nodes.append(helper.make_node("Reshape", ["prod", "shape_1"], ["prod_1"]))
            s = "prod_1"
        elif scale == "cast":
            nodes.append(helper.make_node("Cast", ["prod"], ["prod_f"], to=TensorProto.FLOAT))
            s = "prod_f"
    nodes += [
        helper.make_node("DequantizeLinear", ["acc", s], ["mm"]),
        helper.make_node("Relu", ["mm"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, N])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize("scale", ["mul", "mul_1", "reshape_1", "cast", "const_1"])
def test_computed_accumulator_scale_compiles_and_equals_onnxruntime(scale):
    # the verifier runs after every pass here (tests/conftest.py): folding the scale
    # left the accumulator a plain i32 its DequantizeLinear's constants now describe,
    # and a [1] scale made 0-d left it typed per axis
    proto = computed_scale_proto(scale)
    onnx.checker.check_model(proto, full_check=True)
    sess = quanta.InferenceSession(proto.SerializeToString())
    assert reference_steps(sess.plan) == []
    got = sess.run(None, {"x": _x()})[0]
    ort = pytest.importorskip("onnxruntime")
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": _x()}
    )[0]
    assert got.dtype == np.float32 and np.array_equal(got, want)
