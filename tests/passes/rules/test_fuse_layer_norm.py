"""FuseLayerNorm (passes/rules/fuse_layer_norm.py): a LayerNorm written out as ReduceMean,
Sub, Pow (or Mul), ReduceMean, Add, Sqrt, Div [, Mul, Add] becomes one
quanta::LayerNormDiv. Fired and structure; bit-exact on the reference and the native
target against the graph as written (odd row lengths, rows longer than 258); the
pipelines (float, quantized island); the refusals, each with its reason; graphs without
the pattern unchanged."""

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


def ln_proto(
    d: int = 17,
    rows: int = 3,
    *,
    opset: int = 17,
    square: str = "Pow",
    exponent: float = 2.0,
    affine: str = "both",
    axes: tuple[int, ...] = (-1,),
    var_axes: tuple[int, ...] | None = None,
    extra_use: str | None = None,
    keepdims: int = 1,
    eps_first: bool = False,
):
    rng = np.random.default_rng(d)
    inits = [
        numpy_helper.from_array(np.float32(exponent), "two"),
        numpy_helper.from_array(np.float32(1e-5), "eps"),
        numpy_helper.from_array((1 + 0.1 * rng.standard_normal(d)).astype(np.float32), "gamma"),
        numpy_helper.from_array((0.1 * rng.standard_normal(d)).astype(np.float32), "beta"),
    ]

    def mean(inp: str, out: str, ax: tuple[int, ...]) -> helper.NodeProto:
        if opset >= 18:
            name = f"{out}_axes"
            inits.append(numpy_helper.from_array(np.array(ax, np.int64), name))
            return helper.make_node("ReduceMean", [inp, name], [out], keepdims=keepdims)
        return helper.make_node("ReduceMean", [inp], [out], axes=list(ax), keepdims=keepdims)

    sq = (
        helper.make_node("Pow", ["d", "two"], ["p"])
        if square == "Pow"
        else helper.make_node("Mul", ["d", "d"], ["p"])
    )
    nodes = [
        helper.make_node("Relu", ["x_in"], ["x"], name="pre"),
        mean("x", "m", axes),
        helper.make_node("Sub", ["x", "m"], ["d"]),
        sq,
        mean("p", "v", var_axes or axes),
        helper.make_node("Add", ["eps", "v"] if eps_first else ["v", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["n"]),
    ]
    last = "n"
    if affine in ("scale", "both"):
        nodes.append(helper.make_node("Mul", ["gamma", last], ["g"]))
        last = "g"
    if affine in ("bias", "both"):
        nodes.append(helper.make_node("Add", [last, "beta"], ["b"]))
        last = "b"
    nodes.append(helper.make_node("Relu", [last], ["y"], name="post"))
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


@pytest.mark.parametrize("affine", ["none", "scale", "bias", "both"])
@pytest.mark.parametrize("square", ["Pow", "Mul"])
@pytest.mark.parametrize("opset", [17, 18])
def test_fuses_bit_exact(affine, square, opset):
    proto = ln_proto(affine=affine, square=square, opset=opset)
    model = load(proto)
    result = run_passes(model, [FuseLayerNormPass(), EliminateDead()])
    assert result.fired("FuseLayerNorm") == 1
    ops = [(n.op_type, n.domain) for n in model.graph.nodes]
    assert ops == [("Relu", ""), ("LayerNormDiv", "quanta"), ("Relu", "")]
    ln = model.graph.nodes[1]
    assert ln.attrs == {"axis": 1, "epsilon": float(np.float32(1e-5))}
    assert len(ln.inputs) == {"none": 1, "scale": 2, "bias": 3, "both": 3}[affine]
    assert_bits(run_ref(proto, feeds())[0], run_ref(model, feeds())[0])


@pytest.mark.parametrize(("rows", "d"), [(3, 3), (7, 7), (1, 17), (5, 259), (2, 384), (300, 64)])
@pytest.mark.parametrize("threads", [1, 2])
def test_native_session_matches_the_graph_as_written(rows, d, threads):
    """The native target (fused by optimize_float) against the reference running the
    unfused nodes: the same bits, for odd rows, rows longer than 258, many rows."""
    proto = ln_proto(d, rows)
    sess = native(proto, threads=threads)
    assert [s.op_type for s in sess.plan.steps] == ["Relu", "LayerNormDiv", "Relu"]
    assert sess.plan.steps[1].kernel.name == "native:layer_norm_div_f32"
    assert not sess.fallbacks
    f = feeds(rows, d, seed=rows * d)
    expected = run_ref(proto, f)[0]
    for _ in range(2):  # the measuring run, then the specialized one
        assert_bits(expected, sess.run(None, f)[0])
    unfused = native(proto, GraphOptimizationLevel.ORT_DISABLE_ALL, threads=threads)
    assert_bits(expected, unfused.run(None, f)[0])


def test_twin_matches_native_on_every_isa_and_specials():
    from quanta.kernels import _native
    from quanta.kernels.reference.nn_norm import layer_norm_div
    from quanta.kernels.reference.registry import OpContext

    rng = np.random.default_rng(5)
    for d in (1, 3, 7, 15, 16, 17, 259, 384):
        x = (rng.standard_normal((4, d)) * rng.choice([1e-3, 1.0, 1e3]) + 7).astype(np.float32)
        x[1] = np.float32(2.5)  # a constant row: d = 0, y = 0 · scale + bias
        scale = rng.standard_normal(d).astype(np.float32)
        bias = rng.standard_normal(d).astype(np.float32)
        ctx = OpContext()
        for s, b in ((None, None), (scale, None), (scale, bias)):
            want = layer_norm_div(ctx, x, s, b, axis=-1, epsilon=1e-5)
            ones = np.ones(d, np.float32) if s is None else s
            for isa in _native.supported_isas():
                _native.set_isa(isa)
                try:
                    got = _native.layer_norm_f32(x, ones, b, 1, float(np.float32(1e-5)), 1, None, False, True)
                finally:
                    _native.clear_isa()
                assert_bits(want, got)


def test_lower_qdq_fuses_the_float_island():
    """In a quantized graph the island between a DQ and a Q is fused after lowering."""
    proto = ln_proto(64, 2, affine="none")
    g = proto.graph
    q = numpy_helper.from_array(np.float32(0.05), "q_scale"), numpy_helper.from_array(np.uint8(128), "q_zp")
    g.initializer.extend(q)
    post = next(n for n in g.node if n.name == "post")
    post.input[0] = "n_dq"
    g.node.extend(
        [
            helper.make_node("QuantizeLinear", ["n", "q_scale", "q_zp"], ["n_q"]),
            helper.make_node("DequantizeLinear", ["n_q", "q_scale", "q_zp"], ["n_dq"]),
        ]
    )
    # the Relu reads the DQ: keep the graph in topological order
    nodes = [n for n in g.node if n.name != "post"] + [post]
    del g.node[:]
    g.node.extend(nodes)
    sess = native(proto)
    assert "LayerNormDiv" in [s.op_type for s in sess.plan.steps]
    assert "fuse_layer_norm" in [r.name for r in sess.plan.passes.records]
    f = feeds(2, 64)
    ref = quanta.InferenceSession(proto.SerializeToString(), backend="reference")
    assert_bits(ref.run(None, f)[0], sess.run(None, f)[0])
    assert_bits(run_ref(proto, f)[0], sess.run(None, f)[0])


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"exponent": 3.0}, "exponent other than a float32 2"),
        ({"axes": (0,)}, "not over the trailing axes"),
        ({"var_axes": (0,)}, "not over the mean's axes"),
        ({"keepdims": 0, "rows": 17}, "keepdims 1"),  # rows = d: the Sub still broadcasts
        ({"extra_use": "s"}, "'s'"),
        ({"extra_use": "m"}, "the mean 'm' has other users"),
        ({"extra_use": "d"}, "readers besides the Pow and the Div"),
    ],
)
def test_refusals_leave_the_graph_unchanged(kwargs, reason):
    """Each refusal with its reason. Where only the mean part is shared (the mean or
    x − mean has other readers), the tail Pow(d, 2) .. Div(d, s) is an RMS norm of d and
    FuseRMSNorm takes it: the same bits."""
    proto = ln_proto(**kwargs)
    model = load(proto)
    before = [(n.op_type, n.name) for n in model.graph.nodes]
    p = FuseLayerNormPass()
    result = run_passes(model, [p, EliminateDead()])
    assert result.fired("FuseLayerNorm") == 0
    assert any(reason in r.reason for r in p.why_not("FuseLayerNorm")), [r.reason for r in p.no_matches()]
    if kwargs.get("extra_use") in ("m", "d"):
        assert result.fired("FuseRMSNorm") == 1
        ops = [n.op_type for n in model.graph.nodes]
        assert ops == ["Relu", "ReduceMean", "Sub", "RMSNormDiv", "Relu"]
        for a, b in zip(run_ref(proto, feeds()), run_ref(model, feeds())):
            assert_bits(a, b)
    else:
        assert result.fired("FuseRMSNorm") == 0
        assert [(n.op_type, n.name) for n in model.graph.nodes] == before


def test_eps_first_and_shared_affine_stay_outside():
    """Add(eps, var) in either order fuses; the Add after a Mul whose output has a second
    reader (a graph output) is not absorbed (the fused op stops at the Mul, whose output
    name it takes)."""
    proto = ln_proto(eps_first=True, extra_use="g")
    model = load(proto)
    run_passes(model, [FuseLayerNormPass(), EliminateDead()])
    ops = [n.op_type for n in model.graph.nodes]
    assert ops == ["Relu", "LayerNormDiv", "Add", "Relu"]
    assert model.graph.nodes[1].outputs[0].name == "g"
    f = feeds()
    for a, b in zip(run_ref(proto, f), run_ref(model, f)):
        assert_bits(a, b)


def test_a_graph_without_the_pattern_is_unchanged():
    """A Div of a Sub by a Sqrt that is not a LayerNorm (no mean) stays as it is."""
    inits = [numpy_helper.from_array(np.float32(1e-5), "eps")]
    nodes = [
        helper.make_node("Sub", ["a", "b"], ["d"]),
        helper.make_node("Add", ["b", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["y"]),
    ]
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 5]) for n in ("a", "b")]
    g = helper.make_graph(
        nodes, "g", vi, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])], inits
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model = load(proto)
    before = [(n.op_type, n.name) for n in model.graph.nodes]
    result = run_passes(model, [FuseLayerNormPass(), EliminateDead()])
    assert result.fired("FuseLayerNorm") == 0
    assert [(n.op_type, n.name) for n in model.graph.nodes] == before


def test_keras_layer_norm_computing_x_minus_mean_twice_fuses_in_float_sessions():
    """DTLN's instant layer norm (keras2onnx): ``x - mean`` is two equal Sub nodes, one
    squared for the variance, one divided. optimize_float merges them (EliminateCommon)
    before FuseLayerNorm, so a float session runs one LayerNormDiv, with the bytes of
    the graph as written."""
    proto = ln_proto(259, 3, square="Mul")
    g = proto.graph
    sub = next(n for n in g.node if n.op_type == "Sub")
    twin = helper.make_node("Sub", list(sub.input), ["d_twin"], name="sub_twin")
    div = next(n for n in g.node if n.op_type == "Div")
    div.input[0] = "d_twin"
    g.node.insert(list(g.node).index(div), twin)
    model = load(proto)
    assert run_passes(model, [FuseLayerNormPass()]).fired("FuseLayerNorm") == 0  # hidden
    sess = native(proto)
    assert [s.op_type for s in sess.plan.steps] == ["Relu", "LayerNormDiv", "Relu"]
    f = feeds(3, 259, seed=4)
    assert_bits(run_ref(proto, f)[0], sess.run(None, f)[0])
