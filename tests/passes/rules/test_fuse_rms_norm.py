"""FuseRMSNorm (passes/rules/fuse_rms_norm.py): T5's RMS norm written out as Pow (or Mul),
ReduceMean, Add, Sqrt, then Div(x, s) or Mul(x, Div(1, s) | Reciprocal(s)) [, Mul, Add]
becomes one quanta::RMSNormDiv. Fired and structure; bit-exact on the reference and the
native target against the graph as written (odd row lengths 7, 17, 515, several rows,
both division forms); the pipelines (float with a no-op Cast, quantized island, a file
written by ONNX Runtime's quantize_dynamic); the refusals, each with its reason; a
mean-subtracting LayerNorm still becomes LayerNormDiv."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.passes.rules.eliminate_dead import EliminateDead
from quanta.passes.rules.fuse_layer_norm import FuseLayerNormPass
from quanta.session import GraphOptimizationLevel, SessionOptions
from tests.passes.helpers import run_passes, run_ref

#: the three ways an export divides by the root mean square
FORMS = ("div_one", "reciprocal", "div")


def rms_proto(
    d: int = 17,
    rows: int = 3,
    *,
    opset: int = 17,
    form: str = "div_one",
    square: str = "Pow",
    exponent: float = 2.0,
    one: float = 1.0,
    affine: str = "scale",
    axes: tuple[int, ...] = (-1,),
    keepdims: int = 1,
    cast: bool = False,
    extra_use: str | None = None,
):
    """Relu -> [Cast to float] -> the RMS norm -> Add(·, x) (x read three times, as T5's
    residual stream is)."""
    rng = np.random.default_rng(d + rows)
    inits = [
        numpy_helper.from_array(np.float32(exponent), "two"),
        numpy_helper.from_array(np.float32(1e-6), "eps"),
        numpy_helper.from_array(np.float32(one), "one"),
        numpy_helper.from_array((1 + 0.1 * rng.standard_normal(d)).astype(np.float32), "gamma"),
        numpy_helper.from_array((0.1 * rng.standard_normal(d)).astype(np.float32), "beta"),
    ]
    if opset >= 18:
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
        mean = helper.make_node("ReduceMean", ["p", "axes"], ["v"], keepdims=keepdims)
    else:
        mean = helper.make_node("ReduceMean", ["p"], ["v"], axes=list(axes), keepdims=keepdims)
    nodes = [helper.make_node("Relu", ["x_in"], ["x0" if cast else "x"], name="pre")]
    if cast:
        nodes.append(helper.make_node("Cast", ["x0"], ["x"], to=TensorProto.FLOAT))
    nodes += [
        helper.make_node("Pow", ["x", "two"], ["p"])
        if square == "Pow"
        else helper.make_node("Mul", ["x", "x"], ["p"]),
        mean,
        helper.make_node("Add", ["v", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
    ]
    if form == "div":
        nodes.append(helper.make_node("Div", ["x", "s"], ["n"]))
    elif form == "reciprocal":
        nodes += [helper.make_node("Reciprocal", ["s"], ["r"]), helper.make_node("Mul", ["r", "x"], ["n"])]
    else:
        nodes += [helper.make_node("Div", ["one", "s"], ["r"]), helper.make_node("Mul", ["x", "r"], ["n"])]
    last = "n"
    if affine in ("scale", "both"):
        nodes.append(helper.make_node("Mul", ["gamma", last], ["g"]))
        last = "g"
    if affine in ("bias", "both"):
        nodes.append(helper.make_node("Add", [last, "beta"], ["b"]))
        last = "b"
    nodes.append(helper.make_node("Add", [last, "x"], ["y"], name="post"))
    shape = [rows, d]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)]
    if extra_use:
        outputs.append(helper.make_tensor_value_info(extra_use, TensorProto.FLOAT, None))
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x_in", TensorProto.FLOAT, shape)], outputs, inits
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def feeds(rows: int = 3, d: int = 17, seed: int = 2) -> dict[str, np.ndarray]:
    x = np.random.default_rng(seed).standard_normal((rows, d)).astype(np.float32) * 3 + 1
    return {"x_in": x}


def assert_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def native(proto, level=GraphOptimizationLevel.ORT_ENABLE_ALL, threads: int = 1):
    options = SessionOptions(graph_optimization_level=level)
    options.intra_op_num_threads = threads
    return quanta.InferenceSession(proto.SerializeToString(), options)


@pytest.mark.parametrize("affine", ["none", "scale", "both"])
@pytest.mark.parametrize("square", ["Pow", "Mul"])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("opset", [17, 18])
def test_fuses_bit_exact(affine, square, form, opset):
    proto = rms_proto(affine=affine, square=square, form=form, opset=opset)
    model = load(proto)
    result = run_passes(model, [FuseLayerNormPass(), EliminateDead()])
    assert result.fired("FuseRMSNorm") == 1
    assert result.fired("FuseLayerNorm") == 0
    ops = [(n.op_type, n.domain) for n in model.graph.nodes]
    assert ops == [("Relu", ""), ("RMSNormDiv", "quanta"), ("Add", "")]
    rms = model.graph.nodes[1]
    assert rms.attrs == {"axis": 1, "epsilon": float(np.float32(1e-6)), "reciprocal": int(form != "div")}
    assert len(rms.inputs) == {"none": 1, "scale": 2, "both": 3}[affine]
    assert rms.inputs[0] is model.graph.nodes[0].outputs[0]
    assert_bits(run_ref(proto, feeds())[0], run_ref(model, feeds())[0])


def test_the_two_division_forms_round_differently():
    """Div(x, s) and Mul(x, 1 / s) are different roundings: the reciprocal attribute is
    what keeps each fused graph equal to its own export (and the two differ somewhere)."""
    f = feeds(64, 515, seed=9)
    div, mul = (run_ref(rms_proto(515, 64, form=form), f)[0] for form in ("div", "div_one"))
    assert not np.array_equal(div, mul)
    for form, expected in (("div", div), ("div_one", mul)):
        model = load(rms_proto(515, 64, form=form))
        run_passes(model, [FuseLayerNormPass(), EliminateDead()])
        assert_bits(expected, run_ref(model, f)[0])


@pytest.mark.parametrize(("rows", "d"), [(3, 7), (7, 17), (1, 515), (5, 259), (300, 64)])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("threads", [1, 2])
def test_native_session_matches_the_graph_as_written(rows, d, form, threads):
    """The native target (fused by optimize_float, after the no-op Cast goes) against the
    reference running the unfused nodes: the same bits for odd row lengths and many rows."""
    proto = rms_proto(d, rows, form=form, affine="both", cast=True)
    sess = native(proto, threads=threads)
    assert [s.op_type for s in sess.plan.steps] == ["Relu", "RMSNormDiv", "Add"]
    assert sess.plan.steps[1].kernel.name == "native:rms_norm_div_f32"
    assert not sess.fallbacks
    f = feeds(rows, d, seed=rows * d)
    expected = run_ref(proto, f)[0]
    for _ in range(2):  # the measuring run, then the specialized one
        assert_bits(expected, sess.run(None, f)[0])
    unfused = native(proto, GraphOptimizationLevel.ORT_DISABLE_ALL, threads=threads)
    assert_bits(expected, unfused.run(None, f)[0])


def test_twin_matches_native_on_every_isa_and_specials():
    from quanta.kernels import _native
    from quanta.kernels.reference.nn_norm import rms_norm_div
    from quanta.kernels.reference.registry import OpContext

    rng = np.random.default_rng(5)
    for d in (1, 3, 7, 15, 16, 17, 259, 515):
        x = (rng.standard_normal((5, d)) * rng.choice([1e-3, 1.0, 1e3]) - 3).astype(np.float32)
        x[1] = np.float32(0.0)  # a zero row: s = sqrt(eps), y = ±0
        x[2, 0] = np.float32(-0.0)
        x[3] = np.float32(3e20)  # x · x overflows: s = inf, y = 0
        x[4, -1] = np.nan  # a NaN row
        scale = rng.standard_normal(d).astype(np.float32)
        bias = rng.standard_normal(d).astype(np.float32)
        ctx = OpContext()
        for reciprocal in (0, 1):
            for s, b in ((None, None), (scale, None), (scale, bias)):
                want = rms_norm_div(ctx, x, s, b, axis=-1, epsilon=1e-6, reciprocal=reciprocal)
                ones = np.ones(d, np.float32) if s is None else s
                for isa in _native.supported_isas():
                    _native.set_isa(isa)
                    try:
                        got = _native.layer_norm_f32(
                            x, ones, b, 1, float(np.float32(1e-6)), 1, None, False, not reciprocal, True
                        )
                    finally:
                        _native.clear_isa()
                    assert_bits(want, got)


def test_lower_qdq_fuses_the_float_island():
    """In a QDQ graph the island between a DQ and a Q is fused after lowering."""
    proto = rms_proto(64, 2, affine="scale")
    g = proto.graph
    g.initializer.extend(
        [numpy_helper.from_array(np.float32(0.05), "q_scale"), numpy_helper.from_array(np.uint8(128), "q_zp")]
    )
    post = next(n for n in g.node if n.name == "post")
    post.input[0] = "g_dq"
    g.node.extend(
        [
            helper.make_node("QuantizeLinear", ["g", "q_scale", "q_zp"], ["g_q"]),
            helper.make_node("DequantizeLinear", ["g_q", "q_scale", "q_zp"], ["g_dq"]),
        ]
    )
    nodes = [n for n in g.node if n.name != "post"] + [post]  # topological order
    del g.node[:]
    g.node.extend(nodes)
    sess = native(proto)
    assert "RMSNormDiv" in [s.op_type for s in sess.plan.steps]
    assert "fuse_layer_norm" in [r.name for r in sess.plan.passes.records]
    f = feeds(2, 64)
    ref = quanta.InferenceSession(proto.SerializeToString(), backend="reference")
    assert_bits(ref.run(None, f)[0], sess.run(None, f)[0])
    assert_bits(run_ref(proto, f)[0], sess.run(None, f)[0])


def test_a_file_from_ort_quantize_dynamic(tmp_path):
    """T5's block shape: RMS norm -> MatMul -> residual Add, quantized by ONNX Runtime's
    quantize_dynamic (DynamicQuantizeLinear + MatMulInteger): the norm is fused in the
    lowered plan and the outputs are the unfused plan's bits."""
    ort_quant = pytest.importorskip("onnxruntime.quantization")
    d, rows = 17, 7
    proto = rms_proto(d, rows, affine="scale")
    g = proto.graph
    w = np.random.default_rng(3).standard_normal((d, d)).astype(np.float32) * 0.2
    g.initializer.append(numpy_helper.from_array(w, "w"))
    post = next(n for n in g.node if n.name == "post")
    post.input[0] = "h"
    nodes = [n for n in g.node if n.name != "post"]
    nodes += [helper.make_node("MatMul", ["g", "w"], ["h"]), post]
    del g.node[:]
    g.node.extend(nodes)
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    src.write_bytes(proto.SerializeToString())
    ort_quant.quantize_dynamic(str(src), str(dst), weight_type=ort_quant.QuantType.QInt8)
    data = dst.read_bytes()
    # ONNX's functions: with ORT's ("auto" on this file) the norm is ORT's own kernel
    # (quanta::OrtLayerNorm, tests/passes/rules/test_ort_norm_softmax.py)
    assert "OrtLayerNorm" in [s.op_type for s in quanta.InferenceSession(data).plan.steps]
    sess = quanta.InferenceSession(data, SessionOptions(float_functions="onnx"))
    steps = [s.op_type for s in sess.plan.steps]
    assert "RMSNormDiv" in steps and "Sqrt" not in steps and "ReduceMean" not in steps
    unfused = quanta.InferenceSession(
        data,
        SessionOptions(
            graph_optimization_level=GraphOptimizationLevel.ORT_DISABLE_ALL, float_functions="onnx"
        ),
    )
    assert "Sqrt" in [s.op_type for s in unfused.plan.steps]
    f = feeds(rows, d, seed=11)
    assert_bits(unfused.run(None, f)[0], sess.run(None, f)[0])


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"exponent": 3.0}, "exponent other than a float32 2"),
        ({"axes": (0,)}, "not over the trailing axes"),
        ({"keepdims": 0, "rows": 17}, "keepdims 1"),  # rows = d: the Div still broadcasts
        ({"one": 2.0}, "nor Mul(x, Reciprocal"),
        ({"extra_use": "s"}, "'s' has other users"),
        ({"extra_use": "r"}, "'r' has other users"),
        ({"extra_use": "v"}, "'v' has other users"),
    ],
)
def test_refusals_leave_the_graph_unchanged(kwargs, reason):
    proto = rms_proto(**kwargs)
    model = load(proto)
    before = [(n.op_type, n.name) for n in model.graph.nodes]
    p = FuseLayerNormPass()
    result = run_passes(model, [p])
    assert result.fired("FuseRMSNorm") == 0
    assert [(n.op_type, n.name) for n in model.graph.nodes] == before
    assert any(reason in r.reason for r in p.why_not("FuseRMSNorm")), [r.reason for r in p.no_matches()]


def test_a_square_of_another_value_is_not_fused():
    """Div(x, sqrt(mean(z²) + eps)) with z not x is not an RMS norm of x."""
    proto = rms_proto(form="div")
    node = next(n for n in proto.graph.node if n.op_type == "Pow")
    node.input[0] = "x_in"
    model = load(proto)
    p = FuseLayerNormPass()
    assert run_passes(model, [p]).fired("FuseRMSNorm") == 0
    assert any("of the normalized x" in r.reason for r in p.why_not("FuseRMSNorm"))


def test_a_layer_norm_stays_a_layer_norm():
    """The mean-subtracting LayerNorm's tail is an RMS norm of x − mean: FuseLayerNorm runs
    first and takes the whole chain."""
    from tests.passes.rules.test_fuse_layer_norm import ln_proto

    model = load(ln_proto())
    result = run_passes(model, [FuseLayerNormPass(), EliminateDead()])
    assert result.fired("FuseLayerNorm") == 1
    assert result.fired("FuseRMSNorm") == 0
    assert [n.op_type for n in model.graph.nodes] == ["Relu", "LayerNormDiv", "Relu"]
