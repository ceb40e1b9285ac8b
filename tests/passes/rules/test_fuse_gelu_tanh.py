"""FuseGeluTanh (passes/rules/fuse_gelu_tanh.py): the tanh GELU written out as eight nodes
(T5 v1.1's gelu_new) becomes quanta::MlasGeluTanh (around ORT's Tanh) or Gelu-20
approximate "tanh" (around an ai.onnx Tanh). Fired and structure; bit-exact on the
reference against the graph as written (both cube forms, swapped operands, both Tanhs);
the native kernel against its twin on every ISA (odd lengths, specials); a file written by
ONNX Runtime's quantize_dynamic (fused in the lowered plan, the unfused plan's bits); the
refusals, each with its reason."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.passes.rules.eliminate_dead import EliminateDead
from quanta.passes.rules.fuse_gelu import FuseGeluPass
from quanta.session import GraphOptimizationLevel, SessionOptions
from tests.passes.helpers import run_passes, run_ref

K = float(np.uint32(0x3F4C422A).view(np.float32))  # f32(√(2/π))
C = float(np.uint32(0x3D372713).view(np.float32))  # f32(0.044715)


def gelu_nodes(x: str, y: str, *, tanh: str = "mlas", cube: str = "Pow", swap: bool = False, k: float = K):
    """The export's eight nodes (``swap``: every commutative operand pair the other way)."""

    def pair(a: str, b: str) -> list[str]:
        return [b, a] if swap else [a, b]

    inits = [
        numpy_helper.from_array(np.float32(v), n)
        for n, v in (("half", 0.5), ("three", 3.0), ("c", C), ("k", k), ("one", 1.0))
    ]
    if cube == "Pow":
        cube_nodes = [helper.make_node("Pow", [x, "three"], ["x3"])]
    else:
        cube_nodes = [helper.make_node("Mul", [x, x], ["x2"]), helper.make_node("Mul", pair("x2", x), ["x3"])]
    tanh_node = (
        helper.make_node("MlasTanh", ["a"], ["t"], domain="quanta")
        if tanh == "mlas"
        else helper.make_node("Tanh", ["a"], ["t"])
    )
    nodes = [
        helper.make_node("Mul", pair(x, "half"), ["hx"]),
        *cube_nodes,
        helper.make_node("Mul", pair("x3", "c"), ["cx3"]),
        helper.make_node("Add", pair(x, "cx3"), ["u"]),
        helper.make_node("Mul", pair("u", "k"), ["a"]),
        tanh_node,
        helper.make_node("Add", pair("t", "one"), ["t1"]),
        helper.make_node("Mul", pair("hx", "t1"), [y]),
    ]
    return nodes, inits


def gelu_proto(rows: int = 3, d: int = 17, *, opset: int = 17, extra_use: str | None = None, **kwargs):
    """Relu -> the GELU -> Add(·, x) (x read by three of the GELU's nodes and the Add)."""
    nodes, inits = gelu_nodes("x", "g", **kwargs)
    nodes = [
        helper.make_node("Relu", ["x_in"], ["x"], name="pre"),
        *nodes,
        helper.make_node("Add", ["g", "x"], ["y"], name="post"),
    ]
    shape = [rows, d]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)]
    if extra_use:
        outputs.append(helper.make_tensor_value_info(extra_use, TensorProto.FLOAT, None))
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x_in", TensorProto.FLOAT, shape)], outputs, inits
    )
    imports = [helper.make_opsetid("", opset), helper.make_opsetid("quanta", 1)]
    return helper.make_model(g, opset_imports=imports)


def feeds(rows: int = 3, d: int = 17, seed: int = 2) -> dict[str, np.ndarray]:
    x = np.random.default_rng(seed).standard_normal((rows, d)).astype(np.float32) * 4
    return {"x_in": x}


def assert_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("cube", ["Pow", "Mul"])
@pytest.mark.parametrize(("tanh", "opset"), [("mlas", 17), ("onnx", 20)])
def test_fuses_bit_exact(tanh, opset, cube, swap):
    proto = gelu_proto(tanh=tanh, opset=opset, cube=cube, swap=swap)
    model = load(proto)
    result = run_passes(model, [FuseGeluPass(opset), EliminateDead()])
    assert result.fired("FuseGeluTanh") == 1
    ops = [(n.op_type, n.domain) for n in model.graph.nodes]
    fused = ("MlasGeluTanh", "quanta") if tanh == "mlas" else ("Gelu", "")
    assert ops == [("Relu", ""), fused, ("Add", "")]
    if tanh == "onnx":
        assert model.graph.nodes[1].attrs == {"approximate": "tanh"}
    f = feeds()
    f["x_in"][0, :4] = [-0.0, 1e13, -1e13, 9.5]  # a negative zero, x³ overflowing, tanh saturated
    assert_bits(run_ref(proto, f)[0], run_ref(model, f)[0])


def test_twin_matches_native_on_every_isa_and_specials():
    from quanta.kernels import _native
    from quanta.kernels.reference.ort_float import mlas_gelu_tanh

    rng = np.random.default_rng(7)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e13, -1e13, 3e-39, -5.5, 11.0], np.float32)
    for n in (1, 7, 17, 515):
        x = (rng.standard_normal(n) * rng.choice([0.1, 3.0, 30.0])).astype(np.float32)
        x[: min(n, specials.size)] = specials[: min(n, specials.size)]
        want = mlas_gelu_tanh(x)
        for isa in _native.supported_isas():
            _native.set_isa(isa)
            try:
                for threads in (1, 2):
                    assert_bits(want, _native.unary_f32("gelu_tanh_mlas", x, threads))
            finally:
                _native.clear_isa()


def test_a_file_from_ort_quantize_dynamic(tmp_path):
    """T5's feed-forward: MatMul -> gelu_new -> MatMul, quantized by ONNX Runtime's
    quantize_dynamic: the file is ORT's, and ORT's FastGeluFusion runs these eight nodes as
    its FastGelu, so they become one OrtFastGelu step (ort_float_functions
    WrittenGeluTanhToOrtFastGelu, before FuseGeluTanh sees them), on every optimization
    level: the unfused plan has the same step and bits."""
    ort_quant = pytest.importorskip("onnxruntime.quantization")
    rows, d, ff = 7, 17, 33
    rng = np.random.default_rng(3)
    nodes, inits = gelu_nodes("h", "g", tanh="onnx")
    inits += [
        numpy_helper.from_array((rng.standard_normal((d, ff)) * 0.3).astype(np.float32), "wi"),
        numpy_helper.from_array((rng.standard_normal((ff, d)) * 0.3).astype(np.float32), "wo"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "wi"], ["h"]),
        *nodes,
        helper.make_node("MatMul", ["g", "wo"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "ffn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, d])],
        inits,
    )
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    src.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    ort_quant.quantize_dynamic(str(src), str(dst), weight_type=ort_quant.QuantType.QInt8)
    data = dst.read_bytes()
    sess = quanta.InferenceSession(data)
    steps = [s.op_type for s in sess.plan.steps]
    assert "OrtFastGelu" in steps and "MlasTanh" not in steps and "Pow" not in steps
    unfused = quanta.InferenceSession(
        data, SessionOptions(graph_optimization_level=GraphOptimizationLevel.ORT_DISABLE_ALL)
    )
    assert "OrtFastGelu" in [s.op_type for s in unfused.plan.steps]
    x = (rng.standard_normal((rows, d)) * 2).astype(np.float32)
    for _ in range(2):  # the measuring run, then the specialized one
        assert_bits(unfused.run(None, {"x": x})[0], sess.run(None, {"x": x})[0])


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"tanh": "onnx", "opset": 17}, "before opset 20"),
        ({"k": 0.8}, "not a tanh GELU"),
        ({"extra_use": "t"}, "'t' has other users"),
        ({"extra_use": "x3"}, "'x3' has other users"),
    ],
)
def test_refusals_leave_the_graph_unchanged(kwargs, reason):
    proto = gelu_proto(**kwargs)
    model = load(proto)
    before = [(n.op_type, n.name) for n in model.graph.nodes]
    p = FuseGeluPass(kwargs.get("opset", 17))
    result = run_passes(model, [p])
    assert result.fired("FuseGeluTanh") == 0
    assert [(n.op_type, n.name) for n in model.graph.nodes] == before
    assert any(reason in r.reason for r in p.why_not("FuseGeluTanh")), [r.reason for r in p.no_matches()]
