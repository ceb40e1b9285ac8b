"""ONNX operators written out as their function bodies on load (quanta/ir/onnx_functions.py):
Attention, RMSNormalization and RotaryEmbedding in each form against ``onnx.reference``
(the specification) and ONNX Runtime's kernel, on both targets, with no fallback; the
Swish and SwiGLU by the onnx node cases.

Shapes avoid coincidences: batch 2, 3 query heads of 7 (2 groups of kv heads where
grouped), 5 query and 6 key tokens, 17 channels for the norm.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import quanta
from quanta.ir.onnx_functions import EXPANDED_OPS, expand_function_ops
from tests.ort_int8 import WEIGHT_BITS

RNG = np.random.default_rng(23)
B, HQ, SQ, SKV, D = 2, 3, 5, 6, 7


def _f(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _model(
    op: str, feeds: dict[str, np.ndarray], consts: dict[str, np.ndarray], inputs: list[str], **attrs
) -> onnx.ModelProto:
    elem = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.bool_): TensorProto.BOOL}
    elem[np.dtype(np.int64)] = TensorProto.INT64
    node = helper.make_node(op, inputs, ["y"], name=f"the_{op}", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(k, elem[v.dtype], list(v.shape)) for k, v in feeds.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    m.ir_version = 10
    return m


def _check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], *, atol: float = 3e-6) -> None:
    """The written-out model holds no node of the expanded operators; quanta computes
    what the specification's evaluator and ONNX Runtime compute, with no fallback."""
    written = onnx.ModelProto()
    written.CopyFrom(model)
    assert expand_function_ops(written) == []
    op = model.graph.node[0].op_type
    assert op not in {n.op_type for n in written.graph.node}
    spec = ReferenceEvaluator(model).run(None, feeds)[0]
    ours = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )[0]
    np.testing.assert_allclose(ours, spec, atol=atol, rtol=1e-5)
    for backend in ("native", "reference"):
        sess = quanta.InferenceSession(model.SerializeToString(), backend=backend)
        assert sess.fallbacks == [] or backend == "reference"
        (got,) = sess.run(None, feeds)
        assert got.shape == spec.shape and got.dtype == spec.dtype
        np.testing.assert_allclose(got, spec, atol=atol, rtol=1e-5, err_msg=backend)
        np.testing.assert_allclose(got, ours, atol=atol, rtol=1e-5, err_msg=backend)


@pytest.mark.parametrize("is_causal", [0, 1])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_attention_4d(is_causal: int, scale: float | None):
    feeds = {"q": _f(B, HQ, SQ, D), "k": _f(B, HQ, SKV, D), "v": _f(B, HQ, SKV, D)}
    attrs = {"is_causal": is_causal} | ({} if scale is None else {"scale": scale})
    _check(_model("Attention", feeds, {}, ["q", "k", "v"], **attrs), feeds)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_attention_with_a_mask(kind: str):
    feeds = {"q": _f(B, HQ, SQ, D), "k": _f(B, HQ, SKV, D), "v": _f(B, HQ, SKV, D)}
    keep = RNG.random((SQ, SKV)) < 0.6
    keep[:, 0] = True  # no row masked everywhere
    feeds["mask"] = keep if kind == "bool" else np.where(keep, 0.0, -1e4).astype(np.float32) + _f(SQ, SKV)
    _check(_model("Attention", feeds, {}, ["q", "k", "v", "mask"]), feeds)


def test_attention_grouped_query_heads_keep_their_repeat():
    feeds = {"q": _f(B, 4, SQ, D), "k": _f(B, 2, SKV, D), "v": _f(B, 2, SKV, 5)}
    model = _model("Attention", feeds, {}, ["q", "k", "v"])
    _check(model, feeds)
    written = onnx.ModelProto()
    written.CopyFrom(model)
    expand_function_ops(written)
    assert "Expand" in {n.op_type for n in written.graph.node}


def test_attention_3d_inputs_with_head_counts():
    feeds = {"q": _f(B, SQ, HQ * D), "k": _f(B, SKV, HQ * D), "v": _f(B, SKV, HQ * 4)}
    _check(_model("Attention", feeds, {}, ["q", "k", "v"], q_num_heads=HQ, kv_num_heads=HQ), feeds)


def test_attention_without_mask_has_no_bias_or_row_guard():
    """No mask and no causal masking: the all-zero bias's Add and the all-masked-row Where
    are dropped (the Softmax's bits do not change), and with as many query as key heads
    the grouped-query repeat goes too."""
    feeds = {"q": _f(B, HQ, SQ, D), "k": _f(B, HQ, SKV, D), "v": _f(B, HQ, SKV, D)}
    model = _model("Attention", feeds, {}, ["q", "k", "v"])
    written = onnx.ModelProto()
    written.CopyFrom(model)
    expand_function_ops(written)
    softmax = next(n for n in written.graph.node if n.op_type == "Softmax")
    assert not [n for n in written.graph.node if softmax.output[0] in n.input and n.op_type == "Where"]
    assert [n.op_type for n in written.graph.node].count("MatMul") == 2
    kernels = [s.kernel.name for s in quanta.InferenceSession(model.SerializeToString())._plan.steps]
    assert sum(k.startswith("native:softmax") for k in kernels) == 1
    assert not [k for k in kernels if any(w in k for w in ("add", "where", "expand"))], kernels


@pytest.mark.parametrize("axis", [-1, 1])
def test_rms_normalization(axis: int):
    x = _f(B, 4, 17, scale=3.0)
    scale_shape = (17,) if axis == -1 else (4, 17)
    feeds = {"x": x}
    model = _model("RMSNormalization", feeds, {"s": _f(*scale_shape)}, ["x", "s"], axis=axis, epsilon=1e-3)
    _check(model, feeds)
    sess = quanta.InferenceSession(model.SerializeToString())
    # the written-out norm fuses into one step (its ReduceMean axes fold from the rank)
    assert [s.kernel.name for s in sess._plan.steps] == ["native:rms_norm_div_f32"]


@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_embedding_with_position_ids(interleaved: int):
    x = _f(B, HQ, SQ, 8)
    cos, sin = _f(11, 4), _f(11, 4)
    pos = RNG.integers(0, 11, (B, SQ)).astype(np.int64)
    feeds = {"x": x, "pos": pos}
    model = _model(
        "RotaryEmbedding",
        feeds,
        {"cos": cos, "sin": sin},
        ["x", "cos", "sin", "pos"],
        interleaved=interleaved,
    )
    _check(model, feeds)


def test_rotary_embedding_3d_with_num_heads():
    feeds = {"x": _f(B, SQ, HQ * 6), "cos": _f(B, SQ, 3), "sin": _f(B, SQ, 3)}
    _check(_model("RotaryEmbedding", feeds, {}, ["x", "cos", "sin"], num_heads=HQ), feeds)


def test_quantized_attention_runs_its_products_in_integer(tmp_path):
    """Written out, the attention's Q·Kᵀ and ·V products are MatMuls the quantizer sees:
    quanta's file runs them in integer, and ONNX Runtime runs the file."""
    wq, wk, wv = _f(21, 21, scale=0.3), _f(21, 21, scale=0.3), _f(21, 21, scale=0.3)
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q3"]),
        helper.make_node("MatMul", ["x", "wk"], ["k3"]),
        helper.make_node("MatMul", ["x", "wv"], ["v3"]),
        helper.make_node("Attention", ["q3", "k3", "v3"], ["y"], name="attn", q_num_heads=3, kv_num_heads=3),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, SQ, 21])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, n) for w, n in ((wq, "wq"), (wk, "wk"), (wv, "wv"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    src, out = tmp_path / "attn.onnx", tmp_path / "attn.int8.onnx"
    onnx.save(model, src)
    calib = [{"x": _f(B, SQ, 21)} for _ in range(6)]
    # 7-bit weights where ORT's u8 x s8 kernels saturate full-range ones (tests/ort_int8.py)
    summary = quanta.quantize_static(src, out, calib, verbose=False, progress=False, weight_bits=WEIGHT_BITS)
    quantized_matmuls = [n for n, op in summary.quantized if op == "MatMul"]
    assert len(quantized_matmuls) == 5, quantized_matmuls
    assert summary.coverage.integer_share == 1.0
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    feed = {"x": _f(B, SQ, 21)}
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    got_ort = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    sess = quanta.InferenceSession(str(out))
    assert sess.fallbacks == []
    (got,) = sess.run(None, feed)
    assert np.abs(got - ref).max() <= 0.05 * np.abs(ref).max()  # int8 fidelity (7- or 8-bit weights)
    # the same file in both engines: integer products are exact, and only the last
    # product (softmax · V, dequantized operands) is float, within its ulps
    np.testing.assert_allclose(got, got_ort, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))


def test_every_onnx_node_case_of_the_expanded_operators():
    """The installed onnx's backend node cases of every operator written out (attention
    masks, GQA, softcap, past states, padded keys, float16 / double; Swish's and SwiGLU's
    attributes and defaults) on the native target, within each case's tolerance, and
    with no fallback but where the body is not written (bfloat16; a double Softmax)."""
    from tests.onnx_node import _array, cases_for

    cases = cases_for(EXPANDED_OPS)
    assert len(cases) >= 65
    for case in cases:
        model = case.model
        names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
        sess = quanta.InferenceSession(model.SerializeToString())
        kept = [op for _, op, _ in sess.fallbacks if op in EXPANDED_OPS]
        if (
            "bfloat16" not in case.name
            and "bf16" not in case.name
            and not case.name.startswith("test_shrink")
        ):
            assert kept == [], (case.name, sess.fallbacks)
        for inputs, expected in case.data_sets:
            got = sess.run(None, {n: _array(x) for n, x in zip(names, inputs)})
            for g, e in zip(got, expected):
                e = np.asarray(_array(e))
                assert g.shape == e.shape and g.dtype == e.dtype, case.name
                np.testing.assert_allclose(
                    g.astype(np.float64),
                    e.astype(np.float64),
                    rtol=case.rtol,
                    atol=max(case.atol, 1e-6),
                    err_msg=case.name,
                )


def test_function_operators_inside_an_if_branch_and_the_main_graph():
    """An Attention in an If branch and an RMSNormalization in the main graph are both
    written out (the branch first, so the main graph's rewrite keeps it)."""
    feeds = {"q": _f(B, HQ, SQ, D), "k": _f(B, HQ, SKV, D), "v": _f(B, HQ, SKV, D), "flag": np.array(True)}
    out_info = [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)]
    then_branch = helper.make_graph(
        [helper.make_node("Attention", ["q", "k", "v"], ["a"], name="attn")], "then", [], out_info
    )
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["q"], ["a"], name="same")], "else", [], out_info
    )
    g = helper.make_graph(
        [
            helper.make_node(
                "If", ["flag"], ["o"], name="branch", then_branch=then_branch, else_branch=else_branch
            ),
            helper.make_node("RMSNormalization", ["o", "s"], ["y"], name="norm"),
        ],
        "g",
        [
            helper.make_tensor_value_info("q", TensorProto.FLOAT, [B, HQ, SQ, D]),
            helper.make_tensor_value_info("k", TensorProto.FLOAT, [B, HQ, SKV, D]),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, [B, HQ, SKV, D]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(_f(D), "s")],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    written = onnx.ModelProto()
    written.CopyFrom(model)
    assert expand_function_ops(written) == []
    ops = {n.op_type for n in written.graph.node}
    body = next(
        a.g for n in written.graph.node if n.op_type == "If" for a in n.attribute if a.name == "then_branch"
    )
    assert "RMSNormalization" not in ops and "Attention" not in {n.op_type for n in body.node}
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    sess = quanta.InferenceSession(model.SerializeToString())
    np.testing.assert_allclose(sess.run(None, feeds)[0], want, atol=3e-6, rtol=1e-5)
