"""ONNX Runtime's fused transformer operators written back as ONNX (quanta/ir/ms_contrib.py):
each one against ONNX Runtime's own kernel, on both targets.

Shapes avoid coincidences: 3 heads of 7 (hidden 21), 5 tokens, batch 2, a vocabulary of
17, distinct per-column scales and non-zero zero points for the quantized forms.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.ms_contrib import decompose_contrib_ops
from tests.ort_int8 import REDUCE_RANGE, WEIGHT_BITS

MS = "com.microsoft"
RNG = np.random.default_rng(5)
B, S, N, HS = 2, 5, 3, 7
H = N * HS

_NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.int8): TensorProto.INT8,
}


def _output(name: str) -> onnx.ValueInfoProto:
    """A graph output of unknown shape: an int32 mask index, else float32."""
    elem = TensorProto.INT32 if name == "mask_index" else TensorProto.FLOAT
    return helper.make_tensor_value_info(name, elem, None)


def _model(
    op: str,
    feeds: dict[str, np.ndarray],
    consts: dict[str, np.ndarray],
    inputs: list[str],
    outputs: list[str],
    *,
    opset: int = 17,
    domain: str = MS,
    producer: str = "",
    **attrs,
) -> onnx.ModelProto:
    node = helper.make_node(op, inputs, outputs, name=f"the_{op}", domain=domain, **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(k, _NP_TO_ONNX[v.dtype], list(v.shape)) for k, v in feeds.items()],
        [_output(o) for o in outputs if o],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    m.producer_name = producer
    return m


def _check(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], *, atol: float = 2e-5, rtol: float = 2e-5
) -> None:
    """quanta (native and reference) computes what ONNX Runtime computes, and the
    decomposed model holds no com.microsoft node but a Gelu, and only operators of the
    model's opset."""
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    written = onnx.ModelProto()
    written.CopyFrom(model)
    assert decompose_contrib_ops(written) == []
    opset = next(o.version for o in written.opset_import if o.domain == "")
    for n in written.graph.node:
        if n.domain == MS:
            assert n.op_type == "Gelu", n.op_type
        else:  # an ai.onnx operator of the model's own opset
            onnx.defs.get_schema(n.op_type, opset, "")
    for backend in ("native", "reference"):
        got = quanta.InferenceSession(model.SerializeToString(), backend=backend).run(None, feeds)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, (backend, g.shape, w.shape, g.dtype, w.dtype)
            np.testing.assert_allclose(g, w, atol=atol, rtol=rtol, err_msg=backend)


def _f(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("with_bias", [True, False])
def test_fast_gelu(with_bias: bool):
    x = _f(B, S, H, scale=2.0)
    consts = {"bias": _f(H)} if with_bias else {}
    _check(_model("FastGelu", {"x": x}, consts, ["x", *consts], ["y"]), {"x": x})


@pytest.mark.parametrize("producer", ["", "onnx.quantize"])
@pytest.mark.parametrize("opset", [13, 17, 20])
def test_bias_gelu(opset: int, producer: str):
    x = _f(B, S, H, scale=2.0)
    _check(
        _model("BiasGelu", {"x": x}, {"b": _f(H)}, ["x", "b"], ["y"], opset=opset, producer=producer),
        {"x": x},
    )


def test_quick_gelu_and_bias_add():
    x = _f(B, S, H, scale=3.0)
    _check(_model("QuickGelu", {"x": x}, {}, ["x"], ["y"], alpha=1.3), {"x": x})
    # BiasAdd has no CPU kernel in ONNX Runtime (CUDA only): its definition instead
    skip, b = _f(B, S, H), _f(H)
    model = _model("BiasAdd", {"x": x, "skip": skip}, {"b": b}, ["x", "b", "skip"], ["y"])
    for backend in ("native", "reference"):
        got = quanta.InferenceSession(model.SerializeToString(), backend=backend).run(
            None, {"x": x, "skip": skip}
        )[0]
        np.testing.assert_array_equal(got, (x + b) + skip)


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize("with_bias", [True, False])
def test_skip_layer_norm_and_its_sum(opset: int, with_bias: bool):
    x, skip = _f(B, S, H, scale=2.0) + 1.0, _f(B, S, H)
    consts = {"gamma": _f(H), "beta": _f(H)}
    ins = ["x", "skip", "gamma", "beta"]
    if with_bias:
        consts["bias"] = _f(H)
        ins.append("bias")
    m = _model(
        "SkipLayerNormalization",
        {"x": x, "skip": skip},
        consts,
        ins,
        ["y", "", "", "sum"],
        opset=opset,
        epsilon=1e-5,
    )
    _check(m, {"x": x, "skip": skip}, atol=5e-5)


def test_simplified_layer_norms():
    x, skip = _f(B, S, H, scale=2.0), _f(B, S, H)
    m = _model(
        "SkipSimplifiedLayerNormalization",
        {"x": x, "skip": skip},
        {"g": _f(H), "b": _f(H)},
        ["x", "skip", "g", "b"],
        ["y"],
        epsilon=1e-6,
    )
    _check(m, {"x": x, "skip": skip}, atol=5e-5)
    m = _model(
        "SimplifiedLayerNormalization", {"x": x}, {"g": _f(H)}, ["x", "g"], ["y"], domain="", epsilon=1e-6
    )
    _check(m, {"x": x}, atol=5e-5)


@pytest.mark.parametrize("trans", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_fused_matmul(trans: tuple[int, int]):
    a = _f(*((B, 3, 7, 17) if not trans[0] else (B, 3, 17, 7)))
    b = _f(*((17, 5) if not trans[1] else (5, 17)))
    m = _model(
        "FusedMatMul", {"a": a}, {"b": b}, ["a", "b"], ["y"], transA=trans[0], transB=trans[1], alpha=0.37
    )
    _check(m, {"a": a})


def test_fused_gemm_and_conv():
    a = _f(7, 17)
    m = _model(
        "FusedGemm",
        {"a": a},
        {"w": _f(5, 17), "c": _f(5)},
        ["a", "w", "c"],
        ["y"],
        transB=1,
        activation="LeakyRelu",
        activation_alpha=0.2,
    )
    _check(m, {"a": a})
    x, z = _f(1, 3, 9, 11), _f(1, 7, 9, 11)
    m = _model(
        "FusedConv",
        {"x": x, "z": z},
        {"w": _f(7, 3, 3, 3), "b": _f(7)},
        ["x", "w", "b", "z"],
        ["y"],
        activation="Relu",
        pads=[1, 1, 1, 1],
        kernel_shape=[3, 3],
    )
    _check(m, {"x": x, "z": z})
    m = _model(
        "FusedConv",
        {"x": x},
        {"w": _f(7, 3, 3, 3)},
        ["x", "w"],
        ["y"],
        activation="Clip",
        activation_params=[-0.5, 0.75],
        strides=[2, 2],
    )
    _check(m, {"x": x})


def _embed_inputs() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    ids = RNG.integers(0, 17, (B, S)).astype(np.int32)
    seg = RNG.integers(0, 2, (B, S)).astype(np.int32)
    mask = np.ones((B, S), np.int32)
    mask[1, 3:] = 0
    consts = {"word": _f(17, H), "pos": _f(9, H), "segt": _f(2, H), "gamma": _f(H), "beta": _f(H)}
    return {"ids": ids, "seg": seg, "mask": mask}, consts


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize("with_positions", [False, True])
def test_embed_layer_norm_with_mask_index_and_sum(opset: int, with_positions: bool):
    feeds, consts = _embed_inputs()
    ins = ["ids", "seg", "word", "pos", "segt", "gamma", "beta", "mask"]
    if with_positions:
        feeds["positions"] = RNG.integers(0, 9, (B, S)).astype(np.int32)
        ins.append("positions")
    m = _model(
        "EmbedLayerNormalization", feeds, consts, ins, ["y", "mask_index", "sum"], opset=opset, epsilon=1e-5
    )
    _check(m, feeds, atol=5e-5)


def test_embed_layer_norm_without_mask_or_segments():
    feeds, consts = _embed_inputs()
    del consts["segt"]
    m = _model(
        "EmbedLayerNormalization",
        {"ids": feeds["ids"]},
        consts,
        ["ids", "", "word", "pos", "", "gamma", "beta"],
        ["y", "mask_index"],
        epsilon=1e-5,
    )
    _check(m, {"ids": feeds["ids"]}, atol=5e-5)


def _quantized(a: np.ndarray, dtype, zp: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    info = np.iinfo(dtype)
    scale = np.float32(np.abs(a).max() / ((info.max - info.min) / 2))
    q = np.clip(np.round(a / scale) + zp, info.min, info.max).astype(dtype)
    return q, np.array(scale, np.float32), np.array(zp, dtype)


def test_q_embed_layer_norm():
    feeds, consts = _embed_inputs()
    q = {}
    for k, zp in (("word", 131), ("pos", 7), ("segt", 200), ("gamma", 128), ("beta", 90)):
        q[f"{k}_q"], q[f"{k}_s"], q[f"{k}_z"] = _quantized(consts[k], np.uint8, zp)
    ins = ["ids", "seg", "word_q", "pos_q", "segt_q", "gamma_q", "beta_q", "mask", "word_s", "pos_s", "segt_s",
           "gamma_s", "beta_s", "word_z", "pos_z", "segt_z", "gamma_z", "beta_z"]  # fmt: skip
    m = _model("QEmbedLayerNormalization", feeds, q, ins, ["y", "mask_index"], epsilon=1e-5)
    _check(m, feeds, atol=5e-5)


def _attention_mask(kind: str) -> np.ndarray | None:
    if kind == "none":
        return None
    if kind == "raw2d":
        m = np.ones((B, S), np.int32)
        m[0, 4:] = 0
        m[1, 2:] = 0
        return m
    if kind == "raw3d":
        return (RNG.random((B, S, S)) > 0.3).astype(np.int32) | np.eye(S, dtype=np.int32)[None]
    return np.array([S, 3], np.int32)  # "ends": [batch] end positions


@pytest.mark.parametrize("mask", ["none", "raw2d", "raw3d", "ends"])
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_attention(mask: str, unidirectional: int):
    x = _f(B, S, 17)
    feeds = {"x": x}
    ins = ["x", "w", "b"]
    m = _attention_mask(mask)
    if m is not None:
        feeds["mask"] = m
        ins.append("mask")
    model = _model("Attention", feeds, {"w": _f(17, 3 * H, scale=0.5), "b": _f(3 * H)}, ins, ["y"],
                   num_heads=N, unidirectional=unidirectional)  # fmt: skip
    _check(model, feeds, atol=5e-5)


def test_attention_with_its_bias_scale_and_unequal_value_width():
    x = _f(B, S, 17)
    bias = _f(1, N, S, S)
    hv = N * 4
    model = _model(
        "Attention",
        {"x": x, "ab": bias},
        {"w": _f(17, 2 * H + hv, scale=0.5), "b": _f(2 * H + hv)},
        ["x", "w", "b", "", "", "ab"],
        ["y"],
        num_heads=N,
        qkv_hidden_sizes=[H, H, hv],
        scale=0.21,
        mask_filter_value=-3000.0,
    )
    _check(model, {"x": x, "ab": bias}, atol=5e-5)


@pytest.mark.parametrize("mask", ["none", "raw2d"])
@pytest.mark.parametrize("weights", ["u8_zp", "s8_per_column"])
def test_q_attention(mask: str, weights: str):
    """uint8 input with zero point 121; uint8 weights with zero point 119 and a scale
    distinct from the input's, or int8 weights with one scale per output column."""
    x = _f(B, S, 17)
    xq, xs, xz = _quantized(x, np.uint8, 121)
    w = _f(17, 3 * H, scale=0.5)
    if weights == "u8_zp":
        wq, ws, wz = _quantized(w, np.uint8, 119)
    else:
        # weights on the 7-bit grid: ONNX Runtime's u8 x s8 kernel on a CPU without VNNI
        # sums product pairs in saturating int16 (docs/kernels.md "AVX2") and would not be
        # the reference this test compares with there
        ws = (np.abs(w).max(0) / 64).astype(np.float32)  # [3H], each column its own
        wq = np.clip(np.round(w / ws), -64, 64).astype(np.int8)
        wz = np.zeros(3 * H, np.int8)
    assert float(ws.reshape(-1)[0]) != float(xs)
    feeds = {"x": xq}
    consts = {"w": wq, "b": _f(3 * H), "xs": xs, "ws": ws, "xz": xz, "wz": wz}
    ins = ["x", "w", "b", "xs", "ws", "", "xz", "wz"]
    m = _attention_mask(mask)
    if m is not None:
        feeds["mask"] = m
        ins[5] = "mask"
    _check(_model("QAttention", feeds, consts, ins, ["y"], num_heads=N), feeds, atol=5e-5)


def test_a_form_not_written_stays_and_names_itself():
    """An Attention with a past state stays as it is: the session names the node."""
    x = _f(B, S, 17)
    past = _f(2, B, N, 3, HS)
    model = _model("Attention", {"x": x, "past": past}, {"w": _f(17, 3 * H), "b": _f(3 * H)},
                   ["x", "w", "b", "", "past"], ["y", "present"], num_heads=N)  # fmt: skip
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    left = decompose_contrib_ops(copy)
    assert left == [("the_Attention", "Attention", "a past state or a present output")]
    with pytest.raises(Exception, match="the_Attention"):
        quanta.InferenceSession(model.SerializeToString()).run(None, {"x": x, "past": past})


def _tiny_bert(opset: int = 17) -> onnx.ModelProto:
    """One encoder layer as ONNX Runtime's transformer optimizer writes it: embedding
    LayerNorm with its mask index, fused attention, residual LayerNorms, BiasGelu."""
    ffn = 2 * H + 3
    consts = {
        "word": _f(17, H),
        "pos": _f(9, H),
        "segt": _f(2, H),
        "g0": _f(H) * 0.1 + 1,
        "b0": _f(H) * 0.1,
        "wqkv": _f(H, 3 * H, scale=0.3),
        "bqkv": _f(3 * H, scale=0.1),
        "wo": _f(H, H, scale=0.3),
        "bo": _f(H, scale=0.1),
        "g1": _f(H) * 0.1 + 1,
        "b1": _f(H) * 0.1,
        "w1": _f(H, ffn, scale=0.3),
        "bf1": _f(ffn, scale=0.1),
        "w2": _f(ffn, H, scale=0.3),
        "bf2": _f(H, scale=0.1),
        "g2": _f(H) * 0.1 + 1,
        "b2": _f(H) * 0.1,
    }
    nodes = [
        helper.make_node("Cast", ["ids64"], ["ids"], to=TensorProto.INT32),
        helper.make_node("Cast", ["seg64"], ["seg"], to=TensorProto.INT32),
        helper.make_node("Cast", ["mask64"], ["mask"], to=TensorProto.INT32),
        helper.make_node(
            "EmbedLayerNormalization", ["ids", "seg", "word", "pos", "segt", "g0", "b0", "mask"], ["e", "mi"],
            domain=MS, epsilon=1e-5,
        ),
        helper.make_node("Attention", ["e", "wqkv", "bqkv", "mi"], ["a"], domain=MS, num_heads=N),
        helper.make_node("MatMul", ["a", "wo"], ["ao"]),
        helper.make_node("SkipLayerNormalization", ["ao", "e", "g1", "b1", "bo"], ["h1"], domain=MS, epsilon=1e-5),
        helper.make_node("MatMul", ["h1", "w1"], ["f1"]),
        helper.make_node("BiasGelu", ["f1", "bf1"], ["f1g"], domain=MS),
        helper.make_node("MatMul", ["f1g", "w2"], ["f2"]),
        helper.make_node("SkipLayerNormalization", ["f2", "h1", "g2", "b2", "bf2"], ["y"], domain=MS, epsilon=1e-5),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "tiny_bert",
        [
            helper.make_tensor_value_info(k, TensorProto.INT64, ["batch", "seq"])
            for k in ("ids64", "seg64", "mask64")
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", H])],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m


def _bert_feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        mask = np.ones((B, S), np.int64)
        mask[1, rng.integers(2, S) :] = 0
        out.append(
            {
                "ids64": rng.integers(0, 17, (B, S)).astype(np.int64),
                "seg64": rng.integers(0, 2, (B, S)).astype(np.int64),
                "mask64": mask,
            }
        )
    return out


def test_an_optimized_encoder_runs_and_quantizes_like_its_plain_form(tmp_path):
    """The whole flow of a user with an ORT-optimized BERT: quanta runs it as ORT does;
    quantize_static puts every MatMul in integer and writes a file ORT runs; ORT's own
    quantize_dynamic of it (QAttention, QEmbedLayerNormalization) runs in quanta as
    it runs in ORT."""
    from onnxruntime.quantization import quantize_dynamic as ort_quantize_dynamic

    src = tmp_path / "bert_opt.onnx"
    onnx.save(_tiny_bert(), src)
    feeds = _bert_feeds(3, 1)
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    for f in feeds:
        np.testing.assert_allclose(
            quanta.InferenceSession(str(src)).run(None, f)[0], ref.run(None, f)[0], atol=5e-5
        )
    out = tmp_path / "bert_static.onnx"
    # 7-bit weights where ORT's u8 x s8 kernels saturate full-range ones (tests/ort_int8.py)
    summary = quanta.quantize_static(
        str(src), str(out), _bert_feeds(8, 2), verbose=False, weight_bits=WEIGHT_BITS
    )
    assert summary.coverage.integer_share == pytest.approx(1.0), summary.format()
    onnx.checker.check_model(onnx.load(out), full_check=True)
    q = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for f in feeds:
        want = ref.run(None, f)[0]
        got = q.run(None, f)[0]
        assert float(np.abs(got - want).max()) < 0.25 * float(np.abs(want).max())
        np.testing.assert_allclose(quanta.InferenceSession(str(out)).run(None, f)[0], got, atol=0.05)
    ort_dyn = tmp_path / "bert_ort_dynamic.onnx"
    ort_quantize_dynamic(
        str(src),
        str(ort_dyn),
        reduce_range=REDUCE_RANGE,  # tests/ort_int8.py
        extra_options={"DefaultTensorType": TensorProto.FLOAT},
    )
    ops = {n.op_type for n in onnx.load(ort_dyn).graph.node}
    assert {"QAttention", "QEmbedLayerNormalization"} <= ops, ops
    o = ort.InferenceSession(str(ort_dyn), providers=["CPUExecutionProvider"])
    for f in feeds:
        np.testing.assert_allclose(
            quanta.InferenceSession(str(ort_dyn)).run(None, f)[0], o.run(None, f)[0], atol=1e-4
        )


@pytest.mark.parametrize("axis", [-1, -2, 1])
def test_layer_norm_below_opset_17_as_onnx_runtime_registers_it(axis: int):
    """ONNX Runtime's LayerNormFusion writes LayerNormalization into any opset (its own
    registration); ONNX has it from opset 17 only."""
    x = _f(B, S, H, scale=2.0) + 0.5
    norm_shape = (H,) if axis == -1 else (S, H)
    consts = {"g": _f(*norm_shape), "b": _f(*norm_shape)}
    m = _model("LayerNormalization", {"x": x}, consts, ["x", "g", "b"], ["y"], opset=13, domain="", axis=axis,
               epsilon=1e-5)  # fmt: skip
    _check(m, {"x": x}, atol=5e-5)


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("ImageScaler", {"scale": 0.5, "bias": [1.0, -2.0, 3.0]}),
        ("Scale", {"scale": 0.3}),
        ("Affine", {"alpha": 0.3, "beta": 0.2}),
        ("ScaledTanh", {"alpha": 1.5, "beta": 0.7}),
        ("ParametricSoftplus", {"alpha": 1.5, "beta": 0.7}),
    ],
)
def test_experimental_operators_of_old_opsets(op: str, attrs: dict):
    """ONNX's experimental operators in an IR 3, opset 8 file (every initializer a graph
    input), as ONNX Runtime still runs them; and such a model quantizes."""
    x = _f(1, 3, 9, 7, scale=2.0)
    m = _model(op, {"x": x}, {}, ["x"], ["y"], opset=8, domain="", **attrs)
    m.ir_version = 3
    m.opset_import.pop()  # no com.microsoft import in such a file
    _check(m, {"x": x}, atol=1e-5)


def test_an_old_detector_with_image_scaler_quantizes(tmp_path):
    """tiny-YOLOv2's form: ImageScaler before the first Conv, opset 8, IR 3."""
    w = _f(7, 3, 3, 3, scale=0.3)
    nodes = [
        helper.make_node("ImageScaler", ["x"], ["s"], scale=1 / 255, bias=[0.0, 0.0, 0.0]),
        helper.make_node("Conv", ["s", "w"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.1),
    ]
    graph = helper.make_graph(
        nodes,
        "yolo_stem",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 13, 11]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [7, 3, 3, 3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7, 13, 11])],
        [numpy_helper.from_array(w, "w")],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)])
    m.ir_version = 3
    src, out = tmp_path / "stem.onnx", tmp_path / "stem.int8.onnx"
    onnx.save(m, src)
    feeds = [{"x": RNG.uniform(0, 255, (1, 3, 13, 11)).astype(np.float32)} for _ in range(4)]
    summary = quanta.quantize_static(str(src), str(out), feeds, verbose=False)
    assert summary.coverage.integer_share == pytest.approx(1.0), summary.format()
    onnx.checker.check_model(onnx.load(out), full_check=True)
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds[0])[0]
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds[0])[0]
    assert float(np.abs(got - want).max()) < 0.05 * float(np.abs(want).max())


@pytest.mark.parametrize("mask", ["none", "raw2d", "ends"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_multi_head_attention_with_a_key_length_of_its_own(mask: str, with_bias: bool):
    """Cross attention (T5 / BART / Whisper decoders): 4 keys for 5 queries, values of
    another width, the projections' bias, the key padding mask forms."""
    ell, hv = 4, N * 4
    q, k, v = _f(B, S, H), _f(B, ell, H), _f(B, ell, hv)
    feeds = {"q": q, "k": k, "v": v}
    consts = {"bias": _f(2 * H + hv)} if with_bias else {}
    ins = ["q", "k", "v", "bias" if with_bias else ""]
    if mask == "raw2d":
        feeds["m"] = np.array([[1, 1, 0, 1], [1, 0, 0, 0]], np.int32)
        ins.append("m")
    elif mask == "ends":
        feeds["m"] = np.array([3, 1], np.int32)
        ins.append("m")
    _check(_model("MultiHeadAttention", feeds, consts, ins, ["y"], num_heads=N), feeds, atol=5e-5)


def test_multi_head_self_attention_unidirectional_with_attention_bias():
    x = _f(B, S, H)
    ab = _f(B, N, S, S)
    feeds = {"q": x, "k": _f(B, S, H), "v": _f(B, S, H), "ab": ab}
    m = _model("MultiHeadAttention", feeds, {}, ["q", "k", "v", "", "", "ab"], ["y"], num_heads=N, unidirectional=1,
               scale=0.3)  # fmt: skip
    _check(m, feeds, atol=5e-5)
